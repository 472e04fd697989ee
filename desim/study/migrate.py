"""Bring a results folder written by desim before results were tied to config hashes (manifest
schema 1) to the current layout, without changing one stored value.

Schema 1 named a run's record by its run id (``runs/<run id>.parquet``), stored the config
hash only inside it, kept provenance only for the last invocation, and held the study file's
absolute path. Migration, for every current run of the study:

- renames its record to ``runs/<config hash>.parquet`` (the bytes are not touched);
- a run the grid does not reach was stored once per grid point: the copies are checked to
  hold the same trajectory, bit for bit, and one is kept;
- writes its sidecar: checksums, trajectory fingerprint, and the provenance schema 1 recorded
  (desim version, git commit, library versions and platform of the invocation that wrote it,
  the run's wall time);
- writes the schema-2 manifest, with the checksums of metrics.parquet and curves.parquet,
  which are kept byte for byte: metrics.parquet must equal, byte for byte, the table the
  current code builds from the migrated records, and every stored curve must equal, value for
  value, the curve the current code computes. Anything else stops the migration.

Run it once per folder: ``python -m desim.study.migrate STUDY...``.
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from desim.study.results import (
    CURVES_FILE,
    DONE,
    MANIFEST_SCHEMA,
    METRICS_FILE,
    _contents_key,
    _curves_key,
    _gather,
    _Manifest,
    _table_entry,
    compute_curves,
    read_manifest,
)
from desim.study.spec import Study, canonical_hash, find_studies, load_study, slug
from desim.study.store import (
    RUNS_DIR,
    SIDECAR_SCHEMA,
    fingerprint,
    record_path,
    sha256_file,
    sidecar_path,
    write_json,
)


class MigrationError(RuntimeError):
    """A results folder that cannot be migrated without changing a stored value."""


def old_run_id(run) -> str:
    """The schema-1 id of a run: every grid column, whether or not it reaches the run."""
    parts = [slug(run.scenario.name)]
    parts += [f"{col}-{slug(v)}" for col, v in run.point.columns.items()]
    parts.append(f"r{run.scenario.replicate:03d}")
    return "_".join(parts)


def old_hash(run) -> str:
    """The schema-1 config hash of a run (every grid value, reached or not)."""
    return canonical_hash({"scenario": run.scenario.as_dict(), "grid": run.point.values})


def _stored_hash(path: Path) -> str | None:
    meta = pq.read_schema(path).metadata or {}
    value = meta.get(b"desim.config_hash")
    return value.decode() if value else None


def _trajectory(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)[["t", "metric", "value"]]


def migrate(study: Study) -> dict[str, int]:
    """Migrate the results folder of `study` in place; return counts of what was done."""
    results = study.results_dir
    old = read_manifest(study)
    if old is None:
        raise MigrationError(f"{results}: no manifest")
    if old.get("schema") == MANIFEST_SCHEMA:
        return {"runs": 0, "duplicates": 0}
    head = {
        k: old.get(k)
        for k in ("desim_version", "git_commit", "platform", "python", "numpy", "pandas", "pyarrow")
    }
    head.update(git_dirty=None, scipy=None, simpy=None)
    sidecars, duplicates = _migrate_runs(study, old, head)
    _write_manifest(study, old, head, sidecars)
    return {"runs": len(sidecars), "duplicates": duplicates}


def _migrate_runs(study: Study, old: dict, head: dict) -> tuple[dict[str, dict[str, Any]], int]:
    """Rename every stored run of the current study file to its record and write its sidecar;
    remove the copies of a run the grid does not reach. The sidecars by hash, and the number
    of copies removed."""
    results = study.results_dir
    by_old = {e["run_id"]: e for e in old.get("runs", []) if isinstance(e, dict)}
    sidecars: dict[str, dict[str, Any]] = {}
    kept: dict[str, str] = {}  # new hash -> fingerprint
    duplicates = 0
    for run in study.runs:
        rid = old_run_id(run)
        path = results / RUNS_DIR / f"{rid}.parquet"
        if run.config_hash in kept:  # a copy of a run the grid does not reach
            duplicates += _drop_copy(run, path, kept[run.config_hash], results)
            continue
        if not path.exists():
            continue  # never finished: it stays to do
        if _stored_hash(path) != old_hash(run):
            continue  # of an older version of the study file: not migrated, never shown
        target = record_path(results, run.config_hash)
        path.rename(target)
        side = _sidecar(run, target, by_old.get(rid, {}), old, head)
        write_json(side, sidecar_path(results, run.config_hash))
        sidecars[run.config_hash] = side
        kept[run.config_hash] = side["fingerprint"]
    return sidecars, duplicates


def _drop_copy(run, path: Path, kept: str, results: Path) -> int:
    """Remove `path`, a stored copy of a run already migrated, once it is shown to hold the
    same trajectory (fingerprint `kept`); 1 if it was removed, 0 if there was none."""
    if not path.exists():
        return 0
    if _stored_hash(path) != old_hash(run):
        raise MigrationError(f"{path}: config hash is not the current one")
    if fingerprint(_trajectory(path)) != kept:
        target = record_path(results, run.config_hash)
        raise MigrationError(
            f"{path}: differs from {target.name}, though the grid does not reach it"
        )
    path.unlink()
    return 1


def _sidecar(run, target: Path, entry: dict, old: dict, head: dict) -> dict[str, Any]:
    """The sidecar of a migrated run record `target` (its old manifest entry `entry`)."""
    return {
        "schema": SIDECAR_SCHEMA,
        "run_id": run.run_id,
        "scenario": run.scenario.name,
        "replicate": run.scenario.replicate,
        "grid": run.columns,
        "spawn": run.spawn,
        "provenance": {
            **head,
            "wall_seconds": entry.get("wall_seconds"),
            "finished": old.get("finished"),
            "migrated": "from a schema-1 results folder",
        },
        "warnings": [],
        "config_hash": run.config_hash,
        "fingerprint": fingerprint(_trajectory(target)),
        "files": {target.name: sha256_file(target)},
    }


def _write_manifest(study: Study, old: dict, head: dict, sidecars: dict) -> None:
    """The schema-2 manifest of the migrated folder, its tables checked against the records
    and the current code first."""
    manifest = _Manifest(study, {}, {}, 0)
    for h, side in sidecars.items():
        manifest.done(h, side)
    _check_metrics(study, sidecars, manifest)
    _check_curves(study, old, manifest)
    body = manifest.body()
    body["invocations"] = [
        {
            "started": old.get("started"),
            "finished": old.get("finished"),
            **head,
            "workers": old.get("workers"),
            "ran": len(sidecars),
            "failed": 0,
            "curves_computed": len(study.curve_jobs),
            "interrupted": old.get("interrupted"),
            "wall_seconds": old.get("wall_seconds"),
            "note": "recorded by a schema-1 manifest (the last invocation only); migrated",
        }
    ]
    write_json(body, study.results_dir / "manifest.json")


def _check_metrics(study: Study, sidecars: dict, manifest: _Manifest) -> None:
    """metrics.parquet must be, byte for byte, what the current code builds from the records."""
    path = study.results_dir / METRICS_FILE
    if not sidecars:
        return
    frame, damaged = _gather(study, study.results_dir, sidecars, False)
    if damaged:
        raise MigrationError(f"{study.results_dir}: damaged records {damaged}")
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buffer)
    if buffer.getvalue() != path.read_bytes():
        raise MigrationError(f"{path}: differs from the table built from the run records")
    manifest.tables[METRICS_FILE] = _table_entry(
        path, _contents_key(study, sidecars), sum(r.config_hash in sidecars for r in study.runs)
    )


def _check_curves(study: Study, old: dict, manifest: _Manifest) -> None:
    """Every stored curve must equal what the current code computes; then it is kept."""
    path = study.results_dir / CURVES_FILE
    fresh, entries, _ = compute_curves(study)
    manifest.curves = entries
    if not study.curve_jobs:
        return
    stored = pd.read_parquet(path)
    if (
        len(stored) != len(fresh)
        or not all(
            np.array_equal(
                stored[c].to_numpy(), fresh[c].to_numpy(), equal_nan=c in ("value", "stderr")
            )
            for c in ("t", "value", "stderr")
        )
        or list(stored["curve"]) != list(fresh["curve"])
    ):
        raise MigrationError(f"{path}: differs from the curves the current code computes")
    if any(e["status"] != DONE for e in entries):
        raise MigrationError(f"{path}: a curve fails with the current code")
    manifest.tables[CURVES_FILE] = _table_entry(path, _curves_key(entries), len(entries))


def main(argv: list[str]) -> int:
    """Migrate every study (or suite) named on the command line."""
    for arg in argv:
        for file in find_studies(arg):
            study = load_study(file)
            counts = migrate(study)
            print(
                f"{file.parent}: {counts['runs']} runs migrated, "
                f"{counts['duplicates']} duplicate copies removed"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
