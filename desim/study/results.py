"""Running a study and keeping what it produced (DESIGN principles 7, 8 and 9).

Layout of ``results/``:

- ``runs/<run_id>.parquet`` one file per finished run (its tidy metrics, with the run's config
  hash in the file's metadata), written atomically the moment the run ends;
  ``runs/<run_id>.agents.parquet`` next to it when the study keeps per-agent errors;
- ``metrics.parquet`` columns ``scenario, replicate, t, metric, value`` and one column per grid
  parameter, rebuilt from the run files of the study's current runs;
- ``curves.parquet`` the closed-form curves: ``curve, t, metric, value, stderr`` (+ grid);
- ``agents.parquet`` per-agent squared errors ``scenario, replicate, t, agent, value`` (+ grid);
- ``manifest.json`` versions, git commit, config hash, seed, platform, times and per-run status.

A run whose file exists with the same config hash is skipped, so a study interrupted by Ctrl-C
or a crash resumes where it stopped. Every file is written to a temporary name in its folder
and then renamed, so no reader ever sees half a file.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

import desim
from desim.kernel.params import ConfigError
from desim.kernel.recorder import log_checkpoints
from desim.study.scenario import run as run_scenario
from desim.study.spec import Run, Study

RUNS_DIR = "runs"
METRICS_FILE = "metrics.parquet"
CURVES_FILE = "curves.parquet"
AGENTS_FILE = "agents.parquet"
MANIFEST_FILE = "manifest.json"
#: Parquet metadata key holding a run file's config hash (what resuming compares).
HASH_KEY = b"desim.config_hash"
#: Version of the manifest layout, bumped when fields change meaning.
MANIFEST_SCHEMA = 1
#: The manifest is rewritten at most this often while runs finish (and always at the end).
MANIFEST_INTERVAL = 2.0

#: Status of a run in the manifest.
DONE, FAILED, SKIPPED, PENDING = "done", "failed", "skipped-resumed", "pending"


@dataclass
class Summary:
    """What `run_study` did: run counts by outcome, wall time, where results are, failures.

    `failures` lists (what, error) for every failed run (by run id) and every failed curve.
    """

    done: int
    skipped: int
    failed: int
    pending: int
    wall_seconds: float
    results_dir: Path
    failures: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every run of the study and every curve has a result."""
        return not self.failures and self.pending == 0


# --------------------------------------------------------------------------------------------
# atomic files


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """Call `write(tmp)` on a temporary path in `path`'s folder, then rename it to `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes owner-only files; results are shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(
    frame: pd.DataFrame, path: Path, metadata: dict[bytes, bytes] | None = None
) -> None:
    """Write `frame` (without its index) to `path` atomically, adding `metadata` to its schema."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_json(obj: Any, path: Path) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    text = json.dumps(obj, indent=2, default=str) + "\n"
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def _file_hash(path: Path) -> str | None:
    """The config hash stored in a run file, or None if the file is absent or unreadable."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return None
    value = meta.get(HASH_KEY)
    return value.decode() if value else None


# --------------------------------------------------------------------------------------------
# one run (executed in a worker process when workers > 1)


def run_path(results_dir: Path, run: Run, agents: bool = False) -> Path:
    """Path of the record of `run` (or of its per-agent errors)."""
    suffix = ".agents.parquet" if agents else ".parquet"
    return results_dir / RUNS_DIR / f"{run.run_id}{suffix}"


def _with_keys(frame: pd.DataFrame, run: Run) -> pd.DataFrame:
    """`frame` with the run's scenario, replicate and grid columns in front."""
    keys = {"scenario": run.scenario.name, "replicate": run.scenario.replicate}
    keys.update(run.point.columns)
    front = pd.DataFrame({k: [v] * len(frame) for k, v in keys.items()})
    front["replicate"] = front["replicate"].astype(np.int64)
    return pd.concat([front, frame.reset_index(drop=True)], axis=1)


def is_done(results_dir: Path, run: Run) -> bool:
    """True when `run`'s record exists with the run's current config hash."""
    if _file_hash(run_path(results_dir, run)) != run.config_hash:
        return False
    if run.scenario.per_agent:
        return _file_hash(run_path(results_dir, run, agents=True)) == run.config_hash
    return True


def execute_run(run: Run, results_dir: Path) -> dict[str, Any]:
    """Simulate `run`, write its record(s), and return its manifest status fields.

    Exceptions of the simulation are caught and returned as a failed status so that one bad
    run never stops the others; KeyboardInterrupt is not caught.
    """
    start = time.perf_counter()
    try:
        out = run_scenario(run.scenario)
        meta = {HASH_KEY: run.config_hash.encode(), b"desim.run_id": run.run_id.encode()}
        if run.scenario.per_agent and out.agents is not None:
            # the agents file goes first: the main record marks the run as complete
            write_parquet(_with_keys(out.agents, run), run_path(results_dir, run, True), meta)
        metrics = out.metrics.sort_values(["t", "metric"], kind="stable")
        write_parquet(_with_keys(metrics, run), run_path(results_dir, run), meta)
    except Exception as exc:  # recorded in the manifest; the study goes on
        return {
            "status": FAILED,
            "wall_seconds": round(time.perf_counter() - start, 3),
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    return {"status": DONE, "wall_seconds": round(time.perf_counter() - start, 3), "error": None}


# --------------------------------------------------------------------------------------------
# closed-form curves


def compute_curves(study: Study) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Every curve of `study` at every grid point on the checkpoint times, and their status."""
    t = log_checkpoints(study.t_max, study.checkpoints).astype(float)
    frames, status = [], []
    for job in study.curve_jobs:
        entry = {"curve": job.curve.name, "grid": job.point.columns, "status": DONE, "error": None}
        try:
            mean, stderr = job.params.curve(t.copy(), job.data)
            mean = np.broadcast_to(np.asarray(mean, dtype=float), t.shape)
            stderr = np.broadcast_to(np.asarray(stderr, dtype=float), t.shape)
        except Exception as exc:  # a broken curve must not cost the simulated results
            entry.update(status=FAILED, error=f"{type(exc).__name__}: {exc}")
            status.append(entry)
            continue
        status.append(entry)
        frame = pd.DataFrame({"curve": [job.curve.name] * len(t)})
        for col, value in job.point.columns.items():
            frame[col] = [value] * len(t)
        frame["t"] = t
        frame["metric"] = "mse"
        frame["value"] = mean
        frame["stderr"] = stderr
        frames.append(frame)
    columns = ["curve", *study.grid_columns.values(), "t", "metric", "value", "stderr"]
    curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    return curves[columns], status


# --------------------------------------------------------------------------------------------
# tables rebuilt from run files


def _gather(study: Study, results_dir: Path, runs: list[Run], agents: bool) -> pd.DataFrame:
    """The records of `runs` in study order, each sorted by time (and metric or agent)."""
    grid = list(study.grid_columns.values())
    last = ["t", "agent", "value"] if agents else ["t", "metric", "value"]
    columns = ["scenario", "replicate", *grid, *last]
    frames = [pd.read_parquet(run_path(results_dir, r, agents)) for r in runs]
    if not frames:
        return pd.DataFrame(columns=columns)
    # runs are in study order (scenario, grid point, replicate) and each file is sorted
    return pd.concat(frames, ignore_index=True)[columns]


def rebuild_tables(study: Study, done: list[Run]) -> None:
    """Rewrite metrics.parquet (and agents.parquet) from the records of the `done` runs."""
    results_dir = study.results_dir
    order = {r.run_id: i for i, r in enumerate(study.runs)}
    done = sorted(done, key=lambda r: order[r.run_id])
    write_parquet(_gather(study, results_dir, done, False), results_dir / METRICS_FILE)
    if study.per_agent:
        write_parquet(_gather(study, results_dir, done, True), results_dir / AGENTS_FILE)


def load_metrics(study: Study) -> pd.DataFrame:
    """The study's metrics.parquet; a `ConfigError` says to run the study first if absent."""
    path = study.results_dir / METRICS_FILE
    if not path.is_file():
        flag = " --quick" if study.quick else ""
        raise ConfigError(f"{path}: no results yet; run `desim run {study.folder}{flag}` first")
    return pd.read_parquet(path)


def load_curves(study: Study) -> pd.DataFrame | None:
    """The study's curves.parquet, or None when it has none."""
    path = study.results_dir / CURVES_FILE
    return pd.read_parquet(path) if path.is_file() else None


def read_manifest(study: Study) -> dict[str, Any] | None:
    """The study's manifest.json, or None when absent or unreadable."""
    try:
        return json.loads((study.results_dir / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------------------------
# the manifest


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def git_commit(folder: Path) -> str | None:
    """The commit checked out in the git repository holding `folder`, or None."""
    try:
        out = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _run_entry(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "scenario": run.scenario.name,
        "replicate": run.scenario.replicate,
        "grid": run.point.columns,
        "status": PENDING,
        "config_hash": run.config_hash,
        "spawn": run.spawn,
        "wall_seconds": None,
        "error": None,
    }


class _Manifest:
    """The manifest of one `run_study` call, rewritten atomically as runs finish."""

    def __init__(self, study: Study, workers: int) -> None:
        self.path = study.results_dir / MANIFEST_FILE
        self.study = study
        self.start = time.perf_counter()
        self._written = 0.0
        self.head: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA,
            "desim_version": desim.__version__,
            "study": {
                "title": study.title,
                "file": study.file.name,
                "config_hash": study.config_hash,
                "quick": study.quick,
            },
            "root_seed": study.seed,
            "git_commit": git_commit(study.folder),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "pandas": pd.__version__,
            "pyarrow": pa.__version__,
            "workers": workers,
            "started": _now(),
            "finished": None,
            "wall_seconds": None,
            "interrupted": False,
        }
        self.curves: list[dict[str, Any]] = []
        self.runs = {run.run_id: _run_entry(run) for run in study.runs}

    def counts(self) -> dict[str, int]:
        """Number of runs by status."""
        out = {DONE: 0, SKIPPED: 0, FAILED: 0, PENDING: 0}
        for entry in self.runs.values():
            out[entry["status"]] += 1
        return out

    def write(self, final: bool = False, force: bool = False) -> None:
        """Rewrite manifest.json (throttled unless `final` or `force`)."""
        now = time.perf_counter()
        if not (final or force) and now - self._written < MANIFEST_INTERVAL:
            return
        self._written = now
        head = dict(self.head)
        head["wall_seconds"] = round(now - self.start, 3)
        if final:
            head["finished"] = _now()
        body = {**head, "counts": self.counts(), "curves": self.curves,
                "runs": list(self.runs.values())}
        write_json(body, self.path)


# --------------------------------------------------------------------------------------------
# running


def _previous_wall_times(study: Study) -> dict[str, float]:
    """Wall time of runs recorded by an earlier call, keyed by config hash."""
    old = read_manifest(study) or {}
    return {
        r["config_hash"]: r["wall_seconds"]
        for r in old.get("runs", [])
        if isinstance(r, dict) and r.get("status") in (DONE, SKIPPED) and "config_hash" in r
    }


def _clean_temporaries(folder: Path) -> None:
    """Remove temporary files left by a run killed while writing (never a finished file)."""
    for tmp in folder.glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def run_study(study: Study, workers: int = 1, progress: bool = True) -> Summary:
    """Run every run of `study` not already done, write results, and summarise.

    `workers` = 1 runs in this process; more use a process pool. Runs are written as they
    finish; a failing run is recorded in the manifest and the others go on; on
    KeyboardInterrupt, finished runs stay, the manifest and metrics.parquet are brought up to
    date, and the interrupt propagates.
    """
    if workers < 1:
        raise ConfigError(f"workers = {workers}: must be an integer ≥ 1")
    results_dir = study.results_dir
    (results_dir / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    _clean_temporaries(results_dir / RUNS_DIR)
    _clean_temporaries(results_dir)
    manifest = _Manifest(study, workers)

    curves, manifest.curves = compute_curves(study)
    write_parquet(curves, results_dir / CURVES_FILE)

    previous = _previous_wall_times(study)
    todo: list[Run] = []
    for run in study.runs:
        if is_done(results_dir, run):
            manifest.runs[run.run_id].update(
                status=SKIPPED, wall_seconds=previous.get(run.config_hash)
            )
        else:
            todo.append(run)
    manifest.write(force=True)

    bar = tqdm(total=len(todo), desc=study.title[:40], unit="run",
               disable=not (progress and todo), file=sys.stderr)

    def finish(run: Run, record: dict[str, Any]) -> None:
        manifest.runs[run.run_id].update(record)
        bar.update(1)
        manifest.write()

    try:
        if workers == 1 or len(todo) <= 1:
            for run in todo:
                finish(run, execute_run(run, results_dir))
        else:
            _run_pool(todo, results_dir, min(workers, len(todo)), finish)
    except KeyboardInterrupt:
        manifest.head["interrupted"] = True
        raise
    finally:
        bar.close()
        ok = {DONE, SKIPPED}
        rebuild_tables(study, [r for r in study.runs if manifest.runs[r.run_id]["status"] in ok])
        manifest.write(final=True)

    counts = manifest.counts()
    failures = [
        (e["run_id"], e["error"]) for e in manifest.runs.values() if e["status"] == FAILED
    ]
    failures += [
        (f"curve {c['curve']!r}", c["error"]) for c in manifest.curves if c["status"] == FAILED
    ]
    return Summary(
        done=counts[DONE],
        skipped=counts[SKIPPED],
        failed=counts[FAILED],
        pending=counts[PENDING],
        wall_seconds=time.perf_counter() - manifest.start,
        results_dir=results_dir,
        failures=failures,
    )


def _run_pool(todo: list[Run], results_dir: Path, workers: int, finish) -> None:
    """Run `todo` on a process pool, calling `finish(run, record)` as each one completes."""
    pool = ProcessPoolExecutor(max_workers=workers)
    futures = {pool.submit(execute_run, run, results_dir): run for run in todo}
    finished: set[Future] = set()
    try:
        for future in as_completed(futures):
            finished.add(future)
            try:
                record = future.result()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a worker that died (e.g. out of memory)
                record = {"status": FAILED, "wall_seconds": None,
                          "error": f"{type(exc).__name__}: {exc}"}
            finish(futures[future], record)
    finally:
        # on Ctrl-C: drop runs not started; running ones finish writing or leave only a .tmp
        pool.shutdown(wait=True, cancel_futures=True)
        for future, run in futures.items():  # runs that ended while we were stopping count
            if future not in finished and future.done() and not future.cancelled():
                if future.exception() is None:
                    finish(run, future.result())
