"""A scenario: one fully specified run, as plain data, and the function that runs it.

A `Scenario` names its protocol, data model and link model and gives their parameters as plain
tables (what a study file holds); `resolve` validates every table through the registries, and
`run` builds the objects and simulates. Scenarios are picklable, so workers receive them as is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from desim.engine import RunOutput, Simulation
from desim.params import ConfigError, build
from desim.plugins import load_plugins
from desim.randomness import Streams, stable_key
from desim.recorder import log_checkpoints
from desim.registry import DATA, LINKS, PROTOCOLS


@dataclass(frozen=True)
class Scenario:
    """One run: protocol, data and network tables, horizon, seed and replicate.

    `data` must hold ``model`` (a data-model name) and `network` ``links`` (a link-model name);
    the other keys are that component's parameters.
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

    @property
    def shared_key(self) -> int:
        """Key of the common-random-number streams: depends on the data set-up only."""
        return stable_key(self.data)

    @property
    def run_key(self) -> int:
        """Key of this scenario's own streams: depends on everything but seed and replicate."""
        return stable_key(
            {"protocol": self.protocol, "params": self.params, "data": self.data,
             "network": self.network}
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain-data form (for manifests and config hashes)."""
        return asdict(self)


@dataclass(frozen=True)
class Resolved:
    """A scenario's validated components: protocol class and params, data params, link model."""

    protocol_cls: type
    protocol_params: Any
    data_params: Any
    links: Any


def resolve(s: Scenario) -> Resolved:
    """Validate every part of `s`; raises `ConfigError` naming the first bad field."""
    load_plugins()
    label = f"scenario {s.name!r}" if s.name else "scenario"
    if isinstance(s.t_max, bool) or not isinstance(s.t_max, int) or s.t_max < 1:
        raise ConfigError(f"{label}: t_max = {s.t_max!r}: must be an integer ≥ 1")
    cls = PROTOCOLS.lookup(s.protocol, f"{label}: protocol")
    params = build(cls.Params, s.params, label)
    data = dict(s.data)
    data_cls = DATA.lookup(data.pop("model", None), "data.model")
    data_params = build(data_cls, data, "data")
    net = dict(s.network)
    link_cls = LINKS.lookup(net.pop("links", "ideal"), "network.links")
    links = build(link_cls, net, "network")
    return Resolved(cls, params, data_params, links)


def run(s: Scenario) -> RunOutput:
    """Simulate scenario `s` and return its tidy records."""
    r = resolve(s)
    streams = Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    data = r.data_params.make(streams.get("population"))
    sim = Simulation(
        r.protocol_cls(r.protocol_params),
        data,
        s.t_max,
        streams,
        links=r.links,
        checkpoints=log_checkpoints(s.t_max, s.checkpoints),
        per_agent=s.per_agent,
    )
    return sim.run()
