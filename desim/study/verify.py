"""`desim verify` and `desim clean`: what a results folder stores, checked and tidied.

`verify_study` checks every file of ``runs/`` against its sidecar (the sha256 of each record,
the config hash it names) and the tables against the manifest, names every damaged, missing,
garbled or orphaned file, then re-runs the current runs (all, or a sample) in memory and
compares each trajectory with the stored record. It writes nothing.

`clean_study` removes the files no current run needs (older versions of the study file,
damaged records set aside).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from desim.kernel.params import ConfigError
from desim.study.progress import progress_bar
from desim.study.results import (
    AGENTS_FILE,
    CURVES_FILE,
    DONE,
    MANIFEST_FILE,
    METRICS_FILE,
    check_outputs,
    read_manifest,
    read_record,
    simulate,
)
from desim.study.spec import Run, Study
from desim.study.store import (
    DAMAGED_DIR,
    RUNS_DIR,
    StudyLock,
    fingerprint,
    provenance,
    record_name,
    sha256_file,
)

#: What a problem is: bytes that differ from their checksum; a file that should be there and
#: is not; a sidecar that cannot be trusted; a file that belongs to no run.
DAMAGED, MISSING, GARBLED, ORPHANED = "damaged", "missing", "garbled", "orphaned"
KINDS = (DAMAGED, MISSING, GARBLED, ORPHANED)
#: A config hash (sha256, hex): the stem of every file desim keeps in ``runs/``.
_HASH = re.compile(r"[0-9a-f]{64}")
#: The suffixes of a run's files: its sidecar, its record, its per-agent record.
_SUFFIXES = (".json", ".parquet", ".agents.parquet")
#: A sidecar larger than this is not one desim wrote.
_MAX_SIDECAR = 1 << 20


@dataclass
class Verified:
    """What `verify_study` found.

    `records` counts the stored files whose bytes were checked; `problems` holds (kind, line)
    for every damaged, missing, garbled or orphaned file, the line naming it relative to the
    study folder; `checked` the run ids re-run, `changed` (run id, line) those whose re-run
    differs from the stored trajectory, `failed` (run id, error) those whose re-run raised;
    `seed` the sample's seed (None when every stored run was re-run); `notes` what the user
    should know but is not a fault (stored runs of older versions, runs not run yet).
    """

    records: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    changed: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    seed: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when everything stored is intact and every re-run identical."""
        return not (self.problems or self.changed or self.failed)

    def count(self, kind: str) -> int:
        """The number of problems of `kind`."""
        return sum(k == kind for k, _ in self.problems)


# --------------------------------------------------------------------------------------------
# integrity: every stored file against its sidecar


class _Check:
    """The integrity check of one results folder, collecting what it finds."""

    def __init__(self, study: Study) -> None:
        self.study = study
        self.runs_dir = study.results_dir / RUNS_DIR
        self.current: dict[str, Run] = {r.config_hash: r for r in study.unique_runs}
        manifest = read_manifest(study) or {}
        entries = manifest.get("runs") if isinstance(manifest.get("runs"), list) else []
        self.done_by_manifest = {
            e["config_hash"]: e.get("run_id")
            for e in entries
            if isinstance(e, dict) and e.get("status") == DONE and e.get("config_hash")
        }
        tables = manifest.get("tables")
        self.tables = tables if isinstance(tables, dict) else {}
        self.out = Verified()
        self.intact: dict[str, dict[str, Any]] = {}  # current runs whose files are intact
        self.stale = 0

    def rel(self, path: Path) -> str:
        """`path` relative to the study folder (what every line names)."""
        try:
            return str(path.relative_to(self.study.folder))
        except ValueError:
            return str(path)

    def problem(self, kind: str, path: Path, what: str) -> None:
        self.out.problems.append((kind, f"{self.rel(path)}: {what}"))

    def run(self) -> None:
        groups = self.groups()
        for h, files in sorted(groups.items()):
            self.check_run(h, files)
        for h, run_id in self.done_by_manifest.items():
            if h in self.current and h not in groups:
                self.problem(
                    MISSING,
                    self.runs_dir / record_name(h),
                    f"no record of run {run_id}, though {MANIFEST_FILE} says it is done; "
                    f"`{self.study.command('run')}` runs it again",
                )
        self.check_tables()

    def groups(self) -> dict[str, dict[str, Path]]:
        """The files of ``runs/`` by config hash and suffix; anything else is named."""
        if not self.runs_dir.is_dir():
            return {}
        groups: dict[str, dict[str, Path]] = {}
        for path in sorted(self.runs_dir.iterdir()):
            if path.name.startswith("."):
                continue  # a killed writer's temporary file: the next run removes it
            if path.is_symlink():
                self.problem(ORPHANED, path, "a link; desim keeps no links in runs/")
            elif path.name == DAMAGED_DIR and path.is_dir():
                aside = sum(1 for p in path.iterdir() if p.is_file())
                if aside:
                    self.out.notes.append(
                        f"{aside} damaged files set aside in {self.rel(path)}/ "
                        f"(`{self.study.command('clean')}` removes them)"
                    )
            else:
                stem, _, rest = path.name.partition(".")
                if _HASH.fullmatch(stem) and "." + rest in _SUFFIXES and path.is_file():
                    groups.setdefault(stem, {})["." + rest] = path
                else:
                    self.problem(
                        ORPHANED,
                        path,
                        "not a file desim writes (runs/ holds <config hash>.json, "
                        ".parquet and .agents.parquet files)",
                    )
        return groups

    def check_run(self, h: str, files: dict[str, Path]) -> None:
        """The files of the run `h`: a sidecar that says what they are, and their bytes."""
        side_path = files.get(".json")
        if side_path is None:
            self.no_sidecar(h, files)
            return
        side, why = _read_sidecar(side_path, h)
        if side is None:
            self.problem(GARBLED, side_path, f"garbled sidecar ({why}); its run is not trusted")
            return
        listed = set(side["files"])
        run = self.current.get(h)
        if run is not None:
            for name in _record_names(run):
                if name not in listed:
                    self.problem(GARBLED, side_path, f"sidecar lists no {name}")
                    return
        good = True
        for name, expected in sorted(side["files"].items()):
            good = self.check_file(self.runs_dir / name, expected, side_path) and good
        for suffix, path in files.items():
            if suffix != ".json" and path.name not in listed:
                self.problem(ORPHANED, path, f"not listed by its sidecar {self.rel(side_path)}")
        if good and run is not None:
            self.intact[h] = side
        elif good:
            self.stale += 1

    def no_sidecar(self, h: str, files: dict[str, Path]) -> None:
        """The records of a run without a sidecar: unfinished, or the sidecar was lost."""
        side = self.rel(self.runs_dir / f"{h}.json")
        for path in files.values():
            if h in self.current:
                said = self.done_by_manifest.get(h)
                why = f", though {MANIFEST_FILE} says run {said} is done" if said else ""
                self.problem(
                    MISSING,
                    path,
                    f"its sidecar {side} is missing{why}; `{self.study.command('run')}` "
                    "runs it again",
                )
            else:
                self.problem(
                    ORPHANED,
                    path,
                    f"belongs to no run of {self.study.file.name} and has no sidecar",
                )

    def check_file(self, path: Path, expected: str, side_path: Path) -> bool:
        """True when the file `path` a sidecar lists has the sha256 it records."""
        if not path.is_file():
            self.problem(MISSING, path, f"listed by its sidecar {self.rel(side_path)}")
            return False
        self.out.records += 1
        try:
            actual = sha256_file(path)
        except OSError as exc:
            actual = f"unreadable: {exc.strerror or exc}"
        if actual != expected:
            again = (
                f"`{self.study.command('run')}` sets it aside and runs it again"
                if path.name.split(".")[0] in self.current
                else f"`{self.study.command('clean')}` removes it"
            )
            self.problem(
                DAMAGED,
                path,
                f"its sha256 differs from the one its sidecar {self.rel(side_path)} "
                f"records; {again}",
            )
            return False
        return True

    def check_tables(self) -> None:
        """The tables the manifest describes, against the sha256 it records."""
        results = self.study.results_dir
        for name in (METRICS_FILE, CURVES_FILE, AGENTS_FILE):
            entry = self.tables.get(name)
            if not isinstance(entry, dict):
                continue
            path = results / name
            rebuild = f"`{self.study.command('run')}` rebuilds it from the records"
            if not path.is_file():
                self.problem(MISSING, path, f"listed by {MANIFEST_FILE}; {rebuild}")
                continue
            self.out.records += 1
            try:
                same = sha256_file(path) == entry.get("sha256")
            except OSError:
                same = False
            if not same:
                self.problem(
                    DAMAGED,
                    path,
                    f"its sha256 differs from the one {MANIFEST_FILE} records; {rebuild}",
                )


def _record_names(run: Run) -> list[str]:
    """The files a finished run must have besides its sidecar."""
    names = [record_name(run.config_hash)]
    if run.scenario.per_agent:
        names.append(record_name(run.config_hash, agents=True))
    return names


def _read_sidecar(path: Path, h: str) -> tuple[dict[str, Any] | None, str]:
    """(the sidecar at `path` of the run `h`, "") or (None, why it cannot be trusted)."""
    try:
        if path.stat().st_size > _MAX_SIDECAR:
            return None, f"over {_MAX_SIDECAR} bytes"
        side = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"cannot be read: {exc.strerror or exc}"
    except ValueError:
        return None, "not JSON text"
    if not isinstance(side, dict):
        return None, "not a JSON object"
    stated = side.get("config_hash")
    if stated != h:
        shown = f"{stated[:12]}…" if isinstance(stated, str) else repr(stated)[:40]
        return None, f"its config_hash {shown} is not its file name's {h[:12]}…"
    files = side.get("files")
    if not isinstance(side.get("fingerprint"), str) or not isinstance(files, dict):
        return None, "no fingerprint or no files"
    for name, digest in files.items():
        if not isinstance(digest, str) or not any(name == h + s for s in _SUFFIXES[1:]):
            return None, f"lists {str(name)[:80]!r}, not a file of its run"
    return side, ""


# --------------------------------------------------------------------------------------------
# re-runs: the stored trajectory against a new one


def _made(p: dict[str, Any]) -> str:
    """Where a run was computed, in words: numpy's version and the machine."""
    machine = f"cpu {p['cpu']}" if p.get("cpu") else None
    if machine and p.get("cpu_simd"):
        machine += f" (SIMD {'+'.join(map(str, p['cpu_simd']))})"
    if machine is None:
        machine = f"{p.get('platform') or 'an unrecorded machine'} (CPU not recorded)"
    return f"numpy {p.get('numpy') or '?'} on {machine}"


def machines(side: dict[str, Any], here: dict[str, Any]) -> str:
    """What differs between the provenance of a stored run and this process, as words."""
    then = side.get("provenance") if isinstance(side.get("provenance"), dict) else {}
    keys = ("numpy", "platform", "cpu", "cpu_simd", "python", "desim_version", "git_commit")
    if all(then.get(k) == here.get(k) for k in keys):
        return "computed here with the same code, numpy and machine"
    text = f"computed with {_made(then)}; here {_made(here)}"
    elsewhere = any(then.get(k) != here.get(k) for k in ("platform", "cpu", "cpu_simd"))
    if elsewhere and then.get("numpy") == here.get("numpy"):
        text += " (numpy's SIMD code differs between CPUs and can change the last bit)"
    if then.get("git_commit") != here.get("git_commit"):
        old, new = (str(p.get("git_commit") or "?")[:10] for p in (then, here))
        text += f"; desim commit {old} then, {new} here"
    return text


def _difference(stored: pd.DataFrame, new: pd.DataFrame) -> str:
    """How far a re-run's values are from the stored ones (when the rows line up)."""
    cols = ["t", "metric"]
    if len(stored) != len(new) or not stored[cols].reset_index(drop=True).equals(
        new[cols].reset_index(drop=True)
    ):
        return "other times or metrics"
    a = stored["value"].to_numpy(np.float64)
    b = new["value"].to_numpy(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rel = np.abs(a - b) / np.maximum(np.abs(a), np.abs(b))
    rel = rel[np.isfinite(rel)]
    worst = float(rel.max()) if rel.size else float("nan")
    return f"values differ by at most {worst:.2g} (relative)"


def _rerun(
    study: Study, run: Run, side: dict[str, Any], here: dict[str, Any], out: Verified
) -> None:
    """Re-run `run` and compare its trajectory with its stored record."""
    results = study.results_dir
    record = results / RUNS_DIR / record_name(run.config_hash)
    where = str(record.relative_to(study.folder))
    sidecar = record.with_suffix(".json").relative_to(study.folder)
    stored = read_record(results, side)
    if stored is None:  # damaged since the integrity check
        out.problems.append((DAMAGED, f"{where}: changed while being verified"))
        return
    out.checked.append(run.run_id)
    # the ε of the privacy ledger and the tight calibrations are dp-accounting's numbers
    then = side.get("provenance") if isinstance(side.get("provenance"), dict) else {}
    old_dp, new_dp = then.get("dp_accounting"), here.get("dp_accounting")
    dp = f"computed with dp-accounting {old_dp}, this machine has {new_dp}"
    dp = dp if old_dp and old_dp != new_dp else ""
    if dp and f"stored runs {dp}" not in out.notes:
        out.notes.append(f"stored runs {dp}")
    if fingerprint(stored) != side["fingerprint"]:
        out.problems.append((GARBLED, f"{sidecar}: its fingerprint is not its record's trajectory"))
    try:
        metrics, _, _ = simulate(run)
    except Exception as exc:
        out.failed.append((run.run_id, f"{type(exc).__name__}: {' '.join(str(exc).split())}"))
        return
    if fingerprint(metrics) != fingerprint(stored):
        out.changed.append(
            (
                run.run_id,
                f"{run.run_id} ({where}): the re-run's trajectory differs from the stored one "
                f"({_difference(stored, metrics)}); {machines(side, here)}"
                + (f"; {dp}" if dp else ""),
            )
        )


def verify_study(
    study: Study, sample: int | None = None, seed: int | None = None, progress: bool = False
) -> Verified:
    """Check every stored file of `study` against its checksum, then re-run its current runs
    (all, or `sample` of them chosen with `seed`, drawn from the OS when None) in memory and
    compare each trajectory with its stored record. Writes nothing."""
    check = _Check(study)
    check.run()
    out = check.out
    runs = [r for r in study.unique_runs if r.config_hash in check.intact]
    if not runs and not out.problems:
        raise ConfigError(
            f"{check.rel(study.results_dir)}: no stored runs of the current "
            f"{study.file.name} to verify; run `{study.command('run')}` first"
        )
    if check.stale:
        out.notes.append(
            f"{check.stale} stored runs of an older version of {study.file.name} "
            f"(not re-run; `{study.command('clean')}` removes them)"
        )
    missing = len(study.unique_runs) - len(check.intact)
    if missing:
        out.notes.append(
            f"{len(check.intact)} of {len(study.unique_runs)} runs have an intact record"
        )
    if sample == 0:
        runs = []
    elif sample is not None and sample < len(runs):
        out.seed = seed if seed is not None else random.SystemRandom().randrange(2**32)
        order = {r.config_hash: i for i, r in enumerate(study.unique_runs)}
        drawn = random.Random(out.seed).sample(runs, sample)
        runs = sorted(drawn, key=lambda r: order[r.config_hash])
    here = provenance()
    bar = progress_bar(len(runs), "verify", "run", disable=not (progress and runs))
    try:
        for run in runs:
            _rerun(study, run, check.intact[run.config_hash], here, out)
            bar.update(1)
    finally:
        bar.close()
    return out


# --------------------------------------------------------------------------------------------
# clean


def stale_files(study: Study) -> list[Path]:
    """Files in the results folder of `study` that belong to no current run (older versions
    of the study file, damaged records set aside)."""
    runs_dir = study.results_dir / RUNS_DIR
    if not runs_dir.is_dir():
        return []
    current = {r.config_hash for r in study.unique_runs}
    out = [
        p
        for p in sorted(runs_dir.iterdir())
        if p.is_file() and not p.name.startswith(".") and p.name.split(".")[0] not in current
    ]
    damaged = runs_dir / DAMAGED_DIR
    if damaged.is_dir() and not damaged.is_symlink():
        out += sorted(p for p in damaged.iterdir() if p.is_file())
    return out


def clean_study(study: Study) -> int:
    """Remove the stale files of `study` (under its lock); return how many were removed."""
    check_outputs(study)
    if not study.results_dir.is_dir():
        return 0
    with StudyLock(study.results_dir):
        files = stale_files(study)
        for path in files:
            path.unlink(missing_ok=True)
    return len(files)
