"""PriCER studies end to end on small copies: a curves-only optimiser study, a simulation study
with a grid column on the x axis and a dashed bound, and the bundled study files' validity."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from desim.kernel.params import ConfigError
from desim.study.plots import draw_figures
from desim.study.results import run_study
from desim.study.spec import load_study

STUDIES = Path(__file__).resolve().parents[2] / "studies"

OPTIMISER = """
[study]
title = "objective against trust"
t_max = 1
checkpoints = 2

[data]
model = "vectors"
agents = 4
dimension = 10

[defaults]
p_server = [0.1, 0.9, 0.1, 0.5]
trust = "ring"

[grid]
"defaults.trusted" = [0, 1, 3]

[[curve]]
name = "optimum"
kind = "pricer-objective"
p_link = 0.5

[[curve]]
name = "as printed"
kind = "pricer-objective"
p_link = 0.5
sigma_search = false

[[plot]]
file = "objective.png"
x = "trusted"
curves = ["optimum", "as printed"]
"""

SIMULATION = """
[study]
title = "relaying against good nodes"
seed = 1
replicates = 3
t_max = 1
checkpoints = 2
metrics = ["pricer"]

[data]
model = "vectors"
agents = 6
dimension = 30

[topology]
model = "regular"
degree = 3

[network]
links = "bernoulli"
p_link = 0.8

[grid]
"network.good" = [1, 4]

[[scenario]]
name = "naive"
protocol = "pricer"
strategy = "naive"

[[scenario]]
name = "PriCER"
protocol = "pricer"

[[plot]]
file = "mse.png"
x = "good"
dashed = ["bound"]

[[plot]]
file = "mse-t.png"
dashed = ["expected_mse"]
"""


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "study.toml").write_text(text, encoding="utf-8")
    return folder


def test_a_curves_only_study_plots_an_optimiser_objective_against_a_grid_column(tmp_path):
    study = load_study(write(tmp_path / "opt", OPTIMISER))
    assert len(study.runs) == 0 and len(study.curve_jobs) == 6
    summary = run_study(study, progress=False)
    assert summary.ok
    curves = pd.read_parquet(study.results_dir / "curves.parquet")
    best = curves[curves["curve"] == "optimum"].groupby("trusted")["value"].first()
    printed = curves[curves["curve"] == "as printed"].groupby("trusted")["value"].first()
    assert (best <= printed * (1 + 1e-9)).all()
    assert best[3] < best[0]  # more trust, lower worst-case MSE
    files = draw_figures(study)
    assert [f.name for f in files] == ["objective.png"] and files[0].stat().st_size > 10_000


def test_a_simulation_study_puts_a_grid_column_on_the_x_axis_with_a_dashed_bound(tmp_path):
    study = load_study(write(tmp_path / "sim", SIMULATION))
    assert len(study.runs) == 12 and study.plots[0].x == "good"
    assert study.plots[0].dashed == ("bound",)
    summary = run_study(study, workers=2, progress=False)
    assert summary.ok, summary.failures
    metrics = pd.read_parquet(study.results_dir / "metrics.parquet")
    assert {"mse", "bound", "expected_mse", "sigma"} <= set(metrics["metric"])
    assert sorted(metrics["good"].unique()) == [1, 4]
    files = draw_figures(study)
    assert [f.name for f in files] == ["mse.png", "mse-t.png"]


def test_plot_options_are_validated(tmp_path):
    bad = SIMULATION.replace('x = "good"', 'x = "goood"')
    with pytest.raises(ConfigError, match="x = 'goood': must be 't' or a grid column"):
        load_study(write(tmp_path / "bad", bad))
    # the pricer metric declares what it records: a dashed name it lacks is refused up front
    with pytest.raises(ConfigError, match="dashed = 'nope': no scenario records it"):
        load_study(
            write(
                tmp_path / "dashed", SIMULATION.replace('dashed = ["bound"]', 'dashed = ["nope"]')
            )
        )
    with pytest.raises(ConfigError, match="no \\[\\[scenario\\]\\] and no \\[\\[curve\\]\\]"):
        load_study(write(tmp_path / "empty", '[study]\ntitle = "x"\n'))


@pytest.mark.parametrize("name, runs, curves", [("pricer-fig3", 0, 130), ("pricer-fig4", 1650, 0)])
def test_the_bundled_pricer_studies_are_valid(name, runs, curves):
    study = load_study(STUDIES / name)
    assert len(study.runs) == runs and len(study.curve_jobs) == curves
