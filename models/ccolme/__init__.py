"""C-ColME and Private-C-ColME (seed 001, "Communication-Constrained Private Decentralized
Online Personalized Mean Estimation"): consensus over estimated class-mates on a sparse graph.

`protocol` (both protocols), `analytic` (closed forms and their curves), `metrics`
(Corollary 1 on each run's graph).
"""

from desim.models.ccolme import analytic, bcolme, metrics, protocol  # noqa: F401  (registration)
