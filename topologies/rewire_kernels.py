"""The rewiring draw's passes over every link as compiled loops (`desim.fast.kernel`): the same
arrays as `desim.topologies.dynamic`'s numpy path, from the same draws (this module draws
nothing). `dynamic` takes them for graphs above `dynamic.COMPILED_ABOVE` agents when
`desim.fast.compiled()`; importing this module imports numba, where it is installed."""

from __future__ import annotations

import numpy as np

from desim import fast


@fast.kernel
def _first_new_into(cand, indptr, indices, fresh, out, most):  # pragma: no cover
    """Write into `out` the link keys u·n + v (u < v) `cand` that are neither links of the
    graph `indptr`, `indices` on n agents nor in `fresh`, each at its first occurrence, in draw
    order, the first `most` of them; return how many. (Keys seen are held in an open
    addressing table of at least twice as many slots, a probe or two per key; a link is looked
    for in u's row, a few neighbours on one or two cache lines, not by a search of every link's
    key.)"""
    n = len(indptr) - 1
    bits = 4
    while (1 << bits) < 2 * (len(cand) + len(fresh)):
        bits += 1
    mask = (1 << bits) - 1
    table = np.full(mask + 1, -1, dtype=np.int64)  # keys are ≥ 0
    found = 0
    for i in range(len(fresh) + len(cand)):
        if found == most:  # (the draw keeps no more: the rest are not looked at)
            break
        key = fresh[i] if i < len(fresh) else cand[i - len(fresh)]
        slot = ((key * 0x5851F42D4C957F2D) >> 20) & mask
        while table[slot] != -1 and table[slot] != key:
            slot = (slot + 1) & mask
        if table[slot] == key:
            continue
        table[slot] = key
        if i < len(fresh):
            continue
        u, v = key // n, key % n
        linked = False
        for e in range(indptr[u], indptr[u + 1]):
            if indices[e] >= v:
                linked = indices[e] == v
                break
        if not linked:
            out[found] = key
            found += 1
    return found


def first_new(
    cand: np.ndarray, indptr: np.ndarray, indices: np.ndarray, fresh: np.ndarray, most: int = -1
):
    """`dynamic._first_new`'s keys: those of `cand` that are neither links of the graph of CSR
    arrays `indptr`, `indices` nor in `fresh`, each at its first occurrence, in draw order (the
    first `most` of them; −1: all)."""
    out = np.empty(len(cand), dtype=np.int64)
    return out[: _first_new_into(cand, indptr, indices, fresh, out, most)]


@fast.kernel
def merged_without(keys, dropped, added):  # pragma: no cover
    """Sorted `keys` without the entries at sorted places `dropped`, merged with sorted
    `added` (no entry in common): `dynamic._merged(np.delete(keys, dropped), added)`."""
    out = np.empty(len(keys) - len(dropped) + len(added), dtype=np.int64)
    d = a = w = 0
    for i in range(len(keys)):
        if d < len(dropped) and dropped[d] == i:
            d += 1
            continue
        key = keys[i]
        while a < len(added) and added[a] < key:
            out[w] = added[a]
            a += 1
            w += 1
        out[w] = key
        w += 1
    while a < len(added):
        out[w] = added[a]
        a += 1
        w += 1
    return out


@fast.kernel
def relinked_csr(indptr, indices, gone, made):  # pragma: no cover
    """The CSR arrays (indptr, indices) of the graph `indptr`, `indices` on n agents without
    the directed edges of sorted keys a·n + b `gone` and with those of sorted `made`: each row
    the old one, the gone neighbours skipped and the made ones inserted in order."""
    n = len(indptr) - 1
    new_indptr = np.empty(n + 1, dtype=np.int64)
    new_indices = np.empty(len(indices) - len(gone) + len(made), dtype=np.int64)
    new_indptr[0] = 0
    g = m = w = 0
    for a in range(n):
        base = a * n
        for i in range(indptr[a], indptr[a + 1]):
            key = base + indices[i]
            while m < len(made) and made[m] < key:
                new_indices[w] = made[m] - base
                m += 1
                w += 1
            if g < len(gone) and gone[g] == key:
                g += 1
                continue
            new_indices[w] = indices[i]
            w += 1
        while m < len(made) and made[m] < base + n:
            new_indices[w] = made[m] - base
            m += 1
            w += 1
        new_indptr[a + 1] = w
    return new_indptr, new_indices


def warm() -> None:
    """Call every kernel once on a three-agent graph, with the argument types of a run (a
    graph's arrays are read-only): numba loads (or compiles) them now, not at the run's first
    change."""
    from desim.topologies.dynamic import _CompiledPasses, link_keys
    from desim.topologies.graph import Graph

    graph, passes = Graph(3, np.array([0, 1, 2, 2]), np.array([1, 0])), _CompiledPasses()
    keys, none = link_keys(graph), np.empty(0, dtype=np.int64)
    passes.first_new(np.array([1, 2, 5]), graph, keys, none, 2)
    passes.merged(keys, np.array([0]), np.array([2]))
    passes.relinked(graph, np.array([2]), keys)
