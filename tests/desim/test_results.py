"""Running studies: the output contract, resuming, failures, interrupts and determinism."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from _toy import TOY_STUDY, write_study

import desim
import desim.study.results as results
from desim.kernel.recorder import log_checkpoints
from desim.study.results import run_study
from desim.study.spec import load_study
from desim.study.store import fingerprint

RUN_FIELDS = {
    "run_id",
    "scenario",
    "replicate",
    "grid",
    "status",
    "config_hash",
    "spawn",
    "wall_seconds",
    "error",
    "points",
}
HEAD_FIELDS = {
    "schema",
    "study",
    "root_seed",
    "counts",
    "warnings",
    "tables",
    "curves",
    "runs",
    "invocations",
}
INVOCATION_FIELDS = {
    "started",
    "finished",
    "desim_version",
    "git_commit",
    "git_dirty",
    "python",
    "numpy",
    "scipy",
    "simpy",
    "pandas",
    "pyarrow",
    "platform",
    "workers",
    "ran",
    "failed",
    "interrupted",
    "wall_seconds",
}
PROVENANCE_FIELDS = {
    "desim_version",
    "git_commit",
    "git_dirty",
    "python",
    "numpy",
    "scipy",
    "simpy",
    "pandas",
    "pyarrow",
    "platform",
    "wall_seconds",
    "finished",
}


def manifest(folder):
    return json.loads((folder / "results" / "manifest.json").read_text())


def mtimes(folder):
    return {p.name: p.stat().st_mtime_ns for p in (folder / "results" / "runs").iterdir()}


def record(folder, run, suffix=".parquet"):
    return folder / "results" / "runs" / f"{run.config_hash}{suffix}"


def test_results_follow_the_output_contract(toy_study):
    study = load_study(toy_study)
    summary = run_study(study, progress=False)
    assert (summary.done, summary.skipped, summary.failed, summary.ok) == (4, 0, 0, True)
    res = toy_study / "results"

    m = pd.read_parquet(res / "metrics.parquet")
    assert list(m.columns) == ["scenario", "replicate", "t", "metric", "value"]
    assert list(m.scenario.unique()) == ["Toy A", "Toy B"]  # file order
    assert set(m.metric) == {"mse", "messages_ping"}
    checkpoints = log_checkpoints(50, 8)
    assert len(m) == 2 * 2 * len(checkpoints) * 2
    np.testing.assert_array_equal(np.unique(m.t), checkpoints)
    pings = m[(m.metric == "messages_ping") & (m.t == 50)].value
    assert (pings == 50).all()  # one ping per slot
    assert (m[m.metric == "mse"].value > 0).all()
    # common random numbers: without noise Toy B would equal Toy A; the data are shared
    a = m[(m.scenario == "Toy A") & (m.metric == "mse")].value.to_numpy()
    assert np.isfinite(a).all()

    c = pd.read_parquet(res / "curves.parquet")
    assert list(c.columns) == ["curve", "t", "metric", "value", "stderr"]
    np.testing.assert_allclose(c.value, 0.25 / checkpoints)
    assert (c.metric == "mse").all() and (c.stderr == 0).all()

    # records are named by config hash, each with a sidecar: checksums, fingerprint, provenance
    runs = sorted(p.name for p in (res / "runs").iterdir())
    assert runs == sorted(f"{r.config_hash}{s}" for r in study.runs for s in (".json", ".parquet"))
    meta = pq.read_schema(record(toy_study, study.runs[0])).metadata
    assert meta[b"desim.config_hash"].decode() == study.runs[0].config_hash
    side = json.loads(record(toy_study, study.runs[0], ".json").read_text())
    assert side["config_hash"] == study.runs[0].config_hash and side["run_id"] == "toy-a_r000"
    assert PROVENANCE_FIELDS <= set(side["provenance"])
    assert side["provenance"]["desim_version"] == desim.__version__
    assert side["provenance"]["wall_seconds"] >= 0 and side["provenance"]["scipy"]
    assert side["files"] == {
        f"{study.runs[0].config_hash}.parquet": results.sha256_file(
            record(toy_study, study.runs[0])
        )
    }
    trajectory = pd.read_parquet(record(toy_study, study.runs[0]))
    assert side["fingerprint"] == fingerprint(trajectory)
    assert not (res / "agents.parquet").exists()

    man = manifest(toy_study)
    assert HEAD_FIELDS <= set(man) and man["root_seed"] == 7
    assert man["study"] == {
        "title": "toy",
        "file": "study.toml",
        "config_hash": study.config_hash,
        "quick": False,
    }
    assert man["counts"] == {"done": 4, "failed": 0, "pending": 0}
    (inv,) = man["invocations"]
    assert INVOCATION_FIELDS <= set(inv) and inv["desim_version"] == desim.__version__
    assert inv["finished"] and inv["wall_seconds"] >= 0 and inv["interrupted"] is False
    assert (inv["ran"], inv["failed"], inv["workers"]) == (4, 0, 1)
    for entry, run in zip(man["runs"], study.runs, strict=True):
        assert RUN_FIELDS <= set(entry)
        assert entry["status"] == "done" and entry["run_id"] == run.run_id
        assert entry["config_hash"] == run.config_hash and entry["spawn"] == run.spawn
        assert set(entry["spawn"]) == {"seed", "replicate", "shared_key", "run_key"}
        assert entry["wall_seconds"] is not None
    assert str(toy_study.parent) not in (res / "manifest.json").read_text()  # no absolute path


def snapshot(folder):
    """Bytes and modification times of every file of a results folder."""
    res = folder / "results"
    return {
        str(p.relative_to(res)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(res.rglob("*"))
        if p.is_file() and not p.name.startswith(".desim")
    }


def test_a_no_op_resume_leaves_every_file_byte_identical(toy_study):
    run_study(load_study(toy_study), progress=False)
    before = snapshot(toy_study)
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.skipped) == (0, 4)
    assert snapshot(toy_study) == before  # manifest, records, sidecars, tables: untouched
    entries = manifest(toy_study)["runs"]
    assert {e["status"] for e in entries} == {"done"}
    assert all(e["wall_seconds"] is not None for e in entries)  # kept from the first call


def test_changed_config_reruns_only_affected_runs(toy_study):
    old = load_study(toy_study)
    run_study(old, progress=False)
    before = mtimes(toy_study)
    text = TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nepsilon = 50.0')
    write_study(toy_study, text)
    new = load_study(toy_study)
    summary = run_study(new, progress=False)
    assert (summary.done, summary.skipped, summary.stale) == (2, 2, 2)
    after = mtimes(toy_study)
    assert after[record(toy_study, new.runs[0]).name] == before[record(toy_study, old.runs[0]).name]
    assert new.runs[2].config_hash != old.runs[2].config_hash
    # the older version's records are kept (never overwritten), only not shown
    assert after[record(toy_study, old.runs[2]).name] == before[record(toy_study, old.runs[2]).name]
    assert record(toy_study, new.runs[2]).name in after
    status = {e["run_id"]: e["status"] for e in manifest(toy_study)["runs"]}
    assert status == {
        "toy-a_r000": "done",
        "toy-a_r001": "done",
        "toy-b_r000": "done",
        "toy-b_r001": "done",
    }
    assert [i["ran"] for i in manifest(toy_study)["invocations"]] == [4, 2]


def test_failed_run_is_recorded_and_the_others_are_kept(toy_study):
    write_study(
        toy_study, TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nfail_replicate = 1')
    )
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.failed, summary.ok) == (3, 1, False)
    assert summary.failures[0][0] == "toy-b_r001"
    assert "RuntimeError: toy failure in replicate 1" in summary.failures[0][1]
    entry = {e["run_id"]: e for e in manifest(toy_study)["runs"]}["toy-b_r001"]
    assert entry["status"] == "failed" and "RuntimeError" in entry["error"]
    assert "Traceback" in entry["traceback"]
    assert not (toy_study / "results" / "runs" / "toy-b_r001.parquet").exists()
    m = pd.read_parquet(toy_study / "results" / "metrics.parquet")
    assert sorted(set(zip(m.scenario, m.replicate, strict=True))) == [
        ("Toy A", 0),
        ("Toy A", 1),
        ("Toy B", 0),
    ]


def test_interrupt_keeps_finished_runs_and_resumes(toy_study, monkeypatch):
    calls = []
    real = results.run_scenario

    def interrupt_third(scenario):
        calls.append(scenario.name)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(scenario)

    monkeypatch.setattr(results, "run_scenario", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        run_study(load_study(toy_study), progress=False)
    man = manifest(toy_study)
    assert man["invocations"][-1]["interrupted"] is True
    assert man["counts"] == {"done": 2, "failed": 0, "pending": 2}
    m = pd.read_parquet(toy_study / "results" / "metrics.parquet")
    assert set(m.scenario) == {"Toy A"}  # the finished runs are in the tables
    assert not list((toy_study / "results" / "runs").glob(".*.tmp"))

    monkeypatch.setattr(results, "run_scenario", real)
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.skipped, summary.ok) == (2, 2, True)


@pytest.mark.skipif(
    multiprocessing.get_start_method() != "fork",
    reason="the toy plug-in reaches workers only through fork",
)
def test_metrics_bytes_do_not_depend_on_the_worker_count(tmp_path):
    grid = '[grid]\n"defaults.epsilon" = [0.5, 2.0]\n'
    one = write_study(tmp_path / "one", TOY_STUDY + grid)
    two = write_study(tmp_path / "two", TOY_STUDY + grid)
    run_study(load_study(one), workers=1, progress=False)
    summary = run_study(load_study(two), workers=2, progress=False)
    assert summary.done == 8
    assert manifest(two)["invocations"][-1]["workers"] == 2
    for name in ("metrics.parquet", "curves.parquet"):
        assert (one / "results" / name).read_bytes() == (two / "results" / name).read_bytes()
    m = pd.read_parquet(one / "results" / "metrics.parquet")
    noisy = m[(m.scenario == "Toy B") & (m.metric == "mse")]
    assert (
        noisy.groupby("epsilon").value.mean().loc[0.5]
        > noisy.groupby("epsilon").value.mean().loc[2.0]
    )  # the grid value reached the protocol


def test_rows_are_sorted_by_scenario_point_replicate_t_metric(tmp_path):
    text = TOY_STUDY.replace('name = "Toy A"', 'name = "Z first"')
    grid = '[grid]\n"data.agents" = [6, 4]\n'
    folder = write_study(tmp_path / "s", text + grid)
    run_study(load_study(folder), progress=False)
    m = pd.read_parquet(folder / "results" / "metrics.parquet")
    assert list(m.columns) == ["scenario", "replicate", "agents", "t", "metric", "value"]
    keys = list(
        zip(
            m.scenario.map({"Z first": 0, "Toy B": 1}),
            m.agents.map({6: 0, 4: 1}),
            m.replicate,
            m.t,
            m.metric,
            strict=True,
        )
    )
    assert keys == sorted(keys)
    c = pd.read_parquet(folder / "results" / "curves.parquet")
    assert list(c.columns) == ["curve", "agents", "t", "metric", "value", "stderr"]
    assert list(c.agents.unique()) == [6, 4]


def test_per_agent_errors_are_kept_on_request(tmp_path):
    text = TOY_STUDY.replace("checkpoints = 8", "checkpoints = 8\nper_agent = true")
    folder = write_study(tmp_path / "s", text)
    run_study(load_study(folder), progress=False)
    a = pd.read_parquet(folder / "results" / "agents.parquet")
    assert list(a.columns) == ["scenario", "replicate", "t", "agent", "value"]
    assert len(a) == 2 * 2 * len(log_checkpoints(50, 8)) * 6
    m = pd.read_parquet(folder / "results" / "metrics.parquet")
    mean = a.groupby(["scenario", "replicate", "t"], sort=False).value.mean().to_numpy()
    np.testing.assert_allclose(mean, m[m.metric == "mse"].value.to_numpy())
    assert run_study(load_study(folder), progress=False).skipped == 4


def test_growing_the_grid_runs_only_the_new_point(tmp_path):
    folder = write_study(tmp_path / "s", TOY_STUDY + '[grid]\n"data.agents" = [4]\n')
    run_study(load_study(folder), progress=False)
    write_study(folder, TOY_STUDY + '[grid]\n"data.agents" = [4, 6]\n')
    summary = run_study(load_study(folder), progress=False)
    assert (summary.done, summary.skipped) == (4, 4)
    m = pd.read_parquet(folder / "results" / "metrics.parquet")
    assert sorted(m.agents.unique()) == [4, 6]


def test_failed_curve_does_not_cost_the_runs(toy_study, monkeypatch):
    import _toy

    def broken(self, t, data):
        raise ValueError("no closed form here")

    monkeypatch.setattr(_toy.ToyCurve, "curve", broken)
    summary = run_study(load_study(toy_study), progress=False)
    assert summary.done == 4 and summary.failed == 0 and not summary.ok
    assert summary.failures == [("curve 'toy curve'", "ValueError: no closed form here")]
    assert manifest(toy_study)["curves"][0]["status"] == "failed"
    assert pd.read_parquet(toy_study / "results" / "curves.parquet").empty


def test_every_curve_failed_still_plots_summarises_and_exports(toy_study, monkeypatch, capsys):
    """With every curve failed, the stored curves table is empty: the figure, the summary and
    the export show the runs, and the note says the curve failed (not that a run computes it)."""
    import _toy

    from desim.study.cli import main

    def broken(self, t, data):
        raise ValueError("no closed form here")

    monkeypatch.setattr(_toy.ToyCurve, "curve", broken)
    assert main(["run", str(toy_study), "--no-progress"]) == 1  # the curve failed
    capsys.readouterr()
    assert main(["plot", str(toy_study)]) == 0
    assert "1 of 1 curves failed; their errors are in results/manifest.json" in (
        capsys.readouterr().err
    )
    assert (toy_study / "figures" / "toy.png").is_file()
    assert main(["summary", str(toy_study)]) == 0
    out = toy_study.parent / "export"
    assert main(["export", str(toy_study), "--format", "csv", "--out", str(out)]) == 0
    assert len(pd.read_csv(out)) > 0
