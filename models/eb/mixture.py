"""``eb-mixture``: personalised estimation with a discrete mixture prior (§2.3, Theorem 5 and
Algorithm 1 of A Generative Framework for Personalized Learning and Estimation: Theory,
Algorithms, and Privacy).

Agent i outputs the posterior mean of Theorem 5, Σ_l α_l μ_l with
α_l ∝ p_l exp(−n_i (X̄_i − μ_l)²/(2σ_i²)), from its own current X̄_i, its n_i samples and its
public σ_i² — a Gaussian quasi-likelihood for bounded data (for uniform or Bernoulli samples
the posterior is not exactly this, but X̄_i is close to Gaussian once n_i is moderate).

- ``prior = "known"``: the centres μ_l and weights p_l are given (Theorem 5); nothing is sent.
- ``prior = "kmeans"`` (Algorithm 1): every round the agents upload their privatised running
  mean (`desim.models.eb.server`: none, PM-I or PM-II), the server clusters the uploads that
  arrived with Lloyd's k-means (scipy's kmeans2; k-means++ seeds from the run's ``kmeans``
  stream in the first round, then warm-started from the previous round's centres, `lloyd`
  iterations per round) and broadcasts (μ_1..μ_k, p_1..p_k), p_l = |S_l|/m_r.

Algorithm 1 uploads the posterior means θ_i^t; here the uploads are the privatised running
means, because only those have a release mechanism (p-sums of samples) — uploading θ_i^t would
leak X̄_i through the weights. With fresh data every round, warm-started clustering is one
iteration of Algorithm 1's alternation per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.protocol import Context
from desim.kernel.registry import PROTOCOLS
from desim.kernel.server import Round
from desim.models.eb.estimators import cluster, posterior_mean
from desim.models.eb.gaussian import UploadParams
from desim.models.eb.server import VALUE, ServerEstimation


@dataclass(frozen=True)
class EBMixtureParams(UploadParams):
    """Parameters of eb-mixture."""

    mechanism: Literal["none", "pm1", "pm2"] = param(
        "none", "upload mechanism: none, or item-level DP with PM-I / PM-II p-sum releases"
    )
    prior: Literal["kmeans", "known"] = param(
        "kmeans", "kmeans: the server clusters the uploads (Alg. 1); known: centres given"
    )
    k: int = param(3, "number of mixture components (clusters)", ge=1)
    centres: list[float] | None = param(None, "μ_1..μ_k of a known prior")
    weights: list[float] | None = param(None, "p_1..p_k of a known prior (default: equal)", ge=0)
    lloyd: int = param(10, "Lloyd iterations of k-means per server round", ge=1)

    def __post_init__(self) -> None:
        if self.prior == "known":
            if self.centres is None or len(self.centres) != self.k:
                raise ValueError(f"prior = 'known' needs centres: a list of k = {self.k} means")
            if self.weights is not None and (
                len(self.weights) != self.k or not sum(self.weights) > 0
            ):
                raise ValueError(f"weights must be k = {self.k} numbers ≥ 0 with a positive sum")
        super().__post_init__()


@PROTOCOLS.register("eb-mixture")
class EBMixture(ServerEstimation):
    """Posterior mean over k centres: known (Thm 5), or clustered by the server (Alg. 1)."""

    Params = EBMixtureParams

    def setup(self, ctx: Context) -> None:
        k = self.params.k
        self.broadcast_width = 2 * k  # μ_1..μ_k, p_1..p_k
        super().setup(ctx)
        p = self.params
        if p.prior == "known":
            w = np.ones(k) if p.weights is None else np.asarray(p.weights, float)
            self.known = (np.asarray(p.centres, float), w / w.sum())
        self._kmeans_rng = ctx.streams.get("kmeans")
        self._centres: np.ndarray | None = None  # the server's previous centres

    def communicates(self) -> bool:
        return self.params.prior != "known"

    def aggregate(self, r: Round) -> tuple[np.ndarray, np.ndarray] | None:
        k = self.params.k
        if len(r) < k:
            return None
        centres, weights = cluster(
            r.payload[:, VALUE], k, self._kmeans_rng, self._centres, self.params.lloyd
        )
        self._centres = centres
        row = np.concatenate([centres, weights])
        return self._agents, np.broadcast_to(row, (len(self._agents), 2 * k))

    def combine(self, agents: np.ndarray) -> np.ndarray:
        sigma2 = np.asarray(self.ctx.public["sigma2"], float)[agents]
        xbar, n = self.local()[agents], self.counts[agents]
        if self.params.prior == "known":
            return posterior_mean(xbar, n, sigma2, *self.known)
        k = self.params.k
        got = self.received[agents]
        # one broadcast per round: agents holding the same round share centres and weights
        rounds = self.received_round[agents]
        out = np.empty(len(agents))
        for rnd in np.unique(rounds):  # usually one (or two, with late broadcasts)
            sel = rounds == rnd
            row = got[np.argmax(sel)]
            out[sel] = posterior_mean(xbar[sel], n[sel], sigma2[sel], row[:k], row[k:])
        return out
