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
- `linear_shrinkage_mse`: the best *linear* estimator a X̄ + (1 − a)μ with the prior's exact
  moments; it is the posterior mean only under a Beta prior.
- `discrete_posterior_mse`: the Bayes MSE of the posterior mean E[p | Z] under a prior with
  finitely many atoms, an exact sum over Z ~ Bin(n, p) (continuous priors enter through their
  quadrature nodes, `desim.models.eb.curves`).
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
    under a Beta prior). v ≥ 0 since σ² ≤ μ(1−μ) on [0, 1]; rounding can make μ(1−μ) − σ²
    slightly negative (atoms 1 and 1 − 2⁻⁵³), so v is clamped at 0 (MSE 0, not −inf)."""
    v = np.maximum(bernoulli_local_mse(n, mean, var), 0.0)
    return var * v / (var + v) if var > 0 else np.zeros_like(v)


def discrete_posterior_mse(n: int, atoms: ArrayLike, weights: ArrayLike) -> float:
    """Bayes MSE of the posterior mean E[p | Z] for Z ~ Bin(n, p), p drawn from the atoms with
    the given weights: Σ_z Σ_k w_k P(Z = z | p_k) (p_k − E[p | Z = z])², an exact sum."""
    if n != int(n) or n < 1:
        raise ValueError(f"n = {n!r}: the sample count must be an integer ≥ 1")
    n = int(n)
    p = np.asarray(atoms, dtype=float)
    w = np.asarray(weights, dtype=float)
    if p.shape != w.shape or p.ndim != 1 or len(p) == 0:
        raise ValueError("atoms and weights must be 1-D arrays of one length ≥ 1")
    if not (np.all((p >= 0) & (p <= 1)) and np.all(w >= 0) and w.sum() > 0):
        raise ValueError("atoms must lie in [0, 1] and weights be ≥ 0 with a positive sum")
    w = w / w.sum()
    j = np.arange(1, n + 1, dtype=float)
    log_binom = np.concatenate([[0.0], np.cumsum(np.log((n - j + 1) / j))])
    # counts in chunks: memory stays O(atoms × chunk) for large n
    step = max(1, 2_000_000 // len(p))
    return float(
        sum(
            _posterior_sq_error(n, p, w, log_binom, np.arange(lo, min(lo + step, n + 1)))
            for lo in range(0, n + 1, step)
        )
    )


def _posterior_sq_error(
    n: int, p: np.ndarray, w: np.ndarray, log_binom: np.ndarray, counts: np.ndarray
) -> float:
    """Σ_{z ∈ counts} Σ_k P(p = p_k, Z = z) (p_k − E[p | Z = z])²."""
    z = counts.astype(float)[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        # 0·log 0 = 0: an atom at 0 or 1 gives every other count probability 0, not NaN
        log_p = np.where(z > 0, z * np.log(p[:, None]), 0.0)
        log_q = np.where(z < n, (n - z) * np.log1p(-p[:, None]), 0.0)
    joint = w[:, None] * np.exp(log_binom[counts][None, :] + log_p + log_q)
    marginal = joint.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        post = np.where(marginal > 0, (joint * p[:, None]).sum(axis=0) / marginal, 0.0)
    # a sum of non-negative terms: no cancellation, unlike E p² − Σ_z P(z) E[p | z]²
    return float(np.sum(joint * (p[:, None] - post[None, :]) ** 2))
