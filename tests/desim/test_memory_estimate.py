"""Memory before running: `desim validate` and `desim run` compare each run's estimated peak
with the memory available to it (MemAvailable, a cgroup's limit, or `--memory SIZE`) and
refuse, in one line, a run that cannot fit; the estimates are checked against measured peaks.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import PROTOCOLS
from desim.study.cli import main
from desim.study.spec import limits
from desim.study.spec.limits import Sizes, parse_size, run_bytes
from desim.study.spec.parse import parse_study, read_study_file

STUDY = """
[study]
title = "t"
seed = 1
t_max = 20
checkpoints = 5

[data]
model = "classes"
agents = 300
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "PM-I"
protocol = "private-colme"
"""


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY)
    return folder


@pytest.fixture
def machine(monkeypatch):
    """A machine with 20 GiB available, whatever this one has."""
    monkeypatch.setattr(limits, "_memory_bytes", lambda: 20 * 2**30)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512M", 512 * 2**20), ("2G", 2 * 2**30), ("1.5GiB", 3 * 2**29), ("2gb", 2 * 2**30),
     ("1000", 1000), ("64k", 64 * 1024), ("1T", 2**40)],
)  # fmt: skip
def test_sizes_are_binary_multiples(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2X", "-1G", "0", "G", "1.5.2G", "two"])
def test_a_bad_memory_size_is_one_line(tmp_path, capsys, text):
    with pytest.raises(SystemExit) as stop:
        main(["validate", str(_folder(tmp_path)), f"--memory={text}"])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert f"--memory: {text!r}: must be a size > 0 such as 512M" in err
    assert len(err.strip().splitlines()) == 1


def test_validate_refuses_a_run_above_the_memory_cap(tmp_path, capsys, machine):
    folder = _folder(tmp_path)
    assert main(["validate", str(folder), "--memory", "8G"]) == 0
    assert main(["validate", str(folder), "--memory", "100M"]) == 2
    err = capsys.readouterr().err
    assert "scenario 'PM-I': private-colme with agents = 300 needs about 0.13" in err
    assert "(M² pair arrays); --memory allows 0.0977 GiB (--force to run it anyway)" in err
    assert len(err.strip().splitlines()) == 1


def test_a_cap_above_what_is_available_does_not_raise_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(limits, "_memory_bytes", lambda: 100 * 2**20)
    assert main(["validate", str(_folder(tmp_path)), "--memory", "8G"]) == 2
    assert "this machine has 0.0977 GiB available" in capsys.readouterr().err


@pytest.mark.parametrize("where", [[], ["--scheduler", "local:1"]])
def test_run_refuses_before_its_first_run(tmp_path, capsys, machine, where):
    folder = _folder(tmp_path)
    assert main(["run", str(folder), "--no-progress", "--memory", "100M", *where]) == 2
    assert "--memory allows 0.0977 GiB" in capsys.readouterr().err
    assert not (folder / "results").exists()


def test_force_skips_the_cap(tmp_path, machine):
    folder = _folder(tmp_path)
    assert main(["validate", str(folder), "--memory", "1M", "--force"]) == 0


def test_the_memory_available_is_at_most_memavailable_and_physical():
    # MemAvailable moves while other processes run: read it before and after
    before = limits._meminfo_available()
    available = limits._memory_bytes()
    after = limits._meminfo_available()
    physical = limits.os.sysconf("SC_PAGE_SIZE") * limits.os.sysconf("SC_PHYS_PAGES")
    assert available is not None and 0 < available <= physical
    if before is not None:
        assert available <= max(before, after)


def _cgroup(folder: Path, limit: str, usage: int, inactive: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.max").write_text(limit + "\n")
    (folder / "memory.current").write_text(f"{usage}\n")
    (folder / "memory.stat").write_text(f"anon 1\ninactive_file {inactive}\nactive_file 9\n")


def test_a_cgroup_limit_leaves_limit_minus_usage_plus_inactive_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "_cgroup_paths", lambda: [("", "/a/b")])
    _cgroup(tmp_path, "max", 5 * 2**30, 0)
    _cgroup(tmp_path / "a", str(4 * 2**30), 3 * 2**30, 2**29)  # the tightest: 1.5 GiB left
    _cgroup(tmp_path / "a" / "b", "max", 2**30, 0)
    assert limits._cgroup_left(tmp_path) == 3 * 2**29
    monkeypatch.setattr(limits, "_cgroup_paths", lambda: [("", "/")])
    assert limits._cgroup_left(tmp_path) is None  # no limit set
    v1 = tmp_path / "memory" / "x"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2**30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{2**28}\n")
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    monkeypatch.setattr(limits, "_cgroup_paths", lambda: [("memory", "/x")])
    assert limits._cgroup_left(tmp_path) == 3 * 2**28


# -- the estimates against measured peaks ---------------------------------------------------

_PEAK = r"""
import json, sys
import desim, desim.kernel.plugins
desim.kernel.plugins.load_plugins()
(kwargs,) = json.loads(sys.argv[1])
desim.run(desim.Scenario(**kwargs))
# VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large pytest
# process would report its parent's peak
with open("/proc/self/status") as f:
    print(next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) * 1024)
"""

_CLASSES = {"model": "classes", "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}
_GRAPH = {"model": "classes", "class_means": [0.0, 1.0], "sigma": 2.0}
#: (scenario, directed edges, dimension): sizes where the protocol's own arrays dominate.
WORKLOADS = {
    # (t_max = M: above 1000 agents a slot's pairs are one block of the RR numbering, and the
    # zeroed pages of blocks no slot has reached are not resident; a run of M − 1 slots or more
    # touches every block, as the estimate assumes)
    "private-colme M=2000": (
        {"protocol": "private-colme", "data": {**_CLASSES, "agents": 2000}, "t_max": 2000},
        0,
        1,
    ),
    "private-colme M=1000 T=1000": (
        {"protocol": "private-colme", "data": {**_CLASSES, "agents": 1000}, "t_max": 1000},
        0,
        1,
    ),
    "c-colme n=5e4 r=40": (
        {
            "protocol": "c-colme",
            "data": {**_GRAPH, "agents": 50_000},
            "t_max": 50,
            "topology": {"model": "regular", "degree": 40},
        },
        2_000_000,
        1,
    ),
    "pricer n=40 d=8000": (
        {
            "protocol": "pricer",
            "data": {"model": "vectors", "agents": 40, "dimension": 8000},
            "t_max": 2,
            "checkpoints": 2,
        },
        0,
        8000,
    ),
    "eb-gaussian m=3e5": (
        {
            "protocol": "eb-gaussian",
            "data": {"model": "hierarchical-gaussian", "agents": 300_000},
            "t_max": 20,
        },
        0,
        1,
    ),
    # a ``forget`` window's rings: one cell per release a pair can get within W + 1 slots
    # (rRR: one a slot; RR: one in M − 1 slots; on a graph one in d_min), a reset's sums
    "private-colme rRR M=200 window": (
        {
            "protocol": "private-colme",
            "params": {"schedule": "rrr", "forget": {"window": 200}},
            "data": {**_CLASSES, "agents": 200},
            "t_max": 400,
        },
        0,
        1,
    ),
    "private-colme M=2000 window": (
        {
            "protocol": "private-colme",
            "params": {"forget": {"window": 5000}},
            "data": {**_CLASSES, "agents": 2000},
            "t_max": 2000,
        },
        0,
        1,
    ),
    "private-colme M=1000 reset PM-II MoM Sch-Var-2": (
        {
            "protocol": "private-colme",
            "params": {
                "forget": {"reset": 500},
                "variance": "sch-var-2",
                "weights": "mom",
                "mechanism": "pm2",
            },
            "data": {**_CLASSES, "agents": 1000},
            "t_max": 1000,
        },
        0,
        1,
    ),
    "private-colme graph M=1e4 window": (
        {
            "protocol": "private-colme",
            "params": {"peers": "topology", "forget": {"window": 1000}},
            "data": {**_CLASSES, "agents": 10_000},
            "t_max": 1200,
            "topology": {"model": "regular", "degree": 10},
        },
        100_000,
        1,
    ),
    # an agent's own window: its last W samples (local, ideal, the server protocols)
    "local M=1e5 window": (
        {
            "protocol": "local",
            "params": {"forget": {"window": 1000}},
            "data": {"model": "hierarchical-gaussian", "agents": 100_000},
            "t_max": 1000,
        },
        0,
        1,
    ),
    "eb-gaussian PM-I M=1e5 window": (
        {
            "protocol": "eb-gaussian",
            "params": {"forget": {"window": 1000}, "round": 100, "mechanism": "pm1"},
            "data": {"model": "hierarchical-gaussian", "agents": 100_000},
            "t_max": 1000,
        },
        0,
        1,
    ),
}


def estimate(scenario: dict, edges: int, dimension: int) -> int:
    """What `desim validate` estimates for one run of `scenario`."""
    load_plugins()
    cls = PROTOCOLS.get(scenario["protocol"])
    params = build(cls.Params, scenario.get("params", {}), "scenario")
    t_max, checkpoints = scenario["t_max"], scenario.get("checkpoints", 60)
    degree = scenario.get("topology", {}).get("degree")
    sizes = Sizes(scenario["data"]["agents"], dimension, edges, min_degree=degree)
    per_unit = cls.memory_per_unit(params, t_max, sizes)
    return run_bytes(cls, sizes, t_max, checkpoints, per_unit=per_unit)[0]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_the_estimate_is_within_1_5x_of_the_measured_peak(name):
    scenario, edges, dimension = WORKLOADS[name]
    done = subprocess.run(
        [sys.executable, "-c", _PEAK, json.dumps([{"seed": 1, **scenario}])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    measured = int(done.stdout.split()[-1])
    ratio = estimate(scenario, edges, dimension) / measured
    assert 1 / 1.5 <= ratio <= 1.5, (name, ratio, measured / 2**20)


# -- what bounds a forget window's rings, read from the study file ---------------------------

_FORGET = STUDY + 'schedule = "rrr"\nforget = {window = 200}\n'


def test_a_forget_window_counts_in_the_estimate(tmp_path, capsys, machine):
    # rRR: a pair may get a release every slot, so each ring holds 256 cells of 16 bytes
    # (300² pairs × 4 kB ≈ 0.35 GiB): refused under 300M, while without ``forget`` it fits
    folder = _folder(tmp_path)
    assert main(["validate", str(folder), "--memory", "300M"]) == 0
    (folder / "study.toml").write_text(_FORGET)
    assert main(["validate", str(folder), "--memory", "300M"]) == 2
    err = capsys.readouterr().err
    assert "scenario 'PM-I': private-colme with agents = 300 needs about 0.4" in err
    assert "(M² pair arrays)" in err and len(err.strip().splitlines()) == 1


def _sizes(tmp_path: Path, extra: str) -> limits.Sizes:
    (tmp_path / "study.toml").write_text(STUDY + extra)
    file = tmp_path / "study.toml"
    doc = parse_study(read_study_file(file), file)
    return limits.study_sizes(limits.horizon(doc, False), doc)


@pytest.mark.parametrize(
    ("extra", "min_degree", "ideal"),
    [
        ("", None, True),
        ('[topology]\nmodel = "regular"\ndegree = 6\n'
         '[grid]\n"topology.degree" = [4, 8]\n', 4, True),
        ('[topology]\nmodel = "ring"\nk = 3\n', 6, True),
        ('[topology]\nmodel = "watts-strogatz"\nk = 6\n', 3, True),
        ('[topology]\nmodel = "grid"\n', None, True),
        ('[topology]\nmodel = "complete"\n', 299, True),
        ('[topology]\nmodel = "barabasi-albert"\nm = 3\n', None, True),
        ('[topology]\nmodel = "erdos-renyi"\np = 0.1\n', None, True),
        ('[topology]\nmodel = "regular"\ndegree = 6\nrewire = {every = 10}\n', None, True),
        ('[topology]\nmodel = "regular"\ndegree = 6\nrewire = {every = 0}\n', 6, True),
        ('[network]\nlinks = "bernoulli"\n', None, False),
        ('[grid]\n"network.links" = ["ideal", "bernoulli"]\n', None, False),
    ],
)  # fmt: skip
def test_the_smallest_degree_and_ideal_links_are_read_from_the_study(
    tmp_path, extra, min_degree, ideal
):
    sizes = _sizes(tmp_path, extra)
    assert (sizes.min_degree, sizes.ideal) == (min_degree, ideal)


def test_a_ring_holds_the_releases_a_pair_can_get_within_the_window():
    # RR over M = 101 agents: a pair gets a release every 100 slots, so W = 250 (251 slots)
    # holds at most ⌈251/100⌉ = 3, kept 4, a ring of 8 cells (16 bytes each) and the heads,
    # base and T^W (40 bytes); links that are not ideal also keep each cell's j (8 bytes)
    load_plugins()
    cls = PROTOCOLS.get("private-colme")
    params = build(cls.Params, {"forget": {"window": 250}}, "scenario")
    bare = cls.memory_per_unit(build(cls.Params, {}, "scenario"), 1000)["pair"]
    ideal = cls.memory_per_unit(params, 1000, Sizes(101, 1, 0))
    assert ideal["pair"] - bare == 16 * 8 + 40
    assert ideal["agent"] == 8 * 250 + 8
    lossy = cls.memory_per_unit(params, 1000, Sizes(101, 1, 0, ideal=False))
    assert lossy["pair"] - bare == 24 * 8 + 40
    # unknown sizes: one release a slot (kept 252, 256 cells), links perhaps not ideal
    assert cls.memory_per_unit(params, 1000)["pair"] - bare == 24 * 256 + 40
