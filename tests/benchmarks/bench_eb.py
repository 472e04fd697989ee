"""Benchmarks of the empirical-Bayes family (run on demand).

    python tests/benchmarks/bench_eb.py
    python tests/benchmarks/bench_eb.py --repeat 3   # best of 3 tries, workloads alternated
    python tests/benchmarks/bench_eb.py --forget 5   # only the forgetting rows, 5 alternations

One-shot workloads (m = 10⁴ agents, one round at t_max = n) for each protocol, bar ≤ 2 s, and
streaming workloads (M = 200, T = 3·10⁴, a round every slot, PM-I uploads), bar ≤ 4 s. Then
exact-time what-ifs (M = 200, T = 10⁴, a round every slot with a deadline of 10 slots, over
exponential latency of mean 5 slots and Markov link outages, exact delivery times: windows),
each next to the same run on ideal links and judged by issue 15's bar, ≤ 3× synchronous. Each
runs in a fresh process (imports not timed) and reports wall time, CPU time (the bars apply to
CPU time: the development machine is shared) and peak memory; the table printed at the end is
what goes into closing notes.
"""

from __future__ import annotations

import argparse

from harness import best_of, forget_rows, print_forget, time_scenario

GAUSS = {
    "model": "hierarchical-gaussian",
    "agents": 10_000,
    "mean": 0.5,
    "sigma_theta": 0.1,
    "sigma_x": 0.5,
}
BERN = {"model": "bernoulli-prior", "agents": 10_000, "prior": "beta", "alpha": 3.5, "beta": 3.5}
CLASSES_10K = {"model": "classes", "agents": 10_000}
CLASSES = {"model": "classes", "agents": 200}

#: (label, protocol, params, data, t_max, bar in CPU seconds)
WORKLOADS = (
    (
        "one-shot eb-gaussian, Thm 2 Gaussian LDP, m=10⁴, n=15",
        "eb-gaussian",
        {"mechanism": "gaussian", "sigma_theta": 0.1, "epsilon": 0.5, "delta": 1e-5},
        GAUSS,
        15,
        2.0,
    ),
    ("one-shot eb-gaussian, σ_θ by moments, m=10⁴, n=15", "eb-gaussian", {}, GAUSS, 15, 2.0),
    ("one-shot eb-bernoulli, consistent LOO, m=10⁴, n=14", "eb-bernoulli", {}, BERN, 14, 2.0),
    (
        "one-shot eb-bernoulli, eq. (7) uploads, m=10⁴, n=14",
        "eb-bernoulli",
        {"mechanism": "rr", "epsilon": 1.0},
        BERN,
        14,
        2.0,
    ),
    ("one-shot eb-mixture, k-means k=3, m=10⁴, n=100", "eb-mixture", {}, CLASSES_10K, 100, 2.0),
    (
        "streaming eb-gaussian PM-I, every slot, M=200, T=3·10⁴",
        "eb-gaussian",
        {"mechanism": "pm1", "round": 1},
        CLASSES,
        30_000,
        4.0,
    ),
    (
        "streaming eb-mixture PM-I, every slot (1 Lloyd step), M=200, T=3·10⁴",
        "eb-mixture",
        {"mechanism": "pm1", "round": 1, "lloyd": 1},
        CLASSES,
        30_000,
        4.0,
    ),
    (
        "streaming eb-mixture PM-I, every 100 slots, M=200, T=3·10⁴",
        "eb-mixture",
        {"mechanism": "pm1", "round": 100},
        CLASSES,
        30_000,
        4.0,
    ),
)

#: Exact delivery times: the network of issue 15's what-ifs (`bench_speed.py`'s EXACT).
EXACT = {
    "links": "ideal",
    "latency": {"model": "exponential", "mean": 5.0},
    "outages": {"model": "markov", "mean_up": 50.0, "mean_down": 10.0},
}
#: (label, protocol, params, data, t_max): each timed on ideal links, then over EXACT. The
#: deadline is twice the mean latency, so most uploads make their round (with 0, none would).
EXACT_WORKLOADS = (
    (
        "eb-gaussian PM-I, every slot, deadline 10, M=200, T=10⁴",
        "eb-gaussian",
        {"mechanism": "pm1", "round": 1, "deadline": 10.0},
        CLASSES,
        10_000,
    ),
    (
        "eb-mixture PM-I, every slot (1 Lloyd step), deadline 10, M=200, T=10⁴",
        "eb-mixture",
        {"mechanism": "pm1", "round": 1, "lloyd": 1, "deadline": 10.0},
        CLASSES,
        10_000,
    ),
)
#: Issue 15's bar: an exact-time what-if costs at most this many times its synchronous run.
EXACT_BAR = 3.0
#: Forgetting (issue 29): eb-gaussian with PM-I uploads every slot (M = 200, a fifth of the
#: agents switch class at 2000, T = 10⁴, 100 checkpoints) without a ``forget`` table and with
#: each of `harness.FORGET_RULES`: per-slot CPU ≤ 1.2× without.
FORGET = {
    "protocol": "eb-gaussian",
    "params": {"mechanism": "pm1", "round": 1},
    "data": {**CLASSES, "drift": {"model": "switch", "fraction": 0.2, "at": 2000}},
    "t_max": 10_000,
    "checkpoints": 100,
    "seed": 1,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="tries of each workload, in rounds over all of them (best kept)",
    )
    parser.add_argument(
        "--forget", type=int, metavar="N", help="only the forgetting rows, N alternations"
    )
    args = parser.parse_args()
    if args.forget:
        title = "eb-gaussian PM-I every slot, M=200 T=1e4"
        print_forget(title, forget_rows(FORGET, args.forget), args.forget)
        return
    # every timed run: one-shot and streaming workloads, then each what-if synchronous and exact
    runs = {
        label: dict(protocol=protocol, params=params, data=data, t_max=t_max, seed=1)
        for label, protocol, params, data, t_max, _bar in WORKLOADS
    }
    for label, protocol, params, data, t_max in EXACT_WORKLOADS:
        runs[(label, "sync")] = dict(
            protocol=protocol, params=params, data=data, t_max=t_max, seed=1
        )
        runs[(label, "exact")] = {**runs[(label, "sync")], "network": EXACT}
    tries: dict = {key: [] for key in runs}
    for _ in range(args.repeat):
        for key, scenario in runs.items():
            tries[key].append(time_scenario(**scenario))
    best = {key: best_of(t) for key, t in tries.items()}
    rows = []
    for label, _protocol, _params, _data, _t_max, bar in WORKLOADS:
        r = best[label]
        ok = "ok" if r["cpu"] <= bar else "FAIL"
        rows.append((label, r["wall"], r["cpu"], r["rss_mb"], f"≤ {bar:g} s", ok))
    for label, *_ in EXACT_WORKLOADS:
        sync, exact = best[(label, "sync")], best[(label, "exact")]
        ratio = exact["cpu"] / sync["cpu"]
        rows.append((f"{label}, sync", sync["wall"], sync["cpu"], sync["rss_mb"], "", ""))
        rows.append(
            (
                f"{label}, exact times",
                exact["wall"],
                exact["cpu"],
                exact["rss_mb"],
                f"{ratio:.2f}× sync (≤ {EXACT_BAR:g}×)",
                "ok" if ratio <= EXACT_BAR else "FAIL",
            )
        )
    if args.repeat > 1:
        print(f"\nbest of {args.repeat} tries per workload")
    print(f"\n{'workload':<84} {'wall s':>7} {'cpu s':>7} {'peak MB':>8}  {'bar':<20} result")
    for label, wall, cpu, rss, bar, ok in rows:
        print(f"{label:<84} {wall:7.2f} {cpu:7.2f} {rss:8.0f}  {bar:<20} {ok}")


if __name__ == "__main__":
    main()
