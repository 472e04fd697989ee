"""Running a study's runs on a dask.distributed cluster (``desim run STUDY --scheduler ...``).

Workers compute; only this process (the client) writes. A task simulates a batch of runs with
`compute_run` and returns their metrics; the client writes each run's record and sidecar with
`store_run` — the same code the local pool runs — under the study's lock, so resume, atomic
records and the manifest work exactly as with ``--workers``. A worker that dies loses only the
batch it was computing: the scheduler gives that task to another worker (tasks write nothing,
so computing one twice is harmless), and a task that fails `RETRIES` more times is recorded as
failed runs that the next ``desim run`` tries again.

Batches: the first tasks hold one run each; from the CPU times they report, later tasks hold
about `TASK_SECONDS` of work (at most `MAX_BATCH` runs, and never so many that the last tasks
leave workers idle), so a study of 10⁴ short runs sends hundreds of tasks, not 10⁴, while
runs of a second or more go one per task. At most two tasks per worker thread are in flight,
so the client never holds more than a few batches of unwritten results.

``--scheduler local:N`` starts a `LocalCluster` of N worker processes (one thread each) on
this machine; any other value is the address of a running scheduler (``tcp://host:8786``).
dask is an optional dependency: ``pip install 'desim[dask]'``.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from desim.kernel.params import ConfigError
from desim.study.results import FAILED, compute_run, curve_value, store_run
from desim.study.spec import CurveJob, Run

LOCAL = "local:"
#: Work per task the batches aim at (CPU seconds of simulation: on a busy machine, wall times
#: would shrink the batches just when the scheduler's share of the CPU is scarce).
TASK_SECONDS = 1.0
#: Most runs in one task.
MAX_BATCH = 200
#: Tasks in flight per worker thread.
IN_FLIGHT = 2
#: Extra attempts of a task that raised (a worker lost while running it is not an attempt).
RETRIES = 2
#: Seconds to wait for a scheduler to answer, and for its first worker.
CONNECT_TIMEOUT = 30
#: Dask settings of a ``local:N`` cluster. Its workers start the way the local pool's do (the
#: platform's multiprocessing default: a fork on Linux inherits this process's imports instead
#: of importing desim, pandas and pyarrow again), and the periodic housekeeping meant for the
#: dashboard (a 10 ms profiler, a 20 ms event-loop tick, a 100 ms memory poll) runs seldom, so
#: that an idle scheduler and its workers leave the cores to the runs (docs/performance.md
#: records what they cost). The start method holds only while the cluster starts: a worker the
#: nanny restarts after a crash is spawned (dask's default), slower to start, same results.
LOCAL_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "1s",
}


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ConfigError(
            "--scheduler: dask.distributed is not installed; install it with "
            "`pip install 'desim[dask]'`"
        ) from None
    return distributed


def parse_scheduler(text: str) -> tuple[str, int | None]:
    """(address, None) for a scheduler address, ("local", N) for ``local:N``; a `ConfigError`
    for anything else or when dask.distributed is not installed."""
    if not isinstance(text, str) or not text.strip() or any(c.isspace() for c in text):
        raise ConfigError(
            f"--scheduler {text!r}: must be a scheduler address (tcp://host:8786) or local:N"
        )
    n = None
    if text.startswith(LOCAL):
        try:
            n = int(text[len(LOCAL) :])
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigError(f"--scheduler {text!r}: local:N needs a number of workers N ≥ 1")
    _distributed()
    return ("local", n) if n is not None else (text, None)


def _start_method() -> str:
    """How the local pool's workers start: the method set in this process, else the platform's
    default (without fixing it, as `multiprocessing.get_context()` would)."""
    return (
        multiprocessing.get_start_method(allow_none=True)
        or (multiprocessing.get_all_start_methods()[0])
    )


@contextmanager
def connect(scheduler: str) -> Iterator[Any]:
    """A `distributed.Client` of `scheduler` (starting and closing a LocalCluster for
    ``local:N``) that has at least one worker."""
    distributed = _distributed()
    address, n = parse_scheduler(scheduler)
    cluster = None
    if n is not None:
        import dask

        method = _start_method()
        with dask.config.set({**LOCAL_CONFIG, "distributed.worker.multiprocessing-method": method}):
            cluster = distributed.LocalCluster(  # no dashboard; health routes on a free port
                n_workers=n,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                scheduler_kwargs={"dashboard_address": ":0"},
                silence_logs=logging.ERROR,
            )
            client = distributed.Client(cluster)
    else:
        try:
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError) as exc:
            raise ConfigError(
                f"--scheduler {address}: no scheduler answers there ({' '.join(str(exc).split())})"
            ) from None
    try:
        try:
            client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise ConfigError(
                f"--scheduler {scheduler}: the scheduler has no worker (waited {CONNECT_TIMEOUT} s)"
            ) from None
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def _desim_version() -> str:
    import desim

    return desim.__version__


def check_workers(client: Any, scheduler: str) -> None:
    """Refuse workers that cannot import desim or run another version of it than this process
    (their runs would be recorded with this process's provenance)."""
    import desim

    try:
        versions = client.run(_desim_version)
    except Exception as exc:
        raise ConfigError(
            f"--scheduler {scheduler}: the workers cannot run desim "
            f"({type(exc).__name__}: {' '.join(str(exc).split())}); install "
            "desim on them"
        ) from None
    other = {w: v for w, v in versions.items() if v != desim.__version__}
    if other:
        worker, version = sorted(other.items())[0]
        raise ConfigError(
            f"--scheduler {scheduler}: worker {worker} runs desim {version}, this "
            f"process desim {desim.__version__}; install the same version on "
            f"every worker ({len(other)} of {len(versions)} differ)"
        )


def compute_batch(runs: list[Run]) -> list[dict[str, Any]]:
    """On a worker: `compute_run` each run of the batch (nothing is written)."""
    return [compute_run(run) for run in runs]


class _Sizer:
    """Runs per task: 1 until CPU times are known, then about `TASK_SECONDS` of work."""

    def __init__(self) -> None:
        self.seconds, self.count = 0.0, 0

    def learn(self, out: dict[str, Any]) -> None:
        if out.get("status") == "computed":
            self.seconds += float(out["cpu_seconds"])
            self.count += 1

    def size(self, left: int, slots: int) -> int:
        if not self.count:
            return 1
        per_run = max(self.seconds / self.count, 1e-4)
        fair = math.ceil(left / (IN_FLIGHT * slots))  # the tail still spreads over workers
        return max(1, min(round(TASK_SECONDS / per_run), MAX_BATCH, fair))


class Session:
    """A study's connection to a cluster, opened on first use (a resume with nothing to
    compute starts no cluster) and closed with the session; curves and runs share it."""

    def __init__(self, scheduler: str) -> None:
        self.scheduler = scheduler
        self._stack = ExitStack()
        self._client: Any = None

    def client(self) -> Any:
        """The `distributed.Client`, connected (and its workers checked) on first use."""
        if self._client is None:
            self._client = self._stack.enter_context(connect(self.scheduler))
            check_workers(self._client, self.scheduler)
        return self._client

    def curves(self, jobs: list[CurveJob], t: np.ndarray) -> list[Any]:
        """`curve_value` of each job, computed on the workers (one task per curve)."""
        client = self.client()
        tag = uuid.uuid4().hex[:8]
        futures = client.map(
            curve_value,
            jobs,
            t=t,
            pure=False,
            retries=RETRIES,
            key=[f"desim-curve-{tag}-{i}" for i in range(len(jobs))],
        )
        return client.gather(futures)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def run_on_cluster(
    todo: list[Run],
    results_dir: Path,
    session: Session,
    finish: Callable[[Run, dict[str, Any]], None],
    head: dict[str, Any],
) -> None:
    """Compute `todo` on the session's cluster and call `finish(run, record)` as each run's
    record is written (in this process)."""
    distributed = _distributed()
    queue, sizer = deque(todo), _Sizer()
    tag = uuid.uuid4().hex[:8]
    client = session.client()
    slots = max(1, sum(client.nthreads().values()))
    batches: dict[Any, list[Run]] = {}
    running = distributed.as_completed()

    def submit() -> None:
        n = min(sizer.size(len(queue), slots), len(queue))
        batch = [queue.popleft() for _ in range(n)]
        future = client.submit(
            compute_batch,
            batch,
            pure=False,
            retries=RETRIES,
            key=f"desim-{tag}-{batch[0].config_hash[:12]}-{n}",
        )
        batches[future] = batch
        running.add(future)

    try:
        while queue and len(batches) < IN_FLIGHT * slots:
            submit()
        for future in running:
            batch = batches.pop(future)
            try:
                outs = future.result()
            except Exception as exc:  # e.g. KilledWorker: lost too often
                error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                outs = [{"status": FAILED, "wall_seconds": None, "error": error}] * len(batch)
            for run, out in zip(batch, outs, strict=True):
                sizer.learn(out)
                finish(run, store_run(run, results_dir, out, head))
            while queue and len(batches) < IN_FLIGHT * slots:
                submit()
    finally:  # on Ctrl-C: drop what is not written; a resume computes it again
        for future in batches:
            future.cancel()
