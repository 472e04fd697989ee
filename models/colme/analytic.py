"""Closed forms for Private-ColME: Var[T_{b→a}] (App. A) and the Prop. 3 oracle (§VI).

Notation (seed 002): agent b has released κ times to agent a, at query times t_1 < … < t_κ
(t_i = number of samples b had at release i), and a combines the releases with weights
w_1..w_κ summing to 1 (statistic (1)). Then

    Var[T_{b→a}] = σ_b² · data_term + σ_DP² · noise_term,

where the data term is the first sum of (2) and the noise term is (20) for PM-I and, for PM-II,
either the exact node sum (docs/papers.md §1.4) or (21) as printed. Functions taking `times` and
`w` work on the last axis and broadcast over leading axes (a float for 1-D input). The local
and ideal baselines (Props. 1–2) are in `desim.models.baselines`.

All three weight kinds are uniform over a window [J₀, κ] of release indices (non-MoM: J₀ = κ;
MoM: J₀ = 1; wMoM: J₀ = 2^{⌊log₂κ⌋}), which is what `prefix_terms` exploits to give Var[T]
after every κ = 1..K at once, in O(K log K) per pair.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from desim.models.privacy.bits import floor_pow2, popcount

WeightKind = Literal["last", "mom", "wmom"]
Formula = Literal["exact", "eq21"]

WEIGHT_KINDS: tuple[str, ...] = ("last", "mom", "wmom")
FORMULAS: tuple[str, ...] = ("exact", "eq21")
MAX_EXACT_OTHERS = 20  # 2^20 class-mate subsets is about the most an exact sum can afford


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} = {value!r}: must be one of {', '.join(allowed)}")


def _check_mechanism(mechanism: str) -> None:
    _check_choice("mechanism", mechanism, ("pm1", "pm2"))


def _out(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


# --------------------------------------------------------------------------- weights


def window_start(kind: str, kappa: ArrayLike) -> np.ndarray:
    """J₀(κ), the first release index with non-zero weight in statistic (1) for `kind`."""
    _check_choice("weights", kind, WEIGHT_KINDS)
    k = np.asarray(kappa, dtype=np.int64)
    if np.any(k < 1):
        raise ValueError(f"kappa = {kappa!r}: must be ≥ 1")
    if kind == "last":
        return k.copy()
    if kind == "mom":
        return np.ones_like(k)
    return floor_pow2(k)


def weights(kind: str, kappa: int) -> np.ndarray:
    """w_1..w_κ of statistic (1): non-MoM ("last"), MoM, or wMoM of §IV-B with the corrected
    denominator κ − 2^{⌊log₂κ⌋} + 1 (the printed one is negative; docs/papers.md §1.1)."""
    if isinstance(kappa, bool) or int(kappa) != kappa or kappa < 1:
        raise ValueError(f"kappa = {kappa!r}: must be an integer ≥ 1")
    kappa = int(kappa)
    j0 = int(window_start(kind, kappa))
    w = np.zeros(kappa)
    w[j0 - 1 :] = 1.0 / (kappa - j0 + 1)
    return w


# ----------------------------------------------------- Var[T] for arbitrary weights


def _times_weights(times: ArrayLike, w: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(times, dtype=float)
    if t.ndim == 0 or t.shape[-1] == 0:
        raise ValueError("times: need at least one release time")
    if np.any(t[..., 0] <= 0) or np.any(np.diff(t, axis=-1) <= 0):
        raise ValueError("times: release times must be positive and strictly increasing")
    wb = np.broadcast_to(np.asarray(w, dtype=float), t.shape)
    return t, wb


def _tail_sums(u: np.ndarray) -> np.ndarray:
    """S_i = Σ_{j≥i} u_j along the last axis."""
    return np.cumsum(u[..., ::-1], axis=-1)[..., ::-1]


def data_term(times: ArrayLike, w: ArrayLike) -> float | np.ndarray:
    """Σ_i (t_i − t_{i−1}) (Σ_{j≥i} w_j/t_j)², the data part of Var[T_{b→a}] in (2) over σ_b²."""
    t, wb = _times_weights(times, w)
    dt = np.diff(t, axis=-1, prepend=0.0)
    return _out(np.sum(dt * _tail_sums(wb / t) ** 2, axis=-1))


def pm1_noise_term(times: ArrayLike, w: ArrayLike) -> float | np.ndarray:
    """Σ_i (Σ_{j≥i} w_j/t_j)², the PM-I noise variance (20) over σ_DP²."""
    t, wb = _times_weights(times, w)
    return _out(np.sum(_tail_sums(wb / t) ** 2, axis=-1))


def _pm2_exact_last_axis(u: np.ndarray) -> np.ndarray:
    # Position j of `c` holds u_j (position 0 is a zero pad); at level s, chunk m of length 2^s
    # covers releases [m2^s, (m+1)2^s − 1], exactly those using dyadic node (s, m) when m is
    # odd, and trailing zero padding truncates the last chunk at κ for free.
    kappa = u.shape[-1]
    size = 1 << max(1, kappa.bit_length())
    c = np.zeros(u.shape[:-1] + (size,))
    c[..., 1 : kappa + 1] = u
    total = np.zeros(u.shape[:-1])
    while c.shape[-1] >= 2:
        total += np.sum(c[..., 1::2] ** 2, axis=-1)
        c = c[..., 0::2] + c[..., 1::2]
    return total


def _pm2_eq21_last_axis(u: np.ndarray) -> np.ndarray:
    kappa = u.shape[-1]
    total = np.zeros(u.shape[:-1])
    for level in range(1, kappa.bit_length() + 1):
        lo, hi = 1 << (level - 1), min((1 << level) - 1, kappa)
        j = np.arange(lo, hi + 1)
        bits = ((j[:, None] >> np.arange(level)) & 1).astype(float)
        total += np.sum((u[..., lo - 1 : hi] @ bits) ** 2, axis=-1)
    return total


def pm2_noise_term(times: ArrayLike, w: ArrayLike, formula: str = "exact") -> float | np.ndarray:
    """PM-II noise variance over σ_DP²: exact node sum (docs/papers.md §1.4) or (21) as printed.

    "exact" sums, over nodes (s, m) with m odd and m2^s ≤ κ, (Σ_{j=m2^s}^{min((m+1)2^s−1,κ)}
    w_j/t_j)²; "eq21" lumps, within each block [2^{l−1}, 2^l−1], all j sharing a set bit into
    one square, which overstates the variance for MoM/wMoM once κ ≥ 7. Both give
    w_H(κ)/t_κ² for non-MoM.
    """
    _check_choice("formula", formula, FORMULAS)
    t, wb = _times_weights(times, w)
    u = wb / t
    return _out(_pm2_exact_last_axis(u) if formula == "exact" else _pm2_eq21_last_axis(u))


def noise_term(
    times: ArrayLike, w: ArrayLike, mechanism: str, formula: str = "exact"
) -> float | np.ndarray:
    """Var[Σ_i w_i Z^{(t_i)}]/σ_DP² for `mechanism`: (20) for "pm1", `pm2_noise_term` for "pm2"."""
    _check_mechanism(mechanism)
    if mechanism == "pm1":
        return pm1_noise_term(times, w)
    return pm2_noise_term(times, w, formula)


def var_T(
    times: ArrayLike,
    w: ArrayLike,
    sigma2_data: float,
    sigma2_dp: float,
    mechanism: str,
    formula: str = "exact",
) -> float | np.ndarray:
    """Var[T_{b→a}] of (2): σ_b² · data_term + σ_DP² · noise_term."""
    return sigma2_data * data_term(times, w) + sigma2_dp * noise_term(times, w, mechanism, formula)


# ------------------------------------------------ Var[T] after every κ, window weights


def _segments(kind: str, K: int) -> list[tuple[int, int]]:
    """0-based [lo, hi) ranges of release indices over which the weight window does not move."""
    if kind == "mom":
        return [(0, K)]
    return [((1 << (lv - 1)) - 1, min((1 << lv) - 1, K)) for lv in range(1, K.bit_length() + 1)]


def _seg_cumsum(x: np.ndarray, segments: list[tuple[int, int]], exclusive: bool = False):
    # Restarting the sum per segment (instead of differencing one global cumsum) keeps every
    # partial sum a sum of non-negative terms, so no cancellation for long windows.
    out = np.zeros_like(x)
    for lo, hi in segments:
        cs = np.cumsum(x[..., lo:hi], axis=-1)
        if exclusive:
            out[..., lo + 1 : hi] = cs[..., :-1]
        else:
            out[..., lo:hi] = cs
    return out


def _pm2_exact_prefix(r: np.ndarray, segments: list[tuple[int, int]]) -> np.ndarray:
    """n² × exact PM-II noise term for every κ, with u_j = 1/t_j on the window [J₀, κ]."""
    B, K = r.shape
    # Complete nodes (end e < κ, start ≥ J₀): their full squared sums, filed under their end.
    full = np.zeros((B, K + 1))
    size = 1 << max(1, K.bit_length())
    c = np.zeros((B, size))
    c[:, 1 : K + 1] = r
    shift = 0
    while c.shape[-1] >= 2:
        m = np.arange(1, c.shape[-1], 2)
        end = ((m + 1) << shift) - 1
        keep = end <= K
        full[:, end[keep]] += c[:, 1::2][:, keep] ** 2
        c = c[:, 0::2] + c[:, 1::2]
        shift += 1
    total = _seg_cumsum(full[:, 1:], segments, exclusive=True)
    # Nodes used by release κ itself are cut at κ: one per set bit b, starting at κ with the
    # bits below b cleared (all inside the current block, hence inside the window).
    prefix = np.concatenate([np.zeros((B, 1)), np.cumsum(r, axis=1)], axis=1)
    kappa = np.arange(1, K + 1)
    for b in range(K.bit_length()):
        has = ((kappa >> b) & 1).astype(bool)
        k = kappa[has]
        start = (k >> b) << b
        total[:, k - 1] += (prefix[:, k] - prefix[:, start - 1]) ** 2
    return total


def _pm2_eq21_prefix(r: np.ndarray, kind: str) -> np.ndarray:
    """n² × eq. (21) PM-II noise term for every κ, with u_j = 1/t_j on the window [J₀, κ]."""
    B, K = r.shape
    out = np.zeros((B, K))
    done = np.zeros(B)  # MoM: contribution of the blocks already complete
    for level in range(1, K.bit_length() + 1):
        lo, hi = 1 << (level - 1), min((1 << level) - 1, K)
        j = np.arange(lo, hi + 1)
        bits = ((j[:, None] >> np.arange(level)) & 1).astype(float)
        part = np.sum(np.cumsum(r[:, lo - 1 : hi, None] * bits, axis=1) ** 2, axis=-1)
        out[:, lo - 1 : hi] = part + (done[:, None] if kind == "mom" else 0.0)
        done = done + part[:, -1]
    return out


def prefix_terms(
    times: ArrayLike, kind: str, mechanism: str, formula: str = "exact"
) -> tuple[np.ndarray, np.ndarray]:
    """(data_term, noise_term) of (2)/(20)/(21) for every κ = 1..K of `times` (..., K).

    Entry [..., κ−1] is Var[T_{b→a}] split as in `var_T` when a has the first κ releases and
    uses `kind` weights for that κ; vectorised prefix sums, no per-κ loop.
    """
    _check_choice("weights", kind, WEIGHT_KINDS)
    _check_mechanism(mechanism)
    _check_choice("formula", formula, FORMULAS)
    t, _ = _times_weights(times, 1.0)
    lead = t.shape[:-1]
    K = t.shape[-1]
    r = 1.0 / t.reshape(-1, K)
    j = np.arange(1, K + 1)
    if kind == "last":
        mult = j if mechanism == "pm1" else popcount(j)
        return r.reshape(t.shape), (mult * r**2).reshape(t.shape)
    segs = _segments(kind, K)
    n = (j - window_start(kind, j) + 1).astype(float)
    # Summation by parts of (2): Σ_j (w_j/t_j)(2 W_j − w_j), W_j = Σ_{i≤j} w_i (docs/papers.md
    # §1.3).
    data = _seg_cumsum((2.0 * _seg_cumsum(np.ones(K), segs) - 1.0) * r, segs)
    if mechanism == "pm1":
        # (20) is the quadratic form Σ_{j,k} u_j u_k min(j, k) over the window.
        g = _seg_cumsum(j * r, segs, exclusive=True)
        noise = _seg_cumsum(r * (j * r + 2.0 * g), segs)
    elif formula == "exact":
        noise = _pm2_exact_prefix(r, segs)
    else:
        noise = _pm2_eq21_prefix(r, kind)
    return (data / n**2).reshape(t.shape), (noise / n**2).reshape(lead + (K,))


# ------------------------------------------------------------------ round robin


def rr_query_times(M: int, position: ArrayLike, kappa: int) -> np.ndarray:
    """t_i^{(ℓ)} = (i−1)(M−1) + ℓ, i = 1..κ, of Prop. 3 (shape (..., κ) for array positions)."""
    pos = _check_positions(M, position)
    return (np.arange(int(kappa))[None, :] * (M - 1) + pos.reshape(-1, 1)).reshape(
        pos.shape + (int(kappa),)
    )


def rr_counts(M: int, position: ArrayLike, t: ArrayLike) -> np.ndarray:
    """κ^{(t)}_{ℓ→a} of Prop. 3: releases RR position ℓ has made to a by time t (broadcast)."""
    pos = _check_positions(M, position)
    tt = np.asarray(t, dtype=np.int64)
    # Same as the case split of Prop. 3, written as #{i ≥ 1 : (i−1)(M−1) + ℓ ≤ t}.
    return np.maximum(0, (tt - pos) // (M - 1) + 1)


def _check_M(M: int) -> int:
    if isinstance(M, bool) or int(M) != M or M < 2:
        raise ValueError(f"M = {M!r}: must be an integer ≥ 2")
    return int(M)


def _check_positions(M: int, position: ArrayLike) -> np.ndarray:
    M = _check_M(M)
    pos = np.asarray(position, dtype=np.int64)
    if np.any(pos < 1) or np.any(pos > M - 1):
        raise ValueError(f"position = {position!r}: RR positions run from 1 to M−1 = {M - 1}")
    return pos


def _check_grid(t: ArrayLike) -> np.ndarray:
    tt = np.asarray(t)
    ti = np.asarray(np.round(tt), dtype=np.int64)
    if tt.ndim != 1 or tt.size == 0 or np.any(ti != tt) or np.any(ti < 1):
        raise ValueError(f"t = {t!r}: must be a non-empty 1-D array of integers ≥ 1")
    return ti


def rr_inverse_variances(
    t: ArrayLike,
    M: int,
    sigma2: float,
    sigma2_dp: float,
    mechanism: str,
    weights_kind: str,
    formula: str = "exact",
) -> np.ndarray:
    """1/Var[T_{ℓ→a}] at every grid t and RR position ℓ (shape (len(t), M−1); 0 before any
    release), the summands of e_{n,t} in Prop. 3."""
    ti = _check_grid(t)
    M = _check_M(M)
    if not sigma2 > 0:
        raise ValueError(f"sigma2 = {sigma2!r}: must be > 0")
    if not sigma2_dp >= 0:
        raise ValueError(f"sigma2_dp = {sigma2_dp!r}: must be ≥ 0")
    pos = np.arange(1, M)
    K = int(rr_counts(M, 1, ti.max()))
    data, noise = prefix_terms(rr_query_times(M, pos, K), weights_kind, mechanism, formula)
    var = sigma2 * data + sigma2_dp * noise  # (M−1, K)
    kappa = rr_counts(M, pos[None, :], ti[:, None])  # (G, M−1)
    inv = 1.0 / var[pos[None, :] - 1, np.maximum(kappa, 1) - 1]
    return np.where(kappa > 0, inv, 0.0)


# ------------------------------------------------------------------ Prop. 3 oracle


def _check_p(p: float) -> None:
    if not 0 <= p <= 1:
        raise ValueError(f"p = {p!r}: must lie in [0, 1]")


def _class_variances(sigma2: ArrayLike) -> np.ndarray:
    s2 = np.atleast_1d(np.asarray(sigma2, dtype=float))
    if s2.ndim != 1 or np.any(~(s2 > 0)):
        raise ValueError(f"sigma2 = {sigma2!r}: must be a number > 0 or a list of them")
    return np.unique(s2, return_counts=True)


def oracle_mse(
    t: ArrayLike,
    M: int,
    p: float,
    sigma2: float | ArrayLike,
    sigma2_dp: float,
    mechanism: str,
    weights_kind: str,
    method: str = "montecarlo",
    n_draws: int = 20000,
    seed: int = 0,
    formula: str = "exact",
) -> tuple[np.ndarray, np.ndarray]:
    """Prop. 3: Σ_n Σ_{ℓ-subsets} p^{n−1}(1−p)^{M−n} / e_{n,t}, the RR oracle MSE on grid t.

    Each of the M−1 other agents is a class-mate independently with probability p; e_{n,t} =
    t/σ² + Σ_{class-mates ℓ} 1/Var[T_{ℓ→a}]. "exact" enumerates all 2^{M−1} subsets (M ≤ 21);
    "montecarlo" stratifies on the number of class-mates k ~ Binomial(M−1, p) (weights exact,
    ≈ n_draws·P(k) uniformly random k-subsets per stratum, at least 2) and returns the
    standard error of that estimate. `sigma2` may list per-class variances: class-mates share
    a's variance, and classes are equally likely (with one value this is the paper's formula).
    Returns (mean, stderr) arrays over t; stderr is 0 for "exact".
    """
    _check_choice("method", method, ("exact", "montecarlo"))
    _check_p(p)
    M = _check_M(M)
    ti = _check_grid(t)
    terms = _OracleTerms(ti, M, sigma2, sigma2_dp, mechanism, weights_kind, formula)
    if method == "exact":
        if M - 1 > MAX_EXACT_OTHERS:
            raise ValueError(
                f"method = 'exact' enumerates 2^(M−1) subsets; M = {M} is too large "
                f"(at most {MAX_EXACT_OTHERS + 1}); use method = 'montecarlo'"
            )
        return _oracle_exact(terms, M - 1, p)
    if int(n_draws) != n_draws or n_draws < 1:
        raise ValueError(f"n_draws = {n_draws!r}: must be an integer ≥ 1")
    return _oracle_montecarlo(terms, M - 1, p, n_draws, seed)


class _OracleTerms:
    """The summands of e_{n,t} on grid t for every class variance: t/σ² and 1/Var[T_{ℓ→a}]."""

    def __init__(
        self,
        ti: np.ndarray,
        M: int,
        sigma2: float | ArrayLike,
        sigma2_dp: float,
        mechanism: str,
        weights_kind: str,
        formula: str,
    ) -> None:
        self.ti = ti
        s2_values, s2_counts = _class_variances(sigma2)
        self.class_w = s2_counts / s2_counts.sum()
        # inv[c]: (G, M−1) inverse variances for class variance c.
        self.inv = np.stack(
            [
                rr_inverse_variances(ti, M, s2, sigma2_dp, mechanism, weights_kind, formula)
                for s2 in s2_values
            ]
        )
        self.own = ti[None, :] / s2_values[:, None]  # (C, G): t/σ² of agent a itself

    def blocks(self, members: np.ndarray):
        """(grid slice, Σ_c P(c)/e over it) for membership rows `members` (draws, M−1)."""
        x = members.astype(float)
        ti = self.ti
        # Column blocks keep the (draws × grid) matrix to about 32 MB for dense grids.
        width = max(1, (1 << 22) // len(x))
        for lo in range(0, len(ti), width):
            sl = slice(lo, lo + width)
            y = np.zeros((len(x), len(ti[sl])))
            for c in range(len(self.class_w)):
                y += self.class_w[c] / (self.own[c, sl] + x @ self.inv[c, sl].T)
            yield sl, y


def _oracle_exact(terms: _OracleTerms, others: int, p: float) -> tuple[np.ndarray, np.ndarray]:
    """`oracle_mse` over all 2^others class-mate subsets, in chunks (stderr 0)."""
    mean = np.zeros(len(terms.ti))
    chunk = 1 << 14
    for start in range(0, 1 << others, chunk):
        idx = np.arange(start, min(start + chunk, 1 << others))
        members = ((idx[:, None] >> np.arange(others)) & 1).astype(bool)
        k = members.sum(axis=1)
        prob = p**k * (1.0 - p) ** (others - k)
        for sl, y in terms.blocks(members):
            mean[sl] += prob @ y
    return mean, np.zeros(len(terms.ti))


def _oracle_montecarlo(
    terms: _OracleTerms, others: int, p: float, n_draws: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """`oracle_mse` stratified on the number of class-mates k, with its standard error."""
    mean = np.zeros(len(terms.ti))
    var = np.zeros(len(terms.ti))
    rng = np.random.default_rng(seed)
    ks = np.arange(others + 1)
    from scipy.stats import binom  # here: scipy.stats costs a run that draws no curve

    pmf = binom.pmf(ks, others, p)
    for k in ks[pmf > 0]:
        if k in (0, others):  # a single possible subset: no sampling needed
            for sl, y in terms.blocks(np.full((1, others), k == others)):
                mean[sl] += pmf[k] * y[0]
            continue
        n_k = max(2, int(round(n_draws * pmf[k])))
        order = np.argsort(rng.random((n_k, others)), axis=1)
        members = np.zeros((n_k, others), dtype=bool)
        np.put_along_axis(members, order[:, :k], True, axis=1)
        for sl, y in terms.blocks(members):
            mean[sl] += pmf[k] * y.mean(axis=0)
            var[sl] += pmf[k] ** 2 * y.var(axis=0, ddof=1) / n_k
    return mean, np.sqrt(var)


def oracle_mse_rrr(
    t: ArrayLike,
    M: int,
    p: float,
    sigma2: float | ArrayLike,
    sigma2_dp: float,
    mechanism: str,
    weights_kind: str,
    formula: str = "exact",
    tail: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray]:
    """Remark 3: the rRR oracle MSE, Σ_n C(M−1, n−1) p^{n−1}(1−p)^{M−n} / e_{n,t}.

    With an oracle, rRR queries only a's n−1 class-mates, so ℓ_j = j and M becomes n in the
    query times and counts. Class sizes with P(n) < `tail` are skipped; since 1/e ≤ σ²/t, the
    error is at most (skipped mass)·σ²/t. Returns (mean, zeros) over t.
    """
    _check_p(p)
    M = _check_M(M)
    ti = _check_grid(t)
    s2_values, s2_counts = _class_variances(sigma2)
    class_w = s2_counts / s2_counts.sum()
    ks = np.arange(M)  # class-mates
    from scipy.stats import binom  # here: scipy.stats costs a run that draws no curve

    pmf = binom.pmf(ks, M - 1, p)
    total = np.zeros(len(ti))
    for k in ks[pmf >= tail]:
        for s2, cw in zip(s2_values, class_w, strict=True):
            e = ti / s2
            if k > 0:
                e = e + rr_inverse_variances(
                    ti, k + 1, s2, sigma2_dp, mechanism, weights_kind, formula
                ).sum(axis=1)
            total += pmf[k] * cw / e
    return total, np.zeros(len(ti))
