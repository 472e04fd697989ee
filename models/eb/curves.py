"""Closed-form curves of the empirical-Bayes family for study files (registry `CURVES`).

Each `curve(t, data)` returns (mean, zeros): the per-agent MSE with n = t samples (a one-shot
round at t), for the study's validated data parameters `data` (``hierarchical-gaussian`` or
``bernoulli-prior``, `desim.models.eb.data`). For Bernoulli agents `eb-linear-shrinkage` is the
best estimator linear in X̄ and `eb-posterior-mean` the best of all (the Bayes posterior mean);
they coincide under a Beta prior only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.registry import CURVES
from desim.models.eb import analytic
from desim.models.eb import mechanisms as mech
from desim.models.eb.server import gaussian_multiplier


def _grid(t: np.ndarray) -> np.ndarray:
    tt = np.asarray(t, dtype=float)
    if tt.ndim != 1 or np.any(~(tt > 0)):
        raise ValueError(f"t = {t!r}: must be a 1-D array of times > 0")
    return tt


def _gaussian(data: Any) -> tuple[int, float, float]:
    if not hasattr(data, "sigma_theta"):
        raise ValueError("this curve needs data model 'hierarchical-gaussian'")
    return int(data.agents), float(data.sigma_theta) ** 2, float(data.sigma_x) ** 2


@CURVES.register("eb-theorem")
@dataclass(frozen=True)
class TheoremCurve:
    """Theorem 1 (mechanism none) or Theorem 2 (gaussian, quantiser): (σ_x²/n)((1−a)/m + a),
    which is also the exact MSE of the estimator with that a (σ_θ known, no clipping).

    The Gaussian mechanism's σ_q² is the protocol's at its last round (n = t): (41) as printed
    (``calibration = "paper"``, per release) or the least noise for which the `rounds` uploads
    together are (ε₀, δ)-DP per the PLD accountant (``tight``,
    `desim.models.eb.server.gaussian_multiplier`); the estimate uses the last round only."""

    mechanism: Literal["none", "gaussian", "quantiser"] = param("none", "upload mechanism")
    epsilon: float = param(1.0, "ε₀ of the Gaussian mechanism", gt=0)
    delta: float = param(1e-6, "δ of the Gaussian mechanism", gt=0, lt=1)
    r: float = param(1.0, "r, the bound |μ| ≤ r of Theorem 2", ge=0)
    clip: float | None = param(None, "b (default: Theorem 2's radius at n = t)", gt=0)
    bits: int = param(8, "k, bits of the quantiser", ge=1, le=52)
    calibration: Literal["paper", "tight"] = param(
        "paper",
        "σ_q² of the Gaussian mechanism: (41) as printed, or the least noise for "
        "(ε₀, δ) per the PLD accountant",
    )
    rounds: int = param(1, "R, upload rounds the tight noise is calibrated for (t_max/round)", ge=1)

    def sigma_q2(self, m: int, n: np.ndarray, sigma_theta2: float, sigma_x2: float) -> np.ndarray:
        """σ_q² of the mechanism at each n (0 without one)."""
        if self.mechanism == "none":
            return np.zeros_like(n)
        b = np.array(
            [
                self.clip
                if self.clip is not None
                else mech.clip_radius(self.r, np.sqrt(sigma_theta2), np.sqrt(sigma_x2), m, int(k))
                for k in n
            ]
        )
        if self.mechanism == "gaussian" and self.calibration == "tight":
            return (
                2.0 * b * gaussian_multiplier("tight", self.epsilon, self.delta, self.rounds)
            ) ** 2
        if self.mechanism == "gaussian":
            return np.array([mech.gaussian_ldp_sigma2(x, self.epsilon, self.delta) for x in b])
        return np.array([mech.quantiser_sigma2(x, self.bits) for x in b])

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) of Theorem 1 or 2 on the grid `t` (n = t)."""
        tt = _grid(t)
        m, st2, sx2 = _gaussian(data)
        sq2 = self.sigma_q2(m, tt, st2, sx2)
        return analytic.theorem_mse(m, tt, st2, sx2, sq2), np.zeros_like(tt)


@CURVES.register("eb-van-trees")
@dataclass(frozen=True)
class VanTreesCurve:
    """The van Trees lower bounds of §5.1.3: (46) with the prior known, (47) with μ estimated."""

    bound: Literal["prior", "estimated"] = param("estimated", "(46) prior known; (47) μ̂")

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) of (46) or (47) on the grid `t` (n = t)."""
        tt = _grid(t)
        m, st2, sx2 = _gaussian(data)
        if self.bound == "prior":
            return analytic.van_trees_prior(tt, st2, sx2), np.zeros_like(tt)
        return analytic.van_trees_estimated(m, tt, st2, sx2), np.zeros_like(tt)


@CURVES.register("eb-local")
@dataclass(frozen=True)
class EBLocalCurve:
    """The local mean's MSE: σ_x²/n (Gaussian) or E[p(1 − p)]/n = (μ(1−μ) − σ²)/n (Bernoulli)."""

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) on the grid `t` (n = t)."""
        tt = _grid(t)
        if hasattr(data, "sigma_theta"):
            return float(data.sigma_x) ** 2 / tt, np.zeros_like(tt)
        mean, var = data.moments()
        return analytic.bernoulli_local_mse(tt, mean, var), np.zeros_like(tt)


@CURVES.register("eb-linear-shrinkage")
@dataclass(frozen=True)
class LinearShrinkageCurve:
    """Bernoulli agents: the best *linear* shrinkage a X̄ + (1 − a)μ with the prior's exact
    moments, MSE a·(μ(1−μ) − σ²)/n; the posterior mean only under a Beta prior (there
    αβ/(n(α+β)(α+β+1)) · n/(α+β+n)), below it for others (`eb-posterior-mean`)."""

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) on the grid `t` (n = t)."""
        tt = _grid(t)
        _bernoulli(data, "eb-linear-shrinkage")
        if data.prior == "beta":
            return analytic.beta_bernoulli_mse(tt, data.alpha, data.beta), np.zeros_like(tt)
        mean, var = data.moments()
        return analytic.linear_shrinkage_mse(tt, mean, var), np.zeros_like(tt)


@CURVES.register("eb-posterior-mean")
@dataclass(frozen=True)
class PosteriorMeanCurve:
    """Bernoulli agents: the Bayes posterior mean E[p | Z] under the known prior, the least MSE
    any estimator from an agent's own n samples and the prior can reach; an exact sum over
    Z ~ Bin(n, p) for spikes, the closed form for Beta, Gauss–Legendre quadrature of the prior
    for uniform (exact for these polynomials) and the clipped normal (with its atoms at 0, 1)."""

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) on the grid `t` (n = t, whole numbers)."""
        tt = _grid(t)
        _bernoulli(data, "eb-posterior-mean")
        if np.any(tt != np.round(tt)):
            raise ValueError(f"t = {t!r}: eb-posterior-mean needs whole sample counts")
        if data.prior == "beta":
            return analytic.beta_bernoulli_mse(tt, data.alpha, data.beta), np.zeros_like(tt)
        out = [analytic.discrete_posterior_mse(int(n), *prior_atoms(data, int(n))) for n in tt]
        return np.array(out), np.zeros_like(tt)


# the old name computed linear shrinkage: difflib alone would point it to eb-posterior-mean
CURVES.renamed["eb-posterior"] = "eb-linear-shrinkage"


def _bernoulli(data: Any, kind: str) -> None:
    if not hasattr(data, "moments"):
        raise ValueError(f"{kind} needs data model 'bernoulli-prior'")


#: Standard-normal half-width kept by the quadrature of the clipped normal prior (mass beyond
#: it is below 10⁻³⁰, far under double precision next to the rest).
_NORMAL_REACH = 12.0


def prior_atoms(data: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(atoms, weights) of the ``bernoulli-prior`` law of p (not Beta): the spikes themselves,
    or Gauss–Legendre nodes with enough points to integrate p^z (1 − p)^(n−z) p² exactly."""
    if data.prior == "spikes":
        atoms = np.asarray(data.spikes, dtype=float)
        return atoms, np.full(len(atoms), 1.0 / len(atoms))
    # K nodes integrate polynomials of degree 2K − 1 exactly; past a few thousand the nodes are
    # far denser than the posterior's width and only cost time
    x, w = np.polynomial.legendre.leggauss(min(n // 2 + 64, 4096))
    if data.prior == "uniform":
        if data.high == data.low:
            return np.array([float(data.low)]), np.array([1.0])
        half = (data.high - data.low) / 2
        return data.low + half * (x + 1.0), w / 2.0
    # normal clipped to [0, 1]: its mass below 0 and above 1 sits on the ends
    lo = max((0.0 - data.mean) / data.sd, -_NORMAL_REACH)
    hi = min((1.0 - data.mean) / data.sd, _NORMAL_REACH)
    ends = np.array([_phi_cdf((0.0 - data.mean) / data.sd), _phi_cdf((data.mean - 1.0) / data.sd)])
    if not hi > lo:
        return np.array([0.0, 1.0]), ends
    u = lo + (hi - lo) / 2 * (x + 1.0)
    inner = w * (hi - lo) / 2 * np.exp(-u * u / 2) / math.sqrt(2 * math.pi)
    atoms = np.clip(data.mean + data.sd * u, 0.0, 1.0)
    return np.concatenate([[0.0, 1.0], atoms]), np.concatenate([ends, inner])


def _phi_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))
