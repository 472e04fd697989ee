"""Closed forms of the empirical-Bayes family (A Generative Framework for Personalized Learning
and Estimation: Theory, Algorithms, and Privacy, §2 and §5), per coordinate (d = 1; multiply
by d for d coordinates).

- `shrinkage_mse`: the exact Bayesian MSE of θ̂_i = a X̄_i + (1 − a) μ̂_q for any a, with
  μ̂_q the mean of m unbiased uploads of noise variance σ_q² (μ̂_q includes agent i's own):

      a² s + (1 − a)² (s + σ_q²)/m + 2a(1 − a) s/m + (1 − a)² σ_θ² (m − 1)/m,  s = σ_x²/n.

  With a of Theorem 1 (σ_q = 0) or Theorem 2 it equals the theorems' bound
  (σ_x²/n)((1 − a)/m + a): the bounds are tight (`theorem_mse`).
- `van_trees_prior` (46) and `van_trees_estimated` (47): the lower bounds of §5.1.3.
- `beta_bernoulli_mse`: the posterior mean (α + Z)/(α + β + n) has MSE
  αβ/(n(α+β)(α+β+1)) · n/(α+β+n); the local mean Z/n has αβ/(n(α+β)(α+β+1)).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from desim.models.eb.estimators import gaussian_weight


def _n(n: ArrayLike) -> np.ndarray:
    nn = np.asarray(n, dtype=float)
    if np.any(~(nn > 0)):
        raise ValueError(f"n = {n!r}: sample counts must be > 0")
    return nn


def shrinkage_mse(
    a: ArrayLike,
    m: int,
    n: ArrayLike,
    sigma_theta2: float,
    sigma_x2: float,
    sigma_q2: float = 0.0,
) -> np.ndarray:
    """Exact E(θ̂_i − θ_i)² of a X̄_i + (1 − a) μ̂_q (see the module docstring)."""
    a = np.asarray(a, dtype=float)
    s = sigma_x2 / _n(n)
    b = 1.0 - a
    return (
        a * a * s
        + b * b * (s + sigma_q2) / m
        + 2 * a * b * s / m
        + b * b * sigma_theta2 * (m - 1) / m
    )


def theorem_weight(
    m: int, n: ArrayLike, sigma_theta2: float, sigma_x2: float, sigma_q2: float = 0.0
) -> np.ndarray:
    """a of Theorem 1 (σ_q² = 0) or Theorem 2."""
    return gaussian_weight(sigma_theta2, sigma_q2, m, sigma_x2 / _n(n))


def theorem_mse(
    m: int, n: ArrayLike, sigma_theta2: float, sigma_x2: float, sigma_q2: float = 0.0
) -> np.ndarray:
    """(σ_x²/n)((1 − a)/m + a) with a of Theorem 1 or 2: their bound, which is the exact MSE."""
    a = theorem_weight(m, n, sigma_theta2, sigma_x2, sigma_q2)
    return sigma_x2 / _n(n) * ((1.0 - a) / m + a)


def van_trees_prior(n: ArrayLike, sigma_theta2: float, sigma_x2: float) -> np.ndarray:
    """(46): σ_θ²σ_x²/(nσ_θ² + σ_x²), the Bayesian lower bound with the prior known."""
    return sigma_theta2 * sigma_x2 / (_n(n) * sigma_theta2 + sigma_x2)


def van_trees_estimated(m: int, n: ArrayLike, sigma_theta2: float, sigma_x2: float) -> np.ndarray:
    """(47): (σ_θ²σ_x² + σ_x⁴/(mn))/(nσ_θ² + σ_x²), with the population mean estimated."""
    nn = _n(n)
    return (sigma_theta2 * sigma_x2 + sigma_x2**2 / (m * nn)) / (nn * sigma_theta2 + sigma_x2)


def beta_moments(alpha: float, beta: float) -> tuple[float, float]:
    """(μ, σ²) of Beta(α, β): α/(α+β) and αβ/((α+β)²(α+β+1))."""
    s = alpha + beta
    return alpha / s, alpha * beta / (s * s * (s + 1.0))


def bernoulli_local_mse(n: ArrayLike, mean: float, var: float) -> np.ndarray:
    """E[p(1 − p)]/n = (μ(1 − μ) − σ²)/n: the local mean's MSE under any prior (μ, σ²)."""
    return (mean * (1.0 - mean) - var) / _n(n)


def beta_bernoulli_mse(n: ArrayLike, alpha: float, beta: float) -> np.ndarray:
    """MSE of the posterior mean under a Beta(α, β) prior: αβ/(n(α+β)(α+β+1)) · n/(α+β+n)."""
    nn = _n(n)
    mean, var = beta_moments(alpha, beta)
    return bernoulli_local_mse(nn, mean, var) * nn / (alpha + beta + nn)


def linear_shrinkage_mse(n: ArrayLike, mean: float, var: float) -> np.ndarray:
    """MSE of the best linear shrinkage a X̄ + (1 − a) μ with exact moments (any prior):
    with v = (μ(1−μ) − σ²)/n, a = σ²/(σ² + v) and the MSE is a·v (= the Beta posterior mean's
    under a Beta prior)."""
    v = bernoulli_local_mse(n, mean, var)
    return var * v / (var + v) if var > 0 else np.zeros_like(v)
