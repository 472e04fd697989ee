"""The network: carries messages between agents over a link model, in batches.

Each send call draws availability and latency for its messages, drops those on links that are
down, and files the rest under their delivery time. One SimPy event is scheduled per distinct
delivery time (unless windows are on, below); when it fires, the messages whose destination
cannot receive then (`LinkModel.receivable`: a churned agent) are dropped and everything else
filed under that time is handed to the protocol as one `Batch`, in send order. Messages due at
the very instant being handed over (a tick's or a delivery's zero-delay sends) get no event of
their own: they are handed over right after it, as their event would be (`at_tick`, `_fire`).

Delivery times are exact (fractional when latencies are): messages of one send with random
delays are sorted once by delivery time, and each distinct time gets its own batch. Same-time
deliveries are one batch in send order; messages with different delays may overtake each other
(links are not FIFO when delays are i.i.d.: a later message with a shorter delay arrives first).
Drops are counted per kind, at send time (link or node down) and at delivery time (destination
down) alike. With ideal links none of this runs: no draws, one batch per send.

Windows (a protocol that declares `Protocol.window_safe`, links that are not ideal; delivery
times exact or on a grid, whose many ties windows keep in send order): instead of an
event per delivery time, one event fires at the earliest due time d, and every message due
before the next instant that matters H (the next other event on the clock: a slot tick, a
deadline, a measurement; only d itself when such an event is at d) is handed over as one
batch sorted by delivery time (stable: send order among equal times), each message carrying
its exact ``delivered_at``. Replies are sent at the exact times of the messages that caused
them (`send(..., at=...)`); those due before H come in a follow-up batch of the same window,
until none is left; then `on_window_end`. Availability, latency and receivability are asked
once per window for all its messages when the link model answers per slot (`per_slot`: a
window never spans a slot boundary) or takes one time per message (`per_message`), else once
per distinct time; latency draws come from the stream in the same order either way, so
windows reproduce one-message-per-instant delivery. A window may span several slots when the
engine hands a protocol several at once (`desim.kernel.engine`): sends then carry their slot
times (`at`) and ids, which make delays fixed functions of the messages (`LinkModel.latency`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import Event

from desim.kernel.links import LinkModel
from desim.kernel.messages import DST, DUE, KIND, PAYLOAD, SENT, SRC, Batch

#: Priorities of same-time events: a slot's tick, deliveries, deadlines, then measurements.
PRIORITY_TICK, PRIORITY_DELIVER, PRIORITY_DEADLINE, PRIORITY_RECORD = 0, 1, 2, 3


class At(Event):
    """An event that fires `delay` after now with a given same-time priority (like `Timeout`)."""

    def __init__(self, env: simpy.Environment, delay: float, priority: int) -> None:
        if delay < 0:
            raise ValueError(f"negative delay {delay}")
        self.env = env
        self.callbacks = []
        self._value = None
        self._ok = True
        env.schedule(self, priority, delay)


class Network:
    """Message transport between `n_agents` agents for one protocol's message kinds.

    `sent[k]` and `dropped[k]` count messages of kind `kinds[k]` since the start.
    """

    def __init__(
        self,
        env: simpy.Environment,
        kinds: tuple[str, ...],
        links: LinkModel,
        rng_links: np.random.Generator,
        rng_latency: np.random.Generator,
        deliver: Callable[[Batch], None],
        window_end: Callable[[], None] | None = None,
    ) -> None:
        self.env = env
        self.kinds = kinds
        self.links = links
        self._ideal = links.ideal  # read once: the synchronous path pays no lookups
        #: Delivery ticks per slot (0: exact delivery times; see `desim.network_models.latency`).
        self._ticks = round(1.0 / links.resolution) if links.resolution > 0 else 0
        self._rng_links = rng_links
        self._rng_latency = rng_latency
        self._deliver = deliver
        self._pending: dict[float, list[Batch]] = {}
        self._firing: float | None = None  # the delivery time being handed over (`_fire`)
        self._now_at: np.ndarray = np.empty(0)  # send times of the current instant (`_sent_now`)
        self._empty: np.ndarray = np.empty((0, 0))  # zero-width payloads (`_no_payload`)
        self._code_arrays: dict[int, np.ndarray] = {}
        self.sent = np.zeros(len(kinds), dtype=np.int64)
        self.dropped = np.zeros(len(kinds), dtype=np.int64)
        #: Window batching: exact times, a window-safe protocol (its `on_window_end`).
        self._window_end = window_end
        self.windows = window_end is not None and not self._ideal
        self._per_slot = bool(getattr(links, "per_slot", False))
        self._per_message = bool(getattr(links, "per_message", False))
        #: Queued messages: row blocks (columns `DUE`, `SENT`, …, payload), each sorted by due
        #: time, in send order (one block per send, merged every few sends).
        self._queue: list[np.ndarray] = []
        self._width = 0  # payload columns of the rows (the widest payload sent so far)
        self._flush_at: float | None = None  # time of the live flush event
        self._flush_token = 0  # flush events of older tokens are void
        self._flushing = False
        self._clean = 0  # leading queued blocks with nothing due in the window being flushed
        self._queued = 0  # blocks queued so far

    def send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray | None = None,
        at: np.ndarray | None = None,
        ids: np.ndarray | None = None,
    ) -> None:
        """Send one message of `kind` from each src[i] to dst[i], carrying payload[i] (a row).

        `at` (windows only): each message's exact send time (ascending), e.g. the delivery
        times of the messages it answers; None means now. `ids` (optional): a number naming
        each message among the run's messages of this kind (a reply may reuse its request's);
        random delays are then fixed functions of (kind, id) (`LinkModel.latency`).
        """
        code = self.kinds.index(kind)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        n = len(src)
        if n == 0:
            return
        if payload is None:
            payload = self._no_payload(n)
        elif payload.ndim == 1:
            payload = payload[:, None]
        now = self.env.now
        self.sent[code] += n
        if self._ideal:
            self._file(
                float(now),
                Batch(
                    src,
                    dst,
                    self._codes(code, n),
                    payload,
                    self._sent_now(float(now), n),
                    self.kinds,
                    code,
                ),
            )
            return
        if ids is not None:
            ids = self._message_ids(code, ids)
        if self.windows:
            self._send_window(code, src, dst, payload, at, ids)
            return
        up = self.links.available(self._rng_links, now, src, dst)
        if up is not True:
            up = np.asarray(up, dtype=bool)
            if not up.all():
                self.dropped[code] += n - int(up.sum())
                src, dst, payload = src[up], dst[up], payload[up]
                if ids is not None:
                    ids = ids[up]
                n = len(src)
                if n == 0:
                    return
        delay = self._latency(now, src, dst, payload.shape[1], ids)
        due: np.ndarray | float = now + (
            np.asarray(delay, dtype=float) if not isinstance(delay, int | float) else float(delay)
        )
        if self._ticks:
            due = self._on_grid(due)
        batch = Batch(
            src, dst, self._codes(code, n), payload, self._sent_now(float(now), n), self.kinds, code
        )
        if np.ndim(due) == 0:
            self._file(float(due), batch)
        elif n == 1 or due.min() == due.max():  # one time for all (e.g. constant delay)
            self._file(float(due[0]), batch)
        else:
            self._file_each(due, batch)

    def _message_ids(self, code: int, ids: np.ndarray) -> np.ndarray:
        """The latency counters of messages of kind `code` named `ids`: distinct per kind."""
        counter = np.asarray(ids, dtype=np.uint64) * np.uint64(len(self.kinds))
        counter += np.uint64(code)
        return counter

    def _latency(
        self,
        t: float | np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        width: int,
        ids: np.ndarray | None,
    ) -> np.ndarray | float:
        """The links' delays of these messages (by id when named; link models written before
        ids existed are never passed them)."""
        if ids is None:
            return self.links.latency(self._rng_latency, t, src, dst, width)
        return self.links.latency(self._rng_latency, t, src, dst, width, ids=ids)

    def _on_grid(self, due: np.ndarray | float) -> np.ndarray:
        """Delivery times rounded up to the grid of 1/ticks slot (a hair's tolerance: a time
        already on the grid stays there despite rounding in the sum t + delay)."""
        return np.ceil(np.asarray(due) * self._ticks - 1e-9) / self._ticks

    def _file_each(self, due: np.ndarray, batch: Batch) -> None:
        """File the messages of `batch` under their own delivery times `due`.

        One stable sort and views of its runs of equal times: no per-time mask over the send.
        """
        order = np.argsort(due, kind="stable")
        due = due[order]
        s = batch.select(order)
        cuts = [0, *(np.flatnonzero(due[1:] != due[:-1]) + 1).tolist(), len(due)]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            self._file(
                float(due[a]),
                Batch(
                    s.src[a:b],
                    s.dst[a:b],
                    s.kind[a:b],
                    s.payload[a:b],
                    s.sent_at[a:b],
                    s.kinds,
                    s.single_kind,
                ),
            )

    def _codes(self, code: int, n: int) -> np.ndarray:
        """A read-only array of n copies of `code` (shared: batches of a kind reuse it).

        One array per kind, grown when needed, of which a view is handed out: sends of varying
        sizes must not keep an array per size alive.
        """
        codes = self._code_arrays.get(code)
        if codes is None or len(codes) < n:
            codes = np.full(max(n, 2 * len(codes) if codes is not None else n), code)
            codes.flags.writeable = False
            self._code_arrays[code] = codes
        return codes[:n]

    def _no_payload(self, n: int) -> np.ndarray:
        """A read-only (n, 0) payload (shared, like `_codes`)."""
        if len(self._empty) < n:
            self._empty = np.empty((max(n, 2 * len(self._empty)), 0))
            self._empty.flags.writeable = False
        return self._empty[:n]

    def _sent_now(self, now: float, n: int) -> np.ndarray:
        """A read-only array of n copies of `now` (the sends of one instant share it).

        A broadcast view of one float (stride 0): no array of 10⁶ entries is allocated and
        filled at every instant, and batches still pending keep their own send time (a buffer
        refilled in place would change it under them).
        """
        at = self._now_at
        if len(at) < n or (n and at[0] != now):
            # (the constructor, not `np.broadcast_to`: a third of the cost, at every instant)
            at = np.ndarray((max(n, len(at)),), np.float64, np.array([now]), 0, (0,))
            at.flags.writeable = False
            self._now_at = at
        return at[:n]

    def _file(self, when: float, batch: Batch) -> None:
        parts = self._pending.get(when)
        if parts is not None:
            parts.append(batch)
            return
        self._pending[when] = [batch]
        if when == self._firing:  # a zero-delay reply: `_fire` hands it over next (see there)
            return
        At(self.env, when - self.env.now, PRIORITY_DELIVER).callbacks.append(
            lambda _event, when=when: self._fire(when)
        )

    def at_tick(self, tick: Callable[[], None]) -> None:
        """Run a slot's `tick` and hand over at once what it sends for delivery now.

        The event those messages would get would fire right after the tick: ticks come first
        at an instant, no other event is filed under this time when nothing is pending for it,
        and deliveries come before deadlines and measurements. So `_fire` follows directly
        (as for zero-delay replies). With windows, sends are queued instead (see `_flush`).
        """
        now = float(self.env.now)
        if self.windows or now in self._pending or self._firing is not None:
            tick()
            return
        self._firing = now
        try:
            tick()
        finally:
            self._firing = None
        if now in self._pending:
            self._fire(now)

    def _fire(self, when: float) -> None:
        """Hand over what is filed under `when`, then what deliveries file there meanwhile.

        Zero-delay replies are filed under the time being delivered; they get no event of their
        own: the event they would get would come right after this one (same time and priority,
        and no other delivery event is filed under one time), so a loop does the same.
        """
        self._firing = when
        try:
            while (parts := self._pending.pop(when, None)) is not None:
                batch = parts[0] if len(parts) == 1 else Batch.concat(parts)
                if not self._ideal:
                    ok = self.links.receivable(when, batch.dst)
                    if ok is not True:
                        ok = np.asarray(ok, dtype=bool)
                        if not ok.all():
                            self.dropped += np.bincount(batch.kind[~ok], minlength=len(self.kinds))
                            batch = batch.select(ok)
                            if len(batch) == 0:
                                continue
                self._deliver(batch)
        finally:
            self._firing = None

    # -- windows -------------------------------------------------------------------------------
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

    def _send_window(
        self,
        code: int,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray,
        at: np.ndarray | None,
        ids: np.ndarray | None,
    ) -> None:
        n = len(src)
        # one send time for all (a tick's sends) or each message's own (replies in a window)
        times: np.ndarray | float = (
            float(self.env.now) if at is None else np.asarray(at, dtype=float)
        )
        up = self._by_time(
            times, lambda t, s: self.links.available(self._rng_links, t, src[s], dst[s])
        )
        if up is not True:
            # (methods, not `np.flatnonzero`/`np.ndim`: the wrappers cost as much at this size)
            keep = up.nonzero()[0] if isinstance(up, np.ndarray) else np.arange(n if up else 0)
            if len(keep) < n:
                self.dropped[code] += n - len(keep)
                src, dst = src[keep], dst[keep]
                if not isinstance(times, float):
                    times = times[keep]
                payload = payload.take(keep, axis=0)  # (`take`: a 2-D mask or index is slower)
                if ids is not None:
                    ids = ids[keep]
                n = len(src)
                if n == 0:
                    return
        width = payload.shape[1]
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
        self._queue.append(rows)
        self._queued += 1
        if len(self._queue) > _MERGE_AT:  # the oldest block drains by itself: keep it apart
            self._queue = [self._queue[0], _merge(self._queue[1:])]
            self._clean = min(self._clean, 1)
        if not self._flushing:
            self._schedule(float(due[0]))

    def _schedule(self, when: float) -> None:
        """Make sure a flush event fires at `when` (or earlier)."""
        if self._flush_at is not None and self._flush_at <= when:
            return
        self._flush_at = when
        self._flush_token += 1
        event = At(self.env, when - self.env.now, PRIORITY_DELIVER)
        event.network_flush = True
        event.callbacks.append(lambda _e, token=self._flush_token: self._flush(token))

    def _horizon(self, now: float) -> float:
        """The time of the next event on the clock other than this network's flushes."""
        # SimPy keeps no public view of its queue; it is a heap of (time, priority, id, event)
        queue = self.env._queue
        if queue and not getattr(queue[0][3], "network_flush", False):
            return queue[0][0]  # the earliest event of all (the usual case: a tick)
        times = [t for t, _prio, _id, ev in queue if not getattr(ev, "network_flush", False)]
        return min(times, default=np.inf)

    def _flush(self, token: int) -> None:
        """Deliver the window that starts now, in batches, then end it."""
        if token != self._flush_token:
            return
        self._flush_at = None
        now = float(self.env.now)
        horizon = self._horizon(now)
        self._flushing = True
        self._clean = 0
        try:
            while (batch := self._take_due(now, horizon)) is not None:
                dst = batch.dst
                ok = self._by_time(
                    batch.delivered_at, lambda t, s, dst=dst: self.links.receivable(t, dst[s])
                )
                if ok is not True:
                    ok = np.broadcast_to(np.asarray(ok, dtype=bool), (len(batch),))
                    if not ok.all():
                        self.dropped += np.bincount(batch.kind[~ok], minlength=len(self.kinds))
                        batch = batch.select(ok)
                if len(batch):
                    events = len(self.env._queue)  # sends schedule no flush while flushing
                    queued = self._queued
                    self._deliver(batch)
                    if len(self.env._queue) != events and self._horizon(now) < horizon:
                        raise RuntimeError(
                            "a window-safe protocol scheduled an event inside a "
                            "window (Context.call_at from on_deliver)"
                        )
                    if self._queued == queued:
                        break  # nothing was queued meanwhile: nothing else is due
            self._window_end()
        finally:
            self._flushing = False
        if self._queue:
            self._schedule(min(float(rows[0, DUE]) for rows in self._queue))

    def _take_due(self, now: float, horizon: float) -> Batch | None:
        """The queued messages due in [now, horizon) (at now only, if horizon is now), sorted
        by delivery time (stable: send order among equal times); the others stay queued."""
        # blocks before `_clean` were taken from in this window: nothing in them is due
        rest = self._queue[: self._clean]
        taken = []
        for rows in self._queue[self._clean :]:  # each block is sorted: what is due is a prefix
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
        self._queue = rest
        self._clean = len(rest)
        if not taken:
            return None
        return Batch.from_rows(_merge(taken), self.kinds)


#: Queued blocks (one per send) merged when there are more than this many: all but the oldest,
#: which windows drain from its front (merging it again and again would re-sort the queue).
_MERGE_AT = 4


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
