"""DP noise calibration for Private-ColME (seed 002 §II-C, §IV, §VII).

The noise is added to a *sum* of samples lying in [μ−L, μ+L] (a p-sum), so its variance does not
depend on how many samples the sum holds; dividing by t then gives the noise of a running mean.
Calibration follows the paper (Dwork–Roth Thm A.1 for the Gaussian case), which states
(ε, δ)-DP for 0 < ε ≤ 1; larger ε are accepted but the guarantee is then the formula's, not a
theorem's.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

Noise = Literal["gaussian", "laplace", "none"]
Mechanism = Literal["pm1", "pm2"]

NOISES: tuple[str, ...] = ("gaussian", "laplace", "none")
MECHANISMS: tuple[str, ...] = ("pm1", "pm2")


def _check_L(L: float) -> None:
    if not (L >= 0 and math.isfinite(L)):
        raise ValueError(f"L = {L!r}: must be a finite number ≥ 0")


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon = {epsilon!r}: must be a finite number > 0")


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta!r}: must lie in (0, 1) for Gaussian noise")


def _check_noise(noise: str) -> None:
    if noise not in NOISES:
        raise ValueError(f"noise = {noise!r}: must be one of {', '.join(NOISES)}")


def gaussian_sigma2(L: float, epsilon: float, delta: float) -> float:
    """σ_DP² = 8 L² ln(1.25/δ)/ε² of Lemma 1: variance of the Gaussian noise added to a p-sum."""
    _check_L(L)
    _check_epsilon(epsilon)
    _check_delta(delta)
    return 8.0 * L**2 * math.log(1.25 / delta) / epsilon**2


def laplace_scale(L: float, epsilon: float) -> float:
    """Scale b = 2L/ε of Lemma 2 (Laplace noise on a p-sum; its variance is 2b² = 8L²/ε²)."""
    _check_L(L)
    _check_epsilon(epsilon)
    return 2.0 * L / epsilon


def noise_sigma2(noise: str, L: float, epsilon: float, delta: float) -> float:
    """σ_DP² of Lemma 1 ("gaussian") or 2b² of Lemma 2 ("laplace"); 0 for "none"."""
    _check_noise(noise)
    if noise == "none":
        return 0.0
    if noise == "gaussian":
        return gaussian_sigma2(L, epsilon, delta)
    return 2.0 * laplace_scale(L, epsilon) ** 2


def pm2_levels(t_max: int) -> int:
    """⌊log₂ t_max⌋ + 1, the factor by which §VII divides PM-II's (ε, δ) (15 for t_max = 3·10⁴)."""
    if isinstance(t_max, bool) or int(t_max) != t_max or t_max < 1:
        raise ValueError(f"t_max = {t_max!r}: must be an integer ≥ 1")
    return int(t_max).bit_length()


def mechanism_budget(
    mechanism: str, epsilon: float, delta: float, t_max: int
) -> tuple[float, float]:
    """Per-p-sum (ε, δ) of §VII: unchanged for PM-I, divided by ⌊log₂ t_max⌋+1 for PM-II.

    PM-II composes a sample over up to that many p-sums, so the split gives both mechanisms the
    same overall privacy level (conservatively: the exact count would use κ_max, not t_max).
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism = {mechanism!r}: must be one of {', '.join(MECHANISMS)}")
    if mechanism == "pm1":
        return float(epsilon), float(delta)
    k = pm2_levels(t_max)
    return epsilon / k, delta / k


def sample_noise(
    rng: np.random.Generator, noise: str, sigma2: float, size: int | tuple[int, ...]
) -> np.ndarray:
    """Draws of the p-sum noise Z of §IV with variance σ_DP² (Lemma 1 or 2); zeros for "none"."""
    _check_noise(noise)
    if not sigma2 >= 0:
        raise ValueError(f"sigma2 = {sigma2!r}: must be ≥ 0")
    if noise == "none":
        return np.zeros(size)
    if noise == "gaussian":
        # rng.normal(0, σ) draws 0 + σ·z from the same z: these are its bits (a −0.0 product
        # becomes +0.0 through the + 0) without its per-draw parameter handling
        z = rng.standard_normal(size)
        z *= math.sqrt(sigma2)
        z += 0.0
        return z
    # Laplace(b) has variance 2b², so b = sqrt(σ²/2) keeps the requested variance.
    return rng.laplace(0.0, math.sqrt(sigma2 / 2.0), size)


def variance_sigma2(L: float, epsilon: float, delta: float, noise: str) -> float:
    """σ_{2,DP}² of Lemma 3: 32 L⁴ ln(1.25/δ)/ε² (Gaussian) or 32 L⁴/ε² (Laplace), 0 for "none"."""
    _check_noise(noise)
    if noise == "none":
        return 0.0
    _check_L(L)
    _check_epsilon(epsilon)
    if noise == "gaussian":
        _check_delta(delta)
        return 32.0 * L**4 * math.log(1.25 / delta) / epsilon**2
    return 32.0 * L**4 / epsilon**2
