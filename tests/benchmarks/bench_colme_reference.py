"""Private-ColME dense (all pairs, ideal links) against an independent numpy reference (issue 28).

    python tests/benchmarks/bench_colme_reference.py                 # M = 5000, T = 10⁴
    python tests/benchmarks/bench_colme_reference.py --agents 2000 --t-max 2000 --repeat 3

The reference is a plain numpy implementation of the same protocol written from the paper
(seed 002), not from desim's code: PM-I with Gaussian noise, round robin, non-MoM ("last")
weights, known variances, the z-test at θ_t = 0.05/ln(t+1), Lemma 4's inverse-variance
combination kept per agent by adding each new term and removing the old one, and the MSE at
desim's 60 log-spaced checkpoints. Its random draws are its own, so only its MSE is compared
with desim's (within a few standard errors of the mean over agents); the times are CPU
seconds of one run each, in fresh processes, desim and the reference alternated (`--repeat`:
best of N tries of each). Desim's time includes importing numba and loading its compiled pass
(`desim.models.colme.dense_kernel`) where numba is installed; the cost of that load, and of a
compilation from scratch, is printed first. ``--numpy`` runs desim without the compiled pass.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = str(Path(__file__).resolve().parent)
ROOT = Path(__file__).resolve().parents[2]
CLASS_MEANS = [0.2, 0.4, 0.8]
SIGMA = 0.5
EPSILON, DELTA, THETA = 1.0, 1e-6, 0.05
BAR = 1.3  # desim's CPU time over the reference's


def checkpoints(t_max: int, n: int = 60) -> np.ndarray:
    """About n log-spaced slots in [1, t_max], with 1 and t_max (desim's default)."""
    points = np.unique(np.round(np.logspace(0, np.log10(t_max), n)).astype(np.int64))
    return np.union1d(points[(points >= 1) & (points <= t_max)], [t_max])


def reference(m: int, t_max: int, seed: int) -> tuple[dict[int, float], float]:
    """MSE of Private-ColME (PM-I, Gaussian, RR, last release, known σ²) at the checkpoints,
    and the standard error of the last one (of the mean over agents)."""
    from scipy.special import ndtri

    rng = np.random.default_rng(seed)
    means = np.asarray(CLASS_MEANS)[rng.integers(0, len(CLASS_MEANS), m)]
    half = SIGMA * math.sqrt(3.0)  # uniform data on [μ − L, μ + L], variance σ²
    sigma2 = SIGMA**2
    sigma_dp = math.sqrt(8.0 * half**2 * math.log(1.25 / DELTA) / EPSILON**2)  # Lemma 1
    agents = np.arange(m)
    # state per ordered pair: release count and summed p-sum noise of b → a ([b, a]); the
    # current terms 1/Var[T] and T/Var[T] of b in a's combination ([a, b])
    count = np.zeros(m * m, dtype=np.int32)
    noise = np.zeros(m * m)
    weight = np.zeros(m * m)
    weighted = np.zeros(m * m)
    num, den = np.zeros(m), np.zeros(m)  # Σ_b T/Var[T], Σ_b 1/Var[T]
    sums = np.zeros(m)
    marks, mse = set(checkpoints(t_max).tolist()), {}
    for t in range(1, t_max + 1):
        sums += means + rng.uniform(-half, half, m)
        b = (agents + (t - 1) % (m - 1) + 1) % m  # RR: a queries a + 1, a + 2, … (skips a)
        out = b * m + agents  # b's release to a
        j = count[out] + 1
        count[out] = j
        z = noise[out] + sigma_dp * rng.standard_normal(m)
        noise[out] = z
        release = (sums[b] + z) / t
        var = (sigma2 + sigma_dp**2 * j / t) / t  # (σ_b² t + σ_DP² j)/t²: p-sums 1..j
        zq = ndtri(1.0 - THETA / math.log(t + 1.0) / 2.0)
        keep = np.abs(sums / t - release) < zq * np.sqrt(sigma2 / t + var)
        w = np.where(keep, 1.0 / var, 0.0)
        pair = agents * m + b
        num += w * release - weighted[pair]
        den += w - weight[pair]
        weight[pair], weighted[pair] = w, w * release
        if t in marks:
            own = t / sigma2
            mu = (own * sums / t + num) / (own + den)
            err2 = (mu - means) ** 2
            mse[t] = float(err2.mean())
    return mse, float(err2.std() / math.sqrt(m))


_DESIM = """
import json, sys, time
import desim, desim.kernel.plugins
from desim import fast
from desim.study.scenario import Scenario
(m, t_max, seed, means, sigma, _) = json.loads(sys.argv[1])
desim.kernel.plugins.load_plugins()
data = {"model": "classes", "agents": m, "class_means": means, "sigma": sigma}
s = Scenario(protocol="private-colme", params={}, data=data, t_max=t_max, seed=seed,
             per_agent=True)
cpu = time.process_time()
out = desim.run(s)
cpu = time.process_time() - cpu
err2 = out.agents[out.agents.t == t_max].value.to_numpy()
print(json.dumps({"cpu": cpu, "mse": float(err2.mean()), "se": float(err2.std() / m**0.5),
                  "compiled": fast.compiled()}))
"""

_REFERENCE = """
import json, sys, time
(m, t_max, seed, means, sigma, here) = json.loads(sys.argv[1])
sys.path.insert(0, here)
from bench_colme_reference import reference
cpu = time.process_time()
mse, se = reference(m, t_max, seed)
cpu = time.process_time() - cpu
print(json.dumps({"cpu": cpu, "mse": mse[t_max], "se": se}))
"""


_JIT = """
import json, sys, time
import numpy as np
cpu = time.process_time()
from desim.models.colme.dense_kernel import release_run, take_run
loaded = time.process_time()
m = 3
one = np.ones(m)
take_run(m, m, one, one, one, np.zeros(m * m), np.ones(m * m, bool), np.zeros(m, np.int64), one,
         1.0, one, 1.0, 2.0, np.zeros((2, m)), np.zeros((2, m)), np.zeros(m, np.int64),
         np.zeros(m, bool))
release_run(m, m, np.zeros(m * m, np.int32), np.zeros(m * m), one, one, 1.0, one, one.copy())
print(json.dumps({"import": loaded - cpu, "first": time.process_time() - loaded}))
"""


def child(code: str, m: int, t_max: int, seed: int, env: dict | None = None) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps([m, t_max, seed, CLASS_MEANS, SIGMA, HERE])],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def jit_costs() -> None:
    """Print the CPU cost of importing numba with the compiled passes and their first calls, from
    numba's on-disk cache and compiled from scratch (the cache in a scratch folder)."""
    with tempfile.TemporaryDirectory() as cache:
        for name, env in (("cached", None), ("compiled anew", {"NUMBA_CACHE_DIR": cache})):
            try:
                r = child(_JIT, 0, 0, 0, None if env is None else {**os.environ, **env})
            except subprocess.CalledProcessError:  # numba not installed: no compiled pass
                print("compiled pass: numba not installed (desim runs its numpy path)")
                return
            print(
                f"compiled pass, {name}: import {r['import']:.2f} s, first call "
                f"{r['first']:.2f} s CPU"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=5000)
    parser.add_argument("--t-max", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=1, help="tries of each, alternated")
    parser.add_argument("--numpy", action="store_true", help="desim without its compiled pass")
    args = parser.parse_args()
    m, t_max = args.agents, args.t_max
    env = {**os.environ, "DESIM_COMPILED": "0"} if args.numpy else None
    jit_costs()
    tries: dict[str, list[dict]] = {"desim": [], "reference": []}
    for i in range(args.repeat):
        for name, code in (("desim", _DESIM), ("reference", _REFERENCE)):
            start = time.perf_counter()
            r = child(code, m, t_max, 1 + i, env if name == "desim" else None)
            r["wall"] = time.perf_counter() - start
            tries[name].append(r)
            print(name, f"cpu {r['cpu']:.2f} s", flush=True, file=sys.stderr)
    best = {name: min(runs, key=lambda r: r["cpu"]) for name, runs in tries.items()}
    ratio = best["desim"]["cpu"] / best["reference"]["cpu"]
    path = "compiled" if best["desim"]["compiled"] else "numpy"
    print(f"\nPrivate-ColME dense M={m} T={t_max}, best of {args.repeat} (CPU s; {path} path)")
    print(f"{'desim':>10} {'reference':>10} {'ratio':>6}  bar")
    pairs = zip(tries["desim"], tries["reference"], strict=True)
    print("tries, alternated: " + ", ".join(f"{d['cpu']:.2f}/{r['cpu']:.2f}" for d, r in pairs))
    verdict = "ok" if ratio <= BAR else "FAIL"
    print(
        f"{best['desim']['cpu']:10.2f} {best['reference']['cpu']:10.2f} {ratio:6.2f}  "
        f"≤ {BAR} {verdict}"
    )
    # MSE at t_max over the tries (independent seeds: classes and data drawn anew, which moves
    # a run's MSE far more than its standard error over agents): the means of the two agree
    # within 4 standard errors of the difference, judged from 3 tries on
    for name, runs in tries.items():
        values = ", ".join(f"{r['mse']:.3e}" for r in runs)
        print(f"MSE at t = {t_max}, {name}: {values}")
    if args.repeat >= 3:
        d, r = (np.array([x["mse"] for x in tries[k]]) for k in ("desim", "reference"))
        se = math.sqrt(d.var(ddof=1) / len(d) + r.var(ddof=1) / len(r))
        gap = d.mean() - r.mean()
        print(f"MSE gap {gap:.2e} ± {se:.1e}: " + ("agree" if abs(gap) <= 4 * se else "DIFFER"))


if __name__ == "__main__":
    main()
