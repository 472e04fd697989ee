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

- ``trim = β`` (a defence against adversarial uploads, desim's extension): the server's
  clustering is trimmed k-means (Cuesta-Albertos, Gordaliza & Matrán 1997): every Lloyd step
  leaves out the ⌊β·m_r⌋ uploads farthest from their centre before the centres move, and p_l
  counts the kept uploads. The first round takes the best of 20 starts (k uploads drawn from
  the ``kmeans`` stream each), as the authors' algorithm does (trimmed Lloyd steps only find
  a local optimum, and k-means++ seeds land on the outliers first); later rounds warm-start.
  Without adversaries it costs the tails of every cluster: centres of well separated clusters
  barely move (symmetric tails), but p_l loses the uploads that lie between clusters.

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
from desim.models.eb.estimators import (
    cluster,
    posterior_mean,
    trimmed_cluster,
    trimmed_cluster_restarts,
)
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
    trim: float | None = param(
        None,
        "β of trimmed k-means: the share of uploads farthest from their centre left out of "
        "every Lloyd step (absent: plain k-means)",
        ge=0,
        lt=0.5,
    )

    def __post_init__(self) -> None:
        if self.trim is not None and self.prior == "known":
            raise ValueError(
                f"trim = {self.trim!r}: trims the server's clustering, which prior = 'known' "
                "does not run; remove trim"
            )
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
        p, y = self.params, r.payload[:, VALUE]
        if p.trim is None:
            centres, weights = cluster(y, k, self._kmeans_rng, self._centres, p.lloyd)
        elif self._centres is None:
            centres, weights = trimmed_cluster_restarts(y, k, self._kmeans_rng, p.lloyd, p.trim)
        else:
            centres, weights, _ = trimmed_cluster(y, self._centres, p.lloyd, p.trim)
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
