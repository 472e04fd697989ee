"""Adversaries and the robust consensus step of C-ColME and Private-C-ColME (docs/adversaries.md,
`desim.models.ccolme.robust`): the tables refused, the shift's closed form through the mixing
weights, the robust steps' range bound, the inflated sizes in W, and bytes across delivery modes."""

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
from desim.models.ccolme.robust import RobustConsensus
from desim.testing import check_modes
from desim.topologies.graph import Graph

load_plugins()


def _circulant(m: int, reach: int) -> Graph:
    """The ring on m agents with links to the `reach` nearest on each side (degree 2·reach)."""
    u = np.repeat(np.arange(m), reach)
    v = (u + np.tile(np.arange(1, reach + 1), m)) % m
    return Graph.from_edges(m, u, v)


# ------------------------------------------------------------------------------- validation


def _validate(tmp_path: Path, capsys, table: str, protocol: str = "c-colme", extra: str = ""):
    return validate_graph_study(tmp_path, capsys, table, protocol, extra)


@pytest.mark.parametrize(
    ("table", "extra", "fragment"),
    [
        ('[adversaries]\nagents = [3, 30]\nbehaviour = "flip"', "", "30 is not an agent"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "inflate"', "", "needs factor"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "inflate"\nfactor = 0', "", "must be > 0"),
        ("", 'consensus = "trimmed"', "needs trim"),
        ("", "trim = 0.2", "reads it alone"),
        ("", 'consensus = "trimmed"\ntrim = 0.5', "trim"),
        ("", 'consensus = "mean"', "consensus"),
    ],
)
def test_validate_refuses_bad_tables_and_consensus_in_one_line(
    tmp_path, capsys, table, extra, fragment
):
    code, err = _validate(tmp_path, capsys, table, extra=extra)
    assert code != 0
    assert fragment in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("protocol", ["c-colme", "private-c-colme"])
def test_every_behaviour_is_accepted_on_the_graph_protocols(tmp_path, capsys, protocol):
    table = '[adversaries]\nfraction = 0.2\nbehaviour = "mimic"\nclass = 0'
    code, err = _validate(tmp_path, capsys, table, protocol=protocol, extra='consensus = "median"')
    assert code == 0, err


# ------------------------------------------------------------------------------- closed forms


def test_a_shift_moves_every_estimate_by_the_mixing_weights_closed_form():
    """No noise, one class, the oracle rule (W fixed, 1 − α = 1/t): adversaries reporting their
    mean + s add B^(t) = (s/t) Σ_{k<t} W^k e to the estimates (e: the adversaries' indicator),
    since t·B^(t) = s·e + W·(t − 1)·B^(t−1); W doubly stochastic makes its average f·s."""
    g = regular(40, 4, seed=1)
    data = GraphData(g, np.zeros(40, dtype=int), [0.5], sigma=0.3)
    bad, s, t_max = [3, 11, 12, 30], 2.0, 60
    base = {"rule": "oracle"}
    clean, _ = adversary_run("c-colme", base, data, t_max)
    table = {"agents": bad, "behaviour": "shift", "shift": s}
    dirty, scores = adversary_run("c-colme", {**base, "adversaries": table}, data, t_max)
    w = dirty.mixing_matrix().toarray()
    e = np.zeros(40)
    e[bad] = 1.0
    power, total = e.copy(), np.zeros(40)
    for _ in range(t_max):
        total += power
        power = w @ power
    closed = s * total / t_max
    moved = dirty.estimates() - clean.estimates()
    honest = np.ones(40, dtype=bool)
    honest[bad] = False
    np.testing.assert_allclose(moved[honest], closed[honest], rtol=1e-9)
    assert moved.mean() == pytest.approx(s * len(bad) / 40, rel=1e-9)
    # the oracle keeps every neighbour: honest agents accept the adversaries next to them
    next_to = np.bincount(g.src[np.isin(g.dst, bad)], minlength=40)[honest]
    assert scores["adversaries_accepted"] == pytest.approx(next_to.mean())
    assert scores["accepting_adversaries"] == pytest.approx(np.mean(next_to > 0))


@pytest.mark.parametrize(
    ("consensus", "trim"), [("median", None), ("trimmed", 0.2), ("weighted", None)]
)
def test_the_robust_steps_keep_honest_agents_within_the_honest_range_bound(consensus, trim):
    """Degree 6, adversaries 7 apart (each honest agent mixes at most one), shifted by s = 20,
    accepted by the oracle rule. When the step's trim (⌊β·6⌋ = 1) or the median bounds the
    adversaries mixed, v_a lies in the honest values' range, so by induction every honest
    |Y_a^(t) − μ| ≤ (1/t) Σ_s max_h |X̄_h^(s) − μ| ≤ 2zσ/√t on the event that every honest
    running mean is within zσ/√s of μ, of probability ≥ 1 − 2·H·T·(1 − Φ(z)) = 1 − 10⁻⁶.
    The weighted step, shifted by about f·s = 2.9, breaks the bound."""
    m, t_max, sigma, s = 42, 200, 1.0, 20.0
    bad = list(range(0, m, 7))
    data = GraphData(_circulant(m, 3), np.zeros(m, dtype=int), [0.5], sigma=sigma)
    params = {
        "rule": "oracle",
        "consensus": consensus,
        "adversaries": {"agents": bad, "behaviour": "shift", "shift": s},
    }
    if trim is not None:
        params["trim"] = trim
    proto, _ = adversary_run("c-colme", params, data, t_max)
    honest = np.setdiff1d(np.arange(m), bad)
    z = norm.isf(1e-6 / (2 * len(honest) * t_max))
    bound = 2 * z * sigma / math.sqrt(t_max)
    worst = np.abs(proto.estimates()[honest] - 0.5).max()
    if consensus == "weighted":
        assert worst > bound
    else:
        assert worst <= bound


def test_robust_mix_is_the_median_or_the_trimmed_mean_of_each_agents_values():
    """By hand: agent 0 holds 1 and neighbours 5, −3, 2, 9; agent 1 holds 4 and mixes nobody."""
    y, nb_y, counts = np.array([1.0, 4.0]), np.array([5.0, -3.0, 2.0, 9.0]), np.array([4, 0])
    median = RobustConsensus("median", None).mix(y, nb_y, counts)
    np.testing.assert_array_equal(median, [2.0, 4.0])
    trimmed = RobustConsensus("trimmed", 0.25).mix(y, nb_y, counts)  # drops −3 and 9
    np.testing.assert_array_equal(trimmed, [(1.0 + 5.0 + 2.0) / 3, 4.0])


def test_inflated_sizes_lower_the_adversaries_weights_in_eq_2():
    """An adversary tells |C_b|·factor: W_ab = 1/(1 + max(|C_a|, factor·|C_b|)) on the edges
    into it, 1/(1 + r) elsewhere (r-regular, the oracle keeps every neighbour)."""
    g = regular(30, 4, seed=2)
    data = GraphData(g, np.zeros(30, dtype=int), [0.5])
    table = {"agents": [5, 9], "behaviour": "inflate", "factor": 3.0}
    proto, _ = adversary_run("c-colme", {"rule": "oracle", "adversaries": table}, data, 20)
    w = proto.mixing_matrix().toarray()
    into = np.isin(g.dst, [5, 9])
    np.testing.assert_array_equal(w[g.src[into], g.dst[into]], 1.0 / (1.0 + 12.0))
    np.testing.assert_array_equal(w[g.src[~into], g.dst[~into]], 1.0 / (1.0 + 4.0))


# ------------------------------------------------------------------------------- delivery modes


@pytest.mark.parametrize(
    ("protocol", "params"),
    [
        ("c-colme", {"adversaries": {"fraction": 0.2, "behaviour": "shift", "shift": 0.1}}),
        (
            "private-c-colme",
            {
                "epsilon": 5.0,
                "adversaries": {"fraction": 0.2, "behaviour": "mimic", "class": 0},
                "consensus": "trimmed",
                "trim": 0.3,
            },
        ),
        (
            "private-c-colme",
            {
                "adversaries": {"fraction": 0.3, "behaviour": "inflate", "factor": 4.0},
                "consensus": "median",
            },
        ),
    ],
)
@pytest.mark.slow
def test_check_modes_gives_the_same_bytes_with_adversaries_on_a_graph(protocol, params):
    check_modes(
        PROTOCOLS.get(protocol),
        params,
        topology=("regular", {"degree": 4}),
        metrics=["adversaries"],
        t_max=40,
    )
