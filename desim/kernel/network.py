"""The network: carries messages between agents over a link model, in batches.

Each send call draws availability and latency for its messages, drops those on links that are
down, and files the rest under their delivery time. One SimPy event is scheduled per distinct
delivery time; when it fires, the messages whose destination cannot receive then
(`LinkModel.receivable`: a churned agent) are dropped and everything else filed under that time
is handed to the protocol as one `Batch`, in send order.

Delivery times are exact (fractional when latencies are): messages of one send with random
delays are sorted once by delivery time, and each distinct time gets its own batch. Same-time
deliveries are one batch in send order; messages with different delays may overtake each other
(links are not FIFO when delays are i.i.d.: a later message with a shorter delay arrives first).
Drops are counted per kind, at send time (link or node down) and at delivery time (destination
down) alike. With ideal links none of this runs: no draws, one batch per send.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import Event

from desim.kernel.links import LinkModel
from desim.kernel.messages import Batch

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
        self._code_arrays: dict[int, np.ndarray] = {}
        self.sent = np.zeros(len(kinds), dtype=np.int64)
        self.dropped = np.zeros(len(kinds), dtype=np.int64)

    def send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray | None = None,
    ) -> None:
        """Send one message of `kind` from each src[i] to dst[i], carrying payload[i] (a row)."""
        code = self.kinds.index(kind)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        n = len(src)
        if n == 0:
            return
        if payload is None:
            payload = np.empty((n, 0))
        elif payload.ndim == 1:
            payload = payload[:, None]
        now = self.env.now
        self.sent[code] += n
        if self._ideal:
            self._file(float(now), Batch(src, dst, self._codes(code, n), payload,
                                         np.full(n, float(now)), self.kinds, code))
            return
        up = self.links.available(self._rng_links, now, src, dst)
        if up is not True:
            up = np.asarray(up, dtype=bool)
            if not up.all():
                self.dropped[code] += n - int(up.sum())
                src, dst, payload = src[up], dst[up], payload[up]
                n = len(src)
                if n == 0:
                    return
        delay = self.links.latency(self._rng_latency, now, src, dst, payload.shape[1])
        due: np.ndarray | float = now + (
            np.asarray(delay, dtype=float) if not isinstance(delay, int | float) else float(delay)
        )
        if self._ticks:  # deliveries on a grid of 1/ticks slot: due times rounded up
            due = np.ceil(np.asarray(due) * self._ticks - 1e-9) / self._ticks
        batch = Batch(src, dst, self._codes(code, n), payload, np.full(n, float(now)),
                      self.kinds, code)
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
            self._file(float(due[a]), Batch(s.src[a:b], s.dst[a:b], s.kind[a:b],
                                            s.payload[a:b], s.sent_at[a:b], s.kinds, s.only))

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

    def _file(self, when: float, batch: Batch) -> None:
        parts = self._pending.get(when)
        if parts is not None:
            parts.append(batch)
            return
        self._pending[when] = [batch]
        At(self.env, when - self.env.now, PRIORITY_DELIVER).callbacks.append(
            lambda _event, when=when: self._fire(when)
        )

    def _fire(self, when: float) -> None:
        batch = Batch.concat(self._pending.pop(when))
        if not self._ideal:
            ok = self.links.receivable(when, batch.dst)
            if ok is not True:
                ok = np.asarray(ok, dtype=bool)
                if not ok.all():
                    self.dropped += np.bincount(batch.kind[~ok], minlength=len(self.kinds))
                    batch = batch.select(ok)
                    if len(batch) == 0:
                        return
        self._deliver(batch)
