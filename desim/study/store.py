"""The run records of a results folder, how they are trusted, and the one writer allowed.

A finished run leaves two files in ``runs/``, both named by the run's config hash (never by
its scenario name, which may be long or hold any character):

- ``<hash>.parquet`` its tidy metrics (``t, metric, value`` behind the run's keys), and
  ``<hash>.agents.parquet`` when the study keeps per-agent errors;
- ``<hash>.json`` its sidecar, written last (a run is done when its sidecar is): run id,
  config hash, the sha256 of each of its files, the *fingerprint* of its trajectory (a hash of
  its metrics: what `desim verify` compares after an upgrade) and its provenance (desim version,
  git commit and dirty flag, versions of numpy, scipy, simpy, pandas, pyarrow, dp-accounting,
  networkx, platform, CPU and numpy's SIMD level, wall time, warnings raised while it ran),
  and ``shared_with``, the id of the run simulated, for a run written from the trajectory of
  an identical one (`desim.study.sharing`).

A record is trusted only when its files hash to what its sidecar says; a damaged one is moved
to ``runs/damaged/`` (named in one line) and run again. No write in a results or figures
folder goes through a link (`refuse_links`), and a file-system error names the file being
written, never desim's temporary file. Records of an older version of the
study file keep their own hashes, so they are never overwritten; `desim clean` removes them.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import platform
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock, Timeout

import desim
from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import ConfigError

RUNS_DIR = "runs"
DAMAGED_DIR = "damaged"
#: The lock file of a results folder (held by the one `desim run` writing into it).
LOCK_FILE = ".desim.lock"
#: Who holds the lock: pid, host, start time (read by the writer that is turned away).
OWNER_FILE = ".desim.lock.owner"
#: Version of the sidecar layout.
SIDECAR_SCHEMA = 1
#: Columns of a run record that its fingerprint covers (the keys are the study's, not the run's).
TRAJECTORY = ("t", "metric", "value")


class StudyLocked(ConfigError):
    """Another process is writing into the same results folder."""


# --------------------------------------------------------------------------------------------
# atomic files

_UMASK = os.umask(0)
os.umask(_UMASK)


def study_root(path: Path) -> Path | None:
    """The study folder of a file desim keeps in a results or figures folder: the folder above
    the nearest ``results*`` or ``figures*`` folder holding `path` (above ``quick/`` for quick
    runs); None for a file elsewhere (an export's target, chosen by the user)."""
    for parent in path.parents:
        if parent.name.startswith(("results", "figures")):
            root = parent.parent
            return root.parent if root.name == "quick" else root
    return None


def refuse_links(path: Path) -> None:
    """Refuse to write `path` when it, or a folder between its study folder and it, is a link.

    A link planted in a results or figures folder would make desim write (or move, or
    truncate) a file elsewhere; no file desim keeps there is ever a link.
    """
    root = study_root(path)
    if root is None:
        return
    here = root
    for part in path.relative_to(root).parts:
        here = here / part
        if here.is_symlink():
            raise ConfigError(
                f"{here.relative_to(root)}: is a link; desim writes nothing through a link in "
                "a study's results and figures folders (remove the link, then run again)"
            )


def named_error(exc: OSError, path: Path) -> OSError:
    """`exc` as an error about `path`: never about desim's temporary file, and naming the
    file being written when the system names none (a full disk)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return OSError(exc.errno, reason, str(path))


def atomic_write(path: Path, write: Callable[[str], None], links_ok: bool = False) -> None:
    """Call `write(tmp)` on a temporary path in `path`'s folder, then rename it to `path`.

    Refuses a link on the way (`refuse_links`) unless `links_ok` (a target the user chose);
    a file-system error names `path`, never the temporary file.
    """
    if not links_ok:
        refuse_links(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".desim.", suffix=".tmp")
    except OSError as exc:
        raise named_error(exc, path) from None
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes owner-only files; results are shared
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise named_error(exc, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def parquet_bytes(frame: pd.DataFrame, metadata: dict[bytes, bytes] | None = None) -> bytes:
    """The parquet file of `frame` (without its index), with `metadata` added to its schema."""
    table = pa.Table.from_pandas(frame, preserve_index=False)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_bytes(data: bytes, path: Path, links_ok: bool = False) -> None:
    """Write `data` to `path` atomically (see `atomic_write`)."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data), links_ok)


def write_parquet(
    frame: pd.DataFrame,
    path: Path,
    metadata: dict[bytes, bytes] | None = None,
    links_ok: bool = False,
) -> None:
    """Write `frame` (without its index) to `path` atomically, adding `metadata` to its schema."""
    write_bytes(parquet_bytes(frame, metadata), path, links_ok)


def json_text(obj: Any) -> str:
    """The indented JSON text desim writes (a fixed form, so equal objects give equal bytes)."""
    return json.dumps(obj, indent=2, default=str, ensure_ascii=False) + "\n"


def write_json(obj: Any, path: Path) -> None:
    """Write `obj` as indented JSON to `path` atomically."""
    text = json_text(obj)
    atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def clean_temporaries(folder: Path) -> None:
    """Remove temporary files a killed writer left in `folder` (regular files only).

    Called only by the lock holder, so no other writer's file is ever removed.
    """
    if not folder.is_dir() or folder.is_symlink():
        return
    for tmp in folder.glob(".*.tmp"):
        if tmp.is_file() and not tmp.is_symlink():
            tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# hashes


def fingerprint(frame: pd.DataFrame) -> str:
    """Hash of a run's trajectory: its ``t, metric, value`` columns, exactly (bit for bit).

    Two runs with the same fingerprint measured the same values at the same times.
    """
    h = hashlib.sha256()
    for col in TRAJECTORY:
        values = frame[col]
        h.update(col.encode() + b"\0")
        if col == "metric":
            h.update("\x1f".join(map(str, values)).encode())
        else:
            h.update(np.ascontiguousarray(values.to_numpy(dtype=np.float64)).tobytes())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# provenance


def _git(args: list[str], where: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(where), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def _cpu_name() -> str | None:
    """The processor's model name (Linux), else what `platform` knows, else None."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def _cpu_simd() -> list[str] | None:
    """The SIMD targets numpy dispatches to on this CPU (e.g. ``X86_V4`` for AVX-512): they
    decide the last bit of numpy's exp, log and pow, so a run may differ across machines."""
    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):
        try:
            umath = importlib.import_module(module)
            features, dispatch = umath.__cpu_features__, umath.__cpu_dispatch__
        except (ImportError, AttributeError):
            continue
        return [name for name in dispatch if features.get(name)]
    return None


def provenance() -> dict[str, Any]:
    """What made a run: desim's version and git state, library versions, platform, CPU.

    The git commit and dirty flag are those of the checkout desim is imported from (the code
    that ran), None when desim is installed without git. The CPU (``machine``, ``cpu``,
    ``cpu_simd``) is there because numpy's SIMD code paths can change a result's last bit.
    """
    code = Path(desim.__file__).resolve().parent.parent
    commit = _git(["rev-parse", "HEAD"], code)
    dirty = None
    if commit is not None:
        status = _git(["status", "--porcelain", "--untracked-files=no"], code)
        dirty = bool(status) if status is not None else None
    return {
        "desim_version": desim.__version__,
        "git_commit": commit,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": _version("scipy"),
        "simpy": _version("simpy"),
        "pandas": pd.__version__,
        "pyarrow": pa.__version__,
        "platform": platform.platform(),
        "dp_accounting": _version("dp-accounting"),
        "networkx": _version("networkx"),
        "machine": platform.machine() or None,
        "cpu": _cpu_name(),
        "cpu_simd": _cpu_simd(),
    }


def now() -> str:
    """The current UTC time, to the second, ISO 8601."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------
# records and sidecars


def record_name(config_hash: str, agents: bool = False) -> str:
    """File name of the record of the run with `config_hash` (or of its per-agent errors)."""
    return f"{config_hash}{'.agents.parquet' if agents else '.parquet'}"


def record_path(results_dir: Path, config_hash: str, agents: bool = False) -> Path:
    """Path of the record of the run with `config_hash` (or of its per-agent errors)."""
    return results_dir / RUNS_DIR / record_name(config_hash, agents)


def sidecar_path(results_dir: Path, config_hash: str) -> Path:
    """Path of the sidecar of the run with `config_hash`."""
    return results_dir / RUNS_DIR / f"{config_hash}.json"


def read_sidecar(results_dir: Path, config_hash: str) -> dict[str, Any] | None:
    """The sidecar of `config_hash`, or None when absent, unreadable or not this run's."""
    path = sidecar_path(results_dir, config_hash)
    try:
        if not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        side = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(side, dict)
        and side.get("config_hash") == config_hash
        and isinstance(side.get("files"), dict)
        and isinstance(side.get("fingerprint"), str)
    )
    return side if ok else None


def stored_hashes(results_dir: Path) -> set[str]:
    """Config hashes of every run that has a sidecar in `results_dir` (any version)."""
    folder = results_dir / RUNS_DIR
    if not folder.is_dir():
        return set()
    return {p.name[:-5] for p in folder.glob("*.json") if not p.name.startswith(".")}


def intact(results_dir: Path, side: dict[str, Any]) -> bool:
    """True when every file of a run's sidecar exists with the sha256 it records."""
    for name, expected in side["files"].items():
        path = results_dir / RUNS_DIR / name
        try:
            if Path(name).name != name or sha256_file(path) != expected:
                return False
        except OSError:
            return False
    return True


def set_aside(results_dir: Path, config_hash: str) -> list[str]:
    """Move every file of the run `config_hash` to ``runs/damaged/``; return their names."""
    runs = results_dir / RUNS_DIR
    target = runs / DAMAGED_DIR
    refuse_links(target)  # a planted link would move the records out of the study
    target.mkdir(exist_ok=True)
    moved = []
    for path in sorted(runs.glob(f"{config_hash}.*")):
        if path.is_file():
            os.replace(path, target / path.name)
            moved.append(path.name)
    return moved


def encode_record(
    config_hash: str, frame: pd.DataFrame, agents: pd.DataFrame | None
) -> dict[str, Any]:
    """A run's record(s) as file bytes, with its fingerprint: all the work of writing a run
    but the writing (a worker encodes, the one process that writes only writes)."""
    meta = {b"desim.config_hash": config_hash.encode()}
    files = {}
    if agents is not None:
        files[record_name(config_hash, agents=True)] = parquet_bytes(agents, meta)
    files[record_name(config_hash)] = parquet_bytes(frame, meta)
    return {"config_hash": config_hash, "fingerprint": fingerprint(frame), "files": files}


def write_record(
    results_dir: Path, encoded: dict[str, Any], head: dict[str, Any]
) -> dict[str, Any]:
    """Write an `encode_record` result (the records, then the sidecar: `head` plus checksums);
    return the sidecar."""
    config_hash = encoded["config_hash"]
    files = {}
    for name, data in encoded["files"].items():  # agents first; the sidecar marks it done
        write_bytes(data, results_dir / RUNS_DIR / name)
        files[name] = hashlib.sha256(data).hexdigest()
    side = {
        "schema": SIDECAR_SCHEMA,
        **head,
        "config_hash": config_hash,
        "fingerprint": encoded["fingerprint"],
        "files": dict(sorted(files.items())),
    }
    write_json(side, sidecar_path(results_dir, config_hash))
    return side


# --------------------------------------------------------------------------------------------
# paths that stay inside the study folder


def check_inside(folder: Path, path: Path, what: str) -> None:
    """Refuse `path` when it (or a link on the way) leads out of the study `folder`."""
    base = folder.resolve()
    try:
        path.resolve().relative_to(base)
    except ValueError:
        raise ConfigError(
            f"{what}: {path} leads out of the study folder {folder} (a link or '..'); "
            "desim reads and writes only inside the study folder"
        ) from None


# --------------------------------------------------------------------------------------------
# one writer


class StudyLock:
    """The lock of one results folder: `desim run` and `desim clean` hold it while writing.

    A `filelock.FileLock` (an OS lock, released by the system when its holder dies, so a lock
    left by a killed process is recovered), plus an owner file that says who holds it.
    """

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        self.lock = FileLock(str(results_dir / LOCK_FILE), timeout=0)

    def __enter__(self) -> StudyLocked | StudyLock:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        refuse_links(self.results_dir / LOCK_FILE)  # the lock file is opened for writing
        try:
            self.lock.acquire()
        except Timeout:
            raise StudyLocked(
                f"{self.results_dir}: {self.holder()} is writing into this "
                "results folder; wait for it to finish"
            ) from None
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": now()}
        try:
            write_bytes(json.dumps(owner).encode(), self.results_dir / OWNER_FILE)
        except OSError:
            pass  # the lock itself is what counts
        except BaseException:  # a planted link: refused, and the lock given back
            self.lock.release()
            raise
        return self

    def holder(self) -> str:
        """Who holds the lock, as words ("another desim process" when unknown)."""
        try:
            owner = json.loads((self.results_dir / OWNER_FILE).read_text(encoding="utf-8"))
            return f"desim process {owner['pid']} on {owner['host']} (since {owner['since']})"
        except (OSError, ValueError, KeyError, TypeError):
            return "another desim process"

    def __exit__(self, *exc: object) -> None:
        (self.results_dir / OWNER_FILE).unlink(missing_ok=True)  # a link itself, never its target
        self.lock.release()


def wall_clock() -> float:
    """A monotonic clock for wall times."""
    return time.perf_counter()
