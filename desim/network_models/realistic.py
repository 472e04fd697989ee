"""Realistic links: a base link model combined with outages, node churn, stragglers and latency.

A study's ``[network]`` table names the base model (``links = "bernoulli"``, flat parameters as
always) and may add sub-tables, each drawing from its own named stream:

- ``[network.latency]`` (stream ``latency``): a per-message delay, `desim.network_models.latency`;
- ``[network.outages]`` (stream ``outages``): per-link availability, shared by both directions
  of an unordered pair and by a node's uplink and downlink to the server
  (`desim.network_models.availability`, scope "link");
- ``[network.nodes]`` (stream ``nodes``): per-agent availability, e.g. churn; the server is
  always up (scope "node");
- ``[network.stragglers]`` (stream ``stragglers``): per-agent speed factors,
  `desim.network_models.stragglers`.

With any of them `desim.study.scenario.resolve` wraps the base model in `RealisticLinks`; without,
the base model is used untouched. Semantics of a message src→dst sent at time t:

- it is dropped at send time if the base link is down (base stream ``links``), the link's
  outage state is down, or src or dst is down (availability asked at the exact t: Bernoulli
  and Markov models read the slot ⌊t⌋, churn and traces are continuous);
- otherwise it is delivered at t + base delay + straggler delay of src + latency sample,
  unless dst is down at that delivery time (churned agents neither send nor receive: dropped at
  delivery, counted per kind like every drop). A message to or from oneself never meets an
  outage (p_ii = 1), but does need its node up.

Agents that are down still observe their data: availability models connectivity, not sensing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from desim.kernel.links import Connectivity, LinkModel, on_time
from desim.kernel.params import ConfigError, build, field_names, unknown_key_message
from desim.kernel.registry import AVAILABILITY
from desim.network_models.availability import (
    Availability,
    BoundAvailability,
    Trace,
    availability,
    link_entity,
    read_trace,
)
from desim.network_models.latency import Latency, latency_keys, latency_model
from desim.network_models.stragglers import BoundStragglers, Stragglers, stragglers_keys

if TYPE_CHECKING:
    from desim.kernel.randomness import Streams

#: The sub-tables a [network] table may have, in the order they are described.
NETWORK_TABLES = ("latency", "outages", "nodes", "stragglers")


@dataclass(frozen=True)
class RealisticLinks(LinkModel):
    """A base link model with optional latency, link outages, node availability and stragglers
    (unbound: `bind` makes the model of one run)."""

    base: LinkModel
    latency: Latency | None = None
    outages: Availability | None = None
    nodes: Availability | None = None
    stragglers: Stragglers | None = None
    ideal = False

    def bind(self, n_agents: int, public: Mapping[str, Any], streams: Streams) -> BoundRealistic:
        n_addresses = n_agents + 1  # the agents and the server
        return BoundRealistic(
            n_agents,
            self.base.bind(n_agents, public, streams),
            self.latency,
            None
            if self.outages is None
            else self.outages.bind(n_addresses, "link", streams.get("outages")),
            None
            if self.nodes is None
            else self.nodes.bind(n_addresses, "node", streams.get("nodes")),
            None
            if self.stragglers is None
            else self.stragglers.bind(n_agents, streams.get("stragglers")),
        )

    def probabilities(
        self,
        n_agents: int,
        within: float | None = None,
        server_within: float | None = None,
        width: int = 1,
    ) -> Connectivity:
        raise RuntimeError("RealisticLinks must be bound to a run first (LinkModel.bind)")

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray:
        raise RuntimeError("RealisticLinks must be bound to a run first (LinkModel.bind)")


class BoundRealistic(LinkModel):
    """The realistic links of one run of `n_agents` agents (address n_agents: the server)."""

    ideal = False

    def __init__(
        self,
        n_agents: int,
        base: LinkModel,
        latency: Latency | None,
        outages: BoundAvailability | None,
        nodes: BoundAvailability | None,
        stragglers: BoundStragglers | None,
    ) -> None:
        self.n_agents = n_agents
        self.base = base
        self.latency_model = latency
        self.outages = outages
        self.nodes = nodes
        self.stragglers = stragglers
        self._latency_key: np.uint64 | None = None  # of delays drawn by message id
        self.slots = base.slots
        # every availability and straggler model is counter-based (`availability`); latency is
        # too for named messages
        self.counter_based = base.counter_based
        self.resolution = latency.resolution if latency is not None else 0.0
        # stragglers read the slot ⌊t⌋, latency models draw per message whatever t is
        self.per_slot = base.per_slot and all(
            part.per_slot for part in (outages, nodes) if part is not None
        )
        self.per_message = base.per_message and all(
            part.per_message for part in (outages, nodes, stragglers, latency) if part is not None
        )

    def _nodes_up(self, t: float | np.ndarray, who: np.ndarray) -> np.ndarray:
        """Whether each address is up at t (or t[k]; the server always is)."""
        agent = who < self.n_agents
        if agent.all():
            return np.asarray(self.nodes.up(t, who), dtype=bool)
        up = np.ones(len(who), dtype=bool)
        up[agent] = self.nodes.up(t[agent] if np.ndim(t) else t, who[agent])
        return up

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray | bool:
        up = self.base.available(rng, t, src, dst)
        if self.outages is not None:
            link = self.outages.up(t, link_entity(src, dst, self.n_agents + 1)) | (src == dst)
            up = link if up is True else up & link
        if self.nodes is not None:
            ends = self._nodes_up(
                np.concatenate([t, t]) if np.ndim(t) else t, np.concatenate([src, dst])
            )
            both = ends[: len(src)] & ends[len(src) :]
            up = both if up is True else up & both
        return up

    def latency(
        self,
        rng: np.random.Generator,
        t: float,
        src: np.ndarray,
        dst: np.ndarray,
        width: int = 0,
        ids: np.ndarray | None = None,
    ) -> np.ndarray | float:
        delay = self.base.latency(rng, t, src, dst, width)
        if self.stragglers is not None:
            delay = delay + self.stragglers.delay(t, src)
        if self.latency_model is not None:
            if ids is None:
                delay = delay + self.latency_model.sample(rng, t, src, dst, width)
            else:
                if self._latency_key is None:  # the run's latency stream fixes the key once
                    self._latency_key = np.uint64(rng.integers(0, 2**63))
                delay = delay + self.latency_model.sample_keyed(
                    self._latency_key, ids, t, src, dst, width
                )
        return delay

    def receivable(self, t: float, dst: np.ndarray) -> np.ndarray | bool:
        return True if self.nodes is None else self._nodes_up(t, dst)

    def probabilities(
        self,
        n_agents: int,
        within: float | None = None,
        server_within: float | None = None,
        width: int = 1,
    ) -> Connectivity:
        """p, P, E of a message sent at a round's start: up, and in time (None: no deadline).

        Base probabilities times the stationary availability a_ij of the pair's outage state and q_i
        q_j of the two nodes (the server: q = 1), times the chance that the base delay, the sender's
        straggler delay and the latency (of a message of `width` values) together are at most the
        deadline (`desim.network_models.stragglers.BoundStragglers.on_time`). Both directions of a
        pair share the outage and node states, so E_{i,j} ← E_{i,j}·a_ij·q_i q_j·F_i F_j.
        Destination availability is counted once, at sending: exact for zero latency and otherwise
        optimistic by the chance that dst churns while the message travels. O(n²) work and memory:
        meant for PriCER-sized networks.
        """
        conn = self.base.probabilities(n_agents)
        n = n_agents
        scale = np.ones((n + 1, n + 1))
        if self.outages is not None:
            i, j = np.indices((n + 1, n + 1)).reshape(2, -1)
            scale = np.asarray(
                self.outages.stationary(link_entity(i, j, n + 1)), dtype=float
            ).reshape(n + 1, n + 1)
        if self.nodes is not None:
            q = np.append(np.asarray(self.nodes.stationary(np.arange(n)), dtype=float), 1.0)
            scale = scale * q[:, None] * q[None, :]
        P = conn.P * scale[:n, :n]
        E = conn.E * scale[:n, :n]
        np.fill_diagonal(P, 1.0)
        np.fill_diagonal(E, 1.0)
        up = Connectivity(conn.p * scale[:n, n], P, E)
        return on_time(up, self._on_time(within, width), self._on_time(server_within, width))

    def _on_time(self, deadline: float | None, width: int) -> np.ndarray | float:
        """P(base delay + straggler delay + latency ≤ deadline) of each agent's messages."""
        if deadline is None:
            return 1.0
        slack = deadline - self.slots
        model = self.latency_model

        def cdf(x: np.ndarray) -> np.ndarray:
            if model is None:
                return (np.asarray(x) >= 0).astype(float)
            return model.cdf(x, width)

        if self.stragglers is None:
            return float(cdf(np.asarray(slack)))
        return self.stragglers.on_time(slack, cdf)


# ---------------------------------------------------------------------------------------------
# reading the [network] sub-tables


def _model_table(table: Any, where: str) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} = {table!r}: must be a table, written {where}")
    return dict(table)


def _availability(table: Any, where: str, scope: Literal["link", "node"]) -> Availability:
    """The availability model of an [network.outages] (scope "link") or [network.nodes] (scope
    "node") table; a trace file is read now, so a bad one stops the study before any run."""
    model = availability(_model_table(table, where), where)
    if isinstance(model, Trace):
        read_trace(model.path(), scope)
    return model


def realistic_links(base: LinkModel, tables: Mapping[str, Any]) -> RealisticLinks:
    """`base` with the validated [network] sub-tables `tables` (names from NETWORK_TABLES)."""
    parts: dict[str, Any] = {}
    for name, table in tables.items():
        where = f"[network.{name}]"
        if name == "latency":
            parts[name] = latency_model(_model_table(table, where), where)
        elif name == "outages":
            parts[name] = _availability(table, where, "link")
        elif name == "nodes":
            parts[name] = _availability(table, where, "node")
        elif name == "stragglers":
            parts[name] = build(Stragglers, _model_table(table, where), where)
        else:
            raise ConfigError(unknown_table_message(name))
    return RealisticLinks(base, **parts)


def unknown_table_message(name: str) -> str:
    """One line for a [network] sub-table that does not exist."""
    return unknown_key_message("[network]", name, list(NETWORK_TABLES)).replace(
        "unknown key", "unknown sub-table", 1
    )


def table_keys(name: str, table: Mapping[str, Any]) -> list[str]:
    """The keys sub-table `name` accepts given its model (for grid paths): model + params."""
    if name == "latency":
        return latency_keys(table)
    if name == "stragglers":
        return stragglers_keys(table)
    model = table.get("model")
    if model not in AVAILABILITY:
        return ["model"]
    return ["model", *field_names(AVAILABILITY.get(model))]
