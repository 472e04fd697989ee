"""The protocol interface: what every simulated protocol implements, and what it is given.

A protocol holds the state of the whole population in numpy arrays. The engine calls
`on_samples` once per slot with every agent's new sample, `on_deliver` with each batch of
messages due at one instant, and `estimates` when the recorder measures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.randomness import Streams


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
    set only for protocols that declare ``uses_oracle = True``.
    `links` is the run's bound link model (its `probabilities(n, within, server_within)` are
    public: PriCER optimises for them, optionally for messages that must arrive within a
    deadline); `call_at(when, fn)` calls `fn()` at time `when`, after that instant's deliveries
    and before the recorder (deadlines, e.g. of `desim.kernel.server`).
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


class Protocol:
    """Base class of protocols; subclasses are registered in `desim.kernel.registry.PROTOCOLS`.

    `Params` is the dataclass of the protocol's parameters (see `desim.kernel.params`), and
    `message_kinds` names every kind of message it sends.

    Window batching (exact delivery times, `desim.kernel.network`): a protocol that declares
    `window_safe` receives every message due in a window — an interval between two instants
    that matter (slot ticks, deadlines, measurements) — in time-ordered batches that carry each
    message's exact ``delivered_at``, followed by one `on_window_end` call. It must send the
    replies to a batch with ``send(..., at=batch.delivered_at[...])`` (the exact time of the
    message that caused them; those due inside the window come in a later batch of it), must
    not call `Context.call_at` from `on_deliver` (`Context.now()` is the window's start: use
    ``delivered_at``), and must end every window in the state that
    one-message-per-instant delivery (the same messages one instant at a time, in time order)
    would have left: bit for bit, which the kernel's tests check.
    """

    Params: ClassVar[type]
    message_kinds: ClassVar[tuple[str, ...]] = ()
    #: True for the named oracle variants and baselines that may see the true classes.
    uses_oracle: ClassVar[bool] = False
    #: True when the protocol can take a window's messages in batches (see above).
    window_safe: ClassVar[bool] = False
    #: True (set by a window-safe protocol, at the latest in `setup`) when what it sends at a
    #: tick never depends on what was delivered before it, so that the engine may hand it
    #: several slots at once (`on_slots`), when the links are counter-based.
    slot_batches: bool = False

    def __init__(self, params: Any) -> None:
        self.params = params

    def setup(self, ctx: Context) -> None:
        """Allocate population state before slot 1."""
        self.ctx = ctx

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        """Take every agent's sample of slot `t` (shape (n_agents,)) and send what is due."""

    def on_slots(self, t: int, samples: np.ndarray) -> None:
        """Slots t … t + k − 1 at once (`slot_batches` only; samples: shape (k, n_agents)).

        Each slot's sends carry ``at`` = its time and ``ids``. The windows up to the next
        call deliver messages due in any of these slots: a message delivered at time x must be
        handled with the state of slot ⌊x⌋ (e.g. sums kept per slot), and the state after the
        last window must be what `on_samples` slot by slot, one instant at a time, would leave:
        bit for bit, which the kernel's tests check. No `Context.call_at` is allowed.
        """
        raise NotImplementedError

    def on_deliver(self, batch: Batch) -> None:
        """React to the messages delivered at the current instant (or in a window)."""

    def on_window_end(self) -> None:
        """Finish a window's deliveries (window-safe protocols only)."""

    def estimates(self) -> np.ndarray:
        """Every agent's current estimate, shape (n_agents,)."""
        raise NotImplementedError
