"""Private-ColME's model as pure functions (seed 002): the test level, the z-test of §III-C1,
Sch-Var-2's final estimate, the RR schedule and the inverse-variance combination of Lemma 4.

The statistic T and its exact variance are `desim.models.colme.statistic`; the unknown-variance
maths (sample variance, Welch test, Sch-Var-1/2 reference forms) `desim.models.colme.variance`.
"""

from __future__ import annotations

import numpy as np

from desim.models.colme.variance import bayes_posterior_mean


def thresholds(theta: float, t_max: int) -> tuple[np.ndarray, np.ndarray]:
    """θ_t = theta/ln(t+1) and the z-test quantile Φ⁻¹(1 − θ_t/2) for t = 0 … t_max + 1
    (index 0 unused: θ = 1, quantile +∞)."""
    from scipy.special import ndtri  # here, not at module level: plug-in loading is cheap

    t = np.arange(1, t_max + 2, dtype=float)
    levels = np.concatenate([[1.0], theta / np.log(t + 1.0)])
    return levels, np.concatenate([[np.inf], ndtri(1.0 - levels[1:] / 2.0)])


def z_accepts(
    own_sums: np.ndarray,
    t: np.ndarray | np.floating,
    sigma2_own: np.ndarray,
    value: np.ndarray,
    var: np.ndarray,
    z: np.ndarray | np.floating,
) -> np.ndarray:
    """χ_a(b) of §III-C1: |X̄_a − T_{b→a}| < z·√(σ_a²/t + Var[T_{b→a}]), X̄_a = own_sums/t."""
    spread = sigma2_own / t  # (in place: the same floats, fewer temporaries)
    spread += var
    np.sqrt(spread, out=spread)
    spread *= z
    gap = own_sums / t
    gap -= value
    return np.abs(gap, out=gap) < spread


def sch_var_2_estimate(
    v_raw: np.ndarray, k_noise: np.ndarray, k: np.ndarray, bayes: bool, prior: str
) -> np.ndarray:
    """V_{b→a} of Sch-Var-2 from V', Kσ_DP² and k releases (`statistic.SchVar2.update`):
    V' − Kσ_DP², +∞ before two releases; a negative V is +∞ (unknown), or with `bayes` the
    posterior mean of (19) under `prior`."""
    v = v_raw - k_noise
    v[k < 2] = np.inf
    negative = v < 0
    if negative.any():
        if bayes:
            v[negative] = bayes_posterior_mean(
                np.maximum(v_raw[negative], 0.0),
                k_noise[negative],
                k[negative],
                prior,
                check=False,
            )
        else:
            v[negative] = np.inf
    return v


def rr_offset(t: int | np.ndarray, m: int) -> int | np.ndarray:
    """RR's position in slot(s) t: every agent a queries a + offset (mod M), offset in 1…M−1."""
    return (t - 1) % (m - 1) + 1


def contribution(
    included: np.ndarray, value: np.ndarray, var: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(T/Var[T], 1/Var[T]) of pairs, 0 where b is excluded: their terms in Lemma 4's sums."""
    with np.errstate(divide="ignore"):
        weight = np.where(included, 1.0 / var, 0.0)
    return weight * value, weight


def combine(
    local: np.ndarray, own: np.ndarray, pairs_num: np.ndarray, pairs_den: np.ndarray
) -> np.ndarray:
    """Lemma 4: μ_a = (own·X̄_a + Σ_b T/Var[T]) / (own + Σ_b 1/Var[T]), own = t/σ_a² (or t/V_a);
    the local mean X̄_a where there is nothing to weigh or own is infinite (σ_a = 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):  # own = ∞ at σ_a = 0: local, below
        num = own * local + pairs_num
        den = own + pairs_den
        mu = num / den
    return np.where(np.isfinite(own) & (den > 0), mu, local)
