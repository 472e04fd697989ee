"""Private-ColME (seeds 000 and 002: Yakimenka et al., "Differentially-Private Collaborative
Online Personalized Mean Estimation"): agents query one other agent per slot, test who is in
their class and combine with inverse-variance weights.

`protocol` (the protocol and its metrics), `model` (the test, Sch-Var-2's estimate and the
combination as pure functions), `statistic` (the statistic T and its exact variance per pair),
`pairs` (class beliefs and last releases per pair), `schedule` (RR, rRR), `view` (the agents'
own data per slot), `delivery` (ideal links, or everything else), `combination` (incremental
combination sums), `variance` (unknown variance: Sch-Var-1, Sch-Var-2, Bayesian, the Welch
test), `analytic` (Var[T] of App. A and the Prop. 3 oracle), `curves` (the oracle curve).
"""

from desim.models.colme import curves, protocol  # noqa: F401  (registration side effects)
