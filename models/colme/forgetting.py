"""Private-ColME with forgetting (desim's extension, `desim.models.forgetting`): windows over
the releases already made.

Agent b's release j to a is R_j = (S_b(t_j) + Z_j)/t_j, a noisy prefix sum over its first t_j
samples. The difference of two releases of the same pair,

    t_j R_j − t_i R_i = S_b(t_i + 1 … t_j) + (Z_j − Z_i),

is the sum of b's samples t_i + 1 … t_j plus the noise of the p-sums between them: under PM-I
the p-sums i + 1 … j (Z_j − Z_i carries j − i of them), under PM-II the tree nodes of j and of i
that are not shared (a node at level ℓ is (ℓ, j >> ℓ); shared ones cancel). So a querier makes
its windowed statistic from releases it holds — post-processing — and

    T^W_{b→a} = (t_j R_j − t_i R_i)/n,  Var[T^W] = (σ_b² n + σ_DP² N)/n²,  n = t_j − t_i,

N the p-sums or nodes the difference keeps (`difference_noise_count`). What it costs in
releases: nothing. Every release is still made and counted when made (a sample that leaves the
window was released all the same): the `privacy` ledger is the one without forgetting, release
for release (under RR; under rRR a querier asks only the peers in C_a, which forgetting
changes), given the same streams: over links that are not ideal a scenario with ``forget``
draws its own losses and delays (its key covers every parameter), as any other scenario does.

``window = W``: the base i is the oldest release a holds with t_j − t_i ≤ W (the empty prefix
while t_j ≤ W), so the window holds the whole p-sums within b's last W samples (a p-sum is the
granularity: under RR, M − 1 samples); until one fits, T is undefined (weight 0, b kept in C_a).
``reset = τ``: the base is the first release at or after b's slot τ − 1. Agent a's own mean is
the same rule over its own samples (`ForgettingSums`), in the z-test (σ_a²/n_a) and in Lemma 4's
combination (weight n_a/σ_a²).

On a graph (``peers = "topology"``) the pairs are the edges: the same arithmetic over the pairs
that exist. Over links that are not ideal a querier holds the releases it received (some lost,
late or stale), so its base is the oldest release it received among b's `kept` releases to it
before j (`PrefixWindow`) with t_j − t_i ≤ W: a window over the newest releases a holds, never
more than W samples (fewer when a release near the window's start was lost); a release made
before a reset's τ and taken from τ on holds no sample from τ on (weight 0). Under a budget a
withheld release (``stop``) is never received, so the window is over the releases made and
received; a degraded p-sum (``degrade``) enters Var[T^W] with the variance it was drawn with
(`difference_noise_count`'s weights).

With unknown variances (Sch-Var-2, plain or Bayesian) V_{b→a} is Sch-Var-2 over the same
window (`WindowedVariances`: the differences of the releases held from the base to j, in the
general unbiased form), V_a the sample variance of a's own window, and the Welch test and eq.
(5)'s weights take both; with MoM weights T^W is the mean of the window's prefix means from the
base, with its exact variance (`WindowedMoM`); with ``combination = "trimmed"`` the trim is over
the windowed T^W. All are post-processing: no release is added.

Refused, with why: ``rate`` (a p-sum's samples are released summed: weights λ^(t − s) within one
cannot be applied); Sch-Var-1 (its release covers every sample since the start: a windowed one
needs the noise correction of every p-sum between two releases, whose lengths a lacks for the
releases it lost); wMoM weights (κ's current dyadic block of prefix means over every sample: a
window has none); MoM with a ``degrade`` budget (the window's noise term counts every node with
σ_DP²).

On a graph that changes during the run (`desim.models.colme.rewire`) the windows follow the
pairs by the same map as the rest of their state (`ReleaseWindows.follow`): a kept link keeps
the releases a holds on it (its ring, a reset's base) and T^W; a new link starts with an empty
window (b's mechanism for a starts afresh and only the empty prefix is held: a link made
after slot W, or after a reset's τ, has T^W only from its second release); a dropped link's
are discarded. The releases are the same with or without
``forget``, so is the ledger. The ring then holds the most releases a pair can get in W + 1
slots whatever the graph (one a slot: RR's positions move at each change).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.models.colme.combination import trimmed_sums
from desim.models.colme.model import combine, sch_var_2_estimate, z_accepts
from desim.models.colme.schedule import max_pair_releases
from desim.models.colme.variance import sample_variance, welch_accepts
from desim.models.forgetting import Forget, ForgettingSums, PrefixWindow, difference_noise_count
from desim.models.privacy.release import levels_for

#: The forgetting rules Private-ColME computes exactly.
PEER_FORGET = ("window", "reset")


def check_forget(params: Any) -> None:
    """Check a scenario's ``forget`` table against Private-ColME's other parameters and keep it
    as a `Forget`; ValueError (one line) naming the field for what this version refuses."""
    if params.forget is None:
        return
    why = "a p-sum's samples are released summed: no weights λ^(t − s) within one"
    forget = Forget.from_table(params.forget, PEER_FORGET, "private-colme", why)
    object.__setattr__(params, "forget", forget)
    for name, (allowed, reason) in _NEEDS.items():
        if getattr(params, name) not in allowed:
            allowed_text = ", ".join(repr(x) for x in allowed)
            raise ValueError(
                f"forget: with {name} = {getattr(params, name)!r} not yet ({reason}; allowed "
                f"with forget: {name} = {allowed_text})"
            )
    budget = params.budget
    action = budget.get("action") if isinstance(budget, dict) else getattr(budget, "action", None)
    if params.weights == "mom" and action == "degrade":
        raise ValueError(
            "forget: with weights = 'mom' and budget action = 'degrade' not yet (the window's "
            "MoM counts every node with σ_DP²; allowed: weights = 'last', or action = 'stop')"
        )


#: What a ``forget`` table needs of Private-ColME's other parameters, and why.
_NEEDS = {
    "variance": (
        ("known", "sch-var-2", "sch-var-2-bayes"),
        "Sch-Var-1's release is b's noisy sample variance over every sample since its first; "
        "differencing two would need the noise correction of every p-sum between them",
    ),
    "weights": (
        ("last", "mom"),
        "wMoM averages the releases of κ's current dyadic block, each a mean over every sample "
        "since the start; a window has no such block",
    ),
}


def release_windows(protocol: Any) -> ReleaseWindows | None:
    """The windows of a Private-ColME run with a ``forget`` table (None without one): their
    rings hold the most releases of one pair within W + 1 slots (`kappa_max`), plus one."""
    p = protocol.params
    if p.forget is None:
        return None
    span = (p.forget.window or 1) + 1
    if protocol.graph is not None and protocol.ctx.public.get("graph_changes"):
        # a changing graph moves RR's positions and degrees, so the set-up graph bounds nothing:
        # a querier asks one responder a slot, so a pair gets at most one release a slot
        return ReleaseWindows(protocol, min(span, protocol.ctx.t_max) + 1)
    return ReleaseWindows(protocol, protocol.kappa_max(span) + 1)


def window_bytes(
    params: Any, t_max: int, sizes: Any = None, per_pair: float = 0.0
) -> dict[str, float]:
    """Bytes per pair (per edge on a graph; `per_pair` and what a ``forget`` table adds) and
    per agent, for the estimate `desim validate` makes: the rings of `ReleaseWindows` (one
    complex cell per release a pair can get within W + 1 slots, rounded up to a power of two,
    and the j each cell holds over links that are not ideal), the heads and a reset's base,
    T^W and its variance, a reset's Sch-Var-2 and MoM sums, and every agent's own window.
    `sizes` (`desim.study.spec.limits.Sizes`) bound the releases a pair gets within a window:
    its agents (every other agent a peer) or the graph's smallest degree; without them (or on a
    graph of unknown or changing degrees) a pair may get one every slot, as `release_windows`
    assumes on a changing graph."""
    f = params.forget
    unit = "edge" if params.peers == "topology" else "pair"
    if f is None:
        return {unit: per_pair}
    span = (f.window or 1) + 1
    if params.peers == "all" and sizes is not None:
        degree = sizes.agents - 1
    else:
        degree = getattr(sizes, "min_degree", None) if params.peers == "topology" else None
    kept = (max_pair_releases(params.schedule, degree + 1, span) if degree else span) + 1
    ideal = sizes is not None and sizes.ideal
    per_pair += PrefixWindow.bytes_per_pair(f, kept, gaps=not ideal) + 16.0
    if f.rule == "reset":
        pm2 = params.mechanism == "pm2"
        per_pair += 48.0 * (params.variance != "known")
        per_pair += 8.0 * (6 + 3 * levels_for(t_max) * pm2) * (params.weights == "mom")
    own = ForgettingSums.bytes_per_agent(f, squares=params.variance != "known")
    return {unit: per_pair, "agent": own}


class ReleaseWindows:
    """The windowed statistic T^W_{b→a} and Var[T^W] of every pair (every ordered pair, or
    every edge on a graph), and every agent's own forgetting mean (the strategy Private-ColME
    chooses once under ``forget``)."""

    def __init__(self, protocol: Any, kept: int) -> None:
        # `kept`: the most releases of one pair within a window, plus one
        p, m = protocol.params, protocol.ctx.n_agents
        self.protocol = protocol
        self.mechanism = p.mechanism
        self.graph = protocol.graph
        # links that are not ideal: releases arrive with gaps in j, and the querier's κ (the
        # delivery's stale test) is the statistic's, kept current here
        self.gaps = protocol.asynchronous
        self.own = ForgettingSums(p.forget, m, squares=not protocol.known)
        self.prefixes = PrefixWindow(p.forget, protocol.n_pairs, kept, self.gaps)
        #: Sch-Var-2 over each pair's window (None: variances known).
        self.variances = (
            None if protocol.known else WindowedVariances(p, self.prefixes, protocol.n_pairs)
        )
        #: MoM over each pair's window (None: ``last`` weights, T^W of the newest release).
        self.means = (
            WindowedMoM(
                p.mechanism, self.prefixes, protocol.n_pairs, levels_for(protocol.ctx.t_max)
            )
            if p.weights == "mom"
            else None
        )
        #: β of a trimmed combination (None: Lemma 4 over every accepted peer).
        self.trim = p.trim
        self._n_other = None  # Welch's second count of the releases just taken
        shape = (m, m) if self.graph is None else protocol.n_pairs
        #: T^W and Var[T^W] of every pair ([a, b], or by edge on a graph; +∞: weight 0).
        self.value = np.zeros(shape)
        self.var = np.full(shape, np.inf)

    def follow(self, graph: Any, carry: Any) -> None:
        """Lay the windows out over a changed graph's pairs (`carry`: the map of
        `desim.models.colme.rewire`): a kept link keeps its releases held and T^W, a new link
        starts with an empty window (T^W undefined), a dropped link's are discarded."""
        self.graph = graph
        self.value, self.var = carry(self.value, 0.0), carry(self.var, np.inf)
        w = self.prefixes
        # each pair's ring row (its releases by index), its head, and a reset's base; a new
        # link's row is the empty prefix (0 in every cell: release 0 at t = 0)
        rows = w._ring.reshape(len(w._head), -1)
        w._ring = carry(rows, 0.0).ravel()
        if w._held is not None:
            w._held = carry(w._held.reshape(rows.shape), 0).ravel()
        w._j, w._stored, w._head = carry(w._j, 0), carry(w._stored, 0), carry(w._head, 0)
        for sums in (self.variances, self.means):  # (a new link: no release, no sums)
            if sums is not None and sums.state is not None:
                sums.state = carry(sums.state, 0.0)

    def add(self, t: int, samples: np.ndarray) -> None:
        """Slot t's own samples; at a reset every pair's T^W is undefined until its next
        difference (T over samples before τ is forgotten too)."""
        self.own.add(t, samples)
        if t == self.own.forget.reset:
            self.var.fill(np.inf)
            self.value.fill(0.0)

    def take(
        self,
        a: np.ndarray,
        b: np.ndarray,
        pair: np.ndarray | slice,
        values: np.ndarray,
        t_b: np.ndarray,
        j: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Take releases b → a (value R_j, made at t_b) of pairs `pair`: (T^W, Var[T^W])."""
        p = self.protocol
        if isinstance(pair, slice):  # (a run of a graph's pairs)
            pair = self.graph.numbers[pair]
        budget = p.release_budget
        degraded_from = None if budget is None else budget.degraded_from_of(pair)
        if self.gaps:  # κ of the pairs, for the delivery's stale test (`last_index`)
            p.stat.update(a, b, values, t_b, j, pair=pair, degraded_from=degraded_from)
        n, noisy_sum, i = self.prefixes.take(pair, values, t_b, j)
        tau = self.own.forget.reset
        if self.gaps and tau is not None and self.own.slots >= tau:
            # a release made before τ and taken from τ on holds no sample from τ on (ideal
            # links take every release in its own slot: never so)
            n = np.where(t_b < tau, 0.0, n)
        noise = self._noise(j, i, degraded_from)
        if self.variances is None:
            sigma2_b = p.sigma2[b]
        else:  # V_{b→a} over the same window (+∞ until two p-sums), Welch's count beside it
            sigma2_b, self._n_other = self.variances.take(pair, values, t_b, j, n, noisy_sum, i)
            sigma2_b = self.variances.estimate(sigma2_b, p.sigma2_dp, n, noisy_sum, j, i)
            p.v_hat.ravel()[pair] = sigma2_b
        if self.means is not None:  # MoM: the mean of the window's prefix means
            value, var = self._mom(sigma2_b, pair, values * t_b, t_b, j, n, noisy_sum, i)
        elif np.count_nonzero(n) == len(n):  # (the usual case: every window holds a p-sum)
            value = noisy_sum / n
            var = (sigma2_b * n + p.sigma2_dp * noise) / (n * n)
        else:
            have = n > 0
            n_safe = np.where(have, n, 1.0)
            value = np.where(have, noisy_sum / n_safe, 0.0)
            with np.errstate(invalid="ignore"):  # (V_{b→a} = +∞ times n = 0: no weight)
                var = (sigma2_b * n + p.sigma2_dp * noise) / (n_safe * n_safe)
            var = np.where(have, var, np.inf)
        self.value.ravel()[pair] = value
        self.var.ravel()[pair] = var
        return value, var

    def _mom(self, sigma2_b: Any, *window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T^W, Var[T^W]) under MoM weights (`WindowedMoM.take` of the `window`'s releases)."""
        value, data, noise, count = self.means.take(*window)
        have = (count > 0) & (window[4] > 0)  # (n = 0: no whole p-sum in the window)
        k = np.where(have, count, 1.0)
        with np.errstate(invalid="ignore"):  # (V_{b→a} = +∞ times D = 0: no weight)
            var = (sigma2_b * data + self.protocol.sigma2_dp * noise) / (k * k)
        return np.where(have, value, 0.0), np.where(have, var, np.inf)

    def _noise(self, j: np.ndarray, i: np.ndarray, degraded_from: np.ndarray | None) -> Any:
        """The noise of t_j R_j − t_i R_i over σ_DP² (`difference_noise_count`); after a
        ``degrade``, each p-sum or node with the variance it was drawn with."""
        if degraded_from is None:
            # (PM-I: the p-sums between, j − i, inline: the usual case, every slot)
            return j - i if self.mechanism == "pm1" else difference_noise_count("pm2", j, i)
        stat = self.protocol.stat
        if self.mechanism == "pm1":
            return stat.noise_count(j, degraded_from) - stat.noise_count(i, degraded_from)
        weights = (stat.node_noise(j, degraded_from), stat.node_noise(i, degraded_from))
        return difference_noise_count("pm2", j, i, weights)

    def accepts(self, a: np.ndarray, value: np.ndarray, var: np.ndarray, t: np.ndarray) -> Any:
        """χ_a(b) at a's clock t with a's own window (its n_a samples) for X̄_a: the z-test of
        §III-C1, or with unknown variances the Welch test of §III-C2 with V_a over the window
        and Welch's second count over b's window (its samples, or its p-sums with ``kappa``)."""
        p, own = self.protocol, self.own
        t = t.astype(np.int64)
        if self.variances is None:  # (a window's or a reset's weights are 1: total n_a)
            return z_accepts(own.sums[a], own.weight, p.sigma2[a], value, var, p._z[t])
        n_a = np.full(len(a), own.weight)
        v_a = sample_variance(own.sums[a], own.sumsq[a], n_a)
        return welch_accepts(own.sums[a] / n_a - value, v_a, n_a, var, self._n_other, p._theta[t])

    def estimates(self, included: np.ndarray, sigma2: np.ndarray | None) -> np.ndarray:
        """Lemma 4 over the pairs' windowed statistics and each agent's own forgetting mean
        (with unknown variances eq. (5)'s weights, n_a/V_a over the window), over every
        accepted peer or those a trimmed combination keeps."""
        own = self.own
        local = own.mean()
        if sigma2 is None:
            sigma2 = sample_variance(own.sums, own.sumsq, np.full(len(own.sums), own.weight))
        with np.errstate(divide="ignore"):
            own_weight = own.effective() / sigma2
            weight = np.where(included, 1.0 / self.var, 0.0)
        if self.graph is None:
            np.fill_diagonal(weight, 0.0)  # a itself
            if self.trim is not None:  # (trimmed over the windowed T^W of the accepted)
                return combine(local, own_weight, *trimmed_sums(weight, self.value, self.trim))
            sums = (weight * self.value).sum(axis=1), weight.sum(axis=1)
            return combine(local, own_weight, *sums)
        return combine(local, own_weight, *self._edge_sums(weight))

    def _edge_sums(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Σ_b T^W/Var[T^W] and Σ_b 1/Var[T^W] by querier on a graph, summed as
        `edge_row_sums` sums them (dense rows up to `incremental_above` agents, so a complete
        graph gives the bits of every peer; by edge in CSR order above)."""
        nb = self.graph
        if nb.n > self.protocol.incremental_above:
            weighted = (weight * self.value).take(nb.csr_pairs)
            sums = np.bincount(nb.csr_src, weighted, minlength=nb.n)
            return sums, np.bincount(nb.csr_src, weight.take(nb.csr_pairs), minlength=nb.n)
        w, v = np.zeros((nb.n, nb.n)), np.zeros((nb.n, nb.n))
        w[nb.src, nb.dst], v[nb.src, nb.dst] = weight, self.value
        return (w * v).sum(axis=1), w.sum(axis=1)


class WindowedVariances:
    """Sch-Var-2 (§V-B) over each pair's window: V_{b→a} from the p-sum differences of the
    releases a holds from the window's base to j, in the general unbiased form of
    `desim.models.colme.variance.schvar2_raw_and_K` (unequal lengths, PM-II's shared nodes),

        V' = (Σ P_k²/d_k − (ΣP)²/n)/(k − 1),  K = (Σ c_k/d_k − c/n)/(k − 1),  V = V' − Kσ_DP²,

    ΣP the window's noisy sum, n its samples and c the noises of t_j R_j − t_i R_i: the same
    estimator over the window's samples as over every sample (post-processing, no release).
    ``window``: the differences are read from the releases held (`PrefixWindow.increments`);
    ``reset``: each pair keeps its sums, restarted at its base."""

    def __init__(self, params: Any, prefixes: PrefixWindow, n_pairs: int) -> None:
        self.mechanism = params.mechanism
        self.bayes = params.variance == "sch-var-2-bayes"
        self.prior = params.prior
        self.by_releases = params.welch_df == "kappa"
        self.prefixes = prefixes
        self.reset = params.forget.reset
        # ``reset``, per pair: the last release taken (t R, t, j), Σ P²/d, Σ c/d, their count,
        # since the base (since the start before it)
        self.state = None if self.reset is None else np.zeros((n_pairs, 6))

    def take(
        self,
        pair: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        n: np.ndarray,
        noisy_sum: np.ndarray,
        i: np.ndarray,
    ) -> tuple[tuple, np.ndarray]:
        """The window's (Σ P²/d, Σ c/d, k) of releases j (bases i, n samples) and Welch's
        second count: b's samples in the window, or with ``kappa`` its p-sums k."""
        if self.state is None:
            sums = self.prefixes.increments(pair, i, j, self.mechanism)
        else:
            sums = self._take_reset(pair, values, t, j)
        return sums, (sums[2] if self.by_releases else n)

    def _take_reset(
        self, pair: np.ndarray, values: np.ndarray, t: np.ndarray, j: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reset's sums: this release's difference added to the pair's, then restarted at
        the release that becomes the base (its own statistic is over every sample: t < τ)."""
        rows = self.state.take(pair, axis=0)
        sum_prev, t_prev, j_prev, p2d, cd, count = rows.T
        total = t * values
        psum = total - sum_prev
        with np.errstate(divide="ignore"):
            inv_d = 1.0 / (t - t_prev)
        c = difference_noise_count(self.mechanism, j, j_prev.astype(np.int64))
        p2d += psum * psum * inv_d
        cd += c * inv_d
        count += 1.0
        out = (p2d.copy(), cd.copy(), count.copy())
        sum_prev[:], t_prev[:], j_prev[:] = total, t, j
        base = self.prefixes.base_index(pair) == j  # (the base was stored by this release)
        p2d[base], cd[base], count[base] = 0.0, 0.0, 0.0
        self.state[pair] = rows
        return out

    def estimate(
        self,
        sums: tuple,
        sigma2_dp: float,
        n: np.ndarray,
        noisy_sum: np.ndarray,
        j: np.ndarray,
        i: np.ndarray,
    ) -> np.ndarray:
        """V_{b→a} over the windows (`sums` of `take`): V' − Kσ_DP² (`unbiased`), +∞ before two
        p-sums, a negative one +∞ or (``sch-var-2-bayes``) the posterior mean of (19)."""
        v_raw, k_noise = self.unbiased(sums, sigma2_dp, n, noisy_sum, j, i)
        return sch_var_2_estimate(v_raw, k_noise, sums[2], self.bayes, self.prior)

    def unbiased(
        self,
        sums: tuple,
        sigma2_dp: float,
        n: np.ndarray,
        noisy_sum: np.ndarray,
        j: np.ndarray,
        i: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(V', Kσ_DP²) of the windows: E[V' − Kσ_DP²] = σ_b² over the window's samples (V'
        +∞ where the window holds no p-sum, n = 0)."""
        p2d, cd, k = sums
        c = difference_noise_count(self.mechanism, j, i)
        k1 = np.maximum(k - 1.0, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            v_raw = (p2d - noisy_sum * (noisy_sum / n)) / k1
            k_noise = sigma2_dp * (cd - c / n) / k1
        v_raw[n == 0] = np.inf
        k_noise[n == 0] = 0.0
        return v_raw, k_noise


class WindowedMoM:
    """MoM weights (``weights = "mom"``) over each pair's window: T^W the mean of the windowed
    prefix means Y_r = (t_{k_r} R_{k_r} − t_i R_i)/n_r of the K releases a holds after the base
    i (n_r = t_{k_r} − t_i), and its exact variance (σ_b² D + σ_DP² A)/K² with
    D = Σ_r (2r − 1)/n_r (nested windows from one base) and A = Σ_ν (coefficient of ν)², ν each
    p-sum (PM-I) or tree node (PM-II) the releases hold: Σ_{r using ν} 1/n_r, less Σ_r 1/n_r
    for the base's own (t_i R_i's) that no release shares. With the base the empty prefix it is
    the paper's MoM over every release. ``window``: summed from the base over the releases held
    at each take (`PrefixWindow.walk`); ``reset``: each pair keeps its sums, restarted at its
    base."""

    #: Per pair: Σ prefix·u, Σ u, D, A, PM-I's Σ_p gaps·C_p, K (u = 1/n_r), then PM-II's
    #: current node id and coefficient per level and the base's node coefficient per level.
    _FIXED = 6

    def __init__(self, mechanism: str, prefixes: PrefixWindow, n_pairs: int, levels: int) -> None:
        self.pm2 = mechanism == "pm2"
        self.levels = levels if self.pm2 else 0
        self.prefixes = prefixes
        width = self._FIXED + 3 * self.levels
        self.state = np.zeros((n_pairs, width)) if prefixes.reset else None
        self.width = width

    def take(
        self,
        pair: np.ndarray,
        prefix: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        n: np.ndarray,
        noisy_sum: np.ndarray,
        i: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(T^W, D, A, K) of releases j (prefix t_j R_j, bases i, n samples; K = 0: none)."""
        base_prefix, base_t = prefix - noisy_sum, t - n
        if self.state is None:
            rows = np.zeros((len(pair), self.width))
            for k, cell, live in self.prefixes.walk(pair, i, j):
                self._step(rows, cell.imag, cell.real - base_t, k, i, live)
        else:
            rows = self.state.take(pair, axis=0)
            self._step(rows, prefix, n, j, i, n > 0)
            out = rows.copy()
            # restart where this release became the base (the sums so far ran from the empty
            # prefix: this release's own statistic, made before τ, is over every sample)
            rows[self.prefixes.base_index(pair) == j] = 0.0
            self.state[pair] = rows
            rows = out
        count = rows[:, 5]
        with np.errstate(divide="ignore", invalid="ignore"):
            value = (rows[:, 0] - base_prefix * rows[:, 1]) / count
        return value, rows[:, 2], rows[:, 3], count

    def _step(
        self,
        rows: np.ndarray,
        prefix: np.ndarray,
        n: np.ndarray,
        k: np.ndarray,
        i: np.ndarray,
        live: np.ndarray,
    ) -> None:
        """Add release k (its prefix, n = t_k − t_i samples after the base i) where `live`."""
        with np.errstate(divide="ignore"):
            u = np.where(live, 1.0 / np.where(live, n, 1.0), 0.0)
        rows[:, 5] += live
        rows[:, 0] += prefix * u
        rows[:, 1] += u
        rows[:, 2] += (2.0 * rows[:, 5] - 1.0) * u
        if not self.pm2:  # each p-sum i+1 … k gains u: A += 2u·Σ g C + u²·(k − i)
            gaps = np.where(live, k - i, 0).astype(float)
            rows[:, 3] += 2.0 * u * rows[:, 4] + u * u * gaps
            rows[:, 4] += u * gaps
            return
        L, f = self.levels, self._FIXED
        ids, coef, base = rows[:, f : f + L], rows[:, f + L : f + 2 * L], rows[:, f + 2 * L :]
        for lv in range(L):
            in_k, in_i = (k >> lv) & 1 == 1, (i >> lv) & 1 == 1
            shared = in_k & in_i & ((k >> lv) == (i >> lv))
            mine = live & in_k & ~shared  # k's node at this level gains u
            node = (k >> lv).astype(float)
            c = np.where(ids[:, lv] == node, coef[:, lv], 0.0)
            rows[:, 3] += np.where(mine, 2.0 * u * c + u * u, 0.0)
            coef[:, lv] = np.where(mine, c + u, coef[:, lv])
            ids[:, lv] = np.where(mine, node, ids[:, lv])
            theirs = live & in_i & ~shared  # the base's node loses u (Σ_r 1/n_r grew)
            rows[:, 3] += np.where(theirs, -2.0 * u * base[:, lv] + u * u, 0.0)
            base[:, lv] -= np.where(theirs, u, 0.0)
