"""What every transport shares: same-time event priorities, the counters and the drop rules.

A transport carries the messages of one run between agents. Three exist, and the engine picks
one at set-up (`desim.kernel.network.pick_transport`): `Synchronous` (ideal links: one batch per
send, no draws), `Instants` (one SimPy event per distinct delivery time) and `Windows` (a
window-safe protocol's deliveries between two instants that matter, in batches). They share
this base: per-kind `sent` and `dropped` counters, one rule for messages lost at send time
(the link or a node is down: `LinkModel.available`) and one for messages lost at delivery time
(the destination cannot receive: `LinkModel.receivable`), and the read-only arrays batches
share (kind codes, send times, empty payloads).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy
from simpy.events import Event

from desim.kernel.links import LinkModel
from desim.kernel.messages import Batch, SenderBatch

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


class Transport:
    """Message transport between agents for one protocol's message kinds (see the module).

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
        self._rng_links = rng_links
        self._rng_latency = rng_latency
        self._deliver = deliver
        #: Delivery ticks per slot (0: exact delivery times; see `desim.network_models.latency`).
        self._ticks = round(1.0 / links.resolution) if links.resolution > 0 else 0
        self.sent = np.zeros(len(kinds), dtype=np.int64)
        self.dropped = np.zeros(len(kinds), dtype=np.int64)
        self._code_arrays: dict[int, np.ndarray] = {}
        self._empty: np.ndarray = np.empty((0, 0))  # zero-width payloads (`_no_payload`)
        self._now_at: np.ndarray = np.empty(0)  # send times of the current instant (`_sent_now`)

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
        raise NotImplementedError

    def send_batch(self, kind: str, batch: SenderBatch) -> None:
        """Send the messages of `batch` (built by the protocol, its columns made when read) as
        `send` sends its columns; a transport that hands a send over whole (`Synchronous`)
        hands over the batch itself."""
        self.send(kind, batch.src, batch.dst, batch.payload)

    def _columns(
        self, src: np.ndarray, dst: np.ndarray, payload: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A send's columns as the transports file them: integer senders and receivers, and a
        payload of one row per message (zero-width when there is none)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        if payload is None:
            payload = self._no_payload(len(src))
        elif payload.ndim == 1:
            payload = payload[:, None]
        return src, dst, payload

    def at_tick(self, tick: Callable[[], None]) -> None:
        """Run a slot's `tick` (the protocol's reaction to its samples)."""
        tick()

    # -- losses, shared by every transport that draws ------------------------------------------
    def _kept(self, code: int, up: np.ndarray | bool, n: int) -> np.ndarray | None:
        """Indices of the `n` messages of kind `code` whose link is up (`up`: the links' answer,
        an array or one bool for all), or None when all are; the others are counted dropped."""
        if up is True:
            return None
        # (methods, not `np.flatnonzero`/`np.ndim`: the wrappers cost as much at this size)
        if isinstance(up, np.ndarray) and up.ndim:
            keep = up.nonzero()[0]
        else:
            keep = np.arange(n if up else 0)
        if len(keep) == n:
            return None
        self.dropped[code] += n - len(keep)
        return keep

    def _receivable(self, batch: Batch, ok: np.ndarray | bool) -> Batch:
        """`batch` without the messages whose destination cannot receive (`ok`: the links'
        answer, an array or one bool for all), which are counted as dropped, per kind."""
        if ok is True:
            return batch
        ok = np.broadcast_to(np.asarray(ok, dtype=bool), (len(batch),))
        if ok.all():
            return batch
        self.dropped += np.bincount(batch.kind[~ok], minlength=len(self.kinds))
        return batch.select(ok)

    # -- the arrays messages carry -------------------------------------------------------------
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
            # (the constructor, not `np.broadcast_to`: it costs less, and this runs every instant)
            at = np.ndarray((max(n, len(at)),), np.float64, np.array([now]), 0, (0,))
            at.flags.writeable = False
            self._now_at = at
        return at[:n]
