"""A scenario: one fully specified run, as plain data, and the function that runs it.

A `Scenario` names its protocol, data model, link model and (optionally) topology and gives
their parameters as plain tables (what a study file holds); `resolve` validates every table
through the registries, and `run` builds the objects and simulates. Scenarios are picklable, so
workers receive them as is.

The communication graph, when a scenario has a topology, is drawn once per run from the
``topology`` stream (keyed by the data set-up, so every protocol of a study sees the same graph)
and handed to the protocol as ``ctx.public["graph"]`` (a `desim.topologies.graph.Graph`): the graph
is public, every agent knows its neighbours. Metric functions named in `metrics` are called by the
recorder at every checkpoint.
"""

from __future__ import annotations

import csv
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from desim.kernel.engine import RunOutput, Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.plugins import load_plugins
from desim.kernel.protocol import FollowsGraph
from desim.kernel.randomness import Streams, stable_key
from desim.kernel.recorder import log_checkpoints
from desim.kernel.registry import DATA, LINKS, METRICS, PROTOCOLS, TOPOLOGIES
from desim.models.forgetting import Forget
from desim.network_models.realistic import NETWORK_TABLES, realistic_links, unknown_table_message
from desim.topologies.dynamic import dynamics, rewire_stream, split
from desim.topologies.files import build_graph


@dataclass(frozen=True)
class Scenario:
    """One run: protocol, data, network and topology tables, horizon, seed and replicate.

    `data` must hold ``model`` (a data-model name), `network` ``links`` (a link-model name) and
    `topology`, when given, ``model`` (a topology name); the other keys are that component's
    parameters, except the sub-tables of `network` (``latency``, ``outages``, ``nodes``,
    ``stragglers``: `desim.network_models.realistic`). `metrics` names extra metrics
    (`desim.kernel.registry.METRICS`)
    to record.
    """

    protocol: str
    params: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=lambda: {"model": "classes"})
    network: dict[str, Any] = field(default_factory=lambda: {"links": "ideal"})
    t_max: int = 1000
    seed: int = 0
    replicate: int = 0
    checkpoints: int = 60
    per_agent: bool = False
    name: str = ""
    topology: dict[str, Any] | None = None
    metrics: tuple[str, ...] = ()
    folder: str = ""
    """The folder relative file paths (traces, graph files) are read from ('' = the working
    directory); not part of the scenario's identity, so a study folder can move."""

    def __post_init__(self) -> None:
        # numpy scalars (np.int64 from a sweep in Python) are numbers like any other; kept as
        # Python numbers, so hashes and random-stream keys do not depend on how they were made
        for name in ("t_max", "seed", "replicate", "checkpoints"):
            value = getattr(self, name)
            if isinstance(value, np.generic):
                object.__setattr__(self, name, value.item())
        for name in ("params", "data", "network"):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, _plain_numbers(value))

    @property
    def shared_key(self) -> int:
        """Key of the common-random-number streams: depends on the data set-up only."""
        return stable_key(self.data)

    @property
    def run_key(self) -> int:
        """Key of this scenario's own streams: depends on everything but seed and replicate."""
        parts = {
            "protocol": self.protocol,
            "params": self.params,
            "data": self.data,
            "network": self.network,
        }
        if self.topology is not None:  # absent keys keep older scenarios' streams unchanged
            # without how the graph changes: runs at every rewiring rate draw the same noise
            parts["topology"] = split(self.topology)[0]
        return stable_key(parts)

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form (for manifests and config hashes).

        `topology` and `metrics` appear only when set, so scenarios without them keep the
        config hashes they had before these fields existed (their results stay resumable).
        """
        out = asdict(self)
        del out["folder"]
        if self.topology is None:
            del out["topology"]
        if not self.metrics:
            del out["metrics"]
        else:
            out["metrics"] = list(self.metrics)
        return out


@dataclass(frozen=True)
class Resolved:
    """A scenario's validated components: protocol, data, links, topology, metric functions."""

    protocol_cls: type
    protocol_params: Any
    data_params: Any
    links: Any
    topology: Any = None
    metrics: tuple[Callable[..., dict[str, float]], ...] = ()
    dynamics: Any = None
    """How the graph changes during the run (`desim.topologies.dynamic.Dynamics`), or None."""


def resolve(s: Scenario) -> Resolved:
    """Validate every part of `s`; raises `ConfigError` naming the first bad field."""
    if not isinstance(s, Scenario):
        raise ConfigError(f"scenario = {s!r}: must be a desim.Scenario")
    load_plugins()
    if not isinstance(s.name, str):
        raise ConfigError(f"scenario: name = {s.name!r}: must be a string")
    label = f"scenario {s.name!r}" if s.name else "scenario"
    _check_fields(s, label)
    cls = PROTOCOLS.lookup(s.protocol, f"{label}: protocol")
    params = build(cls.Params, _plain_numbers(s.params), label)
    data = _plain_numbers(_with_folder(dict(s.data), s.folder, "data"))
    data_cls = DATA.lookup(data.pop("model", None), "data.model")
    data_params = build(data_cls, data, "data")
    forget = getattr(params, "forget", None)  # a forgetting rule (desim.models.forgetting)
    if isinstance(forget, Forget):
        try:
            forget.check_horizon(s.t_max)
        except ValueError as exc:
            raise ConfigError(f"{label}: {exc}") from None
    check_run = getattr(data_params, "check_run", None)  # limits given the horizon (drift)
    if check_run is not None:
        try:
            check_run(s.t_max, cls, params)
        except ValueError as exc:
            raise ConfigError(f"{label}: data: {exc}") from None
    try:  # trace and graph files are read here: their trouble is one line, never their content
        links = _resolve_links(_with_folder(s.network, s.folder, "network"))
        topology, dynamics = _resolve_topology(s, data_params)
        if dynamics is not None and not _reads_graph(cls, params):
            dynamics = None  # a protocol that reads no graph runs as on a static one
        _check_follows(label, cls, params, links, dynamics)
    except ConfigError:
        raise
    except (UnicodeError, OSError, csv.Error, ValueError, IndexError, KeyError) as exc:
        what = (
            "not UTF-8 text" if isinstance(exc, UnicodeError) else " ".join(str(exc).split())[:200]
        )
        raise ConfigError(f"{label}: a trace or graph file cannot be read: {what}") from None
    if topology is None and cls.needs_topology:
        raise ConfigError(
            f"{label}: protocol {s.protocol!r} needs a communication graph: add a [topology] "
            f"table (models: {', '.join(TOPOLOGIES)})"
        )
    if isinstance(s.metrics, str) or not isinstance(s.metrics, list | tuple):
        raise ConfigError(f"metrics = {s.metrics!r}: must be a list of metric names")
    metrics = tuple(METRICS.lookup(name, "metrics") for name in s.metrics)
    return Resolved(cls, params, data_params, links, topology, metrics, dynamics)


#: Longest horizon (and most checkpoints) a scenario may ask for.
MAX_T = 10**9


def _check_fields(s: Scenario, label: str) -> None:
    """Refuse a scenario field of the wrong type or range (before any of it is read)."""
    if not isinstance(s.per_agent, bool):
        raise ConfigError(f"{label}: per_agent = {s.per_agent!r}: must be true or false")
    for name, low, high in (
        ("t_max", 1, MAX_T),
        ("seed", 0, 2**63 - 1),
        ("replicate", 0, 2**31 - 1),
        ("checkpoints", 2, MAX_T),
    ):
        _check_int(label, name, getattr(s, name), low, high)
    for name, kind in (("params", dict), ("data", dict), ("network", dict)):
        if not isinstance(getattr(s, name), kind):
            raise ConfigError(f"{label}: {name} = {getattr(s, name)!r}: must be a table (dict)")
    if s.topology is not None and not isinstance(s.topology, dict):
        raise ConfigError(f"{label}: topology = {s.topology!r}: must be a table (dict) or None")
    if not isinstance(s.protocol, str):
        raise ConfigError(f"{label}: protocol = {s.protocol!r}: must be a protocol name")


def _check_int(label: str, name: str, value: Any, low: int, high: int) -> None:
    """Refuse a non-integer or out-of-range scenario field (numpy integers are integers)."""
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not ok or not low <= int(value) <= high:
        raise ConfigError(f"{label}: {name} = {value!r}: must be an integer in [{low}, {high}]")


def _plain_numbers(table: dict[str, Any]) -> dict[str, Any]:
    """`table` with numpy scalars (np.int64, np.float64) as Python numbers, lists kept."""
    out = {}
    for key, value in table.items():
        if isinstance(value, np.generic):
            value = value.item()
        elif isinstance(value, np.ndarray):
            value = value.tolist()
        out[key] = value
    return out


def _with_folder(table: dict[str, Any] | None, folder: str, what: str) -> dict[str, Any] | None:
    """`table` with its relative file paths (trace or data `file`, graph `path`) joined to
    `folder`."""
    if table is None or not folder:
        return table
    out = dict(table)
    if what == "data" and isinstance(out.get("file"), str):
        out["file"] = str(Path(folder) / out["file"])
    if what == "topology" and isinstance(out.get("path"), str):
        out["path"] = str(Path(folder) / out["path"])
    for sub in ("outages", "nodes"):
        inner = out.get(sub) if what == "network" else None
        if isinstance(inner, dict) and isinstance(inner.get("file"), str):
            out[sub] = {**inner, "file": str(Path(folder) / inner["file"])}
    return out


def _resolve_links(network: dict[str, Any]) -> Any:
    """The validated link model of a [network] table: the base model, wrapped in
    `desim.network_models.realistic.RealisticLinks` when the table has sub-tables (latency,
    outages, …)."""
    net = dict(network)
    tables = {name: net.pop(name) for name in NETWORK_TABLES if name in net}
    for key, value in net.items():
        if isinstance(value, dict):  # a sub-table that does not exist, not a bad parameter
            raise ConfigError(unknown_table_message(key))
    link_cls = LINKS.lookup(net.pop("links", "ideal"), "network.links")
    links = build(link_cls, net, "network")
    return realistic_links(links, tables) if tables else links


def _check_follows(label: str, cls: type, params: Any, links: Any, dynamics: Any) -> None:
    """Refuse a graph that changes during the run for a protocol that cannot follow it."""
    if dynamics is None:
        return
    if not issubclass(cls, FollowsGraph):
        raise ConfigError(
            f"{label}: [topology] rewire/sequence: protocol {cls.__name__} does not follow a "
            "graph that changes during a run; remove rewire and sequence"
        )
    try:
        cls.check_graph_changes(params, links)
    except ValueError as exc:
        raise ConfigError(f"{label}: [topology] rewire/sequence: {exc}") from None


def _reads_graph(cls: type, params: Any) -> bool:
    """Whether a protocol with `params` reads the [topology] (`Protocol.reads`, `reads_when`)."""
    when = cls.reads_when.get("topology")
    return "topology" in cls.reads or (when is not None and getattr(params, when[0]) == when[1])


def _resolve_topology(s: Scenario, data_params: Any) -> tuple[Any, Any]:
    """The validated topology of `s` (None without one), checked against the number of agents,
    and how it changes during the run (None: it does not)."""
    if s.topology is None:
        return None, None
    static, _ = split(s.topology)
    found = dynamics(s.topology, s.t_max)
    return _static_topology(s, static, data_params), found if found.changes else None


def _static_topology(s: Scenario, table: dict[str, Any], data_params: Any) -> Any:
    """The validated graph model of a [topology] table without its dynamic keys."""
    topo = _plain_numbers(_with_folder(table, s.folder, "topology"))
    if "model" not in topo:
        raise ConfigError(f"topology: model is required (allowed: {', '.join(TOPOLOGIES)})")
    topology = build(TOPOLOGIES.lookup(topo.pop("model"), "topology.model"), topo, "topology")
    agents = getattr(data_params, "agents", None)
    if agents is not None:
        try:
            topology.check(int(agents))
        except ValueError as exc:
            raise ConfigError(f"topology: {exc}") from None
    return topology


def check_setup(s: Scenario) -> None:
    """Build what a run of `s` builds before it simulates (its data, graph and bound links)
    and refuse, with a `ConfigError`, what does not fit the population: e.g. a list of 3 link
    probabilities for 10 nodes, a trace row naming agent 999, an unreadable trace file."""
    r = resolve(s)
    label = f"scenario {s.name!r}" if s.name else "scenario"
    streams = Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a disconnected graph is for the run to report
            data = r.data_params.make(streams.get("population"))
            if r.topology is not None:
                data.public["graph"] = build_graph(r.topology, data, streams.get("topology"))
            if r.dynamics is not None:
                r.dynamics.check(data.public["graph"], s.t_max, s.folder)
            links = r.links.bind(data.n_agents, data.public, streams)
            r.protocol_cls.check_setup(r.protocol_params, data, links)  # its own checks
            if hasattr(data, "check_run"):  # what a data file must give this run (classes, rows)
                data.check_run(r.protocol_cls(r.protocol_params), s.metrics, s.t_max)
    except (
        ValueError,
        IndexError,
        KeyError,
        TypeError,
        ArithmeticError,
        UnicodeError,
        OSError,
    ) as exc:
        raise ConfigError(f"{label}: {' '.join(str(exc).split())[:300]}") from None


def run(s: Scenario, streams: Streams | None = None) -> RunOutput:
    """Simulate scenario `s` and return its tidy records.

    `streams` replaces the scenario's own random streams (to compare link models on the same
    draws); by default they are keyed by `s`.
    """
    r = resolve(s)
    if streams is None:
        streams = Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    data = r.data_params.make(streams.get("population"))
    graphs = None
    if r.topology is not None:
        data.public["graph"] = build_graph(r.topology, data, streams.get("topology"))
        if r.dynamics is not None:
            graphs = r.dynamics.schedule(
                data.public["graph"], s.t_max, lambda: rewire_stream(streams), s.folder
            )
    if hasattr(data, "note_run"):  # what a data file's streams do over the run (exhausted)
        data.note_run(s.t_max)
    sim = Simulation(
        r.protocol_cls(r.protocol_params),
        data,
        s.t_max,
        streams,
        links=r.links,
        checkpoints=log_checkpoints(s.t_max, s.checkpoints),
        per_agent=s.per_agent,
        metrics=r.metrics,
        graphs=graphs,
    )
    return sim.run()
