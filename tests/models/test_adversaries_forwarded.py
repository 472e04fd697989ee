"""B-ColME adversaries that corrupt the sums they forward (``forwarded = "corrupted"``,
docs/adversaries.md, `desim.models.ccolme.robust`): the key refused where nothing is forwarded,
the corruption's closed forms through the non-backtracking walks, the robust combination
unmoved, the modes' bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular
from _runs import adversary_run, validate_graph_study

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import PROTOCOLS
from desim.testing import check_modes
from desim.topologies.graph import Graph

load_plugins()

SHIFT = '[adversaries]\nfraction = 0.2\nbehaviour = "shift"\nshift = 0.1\n'


def _validate(tmp_path: Path, capsys, table: str, protocol: str = "b-colme", extra: str = ""):
    return validate_graph_study(tmp_path, capsys, table, protocol, extra)


@pytest.mark.parametrize(
    ("table", "protocol", "fragment"),
    [
        (SHIFT + 'forwarded = "corrupt"', "b-colme", "must be one of unchanged, corrupted"),
        (SHIFT + "forwarded = true", "private-b-colme", "forwarded = True: must be one of"),
        (SHIFT + 'forwarded = "corrupted"', "c-colme", "own consensus estimate"),
        (SHIFT + 'forwarded = "unchanged"', "private-c-colme", "remove forwarded"),
        (
            '[adversaries]\nfraction = 0.2\nbehaviour = "inflate"\nfactor = 3\n'
            'forwarded = "corrupted"',
            "b-colme",
            "'inflate' reports no value to corrupt",
        ),
    ],
)
def test_forwarded_is_refused_in_one_line_naming_value_and_what_is_allowed(
    tmp_path, capsys, table, protocol, fragment
):
    code, err = _validate(tmp_path, capsys, table, protocol=protocol)
    assert code != 0
    assert "adversaries.forwarded" in err and fragment in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("protocol", "fragment"),
    [
        ("pricer", "always corrupt the honest shares they relay"),
        ("private-colme", "its messages carry no sums of other agents' values"),
        ("eb-gaussian", "its messages carry no sums of other agents' values"),
    ],
)
def test_families_without_forwarded_sums_refuse_it_with_their_reason(protocol, fragment):
    table = {"fraction": 0.2, "behaviour": "shift", "shift": 0.1, "forwarded": "corrupted"}
    with pytest.raises(Exception, match=fragment) as caught:
        build(PROTOCOLS.get(protocol).Params, {"adversaries": table}, "test")
    assert "adversaries.forwarded = 'corrupted'" in str(caught.value)


@pytest.mark.parametrize("protocol", ["b-colme", "private-b-colme"])
@pytest.mark.parametrize("value", ["unchanged", "corrupted"])
def test_forwarded_is_accepted_by_b_colme(tmp_path, capsys, protocol, value):
    code, err = _validate(tmp_path, capsys, SHIFT + f'forwarded = "{value}"', protocol=protocol)
    assert code == 0, err


def test_the_baselines_accept_it_as_every_key_they_only_score_by():
    """A study-wide [adversaries] table reaches local and ideal, which only score by it."""
    table = {"fraction": 0.2, "behaviour": "shift", "shift": 0.1, "forwarded": "corrupted"}
    params = build(PROTOCOLS.get("local").Params, {"adversaries": table}, "test")
    assert params.adversaries.forwarded == "corrupted"


# ------------------------------------------------------------------------------- closed forms


def _walks(g: Graph, a: int, steps: int) -> list[list[int]]:
    """The non-backtracking walks a = v_0 → v_1 → … → v_steps, as [v_1, …, v_steps]."""
    out = [[int(b)] for b in g.dst[g.src == a]]
    for _ in range(steps - 1):
        longer = []
        for walk in out:
            back = walk[-2] if len(walk) > 1 else a
            longer += [walk + [int(c)] for c in g.dst[g.src == walk[-1]] if c != back]
        out = longer
    return out


def _walk_estimate(g: Graph, t: int, kappa: int, x: np.ndarray, report) -> np.ndarray:
    """μ̂_a at slot t when every agent's samples are its constant x_v (no noise, one class, the
    oracle rule, ideal links): (t x_a + Σ_k w_k Σ_walks value) / (t + Σ_k w_k N_k(a)), the sum
    over the non-backtracking walks a → v_1 → … → v_{k+1} (k ≤ κ − 2, w_k = t − 1 − k ≥ 1)
    of x_{v_{k+1}} as `report(v, value)` passes it on from v_{k+1} (its own report) back
    through v_k, …, v_1 (each forwarding it)."""
    out = np.empty(g.n)
    for a in range(g.n):
        num, den = t * x[a], float(t)
        for k in range(kappa - 1):
            w = t - 1 - k
            if w < 1:
                continue
            for walk in _walks(g, a, k + 1):
                value = x[walk[-1]]
                for v in reversed(walk):
                    value = report(v, value)
                num += w * value
                den += w
        out[a] = num / den
    return out


def _constant_data(m: int, seed: int) -> GraphData:
    """One class on a 4-regular graph, every agent's samples its own constant mean."""
    data = GraphData(regular(m, 4, seed=seed), np.zeros(m, dtype=int), [0.0], sigma=0.0)
    data.means = np.random.default_rng(seed + 4).uniform(0.0, 1.0, m)
    data.public = {**data.public, "L": 1.0, "sigma2": np.ones(m)}
    return data


def test_a_shift_moves_honest_estimates_once_per_adversary_on_each_walk_closed_form():
    """Adversaries A shifted by s that corrupt what they forward move honest a's estimate by
    s Σ_k w_k P_k(a) / (t + Σ_k w_k N_k(a)), P_k(a) the adversaries counted along the walks of
    k + 1 steps from a (each position v_1 … v_{k+1} in A: the end one's report, every earlier
    one's forwarding), N_k(a) the walks: the honest part (`unchanged`) plus the forwarders'."""
    g = regular(40, 4, seed=1)
    data = GraphData(g, np.zeros(40, dtype=int), [0.5], sigma=0.3)
    bad, s, t_max = [3, 11, 12, 30], 2.0, 30
    params = {"rule": "oracle"}
    table = {"agents": bad, "behaviour": "shift", "shift": s}
    clean, _ = adversary_run("b-colme", params, data, t_max)
    passed, _ = adversary_run("b-colme", {**params, "adversaries": table}, data, t_max)
    table = {**table, "forwarded": "corrupted"}
    dirty, scores = adversary_run("b-colme", {**params, "adversaries": table}, data, t_max)
    # the non-backtracking operator on directed edges, and the edges that end in A
    step = ((g.src[None, :] == g.dst[:, None]) & (g.dst[None, :] != g.src[:, None])).astype(float)
    ends_bad = np.isin(g.dst, bad).astype(float)
    walks, hits = np.eye(g.n_directed), np.diag(ends_bad)  # hits: adversaries along, by last edge
    num, den = np.zeros(40), np.zeros(40)
    for k in range(4):  # κ = 5: depths 0 … 3
        w = t_max - 1 - k
        np.add.at(num, g.src, w * hits.sum(axis=1))
        np.add.at(den, g.src, w * walks.sum(axis=1))
        hits = hits @ step + (walks @ step) * ends_bad[None, :]
        walks = walks @ step
    closed = s * num / (t_max + den)
    honest = np.setdiff1d(np.arange(40), bad)
    moved = dirty.estimates() - clean.estimates()
    np.testing.assert_allclose(moved[honest], closed[honest], rtol=1e-9)
    # more than the adversaries' own means alone move them (every walk through A, not only to A)
    assert np.all(moved[honest] > passed.estimates()[honest] - clean.estimates()[honest])
    np.testing.assert_array_equal(dirty.mean, passed.mean)  # their own reports: the same
    assert scores["adversaries_accepted"] > 0


@pytest.mark.parametrize(
    "table",
    [
        {"behaviour": "flip"},
        {"behaviour": "collude", "target": 3.0},
        {"behaviour": "mimic", "class": 0, "shift": 0.25},
        {"behaviour": "shift", "shift": -0.5},
    ],
)
def test_every_mean_a_sum_carries_is_reported_by_each_adversary_that_forwards_it(table):
    """Constant samples x_v: a forwarded mean reaches honest a as each adversary on its walk
    reports it (origin first, then every forwarder toward a): flip 2μ̄ − x, shift x + s,
    collude and mimic their centre (the target, or μ_c + s: an adversary's own report too, its
    samples being its mean); the estimate is the walks' closed form."""
    m, t_max = 24, 9
    data = _constant_data(m, seed=6)
    bad = [2, 7, 13, 19]
    spec = {"agents": bad, **table, "forwarded": "corrupted"}
    proto, _ = adversary_run("b-colme", {"rule": "oracle", "adversaries": spec}, data, t_max)
    x = data.means
    centre = {
        "flip": None,
        "collude": table.get("target"),
        "mimic": float(np.mean(x)) + table.get("shift", 0.0),  # one class: class 0 is everyone
    }.get(table["behaviour"])
    is_bad = np.isin(np.arange(m), bad)

    def report(v: int, value: float) -> float:
        if not is_bad[v]:
            return value
        if table["behaviour"] == "flip":
            return 2 * float(np.mean(x)) - value
        if table["behaviour"] == "shift":
            return value + table["shift"]
        return centre

    closed = _walk_estimate(data.public["graph"], t_max, 5, x, report)
    honest = ~is_bad
    np.testing.assert_allclose(proto.estimates()[honest], closed[honest], rtol=1e-9)


@pytest.mark.parametrize(("combination", "trim"), [("median", None), ("trimmed", 0.3)])
def test_the_robust_combination_never_reads_forwarded_sums(combination, trim):
    """Private-B-ColME (noise, the Bernstein test, re-tested decisions), 20 % shifted
    adversaries: the median or trimmed mean over depth-0 means gives the same bytes whether the
    adversaries corrupt what they forward or not (no test nor estimate reads deeper entries);
    the weighted tables move."""
    g = regular(40, 4, seed=3)
    data = GraphData(g, np.arange(40) % 2, [0.2, 0.8], sigma=0.5)
    table = {"fraction": 0.2, "behaviour": "shift", "shift": 0.3}
    robust = {"epsilon": 5.0, "combination": combination}
    if trim is not None:
        robust["trim"] = trim
    out = {}
    for params in (robust, {"epsilon": 5.0}):
        for forwarded in ("unchanged", "corrupted"):
            spec = {**table, "forwarded": forwarded}
            proto, _ = adversary_run("private-b-colme", {**params, "adversaries": spec}, data, 60)
            out[params is robust, forwarded] = proto.estimates().tobytes()
    assert out[True, "unchanged"] == out[True, "corrupted"]
    assert out[False, "unchanged"] != out[False, "corrupted"]


def test_forwarded_unchanged_stated_gives_the_bytes_of_the_table_without_it():
    g = regular(30, 4, seed=3)
    data = GraphData(g, np.arange(30) % 2, [0.2, 0.8], sigma=0.5)
    table = {"fraction": 0.2, "behaviour": "mimic", "class": 0}
    plain, _ = adversary_run("private-b-colme", {"adversaries": table}, data, 40)
    stated = {**table, "forwarded": "unchanged"}
    same, _ = adversary_run("private-b-colme", {"adversaries": stated}, data, 40)
    assert plain.estimates().tobytes() == same.estimates().tobytes()


@pytest.mark.parametrize("protocol", ["b-colme", "private-b-colme"])
def test_check_modes_gives_the_same_bytes_with_corrupted_forwarding(protocol):
    table = {"fraction": 0.2, "behaviour": "flip", "forwarded": "corrupted"}
    check_modes(
        PROTOCOLS.get(protocol),
        {"adversaries": table},
        topology=("regular", {"degree": 4}),
        metrics=["adversaries"],
        t_max=40,
    )
