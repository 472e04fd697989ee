"""Benchmark of `desim validate` on large but valid studies (issue 27; run on demand).

    python tests/benchmarks/bench_validate.py              # both workloads
    python tests/benchmarks/bench_validate.py --only grid  # rows whose name contains a text
    python tests/benchmarks/bench_validate.py --root DIR   # time another checkout (before/after)
    python tests/benchmarks/bench_validate.py --repeat 3   # best of 3 tries
    python tests/benchmarks/bench_validate.py --keep DIR   # write the studies to DIR and keep them

The studies are written into a scratch folder (the same files every time: fixed seeds):

* grid: three scenarios (Private-ColME with PM-I, ColME without noise, C-ColME on a graph) over
  a grid of 10 privacy budgets × 15 latency means × 20 data spreads, 20 replicates:
  180,000 runs, all distinct (every scenario declares the privacy budget);
* trace: a 51 MB link-outage trace (about 2 million rows ``start,end,state,src,dst`` in time
  order, intervals of one link never overlapping) read by two scenarios over a small grid.

Each workload is one `desim validate` in a fresh process: `seconds` is its wall time, imports
included (what a user waits for), `cpu` its CPU time, `peak MB` its maximum resident memory.
The targets of issue 27, on an idle machine: grid < 20 s; trace < 10 s and < 300 MB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import json, resource, sys, time
start = time.perf_counter()
from desim.study.cli import main
(folder,) = json.loads(sys.argv[1])
rc = main(["validate", folder])
wall = time.perf_counter() - start
use = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"rc": rc, "wall": wall, "cpu": use.ru_utime + use.ru_stime,
                  "rss_mb": use.ru_maxrss / 1024}))
"""

_HEAD = """\
[study]
title = "{title}"
seed = 1
replicates = {replicates}
t_max = 1000
checkpoints = 20

[data]
model = "classes"
agents = {agents}
class_means = [0.2, 0.4, 0.8]
sigma = 0.5

[topology]
model = "regular"
degree = 4

[network]
links = "ideal"
"""

PRIVATE = """
[[scenario]]
name = "Private-ColME"
protocol = "private-colme"
peers = "all"
mechanism = "pm1"
"""
COLME = """
[[scenario]]
name = "ColME"
protocol = "private-colme"
peers = "all"
noise = "none"
"""
CCOLME = """
[[scenario]]
name = "C-ColME"
protocol = "c-colme"
"""

#: 10 privacy budgets × 15 latency means × 20 data spreads.
GRID = {
    "defaults.epsilon": [0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0, 5.0],
    "network.latency.mean": [
        float(m) for m in (0, 0.5, 1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150)
    ],
    "data.sigma": [round(0.05 * k, 2) for k in range(1, 21)],
}
GRID_STUDY = (
    _HEAD.format(title="180,000 runs", replicates=20, agents=20)
    + """
[network.latency]
model = "lognormal"
mean = 1.0
cv = 1.0
resolution = 0.25

[defaults]
epsilon = 1.0

[grid]
"""
    + "".join(f'"{path}" = {json.dumps(values)}\n' for path, values in GRID.items())
    + PRIVATE
    + COLME
    + CCOLME
)

TRACE_AGENTS = 100
TRACE_STUDY = (
    _HEAD.format(title="a 51 MB trace", replicates=4, agents=TRACE_AGENTS)
    + """
[network.outages]
model = "trace"
file = "outages.csv"

[grid]
"data.sigma" = [0.25, 0.5]
"""
    + PRIVATE
    + CCOLME
)
#: Size of the trace file to write, in bytes (the file issue 27 measured).
TRACE_BYTES = 51_000_000


def write_trace(path: Path, agents: int = TRACE_AGENTS, size: int = TRACE_BYTES) -> int:
    """Write a link-outage trace of about `size` bytes for `agents` agents (and the server):
    per link, alternating gaps and outages of random lengths, all rows in time order; return
    the number of rows."""
    rng = np.random.default_rng(27)
    addresses = agents + 1
    src, dst = np.triu_indices(addresses, k=1)
    per_link = max(1, size // (27 * len(src)))
    gaps = rng.exponential(50.0, (len(src), per_link)).round(2) + 0.01
    lengths = rng.exponential(5.0, (len(src), per_link)).round(2) + 0.01
    ends = np.cumsum(gaps + lengths, axis=1)
    starts = ends - lengths
    order = np.argsort(starts, axis=None, kind="stable")
    link = np.repeat(np.arange(len(src)), per_link)[order]
    state = np.where(rng.random(len(order)) < 0.9, "down", "up")
    with path.open("w") as f:
        f.write("start,end,state,src,dst\n")
        chunk = 200_000
        for i in range(0, len(order), chunk):
            rows = slice(i, i + chunk)
            s, e = starts.ravel()[order[rows]], ends.ravel()[order[rows]]
            f.writelines(
                f"{a:.2f},{b:.2f},{c},{x},{y}\n"
                for a, b, c, x, y in zip(
                    s.tolist(),
                    e.tolist(),
                    state[rows].tolist(),
                    src[link[rows]].tolist(),
                    dst[link[rows]].tolist(),
                    strict=True,
                )
            )
    return len(order)


def write_studies(folder: Path) -> dict[str, Path]:
    """Write the two studies under `folder`; return workload name → study folder."""
    grid = folder / "grid"
    grid.mkdir(parents=True, exist_ok=True)
    (grid / "study.toml").write_text(GRID_STUDY)
    trace = folder / "trace"
    trace.mkdir(exist_ok=True)
    (trace / "study.toml").write_text(TRACE_STUDY)
    if not (trace / "outages.csv").exists():
        write_trace(trace / "outages.csv")
    return {"grid: 180,000 runs": grid, "trace: 51 MB link outages": trace}


def time_validate(root: Path, study: Path) -> dict:
    """Wall time, CPU time and peak memory of `desim validate STUDY` in checkout `root`."""
    venv = root / ".venv" / "bin" / "python"  # the checkout's own environment, if it has one
    python = str(venv) if venv.exists() else sys.executable
    out = subprocess.run(
        [python, "-c", _CHILD, json.dumps([str(study)])],
        check=True,
        capture_output=True,
        text=True,
        cwd=root,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["rc"] != 0:
        raise SystemExit(f"desim validate {study} failed: {out.stdout}{out.stderr}")
    return result


def main() -> None:
    """Write the studies, time each workload and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="time only workloads whose name contains this")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to time")
    parser.add_argument("--repeat", type=int, default=1, help="tries per workload (best kept)")
    parser.add_argument("--keep", type=Path, help="write the studies here and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        studies = write_studies(args.keep or Path(tmp))
        print(f"{'workload':<28} {'seconds':>8} {'cpu':>8} {'peak MB':>8}")
        for name, folder in studies.items():
            if args.only not in name:
                continue
            tries = [time_validate(args.root, folder) for _ in range(args.repeat)]
            best = min(tries, key=lambda r: r["wall"])
            print(f"{name:<28} {best['wall']:8.1f} {best['cpu']:8.1f} {best['rss_mb']:8.0f}")


if __name__ == "__main__":
    main()
