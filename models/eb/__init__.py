"""Empirical-Bayes personalised estimation through a server (A Generative Framework for
Personalized Learning and Estimation: Theory, Algorithms, and Privacy, §2): every agent wants
its own mean and borrows strength from the population through a server that sees only
privatised uploads — the server-based answer to the question ColME answers peer to peer.

`server` (rounds, uploads and their mechanisms, broadcasts), `gaussian` (``eb-gaussian``,
Theorems 1–2), `bernoulli` (``eb-bernoulli``, Theorems 3–4), `mixture` (``eb-mixture``,
Theorem 5 and Algorithm 1), `mechanisms` (clipping, Gaussian LDP, the k-bit quantiser (37),
randomised response (7)), `estimators` (the estimators as array functions), `data`
(``hierarchical-gaussian`` and ``bernoulli-prior`` data), `analytic` and `curves` (closed forms).
"""

from desim.models.eb import bernoulli, curves, data, gaussian, mixture, server  # noqa: F401
