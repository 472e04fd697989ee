"""Benchmark of Dask's overhead: a 400-run quick sweep on ``local:2`` versus the pool of 2.

    python tests/benchmarks/bench_dask.py               # 400 runs, once each way
    python tests/benchmarks/bench_dask.py --repeat 3    # best of 3

Each way runs the same study into a fresh folder: the process pool with 2 workers
(``--workers 2``), ``--scheduler local:2`` (the wall time includes starting the LocalCluster),
and a LocalCluster of 2 started beforehand and reached by its address (the overhead of the
scheduler and of the client writing every record, without the start-up). The metrics.parquet
of the three must be byte-identical. Wall time depends on what else the machine runs; the
table gives the best of `--repeat` tries, the overhead relative to the pool, and the CPU time
of this process (with Dask it writes every record: about 10 ms of CPU per run here, done by
the pool's workers otherwise). Run it on an idle machine: with 2 cores, the client competes
with the 2 workers for CPU.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

from distributed import LocalCluster

from desim.study.results import run_study
from desim.study.spec import load_study

#: 4 scenarios × 100 replicates of a small Private-ColME network: 400 runs of ~0.1 s.
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
    parser.add_argument("--agents", type=int, default=30, help="M of every run (default 30)")
    parser.add_argument("--t-max", type=int, default=400, help="T of every run (default 400; "
                        "colme-fig2's quick scale is --agents 60 --t-max 2000)")
    args = parser.parse_args()
    text = STUDY.format(agents=args.agents, t_max=args.t_max)
    best: dict[str, float] = {}
    client: dict[str, float] = {}
    outputs: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeat):
            root = Path(tmp) / str(k)
            root.mkdir()
            ways = {"process pool, 2 workers": {"workers": 2},
                    "dask local:2 (with cluster start-up)": {"scheduler": "local:2"}}
            for name, how in ways.items():
                wall, cpu, out = one(root, name.split()[0] + name.split()[1], text, **how)
                best[name] = min(best.get(name, wall), wall)
                client[name] = cpu
                outputs[name] = out
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=None, silence_logs=logging.ERROR) as cluster:
                name = "dask LocalCluster of 2, started before"
                wall, cpu, out = one(root, "started", text,
                                     scheduler=cluster.scheduler_address)
                best[name] = min(best.get(name, wall), wall)
                client[name] = cpu
                outputs[name] = out
    same = len(set(outputs.values())) == 1
    pool = best["process pool, 2 workers"]
    head = f"400 runs, M = {args.agents}, T = {args.t_max}"
    print(f"\n{head:<42} {'wall s':>8} {'vs pool':>9} {'client cpu s':>13}")
    for name, wall in best.items():
        print(f"{name:<42} {wall:8.2f} {100 * (wall / pool - 1):+8.1f}% {client[name]:13.2f}")
    print(f"metrics.parquet byte-identical: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
