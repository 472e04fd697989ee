"""Batches of messages: the unit in which the network hands work to a protocol."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_EMPTY_PAYLOAD = np.empty((0, 0))

#: Columns of a batch held as one float matrix (`Batch.from_rows`): delivery time, send time,
#: source, destination, kind index, then the payload (exact: ids and kinds are far below 2⁵³).
DUE, SENT, SRC, DST, KIND, PAYLOAD = range(6)


class Batch:
    """Messages delivered at one instant, as a struct of arrays (one entry per message).

    ``kind`` holds indices into ``kinds`` (the protocol's message kinds). ``payload`` is a
    float array of shape (n, width); messages of a kind with a narrower payload are padded
    with NaN when batches of several kinds are joined. ``only`` is the kind index when every
    message has that kind, or -1. ``delivered_at`` is each message's exact delivery time when
    the batch is a window's (`desim.network`), else None (every message is delivered now).
    Treat a batch as read-only.
    """

    # (a plain class with slots: batches are made per send and per delivery, and a window's
    # batch reads its integer columns out of `rows` only when asked)
    __slots__ = (
        "_src",
        "_dst",
        "_kind",
        "payload",
        "sent_at",
        "kinds",
        "_only",
        "delivered_at",
        "rows",
    )

    def __init__(
        self,
        src: np.ndarray | None,
        dst: np.ndarray | None,
        kind: np.ndarray | None,
        payload: np.ndarray,
        sent_at: np.ndarray,
        kinds: tuple[str, ...],
        only: int | None = -1,
        delivered_at: np.ndarray | None = None,
        rows: np.ndarray | None = None,
    ) -> None:
        self._src, self._dst, self._kind = src, dst, kind
        self.payload = payload
        self.sent_at = sent_at
        self.kinds = kinds
        self._only = only  # None: not known yet (read from `kind`)
        self.delivered_at = delivered_at
        #: The matrix this batch's arrays are columns of (`from_rows`), or None.
        self.rows = rows

    @property
    def src(self) -> np.ndarray:
        """The sender of each message."""
        if self._src is None:
            self._src = self.rows[:, SRC].astype(np.int64)
        return self._src

    @property
    def dst(self) -> np.ndarray:
        """The receiver of each message."""
        if self._dst is None:
            self._dst = self.rows[:, DST].astype(np.int64)
        return self._dst

    @property
    def kind(self) -> np.ndarray:
        """The kind index of each message."""
        if self._kind is None:
            self._kind = self.rows[:, KIND].astype(np.int64)
        return self._kind

    @property
    def only(self) -> int:
        """The kind index of every message when they share one, else -1."""
        if self._only is None:
            kind = self.kind
            self._only = int(kind[0]) if len(kind) and (kind == kind[0]).all() else -1
        return self._only

    def __repr__(self) -> str:
        return f"Batch({len(self)} messages, kinds={self.kinds}, only={self.only})"

    @staticmethod
    def from_rows(rows: np.ndarray, kinds: tuple[str, ...]) -> Batch:
        """The batch whose messages are `rows` (columns DUE … PAYLOAD; delivered at DUE): one
        float matrix, so that selecting or joining messages is one operation, not one per
        array; the integer columns are read out when first asked for."""
        return Batch(
            None, None, None, rows[:, PAYLOAD:], rows[:, SENT], kinds, None, rows[:, DUE], rows
        )

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self._src)

    def of_kind(self, name: str) -> Batch:
        """The messages of kind `name`, in delivery order (possibly none)."""
        code = self.kinds.index(name)
        if self.only == code:
            return self
        if self.only >= 0:
            return self.select(slice(0, 0))
        return self.select(self.kind == code)

    def select(self, index: np.ndarray | slice) -> Batch:
        """The messages picked by a boolean mask, an index array or a slice."""
        if isinstance(index, slice):
            if self.rows is not None:
                return Batch.from_rows(self.rows[index], self.kinds)
            return Batch(
                self.src[index],
                self.dst[index],
                self.kind[index],
                self.payload[index],
                self.sent_at[index],
                self.kinds,
                self.only,
                None if self.delivered_at is None else self.delivered_at[index],
            )
        index = np.asarray(index)
        if index.dtype == bool:  # positions once, not a mask pass per array
            index = index.nonzero()[0]  # (1-D; the method, not `np.flatnonzero`'s wrapper)
        if self.rows is not None:
            return Batch.from_rows(self.rows.take(index, axis=0), self.kinds)
        return Batch(
            self.src.take(index),
            self.dst.take(index),
            self.kind.take(index),
            self.payload.take(index, axis=0),
            self.sent_at.take(index),
            self.kinds,
            self.only,
            None if self.delivered_at is None else self.delivered_at.take(index),
        )

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """The messages of `parts` one after the other (send order is kept)."""
        if len(parts) == 1:
            return parts[0]
        if all(p.rows is not None for p in parts) and len({p.rows.shape[1] for p in parts}) == 1:
            return Batch.from_rows(np.concatenate([p.rows for p in parts]), parts[0].kinds)
        only = parts[0].only if all(p.only == parts[0].only for p in parts) else -1
        widths = [p.payload.shape[1] for p in parts]
        width = max(widths)
        if min(widths) == width:
            payload = np.concatenate([p.payload for p in parts])
        else:  # one array for all payloads; narrower kinds leave NaN in the columns they lack
            sizes = [len(p) for p in parts]
            payload = np.full((sum(sizes), width), np.nan)
            start = 0
            for p, n, w in zip(parts, sizes, widths, strict=True):
                payload[start : start + n, :w] = p.payload
                start += n
        return Batch(
            np.concatenate([p.src for p in parts]),
            np.concatenate([p.dst for p in parts]),
            np.concatenate([p.kind for p in parts]),
            payload,
            np.concatenate([p.sent_at for p in parts]),
            parts[0].kinds,
            only,
            None
            if any(p.delivered_at is None for p in parts)
            else np.concatenate([p.delivered_at for p in parts]),
        )
