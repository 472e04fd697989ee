"""Batches of messages: the unit in which the network hands work to a protocol.

A `Batch` holds its messages as a struct of arrays. A window's messages (`RowBatch`) arrive as
one float matrix instead, one row per message: selecting or joining them is then one operation,
not one per array, and the integer columns are read out of the matrix only when a protocol
asks for them. A send whose every message carries its sender's row of one table
(`SenderBatch`: "b tells each neighbour its |C_b|") is held as the table and the edges it goes
over; its columns are made only when read. All have the same attributes and methods; a protocol
need not know which it got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

#: Columns of a `RowBatch`'s matrix: delivery time, send time, source, destination, kind index,
#: then the payload (exact: ids and kinds are far below 2⁵³).
DUE, SENT, SRC, DST, KIND, PAYLOAD = range(6)

#: The integer columns a `RowBatch` reads out of its matrix when first asked.
_INT_COLUMNS = {"src": SRC, "dst": DST, "kind": KIND}


def undeclared_kind(kind: object, kinds: tuple[str, ...]) -> ValueError:
    """The error for a message kind the protocol does not declare in its `message_kinds`."""
    return ValueError(
        f"message kind {kind!r} is not declared by the protocol; its message_kinds are "
        f"{', '.join(map(repr, kinds)) or 'none'} (declare every kind it sends)"
    )


class Batch:
    """Messages delivered at one instant, as a struct of arrays (one entry per message).

    ``kind`` holds indices into ``kinds`` (the protocol's message kinds). ``payload`` is a
    float array of shape (n, width); messages of a kind with a narrower payload are padded
    with NaN when batches of several kinds are joined. ``single_kind`` is the kind index shared
    by every message when known, else None (mixed kinds, or not known). ``delivered_at`` is
    each message's exact delivery time when the batch is a window's (`desim.network`), else
    None (every message is delivered now). Treat a batch as read-only.
    """

    # (a plain class with slots: batches are made per send and per delivery)
    __slots__ = ("src", "dst", "kind", "payload", "sent_at", "kinds", "single_kind", "delivered_at")

    src: np.ndarray
    dst: np.ndarray
    kind: np.ndarray
    single_kind: int | None

    def __init__(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        kind: np.ndarray,
        payload: np.ndarray,
        sent_at: np.ndarray,
        kinds: tuple[str, ...],
        single_kind: int | None = None,
        delivered_at: np.ndarray | None = None,
    ) -> None:
        self.src, self.dst, self.kind = src, dst, kind
        self.payload = payload
        self.sent_at = sent_at
        self.kinds = kinds
        self.single_kind = single_kind
        self.delivered_at = delivered_at

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self)} messages, kinds={self.kinds})"

    def __len__(self) -> int:
        return len(self.sent_at)

    @staticmethod
    def from_rows(rows: np.ndarray, kinds: tuple[str, ...]) -> RowBatch:
        """The batch whose messages are `rows` (columns DUE … PAYLOAD; delivered at DUE)."""
        return RowBatch(rows, kinds)

    def of_kind(self, name: str) -> Batch:
        """The messages of kind `name`, in delivery order (possibly none)."""
        try:
            code = self.kinds.index(name)
        except ValueError:
            raise undeclared_kind(name, self.kinds) from None
        if self.single_kind == code:
            return self
        if self.single_kind is not None:
            return self.select(slice(0, 0))
        return self.select(self.kind == code)

    def select(self, index: np.ndarray | slice) -> Batch:
        """The messages picked by a boolean mask, an index array or a slice."""
        if isinstance(index, slice):
            return Batch(
                self.src[index],
                self.dst[index],
                self.kind[index],
                self.payload[index],
                self.sent_at[index],
                self.kinds,
                self.single_kind,
                None if self.delivered_at is None else self.delivered_at[index],
            )
        index = _positions(index)
        return Batch(
            self.src.take(index),
            self.dst.take(index),
            self.kind.take(index),
            self.payload.take(index, axis=0),
            self.sent_at.take(index),
            self.kinds,
            self.single_kind,
            None if self.delivered_at is None else self.delivered_at.take(index),
        )

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """The messages of `parts` one after the other (send order is kept)."""
        if len(parts) == 1:
            return parts[0]
        joined = RowBatch.join(parts)
        if joined is not None:
            return joined
        first = parts[0].single_kind
        return Batch(
            np.concatenate([p.src for p in parts]),
            np.concatenate([p.dst for p in parts]),
            np.concatenate([p.kind for p in parts]),
            _payloads(parts),
            np.concatenate([p.sent_at for p in parts]),
            parts[0].kinds,
            first if all(p.single_kind == first for p in parts) else None,
            None
            if any(p.delivered_at is None for p in parts)
            else np.concatenate([p.delivered_at for p in parts]),
        )


class RowBatch(Batch):
    """A window's messages as one float matrix `rows` (columns DUE … PAYLOAD, delivered at DUE).

    `payload`, `sent_at` and `delivered_at` are views of its columns; `src`, `dst`, `kind` and
    `single_kind` are read out of it when first asked, then held as a `Batch` holds them.
    Selecting or joining row batches of one width selects or joins their matrices.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: np.ndarray, kinds: tuple[str, ...]) -> None:
        self.rows = rows
        self.payload = rows[:, PAYLOAD:]
        self.sent_at = rows[:, SENT]
        self.delivered_at = rows[:, DUE]
        self.kinds = kinds

    def __getattr__(self, name: str) -> np.ndarray | int | None:
        # called only for a slot not filled yet: a protocol that never reads a column (or asks
        # the kind of a batch it hands on whole) pays no copy, and later reads are plain
        # attribute reads
        column = _INT_COLUMNS.get(name)
        if column is not None:
            value = self.rows[:, column].astype(np.int64)
        elif name == "single_kind":
            kind = self.kind
            value = int(kind[0]) if len(kind) and (kind == kind[0]).all() else None
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def select(self, index: np.ndarray | slice) -> RowBatch:
        """The messages picked by a boolean mask, an index array or a slice."""
        if isinstance(index, slice):
            return RowBatch(self.rows[index], self.kinds)
        return RowBatch(self.rows.take(_positions(index), axis=0), self.kinds)

    @staticmethod
    def join(parts: Sequence[Batch]) -> RowBatch | None:
        """The row batches `parts` one after the other as one, or None unless every part is a
        row batch and all have one width."""
        if not all(isinstance(p, RowBatch) for p in parts):
            return None
        if len({p.rows.shape[1] for p in parts}) != 1:
            return None
        return RowBatch(np.concatenate([p.rows for p in parts]), parts[0].kinds)


class SenderBatch(Batch):
    """One send in which every message carries its sender's row of a table (one row per
    agent): message i goes over edge e = edges[i], from src = senders[e] to dst = receivers[e],
    and carries table[src], as the columns a `Batch` would hold.

    With `carried` = k, only the first k messages carry their sender's row, the others a row
    of NaN (sent for their count, their values not meant to be read).

    The table is made by `make_table` when first needed; `kinds`, `kind` and `sent_at` are
    given by the transport (`kind` and `sent_at` shared arrays); `src`, `dst` and `payload` are
    made when first read, then held as a `Batch` holds them. `len()` makes none of them. A
    protocol that recognises its own send reads only what it needs (`rows`); every other reader
    (selection, joining, a transport that draws per message) gets the columns.
    """

    __slots__ = ("make_table", "edges", "senders", "receivers", "carried", "_table")

    def __init__(
        self,
        make_table: Callable[[], np.ndarray],
        edges: np.ndarray,
        senders: np.ndarray,
        receivers: np.ndarray,
        carried: int | None = None,
    ) -> None:
        self.make_table, self.edges = make_table, edges
        self.senders, self.receivers = senders, receivers
        #: How many of the first messages carry their sender's row (None: all of them).
        self.carried = carried
        self.delivered_at = None
        self._table: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.edges)

    def __getattr__(self, name: str) -> np.ndarray:
        # called only for a slot not filled yet (see `RowBatch.__getattr__`)
        if name == "src":
            value = self.senders.take(self.edges)
        elif name == "dst":
            value = self.receivers.take(self.edges)
        elif name == "payload":
            value = self.rows(slice(None))
        else:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        setattr(self, name, value)
        return value

    def rows(self, index: np.ndarray | slice) -> np.ndarray:
        """The payload rows of the messages `index` (a new array: table[src] there, NaN past
        `carried`)."""
        if self._table is None:
            self._table = self.make_table()
        out = self._table.take(self.senders.take(self.edges[index]), axis=0)
        if self.carried is not None and self.carried < len(self.edges):
            out[np.arange(len(self.edges))[index] >= self.carried] = np.nan
        return out


def _positions(index: np.ndarray) -> np.ndarray:
    """The positions an index array or boolean mask picks: once, not a mask pass per array."""
    index = np.asarray(index)
    if index.dtype == bool:
        index = index.nonzero()[0]  # (1-D; the method, not `np.flatnonzero`'s wrapper)
    return index


def _payloads(parts: Sequence[Batch]) -> np.ndarray:
    """The payloads of `parts` stacked in one array; narrower kinds leave NaN in the columns
    they lack."""
    widths = [p.payload.shape[1] for p in parts]
    width = max(widths)
    if min(widths) == width:
        return np.concatenate([p.payload for p in parts])
    sizes = [len(p) for p in parts]
    payload = np.full((sum(sizes), width), np.nan)
    start = 0
    for p, n, w in zip(parts, sizes, widths, strict=True):
        payload[start : start + n, :w] = p.payload
        start += n
    return payload
