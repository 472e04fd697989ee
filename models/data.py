"""Data models: agents in classes with a common mean per class, streaming i.i.d. samples.

Agents are assigned to classes uniformly at random (the papers' set-up) from the run's
``population`` stream, so every protocol compared in a study sees the same classes and, through
the ``data`` stream, the same samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.protocol import DataSource
from desim.kernel.registry import DATA


@DATA.register("classes")
@dataclass(frozen=True)
class ClassData:
    """M agents in classes with means `class_means`; samples uniform, Gaussian or Bernoulli.

    Uniform data lie on [μ−L, μ+L] with L = σ√3 (variance σ²); Gaussian data have standard
    deviation σ; Bernoulli data have mean μ ∈ [0, 1] and variance μ(1−μ), and `sigma` is
    ignored.
    """

    agents: int = param(200, "number of agents M", ge=2)
    class_means: list[float] = param([0.2, 0.4, 0.8], "mean of each class", nonempty=True)
    sigma: float = param(0.5, "standard deviation of every agent's data", ge=0)
    distribution: Literal["uniform", "gaussian", "bernoulli"] = param(
        "uniform", "distribution of the samples"
    )
    assignment: Literal["random", "balanced"] = param(
        "random", "random: each agent picks a class uniformly; balanced: sizes differ by ≤ 1"
    )
    #: Parameters read only under some settings (`desim validate` refuses them otherwise).
    read_only_when: ClassVar = {"sigma": ("distribution", ("uniform", "gaussian"))}

    def __post_init__(self) -> None:
        if self.distribution == "bernoulli" and not all(0 <= m <= 1 for m in self.class_means):
            raise ValueError(
                f"class_means = {self.class_means}: Bernoulli means must lie in [0, 1]"
            )

    def support_half_width(self) -> float:
        """L, the half-width of the data support [μ−L, μ+L] that DP calibration uses.

        σ√3 for uniform data; 1/2 for Bernoulli data (two samples differ by at most 2L = 1).
        Gaussian data are unbounded, so no finite L exists: we use L = 3σ, and the DP
        guarantee then holds only for samples within 3σ of the mean (an approximation).
        """
        if self.distribution == "uniform":
            return self.sigma * math.sqrt(3.0)
        if self.distribution == "bernoulli":
            return 0.5
        return 3.0 * self.sigma

    def variances(self, classes: np.ndarray) -> np.ndarray:
        """σ_a² of every agent given its class."""
        means = np.asarray(self.class_means, dtype=float)[classes]
        if self.distribution == "bernoulli":
            return means * (1.0 - means)
        return np.full(len(classes), self.sigma**2)

    def make(self, rng: np.random.Generator) -> ClassSamples:
        """Draw the class of every agent and return the data source."""
        n_classes = len(self.class_means)
        if self.assignment == "random":
            classes = rng.integers(0, n_classes, size=self.agents)
        else:
            classes = rng.permutation(np.arange(self.agents) % n_classes)
        return ClassSamples(self, classes)


class ClassSamples(DataSource):
    """The data source of one run of `ClassData`: fixed classes, fresh samples every slot."""

    def __init__(self, spec: ClassData, classes: np.ndarray) -> None:
        self.spec = spec
        self.n_agents = spec.agents
        self.classes = classes
        self.means = np.asarray(spec.class_means, dtype=float)[classes]
        sigma2 = spec.variances(classes)
        self.public = {
            "L": spec.support_half_width(),
            "sigma2": sigma2,
            "distribution": spec.distribution,
        }

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        shape = (n_slots, self.n_agents)
        # in place: one array of the block's size (the same numbers as means + σ·z)
        if self.spec.distribution == "uniform":
            half = self.spec.support_half_width()
            x = rng.uniform(-half, half, size=shape)
            x += self.means
            return x
        if self.spec.distribution == "gaussian":
            x = rng.standard_normal(shape)
            x *= self.spec.sigma
            x += self.means
            return x
        return (rng.random(shape) < self.means).astype(float)
