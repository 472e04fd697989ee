"""PriCER and ColRel (seed 004, private collaborative relaying to a parameter server over
intermittent links).

`protocol` (the two-stage relaying protocol and its metrics), `optimiser` (Alg. 3: relay
weights and noise), `curves` (the optimised objective), `data` (the vector data of Fig. 4).
"""

from desim.models.pricer import curves, data, protocol  # noqa: F401  (registration)
