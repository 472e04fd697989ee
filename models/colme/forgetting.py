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

Refused, with why: ``rate`` (a p-sum's samples are released summed: weights λ^(t − s) within one
cannot be applied); unknown variances (Sch-Var-1's released variance and Sch-Var-2's estimate
cover every sample since the start: a windowed variance would be another release or another
estimator); MoM weights (they average prefix means over every sample since the start: the
window replaces T's weights); the trimmed combination (not yet).

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

from desim.models.colme.model import combine, z_accepts
from desim.models.forgetting import Forget, ForgettingSums, PrefixWindow, difference_noise_count

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
        if getattr(params, name) != allowed:
            raise ValueError(
                f"forget: with {name} = {getattr(params, name)!r} not yet ({reason}; allowed "
                f"with forget: {name} = {allowed!r})"
            )


#: What a ``forget`` table needs of Private-ColME's other parameters, and why.
_NEEDS = {
    "variance": (
        "known",
        "the variance estimates cover every sample since the start, a windowed one would be "
        "another release or estimator",
    ),
    "weights": ("last", "MoM averages prefix means over every sample: the window replaces T's"),
    "combination": ("weighted", "the trimmed combination is not windowed yet"),
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
        self.own = ForgettingSums(p.forget, m)
        self.prefixes = PrefixWindow(p.forget, protocol.n_pairs, kept, self.gaps)
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
        sigma2_b = p.sigma2[b]
        if n.all():  # (the usual case: every window holds a p-sum)
            value = noisy_sum / n
            var = (sigma2_b * n + p.sigma2_dp * noise) / (n * n)
        else:
            have = n > 0
            n_safe = np.where(have, n, 1.0)
            value = np.where(have, noisy_sum / n_safe, 0.0)
            var = np.where(have, (sigma2_b * n + p.sigma2_dp * noise) / (n_safe * n_safe), np.inf)
        self.value.ravel()[pair] = value
        self.var.ravel()[pair] = var
        return value, var

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

    def accepts(
        self, a: np.ndarray, sigma2_a: np.ndarray, value: np.ndarray, var: np.ndarray, z: Any
    ) -> np.ndarray:
        """The z-test of §III-C1 with a's own window (its n_a samples' sum) for X̄_a."""
        # (a window's or a reset's weights are 1: the weight total is n_a)
        return z_accepts(self.own.sums[a], self.own.weight, sigma2_a, value, var, z)

    def estimates(self, included: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
        """Lemma 4 over the pairs' windowed statistics and each agent's own forgetting mean."""
        local = self.own.mean()
        with np.errstate(divide="ignore"):
            own = self.own.effective() / sigma2
            weight = np.where(included, 1.0 / self.var, 0.0)
        if self.graph is None:
            np.fill_diagonal(weight, 0.0)  # a itself
            return combine(local, own, (weight * self.value).sum(axis=1), weight.sum(axis=1))
        return combine(local, own, *self._edge_sums(weight))

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
