"""PriCER's optimiser (seed 004 §III–V): formulas against the paper's sums, Algorithm 3 against a
generic scipy solution of (8), constraints of every output, infeasible inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from desim.kernel.links import Connectivity
from desim.models.pricer import optimiser as po
from desim.network_models.links import reciprocity_matrix


def random_problem(
    rng: np.random.Generator, n: int, rho: float | None = None, d: int | None = None
) -> po.Problem:
    """A random instance: some links absent, some p_i ∈ {0, 1}, ε over five decades."""
    p = rng.uniform(0, 1, n)
    p[rng.random(n) < 0.15] = rng.choice([0.0, 1.0])
    P = rng.uniform(0, 1, (n, n)) * (rng.random((n, n)) < 0.75)
    if rng.random() < 0.5:
        P = np.maximum(P, P.T)
    P[rng.random((n, n)) < 0.1] = 1.0
    np.fill_diagonal(P, 1.0)
    rho = rng.uniform() if rho is None else rho
    eps = np.exp(rng.uniform(np.log(0.05), np.log(1e3), (n, n)))
    delta = np.exp(rng.uniform(np.log(1e-6), 0, (n, n)))
    return po.Problem(
        Connectivity(p, P, reciprocity_matrix(P, rho)),
        eps,
        delta,
        float(rng.uniform(0.5, 3)),
        int(d or rng.choice([1, 10, 1000])),
    )


def feasible_problems(seed: int, count: int, n_max: int = 8) -> list[po.Problem]:
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        try:
            out.append(random_problem(rng, int(rng.integers(2, n_max + 1))))
        except po.InfeasibleError:
            continue
    return out


# ---- the formulas, against the paper's sums written out ---------------------------------------


def paper_sigma_tv2(prob, A, relaxed=False):
    """σ²_tv of Thm. 3.2 (or σ̄²_tv of (13)) as printed: triple and double sums."""
    n, p, P, E = prob.n, prob.conn.p, prob.conn.P, prob.conn.E
    total = 0.0
    for i in range(n):
        for j in range(n):
            for m in range(n):
                total += p[j] * (1 - p[j]) * P[i, j] * P[m, j] * A[i, j] * A[m, j]
    for i in range(n):
        for j in range(n):
            total += P[i, j] * p[j] * (1 - P[i, j]) * A[i, j] ** 2
    for i in range(n):
        for m in range(n):
            pair = A[i, m] ** 2 if relaxed else A[m, i] * A[i, m]
            total += p[i] * p[m] * (E[i, m] - P[i, m] * P[m, i]) * pair
    return total / n**2


def test_objective_terms_equal_the_printed_sums():
    rng = np.random.default_rng(1)
    for prob in feasible_problems(2, 6):
        A = rng.uniform(0, 2, (prob.n, prob.n))
        assert po.sigma_tv2(prob, A) == pytest.approx(paper_sigma_tv2(prob, A), rel=1e-12)
        assert po.sigma_tv2_relaxed(prob, A) == pytest.approx(
            paper_sigma_tv2(prob, A, True), rel=1e-12
        )
        sigma = 0.7
        piv = (
            sum(
                prob.conn.p[j] * prob.conn.P[i, j] * sigma**2 * prob.d
                for i in range(prob.n)
                for j in range(prob.n)
            )
            / prob.n**2
        )
        assert po.sigma_pr2(prob, sigma) == pytest.approx(piv, rel=1e-12)
        assert po.objective(prob, A, sigma) == pytest.approx(
            prob.R**2 * paper_sigma_tv2(prob, A) + piv, rel=1e-12
        )
        # the relaxation (13) bounds (11) from above (α_li α_il ≤ (α_li² + α_il²)/2)
        assert po.sigma_tv2_relaxed(prob, A) >= po.sigma_tv2(prob, A) - 1e-15


def test_privacy_levels_threshold_and_sigma_update_follow_6_and_10():
    prob = feasible_problems(3, 1)[0]
    n, R = prob.n, prob.R
    rng = np.random.default_rng(0)
    A = rng.uniform(0, 1, (n, n)) * (prob.conn.P > 0)
    root = np.sqrt(2 * np.log(1.25 / prob.delta))
    sigma = 1.3
    expect = np.where(prob.conn.P > 0, root * 2 * A * R / sigma, 0.0)
    assert np.allclose(po.privacy_levels(prob, A, sigma), expect, rtol=1e-12)
    g = prob.conn.p[None, :] * prob.conn.P
    thr = 2 * R * np.max(1 / (g * prob.epsilon / root).sum(axis=1))
    assert po.sigma_threshold(prob) == pytest.approx(thr, rel=1e-12)
    need = np.max(np.where(prob.conn.P > 0, root * 2 * A * R / prob.epsilon, 0))
    assert po.sigma_update(prob, A) == pytest.approx(max(need, thr), rel=1e-12)


def test_sigma_tv2_is_a_positive_semidefinite_form_so_problem_8_is_convex():
    """The paper calls (8) and (11) non-convex; σ²_tv = Var(Σ_j c_j)/n² is PSD in A."""
    for seed in range(6):
        prob = random_problem(np.random.default_rng(seed), 5, rho=[0.0, 0.5, 1.0][seed % 3])
        n = prob.n
        Q = np.zeros((n * n, n * n))
        for k in range(n * n):  # Q from the quadratic form by polarisation
            for m in range(n * n):
                e = np.zeros(n * n)
                e[k] += 1
                e[m] += 1
                Q[k, m] = po.sigma_tv2(prob, e.reshape(n, n))
        diag = np.diag(Q).copy() / 4
        Q = (Q - diag[:, None] - diag[None, :]) / 2
        assert np.linalg.eigvalsh((Q + Q.T) / 2).min() > -1e-12


def test_expected_mse_matches_a_direct_monte_carlo_of_the_estimator():
    """The moments behind Thm. 3.2, checked by drawing τ and noise in plain numpy."""
    rng = np.random.default_rng(7)
    n, d, draws = 4, 3, 200_000
    p = np.array([0.3, 0.9, 0.6, 1.0])
    P = np.array([[1, 0.7, 0.5, 0.0], [0.7, 1, 0.2, 0.9], [0.5, 0.2, 1, 0.4], [0.3, 0.9, 0.4, 1]])
    rho = 0.6
    conn = Connectivity(p, P, reciprocity_matrix(P, rho))
    A = rng.uniform(0, 1.5, (n, n)) * (P > 0)
    x = rng.normal(size=(n, d)) + 0.5
    sigma = 0.3
    # τ_ij with the coupling of desim.kernel.links: shared uniform with probability ρ
    u_shared = rng.random((draws, n, n))
    u_shared = np.triu(u_shared, 1) + np.transpose(np.triu(u_shared, 1), (0, 2, 1))
    coupled = rng.random((draws, n, n)) < rho
    coupled = np.triu(coupled, 1) | np.transpose(np.triu(coupled, 1), (0, 2, 1))
    u = np.where(coupled, u_shared, rng.random((draws, n, n)))
    tau = u < P
    tau[:, np.arange(n), np.arange(n)] = True
    up = rng.random((draws, n)) < p
    # x̂ = (1/n) Σ_j τ_j Σ_i τ_ij (α_ij x_i + n_ij) over links that can be up
    coef = np.einsum("kj,kij,ij->ki", up, tau, A)  # c_i of every draw
    est = coef @ x / n
    noise_count = np.einsum("kj,kij,ij->k", up, tau, (P > 0).astype(float))
    err = ((est - x.mean(axis=0)) ** 2).sum(axis=1) + noise_count * sigma**2 * d / n**2
    exact = po.expected_mse(conn, A, sigma, x)
    assert abs(err.mean() - exact) < 4 * err.std() / np.sqrt(draws)


def test_worst_case_mse_of_unbiased_weights_is_the_thm_3_2_bound_and_is_tight():
    for prob in feasible_problems(4, 4):
        sol = po.optimise(prob)
        bound = po.objective(prob, sol.A, sol.sigma)
        assert po.worst_case_mse(prob.conn, sol.A, sol.sigma, prob.R, prob.d) == pytest.approx(
            bound, rel=1e-10
        )
        same = np.tile(np.r_[prob.R, np.zeros(prob.d - 1)], (prob.n, 1))  # all x_i equal, norm R
        assert po.expected_mse(prob.conn, sol.A, sol.sigma, same) == pytest.approx(bound, rel=1e-10)


# ---- every output satisfies the constraints of (8) --------------------------------------------


@st.composite
def problems(draw):
    n = draw(st.integers(1, 7))
    p = np.array(
        draw(st.lists(st.sampled_from([0.0, 0.05, 0.3, 0.7, 0.95, 1.0]), min_size=n, max_size=n))
    )
    P = np.array(
        draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), min_size=n * n, max_size=n * n))
    ).reshape(n, n)
    np.fill_diagonal(P, 1.0)
    rho = draw(st.sampled_from([0.0, 0.3, 1.0]))
    eps = np.array(draw(st.lists(st.floats(1e-3, 1e4), min_size=n * n, max_size=n * n))).reshape(
        n, n
    )
    if draw(st.booleans()):
        eps[
            np.array(draw(st.lists(st.booleans(), min_size=n * n, max_size=n * n))).reshape(n, n)
        ] = np.inf
    delta = np.array(draw(st.lists(st.floats(1e-9, 1.0), min_size=n * n, max_size=n * n))).reshape(
        n, n
    )
    R = draw(st.floats(0.01, 100))
    d = draw(st.sampled_from([1, 7, 1000]))
    try:
        return po.Problem(Connectivity(p, P, reciprocity_matrix(P, rho)), eps, delta, R, d)
    except po.InfeasibleError:
        assume(False)


@given(prob=problems(), search=st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_every_output_is_nonnegative_unbiased_and_private(prob, search):
    sol = po.optimise(prob, sigma_search=search)
    A, sigma = sol.A, sol.sigma
    assert A.min() >= 0 and sigma >= 0 and np.isfinite(sol.objective)
    assert np.all(A[prob.conn.P == 0] == 0)
    assert np.max(np.abs(po.bias(prob, A))) <= 1e-9  # eq. (3)
    levels = po.privacy_levels(prob, A, sigma)
    limited = (prob.conn.P > 0) & np.isfinite(prob.epsilon)
    if sigma > 0:
        assert np.all(levels[limited] <= prob.epsilon[limited] + 1e-9)  # each pair, (6)
    else:  # no noise: only pairs without a constraint may carry data
        assert np.all(A[limited] == 0)
    assert sol.report.bias <= 1e-9 and sol.report.privacy_excess <= 1e-9
    assert sigma >= po.sigma_threshold(prob) * (1 - 1e-12)


# ---- optimality: Algorithm 3 (with the σ search) against a generic solver of (8) ----------


def slsqp_solution(prob: po.Problem, starts: int, seed: int) -> float:
    """The best objective of (8) that SLSQP finds from `starts` random starting points."""
    n = prob.n
    free = np.flatnonzero((prob.conn.P > 0).ravel())
    m = len(free)
    Q = np.zeros((m, m))
    for a in range(m):  # σ²_tv restricted to the links that can be up, by polarisation
        for b in range(a, m):
            e = np.zeros(n * n)
            e[free[a]] += 1
            e[free[b]] += 1
            Q[a, b] = Q[b, a] = po.sigma_tv2(prob, e.reshape(n, n))
    diag = np.diag(Q).copy() / 4
    Q = prob.R**2 * (Q - diag[:, None] - diag[None, :]) / 2
    np.fill_diagonal(Q, prob.R**2 * diag)
    kappa = prob.kappa
    g, slope = prob.g.ravel()[free], prob.slope.ravel()[free]
    rows = free // n
    A_eq = np.zeros((n, m + 1))
    A_eq[rows, np.arange(m)] = g
    lim = np.isfinite(slope)
    A_in = np.zeros((lim.sum(), m + 1))
    A_in[np.arange(lim.sum()), np.flatnonzero(lim)] = -1.0
    A_in[:, m] = slope[lim]
    cons = [
        {"type": "eq", "fun": lambda z: A_eq @ z - 1, "jac": lambda z: A_eq},
        {"type": "ineq", "fun": lambda z: A_in @ z, "jac": lambda z: A_in},
    ]

    def f(z):
        return z[:m] @ Q @ z[:m] + kappa * z[m] ** 2

    def df(z):
        return np.r_[2 * Q @ z[:m], 2 * kappa * z[m]]

    rng = np.random.default_rng(seed)
    thr = po.sigma_threshold(prob)
    best = np.inf
    for _ in range(starts):
        z0 = np.r_[rng.random(m), thr * np.exp(rng.uniform(0, 2))]
        res = minimize(
            f,
            z0,
            jac=df,
            constraints=cons,
            bounds=[(0, None)] * (m + 1),
            method="SLSQP",
            options={"maxiter": 1000, "ftol": 1e-14},
        )
        z = res.x
        feasible = (
            np.abs(A_eq @ z - 1).max() < 1e-7 and (A_in @ z).min() > -1e-7 and z.min() > -1e-9
        )
        if feasible:
            best = min(best, f(z))
    return best


# The problems whose reference (SLSQP from four starts) takes longest are checked in the slow set.
SLOW_REFERENCE = {0, 3, 4}


@pytest.mark.parametrize(
    "seed",
    [pytest.param(s, marks=[pytest.mark.slow] if s in SLOW_REFERENCE else []) for s in range(8)],
)
def test_objective_is_within_one_percent_of_a_generic_solver_or_better(seed):
    prob = feasible_problems(100 + seed, 1)[0]
    ours = po.optimise(prob).objective
    reference = slsqp_solution(prob, starts=4, seed=seed)
    assert np.isfinite(reference)
    assert ours <= 1.01 * reference


def test_algorithm_3_as_printed_keeps_sigma_at_the_threshold_and_can_be_far_from_optimal():
    n = 10
    p = np.array([0.1, 0.1, 0.8, 0.1, 0.1, 0.9, 0.1, 0.1, 0.9, 0.1])
    P = np.full((n, n), 0.9)
    np.fill_diagonal(P, 1.0)
    eps = po.epsilon_matrix(po.trust_matrix("ring", n, 9), 1e3, 0.1)
    prob = po.Problem(
        Connectivity(p, P, reciprocity_matrix(P, 1.0)), eps, np.full((n, n), 1e-3), 1.0, 1
    )
    printed = po.optimise(prob, K=4, sigma_search=False)
    assert all(it.sigma == po.sigma_threshold(prob) for it in printed.report.iterations)
    assert printed.sigma == pytest.approx(po.sigma_threshold(prob), rel=1e-12)
    best = po.optimise(prob)
    assert best.sigma > 1.2 * printed.sigma
    assert best.objective < 0.6 * printed.objective
    assert "σ search" in best.report.summary() and best.report.converged


def test_colrel_has_no_noise_and_bounds_pricer_from_below():
    for prob in feasible_problems(9, 4):
        free = po.colrel(prob)
        assert free.sigma == 0 and free.objective == pytest.approx(
            prob.R**2 * po.sigma_tv2(prob, free.A)
        )
        assert po.optimise(prob).objective >= free.objective * (1 - 1e-9)
        relaxed = po.Problem(prob.conn, np.full((prob.n, prob.n), 1e12), prob.delta, prob.R, prob.d)
        assert po.optimise(relaxed).objective == pytest.approx(free.objective, rel=1e-6)


# ---- inputs ------------------------------------------------------------------------------------


def _simple(p, P, eps=1.0, delta=1e-3):
    P = np.asarray(P, dtype=float)
    n = len(p)
    return po.Problem(
        Connectivity(np.asarray(p, float), P, reciprocity_matrix(P, 1.0)),
        np.full((n, n), eps),
        np.full((n, n), delta),
    )


def test_infeasible_inputs_stop_with_one_clear_message():
    with pytest.raises(po.InfeasibleError, match="node 1 cannot reach the server: p_1 = 0"):
        _simple([0.5, 0.0], [[1, 0], [0, 1]])
    with pytest.raises(po.InfeasibleError, match="node 1 cannot reach the server"):
        _simple([0.5, 0.0, 0.0], [[1, 0, 0], [0, 1, 0.5], [0, 0.5, 1]])
    assert _simple([0.5, 0.0], [[1, 0], [0.5, 1]]).n == 2  # relayed through node 0: feasible
    with pytest.raises(po.InfeasibleError, match=r"epsilon\[0, 0\] = 0.0: .* must be > 0"):
        _simple([0.5, 0.5], np.eye(2), eps=0.0)
    with pytest.raises(po.InfeasibleError, match="must be > 0"):
        _simple([0.5, 0.5], np.eye(2), eps=-1.0)
    with pytest.raises(po.InfeasibleError, match=r"delta\[0, 0\] = 0.0: .* \(0, 1\]"):
        _simple([0.5, 0.5], np.eye(2), delta=0.0)
    with pytest.raises(po.InfeasibleError, match=r"\(0, 1\]"):
        _simple([0.5, 0.5], np.eye(2), delta=1.5)
    assert _simple([0.5, 0.5], np.eye(2), delta=1.0).n == 2
    with pytest.raises(ValueError, match="K = 0"):
        po.optimise(_simple([0.5], [[1.0]]), K=0)


def test_a_node_without_uplink_relays_everything_and_a_perfect_node_keeps_its_data():
    sol = po.optimise(_simple([1.0, 0.0], [[1, 0.5], [0.5, 1]], eps=50.0))
    assert sol.A[1, 1] == 0 and sol.A[1, 0] == pytest.approx(2.0)  # 1 / (p_0 p_10)
    assert sol.A[0, 0] == 1.0 and sol.A[0, 1] == 0.0  # case (c), eq. (19)


def test_trust_matrices():
    ring = po.trust_matrix("ring", 5, 2)
    assert ring[0].tolist() == [True, True, True, False, False] and ring[4, 1]
    assert po.trust_matrix("none", 3).sum() == 3 and po.trust_matrix("all", 3).all()
    P = np.array([[1, 0.5, 0], [0.5, 1, 0], [0, 0, 1]])
    assert po.trust_matrix("links", 3, P=P).tolist() == [
        [True, True, False],
        [True, True, False],
        [False, False, True],
    ]
    rand = po.trust_matrix("random", 6, 3, rng=np.random.default_rng(0))
    assert (rand.sum(axis=1) == 4).all() and rand.diagonal().all()
    with pytest.raises(ValueError, match="trusted = 6"):
        po.trust_matrix("ring", 6, 6)
    eps = po.epsilon_matrix(ring, 1e3, 0.1)
    assert eps[0, 1] == 1e3 and eps[0, 3] == 0.1
