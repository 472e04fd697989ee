"""The live-first delivery path of C-ColME: ideal links and irrevocable decisions.

An edge a dropped never returns to C_a, so nothing reads b's states on it again. Every edge
still gets its state message in every slot (message counts are results), but those of the edges
still tested come first and carry values; the others carry NaN. The test runs on the edges still
tested only, and Y_b is gathered from the send by a cached index: the operations of the per-edge
path (`desim.models.ccolme.edges.EdgeStates`) on the same values, over fewer edges, so the
results are the same bit for bit (tests check it).

The send is a `desim.kernel.messages.SenderBatch` (b's row (X̃_b, t, Y_b), NaN rows past S),
its columns made only if something reads them; the receivers read X̃_b and Y_b over S from
the two buffers the send's gather wrote, so no per-edge payload or slot column is written.

S, the edges whose states carry values (CSR order, a superset of χ), is χ as of its last
compaction: it holds the edges dropped since then until they are an eighth of it (their values
are sent and not read), so that S, its message order and the index arrays built from it change
a few times per run, not in every slot with a drop. Caches are keyed by version numbers: S's
(`version`, counted up at each compaction) and the kept set C's (counted by the protocol).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.kernel.messages import Batch, SenderBatch
from desim.kernel.protocol import Context
from desim.models.ccolme.compiled import CompiledPass, PairTable
from desim.models.ccolme.edges import BlockedTake, EdgeStates, Turns, flatnonzero_into
from desim.models.ccolme.model import NeighbourTest
from desim.topologies.graph import Graph

#: State buffers taken in turn (ideal links: a holds t − 1's and t − 2's states).
BUFFERS = 3
#: From this many agents on, X̃_b and Y_b are gathered by block of senders (`LiveFirst.send`,
#: `desim.models.ccolme.edges.BlockedTake`): their arrays no longer fit in a core's cache.
BLOCKED_FROM = 1 << 17
#: Edges the neighbour test takes at a time (`NeighbourTest.keep_in_chunks`): a cache's worth.
CHUNK = 1 << 16


class LiveFirst:
    """The states of a live-first run: a's view of b's states over S, one send per slot."""

    #: Senders per block of the send's gather, as a power of 2 (None: `BlockedTake`'s own).
    block_bits: int | None = None
    #: The next send's rows, if the consensus step writes them (`desim.models.ccolme.paired`).
    table: PairTable | None = None

    def __init__(self, graph: Graph, kept_idx: np.ndarray) -> None:
        """Start with S = the kept edges `kept_idx` (every edge: irrevocable needs all)."""
        self._src, self._dst, self._e = graph.src, graph.dst, graph.n_directed
        #: S: the edges whose states carry values (CSR order, a superset of χ's edges).
        self.s = kept_idx
        #: S's version, counted up at each compaction (the key of every cache built on S).
        self.version = 0
        self._s_is_kept: int | None = 0  # the version of C that S equals (None: no C)
        #: χ over S: the edges of S not dropped yet.
        self.alive = np.ones(len(kept_idx), dtype=bool)
        self._dead = 0  # edges of S dropped for good since S was last compacted
        #: The edges dropped for good in this slot's test (the protocol takes them).
        self.died = kept_idx[:0]
        self._order: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        # X̃_b and Y_b over S of the sends, in `BUFFERS` buffers each taken in turn, and the
        # latest send with its two
        self._values = Turns(self._e, float, BUFFERS), Turns(self._e, float, BUFFERS)
        self._sent: tuple[SenderBatch, np.ndarray, np.ndarray] | None = None
        # the newest and the previous send as a holds them: (S's version, S, X̃_b, Y_b)
        zero = np.zeros(self._e)
        self._held: tuple[int, np.ndarray, np.ndarray, np.ndarray] = (0, self.s, zero, zero)
        self._held_prev: tuple[int, np.ndarray, np.ndarray] = (0, self.s, zero)
        #: t_b of the newest send (0: none yet), and of the one before.
        self.n_all: float = 0.0
        self.n_prev_all: float = 0.0
        # positions of an edge set (key) within a version of S, for the two latest pairs
        self._within: list[tuple[Any, int, np.ndarray]] = []
        #: S's senders' gather by block (`BlockedTake`; large graphs) and S's version it is for.
        self.blocked: tuple[int, BlockedTake] | None = None
        self._y_of: np.ndarray | None = None  # `y_of`'s buffer
        # per version of C (`kept_moved`): its positions in S, read by `y_of` within the
        # version; its edges, also the slots of the size send last heard (filed, at the
        # latest, when the next version's send arrives)
        self._c_pos, self._c_edges = Turns(len(kept_idx), count=1), Turns(len(kept_idx))
        self._compiled = CompiledPass.choose(self._e)  # the send's gather, chosen once

    # -- sending -----------------------------------------------------------------------------
    def compact(self, kept_idx: np.ndarray, kept_version: int, symmetric: bool) -> None:
        """Shrink S to χ's edges once those dropped since the last compaction are an eighth
        of it (without ``symmetric`` χ's edges are the kept ones, `kept_idx`)."""
        if self._dead * 8 <= len(self.s):
            return
        # kept_idx is in one of `_c_edges`' buffers, which C's next versions overwrite
        keep = self.s[self.alive] if symmetric else kept_idx.copy()
        self._seed(("S", self.version + 1), self.version, np.flatnonzero(self.alive))
        self.s, self.alive, self._dead = keep, np.ones(len(keep), bool), 0
        self.version += 1
        self._s_is_kept = None if symmetric else kept_version

    def send(
        self, ctx: Context, mean: np.ndarray, y: np.ndarray, t: float
    ) -> tuple[SenderBatch, SenderBatch, np.ndarray]:
        """Send this slot's states, live first: a `SenderBatch` of b's row (X̃_b, t, Y_b) over
        S's edges, then NaN rows over the others. X̃_b and Y_b over S are gathered into two
        buffers of this object's, which the receivers read (`receive`); the rows are made only
        if something else reads them. Returns (batch, batch, the receivers' slots)."""
        s = self.s
        if self._order is None or self._order[0] != self.version:
            rest = np.ones(self._e, dtype=bool)
            rest[s] = False
            order = np.concatenate([s, np.flatnonzero(rest)])
            self._order = (self.version, self._dst[order], self._src[order], order)
        _, sender, _, slots = self._order
        k = len(s)
        blocked = None
        if len(mean) >= BLOCKED_FROM:
            if self.blocked is None or self.blocked[0] != self.version:
                self.blocked = None  # its arrays freed before the new ones are made
                self.blocked = (
                    self.version,
                    BlockedTake(sender[:k], len(mean), self.block_bits, self._compiled),
                )
            blocked = self.blocked[1]
        held = self._gather(mean, y, sender[:k], blocked)

        # made when first read: `mean` and `y` are never written in place (each slot makes
        # new ones), so the table then is the one of this send
        def table() -> np.ndarray:  # (X̃_b, t, Y_b) per agent b
            out = np.empty((len(mean), 3))
            out[:, 0], out[:, 1], out[:, 2] = mean, t, y
            return out

        batch = SenderBatch(table, slots, self._dst, self._src, carried=k)
        self._sent = (batch, *held)
        if ctx.send_batch is None:  # an engine that takes columns only
            ctx.send("state", batch.src, batch.dst, batch.payload)
        else:
            ctx.send_batch("state", batch)
        return batch, batch, slots

    def _gather(
        self, mean: np.ndarray, y: np.ndarray, sender: np.ndarray, blocked: BlockedTake | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """X̃_b and Y_b over S (b = sender[i]), in the next of the state buffers: what a holds
        of this send (`receive`)."""
        # ideal links: a holds t − 1's and t − 2's states, so t − 3's buffers are free
        k = len(sender)
        x_b, y_b = self._values[0].next(k), self._values[1].next(k)
        if self._compiled is not None:
            self._compiled.gather_states(mean, y, sender, x_b, y_b, blocked)
        elif blocked is not None:
            blocked.take(mean, x_b)
            blocked.take(y, y_b)
        else:
            np.take(mean, sender, out=x_b, mode="clip")
            np.take(y, sender, out=y_b, mode="clip")
        return x_b, y_b

    # -- receiving ---------------------------------------------------------------------------
    def receive(self, batch: Batch, t: float) -> np.ndarray:
        """This slot's send, whole: hold X̃_b and Y_b over S (from the buffers `send` filled,
        or from the columns of a batch made of them); returns S (the edges to test)."""
        k = len(self.s)
        if self._sent is not None and batch is self._sent[0]:
            x, y = self._sent[1], self._sent[2]
        else:
            x, y = batch.payload[:k, 0], batch.payload[:k, 2]
        self._held_prev = self._held[:3]
        self._held = (self.version, self.s, x, y)
        self.n_prev_all, self.n_all = self.n_all, float(t)
        return self.s

    def test(self, rule: Any, test: NeighbourTest, mean: np.ndarray, t: float) -> np.ndarray:
        """Test S's edges by `rule` (the protocol's χ_a(b) of given edges) and file the result
        (`tested`); returns the edges that died. (`test` and `mean`: what a compiled strategy
        reads instead, `desim.models.ccolme.paired`.)"""
        return self.tested(rule(self.s))

    def tested(self, keep: np.ndarray) -> np.ndarray:
        """File the test's χ over S (irrevocable: a drop stays); returns the edges that died."""
        keep &= self.alive
        if np.count_nonzero(keep) == len(self.s) - self._dead:  # as many alive as before
            return self.s[:0]
        died = np.not_equal(self.alive, keep)  # alive & ~keep, keep being within alive
        self.died = self.s[died]
        self.alive = keep
        self._dead += len(self.died)
        return self.died

    def kept_moved(self, kept_version: int) -> np.ndarray:
        """C lost this slot's drops (no ``symmetric``): it is χ = S's alive edges, returned
        (CSR order) and their positions in S kept for `y_of`; both in buffers taken in turn."""
        if self._compiled is not None:
            k = len(self.alive)
            pos, edges = self._compiled.alive_edges(
                self.alive, self.s, self._c_pos.next(k), self._c_edges.next(k)
            )
            self._seed(("C", kept_version), self.version, pos)
            return edges
        pos = flatnonzero_into(self.alive, self._c_pos.next(len(self.alive)))
        self._seed(("C", kept_version), self.version, pos)
        return np.take(self.s, pos, out=self._c_edges.next(len(pos)), mode="clip")

    # -- what the test and the update read ---------------------------------------------------
    def ends(self, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) of the edges of S: the send's receivers and senders (no gather)."""
        assert self._order is not None
        return self._order[2][: len(e)], self._order[1][: len(e)]

    def read(self, e: np.ndarray, fresh: bool) -> tuple[np.ndarray, float, float]:
        """(X̃_b, t_b, t_b) on S (`e`) of the newest send (`fresh`) or the one before."""
        if fresh:
            version, s, x, _ = self._held
            n_all = self.n_all
        else:
            version, s, x = self._held_prev
            n_all = self.n_prev_all
        if version != self.version:  # held over an older S
            x = x.take(self._pos(("S", self.version), version, e, s))
        return x, n_all, n_all

    def y_of(
        self, idx: np.ndarray, kept_version: int | None, lazy: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Y_b of the newest send on the edges idx (the kept edges of C's version
        `kept_version`, or another subset of S: None), and None; or, when `lazy` and the
        compiled mix reads it (`desim.models.ccolme.compiled`), the send's Y column over S and
        the positions of idx in it: the mix then reads Y_b there, with no gathered copy."""
        version, s, _, y = self._held
        if version == self.version and self._s_is_kept == kept_version is not None:
            return y, None  # S is C: no gather
        key = None if kept_version is None else ("C", kept_version)
        pos = self._pos(key, version, idx, s)
        if lazy and self._compiled is not None:
            return y, pos
        # read within the slot only: one buffer, not a fresh array per slot
        if self._y_of is None:
            self._y_of = np.empty(self._e)
        return np.take(y, pos, out=self._y_of[: len(pos)], mode="clip"), None

    def _pos(self, key: Any, version: int, idx: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The positions in S (of `version`) of the edges idx, cached by key for the two latest
        pairs, which the next slots ask for again."""
        if key is not None:
            for cached in self._within:
                if cached[0] == key and cached[1] == version:
                    return cached[2]
        pos = np.searchsorted(s, idx)
        if key is not None:
            self._seed(key, version, pos)
        return pos

    def _seed(self, key: Any, version: int, pos: np.ndarray) -> None:
        """Remember the positions pos of the edge set `key` within S of `version`."""
        self._within = [(key, version, pos), *self._within[:1]]

    # -- per edge (for inspection, and to leave this path) -----------------------------------
    def view(self, name: str) -> np.ndarray:
        """The per-edge array `name` of `EdgeStates` (x, n, y, x_prev, n_prev); NaN where a
        message carried no value (edges dropped for good)."""
        if name in ("n", "n_prev"):
            return np.full(self._e, self.n_all if name == "n" else self.n_prev_all)
        _, s, x, y = self._held
        if name == "x_prev":
            _, s, x = self._held_prev
        out = np.full(self._e, np.nan)
        out[s] = y if name == "y" else x
        return out

    def to_edge_states(self) -> EdgeStates:
        """The same states per edge, to go on on the per-edge path."""
        states = EdgeStates(self._e)
        for name in ("x", "n", "y", "x_prev", "n_prev"):
            setattr(states, name, self.view(name))
        states.n_all, states.n_prev_all = self.n_all, self.n_prev_all
        return states
