"""The link interface: whether a link is up when a message is sent, and when the message arrives.

A link model is asked once per send call, with arrays of sources and destinations, and draws
availability from the run's ``links`` stream and delays from its ``latency`` stream. Time is in
slots and may be fractional. Before a run the engine calls `LinkModel.bind` with the number of
agents, the run's public facts (e.g. the communication graph) and the run's `Streams`, so a model
can fix its per-link probabilities and take the named streams of its parts; protocols read the
probabilities through `LinkModel.probabilities` (PriCER optimises its weights for them), which
can also require a message to arrive within a deadline. At delivery time the network asks
`LinkModel.receivable` whether each destination can still receive (node churn,
`desim.network_models.realistic`). This module holds the interface, the ideal link the papers
assume, the per-round probabilities PriCER optimises for (`Connectivity`) and the counter-based
uniforms random models draw from; the models themselves live in `desim.network_models`.

Address ``n_agents`` (one past the agents) is the parameter server (`desim.kernel.server`): links
to it are the uplinks τ_i, links from it are always up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from desim.kernel.registry import LINKS

if TYPE_CHECKING:
    from desim.kernel.randomness import Streams


@dataclass(frozen=True)
class Connectivity:
    """Per-slot link probabilities of n agents and a server (seed 004 §II-A).

    `p[i]` = p_i = P(τ_i = 1), node i reaches the server; `P[i, j]` = p_ij = P(τ_ij = 1), node i
    reaches node j (P_ii = 1); `E[i, j]` = E_{i,j} = E[τ_ij τ_ji], the reciprocity correlation
    (E_ii = 1).
    """

    p: np.ndarray
    P: np.ndarray
    E: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.p)
        for name, a, shape in (("p", self.p, (n,)), ("P", self.P, (n, n)), ("E", self.E, (n, n))):
            if np.shape(a) != shape:
                raise ValueError(f"{name} has shape {np.shape(a)}; expected {shape}")
            if not np.all((a >= 0) & (a <= 1)):
                raise ValueError(f"{name}: every probability must lie in [0, 1]")
        if not np.all(np.diag(self.P) == 1):
            raise ValueError("P: p_ii must be 1 (a node always reaches itself)")
        low = self.P * self.P.T
        high = np.minimum(self.P, self.P.T)
        tol = 1e-12
        if not (np.all(self.E >= low - tol) and np.all(self.E <= high + tol)):
            raise ValueError("E: E_{i,j} must lie in [p_ij p_ji, min(p_ij, p_ji)]")
        if not np.allclose(self.E, self.E.T, rtol=0, atol=tol):
            raise ValueError("E: E_{i,j} = E[τ_ij τ_ji] must be symmetric")

    @property
    def n(self) -> int:
        """Number of nodes n."""
        return len(self.p)

    @staticmethod
    def reliable(n: int) -> Connectivity:
        """Links that never fail: p = 1, P = 1, E = 1."""
        return Connectivity(np.ones(n), np.ones((n, n)), np.ones((n, n)))


def on_time(
    conn: Connectivity, node: np.ndarray | float, server: np.ndarray | float
) -> Connectivity:
    """`conn` for messages that must also arrive in time: P and E thinned by delivery chances.

    `node[i]` is the probability that a message of node i to another node arrives within the
    deadline, `server[i]` the same for its message to the server (one number: the same for
    all). Delays are independent of availability and of each other (also the two directions of
    a pair), so p_i ← p_i·server_i, p_ij ← p_ij·node_i and E_{i,j} ← E_{i,j}·node_i·node_j.
    """
    n = conn.n
    node = np.broadcast_to(np.asarray(node, dtype=float), (n,))
    server = np.broadcast_to(np.asarray(server, dtype=float), (n,))
    if np.all(node == 1) and np.all(server == 1):
        return conn
    P = conn.P * node[:, None]
    E = conn.E * node[:, None] * node[None, :]
    np.fill_diagonal(P, 1.0)
    np.fill_diagonal(E, 1.0)
    return Connectivity(conn.p * server, P, E)


def fixed_on_time(slots: float, deadline: float | None) -> float:
    """Whether a message delayed exactly `slots` arrives within `deadline` (None: no deadline)."""
    return 1.0 if deadline is None or slots <= deadline else 0.0


class LinkModel:
    """Availability and latency of every link; the default is always up with zero latency."""

    #: True when every link is always up with zero latency, so the network can skip both draws.
    ideal: bool = True
    #: The delivery delay in slots of every message (models with a fixed latency).
    slots: float = 0.0
    #: Delivery times are rounded up to a multiple of this many slots (0: exact times).
    resolution: float = 0.0
    #: True when `available`, `latency` and `receivable` depend on the time only through its
    #: slot ⌊t⌋ (and latency draws per message, not per call): the network may then ask once
    #: for all messages of a window (`desim.kernel.transports.Windows`).
    per_slot: bool = False
    #: True when `available`, `latency` and `receivable` also take an array t, one time per
    #: message, and answer as questions per distinct time in order would (latency draws in
    #: message order): the network may then ask once for all messages of a window.
    per_message: bool = False
    #: True when every random answer is a fixed function of what it is about: availability of
    #: a (link, time), receivability of a (node, time), the delay of a message given its id
    #: (`latency`'s ``ids``). The order and grouping of questions then do not matter, so the
    #: engine may hand a protocol several slots at once (`desim.kernel.engine`). False unless a
    #: model says so: one that draws from its streams in the order asked must not be batched.
    counter_based: bool = False

    def bind(self, n_agents: int, public: Mapping[str, Any], streams: Streams) -> LinkModel:
        """The link model of one run of `n_agents` agents (default: this one, unchanged).

        `public` holds the run's public facts (e.g. ``graph``), `streams` the run's named random
        streams, for models whose per-link state is random (each takes its own stream by name).
        """
        return self

    def probabilities(
        self,
        n_agents: int,
        within: float | None = None,
        server_within: float | None = None,
        width: int = 1,
    ) -> Connectivity:
        """The per-round probabilities p, P, E that a message sent at a round's start is up and
        arrives within `within` slots (to a node) or `server_within` slots (to the server).

        None means no deadline; `width` is the number of values a message carries (for
        size-proportional latency). Here links never fail, so only the fixed delay counts.
        """
        return on_time(
            Connectivity.reliable(n_agents),
            fixed_on_time(self.slots, within),
            fixed_on_time(self.slots, server_within),
        )

    def available(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray
    ) -> np.ndarray | bool:
        """Whether each link src→dst is up at time t (an array, or one bool for all)."""
        return True

    def latency(
        self,
        rng: np.random.Generator,
        t: float,
        src: np.ndarray,
        dst: np.ndarray,
        width: int = 0,
        ids: np.ndarray | None = None,
    ) -> np.ndarray | float:
        """Delivery delay in slots of each message sent at t carrying `width` numbers (an array,
        or one number for all).

        `ids` (uint64, one per message, unique in the run; None: not given) name the messages:
        with them a random delay is a fixed function of the message's id, not the next draw
        from `rng` (`counter_uniform`), so it does not depend on when or with which other
        messages it is asked for.
        """
        return self.slots

    def receivable(self, t: float, dst: np.ndarray) -> np.ndarray | bool:
        """Whether each destination can take delivery at time t (an array, or one bool for all)."""
        return True


@LINKS.register("ideal")
@dataclass(frozen=True)
class IdealLinks(LinkModel):
    """Every link is always up and delivers in the slot it was sent (the papers' model)."""

    per_slot = True
    per_message = True
    counter_based = True


# ---------------------------------------------------------------------------------------------
# Counter-based uniforms shared by every random link, availability and straggler model

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def counter_uniform(key: np.uint64, counter: np.ndarray) -> np.ndarray:
    """U(0, 1) draws that depend only on (key, counter): SplitMix64's output number `counter`.

    A counter-based draw lets every message on a link in a slot see the same τ without storing
    a realisation of all n² links per slot, and makes availability independent of how many
    sends a protocol makes or in which order.
    """
    z = np.array(counter, dtype=np.uint64)  # a copy, mixed in place (array arithmetic wraps)
    z *= _GAMMA
    z += key
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    u = z.astype(np.float64)
    u *= 2.0**-53
    return u
