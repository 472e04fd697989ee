"""What an agent holds per directed edge e = (a, b) of the graph, and how a message finds its edge.

Every array here is indexed by the directed edge in CSR order (`Graph.src`, `Graph.dst`): slot e
is a's record of its neighbour b. `EdgeStates` holds b's latest states as a received them (the
per-edge delivery path: links that are not ideal, windows); `EdgeSlots` maps a message
(receiver a, sender b) to its slot e; `newest` picks per edge the newest of a batch's messages
(by send time: a state, decision or size older than the one held is ignored); `Rows` counts
and finds each agent's run of edges.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.kernel.rowindex import RowIndex
from desim.models.ccolme.compiled import CompiledPass, PairTable
from desim.models.ccolme.model import consensus_step, mix
from desim.topologies.graph import Graph

#: Edge keys up to which `EdgeSlots` keeps a direct table (int32: 16 MiB).
TABLE_KEYS = 1 << 22
#: `BlockedTake` reads its values 2^BLOCK_BITS at a time: one block of 8-byte values stays in a
#: core's cache while every index into it is served.
BLOCK_BITS = 16
#: `flatnonzero_into` reads this many flags at a time (a cache-sized piece of int64 positions).
PIECE = 1 << 18


def common(x: np.ndarray) -> float | None:
    """The value every element of x shares, or None (also for an empty x)."""
    if len(x) == 0 or not (x == x[0]).all():
        return None
    return float(x[0])


def flatnonzero_into(mask: np.ndarray, out: np.ndarray) -> np.ndarray:
    """`np.flatnonzero(mask)` written into `out` (long enough; its first count slots returned),
    `PIECE` flags at a time: no per-edge index array is made."""
    k, chunk = 0, PIECE
    for lo in range(0, len(mask), chunk):
        part = np.flatnonzero(mask[lo : lo + chunk])
        np.add(part, lo, out=out[k : k + len(part)])
        k += len(part)
    return out[:k]


class Turns:
    """Per-edge arrays made anew whenever C moves, written into `count` buffers taken in turn.

    With two, the array of the version before stays intact while the new one is made (it may
    still be read then); with one, the next array overwrites it (nothing reads it again). A
    fresh array of every edge in every slot that C moves costs page faults that grow faster
    than the graph.
    """

    def __init__(self, size: int, dtype: type = np.int64, count: int = 2) -> None:
        self._size, self._dtype, self._count = size, dtype, count
        self._buffers: list[np.ndarray] = []

    def next(self, k: int) -> np.ndarray:
        """The first k slots of the buffer handed out least recently."""
        if not self._buffers:  # pages are touched only where written
            self._buffers = [np.empty(self._size, dtype=self._dtype) for _ in range(self._count)]
        self._buffers.append(self._buffers.pop(0))
        return self._buffers[-1][:k]


def newest(
    e: np.ndarray, stamp: np.ndarray, held: np.ndarray, strict: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Messages for edge slots e with time stamps: which ones to keep, per edge the newest.

    Messages not newer than the stamp `held` of their edge (strictly, or as new) are dropped.
    Returns the distinct edges left, the row of each one's newest message (ties: the last to
    arrive) and the row of the message just before it for that edge (−1 if none).
    """
    ok = stamp > held if strict else stamp >= held
    rows = np.flatnonzero(ok)
    if len(rows) <= 1:
        return e[rows], rows, np.full(len(rows), -1)
    order = rows[np.lexsort((stamp[rows], e[rows]))]  # by edge, then stamp; stable
    es = e[order]
    last = np.ones(len(es), dtype=bool)
    last[:-1] = es[1:] != es[:-1]
    pos = np.flatnonzero(last)
    has = (pos > 0) & (es[pos - 1] == es[pos])
    return es[pos], order[pos], np.where(has, order[pos - 1], -1)


class BlockedTake:
    """values[index] for one fixed `index` (values of `n` entries), in two passes that stay in
    cache instead of one random read per index over values too large for any core's cache.

    The first pass reads the indices sorted by block of 2^`bits` values (stable, so each block's
    reads keep their order): one block is read at a time. The second puts each read back in
    place: it reads as many ascending streams as there are blocks. Both are plain copies, so
    the values are the same bits as `np.take(values, index)`.
    """

    def __init__(
        self, index: np.ndarray, n: int, bits: int | None = None, compiled: Any = None
    ) -> None:
        """For `index` into values of `n` entries; `compiled` (a `CompiledPass`) sorts by
        block in one counting pass instead of numpy's argsort (the same order)."""
        bits = BLOCK_BITS if bits is None else bits
        #: The indices sorted by block (stable), and where each read goes back to.
        self.sorted: np.ndarray
        self.back: np.ndarray
        if compiled is not None:
            self.sorted, self.back = compiled.block_order(index, bits, n)
        else:
            blocks = (index >> bits).astype(np.uint8 if n >> bits < 256 else np.int64)
            order = np.argsort(blocks, kind="stable")  # 8-bit keys: a radix sort
            self.sorted = index.take(order)
            self.back = np.empty(len(index), dtype=np.int64)
            self.back[order] = np.arange(len(index))
        self._read: np.ndarray | None = None  # the first pass's reads (made at the first take)

    def take(self, values: np.ndarray, out: np.ndarray) -> np.ndarray:
        """values[index] written into `out` (returned)."""
        np.take(values, self.sorted, out=self.reads(), mode="clip")
        return np.take(self._read, self.back, out=out, mode="clip")

    def reads(self, width: int = 1) -> np.ndarray:
        """The buffer of the first pass's reads: one per index (`width` values each)."""
        shape = (len(self.back), width) if width > 1 else (len(self.back),)
        if self._read is None or self._read.shape != shape:
            self._read = None  # freed before the new one is made
            self._read = np.empty(shape)
        return self._read


class EdgeSlots:
    """The slot e of each message from sender b to receiver a, by its key a·n + b."""

    def __init__(self, n: int, keys: np.ndarray) -> None:
        """`keys`: src·n + dst of every directed edge, sorted (CSR order)."""
        self._n = n
        self._keys = keys
        self._table: np.ndarray | RowIndex | None = None  # built at the first lookup

    @property
    def direct(self) -> bool:
        """Whether lookups use a direct table (up to `TABLE_KEYS` keys) or a hash index."""
        return self._n * self._n <= TABLE_KEYS

    def find(self, receiver: np.ndarray, sender: np.ndarray) -> np.ndarray:
        """The slots of messages from `sender` to `receiver` (edges of the graph)."""
        keys = receiver * self._n + sender
        if self._table is None:
            if self.direct:
                self._table = np.full(self._n * self._n, -1, dtype=np.int32)
                self._table[self._keys] = np.arange(len(self._keys), dtype=np.int32)
            else:
                self._table = RowIndex()  # rows in order of adding: the slots
                self._table.add(self._keys)
        if isinstance(self._table, RowIndex):
            return self._table.find(keys)
        return self._table[keys].astype(np.int64)


class EdgeStates:
    """Per directed edge e = (a, b), b's newest state (X̃_b, t_b, Y_b) as a holds it and, for
    ``values = "stale"``, the one before; t_b = 0: none yet.

    `n_all` / `n_prev_all` is the t_b every held state shares (synchronous agents: one slot's
    send reached every edge), None once they differ; it lets the test and the update take the
    one-slot shortcuts.
    """

    def __init__(self, n_edges: int) -> None:
        self.x, self.n, self.y = np.zeros(n_edges), np.zeros(n_edges), np.zeros(n_edges)
        self.x_prev, self.n_prev = np.zeros(n_edges), np.zeros(n_edges)
        self.n_all: float | None = 0.0
        self.n_prev_all: float | None = 0.0

    def newest_stamp(self) -> float:
        """The largest t_b of every state held (0 when none)."""
        if self.n_all is not None:
            return self.n_all
        return float(self.n.max())

    def take_columns(self, x: np.ndarray, n: np.ndarray, y: np.ndarray) -> None:
        """Every neighbour's state of one slot t_b = n[0], newer than all held: keep the
        columns (the held newest become the previous)."""
        self.x_prev, self.n_prev, self.n_prev_all = self.x, self.n, self.n_all
        self.x, self.n, self.y = x, n, y
        self.n_all = float(n[0])

    def store(
        self, e: np.ndarray, x: np.ndarray, n: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """File states (x, n, y) in the edge slots e, keeping per edge the newest two by t_b.

        Returns the edges that got a newer state (older ones than held are ignored) and the row
        of each one's newest. In place and O(len(e)): with spread latencies batches are small
        and many.
        """
        edges, rows, before = newest(e, n, self.n[e], strict=True)
        if len(edges) == 0:
            return edges, rows
        # the state this one replaces: an older one of this batch, or the newest held
        had = before >= 0
        self.x_prev[edges] = np.where(had, x[before], self.x[edges])
        self.n_prev[edges] = np.where(had, n[before], self.n[edges])
        self.x[edges], self.n[edges], self.y[edges] = x[rows], n[rows], y[rows]
        self.n_prev_all = self.n_all = None
        return edges, rows

    def read(
        self, e: np.ndarray | slice, fresh: bool
    ) -> tuple[np.ndarray, float | None, np.ndarray]:
        """(X̃_b, t_b shared by all or None, t_b) on edges e: the newest states (`fresh`) or
        the ones before."""
        if fresh:
            return self.x[e], self.n_all, self.n[e]
        return self.x_prev[e], self.n_prev_all, self.n_prev[e]


class Rows:
    """An agent's edges are a run of consecutive slots (CSR rows): counts and run starts."""

    def __init__(self, graph: Graph) -> None:
        self._n = graph.n
        self._rows = graph.degree > 0
        self._starts = graph.indptr[:-1][self._rows]
        self._cached: tuple[int | None, tuple[np.ndarray, np.ndarray]] | None = None
        d = graph.degree
        #: r when every agent has r ≥ 1 neighbours (r-regular: rows of r edges), else None.
        self.regular = int(d[0]) if graph.n and d[0] > 0 and np.all(d == d[0]) else None
        self._e = graph.n_directed
        self._scratch: np.ndarray | None = None  # `spread`'s buffer, one per-edge array
        self._src = graph.src  # each edge's agent (irregular graphs' `spread`)
        self._owners: tuple[int, np.ndarray] | None = None  # (C's version, `owners`)
        self._owner_turns = Turns(graph.n_directed, count=1)  # read within C's version
        self._compiled = CompiledPass.choose(graph.n_directed)  # `mix`'s pass, chosen once

    def spread(
        self, values: np.ndarray, counts: np.ndarray | None = None, version: int | None = None
    ) -> np.ndarray:
        """Each agent's value repeated over its run of edges (all its edges, or `counts[a]` of
        them): `np.repeat` in CSR order. When every run has r edges, or `counts` is |C| of C's
        `version` (its `owners` cached), the result is written into one buffer, reused (and
        overwritten) by the next call: a fresh array of every edge in every slot costs page
        faults that grow faster than the graph."""
        r = self.regular
        if r is not None and (counts is None or np.all(counts == r)):
            out = self._buffer(self._n * r)
            out.reshape(self._n, r)[:] = values[:, np.newaxis]
            return out
        if counts is None:  # (a rewired graph): each edge's agent, gathered into the buffer
            return self.gather(values, self._src)
        if version is None:
            return np.repeat(values, counts)
        return self.gather(values, self.owners(counts, version))

    def mix(
        self,
        y: np.ndarray,
        nb_y: np.ndarray,
        w: np.ndarray | float,
        counts: np.ndarray,
        version: int | None,
        at: np.ndarray | None = None,
        step: tuple[np.ndarray, np.ndarray, float, float, float] | None = None,
        table: PairTable | None = None,
    ) -> np.ndarray:
        """(W Y)_a over each agent's run of `counts[a]` mixed edges (`desim.models.ccolme.model.
        mix`; `version`: C's, when `counts` are its |C|, else None): Y_a spread in the buffer
        `spread` reuses, or one compiled pass with the same bytes (which needs no run starts).
        With `at`, Y_b of mixed edge i is nb_y[at[i]] (`desim.models.ccolme.live_first.
        LiveFirst.y_of`, lazy). With `step` = (X̃, t^start, t, c, p), the consensus step on
        it (`desim.models.ccolme.model.consensus_step`), in the compiled pass when it takes it
        (p = 1, c ≥ 1), which then writes the next send's `table` too."""
        fused = step is not None and step[4] == 1.0 and step[3] >= 1.0
        if self._compiled is not None:  # (agents mixing nobody: Y_a, as numpy's copy)
            fused_step = step[:4] if fused else None  # type: ignore[index]
            mixed = self._compiled.mix(y, nb_y, w, counts, at, fused_step, table)
            if fused:
                return mixed
        else:
            rows, first = self.starts(counts, version)
            if at is not None:
                nb_y = nb_y.take(at)
            terms = self.spread(y, counts, version) if len(first) else None
            mixed = mix(y, nb_y, w, counts, rows, first, terms)
        if step is None:
            return mixed
        return consensus_step(step[0], mixed, *step[1:], compiled=self._compiled)

    def gather(self, values: np.ndarray, agents: np.ndarray) -> np.ndarray:
        """values[agents] (one agent per edge) in the buffer `spread` reuses."""
        return np.take(values, agents, out=self._buffer(len(agents)), mode="clip")

    def owners(
        self,
        counts: np.ndarray,
        version: int,
        kept_idx: np.ndarray | None = None,
        reuse: bool = False,
    ) -> np.ndarray:
        """The agent of each edge of runs of `counts[a]` edges, `counts` being |C| of C's
        `version` (cached for it): a's kept edges are a's, in CSR order. With `reuse` (ideal
        links: each version's sends are read within its slot) they are src[kept_idx], C's
        edges, in buffers taken in turn."""
        if self._owners is None or self._owners[0] != version:
            if kept_idx is None or not reuse:
                agents = np.repeat(np.arange(self._n), counts)
            else:
                out = self._owner_turns.next(len(kept_idx))
                agents = np.take(self._src, kept_idx, out=out, mode="clip")
            self._owners = (version, agents)
        return self._owners[1]

    def _buffer(self, k: int) -> np.ndarray:
        """The first k slots of the one per-edge buffer."""
        if self._scratch is None:
            self._scratch = np.empty(self._e)
        return self._scratch[:k]

    def count(self, mask: np.ndarray) -> np.ndarray:
        """Number of True edges of each agent."""
        if len(self._starts) == self._n:  # nobody isolated: one call
            return np.add.reduceat(mask, self._starts, dtype=np.int64)
        out = np.zeros(self._n, dtype=np.int64)
        if len(self._starts):
            out[self._rows] = np.add.reduceat(mask, self._starts, dtype=np.int64)
        return out

    def starts(self, counts: np.ndarray, version: int | None) -> tuple[np.ndarray, np.ndarray]:
        """(counts > 0, where each such agent's run of `counts` consecutive edges starts);
        cached while `counts` is |C| of C's `version` (None: counts that are not |C|)."""
        if version is not None and self._cached is not None and self._cached[0] == version:
            return self._cached[1]  # |C| unchanged
        rows = counts > 0
        out = rows, np.cumsum(counts)[rows] - counts[rows]
        self._cached = (version, out)
        return out
