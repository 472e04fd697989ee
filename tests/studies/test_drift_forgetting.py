"""robustness/drift/README.md, "With forgetting": what the README claims about the forgetting
scenarios, checked against the committed results."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from desim.study.summary import summarise_runs

DRIFT = Path(__file__).resolve().parents[2] / "studies" / "robustness" / "drift" / "results"

#: The forgetting scenarios and the median time (slots) each takes back within 2× of its
#: pre-switch MSE, as the README's table gives them.
RECOVERS = {
    "Private-ColME, window 1000": 1214,
    "Private-ColME, reset at 2000": 1074,
    "EB-Gaussian, window 1000": 905,
    "EB-Gaussian, reset at 2000": 927,
    "local, window 1000": 903,
    "local, λ = 0.999": 2374,
    "local, reset at 2000": 929,
}

#: The README's MSE table (two significant figures, three for the first column's 1.05e-5).
TABLE = {
    "Private-ColME, window 1000": [1.05e-5, 3.7e-2, 2.6e-4, 8.8e-6, 1.3e-5],
    "Private-ColME, reset at 2000": [6.7e-6, 4.3e-3, 1.5e-5, 3.3e-6, 1.3e-6],
    "EB-Gaussian, window 1000": [2.6e-4, 3.3e-2, 2.6e-4, 2.5e-4, 2.6e-4],
    "EB-Gaussian, reset at 2000": [1.4e-4, 8.6e-3, 2.6e-4, 7.7e-5, 3.1e-5],
    "local, window 1000": [2.6e-4, 3.3e-2, 2.6e-4, 2.5e-4, 2.6e-4],
    "local, λ = 0.999": [1.8e-4, 3.2e-2, 4.3e-3, 1.7e-4, 1.3e-4],
    "local, reset at 2000": [1.4e-4, 4.3e-3, 2.6e-4, 7.7e-5, 3.1e-5],
}
SLOTS = [1874, 2057, 2984, 5214, 10_000]

#: Each local forgetting scenario and its closed-form curve.
CURVES = {
    "local, window 1000": "local, window 1000 (closed form)",
    "local, λ = 0.999": "local, λ = 0.999 (closed form)",
    "local, reset at 2000": "local, reset at 2000 (closed form)",
}


def _mse() -> pd.DataFrame:
    m = pd.read_parquet(DRIFT / "metrics.parquet")
    return m[m["metric"] == "mse"]


def _sig(x: float, digits: int = 2) -> float:
    return float(f"{x:.{digits - 1}e}")


def test_every_forgetting_scenario_recovers_in_the_time_the_readme_gives():
    table = summarise_runs(pd.read_parquet(DRIFT / "metrics.parquet"), recover=(2000, 2.0))
    table = table.set_index("scenario")
    for name, slots in RECOVERS.items():
        assert table.loc[name, "recovered"] == 8
        assert round(table.loc[name, "t_recover_median"]) == slots


def test_the_mse_table_and_its_standard_errors():
    m = _mse()
    stats = m.groupby(["scenario", "t"])["value"].agg(["mean", "std", "count"])
    for name, row in TABLE.items():
        for t, want in zip(SLOTS, row, strict=True):
            mean, std, n = stats.loc[(name, t)]
            digits = 3 if want == 1.05e-5 else 2
            assert _sig(mean, digits) == want, (name, t, mean)
            assert std / math.sqrt(n) < 0.16 * mean


def test_the_local_closed_forms_and_their_table_rows():
    curves = pd.read_parquet(DRIFT / "curves.parquet")
    curves = curves[curves["metric"] == "mse"]
    curves = curves.pivot_table(index="t", columns="curve", values="value")
    rows = {
        "local, window 1000 (closed form)": [2.5e-4, 3.3e-2, 2.6e-4, 2.5e-4, 2.5e-4],
        "local, λ = 0.999 (closed form)": [1.7e-4, 3.3e-2, 4.5e-3, 1.7e-4, 1.3e-4],
        "local, reset at 2000 (closed form)": [1.3e-4, 4.3e-3, 2.5e-4, 7.8e-5, 3.1e-5],
    }
    for name, row in rows.items():
        assert [_sig(curves.loc[t, name]) for t in SLOTS] == row
    # "within 4 standard errors of their curves at every checkpoint from the switch on"
    stats = _mse().groupby(["scenario", "t"])["value"].agg(["mean", "std", "count"])
    for scenario, curve in CURVES.items():
        s = stats.loc[scenario]
        s = s[s.index >= 2000]
        z = (s["mean"] - curves.loc[s.index, curve]) / (s["std"] / np.sqrt(s["count"]))
        assert (z.abs() < 4).all(), (scenario, z.abs().max())


def test_the_price_of_forgetting_before_the_switch_and_in_steady_state():
    """At t = 1874: a window of 1000 is 1.9× local's error (EB-Gaussian the same), 1.7× for
    Private-ColME, λ = 0.999 1.3×, a reset 1×; at 10⁴ Private-ColME's window is 10× its
    reset."""
    x = _mse().groupby(["scenario", "t"])["value"].mean()
    before = x.xs(1874, level="t")
    assert round(before["local, window 1000"] / before["local"], 1) == 1.9
    assert round(before["EB-Gaussian, window 1000"] / before["EB-Gaussian (PM-I, ε = 1)"], 1) == 1.9
    private = before["Private-ColME (PM-I, RR, ε = 1)"]
    assert round(before["Private-ColME, window 1000"] / private, 1) == 1.7
    assert round(before["local, λ = 0.999"] / before["local"], 1) == 1.3
    assert before["local, reset at 2000"] == pytest.approx(before["local"], rel=1e-12)
    late = x.xs(10_000, level="t")
    ratio = late["Private-ColME, window 1000"] / late["Private-ColME, reset at 2000"]
    assert round(ratio) == 10
