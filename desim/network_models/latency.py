"""Latency models: how long each message takes on top of the base link model's fixed delay.

A study file picks one with a ``[network.latency]`` table: any distribution of
`desim.network_models.distributions` (``model = "exponential"``, ``mean = 5.0``: every message gets
its own independent delay) or ``model = "size-proportional"`` (``base + per_value × width``, where
width is the number of values the message carries). Delays are in slots and may be fractional; the
network delivers at the exact time. Draws come from the run's ``latency`` stream in send order, one
per message, so i.i.d. delays let a later message overtake an earlier one on the same link. A
protocol that names its messages (ids, `desim.kernel.links.LinkModel.latency`) gets each delay as a
fixed function of its message's id instead, ``ppf(counter_uniform(key, id))`` with a key drawn
once from that stream: the same law, whatever the order messages are sent in.

``resolution`` (slots, default 0: exact) rounds every delivery time up to the next multiple of
it (1/resolution must be a whole number of ticks per slot). Exact continuous delays give every
message its own delivery instant. A protocol that declares itself window-safe gets them in
windows either way (`desim.kernel.network`), so the grid changes the model, not the speed;
any other protocol handles one delivery instant per event, and there a resolution of 0.1
slot (what arrives within a tenth of a slot comes together, at most 0.1 slot late) makes
population-scale runs with random latency ten to a hundred times faster. Deadlines on the
grid (PriCER's, in whole or tenth slots) see exactly the same on-time probability, since
⌈t + D⌉ ≤ t + d ⟺ D ≤ d when t + d is on the grid.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.links import counter_uniform
from desim.kernel.params import ConfigError, build, field_names, param
from desim.kernel.registry import DISTRIBUTIONS
from desim.network_models.distributions import Distribution, distribution

#: The model name of `SizeProportional` (every other name is a distribution).
SIZE_PROPORTIONAL = "size-proportional"


class Latency:
    """A per-message delay model: a sampler and the CDF that deadline probabilities need."""

    #: Delivery times are rounded up to a multiple of this many slots (0: exact).
    resolution: float = 0.0
    #: True when `sample` ignores t (or takes one per message): draws come in message order.
    per_message: bool = False

    def sample(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray, width: int
    ) -> np.ndarray | float:
        """The delay in slots of each message src[k]→dst[k] sent at t carrying `width` values
        (an array, or one number for all), drawn from `rng` (the ``latency`` stream)."""
        raise NotImplementedError

    def sample_keyed(
        self,
        key: np.uint64,
        ids: np.ndarray,
        t: float,
        src: np.ndarray,
        dst: np.ndarray,
        width: int,
    ) -> np.ndarray | float:
        """The same law as `sample`, as a fixed function of each message's id (uint64) and the
        run's `key`: the draws do not depend on the order messages are asked in."""
        raise NotImplementedError

    def cdf(self, x: np.ndarray, width: int) -> np.ndarray:
        """P(delay ≤ x) of a message carrying `width` values, elementwise."""
        raise NotImplementedError


@dataclass(frozen=True)
class IidLatency(Latency):
    """Every message is delayed by its own independent draw of the distribution `delay`."""

    delay: Distribution
    resolution: float = 0.0
    per_message = True

    def sample(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray, width: int
    ) -> np.ndarray:
        return self.delay.sample(rng, len(src))

    def sample_keyed(
        self,
        key: np.uint64,
        ids: np.ndarray,
        t: float,
        src: np.ndarray,
        dst: np.ndarray,
        width: int,
    ) -> np.ndarray:
        # (`Distribution.sample` inverts one uniform per draw too: the same law)
        return self.delay.ppf(counter_uniform(key, ids))

    def cdf(self, x: np.ndarray, width: int) -> np.ndarray:
        return self.delay.cdf(x)


@dataclass(frozen=True)
class SizeProportional(Latency):
    """Delay = base + per_value × width: a fixed latency plus a transmission time per value.

    width is the number of values in the message's payload (its columns, a round tag included),
    so every message of one send has the same delay and no draw is made.
    """

    base: float = param(0.0, "delay of an empty message, in slots", ge=0)
    per_value: float = param(0.0, "extra delay per value carried, in slots", ge=0)
    resolution: float = param(
        0.0, "round delivery times up to a multiple of this (slots; 0: exact)", ge=0, lt=1
    )
    per_message = True

    def sample(
        self, rng: np.random.Generator, t: float, src: np.ndarray, dst: np.ndarray, width: int
    ) -> float:
        return self.base + self.per_value * width

    def sample_keyed(
        self,
        key: np.uint64,
        ids: np.ndarray,
        t: float,
        src: np.ndarray,
        dst: np.ndarray,
        width: int,
    ) -> float:
        return self.base + self.per_value * width

    def cdf(self, x: np.ndarray, width: int) -> np.ndarray:
        return (np.asarray(x, dtype=float) >= self.base + self.per_value * width).astype(float)


def latency_model(table: Mapping[str, Any], where: str) -> Latency:
    """The latency model a ``[network.latency]`` table describes; `ConfigError` naming `where`."""
    if not isinstance(table, Mapping):
        raise ConfigError(f'{where} = {table!r}: must be a table {{model = "<name>", ...}}')
    allowed = sorted([*DISTRIBUTIONS, SIZE_PROPORTIONAL])
    name = table.get("model")
    if name is None:
        raise ConfigError(f"{where}: missing key 'model'; allowed models: {', '.join(allowed)}")
    if name not in allowed:
        close = difflib.get_close_matches(str(name), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{where}: model: unknown latency model {name!r}{hint}; allowed: {', '.join(allowed)}"
        )
    resolution = table.get("resolution", 0.0)
    if (
        isinstance(resolution, bool)
        or not isinstance(resolution, int | float)
        or not (0 <= resolution < 1)
        or (resolution > 0 and abs(1 / resolution - round(1 / resolution)) > 1e-9)
    ):
        raise ConfigError(
            f"{where}: resolution = {resolution!r}: must be 0 (exact times) or "
            "1/k slot for a whole number k ≥ 2 (e.g. 0.5, 0.1, 0.01)"
        )
    rest = {k: v for k, v in table.items() if k not in ("model", "resolution")}
    if name == SIZE_PROPORTIONAL:
        return build(SizeProportional, {**rest, "resolution": resolution}, where)
    return IidLatency(distribution({"model": name, **rest}, where), float(resolution))


def latency_keys(table: Mapping[str, Any]) -> list[str]:
    """The keys a ``[network.latency]`` table of this model accepts (for grid paths)."""
    name = table.get("model")
    if name == SIZE_PROPORTIONAL:
        cls: type = SizeProportional
    elif name in DISTRIBUTIONS:
        cls = DISTRIBUTIONS.get(name)
        return ["model", *field_names(cls), "resolution"]
    else:
        return ["model"]
    return ["model", *field_names(cls)]
