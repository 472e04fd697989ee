"""``eb-gaussian``: Gaussian empirical-Bayes shrinkage through the server (§2.1, Theorems 1–2 of
A Generative Framework for Personalized Learning and Estimation: Theory, Algorithms, and
Privacy).

Each round the agents upload q(X̄_i) (`desim.models.eb.server`); the server computes
μ̂ = (1/m_r) Σ q(X̄_l) over the m_r uploads that arrived and, when σ_θ is not given, the
method-of-moments σ̂_θ² = max(0, S²_q − mean σ_x²/n − mean σ_q²) (sampling and mechanism noise
variance subtracted), and broadcasts (μ̂, σ̂_θ², mean σ_q², m_r). Agent i outputs
a X̄_i + (1 − a) μ̂ with its current X̄_i and n_i samples and a of Theorem 2,
a = (σ_θ² + σ_q²/(m_r − 1))/(σ_θ² + σ_q²/(m_r − 1) + σ_x²/n_i) — Theorem 1 when σ_q = 0.
With σ_θ known and one round at t_max this is exactly the paper's estimator, whose MSE is
`desim.models.eb.analytic.theorem_mse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.registry import PROTOCOLS
from desim.kernel.server import Round
from desim.models.eb.estimators import (
    gaussian_weight,
    mad_variance,
    moment_sigma_theta2,
    robust_location,
)
from desim.models.eb.forgetting import check_upload_forget
from desim.models.eb.server import (
    COUNT,
    NOISE_VAR,
    VALUE,
    ServerEstimation,
    check_upload_adversaries,
    check_upload_budget,
)
from desim.models.forgetting import forget_param


@dataclass(frozen=True)
class UploadParams:
    """Rounds, deadline and privacy budget of the empirical-Bayes protocols."""

    round: int | None = param(
        None,
        "slots between upload rounds (default: one round, at t_max: the one-shot setting)",
        ge=1,
    )
    deadline: float = param(
        0.0, "slots after a round opens when the server aggregates what has arrived", ge=0
    )
    epsilon: float = param(1.0, "ε₀ of a user-level mechanism, or ε per sample (pm1, pm2)", gt=0)
    delta: float = param(1e-6, "δ of the Gaussian mechanisms", gt=0, lt=1)
    noise: Literal["gaussian", "laplace"] = param("gaussian", "p-sum noise of pm1 / pm2")
    budget_t_max: int | None = param(
        None, "t_max in PM-II's budget split ⌊log₂ t_max⌋+1 (default: the run's t_max)", ge=1
    )
    calibration: Literal["paper", "tight"] = param(
        "paper",
        "noise of gaussian / pm1 / pm2 uploads: the papers' formulas, or the least "
        "noise for which all the run's uploads are (ε, δ)-DP per the PLD accountant",
    )
    accountant: Literal["pld", "rdp"] = param(
        "pld",
        "accountant of the ledger, the budget and the tight calibration: privacy loss "
        "distributions, or Rényi DP (`desim.models.privacy.accounting`)",
    )
    budget: dict | None = param(
        None,
        "per-agent privacy budget {epsilon, delta, action = stop | degrade} against the server: "
        "an upload that would exceed it is not made, or made noisier (`desim.models.eb.server`)",
    )
    adversaries: dict | None = param(
        None,
        "an [adversaries] table {fraction | agents, behaviour = shift | flip | collude | "
        "inflate, …}: agents whose uploads are corrupted (`desim.models.adversaries`)",
    )
    forget: dict | None = forget_param()

    def __post_init__(self) -> None:
        check_upload_budget(self)
        check_upload_adversaries(self)
        check_upload_forget(self)


@dataclass(frozen=True)
class EBGaussianParams(UploadParams):
    """Parameters of eb-gaussian."""

    mechanism: Literal["none", "gaussian", "quantiser", "pm1", "pm2"] = param(
        "none", "upload mechanism: none, Thm 2's Gaussian LDP or k-bit quantiser, PM-I/PM-II"
    )
    sigma_theta: float | None = param(
        None, "σ_θ if known (Theorems 1–2); absent: the server's method-of-moments estimate", ge=0
    )
    r: float = param(1.0, "r, a known bound |μ| ≤ r (Theorem 2's clipping radius b)", ge=0)
    clip: float | None = param(None, "b, the clipping radius (default: Theorem 2's)", gt=0)
    bits: int = param(8, "k, bits of the quantiser (37)", ge=1, le=52)
    moments: Literal["mean", "median", "trimmed"] = param(
        "mean",
        "the server's μ̂ and S²: mean and variance of the uploads (the paper), or robust ones: "
        "their median or trimmed mean, and S² from their median absolute deviation",
    )
    trim: float | None = param(
        None, "moments = 'trimmed': the share β of uploads dropped at each end", ge=0, lt=0.5
    )

    def __post_init__(self) -> None:
        if (self.moments == "trimmed") != (self.trim is not None):
            raise ValueError(
                f"trim = {self.trim!r}: moments = 'trimmed' needs trim (β in [0, 0.5)) and "
                f"reads it alone (moments = {self.moments!r})"
            )
        if (
            self.mechanism in ("gaussian", "quantiser")
            and self.clip is None
            and self.sigma_theta is None
        ):
            raise ValueError(
                f"mechanism = {self.mechanism!r} clips to Theorem 2's radius b, "
                "which needs sigma_theta; set sigma_theta or clip"
            )
        super().__post_init__()


@PROTOCOLS.register("eb-gaussian")
class EBGaussian(ServerEstimation):
    """Shrinkage to the server's μ̂ with the weight of Theorem 1 or 2."""

    Params = EBGaussianParams
    broadcast_width = 4  # μ̂, σ̂_θ², mean σ_q², m_r
    #: A scenario stating the paper's moments keeps the hashes of one from before `moments`.
    legacy_values = {"moments": "mean"}

    def aggregate(self, r: Round) -> tuple[np.ndarray, np.ndarray] | None:
        if len(r) < 2:
            return None
        y, counts, noise = r.payload[:, VALUE], r.payload[:, COUNT], r.payload[:, NOISE_VAR]
        p = self.params
        m_r = len(y)
        robust = p.moments != "mean"
        if p.sigma_theta is not None:
            st2 = p.sigma_theta**2
        else:
            spread = mad_variance(y) if robust else None
            st2 = moment_sigma_theta2(y, self.sampling_variance(r.src, counts), noise, spread)
        centre = robust_location(y, p.moments, p.trim) if robust else y.sum() / m_r
        row = np.array([centre, st2, noise.sum() / m_r, m_r])
        return self._agents, np.broadcast_to(row, (len(self._agents), 4))

    def weight(self, agents: np.ndarray) -> np.ndarray:
        """a of every agent in `agents` for its latest broadcast and current count."""
        _, st2, sq2, mr = self.received[agents].T
        sampling = np.asarray(self.ctx.public["sigma2"], float)[agents] / self.counts[agents]
        return gaussian_weight(st2, sq2, mr, sampling)

    def combine(self, agents: np.ndarray) -> np.ndarray:
        a = self.weight(agents)
        return a * self.local()[agents] + (1.0 - a) * self.received[agents, 0]
