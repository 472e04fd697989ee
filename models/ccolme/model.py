"""The model of C-ColME and Private-C-ColME as pure functions, one per step of the papers.

Each function computes one formula of docs/papers.md (§2 for Galante et al.'s C-ColME, §3 for
seed 001's Private-C-ColME) on numbers or arrays, with no protocol state, so that it can be
checked against the paper alone (tests/models/test_ccolme_model.py does, with values computed
by hand). The protocol (`desim.models.ccolme.protocol`) calls them with the same operations in
the same order as before they were pulled out, so every stored result stays bit for bit.

- neighbour test: `confidence_radius` and `optimistic_keep` (the optimistic distance, §2.1,
  §2.2, §3.4), `pair_parameters`, `bernstein_threshold` and `bernstein_keep` (§3.3);
- weights: `edge_weight` and `metropolis_weights` (eq. (2), Metropolis-type), `row_sums`;
- update: `one_minus_alpha` (the α schedule), `mix` (W Y), `consensus_update`
  (Y = (1−α) X̃ + α W Y);
- fallback: `small_component` (|C̃_a| seems 1 or 2: report the local mean, §3.6).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from desim.models.ccolme.compiled import CompiledPass
from desim.topologies.graph import Graph

# -- the neighbour test -----------------------------------------------------------------------


def confidence_radius(
    n: np.ndarray | float, sigma2: np.ndarray | float, gamma: float
) -> np.ndarray:
    """β(n; σ, γ) = σ √((2/n)(1 + 1/n) ln(√(n+1)/γ)), +∞ for n < 2 (docs/papers.md §2.1)."""
    n = np.asarray(n, dtype=float)
    if n.ndim == 0 and n >= 2:  # one finite radius (every slot's case): nothing to silence
        return np.sqrt(sigma2 * (2.0 / n) * (1.0 + 1.0 / n) * np.log(np.sqrt(n + 1.0) / gamma))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(sigma2 * (2.0 / n) * (1.0 + 1.0 / n) * np.log(np.sqrt(n + 1.0) / gamma))
    return np.where(n < 2, np.inf, r)


def bernstein_threshold(
    n: np.ndarray | float,
    sigma2: np.ndarray | float,
    beta: np.ndarray | float,
    theta: np.ndarray | float,
    exact: bool = True,
) -> np.ndarray:
    """z with 2 exp(−n z²/(2(σ² + βz))) = θ (exact), or z' = 2βℓ/n + σ√(2ℓ/n), ℓ = ln(2/θ).

    Accepting H0 (same mean) iff |S| < z bounds the type-I error of a mean of n terms with
    variance σ² and Bernstein parameter β by θ (seed 001 §II-D, Lemma 4).
    """
    n = np.asarray(n, dtype=float)
    ell = np.log(2.0 / np.asarray(theta, dtype=float))
    if exact:
        return (beta * ell + np.sqrt(beta * beta * ell * ell + 2.0 * n * sigma2 * ell)) / n
    return 2.0 * beta * ell / n + np.sqrt(sigma2 * 2.0 * ell / n)


def data_bernstein_parameter(distribution: str, sigma2: np.ndarray) -> np.ndarray:
    """β_a of every agent's data: uniform σ√(3/20) (Lemma 2), Gaussian σ/2, Bernoulli 1/3."""
    sigma = np.sqrt(np.asarray(sigma2, dtype=float))
    if distribution == "uniform":
        return sigma * math.sqrt(3.0 / 20.0)
    if distribution == "gaussian":
        return sigma / 2.0
    return np.full_like(sigma, 1.0 / 3.0)


def optimistic_keep(
    diff: np.ndarray,
    n_a: np.ndarray | float,
    n_b: np.ndarray | float,
    sigma2_a: np.ndarray | float,
    sigma2_b: np.ndarray | float,
    gamma: float,
) -> np.ndarray:
    """χ_a(b) by the optimistic distance: |X̃_a − X̃_b| ≤ β(n_a; σ̃_a, γ) + β(n_b; σ̃_b, γ).

    `diff` is |X̃_a − X̃_b|, n_a and n_b the numbers of samples behind each mean (§2.2, §3.4).
    """
    return diff <= optimistic_bound(n_a, n_b, sigma2_a, sigma2_b, gamma)


def optimistic_bound(
    n_a: np.ndarray | float,
    n_b: np.ndarray | float,
    sigma2_a: np.ndarray | float,
    sigma2_b: np.ndarray | float,
    gamma: float,
) -> np.ndarray:
    """β(n_a; σ̃_a, γ) + β(n_b; σ̃_b, γ), the bound of the optimistic distance (§2.2, §3.4)."""
    return confidence_radius(n_a, sigma2_a, gamma) + confidence_radius(n_b, sigma2_b, gamma)


def pair_parameters(
    sigma2_a: np.ndarray | float,
    sigma2_b: np.ndarray | float,
    beta_a: np.ndarray | float,
    beta_b: np.ndarray | float,
    sigma_a: np.ndarray | float,
    sigma_b: np.ndarray | float,
    sigma2_dp: float,
) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(σ_ab², β_ab) of the Bernstein pair test on X̃_a − X̃_b (§3.3).

    σ_ab² = σ̃_a² + σ̃_b² and β_ab = √k·max(β_a, β_b, σ_a, σ_b, β_DP, σ_DP) over the k = 2
    (no noise) or 4 independent terms X_a, X_b, Z_a, Z_b, with β_DP = σ_DP/√2 ≤ σ_DP. Floats
    in, floats out (one pair for all: equal variances); arrays are taken element-wise.
    """
    terms = 4 if sigma2_dp > 0 else 2  # X_a, X_b (and Z_a, Z_b) are independent
    s_dp = math.sqrt(sigma2_dp)
    s2 = sigma2_a + sigma2_b
    if isinstance(beta_a, float):  # one pair for all
        bounds = (beta_a, beta_b, sigma_a, sigma_b, s_dp / math.sqrt(2.0), s_dp)
        return s2, math.sqrt(terms) * max(bounds)  # type: ignore[type-var]
    beta = math.sqrt(terms) * np.maximum.reduce(
        [beta_a, beta_b, sigma_a, sigma_b, np.full(len(beta_a), s_dp)]  # type: ignore[arg-type]
    )
    return s2, beta


def bernstein_keep(
    diff: np.ndarray,
    n: np.ndarray | float,
    sigma2_ab: np.ndarray | float,
    beta_ab: np.ndarray | float,
    theta: float,
    scale: float = 1.0,
    exact: bool = True,
) -> np.ndarray:
    """χ_a(b) by the Bernstein test: |X̃_a − X̃_b| < scale·z_t at level θ_t = θ/ln(n+1) (§3.3).

    n = min(t_a, t_b) is the number of samples behind the shorter mean.
    """
    return diff < bernstein_bound(n, sigma2_ab, beta_ab, theta, scale, exact)


def bernstein_bound(
    n: np.ndarray | float,
    sigma2_ab: np.ndarray | float,
    beta_ab: np.ndarray | float,
    theta: float,
    scale: float = 1.0,
    exact: bool = True,
) -> np.ndarray:
    """scale·z_t at level θ_t = θ/ln(n+1), the (strict) bound of the Bernstein test (§3.3)."""
    theta_t = theta / np.log(np.asarray(n, dtype=float) + 1.0)
    return scale * bernstein_threshold(n, sigma2_ab, beta_ab, theta_t, exact)


# -- the mixing weights ------------------------------------------------------------------------


def edge_weight(size_a: np.ndarray, size_b: np.ndarray) -> np.ndarray:
    """W_ab = 1/(1 + max(|C_a|, |C_b|)) of eq. (2), element-wise (a new float array)."""
    w = np.maximum(size_a, size_b).astype(float, copy=False)
    w += 1.0
    return np.divide(1.0, w, out=w)


def metropolis_weights(graph: Graph, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w_e over directed edges, W_aa) of eq. (2) for the neighbour sets `kept`.

    W_ab = 1/(1 + max(|C_a|, |C_b|)) for kept edges, 0 otherwise; W_aa = 1 − Σ_b W_ab. With
    symmetric `kept` (kept[e] == kept[reverse[e]]) W is symmetric and doubly stochastic.
    """
    size = row_sums(graph, kept.astype(float))
    w = np.where(kept, edge_weight(size[graph.src], size[graph.dst]), 0.0)
    return w, 1.0 - row_sums(graph, w)


def row_sums(graph: Graph, x: np.ndarray) -> np.ndarray:
    """Σ over each agent's outgoing edges of the per-edge values x (CSR order)."""
    out = np.zeros(graph.n, dtype=np.result_type(x.dtype, np.int64))
    rows = graph.degree > 0
    if rows.any():
        out[rows] = np.add.reduceat(x, graph.indptr[:-1][rows])
    return out


# -- the consensus update ----------------------------------------------------------------------


def one_minus_alpha(age: np.ndarray, c: float = 1.0, p: float = 1.0) -> np.ndarray:
    """1 − α = min(1, c·s^(−p)) at each agent's age s ≥ 1, and α = 0 at s = 1 (a (re)start).

    The default c = p = 1 is Theorem 1's 1 − α = 1/s (§2.4, §3.5).
    """
    decay = c / age if p == 1.0 else c * age ** (-p)
    out = np.minimum(1.0, decay)
    if c < 1.0:  # α = 0 at age 1 whatever the schedule
        out[age <= 1] = 1.0
    return out


def mix(
    y: np.ndarray,
    nb_y: np.ndarray,
    w: np.ndarray | float,
    counts: np.ndarray,
    rows: np.ndarray,
    starts: np.ndarray,
    terms: np.ndarray | None = None,
) -> np.ndarray:
    """(W Y)_a = W_aa Y_a + Σ_b W_ab Y_b = Y_a + Σ_b W_ab (Y_b − Y_a), a new array.

    The mixed edges are in CSR order: agent a's are `counts[a]` consecutive ones, with Y_b in
    `nb_y` and W_ab in `w`; `rows` = counts > 0 and `starts` where each such run begins. W_aa
    = 1 − Σ_b W_ab is never formed, which is what keeps Y_a exact when a mixes nobody.
    `terms`, if given, is `np.repeat(y, counts)` in a buffer the function may overwrite.
    """
    if not len(starts):
        return y.copy()
    if terms is None:
        terms = np.repeat(y, counts)
    np.subtract(nb_y, terms, out=terms)
    terms *= w
    sums = np.add.reduceat(terms, starts)
    if len(starts) == len(y):
        return y + sums
    out = y.copy()
    out[rows] += sums
    return out


def consensus_update(
    mean: np.ndarray, mixed: np.ndarray, one_minus_alpha: np.ndarray
) -> np.ndarray:
    """Y^(t) = (1 − α) X̃^(t) + α (W Y^(t−1)), given X̃ (`mean`) and W Y (`mixed`)."""
    return one_minus_alpha * mean + (1.0 - one_minus_alpha) * mixed


def consensus_step(
    mean: np.ndarray,
    mixed: np.ndarray,
    start: np.ndarray,
    t: float,
    c: float = 1.0,
    p: float = 1.0,
    compiled: CompiledPass | None = None,
) -> np.ndarray:
    """`consensus_update` with 1 − α of `one_minus_alpha` at the ages s = t − start: in one
    compiled pass (the same operations) when `compiled` is given and 1 − α = min(1, c/s), c ≥ 1
    (Theorem 1's schedule among them); a new array either way."""
    if compiled is not None and p == 1.0 and c >= 1.0:
        return compiled.consensus_step(mean, mixed, start, t, c)
    return consensus_update(mean, mixed, one_minus_alpha(t - start, c, p))


def small_component(size: np.ndarray, told: np.ndarray) -> np.ndarray:
    """Whether |C̃_a| seems 1 or 2 (the fallback to the local mean, §3.6): a keeps nobody, or
    keeps one neighbour b who keeps only a (`told`: Σ_{b ∈ C_a} |C_b| as the b told a)."""
    return (size == 0) | ((size == 1) & (told == 1))


# -- the test with the agents' constants -------------------------------------------------------


class NeighbourTest:
    """The neighbour test χ_a(b) of one run: the rule and the agents' constants (σ̃², β, γ)."""

    def __init__(
        self, params: Any, sigma2: np.ndarray, sigma2_dp: float, distribution: str, links: int
    ) -> None:
        """`params` (rule, delta, theta, threshold, threshold_scale), the agents' data variances
        σ_a², the noise variance σ_DP², the data distribution and Σ_a deg a (`links`)."""
        self.rule, self.theta, self.scale = params.rule, params.theta, params.threshold_scale
        self.exact = params.threshold == "exact"
        self.sigma2_dp = sigma2_dp
        #: σ̃_a² = σ_a² + σ_DP², the variance of a privatised sample.
        self.sigma2_tilde = sigma2 + sigma2_dp
        self._equal = bool(np.all(sigma2 == sigma2[0])) if len(sigma2) else True
        self._beta = data_bernstein_parameter(distribution, sigma2)
        self._sigma = np.sqrt(sigma2)
        #: γ = δ/(4 Σ_a deg a) of the optimistic distance.
        self.gamma = params.delta / (4.0 * max(links, 1))
        self._chunk = np.empty(0)  # `keep_in_chunks`'s buffer
        # one bound for every edge (equal variances): the compiled test, chosen once
        self._compiled = CompiledPass.choose(links) if self._equal else None

    @property
    def compiled(self) -> bool:
        """Whether one bound serves every edge and the compiled test takes it (`bound`)."""
        return self._compiled is not None

    def keep(
        self,
        diff: np.ndarray,
        n_a: float,
        n_b: np.ndarray | float,
        a: np.ndarray,
        b: np.ndarray,
    ) -> np.ndarray:
        """χ_a(b) for the edges (a, b) from |X̃_a − X̃_b| (`diff`) and the sample counts."""
        if self.rule == "optimistic":
            return optimistic_keep(diff, n_a, n_b, self._s2(a), self._s2(b), self.gamma)
        s2, beta = self._pair(a, b)
        n = np.minimum(n_a, n_b)
        return bernstein_keep(diff, n, s2, beta, self.theta, self.scale, self.exact)

    def keep_in_chunks(
        self,
        mean: np.ndarray,
        x_b: np.ndarray,
        a: np.ndarray,
        b: np.ndarray,
        n_a: float,
        n_b: float,
        chunk: int,
    ) -> np.ndarray:
        """`keep` on |X̃_a − X̃_b| for the edges (a, b), X̃_a = mean[a], `chunk` edges at a
        time in one reused buffer: element-wise, so the same floats as on whole arrays, without
        passes over per-edge arrays that fit in no cache."""
        if self._compiled is not None:
            bound, strict = self.bound(n_a, n_b)
            return self._compiled.keep_within(mean, x_b, a, bound, strict)
        keep = np.empty(len(x_b), dtype=bool)
        if len(self._chunk) < chunk:
            self._chunk = np.empty(chunk)
        for lo in range(0, len(x_b), chunk):
            part = slice(lo, lo + chunk)
            diff = self._chunk[: len(x_b[part])]
            np.take(mean, a[part], out=diff, mode="clip")
            np.subtract(diff, x_b[part], out=diff)
            np.abs(diff, out=diff)
            keep[part] = self.keep(diff, n_a, n_b, a[part], b[part])
        return keep

    def bound(self, n_a: float, n_b: float) -> tuple[float, bool]:
        """(the bound `keep` compares |X̃_a − X̃_b| with, whether strictly) when every agent
        has the same variance: one number for every edge of a slot."""
        if self.rule == "optimistic":
            s2 = float(self.sigma2_tilde[0])
            return float(optimistic_bound(n_a, n_b, s2, s2, self.gamma)), False
        s2, beta = self._pair(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
        bound = bernstein_bound(min(n_a, n_b), s2, beta, self.theta, self.scale, self.exact)
        return float(bound), True

    def _s2(self, agents: np.ndarray) -> np.ndarray | float:
        """σ̃² of the given agents (one float when all agents share it)."""
        return float(self.sigma2_tilde[0]) if self._equal else self.sigma2_tilde[agents]

    def _pair(self, a: np.ndarray, b: np.ndarray) -> tuple[Any, Any]:
        """(σ_ab², β_ab) of the Bernstein pair test for the edges (a, b)."""
        st, bd, sg = self.sigma2_tilde, self._beta, self._sigma
        if self._equal:
            s2, beta, sigma = float(st[0]), float(bd[0]), float(sg[0])
            return pair_parameters(s2, s2, beta, beta, sigma, sigma, self.sigma2_dp)
        return pair_parameters(st[a], st[b], bd[a], bd[b], sg[a], sg[b], self.sigma2_dp)
