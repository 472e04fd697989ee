"""PriCER and ColRel (seed 004: Saha et al., "Collaborative Mean Estimation over Intermittently
Connected Networks with Peer-To-Peer Privacy"): private relaying to a parameter server.

`protocol` (the two-stage relaying protocol and its metrics), `optimiser` (Alg. 3: relay
weights and noise), `curves` (the optimised objective), `data` (the vector data of Fig. 4),
`table` (the vectors read from a file).
"""

from desim.models.pricer import curves, data, protocol, table  # noqa: F401  (registration)
