"""What studies/robustness/dynamic-graph/README.md claims of B-ColME and Private-B-ColME, checked
against its committed results: each test names the sentence it guards."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

STUDY = Path(__file__).resolve().parents[2] / "studies" / "robustness" / "dynamic-graph"
FAMILY = ("B-ColME", "Private-B-ColME")
RATES = (500, 100, 20)


@pytest.fixture(scope="module")
def mse() -> pd.DataFrame:
    """Mean and standard error of the MSE over replicates, by (scenario, every, t)."""
    m = pd.read_parquet(STUDY / "results" / "metrics.parquet")
    m = m[m["metric"] == "mse"]
    g = m.groupby(["scenario", "every", "t"])["value"]
    return pd.DataFrame({"mean": g.mean(), "se": g.std() / g.count().map(math.sqrt)})


def _z(a: pd.Series, b: pd.Series) -> float:
    return float((a["mean"] - b["mean"]) / math.hypot(a["se"], b["se"]))


@pytest.mark.parametrize(("scenario", "within"), [("B-ColME", 1.3), ("Private-B-ColME", 1.6)])
def test_between_changes_rewiring_costs_little(mse, scenario, within):
    """'Between changes (t = 2779) every rewired run is within 1.3× (B-ColME) and 1.6×
    (Private-B-ColME) of its static run, less than 2 SE apart'."""
    static = mse.loc[(scenario, 0, 2779.0)]
    for k in RATES:
        rewired = mse.loc[(scenario, k, 2779.0)]
        assert 1 / within <= rewired["mean"] / static["mean"] <= within
        assert abs(_z(rewired, static)) < 2


def test_one_slot_after_a_change_there_is_no_spike(mse):
    """'one slot after a change (t = 5000) they are 1.6–1.8× the static runs (1.4–2.4 SE apart),
    where C-ColME is 1000× worse than B-ColME'."""
    for scenario in FAMILY:
        static = mse.loc[(scenario, 0, 5000.0)]
        for k in RATES:
            rewired = mse.loc[(scenario, k, 5000.0)]
            assert 1.55 <= rewired["mean"] / static["mean"] <= 1.8
            assert 1.35 <= _z(rewired, static) <= 2.45
            c_colme = mse.loc[("C-ColME", k, 5000.0), "mean"]
            if scenario == "B-ColME":
                assert 950 <= c_colme / rewired["mean"] <= 1300


def test_every_run_is_far_better_than_local_and_private_b_colme_than_private_c_colme(mse):
    """'Every run is 14–26× (B-ColME) and 7–12× (Private-B-ColME) better than local at t = 2779
    and 5000, and Private-B-ColME is 6–8× better than Private-C-ColME one slot after a
    change.'"""
    x = mse["mean"]
    for scenario, low, high in (("B-ColME", 14, 26), ("Private-B-ColME", 6.95, 12.5)):
        for t in (2779.0, 5000.0):
            for k in (0, *RATES):
                assert low <= x["local", k, t] / x[scenario, k, t] <= high
    for k in RATES:
        assert 6 <= x["Private-C-ColME", k, 5000.0] / x["Private-B-ColME", k, 5000.0] <= 8


def test_rewiring_does_not_move_b_colmes_own_transient(mse):
    """'every B-ColME run, static or not, is worse than local before t ≈ 1200 (up to 35× at
    t = 198 …), then far better; Private-B-ColME, which tests again, until t ≈ 500.'"""
    x = mse["mean"]
    for k in (0, *RATES):
        assert x["B-ColME", k, 1151.0] > x["local", k, 1151.0]
        assert 34 <= x["B-ColME", k, 198.0] / x["local", k, 198.0] <= 35.5
        assert x["B-ColME", k, 1544.0] < 0.2 * x["local", k, 1544.0]
        assert x["Private-B-ColME", k, 477.0] > x["local", k, 477.0]
        assert x["Private-B-ColME", k, 858.0] < x["local", k, 858.0]
