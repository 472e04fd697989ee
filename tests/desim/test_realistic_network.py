"""Realistic links: outages and churn on the network, the synchronous limit, deadline
probabilities, study files."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from _toy import TOY_STUDY, write_study
from test_latency import N, Sender, SenderParams, Zeros

import desim
from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.network_models.availability import BernoulliAvailability, Markov, Trace, link_entity
from desim.network_models.distributions import Constant, Exponential, Uniform
from desim.network_models.latency import IidLatency
from desim.network_models.links import BernoulliLinks, FixedLatency
from desim.network_models.realistic import RealisticLinks
from desim.network_models.stragglers import Stragglers
from desim.study.scenario import Scenario, resolve
from desim.study.spec import load_study


def run(links, until=6, t_max=10):
    proto = Sender(SenderParams(until))
    sim = Simulation(
        proto, Zeros(N), t_max, Streams(5, 0, 1, 2), links=links, checkpoints=np.array([t_max])
    )
    out = sim.run()
    return proto, sim, out


def trace(tmp_path, text, name="trace.csv"):
    path = tmp_path / name
    path.write_text(text)
    return Trace(file=str(path))


def test_a_down_node_neither_sends_nor_receives_and_drops_are_counted(tmp_path):
    # node 1 is down in [2.5, 4.5); latency 1.5 carries slot-1 sends to 2.5 (delivery drop)
    nodes = trace(tmp_path, "node,start,end,state\n1,2.5,4.5,down\n")
    links = RealisticLinks(IdealLinks(), latency=IidLatency(Constant(1.5)), nodes=nodes)
    proto, sim, out = run(links)
    got = proto.deliveries()
    for t in range(1, 7):
        arrive = t + 1.5
        for kind in (0, 1):
            for i in range(N):
                dst = (i + 1 + kind) % N
                down_at_send = 2.5 <= t < 4.5 and 1 in (i, dst)
                down_at_arrival = 2.5 <= arrive < 4.5 and dst == 1
                delivered = (arrive, i, dst, float(t), kind) in got
                assert delivered == (not down_at_send and not down_at_arrival), (t, i, dst)
    # per kind, one message to node 1 sent in slots 1 and 2 arrives while it is down (2.5,
    # 3.5), and in slots 3 and 4 the one to and the one from node 1 cannot be sent
    assert sim.network.dropped.tolist() == [1 + 1 + 2 * 2, 1 + 1 + 2 * 2]
    last = out.metrics.set_index("metric")["value"]
    assert last["dropped_narrow"] == 6 and last["messages_narrow"] == 6 * N


def test_a_link_outage_drops_both_directions_and_server_links_too(tmp_path):
    outages = trace(tmp_path, "src,dst,start,end,state\n2,1,3,5,down\n")
    proto, sim, _ = run(RealisticLinks(IdealLinks(), outages=outages))
    got = {(t, s, d) for t, s, d, _, _ in proto.deliveries()}
    for t in range(1, 7):
        down = 3 <= t < 5
        assert ((t, 1, 2) in got) == (not down)  # narrow 1 → 2
        assert ((t, 4, 1) in got) and ((t, 0, 2) in got)  # other links unaffected
    assert sim.network.dropped.tolist() == [2, 0]  # only 1 → 2 (narrow) uses the link
    # with 3 agents the server is address 3: its link to node 0 is down both ways
    server = trace(tmp_path, "src,dst,start,end,state\n0,3,0,10,down\n", "server.csv")
    bound = RealisticLinks(IdealLinks(), outages=server).bind(3, {}, Streams(0, 0, 0, 0))
    up = bound.available(None, 1.0, np.array([0, 3, 1, 1, 0]), np.array([3, 0, 1, 3, 0]))
    assert up.tolist() == [False, False, True, True, True]  # a node always reaches itself


def test_a_message_goes_through_exactly_when_its_link_and_both_nodes_are_up():
    outages, nodes = Markov(mean_up=6.0, mean_down=2.0), BernoulliAvailability(p=0.8)
    base = build(BernoulliLinks, {"p_link": 0.9}, "network")
    proto, sim, _ = run(RealisticLinks(base, outages=outages, nodes=nodes), until=60, t_max=60)
    # the same realisations, replayed from the run's streams (counter-based: order-free)
    streams = Streams(5, 0, 1, 2)
    link_up = outages.bind(N + 1, "link", streams.get("outages"))
    node_up = nodes.bind(N + 1, "node", streams.get("nodes"))
    tau = base.bind(N, {}, streams)
    got = {(t, s, d) for t, s, d, _, _ in proto.deliveries()}
    src = np.concatenate([np.arange(N), np.arange(N)])
    dst = np.concatenate([(np.arange(N) + 1) % N, (np.arange(N) + 2) % N])
    expected = set()
    for t in range(1, 61):
        up = (
            tau.realise(streams.get("links"), t, src, dst)
            & link_up.up(t, link_entity(src, dst, N + 1))
            & node_up.up(t, src)
            & node_up.up(t, dst)
        )
        expected |= {(float(t), int(s), int(d)) for s, d in zip(src[up], dst[up], strict=True)}
    assert got == expected
    assert sim.network.dropped.sum() == 2 * 60 * N - len(expected) > 0


def test_bound_links_take_one_time_per_message_as_they_take_one_time():
    """With `per_message` the network asks once per window: availability, straggler delays
    and receivability at each message's own time, the same answers as one time at a time."""
    base = build(BernoulliLinks, {"p_link": 0.7, "p_server": 0.5}, "network")
    model = RealisticLinks(
        base,
        latency=IidLatency(Exponential(mean=2.0)),
        outages=Markov(mean_up=4.0, mean_down=2.0),
        nodes=desim.network_models.availability.availability(
            {
                "model": "churn",
                "session": {"model": "exponential", "mean": 3.0},
                "offline": {"model": "exponential", "mean": 1.0},
            },
            "nodes",
        ),
        stragglers=Stragglers(
            fraction=0.5, slowdown=3.0, delay={"model": "exponential", "mean": 1.0}
        ),
    )
    rng = np.random.default_rng(8)
    times = np.sort(rng.uniform(0, 40, 300))
    src, dst = rng.integers(0, N + 1, 300), rng.integers(0, N + 1, 300)
    many, one = (model.bind(N, {}, Streams(2, 0, 1, 2)) for _ in range(2))
    assert many.per_message and not many.per_slot
    key_a, key_b = np.random.default_rng(1), np.random.default_rng(1)  # (the base's key)
    first = [
        np.atleast_1d(one.available(key_b, float(t), src[i : i + 1], dst[i : i + 1]))[0]
        for i, t in enumerate(times)
    ]
    assert np.array_equal(many.available(key_a, times, src, dst), first)
    late = [
        np.atleast_1d(one.stragglers.delay(float(t), src[i : i + 1]))[0]
        for i, t in enumerate(times)
    ]
    assert np.array_equal(np.broadcast_to(many.stragglers.delay(times, src), (300,)), late)
    ok = [np.atleast_1d(one.receivable(float(t), dst[i : i + 1]))[0] for i, t in enumerate(times)]
    assert np.array_equal(many.receivable(times, dst), ok)
    # latency draws in message order: one call for all is the calls one by one
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    joint = many.latency(a, times, src, dst, 1)
    split = np.concatenate(
        [
            np.atleast_1d(one.latency(b, float(times[i]), src[i : i + 1], dst[i : i + 1], 1))
            for i in range(300)
        ]
    )
    assert np.array_equal(joint, split)


@pytest.mark.parametrize("law", [Exponential(mean=5.0), Uniform(low=1.0, high=3.0)])
def test_delays_by_message_id_do_not_depend_on_order_or_grouping_and_keep_the_law(law):
    """Named messages (ids) get ppf(counter_uniform(key, id)): the same delay whatever order and
    calls they are asked in, whatever other draws the stream made; their mean and spread
    are the law's within four standard errors (10⁵ draws)."""
    model = RealisticLinks(IdealLinks(), latency=IidLatency(law))
    ids = np.arange(100_000, dtype=np.uint64) * np.uint64(7919)
    src = dst = np.zeros(len(ids), dtype=np.int64)
    a, b = (model.bind(N, {}, Streams(2, 0, 1, 2)) for _ in range(2))
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    joint = a.latency(rng_a, 3.0, src, dst, 1, ids=ids)
    order = np.random.default_rng(0).permutation(len(ids))
    b.latency(rng_b, 0.0, src[:1], dst[:1], 1, ids=ids[:1])  # fixes the key
    rng_b.random(17)  # other draws of the stream change nothing
    parts = [b.latency(rng_b, 9.5, src[p], dst[p], 1, ids=ids[p]) for p in np.array_split(order, 7)]
    assert np.array_equal(np.concatenate(parts), joint[order])
    n = len(joint)
    sd = math.sqrt(_variance(law))
    assert abs(joint.mean() - law.mean) < 4 * sd / math.sqrt(n)
    # the sample variance's standard error, from the fourth central moment of the law
    m4 = 9 * law.mean**4 if isinstance(law, Exponential) else (law.high - law.low) ** 4 / 80
    assert abs(joint.var() - sd**2) < 4 * math.sqrt((m4 - sd**4) / n)
    # and distinct ids are not the same draw: no two of 10⁵ continuous delays coincide
    assert len(np.unique(joint)) == n


def _variance(law) -> float:
    if isinstance(law, Exponential):
        return law.mean**2
    return (law.high - law.low) ** 2 / 12


# ---- the synchronous limit -------------------------------------------------------------------

ZERO = {
    "latency": {"model": "constant", "value": 0.0},
    "outages": {"model": "always"},
    "nodes": {"model": "bernoulli", "p": 1.0},
    "stragglers": {"fraction": 0.0},
}


def _same_metrics(s: Scenario) -> None:
    """s on its base links and on zero-latency, always-up realistic links: the same bytes."""
    real = dataclasses.replace(s, network={**s.network, **ZERO})
    assert type(resolve(real).links) is RealisticLinks
    streams = Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    a = desim.run(s).metrics
    b = desim.study.scenario.run(real, streams).metrics
    if not a.metric.str.startswith("dropped_").any():  # ideal links record no drops
        b = b[~b.metric.str.startswith("dropped_")].reset_index(drop=True)
    assert a.to_csv().encode() == b.to_csv().encode()


def test_zero_latency_always_up_reproduces_private_colme_bit_for_bit():
    _same_metrics(
        Scenario(
            "private-colme",
            {"mechanism": "pm2"},
            {"model": "classes", "agents": 12, "class_means": [0.2, 0.8]},
            t_max=120,
            seed=4,
        )
    )


def test_zero_latency_always_up_reproduces_c_colme_bit_for_bit():
    _same_metrics(
        Scenario(
            "private-c-colme",
            {"epsilon": 2.0},
            {"model": "classes", "agents": 20},
            t_max=80,
            seed=4,
            topology={"model": "regular", "degree": 4},
            metrics=("accuracy", "links"),
        )
    )


def test_zero_latency_always_up_reproduces_pricer_bit_for_bit():
    _same_metrics(
        Scenario(
            "pricer",
            {"strategy": "pricer"},
            {"model": "vectors", "agents": 5, "dimension": 4},
            network={"links": "bernoulli", "good": 2, "p_link": 0.8},
            t_max=30,
            seed=5,
            metrics=("pricer",),
        )
    )


def test_same_seed_same_bytes_on_a_realistic_network():
    net = {
        "links": "bernoulli",
        "p_link": 0.9,
        "slots": 0.5,
        "latency": {"model": "lognormal", "mean": 2.0, "cv": 1.0},
        "outages": {"model": "markov", "mean_up": 10.0, "mean_down": 3.0},
        "nodes": {"model": "churn", "session": {"model": "weibull", "shape": 0.7, "scale": 30.0}},
        "stragglers": {
            "fraction": 0.3,
            "slowdown": 3.0,
            "delay": {"model": "exponential", "mean": 1.0},
        },
    }
    s = Scenario(
        "private-c-colme",
        {"epsilon": 2.0},
        {"model": "classes", "agents": 20},
        t_max=60,
        seed=8,
        network=net,
        topology={"model": "regular", "degree": 4},
    )
    a, b = desim.run(s).metrics, desim.run(s).metrics
    assert a.to_csv().encode() == b.to_csv().encode()
    last = a[a.t == 60].set_index("metric")["value"]
    assert 0 < last["dropped_state"] < last["messages_state"]
    other = desim.run(dataclasses.replace(s, seed=9)).metrics
    assert not a.equals(other)


def test_without_sub_tables_the_base_model_and_streams_are_untouched():
    s = Scenario("local", {}, network={"links": "fixed-latency", "slots": 2.0})
    assert resolve(s).links == FixedLatency(2.0)
    assert s.as_dict()["network"] == {"links": "fixed-latency", "slots": 2.0}


# ---- deadline probabilities ------------------------------------------------------------------


def test_base_models_apply_deadlines_to_their_fixed_delay():
    for links in (FixedLatency(2.0), build(BernoulliLinks, {"p_link": 0.5, "slots": 2.0}, "n")):
        late = links.probabilities(3, within=1.5, server_within=2.0)
        assert np.all(late.P == np.eye(3)) and np.all(late.E == np.eye(3))
        assert late.p.tolist() == links.probabilities(3).p.tolist()
        assert np.array_equal(links.probabilities(3, within=2.0).P, links.probabilities(3).P)
    assert np.all(IdealLinks().probabilities(2, within=0.0, server_within=0.0).P == 1)


def test_realistic_probabilities_multiply_availability_and_on_time_chances():
    base = build(
        BernoulliLinks,
        {"p_server": [0.5, 0.8, 1.0], "p_link": 0.9, "reciprocity": 0.0, "slots": 0.5},
        "network",
    )
    links = RealisticLinks(
        base,
        latency=IidLatency(Exponential(2.0)),
        outages=BernoulliAvailability(p=0.8),
        nodes=Markov(mean_up=3.0, mean_down=1.0),
        stragglers=Stragglers(factors=[1, 3, 1]),
    ).bind(3, {}, Streams(0, 0, 0, 0))
    conn = links.probabilities(3, within=4.0, server_within=6.0)

    def on_time(f, w):  # P(0.5 + (f − 1)·1 + L ≤ w), L exponential of mean 2
        return 1 - math.exp(-(w - 0.5 - (f - 1)) / 2)

    f = [1, 3, 1]
    q = 0.75
    for i in range(3):
        assert conn.p[i] == pytest.approx(
            [0.5, 0.8, 1.0][i] * 0.8 * q * on_time(f[i], 6.0), rel=1e-12
        )
        for j in range(3):
            if i == j:
                assert conn.P[i, j] == conn.E[i, j] == 1
                continue
            assert conn.P[i, j] == pytest.approx(0.9 * 0.8 * q * q * on_time(f[i], 4.0), rel=1e-12)
            assert conn.E[i, j] == pytest.approx(
                0.81 * 0.8 * q * q * on_time(f[i], 4.0) * on_time(f[j], 4.0), rel=1e-12
            )
    # no deadline: availability only; an impossible one: nothing arrives
    free = links.probabilities(3)
    assert free.P[0, 1] == pytest.approx(0.9 * 0.8 * q * q, rel=1e-12)
    assert np.all(links.probabilities(3, within=0.4, server_within=0.4).p == 0)


def test_a_random_straggler_delay_is_integrated_in_the_deadline_probability():
    links = RealisticLinks(
        IdealLinks(),
        stragglers=Stragglers(factors=[1, 3], delay={"model": "uniform", "low": 0.0, "high": 2.0}),
    ).bind(2, {}, Streams(0, 0, 0, 0))
    conn = links.probabilities(2, within=2.0)  # P(2D ≤ 2) = P(D ≤ 1) = 1/2 for node 1
    assert conn.P[0, 1] == 1 and conn.P[1, 0] == pytest.approx(0.5, abs=1 / 4096)
    assert conn.E[0, 1] == pytest.approx(0.5, abs=1 / 4096)
    assert np.all(conn.p == 1)  # no server deadline


def test_an_unbound_realistic_model_refuses_to_answer():
    with pytest.raises(RuntimeError, match="bound"):
        RealisticLinks(IdealLinks()).probabilities(3)


# ---- study files -----------------------------------------------------------------------------

NETWORK = """
[network]
links = "bernoulli"
p_link = 0.9
[network.latency]
model = "exponential"
mean = 2.0
[network.stragglers]
fraction = 0.2
"""


def _study(tmp_path, extra: str):
    return load_study(write_study(tmp_path / "s", TOY_STUDY + NETWORK + extra))


def test_a_study_sweeps_into_network_sub_tables(tmp_path):
    study = _study(
        tmp_path,
        '[grid]\n"network.latency.mean" = [1.0, 4.0]\n"network.stragglers.fraction" = [0.0, 0.5]\n',
    )
    assert study.grid_columns == {
        "network.latency.mean": "mean",
        "network.stragglers.fraction": "fraction",
    }
    assert study.points[3].columns == {"mean": 4.0, "fraction": 0.5}
    nets = [
        r.scenario.network
        for r in study.runs
        if r.scenario.replicate == 0 and r.scenario.name == "Toy A"
    ]
    assert [n["latency"] for n in nets] == [
        {"model": "exponential", "mean": m} for m in (1.0, 1.0, 4.0, 4.0)
    ]
    assert [n["stragglers"]["fraction"] for n in nets] == [0.0, 0.5, 0.0, 0.5]
    assert study.runs[0].run_id == "toy-a_mean-1_fraction-0_r000"
    assert type(resolve(study.runs[0].scenario).links) is RealisticLinks


def test_a_study_can_sweep_whole_sub_tables(tmp_path):
    study = _study(
        tmp_path,
        '[grid]\n"network.outages" = [{model = "bernoulli", p = 0.8}, '
        '{model = "markov", mean_up = 8.0, mean_down = 2.0}]\n',
    )
    assert study.grid_columns == {"network.outages": "outages"}
    assert study.runs[-1].scenario.network["outages"]["model"] == "markov"


def test_a_relative_trace_file_is_found_from_the_study_folder(tmp_path, monkeypatch):
    folder = write_study(
        tmp_path / "s",
        TOY_STUDY + NETWORK + '[network.nodes]\nmodel = "trace"\nfile = "nodes.csv"\n',
    )
    (folder / "nodes.csv").write_text("node,start,end,state\n0,1,3,down\n")
    monkeypatch.chdir(tmp_path)
    study = load_study(folder)
    # the scenario keeps the path relative (its config hash holds no absolute path) and
    # reads it from the study folder, wherever desim runs
    s = study.runs[0].scenario
    assert s.network["nodes"]["file"] == "nodes.csv" and s.folder == str(folder.resolve())
    assert str(folder) not in json.dumps(s.as_dict())
    desim.run(s)


BAD = [
    (
        '[network.latncy]\nmodel = "constant"\n',
        [
            "[network]",
            "unknown sub-table 'latncy'",
            "did you mean 'latency'",
            "latency, outages, nodes, stragglers",
        ],
    ),
    (
        '[network.outages]\nmodel = "markof"\n',
        ["[network.outages]", "unknown availability model 'markof'", "did you mean 'markov'"],
    ),
    (
        '[network.nodes]\nmodel = "churn"\nsession = { model = "weibull", shape = -1 }\n',
        ["[network.nodes]", "session", "shape = -1"],
    ),
    (
        '[network.nodes]\nmodel = "trace"\nfile = "missing.csv"\n',
        ["trace file", "missing.csv", "no such"],
    ),
    (
        '[grid]\n"network.latency.meen" = [1.0]\n',
        ["[grid]", "'network.latency.meen'", "unknown key 'meen'", "did you mean 'mean'"],
    ),
    ('[grid]\n"network.outages.p" = [0.5]\n', ["[grid]", "no [network.outages] table"]),
    ('[grid]\n"network.latncy.mean" = [1.0]\n', ["[grid]", "unknown sub-table 'latncy'"]),
    ('[grid]\n"network.latency.mean.x" = [1.0]\n', ["[grid]", "network.<sub-table>.<key>"]),
    (
        '[grid]\n"network.latency.mean" = [1.0, -1.0]\n',
        ["grid point mean = -1", "[network.latency]", "mean = -1", "> 0"],
    ),
]


@pytest.mark.parametrize("extra,fragments", BAD, ids=[b[1][1] for b in BAD])
def test_bad_network_sub_tables_stop_the_study_in_one_line(tmp_path, extra, fragments):
    with pytest.raises(ConfigError) as info:
        _study(tmp_path, extra)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_uniform_latency_gives_its_cdf_at_the_deadline():
    links = RealisticLinks(IdealLinks(), latency=IidLatency(Uniform(0.0, 4.0)))
    bound = links.bind(2, {}, Streams(0, 0, 0, 0))
    assert bound.probabilities(2, within=1.0).P[0, 1] == pytest.approx(0.25)
    assert bound.probabilities(2, server_within=3.0).p.tolist() == [0.75, 0.75]
