"""Data models of the empirical-Bayes family: agents' parameters drawn from a population law.

- ``hierarchical-gaussian`` (§2.1): θ_i ~ N(μ, σ_θ²), samples X_ij ~ N(θ_i, σ_x²).
- ``bernoulli-prior`` (§2.2, §4): p_i from a prior on [0, 1] — Beta(α, β), a normal clipped to
  [0, 1], uniform on [low, high], or equal-mass spikes (the paper's "3-spike": 1/4, 1/2, 3/4) —
  and samples X_ij ~ Bern(p_i).

(The discrete mixture of §2.3 is the class model ``classes`` of `desim.models.data`.) The
agents' parameters come from the run's ``population`` stream, the samples from ``data``, so
protocols compared in one study see the same agents and samples. Every agent is its own class
(`classes` = 0…m−1: the "ideal" baseline then is the local mean).

Public facts: σ_x² (``sigma2``, known in §2.1) and the support half-width ``L`` that item-level
DP calibration uses (3σ_x for Gaussian samples, an approximation as for the class model; 1/2 for
Bernoulli samples). The Bernoulli agents' variances p_i(1 − p_i) are not public.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.protocol import DataSource
from desim.kernel.registry import DATA
from desim.models.eb.analytic import beta_moments


@DATA.register("hierarchical-gaussian")
@dataclass(frozen=True)
class HierarchicalGaussian:
    """m agents with θ_i ~ N(μ, σ_θ²) and Gaussian samples N(θ_i, σ_x²) (§2.1, d = 1)."""

    agents: int = param(10000, "number of agents m", ge=3)
    mean: float = param(0.0, "μ, the population mean")
    sigma_theta: float = param(0.1, "σ_θ, the population standard deviation", ge=0)
    sigma_x: float = param(0.5, "σ_x, the standard deviation of every sample", gt=0)

    def make(self, rng: np.random.Generator) -> AgentSamples:
        """Draw θ_1..θ_m and return the data source."""
        theta = self.mean + self.sigma_theta * rng.standard_normal(self.agents)
        public = {
            "L": 3.0 * self.sigma_x,
            "sigma2": np.full(self.agents, self.sigma_x**2),
            "distribution": "gaussian",
        }
        return AgentSamples(theta, public, self._deviations)

    def _deviations(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """σ_x·z for a block of slots, scaled in place (one array of the block's size)."""
        z = rng.standard_normal(shape)
        z *= self.sigma_x
        return z


@DATA.register("bernoulli-prior")
@dataclass(frozen=True)
class BernoulliPrior:
    """m agents with p_i drawn from `prior` and Bernoulli(p_i) samples (§2.2, §4)."""

    agents: int = param(10000, "number of agents m", ge=3)
    prior: Literal["beta", "normal", "uniform", "spikes"] = param(
        "beta", "law of p_i: Beta(α, β), N(mean, sd²) clipped to [0, 1], U[low, high], spikes"
    )
    alpha: float = param(3.5, "α of the Beta prior", gt=0)
    beta: float = param(3.5, "β of the Beta prior", gt=0)
    mean: float = param(0.5, "mean of the normal prior (before clipping)")
    sd: float = param(0.2, "standard deviation of the normal prior (before clipping)", gt=0)
    low: float = param(0.0, "lower end of the uniform prior", ge=0, le=1)
    high: float = param(1.0, "upper end of the uniform prior", ge=0, le=1)
    spikes: list[float] = param(
        [0.25, 0.5, 0.75], "atoms of equal mass (the 3-spike prior)", ge=0, le=1, nonempty=True
    )
    #: Parameters read only under some priors (`desim validate` refuses them otherwise).
    read_only_when: ClassVar = {
        **dict.fromkeys(("alpha", "beta"), ("prior", ("beta",))),
        **dict.fromkeys(("mean", "sd"), ("prior", ("normal",))),
        **dict.fromkeys(("low", "high"), ("prior", ("uniform",))),
        "spikes": ("prior", ("spikes",)),
    }

    def __post_init__(self) -> None:
        if self.high < self.low:
            raise ValueError(f"high = {self.high} < low = {self.low}: need low ≤ high")

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """p_1..p_m."""
        m = self.agents
        if self.prior == "beta":
            return rng.beta(self.alpha, self.beta, m)
        if self.prior == "normal":
            return np.clip(self.mean + self.sd * rng.standard_normal(m), 0.0, 1.0)
        if self.prior == "uniform":
            return rng.uniform(self.low, self.high, m)
        return np.asarray(self.spikes, dtype=float)[rng.integers(0, len(self.spikes), m)]

    def moments(self) -> tuple[float, float]:
        """(μ, σ²), the mean and variance of the prior (exact; the clipped normal by quadrature)."""
        if self.prior == "beta":
            return beta_moments(self.alpha, self.beta)
        if self.prior == "uniform":
            return (self.low + self.high) / 2, (self.high - self.low) ** 2 / 12
        if self.prior == "spikes":
            s = np.asarray(self.spikes, dtype=float)
            return float(s.mean()), float(s.var())
        from scipy import integrate, stats  # here: ~0.5 s of imports only this prior needs

        z = stats.norm(self.mean, self.sd)
        inner = [integrate.quad(lambda p, k=k: p**k * z.pdf(p), 0.0, 1.0)[0] for k in (1, 2)]
        upper = z.sf(1.0)  # mass clipped to 1 (mass clipped to 0 adds nothing to the moments)
        m1, m2 = inner[0] + upper, inner[1] + upper
        return m1, m2 - m1 * m1

    def make(self, rng: np.random.Generator) -> AgentSamples:
        """Draw p_1..p_m and return the data source."""
        p = self.draw(rng)
        public = {"L": 0.5, "distribution": "bernoulli"}
        return AgentSamples(p, public, None)


class AgentSamples(DataSource):
    """The data source of one run: fixed per-agent parameters, fresh samples every slot.

    `means` holds θ_i (or p_i); `noise(rng, shape)` draws the Gaussian deviations, or None for
    Bernoulli samples.
    """

    def __init__(self, means: np.ndarray, public: dict, noise) -> None:
        self.means = means
        self.n_agents = len(means)
        self.classes = np.arange(self.n_agents)
        self.public = public
        self._noise = noise

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        shape = (n_slots, self.n_agents)
        if self._noise is None:
            return (rng.random(shape) < self.means).astype(float)
        x = self._noise(rng, shape)  # in place: the same floats as means + noise
        x += self.means
        return x
