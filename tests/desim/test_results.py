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

RUN_FIELDS = {"run_id", "scenario", "replicate", "grid", "status", "config_hash", "spawn",
              "wall_seconds", "error"}
HEAD_FIELDS = {"schema", "desim_version", "study", "root_seed", "git_commit", "platform",
               "python", "numpy", "pandas", "pyarrow", "workers", "started", "finished",
               "wall_seconds", "interrupted", "counts", "curves", "runs"}


def manifest(folder):
    return json.loads((folder / "results" / "manifest.json").read_text())


def mtimes(folder):
    return {p.name: p.stat().st_mtime_ns for p in (folder / "results" / "runs").iterdir()}


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

    runs = sorted(p.name for p in (res / "runs").iterdir())
    assert runs == ["toy-a_r000.parquet", "toy-a_r001.parquet", "toy-b_r000.parquet",
                    "toy-b_r001.parquet"]
    meta = pq.read_schema(res / "runs" / "toy-a_r000.parquet").metadata
    assert meta[b"desim.config_hash"].decode() == study.runs[0].config_hash
    assert not (res / "agents.parquet").exists()

    man = manifest(toy_study)
    assert HEAD_FIELDS <= set(man)
    assert man["desim_version"] == desim.__version__ and man["root_seed"] == 7
    assert man["study"]["config_hash"] == study.config_hash
    assert man["counts"] == {"done": 4, "skipped-resumed": 0, "failed": 0, "pending": 0}
    assert man["finished"] and man["wall_seconds"] >= 0 and man["interrupted"] is False
    for entry, run in zip(man["runs"], study.runs, strict=True):
        assert RUN_FIELDS <= set(entry)
        assert entry["status"] == "done" and entry["run_id"] == run.run_id
        assert entry["config_hash"] == run.config_hash and entry["spawn"] == run.spawn
        assert set(entry["spawn"]) == {"seed", "replicate", "shared_key", "run_key"}


def test_rerun_skips_everything_and_rewrites_nothing(toy_study):
    run_study(load_study(toy_study), progress=False)
    before = mtimes(toy_study)
    metrics = (toy_study / "results" / "metrics.parquet").read_bytes()
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.skipped) == (0, 4)
    assert mtimes(toy_study) == before
    assert (toy_study / "results" / "metrics.parquet").read_bytes() == metrics
    entries = manifest(toy_study)["runs"]
    assert {e["status"] for e in entries} == {"skipped-resumed"}
    assert all(e["wall_seconds"] is not None for e in entries)  # kept from the first call


def test_changed_config_reruns_only_affected_runs(toy_study):
    run_study(load_study(toy_study), progress=False)
    before = mtimes(toy_study)
    text = TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nepsilon = 50.0')
    write_study(toy_study, text)
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.skipped) == (2, 2)
    after = mtimes(toy_study)
    assert after["toy-a_r000.parquet"] == before["toy-a_r000.parquet"]
    assert after["toy-b_r000.parquet"] != before["toy-b_r000.parquet"]
    status = {e["run_id"]: e["status"] for e in manifest(toy_study)["runs"]}
    assert status == {"toy-a_r000": "skipped-resumed", "toy-a_r001": "skipped-resumed",
                      "toy-b_r000": "done", "toy-b_r001": "done"}


def test_failed_run_is_recorded_and_the_others_are_kept(toy_study):
    write_study(toy_study, TOY_STUDY.replace('noise = "gaussian"',
                                             'noise = "gaussian"\nfail_replicate = 1'))
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
        ("Toy A", 0), ("Toy A", 1), ("Toy B", 0)]


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
    assert man["interrupted"] is True
    assert man["counts"] == {"done": 2, "skipped-resumed": 0, "failed": 0, "pending": 2}
    m = pd.read_parquet(toy_study / "results" / "metrics.parquet")
    assert set(m.scenario) == {"Toy A"}  # the finished runs are in the tables
    assert not list((toy_study / "results" / "runs").glob(".*.tmp"))

    monkeypatch.setattr(results, "run_scenario", real)
    summary = run_study(load_study(toy_study), progress=False)
    assert (summary.done, summary.skipped, summary.ok) == (2, 2, True)


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork",
                    reason="the toy plug-in reaches workers only through fork")
def test_metrics_bytes_do_not_depend_on_the_worker_count(tmp_path):
    grid = '[grid]\n"defaults.epsilon" = [0.5, 2.0]\n'
    one = write_study(tmp_path / "one", TOY_STUDY + grid)
    two = write_study(tmp_path / "two", TOY_STUDY + grid)
    run_study(load_study(one), workers=1, progress=False)
    summary = run_study(load_study(two), workers=2, progress=False)
    assert summary.done == 8
    assert manifest(two)["workers"] == 2
    for name in ("metrics.parquet", "curves.parquet"):
        assert (one / "results" / name).read_bytes() == (two / "results" / name).read_bytes()
    m = pd.read_parquet(one / "results" / "metrics.parquet")
    noisy = m[(m.scenario == "Toy B") & (m.metric == "mse")]
    assert noisy.groupby("epsilon").value.mean().loc[0.5] > noisy.groupby(
        "epsilon").value.mean().loc[2.0]  # the grid value reached the protocol


def test_rows_are_sorted_by_scenario_point_replicate_t_metric(tmp_path):
    text = TOY_STUDY.replace('name = "Toy A"', 'name = "Z first"')
    grid = '[grid]\n"data.agents" = [6, 4]\n'
    folder = write_study(tmp_path / "s", text + grid)
    run_study(load_study(folder), progress=False)
    m = pd.read_parquet(folder / "results" / "metrics.parquet")
    assert list(m.columns) == ["scenario", "replicate", "agents", "t", "metric", "value"]
    keys = list(zip(m.scenario.map({"Z first": 0, "Toy B": 1}), m.agents.map({6: 0, 4: 1}),
                    m.replicate, m.t, m.metric, strict=True))
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
