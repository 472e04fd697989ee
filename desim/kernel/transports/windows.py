"""Windows: a window-safe protocol's deliveries between two instants that matter, in batches.

With exact delivery times (or times on a grid, whose many ties windows keep in send order) and
a protocol that is `desim.kernel.protocol.WindowSafe`, one event fires at the earliest due
time d instead of an event per delivery time, and every message due before the next instant
that matters H is handed over as one batch sorted by delivery time (stable: send order among
equal times), each message carrying its exact ``delivered_at``. H is the engine's horizon (the
next slot tick, deadline set with `Context.call_at`, measurement or the run's end; only d
itself when such an instant is at d). Replies are sent at the exact times of the messages that
caused them (`send(..., at=...)`); those due before H come in a follow-up batch of the same
window, until none is left; then `WindowSafe.on_window_end`.

Availability, latency and receivability are asked once per window for all its messages when
the link model answers per slot (`LinkModel.per_slot`: a window never spans a slot boundary)
or takes one time per message (`LinkModel.per_message`), else once per distinct time; latency
draws come from the stream in the same order either way, so windows reproduce
one-message-per-instant delivery. A window may span several slots when the engine hands a
`desim.kernel.protocol.SlotBatched` protocol several at once: sends then carry their slot
times (`at`) and ids, which make delays fixed functions of the messages
(`LinkModel.latency`); an unnamed send is refused then (`require_names`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from desim.kernel.messages import DST, DUE, KIND, PAYLOAD, SENT, SRC, Batch, undeclared_kind
from desim.kernel.transports.base import PRIORITY_DELIVER, At, Transport

#: Queued blocks (one per send) merged when there are more than this many: all but the oldest,
#: which windows drain from its front (merging it again and again would re-sort the queue).
MERGE_AT = 4


class Windows(Transport):
    """Deliveries in windows up to the engine's `horizon()` (see the module).

    `window_end` is the protocol's `on_window_end`; `horizon()` the time of the next instant
    that matters other than deliveries (the engine's ticks, deadlines, measurements, end).
    """

    def __init__(
        self,
        *args,
        window_end: Callable[[], None],
        horizon: Callable[[], float],
        **kwargs,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._window_end = window_end
        self._horizon = horizon
        self._per_slot = self.links.per_slot
        self._per_message = self.links.per_message
        self._names_required = False
        #: Queued messages: row blocks (columns `DUE`, `SENT`, …, payload), each sorted by due
        #: time, in send order (one block per send, merged every few sends).
        self._blocks: list[np.ndarray] = []
        self._width = 0  # payload columns of the rows (the widest payload sent so far)
        self._flush_at: float | None = None  # time of the live flush event
        self._flush_token = 0  # flush events of older tokens are void
        self._flushing = False
        self._clean = 0  # leading queued blocks with nothing due in the window being flushed
        self._blocks_filed = 0  # blocks queued so far

    def require_names(self) -> None:
        """Refuse sends without ``ids`` from now on (slot batches: a delay must not depend on
        how sends are grouped, so every message needs a name)."""
        self._names_required = True

    def send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray | None = None,
        at: np.ndarray | None = None,
        ids: np.ndarray | None = None,
    ) -> None:
        """Draw the links' answers per window, drop what is lost, queue the rest as rows."""
        try:
            code = self.kinds.index(kind)
        except ValueError:  # a kind the protocol does not declare: say which are
            raise undeclared_kind(kind, self.kinds) from None
        if ids is None and self._names_required:
            raise ValueError(
                f"send({kind!r}, ...) without ids while the engine hands several slots at once "
                "(SlotBatched): name every message (ids=...), so that its delay does not "
                "depend on how sends are grouped"
            )
        src, dst, payload = self._columns(src, dst, payload)
        n = len(src)
        if n == 0:
            return
        self.sent[code] += n
        if ids is not None:
            ids = self._message_ids(code, ids)
        # one send time for all (a tick's sends) or each message's own (replies in a window)
        times: np.ndarray | float = (
            float(self.env.now) if at is None else np.asarray(at, dtype=float)
        )
        up = self._by_time(
            times, lambda t, s: self.links.available(self._rng_links, t, src[s], dst[s])
        )
        keep = self._kept(code, up, n)
        if keep is not None:
            src, dst = src[keep], dst[keep]
            if not isinstance(times, float):
                times = times[keep]
            payload = payload.take(keep, axis=0)  # (`take`: a 2-D mask or index is slower)
            if ids is not None:
                ids = ids[keep]
            n = len(src)
            if n == 0:
                return
        self._file_rows(code, src, dst, payload, times, ids)

    def _file_rows(
        self,
        code: int,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray,
        times: np.ndarray | float,
        ids: np.ndarray | None,
    ) -> None:
        """Queue messages whose links are up as one block of rows sorted by due time."""
        n, width = len(src), payload.shape[1]
        delay = self._by_time(
            times,
            lambda t, s: self._latency(t, src[s], dst[s], width, None if ids is None else ids[s]),
        )
        due = np.asarray(times + np.asarray(delay, dtype=float))  # (scalars broadcast)
        if due.ndim == 0:
            due = np.full(n, float(due))
        if self._ticks:
            due = self._on_grid(due)
        # one row per message: (due, sent at, src, dst, kind, payload…), NaN past its width
        self._width = max(self._width, width)
        rows = np.empty((n, PAYLOAD + self._width))
        rows[:, DUE], rows[:, SENT], rows[:, SRC], rows[:, DST] = due, times, src, dst
        rows[:, KIND] = code
        rows[:, PAYLOAD : PAYLOAD + width] = payload
        rows[:, PAYLOAD + width :] = np.nan
        if n > 1:  # sorted by due time (stable: send order among equal times)
            order = due.argsort(kind="stable")
            due, rows = due[order], rows.take(order, axis=0)
        self._blocks.append(rows)
        self._blocks_filed += 1
        if len(self._blocks) > MERGE_AT:  # the oldest block drains by itself: keep it apart
            self._blocks = [self._blocks[0], _merge(self._blocks[1:])]
            self._clean = min(self._clean, 1)
        if not self._flushing:
            self._schedule(float(due[0]))

    def _by_time(
        self,
        times: np.ndarray | float,
        ask: Callable[[float, slice], np.ndarray | bool | float],
    ) -> np.ndarray | bool | float:
        """`ask(t, part)` for the messages sent (or delivered) at `times` (ascending; a float:
        all at that time): once for all when they share one time, or one slot and the links
        answer per slot; else once per run of equal times, in order (so draws come in the
        order single instants make them)."""
        if isinstance(times, float):
            return ask(times, slice(None))
        first, last = float(times[0]), float(times[-1])
        if first == last or (self._per_slot and math.floor(first) == math.floor(last)):
            return ask(first, slice(None))
        if self._per_message:  # the links take one time per message
            return ask(times, slice(None))
        cuts = [0, *(np.flatnonzero(times[1:] != times[:-1]) + 1).tolist(), len(times)]
        parts = [
            np.broadcast_to(ask(float(times[a]), slice(a, b)), (b - a,))
            for a, b in zip(cuts[:-1], cuts[1:], strict=True)
        ]
        return np.concatenate(parts)

    def _schedule(self, when: float) -> None:
        """Make sure a flush event fires at `when` (or earlier)."""
        if self._flush_at is not None and self._flush_at <= when:
            return
        self._flush_at = when
        self._flush_token += 1
        event = At(self.env, when - self.env.now, PRIORITY_DELIVER)
        event.callbacks.append(lambda _e, token=self._flush_token: self._flush(token))

    def _flush(self, token: int) -> None:
        """Deliver the window that starts now, in batches, then end it."""
        if token != self._flush_token:
            return
        self._flush_at = None
        now = float(self.env.now)
        horizon = self._horizon()
        self._flushing = True
        self._clean = 0
        try:
            while (batch := self._take_due(now, horizon)) is not None:
                batch = self._receivable(
                    batch,
                    self._by_time(
                        batch.delivered_at,
                        lambda t, s, dst=batch.dst: self.links.receivable(t, dst[s]),
                    ),
                )
                if len(batch):
                    filed = self._blocks_filed
                    self._deliver(batch)
                    if self._horizon() < horizon:
                        raise RuntimeError(
                            "a window-safe protocol scheduled an event inside a "
                            "window (Context.call_at from on_deliver)"
                        )
                    if self._blocks_filed == filed:
                        break  # nothing was queued meanwhile: nothing else is due
            self._window_end()
        finally:
            self._flushing = False
        if self._blocks:
            self._schedule(min(float(rows[0, DUE]) for rows in self._blocks))

    def _take_due(self, now: float, horizon: float) -> Batch | None:
        """The queued messages due in [now, horizon) (at now only, if horizon is now), sorted
        by delivery time (stable: send order among equal times); the others stay queued."""
        # blocks before `_clean` were taken from in this window: nothing in them is due
        rest = self._blocks[: self._clean]
        taken = []
        for rows in self._blocks[self._clean :]:  # each block is sorted: what is due is a prefix
            due = rows[:, DUE]
            k = int(
                due.searchsorted(horizon, side="left")
                if horizon > now
                else due.searchsorted(now, side="right")
            )
            if k:
                taken.append(rows[:k])
            if k < len(rows):
                rest.append(rows[k:])
        self._blocks = rest
        self._clean = len(rest)
        if not taken:
            return None
        return Batch.from_rows(_merge(taken), self.kinds)


def _merge(blocks: list[np.ndarray]) -> np.ndarray:
    """One block sorted by due time from sorted row blocks in send order (stable: send order
    among equal times); narrower blocks (sent before a wider payload) are padded with NaN."""
    if len(blocks) == 1:
        return blocks[0]
    width = max(b.shape[1] for b in blocks)
    rows = np.concatenate(
        [
            b
            if b.shape[1] == width
            else np.pad(b, ((0, 0), (0, width - b.shape[1])), constant_values=np.nan)
            for b in blocks
        ]
    )
    return rows.take(rows[:, DUE].argsort(kind="stable"), axis=0)
