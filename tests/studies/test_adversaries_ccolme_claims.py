"""robustness/adversaries/README.md, its C-ColME section (`ccolme/`): the claims, on the stored
results (honest agents' MSE at T = 2000, mean of 3 replicates)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

RESULTS = (
    Path(__file__).resolve().parents[2]
    / "studies"
    / "robustness"
    / "adversaries"
    / "ccolme"
    / "results"
    / "metrics.parquet"
)


@pytest.fixture(scope="module")
def last() -> pd.Series:
    """Mean over replicates of every metric at T, by (scenario, metric)."""
    m = pd.read_parquet(RESULTS)
    return m[m["t"] == m["t"].max()].groupby(["scenario", "metric"])["value"].mean()


def _h(last: pd.Series, name: str) -> float:
    return last[(name, "mse_honest")]


def test_the_table_and_local(last):
    local = last[("local", "mse")]
    assert round(local, 6) == 1.15e-4
    table = {
        "C-ColME, f = 0": 3.1e-6,
        "C-ColME, shift 0.1 f = 0.1": 1.7e-3,
        "C-ColME median, f = 0": 1.1e-5,
        "C-ColME median, shift 0.1 f = 0.1": 1.2e-4,
        "C-ColME median, mimic f = 0.1": 9.5e-5,
        "Private-C-ColME, f = 0": 8.3e-6,
        "Private-C-ColME, shift 0.1 f = 0.3": 3.8e-4,
        "Private-C-ColME median, shift 0.1 f = 0.1": 3.9e-5,
        "Private-C-ColME trimmed, mimic f = 0.3": 2.9e-4,
        "Private-C-ColME, inflate f = 0.3": 2.1e-5,
    }
    for name, value in table.items():
        assert float(f"{_h(last, name):.1e}") == value, name
    # bold: every weighted and trimmed C-ColME entry under shift and mimicry is worse than local
    for step in ("C-ColME", "C-ColME trimmed"):
        for behaviour in ("shift 0.1", "mimic"):
            for f in (0.1, 0.2, 0.3):
                assert _h(last, f"{step}, {behaviour} f = {f}") > local


def test_c_colme_breaks_at_the_first_ten_percent(last):
    local = last[("local", "mse")]
    shifted = _h(last, "C-ColME, shift 0.1 f = 0.1")
    assert round(shifted / local) == 15
    assert round(shifted / _h(last, "C-ColME, f = 0"), -1) == 550
    assert round(last[("C-ColME, shift 0.1 f = 0.1", "accepting_adversaries")], 2) == 0.33
    assert round(last[("C-ColME, shift 0.1 f = 0.1", "adversaries_accepted")], 2) == 0.40


def test_the_median_works_on_a_sparse_graph_and_the_trim_barely(last):
    local = last[("local", "mse")]
    weighted = _h(last, "C-ColME, shift 0.1 f = 0.1")
    median = _h(last, "C-ColME median, shift 0.1 f = 0.1")
    assert round(weighted / median) == 14 and round(median / local, 2) == 1.06
    mimic = _h(last, "C-ColME, mimic f = 0.1") / _h(last, "C-ColME median, mimic f = 0.1")
    assert round(mimic) == 9 and _h(last, "C-ColME median, mimic f = 0.1") < local
    for behaviour in ("shift 0.1", "mimic"):
        assert _h(last, f"C-ColME median, {behaviour} f = 0.2") > local
        assert round(_h(last, f"C-ColME median, {behaviour} f = 0.3") / local) == 4
    trimmed = _h(last, "C-ColME trimmed, shift 0.1 f = 0.1")
    assert round(weighted / trimmed, 1) == 2.6 and round(trimmed / local, 1) == 5.7
    price = _h(last, "C-ColME median, f = 0") / _h(last, "C-ColME, f = 0")
    assert round(price, 1) == 3.6


def test_private_c_colme_degrades_more_gracefully(last):
    local = last[("local", "mse")]
    accepting = last[("Private-C-ColME, shift 0.1 f = 0.1", "accepting_adversaries")]
    assert round(accepting, 3) == 0.085

    def ratio(name: str) -> float:
        return _h(last, name) / local

    shift = [ratio(f"Private-C-ColME, shift 0.1 f = {f}") for f in (0.1, 0.2, 0.3)]
    assert [round(x, 2) for x in shift[:2]] == [1.08, 0.98] and round(shift[2], 1) == 3.3
    median = [ratio(f"Private-C-ColME median, shift 0.1 f = {f}") for f in (0.1, 0.2, 0.3)]
    assert [round(x, 2) for x in median[:2]] == [0.34, 0.68] and round(median[2], 1) == 1.5
    price = _h(last, "Private-C-ColME median, f = 0") / _h(last, "Private-C-ColME, f = 0")
    assert round(price, 1) == 2.1
    assert round(ratio("Private-C-ColME, mimic f = 0.2"), 1) == 1.5
    assert ratio("Private-C-ColME, mimic f = 0.1") < 1
    assert round(ratio("Private-C-ColME median, mimic f = 0.2"), 2) == 0.97
    assert round(ratio("Private-C-ColME median, mimic f = 0.3"), 1) == 2.5


def test_inflated_sizes_do_little(last):
    local = last[("local", "mse")]
    clean = _h(last, "C-ColME, f = 0")
    for f in (0.1, 0.2, 0.3):
        assert abs(_h(last, f"C-ColME, inflate f = {f}") / clean - 1) <= 0.2
    inflated = _h(last, "Private-C-ColME, inflate f = 0.3")
    assert round(inflated / _h(last, "Private-C-ColME, f = 0"), 1) == 2.5
    assert round(local / inflated, 1) == 5.6
