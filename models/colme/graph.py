"""Private-ColME on a communication graph (``peers = "topology"``): an agent queries only its
neighbours, and every per-pair state is held for the directed edges that exist.

A pair b → a is named by a pair index p of the directed edge a → b, so the pair state of M
agents of degree r takes O(M·r) memory, not O(M²). Pairs are numbered by RR position first,
then by the querier's degree, then by querier: block q holds every agent's neighbour at RR
position q + 1 (those of degree > q), by degree, then in agent order. Under RR every querier of
one degree is at the same position in a slot, so on a regular graph a slot's queries touch one
contiguous block of every per-pair array, and on an irregular one a run per degree (read in
agent order, as a few interleaved streams of consecutive pairs), not one cache line per query
scattered over all of them. Sums over a's neighbours run in the graph's CSR order (by
neighbour), as before this numbering: `csr_pairs` maps CSR edges to pairs.

RR over neighbours keeps the dense RR's order: agent a's neighbours taken cyclically from the
first one above a (a+1, a+2, … mod M, skipping non-neighbours), one per slot; rRR skips the
neighbours a has excluded. On a complete graph both are the dense schedules exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

import numpy as np

from desim.models.colme.pairs import revise
from desim.models.colme.schedule import max_pair_releases
from desim.models.colme.view import every_agent
from desim.topologies.graph import Graph


class Neighbours:
    """Each agent's neighbours in RR order, and the pair index of each (agent, RR position)."""

    def __init__(
        self, graph: Graph, compiled: bool = False, previous: Neighbours | None = None
    ) -> None:
        """The numbering of `graph`'s pairs (`compiled`: by `change_kernels.neighbour_layout`,
        the same integers; `previous`: the numbering this one replaces, whose run of pair
        indices and scratch arrays are reused where the pair counts agree)."""
        self.n = graph.n
        self.indptr = graph.indptr
        self.degree = graph.degree
        #: Pairs, one per ordered pair (querier, neighbour): the number of pairs held.
        self.n_pairs = graph.n_directed
        src, dst = graph.src, graph.dst  # by CSR edge
        #: Agents with at least one neighbour: those that query.
        self.querying = np.flatnonzero(self.degree > 0)
        #: RR's next pair and its neighbour of every pair, as rows (`following`, and dst of
        #: it: RR's irregular slot reads both of a pair in one row, 32-bit where they fit),
        #: where the layout was compiled (None otherwise: `following` and `dst` are read apart).
        self.ahead: np.ndarray | None = None
        if len(self.querying) == self.n:  # (the views' arrays are then read without a gather)
            self.querying = every_agent(self.n)
        top = int(self.degree.max(initial=0)) + 1  # position < degree < top
        if compiled and top * top <= _COUNTING_KEYS:
            from desim.models.colme.change_kernels import neighbour_layout

            self.below, csr_pairs, by_pair_dst, self._rr, ahead = neighbour_layout(
                self.indptr, graph.indices, top
            )
            self.ahead = _frozen(ahead)
        else:
            self.below, csr_pairs, by_pair_src, by_pair_dst, self._rr = _layout(graph)
            self.__dict__["src"] = _frozen(by_pair_src)  # (the cached property's value)
        #: The pair index of every CSR edge (a's edges in order of neighbour).
        self.csr_pairs = _frozen(csr_pairs)
        #: The neighbour b of every pair (its querier a: `src`).
        self.dst = _frozen(by_pair_dst)
        #: The querier and the neighbour of every CSR edge (sorted by a·M + b).
        self.csr_src, self.csr_dst = src, dst
        #: block[q]: the first pair at RR position q + 1 (block[q + 1] − block[q] agents).
        # (block q holds one pair of every agent of degree > q: counted from the degrees)
        above = len(self.degree) - np.cumsum(np.bincount(self.degree, minlength=2))[:-1]
        self.block = np.concatenate(([0], np.cumsum(above)))
        self._responders: tuple[np.ndarray | None, np.ndarray] = (None, np.empty(0))
        self._scratch: list[np.ndarray] = []
        #: Every pair index in order, as integers and as floats (what a message carries):
        #: RR's slot on a regular graph is a view of a run of them (`span`).
        if previous is not None and previous.n_pairs == self.n_pairs:
            self.numbers, self.floats = previous.numbers, previous.floats
            self._scratch = previous._scratch  # (their pages are in memory already)
        else:
            self.numbers = _frozen(np.arange(self.n_pairs))
            self.floats = _frozen(self.numbers.astype(float))

    @cached_property
    def src(self) -> np.ndarray:
        """The querier a of every pair (made when first read where the layout was compiled:
        a graph change does not read it)."""
        out = np.empty(self.n_pairs, dtype=np.int64)
        out[self.csr_pairs] = self.csr_src
        return _frozen(out)

    @cached_property
    def csr_keys(self) -> np.ndarray:
        """a·M + b of every CSR edge a → b: sorted (what a graph change searches)."""
        return _frozen(self.csr_src * self.n + self.csr_dst)

    @cached_property
    def following(self) -> np.ndarray:
        """The pair of the same querier at the next RR position (cyclic) of every pair: RR's
        slot t + 1 on an irregular graph is these of slot t's pairs."""
        # `_rr` holds each agent's pairs by RR position, row after row: the next position's
        # pair is the next entry, but at the end of a row, where it is the row's first
        nxt = np.empty(self.n_pairs, dtype=np.int64)
        nxt[:-1] = self._rr[1:]
        rows = self.degree > 0
        nxt[self.indptr[1:][rows] - 1] = self._rr[self.indptr[:-1][rows]]
        out = np.empty(self.n_pairs, dtype=np.int64)
        out[self._rr] = nxt
        return _frozen(out)

    def scratch(self, count: int) -> list[np.ndarray]:
        """`count` float arrays of one entry per pair, kept for reuse from call to call (their
        contents are whatever the last caller left): a checkpoint's passes over every pair
        write into them, not into new arrays whose pages are first touched each time."""
        while len(self._scratch) < count:
            self._scratch.append(np.empty(self.n_pairs))
        return self._scratch[:count]

    def span(self, pairs: np.ndarray) -> slice | None:
        """The run of pairs start … stop − 1 that `pairs` holds if it is a view of consecutive
        entries of `numbers` or `floats` (so its values are those indices), else None."""
        whole = self.floats if pairs.dtype.kind == "f" else self.numbers
        if pairs.base is not whole or pairs.ndim != 1 or pairs.strides != whole.strides:
            return None
        start = int(pairs[0]) if len(pairs) else 0
        return slice(start, start + len(pairs))

    def edge(self, a: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Pair index of agent a's neighbour at RR position(s) 1 … deg(a) (cyclic)."""
        return self._rr[self.indptr[a] + (position - 1) % self.degree[a]]

    def at_place(self, a: np.ndarray, place: np.ndarray) -> np.ndarray:
        """Pair index of agent a's neighbour at RR position place + 1 (0 ≤ place < deg(a))."""
        return self._rr[self.indptr[a] + place]

    def min_degree(self) -> int:
        """The smallest degree of a querying agent (0 when none queries)."""
        return int(self.degree[self.querying].min()) if len(self.querying) else 0

    def max_degree(self) -> int:
        """The largest degree: the most queriers one responder has."""
        return int(self.degree.max(initial=0))

    def edges_of(self, agents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The pairs of `agents` (each agent's in CSR order, by neighbour) and the position in
        `agents` of each."""
        d = self.degree[agents]
        owner = np.repeat(np.arange(len(agents)), d)
        first = np.repeat(self.indptr[agents] - np.cumsum(d) + d, d)
        return self.csr_pairs[first + np.arange(len(owner))], owner

    def of_responders(self, values: np.ndarray, e: np.ndarray | slice) -> np.ndarray:
        """values[b] of the neighbour b of pairs `e` (one value for every agent: that value, a
        scalar, which multiplies as the array of it would); `values` (one per agent) must not
        change during the run: the gather over every pair is made once and kept."""
        held, by_pair = self._responders
        if held is not values:
            # (one σ² for all, the usual case: no gather per slot where pairs are scattered)
            same = len(values) > 0 and bool((values == values[0]).all())
            by_pair = values[0] if same else values.take(self.dst)
            self._responders = held, by_pair = values, by_pair
        return by_pair if by_pair.ndim == 0 else by_pair[e]


def max_neighbour_releases(schedule: str, neighbours: Neighbours, t_max: int) -> int:
    """κ_max on the graph: under RR agent a queries each neighbour once every deg(a) slots, so
    ⌈t_max/d_min⌉ (the dense bound with M − 1 = d_min); under rRR, t_max as in the dense case."""
    return max_pair_releases(schedule, neighbours.min_degree() + 1, t_max)


class EdgeBeliefs:
    """C_a^{(t)} restricted to neighbours: `flat[e]` is χ_a(b) of edge e = a → b, with each
    agent's number of included neighbours (itself not counted)."""

    def __init__(
        self, included: np.ndarray, neighbours: Neighbours, n_included: np.ndarray | None = None
    ) -> None:
        """χ_a(b) of every edge (`n_included`: each agent's count of them, where known)."""
        self.flat = self.included = included
        if n_included is None:
            n_included = np.bincount(
                neighbours.src, weights=included, minlength=neighbours.n
            ).astype(np.int64)
        self.n_included = n_included

    def revise_pairs(
        self,
        a: np.ndarray,
        pair: np.ndarray,
        decision: np.ndarray,
        current: np.ndarray | None = None,
    ) -> None:
        """Set χ_a(b) of distinct pairs `pair` (from agents a) to `decision` (`current`: their
        χ_a(b) now, if the caller has read it)."""
        revise(self.flat, self.n_included, a, pair, decision, current)


class NeighbourRoundRobin:
    """RR over neighbours: in slot t agent a queries its neighbour at position (t−1) mod deg(a)
    + 1."""

    def __init__(self, neighbours: Neighbours) -> None:
        self.nb = nb = neighbours
        self.agents = a = nb.querying
        self._first, self._degree = nb.indptr[a], nb.degree[a]
        # one degree for every querier (a regular graph): slot t's pairs are the block of RR
        # position (t − 1) mod d + 1, a range (views of these, not gathers)
        self._uniform = len(a) > 0 and bool((self._degree == self._degree[0]).all())
        self._pairs = nb.numbers
        # otherwise the pairs of the slot last asked for: slot t + 1 moves each querier to its
        # next neighbour in RR order (one look-up per querier in `following`)
        self._slot, self._last = 0, np.zeros(0, dtype=np.int64)
        # a compiled layout's `ahead` rows: the next pairs and their neighbours in one kernel
        self._step = None
        if nb.ahead is not None:
            from desim.models.colme.pair_kernels import rr_next

            self._step = rr_next

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers a, queried neighbours b and pairs a → b of slot t (`Neighbours.edge`
        at position (t − 1) mod deg(a) + 1)."""
        if self._uniform:
            first = self.nb.block[(t - 1) % int(self._degree[0])]
            span = slice(first, first + len(self.agents))
            return self.agents, self.nb.dst[span], self._pairs[span]
        if t != self._slot + 1 or self._slot == 0:
            e = self.nb._rr.take((t - 1) % self._degree + self._first)
            b = self.nb.dst.take(e)
        elif self._step is not None:
            e, b = self._step(self.nb.ahead, self._last)
        else:
            e = self.nb.following.take(self._last)
            b = self.nb.dst.take(e)
        self._slot, self._last = t, e
        return self.agents, b, e

    def batch(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers, queried neighbours and pairs of several slots, slot by slot."""
        a = np.tile(self.agents, len(slots))
        d = np.tile(self._degree, len(slots))
        e = self.nb.edge(a, (np.repeat(slots, len(self.agents)) - 1) % d + 1)
        return a, self.nb.dst[e], e


class NeighbourRestrictedRoundRobin:
    """rRR over neighbours: each agent queries its next RR position whose neighbour it still
    includes."""

    def __init__(self, neighbours: Neighbours, beliefs: EdgeBeliefs) -> None:
        self.nb = neighbours
        self.beliefs = beliefs
        self.agents = np.arange(neighbours.n)
        self.offset = np.zeros(neighbours.n, dtype=np.int64)  # position last queried, 0 = none

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers a (those including some neighbour), their neighbours b and pairs."""
        nb = self.nb
        agents = self.agents[self.beliefs.n_included > 0]
        offset = self.offset[agents]
        degree = nb.degree[agents]
        ahead = np.arange(1, min(16, nb.max_degree()) + 1)
        todo = np.arange(len(agents))
        flat = self.beliefs.flat
        while len(todo):  # look a window of positions ahead, as the dense rRR does
            a, d = agents[todo], degree[todo, None]
            cand = (offset[todo, None] + ahead - 1) % d + 1
            hit = flat[nb.at_place(a[:, None], cand - 1)]
            first = hit.argmax(axis=1)
            rows = np.arange(len(todo))
            found = hit[rows, first]
            offset[todo] = np.where(found, cand[rows, first], cand[:, -1])
            todo = todo[~found]
        self.offset[agents] = offset
        e = nb.edge(agents, offset)
        return agents, nb.dst[e], e


def edge_row_sums(protocol: Any, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """`PrivateColME.row_sums` on a graph: Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}] over
    the neighbours b that agents a in `rows` include, from the pair state.

    Up to `incremental_above` agents each row is laid out as the dense one (M columns, 0 where
    there is no pair) and summed the same way, so a complete graph gives the bits of
    peers = "all"; above, the rows are summed edge by edge in CSR order (O(M·r)).
    """
    p, nb = protocol, protocol.graph
    agents = np.arange(nb.n)[rows]
    every = isinstance(rows, slice) and len(agents) == nb.n
    # (before every pair's querier is read: a compiled layout makes `src` only when read)
    if every and nb.n > p.incremental_above and p.stat.compact and p.stat.mechanism == "pm1":
        return _every_edge_sums_last(p)
    if every:  # every pair, in pair order (contiguous); summed below in CSR order
        e, owner = slice(None), nb.src
    else:
        e, owner = nb.edges_of(agents)
    k = len(agents)
    weight, value = _edge_terms(p, e)
    if nb.n > p.incremental_above:
        weighted = weight * value
        if every:  # (the terms of a's neighbours in CSR order: the summation order of before)
            weighted, weight = weighted.take(nb.csr_pairs), weight.take(nb.csr_pairs)
            owner = nb.csr_src
        return np.bincount(owner, weighted, minlength=k), np.bincount(owner, weight, minlength=k)
    w, v = np.zeros((k, nb.n)), np.zeros((k, nb.n))
    w[owner, nb.dst[e]], v[owner, nb.dst[e]] = weight, value
    return (w * v).sum(axis=1), w.sum(axis=1)


def _every_edge_sums_last(p: Any) -> tuple[np.ndarray, np.ndarray]:
    """`edge_row_sums` of every agent above `incremental_above` under ``last`` PM-I: the floats
    of `_edge_terms` and the CSR-order sums, each pass written into the graph's kept buffers
    (`Neighbours.scratch`) instead of a new array per term at every checkpoint."""
    nb = p.graph
    noise, num, value, weight, bits = nb.scratch(5)
    kappa, total, data = p.stat.last_pm1_columns(noise)
    sigma2 = nb.of_responders(p.sigma2, slice(None)) if p.known else p.v_hat[:]
    with np.errstate(invalid="ignore"):
        np.multiply(sigma2, data, out=num)
        noise *= p.sigma2_dp
        num += noise
    taken = kappa > 0
    if taken.all():  # (every pair has had a release: T is the block sum itself)
        value = total
    else:
        _where(taken, total, value, bits)
    keep = np.logical_and(p.beliefs.flat, taken, out=taken)
    with np.errstate(divide="ignore"):  # (1/0 of pairs never taken: masked out next)
        np.divide(1.0, num, out=weight)
    _where(keep, weight, weight, bits)
    value = np.multiply(weight, value, out=num)  # the weighted terms
    # (the terms of a's neighbours in CSR order: the summation order of before)
    np.take(value, nb.csr_pairs, out=noise, mode="clip")
    np.take(weight, nb.csr_pairs, out=bits, mode="clip")
    return (
        np.bincount(nb.csr_src, noise, minlength=nb.n),
        np.bincount(nb.csr_src, bits, minlength=nb.n),
    )


def _where(mask: np.ndarray, x: np.ndarray, out: np.ndarray, bits: np.ndarray) -> None:
    """out = x where `mask`, +0.0 elsewhere (np.where(mask, x, 0.0)'s bits): x's bits ANDed
    with all ones or all zeros, in straight passes (a masked copy branches on every entry).
    `bits` is a scratch array of out's size."""
    ones = bits.view(np.int64)
    np.copyto(ones, mask)
    np.negative(ones, out=ones)  # 1 → −1: every bit set
    np.bitwise_and(x.view(np.int64), ones, out=out.view(np.int64))


def _edge_terms(p: Any, e: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """The weight 1/Var[T_{b→a}] (0 for an excluded b) and T_{b→a} of pairs `e`.

    Where every block is the last release alone (``last`` under PM-I) n is 0 or 1, so T = block
    sum / 1 and Var = (σ_b²D + σ_DP²A)/1 are the block sum and the numerator themselves: the
    divisions by n and n², and their passes, are skipped for the same bits.
    """
    n, total, data, noise = p.stat.pair_columns(e)
    last_only = p.stat.compact and p.stat.mechanism == "pm1"
    sigma2 = p.graph.of_responders(p.sigma2, e) if p.known else p.v_hat[e]
    with np.errstate(invalid="ignore"):
        num = sigma2 * data
        num += p.sigma2_dp * noise
    if last_only:
        taken = n > 0
        value = np.where(taken, total, 0.0)
        keep = p.beliefs.flat[e] & taken
        return np.divide(1.0, num, out=np.zeros_like(num), where=keep), value
    value = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    var = np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)
    with np.errstate(divide="ignore"):
        return np.where(p.beliefs.flat[e], 1.0 / var, 0.0), value


def responder_spend(
    protocol: Any, first_sample_psums: Callable[[str, np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per responder b, the most p-sums holding its first sample that one neighbour got, and
    their sum over its neighbours (`PrivateColME.privacy_spend` on a graph)."""
    nb = protocol.graph
    counts = protocol.mech.count.ravel()[: nb.n_pairs]
    if protocol.retired is not None:  # links dropped during the run (`desim.models.colme.rewire`)
        return protocol.retired.spend(first_sample_psums, protocol.params.mechanism, nb, counts)
    per = first_sample_psums(protocol.params.mechanism, counts)
    one = np.zeros(nb.n, dtype=per.dtype)
    np.maximum.at(one, nb.dst, per)
    every = np.zeros(nb.n, dtype=per.dtype)
    np.add.at(every, nb.dst, per)
    return one, every


#: The most (position, degree) keys the compiled layout counts (degrees up to 1023).
_COUNTING_KEYS = 2**20


def _layout(graph: Graph) -> tuple[np.ndarray, ...]:
    """`Neighbours`' numbering of `graph` by numpy passes: (below, csr_pairs, src, dst, rr):
    each agent's neighbours below it, the pair of every CSR edge, the querier and neighbour of
    every pair, and rr[indptr[a] + q], the pair of a's neighbour at RR position q + 1."""
    n, n_pairs, degree, indptr = graph.n, graph.n_directed, graph.degree, graph.indptr
    src, dst = graph.src, graph.dst
    # neighbours below a come first in a's row: RR starts after them (at the first above a)
    below = np.bincount(src[dst < src], minlength=n)
    # the RR position (from 0) of every CSR edge, then the pairs: by position, then querier
    # (its place in a's row less `below`, wrapped by deg(a): a multiply, not a division)
    numbers = np.arange(n_pairs)
    position = numbers - np.repeat(indptr[:-1] + below, degree)
    position += np.repeat(degree, degree) * (position < 0)
    order = _by_position(position, np.repeat(degree, degree))
    csr_pairs = np.empty(n_pairs, dtype=np.int64)
    csr_pairs[order] = numbers
    rr = np.empty(n_pairs, dtype=np.int64)
    rr[np.repeat(indptr[:-1], degree) + position] = csr_pairs
    return below, csr_pairs, src[order], dst[order], rr


def _by_position(position: np.ndarray, degree: np.ndarray) -> np.ndarray:
    """The CSR edges ordered by RR position, then querier's degree, then querier. CSR order is
    by querier and one querier's positions differ, so a stable sort by (position, degree)
    gives it; on small integers numpy's stable sort is a radix sort (O(E), where a graph change
    rebuilds it), not a comparison sort of 64-bit keys. Where position·top + degree fits 16 bits
    it is one sort of that key; otherwise a stable sort by degree, then one of that by
    position."""
    top = int(degree.max(initial=0)) + 1  # position < degree < top
    if top * top <= 2**16:
        return np.argsort((position * top + degree).astype(np.uint16), kind="stable")
    by_degree = np.argsort(_small(degree), kind="stable")
    return by_degree[np.argsort(_small(position[by_degree]), kind="stable")]


def _small(keys: np.ndarray) -> np.ndarray:
    """Non-negative integer `keys` as 16-bit ones where they fit (a radix sort's keys)."""
    return keys.astype(np.uint16 if len(keys) == 0 or keys.max() < 2**16 else keys.dtype)


def _frozen(a: np.ndarray) -> np.ndarray:
    """`a`, read-only: the run's pair numbering is fixed once built."""
    a.flags.writeable = False
    return a
