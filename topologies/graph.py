"""The communication graph G in the form the hot loop uses: CSR arrays, built once per run.

Every undirected link {a, b} is stored twice, as the directed edges a→b and b→a, ordered by
source and then by destination (compressed sparse rows). Edge e goes from ``src[e]`` to
``dst[e]``, and ``reverse[e]`` is the index of the opposite edge, so a protocol can hold one
value per (agent, neighbour) pair in a flat array and exchange values along links with a
single gather. Connected components of G and the class-restricted components C̃_a of seed 001
§III-A (the component of a in the subgraph induced by a's class) are found with numpy (min-label
propagation with pointer jumping), numbered as scipy's csgraph numbers them.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # scipy.sparse is imported where used: it costs ~0.3 s at import
    import scipy.sparse as sp


def component_labels(n: int, indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Label in 0, …, K−1 of the connected component of each of n agents (CSR adjacency of an
    undirected graph, both directions stored), numbered by their smallest agent — the labels of
    scipy's `connected_components`.

    Every agent starts with its own index as label; each round takes the smallest label among
    an agent and its neighbours, then follows labels to a fixed point (label ← label[label]:
    a label always names an agent of the same component whose own label is not larger). At the
    fixed point labels agree across every link, so each component carries its smallest agent.
    Rounds grow with the diameter only logarithmically (pointer jumping), each O(|E|).
    """
    label = np.arange(n, dtype=np.int64)
    rows = np.flatnonzero(np.diff(indptr) > 0)
    starts = indptr[rows]
    while len(rows):
        low = np.minimum.reduceat(label[indices], starts)
        new = label.copy()
        np.minimum.at(new, label[rows], low)  # hook: the root a label names gets it too
        np.minimum(new, new[label], out=new)
        new[rows] = np.minimum(new[rows], low)
        while True:  # pointer jumping to the fixed point
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            break
        label = new
    return np.unique(label, return_inverse=True)[1].astype(np.int64)


#: Graphs of at most this many agents find `Graph.reverse` by sorting 16-bit agent numbers
#: (and of at most its square, by two such sorts).
_RADIX_AGENTS = 1 << 16


def _stable_order(agents: np.ndarray, n: int) -> np.ndarray:
    """np.argsort(agents, kind="stable") for agent numbers below n: numpy's stable sort of
    16-bit keys is a radix sort, O(E), so agents that fit 16 bits sort as such, and up to 32
    bits by their low then their high 16 bits (a stable sort by the low half, then by the high
    half, is the stable sort by the whole: the same permutation)."""
    if n <= _RADIX_AGENTS:
        return np.argsort(agents.astype(np.uint16), kind="stable")
    if n > _RADIX_AGENTS * _RADIX_AGENTS:
        return np.argsort(agents, kind="stable")
    low = np.argsort(agents.astype(np.uint16), kind="stable")  # the low 16 bits (wrapped)
    high = (agents >> 16).astype(np.uint16).take(low)
    return low.take(np.argsort(high, kind="stable"))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class Graph:
    """An undirected simple graph G on the agents 0, …, n−1 (no self-loops, no multi-edges).

    `indptr` and `indices` are its CSR arrays (both directions of every link, neighbours in
    increasing order); `positions` holds agents' coordinates for geometric graphs, else None.
    """

    def __init__(
        self,
        n: int,
        indptr: np.ndarray,
        indices: np.ndarray,
        positions: np.ndarray | None = None,
    ) -> None:
        self.n = int(n)
        self.indptr = _frozen(np.asarray(indptr, dtype=np.int64))
        self.indices = _frozen(np.asarray(indices, dtype=np.int64))
        self.positions = positions
        if len(self.indptr) != self.n + 1 or self.indptr[-1] != len(self.indices):
            raise ValueError("indptr does not match n and indices")

    @classmethod
    def from_edges(
        cls, n: int, u: np.ndarray, v: np.ndarray, positions: np.ndarray | None = None
    ) -> Graph:
        """The graph with links {u[i], v[i]}; repeated links (either direction) are merged.

        Raises ValueError for an agent outside [0, n) or a self-loop.
        """
        u = np.asarray(u, dtype=np.int64).ravel()
        v = np.asarray(v, dtype=np.int64).ravel()
        if len(u) != len(v):
            raise ValueError("u and v must have the same length")
        if len(u) and (min(u.min(), v.min()) < 0 or max(u.max(), v.max()) >= n):
            raise ValueError(f"an edge names an agent outside 0…{n - 1}")
        loops = u == v
        if loops.any():
            raise ValueError(f"self-loop at agent {int(u[loops][0])}: G has none")
        src = np.concatenate([u, v])
        dst = np.concatenate([v, u])
        # sorted by (src, dst), then repeats dropped: np.unique's result, but its hash table
        # costs ~15× the sort on the 10⁶ keys of a large graph
        key = np.sort(src * n + dst)
        if len(key) > 1:
            key = key[np.concatenate(([True], key[1:] != key[:-1]))]
        src, dst = key // n, key % n
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
        return cls(n, indptr, dst, positions)

    # -- arrays over directed edges, in CSR order --------------------------------------------
    @cached_property
    def degree(self) -> np.ndarray:
        """deg(a) = |N_a| of every agent."""
        return _frozen(np.diff(self.indptr))

    @cached_property
    def src(self) -> np.ndarray:
        """Source agent of every directed edge (the agent whose neighbour list holds it)."""
        return _frozen(np.repeat(np.arange(self.n, dtype=np.int64), self.degree))

    @property
    def dst(self) -> np.ndarray:
        """Destination agent of every directed edge (the neighbour)."""
        return self.indices

    @cached_property
    def reverse(self) -> np.ndarray:
        """reverse[e]: index of the edge dst[e]→src[e] (an involution without fixed points)."""
        # The edge b→a is the i-th in (src, dst) order where a→b is the i-th in (dst, src) order,
        # which a stable sort by dst gives (src ascends within it): its inverse permutation, at
        # a fraction of the cost of a lexsort or of searching every key (random reads); by
        # radix sorts of 16-bit halves (`_stable_order`).
        order = _stable_order(self.dst, self.n)
        out = np.empty_like(order)
        out[order] = np.arange(len(order))
        return _frozen(out)

    @property
    def n_directed(self) -> int:
        """Number of directed edges, 2|E| = Σ_a deg(a)."""
        return len(self.indices)

    @property
    def n_links(self) -> int:
        """Number of undirected links |E|."""
        return len(self.indices) // 2

    def links(self) -> tuple[np.ndarray, np.ndarray]:
        """Every link once, as arrays (u, v) with u < v."""
        keep = self.src < self.dst
        return self.src[keep], self.dst[keep]

    def adjacency(self, keep: np.ndarray | None = None) -> sp.csr_array:
        """The 0/1 adjacency matrix as a scipy CSR array (only the edges in mask `keep`)."""
        import scipy.sparse as sp

        if keep is None:
            data = np.ones(self.n_directed)
            return sp.csr_array((data, self.indices, self.indptr), shape=(self.n, self.n))
        keep = np.asarray(keep, dtype=bool)  # csgraph counts stored zeros as edges: drop them
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.src[keep], minlength=self.n), out=indptr[1:])
        data = np.ones(int(keep.sum()))
        return sp.csr_array((data, self.indices[keep], indptr), shape=(self.n, self.n))

    # -- components ------------------------------------------------------------------------
    @cached_property
    def components(self) -> np.ndarray:
        """Label in 0, …, K−1 of the connected component of G holding each agent."""
        return _frozen(component_labels(self.n, self.indptr, self.indices))

    @property
    def n_components(self) -> int:
        """K, the number of connected components of G (1: connected)."""
        return int(self.components.max()) + 1 if self.n else 0

    def restricted_components(self, classes: np.ndarray) -> np.ndarray:
        """Label of C̃_a for every agent a: components of G without links between classes."""
        classes = np.asarray(classes)
        same = classes[self.src] == classes[self.dst]
        indptr = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.src[same], minlength=self.n), out=indptr[1:])
        return component_labels(self.n, indptr, self.indices[same])

    def __repr__(self) -> str:
        low, high = (self.degree.min(), self.degree.max()) if self.n else (0, 0)
        return (
            f"Graph(n={self.n}, links={self.n_links}, components={self.n_components}, "
            f"degree {low}…{high})"
        )


def component_sizes(labels: np.ndarray) -> np.ndarray:
    """|C̃_a| = n_a of every agent, given the component label of every agent."""
    labels = np.asarray(labels, dtype=np.int64)
    return np.bincount(labels)[labels]
