"""The `desim` command end to end on the toy study: run, resume, failures, quick, plot, list."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
from _toy import TOY_STUDY, write_study

from desim.study.cli import main

PNG = b"\x89PNG\r\n\x1a\n"


def test_run_writes_results_and_figures_and_summarises(toy_study, capsys):
    assert main(["run", str(toy_study), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "4 runs: 4 done, 0 skipped (already done), 0 failed" in out
    assert "results:" in out and "toy.png" in out
    res = toy_study / "results"
    for name in ("metrics.parquet", "curves.parquet", "manifest.json"):
        assert (res / name).is_file()
    assert len(list((res / "runs").glob("*.parquet"))) == 4
    assert (toy_study / "figures" / "toy.png").read_bytes()[:8] == PNG

    assert main(["run", str(toy_study / "study.toml")]) == 0  # resume: nothing to do
    assert "0 done, 4 skipped (already done)" in capsys.readouterr().out


def test_changed_config_reruns_only_affected_runs(toy_run, capsys, no_figures):
    toy_study = toy_run  # the toy study after a run
    write_study(
        toy_study,
        TOY_STUDY.replace(
            "[[curve]]",
            '[[scenario]]\nname = "Toy C"\nprotocol = "toy-local-mean"\ndelta = 0.1\n\n[[curve]]',
        ),
    )
    capsys.readouterr()
    assert main(["run", str(toy_study)]) == 0
    assert "6 runs: 2 done, 4 skipped" in capsys.readouterr().out
    m = pd.read_parquet(toy_study / "results" / "metrics.parquet")
    assert list(m.scenario.unique()) == ["Toy A", "Toy B", "Toy C"]


def test_failing_run_exits_nonzero_and_keeps_the_rest(toy_study, capsys):
    write_study(
        toy_study, TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nfail_replicate = 0')
    )
    assert main(["run", str(toy_study), "--workers", "2"]) == 1
    captured = capsys.readouterr()
    assert "3 done, 0 skipped (already done), 1 failed" in captured.out
    assert "toy-b_r000: RuntimeError: toy failure in replicate 0" in captured.err
    assert "manifest.json" in captured.err
    man = json.loads((toy_study / "results" / "manifest.json").read_text())
    assert [e["status"] for e in man["runs"]] == ["done", "done", "failed", "done"]
    assert (toy_study / "figures" / "toy.png").is_file()  # drawn from what finished


def test_interrupt_exits_130_and_keeps_results(toy_study, capsys, monkeypatch):
    import desim.study.results as results

    def interrupted(study, workers=1, progress=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(results, "run_study", interrupted)
    assert main(["run", str(toy_study)]) == 130
    assert "run the same command again to resume" in capsys.readouterr().err


def test_quick_writes_under_quick_only(toy_study, capsys):
    assert main(["run", str(toy_study), "--quick"]) == 0
    assert "2 runs: 2 done" in capsys.readouterr().out
    assert not (toy_study / "results").exists() and not (toy_study / "figures").exists()
    quick = toy_study / "quick"
    m = pd.read_parquet(quick / "results" / "metrics.parquet")
    assert m.t.max() == 20 and set(m.replicate) == {0}
    assert (quick / "figures" / "toy.png").is_file()
    assert json.loads((quick / "results" / "manifest.json").read_text())["study"]["quick"]
    assert main(["plot", str(toy_study), "--quick"]) == 0


def test_config_error_after_a_run_leaves_results_untouched(toy_run, capsys):
    toy_study = toy_run  # the toy study after a run
    res = toy_study / "results"
    before = {p: p.read_bytes() for p in res.rglob("*") if p.is_file()}
    write_study(toy_study, TOY_STUDY.replace("agents = 6", "agents = 1"))
    capsys.readouterr()
    assert main(["run", str(toy_study)]) == 2
    err = capsys.readouterr().err
    assert err == f"desim: error: {toy_study / 'study.toml'}: data: agents = 1: must be ≥ 2\n"
    assert {p: p.read_bytes() for p in res.rglob("*") if p.is_file()} == before


def test_plot_redraws_from_results_without_running(toy_study, capsys):
    assert main(["plot", str(toy_study)]) == 2
    assert "no results yet" in capsys.readouterr().err
    assert not (toy_study / "figures").exists()
    assert main(["run", str(toy_study)]) == 0
    figure = toy_study / "figures" / "toy.png"
    figure.unlink()
    runs = sorted((toy_study / "results" / "runs").iterdir())
    assert main(["plot", str(toy_study)]) == 0
    assert figure.read_bytes()[:8] == PNG
    assert sorted((toy_study / "results" / "runs").iterdir()) == runs


def test_validate(toy_study, capsys):
    assert main(["validate", str(toy_study)]) == 0
    assert capsys.readouterr().out == "ok: 4 runs, 1 curves\n"
    assert main(["validate", str(toy_study), "--quick"]) == 0
    assert capsys.readouterr().out == "ok: 2 runs, 1 curves\n"
    assert not (toy_study / "results").exists()


def test_list_names_every_registered_component_with_parameters(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for header in ("protocols:", "data models:", "link models:", "curves:"):
        assert header in out
    assert "toy-local-mean" in out and "classes" in out and "ideal" in out
    assert "epsilon (a number, default 1.0): noise scale" in out
    assert "noise (one of 'none', 'gaussian', default 'none')" in out


@pytest.mark.parametrize(
    "argv", [["run", "x", "--workers", "0"], ["run", "x", "--workers", "two"], ["frobnicate"]]
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "desim: error:" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "usage: desim" in capsys.readouterr().err


def test_command_line_process_reports_a_missing_study(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "desim.study.cli", "validate", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("desim: error: ") and proc.stderr.count("\n") == 1
    assert "absent" in proc.stderr and proc.stdout == ""
