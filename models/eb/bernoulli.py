"""``eb-bernoulli``: personalised Bernoulli means through the server (§2.2, Theorems 3–4 of A
Generative Framework for Personalized Learning and Estimation: Theory, Algorithms, and
Privacy).

- ``moments = "known"``: the Beta(α, β) posterior mean (α + Z_i)/(α + β + n) =
  a X̄_i + (1 − a) α/(α+β), a = n/(α+β+n); nothing is sent.
- Otherwise each round the agents upload X̄_i (``mechanism = "none"``) or q^priv(X̄_i) of eq. (7)
  (``"rr"``, user-level ε₀-LDP); the server sends every uploader i its leave-one-out moments
  (μ̂_i, σ̂_i²) of eq. (6) (an agent whose upload did not arrive gets the moments of all
  uploads), and agent i outputs â_i X̄_i + (1 − â_i) μ̂_i.
  ``moments = "consistent"`` (the default) is the consistent plug-in: the server turns the
  sample variance S² of the uploaded means into σ̂² = (S² − μ̂(1−μ̂)/n)/(1 − 1/n) (E S² is
  Var X̄ = σ² + (μ(1−μ) − σ²)/n, not σ²), and â = σ̂²/(σ̂² + (μ̂(1−μ̂) − σ̂²)/n).
  ``moments = "printed"`` is eq. (6) as printed: σ̂_i² from deviations to each μ̂_l, and
  â = n/(μ̂(1−μ̂)/σ̂² − 1 + n) — without the −1 for the private estimator, as Theorem 4 prints it.
- ``robust = "median"`` / ``"trimmed"`` (a defence against adversarial uploads, desim's
  extension): the server fits the prior from robust moments instead — the uploads' median or
  trimmed mean (β = `trim` at each end) for μ̂ and the median absolute deviation for S²
  (`desim.models.eb.estimators.robust_moments`), the same for every agent (one upload moves a
  median by O(1/m), like leaving it out does); the rest of the fit is unchanged. Their price
  without adversaries: the median estimates the uploads' median, not their mean, when the prior
  is skewed. Refused with ``rr``: two-valued uploads have no informative median or MAD.
- ``subtract = true`` removes the mechanism's known variance e^ε₀/(e^ε₀ − 1)² from the
  uploads' variance before the moments are used (the paper does not).

Note on eq. (7): its output is two-valued with P(high) affine in X̄_l, so each upload's law
depends only on E X̄_l = μ; private uploads tell the server μ but nothing about σ² (E S² =
e^ε₀/(e^ε₀−1)² + μ(1−μ) whatever the prior's spread). The private weights therefore cannot adapt
to the heterogeneity — see the eb-bernoulli study.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.registry import PROTOCOLS
from desim.kernel.server import Round
from desim.models.eb.estimators import (
    all_moments,
    bernoulli_weight,
    loo_moments,
    prior_variance,
    robust_moments,
)
from desim.models.eb.gaussian import UploadParams
from desim.models.eb.server import COUNT, NOISE_VAR, VALUE, ServerEstimation


@dataclass(frozen=True)
class EBBernoulliParams(UploadParams):
    """Parameters of eb-bernoulli."""

    mechanism: Literal["none", "rr"] = param(
        "none", "upload mechanism: none, or the randomised response of eq. (7)"
    )
    moments: Literal["consistent", "printed", "known"] = param(
        "consistent", "consistent plug-in, eq. (6) as printed, or a known Beta(α, β) prior"
    )
    subtract: bool = param(False, "subtract the mechanism's variance e^ε₀/(e^ε₀−1)² from S²")
    alpha: float | None = param(None, "α of the known Beta prior (moments = known)", gt=0)
    beta: float | None = param(None, "β of the known Beta prior (moments = known)", gt=0)
    robust: Literal["none", "median", "trimmed"] = param(
        "none",
        "the server's prior fit from the uploads' mean and variance (none), or from robust "
        "moments: their median or trimmed mean, and S² from their median absolute deviation",
    )
    trim: float | None = param(
        None, "robust = 'trimmed': the share β of uploads dropped at each end", ge=0, lt=0.5
    )

    def __post_init__(self) -> None:
        if self.moments == "known" and (self.alpha is None or self.beta is None):
            raise ValueError("moments = 'known' needs alpha and beta (the Beta prior)")
        if (self.robust == "trimmed") != (self.trim is not None):
            raise ValueError(
                f"trim = {self.trim!r}: robust = 'trimmed' needs trim (β in [0, 0.5)) and "
                f"reads it alone (robust = {self.robust!r})"
            )
        if self.robust != "none" and (self.moments == "known" or self.mechanism == "rr"):
            known = self.moments == "known"
            why = "a known prior fits nothing" if known else "rr uploads are two-valued"
            raise ValueError(
                f"robust = {self.robust!r}: not with moments = {self.moments!r}, mechanism = "
                f"{self.mechanism!r}: {why}"
            )
        super().__post_init__()


@PROTOCOLS.register("eb-bernoulli")
class EBBernoulli(ServerEstimation):
    """Beta-Bernoulli posterior mean, or its leave-one-out empirical-Bayes versions."""

    Params = EBBernoulliParams
    broadcast_width = 2  # μ̂_i, σ̂_i²

    def communicates(self) -> bool:
        return self.params.moments != "known"

    def aggregate(self, r: Round) -> tuple[np.ndarray, np.ndarray] | None:
        if len(r) < 3:
            return None
        p = self.params
        y, counts = r.payload[:, VALUE], r.payload[:, COUNT]
        out = np.empty((len(self._agents), 2))
        if p.robust != "none":  # one robust fit for every agent (see the module's note)
            out[:] = robust_moments(y, p.robust, p.trim)
        else:
            mu_all, s2_all = all_moments(y)
            out[:] = mu_all, s2_all
            mu, s2 = loo_moments(y, "printed" if p.moments == "printed" else "consistent")
            out[r.src, 0], out[r.src, 1] = mu, s2
        if p.subtract:
            out[:, 1] -= r.payload[:, NOISE_VAR].mean()
        if p.moments == "consistent":
            out[:, 1] = prior_variance(out[:, 1], out[:, 0], counts.mean())
        return self._agents, out

    def weight(self, agents: np.ndarray) -> np.ndarray:
        """â of every agent in `agents` (a = n/(α+β+n) with a known prior)."""
        p = self.params
        n = self.counts[agents]
        if p.moments == "known":
            return n / (p.alpha + p.beta + n)
        mu, s2 = self.received[agents].T
        return bernoulli_weight(mu, s2, n, p.moments, minus_one=p.mechanism == "none")

    def combine(self, agents: np.ndarray) -> np.ndarray:
        p = self.params
        if p.moments == "known":
            centre = p.alpha / (p.alpha + p.beta)
        else:
            centre = self.received[agents, 0]
        a = self.weight(agents)
        return a * self.local()[agents] + (1.0 - a) * centre
