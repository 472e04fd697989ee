"""Adversaries and the robust combination of B-ColME and Private-B-ColME (docs/adversaries.md,
`desim.models.ccolme.bcolme`): the tables refused, the shift's and the inflated counts' closed
forms through the non-backtracking walks, the robust combination's range bound, bytes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular
from _runs import adversary_run, validate_graph_study
from scipy.stats import norm

from desim.kernel.plugins import load_plugins
from desim.kernel.registry import PROTOCOLS
from desim.testing import check_modes
from desim.topologies.graph import Graph

load_plugins()


def _validate(tmp_path: Path, capsys, table: str, protocol: str = "b-colme", extra: str = ""):
    return validate_graph_study(tmp_path, capsys, table, protocol, extra)


@pytest.mark.parametrize(
    ("table", "extra", "fragment"),
    [
        ('[adversaries]\nfraction = 0.1\nbehaviour = "inflate"\nfactor = 0.5', "", "factor ≥ 1"),
        ('[adversaries]\nagents = [3, 30]\nbehaviour = "flip"', "", "30 is not an agent"),
        ("", 'combination = "trimmed"', "needs trim"),
        ("", "trim = 0.2", "reads it alone"),
        ("", 'combination = "mean"', "combination"),
        ("", 'consensus = "median"', "consensus"),
    ],
)
def test_validate_refuses_bad_tables_and_combinations_in_one_line(
    tmp_path, capsys, table, extra, fragment
):
    code, err = _validate(tmp_path, capsys, table, extra=extra)
    assert code != 0
    assert fragment in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("protocol", ["b-colme", "private-b-colme"])
@pytest.mark.parametrize(
    "behaviour", ['"shift"\nshift = 0.1', '"mimic"\nclass = 0', '"inflate"\nfactor = 3']
)
def test_every_behaviour_is_accepted_on_b_colme(tmp_path, capsys, protocol, behaviour):
    table = f"[adversaries]\nfraction = 0.2\nbehaviour = {behaviour}"
    extra = 'combination = "trimmed"\ntrim = 0.3'
    code, err = _validate(tmp_path, capsys, table, protocol=protocol, extra=extra)
    assert code == 0, err


# ------------------------------------------------------------------------------- closed forms


def _walk_weights(g: Graph, t: int, kappa: int, factor: np.ndarray) -> np.ndarray:
    """W[a, v]: the weight a's estimate at slot t gives X̃_v through its tables, with no noise,
    the oracle rule keeping every neighbour of one class, and ideal links: Σ over the
    non-backtracking walks a → b → … → v of k + 1 steps (k ≤ κ − 2) of factor_b·(t − 1) − k,
    the walks whose entry is present (t − 1 − k ≥ 1)."""
    e = g.n_directed
    # the non-backtracking operator on directed edges: (u→v) then (v→w), w ≠ u
    step = (g.src[None, :] == g.dst[:, None]) & (g.dst[None, :] != g.src[:, None])
    ends = np.zeros((e, g.n))
    ends[np.arange(e), g.dst] = 1.0
    walks = np.eye(e)  # row e0: the walks that start with the edge e0, by their last edge
    out = np.zeros((g.n, g.n))
    for k in range(kappa - 1):
        if t - 1 - k >= 1:
            weight = factor[g.dst] * (t - 1) - k  # b = dst of the first edge tells factor_b·n_b
            np.add.at(out, g.src, weight[:, None] * (walks @ ends))
        walks = walks @ step
    return out


def test_a_shift_moves_honest_estimates_by_the_walk_counts_closed_form():
    """No noise, one class, the oracle rule: adversaries A shifted by s move honest a's estimate
    by s Σ_k w_k N_k(a, A) / (t + Σ_k w_k N_k(a)), w_k = t − 1 − k, N_k the non-backtracking
    walks of k + 1 steps from a (ending in A, or anywhere): the estimate is linear in the means
    with weights that do not depend on them."""
    g = regular(40, 4, seed=1)
    data = GraphData(g, np.zeros(40, dtype=int), [0.5], sigma=0.3)
    bad, s, t_max = [3, 11, 12, 30], 2.0, 30
    clean, _ = adversary_run("b-colme", {"rule": "oracle"}, data, t_max)
    table = {"agents": bad, "behaviour": "shift", "shift": s}
    dirty, scores = adversary_run("b-colme", {"rule": "oracle", "adversaries": table}, data, t_max)
    w = _walk_weights(g, t_max, 5, np.ones(40))
    e = np.zeros(40)
    e[bad] = 1.0
    closed = s * (w @ e) / (t_max + w.sum(axis=1))
    honest = np.setdiff1d(np.arange(40), bad)
    moved = dirty.estimates() - clean.estimates()
    np.testing.assert_allclose(moved[honest], closed[honest], rtol=1e-9)
    assert np.all(closed[honest] > 0)  # every honest agent is within 4 hops of an adversary
    next_to = np.bincount(g.src[np.isin(g.dst, bad)], minlength=40)[honest]
    assert scores["adversaries_accepted"] == pytest.approx(next_to.mean())
    assert scores["accepting_adversaries"] == pytest.approx(np.mean(next_to > 0))


@pytest.mark.parametrize("t_max", [3, 25])
def test_inflated_counts_weigh_every_walk_through_the_adversary_closed_form(t_max):
    """Every agent's samples are its own constant x_v (σ = 0), one class, the oracle rule: the
    estimate is (t x_a + Σ_v W[a, v] x_v) / (t + Σ_v W[a, v]), where the walks whose first step
    is an adversary weigh factor·(t − 1) − k instead of t − 1 − k; its mean stays honest."""
    g = regular(30, 4, seed=2)
    data = GraphData(g, np.zeros(30, dtype=int), [0.0], sigma=0.0)
    data.means = np.random.default_rng(5).uniform(0.0, 1.0, 30)
    data.public = {**data.public, "L": 1.0, "sigma2": np.ones(30)}
    bad, factor = [5, 9, 20], 3.0
    table = {"agents": bad, "behaviour": "inflate", "factor": factor}
    proto, _ = adversary_run("b-colme", {"rule": "oracle", "adversaries": table}, data, t_max)
    told = np.ones(30)
    told[bad] = factor
    w = _walk_weights(g, t_max, 5, told)
    x = data.means
    closed = (t_max * x + w @ x) / (t_max + w.sum(axis=1))
    np.testing.assert_allclose(proto.estimates(), closed, rtol=1e-9)
    np.testing.assert_allclose(proto.mean, x, rtol=1e-12)  # the adversaries' means: honest
    plain = _walk_weights(g, t_max, 5, np.ones(30))
    assert not np.allclose(closed, (t_max * x + plain @ x) / (t_max + plain.sum(axis=1)))


def test_without_adversaries_the_bytes_are_unchanged():
    """A table with fraction 0 (nobody) and the weighted combination stated give the bytes of
    the run without them."""
    g = regular(30, 4, seed=3)
    data = GraphData(g, np.arange(30) % 2, [0.2, 0.8], sigma=0.5)
    for name in ("b-colme", "private-b-colme"):
        plain, _ = adversary_run(name, {}, data, 40)
        table = {"fraction": 0.0, "behaviour": "shift", "shift": 1.0}
        same, scores = adversary_run(
            name, {"adversaries": table, "combination": "weighted"}, data, 40
        )
        assert plain.estimates().tobytes() == same.estimates().tobytes()
        assert scores["accepting_adversaries"] == 0.0


def test_skip_noise_reports_the_raw_mean_corrupted():
    """Private-B-ColME with skip_noise: an adversary's X̃_b is its raw running mean plus s (that
    of the noiseless run on the same data), the honest agents' still carry their noise."""
    g = regular(30, 4, seed=3)
    data = GraphData(g, np.arange(30) % 2, [0.2, 0.8], sigma=0.5)
    raw, _ = adversary_run("b-colme", {}, data, 20)
    bad = [2, 7]
    table = {"agents": bad, "behaviour": "shift", "shift": 0.5, "skip_noise": True}
    proto, _ = adversary_run("private-b-colme", {"adversaries": table}, data, 20)
    np.testing.assert_allclose(proto.mean[bad], raw.mean[bad] + 0.5, rtol=1e-12)
    honest = np.setdiff1d(np.arange(30), bad)
    assert np.all(proto.mean[honest] != raw.mean[honest])


@pytest.mark.parametrize(
    ("table", "moved"),
    [
        ({"behaviour": "collude", "target": 5.0}, lambda x, mu: x - mu + 5.0),
        ({"behaviour": "flip"}, lambda x, mu: 2 * 0.5 - x),  # population mean (0.2 + 0.8)/2
    ],
)
def test_an_adversary_reports_its_behaviours_map_of_its_own_mean(table, moved):
    """What a collude or flip adversary's depth-0 entry carries: its behaviour's map of the mean
    an honest agent would report (noise-free B-ColME: the clean run's X̃_b)."""
    g = regular(30, 4, seed=3)
    data = GraphData(g, np.arange(30) % 2, [0.2, 0.8], sigma=0.5)
    clean, _ = adversary_run("b-colme", {}, data, 20)
    bad = [2, 7]
    proto, _ = adversary_run("b-colme", {"adversaries": {"agents": bad, **table}}, data, 20)
    np.testing.assert_allclose(proto.mean[bad], moved(clean.mean[bad], data.means[bad]), rtol=1e-12)


def _circulant(m: int, reach: int) -> Graph:
    """The ring on m agents with links to the `reach` nearest on each side (degree 2·reach)."""
    u = np.repeat(np.arange(m), reach)
    v = (u + np.tile(np.arange(1, reach + 1), m)) % m
    return Graph.from_edges(m, u, v)


@pytest.mark.parametrize(
    ("combination", "trim"), [("median", None), ("trimmed", 0.2), ("weighted", None)]
)
def test_the_robust_combination_keeps_honest_agents_within_the_honest_range(combination, trim):
    """Degree 6, adversaries 7 apart (each honest agent keeps at most one), shifted by s = 20,
    kept by the oracle rule. The median of 7 values, or the trim ⌊0.2·6⌋ = 1, leaves μ̂_a among
    the honest means it holds (X̃^(t) and X̃^(t−1)), all within zσ/√(t − 1) of μ on an event of
    probability ≥ 1 − 2·H·2·(1 − Φ(z)) = 1 − 10⁻⁶. The weighted tables, shifted by about
    s times the adversaries' share of the walks, break the bound."""
    m, t_max, sigma = 42, 200, 1.0
    bad = list(range(0, m, 7))
    data = GraphData(_circulant(m, 3), np.zeros(m, dtype=int), [0.5], sigma=sigma)
    params = {
        "rule": "oracle",
        "combination": combination,
        "adversaries": {"agents": bad, "behaviour": "shift", "shift": 20.0},
    }
    if trim is not None:
        params["trim"] = trim
    proto, _ = adversary_run("b-colme", params, data, t_max)
    honest = np.setdiff1d(np.arange(m), bad)
    z = norm.isf(1e-6 / (2 * len(honest) * 2))
    bound = z * sigma / math.sqrt(t_max - 1)
    worst = np.abs(proto.estimates()[honest] - 0.5).max()
    if combination == "weighted":
        assert worst > bound
    else:
        assert worst <= bound


@pytest.mark.parametrize(
    ("protocol", "params"),
    [
        ("b-colme", {"adversaries": {"fraction": 0.2, "behaviour": "shift", "shift": 0.1}}),
        (
            "private-b-colme",
            {
                "epsilon": 5.0,
                "adversaries": {"fraction": 0.3, "behaviour": "inflate", "factor": 4.0},
                "combination": "median",
            },
        ),
    ],
)
def test_check_modes_gives_the_same_bytes_with_adversaries_on_b_colme(protocol, params):
    check_modes(
        PROTOCOLS.get(protocol),
        params,
        topology=("regular", {"degree": 4}),
        metrics=["adversaries"],
        t_max=40,
    )
