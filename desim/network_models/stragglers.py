"""Stragglers: agents that compute slower than the slot, so their messages leave late.

Agent i has a speed factor f_i ≥ 1 (1: nominal). A study file sets them with a
``[network.stragglers]`` table: a `fraction` of the agents, chosen at random from the run's
``stragglers`` stream when the run starts, get f = `slowdown`, the others 1; or `factors` lists
every f_i. The synchronous model absorbs a nominal agent's compute in its slot, so only the
excess counts: everything agent i sends during slot s = ⌊t⌋ leaves (f_i − 1)·D_{i,s} slots late,
where D_{i,s} is agent i's nominal processing time in slot s, a draw of the `delay` distribution
(default: the constant 1 slot). D_{i,s} is counter-based — ``delay.ppf`` of a
`desim.kernel.links.counter_uniform` keyed by the stream and numbered by (s, i) — so it is one draw
per agent and slot whoever asks, and a reply sent mid-slot leaves as late as the slot's other sends.
The server is never a straggler.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.links import counter_uniform
from desim.kernel.params import field_names, param
from desim.network_models.distributions import Constant, Distribution, distribution

#: The nominal processing time when the table gives no `delay`: one slot.
NOMINAL_DELAY = Constant(1.0)
#: Quantile midpoints of D used to integrate deadline probabilities (error ≤ 1/QUADRATURE).
QUADRATURE = 4096


@dataclass(frozen=True)
class Stragglers:
    """Per-agent speed factors f_i and the nominal processing time D of a ``[network.stragglers]``
    table."""

    fraction: float = param(
        0.0, "share of agents that are stragglers (chosen at random)", ge=0, le=1
    )
    slowdown: float = param(5.0, "speed factor f of a straggler (the others have f = 1)", ge=1)
    factors: list[float] | None = param(
        None, "explicit speed factor f_i of every agent (overrides fraction and slowdown)", ge=1
    )
    delay: dict | None = param(
        None, "nominal processing time D per slot, a distribution table (default: 1 slot)"
    )

    def __post_init__(self) -> None:
        if self.delay is not None:  # a bad delay table is reported when the table is read
            distribution(self.delay, "delay")

    @property
    def nominal(self) -> Distribution:
        """The distribution of D, the nominal processing time of an agent in a slot."""
        return NOMINAL_DELAY if self.delay is None else distribution(self.delay, "delay")

    def bind(self, n_agents: int, rng: np.random.Generator) -> BoundStragglers:
        """The stragglers of one run of `n_agents` agents; `rng` is its ``stragglers`` stream.

        With `fraction`, exactly ⌊fraction·n + ½⌋ agents, a uniformly random subset, straggle.
        """
        if self.factors is not None:
            if len(self.factors) != n_agents:
                raise ValueError(
                    f"stragglers: factors has {len(self.factors)} values; the data "
                    f"have {n_agents} agents"
                )
            factors = np.asarray(self.factors, dtype=float)
        else:
            factors = np.ones(n_agents)
            slow = rng.permutation(n_agents)[: math.floor(self.fraction * n_agents + 0.5)]
            factors[slow] = self.slowdown
        return BoundStragglers(factors, self.nominal, np.uint64(rng.integers(0, 2**63)))


class BoundStragglers:
    """The speed factors f_i of one run's agents and their counter-based processing times."""

    def __init__(self, factors: np.ndarray, nominal: Distribution, key: np.uint64) -> None:
        self.factors = factors
        self.nominal = nominal
        self._key = key
        self._stride = np.uint64(len(factors) + 1)
        # f of every address, the server (one past the agents) included
        self._f = np.append(factors, 1.0)

    #: `delay` also takes one time per message.
    per_message = True

    def delay(self, t: float | np.ndarray, src: np.ndarray) -> np.ndarray | float:
        """How late each message src[k] sent at time t (or t[k]) leaves: (f_i − 1)·D_{i,⌊t⌋}
        slots."""
        f = self._f[src]
        slow = f > 1
        if not slow.any():
            return 0.0
        out = np.zeros(len(src))
        slot = (
            np.floor(np.asarray(t)[slow]).astype(np.uint64)
            if np.ndim(t)
            else np.uint64(math.floor(t))
        )
        counter = slot * self._stride + src[slow].astype(np.uint64)
        out[slow] = (f[slow] - 1) * self.nominal.ppf(counter_uniform(self._key, counter))
        return out

    def on_time(self, slack: float, cdf: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """P((f_i − 1)·D + L ≤ slack) of every agent i, for a delay L independent of D with
        P(L ≤ x) = cdf(x).

        Integrated over D's quantiles at the midpoints (k + ½)/QUADRATURE: exact when D is
        constant, otherwise within 1/QUADRATURE (the integrand is monotone in the quantile).
        """
        u = (np.arange(QUADRATURE) + 0.5) / QUADRATURE
        d = self.nominal.ppf(u)
        f, which = np.unique(self.factors, return_inverse=True)
        prob = np.mean(cdf(slack - (f[:, None] - 1) * d[None, :]), axis=1)
        return prob[which]


def stragglers_keys(table: Mapping[str, Any]) -> list[str]:
    """The keys a ``[network.stragglers]`` table accepts (for grid paths)."""
    return field_names(Stragglers)
