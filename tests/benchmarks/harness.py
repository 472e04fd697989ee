"""What the benchmark scripts share: a workload in a fresh process, a study in a scratch copy."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, *args: object) -> dict:
    """Run `code` in a fresh Python (so peak memory is its own) with `args` as one JSON
    argument; return the JSON object it prints last."""
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(args))],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


_SCENARIO_CHILD = """
import json, resource, sys, time
import desim, desim.kernel.plugins
from desim.study.scenario import Scenario
(kwargs,) = json.loads(sys.argv[1])
kwargs["metrics"] = tuple(kwargs.get("metrics", ()))
s = Scenario(**kwargs)
desim.kernel.plugins.load_plugins()  # imports are not part of the run
start, cpu = time.perf_counter(), time.process_time()
desim.run(s)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": rss}))
"""


def time_scenario(**scenario: object) -> dict:
    """Wall time, CPU time and peak memory (MB) of one `desim.Scenario(**scenario)` run in a
    fresh process; imports and plugin loading are not timed."""
    return run_child(_SCENARIO_CHILD, scenario)


def time_study(name: str, workers: int) -> float:
    """Wall time of a full study (all runs, curves and figures) in a scratch copy."""
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / name
        shutil.copytree(
            ROOT / "studies" / name,
            study,
            ignore=shutil.ignore_patterns("results", "figures", "quick"),
        )
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from desim.study.cli import main; sys.exit(main())",
                "run",
                str(study),
                "--workers",
                str(workers),
                "--no-progress",
            ],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        return time.perf_counter() - start


def best_of(tries: list[dict]) -> dict:
    """The try of one workload with the least CPU time: on a shared machine interference only
    adds time, so the least is the closest to what the code costs (as `timeit` keeps)."""
    return min(tries, key=lambda r: r["cpu"])


#: Changing graphs (issue 29): static against 10 % of the links rewired before every 100th slot
#: (a random 10-regular graph); bar: the rewired run ≤ 1.2× the static run's CPU.
REWIRE_EVERY, BAR_REWIRE = 100, 1.2
#: `time_scenario`'s child with the compiled kernels of a changing graph (Private-ColME's slot
#: and change kernels, the rewiring draw's) loaded before the timed run (as the imports are),
#: their load time printed apart: numba's first call costs a fixed fraction of a second that only
#: the runs taking a kernel (irregular or changing graphs) would otherwise carry.
_WARM_CHILD = """
import json, resource, sys, time
import desim, desim.kernel.plugins
from desim.models.colme import change_kernels, pair_kernels
from desim.topologies import rewire_kernels
from desim.study.scenario import Scenario
(kwargs,) = json.loads(sys.argv[1])
kwargs["metrics"] = tuple(kwargs.get("metrics", ()))
s = Scenario(**kwargs)
desim.kernel.plugins.load_plugins()
jit = time.process_time()
pair_kernels.warm(), change_kernels.warm(), rewire_kernels.warm()
jit = time.process_time() - jit
start, cpu = time.perf_counter(), time.process_time()
desim.run(s)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": rss, "jit": jit}))
"""


def rewire_rows(label: str, scenario: dict, repeat: int) -> list[tuple]:
    """`scenario` (a `desim.Scenario`'s keywords, without its topology) on a static and on a
    rewired random 10-regular graph, alternated `repeat` times in fresh processes (a change in
    load hits both alike); each the least CPU time of its tries, the rewired against the bar."""
    static = {"model": "regular", "degree": 10}
    rewire = {"every": REWIRE_EVERY, "fraction": 0.1}
    topologies = {"static": static, f"rewired every {REWIRE_EVERY}": {**static, "rewire": rewire}}
    tries: dict[str, list[dict]] = {name: [] for name in topologies}
    for _ in range(repeat):
        for name, topology in topologies.items():
            r = run_child(_WARM_CHILD, {**scenario, "topology": topology, "seed": 1})
            tries[name].append(r)
            print(
                f"  {name}: {r['cpu']:.2f} s CPU (kernels loaded in {r['jit']:.2f} s)", flush=True
            )
    fixed, rewired = (best_of(t) for t in tries.values())
    ratio = rewired["cpu"] / fixed["cpu"]
    rows = []
    for name, r in zip(topologies, (fixed, rewired), strict=True):
        bar = "" if r is fixed else f"≤ {BAR_REWIRE:g}× static ({ratio:.2f}×)"
        ok = "" if r is fixed else ("ok" if ratio <= BAR_REWIRE else "FAIL")
        rows.append((f"{label} {name}", r["wall"], r["cpu"], r["rss_mb"], bar, ok))
    return rows


#: The ``forget`` rules a forgetting row compares with the run without one (issue 29's bar:
#: per-slot CPU ≤ `BAR_FORGET`× without).
FORGET_RULES = {"without": None, "window 1000": {"window": 1000}, "reset 2000": {"reset": 2000}}
BAR_FORGET = 1.2


def forget_rows(scenario: dict, tries: int) -> list[tuple]:
    """Per-slot CPU (ms) of `scenario` without and with each of `FORGET_RULES` (added to its
    params): `tries` fresh processes each, the rules alternated (so a change in load hits all
    alike); per rule its median, least and most, and the median's ratio to the median
    without, and whether that ratio meets `BAR_FORGET`."""
    cpu: dict[str, list[float]] = {name: [] for name in FORGET_RULES}
    for _ in range(tries):
        for name, forget in FORGET_RULES.items():
            params = dict(scenario["params"])
            if forget is not None:
                params["forget"] = forget
            r = time_scenario(**{**scenario, "params": params})
            cpu[name].append(r["cpu"] / scenario["t_max"] * 1e3)
    base = statistics.median(cpu["without"])
    rows = []
    for name, per_slot in cpu.items():
        ratio = statistics.median(per_slot) / base
        ok = name == "without" or ratio <= BAR_FORGET
        rows.append((name, statistics.median(per_slot), min(per_slot), max(per_slot), ratio, ok))
    return rows


def print_forget(title: str, rows: list[tuple], tries: int) -> None:
    """`forget_rows`' table, as closing notes quote them (ms per slot, `tries` runs each)."""
    print(f"\n{title}, ms per slot, {tries} alternated runs each")
    print(f"{'forget':<14} {'median':>7} {'least':>7} {'most':>7} {'ratio':>6}  bar")
    for name, mid, low, high, ratio, ok in rows:
        result = f"≤ {BAR_FORGET:g}× {'ok' if ok else 'FAIL'}" if name != "without" else ""
        print(f"{name:<14} {mid:7.3f} {low:7.3f} {high:7.3f} {ratio:5.2f}×  {result}")
