"""The transports a run's messages travel by, one class per delivery mode (chosen once).

`Synchronous` (ideal links), `Instants` (one event per delivery time) and `Windows` (a
window-safe protocol's deliveries in batches up to the engine's horizon) share `Transport`'s
counters and drop rules; `desim.kernel.network.pick_transport` chooses among them.
"""

from desim.kernel.transports.base import (
    PRIORITY_DEADLINE,
    PRIORITY_DELIVER,
    PRIORITY_RECORD,
    PRIORITY_TICK,
    At,
    Transport,
)
from desim.kernel.transports.instants import Instants
from desim.kernel.transports.synchronous import Synchronous
from desim.kernel.transports.windows import Windows

__all__ = [
    "PRIORITY_DEADLINE",
    "PRIORITY_DELIVER",
    "PRIORITY_RECORD",
    "PRIORITY_TICK",
    "At",
    "Instants",
    "Synchronous",
    "Transport",
    "Windows",
]
