"""Private-ColME's forgetting on a graph that changes during a run (`desim.models.colme.rewire`,
`ReleaseWindows.follow`): a kept link keeps the releases a holds on it, a new link starts with
an empty window, a dropped link's are discarded. So a change that moves no link gives the
static bytes, a window after a change is the hand count, W ≥ t_max is T over every release,
and the releases, hence the ledger, are those without ``forget``."""

from __future__ import annotations

import dp_accounting  # noqa: F401  (the privacy metric's; imported once here, not in a test)
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.study.cli import main
from desim.study.scenario import Scenario, resolve, run
from desim.topologies.files import build_graph

load_plugins()

SMALL = {"model": "classes", "agents": 10, "class_means": [0.2, 0.8], "sigma": 0.5}
RING = {"model": "regular", "degree": 4}
LATENCY = {"links": "ideal", "latency": {"model": "exponential", "mean": 2.0}}
G1 = [(0, 1), (1, 2), (2, 3)]  # the path 0–1–2–3
G2 = [(0, 2), (1, 2), (2, 3)]  # from slot 10: 0–1 dropped, 0–2 new, 1–2 and 2–3 kept
SIGMA = 0.5


def _scenario(params: dict, topology: dict, t_max: int = 120, **kw) -> Scenario:
    return Scenario(
        protocol="private-colme",
        params={"peers": "topology", **params},
        data=kw.pop("data", SMALL),
        t_max=t_max,
        checkpoints=kw.pop("checkpoints", 12),
        topology=topology,
        per_agent=True,
        metrics=("privacy",),
        **kw,
    )


def _path_files(folder) -> dict:
    """The path G1, G2 from slot 10 (a sequence of two graph files in `folder`)."""
    for name, edges in (("g1.edges", G1), ("g2.edges", G2)):
        (folder / name).write_text("".join(f"{u} {v}\n" for u, v in edges))
    return {"model": "file", "path": "g1.edges", "sequence": [{"at": 10, "file": "g2.edges"}]}


def _same(one, other) -> None:
    pd.testing.assert_frame_equal(one.metrics, other.metrics, check_exact=True)
    pd.testing.assert_frame_equal(one.agents, other.agents, check_exact=True)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
@pytest.mark.parametrize("schedule", ["rr", "rrr"])
def test_a_change_that_moves_no_link_gives_the_static_bytes_with_forget(tmp_path, forget, schedule):
    """Rewiring that moves nothing (round(q·|E|) = 0) and a sequence of the same graph file
    (every pair carried to itself): the windows of the static graph, bit for bit."""
    from desim.topologies.generators import RandomRegular

    params = {"forget": forget, "schedule": schedule}
    static = run(_scenario(params, RING))
    tiny = run(_scenario(params, {**RING, "rewire": {"every": 10, "fraction": 1e-9}}))
    _same(static, tiny)
    g = RandomRegular(degree=4).make(10, np.random.default_rng(3))
    u, v = g.links()
    (tmp_path / "g.edges").write_text("".join(f"{a} {b}\n" for a, b in zip(u, v, strict=True)))
    file = {"model": "file", "path": "g.edges"}
    seq = {**file, "sequence": [{"at": 30, "file": "g.edges"}, {"at": 77, "file": "g.edges"}]}
    _same(
        run(_scenario(params, file, folder=str(tmp_path))),
        run(_scenario(params, seq, folder=str(tmp_path))),
    )


def _simulate(s: Scenario):
    """Run `s` as `run` does; returns the protocol after the run and every slot's samples
    (row t − 1: slot t)."""
    r, streams = resolve(s), Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    data = r.data_params.make(streams.get("population"))
    data.public["graph"] = build_graph(r.topology, data, streams.get("topology"))
    graphs = r.dynamics.schedule(data.public["graph"], s.t_max, None, s.folder)
    drawn, draw = [], data.sample

    def sample(rng, n):
        drawn.append(draw(rng, n))
        return drawn[-1]

    data.sample = sample
    proto = r.protocol_cls(r.protocol_params)
    Simulation(proto, data, s.t_max, streams, graphs=graphs).run()
    return proto, np.concatenate(drawn)


@pytest.mark.parametrize("forget", [{"window": 4}, {"reset": 9}])
def test_a_window_after_a_change_is_the_hand_count(tmp_path, forget):
    """No noise, one class, until slot 12. Agent 0's only neighbour from slot 10 is 2 over
    the new link 0–2, asked every slot: releases at 10, 11, 12. W = 4: the first has only the
    empty prefix (10 − 0 > 4), so the base is release 1 (slot 10); reset at τ = 9: the first
    release at or after slot τ − 1 is release 1 too. T^W_{2→0} is the mean of x_2 over slots
    11–12 (n = 2, Var = σ²/2). Agent 3's only neighbour is 2 over the kept link 2–3, asked
    every slot: its base is the release of slot 8, made before the change (W = 4: 12 − 8 ≤ 4;
    τ − 1 = 8), so T^W_{2→3} is the mean of x_2 over 9–12 (n = 4). Each agent's own mean is
    over its samples 9–12, weight 4/σ²: Lemma 4 gives (4·x̄_a + n·T^W)/(4 + n)."""
    topology = _path_files(tmp_path)
    data = {"model": "classes", "agents": 4, "class_means": [0.5, 0.5], "sigma": SIGMA}
    params = {"forget": forget, "noise": "none", "mechanism": "pm1"}
    s = _scenario(params, topology, 12, data=data, seed=4, folder=str(tmp_path))
    proto, x = _simulate(s)
    nb = proto.graph
    edge = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(nb.src, nb.dst, strict=True))}
    new, kept = edge[(0, 2)], edge[(3, 2)]
    assert (0, 1) not in edge and proto.included[[new, kept]].all()
    mean = x[8:12].mean(axis=0)  # slots 9–12
    t_new, t_kept = x[10:12, 2].mean(), mean[2]
    assert proto.forget.value[[new, kept]] == pytest.approx([t_new, t_kept], rel=1e-12)
    assert proto.forget.var[[new, kept]] == pytest.approx([SIGMA**2 / 2, SIGMA**2 / 4])
    est = proto.estimates()
    want = [(4 * mean[0] + 2 * t_new) / 6, (4 * mean[3] + 4 * t_kept) / 8]
    assert est[[0, 3]] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("network", [{"links": "ideal"}, LATENCY])
def test_a_window_longer_than_the_run_is_t_over_every_release_on_a_changing_graph(network):
    """W ≥ t_max: every base is the empty prefix (a new link's too), so T^W = R_j and
    Var[T^W] = Var[T] of ``last`` weights, over late links too: the MSE agrees to rounding."""
    topology = {**RING, "rewire": {"every": 15, "fraction": 0.3}}
    plain = run(_scenario({}, topology, network=network), streams=Streams(1, 0, 5, 7))
    forget = {"forget": {"window": 120}}
    window = run(_scenario(forget, topology, network=network), streams=Streams(1, 0, 5, 7))
    a, b = plain.metrics, window.metrics
    assert (a.metric == "mse").any()
    np.testing.assert_allclose(b.value.to_numpy(), a.value.to_numpy(), rtol=1e-9)


@pytest.mark.parametrize("forget", [{"window": 20}, {"reset": 30}])
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_the_ledger_with_forget_is_the_ledger_without_on_a_changing_graph(forget, mechanism):
    """Forgetting is post-processing of the releases held: the releases made over every link
    incarnation, hence every ε of the ledger, are those without ``forget``."""
    topology = {**RING, "rewire": {"every": 7, "fraction": 0.4}}
    params = {"mechanism": mechanism}
    plain = run(_scenario(params, topology))
    forgets = run(_scenario({**params, "forget": forget}, topology))
    ledger = ~plain.metrics.metric.isin(["mse", "accuracy"])
    a, b = plain.metrics[ledger], forgets.metrics[ledger.to_numpy()]
    assert a.metric.str.startswith("eps").any()
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    eps = [c for c in plain.agents.columns if c.startswith("eps")]
    pd.testing.assert_frame_equal(plain.agents[eps], forgets.agents[eps])


def test_forget_on_a_changing_graph_is_accepted(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(
        '[study]\ntitle = "x"\nreplicates = 1\nt_max = 30\n\n[data]\nmodel = "classes"\n'
        'agents = 12\n\n[topology]\nmodel = "regular"\ndegree = 4\n'
        'rewire = {every = 10, fraction = 0.2}\n\n[[scenario]]\nname = "P"\n'
        'protocol = "private-colme"\npeers = "topology"\nforget = {window = 9}\n'
    )
    assert main(["validate", str(folder)]) == 0


@given(
    forget=st.sampled_from([{"window": 6}, {"window": 15}, {"reset": 12}]),
    mechanism=st.sampled_from(["pm1", "pm2"]),
    every=st.integers(2, 9),
    fraction=st.floats(0.1, 1.0),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=4, deadline=None)
def test_forget_follows_random_rewiring(forget, mechanism, every, fraction, seed):
    """Rewiring (links dropped and made again): over ideal links the ledger is the one without
    ``forget``; over Bernoulli links with delays (lost, late and stale releases, messages of
    links gone) every recorded value is finite."""

    def scenario(params: dict, network: dict) -> Scenario:
        return Scenario(
            protocol="private-colme",
            params={"peers": "topology", "mechanism": mechanism, **params},
            data={"model": "classes", "agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5},
            network=network,
            t_max=40,
            seed=seed,
            checkpoints=8,
            topology={
                "model": "regular",
                "degree": 3,
                "rewire": {"every": every, "fraction": fraction},
            },
            metrics=("privacy",),
        )

    ideal = {"links": "ideal"}
    plain, forgets = run(scenario({}, ideal)).metrics, run(scenario({"forget": forget}, ideal))
    ledger = plain.metric.str.startswith("eps").to_numpy()
    assert ledger.any()
    pd.testing.assert_frame_equal(
        plain[ledger].reset_index(drop=True), forgets.metrics[ledger].reset_index(drop=True)
    )
    lossy = {"links": "bernoulli", "p_link": 0.7, "latency": {"model": "exponential"}}
    assert np.isfinite(run(scenario({"forget": forget}, lossy)).metrics.value.to_numpy()).all()
