"""Private-ColME's forgetting with MoM weights (``weights = "mom"``,
`desim.models.colme.forgetting.WindowedMoM`): T^W the mean of the window's prefix means from
its base, Var[T^W] with each p-sum's or node's exact coefficient.

With W ≥ t_max every base is the empty prefix and it is the paper's MoM over every release: T
and Var[T] to rounding (rtol 1e-9: Σ t_k R_k/t_k against Σ R_k), the decisions the same.
"""

from __future__ import annotations

import dp_accounting  # noqa: F401  (the privacy metric's; imported once here, not in a test)
import numpy as np
import pandas as pd
import pytest
from _forget import (
    DRIFT,
    LATENCY,
    assert_refused_in_one_line,
    assert_same_ledger,
    mse_without_and_with_reset,
    windowed_releases,
)
from _runs import every_slot
from hypothesis import settings

from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.models.colme.forgetting import WindowedMoM
from desim.models.forgetting import Forget, PrefixWindow
from desim.study.scenario import Scenario, run

load_plugins()
PAIRS = np.flatnonzero(~np.eye(10, dtype=bool))


def _run(params: dict, network: dict | None = None, topology: dict | None = None):
    s = Scenario(
        protocol="private-colme",
        params={"weights": "mom", **params},
        data=DRIFT,
        network=network or {"links": "ideal"},
        t_max=150,
        checkpoints=15,
        topology=topology,
        per_agent=True,
        metrics=("privacy", "colme-async"),
    )
    return run(s, streams=Streams(1, 0, 5, 7))


def _nodes(k: int, mechanism: str) -> set:
    """The p-sums (PM-I: 1 … k) or tree nodes (PM-II: (ℓ, k >> ℓ) per set bit) of release k."""
    if mechanism == "pm1":
        return {(0, p) for p in range(1, k + 1)}
    return {(lv, k >> lv) for lv in range(k.bit_length()) if k >> lv & 1}


def _reference(ts, prefix, chain, base, mechanism):
    """T, D and A of MoM over releases `chain` after `base`, by enumeration: Y_r its windowed
    prefix means, D = Σ_{r,s} min(n_r, n_s)/(n_r n_s), and A the sum over every p-sum or node
    of (Σ_{r using it} 1/n_r − [the base uses it]·Σ_r 1/n_r)²."""
    n = np.array([ts[k] - ts[base] for k in chain])
    y = np.array([prefix[k] - prefix[base] for k in chain]) / n
    data = sum(min(a, b) / (a * b) for a in n for b in n)
    total = (1.0 / n).sum()
    coef: dict = {}
    for k, nk in zip(chain, n, strict=True):
        for node in _nodes(k, mechanism):
            coef[node] = coef.get(node, 0.0) + 1.0 / nk
    for node in _nodes(base, mechanism) if base else ():
        coef[node] = coef.get(node, 0.0) - total
    return y.mean(), data, sum(c * c for c in coef.values())


@settings(max_examples=40, deadline=None)
@windowed_releases
def test_the_windowed_mom_is_the_enumeration_over_the_window(
    received, steps, rule, size, mechanism
):
    """Releases 1 … J at increasing t, a subset received in order: at each, T^W, D and A of
    the windowed MoM are the enumeration over the received releases after its base (PM-II: the
    base's unshared nodes with coefficient −Σ 1/n_r, shared ones cancelled)."""
    ts = np.concatenate(([0], np.cumsum(steps)[: len(received)])).astype(float)
    prefix = np.random.default_rng(len(received)).normal(size=len(ts)) * 10
    prefix[0] = 0.0
    forget = Forget(window=size) if rule == "window" else Forget(reset=size)
    prefixes = PrefixWindow(forget, 1, len(ts), gaps=True)
    means = WindowedMoM(mechanism, prefixes, 1, levels=6)
    held, one = [0], np.array([0])
    for j in (j for j, got in enumerate(received, start=1) if got):
        jj, tj = np.array([j]), ts[[j]]
        n, total, i = prefixes.take(one, np.array([prefix[j] / ts[j]]), tj, jj)
        value, data, noise, count = means.take(one, prefix[[j]], tj, jj, n, total, i)
        held.append(j)
        if n[0] == 0:
            continue
        base = int(i[0])
        chain = [k for k in held if base < k <= j]
        assert count[0] == len(chain)
        want = _reference(ts, prefix, chain, base, mechanism)
        np.testing.assert_allclose([value[0], data[0], noise[0]], want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("variance", ["known", "sch-var-2"])
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_a_window_longer_than_the_run_is_mom_over_every_release(variance, mechanism):
    """W ≥ t_max: T^W and Var[T^W] are MoM's T and exact Var[T] (PM-II: the node form), the
    decisions the same, the metrics to rounding."""
    params = {"variance": variance, "mechanism": mechanism, "weights": "mom"}
    plain, out = every_slot(params, 10, 100)
    window, out_w = every_slot({**params, "forget": {"window": 100}}, 10, 100)
    np.testing.assert_allclose(
        window.forget.value.ravel()[PAIRS], plain.stat.value.ravel()[PAIRS], rtol=1e-9, atol=1e-12
    )
    if variance == "known":
        var = plain.stat.variance(plain.sigma2[None, :], slice(None)).ravel()[PAIRS]
        np.testing.assert_allclose(window.forget.var.ravel()[PAIRS], var, rtol=1e-9)
    np.testing.assert_array_equal(window.included, plain.included)
    np.testing.assert_allclose(out_w.metrics.value, out.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("network", [{"links": "ideal"}, LATENCY])
@pytest.mark.parametrize("topology", [None, {"model": "regular", "degree": 4}])
def test_over_late_links_and_on_a_graph_a_long_window_is_mom(network, topology):
    params = {} if topology is None else {"peers": "topology"}
    plain = _run(params, network, topology)
    window = _run({**params, "forget": {"window": 150}}, network, topology)
    np.testing.assert_allclose(window.metrics.value, plain.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
def test_the_ledger_with_forget_is_the_ledger_without_under_mom(forget):
    plain = _run({"mechanism": "pm2"})
    forgets = _run({"mechanism": "pm2", "forget": forget})
    assert_same_ledger(plain, forgets)


def test_a_reset_forgets_the_old_class_under_mom():
    """Every agent switches class at τ = 40: with a reset at τ the MoM estimates are over the
    new class's samples, a third of the MSE without (at least) at t = 400."""
    plain, reset = mse_without_and_with_reset({"epsilon": 5.0, "weights": "mom"})
    assert plain > 2e-3 and reset < plain / 3


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"weights": "wmom", "mechanism": "pm2"}, "weights = 'wmom' not yet (wMoM averages"),
        (
            {"weights": "mom", "budget": {"epsilon": 2.0, "action": "degrade"}},
            "weights = 'mom' and budget action = 'degrade' not yet",
        ),
    ],
)
def test_what_forget_refuses_with_mom_is_said_in_one_line(params, fragment):
    assert_refused_in_one_line(params, fragment)


@pytest.mark.parametrize("forget", [{"window": 30}, {"reset": 40}])
def test_a_change_that_moves_no_link_keeps_the_windowed_mom(forget):
    """Rewiring that moves nothing: every pair's MoM sums carried to itself, the static bytes."""
    ring = {"model": "regular", "degree": 4}
    params = {"peers": "topology", "forget": forget, "mechanism": "pm2"}
    static = _run(params, topology=ring)
    tiny = _run(params, topology={**ring, "rewire": {"every": 10, "fraction": 1e-9}})
    pd.testing.assert_frame_equal(static.metrics, tiny.metrics, check_exact=True)
    pd.testing.assert_frame_equal(static.agents, tiny.agents, check_exact=True)


def test_on_a_changing_graph_a_long_window_is_mom():
    topology = {"model": "regular", "degree": 4, "rewire": {"every": 15, "fraction": 0.3}}
    plain = _run({"peers": "topology"}, topology=topology)
    window = _run({"peers": "topology", "forget": {"window": 150}}, topology=topology)
    np.testing.assert_allclose(window.metrics.value, plain.metrics.value, rtol=1e-9)


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_under_a_stop_budget_mom_with_forget_keeps_the_ledger(mechanism):
    """A withheld release is never received (a gap in the window's releases): the releases
    made, and every ε of the ledger, are those without forgetting."""
    params = {"mechanism": mechanism, "budget": {"epsilon": 2.0, "against": "colluding"}}
    plain = _run(params)
    window = _run({**params, "forget": {"window": 30}})
    ledger = ~plain.metrics.metric.isin(["mse", "accuracy"])
    pd.testing.assert_frame_equal(
        plain.metrics[ledger].reset_index(drop=True),
        window.metrics[ledger.to_numpy()].reset_index(drop=True),
    )
    assert np.isfinite(window.metrics.value).all()
