"""What the C-ColME family's tests share: data on a given graph, a by-hand driver with ideal
links, protocols built from parameters, regular graphs, and a schedule of graph switches."""

from __future__ import annotations

import math

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.params import build
from desim.kernel.protocol import Context, DataSource, Protocol
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS, TOPOLOGIES
from desim.topologies.dynamic import difference
from desim.topologies.graph import Graph


class GraphData(DataSource):
    """Gaussian (or uniform) data on a given graph, one mean per class."""

    def __init__(self, graph: Graph, classes, class_means, sigma=1.0, distribution="gaussian"):
        self.n_agents = graph.n
        self.classes = np.asarray(classes)
        self.means = np.asarray(class_means, dtype=float)[self.classes]
        self.sigma = sigma
        self.distribution = distribution
        half = sigma * math.sqrt(3) if distribution == "uniform" else 3 * sigma
        self.public = {
            "L": half,
            "sigma2": np.full(graph.n, sigma**2),
            "distribution": distribution,
            "graph": graph,
        }

    def sample(self, rng, n_slots):
        """`n_slots` slots of samples, one row per slot."""
        shape = (n_slots, self.n_agents)
        if self.distribution == "uniform":
            h = self.public["L"]
            return self.means + rng.uniform(-h, h, shape)
        return self.means + self.sigma * rng.standard_normal(shape)


class Driver:
    """Runs a protocol by hand: zero-latency delivery of everything it sends, all recorded;
    deadlines run in order once everything sent before them is delivered (as in the engine)."""

    def __init__(self, proto: Protocol, data: GraphData, seed: int = 0) -> None:
        self.proto, self.sent = proto, []
        self.queue: list[Batch] = []
        self.deadlines: list = []
        ctx = Context(
            data.n_agents,
            100,
            dict(data.public),
            Streams(seed, 0, 1, 2),
            self.send,
            lambda: 0.0,
            data.classes if proto.uses_oracle else None,
            call_at=lambda when, fn: self.deadlines.append(fn),
        )
        proto.setup(ctx)

    def send(self, kind, src, dst, payload=None):
        """Record a send and queue it for delivery, as one batch."""
        self.sent.append((kind, np.array(src), np.array(dst), np.array(payload)))
        payload = payload[:, None] if payload.ndim == 1 else payload  # as the network does
        code = self.proto.message_kinds.index(kind)
        n = len(src)
        self.queue.append(
            Batch(src, dst, np.full(n, code), payload, np.zeros(n), self.proto.message_kinds, code)
        )

    def slot(self, t: int, samples: np.ndarray) -> np.ndarray:
        """Slot t: the samples, every delivery and deadline; returns the estimates."""
        self.proto.on_samples(t, samples)
        while self.queue or self.deadlines:
            while self.queue:
                self.proto.on_deliver(self.queue.pop(0))
            if self.deadlines:
                self.deadlines.pop(0)()
        return self.proto.estimates()


def protocol(name: str = "private-c-colme", cls=None, **params):
    """The protocol registered as `name` (or class `cls`) with `params`."""
    cls = cls or PROTOCOLS.get(name)
    return cls(build(cls.Params, params, "test"))


def regular(n: int, r: int, seed: int = 0) -> Graph:
    """A random r-regular graph on n agents."""
    return TOPOLOGIES.get("regular")(degree=r).make(n, np.random.default_rng(seed))


class Switches:
    """A schedule that switches, before each slot of `at`, to the next of `graphs`."""

    def __init__(self, first: Graph, graphs: list[Graph], at: list[int]) -> None:
        self.times = np.array(at)
        self._changes, old = [], first
        for g in graphs:
            self._changes.append((g, *difference(old, g)))
            old = g

    def change(self, t: int):
        """The switch due at t."""
        return self._changes[list(self.times).index(t)]
