"""Benchmark of the performance bars for C-ColME and B-ColME (run on demand, not by pytest).

    python tests/benchmarks/bench_ccolme.py            # the bar: M = 10⁴, r = 10, T = 2000
    python tests/benchmarks/bench_ccolme.py --study    # also the full ccolme-scale study
    python tests/benchmarks/bench_ccolme.py --million  # also M = 10⁶ (issue 28; many minutes)
    python tests/benchmarks/bench_ccolme.py --million --only-million --t-max 200  # 10⁶ only, short
    python tests/benchmarks/bench_ccolme.py --rewire 3  # static against rewired graph, alternated

Each workload runs in a fresh process, so its peak memory (max RSS) is its own; the graph and
the data are part of the timed run (as in a study). Wall time depends on what else the machine
runs, so the table also gives the process's CPU time. From 2^19 directed edges C-ColME takes its
compiled passes when numba is installed (`desim.models.ccolme.compiled`); their loading from
numba's disk cache (or their first compilation) is part of the timed run. `--numpy` sets
DESIM_COMPILED=0 for the runs, to time the numpy path.
"""

from __future__ import annotations

import argparse
import os

from harness import rewire_rows, time_scenario, time_study

SCALE = {
    "model": "classes",
    "agents": 10_000,
    "class_means": [0.0, 1.0],
    "sigma": 2.0,
    "distribution": "gaussian",
}
FIG1 = {"model": "classes", "agents": 200, "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}
BAR = 10.0  # seconds per replicate (the authors' C++ simulator: 29 s on the same machine)
#: B-ColME: a fifth of the authors' C++ (153 s per run of B-ColME with its oracle, n = 10⁴)
BAR_B = 153.0 / 5

#: name → (protocol, parameters, data, degree, t_max, bar in seconds or None)
WORKLOADS = {
    "C-ColME M=1e4 r=10 T=2000": ("c-colme", {}, SCALE, 10, 2000, BAR),
    "C-ColME oracle M=1e4 r=10 T=2000": ("c-colme", {"rule": "oracle"}, SCALE, 10, 2000, BAR),
    "Private-C-ColME ε=5 M=1e4 r=10 T=2000": (
        "private-c-colme",
        {"epsilon": 5.0},
        SCALE,
        10,
        2000,
        BAR,
    ),
    "B-ColME M=1e4 r=10 T=2000": ("b-colme", {}, SCALE, 10, 2000, BAR_B),
    "B-ColME oracle M=1e4 r=10 T=2000": ("b-colme", {"rule": "oracle"}, SCALE, 10, 2000, BAR_B),
    "Private-C-ColME ε=2 M=200 r=10 T=3e4 (fig1 run)": (
        "private-c-colme",
        {"epsilon": 2.0},
        FIG1,
        10,
        30_000,
        None,
    ),
}


#: C-ColME at 10⁶ agents (issue 28), judged by CPU time and peak memory: a run of 10⁷
#: directed edges takes minutes, so wall time would measure the machine's load.
MILLION = {"C-ColME M=1e6 r=10 T=2000": ("c-colme", {}, {**SCALE, "agents": 1_000_000}, 10, 2000)}
BAR_MILLION = (180.0, 4096.0)  # CPU seconds, MB

#: C-ColME and Private-C-ColME on a changing graph (issue 29): the bar's workload, static against
#: 10 % of the links rewired before every 100th slot (`harness.rewire_rows`).
_REWIRED = {"data": SCALE, "t_max": 2000, "metrics": ["accuracy", "links"]}
REWIRE = {
    "C-ColME M=1e4 r=10 T=2000": {"protocol": "c-colme", "params": {}, **_REWIRED},
    "Private-C-ColME ε=5 M=1e4 r=10 T=2000": {
        "protocol": "private-c-colme",
        "params": {"epsilon": 5.0},
        **_REWIRED,
    },
}


def time_million(t_max: int | None = None) -> list[tuple]:
    """The 10⁶ rows: (name, wall, cpu, MB, bar, result), judged by CPU time and memory; with
    `t_max`, shorter runs (judged by nothing: the bar is for T = 2000)."""
    rows = []
    cpu_bar, mb_bar = BAR_MILLION
    for name, (protocol, params, data, degree, full) in MILLION.items():
        t_max = full if t_max is None else t_max
        r = time_scenario(
            protocol=protocol,
            params=params,
            data=data,
            t_max=t_max,
            seed=1,
            topology={"model": "regular", "degree": degree},
            metrics=["accuracy", "links"],
        )
        ok = "ok" if r["cpu"] <= cpu_bar and r["rss_mb"] <= mb_bar else "FAIL"
        bar = f"≤ {cpu_bar:g} s cpu, ≤ {mb_bar / 1024:g} GB"
        if t_max != full:
            name, bar, ok = name.replace(f"T={full}", f"T={t_max}"), "—", "—"
        rows.append((name, r["wall"], r["cpu"], r["rss_mb"], bar, ok))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", action="store_true", help="also time the ccolme-scale study")
    parser.add_argument("--million", action="store_true", help="also C-ColME at M = 10⁶")
    parser.add_argument("--only-million", action="store_true", help="with --million: only it")
    parser.add_argument("--t-max", type=int, help="slots of the M = 10⁶ run (default: 2000)")
    parser.add_argument("--numpy", action="store_true", help="no compiled passes (numpy only)")
    parser.add_argument(
        "--rewire", type=int, metavar="N", help="only static against rewired, N runs of each"
    )
    args = parser.parse_args()
    if args.numpy:
        os.environ["DESIM_COMPILED"] = "0"  # the runs' fresh processes inherit it
    rows = []
    if args.rewire:
        for label, scenario in REWIRE.items():
            rows += rewire_rows(label, scenario, args.rewire)
        _print(rows)
        return
    workloads = {} if args.million and args.only_million else WORKLOADS
    for name, (protocol, params, data, degree, t_max, bar) in workloads.items():
        r = time_scenario(
            protocol=protocol,
            params=params,
            data=data,
            t_max=t_max,
            seed=1,
            topology={"model": "regular", "degree": degree},
            metrics=["accuracy", "links"],
        )
        ok = "—" if bar is None else ("ok" if r["wall"] <= bar else "FAIL")
        rows.append(
            (name, r["wall"], r["cpu"], r["rss_mb"], "—" if bar is None else f"≤ {bar:g} s", ok)
        )
    if args.million:
        rows += time_million(args.t_max)
    if args.study:
        wall = time_study("ccolme-scale", 2)
        rows.append(
            (
                "ccolme-scale study (7 scenarios × 20 runs), 2 workers",
                wall,
                float("nan"),
                float("nan"),
                "—",
                "—",
            )
        )
    _print(rows)


def _print(rows: list[tuple]) -> None:
    """The rows as a table: workload, wall and CPU seconds, peak MB, bar, result."""
    print(f"\n{'workload':<56} {'wall s':>8} {'cpu s':>8} {'peak MB':>8}  {'bar':<9} result")
    for name, wall, cpu, rss, bar, ok in rows:
        print(f"{name:<56} {wall:8.2f} {cpu:8.2f} {rss:8.0f}  {bar:<9} {ok}")


if __name__ == "__main__":
    main()
