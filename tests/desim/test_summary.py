"""`desim.study.summary` against hand-computed values, and `desim summary` on a real study
folder."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from desim.study.cli import main
from desim.study.summary import (
    first_crossing,
    summarise_runs,
    time_to_recover,
    time_to_target,
)


def test_first_crossing_interpolates_on_log_log_axes():
    t = np.array([1.0, 10.0, 100.0])
    value = np.array([1.0, 1e-1, 1e-3])
    # between t = 10 (0.1) and t = 100 (1e-3): log10 value falls 2 per decade; 1e-2 is halfway
    assert first_crossing(t, value, 1e-2) == pytest.approx(10**1.5)
    assert first_crossing(t, value, 2.0) == 1.0  # already there at the first checkpoint
    assert first_crossing(t, value, 1e-1) == pytest.approx(10.0)  # exactly at a checkpoint
    assert math.isnan(first_crossing(t, value, 1e-4))  # never


def _frame() -> pd.DataFrame:
    rows = []
    for rep, scale in enumerate([1.0, 2.0, 100.0]):  # replicate 2 never reaches 1e-2
        for t, v in [(1, 1.0), (10, 0.1), (100, 1e-3)]:
            rows.append(("A", rep, t, "mse", v * scale))
    return pd.DataFrame(rows, columns=["scenario", "replicate", "t", "metric", "value"])


def test_time_to_target_per_replicate():
    hits = time_to_target(_frame(), 1e-2)
    assert hits["t_target"].iloc[0] == pytest.approx(10**1.5)
    # replicate 1: 0.2 at t=10, 2e-3 at t=100: log-distance 1 decade of value per 0.5 decade
    assert hits["t_target"].iloc[1] == pytest.approx(10 ** (1 + math.log10(20) / 2))
    assert math.isnan(hits["t_target"].iloc[2])


def test_summarise_runs_mean_stderr_and_median_time():
    table = summarise_runs(_frame(), target=1e-2)
    row = table.iloc[0]
    last = np.array([1e-3, 2e-3, 1e-1])
    assert row["value"] == pytest.approx(last.mean())
    assert row["stderr"] == pytest.approx(last.std(ddof=1) / math.sqrt(3))
    assert row["replicates"] == 3 and row["reached"] == 2
    # the unreached run counts as latest: the median is replicate 1's time
    assert row["t_target_median"] == pytest.approx(10 ** (1 + math.log10(20) / 2))
    at10 = summarise_runs(_frame(), at=10)
    assert at10["value"].iloc[0] == pytest.approx(np.mean([0.1, 0.2, 10.0]))


def test_cli_summary_reads_the_results_of_a_run(toy_ran, capsys, tmp_path):
    out_csv = tmp_path / "summary.csv"
    assert main(["summary", str(toy_ran), "--target", "1e9", "--csv", str(out_csv)]) == 0
    printed = capsys.readouterr().out
    table = pd.read_csv(out_csv)
    assert set(table["scenario"]) == {"Toy A", "Toy B"} and "t_target_median" in printed
    assert (table["reached"] == table["replicates"]).all()  # every run is below 1e9 at once


def test_cli_summary_errors_are_one_line(toy_study, capsys):
    assert main(["summary", str(toy_study)]) == 2  # nothing run yet
    assert "no results yet; run `desim run" in capsys.readouterr().err
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["summary", str(toy_study), "--metric", "nope"]) == 2
    assert "--metric 'nope': not in the results" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["summary", str(toy_study), "--target", "-1"])


def test_time_to_recover_measures_from_the_disturbance_to_within_a_factor_of_before():
    # before τ = 100 the MSE is 1e-3 at t = 90; it jumps, then falls as 0.1·(100/t)²
    t = np.array([10.0, 90.0, 100.0, 200.0, 400.0, 800.0])
    up = [1e-2, 1e-3, 0.1, 0.025, 0.00625, 0.0015625]
    never = [1e-2, 1e-3, 0.1, 0.1, 0.1, 0.1]
    metrics = pd.DataFrame(
        {
            "scenario": ["a"] * 6 + ["b"] * 6,
            "replicate": 0,
            "t": np.concatenate([t, t]),
            "metric": "mse",
            "value": up + never,
        }
    )
    out = time_to_recover(metrics, after=100, within=2.0).set_index("scenario")
    assert out.loc["a", "before"] == out.loc["b", "before"] == 1e-3
    # back within 2e-3 between t = 400 (6.25e-3) and 800 (1.5625e-3): log-log interpolation of
    # a power law (exponent −2) is exact, 0.1·(100/t)² = 2e-3 at t = 100·√50
    assert out.loc["a", "t_recover"] == pytest.approx(100 * math.sqrt(50) - 100, rel=1e-12)
    assert math.isnan(out.loc["b", "t_recover"])
    table = summarise_runs(metrics, recover=(100, 2.0)).set_index("scenario")
    assert table.loc["a", "recovered"] == 1 and table.loc["b", "recovered"] == 0
    assert table.loc["a", "t_recover_median"] == pytest.approx(100 * math.sqrt(50) - 100)
    assert math.isnan(table.loc["b", "t_recover_median"])


def test_cli_summary_recover_reads_a_run(toy_ran, capsys):
    assert main(["summary", str(toy_ran), "--recover", "5", "--within", "3"]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-3:] == ["before", "recovered", "t_recover_median"]
