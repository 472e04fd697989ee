"""What the benchmark scripts share: a workload in a fresh process, a study in a scratch copy."""

from __future__ import annotations

import json
import shutil
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
