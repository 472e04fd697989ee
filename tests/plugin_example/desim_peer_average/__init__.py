"""An example desim plug-in: the `peer-average` protocol, its closed-form curve and a metric.

Each slot every agent sends its running mean X̄_a to the next agent on a ring (a + 1 mod M) and
estimates its own mean by (X̄_a + X̄_{a−1}) / 2, the average of its running mean and the last
one it received. When all agents share one mean μ and the data have variance σ², on ideal links
both running means hold t independent samples at slot t, so the MSE is σ²/(2t): the curve
``peer-average``. The metric ``ring-gap`` is the mean |estimate_a − estimate_{a+1}|.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context, Protocol
from desim.kernel.registry import CURVES, METRICS, PROTOCOLS, records


@dataclass(frozen=True)
class PeerAverageParams:
    """Parameters of `peer-average`."""

    step: int = param(1, "ring step: agent a sends to a + step (mod M)", ge=1)


@PROTOCOLS.register("peer-average")
class PeerAverage(Protocol):
    """Average of one's running mean and the last running mean received from a ring neighbour."""

    Params = PeerAverageParams
    message_kinds = ("mean",)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        m = ctx.n_agents
        self.sums = np.zeros(m)
        self.t = 0
        self.received = np.full(m, np.nan)  # last running mean each agent received
        self.agents = np.arange(m)
        self.next = (self.agents + self.params.step) % m

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.sums += samples
        self.t = t
        self.ctx.send("mean", self.agents, self.next, (self.sums / t)[:, None])

    def on_deliver(self, batch: Batch) -> None:
        self.received[batch.dst] = batch.payload[:, 0]

    def estimates(self) -> np.ndarray:
        own = self.sums / max(self.t, 1)
        return np.where(np.isnan(self.received), own, (own + self.received) / 2)


@CURVES.register("peer-average")
@dataclass(frozen=True)
class PeerAverageCurve:
    """σ²/(2t): the MSE of `peer-average` when every agent has the same mean (ideal links)."""

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(σ²/(2t), zeros) on the grid `t`."""
        t = np.asarray(t, dtype=float)
        return float(data.sigma) ** 2 / (2 * t), np.zeros_like(t)


@METRICS.register("ring-gap")
@records("ring_gap")
def ring_gap(protocol: Any, data: Any) -> dict[str, float]:
    """Mean |estimate_a − estimate_{a+1}| around the ring (any protocol)."""
    est = np.asarray(protocol.estimates(), dtype=float)
    return {"ring_gap": float(np.mean(np.abs(est - np.roll(est, -1))))}
