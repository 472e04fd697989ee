"""CPU time and peak memory of one run of each scenario of the population-scale study at each
number of agents (run on demand, not by pytest).

    python tests/benchmarks/bench_population.py                    # every M of the study
    python tests/benchmarks/bench_population.py --agents 100000    # one M
    python tests/benchmarks/bench_population.py --quick            # the study's --quick horizon

Each run is replicate 0 of the study's own scenario (the same tables, horizon and seed), in a
fresh process, so its peak memory (max RSS) is its own; the graph and the data are part of the
timed run, as in a study. The table also gives the messages each agent sent (from the run's
last checkpoint), the cost a deployment pays beside CPU time.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from harness import ROOT, run_child

from desim.study.spec import load_study

STUDY = ROOT / "studies" / "population-scale"

_CHILD = """
import json, resource, sys, time
import desim, desim.kernel.plugins
from desim.study.scenario import Scenario
(kwargs,) = json.loads(sys.argv[1])
kwargs["metrics"] = tuple(kwargs.get("metrics", ()))
s = Scenario(**kwargs)
desim.kernel.plugins.load_plugins()  # imports are not part of the run
start, cpu = time.perf_counter(), time.process_time()
out = desim.run(s)
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
rows = out.metrics
last = rows[rows["t"] == rows["t"].max()]
sent = float(last[last["metric"].str.startswith("messages_")]["value"].sum())
print(json.dumps({"wall": wall, "cpu": cpu, "rss_mb": rss, "sent": sent}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, action="append", help="only these M (repeatable)")
    parser.add_argument("--quick", action="store_true", help="the study's --quick horizon")
    args = parser.parse_args()
    study = load_study(STUDY, quick=args.quick)
    for run in study.runs:
        agents = run.columns["agents"]
        if run.scenario.replicate or (args.agents and agents not in args.agents):
            continue
        kwargs = asdict(run.scenario)
        kwargs["metrics"] = list(kwargs["metrics"])
        r = run_child(_CHILD, kwargs)
        print(
            f"{run.scenario.name:<34} M = {agents:>7,}  cpu {r['cpu']:8.2f} s  wall "
            f"{r['wall']:8.2f} s  peak {r['rss_mb']:8.0f} MB  messages/agent "
            f"{r['sent'] / agents:8.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
