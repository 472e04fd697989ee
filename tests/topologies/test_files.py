"""Graphs from data: a graph file's node ids matched to a table's agent ids (edge list, GraphML,
the county adjacency layout), unmatched ids reported at validate and in the run record, bad
files refused in one line, the file's sha256 in the config hash; and the bundled US county
adjacency (counts, symmetry, the two Minnesota counties it lacks)."""

from __future__ import annotations

import gzip
import json
import tomllib

import networkx as nx
import numpy as np
import pytest

from desim.kernel.fingerprint import sha256_file as sha256_of
from desim.models.table import TableData
from desim.study.cli import main
from desim.study.spec import load_study
from desim.study.spec.limits import horizon, study_sizes
from desim.study.spec.parse import parse_study
from desim.topologies.files import COUNTIES, FromFile, id_key, read_graph

STUDY = """\
[study]
title = "graph from data"
seed = 3
replicates = 1
t_max = 12
checkpoints = 4

[data]
model = "table"
file = "data.csv"

[topology]
model = "file"
{topology}

[[scenario]]
name = "c-colme"
protocol = "c-colme"
"""

#: Agents a, b, c, d with 3 rows each.
CSV = "agent,value\n" + "".join(f"{a},{v}\n" for a in "abcd" for v in (0.0, 1.0, 0.5))


def study(tmp_path, graph="a b\nb c\nx a\n", name="g.txt", csv=CSV, **keys):
    """A study folder: `csv` as data.csv, `graph` as the graph file `name`, [topology] `keys`."""
    folder = tmp_path / "s"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.csv").write_text(csv)
    if graph is not None:
        path = folder / name
        path.write_bytes(graph) if isinstance(graph, bytes) else path.write_text(graph)
    keys = {"path": name, **keys}
    topology = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items() if v is not None)
    (folder / "study.toml").write_text(STUDY.format(topology=topology))
    return folder


def built(folder, **keys):
    """(the run's data source, its graph) of the study's table and a `FromFile(**keys)`."""
    data = TableData(file=str(folder / "data.csv")).make(np.random.default_rng(0))
    graph = FromFile(**keys).build_on(data, np.random.default_rng(0))
    return data, graph


def test_unmatched_ids_are_reported_at_validate_and_in_the_run_record(tmp_path, capsys, no_figures):
    folder = study(tmp_path)
    assert main(["validate", str(folder)]) == 0
    err = capsys.readouterr().err
    report = (
        "g.txt: 1 of 4 agents have no node (isolated: 'd'); "
        "1 of 4 nodes have no agent (dropped: 'x')"
    )
    assert f"note: [topology]: {report}" in err
    assert main(["run", str(folder), "--no-progress"]) == 0
    side = json.loads(next((folder / "results" / "runs").glob("*.json")).read_text())
    assert f"GraphMatchWarning: {report}" in side["warnings"]


def test_isolate_keeps_an_agent_without_node_and_drop_removes_it(tmp_path):
    folder = study(tmp_path)
    data, graph = built(folder, path=str(folder / "g.txt"))
    assert data.n_agents == 4 and graph.n == 4
    assert sorted(zip(*graph.links(), strict=True)) == [(0, 1), (1, 2)]  # a–b, b–c; d alone
    data, graph = built(folder, path=str(folder / "g.txt"), unmatched="drop")
    assert data.public["agent_ids"] == ["a", "b", "c"] and graph.n == data.n_agents == 3
    assert len(data.means) == len(data.public["sigma2"]) == len(data.classes) == 3
    assert data.sample(np.random.default_rng(0), 4).shape == (4, 3)


def test_dropping_agents_keeps_the_others_streams_and_facts(tmp_path):
    csv = "agent,value\n" + "a,0\na,2\nb,10\nb,-10\nc,4\nc,6\n"
    folder = study(tmp_path, graph="a c\n", csv=csv)
    data, _ = built(folder, path=str(folder / "g.txt"), unmatched="drop")
    assert data.public["agent_index"] == {"a": 0, "c": 1}
    np.testing.assert_array_equal(data.means, [1.0, 5.0])
    np.testing.assert_array_equal(data.public["sigma2"], [1.0, 1.0])
    assert data.public["L"] == 3.0  # half the range of the kept agents' values (0 … 6)
    np.testing.assert_array_equal(data.sample(None, 3), [[0, 4], [2, 6], [0, 4]])


def test_graphml_and_county_layout_match_by_id(tmp_path):
    g = nx.Graph([("c", "a"), ("a", "d")])
    folder = study(tmp_path, graph=None)
    nx.write_graphml(g, folder / "g.graphml")
    _, graph = built(folder, path=str(folder / "g.graphml"))
    assert sorted(zip(*graph.links(), strict=True)) == [(0, 2), (0, 3)]
    county = '"A"\ta\t"B"\tb\n\t\t"C"\tc\n"D"\td\t"D"\td\n'
    (folder / "c.txt").write_text(county)
    _, graph = built(folder, path=str(folder / "c.txt"), format="county-adjacency")
    assert sorted(zip(*graph.links(), strict=True)) == [(0, 1), (0, 2)] and graph.degree[3] == 0


def test_fips_codes_match_integer_agent_ids_on_the_bundled_file(tmp_path, capsys):
    # a CSV's 01001 is read as the integer 1001; the county file's "01001" compares equal.
    # Autauga (01001), Chilton (01021) and Elmore (01051), AL, border each other.
    fips = ("01001", "01021", "01051")
    csv = "agent,value\n" + "".join(f"{f},{v}\n" for f in fips for v in (0, 1))
    folder = study(tmp_path, graph=None, csv=csv, path=None, format="county-adjacency")
    data, graph = built(folder, format="county-adjacency")
    assert data.public["agent_ids"] == [1001, 1021, 1051]
    assert sorted(zip(*graph.links(), strict=True)) == [(0, 1), (0, 2), (1, 2)]
    assert main(["validate", str(folder)]) == 0
    err = capsys.readouterr().err
    assert "county_adjacency.txt.gz: 3229 of 3232 nodes have no agent (dropped: '01047'," in err
    assert id_key("01001") == id_key(1001) == 1001 and id_key("a01") == "a01"


@pytest.mark.parametrize(
    "graph, keys, message",
    [
        ("x y\ny z\n", {}, "g.txt: no node id matches an agent id (nodes: 'x', 'y', 'z'"),
        ("", {}, "the file is empty"),
        ("a b\n", {"format": "graphml"}, "g.txt: not a GraphML file"),
        ("<?xml version='1.0'?><graphml/>", {}, "looks like XML (GraphML?): set format"),
        ("a\tA\tb\n", {"format": "county-adjacency"}, "g.txt:1: 'a\\tA\\tb': expected 4 fields"),
        ("a b\nc c\n", {}, "g.txt:2: self-loop c–c"),
        ("a 7\nb 007\n", {}, "node ids '7' and '007' are the same id"),
        (b"\x1f\x8b\x08junk", {}, "g.txt: a damaged gzip file"),
        ("a b\n".encode("utf-16"), {}, "not UTF-8 text"),
    ],
)
def test_bad_graph_files_are_refused_in_one_line(tmp_path, capsys, graph, keys, message):
    folder = study(tmp_path, graph=graph, **keys)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_graph_file_outside_the_folder_through_a_link_is_refused(tmp_path, capsys):
    outside = tmp_path / "elsewhere.txt"
    outside.write_text("a b\n")
    folder = study(tmp_path, graph=None, name="g.txt")
    (folder / "g.txt").symlink_to(outside)
    assert main(["validate", str(folder)]) == 2
    assert "leads out of the study folder" in capsys.readouterr().err


def test_the_graph_files_sha256_is_in_the_config_hash(tmp_path):
    folder = study(tmp_path)
    before = load_study(folder).runs[0]
    assert len(before.scenario.topology["sha256"]) == 64
    (folder / "g.txt").write_text("a b\nb c\nc d\n")
    assert load_study(folder).runs[0].config_hash != before.config_hash
    bundled = study(tmp_path / "b", graph=None, path=None, format="county-adjacency")
    topology = load_study(bundled).runs[0].scenario.topology
    assert topology["sha256"] == sha256_of(COUNTIES)


def test_a_graph_file_changed_after_expansion_is_refused_at_run(tmp_path):
    folder = study(tmp_path)
    with pytest.raises(ValueError, match="changed since the study was expanded"):
        built(folder, path=str(folder / "g.txt"), sha256="0" * 64)


def test_county_names_need_a_population_with_ids():
    with pytest.raises(ValueError, match="names counties"):
        FromFile(format="county-adjacency").check(10)


def test_the_bundled_county_adjacency_is_symmetric_with_the_documented_counts():
    graph = read_graph(COUNTIES, "county-adjacency")
    assert len(graph.nodes) == 3232 and len(set(graph.nodes)) == 3232
    assert all(len(f) == 5 and f.isdigit() for f in graph.nodes)
    pairs = set(zip(graph.u.tolist(), graph.v.tolist(), strict=True))
    assert all((b, a) in pairs for a, b in pairs)  # every link listed from both sides
    assert len(pairs) == 2 * 9476
    degree = np.bincount(graph.u, minlength=3232)
    assert (degree == 0).sum() == 10  # islands, listed as their own neighbour
    # Otter Tail (27111) and Watonwan (27165), Minnesota, have no entry in the source
    assert "27111" not in graph.nodes and "27165" not in graph.nodes
    with gzip.open(COUNTIES, "rt", encoding="utf-8") as fh:
        assert fh.readline().startswith('"Autauga County, AL"\t01001\t')


def test_warnings_name_the_file_not_its_absolute_path(tmp_path, no_figures):
    folder = study(tmp_path)
    assert main(["run", str(folder), "--no-progress"]) == 0
    side = (next((folder / "results" / "runs").glob("*.json"))).read_text()
    assert "TopologyWarning: graph file 'g.txt': the graph is disconnected" in side
    assert str(tmp_path) not in side


def test_size_estimates_count_the_graph_files_links(tmp_path):
    folder = study(tmp_path)
    file = folder / "study.toml"
    doc = parse_study(tomllib.loads(file.read_text()), file)
    sizes = study_sizes(horizon(doc, False), doc)
    assert sizes.agents == 4 and sizes.edges == 6  # 3 lines of the file, both directions
