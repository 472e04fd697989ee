"""robustness/adversaries/README.md, its B-ColME section (`ccolme/`, corrupted forwarding too):
the claims, on the stored results (honest agents' MSE at T = 2000, mean of 3 replicates)."""

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
FRACTIONS = (0.1, 0.2, 0.3)
BEHAVIOURS = ("shift 0.1", "mimic", "inflate")
ROWS = [f"{p}{s}" for p in ("B-ColME", "Private-B-ColME") for s in ("", " median", " trimmed")]
TABLE = {  # the README's table: f = 0, then each behaviour at f = 0.1 / 0.2 / 0.3
    "B-ColME": ["4.6e-6", "1.1e-3 2.4e-3 3.6e-3", "3.8e-4 8.7e-4 1.2e-3", "4.8e-6 4.8e-6 4.9e-6"],
    "B-ColME median": ["3.8e-5", "1.1e-4 3.3e-4 7.6e-4", "8.1e-5 1.6e-4 3.1e-4", "3.7e-5 " * 3],
    "B-ColME trimmed": [
        "3.4e-5",
        "2.0e-4 4.6e-4 8.1e-4",
        "9.9e-5 1.8e-4 2.7e-4",
        "3.4e-5 3.4e-5 3.3e-5",
    ],
    "Private-B-ColME": [
        "1.1e-5",
        "3.5e-5 1.5e-4 3.4e-4",
        "8.1e-5 2.1e-4 3.3e-4",
        "1.2e-5 1.1e-5 1.1e-5",
    ],
    "Private-B-ColME median": [
        "7.3e-5",
        "9.8e-5 1.3e-4 1.9e-4",
        "1.1e-4 1.8e-4 2.9e-4",
        "7.4e-5 7.3e-5 8.7e-5",
    ],
    "Private-B-ColME trimmed": [
        "5.7e-5",
        "1.1e-4 2.1e-4 2.6e-4",
        "1.1e-4 1.6e-4 2.4e-4",
        "5.5e-5 7.1e-5 7.2e-5",
    ],
}


@pytest.fixture(scope="module")
def last() -> pd.DataFrame:
    """Mean and standard error over replicates of every metric at T, by (scenario, metric)."""
    m = pd.read_parquet(RESULTS)
    return m[m["t"] == m["t"].max()].groupby(["scenario", "metric"])["value"].agg(["mean", "sem"])


def _h(last: pd.DataFrame, name: str) -> float:
    return float(last.loc[(name, "mse_honest"), "mean"])


def test_the_table_its_bold_entries_and_standard_errors(last):
    local = float(last.loc[("local", "mse"), "mean"])
    assert round(local, 6) == 1.15e-4
    for row in ROWS:
        names = [f"{row}, f = 0"] + [f"{row}, {b} f = {f}" for b in BEHAVIOURS for f in FRACTIONS]
        quoted = " ".join(TABLE[row]).split()
        assert [f"{_h(last, n):.1e}".replace("e-0", "e-") for n in names] == quoted, row
        # bold in the README: every entry above local, under the shift and mimicry at f ≥ 0.2
        for b in ("shift 0.1", "mimic"):
            for f in (0.2, 0.3):
                assert _h(last, f"{row}, {b} f = {f}") > local
        assert all(_h(last, f"{row}, inflate f = {f}") < local for f in FRACTIONS)
    bold_at_01 = {"B-ColME": ("shift 0.1", "mimic"), "B-ColME trimmed": ("shift 0.1",)}
    for row in ROWS:
        for b in ("shift 0.1", "mimic"):
            above = _h(last, f"{row}, {b} f = 0.1") > local
            assert above == (b in bold_at_01.get(row, ())), (row, b)
    errors = [
        last.loc[(f"{row}, {b} f = {f}", "mse_honest"), "sem"] / _h(last, f"{row}, {b} f = {f}")
        for row in ROWS
        for b in BEHAVIOURS
        for f in FRACTIONS
    ]
    assert round(min(errors) * 100) == 1 and round(max(errors) * 100) == 59


def test_b_colme_breaks_at_the_first_ten_percent(last):
    local = float(last.loc[("local", "mse"), "mean"])
    shifted = _h(last, "B-ColME, shift 0.1 f = 0.1")
    assert round(shifted / local, 1) == 9.9
    assert round(shifted / _h(last, "B-ColME, f = 0"), -1) == 250
    assert (
        round(last.loc[("B-ColME, shift 0.1 f = 0.1", "accepting_adversaries"), "mean"], 2) == 0.33
    )
    assert (
        round(last.loc[("B-ColME, shift 0.1 f = 0.1", "adversaries_accepted"), "mean"], 2) == 0.40
    )
    assert round(_h(last, "B-ColME, mimic f = 0.1") / local, 1) == 3.3


def test_the_median_works_and_costs_the_tables(last):
    local = float(last.loc[("local", "mse"), "mean"])
    median = _h(last, "B-ColME median, shift 0.1 f = 0.1")
    assert round(median / local, 2) == 0.97
    assert round(_h(last, "B-ColME, shift 0.1 f = 0.1") / median) == 10
    mimic = _h(last, "B-ColME median, mimic f = 0.1")
    assert round(mimic / local, 2) == 0.70
    assert round(_h(last, "B-ColME, mimic f = 0.1") / mimic, 1) == 4.7
    assert round(_h(last, "B-ColME median, shift 0.1 f = 0.3") / local, 1) == 6.6
    clean = _h(last, "B-ColME median, f = 0")
    assert round(clean / _h(last, "B-ColME, f = 0"), 1) == 8.2
    assert round(clean / local, 2) == 0.33
    assert round(_h(last, "B-ColME trimmed, shift 0.1 f = 0.1") / local, 1) == 1.8


def test_private_b_colme_degrades_more_gracefully(last):
    local = float(last.loc[("local", "mse"), "mean"])

    def ratio(name: str) -> float:
        return _h(last, name) / local

    accepting = last.loc[("Private-B-ColME, shift 0.1 f = 0.1", "accepting_adversaries"), "mean"]
    accepted = last.loc[("Private-B-ColME, shift 0.1 f = 0.1", "adversaries_accepted"), "mean"]
    assert round(accepting, 3) == 0.069 and round(accepted, 2) == 0.07
    shift = [ratio(f"Private-B-ColME, shift 0.1 f = {f}") for f in FRACTIONS]
    assert [round(x, 2) for x in shift] == [0.30, 1.32, 2.96]
    assert round(ratio("Private-C-ColME, shift 0.1 f = 0.1"), 2) == 1.08
    median = [ratio(f"Private-B-ColME median, shift 0.1 f = {f}") for f in FRACTIONS]
    assert round(median[0], 2) == 0.86 and [round(x, 1) for x in median[1:]] == [1.1, 1.7]
    assert median[0] > shift[0]
    assert round(shift[2] / median[2], 1) == 1.8
    price = _h(last, "Private-B-ColME median, f = 0") / _h(last, "Private-B-ColME, f = 0")
    assert round(price, 1) == 6.5
    assert round(ratio("Private-B-ColME, mimic f = 0.2"), 1) == 1.8


def test_inflated_counts_do_little(last):
    for row, within in (("B-ColME", 0.06), ("Private-B-ColME", 0.085)):
        clean = _h(last, f"{row}, f = 0")
        assert all(
            abs(_h(last, f"{row}, inflate f = {f}") / clean - 1) <= within for f in FRACTIONS
        )
    moved = [
        _h(last, f"Private-B-ColME{s}, inflate f = {f}") / _h(last, f"Private-B-ColME{s}, f = 0")
        for s in (" median", " trimmed")
        for f in FRACTIONS
    ]
    assert round(max(abs(x - 1) for x in moved), 2) == 0.26
    assert round(moved[-1] - 1, 2) == 0.26  # the largest: trimmed, f = 0.3
    errors = [
        last.loc[(f"Private-B-ColME{s}, inflate f = {f}", "mse_honest"), "sem"]
        / _h(last, f"Private-B-ColME{s}, inflate f = {f}")
        for s in (" median", " trimmed")
        for f in (0.2, 0.3)
    ]
    assert round(min(errors) * 100) == 2 and round(max(errors) * 100) == 8


# ---- "When the adversaries corrupt the sums they forward too" -------------------------------

# the README's table: MSE (ratio to the sums forwarded unchanged) at f = 0.1 / 0.2 / 0.3
FORWARDED = {
    ("B-ColME", "shift 0.1"): "3.7e-3 (3.2×) 1.0e-2 (4.3×) 1.9e-2 (5.2×)",
    ("B-ColME", "mimic"): "5.4e-4 (1.4×) 1.2e-3 (1.4×) 1.5e-3 (1.3×)",
    ("B-ColME median", "shift 0.1"): "1.1e-4 (1×) 3.3e-4 (1×) 7.6e-4 (1×)",
    ("Private-B-ColME", "shift 0.1"): "1.8e-4 (5.1×) 8.8e-4 (5.8×) 1.4e-3 (4.2×)",
    ("Private-B-ColME", "mimic"): "3.0e-4 (3.7×) 6.3e-4 (3.0×) 7.9e-4 (2.4×)",
    ("Private-B-ColME median", "shift 0.1"): "9.5e-5 (0.97×) 1.3e-4 (0.98×) 1.8e-4 (0.95×)",
}


def _fwd(row: str, behaviour: str, f: float) -> str:
    return f"{row} forwarded corrupted, {behaviour} f = {f}"


def test_the_forwarded_table_its_ratios_and_standard_errors(last):
    local = float(last.loc[("local", "mse"), "mean"])
    errors = []
    for (row, b), quoted in FORWARDED.items():
        found = []
        for f in FRACTIONS:
            new, old = _h(last, _fwd(row, b, f)), _h(last, f"{row}, {b} f = {f}")
            digits = 0 if row == "B-ColME median" else (2 if "median" in row else 1)
            ratio = f"{round(new / old, digits):.{digits}f}×" if digits else f"{new / old:.0f}×"
            found += [f"{new:.1e}".replace("e-0", "e-"), f"({ratio})"]
            errors.append(last.loc[(_fwd(row, b, f), "mse_honest"), "sem"] / new)
            # 'every entry is worse than local but the two medians' at f = 0.1'
            assert (new < local) == ("median" in row and f == 0.1), (row, b, f)
        assert found == quoted.split(), (row, b)
    assert round(min(errors) * 100) == 1 and round(max(errors) * 100) == 37


def test_corrupted_forwarding_multiplies_the_shift_and_breaks_private_b_colme(last):
    local = float(last.loc[("local", "mse"), "mean"])
    ratios = [
        _h(last, _fwd(row, "shift 0.1", f)) / _h(last, f"{row}, shift 0.1 f = {f}")
        for row in ("B-ColME", "Private-B-ColME")
        for f in FRACTIONS
    ]
    assert 3 <= min(ratios) and max(ratios) <= 6
    assert round(_h(last, _fwd("B-ColME", "shift 0.1", 0.1)) / local) == 32
    assert round(_h(last, "Private-B-ColME, shift 0.1 f = 0.1") / local, 2) == 0.30
    assert round(_h(last, _fwd("Private-B-ColME", "shift 0.1", 0.1)) / local, 1) == 1.5
    keeps = last.loc[(_fwd("Private-B-ColME", "shift 0.1", 0.1), "accepting_adversaries"), "mean"]
    assert round(keeps, 3) == 0.061
    mimic = [
        _h(last, _fwd(row, "mimic", f)) / _h(last, f"{row}, mimic f = {f}")
        for row in ("B-ColME", "Private-B-ColME")
        for f in FRACTIONS
    ]
    assert round(min(mimic), 1) == 1.3 and round(max(mimic), 1) == 3.7


def test_the_median_is_untouched_by_corrupted_forwarding():
    """B-ColME's median rows equal those with the sums forwarded unchanged to the bit (every
    replicate, every checkpoint, every metric); Private-B-ColME's (own noise draws) within
    two standard errors of the difference."""
    m = pd.read_parquet(RESULTS)
    keys = ["replicate", "t", "metric"]
    for f in FRACTIONS:
        a = m[m["scenario"] == f"B-ColME median, shift 0.1 f = {f}"].sort_values(keys)
        b = m[m["scenario"] == _fwd("B-ColME median", "shift 0.1", f)].sort_values(keys)
        assert len(a) > 0 and a["value"].to_numpy().tobytes() == b["value"].to_numpy().tobytes()
    last = m[(m["t"] == m["t"].max()) & (m["metric"] == "mse_honest")]
    for f in FRACTIONS:
        a = last[last["scenario"] == f"Private-B-ColME median, shift 0.1 f = {f}"]["value"]
        b = last[last["scenario"] == _fwd("Private-B-ColME median", "shift 0.1", f)]["value"]
        se = (a.var() / len(a) + b.var() / len(b)) ** 0.5
        assert abs(a.mean() - b.mean()) < 2 * se
        assert 0.95 <= round(b.mean() / a.mean(), 2) <= 0.98


def test_against_corrupted_forwarding_the_median_is_the_defence(last):
    local = float(last.loc[("local", "mse"), "mean"])
    b_median = _h(last, _fwd("B-ColME median", "shift 0.1", 0.1))
    assert round(b_median / local, 2) == 0.97
    assert round(_h(last, _fwd("B-ColME", "shift 0.1", 0.1)) / b_median) == 33
    p_median = _h(last, _fwd("Private-B-ColME median", "shift 0.1", 0.1))
    assert round(p_median / local, 2) == 0.83
    assert round(_h(last, _fwd("Private-B-ColME", "shift 0.1", 0.1)) / p_median, 1) == 1.9
    for row, below, worse in (("B-ColME", 25, 6.6), ("Private-B-ColME", 7.9, 1.6)):
        median = _h(last, _fwd(f"{row} median", "shift 0.1", 0.3))
        assert (
            round(_h(last, _fwd(row, "shift 0.1", 0.3)) / median, 1 if below < 10 else 0) == below
        )
        assert round(median / local, 1) == worse
