"""`desim run --scheduler` when things go wrong: a malformed address or a contradicting
`--workers` is one line before anything starts; a server that is not a dask scheduler (garbage,
silence, nothing) is one line within a bounded time with the study's lock released; runs lost
with their workers are named in one line after the others are written; a scheduler that stops
answering mid-study (silence, garbage) stops it within a bounded time; local workers start even
where filelock refuses concurrent forks.

Every server and cluster here listens on 127.0.0.1 only."""

from __future__ import annotations

import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from _toy import write_study
from hypothesis import given, settings
from hypothesis import strategies as st

distributed = pytest.importorskip("distributed")

import dask  # noqa: E402

import desim.study.dask as desim_dask  # noqa: E402
from desim.kernel.params import ConfigError  # noqa: E402
from desim.study.cli import main  # noqa: E402
from desim.study.results import run_study  # noqa: E402
from desim.study.spec import load_study  # noqa: E402
from desim.study.store import StudyLock  # noqa: E402

# real protocols (the test-only toy protocol is not importable in spawned dask workers)
STUDY = """\
[study]
title = "dask failures"
seed = 3
replicates = 4
t_max = 200
checkpoints = 8

[data]
model = "classes"
agents = 12
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "local"
protocol = "local"

[[scenario]]
name = "ideal"
protocol = "ideal"

[[curve]]
name = "local (Prop. 1)"
kind = "local"

[[plot]]
file = "mse.png"
title = "MSE"
"""
RUNS = 8

#: Starts `desim run --scheduler local:2` on the study folder argv[1] in a process where a fork
#: is refused as filelock's audit hook refuses it (filelock 3.32.5 on any CPython, 4.x on
#: ≥ 3.12): while this thread is inside a file lock's acquire or release, or while another
#: thread is between its fork's before-hooks and after-hooks. The hooks here hold that window
#: open for 0.2 s, so two forks from two threads at once always meet it (with filelock they
#: meet it by chance, more often on Python ≥ 3.12, which warns between the two).
FORK_AUDIT = """
import os, sys, threading, time
import filelock

inside = threading.local()
forking = set()

def before():
    forking.add(threading.get_ident())
    time.sleep(0.2)

def after_in_parent():
    forking.discard(threading.get_ident())

def after_in_child():
    forking.clear()

os.register_at_fork(before=before, after_in_parent=after_in_parent, after_in_child=after_in_child)

def audit(event, args):
    changing = getattr(inside, "depth", 0)
    if event in ("os.fork", "os.forkpty") and (changing or forking):
        raise RuntimeError(f"{event} is unsafe while filelock is changing descriptor ownership")
    if event == "_posixsubprocess.fork_exec" and changing:
        raise RuntimeError("fork_exec is unsafe while filelock is changing descriptor ownership")

sys.addaudithook(audit)

def tracked(method):
    def wrapper(self, *args, **kwargs):
        inside.depth = getattr(inside, "depth", 0) + 1
        try:
            return method(self, *args, **kwargs)
        finally:
            inside.depth -= 1
    return wrapper

for name in ("acquire", "release"):
    setattr(filelock.BaseFileLock, name, tracked(getattr(filelock.BaseFileLock, name)))

from desim.study.cli import main
sys.exit(main(["run", sys.argv[1], "--scheduler", "local:2", "--no-progress"]))
"""


def records(folder: Path) -> list[Path]:
    return sorted((folder / "results" / "runs").glob("*.json"))


def assert_unlocked(folder: Path) -> None:
    """The study's lock is free (another writer would get it at once)."""
    with StudyLock(folder / "results"):
        pass


def one_line(err: str) -> str:
    assert err.startswith("desim: error: ") and err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------------------------------------
# refused up front


@pytest.mark.parametrize(
    "address, says",
    [
        ("foo", "no PROTOCOL://"),
        ("127.0.0.1:8786", "no PROTOCOL://"),
        ("tcp://127.0.0.1:notaport", "port 'notaport'"),
        ("tcp://127.0.0.1:0", "port '0'"),
        ("tcp://127.0.0.1:65536", "port '65536'"),
        ("tcp://:8786", "not HOST:PORT"),
        ("tcp://127.0.0.1", "not HOST:PORT"),
        ("tcp://bad host:8786", "not HOST:PORT"),
        ("ucx://127.0.0.1:8786", "protocol 'ucx'"),
        ("inproc://nothing", "protocol 'inproc'"),
        ("local:", "N ≥ 1"),
        ("local:2_0", "N ≥ 1"),
        ("local: 2", "N ≥ 1"),
        ("local:²", "N ≥ 1"),
    ],
)
def test_malformed_addresses_are_refused_before_the_study_starts(tmp_path, capsys, address, says):
    folder = write_study(tmp_path / "s", STUDY)
    assert main(["run", str(folder), "--scheduler", address]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"--scheduler {address!r}" in err and says in err
    if not address.startswith("local:"):
        assert "allowed: local:N" in err and "tcp://HOST:PORT" in err
    assert not (folder / "results").exists()  # no lock taken, nothing written


@pytest.mark.parametrize(
    "address",
    ["tcp://127.0.0.1:8786", "tcp://head-node.example.org:8786", "tls://[::1]:8786", "local:3"],
)
def test_wellformed_addresses_are_accepted(address):
    kind, n = desim_dask.parse_scheduler(address)
    assert (kind, n) == (("local", 3) if address == "local:3" else (address, None))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"(tcp|tls|ucx|local)://?[^ ]{0,12}:\S{0,6}"))
def test_any_text_is_an_address_or_one_line(text):
    try:
        kind, n = desim_dask.parse_scheduler(text)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("--scheduler ") and "\n" not in message
    else:
        assert (kind == "local" and n >= 1) or (kind == text and n is None)


def test_workers_with_a_scheduler_are_refused(tmp_path, capsys):
    folder = write_study(tmp_path / "s", STUDY)
    assert main(["run", str(folder), "--workers", "2", "--scheduler", "local:2"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "--workers 2 with --scheduler local:2" in err
    assert not (folder / "results").exists()


def test_the_stall_timeout_is_a_dask_setting():
    assert desim_dask.stall_seconds() == desim_dask.STALL_SECONDS
    with dask.config.set({desim_dask.STALL_SETTING: "5m"}):
        assert desim_dask.stall_seconds() == 300
    with dask.config.set({"desim.stall_timeout": 2}):  # as DASK_DESIM__STALL_TIMEOUT=2 sets it
        assert desim_dask.stall_seconds() == 2


@pytest.mark.parametrize("value", ["soon", "", -1, 0, float("inf"), True, [60]])
def test_a_stall_timeout_that_is_not_a_time_is_refused_up_front(tmp_path, capsys, value):
    folder = write_study(tmp_path / "s", STUDY)
    with dask.config.set({desim_dask.STALL_SETTING: value}):
        assert main(["run", str(folder), "--scheduler", "local:2"]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"dask setting desim.stall-timeout = {value!r}: must be a time > 0" in err
    assert not (folder / "results").exists()


# ---------------------------------------------------------------------------------------------
# servers that are not dask schedulers


@contextmanager
def server(reply: bytes | None):
    """A TCP server on 127.0.0.1 that accepts every connection, sends `reply` on it (None:
    nothing) and keeps it open; yields its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    held, stop = [], threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:  # the accept timed out
                continue
            held.append(conn)
            if reply is not None:
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


# What a web server (dask's dashboard on 8787, say) answers: its first 8 bytes, read as the
# length of a dask message, ask for 3 EiB.
HTTP = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@pytest.mark.parametrize(
    "reply, says",
    [
        (HTTP, "what answers there is not a dask scheduler"),
        (b"\x08" + b"\x00" * 7 + b"\xc1" * 8, "what answers there is not a dask scheduler"),
        (None, "no dask scheduler answered there within 2 s"),
    ],
    ids=["http", "garbage-message", "silent"],
)
def test_a_server_that_is_not_a_scheduler_is_one_line(tmp_path, capsys, monkeypatch, reply, says):
    monkeypatch.setattr(desim_dask, "CONNECT_TIMEOUT", 1)
    folder = write_study(tmp_path / "s", STUDY)
    start = time.monotonic()
    with server(reply) as address:
        code = main(["run", str(folder), "--scheduler", address, "--no-progress"])
    assert time.monotonic() - start < 10
    assert code == 2
    err = one_line(capsys.readouterr().err)
    assert f"--scheduler {address}: {says}" in err
    assert not records(folder)
    assert_unlocked(folder)


def test_no_server_at_all_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(desim_dask, "CONNECT_TIMEOUT", 1)
    with socket.create_server(("127.0.0.1", 0)) as probe:
        address = f"tcp://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nothing there
    folder = write_study(tmp_path / "s", STUDY)
    assert main(["run", str(folder), "--scheduler", address, "--no-progress"]) == 2
    err = one_line(capsys.readouterr().err)
    assert f"--scheduler {address}: no scheduler answers there" in err
    assert_unlocked(folder)


# ---------------------------------------------------------------------------------------------
# a scheduler that stops answering mid-study


class Relay:
    """A TCP relay on 127.0.0.1 to a scheduler (the client's only way to it) that can `turn`
    silent (it keeps every connection, and accepts new ones, but passes nothing on) or
    garbage (it sends `HTTP` on every connection instead of the scheduler's answers)."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("tcp://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self.mode, self.sent = "relay", False
        self.peer: dict[socket.socket, socket.socket | None] = {}
        self.clients: list[socket.socket] = []
        self.selector = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)

    def __enter__(self) -> Relay:
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        for sock in [*self.peer, self.listener]:
            sock.close()

    def turn(self, mode: str) -> None:
        """From now on, be `mode` ("silent" or "garbage")."""
        self.mode = mode

    def serve(self) -> None:
        """Pass bytes on (or not) until stopped: the relay's thread."""
        while not self.stop.is_set():
            if self.mode == "garbage" and not self.sent:
                self.sent = True
                for conn in self.clients:
                    self.send(conn, HTTP)
            for key, _ in self.selector.select(timeout=0.02):
                if key.fileobj is self.listener:
                    self.accept()
                else:
                    self.pass_on(key.fileobj)

    def accept(self) -> None:
        """Take a new connection (joined to the scheduler while relaying)."""
        conn, _ = self.listener.accept()
        up = socket.create_connection(self.upstream) if self.mode == "relay" else None
        for a, b in ((conn, up), (up, conn)):
            if a is not None:
                self.peer[a] = b
                self.selector.register(a, selectors.EVENT_READ)
        self.clients.append(conn)
        if self.mode == "garbage":
            self.send(conn, HTTP)

    def pass_on(self, sock: socket.socket) -> None:
        """Read what came on `sock` and pass it to its other end while relaying."""
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        peer = self.peer.get(sock)
        if not data:  # closed: close its other end too
            for end in (sock, peer):
                if end in self.peer:
                    del self.peer[end]
                    self.selector.unregister(end)
                    end.close()
        elif self.mode == "relay" and peer is not None:
            self.send(peer, data)

    @staticmethod
    def send(sock: socket.socket, data: bytes) -> None:
        """Send `data` on `sock` unless it has closed."""
        try:
            sock.sendall(data)
        except OSError:  # closed meanwhile
            pass


#: `desim run` on the study folder argv[1] with the scheduler argv[2]; once it returns, the
#: study's lock must be free in this very process.
RUN_THEN_LOCK = """
import sys
from pathlib import Path
from desim.study.cli import main
from desim.study.store import StudyLock
code = main(["run", sys.argv[1], "--scheduler", sys.argv[2], "--no-progress"])
with StudyLock(Path(sys.argv[1]) / "results"):
    pass
sys.exit(code)
"""

#: Seconds the watch waits, in the tests, for a scheduler that stopped answering.
STALL = 2
LONG = STUDY.replace("replicates = 4", "replicates = 20").replace("t_max = 200", "t_max = 4000")


def run_and_stall(folder: Path, address: str, stall: Callable[[], None]) -> None:
    """`desim run` of `folder` on the scheduler at `address` in a process of its own (a
    timeout, so that a regression fails instead of hanging the suite), the watch's time
    `STALL` s; `stall()` once the first run is written. It must stop within the watch's time
    (and a check's) with one line naming the runs not written, keep those written, and give
    the study's lock back."""
    runs = len(load_study(folder).unique_runs)
    env = {**os.environ, "DASK_DESIM__STALL_TIMEOUT": str(STALL)}
    command = [sys.executable, "-c", RUN_THEN_LOCK, str(folder), address]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not records(folder) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        stall()
        stalled = time.monotonic()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    took = time.monotonic() - stalled
    assert proc.returncode == 2, err[-3000:]
    line = one_line(err)
    assert f"runs lost (no worker or no answer from the scheduler for {STALL} s)" in line
    lost = int(re.search(r"(\d+) runs lost", line)[1])
    kept = len(records(folder))
    assert kept >= 1 and kept + lost == runs
    assert f"every finished run is kept ({kept} this time)" in line
    # the watch waits STALL s from a check's start; a check waits at most STALL s (and comes
    # once a second); the rest is writing the manifest and closing the client
    assert took < 3 * STALL + 1 + 15, took


@pytest.mark.slow  # a `desim run` process of its own, and the watch's wait
@pytest.mark.parametrize("mode", ["silent", "garbage"])
def test_a_scheduler_that_stops_answering_stops_the_study(tmp_path, dask_cluster, mode):
    """The relay to the scheduler turns silent or garbage once the first run is written."""
    folder = write_study(tmp_path / "s", LONG)
    with Relay(dask_cluster.scheduler.address) as relay:
        run_and_stall(folder, relay.address, partial(relay.turn, mode))


@pytest.mark.slow  # a `desim run` process of its own, and the watch's wait
def test_a_cluster_left_without_workers_stops_the_study(tmp_path):
    """The cluster scales to no worker once the first run is written."""
    folder = write_study(tmp_path / "s", LONG)
    with desim_dask.connect("local:1") as client:
        run_and_stall(folder, client.scheduler.address, partial(client.cluster.scale, 0))
        assert not client.nthreads()


# ---------------------------------------------------------------------------------------------
# workers lost


#: compute_batch as desim has it (the tests below replace it in desim.study.dask).
COMPUTE = desim_dask.compute_batch


def compute_or_die(poison: str, runs):
    """compute_batch, except that the worker given the run `poison` dies (SIGKILL)."""
    if any(run.config_hash == poison for run in runs):
        os.kill(os.getpid(), signal.SIGKILL)
    return COMPUTE(runs)


def test_runs_lost_with_their_workers_are_named_and_the_rest_kept(tmp_path, capsys, monkeypatch):
    """A run that kills every worker it is given is lost (here at once: dask is allowed no
    failure): the other runs are written, then one line names the lost ones (with the poison
    run, any run queued on the same worker); the next ``desim run`` computes only those."""
    if desim_dask._start_method() != "fork":
        pytest.skip("the workers must inherit this module")
    folder = write_study(tmp_path / "s", STUDY)
    poison = load_study(folder).unique_runs[0]
    monkeypatch.setattr(desim_dask, "compute_batch", partial(compute_or_die, poison.config_hash))
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        code = main(["run", str(folder), "--scheduler", "local:2", "--no-progress"])
    err = one_line(capsys.readouterr().err)
    assert code == 2
    assert "--scheduler local:2: " in err and "runs lost (their workers died" in err
    lost = [run for run in load_study(folder).unique_runs if run.run_id in err]
    kept = records(folder)
    assert poison in lost and len(kept) + len(lost) == RUNS
    assert {p.stem for p in kept}.isdisjoint(run.config_hash for run in lost)
    assert f"every finished run is kept ({len(kept)} this time)" in err
    manifest = (folder / "results" / "manifest.json").read_text()
    assert manifest.count('"status": "pending"') == len(lost)
    assert_unlocked(folder)

    monkeypatch.setattr(desim_dask, "compute_batch", COMPUTE)
    summary = run_study(load_study(folder), progress=False, scheduler="local:1")
    assert summary.ok and (summary.done, summary.skipped) == (len(lost), len(kept))


@pytest.mark.slow
def test_workers_killed_every_1_5_s_end_in_results_or_one_line(tmp_path, capsys):
    """A worker process SIGKILLed every 1.5 s: the study either finishes or stops with one
    line naming the lost runs, every finished run written."""
    psutil = pytest.importorskip("psutil")
    longer = STUDY.replace("replicates = 4", "replicates = 20").replace(
        "t_max = 200", "t_max = 40000"
    )
    folder = write_study(tmp_path / "s", longer)
    stop, kills = threading.Event(), []
    before = {child.pid for child in psutil.Process().children()}

    def live_workers() -> list:
        """This process's live children but multiprocessing's resource tracker; a child
        that is a zombie (left by an earlier test in this process), gone, or there before
        this study (the workers of the tests' shared cluster) is skipped."""
        workers = []
        for child in psutil.Process().children():
            try:
                if (
                    child.pid not in before
                    and child.status() != psutil.STATUS_ZOMBIE
                    and not any("resource_tracker" in part for part in child.cmdline())
                ):
                    workers.append(child)
            except psutil.Error:
                continue
        return workers

    def kill_workers() -> None:
        # the first kill as soon as the first run is written (forked workers of a warm process
        # finish this study in seconds; a kill before then can land in the cluster's start,
        # which is refused with its own line, not this test's), then one every 1.5 s
        pause = 0.05
        while not stop.wait(pause):
            workers = live_workers() if kills or records(folder) else []
            if workers:
                victim = workers[len(kills) % len(workers)]
                try:
                    os.kill(victim.pid, signal.SIGKILL)
                    kills.append(victim.pid)
                    pause = 1.5
                except OSError:  # gone meanwhile
                    pass

    killer = threading.Thread(target=kill_workers, daemon=True)
    killer.start()
    try:
        code = main(["run", str(folder), "--scheduler", "local:2", "--no-progress"])
    finally:
        stop.set()
        killer.join()
    err = capsys.readouterr().err
    runs = len(load_study(folder).unique_runs)
    assert kills and "Traceback" not in err
    if code == 0:
        assert len(records(folder)) == runs
    else:
        assert code == 2 and "runs lost" in one_line(err)
        lost = int(re.search(r"(\d+) runs lost", err)[1])
        assert len(records(folder)) + lost == runs
    assert_unlocked(folder)


# ---------------------------------------------------------------------------------------------
# filelock and fork


@pytest.mark.slow  # every audit event of that process, and of its workers, runs Python code
def test_local_workers_start_where_filelock_refuses_concurrent_forks(tmp_path):
    """`--scheduler local:2` under a fork audit like filelock's: its workers are forked one
    at a time, so no fork meets another one, and the study runs."""
    folder = write_study(tmp_path / "s", STUDY)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    out = subprocess.run(
        [sys.executable, "-c", FORK_AUDIT, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unsafe" not in out.stderr
    assert len(records(folder)) == RUNS
