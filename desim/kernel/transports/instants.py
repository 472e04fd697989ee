"""One delivery instant at a time: a SimPy event per distinct delivery time.

Each send draws availability and latency for its messages, drops those on links that are down,
and files the rest under their delivery time. One event is scheduled per distinct delivery
time; when it fires, the messages whose destination cannot receive then
(`LinkModel.receivable`: a churned agent) are dropped and everything else filed under that
time is handed to the protocol as one `Batch`, in send order. Messages due at the very instant
being handed over (a tick's or a delivery's zero-delay sends) get no event of their own: they
are handed over right after it, as their event would be (`at_tick`, `_fire`).

Delivery times are exact (fractional when latencies are): messages of one send with random
delays are sorted once by delivery time, and each distinct time gets its own batch. Same-time
deliveries are one batch in send order; messages with different delays may overtake each other
(links are not FIFO when delays are i.i.d.: a later message with a shorter delay arrives first).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from desim.kernel.messages import Batch, undeclared_kind
from desim.kernel.transports.base import PRIORITY_DELIVER, At, Transport


class Instants(Transport):
    """Messages delivered one instant at a time, drawn on any link model (see the module)."""

    #: Whether a delivery asks `LinkModel.receivable` (ideal links: every node always can).
    checks_receivers = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._pending: dict[float, list[Batch]] = {}
        self._firing: float | None = None  # the delivery time being handed over (`_fire`)

    def send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray | None = None,
        at: np.ndarray | None = None,
        ids: np.ndarray | None = None,
    ) -> None:
        """Draw the links' answers, drop what is lost, file the rest by delivery time."""
        try:
            code = self.kinds.index(kind)
        except ValueError:  # a kind the protocol does not declare: say which are
            raise undeclared_kind(kind, self.kinds) from None
        src, dst, payload = self._columns(src, dst, payload)
        n = len(src)
        if n == 0:
            return
        now = self.env.now
        self.sent[code] += n
        if ids is not None:
            ids = self._message_ids(code, ids)
        keep = self._kept(code, self.links.available(self._rng_links, now, src, dst), n)
        if keep is not None:
            src, dst, payload = src[keep], dst[keep], payload.take(keep, axis=0)
            if ids is not None:
                ids = ids[keep]
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

    def _file(self, when: float, batch: Batch) -> None:
        """File `batch` for delivery at `when`: under an event of that time, or (zero-delay
        sends at the time being handed over) for `_fire` to hand over next."""
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
        (as for zero-delay replies).
        """
        now = float(self.env.now)
        if now in self._pending or self._firing is not None:
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
                if self.checks_receivers:
                    batch = self._receivable(batch, self.links.receivable(when, batch.dst))
                    if len(batch) == 0:
                        continue
                self._deliver(batch)
        finally:
            self._firing = None
