"""Every size known before running: `desim validate` estimates the memory of every allocation that
scales with a parameter (Private-ColME's M² pair state, C-ColME's edges, PriCER's n × d vectors,
the oracle curve's Monte Carlo draws) and refuses a study one machine cannot hold, with the
estimate and what drives it, so that nothing that validates dies of memory.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from _toy import PRICER_HEAD, write_study

from desim.kernel.params import ConfigError
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import PROTOCOLS
from desim.study.cli import main
from desim.study.spec import limits, load_study
from desim.study.spec.limits import Sizes, run_bytes

STUDY = """
[study]
title = "t"
seed = 1
t_max = 20
checkpoints = 5

[data]
model = "classes"
agents = {agents}
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "PM-I"
protocol = "private-colme"
"""


@pytest.fixture
def machine(monkeypatch):
    """A machine with 20 GiB, whatever this one has."""
    monkeypatch.setattr(limits, "_memory_bytes", lambda: 20 * 2**30)


def test_private_colme_with_too_many_agents_is_refused_with_the_estimate(tmp_path, capsys, machine):
    folder = write_study(tmp_path / "s", STUDY.format(agents=100_000))
    code = main(["validate", str(folder)])
    err = capsys.readouterr().err
    assert code != 0
    assert "scenario 'PM-I': private-colme with agents = 100000 needs about" in err
    assert "(M² pair arrays); this machine has 20 GiB" in err
    assert len(err.strip().splitlines()) == 1


def test_force_skips_the_memory_estimate(tmp_path, machine):
    folder = write_study(tmp_path / "s", STUDY.format(agents=100_000))
    assert len(load_study(folder, force=True).runs) == 1


def test_a_grid_over_agents_is_estimated_at_its_largest_value(tmp_path, machine):
    text = STUDY.format(agents=10) + '\n[grid]\n"data.agents" = [10, 200000]\n'
    with pytest.raises(ConfigError, match="agents = 200000 needs about"):
        load_study(write_study(tmp_path / "s", text))


PRICER = (
    PRICER_HEAD
    + """
[[scenario]]
name = "PriCER"
protocol = "pricer"
"""
)


def test_a_pricer_dimension_too_large_is_refused_before_anything_is_allocated(
    tmp_path, capsys, machine
):
    folder = write_study(tmp_path / "s", PRICER.format(dimension=10**10))
    code = main(["validate", str(folder)])
    err = capsys.readouterr().err
    assert code != 0
    assert "pricer with agents = 10 and dimension = 10000000000 needs about" in err
    assert "Error" not in err  # not numpy's ArrayMemoryError


ORACLE = """
[study]
title = "o"
t_max = 100

[data]
model = "classes"
agents = 30
class_means = [0.2, 0.8]

[[curve]]
name = "oracle"
kind = "oracle"
draws = {draws}
"""


def test_oracle_draws_too_many_are_refused(tmp_path, machine):
    with pytest.raises(ConfigError, match=r"curve 'oracle': oracle with draws = 10{12}"):
        load_study(write_study(tmp_path / "s", ORACLE.format(draws=10**12)))
    assert load_study(write_study(tmp_path / "s", ORACLE.format(draws=20000))).curve_jobs


def test_c_colme_scales_with_the_edges_of_its_graph():
    cls = PROTOCOLS.get("c-colme")
    small, _ = run_bytes(cls, Sizes(10_000, 1, 100_000), 2000, 30)
    large, driver = run_bytes(cls, Sizes(10_000, 1, 100_000_000), 2000, 30)
    assert large > 10 * small
    assert driver == "per-edge arrays of the graph"


PEAK = """
import tracemalloc
import desim
def run(agents):
    desim.run(desim.Scenario("private-colme", {}, data={"model": "classes", "agents": agents},
                             t_max=20, checkpoints=5))
def peak(agents):
    run(agents)
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child of a large pytest
    # process would report its parent's peak
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) * 1024
def allocated(agents):
    tracemalloc.start()
    run(agents)
    top = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return top
print(peak(%d), peak(%d), allocated(%d), allocated(%d))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_the_private_colme_estimate_is_within_1_5x_of_the_measured_peak():
    # the growth of the peak from a small run (every module loaded) to one of 2000 agents,
    # against the growth of the estimate: what the interpreter holds anyway cancels
    small, large = 200, 2000
    done = subprocess.run(
        [sys.executable, "-c", PEAK % (small, large, small, large)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    low, high, low_allocated, high_allocated = map(int, done.stdout.split()[-4:])
    load_plugins()
    cls = PROTOCOLS.get("private-colme")
    estimate = (
        run_bytes(cls, Sizes(large, 1, 0), 20, 5)[0] - run_bytes(cls, Sizes(small, 1, 0), 20, 5)[0]
    )
    # The estimate counts the bytes allocated (as numpy reports them to tracemalloc); how many
    # of them are resident depends on numpy and the kernel: numpy 1.26 leaves the untouched
    # pages of a zeroed array out of memory, numpy 2 asks for huge pages for it too (a touch
    # makes 2 MiB resident).
    allocated = high_allocated - low_allocated
    assert allocated / 1.5 <= estimate <= 1.5 * allocated, (estimate / 2**20, allocated / 2**20)
    measured = high - low  # and the memory really used is never far above it
    assert measured <= 1.5 * estimate, (estimate / 2**20, measured / 2**20)


def test_a_trace_file_counts_for_the_scenarios_that_read_it(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "_memory_bytes", lambda: limits.BASE_BYTES + 20 * 2**20)
    folder = write_study(tmp_path / "s", STUDY.format(agents=12))
    assert load_study(folder).runs  # without a trace, the run fits
    rows = "".join(f"{2 * i}.5,{2 * i + 1}.25,down,{i % 12}\n" for i in range(30_000))
    (folder / "trace.csv").write_text("start,end,state,node\n" + rows)
    text = STUDY.format(agents=12) + '\n[network.nodes]\nmodel = "trace"\nfile = "trace.csv"\n'
    (folder / "study.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"needs about .* \(trace files parsed into rows\)"):
        load_study(folder)
