"""A graph change's passes over every pair as compiled loops (`desim.fast.kernel`): the pair
numbering of the new graph (`graph.Neighbours`) and the map of the pairs it keeps
(`rewire.carried`), the same integers as their numpy paths. `desim.models.colme.rewire` takes
them for graphs above `compiled.CompiledPairs.above` agents when `desim.fast.compiled()`;
importing this module imports numba, where it is installed."""

from __future__ import annotations

import numpy as np

from desim import fast


def neighbour_layout(indptr: np.ndarray, indices: np.ndarray, top: int) -> tuple[np.ndarray, ...]:
    """`Neighbours`' numbering of the graph `indptr`, `indices` (degrees below `top`):
    (below, csr_pairs, dst, rr, ahead), each pair numbered by RR position, then the
    querier's degree, then the querier, by one counting sort of the CSR edges (stable, as the
    numpy path's radix sort is); `ahead` is `Neighbours.ahead`. (Three loops, each its own
    kernel: as one, numba compiled them to slower code.)"""
    below, position, starts = _positions(indptr, indices, top)
    csr_pairs, dst, rr = _placed(indptr, indices, top, position, starts)
    # (32-bit rows where the pair numbers fit: RR's step reads one row per querier)
    ahead = np.empty((len(rr), 2), dtype=np.int32 if len(rr) < 2**31 else np.int64)
    _following(indptr, rr, dst, ahead)
    return below, csr_pairs, dst, rr, ahead


@fast.kernel
def _positions(indptr, indices, top):  # pragma: no cover
    """Each agent's neighbours below it, the RR position (from 0) of every CSR edge, and the
    first pair of every key position·top + degree (a counting sort's starts)."""
    n = len(indptr) - 1
    below = np.zeros(n, dtype=np.int64)
    position = np.empty(len(indices), dtype=np.int64)
    starts = np.zeros(top * top + 1, dtype=np.int64)
    for a in range(n):
        first, degree = indptr[a], indptr[a + 1] - indptr[a]
        count = 0
        for e in range(first, first + degree):
            count += indices[e] < a
        below[a] = count
        for e in range(first, first + degree):
            place = e - first - count
            position[e] = place + degree if place < 0 else place
            starts[position[e] * top + degree + 1] += 1
    for key in range(top * top):
        starts[key + 1] += starts[key]
    return below, position, starts


@fast.kernel
def _placed(indptr, indices, top, position, starts):  # pragma: no cover
    """The pair of every CSR edge (its key's next free place, in CSR order: stable), the
    neighbour of every pair, and rr[indptr[a] + q]: a's pair at position q + 1. (Not the
    querier of every pair: a second stream of writes scattered over the pairs would cost the
    loop about twice its time; `Neighbours.src` makes it where it is read.)"""
    n_pairs = len(indices)
    csr_pairs = np.empty(n_pairs, dtype=np.int64)
    dst = np.empty(n_pairs, dtype=np.int64)
    rr = np.empty(n_pairs, dtype=np.int64)
    for a in range(len(indptr) - 1):
        first, degree = indptr[a], indptr[a + 1] - indptr[a]
        for e in range(first, first + degree):
            key = position[e] * top + degree
            pair = starts[key]
            starts[key] = pair + 1
            csr_pairs[e] = pair
            dst[pair] = indices[e]
            rr[first + position[e]] = pair
    return csr_pairs, dst, rr


@fast.kernel
def _following(indptr, rr, dst, ahead):  # pragma: no cover
    """`Neighbours.ahead` written into `ahead`: the pair at the next RR position (cyclic) of
    every pair, and its neighbour (`Neighbours.following`'s values are the first column)."""
    for a in range(len(indptr) - 1):
        first, last = indptr[a], indptr[a + 1] - 1
        for i in range(first, last + 1):
            pair = rr[i + 1] if i < last else rr[first]
            ahead[rr[i], 0] = pair
            ahead[rr[i], 1] = dst[pair]


@fast.kernel
def carry_map(
    old_indptr, old_indices, old_pairs, new_indptr, new_indices, new_pairs
):  # pragma: no cover
    """`rewire._Carry`'s arrays from one merge of each agent's old and new rows (both in
    increasing neighbour order): (index: for every new pair the old pair of its link, 0 for a
    new link; new: whether it is a new link; fresh: the new links' pairs, increasing; gone:
    the old pairs whose link is gone, in the old CSR order, and the querier of each)."""
    index = np.zeros(len(new_indices), dtype=np.int64)
    new = np.ones(len(new_indices), dtype=np.bool_)
    gone = np.empty(len(old_indices), dtype=np.int64)
    gone_src = np.empty(len(old_indices), dtype=np.int64)
    dropped = 0
    for a in range(len(new_indptr) - 1):
        i, i_end = old_indptr[a], old_indptr[a + 1]
        j, j_end = new_indptr[a], new_indptr[a + 1]
        while i < i_end:
            if j < j_end and old_indices[i] == new_indices[j]:
                index[new_pairs[j]] = old_pairs[i]
                new[new_pairs[j]] = False
                i += 1
                j += 1
            elif j == j_end or old_indices[i] < new_indices[j]:
                gone[dropped] = old_pairs[i]
                gone_src[dropped] = a
                dropped += 1
                i += 1
            else:
                j += 1
    fresh = np.empty(len(new_indices), dtype=np.int64)
    count = 0
    for pair in range(len(new)):
        if new[pair]:
            fresh[count] = pair
            count += 1
    return index, new, fresh[:count], gone[:dropped], gone_src[:dropped]


@fast.kernel
def carried_beliefs(included, old, index, new, indptr, csr_pairs, n_included):  # pragma: no cover
    """χ_a(b) over the new pairs: `old`'s of the link for a kept one, `included`'s as made
    for a new link; then each querier's count of included pairs counted into `n_included`
    (zeros) over its row of the new graph's CSR arrays `indptr`, `csr_pairs` (`EdgeBeliefs`'
    count, the same integers; one byte per pair read: no querier of every pair needed)."""
    for pair in range(len(index)):
        if not new[pair]:
            included[pair] = old[index[pair]]
    for a in range(len(indptr) - 1):
        count = 0
        for e in range(indptr[a], indptr[a + 1]):
            count += included[csr_pairs[e]]
        n_included[a] = count


def warm() -> None:
    """Call every kernel once on a one-link graph, with the argument types of a run (a graph's
    arrays are read-only): numba loads (or compiles) them now, not at the run's first change."""
    from desim.models.colme.graph import Neighbours
    from desim.topologies.graph import Graph

    old = Neighbours(Graph(2, np.array([0, 1, 2]), np.array([1, 0])))
    new = Neighbours(Graph(2, np.array([0, 1, 2]), np.array([1, 0])), compiled=True)
    index, fresh, *_ = carry_map(
        old.indptr, old.csr_dst, old.csr_pairs, new.indptr, new.csr_dst, new.csr_pairs
    )
    included, counts = np.ones(2, dtype=bool), np.zeros(2, dtype=np.int64)
    carried_beliefs(included, included.copy(), index, fresh, new.indptr, new.csr_pairs, counts)
