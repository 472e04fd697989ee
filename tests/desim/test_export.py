"""`desim.load` and `desim export`: the current results, as tables, a Dataset and files."""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from _toy import TOY_STUDY, write_study

import desim
from desim.study.cli import main
from desim.study.results import load_results, run_study
from desim.study.spec import load_study

GRID = '[grid]\n"defaults.epsilon" = [0.5, 2.0]\n'


@pytest.fixture
def grid_study(tmp_path):
    folder = write_study(tmp_path / "g", TOY_STUDY + GRID)
    run_study(load_study(folder), progress=False)
    return folder


def test_load_returns_the_current_results_and_curves(grid_study):
    res = desim.load(grid_study)
    study = load_study(grid_study)
    loaded = load_results(study)
    pd.testing.assert_frame_equal(res.metrics, loaded.metrics)
    pd.testing.assert_frame_equal(res.curves, loaded.curves)
    assert list(res.metrics.columns) == ["scenario", "replicate", "epsilon", "t", "metric", "value"]
    assert res.grid == ["epsilon"]
    assert "8 runs" in repr(res)  # 2 scenarios × 2 ε × 2 replicates


def test_load_shows_only_the_current_version(grid_study):
    # a new study file version (another seed): the stored runs are stale, not shown
    write_study(grid_study, TOY_STUDY.replace("seed = 7", "seed = 8") + GRID)
    with pytest.raises(desim.ConfigError, match="older version"):
        desim.load(grid_study)
    run_study(load_study(grid_study), progress=False)
    res = desim.load(grid_study)
    assert len(res.metrics) == 2 * 2 * 2 * 8 * 2  # scenarios, ε, replicates, t, metrics
    assert any("older version" in n for n in res.notes)


def test_to_xarray_has_one_cell_per_row(grid_study):
    res = desim.load(grid_study)
    ds = res.to_xarray()
    assert ds["value"].dims == ("scenario", "epsilon", "replicate", "t", "metric")
    assert list(ds.scenario.values) == ["Toy A", "Toy B"]  # the study file's order
    assert ds["value"].shape == (2, 2, 2, 8, 2)
    assert int(ds["value"].notnull().sum()) == len(res.metrics)
    for row in res.metrics.sample(20, random_state=0).itertuples(index=False):
        cell = ds["value"].sel(
            scenario=row.scenario,
            epsilon=row.epsilon,
            replicate=row.replicate,
            t=row.t,
            metric=row.metric,
        )
        assert float(cell) == row.value  # exactly, not approximately
    assert ds["curve_value"].dims == ("curve", "epsilon", "t")
    curve = res.curves.iloc[3]
    assert (
        float(ds["curve_value"].sel(curve=curve.curve, epsilon=curve.epsilon, t=curve.t))
        == curve.value
    )
    assert ds.attrs["config_hash"] == load_study(grid_study).config_hash
    assert ds.attrs["root_seed"] == 7


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_export_tables_read_back_exactly(grid_study, tmp_path, fmt):
    out = tmp_path / f"out.{fmt}"
    assert main(["export", str(grid_study), "--format", fmt, "--out", str(out)]) == 0
    # pandas before 3 parses csv floats to within an ulp unless asked for round-trip precision
    csv = partial(pd.read_csv, float_precision="round_trip")
    read = csv if fmt == "csv" else pd.read_parquet
    res = desim.load(grid_study)
    back = read(out)
    assert list(back.columns) == list(res.metrics.columns)
    np.testing.assert_array_equal(back["value"].to_numpy(), res.metrics["value"].to_numpy())
    np.testing.assert_array_equal(back["t"].to_numpy(), res.metrics["t"].to_numpy())
    assert list(back["scenario"]) == list(res.metrics["scenario"])
    curves = read(tmp_path / f"out.curves.{fmt}")
    np.testing.assert_array_equal(curves["value"].to_numpy(), res.curves["value"].to_numpy())


def test_export_netcdf_round_trips_the_dataset(grid_study, tmp_path, capsys):
    assert main(["export", str(grid_study), "--format", "netcdf"]) == 0
    path = grid_study / "results.nc"  # default: beside the results folder
    assert str(path.name) in capsys.readouterr().out
    with xr.open_dataset(path) as back:
        expected = desim.load(grid_study).to_xarray()
        xr.testing.assert_identical(back.load(), expected)


def test_export_errors_are_one_line(grid_study, tmp_path, capsys):
    assert (
        main(
            [
                "export",
                str(grid_study),
                "--format",
                "csv",
                "--out",
                str(tmp_path / "missing" / "x.csv"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("desim: error: --out") and "\n" not in err
    empty = write_study(tmp_path / "empty", TOY_STUDY)
    assert main(["export", str(empty), "--format", "csv"]) == 2
    assert "no results yet" in capsys.readouterr().err
