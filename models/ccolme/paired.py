"""The live-first path with the compiled passes: a send held as (X̃_b, Y_b) pairs.

`desim.models.ccolme.live_first.LiveFirst` gathers X̃_b and Y_b of every edge of S into two
arrays in S's (CSR) order; on a large graph that gather is two passes, the second putting each
value read by block of senders back in place, and the test, C's move and the mix then read those
arrays again. Here the send is held as its first pass left it: one row (X̃_b, Y_b) per edge of S,
by block of senders (`desim.models.ccolme.edges.BlockedTake`), or in S's order when the graph's
agents fit in cache. The pairs' X̃_b is the one the test reads: the newest send's (``values =
"fresh"``) or the one before (``"stale"``), gathered with this send's Y_b^(t−1).

One pass over S then tests every edge still alive against its pair (read through the block
order), files the drops, and writes their Y_b in CSR order, and C's edges if any died (else C is
as it was): what C's move and the mix read (`kept_moved`, `y_of`), with no pass of their own over
S and no gathered copy. The
operations are those of `LiveFirst` and the protocol's compiled passes on the same values, so the
results are the same bit for bit (tests compare them with the numpy path).

`live_first` chooses this class or `LiveFirst` once, at set-up: this one when the graph takes
the compiled passes (`desim.models.ccolme.compiled`). A run that leaves the live-first path
(a graph change) comes back to it as `LiveFirst` (`desim.models.ccolme.rewire.relive`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.kernel.messages import Batch
from desim.models.ccolme import live_first as _live
from desim.models.ccolme.compiled import CompiledPass, PairTable
from desim.models.ccolme.edges import BlockedTake
from desim.models.ccolme.live_first import LiveFirst
from desim.models.ccolme.model import NeighbourTest
from desim.topologies.graph import Graph


def live_first(graph: Graph, kept_idx: np.ndarray, fresh: bool) -> LiveFirst:
    """The live-first path of a run: `PairedLiveFirst` when the graph takes the compiled passes,
    else `LiveFirst`; `fresh`: whether the test reads the newest states (``values``)."""
    if CompiledPass.choose(graph.n_directed) is None:
        return LiveFirst(graph, kept_idx)
    return PairedLiveFirst(graph, kept_idx, fresh)


class PairedLiveFirst(LiveFirst):
    """A live-first run whose sends are held as (X̃_b, Y_b) pairs, read by the compiled passes."""

    # the test reads the pairs through the block order, one stream per block: fewer, larger
    # blocks than the two-pass gather's
    block_bits = 17

    def __init__(self, graph: Graph, kept_idx: np.ndarray, fresh: bool) -> None:
        """Start with S = the kept edges `kept_idx`; `fresh`: the test reads the newest X̃_b."""
        super().__init__(graph, kept_idx)
        assert self._compiled is not None
        self._pass: CompiledPass = self._compiled
        self._fresh = fresh
        # stale: the consensus step of each slot writes the next send's (X̃_b, Y_b) rows
        self.table = None if fresh else PairTable(graph.n)
        # X̃ per agent of the newest send and of the one before (None: none yet), and the
        # newest send's Y; never written in place (each slot makes new arrays)
        self._means: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
        self._y_sent: np.ndarray | None = None
        # the newest send's pairs and where S's edge i is in them (None: at i)
        self._pairs: tuple[np.ndarray, np.ndarray | None] | None = None
        self._own: np.ndarray | None = None  # the pairs' buffer when not gathered by block
        self._died = np.empty(0, dtype=np.int64)  # the test's buffer of edges that died
        # C's edges (CSR order) in one of two buffers, the other taking the next version's;
        # C's version they are of; this slot's Y_b on them (None: not written by the test)
        self._kept_buffers = [np.empty(len(kept_idx), dtype=np.int64) for _ in range(2)]
        self._kept = kept_idx
        self._c_version = 0
        self._y_buffer = np.empty(0)
        self._y_kept: np.ndarray | None = None
        self._y_for: int | None = None  # C's version `_y_kept` is on

    # -- sending and receiving ---------------------------------------------------------------
    def _gather(
        self, mean: np.ndarray, y: np.ndarray, sender: np.ndarray, blocked: BlockedTake | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """This send's pairs (X̃_b the test reads, Y_b) over S, by block of senders when
        `blocked`; returns (pairs, where S's edge i is in them or None)."""
        x = mean if self._fresh else self._means[0]
        if x is None:  # stale, first send: nothing is tested against it
            x = np.zeros(len(mean))
        self._means, self._y_sent = (mean, self._means[0]), y
        k = len(sender)
        if blocked is not None:
            pairs = blocked.reads(2)
            self._pass.gather_pairs(x, y, blocked.sorted, pairs, self.table)
            return pairs, blocked.back
        if self._own is None:
            self._own = np.empty((self._e, 2))
        self._pass.gather_pairs(x, y, sender, self._own[:k], self.table)
        return self._own[:k], None

    def receive(self, batch: Batch, t: float) -> np.ndarray:
        """This slot's send, whole: hold its pairs (the values sent, which ideal links deliver
        unchanged); returns S (the edges to test)."""
        assert self._sent is not None
        self._pairs = self._sent[1], self._sent[2]
        self.n_prev_all, self.n_all = self.n_all, float(t)
        return self.s

    # -- the test, C's move and the mix ------------------------------------------------------
    def test(self, rule: Any, test: NeighbourTest, mean: np.ndarray, t: float) -> np.ndarray:
        """S's edges tested against X̃_b of the pairs in one pass, when one bound serves every
        edge (as `NeighbourTest.keep_in_chunks` takes it): it files the drops and writes Y_b
        on C's edges for the mix (`y_of`), and C's edges if any died (`kept_moved`). Else by
        `rule` on the values gathered (`read`)."""
        self._y_kept = None
        n_b = self.n_all if self._fresh else self.n_prev_all
        if test.rule == "oracle" or not test.compiled or len(self.s) <= _live.CHUNK or n_b == 0.0:
            return super().test(rule, test, mean, t)
        assert self._pairs is not None
        k = len(self.s)
        if len(self._died) < k:
            self._died, self._y_buffer = np.empty(k, dtype=np.int64), np.empty(k)
        # C's edges go into the buffer that does not hold C's current ones (which stay intact
        # if none died)
        kept = self._kept_buffers[1][:k]
        out = (self._died, self._y_buffer, kept)
        assert self._order is not None  # the send's (S first): its receivers
        receiver, s = self._order[2][:k], self._every()
        died, c = self._pass.test_pairs(
            mean, receiver, self._pairs, self.alive, s, test.bound(t, n_b), out
        )
        self.died = self._died[:died].copy()
        self._dead += died
        if died:
            self._kept_buffers.reverse()
        self._kept = kept[:c] if died else self._kept
        self._y_kept = self._y_buffer[:c]
        self._y_for = None if died else self._c_version  # (`kept_moved` names the new one)
        return self.died

    def kept_moved(self, kept_version: int) -> np.ndarray:
        """C's edges (S's alive ones, CSR order), as this slot's test wrote them (or in a
        pass of their own); their positions in S are not kept (`y_of` has C's Y_b)."""
        self._c_version = self._y_for = kept_version
        if self._y_kept is None:  # the test took `LiveFirst`'s path: C's own pass
            self._kept = super().kept_moved(kept_version)
        return self._kept

    def _every(self) -> np.ndarray | None:
        """S, or None when S is every edge (edge i of S is the graph's edge i)."""
        return None if len(self.s) == self._e else self.s

    # -- the values held, gathered when read elsewhere ---------------------------------------
    def _over_s(self, values: np.ndarray | None) -> np.ndarray:
        """values[b] over S's edges (b their senders); 0 where nothing was sent yet."""
        if values is None:
            return np.zeros(len(self.s))
        return values.take(self._dst[self.s])

    def read(self, e: np.ndarray, fresh: bool) -> tuple[np.ndarray, float, float]:
        """(X̃_b, t_b, t_b) on S (`e`) of the newest send (`fresh`) or the one before."""
        n_all = self.n_all if fresh else self.n_prev_all
        return self._over_s(self._means[0 if fresh else 1]), n_all, n_all

    def y_of(
        self, idx: np.ndarray, kept_version: int | None, lazy: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Y_b of the newest send on the edges idx (see `LiveFirst.y_of`), gathered."""
        if self._y_kept is not None and kept_version == self._y_for:
            return self._y_kept, None  # written by this slot's test, in C's order
        y = self._over_s(self._y_sent)
        if self._s_is_kept == kept_version is not None:
            return y, None  # S is C
        key = None if kept_version is None else ("C", kept_version)
        return y.take(self._pos(key, self.version, idx, self.s)), None

    def view(self, name: str) -> np.ndarray:
        """The per-edge array `name` of `EdgeStates` (see `LiveFirst.view`)."""
        if name in ("n", "n_prev"):
            return super().view(name)
        values = {"x": self._means[0], "x_prev": self._means[1], "y": self._y_sent}[name]
        out = np.full(self._e, np.nan)
        out[self.s] = self._over_s(values)
        return out
