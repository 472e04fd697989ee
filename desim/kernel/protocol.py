"""The protocol interface: what every simulated protocol implements, and what it is given.

A protocol holds the state of the whole population in numpy arrays. The engine calls
`on_samples` once per slot with every agent's new sample, `on_deliver` with each batch of
messages due at one instant, and `estimates` when the recorder measures.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.randomness import Streams

if TYPE_CHECKING:
    from desim.kernel.links import LinkModel


class DataSource:
    """The agents' data: what they observe each slot, and the truth used only for scoring.

    Subclasses set `n_agents`, `means` (true mean of each agent), `classes` (class label of each
    agent) and `public` (facts every agent may use, e.g. the support half-width ``L`` and the
    data variance ``sigma2`` in the known-variance setting).
    """

    n_agents: int
    means: np.ndarray
    classes: np.ndarray
    public: dict[str, Any]
    #: Whether the means (or classes) move over a run; then `at` says them at each slot.
    drifts: ClassVar[bool] = False

    def at(self, t: int) -> DataSource:
        """The source as it is at slot `t`: its `means` and `classes` then (what metrics score).

        A source whose means never move is itself: the recorder then reads the arrays it was
        built with, at no cost.
        """
        return self

    def stops_before(self, t_max: int) -> bool:
        """Whether some agent's samples stop before slot `t_max`: its later samples are NaN,
        "no new sample" (a table's stream that runs out with ``exhausted = "stop"``); only a
        `StopsSampling` protocol can run then (default: never)."""
        return False

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        """`n_slots` consecutive slots of samples, shape (n_slots, n_agents).

        Slots are drawn in order: `sample(rng, a)` then `sample(rng, b)` gives the rows of
        `sample(rng, a + b)` (the engine sizes its blocks by memory).
        """
        raise NotImplementedError


@dataclass
class Context:
    """What a protocol is given at set-up.

    `send(kind, src, dst, payload, at=None, ids=None)` puts messages on the network (`at`:
    their exact send times, in a window; `ids`: numbers naming them, which make random delays
    fixed functions of the messages); `oracle_classes` is the true class of each agent and is
    set only for protocols whose `Protocol.uses_oracle` is true.
    `links` is the run's bound link model (its `probabilities(n, within, server_within)` are
    public: PriCER optimises for them, optionally for messages that must arrive within a
    deadline); `call_at(when, fn)` calls `fn()` at time `when`, after that instant's deliveries
    and before the recorder (deadlines, e.g. of `desim.kernel.server`). `adversary_truth` is
    the data source (its means and classes at the start), set only for a protocol that
    simulates adversaries (`has_adversaries`): what omniscient adversaries report from.
    `send_batch` (optional) sends a batch the protocol built, e.g. a `SenderBatch`.
    """

    n_agents: int
    t_max: int
    public: dict[str, Any]
    streams: Streams
    send: Callable[..., None]
    now: Callable[[], float]
    oracle_classes: np.ndarray | None = None
    links: Any = None
    call_at: Callable[[float, Callable[[], None]], None] | None = None
    adversary_truth: DataSource | None = None
    #: `send_batch(kind, batch)` sends a `desim.kernel.messages.SenderBatch` (each message
    #: carries its sender's row of a table, its columns made when read); None: use `send`.
    send_batch: Callable[..., None] | None = None


class Protocol:
    """Base class of protocols; subclasses are registered in `desim.kernel.registry.PROTOCOLS`.

    `Params` is the dataclass of the protocol's parameters (see `desim.kernel.params`), and
    `message_kinds` names every kind of message it sends. Beside the calls every protocol takes
    (`setup`, `on_samples`, `on_deliver`, `estimates`), a protocol may implement the hooks
    below (each has a default: nothing needed, nothing to check, nothing to report) and declare
    capabilities by its bases: `WindowSafe` (deliveries in windows), `SlotBatched` (several
    slots at once), `FollowsGraph` (a graph that changes during a run), `StopsSampling`
    (agents whose samples stop before the horizon). `docs/extending.md` describes them all.
    """

    Params: ClassVar[type]
    message_kinds: ClassVar[tuple[str, ...]] = ()
    #: Whether a scenario of this protocol must have a [topology] (the graph then arrives as
    #: ``ctx.public["graph"]``); a study without one is refused before any run.
    needs_topology: ClassVar[bool] = False
    #: The parts of a study beyond [data] this protocol reads: ``"network"`` (its messages cross
    #: the [network] links and sub-tables) and ``"topology"`` (the [topology] graph, itself or
    #: through its links). `desim validate` refuses a table no scenario reads and notes the
    #: scenarios that ignore one others read. Undeclared: both (never refused for them).
    reads: ClassVar[frozenset[str]] = frozenset({"network", "topology"})
    #: Tables read only under one parameter value, table -> (parameter, value): private-colme
    #: reads the [topology] with peers = "topology" (`desim validate`'s table checks).
    reads_when: ClassVar[dict[str, tuple[str, Any]]] = {}
    #: Parameters a scenario must set when the study has a table, table -> parameter:
    #: private-colme's `peers` beside a [topology]; `desim validate` refuses the scenario else.
    must_say: ClassVar[dict[str, str]] = {}
    #: Parameter values that are the behaviour from before the parameter existed, name ->
    #: value: a scenario stating one keeps the config hash, random-stream keys and study hash
    #: of one that does not (`desim.study.spec.hashing.without_legacy_values`).
    legacy_values: ClassVar[dict[str, Any]] = {}
    #: Whether `reads` is exact: a run's trajectory depends on the [network] and [topology]
    #: tables only through the ones `reads` names. That fails for a protocol drawing from the
    #: run's own streams (their key holds both tables: `Scenario.run_key`) unless the draws
    #: cannot change its output. Runs of a study that differ only in tables such a protocol does
    #: not read are then simulated once, each written as its own run would have been
    #: (`desim.study.sharing`); tests/desim/test_shared_runs.py checks every declaration.
    #: Undeclared: False (every run simulated).
    reads_exact: ClassVar[bool] = False
    #: Bytes of state per unit of what drives it, for the memory `desim validate` estimates
    #: before any run (`desim.study.spec.limits`): ``"agent"`` (M), ``"pair"`` (M²), ``"edge"``
    #: (directed edges of the graph), ``"coordinate"`` (M × data dimension d), ``"pair-coordinate"``
    #: (M² × d). Undeclared units cost nothing beyond what every run holds per agent.
    memory: ClassVar[dict[str, float]] = {}

    def __init__(self, params: Any) -> None:
        self.params = params

    @classmethod
    def memory_per_unit(cls, params: Any, t_max: int, sizes: Any = None) -> dict[str, float]:
        """Bytes of state per unit (the units of `memory`) of a run with `params` and horizon
        `t_max` at `sizes` (`desim.study.spec.limits.Sizes`, the largest the run reaches; None:
        unknown), for the estimate `desim validate` makes (default: the declared `memory`)."""
        return dict(cls.memory)

    @property
    def uses_oracle(self) -> bool:
        """Whether this protocol, with its parameters, sees the true classes
        (`Context.oracle_classes`): only the named oracle variants and baselines do."""
        return False

    @classmethod
    def check_setup(cls, params: Any, data: DataSource, links: LinkModel | None) -> None:
        """Raise `ValueError` (one line) when `params` cannot run on this population and these
        bound links, so that a study is refused before any run (default: every set-up runs)."""

    def setup(self, ctx: Context) -> None:
        """Allocate population state before slot 1."""
        self.ctx = ctx

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        """Take every agent's sample of slot `t` (shape (n_agents,)) and send what is due."""

    def on_deliver(self, batch: Batch) -> None:
        """React to the messages delivered at the current instant (or in a window)."""

    def estimates(self) -> np.ndarray:
        """Every agent's current estimate, shape (n_agents,)."""
        raise NotImplementedError

    def privacy_spend(self) -> Any:
        """The agents' releases so far as a `desim.models.privacy.accounting.Spend`, for the
        ``privacy`` ledger metric (None: no privacy mechanism, the metric records nothing)."""
        return None

    def neighbour_decisions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(a, b, b ∈ C_a) for every directed edge (a, b) of the graph, for the ``links``
        metric (None: the protocol estimates no neighbour classes)."""
        return None


class WindowSafe(Protocol, metaclass=ABCMeta):
    """A protocol that takes a window's messages in batches (exact delivery times).

    With links that are not ideal, the engine then hands it every message due in a window — an
    interval between two instants that matter (slot ticks, deadlines, measurements) — in
    time-ordered batches that carry each message's exact ``delivered_at``, followed by one
    `on_window_end` call (`desim.kernel.transports.Windows`). It must send the replies to a
    batch with ``send(..., at=batch.delivered_at[...])`` (the exact time of the message that
    caused them; those due inside the window come in a later batch of it), must not call
    `Context.call_at` from `on_deliver` (`Context.now()` is the window's start: use
    ``delivered_at``; the engine refuses it), and must end every window in the state that
    one-message-per-instant delivery (the same messages one instant at a time, in time order)
    would have left: bit for bit, which `desim.testing.check_modes` checks.
    """

    @abstractmethod
    def on_window_end(self) -> None:
        """Finish a window's deliveries (the state must be what one instant at a time leaves)."""


class SlotBatched(WindowSafe):
    """A window-safe protocol whose sends at a tick never depend on earlier deliveries, so
    that the engine may hand it several slots at once (`on_slots`) on counter-based links
    (`LinkModel.counter_based`); a batch ends at every measurement."""

    @abstractmethod
    def on_slots(self, t: int, samples: np.ndarray) -> None:
        """Slots t … t + k − 1 at once (samples: shape (k, n_agents)).

        Each slot's sends carry ``at`` = its time and ``ids`` (an unnamed send is refused).
        The windows up to the next call deliver messages due in any of these slots: a message
        delivered at time x must be handled with the state of slot ⌊x⌋ (e.g. sums kept per
        slot), and the state after the last window must be what `on_samples` slot by slot, one
        instant at a time, would leave: bit for bit. No `Context.call_at` is allowed.
        """

    def batches_slots(self) -> bool:
        """Whether this run may be handed several slots at once, decided from the parameters
        and asked once after `setup` (default: always)."""
        return True


class FollowsGraph(Protocol, metaclass=ABCMeta):
    """A protocol that follows a communication graph changing during a run ([topology]
    ``rewire`` or ``sequence``: `desim.topologies.dynamic`); a study that changes the graph of
    a protocol without this base is refused before any run.

    Before slot t's samples, when the graph changes at t, the engine puts the new graph in
    ``ctx.public["graph"]`` and calls `on_graph_change`; the protocol must say what happens to
    the state it holds per link on a new and on a dropped link.
    """

    @classmethod
    def check_graph_changes(cls, params: Any, links: Any) -> None:
        """Raise `ValueError` (one line) when a run with `params` over the (unbound) `links`
        cannot follow graph changes (default: every run can)."""

    @abstractmethod
    def on_graph_change(self, t: int, added: np.ndarray, dropped: np.ndarray) -> None:
        """The graph changes before slot t: `added` and `dropped` are its new and its lost
        links, (k, 2) arrays of agents (u, v), u < v; the new graph is ``ctx.public["graph"]``."""


class StopsSampling(Protocol, metaclass=ABCMeta):
    """A protocol whose agents may stop sampling before the horizon (`DataSource.stops_before`:
    a table whose streams run out with ``exhausted = "stop"``); a study that stops the samples
    of a protocol without this base is refused before any run.

    When some agent stops before the horizon, the engine calls `stop_sampling` once after
    `setup`; from then on a NaN sample means that agent has no new sample, and its estimate
    keeps to the samples it had.
    """

    @classmethod
    def check_stops(cls, params: Any) -> None:
        """Raise `ValueError` (one line) when a run with `params` cannot have agents stop
        sampling (default: every run can)."""

    @abstractmethod
    def stop_sampling(self) -> None:
        """Some agents stop sampling during this run: from now on a NaN sample is no sample."""
