"""Plug-ins: a third-party package registers a protocol, a curve and a metric through the
``desim.plugins`` entry point (the example under ``tests/plugin_example``, installed for real),
and registering a name again replaces it with a warning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from desim.kernel.registry import Registry, RegistryWarning

EXAMPLE = Path(__file__).resolve().parents[1] / "plugin_example"

CHECK = textwrap.dedent("""
    import json, numpy as np, desim
    from desim.kernel.plugins import load_plugins
    from desim.kernel.registry import CURVES
    assert load_plugins()["peer-average"] == "desim_peer_average"
    M, R, T, SIGMA = 200, 4, 400, 0.5
    data = {"model": "classes", "agents": M, "class_means": [0.3], "sigma": SIGMA,
            "distribution": "gaussian"}
    mse, gap = [], []
    for r in range(R):
        out = desim.run(desim.Scenario("peer-average", {}, data=data, t_max=T, seed=5,
                                       replicate=r, checkpoints=4, metrics=("ring-gap",)))
        last = out.metrics[out.metrics.t == T].set_index("metric")["value"]
        mse.append(last["mse"]); gap.append(last["ring_gap"])
    params = type("Data", (), {"sigma": SIGMA})
    curve, _ = CURVES.get("peer-average")().curve(np.array([float(T)]), params)
    print(json.dumps({"mse": float(np.mean(mse)), "curve": float(curve[0]),
                      "gap": float(np.mean(gap))}))
""")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example plug-in, built and installed into a folder of its own."""
    source = tmp_path_factory.mktemp("source") / "plugin"  # building leaves files behind
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    )
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return target


def _run(args: list[str], site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site), "MPLBACKEND": "Agg"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


@pytest.mark.slow
def test_desim_list_shows_the_plugin_components(installed, tmp_path):
    done = _run(["-m", "desim.study.cli", "list"], installed, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "desim_peer_average (peer-average)" in done.stdout.splitlines()[0]
    for name in ("peer-average", "ring-gap"):
        assert f"  {name}  " in done.stdout
    assert "[desim_peer_average]" in done.stdout


@pytest.mark.slow
def test_the_plugin_protocol_runs_and_matches_its_curve(installed, tmp_path):
    done = _run(["-c", CHECK], installed, tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.splitlines()[-1])
    v = 0.5**2 / (2 * 400)
    assert got["curve"] == pytest.approx(v, rel=1e-12)
    # e_a = (e'_a + e'_{a−1})/2 with i.i.d. Gaussian e': Var e_a = v, Corr(e_a, e_{a+1}) = 1/2,
    # so Var of the agent-and-replicate mean of e_a² is (2v² + 2·v²/2)/(M R) = 3v²/(M R).
    se = v * (3 / (200 * 4)) ** 0.5
    assert abs(got["mse"] - v) < 4 * se
    assert got["gap"] > 0


def test_registering_a_name_again_replaces_it_with_a_warning():
    registry: Registry = Registry("thing")

    @registry.register("x")
    class First:
        pass

    with pytest.warns(RegistryWarning, match="registered again: .*Second replaces .*First"):

        @registry.register("x")
        class Second:
            pass

    assert registry.get("x") is Second
    registry.register("x")(Second)  # the same object again: nothing to say
