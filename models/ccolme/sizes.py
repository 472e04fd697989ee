"""|C_b| as each neighbour b told a, the size sends, and the weights W_ab of eq. (2) built on them.

After C^(t) is decided, every agent a tells each kept neighbour b its |C_a| (``size``); a mixes
with W_ab = 1/(1 + max(|C_a|, |C_b|)) (`desim.models.ccolme.model.edge_weight`) using the |C_b|
b told it. `Sizes` keeps those per directed edge e = (a, b) (CSR order), builds the sends, and
caches what stays the same while C does not move. Every cache is keyed by the version of C
(the protocol counts it up whenever a kept edge flips), never by an array's identity.

With ideal links (`in_order`) every send arrives whole, at once and in order: the latest send's
column is held as it came (`_heard`) and written per edge only when read, or for the edges C
drops; |C_b| and W_ab are kept per edge and updated where C moves. There, when every agent
tells its own |C_b| and the engine takes built sends (`Context.send_batch`), a send is a
`desim.kernel.messages.SenderBatch`: b's row (|C_b|, t) over C's edges, its senders, receivers
and payload made only if something reads them (the protocol reads the sizes of the edges C
drops only), so a slot in which C moves writes no per-edge send.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.kernel.messages import Batch, SenderBatch
from desim.kernel.protocol import Context
from desim.models.ccolme.compiled import CompiledPass, KeptWeights
from desim.models.ccolme.edges import Rows, Turns, newest
from desim.models.ccolme.model import edge_weight
from desim.topologies.graph import Graph

#: `Sizes.moved` recomputes |C_b| and W_ab on every edge, in place, once the agents whose |C_a|
#: changed hold this share of the edges: fewer passes than over their own edges and the
#: reverse ones, and no per-edge index arrays.
EVERY_EDGE_FROM = 0.25


class Sizes:
    """a's record of |C_b| per directed edge, the size sends, and eq. (2)'s W_ab."""

    def __init__(
        self,
        graph: Graph,
        size: np.ndarray,
        in_order: bool,
        metropolis: bool,
        told: np.ndarray | None = None,
    ) -> None:
        """Start from |C| = `size` (before any message: every b's own ``initial`` |C_b|);
        `told`: per agent, the factor on the |C_b| it tells (an inflating adversary's)."""
        self._g, self._in_order, self._metropolis = graph, in_order, metropolis
        #: The factor on each agent's told |C_b| (None: every agent tells its own).
        self.told = told
        self._nb_size = size[graph.dst].astype(float)  # |C_b| as b told a (`nb_size`)
        if told is not None:
            self._nb_size *= told[graph.dst]
        #: The send time of the |C_b| held, per edge (0: the prior; kept without ideal links).
        self.at = np.zeros(graph.n_directed)
        self._agents = np.arange(graph.n)
        #: 1/(1 + max degree): W_ab for ``weights = "max-degree"``.
        self.w_const = 1.0 / (1.0 + (graph.degree.max() if graph.n else 0))
        self._send: tuple[int, np.ndarray, np.ndarray] | None = None  # (C's version, src, dst)
        self._sent_version: int | None = None  # C's version of the latest send
        # (slots, the send's batch, C's version) of the latest send when it arrived whole
        self._heard: tuple[np.ndarray, Batch, int] | None = None
        self._heard_filed = True
        self._column: tuple[int, np.ndarray] | None = None  # (C's version, `_whole_column`)
        self._payload: np.ndarray | None = None
        # the latest `SenderBatch` size send and the |C| it tells (its table's first column)
        self._told: tuple[SenderBatch, np.ndarray] | None = None
        self._buffers: list[np.ndarray] = []
        self._w_cache: tuple[int, np.ndarray | float] | None = None  # (C's version, W_ab)
        if in_order:  # per edge: |C_b| (float) and eq. (2)'s W_ab, updated where C moves
            self._size_dst = size[graph.dst].astype(float)
            if told is not None:
                self._size_dst *= told[graph.dst]
            self._w_full = edge_weight(size[graph.src], self._size_dst)
            # per version of C, the size send's senders and W_ab: read within the version
            e = graph.n_directed
            self._turns = (Turns(e, count=1), Turns(e, float, count=1))
        # the size send and eq. (2)'s refresh in one pass each (ideal links), chosen once
        self._compiled = CompiledPass.choose(graph.n_directed) if in_order else None

    # -- sending -----------------------------------------------------------------------------
    def send(
        self,
        ctx: Context,
        kept_idx: np.ndarray,
        version: int,
        size: np.ndarray,
        t: float,
        rows: Rows,
    ) -> tuple[Any, Any, np.ndarray]:
        """Send this slot's sizes over the kept edges (`kept_idx`, CSR order, of C's `version`;
        `rows`: the protocol's `Rows`); returns (senders, receivers, slots) as sent, or
        (batch, batch, slots) for a `SenderBatch`."""
        if self._in_order and self.told is None and ctx.send_batch is not None:
            g = self._g

            # made when first read: `size` is never written in place (C's moves make a new
            # array), so the table then is the one of this send
            def table() -> np.ndarray:  # (|C_b|, t) per agent b, as the per-edge columns hold
                out = np.empty((g.n, 2))
                out[:, 0], out[:, 1] = size, t
                return out

            self._sent_version = version
            batch = SenderBatch(table, kept_idx, g.dst, g.src)
            self._told = (batch, size)
            ctx.send_batch("size", batch)
            return batch, batch, kept_idx
        owners = rows.owners(size, version, kept_idx, self._in_order)
        sender, receiver, payload = self.payload(kept_idx, version, size, t, owners)
        ctx.send("size", sender, receiver, payload)
        return sender, receiver, kept_idx

    def payload(
        self,
        kept_idx: np.ndarray,
        version: int,
        size: np.ndarray,
        t: float,
        receiver: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(senders, receivers, payload) of this slot's size send: b = dst[e] tells a = src[e]
        its |C_b| for every kept edge e (`kept_idx`, CSR order), with the slot t; `receiver`,
        if given, is src[kept_idx] (`Rows.owners`, shared rather than built twice)."""
        new = self._send is None or self._send[0] != version
        if new and receiver is None:  # src[kept_idx]: kept_idx is in CSR order
            receiver = np.repeat(self._agents, size)
        if new and self._compiled is not None:  # in order: senders and sizes in one pass
            sender = self._turns[0].next(len(kept_idx))
            payload = self._buffer(len(sender))
            self._compiled.size_send(kept_idx, self._g.dst, self._size_dst, t, sender, payload)
            self._send, self._payload = (version, sender, receiver), payload
            self._sent_version = version
            return sender, receiver, payload  # type: ignore[return-value]
        if new:
            if self._in_order:  # each send read within its slot: buffers in turn
                sender = self._g.dst.take(kept_idx, out=self._turns[0].next(len(kept_idx)))
            else:  # a send in flight keeps its own arrays
                sender = self._g.dst[kept_idx]
            self._send = (version, sender, receiver)
        _, sender, receiver = self._send
        payload = self._payload
        if payload is None or self._sent_version != version:
            payload = self._buffer(len(sender))
            if self._in_order:  # |C_b| per edge, kept up to date: a gather in CSR order
                np.take(self._size_dst, kept_idx, out=payload[:, 0], mode="clip")
            else:
                payload[:, 0] = size[sender]
                if self.told is not None:
                    payload[:, 0] *= self.told[sender]
        # in order (ideal links) and unchanged: the last payload, delivered at once and read
        # only for its sizes (not its send times), is taken again
        self._payload = payload if self._in_order else None
        payload[:, 1] = t
        self._sent_version = version
        return sender, receiver, payload

    def _buffer(self, k: int) -> np.ndarray:
        """A (k × 2) array for a size send, columns contiguous; in order, one of two buffers in
        turn (the other holds the sizes last heard, not yet filed)."""
        if not self._in_order:
            return np.empty((2, k)).T
        if not self._buffers:
            self._buffers = [np.empty((2, self._g.n_directed)) for _ in range(2)]
        self._buffers.reverse()
        return self._buffers[0][:, :k].T

    # -- receiving ---------------------------------------------------------------------------
    def heard_whole(self, slots: np.ndarray, batch: Batch) -> None:
        """The latest send (in order), whole: hold it (its |C_b| column read when needed)."""
        if not self._heard_filed and self._heard[2] != self._sent_version:  # type: ignore[index]
            self._file_heard()  # the new sizes do not cover the same slots
        self._heard, self._heard_filed = (slots, batch, self._sent_version), False  # type: ignore[assignment]

    def heard(self, e: np.ndarray, size: np.ndarray, at: np.ndarray) -> None:
        """Sizes of any send for the edge slots e, sent at `at`: keep per edge the newest."""
        self._file_heard()
        self._heard = None
        e, rows, _ = newest(e, at, self.at[e], strict=False)
        self._nb_size[e], self.at[e] = size[rows], at[rows]

    @property
    def nb_size(self) -> np.ndarray:
        """|C_b| as b told a, per directed edge (a's slot)."""
        self._file_heard()
        return self._nb_size

    def _file_heard(self) -> None:
        """Write the sizes of the latest whole send into `_nb_size` (if not done yet)."""
        if not self._heard_filed:
            self._nb_size[self._heard[0]] = self._heard_sizes(slice(None))  # type: ignore[index]
            self._heard_filed = True

    def _whole_column(self) -> np.ndarray:
        """|C_b| of every message of the latest whole send (made once per version of C when
        the send is a `SenderBatch`: a version's sends carry the same sizes)."""
        _, batch, version = self._heard  # type: ignore[misc]
        if not isinstance(batch, SenderBatch):
            return batch.payload[:, 0]
        if self._column is None or self._column[0] != version:
            self._column = None  # freed before the new one is made
            self._column = (version, batch.rows(slice(None))[:, 0])
        return self._column[1]

    def _heard_sizes(self, rows: np.ndarray | slice) -> np.ndarray:
        """|C_b| of the messages `rows` of the latest whole send (only those made, if lazy)."""
        batch = self._heard[1]  # type: ignore[index]
        if isinstance(batch, SenderBatch):
            return batch.rows(rows)[:, 0]
        return batch.payload[rows, 0]

    # -- C moved (in order) ------------------------------------------------------------------
    def _gone_sizes(self, heard: tuple[np.ndarray, Batch, int], gone: np.ndarray) -> np.ndarray:
        """|C_b| the latest whole send told on the edges `gone` (some of its edges): for this
        object's own `SenderBatch`, b's |C_b| as the send's table holds it (the table not
        made, the edges not looked up), else the messages' column there."""
        if self._told is not None and heard[1] is self._told[0]:
            return self._told[1].take(self._g.dst.take(gone)).astype(float)
        return self._heard_sizes(np.searchsorted(heard[0], gone))

    def moved(self, gone: np.ndarray, agents: np.ndarray, size: np.ndarray, version: int) -> None:
        """C of version `version` lost the edges `gone` and |C_a| = `size` changed for `agents`.

        Files the sizes last heard only for the edges `gone` (the send about to arrive at once
        overwrites every other slot they filled), then recomputes |C_b| and W_ab on the edges
        that touch `agents` (their own rows and the reverse edges): the floats eq. (2) gives.
        """
        heard = self._heard
        if not self._heard_filed and heard is not None and heard[2] == version:
            self._nb_size[gone] = self._gone_sizes(heard, gone)
            self._heard_filed = True
        g = self._g
        deg = g.degree[agents]
        if self.told is None and int(deg.sum()) >= EVERY_EDGE_FROM * g.n_directed:
            self._refresh(size)
            return
        if self.told is None and self._metropolis and self._compiled is not None:
            self._compiled.refresh_rows(agents, g, size, self._size_dst, self._w_full)
            return
        first = g.indptr[agents]
        own = np.repeat(first - (np.cumsum(deg) - deg), deg) + np.arange(int(deg.sum()))
        e = np.concatenate([own, g.reverse[own]])
        self._size_dst[e] = size[g.dst[e]]
        if self.told is not None:
            self._size_dst[e] *= self.told[g.dst[e]]
        if self._metropolis:
            self._w_full[e] = edge_weight(size[g.src[e]], self._size_dst[e])

    def _refresh(self, size: np.ndarray) -> None:
        """|C_b| and W_ab of eq. (2) on every edge, written into the arrays held (the floats
        `edge_weight` gives; no per-edge array made)."""
        g = self._g
        if self._compiled is not None and self._metropolis:
            self._compiled.refresh_weights(size, g.src, g.dst, self._size_dst, self._w_full)
            return
        as_float = size.astype(float)
        np.take(as_float, g.dst, out=self._size_dst, mode="clip")
        if self._metropolis:
            w = np.take(as_float, g.src, out=self._w_full, mode="clip")
            np.maximum(w, self._size_dst, out=w)
            w += 1.0
            np.divide(1.0, w, out=w)

    # -- what the update reads ---------------------------------------------------------------
    def whole(self, version: int) -> bool:
        """Whether the latest send arrived whole and covers the kept edges of C's `version`."""
        return self._heard is not None and self._heard[2] == version

    def of(self, idx: np.ndarray, every: bool, whole: bool) -> np.ndarray:
        """|C_b| as b told a on the edges idx (all edges if `every`; the kept ones if `whole`)."""
        if whole:  # the latest send arrived whole: its column
            return self._whole_column()
        return self.nb_size if every else self.nb_size[idx]

    def weights(
        self, idx: np.ndarray, counts: np.ndarray, size: np.ndarray, every: bool, whole: bool
    ) -> np.ndarray | float | KeptWeights:
        """W_ab of the mixed edges idx (CSR order, `counts` per agent) given |C_b| as each b
        told: eq. (2) with a's own |C_a| (`size`), or 1/(1 + max degree); on the compiled
        path, those kept per edge are read there (`KeptWeights`)."""
        if not self._metropolis:
            return self.w_const
        version = self._heard[2] if whole else None  # type: ignore[index]
        if whole and self._w_cache is not None and self._w_cache[0] == version:
            return self._w_cache[1]  # the same C and sizes as the last step: the same W
        if whole and self._in_order and self._compiled is not None:  # read where kept
            w = KeptWeights(self._w_full, idx)
        elif whole and self._in_order:  # they are this slot's |C_b|: W_ab is kept per edge
            w = self._w_full.take(idx, out=self._turns[1].next(len(idx)), mode="clip")
        else:
            w = edge_weight(np.repeat(size, counts), self.of(idx, every, whole))
        if whole:
            self._w_cache = (version, w)  # type: ignore[assignment]
        return w
