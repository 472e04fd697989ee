"""Upload mechanisms of the empirical-Bayes family: what an agent's running mean goes through
before it leaves for the server (A Generative Framework for Personalized Learning and
Estimation: Theory, Algorithms, and Privacy, §2.1–§2.2, §5.1.2).

- `clip_radius`: b of Theorem 2, b = r + σ_θ√log(m²n) + (σ_x/√n)√log(m²n), so that every X̄_i
  lies in [−b, b] with probability ≥ 1 − 2/(mn) when |μ| ≤ r.
- `quantise`: the k-bit stochastic quantiser q_k of eq. (37) on [−b, b]; unbiased, with
  variance ≤ σ_q² = b²/(2^k − 1)² (39).
- `gaussian_ldp_sigma2`: σ_q² = 8b² log(2/δ)/ε₀² of the Gaussian mechanism (41), user-level
  (ε₀, δ)-LDP for one release of a mean clipped to [−b, b] (the paper's log(2/δ), not the
  usual ln(1.25/δ)).
- `randomised_response`: q^priv of eq. (7) for x ∈ [0, 1], user-level ε₀-LDP and unbiased,
  with `rr_variance` its exact variance e^ε₀/(e^ε₀ − 1)² + x(1 − x).

Repeated uploads with item-level privacy reuse the PM-I/PM-II p-sum releases of
`desim.models.privacy.release` (see `desim.models.eb.server`).
"""

from __future__ import annotations

import math

import numpy as np


def clip_radius(r: float, sigma_theta: float, sigma_x: float, m: int, n: int) -> float:
    """b of Theorem 2: r + σ_θ√log(m²n) + (σ_x/√n)√log(m²n)."""
    if not (r >= 0 and sigma_theta >= 0 and sigma_x >= 0 and m >= 1 and n >= 1):
        raise ValueError(
            f"clip_radius({r}, {sigma_theta}, {sigma_x}, {m}, {n}): r, σ_θ, σ_x "
            "must be ≥ 0 and m, n ≥ 1"
        )
    root = math.sqrt(math.log(m * m * n))
    return r + sigma_theta * root + sigma_x / math.sqrt(n) * root


def gaussian_ldp_sigma2(b: float, epsilon: float, delta: float) -> float:
    """σ_q² = 8 b² log(2/δ)/ε₀² of the Gaussian mechanism (41) on a mean clipped to [−b, b]."""
    if not (b >= 0 and epsilon > 0 and 0 < delta < 1):
        raise ValueError(
            f"gaussian_ldp_sigma2({b}, {epsilon}, {delta}): need b ≥ 0, ε₀ > 0 and 0 < δ < 1"
        )
    return 8.0 * b * b * math.log(2.0 / delta) / epsilon**2


def quantiser_sigma2(b: float, bits: int) -> float:
    """σ_q² = b²/(2^k − 1)², the bound (39) on the variance of q_k."""
    if bits < 1:
        raise ValueError(f"bits = {bits}: must be ≥ 1")
    return (b / (2**bits - 1)) ** 2


def quantise(x: np.ndarray, b: float, bits: int, rng: np.random.Generator) -> np.ndarray:
    """q_k(x) of eq. (37) for x already in [−b, b]: one of the 2^k levels −b + 2b·i/(2^k − 1).

    x̃ = (2^k − 1)(x + b)/(2b) is rounded down or up at random, up with probability x̃ − ⌊x̃⌋,
    so E[q_k(x)] = x and Var = Δ² f(1 − f) ≤ Δ²/4 = σ_q² with Δ = 2b/(2^k − 1), f = x̃ − ⌊x̃⌋.
    """
    x = np.asarray(x, dtype=float)
    if np.any(np.abs(x) > b * (1 + 1e-12)):
        raise ValueError(f"quantise: inputs must lie in [−b, b] = [{-b}, {b}] (clip first)")
    levels = 2**bits - 1
    scaled = levels * (x + b) / (2.0 * b)
    low = np.floor(scaled)
    up = rng.random(x.shape) < scaled - low
    return 2.0 * b / levels * np.minimum(low + up, levels) - b


def rr_values(epsilon: float) -> tuple[float, float]:
    """The two outputs of eq. (7): −1/(e^ε₀ − 1) and e^ε₀/(e^ε₀ − 1)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon = {epsilon}: must be > 0")
    e = math.exp(epsilon)
    return -1.0 / (e - 1.0), e / (e - 1.0)


def rr_high_probability(x: np.ndarray, epsilon: float) -> np.ndarray:
    """P[q^priv(x) = e^ε₀/(e^ε₀ − 1)] = 1/(e^ε₀ + 1) + x (e^ε₀ − 1)/(e^ε₀ + 1) of eq. (7)."""
    e = math.exp(epsilon)
    return 1.0 / (e + 1.0) + np.asarray(x, dtype=float) * (e - 1.0) / (e + 1.0)


def randomised_response(x: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """q^priv(x) of eq. (7) for means x ∈ [0, 1]: unbiased, user-level ε₀-LDP."""
    x = np.asarray(x, dtype=float)
    if np.any((x < 0) | (x > 1)):
        raise ValueError("randomised_response: inputs must lie in [0, 1]")
    low, high = rr_values(epsilon)
    return np.where(rng.random(x.shape) < rr_high_probability(x, epsilon), high, low)


def rr_noise_variance(epsilon: float) -> float:
    """e^ε₀/(e^ε₀ − 1)²: the part of Var[q^priv(x)] that does not depend on x."""
    e = math.exp(epsilon)
    return e / (e - 1.0) ** 2


def rr_variance(x: np.ndarray, epsilon: float) -> np.ndarray:
    """Var[q^priv(x)] = e^ε₀/(e^ε₀ − 1)² + x(1 − x), exactly."""
    x = np.asarray(x, dtype=float)
    return rr_noise_variance(epsilon) + x * (1.0 - x)
