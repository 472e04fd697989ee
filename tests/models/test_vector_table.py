"""PriCER's vectors read from a file (`[data] model = "vector-table"`): the vectors a file holds
are the ones the run sees (the same results as the ``vectors`` model drawing them), R is the
study's and never the data's, and bad files are refused in one line before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from _pricer_helpers import NETWORK, Logged

import desim
from desim.kernel.engine import Simulation
from desim.kernel.fingerprint import sha256_file
from desim.kernel.params import ConfigError, build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA
from desim.models.pricer.data import VectorData
from desim.models.pricer.protocol import PricerParams
from desim.models.pricer.table import ClippedWarning, VectorTable
from desim.study.cli import main

load_plugins()

STUDY = """
[study]
title = "vectors from a file"
seed = 3
replicates = 2
t_max = 1
checkpoints = 2
metrics = ["pricer"]

[data]
{data}

[topology]
model = "regular"
degree = 3

[network]
links = "bernoulli"
p_good = 0.9
p_bad = 0.2
p_link = 0.8

[[scenario]]
name = "PriCER"
protocol = "pricer"
"""


def _frame(x: np.ndarray, ids: list) -> pd.DataFrame:
    frame = pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])])
    frame.insert(0, "agent", ids)
    return frame


def test_the_vectors_of_a_file_are_read_in_sorted_agent_order(tmp_path):
    x = np.arange(12, dtype=float).reshape(4, 3) / 100
    _frame(x, ["c", "a", "d", "b"]).to_csv(tmp_path / "v.csv", index=False)
    source = VectorTable(file=str(tmp_path / "v.csv"), radius=1.0).make(np.random.default_rng(0))
    assert source.public["agent_ids"] == ["a", "b", "c", "d"]
    np.testing.assert_array_equal(source.x, x[[1, 3, 0, 2]])
    np.testing.assert_allclose(source.means[0], x.mean(axis=0), rtol=1e-15)
    assert source.public["R"] == 1.0 and source.public["d"] == 3
    block = source.sample(np.random.default_rng(0), 5)
    assert block.shape == (5, 4, 3) and (block[4] == source.x).all()


def test_named_columns_choose_and_order_the_coordinates(tmp_path):
    frame = pd.DataFrame({"agent": [1, 2], "u": [0.1, 0.2], "w": [0.3, 0.4], "note": [7, 8]})
    frame.to_parquet(tmp_path / "v.parquet")
    spec = VectorTable(file=str(tmp_path / "v.parquet"), radius=2.0, columns=["w", "u"])
    np.testing.assert_array_equal(spec.make(None).x, [[0.3, 0.1], [0.4, 0.2]])


def _estimates(data) -> np.ndarray:
    """PriCER's server estimates over 40 rounds on `data` (the same links and noise streams)."""
    links = build(desim.network_models.links.BernoulliLinks, NETWORK, "network")
    proto = Logged(build(PricerParams, {"epsilon_low": 2.0, "trust": "ring", "trusted": 1}, "p"))
    Simulation(proto, data, 40, Streams(3, 0, 1, 2), links=links, checkpoints=np.array([40])).run()
    return np.array(proto.rounds)


def test_pricer_on_a_file_gives_the_bytes_of_the_same_vectors_drawn(tmp_path):
    drawn = VectorData(agents=5, dimension=8, radius=2.0, distribution="normal").make(
        np.random.default_rng(11)
    )
    _frame(drawn.x, [f"n{i}" for i in range(5)]).to_parquet(tmp_path / "v.parquet")
    read = VectorTable(file=str(tmp_path / "v.parquet"), radius=2.0).make(None)
    np.testing.assert_array_equal(read.x, drawn.x)
    assert _estimates(read).tobytes() == _estimates(drawn).tobytes()


def test_a_study_names_the_file_and_records_its_sha256(tmp_path):
    x = VectorData(agents=6, dimension=10, radius=1.0).draw(np.random.default_rng(2))
    _frame(x, list(range(6))).to_csv(tmp_path / "v.csv", index=False)
    (tmp_path / "study.toml").write_text(
        STUDY.format(data='model = "vector-table"\nfile = "v.csv"\nradius = 1.0')
    )
    assert main(["run", str(tmp_path), "--no-progress"]) == 0
    metrics = pd.read_parquet(tmp_path / "results" / "metrics.parquet")
    assert set(metrics.replicate) == {0, 1} and np.isfinite(metrics.value).all()
    side = json.loads(next((tmp_path / "results" / "runs").glob("*.json")).read_text())
    assert side["data_file"] == {"file": "v.csv", "sha256": sha256_file(tmp_path / "v.csv")}


@pytest.mark.parametrize(
    ("table", "write", "message"),
    [
        ({"radius": 0.0}, None, "radius = 0.0: set R > 0"),
        ({}, lambda p: _frame(np.ones((2, 2)), ["a", "b"]).to_csv(p, index=False), "longer than"),
        (
            {"radius": 9.0},
            lambda p: _frame(np.zeros((2, 2)), ["a", "a"]).to_csv(p, index=False),
            "agent 'a' has more than one row",
        ),
        (
            {"radius": 9.0, "columns": ["x0", "x7"]},
            lambda p: _frame(np.zeros((2, 2)), ["a", "b"]).to_csv(p, index=False),
            "missing column 'x7'",
        ),
        (
            {"radius": 9.0},
            lambda p: pd.DataFrame({"agent": [1], "x0": ["up"]}).to_csv(p, index=False),
            "column 'x0' is not numeric",
        ),
        (
            {"radius": 9.0},
            lambda p: pd.DataFrame({"agent": [1, 2], "x0": [0.1, np.inf]}).to_csv(p, index=False),
            "column 'x0' has NaN or infinite values",
        ),
        (
            {"radius": 9.0},
            lambda p: pd.DataFrame({"id": [1], "x0": [0.1]}).to_csv(p, index=False),
            "missing column 'agent'",
        ),
    ],
)
def test_bad_files_and_fields_are_refused_in_one_line(tmp_path, table, write, message):
    path = tmp_path / "v.csv"
    if write is not None:
        write(path)
    fields = {"file": str(path), "radius": 1.0, **table}
    with pytest.raises((ValueError, ConfigError), match=message) as err:
        build(DATA.get("vector-table"), fields, "data").make(np.random.default_rng(0))
    assert "\n" not in str(err.value)


def test_clip_scale_scales_only_the_long_vectors_to_norm_r_and_says_how_many(tmp_path):
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 2.0]])
    _frame(x, [1, 2, 3]).to_csv(tmp_path / "v.csv", index=False)
    spec = VectorTable(file=str(tmp_path / "v.csv"), radius=1.0, clip="scale")
    with pytest.warns(ClippedWarning, match=r"2 of 3 vectors .* agent 1, norm 5"):
        source = spec.make(None)
    np.testing.assert_allclose(np.linalg.norm(source.x, axis=1), [1.0, 0.5, 1.0], rtol=1e-15)
    np.testing.assert_allclose(source.x[0], [0.6, 0.8], rtol=1e-15)


def test_a_graph_file_matches_the_nodes_and_drop_keeps_the_mean_of_those_kept(tmp_path):
    from desim.topologies.files import FromFile

    x = np.array([[0.1, 0.0], [0.2, 0.0], [0.3, 0.0], [0.9, 0.0]])
    _frame(x, ["a", "b", "c", "z"]).to_csv(tmp_path / "v.csv", index=False)
    (tmp_path / "g.txt").write_text("a b\nb c\nc a\n")
    source = VectorTable(file=str(tmp_path / "v.csv"), radius=1.0).make(None)
    topology = FromFile(path=str(tmp_path / "g.txt"), unmatched="drop")
    with pytest.warns(UserWarning, match="z"):
        graph = topology.build_on(source, np.random.default_rng(0))
    assert graph.n == 3 and source.n_agents == 3 and source.public["agent_ids"] == ["a", "b", "c"]
    np.testing.assert_allclose(source.means[0], [0.2, 0.0], rtol=1e-15)


def test_size_estimates_count_the_nodes_and_coordinates_of_the_file(tmp_path):
    from desim.study.spec.limits import vector_sizes

    _frame(np.zeros((7, 5)), list(range(7))).to_csv(tmp_path / "v.csv", index=False)
    data = {"model": "vector-table", "file": "v.csv", "radius": 1.0}
    assert vector_sizes(data, tmp_path) == (7, 5)
    assert vector_sizes({**data, "columns": ["x0", "x1"]}, tmp_path) == (7, 2)
    assert vector_sizes({**data, "file": "missing.csv"}, tmp_path) == (0, 0)
