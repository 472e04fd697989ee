"""PriCER's per-node privacy budgets (``action = "stop"``): no node's ledger ε passes its budget
and a stopped node had no room for one more round; a budget never hit changes nothing; a tiny
one stops every node from round 1, leaving the server's estimate at 0; bad tables are one-line
errors."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _pricer_helpers import NETWORK, Logged
from _runs import run_study_text, summary_rows
from hypothesis import given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS
from desim.models.pricer.data import VectorData
from desim.models.pricer.protocol import Pricer, PricerParams
from desim.models.privacy.accounting import epsilon_spent
from desim.study.spec.hashing import curve_hash
from desim.testing import check_modes

N, D, DELTA = 5, 4, 1e-3


def simulate(t_max=12, seed=3, **params):
    """(protocol, data, server estimates per round, wide metrics per slot) of one PriCER run."""
    data = VectorData(agents=N, dimension=D, radius=2.0, distribution="normal").make(
        np.random.default_rng(11)
    )
    links = build(desim.network_models.links.BernoulliLinks, NETWORK, "network")
    base = {"epsilon_high": 4.0, "epsilon_low": 2.0, "trust": "ring", "trusted": 1, "delta": DELTA}
    proto = Logged(build(PricerParams, {**base, **params}, "pricer"))
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        metrics=[METRICS.get(name) for name in ("privacy", "budget", "pricer")],
    )
    out = sim.run()
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    return proto, data, np.array(proto.rounds), wide


def check_stops_exactly(proto, wide, budget, against, t_max=12):
    """No node's ledger ε passes the budget; a node stopped exactly when one more round would
    not have fitted, and withheld every round after; the `budget` metric counts them."""
    gate, spend = proto.gate, proto.privacy_spend()
    mult, count = spend.against[against]
    assert (spend.epsilons()[against] <= budget).all()
    assert (wide[f"eps_{against}_max"] <= budget).all()
    for i in range(N):
        if gate.withheld[i]:
            assert epsilon_spent("gaussian", float(mult[i]), int(count[i]) + 1, DELTA) > budget
            assert gate.hit_at[i] == count[i] + 1 and gate.withheld[i] == t_max - count[i]
        else:
            assert count[i] == t_max or not np.isfinite(mult[i])
    assert wide["budget_exhausted"].iloc[-1] == np.mean(gate.withheld > 0)
    assert wide["budget_withheld"].iloc[-1] == gate.withheld.sum()


@given(
    budget=st.floats(0.5, 40.0),
    against=st.sampled_from(["neighbour", "server"]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=8, deadline=None)
@pytest.mark.slow  # an optimiser run and PLD compositions per example: about 5 s
def test_no_node_passes_its_budget_and_a_stopped_node_had_no_room(budget, against, seed):
    proto, _, _, wide = simulate(12, seed, budget={"epsilon": budget, "against": against})
    check_stops_exactly(proto, wide, budget, against)


def test_a_budget_never_hit_changes_nothing():
    _, _, free_rounds, free = simulate()
    proto, _, rounds, budgeted = simulate(budget={"epsilon": 1e6, "against": "server"})
    assert proto.gate.withheld.sum() == 0 and not np.isfinite(proto.gate.hit_at).any()
    assert free_rounds.tobytes() == rounds.tobytes()
    keep = [c for c in budgeted.columns if not c.startswith("budget")]
    assert free.to_csv().encode() == budgeted[keep].to_csv().encode()
    assert (budgeted["budget_exhausted"] == 0).all()


def test_a_budget_that_binds_keeps_the_rounds_before_it_and_the_others_noise():
    """Up to the first node's k*, every round is the unbudgeted run's, bit for bit (the noise of
    every pair is drawn whether or not it is sent)."""
    _, _, free_rounds, _ = simulate()
    proto, _, rounds, wide = simulate(budget={"epsilon": 6.0, "against": "neighbour"})
    check_stops_exactly(proto, wide, 6.0, "neighbour")
    first = int(proto.gate.capacity.min())
    assert 0 < first < 12 and proto.gate.withheld.sum() > 0
    assert free_rounds[:first].tobytes() == rounds[:first].tobytes()
    assert not np.array_equal(free_rounds[first:], rounds[first:])


def test_a_budget_against_the_server_stops_by_the_server_ledger():
    proto, _, _, wide = simulate(budget={"epsilon": 10.0, "against": "server"})
    assert 0 < proto.gate.withheld.sum() and np.isfinite(proto.gate.hit_at).all()
    check_stops_exactly(proto, wide, 10.0, "server")


def test_a_tiny_budget_stops_every_node_from_round_1_and_the_server_estimates_0():
    """ε_budget = 10⁻³ is below one round's ε for every node: nobody sends, every round closes
    empty, x̂̄ = 0 and the MSE is ‖x̄‖²; the ledger is empty."""
    proto, data, rounds, wide = simulate(budget={"epsilon": 1e-3, "against": "neighbour"})
    gate = proto.gate
    assert (gate.capacity == 0).all() and (gate.hit_at == 1).all()
    assert (gate.withheld == 12).all()
    assert len(rounds) == 12 and (rounds == 0).all()
    truth = data.x.mean(axis=0)
    np.testing.assert_allclose(wide["mse"], (truth**2).sum(), rtol=1e-12)
    assert (wide["budget_exhausted"] == 1).all()
    assert (wide["eps_neighbour_max"] == 0).all() and (wide["eps_server_max"] == 0).all()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"budget": {"epsilon": 1, "against": "one"}}, "budget.against = 'one': must be one of "),
        ({"budget": {"epsilon": 1, "action": "degrade"}}, "budget.action = 'degrade': must be"),
        ({"budget": {"epsilon": 0}}, "budget.epsilon = 0: must be a finite number > 0"),
        ({"budget": {"epsilon": 1, "delta": 2}}, "budget.delta = 2: must lie in"),
        ({"budget": {"epsilon": 1, "size": 2}}, "budget.size: unknown key"),
        ({"budget": 3}, "budget = 3: must be a table"),
        ({"strategy": "colrel", "budget": {"epsilon": 1}}, "budget: needs strategy = 'pricer'"),
    ],
)
def test_bad_budgets_are_one_line_config_errors(params, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as err:
        build(PricerParams, params, "scenario 'x'")
    assert "\n" not in str(err.value)


def test_no_budget_leaves_the_params_hash_as_it_was():
    """A budget of None is left out of hashes (`hash_omits_absent`); a budget enters them."""
    params = build(PricerParams, {}, "pricer")
    before = {k: v for k, v in dataclasses.asdict(params).items() if k != "budget"}
    assert curve_hash("k", params, {}, 1, 1) == curve_hash("k", before, {}, 1, 1)
    budgeted = build(PricerParams, {"budget": {"epsilon": 1.0}}, "pricer")
    assert budgeted.budget.against == "neighbour" and budgeted.budget.delta == params.delta
    assert curve_hash("k", params, {}, 1, 1) != curve_hash("k", budgeted, {}, 1, 1)


def test_a_binding_budget_gives_the_same_bytes_in_every_delivery_mode():
    """Windows withhold exactly the rounds one message per instant does (`check_modes`)."""
    for runs in check_modes(
        Pricer,
        {
            "epsilon_high": 4.0,
            "epsilon_low": 2.0,
            "trust": "ring",
            "trusted": 1,
            "relay_deadline": 1.25,
            "budget": {"epsilon": 6.0},
        },
        networks=[
            {"latency": {"model": "exponential", "mean": 0.6}},
            {
                "latency": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
                "outages": {"model": "markov", "mean_up": 6.0, "mean_down": 2.0},
            },
        ],
        data=("vectors", {"agents": 8, "dimension": 5, "radius": 2.0, "distribution": "normal"}),
        base=build(
            desim.network_models.links.BernoulliLinks,
            {"p_server": [0.9, 0.5] * 4, "p_link": 0.7},
            "network",
        ),
        t_max=40,
        metrics=("pricer", "privacy", "budget"),
        state=("gate.withheld", "gate.hit_at"),
    ):
        assert runs["instants"].protocol.gate.withheld.sum() > 0


STUDY = """
[study]
title = "pricer budgets"
seed = 1
replicates = 1
t_max = 12
checkpoints = 4
metrics = ["privacy", "budget"]

[data]
model = "vectors"
agents = 5
dimension = 4
radius = 2.0
distribution = "normal"

[network]
links = "bernoulli"
p_server = [0.2, 0.9, 0.5, 0.3, 1.0]
p_link = 0.6
reciprocity = 0.5

[defaults]
trust = "ring"
trusted = 1
epsilon_high = 4.0
epsilon_low = 2.0
delta = 1e-3

[[scenario]]
name = "unlimited"
protocol = "pricer"

[[scenario]]
name = "stop"
protocol = "pricer"
budget = {epsilon = 6.0, against = "neighbour", action = "stop"}
"""


@pytest.mark.slow  # validate, run and two summaries of a study: about 5 s
def test_a_pricer_study_with_a_budget_runs_and_summarises(tmp_path, capsys):
    folder = run_study_text(tmp_path / "budgets", STUDY)
    rows = summary_rows(folder, "eps_neighbour_max", capsys)
    assert float(rows["stop"][1]) <= 6.0 < float(rows["unlimited"][1])
    rows = summary_rows(folder, "budget_exhausted", capsys)
    assert 0 < float(rows["stop"][1]) <= 1 and "unlimited" not in rows


def test_a_bad_pricer_budget_is_refused_by_validate_in_one_line(tmp_path, capsys):
    from desim.study.cli import main

    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.replace('"neighbour"', '"colluding"'))
    assert main(["validate", str(folder)]) != 0
    err = capsys.readouterr().err
    assert "budget.against = 'colluding': must be one of neighbour, server" in err
    assert "Traceback" not in err
