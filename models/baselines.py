"""The local and ideal baselines (seed 002 Props. 1 and 2), as protocols without messages."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from desim.protocol import Context, Protocol
from desim.registry import PROTOCOLS


@dataclass(frozen=True)
class NoParams:
    """A protocol without parameters."""


@PROTOCOLS.register("local")
class Local(Protocol):
    """Every agent estimates its mean by its own running mean X̄_a (MSE σ²/t, Prop. 1)."""

    Params = NoParams

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.sums = np.zeros(ctx.n_agents)
        self.counts = 0

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.sums += samples
        self.counts += 1

    def estimates(self) -> np.ndarray:
        return self.sums / max(self.counts, 1)


@PROTOCOLS.register("ideal")
class Ideal(Local):
    """Every agent averages all samples of its true class (MSE σ²/(|C_a| t), Prop. 2).

    This is the paper's "public data with known classes" benchmark, so it uses the truth.
    """

    uses_oracle = True

    def estimates(self) -> np.ndarray:
        classes = self.ctx.oracle_classes
        size = np.bincount(classes)
        class_mean = np.bincount(classes, weights=self.sums) / np.maximum(size, 1)
        return class_mean[classes] / max(self.counts, 1)
