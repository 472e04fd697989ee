"""Helpers of the Private-ColME forgetting tests: the small drifting population, one run of it
measured at 12 checkpoints with the ledger and the asynchrony metrics, the MSE at t = 400 of a
switch at τ = 40 with and without a reset, the one-line refusal of a `forget` combination, and
the release sequences the windowed estimators' property tests draw.

A test module imports them (`from _forget import DRIFT, forget_run`): pytest puts this folder on
sys.path to import the module.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from desim.kernel.params import ConfigError
from desim.kernel.randomness import Streams
from desim.study.scenario import Scenario, resolve, run

SMALL = {"model": "classes", "agents": 10, "class_means": [0.2, 0.8], "sigma": 0.5}
DRIFT = {**SMALL, "drift": {"model": "switch", "fraction": 0.5, "at": 40}}
LATENCY = {"links": "ideal", "latency": {"model": "exponential", "mean": 2.0}}

#: Releases 1 … J of one pair at increasing t (`steps` apart), a subset `received` in order,
#: under a window or a reset of `size` slots, PM-I or PM-II (the windowed estimators' properties).
windowed_releases = given(
    received=st.lists(st.booleans(), min_size=1, max_size=30).filter(any),
    steps=st.lists(st.integers(1, 5), min_size=30, max_size=30),
    rule=st.sampled_from(["window", "reset"]),
    size=st.integers(2, 40),
    mechanism=st.sampled_from(["pm1", "pm2"]),
)


def forget_run(
    params: dict, network: dict | None = None, topology: dict | None = None, t: int = 120
):
    """Private-ColME on `DRIFT` for t slots with the privacy and asynchrony metrics per agent."""
    s = Scenario(
        protocol="private-colme",
        params=params,
        data=DRIFT,
        network=network or {"links": "ideal"},
        t_max=t,
        checkpoints=12,
        topology=topology,
        per_agent=True,
        metrics=("privacy", "colme-async"),
    )
    return run(s, streams=Streams(1, 0, 5, 7))


def mse_without_and_with_reset(params: dict) -> tuple[float, float]:
    """MSE at t = 400 when 20 agents all switch class at τ = 40: without forget, reset at τ."""
    data = {**SMALL, "agents": 20, "drift": {"model": "switch", "fraction": 1.0, "at": 40}}
    out = []
    for forget in (None, {"reset": 40}):
        with_forget = {**params, "forget": forget} if forget else params
        s = Scenario(protocol="private-colme", params=with_forget, data=data, t_max=400)
        m = run(s, streams=Streams(3, 0, 11, 22)).metrics
        out.append(float(m[(m.metric == "mse") & (m.t == 400)].value.iloc[0]))
    return out[0], out[1]


def assert_same_ledger(plain: Any, forgets: Any) -> None:
    """Every ε row of the ledger of run `forgets` (with ``forget``) equals run `plain`'s, exactly
    (forgetting is post-processing of the releases: the ledger counts the same ones)."""
    ledger = plain.metrics.metric.str.startswith("eps")
    assert ledger.any()
    pd.testing.assert_frame_equal(
        plain.metrics[ledger].reset_index(drop=True),
        forgets.metrics[ledger.to_numpy()].reset_index(drop=True),
        check_exact=True,
    )


def assert_refused_in_one_line(params: dict, fragment: str) -> None:
    """`params` with a window of 9 is refused at resolve, in one line that holds `fragment`."""
    scenario = Scenario(
        protocol="private-colme",
        params={**params, "forget": {"window": 9}},
        data={"model": "classes"},
        t_max=50,
    )
    with pytest.raises(ConfigError) as info:
        resolve(scenario)
    assert fragment in str(info.value) and "\n" not in str(info.value)
