"""Benchmarks of the README's performance bars that apply to PriCER (run on demand).

    python tests/benchmarks/bench_pricer.py            # the optimiser at n = 10, 50, 100
    python tests/benchmarks/bench_pricer.py --study    # also the Fig. 3 and Fig. 4 studies

The optimiser instances scale Fig. 3 of seed 004 up: the ten-node p = [0.1, 0.1, 0.8, 0.1, 0.1,
0.9, 0.1, 0.1, 0.9, 0.1] repeated, Erdős–Rényi links p_c = 0.5 (fully reciprocal), every node
trusting the next n/2 nodes (ε = 10³, others 0.1), δ = 10⁻³, R = 1, d = 1000; each is timed with
Algorithm 3 as printed and with the σ search (the default). Each workload runs in a fresh
process so its peak memory (max RSS) is its own; the table printed at the end is what goes into
closing notes.
"""

from __future__ import annotations

import argparse

from harness import run_child, time_study

#: (n, bar in seconds): "n = 10 in well under a second", n = 100 within 30 s.
SIZES = ((10, 0.5), (50, 30.0), (100, 30.0))
#: Bars of the studies end to end with 2 workers (not project bars: set here, like Fig. 2's).
STUDY_BARS = {"pricer-fig3": 120.0, "pricer-fig4": 600.0}

CHILD = """
import json, resource, sys, time
import numpy as np
from desim.kernel.links import Connectivity
from desim.network_models.links import reciprocity_matrix
from desim.models.pricer import optimiser as po
n, search = json.loads(sys.argv[1])
p = np.resize([0.1, 0.1, 0.8, 0.1, 0.1, 0.9, 0.1, 0.1, 0.9, 0.1], n)
P = np.full((n, n), 0.5)
np.fill_diagonal(P, 1.0)
eps = po.epsilon_matrix(po.trust_matrix("ring", n, n // 2), 1e3, 0.1)
prob = po.Problem(Connectivity(p, P, reciprocity_matrix(P, 1.0)), eps, np.full((n, n), 1e-3),
                  1.0, 1000)
start = time.perf_counter()
sol = po.optimise(prob, sigma_search=search)
wall = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ok = sol.report.converged and sol.report.bias <= 1e-9 and sol.report.privacy_excess <= 1e-9
print(json.dumps({"wall": wall, "rss_mb": rss, "objective": sol.objective, "ok": ok}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--study",
        action="store_true",
        help="also time the Fig. 3 and Fig. 4 studies with 2 workers",
    )
    args = parser.parse_args()
    rows = []
    for n, bar in SIZES:
        for search in (False, True):
            r = run_child(CHILD, n, search)
            what = "with σ search" if search else "Alg. 3 as printed"
            ok = r["ok"] and r["wall"] <= bar
            rows.append(
                (
                    f"PriCER optimiser n={n}, {what} (objective {r['objective']:.4g})",
                    r["wall"],
                    r["rss_mb"],
                    f"≤ {bar:g} s",
                    "ok" if ok else "FAIL",
                )
            )
    if args.study:
        for name, bar in STUDY_BARS.items():
            wall = time_study(name, 2)
            rows.append(
                (
                    f"{name} study end to end, 2 workers",
                    wall,
                    float("nan"),
                    f"≤ {bar:g} s",
                    "ok" if wall <= bar else "FAIL",
                )
            )
    print(f"\n{'workload':<66} {'wall s':>8} {'peak MB':>8}  {'bar':<10} result")
    for name, wall, rss, bar, ok in rows:
        print(f"{name:<66} {wall:8.2f} {rss:8.0f}  {bar:<10} {ok}")


if __name__ == "__main__":
    main()
