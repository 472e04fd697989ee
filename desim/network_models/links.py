"""Link models beyond the ideal one: a fixed delay, and the Bernoulli links of seed 004.

Both implement `desim.kernel.links.LinkModel`. `BernoulliLinks` (registered as ``bernoulli``) is
what a study names; binding it to a run gives `IntermittentLinks`, one realisation of τ per slot
and link drawn from counter-based uniforms, so a link's history does not depend on how many
messages a protocol sends or in which order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from desim.kernel.links import Connectivity, LinkModel, counter_uniform, fixed_on_time, on_time
from desim.kernel.params import param
from desim.kernel.registry import LINKS

if TYPE_CHECKING:
    from desim.kernel.randomness import Streams

#: Counter streams of one slot: the server uplink, a pair's shared and coupling draws, a link's own.
_UPLINK, _SHARED, _COUPLE, _OWN = 0, 1, 2, 3


def reciprocity_matrix(P: np.ndarray, rho: float) -> np.ndarray:
    """E_{i,j} = p_ij p_ji + ρ (min(p_ij, p_ji) − p_ij p_ji): ρ = 0 independent, 1 fully reciprocal.

    These are the correlations `IntermittentLinks` realises; E_ii = 1.
    """
    if not 0 <= rho <= 1:
        raise ValueError(f"reciprocity = {rho!r}: must lie in [0, 1]")
    indep = P * P.T
    E = indep + rho * (np.minimum(P, P.T) - indep)
    np.fill_diagonal(E, 1.0)
    return E


@LINKS.register("fixed-latency")
@dataclass(frozen=True)
class FixedLatency(LinkModel):
    """Every link is always up and delivers exactly `slots` slots after sending."""

    slots: float = param(1.0, "delivery delay of every message, in slots", ge=0)
    ideal = False
    per_slot = True
    per_message = True
    counter_based = True


class IntermittentLinks(LinkModel):
    """Bernoulli links of one run: τ_i ~ Ber(p_i) to the server, τ_ij ~ Ber(p_ij) between nodes.

    One realisation per slot ⌊t⌋ and link, independent across slots and across unordered pairs;
    τ_ij and τ_ji are coupled so that E[τ_ij τ_ji] = E_{i,j} of `reciprocity_matrix`: with
    probability ρ both read one shared uniform (E = min(p_ij, p_ji)), otherwise each its own
    (E = p_ij p_ji). Address n is the server; server → node links are always up.
    """

    ideal = False
    per_slot = True
    per_message = True
    counter_based = True  # τ of a (link, slot) is `counter_uniform` of them

    def __init__(self, conn: Connectivity, reciprocity: float, slots: float = 0.0) -> None:
        self.conn = conn
        self.reciprocity = float(reciprocity)
        self.slots = float(slots)
        n = conn.n
        self._stride = np.uint64(n + 1)
        # node probabilities with a server row and column: P[i, n] = p_i, P[n, i] = 1
        full = np.ones((n + 1, n + 1))
        full[:n, :n] = conn.P
        full[:n, n] = conn.p
        self._P = full
        self._key: np.uint64 | None = None

    def probabilities(
        self,
        n_agents: int,
        within: float | None = None,
        server_within: float | None = None,
        width: int = 1,
    ) -> Connectivity:
        if n_agents != self.conn.n:
            raise ValueError(f"links were bound for {self.conn.n} agents, not {n_agents}")
        return on_time(
            self.conn, fixed_on_time(self.slots, within), fixed_on_time(self.slots, server_within)
        )

    def realise(
        self, rng: np.random.Generator, slot: int | np.ndarray, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray:
        """τ of each link src→dst in slot `slot` (one, or one per link): the same inputs, the
        same τ."""
        if self._key is None:  # the run's links stream fixes the key once
            self._key = np.uint64(rng.integers(0, 2**63))
        n = self.conn.n
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        stride = self._stride
        base = np.asarray(slot, dtype=np.uint64) * np.uint64(4)

        def u(stream: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
            c = ((base + np.uint64(stream)) * stride + a.astype(np.uint64)) * stride
            return counter_uniform(self._key, c + b.astype(np.uint64))

        uplink = dst == n
        if uplink.all():  # server links only (e.g. relays): the pair draws are not needed
            return u(_UPLINK, src, np.zeros_like(src)) < self._P[src, dst]
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        shared = u(_SHARED, lo, hi)
        if self.reciprocity == 1:  # coupled draws are < 1: every link reads the shared one
            own = shared
        else:
            own = u(_OWN, src, dst)
            if self.reciprocity > 0:
                coupled = u(_COUPLE, lo, hi) < self.reciprocity
                own = np.where(coupled, shared, own)
        draw = np.where(uplink, u(_UPLINK, src, np.zeros_like(src)), own) if uplink.any() else own
        return draw < self._P[src, dst]

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray:
        return self.realise(
            rng, np.floor(t).astype(np.int64) if np.ndim(t) else math.floor(t), src, dst
        )


@LINKS.register("bernoulli")
@dataclass(frozen=True)
class BernoulliLinks(LinkModel):
    """Intermittent links of seed 004: τ_i ~ Ber(p_i) to the server, τ_ij ~ Ber(p_ij) between nodes.

    p comes from `p_server` (one number or one per node) or, with `good` set, from the good/bad
    split of Fig. 4. P comes from `p_nodes` when given, else p_ij = `p_link` on every link of the
    study's [topology] graph (every pair without one: the paper's Erdős–Rényi set-up),
    times exp(−distance/`decay`) when `decay` is set and the graph has positions; unlinked pairs
    have p_ij = 0. `reciprocity` ρ sets E_{i,j} between p_ij p_ji (0) and min(p_ij, p_ji) (1).
    """

    reads_topology = True  # p_ij follows the [topology] graph: every protocol sending reads it

    p_server: float | list[float] = param(
        1.0,
        "p_i: probability that node i reaches the server in a slot (one for all, or a list)",
        ge=0,
        le=1,
    )
    good: int | None = param(
        None, "if set: nodes 0…good−1 reach the server with p_good, the others with p_bad", ge=0
    )
    p_good: float = param(0.9, "p_i of a good node (with `good`)", ge=0, le=1)
    p_bad: float = param(0.2, "p_i of a bad node (with `good`)", ge=0, le=1)
    p_link: float = param(
        1.0, "p_ij of every link of the [topology] graph (of every pair without one)", ge=0, le=1
    )
    decay: float | None = param(
        None,
        "geometric graphs: p_ij = p_link·exp(−distance/decay) (distance in the unit square)",
        gt=0,
    )
    p_nodes: list[list[float]] | None = param(
        None, "explicit P as rows (n × n, p_ii is 1); overrides p_link and the graph", ge=0, le=1
    )
    reciprocity: float = param(
        1.0,
        "ρ: E[τ_ij τ_ji] = p_ij p_ji + ρ(min(p_ij, p_ji) − p_ij p_ji); 0 independent",
        ge=0,
        le=1,
    )
    slots: float = param(0.0, "delivery delay of every message, in slots", ge=0)
    ideal = False
    per_slot = True

    def __post_init__(self) -> None:
        if self.p_nodes is not None:
            n = len(self.p_nodes)
            if any(len(row) != n for row in self.p_nodes):
                raise ValueError("p_nodes must be a square matrix (n rows of n numbers)")
            if not all(0 <= x <= 1 for row in self.p_nodes for x in row):
                raise ValueError("p_nodes: every probability must lie in [0, 1]")

    def server_probabilities(self, n: int) -> np.ndarray:
        """p of the run's n nodes."""
        if self.good is not None:
            if self.good > n:
                raise ValueError(f"good = {self.good}: more good nodes than the {n} nodes")
            return np.where(np.arange(n) < self.good, self.p_good, self.p_bad)
        if isinstance(self.p_server, list):
            if len(self.p_server) != n:
                raise ValueError(
                    f"p_server has {len(self.p_server)} values; the data have {n} nodes"
                )
            return np.asarray(self.p_server, dtype=float)
        return np.full(n, float(self.p_server))

    def node_probabilities(self, n: int, graph: Any = None) -> np.ndarray:
        """P of the run's n nodes given the communication graph (None: every pair linked)."""
        if self.p_nodes is not None:
            P = np.asarray(self.p_nodes, dtype=float)
            if P.shape != (n, n):
                raise ValueError(
                    f"p_nodes is {P.shape[0]}×{P.shape[1] if P.ndim > 1 else 0}; "
                    f"the data have {n} nodes"
                )
        elif graph is None:
            P = np.full((n, n), self.p_link)
        else:
            src, dst = np.asarray(graph.src), np.asarray(graph.dst)
            P = np.zeros((n, n))
            weight = np.full(len(src), self.p_link)
            positions = getattr(graph, "positions", None)
            if self.decay is not None and positions is not None:
                dist = np.linalg.norm(positions[src] - positions[dst], axis=1)
                weight = weight * np.exp(-dist / self.decay)
            P[src, dst] = weight
        np.fill_diagonal(P, 1.0)
        return P

    def connectivity(self, n: int, graph: Any = None) -> Connectivity:
        """p, P and E of the run's n nodes."""
        P = self.node_probabilities(n, graph)
        E = reciprocity_matrix(P, self.reciprocity)
        return Connectivity(self.server_probabilities(n), P, E)

    def bind(self, n_agents: int, public: Mapping[str, Any], streams: Streams) -> IntermittentLinks:
        conn = self.connectivity(n_agents, public.get("graph"))
        return IntermittentLinks(conn, self.reciprocity, self.slots)

    def probabilities(
        self,
        n_agents: int,
        within: float | None = None,
        server_within: float | None = None,
        width: int = 1,
    ) -> Connectivity:
        return on_time(
            self.connectivity(n_agents),
            fixed_on_time(self.slots, within),
            fixed_on_time(self.slots, server_within),
        )

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray:
        raise RuntimeError("BernoulliLinks must be bound to a run first (LinkModel.bind)")
