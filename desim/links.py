"""Link models: whether a link is up when a message is sent, and when the message arrives.

A link model is asked once per send call, with arrays of sources and destinations, and draws
from the run's ``links`` stream. Time is in slots and may be fractional.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from desim.params import param
from desim.registry import LINKS


class LinkModel:
    """Availability and latency of every link; the default is always up with zero latency."""

    #: True when every link is always up with zero latency, so the network can skip both draws.
    ideal: bool = True

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray | bool:
        """Whether each link src→dst is up at time t (an array, or one bool for all)."""
        return True

    def latency(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray | float:
        """Delivery delay in slots of each message sent at t (an array, or one number for all)."""
        return 0.0


@LINKS.register("ideal")
@dataclass(frozen=True)
class IdealLinks(LinkModel):
    """Every link is always up and delivers in the slot it was sent (the papers' model)."""


@LINKS.register("fixed-latency")
@dataclass(frozen=True)
class FixedLatency(LinkModel):
    """Every link is always up and delivers exactly `slots` slots after sending."""

    slots: float = param(1.0, "delivery delay of every message, in slots", ge=0)
    ideal = False

    def latency(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> float:
        return self.slots
