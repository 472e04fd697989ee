"""The network: carries messages between agents over a link model, in batches.

A run's `Network` is a small façade over one transport, chosen once by `pick_transport` from
the link model and the protocol's declared capabilities (`desim.kernel.transports`):

- ideal links (always up, zero latency): `Synchronous`, one batch per send, no draws;
- a `desim.kernel.protocol.WindowSafe` protocol on other links: `Windows`, every message due
  between two instants that matter handed over in time-ordered batches with their exact
  ``delivered_at``, up to the engine's horizon;
- otherwise `Instants`: one SimPy event per distinct delivery time, one batch per instant.

Every transport draws availability (``links`` stream) and latency (``latency`` stream) alike
and counts drops per kind at send time (link or node down) and at delivery time (destination
down), so every mode gives the same bytes (`desim.testing.check_modes` checks it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from desim.kernel.links import LinkModel
from desim.kernel.protocol import Protocol, WindowSafe
from desim.kernel.transports import (
    PRIORITY_DEADLINE,
    PRIORITY_DELIVER,
    PRIORITY_RECORD,
    PRIORITY_TICK,
    At,
    Instants,
    Synchronous,
    Transport,
    Windows,
)

__all__ = [
    "PRIORITY_DEADLINE",
    "PRIORITY_DELIVER",
    "PRIORITY_RECORD",
    "PRIORITY_TICK",
    "At",
    "Network",
    "pick_transport",
]


def pick_transport(
    env: simpy.Environment,
    protocol: Protocol,
    links: LinkModel,
    rng_links: np.random.Generator,
    rng_latency: np.random.Generator,
    horizon: Callable[[], float],
    windows: bool = True,
) -> Transport:
    """The transport of one run: `Synchronous` on ideal links, `Windows` for a window-safe
    protocol (unless `windows` is False), else `Instants` (see the module)."""
    args = (env, protocol.message_kinds, links, rng_links, rng_latency, protocol.on_deliver)
    if links.ideal:
        return Synchronous(*args)
    if windows and isinstance(protocol, WindowSafe):
        return Windows(*args, window_end=protocol.on_window_end, horizon=horizon)
    return Instants(*args)


class Network:
    """The message transport of one run: `send`, the counters, and which transport carries.

    `sent[k]` and `dropped[k]` count messages of kind `kinds[k]` since the start.
    """

    def __init__(self, transport: Transport) -> None:
        #: The transport chosen for the run (`pick_transport`).
        self.transport = transport
        self.kinds = transport.kinds
        self.links = transport.links
        #: `Transport.send` of the run's transport, bound once: a send costs one call.
        self.send: Callable[..., None] = transport.send
        #: `Transport.send_batch`: a send built by the protocol (`SenderBatch`), bound once.
        self.send_batch: Callable[..., None] = transport.send_batch
        #: Run a slot's tick through the transport (`Instants.at_tick`).
        self.at_tick: Callable[[Callable[[], None]], None] = transport.at_tick

    @property
    def windows(self) -> bool:
        """Whether deliveries come in windows (`desim.kernel.transports.Windows`)."""
        return isinstance(self.transport, Windows)

    @property
    def sent(self) -> np.ndarray:
        """Messages sent so far, per kind."""
        return self.transport.sent

    @property
    def dropped(self) -> np.ndarray:
        """Messages lost so far (at send or at delivery), per kind."""
        return self.transport.dropped
