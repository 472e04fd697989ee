"""[topology] tables, topology grids, [study] metrics and curves that receive the topology."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from desim.kernel.params import ConfigError
from desim.study.results import run_study
from desim.study.spec import load_study

ROOT = Path(__file__).resolve().parents[2]

STUDY = """
[study]
title = "consensus toy"
seed = 3
replicates = 2
t_max = 60
checkpoints = 5
metrics = ["accuracy", "links", "corollary1"]

[data]
model = "classes"
agents = 24
class_means = [0.0, 1.0]

[topology]
model = "regular"
degree = 4

[defaults]
epsilon = 2.0

[[scenario]]
name = "private"
protocol = "private-c-colme"

[[scenario]]
name = "galante"
protocol = "c-colme"

[[scenario]]
name = "local"
protocol = "local"

[[curve]]
name = "ideal"
kind = "ideal-component"
draws = 5

[[curve]]
name = "theorem 1"
kind = "consensus-oracle"
draws = 5

[grid]
"topology.degree" = [3, 4]
"""


def write(folder: Path, text: str = STUDY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.toml").write_text(textwrap.dedent(text))
    return folder


def test_topology_table_grid_metrics_and_curves(tmp_path: Path):
    study = load_study(write(tmp_path / "s"))
    assert study.grid_columns == {"topology.degree": "degree"}
    assert len(study.runs) == 3 * 2 * 2
    degrees = {r.scenario.topology["degree"] for r in study.runs}
    assert degrees == {3, 4}
    assert all(r.scenario.metrics == ("accuracy", "links", "corollary1") for r in study.runs)
    assert [j.params.topology["degree"] for j in study.curve_jobs] == [3, 4, 3, 4]
    assert study.curve_jobs[2].params.epsilon == 2.0  # [defaults] reach curves


def test_study_runs_the_same_with_one_or_two_workers(tmp_path: Path):
    frames = []
    for workers in (1, 2):
        study = load_study(write(tmp_path / f"w{workers}"))
        summary = run_study(study, workers=workers, progress=False)
        assert summary.ok, summary.failures
        frames.append(pd.read_parquet(study.results_dir / "metrics.parquet"))
    assert frames[0].to_csv().encode() == frames[1].to_csv().encode()
    m = frames[0]
    assert {"within_0.1", "wrong_kept", "cor1_rhs", "cor1_holds"} <= set(m.metric)
    local = m[m.scenario == "local"]
    assert "wrong_kept" not in set(local.metric)  # local exposes no neighbour decisions
    assert "cor1_rhs" in set(local.metric)
    # every protocol of a grid point sees the same graph: the same Corollary-1 bound
    rhs = m[m.metric == "cor1_rhs"].groupby(["degree", "replicate"]).value.nunique()
    assert (rhs == 1).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (('model = "regular"\ndegree = 4', "degree = 4"), "[topology]: model is required"),
        (
            ('model = "regular"\ndegree = 4', 'model = "regulr"\ndegree = 4'),
            "unknown topology 'regulr' (did you mean 'regular'?)",
        ),
        (("degree = 4\n", "degree = 4\nwidth = 3\n"), "topology: unknown key 'width'"),
        (
            ('"topology.degree" = [3, 4]', '"topology.degree" = [3, 24]'),
            "grid point degree = 24: topology: degree = 24: an r-regular graph on M = 24",
        ),
        (
            ('"topology.degree" = [3, 4]', '"topology.degre" = [3, 4]'),
            "unknown key 'degre' (did you mean 'degree'?)",
        ),
        (
            ('metrics = ["accuracy", "links", "corollary1"]', 'metrics = ["acuracy"]'),
            "unknown metric 'acuracy' (did you mean 'accuracy'?)",
        ),
    ],
)
def test_bad_topology_or_metrics_are_one_line_errors(tmp_path: Path, change, message):
    old, new = change
    assert old in STUDY
    folder = write(tmp_path / "bad", STUDY.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_study(folder)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_grid_on_topology_needs_a_topology_table(tmp_path: Path):
    text = STUDY.replace('[topology]\nmodel = "regular"\ndegree = 4\n', "")
    text = text.replace('protocol = "private-c-colme"', 'protocol = "local"')
    text = text.replace('protocol = "c-colme"', 'protocol = "ideal"')
    text = text.replace("[defaults]\nepsilon = 2.0\n", "")
    text = text.split("[[curve]]")[0] + '[grid]\n"topology.degree" = [3, 4]\n'
    with pytest.raises(ConfigError, match="no \\[topology\\] table to sweep"):
        load_study(write(tmp_path / "s", text))


def test_graph_file_path_is_relative_to_the_study_folder(tmp_path: Path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "ring.txt").write_text("\n".join(f"{i} {(i + 1) % 24}" for i in range(24)))
    text = STUDY.replace('model = "regular"\ndegree = 4', 'model = "file"\npath = "ring.txt"')
    text = text.split("[grid]")[0]
    study = load_study(write(folder, text))
    # kept relative (no absolute path in the config hash), read from the scenario's folder
    s = study.runs[0].scenario
    assert s.topology["path"] == "ring.txt" and s.folder == str(folder.resolve())
    missing = text.replace("ring.txt", "nowhere.txt")
    with pytest.raises(ConfigError, match="nowhere.txt'?: no such graph file"):
        load_study(write(tmp_path / "m", missing))


def test_existing_studies_keep_their_config_hashes():
    """Scenario fields added for topologies and metrics leave older studies resumable."""
    manifest = ROOT / "studies" / "colme-fig2" / "results" / "manifest.json"
    if not manifest.is_file():
        pytest.skip("no committed colme-fig2 results")
    recorded = {r["run_id"]: r["config_hash"] for r in json.loads(manifest.read_text())["runs"]}
    study = load_study(ROOT / "studies" / "colme-fig2")
    assert {r.run_id: r.config_hash for r in study.runs} == recorded
