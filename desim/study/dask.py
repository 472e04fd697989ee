"""Running a study's runs on a dask.distributed cluster (``desim run STUDY --scheduler ...``).

Workers compute; only this process (the client) writes. A task simulates a batch of runs with
`compute_run` and returns their metrics; the client writes each run's record and sidecar with
`store_run` — the same code the local pool runs — under the study's lock, so resume, atomic
records and the manifest work exactly as with ``--workers``. A worker that dies loses only the
batch it was computing: the scheduler gives that task to another worker (tasks write nothing,
so computing one twice is harmless). A task whose workers keep dying (dask gives up after
``distributed.scheduler.allowed-failures`` of them, 3 by default) is lost: the other runs go on
and are written, then the study stops with one line naming the lost runs (`ClusterLost`), which
the next ``desim run`` computes again; so does a cluster left without workers, or a scheduler
that stops answering, for `STALL_SECONDS` (or dask's setting `STALL_SETTING`). A task that
raises is tried `RETRIES` more times, then recorded as failed runs.

Batches: the first tasks hold one run each; from the CPU times they report, later tasks hold
about `TASK_SECONDS` of work (at most `MAX_BATCH` runs, and never so many that the last tasks
leave workers idle), so a study of 10⁴ short runs sends hundreds of tasks, not 10⁴, while
runs of a second or more go one per task. At most two tasks per worker thread are in flight,
so the client never holds more than a few batches of unwritten results.

``--scheduler local:N`` starts a `LocalCluster` of N worker processes (one thread each) on
this machine; otherwise it is the address of a running scheduler (``tcp://host:8786``), checked
before the study starts (`parse_scheduler`), and a server there that does not greet as a dask
scheduler within `CONNECT_TIMEOUT` seconds is one line, not a hang with the study's lock held.
dask is an optional dependency: ``pip install 'desim[dask]'``.
"""

from __future__ import annotations

import gc
import logging
import math
import multiprocessing
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from desim.kernel.params import ConfigError
from desim.study.results import DONE, FAILED, compute_run, curve_value, store_run
from desim.study.sharing import members
from desim.study.spec import CurveJob, Run

#: Protocols of a scheduler's address (tls takes its certificates from dask's configuration).
PROTOCOLS = ("tcp", "tls")
#: What ``--scheduler`` accepts, as its messages say.
ALLOWED = "local:N, or a running scheduler's address tcp://HOST:PORT (or tls://HOST:PORT)"
_LOCAL = re.compile(r"local:(?P<n>.*)", re.DOTALL)
#: A host name or IPv4 address, or an IPv6 address in brackets.
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\]")
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
#: Seconds a study waits on a cluster with no worker, or a scheduler that does not answer.
STALL_SECONDS = 60
#: The dask setting that replaces `STALL_SECONDS` (in dask's configuration, or as the variable
#: DASK_DESIM__STALL_TIMEOUT): seconds, or a time such as "90s" or "5m".
STALL_SETTING = "desim.stall-timeout"
#: Most seconds one health check, or one hand-over of a finished task's result, waits for the
#: scheduler before the watch asks again (dask bounds neither: a scheduler that stops
#: answering would hold the study, and its lock, for ever).
ASK_SECONDS = 10
#: Lost runs named in the line that stops a study (the manifest lists them all as pending).
LOST_SHOWN = 10
#: Dask settings of a ``local:N`` cluster. Its workers start the way the local pool's do (the
#: platform's multiprocessing default: a fork on Linux inherits this process's imports instead
#: of importing desim, pandas and pyarrow again), and the periodic housekeeping meant for the
#: dashboard (a 10 ms profiler, a 20 ms event-loop tick, a 100 ms memory poll) runs seldom, so
#: that an idle scheduler and its workers leave the cores to the runs (docs/performance.md
#: records what they cost). The start method holds only while the cluster starts: a worker the
#: nanny restarts after a crash is spawned (dask's default), slower to start, same results.
#: Forked workers start one after the other (see `_local_client`).
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
    for anything else, when dask.distributed is not installed, or for a `STALL_SETTING` that
    is not a time."""
    if not isinstance(text, str):
        raise ConfigError(f"--scheduler {text!r}: must be text; allowed: {ALLOWED}")
    local = _LOCAL.fullmatch(text)
    if local is not None:
        digits = local["n"].isascii() and local["n"].isdecimal()  # not "2_0", " 2", "²", "٣"
        n = int(local["n"]) if digits else 0
        if n < 1:
            raise ConfigError(f"--scheduler {text!r}: local:N needs a number of workers N ≥ 1")
        _distributed()
        stall_seconds()
        return ("local", n)
    why = _address_problem(text)
    if why is not None:
        raise ConfigError(f"--scheduler {text!r}: {why}; allowed: {ALLOWED}")
    _distributed()
    stall_seconds()
    return (text, None)


def stall_seconds() -> float:
    """Seconds a study waits on a stalled cluster: dask's `STALL_SETTING`, else
    `STALL_SECONDS`; a `ConfigError` for a setting that is not a time > 0."""
    import dask
    from dask.utils import parse_timedelta

    value = dask.config.get(STALL_SETTING, STALL_SECONDS)
    try:
        seconds = float(parse_timedelta(value))
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        seconds = math.nan
    if isinstance(value, bool) or not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(
            f"dask setting {STALL_SETTING} = {value!r}: must be a time > 0 "
            "(seconds, or text such as '90s' or '5m')"
        )
    return seconds


def _address_problem(text: str) -> str | None:
    """What is wrong with a scheduler address (None when it is ``PROTOCOL://HOST:PORT``)."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        return "not a scheduler address (it has no PROTOCOL://)"
    if scheme not in PROTOCOLS:
        return f"protocol {scheme!r} is not supported"
    host, colon, port = rest.rpartition(":")
    if not colon or not _HOST.fullmatch(host):
        return f"{rest!r} is not HOST:PORT"
    if not (port.isascii() and port.isdecimal() and 1 <= int(port) <= 65535):
        return f"port {port!r} is not a number from 1 to 65535"
    return None


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
    ``local:N``) that has at least one worker; a `ConfigError` (one line) when there is none
    within `CONNECT_TIMEOUT` seconds, or nothing there answers as a dask scheduler does."""
    address, n = parse_scheduler(scheduler)
    with ExitStack() as stack:
        client = _local_client(stack, n) if n is not None else _remote_client(stack, address)
        try:
            client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
        except TimeoutError:
            raise ConfigError(
                f"--scheduler {scheduler}: the scheduler has no worker (waited {CONNECT_TIMEOUT} s)"
            ) from None
        yield client


def _why(exc: BaseException) -> str:
    """An exception as a short line of text (its type and the start of its message)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def _local_client(stack: ExitStack, n: int) -> Any:
    """A client of a new LocalCluster of `n` worker processes, closed with `stack`.

    Forked workers start one at a time: a fork while another thread of this process is forking
    is refused by filelock's audit hook on some versions ("os.fork is unsafe while filelock is
    changing descriptor ownership"), and dask starts each worker from its own thread.
    """
    distributed = _distributed()
    import dask

    method = _start_method()
    first = 1 if method == "fork" else n
    settings = {**LOCAL_CONFIG, "distributed.worker.multiprocessing-method": method}
    try:
        with dask.config.set(settings):
            cluster = stack.enter_context(
                distributed.LocalCluster(  # no dashboard; health routes on a free port
                    n_workers=first,
                    threads_per_worker=1,
                    processes=True,
                    dashboard_address=None,
                    scheduler_kwargs={"dashboard_address": ":0"},
                    silence_logs=logging.CRITICAL,  # failures are said in desim's one line
                )
            )
            client = _closed_with(stack, distributed.Client(cluster))
            for k in range(first + 1, n + 1):
                cluster.scale(k)
                client.wait_for_workers(k, timeout=CONNECT_TIMEOUT)
    except Exception as exc:
        raise ConfigError(
            f"--scheduler local:{n}: the local cluster did not start ({_why(exc)})"
        ) from None
    return client


def _remote_client(stack: ExitStack, address: str) -> Any:
    """A client of the scheduler at `address`, closed with `stack`; one line when nothing
    there answers as a dask scheduler within `CONNECT_TIMEOUT` seconds."""
    distributed = _distributed()
    try:
        _handshake(address, CONNECT_TIMEOUT)
        return _closed_with(stack, distributed.Client(address, timeout=CONNECT_TIMEOUT))
    except TimeoutError:
        raise ConfigError(
            f"--scheduler {address}: no dask scheduler answered there within "
            f"{2 * CONNECT_TIMEOUT} s (the connection was accepted or is still pending)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"--scheduler {address}: no scheduler answers there ({_why(exc)})"
        ) from None
    except Exception as exc:  # garbage read as a message: a MemoryError, a decoding error ...
        raise ConfigError(
            f"--scheduler {address}: what answers there is not a dask scheduler ({_why(exc)})"
        ) from None


def _closed_with(stack: ExitStack, client: Any) -> Any:
    """`client`, closed with `stack` within `CONNECT_TIMEOUT` seconds whatever its scheduler
    does: a close that fails (the client's connection broke on garbage) leaves the rest to the
    end of this process, instead of replacing the study's one line with a traceback."""

    def close() -> None:
        try:
            client.close(timeout=CONNECT_TIMEOUT)
        except Exception:
            client.status = "closed"  # not closed again at exit (its timeout spent in vain)

    stack.callback(close)
    return client


@contextmanager
def _quiet_logs() -> Iterator[None]:
    """distributed's and tornado's log handlers, and the asyncio logger, print only critical
    records while a study runs on a cluster: a scheduler that stops answering or answers
    garbage makes the client's background tasks log tracebacks (asyncio's "Task exception was
    never retrieved" when a gather is abandoned), and the study's one line says it instead."""
    handlers = [
        handler
        for name in ("distributed", "tornado")
        for handler in logging.getLogger(name).handlers
        if isinstance(handler, logging.StreamHandler)
    ]
    levels = [handler.level for handler in handlers]
    for handler in handlers:
        handler.setLevel(logging.CRITICAL)
    loop_log = logging.getLogger("asyncio")  # no handler of its own: its records reach stderr
    loop_level = loop_log.level
    loop_log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        gc.collect()  # abandoned tasks report when collected: while their records are held back
        loop_log.setLevel(loop_level)
        for handler, level in zip(handlers, levels, strict=True):
            handler.setLevel(level)


def _handshake(address: str, timeout: float) -> None:
    """Connect to `address` (trying for `timeout` seconds) and read a dask scheduler's
    greeting, all within twice that (dask bounds the connection but not the greeting that
    follows, so a server that accepts and never answers would hold `desim run`, and the study's
    lock, for ever); a `TimeoutError` when that runs out."""
    import asyncio

    from distributed.comm import connect as open_comm
    from distributed.security import Security

    args = Security().get_connection_args("client")

    async def greet() -> None:
        comm = await open_comm(address, timeout=timeout, **args)
        await comm.close()

    async def bounded() -> None:
        await asyncio.wait_for(greet(), 2 * timeout)

    # an event loop of its own, in a thread (the caller may be running one: a notebook)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, bounded()).result()


def _desim_version() -> str:
    import desim

    return desim.__version__


def check_workers(client: Any, scheduler: str) -> None:
    """Refuse workers that cannot import desim or run another version of it than this process
    (their runs would be recorded with this process's provenance)."""
    import desim

    answers = client.run(_desim_version, on_error="return")
    # a worker lost while answering (its connection closed) is not refused: it is gone
    versions = {w: v for w, v in answers.items() if not isinstance(v, OSError)}
    for exc in versions.values():
        if isinstance(exc, BaseException):
            raise ConfigError(
                f"--scheduler {scheduler}: the workers cannot run desim ({_why(exc)}); "
                "install desim on them"
            )
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
            self._stack.enter_context(_quiet_logs())
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
        running, watch = _distributed().as_completed(futures), _Watch(client)
        try:
            while not running.is_empty():
                _next_done(running, watch)
            return [_curve_result(future, watch) for future in futures]
        except _Stalled:
            client.cancel(futures)
            raise ClusterLost(
                f"--scheduler {self.scheduler}: {len(jobs)} curves not computed "
                f"({watch.why()}); run the same command again"
            ) from None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _curve_result(future: Any, watch: _Watch) -> Any:
    """A curve task's `curve_value`, or its loss as a line of text (the curve is recorded as
    failed and computed again by the next ``desim run``)."""
    distributed = _distributed()
    try:
        return _fetch(future, watch)
    except _Stalled:
        raise
    except (distributed.KilledWorker, distributed.CancelledError) as exc:
        return f"lost with the workers that computed it ({_why(exc)}); run the study again"
    except Exception as exc:  # the task raised `RETRIES` + 1 times (curve_value itself does not)
        return _why(exc)


class ClusterLost(ConfigError):
    """Runs lost with the workers that computed them, or a cluster that stopped answering:
    the study stops (after the other runs, which are written) with one line naming them."""


def _lost_message(scheduler: str, lost: list[Run], done: int, why: str) -> str:
    """The line that stops a study whose runs were lost on the cluster."""
    lost = [member for run in lost for member in members(run)]  # a lead's followers with it
    shown = ", ".join(run.run_id for run in lost[:LOST_SHOWN])
    more = f" and {len(lost) - LOST_SHOWN} more" if len(lost) > LOST_SHOWN else ""
    return (
        f"--scheduler {scheduler}: {len(lost)} runs lost ({why}): {shown}{more}; every "
        f"finished run is kept ({done} this time); run the same command again for the rest"
    )


class _Stalled(Exception):
    """The cluster has had no worker, or its scheduler has not answered, for the watch's time."""


class _Watch:
    """Stops a study whose cluster has had no worker, or whose scheduler has not answered,
    for `stall_seconds` (tasks would wait for ever, and the study's lock with them)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.seconds = stall_seconds()
        self.ask = min(ASK_SECONDS, self.seconds)
        self.since: float | None = None
        self.checked = time.monotonic()

    def check(self, now: bool = False) -> bool:
        """Whether the scheduler answers and has a worker (asked at most once a second unless
        `now`, each time waiting at most `ask` seconds); `_Stalled` once it has not, for
        `seconds`."""
        start = time.monotonic()
        if not now and start - self.checked < 1.0:
            return self.since is None
        try:
            healthy = self.client.status == "running" and bool(
                self.client.nthreads(callback_timeout=self.ask)
            )
        except Exception:  # no answer in time, a scheduler gone (connection closed), garbage
            healthy = False
        self.checked = time.monotonic()
        if healthy:
            self.since = None
        elif self.since is None:
            self.since = start
        if self.since is not None and self.checked - self.since >= self.seconds:
            raise _Stalled
        return healthy

    def why(self) -> str:
        """The stall, as the line that stops the study says it."""
        return f"no worker or no answer from the scheduler for {self.seconds:g} s"


def _next_done(running: Any, watch: _Watch) -> Any:
    """The next finished future of `running` (`_Stalled` when the cluster has stalled)."""
    while not running.has_ready():
        watch.check()
        with running.thread_condition:  # notified as each future finishes
            running.thread_condition.wait(timeout=0.1)
    return next(running)


def _fetch(future: Any, watch: _Watch) -> Any:
    """`future.result()` of a finished future, handed over by the scheduler: asked again while
    the scheduler does not answer (`_Stalled` once the watch's time is up), at most `RETRIES`
    more times when it answers but the hand-over fails; the task's own error raised as is."""
    failures = 0
    while True:
        try:
            return future.result(timeout=watch.ask)
        except Exception as exc:
            if future.status in ("error", "cancelled"):  # the task's outcome, not the hand-over's
                raise
            if watch.check(now=True) and not isinstance(exc, TimeoutError):
                failures += 1
                if failures > RETRIES:
                    raise
            if not isinstance(exc, TimeoutError):
                time.sleep(0.1)  # a failure at once (garbage) is not asked again at once


def _outcome(future: Any, size: int, watch: _Watch) -> list[dict[str, Any]] | None:
    """What a batch task returned, its error as failed runs, or None when it was lost with
    its workers (dask gives up on a task after `distributed.scheduler.allowed-failures`
    workers died running it)."""
    distributed = _distributed()
    try:
        return _fetch(future, watch)
    except _Stalled:
        raise
    except (distributed.KilledWorker, distributed.CancelledError):
        return None
    except Exception as exc:  # the task itself raised, `RETRIES` + 1 times
        return [{"status": FAILED, "wall_seconds": None, "error": _why(exc)}] * size


class _Feed:
    """The runs still to send to the cluster, and the batches in flight (at most `IN_FLIGHT`
    per worker thread, so the client never holds many batches of unwritten results)."""

    def __init__(self, client: Any, todo: list[Run]) -> None:
        self.client, self.queue, self.sizer = client, deque(todo), _Sizer()
        self.tag = uuid.uuid4().hex[:8]
        self.slots = max(1, sum(client.nthreads().values()))
        self.batches: dict[Any, list[Run]] = {}
        self.running = _distributed().as_completed()

    def fill(self) -> None:
        """Send batches until `IN_FLIGHT` per worker thread are in flight (or none is left)."""
        while self.queue and len(self.batches) < IN_FLIGHT * self.slots:
            n = min(self.sizer.size(len(self.queue), self.slots), len(self.queue))
            batch = [self.queue.popleft() for _ in range(n)]
            future = self.client.submit(
                compute_batch,
                batch,
                pure=False,
                retries=RETRIES,
                key=f"desim-{self.tag}-{batch[0].config_hash[:12]}-{n}",
            )
            self.batches[future] = batch
            self.running.add(future)

    def unfinished(self) -> list[Run]:
        """The runs in flight, then those not sent yet."""
        return [run for batch in self.batches.values() for run in batch] + list(self.queue)


def run_on_cluster(
    todo: list[Run],
    results_dir: Path,
    session: Session,
    finish: Callable[[Run, dict[str, Any]], None],
    head: dict[str, Any],
) -> None:
    """Compute `todo` on the session's cluster and call `finish(run, record)` as each run's
    record is written (in this process). Runs lost with their workers are left for the next
    ``desim run`` and named by a `ClusterLost` once the others are written; a cluster without
    workers (or scheduler) for `stall_seconds` stops the study the same way."""
    client = session.client()
    feed, watch = _Feed(client, todo), _Watch(client)
    lost: list[Run] = []
    done = 0
    try:
        feed.fill()
        while feed.batches:
            future = _next_done(feed.running, watch)
            batch = feed.batches[future]  # in flight until its outcome is in hand
            outs = _outcome(future, len(batch), watch)
            del feed.batches[future]
            if outs is None:
                lost += batch
            else:
                for run, out in zip(batch, outs, strict=True):
                    feed.sizer.learn(out)
                    record = store_run(run, results_dir, out, head)
                    finish(run, record)
                    done += record["status"] == DONE
            feed.fill()
    except _Stalled:
        unfinished = lost + feed.unfinished()
        raise ClusterLost(_lost_message(session.scheduler, unfinished, done, watch.why())) from None
    finally:  # on Ctrl-C: drop what is not written; a resume computes it again
        for future in feed.batches:
            future.cancel()
    if lost:
        why = "their workers died each time they ran them"
        raise ClusterLost(_lost_message(session.scheduler, lost, done, why))
