"""PriCER's weights and noise (seed 004 §III–V): the MSE bound, privacy levels and Algorithm 3.

Notation. Node i sends α_ij x_i + n_ij to node j over τ_ij ~ Ber(p_ij), and node j forwards
what it got to the server over τ_j ~ Ber(p_j); rows of A are senders. With g_ij = p_j p_ij the
unbiasedness condition (3) is Σ_j g_ij α_ij = 1 for every i, and the pairwise privacy
constraint of (8) is α_ij ≤ c_ij σ with the slope c_ij = ε_ij / (2R √(2 ln(1.25/δ_ij))), so the
paper's box edge is w̃_ij = c_ij σ. ε_ij = ∞ means "no constraint on that pair" (ColRel is the
problem with every ε_ij = ∞, whose optimum has σ = 0).

Problem (8), min over (A, σ) of R² σ²_tv(A) + σ²_pr(σ), is solved by Algorithm 3: alternating
minimisation over A (Gauss–Seidel on the rows, first of the convex relaxation (13) with the row
update (15)–(19), then of (11) with (20)) and over σ (update (10)). Two findings shape this
module (see docs/protocols.md, "Algorithm 3 and what we changed"):

- σ²_tv(A) = Var(Σ_j c_j)/n², with c_j = Σ_i τ_i τ_ji α_ji the random coefficient of x_j in
  the estimate, is a positive semi-definite quadratic form in A, so (11), (13) and (8) are
  convex (the paper says they are not). Gauss–Seidel with exact row minimisation therefore
  reaches the optimum of (11) for a fixed σ.
- Starting from σ⁽⁰⁾ = σ_thr, update (10) can never raise σ (each A⁽ᵏ⁾ lies in the box of
  σ⁽ᵏ⁻¹⁾), so Algorithm 3 as printed stays at σ = σ_thr. `optimise` then (by default) searches
  σ ∈ [σ_thr, σ_free] for the minimum of V(σ) = min_A (8) — V is convex, being a partial
  minimum of a jointly convex problem — which reaches the optimum of (8).

Each row update is exact: the row problem is a separable convex quadratic with one linear
constraint, its solution is α_ij(λ_i) = clip((λ_i − b_ij)/D_ij, 0, w̃_ij), and λ_i is found by
bisection over the sorted breakpoints of the piecewise-linear Σ_j g_ij α_ij(λ), then
interpolation: exact where a numeric bisection is approximate, and O(n log n) per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from desim.kernel.links import Connectivity
from desim.models.privacy.accounting import check_calibration, epsilon_spent, tight_multiplier

#: Default tolerance: a Gauss–Seidel pass stops when a sweep lowers σ²_tv by less (relatively).
TOL = 1e-10
#: Default number of row updates of each Gauss–Seidel pass, per node (L1 = L2 = this × n).
SWEEPS = 400
#: Pass tolerance while searching σ (the best point is then polished with `TOL`).
SEARCH_TOL = 1e-8


class InfeasibleError(ValueError):
    """Inputs for which problem (8) has no solution, or that are not a valid problem."""


# ---------------------------------------------------------------------------------------------
# the problem


@dataclass(frozen=True)
class Problem:
    """An instance of problem (8): links p, P, E; pairwise (ε_ij, δ_ij); radius R; dimension d.

    Raises `InfeasibleError` with one sentence when (8) has no solution (a node that can reach
    the server neither directly nor through a neighbour) or an input is invalid (ε_ij ≤ 0 or
    δ_ij ∉ (0, 1] on a link that can be up, R ≤ 0, d < 1).
    """

    conn: Connectivity
    epsilon: np.ndarray
    delta: np.ndarray
    R: float = 1.0
    d: int = 1
    #: "paper": Thm. 4.1's classical Gaussian bound; "tight": the least noise multiplier for
    #: (ε_ij, δ_ij) per the PLD accountant (`desim.models.privacy.accounting`).
    calibration: str = "paper"

    def __post_init__(self) -> None:
        n = self.conn.n
        eps = np.asarray(self.epsilon, dtype=float)
        delta = np.asarray(self.delta, dtype=float)
        for name, a in (("epsilon", eps), ("delta", delta)):
            if a.shape != (n, n):
                raise InfeasibleError(f"{name} has shape {a.shape}; expected ({n}, {n})")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)
        if not (self.R > 0 and math.isfinite(self.R)):
            raise InfeasibleError(f"R = {self.R!r}: the radius must be a finite number > 0")
        if int(self.d) != self.d or self.d < 1:
            raise InfeasibleError(f"d = {self.d!r}: the dimension must be an integer ≥ 1")
        link = self.conn.P > 0
        bad = link & ~(eps > 0)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise InfeasibleError(
                f"epsilon[{i}, {j}] = {float(eps[i, j])!r}: every ε_ij of a link that can be up "
                "must be > 0 (use inf for no privacy constraint)"
            )
        bad = link & ~((delta > 0) & (delta <= 1))
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise InfeasibleError(
                f"delta[{i}, {j}] = {float(delta[i, j])!r}: every δ_ij must lie in (0, 1]"
            )
        check_calibration(self.calibration)
        object.__setattr__(self, "_multiplier", _multipliers(eps, delta, self.calibration))
        stranded = ~(self.g > 0).any(axis=1)
        if stranded.any():
            i = int(np.flatnonzero(stranded)[0])
            raise InfeasibleError(
                f"node {i} cannot reach the server: p_{i} = {self.conn.p[i]:g} and no neighbour "
                f"j has p_{i}j·p_j > 0, so the unbiasedness condition (3) cannot hold"
            )

    @property
    def n(self) -> int:
        """Number of nodes n."""
        return self.conn.n

    @property
    def g(self) -> np.ndarray:
        """g_ij = p_j p_ij, the probability that i's share to j reaches the server."""
        return self.conn.p[None, :] * self.conn.P

    @property
    def slope(self) -> np.ndarray:
        """c_ij = ε_ij / (2R √(2 ln(1.25/δ_ij))): α_ij ≤ c_ij σ is the privacy constraint.

        With tight calibration c_ij = 1/(2R m_ij), m_ij the least noise multiplier (σ over the
        sensitivity 2R α_ij) of an (ε_ij, δ_ij)-DP Gaussian release per the accountant.
        """
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.calibration == "tight":
                return np.where(self.conn.P > 0, 1.0 / (2.0 * self.R * self._multiplier), np.inf)
            root = np.sqrt(2.0 * np.log(1.25 / np.where(self.delta > 0, self.delta, 1.0)))
            return np.where(self.conn.P > 0, self.epsilon / (2.0 * self.R * root), np.inf)

    @property
    def kappa(self) -> float:
        """σ²_pr / σ² = (d/n²) Σ_ij p_j p_ij, the privacy variance per unit of noise variance."""
        return self.d * float(self.g.sum()) / self.n**2

    def without_privacy(self) -> Problem:
        """The same links with every ε_ij = ∞: the ColRel problem (its optimum has σ = 0)."""
        return Problem(
            self.conn,
            np.full_like(self.epsilon, np.inf),
            self.delta,
            self.R,
            self.d,
            self.calibration,
        )


def _multipliers(eps: np.ndarray, delta: np.ndarray, calibration: str) -> np.ndarray | None:
    """Tight noise multipliers m_ij of every pair's (ε_ij, δ_ij), 0 where unconstrained (ε = ∞
    or δ ≥ 1); None for the paper's calibration. One accountant search per distinct pair."""
    if calibration != "tight":
        return None
    out = np.zeros(eps.shape)
    free = ~np.isfinite(eps) | ~(eps > 0) | ~(delta < 1) | ~(delta > 0)
    pairs = np.stack([eps[~free], delta[~free]])
    if pairs.size:
        keys, inverse = np.unique(pairs, axis=1, return_inverse=True)
        mult = np.array([tight_multiplier("gaussian", float(e), float(d), 1) for e, d in keys.T])
        out[~free] = mult[inverse.ravel()]
    return out


def trust_matrix(
    kind: str,
    n: int,
    k: int = 0,
    P: np.ndarray | None = None,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Which pairs are trusted (a bool n × n matrix, every node trusts itself).

    ``ring``: node i trusts i+1, …, i+k (mod n), the "k trusted neighbours" of Fig. 3;
    ``links``: node i trusts every j with p_ij > 0 (Fig. 4, trust = the communication graph);
    ``random``: k others chosen uniformly by each node (from `rng`); ``all``; ``none``.
    """
    if kind in ("ring", "random") and not 0 <= k <= n - 1:
        raise ValueError(f"trusted = {k}: a node can trust 0 … {n - 1} others")
    trusted = np.eye(n, dtype=bool)
    if kind == "ring":
        i = np.repeat(np.arange(n), k)
        trusted[i, (i + np.tile(np.arange(1, k + 1), n)) % n] = True
    elif kind == "links":
        if P is None:
            raise ValueError("trust = 'links' needs the link probabilities P")
        trusted |= P > 0
    elif kind == "random":
        if rng is None:
            raise ValueError("trust = 'random' needs a random generator")
        others = np.argsort(rng.random((n, n)) + 2.0 * np.eye(n), axis=1)[:, : n - 1]
        trusted[np.repeat(np.arange(n), k), others[:, :k].ravel()] = True
    elif kind == "all":
        trusted[:] = True
    elif kind != "none":
        raise ValueError(f"trust = {kind!r}: must be ring, links, random, all or none")
    return trusted


def epsilon_matrix(trusted: np.ndarray, eps_high: float, eps_low: float) -> np.ndarray:
    """ε_ij = `eps_high` on trusted pairs (and self), `eps_low` elsewhere (Figs. 3 and 4)."""
    return np.where(trusted, float(eps_high), float(eps_low))


# ---------------------------------------------------------------------------------------------
# the objective, the bound and the privacy levels


def _reciprocal(prob: Problem) -> np.ndarray:
    """C_il = p_i p_l (E_il − p_il p_li), the weight of α_li α_il in σ²_tv (0 on the diagonal)."""
    p, P, E = prob.conn.p, prob.conn.P, prob.conn.E
    C = np.outer(p, p) * (E - P * P.T)
    np.fill_diagonal(C, 0.0)
    return C


def sigma_tv2(prob: Problem, A: np.ndarray) -> float:
    """σ²_tv(p, P, A) of Thm. 3.2, the topology-induced variance (per unit R²)."""
    p, P = prob.conn.p, prob.conn.P
    s = (P * A).sum(axis=0)  # s_j = Σ_i p_ij α_ij
    first = float(np.sum(p * (1 - p) * s * s))
    second = float(np.sum(P * p[None, :] * (1 - P) * A * A))
    third = float(np.sum(_reciprocal(prob) * A.T * A))
    return (first + second + third) / prob.n**2


def sigma_tv2_relaxed(prob: Problem, A: np.ndarray) -> float:
    """σ̄²_tv(p, P, A) of (13): α_li α_il replaced by α_il², a convex separable upper bound."""
    p, P = prob.conn.p, prob.conn.P
    s = (P * A).sum(axis=0)
    first = float(np.sum(p * (1 - p) * s * s))
    second = float(np.sum(P * p[None, :] * (1 - P) * A * A))
    third = float(np.sum(_reciprocal(prob) * A * A))
    return (first + second + third) / prob.n**2


def sigma_pr2(prob: Problem, sigma: float) -> float:
    """σ²_pr(p, P, σ) of (5) = (1/n²) Σ_ij p_j p_ij σ² d, the privacy-induced variance."""
    return prob.kappa * float(sigma) ** 2


def objective(prob: Problem, A: np.ndarray, sigma: float) -> float:
    """The objective of (8), R² σ²_tv + σ²_pr: the worst-case MSE bound (4) of Thm. 3.2."""
    return prob.R**2 * sigma_tv2(prob, A) + sigma_pr2(prob, sigma)


def bias(prob: Problem, A: np.ndarray) -> np.ndarray:
    """Σ_j p_j p_ij α_ij − 1 of every node i: zero when A satisfies the unbiasedness (3)."""
    return (prob.g * A).sum(axis=1) - 1.0


def privacy_levels(prob: Problem, A: np.ndarray, sigma: float) -> np.ndarray:
    """ε_ij of Thm. 4.1 (6) reached by weights A and noise σ (0 where p_ij = 0 or α_ij = 0);
    with tight calibration the accountant's ε_ij at δ_ij of the Gaussian release α_ij x_i + n_ij
    (noise multiplier σ/(2R α_ij))."""
    if prob.calibration == "tight":
        return _tight_levels(prob, A, sigma)
    root = np.sqrt(2.0 * np.log(1.25 / np.where(prob.delta > 0, prob.delta, 1.0)))
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = root * 2.0 * A * prob.R / sigma
    eps = np.where(A > 0, eps, 0.0)
    return np.where(prob.conn.P > 0, eps, 0.0)


def _tight_levels(prob: Problem, A: np.ndarray, sigma: float) -> np.ndarray:
    """The accountant's ε_ij for every pair with α_ij > 0 on a link (∞ if σ = 0)."""
    used = (A > 0) & (prob.conn.P > 0)
    eps = np.zeros(A.shape)
    if not used.any():
        return eps
    if sigma == 0:
        eps[used] = np.inf
        return eps
    mult = sigma / (2.0 * prob.R * A[used])
    keys, inverse = np.unique(np.stack([mult, prob.delta[used]]), axis=1, return_inverse=True)
    values = [epsilon_spent("gaussian", float(m), 1, float(d)) for m, d in keys.T]
    eps[used] = np.asarray(values)[inverse.ravel()]
    return eps


def sigma_threshold(prob: Problem) -> float:
    """σ_thr: the least σ whose privacy box meets every row's unbiasedness hyperplane."""
    reach = (prob.g * np.where(prob.g > 0, prob.slope, 0.0)).sum(axis=1)  # Σ_j g_ij c_ij
    with np.errstate(divide="ignore"):
        return float(np.max(1.0 / reach))


def sigma_update(prob: Problem, A: np.ndarray) -> float:
    """σ of (10): the least σ ≥ σ_thr that makes weights A meet every privacy constraint."""
    finite = np.isfinite(prob.slope) & (prob.conn.P > 0) & (A > 0)
    need = float(np.max(A[finite] / prob.slope[finite])) if finite.any() else 0.0
    return max(need, sigma_threshold(prob))


def coefficient_moments(conn: Connectivity, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Cov(c_j, c_l), E[c_j] − 1) of the coefficients c_j = Σ_i τ_i τ_ji α_ji of x_j.

    The estimate is x̂̄ = (1/n) Σ_j c_j x_j + noise, so these give the exact MSE of any data;
    any weights A (the naive strategy is A = I) and links `conn`.
    """
    p, P, E = conn.p, conn.P, conn.E
    B = A * P  # B_ji = α_ji p_ji
    cov = (B * (p * (1 - p))[None, :]) @ B.T
    cov[np.diag_indices_from(cov)] += np.sum(A * A * p[None, :] * P * (1 - P), axis=1)
    C = np.outer(p, p) * (E - P * P.T)
    np.fill_diagonal(C, 0.0)
    cov += A * A.T * C
    return cov, ((p[None, :] * P) * A).sum(axis=1) - 1.0


def noise_variance(
    conn: Connectivity, sigma: float, d: int, noisy_pairs: np.ndarray | None = None
) -> float:
    """(1/n²) Σ_noisy p_j p_ij σ² d: σ²_pr of (5) when every pair that can be up adds noise."""
    noisy = conn.P > 0 if noisy_pairs is None else noisy_pairs
    g = conn.p[None, :] * conn.P
    return d * float(sigma) ** 2 * float(np.sum(g * noisy)) / conn.n**2


def expected_mse(conn: Connectivity, A: np.ndarray, sigma: float, x: np.ndarray) -> float:
    """E‖x̂̄ − x̄‖² of relaying with weights A and noise σ on the data rows x (exact, over the
    links and the noise, any bias included; every pair that can be up adds noise, as in (5))."""
    cov, b = coefficient_moments(conn, A)
    signal = float(np.sum((cov + np.outer(b, b)) * (x @ x.T))) / conn.n**2
    return signal + noise_variance(conn, sigma, x.shape[1])


def worst_case_mse(conn: Connectivity, A: np.ndarray, sigma: float, R: float, d: int) -> float:
    """sup over ‖x_i‖ ≤ R of E‖x̂̄ − x̄‖²: all x_i equal, R² Σ_jl (Cov + b bᵀ)_jl / n² + σ²_pr.

    For unbiased A this is the bound (4) of Thm. 3.2, which it shows to be tight; it also holds
    for the naive strategy (A = I, biased), whose moments are all non-negative.
    """
    cov, b = coefficient_moments(conn, A)
    return R**2 * float(np.sum(cov + np.outer(b, b))) / conn.n**2 + noise_variance(conn, sigma, d)


# ---------------------------------------------------------------------------------------------
# Gauss–Seidel row updates


@dataclass(frozen=True)
class _Coefficients:
    """Per-problem arrays of the row updates (15) and (20), computed once."""

    P: np.ndarray  # p_ij
    g: np.ndarray  # g_ij = p_j p_ij
    active: np.ndarray  # g_ij > 0: the entries a row may use, (17)–(18)
    free: np.ndarray  # g_ij = 1: entries that cost nothing, case (b)
    H: np.ndarray  # p_i (E_ij/p_ij − p_ji): the reciprocity term of (15) and (20)
    D_relaxed: np.ndarray  # denominator of (15): 2[(1 − g_ij) + H_ij]
    D_exact: np.ndarray  # denominator of (20): 2(1 − g_ij)
    one_minus_p: np.ndarray  # 1 − p_j


def _coefficients(prob: Problem) -> _Coefficients:
    p, P, E = prob.conn.p, prob.conn.P, prob.conn.E
    g = prob.g
    with np.errstate(divide="ignore", invalid="ignore"):
        H = np.where(P > 0, p[:, None] * (E / P - P.T), 0.0)
    np.fill_diagonal(H, 0.0)
    H = np.maximum(H, 0.0)  # E ≥ p_ij p_ji; rounding must not make it negative
    return _Coefficients(
        P=P,
        g=g,
        active=g > 0,
        free=g == 1.0,
        H=H,
        D_relaxed=2.0 * ((1.0 - g) + H),
        D_exact=2.0 * (1.0 - g),
        one_minus_p=1.0 - p,
    )


def _box(prob: Problem, sigma: float) -> np.ndarray:
    """w̃_ij = c_ij σ (∞ where ε_ij = ∞, also at σ = 0)."""
    slope = prob.slope
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(slope), np.inf, slope * sigma)


def _water_fill(
    g: np.ndarray, b: np.ndarray, D: np.ndarray, w: np.ndarray, target: float
) -> np.ndarray:
    """α = clip((λ − b)/D, 0, w) with Σ g α = target, λ by bisection over the breakpoints.

    h(λ) = Σ g α(λ) is piecewise linear and non-decreasing with breakpoints b_j (α_j leaves 0)
    and b_j + D_j w_j (α_j reaches w_j); the breakpoints are sorted, h is accumulated on them,
    the segment holding `target` is found by binary search and λ interpolated on it.
    """
    slope = g / D
    finite = np.isfinite(w)
    points = np.concatenate([b, (b + D * w)[finite]])
    change = np.concatenate([slope, -slope[finite]])
    order = np.argsort(points, kind="stable")
    points, change = points[order], change[order]
    rate = np.cumsum(change)  # slope of h just after each breakpoint
    h = np.concatenate([[0.0], np.cumsum(rate[:-1] * np.diff(points))])
    k = int(np.searchsorted(h, target, side="left"))
    if k == 0:
        lam = points[0]
    elif k < len(h):
        lam = points[k - 1] + (target - h[k - 1]) / rate[k - 1]
    elif rate[-1] > 0:  # beyond the last breakpoint only entries without an upper bound rise
        lam = points[-1] + (target - h[-1]) / rate[-1]
    else:  # the box cannot reach the hyperplane: σ < σ_thr (callers prevent it)
        return w.copy()
    return np.clip((lam - b) / D, 0.0, w)


def _row(
    i: int, A: np.ndarray, s: np.ndarray, co: _Coefficients, w: np.ndarray, exact: bool
) -> np.ndarray:
    """The new row i of A: cases (a)–(c) with (15)–(19) (relaxed) or (20) (exact, fine tuning)."""
    n = len(s)
    new = np.zeros(n)
    gi, wi = co.g[i], w[i]
    if gi[i] == 1.0 and wi[i] >= 1.0:  # case (c), p_i = 1: keep the data at home, (19)
        new[i] = 1.0
        return new
    free = co.free[i]
    target = 1.0
    if free.any():  # case (b): entries with p_j p_ij = 1 cost nothing; fill them first
        wf = wi[free]
        total = float(np.sum(wf))
        if total >= 1.0:
            if np.isinf(total):
                unbounded = np.isinf(wf)
                new[np.flatnonzero(free)[unbounded]] = 1.0 / unbounded.sum()
            else:
                new[free] = wf / total
            return new
        new[free] = wf
        target = 1.0 - total
    use = co.active[i] & ~free
    if not use.any():
        return new
    j = np.flatnonzero(use)
    off = s[j] - co.P[i, j] * A[i, j]  # Σ_{l≠i} p_lj α_lj
    b = 2.0 * co.one_minus_p[j] * off
    if exact:  # (20): the exact cross term with α_ji of the other row
        b = b + 2.0 * co.H[i, j] * A[j, i]
        D = co.D_exact[i, j]
    else:  # (15): the relaxation (13)
        D = co.D_relaxed[i, j]
    new[j] = _water_fill(co.g[i, j], b, D, wi[j], target)
    return new


def gauss_seidel(
    prob: Problem,
    A: np.ndarray,
    sigma: float,
    updates: int,
    exact: bool,
    tol: float = TOL,
    co: _Coefficients | None = None,
) -> tuple[np.ndarray, int, bool]:
    """Up to `updates` row updates (14) of (13) or, with `exact`, of (11), for a fixed σ.

    Rows are visited cyclically (the paper's i = ℓ mod n). Every row update is exact, so the
    weights always satisfy (3) and the box; the pass stops early after a full sweep that lowers
    σ²_tv (relaxed or exact) by at most `tol` relatively (the descent is linear, so what is
    left is then of the same order). Returns (A, updates used, converged).
    """
    co = co or _coefficients(prob)
    tv = sigma_tv2 if exact else sigma_tv2_relaxed
    A = np.array(A, dtype=float)
    n = prob.n
    w = _box(prob, sigma)
    used = 0
    before = tv(prob, A)
    while used < updates:
        s = (co.P * A).sum(axis=0)  # column sums, refreshed every sweep against drift
        for i in range(min(n, updates - used)):
            new = _row(i, A, s, co, w, exact)
            s += co.P[i] * (new - A[i])
            A[i] = new
        used += min(n, updates - used)
        after = tv(prob, A)
        # |change|: the first sweep from a start outside the box may raise σ²_tv
        if used % n == 0 and abs(before - after) <= tol * after:
            return A, used, True
        before = after
    return A, used, False


def _initial(prob: Problem) -> np.ndarray:
    """A⁽⁰⁾ = diag(1/p_i) of Alg. 3; a node with p_i = 0 spreads 1 evenly over its relays."""
    n = prob.n
    A = np.zeros((n, n))
    p = prob.conn.p
    direct = p > 0
    A[direct, direct] = 1.0 / p[direct]
    g = prob.g
    for i in np.flatnonzero(~direct):
        j = g[i] > 0
        A[i, j] = 1.0 / (j.sum() * g[i, j])
    return A


@dataclass(frozen=True)
class Iteration:
    """One outer iteration k of Alg. 3: the σ it used, what the passes did, the new σ (10)."""

    k: int
    sigma: float
    relaxed_objective: float
    updates_relaxed: int
    converged_relaxed: bool
    updates_exact: int
    converged_exact: bool
    objective: float
    sigma_next: float


@dataclass(frozen=True)
class Report:
    """How the optimiser went: Alg. 3's iterations, the σ search, the final residuals."""

    sigma_thr: float
    iterations: tuple[Iteration, ...]
    alg3_objective: float
    search: tuple[tuple[float, float], ...]
    objective: float
    sigma: float
    bias: float
    privacy_excess: float
    converged: bool

    def summary(self) -> str:
        """A few lines for people: iterations, σ, objective, residuals."""
        lines = [f"σ_thr = {self.sigma_thr:.6g}"]
        for it in self.iterations:
            lines.append(
                f"k = {it.k}: σ = {it.sigma:.6g}, relaxed (13) = {it.relaxed_objective:.6g} "
                f"after {it.updates_relaxed} row updates"
                f"{'' if it.converged_relaxed else ' (not converged)'}, (8) = {it.objective:.6g}"
                f" after {it.updates_exact}{'' if it.converged_exact else ' (not converged)'}, "
                f"σ (10) → {it.sigma_next:.6g}"
            )
        if self.search:
            best = min(self.search, key=lambda e: e[1])
            lines.append(
                f"σ search: {len(self.search)} evaluations, best V({best[0]:.6g}) = "
                f"{best[1]:.6g} (Alg. 3 as printed: {self.alg3_objective:.6g})"
            )
        lines.append(
            f"result: σ = {self.sigma:.6g}, objective (8) = {self.objective:.6g}, "
            f"max |bias| = {self.bias:.2e}, max ε excess = {self.privacy_excess:.2e}, "
            f"{'converged' if self.converged else 'NOT converged'}"
        )
        return "\n".join(lines)


@dataclass(frozen=True)
class Solution:
    """Weights A and noise σ for problem (8), their objective, and the optimiser's report."""

    A: np.ndarray
    sigma: float
    objective: float
    report: Report = field(repr=False)


def weights_step(
    prob: Problem,
    sigma: float,
    A: np.ndarray,
    L1: int,
    L2: int,
    tol: float = TOL,
    co: _Coefficients | None = None,
) -> tuple[np.ndarray, tuple[float, int, bool, int, bool]]:
    """Alg. 3 lines 3–9 for a fixed σ: L1 row updates of (13), then L2 of (11) (fine tuning).

    Returns the weights and (relaxed objective, updates and convergence of both passes).
    """
    co = co or _coefficients(prob)
    A, used1, ok1 = gauss_seidel(prob, A, sigma, L1, exact=False, tol=tol, co=co)
    relaxed = prob.R**2 * sigma_tv2_relaxed(prob, A) + sigma_pr2(prob, sigma)
    A, used2, ok2 = gauss_seidel(prob, A, sigma, L2, exact=True, tol=tol, co=co)
    return A, (relaxed, used1, ok1, used2, ok2)


def optimise(
    prob: Problem,
    K: int = 2,
    L1: int | None = None,
    L2: int | None = None,
    sigma_search: bool = True,
    tol: float = TOL,
) -> Solution:
    """Algorithm 3 (K outer iterations of L1 relaxed and L2 exact row updates and update (10)),
    then, with `sigma_search`, the search over σ ∈ [σ_thr, σ_free] that makes it reach (8)'s
    optimum (Alg. 3 alone keeps σ = σ_thr, see the module notes).

    L1 and L2 count single-row updates as in the paper (default `SWEEPS`·n each; passes stop
    early once a sweep changes nothing). The returned σ is update (10) of the returned A, so
    every privacy constraint holds by construction.
    """
    if K < 1:
        raise ValueError(f"K = {K}: Algorithm 3 needs at least one outer iteration")
    n = prob.n
    L1 = SWEEPS * n if L1 is None else int(L1)
    L2 = SWEEPS * n if L2 is None else int(L2)
    co = _coefficients(prob)
    thr = sigma_threshold(prob)
    sigma, A = thr, _initial(prob)
    iterations = []
    for k in range(1, K + 1):
        A, (relaxed, u1, ok1, u2, ok2) = weights_step(prob, sigma, A, L1, L2, tol, co)
        nxt = sigma_update(prob, A)
        iterations.append(
            Iteration(k, sigma, relaxed, u1, ok1, u2, ok2, objective(prob, A, nxt), nxt)
        )
        done = abs(nxt - sigma) <= tol * max(sigma, 1e-300)
        sigma = nxt
        if done:
            break
    alg3 = objective(prob, A, sigma)
    converged = iterations[-1].converged_exact
    search: list[tuple[float, float]] = []
    if sigma_search:
        A, converged, search = _search_sigma(prob, A, thr, L1, L2, tol, co, converged)
        sigma = sigma_update(prob, A)
    value = objective(prob, A, sigma)
    finite = (prob.conn.P > 0) & np.isfinite(prob.epsilon)
    excess = np.where(
        finite, privacy_levels(prob, A, sigma) - np.where(finite, prob.epsilon, 0), -np.inf
    )
    report = Report(
        sigma_thr=thr,
        iterations=tuple(iterations),
        alg3_objective=alg3,
        search=tuple(search),
        objective=value,
        sigma=sigma,
        bias=float(np.max(np.abs(bias(prob, A)))),
        privacy_excess=float(np.max(excess)),
        converged=converged,
    )
    return Solution(A, sigma, value, report)


def _search_sigma(
    prob: Problem,
    A: np.ndarray,
    thr: float,
    L1: int,
    L2: int,
    tol: float,
    co: _Coefficients,
    converged: bool,
) -> tuple[np.ndarray, bool, list[tuple[float, float]]]:
    """Minimise V(σ) = min_A (8) over σ ∈ [σ_thr, σ_free] (V is convex; Brent in log σ).

    σ_free is the noise the unconstrained (ColRel) weights would need: beyond it V only grows.
    The search evaluates V with a looser pass tolerance (`SEARCH_TOL`), then polishes the best
    point with `tol`. Returns the best weights found (Alg. 3's own are a candidate), whether
    their pass converged, and the evaluations (σ, V(σ)).
    """
    free = optimise(prob.without_privacy(), K=1, L1=L1, L2=L2, sigma_search=False, tol=tol)
    sigma_free = sigma_update(prob, free.A)
    if not sigma_free > thr * (1.0 + 1e-9):
        return A, converged, []
    loose = max(tol, SEARCH_TOL)
    best: tuple[float, np.ndarray, float | None] = (
        objective(prob, A, sigma_update(prob, A)),
        A,
        None,
    )
    evals: list[tuple[float, float]] = []
    warm = [A]

    def value(log_sigma: float) -> float:
        nonlocal best
        sigma = math.exp(log_sigma)
        # warm started near the optimum, the exact pass alone suffices (the relaxed pass of
        # Alg. 3 only provides a starting point)
        B, _, _ = gauss_seidel(prob, warm[0], sigma, L2, exact=True, tol=loose, co=co)
        warm[0] = B
        v = objective(prob, B, sigma)
        evals.append((sigma, v))
        if v < best[0]:
            best = (v, B, sigma)
        return v

    # log σ: the range may span decades; σ_thr = 0 (a row with an unconstrained pair) is kept
    # as a candidate (Alg. 3's own weights) and the search starts 9 decades below σ_free
    low, high = math.log(max(thr, sigma_free * 1e-9)), math.log(sigma_free)
    step = min(1e-3, (high - low) / 2)
    # V is convex: if it does not fall just above σ_thr, its minimum lies within that step
    if value(low + step) < objective(prob, A, thr):
        from scipy.optimize import minimize_scalar  # here: only PriCER runs pay for it

        minimize_scalar(value, bounds=(low, high), method="bounded", options={"xatol": 1e-3})
    v, B, sigma = best
    if sigma is None:  # Alg. 3's weights stay best
        chosen = (v, A, converged)
    else:
        B, _, ok = gauss_seidel(prob, B, sigma, L2, exact=True, tol=tol, co=co)
        chosen = (objective(prob, B, sigma), B, ok)
    v_free = objective(prob, free.A, sigma_free)
    if v_free < chosen[0]:
        chosen = (v_free, free.A, free.report.converged)
    return chosen[1], chosen[2], evals


def colrel(prob: Problem, L1: int | None = None, L2: int | None = None) -> Solution:
    """ColRel's weights (PriCER without privacy, σ = 0): (8) with every ε_ij = ∞."""
    return optimise(prob.without_privacy(), K=1, L1=L1, L2=L2, sigma_search=False)
