"""Benchmark of Dask's overhead: a 400-run quick sweep on ``local:2`` versus the pool of 2.

    python tests/benchmarks/bench_dask.py                             # the quick sweep, once
    python tests/benchmarks/bench_dask.py --repeat 3                  # best of 3
    python tests/benchmarks/bench_dask.py --agents 30 --t-max 400     # shorter runs (~25 ms)

The quick sweep is 4 scenarios × 100 replicates at colme-fig2's quick scale (M = 60 agents,
T = 2000; Private-ColME with PM-I and PM-II, local, ideal): 400 runs averaging ~0.1 s, about
20 s on 2 idle cores. Each way runs the same study into a fresh folder: the process pool with 2
workers (``--workers 2``), ``--scheduler local:2`` (the wall time includes starting the
LocalCluster), and a LocalCluster of 2 with dask's default settings started beforehand and
reached by its address (as a cluster started by hand: spawned workers that import desim on
their first task, dashboard housekeeping on). The metrics.parquet of the three must be
byte-identical. The table gives the best wall time of `--repeat` tries, its overhead relative to
the pool, the CPU time of this process (with Dask it hosts the scheduler and writes every
record, which the pool's workers do otherwise) and the CPU time of this process and of every
worker together (what the overhead costs on a busy machine, where wall times mostly measure the
other jobs). On 2 cores the client competes with the 2 workers for CPU.

Measured on 2 cores shared with other jobs (load average 2–4, this benchmark included), each
way's best wall time over 3 alternating tries; in brackets the CPU of all processes relative to
the pool's. "Before" is `local:N` with dask's defaults (spawned workers, dashboard
housekeeping), as a LocalCluster started beforehand still has:

| 400 runs                                     | M = 60, T = 2000        | M = 30, T = 400        |
|----------------------------------------------|-------------------------|------------------------|
| process pool, 2 workers                      | 20.05 s                 | 5.70 s                 |
| dask local:2, start-up included              | 20.88 s  +4 % (+3–6 %)  | 6.13 s  +8 % (+3–6 %)  |
| dask local:2 before (dask's defaults)        | 25.02 s +24 % (+22 %)   | 8.20 s +42 % (+41 %)   |
| dask LocalCluster (defaults), started before | 23.74 s +18 % (+23 %)   | 7.12 s +25 % (+44 %)   |

The remaining overhead on 2 cores is this process's extra CPU (~0.6–1 s here: it hosts the
scheduler and writes every record, while the 2 workers use both cores) and ~0.2 s of start-up.
"""

from __future__ import annotations

import argparse
import logging
import resource
import tempfile
import time
from pathlib import Path

from distributed import LocalCluster

from desim.study.results import run_study
from desim.study.spec import load_study

#: 4 scenarios × 100 replicates: 400 runs (~0.1 s each at the quick scale M = 60, T = 2000).
STUDY = """\
[study]
title = "dask benchmark"
seed = 5
replicates = 100
t_max = {t_max}
checkpoints = 12

[data]
model = "classes"
agents = {agents}
class_means = [0.2, 0.4, 0.8]
sigma = 0.5

[defaults]
epsilon = 1.0

[[scenario]]
name = "PM-I"
protocol = "private-colme"
mechanism = "pm1"

[[scenario]]
name = "PM-II"
protocol = "private-colme"
mechanism = "pm2"

[[scenario]]
name = "local"
protocol = "local"

[[scenario]]
name = "ideal"
protocol = "ideal"

[[plot]]
file = "mse.png"
title = "MSE"
"""


def children_cpu() -> float:
    """CPU seconds of this process's ended children (pool workers, LocalCluster workers)."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def one(root: Path, name: str, text: str, **how) -> tuple[float, float, bytes]:
    folder = root / name
    folder.mkdir()
    (folder / "study.toml").write_text(text, encoding="utf-8")
    study = load_study(folder)
    assert len(study.unique_runs) == 400
    start, cpu = time.perf_counter(), time.process_time()
    summary = run_study(study, progress=False, **how)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert summary.ok and summary.done == 400, summary
    return wall, cpu, (study.results_dir / "metrics.parquet").read_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="tries of each way (best kept)")
    parser.add_argument(
        "--agents",
        type=int,
        default=60,
        help="M of every run (default 60, colme-fig2's quick scale)",
    )
    parser.add_argument(
        "--t-max",
        type=int,
        default=2000,
        help="T of every run (default 2000, colme-fig2's quick scale)",
    )
    args = parser.parse_args()
    text = STUDY.format(agents=args.agents, t_max=args.t_max)
    best: dict[str, float] = {}
    client: dict[str, float] = {}
    total: dict[str, float] = {}
    outputs: dict[str, bytes] = {}

    def keep(name: str, wall: float, cpu: float, workers: float, out: bytes) -> None:
        if wall < best.get(name, float("inf")):
            best[name], client[name], total[name] = wall, cpu, cpu + workers
        outputs[name] = out

    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeat):
            root = Path(tmp) / str(k)
            root.mkdir()
            ways = {
                "process pool, 2 workers": {"workers": 2},
                "dask local:2 (with cluster start-up)": {"scheduler": "local:2"},
            }
            for name, how in ways.items():
                before = children_cpu()
                wall, cpu, out = one(root, name.split()[0] + name.split()[1], text, **how)
                keep(name, wall, cpu, children_cpu() - before, out)
            before = children_cpu()
            with LocalCluster(
                n_workers=2,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            ) as cluster:
                wall, cpu, out = one(root, "started", text, scheduler=cluster.scheduler_address)
            keep(
                "dask LocalCluster of 2 (defaults), started before",
                wall,
                cpu,
                children_cpu() - before,
                out,
            )  # workers' CPU includes their start-up
    same = len(set(outputs.values())) == 1
    pool, pool_total = best["process pool, 2 workers"], total["process pool, 2 workers"]
    head = f"400 runs, M = {args.agents}, T = {args.t_max}"
    print(
        f"\n{head:<52} {'wall s':>7} {'vs pool':>8} {'client cpu s':>13} "
        f"{'total cpu s':>12} {'vs pool':>8}"
    )
    for name, wall in best.items():
        print(
            f"{name:<52} {wall:7.2f} {100 * (wall / pool - 1):+7.1f}% {client[name]:13.2f} "
            f"{total[name]:12.2f} {100 * (total[name] / pool_total - 1):+7.1f}%"
        )
    print(f"metrics.parquet byte-identical: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
