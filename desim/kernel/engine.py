"""The engine: runs one protocol on one data source over a network, slot by slot, on SimPy.

Time is slotted: slot t (t = 1, …, t_max) happens at simulated time t, when every agent
receives one sample. At each instant the order is fixed: the slot's tick (samples, then what
the protocol sends in response), then message deliveries in send order (one batch per
instant, more batches if zero-latency replies are sent meanwhile), then deadlines a protocol
set with `Context.call_at` (their zero-latency sends are delivered before the next deadline),
then the recorder. The engine picks the run's transport once (`desim.kernel.network`): with
links that are not ideal and a `WindowSafe` protocol, the deliveries between two such instants
come as windows, up to the horizon the engine gives (its next tick, deadline, measurement or
the run's end): the same results, far fewer events. When moreover the protocol is
`SlotBatched` (its sends at a tick never depend on earlier deliveries; `batches_slots()` asked
once after set-up) and the links are counter-based, up to SLOT_BATCH slots are handed over at
once (`SlotBatched.on_slots`), so that windows span those slots; a batch ends at every
measurement, which then sees the state one slot at a time would leave.

A graph that changes during a run (`graphs`: its schedule, `desim.topologies.dynamic`) changes
at the start of a slot's tick, before its samples: the engine puts the new graph in the
context's and the data's ``public["graph"]`` and tells the protocol (`FollowsGraph`); a slot
batch never spans a change.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import simpy

from desim.kernel.links import IdealLinks, LinkModel
from desim.kernel.network import (
    PRIORITY_DEADLINE,
    PRIORITY_RECORD,
    PRIORITY_TICK,
    At,
    Network,
    pick_transport,
)
from desim.kernel.protocol import (
    Context,
    DataSource,
    FollowsGraph,
    Protocol,
    SlotBatched,
    StopsSampling,
)
from desim.kernel.randomness import Streams
from desim.kernel.recorder import Recorder, log_checkpoints
from desim.kernel.transports import Windows

#: Slots of data drawn per call to the data source: this many, or fewer when their samples
#: would take more than DATA_BLOCK_BYTES (large populations). Data never depend on the block:
#: a data source draws slots in order (`DataSource.sample`), so neither t_max nor the
#: population's size changes the samples of a slot.
DATA_BLOCK = 1024
DATA_BLOCK_BYTES = 128 * 2**20
#: Most slots handed to a protocol at once (`SlotBatched.on_slots`).
SLOT_BATCH = 32


def data_block(n_agents: int) -> int:
    """Slots per data block for `n_agents` agents (1024 up to 16 384 agents)."""
    return max(1, min(DATA_BLOCK, DATA_BLOCK_BYTES // (8 * max(n_agents, 1))))


@dataclass
class RunOutput:
    """What one run produced: tidy metrics, optional per-agent errors, and its wall time."""

    metrics: pd.DataFrame
    agents: pd.DataFrame | None


class Simulation:
    """One run: a protocol, a data source, a link model and a recorder on a SimPy clock.

    `windows` and `slot_batches` (both on by default) allow windows and slot batches where the
    protocol declares them (`WindowSafe`, `SlotBatched`); turned off, the run takes the slower
    mode they reproduce, e.g. to check that they give the same bytes (`desim.testing`).
    `graphs`, for a graph that changes during the run, gives the slots it changes at
    (``times``) and each change (``change(t)`` → new graph, added links, dropped links);
    the protocol finds those slots in ``ctx.public["graph_changes"]`` at set-up.
    """

    def __init__(
        self,
        protocol: Protocol,
        data: DataSource,
        t_max: int,
        streams: Streams,
        links: LinkModel | None = None,
        checkpoints: np.ndarray | None = None,
        per_agent: bool = False,
        metrics: Sequence[Callable[..., dict[str, float]]] = (),
        windows: bool = True,
        slot_batches: bool = True,
        graphs: Any = None,
    ) -> None:
        self.env = simpy.Environment()
        self.graphs = graphs
        self._changes: list[int] = [] if graphs is None else [int(x) for x in graphs.times]
        if self._changes and not isinstance(protocol, FollowsGraph):
            raise ValueError(
                f"protocol {type(protocol).__name__} does not follow graph changes (FollowsGraph)"
            )
        self.protocol = protocol
        self.data = data
        self.t_max = int(t_max)
        self._stops = data.stops_before(self.t_max)
        if self._stops and not isinstance(protocol, StopsSampling):
            raise ValueError(
                f"protocol {type(protocol).__name__} needs a sample every slot (StopsSampling)"
            )
        self.streams = streams
        # the links of this run: probabilities fixed now (graph, own streams), public to all
        self.links = (links or IdealLinks()).bind(data.n_agents, data.public, streams)
        # what the horizon reads (`_horizon`): the times of the pending tick, deadlines and
        # measurements, as SimPy files them
        self._next_tick = math.inf
        self._deadlines: list[float] = []  # a heap
        self._measured = np.empty(0)
        self._next_measure = 0
        self._end = float(self.t_max + 1)
        self.network = Network(
            pick_transport(
                self.env,
                protocol,
                self.links,
                streams.get("links"),
                streams.get("latency"),
                self._horizon,
                windows,
            )
        )
        self.checkpoints = log_checkpoints(t_max) if checkpoints is None else checkpoints
        self._allow_batches = slot_batches
        #: Whether slots are handed to the protocol in batches (decided in `run`).
        self.slot_batches = False
        self.recorder = Recorder(protocol, self.network, data.means, per_agent, data, metrics)

    def _tick(self, _event: simpy.Event | None = None) -> None:
        """Slot t's tick: every agent's sample, then the next tick (a chain of callbacks, not
        a SimPy process: a process pays a generator resume and an event per slot on top); with
        slot batches, the ticks of slots t … t + k − 1 at once."""
        t = self._t = self._t + 1
        if self._changes and self._changes[0] == t:
            self._change_graph(t)
        i = (t - 1) % self._block_size
        if i == 0:
            self._block = None  # free the old block before drawing the next
            self._block = self.data.sample(self._rng_data, self._block_size)
        if self.slot_batches:
            # slots t … last at once: to a measurement, the run's end or the block's end
            measured = self._measured
            k = (
                math.floor(measured[measured.searchsorted(t)]) + 1 - t
                if (len(measured) and t <= measured[-1])
                else SLOT_BATCH
            )
            k = min(k, SLOT_BATCH, self.t_max + 1 - t, self._block_size - i)
            if self._changes:  # a batch ends before the next graph change
                k = min(k, self._changes[0] - t)
            samples = self._block[i : i + k]
            self._t = t + k - 1
            self.network.at_tick(lambda: self.protocol.on_slots(t, samples))
            self._next(k if self._t < self.t_max else 0)
            return
        samples = self._block[i]
        self.network.at_tick(lambda: self.protocol.on_samples(t, samples))
        if t < self.t_max:  # (inline, not `_next`: this runs every slot)
            self._next_tick = t + 1
            At(self.env, 1, PRIORITY_TICK).callbacks.append(self._tick)
        else:
            self._next_tick = math.inf

    def _change_graph(self, t: int) -> None:
        """The graph changes before slot t: the new one goes public, the protocol is told."""
        self._changes.pop(0)
        graph, added, dropped = self.graphs.change(t)
        self._ctx.public["graph"] = graph
        self.data.public["graph"] = graph  # what metrics read of the graph in force
        self.protocol.on_graph_change(t, added, dropped)  # type: ignore[attr-defined]

    def _next(self, k: int) -> None:
        """Schedule the next tick `k` slots from now (0: none is left)."""
        if k:
            self._next_tick = self.env.now + k
            At(self.env, k, PRIORITY_TICK).callbacks.append(self._tick)
        else:
            self._next_tick = math.inf

    def _call_at(self, when: float, fn: Callable[[], None]) -> None:
        """Call `fn()` at time `when` (≥ now), after that instant's deliveries."""
        delay = when - self.env.now
        event = At(self.env, delay, PRIORITY_DEADLINE)
        heapq.heappush(self._deadlines, self.env.now + delay)  # (the time SimPy files)
        event.callbacks.append(lambda _e: self._deadline(fn))

    def _deadline(self, fn: Callable[[], None]) -> None:
        """A deadline fires: it leaves the horizon, then `fn` runs."""
        heapq.heappop(self._deadlines)  # deadlines fire in time order: this is the earliest
        fn()

    def _measure(self, t: float) -> None:
        """A measurement fires: it leaves the horizon, then the recorder measures."""
        self._next_measure += 1
        self.recorder.measure(t)

    def _horizon(self) -> float:
        """The time of the next instant that matters other than deliveries: the pending tick,
        deadline or measurement, or the run's end (`desim.kernel.transports.Windows`)."""
        h = self._end
        if self._next_tick < h:
            h = self._next_tick
        if self._deadlines and self._deadlines[0] < h:
            h = self._deadlines[0]
        i = self._next_measure
        if i < len(self._measured) and self._measured[i] < h:
            h = float(self._measured[i])
        return h

    def run(self) -> RunOutput:
        """Run to `t_max` and return the records."""
        ctx = Context(
            n_agents=self.data.n_agents,
            t_max=self.t_max,
            public=dict(self.data.public),
            streams=self.streams,
            send=self.network.send,
            send_batch=self.network.send_batch,
            now=lambda: self.env.now,
            oracle_classes=self.data.classes.copy() if self.protocol.uses_oracle else None,
            links=self.links,
            call_at=self._call_at,
            adversary_truth=self.data if getattr(self.protocol, "has_adversaries", False) else None,
        )
        self._ctx = ctx
        if self._changes:  # a protocol whose bounds must hold over the changes knows of them
            ctx.public["graph_changes"] = tuple(self._changes)
        self.protocol.setup(ctx)
        if self._stops:
            self.protocol.stop_sampling()
        transport = self.network.transport
        self.slot_batches = (
            self._allow_batches
            and isinstance(transport, Windows)
            and isinstance(self.protocol, SlotBatched)
            and self.links.counter_based
            and self.protocol.batches_slots()
        )
        if self.slot_batches:
            transport.require_names()
        self._measured = np.sort(np.asarray(self.checkpoints, dtype=float))
        self._t, self._block, self._block_size = 0, None, data_block(self.data.n_agents)
        self._rng_data = self.streams.get("data")
        self._next(1 if self.t_max >= 1 else 0)
        for t in self.checkpoints:
            At(self.env, float(t), PRIORITY_RECORD).callbacks.append(
                lambda _e, t=float(t): self._measure(t)
            )
        self.env.run(until=self.t_max + 1)
        return RunOutput(self.recorder.metrics(), self.recorder.agents())
