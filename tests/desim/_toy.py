"""A test-only protocol and curve, registered under names no real plug-in uses.

`toy-local-mean`: every agent estimates its mean by its running mean, plus optional Gaussian
noise of standard deviation 1/(ε t) from the run's ``dp-noise`` stream; agent 0 pings agent 1
every slot (so results hold a message metric). `fail_replicate` makes one replicate raise, to
test how a study survives a failing run. `toy-local`: the curve σ²/t (times `scale`).

`TOY_STUDY` is a small study of both; the fixtures ``stored`` (the study run once per test
module) and ``copy`` (a fresh copy of it per test) serve the tests that damage or export a
results folder: a module imports `stored_toy` and `toy_copy` to use them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from desim.kernel.params import param
from desim.kernel.protocol import Context, Protocol
from desim.kernel.registry import CURVES, METRICS, PROTOCOLS

PROTOCOL = "toy-local-mean"
CURVE = "toy-local"
UNDECLARED_METRIC = "toy-undeclared"


@dataclass(frozen=True)
class ToyParams:
    """Parameters of the toy protocol."""

    epsilon: float = param(1.0, "noise scale: standard deviation 1/(ε t)", gt=0)
    delta: float = param(1e-6, "unused; declared to test (0, 1) bounds", gt=0, lt=1)
    noise: Literal["none", "gaussian"] = param("none", "whether estimates are noisy")
    fail_replicate: int = param(-1, "replicate whose set-up raises (-1: none)")


class ToyLocalMean(Protocol):
    """Each agent's estimate is its own running mean (optionally noisy)."""

    Params = ToyParams
    message_kinds = ("ping",)

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        if ctx.streams.replicate == self.params.fail_replicate:
            raise RuntimeError(f"toy failure in replicate {ctx.streams.replicate}")
        self.sums = np.zeros(ctx.n_agents)
        self.t = 0
        self.rng = ctx.streams.get("dp-noise")

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.sums += samples
        self.t = t
        self.ctx.send("ping", np.array([0]), np.array([1]))

    def estimates(self) -> np.ndarray:
        est = self.sums / max(self.t, 1)
        if self.params.noise == "gaussian":
            est = est + self.rng.standard_normal(len(est)) / (self.params.epsilon * self.t)
        return est


@dataclass(frozen=True)
class ToyCurve:
    """σ²/t times `scale` (the local baseline of the toy)."""

    scale: float = param(1.0, "factor on σ²/t", gt=0)
    epsilon: float = param(1.0, "declared so that [defaults] reach curves too", gt=0)

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(σ²·scale/t, zeros)."""
        return self.scale * data.sigma**2 / t, np.zeros_like(t)


# pytest may import this module under two names; a registry refuses a second registration
if PROTOCOL not in PROTOCOLS:
    PROTOCOLS.register(PROTOCOL)(ToyLocalMean)
if CURVE not in CURVES:
    CURVES.register(CURVE)(ToyCurve)
if UNDECLARED_METRIC not in METRICS:  # a metric that does not declare what it records
    METRICS.register(UNDECLARED_METRIC)(lambda protocol, data: {"toy_value": 1.0})


#: A study of the toy protocol: 2 scenarios × 2 replicates, one curve, one plot.
TOY_STUDY = """\
[study]
title = "toy"
seed = 7
replicates = 2
t_max = 50
checkpoints = 8

[quick]
replicates = 1
t_max = 20

[data]
model = "classes"
agents = 6
class_means = [0.2, 0.8]
sigma = 0.5

[defaults]
epsilon = 1.0

[[scenario]]
name = "Toy A"
protocol = "toy-local-mean"

[[scenario]]
name = "Toy B"
protocol = "toy-local-mean"
noise = "gaussian"

[[curve]]
name = "toy curve"
kind = "toy-local"

[[plot]]
file = "toy.png"
title = "Toy"
curves = ["toy curve"]
"""


#: The head of a small PriCER study (10 agents in `dimension` dimensions, one slot): a test adds
#: its [defaults], [grid] and scenarios.
PRICER_HEAD = """\
[study]
title = "p"
seed = 4
t_max = 1
checkpoints = 2

[data]
model = "vectors"
agents = 10
dimension = {dimension}
"""


def write_study(folder: Path, text: str = TOY_STUDY) -> Path:
    """Write `text` as folder/study.toml and return the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.toml").write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module", name="stored")
def stored_toy(tmp_path_factory) -> Path:
    """The toy study, run once (4 runs) per test module; each test works on its own copy."""
    from desim.study.results import run_study  # here: importing the toy loads no study layer
    from desim.study.spec import load_study

    folder = write_study(tmp_path_factory.mktemp("stored") / "toy")
    run_study(load_study(folder), progress=False)
    return folder


@pytest.fixture(name="copy")
def toy_copy(stored: Path, tmp_path: Path) -> Path:
    """A copy of the stored toy study for one test to change."""
    return Path(shutil.copytree(stored, tmp_path / "toy"))
