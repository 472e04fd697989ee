"""Benchmarks of privacy accounting (issue 13), run on demand:

    python tests/benchmarks/bench_privacy.py

- calibration: CPU time of `calibration = "tight"` in a fresh process (the accountant's
  bisection, uncached) and again (cached), per mechanism — bar ≤ 1 s per run;
- the ledger: Private-ColME M = 200, T = 3·10⁴, 60 checkpoints, with and without
  ``metrics = ["privacy"]`` — bar ≤ 10 % more CPU time;
- budgets (issue 30): Private-ColME M = 200, T = 10⁴, round robin, with a budget that can bind
  but is not hit, and with ``action = "degrade"`` in effect (PM-II against colluding queriers,
  PM-I against one), each against the same run without a budget, all with
  ``metrics = ["privacy", "budget"]`` and dp-accounting imported before the clock starts —
  bar ≤ 15 % more CPU time (`--budgets N`: only these rows, N runs of each, alternated; judged
  on the median of the N paired ratios, which a change of load between pairs moves less than
  the ratio of the two bests, shown beside it).

Each workload runs in a fresh process; CPU time is what the bars judge (the machine is shared).
"""

from __future__ import annotations

import argparse
import statistics

from harness import best_of, run_child, time_scenario

DATA = {"model": "classes", "agents": 200, "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}
T_MAX = 30_000

_CALIBRATION_CHILD = """
import json, math, sys, time
from desim.models.privacy.accounting import psum_noise
(noise, mechanism, variance) = json.loads(sys.argv[1])
args = (noise, math.sqrt(3) / 2, mechanism, 1.0, 1e-6, 30000, "tight", variance)
cpu = time.process_time()
psum_noise(*args)
first = time.process_time() - cpu
cpu = time.process_time()
psum_noise(*args)
print(json.dumps({"first": first, "cached": time.process_time() - cpu}))
"""

CALIBRATIONS = [
    ("gaussian", "pm1", False),
    ("gaussian", "pm2", False),
    ("gaussian", "pm2", True),
    ("laplace", "pm1", False),
    ("laplace", "pm2", False),
    ("laplace", "pm2", True),
]

LEDGER = {
    "PM-I non-MoM RR": {"mechanism": "pm1", "weights": "last"},
    "PM-II non-MoM RR": {"mechanism": "pm2", "weights": "last"},
    "PM-II non-MoM RR Laplace": {"mechanism": "pm2", "weights": "last", "noise": "laplace"},
}


_BUDGET_CHILD = """
import json, sys, time
import dp_accounting  # (its import is a run's once, the same with a budget or without)
import desim, desim.kernel.plugins
from desim.study.scenario import Scenario
(kwargs,) = json.loads(sys.argv[1])
kwargs["metrics"] = tuple(kwargs["metrics"])
s = Scenario(**kwargs)
desim.kernel.plugins.load_plugins()
cpu = time.process_time()
desim.run(s)
print(json.dumps({"cpu": time.process_time() - cpu}))
"""

#: (row, mechanism, budget, t_max). Not hit: at t_max = 63·199 + 100 the queriers at RR
#: offsets ≤ 100 have made their 64th release (a 7th tree level) and the others not, so an
#: agent's count against colluding queriers ends at 100·7 + 99·6 = 1294 p-sums, below the
#: 7·199 = 1393 the gate must allow for: ε_B = 13.2 gives k* = 1348 between the two (the gate
#: decides every release, none is refused). ε_B = 1 against colluding and 0.5 against one are
#: reached early, so `degrade` is in effect for most of the run.
BUDGETS = [
    ("budget not hit (PM-II colluding)", "pm2", {"epsilon": 13.2, "against": "colluding"}, 12_637),
    ("degrade in effect (PM-II colluding)", "pm2", {"epsilon": 1, "against": "colluding"}, 10_000),
    ("degrade in effect (PM-I one)", "pm1", {"epsilon": 0.5, "against": "one"}, 10_000),
]


def budget_rows(tries: int) -> list[tuple]:
    """CPU seconds of each budget row and of its run without a budget, best of `tries` fresh
    processes, the two alternated (so a change in load hits both alike), judged on the median
    of the paired ratios."""
    rows = []
    for name, mechanism, budget, t_max in BUDGETS:
        base = {
            "protocol": "private-colme",
            "params": {"mechanism": mechanism, "weights": "last", "calibration": "tight"},
            "data": DATA,
            "t_max": t_max,
            "seed": 1,
            "metrics": ["privacy", "budget"],
        }
        limited = {**base, "params": {**base["params"], "budget": {**budget, "action": "degrade"}}}
        plain, spent = [], []
        for _ in range(tries):
            plain.append(run_child(_BUDGET_CHILD, base))
            spent.append(run_child(_BUDGET_CHILD, limited))
        a, b = best_of(plain)["cpu"], best_of(spent)["cpu"]
        paired = statistics.median(y["cpu"] / x["cpu"] for x, y in zip(plain, spent, strict=True))
        rows.append(
            (
                f"{name} ×{tries}",
                a,
                b,
                "≤ 1.15×",
                f"{'ok' if paired <= 1.15 else 'FAIL'} ({paired:.3f}×; bests {b / a:.3f}×)",
            )
        )
    return rows


def show(rows: list[tuple], legend: str) -> None:
    """Print `rows` (workload, two CPU times, bar, result) as a table under `legend`."""
    print(f"\n{'workload':<52} {'cpu s (a)':>10} {'cpu s (b)':>10}  {'bar':<9} result")
    print(legend)
    for name, a, b, bar, ok in rows:
        print(f"{name:<52} {a:10.3f} {b:10.3f}  {bar:<9} {ok}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=int, metavar="N", help="only the budget rows, best of N")
    args = parser.parse_args()
    if args.budgets:
        show(budget_rows(args.budgets), "(a/b: without/with the budget, action = degrade)")
        return
    rows = []
    for noise, mech, var in CALIBRATIONS:
        r = run_child(_CALIBRATION_CHILD, noise, mech, var)
        name = f"tight calibration {noise} {mech}{' Sch-Var-1' if var else ''}"
        rows.append((name, r["first"], r["cached"], "≤ 1 s", "ok" if r["first"] <= 1 else "FAIL"))
    for name, params in LEDGER.items():
        base = {
            "protocol": "private-colme",
            "params": {**params, "calibration": "tight"},
            "data": DATA,
            "t_max": T_MAX,
            "seed": 1,
        }
        plain = time_scenario(**base)["cpu"]
        ledger = time_scenario(**base, metrics=["privacy"])["cpu"]
        extra = ledger / plain - 1
        rows.append(
            (
                f"ledger M=200 T=3e4 {name}",
                plain,
                ledger,
                "≤ +10 %",
                f"{'ok' if extra <= 0.10 else 'FAIL'} ({100 * extra:+.1f} %)",
            )
        )
    rows += budget_rows(2)
    show(
        rows,
        "(a/b: calibration uncached/cached; ledger without/with the privacy metric; "
        "budget without/with)",
    )


if __name__ == "__main__":
    main()
