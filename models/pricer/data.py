"""Vector data of distributed mean estimation (seed 004): node i holds x_i ∈ R^d, ‖x_i‖₂ ≤ R.

The vectors are drawn once per run from the ``population`` stream (so every protocol of a study
sees the same x_i) and stay fixed: every slot shows each node the same x_i, and every slot is
one round of estimating x̄ = (1/n) Σ_i x_i. The truth of every agent is x̄ (the server's
target), so the recorder's ``mse`` is ‖x̂̄ − x̄‖² when a protocol reports the server's estimate
for every agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np

from desim.kernel.params import param
from desim.kernel.protocol import DataSource
from desim.kernel.registry import DATA


@DATA.register("vectors")
@dataclass(frozen=True)
class VectorData:
    """n nodes holding vectors x_i ∈ R^d with ‖x_i‖ ≤ R (seed 004 §II, Fig. 4).

    ``cubed-normal``: coordinates N(0, 1)³ (heavy tailed, Fig. 4); ``normal``: N(0, 1); ``sphere``:
    uniform on the sphere of radius R. `normalise`: ``max`` scales all vectors by one factor so
    that the largest norm is R (norms keep their spread); ``each`` scales every vector to norm R.
    """

    agents: int = param(10, "number of nodes n", ge=1)
    dimension: int = param(1000, "dimension d of every vector", ge=1)
    radius: float = param(1.0, "R, the known bound on every ‖x_i‖₂", gt=0)
    distribution: Literal["cubed-normal", "normal", "sphere"] = param(
        "cubed-normal", "law of the coordinates before normalisation"
    )
    normalise: Literal["max", "each"] = param(
        "max", "max: one factor, largest norm R; each: every norm R"
    )
    #: Parameters read only under some settings (`desim validate` refuses them otherwise).
    read_only_when: ClassVar = {"normalise": ("distribution", ("cubed-normal", "normal"))}

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """The n × d matrix whose rows are x_1, …, x_n; a `MemoryError` naming `dimension` and
        the bytes it needs when it does not fit (``desim run --force`` skips the estimate that
        would have refused it)."""
        try:
            x = rng.standard_normal((self.agents, self.dimension))
            if self.distribution == "cubed-normal":
                x = x**3
            norms = np.linalg.norm(x, axis=1)
            if self.distribution == "sphere" or self.normalise == "each":
                return self.radius * x / norms[:, None]
            return self.radius * x / norms.max()
        except MemoryError:
            need = self.agents * self.dimension * 8  # float64 coordinates, for every copy
            raise MemoryError(
                f"[data]: dimension = {self.dimension}: the vectors of agents = {self.agents} "
                f"nodes need {need / 2**30:.3g} GiB per copy, more than this machine could "
                "allocate; lower dimension"
            ) from None

    def make(self, rng: np.random.Generator) -> VectorSamples:
        """Draw the vectors and return the data source."""
        return VectorSamples(self, self.draw(rng))


class VectorSamples(DataSource):
    """The data source of one run of `VectorData`: the same x_i every slot, truth x̄ for all."""

    def __init__(self, spec: VectorData, x: np.ndarray) -> None:
        self.spec = spec
        self.x = x
        self.x.flags.writeable = False
        self.n_agents = spec.agents
        self.classes = np.zeros(spec.agents, dtype=np.int64)
        #: Every agent's truth is the mean x̄ the server estimates.
        self.means = np.broadcast_to(x.mean(axis=0), x.shape)
        self.public = {"R": spec.radius, "d": spec.dimension}

    def sample(self, rng: np.random.Generator, n_slots: int) -> np.ndarray:
        # A read-only view: the data are fixed, so n_slots copies would only cost memory.
        return np.broadcast_to(self.x, (n_slots, *self.x.shape))
