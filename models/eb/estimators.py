"""The estimators of the empirical-Bayes family as plain array functions (no simulation).

Notation of "A Generative Framework for Personalized Learning and Estimation: Theory,
Algorithms, and Privacy" (§2): agent i holds n samples with mean X̄_i; the server sees uploads
y_l = q(X̄_l) of m agents. Every function is vectorised over agents.

Gaussian (§2.1): θ̂_i = a X̄_i + (1 − a) μ̂ with a of Theorem 1 (σ_q = 0) or 2,
a = (σ_θ² + σ_q²/(m − 1)) / (σ_θ² + σ_q²/(m − 1) + σ_x²/n); when σ_θ is unknown the server
plugs in the method-of-moments σ̂_θ² = max(0, S²_y − mean σ_x²/n − mean σ_q²).

Bernoulli (§2.2): leave-one-out moments of eq. (6) and the weights built on them, as printed
or with the consistent plug-in (see `loo_moments` and `bernoulli_weight`).

Mixture (§2.3): the posterior weights of Theorem 5 with a Gaussian quasi-likelihood,
α_l ∝ p_l exp(−n (X̄_i − μ_l)²/(2σ_i²)) (the Σ_j‖X_ij − μ_l‖² of the paper equals
n(X̄_i − μ_l)² plus a term that cancels), and the server's clustering of Algorithm 1.
"""

from __future__ import annotations

import warnings
from typing import Literal

import numpy as np

Moments = Literal["printed", "consistent"]


def gaussian_weight(
    sigma_theta2: float | np.ndarray,
    sigma_q2: float | np.ndarray,
    m: int | np.ndarray,
    sampling_var: np.ndarray,
) -> np.ndarray:
    """a of Theorem 2 (Theorem 1 when σ_q² = 0) for m ≥ 2 uploads; `sampling_var` is σ_x²/n
    of each agent. Every argument broadcasts (one value per agent, or one for all)."""
    extra = np.asarray(sigma_theta2, dtype=float) + np.asarray(sigma_q2, dtype=float) / (
        np.asarray(m, dtype=float) - 1.0
    )
    total = extra + np.asarray(sampling_var, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.where(total > 0, extra / total, 1.0)
    return a


def moment_sigma_theta2(
    y: np.ndarray,
    sampling_var: np.ndarray,
    noise_var: np.ndarray,
    spread: float | None = None,
) -> float:
    """σ̂_θ² = max(0, S²_y − mean(σ_x²/n) − mean(σ_q²)) from the uploads y (unbiased before the
    clip: E S²_y = σ_θ² + mean σ_x²/n + mean σ_q² for independent uploads); `spread`, when
    given, stands for S²_y (a robust estimate of the uploads' variance, `mad_variance`)."""
    if len(y) < 2:
        raise ValueError("moment_sigma_theta2 needs at least two uploads")
    s2 = float(np.var(y, ddof=1)) if spread is None else spread
    return max(0.0, float(s2 - np.mean(sampling_var) - np.mean(noise_var)))


#: 1/Φ⁻¹(3/4): the median absolute deviation of Gaussian data times it estimates their σ.
MAD_TO_SIGMA = 1.482602218505602


def mad_variance(y: np.ndarray) -> float:
    """(1.4826 · median |y − median y|)²: a variance estimate of Gaussian uploads that a
    minority of outliers cannot move far (breakdown point 1/2; Hampel 1974)."""
    return float((MAD_TO_SIGMA * np.median(np.abs(y - np.median(y)))) ** 2)


def robust_location(y: np.ndarray, how: str, trim: float | None = None) -> float:
    """The uploads' median (``median``), or their trimmed mean (``trimmed``: the ⌊β·m⌋ lowest
    and highest of the m uploads dropped, β = `trim`): Yin et al. (2018)'s coordinate-wise
    robust aggregates, in one dimension."""
    if how == "median":
        return float(np.median(y))
    cut = int(np.floor(trim * len(y)))
    kept = np.sort(y)[cut : len(y) - cut]
    return float(kept.mean())


def robust_moments(y: np.ndarray, how: str, trim: float | None = None) -> tuple[float, float]:
    """(location, spread) of the uploads y that a minority of outliers cannot move far: their
    median or trimmed mean (`robust_location`) and the variance from their median absolute
    deviation (`mad_variance`) — the robust stand-ins for (mean, sample variance) in a
    method-of-moments prior fit."""
    return robust_location(y, how, trim), mad_variance(y)


def loo_moments(y: np.ndarray, moments: Moments = "consistent") -> tuple[np.ndarray, np.ndarray]:
    """(μ̂_i, σ̂_i²) of eq. (6) for every uploader i, leaving its own upload out.

    μ̂_i = (1/(m−1)) Σ_{l≠i} y_l. ``"printed"``: σ̂_i² = (1/(m−2)) Σ_{l≠i} (y_l − μ̂_l)² exactly
    as eq. (6) prints it (deviations from each l's own leave-one-out mean);
    ``"consistent"``: the leave-one-out sample variance (1/(m−2)) Σ_{l≠i} (y_l − μ̂_i)², which
    the proof of Theorem 3 uses. Needs m ≥ 3 uploads.
    """
    y = np.asarray(y, dtype=float)
    m = len(y)
    if m < 3:
        raise ValueError(f"loo_moments needs at least 3 uploads, got {m}")
    s = y.sum()
    mu = (s - y) / (m - 1)
    if moments == "printed":
        dev = y - y.mean()
        total = (m / (m - 1)) ** 2 * (np.sum(dev * dev) - dev * dev)
    else:
        q = np.sum(y * y)
        total = (q - y * y) - (s - y) ** 2 / (m - 1)
    return mu, np.maximum(total, 0.0) / (m - 2)


def all_moments(y: np.ndarray) -> tuple[float, float]:
    """(mean, sample variance) of all uploads: what an agent whose own upload did not arrive
    gets (nothing of its own to leave out)."""
    return float(np.mean(y)), float(np.var(y, ddof=1))


def prior_variance(s2: np.ndarray, mu: np.ndarray, n: np.ndarray | float) -> np.ndarray:
    """The consistent plug-in σ̂² = max(0, (S² − μ̂(1−μ̂)/n)/(1 − 1/n)) (n ≥ 2).

    E S² over the agents' means X̄ is Var X̄ = σ² + (μ(1−μ) − σ²)/n, not σ²; solving for σ²
    gives this estimate. μ̂ is clipped to [0, 1] first (private means may leave it). With one
    sample σ² is not identifiable (Var X̄ = μ(1−μ) whatever σ²): NaN, which `bernoulli_weight`
    turns into the local mean.
    """
    mu = np.clip(mu, 0.0, 1.0)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.maximum(0.0, (s2 - mu * (1.0 - mu) / n) / (1.0 - 1.0 / n))
    return np.where(n > 1, out, np.nan)


def bernoulli_weight(
    mu: np.ndarray, s2: np.ndarray, n: np.ndarray | float, moments: Moments, minus_one: bool
) -> np.ndarray:
    """â_i in [0, 1] from the server's (μ̂_i, σ̂_i²) and the agent's sample count n.

    ``"printed"``: â = n/(μ̂(1−μ̂)/σ̂² − 1 + n) as in (6) (`minus_one`), or without the −1 as the
    proof (48) and the private estimator of Theorem 4 print it. ``"consistent"``: s2 is the
    consistent prior-variance estimate σ̂² (`prior_variance`) and
    â = σ̂²/(σ̂² + (μ̂(1−μ̂) − σ̂²)/n), which is n/(α+β+n) when the moments are exact.
    Values outside [0, 1] (noisy moments) are clipped: â is a convex weight.
    """
    mu = np.clip(mu, 0.0, 1.0)
    pq = mu * (1.0 - mu)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        if moments == "printed":
            denom = np.where(s2 > 0, pq / s2, np.inf) - (1.0 if minus_one else 0.0) + n
            a = np.where(denom > 0, n / denom, 1.0)
        else:
            denom = s2 + (pq - s2) / n
            a = np.where(denom > 0, s2 / denom, np.where(np.isnan(s2), 1.0, 0.0))
    return np.clip(np.nan_to_num(a, nan=1.0), 0.0, 1.0)


def posterior_weights(
    xbar: np.ndarray,
    n: np.ndarray | float,
    sigma2: np.ndarray | float,
    centres: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """α_l^{(i)} of Theorem 5 for every agent (rows) and centre (columns): ∝ p_l e^{−n(X̄_i −
    μ_l)²/(2σ_i²)}, normalised per row (log-sum-exp: the exponents are large for large n)."""
    xbar = np.asarray(xbar, dtype=float)[:, None]
    scale = np.asarray(n, dtype=float) / (2.0 * np.asarray(sigma2, dtype=float))
    scale = np.broadcast_to(scale, xbar.shape[:1])[:, None]
    with np.errstate(divide="ignore"):
        log_w = np.log(np.asarray(weights, dtype=float))[None, :] - scale * (xbar - centres) ** 2
    log_w -= log_w.max(axis=1, keepdims=True)
    w = np.exp(log_w)
    return w / w.sum(axis=1, keepdims=True)


def posterior_mean(
    xbar: np.ndarray,
    n: np.ndarray | float,
    sigma2: np.ndarray | float,
    centres: np.ndarray,
    weights: np.ndarray,
) -> np.ndarray:
    """θ̂_i = Σ_l α_l^{(i)} μ_l of Theorem 5 (9)."""
    return posterior_weights(xbar, n, sigma2, centres, weights) @ np.asarray(centres, float)


def cluster(
    y: np.ndarray, k: int, rng: np.random.Generator, start: np.ndarray | None, iterations: int
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster(y, k) of Algorithm 1: Lloyd's k-means (scipy's kmeans2) on the uploads.

    Starts from k-means++ seeds drawn from `rng` (the first round) or from `start` (the previous
    round's centres: one round of Algorithm 1 per server round, warm-started), runs `iterations`
    Lloyd steps, and returns the centres in increasing order with p_l = |S_l|/m. A cluster left
    empty keeps its centre and gets p_l = 0.
    """
    y = np.asarray(y, dtype=float)
    if len(y) < k:
        raise ValueError(f"cluster: {len(y)} uploads cannot make k = {k} clusters")
    from scipy.cluster.vq import ClusterError, kmeans2  # here: ~0.4 s of imports

    if start is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty cluster: handled below (p_l = 0)
            # as a column: before scipy 1.13, k-means++ seeding fails on 1-D data (the same
            # draws and Lloyd steps as scipy's own 1-D path)
            centres, labels = kmeans2(
                y[:, np.newaxis], k, iter=iterations, minit="++", seed=rng, check_finite=False
            )
            centres = centres[:, 0]
    else:
        start = np.asarray(start, float)
        try:  # the usual case, without the cost of catching warnings every round
            centres, labels = kmeans2(
                y, start, iter=iterations, minit="matrix", missing="raise", check_finite=False
            )
        except ClusterError:  # a cluster went empty: keep its centre (p_l = 0)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                centres, labels = kmeans2(
                    y, start, iter=iterations, minit="matrix", check_finite=False
                )
    order = np.argsort(centres, kind="stable")
    sizes = np.bincount(labels, minlength=k).astype(float)
    return centres[order], sizes[order] / len(y)


#: Random starts of trimmed k-means in the first round (Cuesta-Albertos et al. 1997's
#: algorithm: the best of several starts, as trimmed Lloyd steps find a local optimum only).
TRIMMED_STARTS = 20


def trimmed_cluster(
    y: np.ndarray, start: np.ndarray, iterations: int, trim: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Trimmed k-means (Cuesta-Albertos, Gordaliza & Matrán 1997) on the uploads, from the
    centres `start`: each of `iterations` Lloyd steps assigns every upload to its nearest
    centre, leaves out the ⌊β·m⌋ uploads farthest from theirs (β = `trim`) and moves each
    centre to the mean of the uploads it keeps. Returns the centres in increasing order,
    p_l = |S_l|/(m − ⌊β·m⌋) over the kept uploads, and the kept uploads' sum of squared
    distances to their centres (the trimmed objective); a cluster left empty keeps its centre
    and gets p_l = 0."""
    y = np.asarray(y, dtype=float)
    centres = np.array(start, dtype=float)
    k, m = len(centres), len(y)
    kept_n = m - int(np.floor(trim * m))
    rows = np.arange(m)
    for _ in range(iterations):
        dist = (y[:, None] - centres[None, :]) ** 2
        labels = dist.argmin(axis=1)
        # stable: among equally far uploads the earlier ones are kept
        keep = np.argsort(dist[rows, labels], kind="stable")[:kept_n]
        sums = np.bincount(labels[keep], weights=y[keep], minlength=k)
        sizes = np.bincount(labels[keep], minlength=k)
        centres = np.where(sizes > 0, sums / np.maximum(sizes, 1), centres)
    dist = (y[:, None] - centres[None, :]) ** 2
    labels = dist.argmin(axis=1)
    keep = np.argsort(dist[rows, labels], kind="stable")[:kept_n]
    sizes = np.bincount(labels[keep], minlength=k).astype(float)
    order = np.argsort(centres, kind="stable")
    return centres[order], sizes[order] / kept_n, float(dist[keep, labels[keep]].sum())


def trimmed_cluster_restarts(
    y: np.ndarray, k: int, rng: np.random.Generator, iterations: int, trim: float
) -> tuple[np.ndarray, np.ndarray]:
    """Trimmed k-means from `TRIMMED_STARTS` starts, each k distinct uploads drawn from `rng`:
    (centres, p_l) of the start whose trimmed objective is least."""
    y = np.asarray(y, dtype=float)
    if len(y) < k:
        raise ValueError(f"trimmed_cluster_restarts: {len(y)} uploads cannot make k = {k} clusters")
    best: tuple[np.ndarray, np.ndarray, float] | None = None
    for _ in range(TRIMMED_STARTS):
        start = y[rng.choice(len(y), size=k, replace=False)]
        got = trimmed_cluster(y, start, iterations, trim)
        if best is None or got[2] < best[2]:
            best = got
    return best[0], best[1]
