"""Non-negative delay and sojourn distributions: latencies, straggler delays, churn sessions.

A study file names one as a table ``{ model = "<name>", <params> }``; `distribution` validates it
into a frozen dataclass registered in `DISTRIBUTIONS`. Every distribution gives its `mean`, its
CDF and its inverse CDF (`ppf`), so a model can draw counter-based realisations (``ppf`` of a
`desim.kernel.links.counter_uniform`) and a protocol can compute exact deadline probabilities
(``cdf``). Values are in slots (or whatever unit the caller gives them) and never negative.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.params import ConfigError, build, param
from desim.kernel.registry import DISTRIBUTIONS


class Distribution:
    """A distribution on [0, ∞): its mean, CDF, inverse CDF and a sampler.

    Models whose parameter is the mean declare it as the field `mean`, which stands in for the
    property here.
    """

    @property
    def mean(self) -> float:
        """E[X]."""
        raise NotImplementedError

    def cdf(self, x: np.ndarray) -> np.ndarray:
        """P(X ≤ x), elementwise."""
        raise NotImplementedError

    def ppf(self, u: np.ndarray) -> np.ndarray:
        """The inverse CDF: the smallest x with P(X ≤ x) ≥ u, elementwise, for u in [0, 1)."""
        raise NotImplementedError

    def sample(self, rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
        """`size` independent draws (floats) by inversion of one uniform each.

        Inversion keeps every draw a fixed function of one uniform, so a sample from `rng`
        and a counter-based draw ``ppf(counter_uniform(...))`` have the same law.
        """
        return self.ppf(rng.random(size))


def _array(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


@DISTRIBUTIONS.register("constant")
@dataclass(frozen=True)
class Constant(Distribution):
    """X = value always."""

    value: float = param(1.0, "the value every draw takes", ge=0)

    @property
    def mean(self) -> float:
        return self.value

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return (_array(x) >= self.value).astype(np.float64)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return np.full(np.shape(u), self.value)


@DISTRIBUTIONS.register("uniform")
@dataclass(frozen=True)
class Uniform(Distribution):
    """X uniform on [low, high] (low = high: the constant low)."""

    low: float = param(0.0, "smallest value", ge=0)
    high: float = param(1.0, "largest value (≥ low)", ge=0)

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"high = {self.high!r}: must be ≥ low = {self.low!r}")

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = _array(x)
        if self.high == self.low:
            return (x >= self.low).astype(np.float64)
        return np.clip((x - self.low) / (self.high - self.low), 0.0, 1.0)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.low + _array(u) * (self.high - self.low)


@DISTRIBUTIONS.register("exponential")
@dataclass(frozen=True)
class Exponential(Distribution):
    """X exponential with mean `mean`: P(X ≤ x) = 1 − exp(−x/mean)."""

    mean: float = param(1.0, "E[X]", gt=0)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return -np.expm1(-np.maximum(_array(x), 0.0) / self.mean)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return -self.mean * np.log1p(-_array(u))


@DISTRIBUTIONS.register("lognormal")
@dataclass(frozen=True)
class Lognormal(Distribution):
    """X = exp(μ + σZ), Z standard normal, parametrised by its mean and coefficient of variation.

    σ² = log(1 + cv²) and μ = log(mean) − σ²/2, so sweeping `cv` changes the spread at a fixed
    mean; cv = 0 is the constant `mean`, and mean = 0 the constant 0 (so a sweep of the mean
    can start at no delay).
    """

    mean: float = param(1.0, "E[X] (0: always 0)", ge=0)
    cv: float = param(1.0, "coefficient of variation sd(X)/E[X]", ge=0)

    @property
    def sigma(self) -> float:
        """σ, the standard deviation of log X."""
        return math.sqrt(math.log1p(self.cv**2))

    @property
    def mu(self) -> float:
        """μ, the mean of log X."""
        return math.log(self.mean) - self.sigma**2 / 2

    def cdf(self, x: np.ndarray) -> np.ndarray:
        x = _array(x)
        if self.cv == 0 or self.mean == 0:
            return (x >= self.mean).astype(np.float64)
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(x, 0.0)) - self.mu) / self.sigma
        from scipy import special  # imported here: scipy.special costs ~0.2 s at import

        return special.ndtr(z)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        if self.mean == 0:
            return np.zeros_like(_array(u))
        from scipy import special

        return np.exp(self.mu + self.sigma * special.ndtri(_array(u)))


@DISTRIBUTIONS.register("pareto")
@dataclass(frozen=True)
class Pareto(Distribution):
    """Shifted Pareto (Lomax): P(X > x) = (1 + (x − shift)/scale)^(−alpha) for x ≥ shift.

    Equivalently X = shift + scale·(U^(−1/alpha) − 1) with U uniform on (0, 1], and
    E[X] = shift + scale/(alpha − 1). shift = scale = x_m gives the classical Pareto with
    minimum x_m; alpha > 1 keeps the mean finite (alpha ≤ 2: infinite variance).
    """

    shift: float = param(0.0, "smallest value", ge=0)
    scale: float = param(1.0, "scale of the tail", gt=0)
    alpha: float = param(3.0, "tail index α (> 1 so that the mean is finite)", gt=1)

    @property
    def mean(self) -> float:
        return self.shift + self.scale / (self.alpha - 1)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        excess = np.maximum(_array(x) - self.shift, 0.0)
        return -np.expm1(-self.alpha * np.log1p(excess / self.scale))

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.shift + self.scale * np.expm1(-np.log1p(-_array(u)) / self.alpha)


@DISTRIBUTIONS.register("weibull")
@dataclass(frozen=True)
class Weibull(Distribution):
    """X Weibull: P(X ≤ x) = 1 − exp(−(x/scale)^shape); shape < 1 is heavy-ish tailed."""

    shape: float = param(1.0, "shape k (1: exponential)", gt=0)
    scale: float = param(1.0, "scale λ", gt=0)

    @property
    def mean(self) -> float:
        return self.scale * math.gamma(1 + 1 / self.shape)

    def cdf(self, x: np.ndarray) -> np.ndarray:
        return -np.expm1(-((np.maximum(_array(x), 0.0) / self.scale) ** self.shape))

    def ppf(self, u: np.ndarray) -> np.ndarray:
        return self.scale * (-np.log1p(-_array(u))) ** (1 / self.shape)


@DISTRIBUTIONS.register("geometric")
@dataclass(frozen=True)
class Geometric(Distribution):
    """X geometric on 1, 2, …: P(X = k) = p(1 − p)^(k−1) with p = 1/mean (a number of slots)."""

    mean: float = param(2.0, "E[X] (≥ 1; 1 is the constant 1)", ge=1)

    @property
    def p(self) -> float:
        """The per-trial success probability 1/mean."""
        return 1 / self.mean

    def cdf(self, x: np.ndarray) -> np.ndarray:
        k = np.floor(np.maximum(_array(x), 0.0))
        if self.p == 1:
            return (k >= 1).astype(np.float64)
        return -np.expm1(k * math.log1p(-self.p))

    @property
    def log_q(self) -> float:
        """log(1 − p) (−∞ when p = 1)."""
        return -math.inf if self.p == 1 else math.log1p(-self.p)

    def ppf(self, u: np.ndarray) -> np.ndarray:
        u = _array(u)
        if self.p == 1:
            return np.ones_like(u)
        return self.ppf_of(u, self.log_q)

    @staticmethod
    def ppf_of(u: np.ndarray, log_q: np.ndarray | float) -> np.ndarray:
        """The quantiles of geometric laws with log(1 − p) = `log_q` (one per u, or one for all):
        the smallest k ≥ 1 with 1 − (1 − p)^k ≥ u (p = 1, log_q = −∞: k = 1)."""
        return np.maximum(np.ceil(np.log1p(-u) / log_q), 1.0)


def distribution(table: Mapping[str, Any] | Distribution, where: str) -> Distribution:
    """The distribution a study-file table ``{model = "<name>", <params>}`` describes.

    `where` names the table in errors, e.g. ``[network.latency]``; a `Distribution` is returned
    unchanged.
    """
    if isinstance(table, Distribution):
        return table
    if not isinstance(table, Mapping):
        raise ConfigError(f'{where} = {table!r}: must be a table {{model = "<name>", ...}}')
    if "model" not in table:
        allowed = ", ".join(DISTRIBUTIONS)
        raise ConfigError(f"{where}: missing key 'model'; allowed models: {allowed}")
    cls = DISTRIBUTIONS.lookup(table["model"], f"{where}: model")
    return build(cls, {k: v for k, v in table.items() if k != "model"}, where)
