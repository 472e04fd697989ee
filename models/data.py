"""Data models: agents in classes with a common mean per class, streaming i.i.d. samples.

Agents are assigned to classes uniformly at random (the papers' set-up) from the run's
``population`` stream, so every protocol compared in a study sees the same classes and, through
the ``data`` stream, the same samples.

A ``[data.drift]`` table makes the means move over the run (`Drift`): samples of slot t are drawn
around the means at t, and the recorder scores every estimate against them
(`desim.kernel.protocol.DataSource.at`). What the drift draws (who switches, the walk's steps)
comes from a child of the ``population`` stream: the classes and the samples' noise are those of
the same study without drift, and every protocol compared sees the same drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from desim.kernel.params import build, param
from desim.kernel.protocol import DataSource
from desim.kernel.registry import DATA

#: The drift models of a ``[data.drift]`` table and the parameters each one reads.
DRIFT_READS = {"switch": ("fraction", "at"), "linear": ("rate",), "random-walk": ("step",)}


@dataclass(frozen=True)
class Drift:
    """How the class means move over a run: a ``[data.drift]`` table of `ClassData`.

    ``switch``: round(fraction·M) agents (at least one), drawn from the drift stream, move to
    the next class (c + 1 mod the number of classes) from slot `at` on: their samples from slot
    `at` are drawn around that class's mean. ``linear``: every agent's mean at slot t is its
    class mean + rate·(t − 1), so classes stay classes. ``random-walk``: each class mean takes
    a Gaussian step of standard deviation `step` at every slot after the first (the agents of a
    class share its walk).
    """

    model: Literal["switch", "linear", "random-walk"] | None = param(
        None, "how the means move: switch, linear or random-walk"
    )
    fraction: float | None = param(None, "switch: the share of agents that switch", gt=0, le=1)
    at: int | None = param(None, "switch: the first slot drawn around the new class's mean", ge=1)
    rate: float | None = param(None, "linear: the change of every mean per slot")
    step: float | None = param(
        None, "random-walk: the standard deviation of a class mean's step per slot", ge=0
    )

    def __post_init__(self) -> None:
        if self.model is None:
            raise ValueError(f"model is required (allowed: {', '.join(DRIFT_READS)})")
        reads = DRIFT_READS[self.model]
        for name in ("fraction", "at", "rate", "step"):
            value = getattr(self, name)
            if name in reads and value is None:
                raise ValueError(
                    f"model = {self.model!r} needs {name} (it reads {', '.join(reads)})"
                )
            if name not in reads and value is not None:
                raise ValueError(
                    f"{name} = {value!r}: model = {self.model!r} reads only {', '.join(reads)}; "
                    f"remove {name}"
                )


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
    drift: dict | None = param(
        None, "a [data.drift] table: the means move over the run (absent: they never move)"
    )
    #: Parameters read only under some settings (`desim validate` refuses them otherwise).
    read_only_when: ClassVar = {"sigma": ("distribution", ("uniform", "gaussian"))}
    #: Fields left out of config hashes while absent (None): studies written before they
    #: existed keep their hashes (`desim.study.spec.hashing`).
    hash_omits_absent: ClassVar = ("drift",)

    def __post_init__(self) -> None:
        if self.distribution == "bernoulli" and not all(0 <= m <= 1 for m in self.class_means):
            raise ValueError(
                f"class_means = {self.class_means}: Bernoulli means must lie in [0, 1]"
            )
        drift = self.drift_model  # (built: its own errors, one line)
        if drift is not None and self.distribution == "bernoulli":
            raise ValueError(
                "drift: Bernoulli means must stay in [0, 1]; drift is allowed with "
                "distribution = 'uniform' or 'gaussian'"
            )
        if drift is not None and drift.model == "switch" and len(self.class_means) < 2:
            raise ValueError(
                f"drift: model = 'switch' moves agents to the next class; class_means = "
                f"{self.class_means} has one class (allowed: ≥ 2 classes)"
            )

    @property
    def drift_model(self) -> Drift | None:
        """The validated [data.drift] table, or None when the means never move."""
        return None if self.drift is None else build(Drift, self.drift, "drift")

    def check_run(self, t_max: int, protocol: type, params: Any) -> None:
        """Raise `ValueError` (one line) for a drift a run of `t_max` slots of `protocol` cannot
        have: a switch after the last slot, or a switch with a protocol told the true classes
        once at set-up (`Protocol.uses_oracle`), which would keep the classes before it."""
        drift = self.drift_model
        if drift is None or drift.model != "switch":
            return
        if drift.at > t_max:
            raise ValueError(f"drift: at = {drift.at}: beyond t_max = {t_max} (allowed: 1 … t_max)")
        if protocol(params).uses_oracle:
            raise ValueError(
                "drift: model = 'switch' changes classes, and this protocol is told the true "
                "classes at set-up only (allowed: linear or random-walk drift, which keep them)"
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
        drift = self.drift_model
        if drift is None:
            return ClassSamples(self, classes)
        # a child stream: the population stream's own draws (the classes) are unchanged
        return DriftingSamples(self, classes, drift, rng.spawn(1)[0])


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
        if self.spec.distribution == "bernoulli":
            return (rng.random(shape) < self.means).astype(float)
        x = self.noise(rng, shape)
        x += self.means
        return x

    def noise(self, rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        """Samples around mean 0 (uniform or Gaussian data), in a new array of `shape`."""
        # in place: one array of the block's size (the same numbers as means + σ·z)
        if self.spec.distribution == "uniform":
            half = self.spec.support_half_width()
            return rng.uniform(-half, half, size=shape)
        x = rng.standard_normal(shape)
        x *= self.spec.sigma
        return x


@dataclass(frozen=True)
class SourceAt:
    """A data source as it is at one slot: what metrics compare estimates with then."""

    n_agents: int
    means: np.ndarray
    classes: np.ndarray
    public: dict
    spec: ClassData


class DriftingSamples(ClassSamples):
    """The data source of a run of `ClassData` with a [data.drift] table: means that move.

    `means` and `classes` are those of slot 1; `at(t)` gives them at slot t. The source counts
    the slots it has drawn (slots come in order, `DataSource.sample`), so it serves one run.
    """

    drifts = True

    def __init__(
        self, spec: ClassData, classes: np.ndarray, drift: Drift, rng: np.random.Generator
    ) -> None:
        super().__init__(spec, classes)
        self.drift = drift
        self._drawn = 0
        self._class_means = np.asarray(spec.class_means, dtype=float)
        if drift.model == "switch":
            count = max(1, round(drift.fraction * self.n_agents))
            #: The agents that switch, and every agent's class and mean from slot `at` on.
            self.switched = np.sort(rng.permutation(self.n_agents)[:count])
            self.classes_after = classes.copy()
            self.classes_after[self.switched] = (classes[self.switched] + 1) % len(
                self._class_means
            )
            self.means_after = self._class_means[self.classes_after]
        #: The random walk of the class means: row s − 1 holds them at slot s (grown on demand).
        self._walk = self._class_means[None, :].copy()
        self._walked = 1
        self._rng = rng

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        first = self._drawn + 1  # the slot of the block's first row
        self._drawn += n_slots
        x = self.noise(rng, (n_slots, self.n_agents))
        model = self.drift.model
        if model == "linear":
            x += self.means
            x += (self.drift.rate * np.arange(first - 1, first - 1 + n_slots))[:, None]
        elif model == "switch":
            k = min(max(self.drift.at - first, 0), n_slots)  # rows before the switch
            x[:k] += self.means
            x[k:] += self.means_after
        else:
            self._extend_walk(first + n_slots - 1)
            # (np.take: a gather along the agents, several times faster than [:, classes])
            x += np.take(self._walk[first - 1 : first - 1 + n_slots], self.classes, axis=1)
        return x

    def at(self, t: int) -> SourceAt:
        """The means and classes at slot `t` (≥ 1)."""
        if t < 1:
            raise ValueError(f"t = {t}: slots start at 1")
        model = self.drift.model
        classes = self.classes
        if model == "linear":
            means = self.means + self.drift.rate * (t - 1)
        elif model == "switch":
            after = t >= self.drift.at
            classes = self.classes_after if after else self.classes
            means = self.means_after if after else self.means
        else:
            self._extend_walk(t)
            means = self._walk[t - 1][self.classes]
        return SourceAt(self.n_agents, means, classes, self.public, self.spec)

    def _extend_walk(self, slots: int) -> None:
        """Walk the class means up to slot `slots`: each row the last plus step·z, z ~ N(0, 1)
        drawn in slot order, so the walk does not depend on how it is extended."""
        if slots <= self._walked:
            return
        if slots > len(self._walk):  # (room doubles: extending costs O(slots) in all)
            room = np.empty((max(slots, 2 * len(self._walk)), self._walk.shape[1]))
            room[: self._walked] = self._walk[: self._walked]
            self._walk = room
        steps = self._rng.standard_normal((slots - self._walked, self._walk.shape[1]))
        steps *= self.drift.step
        steps[0] += self._walk[self._walked - 1]  # cumsum continues from the last row
        np.cumsum(steps, axis=0, out=self._walk[self._walked : slots])
        self._walked = slots
