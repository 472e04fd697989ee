"""Private-ColME (seeds 000 and 002: Yakimenka et al., "Differentially-Private Collaborative
Online Personalized Mean Estimation"): agents query one other agent per slot, test who is in
their class and combine with inverse-variance weights.

`protocol` (the protocol and its metrics), `statistic` (the statistic T and its exact variance
per pair), `variance` (unknown variance: Sch-Var-1, Sch-Var-2, Bayesian, the Welch test),
`analytic` (Var[T] of App. A and the Prop. 3 oracle), `curves` (the oracle curve).
"""

from desim.models.colme import curves, protocol  # noqa: F401  (registration side effects)
