"""Scripted components for testing protocols: data that are all zero, links you program.

They let a test (or a plugin author) put a protocol on a network whose drops and delays are
exactly what the test says, and check what the protocol does with them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from desim.kernel.links import LinkModel
from desim.kernel.protocol import DataSource


class Zeros(DataSource):
    """`n` agents in one class that observe 0 in every slot."""

    def __init__(self, n: int) -> None:
        self.n_agents, self.means = n, np.zeros(n)
        self.classes, self.public = np.zeros(n, dtype=np.int64), {}

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        return np.zeros((n_slots, self.n_agents))


class ScriptedLinks(LinkModel):
    """Links that drop where `down(rng, t, src, dst)` is True and delay by `delay(rng, t, n)`
    slots (both optional: never down, no delay); never ideal, so the network's general path
    runs even when nothing is dropped or delayed."""

    ideal = False  # (and not counter-based: the callbacks draw in the order they are asked)

    def __init__(
        self,
        down: Callable[..., np.ndarray] | None = None,
        delay: Callable[..., np.ndarray | float] | None = None,
    ) -> None:
        self.down, self.delay = down, delay

    def available(self, rng, t, src, dst):  # noqa: D102 (LinkModel's doc)
        return True if self.down is None else ~self.down(rng, t, src, dst)

    def latency(self, rng, t, src, dst, width=0, ids=None):  # noqa: D102 (LinkModel's doc)
        return 0.0 if self.delay is None else self.delay(rng, t, len(src))


#: Realistic network tables (`desim.network_models.realistic.realistic_links`) that exercise
#: every way a window asks its links, for tests that a window-safe protocol reproduces
#: one-message-per-instant delivery: slotted Markov outages and stragglers (one question per
#: window), continuous churn with heavy-tailed latency (one time per message), and a
#: quarter-slot delivery grid (many messages per instant, ties in send order).
WINDOW_NETWORKS: tuple[dict, ...] = (
    {
        "latency": {"model": "exponential", "mean": 3.0},
        "outages": {"model": "markov", "mean_up": 8.0, "mean_down": 3.0},
        "stragglers": {"fraction": 0.3, "slowdown": 3.0},
    },
    {
        "latency": {"model": "lognormal", "mean": 2.0, "cv": 3.0},
        "nodes": {
            "model": "churn",
            "session": {"model": "weibull", "shape": 0.7, "scale": 40.0},
            "offline": {"model": "exponential", "mean": 6.0},
        },
    },
    {
        "latency": {"model": "exponential", "mean": 1.5, "resolution": 0.25},
        "outages": {"model": "markov", "mean_up": 8.0, "mean_down": 3.0},
    },
)
