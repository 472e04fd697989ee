"""Budgets on a graph that changes during a run (Private-ColME, peers = "topology", a sequence
of graph files): ``stop`` against colluding queriers counts every p-sum of the first sample
as it is made, on a new link as on an old one, so the ledger (which keeps the releases of
dropped links) equals the hand count, never passes the budget and reaches the last release
that fits; the runs whose bounds assume the set-up graph are refused, saying why."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _runs import validate_rewired
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.plugins import load_plugins
from desim.models.privacy.accounting import epsilon_spent, psum_multiplier, psum_noise
from desim.study.scenario import Scenario, run

load_plugins()

DELTA = 1e-6
L_DATA = math.sqrt(3) / 2  # σ = 1/2 uniform data: L = σ√3
G1 = [(0, 1), (1, 2), (2, 3)]  # the path 0–1–2–3
G2 = [(0, 2), (1, 2), (2, 3)]  # 0–1 dropped, 0–2 new


def changing(tmp_path, budget: dict | None, t_max: int = 30, **params) -> Scenario:
    """PM-I on the path G1, G2 from slot 10, G1 again from slot 20 (0–1 made again, 0–2
    dropped), every slot a checkpoint, per-agent ledger."""
    for name, edges in (("g1.edges", G1), ("g2.edges", G2)):
        (tmp_path / name).write_text("".join(f"{u} {v}\n" for u, v in edges))
    sequence = [{"at": 10, "file": "g2.edges"}, {"at": 20, "file": "g1.edges"}]
    extra = {} if budget is None else {"budget": budget}
    return Scenario(
        protocol="private-colme",
        params={"peers": "topology", "mechanism": "pm1", **extra, **params},
        data={"model": "classes", "agents": 4, "class_means": [0.2, 0.8], "sigma": 0.5},
        t_max=t_max,
        seed=4,
        checkpoints=t_max,
        topology={"model": "file", "path": "g1.edges", "sequence": sequence},
        metrics=("privacy", "budget"),
        per_agent=True,
        folder=str(tmp_path),
    )


def final(out, metric: str) -> np.ndarray:
    """Every agent's `metric` at the last checkpoint."""
    agents = out.agents
    return agents[agents.t == agents.t.max()].sort_values("agent")[metric].to_numpy()


def test_a_stop_budget_on_a_changing_graph_ends_at_the_last_release_that_fits(tmp_path):
    """Unlimited, b's first sample ends in one p-sum per querier and link incarnation that
    released: 3, 3, 3, 1 (0 told twice by 1 and once by 2; 1 twice by 0, once by 2; 2 by 0, 1,
    3; 3 by 2). A budget between ε(m, 2) and ε(m, 3) against colluding queriers stops agents 0,
    1 and 2 at exactly 2 p-sums (their third would not fit: withheld, at every query for it)
    and leaves agent 3 alone; ε never passes the budget at any slot."""
    free = run(changing(tmp_path, None))
    sigma2 = psum_noise("gaussian", L_DATA, "pm1", 1.0, DELTA, 30)[0]  # the paper's, ε = 1
    m = psum_multiplier("gaussian", sigma2, L_DATA)
    spent = [epsilon_spent("gaussian", m, k, DELTA) for k in (1, 2, 3)]
    assert final(free, "eps_all") == pytest.approx([spent[2]] * 3 + [spent[0]], rel=1e-9)
    eps_b = (spent[1] + spent[2]) / 2
    out = run(changing(tmp_path, {"epsilon": eps_b, "against": "colluding", "action": "stop"}))
    want = [spent[1], spent[1], spent[1], spent[0]]
    assert final(out, "eps_all") == pytest.approx(want, rel=1e-9)
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    assert (wide["eps_all_max"] <= eps_b).all()
    assert wide["budget_withheld"].iloc[-1] >= 3 and wide["budget_exhausted"].iloc[-1] == 0.75


def test_a_stop_budget_against_one_counts_a_link_made_again(tmp_path):
    """Against one querier, unlimited: 1 told 0 twice (0–1, then 0–1 made again) and so did
    0 to 1, the others one p-sum each: 2, 2, 1, 1. A budget between ε(m, 1) and ε(m, 2) stops
    the first release of the link made again, which starts a new tree but holds the first
    sample again: every agent ends at 1 p-sum, and agents 0 and 1 have hit their budget."""
    sigma2 = psum_noise("gaussian", L_DATA, "pm1", 1.0, DELTA, 30)[0]
    m = psum_multiplier("gaussian", sigma2, L_DATA)
    spent = [epsilon_spent("gaussian", m, k, DELTA) for k in (1, 2)]
    free = run(changing(tmp_path, None))
    assert final(free, "eps_one") == pytest.approx([spent[1]] * 2 + [spent[0]] * 2, rel=1e-9)
    eps_b = sum(spent) / 2
    out = run(changing(tmp_path, {"epsilon": eps_b, "against": "one", "action": "stop"}))
    assert final(out, "eps_one") == pytest.approx([spent[0]] * 4, rel=1e-9)
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    assert (wide["eps_one_max"] <= eps_b).all()
    assert wide["budget_exhausted"].iloc[-1] == 0.5 and wide["budget_withheld"].iloc[-1] >= 2


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            'budget = {epsilon = 8.0, against = "colluding", action = "degrade"}',
            "m' spreads the budget",
        ),
        ('calibration = "tight-tree"', "a link made again starts a new tree"),
    ],
)
def test_bounds_of_the_set_up_graph_are_refused_saying_why(tmp_path, capsys, extra, fragment):
    assert validate_rewired(tmp_path, extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


@pytest.mark.parametrize("against", ["one", "colluding"])
def test_a_stop_budget_is_accepted_on_a_changing_graph(tmp_path, against):
    assert (
        validate_rewired(
            tmp_path, f'budget = {{epsilon = 2.0, against = "{against}", action = "stop"}}'
        )
        == 0
    )


@given(
    against=st.sampled_from(["one", "colluding"]),
    mechanism=st.sampled_from(["pm1", "pm2"]),
    schedule=st.sampled_from(["rr", "rrr"]),
    every=st.integers(2, 9),
    fraction=st.floats(0.1, 1.0),
    budget=st.floats(0.3, 4.0),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=6, deadline=None)
@pytest.mark.slow  # six runs with the ledger at 20 checkpoints: about 6 s
def test_a_stop_budget_holds_over_random_rewiring_on_lossy_delayed_links(
    against, mechanism, schedule, every, fraction, budget, seed
):
    """Rewiring (links dropped and made again), Bernoulli links and delays (repeats, stale and
    lost releases, messages of links gone): no agent's ledger ε passes its budget at any
    checkpoint, whatever the recipient set."""
    s = Scenario(
        protocol="private-colme",
        params={
            "peers": "topology",
            "mechanism": mechanism,
            "schedule": schedule,
            "budget": {"epsilon": budget, "against": against, "action": "stop"},
        },
        data={"model": "classes", "agents": 8, "class_means": [0.2, 0.8], "sigma": 0.5},
        network={"links": "bernoulli", "p_link": 0.7, "latency": {"model": "exponential"}},
        t_max=40,
        seed=seed,
        checkpoints=20,
        topology={
            "model": "regular",
            "degree": 3,
            "rewire": {"every": every, "fraction": fraction},
        },
        metrics=("privacy", "budget"),
    )
    wide = run(s).metrics.pivot(index="t", columns="metric", values="value")
    who = "one" if against == "one" else "all"
    assert (wide[f"eps_{who}_max"] <= budget).all()
