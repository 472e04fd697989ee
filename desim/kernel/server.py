"""The parameter server and round deadlines: collecting messages per round, protocol-agnostic.

The parameter server (PS) is the network address ``n_agents``, one past the agents: agents send
to it like to any agent, over links the link model decides (the uplinks τ_i of seed 004). A
`RoundCollector` gathers the messages of one kind that belong to round r — column 0 of their
payload carries r (`tag`) — and hands them over at r's deadline, a timer of the engine
(`desim.kernel.protocol.Context.call_at`); a message that arrives after its round closed is late: it
is counted, not delivered. With zero latency and deadline = the round's start, everything sent
in the round is collected (deadlines fire after the instant's deliveries). `ParameterServer` is
a collector at the server address; protocols use plain collectors for their agents' own stage
deadlines (e.g. PriCER's Stage 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.protocol import Context


def server_address(n_agents: int) -> int:
    """The network address of the parameter server: one past the agents."""
    return n_agents


def tag(r: int, payload: np.ndarray) -> np.ndarray:
    """`payload` rows (one message each) with the round number r prepended as column 0."""
    payload = np.asarray(payload, dtype=float)
    if payload.ndim == 1:
        payload = payload[:, None]
    return np.column_stack([np.full(len(payload), float(r)), payload])


@dataclass(frozen=True)
class Round:
    """The messages of round `r` that arrived before its deadline (payload without the tag)."""

    r: int
    src: np.ndarray
    dst: np.ndarray
    payload: np.ndarray

    def __len__(self) -> int:
        return len(self.src)


class RoundCollector:
    """Messages of kind `kind` gathered per round and handed to `on_close` at the round's deadline.

    `width` is the payload width after the tag (narrower kinds in a joined batch are NaN-padded,
    so the collector cuts them back); `late` counts messages that missed their deadline.
    """

    def __init__(
        self, ctx: Context, kind: str, width: int, on_close: Callable[[Round], None]
    ) -> None:
        if ctx.call_at is None:
            raise ValueError("this engine gives no timers (Context.call_at); rounds need them")
        self.ctx = ctx
        self.kind = kind
        self.width = int(width)
        self.on_close = on_close
        self.late = 0
        #: Open rounds: the (src, dst, payload without the tag) of each delivery, in order.
        self._parts: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def open(self, r: int, deadline: float) -> None:
        """Start collecting round r; it closes at time `deadline` (≥ now)."""
        if r in self._parts:
            raise ValueError(f"round {r} of {self.kind!r} is already open")
        self._parts[r] = []
        self.ctx.call_at(deadline, lambda: self._close(r))

    def accepts(self, batch: Batch) -> np.ndarray:
        """Which messages of `batch` this collector takes if of its kind (checked apart): all."""
        return np.ones(len(batch), dtype=bool)

    def receive(self, batch: Batch) -> None:
        """File the messages of this kind in `batch` under their rounds (late ones are counted).

        A window's batch (`desim.kernel.network`) may hold several rounds and late messages:
        one stable sort by round (delivery order within a round) and one run of it per open
        round, the rest late. No round opens or closes inside a window (ticks and deadlines end
        windows), so this files what the same messages delivered one instant at a time would.
        """
        code = batch.kinds.index(self.kind)
        if batch.single_kind is not None and batch.single_kind != code:
            return
        take = np.asarray(self.accepts(batch), dtype=bool)
        if batch.single_kind != code:  # joined kinds: one mask for kind and acceptance, one select
            take = take & (batch.kind == code)
        index = take.nonzero()[0]  # (methods here, not numpy's wrappers: a call per window)
        if len(index) == 0:
            return
        rounds = batch.payload[index, 0]  # round numbers are exact in a float column
        several = not (rounds == rounds[0]).all()  # the usual case: one round in flight
        if several:
            order = rounds.argsort(kind="stable")
            index, rounds = index[order], rounds[order]
        # a copy (`select` takes): rounds keep their messages until they close, longer than a
        # sender's payload buffer need live
        mine = batch.select(index)
        payload = mine.payload[:, 1 : 1 + self.width]
        if not several:
            parts = self._parts.get(int(rounds[0]))
            if parts is None:
                self.late += len(mine)
            else:
                parts.append((mine.src, mine.dst, payload))
            return
        open_rounds = np.fromiter(self._parts, dtype=float, count=len(self._parts))
        starts = rounds.searchsorted(open_rounds, side="left").tolist()
        ends = rounds.searchsorted(open_rounds, side="right").tolist()
        taken = 0
        src, dst = mine.src, mine.dst  # (properties: read once, not once per round)
        for parts, a, b in zip(self._parts.values(), starts, ends, strict=True):
            if b > a:
                parts.append((src[a:b], dst[a:b], payload[a:b]))
                taken += b - a
        self.late += len(mine) - taken

    def _close(self, r: int) -> None:
        parts = self._parts.pop(r)
        if len(parts) == 1:
            self.on_close(Round(r, *parts[0]))
        elif parts:
            src, dst, payload = zip(*parts, strict=True)
            self.on_close(
                Round(r, np.concatenate(src), np.concatenate(dst), np.concatenate(payload))
            )
        else:
            empty = np.empty(0, dtype=np.int64)
            self.on_close(Round(r, empty, empty, np.empty((0, self.width))))


class ParameterServer(RoundCollector):
    """The PS: a round collector for the messages of `kind` addressed to `server_address`."""

    def __init__(
        self, ctx: Context, kind: str, width: int, on_close: Callable[[Round], None]
    ) -> None:
        super().__init__(ctx, kind, width, on_close)
        #: The server's network address (one past the agents).
        self.address = server_address(ctx.n_agents)

    def accepts(self, batch: Batch) -> np.ndarray:
        """Only messages addressed to the server."""
        return batch.dst == self.address
