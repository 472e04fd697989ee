"""`desim run --scheduler`: runs computed on a real dask.distributed cluster of processes give
the same bytes as the local pool, even when a worker is killed mid-study."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from _toy import write_study

distributed = pytest.importorskip("distributed")

import desim.study.dask as desim_dask  # noqa: E402
from desim.study.cli import main  # noqa: E402
from desim.study.results import run_study  # noqa: E402
from desim.study.spec import load_study  # noqa: E402
from desim.study.store import StudyLock  # noqa: E402

# real protocols (the test-only toy protocol is not importable in spawned dask workers)
STUDY = """\
[study]
title = "dask"
seed = 11
replicates = 5
t_max = 300
checkpoints = 10

[data]
model = "classes"
agents = 24
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "Private-ColME"
protocol = "private-colme"
epsilon = 1.0

[[scenario]]
name = "local"
protocol = "local"

[[curve]]
name = "local (Prop. 1)"
kind = "local"

[[plot]]
file = "mse.png"
title = "MSE"
"""


LOCK_PROBE = """
import sys
from pathlib import Path
from desim.study.store import StudyLock, StudyLocked
try:
    with StudyLock(Path(sys.argv[1])):
        print("acquired")
except StudyLocked:
    print("locked")
"""


def tables(folder):
    res = folder / "results"
    out = {name: (res / name).read_bytes() for name in ("metrics.parquet", "curves.parquet")}
    out.update({p.name: p.read_bytes() for p in (res / "runs").glob("*.parquet")})
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The study run by the local pool of 2 workers."""
    folder = write_study(tmp_path_factory.mktemp("pool") / "s", STUDY)
    summary = run_study(load_study(folder), workers=2, progress=False)
    assert summary.ok and summary.done == 10
    return tables(folder)


def handler_levels() -> list[int]:
    """The levels of the log handlers of distributed and tornado (where they print)."""
    names = ("distributed", "tornado")
    return [h.level for name in names for h in logging.getLogger(name).handlers]


def test_local_cluster_gives_the_pool_bytes(tmp_path, reference, capsys):
    folder = write_study(tmp_path / "s", STUDY)
    levels = handler_levels()
    assert main(["run", str(folder), "--scheduler", "local:2", "--no-progress"]) == 0
    assert handler_levels() == levels  # held back during the run only
    assert "dask scheduler local:2" in capsys.readouterr().out
    assert tables(folder) == reference
    manifest = (folder / "results" / "manifest.json").read_text()
    assert '"scheduler": "local:2"' in manifest
    # a resume on the cluster finds everything done and writes nothing
    before = {p.name: p.stat().st_mtime_ns for p in (folder / "results").rglob("*")}
    summary = run_study(load_study(folder), progress=False, scheduler="local:1")
    assert (summary.done, summary.skipped) == (0, 10)
    assert {p.name: p.stat().st_mtime_ns for p in (folder / "results").rglob("*")} == before


def test_curves_are_computed_on_the_cluster(tmp_path, dask_cluster, monkeypatch):
    import desim.study.results as results

    def here(job, t):
        raise AssertionError("a curve was computed in the client")

    monkeypatch.setattr(results, "curve_value", here)  # the client's copy only
    folder = write_study(tmp_path / "s", STUDY)
    address = dask_cluster.scheduler.address
    summary = run_study(load_study(folder), progress=False, scheduler=address)
    assert summary.ok and not summary.failures


def test_killed_worker_loses_nothing(tmp_path, reference, dask_cluster, monkeypatch):
    """SIGKILL one busy worker after the first run is written: its tasks go to the other
    worker (the nanny restarts the killed one) and the results are the same bytes."""
    client = dask_cluster
    pids = client.run(os.getpid)
    killed = []
    store = desim_dask.store_run

    def store_and_kill(run, results_dir, out, head):
        if not killed:
            busy = [w for w, keys in client.processing().items() if keys] or list(pids)
            os.kill(pids[busy[0]], signal.SIGKILL)
            killed.append(busy[0])
        return store(run, results_dir, out, head)

    monkeypatch.setattr(desim_dask, "store_run", store_and_kill)
    folder = write_study(tmp_path / "s", STUDY)
    summary = run_study(load_study(folder), progress=False, scheduler=client.scheduler.address)
    assert killed and summary.ok and summary.done == 10
    assert tables(folder) == reference
    deadline = time.monotonic() + 30  # the nanny brings a new worker process up
    while time.monotonic() < deadline:
        now = client.run(os.getpid)
        if len(now) == 2:
            break
        time.sleep(0.2)
    assert pids[killed[0]] not in client.run(os.getpid).values()


def test_workers_of_another_desim_version_are_refused(tmp_path, dask_cluster, monkeypatch):
    import desim

    monkeypatch.setattr(desim, "__version__", "0.0.0-client")
    folder = write_study(tmp_path / "s", STUDY)
    with pytest.raises(desim.ConfigError, match="runs desim .*, this process desim 0.0.0"):
        run_study(load_study(folder), progress=False, scheduler=dask_cluster.scheduler.address)
    assert not list((folder / "results" / "runs").glob("*.parquet"))  # nothing ran


def test_local_workers_start_as_the_pools_do(tmp_path):
    """``local:N`` workers are forked where the pool's are (they inherit this process's imports:
    no desim, pandas, pyarrow to import again) and keep the dashboard's housekeeping seldom; the
    settings hold only for that cluster."""
    import dask

    if desim_dask._start_method() != "fork":
        pytest.skip("the pool's workers are not forked on this platform")
    before = dask.config.get("distributed.worker.multiprocessing-method")
    with StudyLock(tmp_path):  # forked while the study is locked, as `desim run` does
        with desim_dask.connect("local:1") as client:
            assert list(client.run(lambda: "desim.study.results" in sys.modules).values()) == [True]
            got = client.run(lambda: {k: dask.config.get(k) for k in desim_dask.LOCAL_CONFIG})
            assert list(got.values()) == [desim_dask.LOCAL_CONFIG]
        # the workers shared the lock file; their exit did not release the study's lock
        probe = subprocess.run(
            [sys.executable, "-c", LOCK_PROBE, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
        )
        assert probe.stdout.strip() == "locked"
    assert dask.config.get("distributed.worker.multiprocessing-method") == before


def test_batches_grow_to_about_a_second_of_work():
    sizer = desim_dask._Sizer()
    assert sizer.size(10_000, 4) == 1  # nothing measured yet: one run per task
    for _ in range(10):
        sizer.learn({"status": "computed", "wall_seconds": 0.05, "cpu_seconds": 0.01})
    assert sizer.size(10_000, 4) == 100  # 1 s / 0.01 s
    assert sizer.size(40, 4) == 5  # the tail still spreads: 40 runs / (2 × 4 slots)
    sizer.learn({"status": "computed", "wall_seconds": 1e4, "cpu_seconds": 1e4})
    assert sizer.size(10_000, 4) == 1  # long runs go one per task


def test_bad_scheduler_and_missing_dask_are_one_line(tmp_path, capsys, monkeypatch):
    folder = write_study(tmp_path / "s", STUDY)
    assert main(["run", str(folder), "--scheduler", "local:0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("desim: error: --scheduler 'local:0'") and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    assert main(["run", str(folder), "--scheduler", "local:2"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'desim[dask]'" in err and err.count("\n") == 1
    assert not (folder / "results").exists()  # nothing written
