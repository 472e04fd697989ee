"""The engine: runs one protocol on one data source over a network, slot by slot, on SimPy.

Time is slotted: slot t (t = 1, …, t_max) happens at simulated time t, when every agent
receives one sample. At each instant the order is fixed: the slot's tick (samples, then what
the protocol sends in response), then message deliveries in send order (one batch per
instant, more batches if zero-latency replies are sent meanwhile), then deadlines a protocol
set with `Context.call_at` (their zero-latency sends are delivered before the next deadline),
then the recorder. With exact delivery times and a window-safe protocol, the deliveries
between two such instants come as windows (`desim.kernel.network`): the same results, far fewer
events. When moreover the protocol's sends at a tick never depend on earlier deliveries
(`Protocol.slot_batches`) and the links are counter-based, up to SLOT_BATCH slots are handed
over at once (`Protocol.on_slots`), so that windows span those slots; a batch ends at every
measurement, which then sees the state one slot at a time would leave.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from desim.kernel.links import IdealLinks, LinkModel
from desim.kernel.network import PRIORITY_DEADLINE, PRIORITY_RECORD, PRIORITY_TICK, At, Network
from desim.kernel.protocol import Context, DataSource, Protocol
from desim.kernel.randomness import Streams
from desim.kernel.recorder import Recorder, log_checkpoints

#: Slots of data drawn per call to the data source: this many, or fewer when their samples
#: would take more than DATA_BLOCK_BYTES (large populations). Data never depend on the block:
#: a data source draws slots in order (`DataSource.sample`), so neither t_max nor the
#: population's size changes the samples of a slot.
DATA_BLOCK = 1024
DATA_BLOCK_BYTES = 128 * 2**20
#: Most slots handed to a protocol at once (`Protocol.on_slots`).
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
    """One run: a protocol, a data source, a link model and a recorder on a SimPy clock."""

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
    ) -> None:
        self.env = simpy.Environment()
        self.protocol = protocol
        self.data = data
        self.t_max = int(t_max)
        self.streams = streams
        # the links of this run: probabilities fixed now (graph, own streams), public to all
        self.links = (links or IdealLinks()).bind(data.n_agents, data.public, streams)
        self.network = Network(
            self.env,
            protocol.message_kinds,
            self.links,
            streams.get("links"),
            streams.get("latency"),
            protocol.on_deliver,
            protocol.on_window_end if windows and protocol.window_safe else None,
        )
        self.checkpoints = log_checkpoints(t_max) if checkpoints is None else checkpoints
        self.recorder = Recorder(protocol, self.network, data.means, per_agent, data, metrics)

    def _tick(self, _event: simpy.Event | None = None) -> None:
        """Slot t's tick: every agent's sample, then the next tick (a chain of callbacks, not
        a SimPy process: a process pays a generator resume and an event per slot on top); with
        slot batches, the ticks of slots t … t + k − 1 at once."""
        t = self._t = self._t + 1
        i = (t - 1) % self._block_size
        if i == 0:
            self._block = None  # free the old block before drawing the next
            self._block = self.data.sample(self._rng_data, self._block_size)
        if self._batches:
            # slots t … last at once: to a measurement, the run's end or the block's end
            measured = self._measured
            k = (
                math.floor(measured[measured.searchsorted(t)]) + 1 - t
                if (len(measured) and t <= measured[-1])
                else SLOT_BATCH
            )
            k = min(k, SLOT_BATCH, self.t_max + 1 - t, self._block_size - i)
            samples = self._block[i : i + k]
            self._t = t + k - 1
            self.network.at_tick(lambda: self.protocol.on_slots(t, samples))
            if self._t < self.t_max:
                At(self.env, k, PRIORITY_TICK).callbacks.append(self._tick)
            return
        samples = self._block[i]
        self.network.at_tick(lambda: self.protocol.on_samples(t, samples))
        if t < self.t_max:
            At(self.env, 1, PRIORITY_TICK).callbacks.append(self._tick)

    def _call_at(self, when: float, fn: Callable[[], None]) -> None:
        """Call `fn()` at time `when` (≥ now), after that instant's deliveries."""
        At(self.env, when - self.env.now, PRIORITY_DEADLINE).callbacks.append(lambda _e: fn())

    def run(self) -> RunOutput:
        """Run to `t_max` and return the records."""
        ctx = Context(
            n_agents=self.data.n_agents,
            t_max=self.t_max,
            public=dict(self.data.public),
            streams=self.streams,
            send=self.network.send,
            now=lambda: self.env.now,
            oracle_classes=self.data.classes.copy() if self.protocol.uses_oracle else None,
            links=self.links,
            call_at=self._call_at,
        )
        self.protocol.setup(ctx)
        self._batches = (
            self.network.windows and self.protocol.slot_batches and self.links.counter_based
        )
        self._measured = np.sort(np.asarray(self.checkpoints, dtype=float))
        self._t, self._block, self._block_size = 0, None, data_block(self.data.n_agents)
        self._rng_data = self.streams.get("data")
        if self.t_max >= 1:
            At(self.env, 1, PRIORITY_TICK).callbacks.append(self._tick)
        for t in self.checkpoints:
            At(self.env, float(t), PRIORITY_RECORD).callbacks.append(
                lambda _e, t=float(t): self.recorder.measure(t)
            )
        self.env.run(until=self.t_max + 1)
        return RunOutput(self.recorder.metrics(), self.recorder.agents())
