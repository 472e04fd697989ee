"""B-ColME: against a line-by-line transcription of the authors' synchronous round, the exact
pooled estimate on a tree, its delivery modes, its privacy boundary and its errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _ccolme_helpers import Driver, GraphData, regular
from _ccolme_helpers import protocol as ccolme_protocol
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.models.ccolme.bcolme import BColME, outgoing_tables, row_sums
from desim.models.ccolme.model import confidence_radius
from desim.testing import check_modes
from desim.topologies.graph import Graph


def protocol(name: str = "b-colme", **params) -> BColME:
    """B-ColME (or the protocol `name`) with `params`."""
    return ccolme_protocol(name, **params)


# --------------------------------------------------------------------------------------------
# the authors' round, transcribed


def authors_round(graph: Graph, samples: np.ndarray, sigma: float, delta: float, up_to: int):
    """Estimates of every round, computed as Galante et al.'s `belief_propagation_v1` loop and
    `NodeB` do (curr/new copies of means, β, flags and variable-length table rows), in float64.
    Round `it` (0-based) has it + 1 samples; desim's slot t is round t − 1."""
    n = graph.n
    nbrs = [list(graph.dst[graph.indptr[a] : graph.indptr[a + 1]]) for a in range(n)]
    gamma = delta / (4 * max(graph.n_directed, 1))  # as desim: an empty graph tests nothing
    curr_mean = samples[0].astype(float).copy()
    curr_beta = np.full(n, math.inf)
    curr_opt = [[True] * len(nbrs[a]) for a in range(n)]
    curr_tab = [[[] for _ in nbrs[a]] for a in range(n)]  # rows of (value, count)
    out = [curr_mean.copy()]
    for it in range(1, len(samples)):
        ns = it + 1
        new_mean = curr_mean * ((ns - 1) / ns) + samples[it] / ns
        new_beta = np.array([confidence_radius(ns, sigma**2, gamma)] * n, dtype=float)
        new_opt = [row[:] for row in curr_opt]
        new_tab = [[row[:] for row in rows] for rows in curr_tab]
        for a in range(n):
            for i, b in enumerate(nbrs[a]):
                if not curr_opt[a][i]:  # irrevocable
                    continue
                dist = abs(new_mean[a] - curr_mean[b]) - new_beta[a] - curr_beta[b]
                new_opt[a][i] = dist <= 0
                if not new_opt[a][i]:
                    new_tab[a][i] = []
            for i, b in enumerate(nbrs[a]):
                if not new_opt[a][i]:
                    continue
                row = [(curr_mean[b], 1)]
                check = [j for j, c in enumerate(nbrs[b]) if c != a and curr_opt[b][j]]
                depth = 1
                while check and depth < up_to - 1:
                    check = [j for j in check if len(curr_tab[b][j]) > depth - 1]
                    if not check:
                        break
                    v = sum(curr_tab[b][j][depth - 1][0] for j in check)
                    c = sum(curr_tab[b][j][depth - 1][1] for j in check)
                    row.append((v, c))
                    depth += 1
                new_tab[a][i] = row
        curr_mean, curr_beta, curr_opt, curr_tab = new_mean, new_beta, new_opt, new_tab
        est = np.empty(n)
        for a in range(n):
            num, den = (it + 1) * new_mean[a], it + 1
            for row in new_tab[a]:
                for k, (v, c) in enumerate(row):
                    num += v * (it - k)
                    den += c * (it - k)
            est[a] = num / den
        out.append(est)
    return np.array(out)


@given(
    n=st.integers(4, 14),
    p=st.floats(0.2, 0.6),
    up_to=st.integers(2, 6),
    gap=st.floats(0.0, 3.0),
    seed=st.integers(0, 10**6),
)
@settings(max_examples=25, deadline=None)
def test_every_estimate_is_the_authors_round(n, p, up_to, gap, seed):
    """On any graph, for any depth κ and class gap, every estimate of every slot is the one the
    authors' synchronous round computes (float64 against float64: to 1e-12 relative)."""
    rng = np.random.default_rng(seed)
    u, v = np.triu_indices(n, 1)
    pick = rng.random(len(u)) < p
    graph = Graph.from_edges(n, u[pick], v[pick])
    classes = rng.integers(0, 2, n)
    data = GraphData(graph, classes, [0.0, gap], sigma=1.0)
    samples = data.sample(rng, 40)
    expect = authors_round(graph, samples, 1.0, 0.1, up_to)
    d = Driver(protocol(up_to=up_to), data)
    got = np.array([d.slot(t, samples[t - 1]) for t in range(1, 41)])
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)


def test_on_a_tree_of_one_class_the_estimate_pools_every_agent_within_reach():
    """A path 0–1–…–7 of one class with constant samples x_i = i: non-backtracking paths on a
    tree reach each agent within κ − 1 hops once, the one d hops away with t − d samples, so
    μ̂_a = Σ_i (t − d_ai) x_i / Σ_i (t − d_ai) over d_ai ≤ κ − 1 (once t > κ − 1)."""
    n, up_to = 8, 4
    graph = Graph.from_edges(n, np.arange(n - 1), np.arange(1, n))
    data = GraphData(graph, np.zeros(n, dtype=int), [0.0])
    d = Driver(protocol(up_to=up_to, rule="oracle"), data)
    x = np.arange(n, dtype=float)
    for t in range(1, 12):
        est = d.slot(t, x)
    dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    w = np.where(dist <= up_to - 1, t - dist, 0.0)
    np.testing.assert_allclose(est, w @ x / w.sum(axis=1), rtol=1e-14)


def test_outgoing_tables_leave_out_what_came_from_the_receiver():
    """Star 0–{1,2,3}: agent 0 sends 1 the sums of what it holds from 2 and 3 only."""
    graph = Graph.from_edges(4, [0, 0, 0], [1, 2, 3])
    held = np.zeros((2, graph.n_directed))  # what a = src[s] holds about b = dst[s]
    for e, (a, b) in enumerate(zip(graph.src, graph.dst, strict=True)):
        held[:, e] = [10.0 * b + a, 100.0 * b]
    out = outgoing_tables(graph.indptr, graph.dst, graph.reverse, held)
    s10 = np.flatnonzero((graph.src == 1) & (graph.dst == 0))[0]  # 1's slot for 0
    assert out[0, s10] == 20.0 + 30.0 and out[1, s10] == 500.0
    sums = row_sums(graph.indptr, held)
    assert sums.shape == (2, 4) and sums[0, 0] == 10 + 20 + 30


def test_dropped_neighbours_stay_dropped_and_classes_separate():
    """Two classes far apart on a 6-regular graph: every cross link is dropped, no same-class
    link is (δ = 0.1 over few links), and the estimates approach their class means."""
    graph = regular(60, 6, seed=1)
    classes = np.arange(60) % 2
    data = GraphData(graph, classes, [0.0, 10.0], sigma=1.0)
    d = Driver(protocol(), data)
    rng = np.random.default_rng(5)
    for t in range(1, 200):
        est = d.slot(t, data.sample(rng, 1)[0])
    a, b, kept = d.proto.neighbour_decisions()
    same = classes[a] == classes[b]
    assert not kept[~same].any() and kept[same].all()
    # ≥ 1 + 6 + 30 agents' samples pooled: sd ≤ 1/sqrt(37·150); 6 sd
    assert np.all(np.abs(est - data.means) < 6 / math.sqrt(37 * 150))


def test_modes_give_the_same_bytes():
    """Windows against one message per instant, on random latencies, losses and outages."""
    runs = check_modes(BColME, {}, topology=("regular", {"degree": 4}), t_max=60)
    assert all("windows" in modes for modes in runs)


def test_private_b_colme_sends_only_privatised_values():
    """Two runs with different raw data but the same privatised samples send the same bytes;
    every sample is one Laplace release of multiplier 1/ε."""
    graph = regular(20, 4, seed=2)
    data = GraphData(graph, np.arange(20) % 2, [0.0, 1.0], sigma=0.5)
    private = np.random.default_rng(3).standard_normal((15, 20))
    sent = []
    for shift in (0.0, 1.0):
        proto = protocol("private-b-colme", epsilon=1.0)
        d = Driver(proto, data, seed=9)
        log: list[np.ndarray] = []
        proto.ctx.send = lambda kind, src, dst, payload, log=log, d=d: (
            log.append(payload.copy()),
            d.send(kind, src, dst, payload),
        )
        for t in range(1, 15):
            proto.privatise = lambda x, t=t: private[t]  # X + Z, whatever X was
            d.slot(t, data.means + shift)
        sent.append(np.concatenate(log))
    np.testing.assert_array_equal(sent[0], sent[1])
    spend = proto.privacy_spend()  # one Laplace release per sample, multiplier b/2L = 1/ε
    for name in ("one", "all"):
        multiplier, count = spend.against[name]
        assert multiplier == pytest.approx(1.0) and np.all(count == 1)


def test_a_graph_of_the_wrong_size_is_refused():
    graph = regular(10, 2)
    data = GraphData(regular(12, 2), np.zeros(12, dtype=int), [0.0])
    data.public["graph"] = graph
    with pytest.raises(ValueError, match="the graph has 10 agents, the data 12"):
        Driver(protocol(), data)
