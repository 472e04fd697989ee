"""The real-data studies (studies/real-data-*): what their READMEs claim, against the committed
results, and the county-elections study run end to end on a small synthetic file of the MIT
Election Data + Science Lab schema (the real file is not in the box)."""

from __future__ import annotations

import runpy
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from desim.study.cli import main

STUDIES = Path(__file__).resolve().parents[2] / "studies"
YEARS = (2000, 2004, 2008, 2012, 2016, 2020)


def _final_mse(study: str) -> pd.DataFrame:
    m = pd.read_parquet(STUDIES / study / "results" / "metrics.parquet")
    return m[(m["metric"] == "mse") & (m["t"] == m["t"].max())]


def test_efron_morris_shrinkage_beats_the_players_own_averages():
    """real-data/efron-morris/README.md: local 0.004184; EB consistent 0.001509 (63.9 %), as
    printed 0.001730 (58.7 %); private as printed gains at most 3.2 %; the private consistent
    plug-in is local in at least 48 of 50 replicates at every ε₀."""
    m = _final_mse("real-data/efron-morris")
    mean = m.groupby("scenario")["value"].mean()
    local = mean["local"]
    assert local == pytest.approx(0.004184, abs=5e-7)
    assert mean["EB, consistent plug-in"] == pytest.approx(0.001509, abs=5e-7)
    assert mean["EB, eq. (6) as printed"] == pytest.approx(0.001730, abs=5e-7)
    by_eps = m.groupby(["scenario", "epsilon"])["value"]
    printed = by_eps.mean()["private, as printed (Thm 4)"]
    assert (1 - printed / local).max() == pytest.approx(0.032, abs=5e-4)
    consistent = m[m["scenario"] == "private, consistent plug-in"]
    at_local = consistent.assign(same=np.isclose(consistent["value"], local, rtol=0, atol=1e-12))
    assert at_local.groupby("epsilon")["same"].sum().min() == 48


# -- county elections: the study on a synthetic file of the downloaded file's schema ----------


def synthetic_returns(n_counties: int = 30, seed: int = 3) -> pd.DataFrame:
    """Returns in the schema of countypres_2000-2020.csv: one row per county, year, party and
    mode; in 2020 every other county reports by mode only, one county also a TOTAL row; a
    row without a FIPS code (a federal precinct) and a county missing in 2008."""
    rng = np.random.default_rng(seed)
    lean = rng.beta(2.0, 2.0, n_counties)
    rows = []
    for year in YEARS:
        for c in range(n_counties):
            if c == n_counties - 1 and year == 2008:
                continue  # not in all six elections: left out
            rep_won = rng.random() < lean[c]
            modes = ["TOTAL"] if year < 2020 or c % 2 else ["ELECTION DAY", "ABSENTEE"]
            if year == 2020 and c == 0:
                modes = ["TOTAL", "ELECTION DAY", "ABSENTEE"]  # TOTAL wins over its parts
            for mode in modes:
                rep, dem = (600, 400) if rep_won else (400, 600)
                if mode == "ABSENTEE":  # flips the winner if the modes were double counted
                    rep, dem = (rep // 10, dem // 10) if c else (0, 1000)
                for party, votes in (("REPUBLICAN", rep), ("DEMOCRAT", dem), ("GREEN", 5)):
                    rows.append(
                        {
                            "year": year,
                            "state": "X",
                            "county_name": f"C{c}",
                            "county_fips": float(1001 + 2 * c),
                            "office": "US PRESIDENT",
                            "party": party,
                            "candidatevotes": votes,
                            "totalvotes": 1005,
                            "mode": mode,
                        }
                    )
    federal = dict(rows[0], county_fips=np.nan, county_name="FEDERAL PRECINCT")
    return pd.DataFrame([*rows, federal])


def _prepared(tmp_path) -> tuple[Path, pd.DataFrame]:
    """A copy of the study folder whose folds prepare.py made from `synthetic_returns`, and
    each county's outcomes (rows: FIPS, columns: years) worked out here from the returns."""
    folder = tmp_path / "elections"
    shutil.copytree(
        STUDIES / "real-data/county-elections",
        folder,
        ignore=shutil.ignore_patterns("folds", "results*", "figures*"),
    )
    returns = synthetic_returns()
    returns.to_csv(folder / "countypres_2000-2020.csv", index=False)
    prepare = runpy.run_path(str(folder / "prepare.py"))["main"]
    assert prepare([str(folder / "countypres_2000-2020.csv")]) == 0
    # Republican most votes; TOTAL rows where given (county 1001 in 2020), else the modes added
    used = returns[returns["mode"].isin(["TOTAL", "ELECTION DAY", "ABSENTEE"])]
    used = used[~((used["county_fips"] == 1001) & (used["mode"] != "TOTAL"))]
    votes = used.dropna().pivot_table(
        index=["county_fips", "year"], columns="party", values="candidatevotes", aggfunc="sum"
    )
    won = (votes["REPUBLICAN"] > votes["DEMOCRAT"]).astype(float).unstack("year").dropna()
    won.index = [f"{int(f):05d}" for f in won.index]
    return folder, won


def test_prepare_writes_one_fold_per_held_out_election(tmp_path):
    folder, won = _prepared(tmp_path)
    assert len(won) == 29  # the county missing in 2008 is left out
    for year in YEARS:
        fold = pd.read_csv(folder / "folds" / f"test-{year}.csv", dtype={"agent": str})
        assert sorted(fold["order"].unique()) == [y for y in YEARS if y != year]
        table = fold.pivot(index="agent", columns="order", values="value")
        pd.testing.assert_frame_equal(
            table, won.drop(columns=year).astype(int), check_names=False, check_dtype=False
        )
        truth = fold.groupby("agent")["truth"].first()
        assert truth.tolist() == won[year].astype(int).tolist()


@pytest.mark.slow
def test_county_elections_study_runs_on_a_file_of_the_mit_schema(tmp_path):
    folder, won = _prepared(tmp_path)
    assert main(["run", str(folder / "elections.toml"), "--no-progress"]) == 0
    m = pd.read_parquet(folder / "results-elections" / "metrics.parquet")
    m = m[(m["metric"] == "mse") & (m["t"] == 5)]
    for year in YEARS:  # local: the mean of the five training elections
        expected = float(np.mean((won.drop(columns=year).mean(axis=1) - won[year]) ** 2))
        fold = m[(m["file"] == f"folds/test-{year}.csv") & (m["scenario"] == "local")]
        assert fold["value"].item() == pytest.approx(expected, rel=1e-12)
    eb = m[m["scenario"] == "EB, consistent plug-in"]["value"]
    assert len(eb) == 6 and np.isfinite(eb).all()


def test_prepare_names_a_missing_column(tmp_path):
    prepare = runpy.run_path(str(STUDIES / "real-data/county-elections" / "prepare.py"))
    bad = synthetic_returns(4).drop(columns="mode")
    with pytest.raises(SystemExit, match="the file has no column 'mode'"):
        prepare["outcomes"](bad)


def _radon(study: str) -> tuple[float, float, pd.Series]:
    """Local's and EB's final MSE (means over replicates) and private EB's gain over local,
    by ε₀, of a radon study."""
    mean = _final_mse(study).groupby(["scenario", "epsilon"])["value"].mean()
    local = mean["local"].iloc[0]
    return local, mean["EB, σ_θ by moments"].iloc[0], 1 - mean["private, σ_θ by moments"] / local


def test_radon_shrinkage_gains_17_percent_and_privacy_only_from_eps_8():
    """real-data/radon/README.md: local 0.4002, EB 0.3314 (17.2 %); private within ±0.3 % of
    local for ε₀ ≤ 4, 4.5 % and 11.6 % lower at ε₀ = 8 and 16."""
    local, eb, gain = _radon("real-data/radon")
    assert local == pytest.approx(0.4002, abs=5e-5)
    assert eb == pytest.approx(0.3314, abs=5e-5)
    assert gain[gain.index <= 4].abs().max() < 0.003
    assert gain[8.0] == pytest.approx(0.045, abs=5e-4)
    assert gain[16.0] == pytest.approx(0.116, abs=5e-4)


def test_radon_unbalanced_gains_25_percent_and_keeps_more_under_privacy():
    """real-data/radon/README.md (unbalanced/): local 0.6445, EB 0.4859 (24.6 %); private 0 /
    1.0 / 2.3 / 5.0 / 14.0 / 18.8 % lower at ε₀ = 0.5 … 16."""
    local, eb, gain = _radon("real-data/radon/unbalanced")
    assert local == pytest.approx(0.6445, abs=5e-5)
    assert eb == pytest.approx(0.4859, abs=5e-5)
    np.testing.assert_allclose(gain, [0.0, 0.010, 0.023, 0.050, 0.140, 0.188], atol=5e-4)
