"""A study whose grid changes after it has results, titles with fields, progress in a log."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest
from _toy import TOY_STUDY, write_study

from desim.study.cli import main
from desim.study.progress import LogProgress, progress_bar
from desim.study.results import run_study
from desim.study.spec import load_study

EPSILON_GRID = '[grid]\n"defaults.epsilon" = [0.5, 1.0]\n'
AGENTS_GRID = '[grid]\n"data.agents" = [4, 6]\n'


def _run(folder, *flags) -> int:
    return main(["run", str(folder), "--no-progress", *flags])


@pytest.mark.parametrize(
    "grid",
    [
        pytest.param(EPSILON_GRID, id="epsilon"),
        # the slow set (a grid over agents added in the default set: ..._runs_with_quick)
        pytest.param(AGENTS_GRID, id="agents", marks=pytest.mark.slow),
    ],
)
def test_a_grid_added_to_a_study_with_results_runs_summarises_and_plots(
    toy_run, tmp_path, capsys, grid
):
    folder = toy_run
    write_study(folder, TOY_STUDY + grid)
    column = "epsilon" if "epsilon" in grid else "agents"
    for _ in range(2):  # the first run rebuilds the tables, the second finds them current
        assert _run(folder) == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err
    manifest = json.loads((folder / "results" / "manifest.json").read_text())
    assert manifest["invocations"][-1]["curves_computed"] == 1  # the old point's curve kept
    fresh = write_study(tmp_path / "fresh", TOY_STUDY + grid)
    assert run_study(load_study(fresh), progress=False).ok  # its tables only: no figure drawn
    for name in ("metrics.parquet", "curves.parquet"):  # the same tables as a fresh copy's
        assert (folder / "results" / name).read_bytes() == (fresh / "results" / name).read_bytes()
    curves = pd.read_parquet(folder / "results" / "curves.parquet")
    assert column in curves.columns and len(curves[column].unique()) == 2
    capsys.readouterr()
    assert main(["summary", str(folder)]) == 0
    out = capsys.readouterr().out
    assert column in out.splitlines()[0]
    assert main(["plot", str(folder)]) == 0
    assert main(["clean", str(folder), "--yes"]) == 0
    assert "removed 8 files" in capsys.readouterr().out  # the 4 old runs: records and sidecars


def test_a_grid_removed_from_a_study_with_results_runs_and_summarises(tmp_path, capsys):
    folder = write_study(tmp_path / "s", TOY_STUDY + EPSILON_GRID)
    assert _run(folder) == 0
    write_study(folder, TOY_STUDY)
    assert _run(folder) == 0
    assert "0 done, 4 skipped" not in capsys.readouterr().out
    assert "epsilon" not in pd.read_parquet(folder / "results" / "curves.parquet").columns
    assert main(["summary", str(folder)]) == 0
    assert main(["plot", str(folder)]) == 0


def test_summary_and_plot_of_a_grown_grid_before_it_is_run_say_what_is_missing(toy_run, capsys):
    folder = write_study(toy_run, TOY_STUDY + EPSILON_GRID)
    capsys.readouterr()
    assert main(["plot", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "no results of the current study.toml" in err and "Traceback" not in err


def test_a_grid_over_agents_runs_with_quick(tmp_path, capsys):
    quick = TOY_STUDY.replace("t_max = 20", "t_max = 20\nagents = 4")
    folder = write_study(tmp_path / "s", quick)
    assert _run(folder, "--quick") == 0
    write_study(folder, quick + '[grid]\n"data.agents" = [4, 8]\n')
    assert _run(folder, "--quick") == 0, capsys.readouterr().err
    assert main(["summary", str(folder), "--quick"]) == 0
    metrics = pd.read_parquet(folder / "quick" / "results" / "metrics.parquet")
    assert sorted(metrics.agents.unique()) == [4, 8]


def test_fields_in_the_study_title_are_filled_where_it_is_printed(tmp_path, capsys):
    titled = TOY_STUDY.replace('title = "toy"', 'title = "toy, M = {agents}, {replicates} runs"')
    folder = write_study(tmp_path / "s", titled)
    assert _run(folder) == 0
    assert "desim: toy, M = 6, 2 runs: 4 runs" in capsys.readouterr().out
    assert _run(folder, "--quick") == 0
    assert "desim: toy, M = 6, 1 runs: 2 runs" in capsys.readouterr().out
    write_study(folder, titled.replace("{agents}", "{agnets}"))
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "[study]: title: unknown field {agnets}; allowed: {agents}" in err


def test_progress_written_into_a_log_is_a_few_plain_lines(tmp_path, capsys):
    folder = write_study(tmp_path / "s")
    assert main(["run", str(folder)]) == 0  # stderr is captured: not a terminal
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if "/4 runs" in line]
    assert lines == [lines[0], lines[-1]] and "0/4 runs" in lines[0] and "4/4 runs" in lines[-1]


def test_a_log_progress_prints_at_most_one_line_per_step_and_interval():
    now = [0.0]
    out = io.StringIO()
    bar = LogProgress(100, "study", "run", out, interval=5.0, step=0.1, clock=lambda: now[0])
    for _ in range(100):
        now[0] += 1.0
        bar.update(1)
    bar.close()
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("study: 0/100 runs") and lines[-1].startswith("study: 100/100 runs")
    assert 3 <= len(lines) <= 12 and len(set(lines)) == len(lines)
    slow = io.StringIO()
    bar = LogProgress(100, "study", "run", slow, interval=1e9, clock=lambda: now[0])
    bar.update(100)
    bar.close()
    assert len(slow.getvalue().splitlines()) == 2  # start and end only


def test_a_progress_bar_on_a_terminal_is_a_live_bar():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = progress_bar(3, "study", "run", file=Terminal())
    assert not isinstance(bar, LogProgress)
    bar.close()
    assert isinstance(progress_bar(3, "study", "run", file=io.StringIO()), LogProgress)
