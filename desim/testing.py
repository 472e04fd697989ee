"""Testing protocols: the delivery-mode checker, data that are all zero, links you program.

`check_modes` runs a protocol in every delivery mode it declares (one message per instant,
windows, slot batches) on random networks and asserts that they give the same bytes: the
proof a plug-in author gives that a `WindowSafe` or `SlotBatched` protocol keeps its contract.
`Zeros` and `ScriptedLinks` let a test put a protocol on a network whose drops and delays are
exactly what the test says, and check what the protocol does with them.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.engine import RunOutput, Simulation
from desim.kernel.links import IdealLinks, LinkModel
from desim.kernel.protocol import DataSource, Protocol, SlotBatched, WindowSafe
from desim.kernel.randomness import Streams


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


#: The data of `check_modes` unless told otherwise: 8 agents in two classes.
CLASSES: tuple[str, dict] = ("classes", {"agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5})


@dataclass
class ModeRun:
    """One run of `check_modes`: the protocol after it, its `Simulation` and what it recorded."""

    protocol: Protocol
    simulation: Simulation
    output: RunOutput


def check_modes(
    protocol_cls: type[Protocol],
    params: Mapping[str, Any],
    networks: Sequence[Mapping[str, Any] | Callable[[], LinkModel]] = WINDOW_NETWORKS,
    data: tuple[str, Mapping[str, Any]] | Callable[[], DataSource] = CLASSES,
    topology: tuple[str, Mapping[str, Any]] | None = None,
    base: LinkModel | None = None,
    t_max: int = 120,
    seed: int = 3,
    checkpoints: np.ndarray | None = None,
    metrics: Sequence[str] = (),
    state: Sequence[str] = (),
) -> list[dict[str, ModeRun]]:
    """Run `protocol_cls(params)` in every delivery mode it declares on each of `networks` and
    assert that every mode gives the bytes of one message per instant.

    Modes: one message per instant (always, the reference), windows (a `WindowSafe` protocol)
    and slot batches (a `SlotBatched` protocol whose `batches_slots()` is true, on
    counter-based links). Compared: the recorded metrics (every slot unless `checkpoints`),
    every agent's squared error, the final estimates, the per-kind message and drop counters,
    and the protocol attributes named in `state` (dotted paths allowed).

    A network is a table of `desim.network_models.realistic` sub-tables over `base` (default
    ideal links), or a function that returns a fresh link model. `data` is a registered data
    model and its parameters (or a function returning a fresh data source); `topology` a
    registered topology and its parameters, for protocols that need a graph. `metrics` are
    names of registered metrics to record too. Returns, per network, each mode's `ModeRun`.
    """
    from desim.kernel.plugins import load_plugins

    load_plugins()
    run_in = functools.partial(
        _run_mode,
        protocol_cls,
        params,
        data=data,
        topology=topology,
        t_max=t_max,
        seed=seed,
        checkpoints=checkpoints,
        metrics=metrics,
    )
    return [
        _check_network(run_in, protocol_cls, network, base, state, f"network #{k}")
        for k, network in enumerate(networks)
    ]


def _check_network(
    run_in: Callable[..., ModeRun],
    protocol_cls: type[Protocol],
    network: Mapping[str, Any] | Callable[[], LinkModel],
    base: LinkModel | None,
    state: Sequence[str],
    where: str,
) -> dict[str, ModeRun]:
    """`check_modes` on one network: each mode's run, once compared with the reference."""
    from desim.network_models.realistic import realistic_links

    def once(windows: bool, batches: bool) -> ModeRun:
        links = network() if callable(network) else realistic_links(base or IdealLinks(), network)
        return run_in(links, windows=windows, batches=batches)

    runs = {"instants": once(False, False)}
    if issubclass(protocol_cls, WindowSafe):
        runs["windows"] = once(True, False)
        assert runs["windows"].simulation.network.windows, f"{where}: no windows"
    if issubclass(protocol_cls, SlotBatched):
        batched = once(True, True)
        if batched.simulation.slot_batches:
            runs["slot batches"] = batched
    for mode, run in list(runs.items())[1:]:
        _assert_same(runs["instants"], run, state, f"{where}, mode {mode!r}")
    return runs


def _run_mode(
    protocol_cls: type[Protocol],
    params: Mapping[str, Any],
    links: LinkModel,
    *,
    data: tuple[str, Mapping[str, Any]] | Callable[[], DataSource],
    topology: tuple[str, Mapping[str, Any]] | None,
    t_max: int,
    seed: int,
    checkpoints: np.ndarray | None,
    metrics: Sequence[str],
    windows: bool,
    batches: bool,
) -> ModeRun:
    """One run of `check_modes` in one mode."""
    from desim.kernel.params import build
    from desim.kernel.registry import DATA, METRICS, TOPOLOGIES

    proto = protocol_cls(build(protocol_cls.Params, dict(params), "params"))
    if callable(data):
        source = data()
    else:
        source = build(DATA.get(data[0]), dict(data[1]), "data").make(np.random.default_rng(seed))
    if topology is not None:
        graph = build(TOPOLOGIES.get(topology[0]), dict(topology[1]), "topology")
        source.public["graph"] = graph.build(source.n_agents, np.random.default_rng(seed + 1))
    sim = Simulation(
        proto,
        source,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1) if checkpoints is None else checkpoints,
        per_agent=True,
        metrics=[METRICS.get(name) for name in metrics],
        windows=windows,
        slot_batches=batches,
    )
    return ModeRun(proto, sim, sim.run())


def _assert_same(ref: ModeRun, run: ModeRun, state: Sequence[str], where: str) -> None:
    """Assert that `run` recorded and left the bytes `ref` did."""
    a, b = ref.output, run.output
    assert a.metrics.to_csv().encode() == b.metrics.to_csv().encode(), f"{where}: metrics differ"
    assert a.agents.to_csv().encode() == b.agents.to_csv().encode(), f"{where}: errors differ"
    pairs = [
        ("estimates", ref.protocol.estimates(), run.protocol.estimates()),
        ("messages sent", ref.simulation.network.sent, run.simulation.network.sent),
        ("messages dropped", ref.simulation.network.dropped, run.simulation.network.dropped),
    ]
    pairs += [
        (name, *(operator.attrgetter(name)(r.protocol) for r in (ref, run))) for name in state
    ]
    for name, x, y in pairs:
        np.testing.assert_array_equal(x, y, err_msg=f"{where}: {name} differ", strict=True)
