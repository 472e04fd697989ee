"""Benchmarks of privacy accounting (issue 13), run on demand:

    python tests/benchmarks/bench_privacy.py

- calibration: CPU time of `calibration = "tight"` in a fresh process (the accountant's
  bisection, uncached) and again (cached), per mechanism — bar ≤ 1 s per run;
- the ledger: Private-ColME M = 200, T = 3·10⁴, 60 checkpoints, with and without
  ``metrics = ["privacy"]`` — bar ≤ 10 % more CPU time.

Each workload runs in a fresh process; CPU time is what the bars judge (the machine is shared).
"""

from __future__ import annotations

from harness import run_child, time_scenario

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


def main() -> None:
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
    print(f"\n{'workload':<52} {'cpu s (a)':>10} {'cpu s (b)':>10}  {'bar':<9} result")
    print("(a/b: calibration uncached/cached; ledger without/with the privacy metric)")
    for name, a, b, bar, ok in rows:
        print(f"{name:<52} {a:10.3f} {b:10.3f}  {bar:<9} {ok}")


if __name__ == "__main__":
    main()
