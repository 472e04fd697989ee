"""Private-ColME's dense pairs numbered by RR position, so that a slot's queries are one block.

Under RR, in slot t every agent a queries b = a + o (mod M), o = `rr_offset(t, M)`. Numbering
the ordered pair (querier a, responder b) as ((b − a) mod M)·M + a puts the M pairs of a slot
in one run, o·M … o·M + M − 1, in querier order: the release mechanism's count and noise
total, the statistic's κ and (block sum, D) cell, and the beliefs are then read and written as
slices, one contiguous block each, instead of M scattered cells of M × M arrays (a stride of
M + 1: a cache line and a page per cell). The arithmetic per pair is unchanged, so are the
floats. `RoundRobinPairs` maps this numbering to the [a, b] and [b, a] matrices the state's
other readers take (the combination recomputed for an agent, the privacy ledger, tests).

It applies where every rule of the slot reads its pairs in slot order (`round_robin_pairs`):
RR over ideal links with every other agent as a peer, ``last`` PM-I, known variances, no
budget, no adversaries, no forgetting, Lemma 4's combination, and populations above
`PrivateColME.positions_above` (below, the [a, b] layout stays: its views are what small runs
and their tests read).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.models.colme.model import rr_offset

# rows of a matrix gathered at once (`RoundRobinPairs.matrix`): a bounded index array
_CHUNK = 256


class RoundRobinPairs:
    """The pair number ((b − a) mod M)·M + a of every ordered pair of M agents (see the module)."""

    def __init__(self, n_agents: int) -> None:
        self.n_agents = n_agents
        self.agents = np.arange(n_agents)

    def run(self, t: int) -> slice:
        """The pairs of slot t's RR queries, a = 0 … M − 1 in order: one run."""
        m = self.n_agents
        start = int(rr_offset(t, m)) * m
        return slice(start, start + m)

    def of(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The pair numbers of querier a and responder b (arrays that broadcast)."""
        m = self.n_agents
        return (b - a) % m * m + a

    def querier_rows(self, rows: np.ndarray | slice) -> np.ndarray:
        """The pair numbers of agents a in `rows` with every b, as [a, b] (one row per a)."""
        return self.of(self.agents[rows][:, None], self.agents[None, :])

    def matrix(self, flat: np.ndarray, by: str = "querier") -> np.ndarray:
        """`flat` (one value per pair number) as the M × M matrix [a, b] (`by` "querier") or
        [b, a] ("responder"), gathered in blocks of rows."""
        m = self.n_agents
        out = np.empty((m, m), dtype=flat.dtype)
        for start in range(0, m, _CHUNK):
            rows = self.agents[start : start + _CHUNK][:, None]
            pairs = self.of(rows, self.agents) if by == "querier" else self.of(self.agents, rows)
            out[start : start + _CHUNK] = flat[pairs]
        return out

    def per_responder(self, per: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The most and the sum of integer `per` (one per pair number) over each responder b's
        queriers, as [b, a]'s rows give them: row o of the pairs holds b = a + o (mod M), two
        runs of b in order (integer sums: exact in any order)."""
        m = self.n_agents
        if per.dtype.kind not in "iub":  # (floats: summed as the matrix's rows are)
            by_responder = self.matrix(per.ravel(), "responder")
            return by_responder.max(axis=1), by_responder.sum(axis=1)
        rows = per.reshape(m, m)
        most, total = np.zeros(m, dtype=per.dtype), np.zeros(m, dtype=per.dtype)
        for o in range(m):  # b = o … M − 1 from a = 0 … M − 1 − o, b < o from a = M − o …
            head, tail = rows[o, : m - o], rows[o, m - o :]
            np.maximum(most[o:], head, out=most[o:])
            np.maximum(most[:o], tail, out=most[:o])
            total[o:] += head
            total[:o] += tail
        return most, total

    def number(self, by_querier: np.ndarray) -> np.ndarray:
        """An [a, b] matrix's values in pair-number order (flat): the inverse of `matrix`."""
        first = by_querier.flat[0]
        if (by_querier == first).all():  # (every cell alike, as C_a^{(0)} of everyone)
            return np.full(by_querier.size, first, dtype=by_querier.dtype)
        flat = np.empty(by_querier.size, dtype=by_querier.dtype)
        for start in range(0, self.n_agents, _CHUNK):
            rows = slice(start, start + _CHUNK)
            flat[self.querier_rows(rows)] = by_querier[rows]
        return flat


def round_robin_pairs(protocol: Any, ctx: Any) -> RoundRobinPairs | None:
    """The RR numbering of the pairs where it applies (see the module), else None."""
    p, m = protocol.params, ctx.n_agents
    applies = (
        p.peers == "all"
        and p.schedule == "rr"
        and (ctx.links is None or ctx.links.ideal)
        and (p.mechanism, p.weights, p.variance) == ("pm1", "last", "known")
        and p.budget is None
        and p.adversaries is None
        and p.forget is None
        and p.combination == "weighted"
        and m > protocol.positions_above
    )
    return RoundRobinPairs(m) if applies else None
