"""The ``table`` data model: agents' streams read from a CSV or parquet file, end to end through
the `desim` command on real files (bad files refused in one line before anything runs, the
file's sha256 in the run record and in the config hash, the same bytes with 1 and 2 workers,
the local mean of a cycled stream in closed form)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from desim.models.table import TableData
from desim.study.cli import main

STUDY = """\
[study]
title = "table"
seed = 3
replicates = {replicates}
t_max = {t_max}
checkpoints = 6

[data]
model = "table"
file = "{file}"
{extra}

[[scenario]]
name = "{protocol}"
protocol = "{protocol}"
"""

#: Agents 'b' (4 rows, given out of time order) and 'a' (3 rows); truth per agent.
CSV = """\
agent,value,order,truth
b,4.0,3,2.0
a,1.0,1,0.5
b,1.0,0,2.0
a,0.0,2,0.5
b,2.0,1,2.0
a,3.0,0,0.5
b,0.0,2,2.0
"""
#: Each agent's stream in time order (agents in sorted id order: a, b).
STREAMS = [[3.0, 1.0, 0.0], [1.0, 2.0, 0.0, 4.0]]


def study(tmp_path, text=CSV, file="data.csv", protocol="local", t_max=20, replicates=1, **kw):
    """A study folder reading `text` as its data file; `kw` are extra [data] keys."""
    folder = tmp_path / "s"
    folder.mkdir(parents=True, exist_ok=True)
    if text is not None:
        path = folder / file
        path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    extra = "\n".join(f"{k} = {json.dumps(v)}" for k, v in kw.items())
    (folder / "study.toml").write_text(
        STUDY.format(
            file=file,
            extra=extra,
            protocol=protocol,
            t_max=t_max,
            replicates=replicates,
        )
    )
    return folder


def refused(folder, capsys) -> str:
    """The one line `desim validate` prints for a refused study (nothing run)."""
    assert main(["validate", str(folder)]) != 0
    err = capsys.readouterr().err.strip()
    assert not (folder / "results").exists()
    assert "Traceback" not in err
    return err


def test_local_mean_of_a_cycled_stream_is_its_closed_form(tmp_path, no_figures):
    folder = study(tmp_path, exhausted="cycle", truth="column")
    assert main(["run", str(folder), "--no-progress"]) == 0
    m = pd.read_parquet(folder / "results" / "metrics.parquet").query("metric == 'mse'")
    assert len(m) >= 5
    for t, mse in zip(m.t.astype(int), m.value, strict=True):
        local = cycled_sums(t) / t  # each agent's mean of its first t cycled samples
        assert mse == pytest.approx(np.mean((local - np.array([0.5, 2.0])) ** 2), rel=1e-12)


def cycled_sums(t: int) -> np.ndarray:
    """Each agent's sum of its first t cycled samples."""
    return np.array([(t // len(x)) * sum(x) + sum(x[: t % len(x)]) for x in STREAMS])


def test_ideal_mean_of_one_class_of_cycled_streams_is_its_closed_form(tmp_path, no_figures):
    one_class = CSV.replace("order,truth\n", "order,truth,class\n").replace(",2.0\n", ",2.0,k\n")
    one_class = one_class.replace(",0.5\n", ",0.5,k\n")
    folder = study(tmp_path, one_class, protocol="ideal", truth="column")
    assert main(["run", str(folder), "--no-progress"]) == 0
    m = pd.read_parquet(folder / "results" / "metrics.parquet").query("metric == 'mse'")
    assert len(m) >= 5
    for t, mse in zip(m.t.astype(int), m.value, strict=True):
        pooled = cycled_sums(t).sum() / (2 * t)  # both agents: the mean of the class's samples
        expected = np.mean((pooled - np.array([0.5, 2.0])) ** 2)
        assert mse == pytest.approx(expected, rel=1e-12)


def test_truth_mean_is_the_agents_full_data_mean(tmp_path):
    source = TableData(file=str(study(tmp_path) / "data.csv")).make(np.random.default_rng(0))
    assert source.means == pytest.approx([4 / 3, 7 / 4])
    assert source.public["agent_ids"] == ["a", "b"]
    assert source.public["agent_index"] == {"a": 0, "b": 1}
    assert source.sample(np.random.default_rng(0), 4)[:, 1].tolist() == STREAMS[1]


def test_a_parquet_file_gives_the_streams_of_the_same_csv(tmp_path):
    folder = study(tmp_path)
    pd.read_csv(folder / "data.csv").to_parquet(folder / "data.parquet")
    rng = np.random.default_rng(0)
    csv = TableData(file=str(folder / "data.csv")).make(rng).sample(rng, 9)
    parquet = TableData(file=str(folder / "data.parquet")).make(rng).sample(rng, 9)
    assert np.array_equal(csv, parquet)


def test_resampled_streams_do_not_depend_on_block_sizes(tmp_path):
    spec = TableData(file=str(study(tmp_path) / "data.csv"), exhausted="resample")
    one, two = spec.make(None), spec.make(None)
    rng1, rng2 = np.random.default_rng(5), np.random.default_rng(5)
    whole = one.sample(rng1, 12)
    split = np.vstack([two.sample(rng2, 5), two.sample(rng2, 7)])
    assert np.array_equal(whole, split)
    assert whole[:3, 0].tolist() == STREAMS[0]  # its own rows first, then resampled ones
    assert set(whole[3:, 0]) <= set(STREAMS[0])


@pytest.mark.parametrize(
    ("text", "file", "expected"),
    [
        ("agent,x\na,1\n", "data.csv", "missing column 'value'"),
        ("agent,value\na,1\na,abc\n", "data.csv", "cannot be read as csv"),
        ("agent,value\na,1\na,nan\n", "data.csv", "NaN or infinite"),
        ("agent,value\na,1\na,inf\n", "data.csv", "NaN or infinite"),
        ("agent,value\na,1\na,\n", "data.csv", "empty values"),
        ("agent,value,class\na,1,x\na,2,y\n", "data.csv", "'class' differs within agent 'a'"),
        ("", "data.csv", "empty (0 bytes)"),
        ("agent,value\na,1\n", "data.parquet", "not a parquet file"),
        (b"PAR1\x00\x01binary", "data.csv", "not a CSV text file"),
    ],
)
def test_bad_files_are_refused_in_one_line_before_anything_runs(
    tmp_path, capsys, text, file, expected
):
    err = refused(study(tmp_path, text, file), capsys)
    assert expected in err and file in err
    assert len(err.splitlines()) <= 2  # the line, and at most desim's summary of it


def test_an_agent_with_no_rows_is_refused(tmp_path, capsys):
    folder = study(tmp_path, None, "data.parquet")
    agents = pd.Categorical(["a", "a", "c"], categories=["a", "b", "c"])
    pd.DataFrame({"agent": agents, "value": [1.0, 2.0, 3.0]}).to_parquet(folder / "data.parquet")
    assert "agent 'b' has no rows" in refused(folder, capsys)


def test_a_file_outside_the_folder_through_a_link_is_refused(tmp_path, capsys):
    outside = tmp_path / "elsewhere.csv"
    outside.write_text(CSV)
    folder = study(tmp_path, None)
    (folder / "data.csv").symlink_to(outside)
    assert "leads out of the study folder" in refused(folder, capsys)


def test_class_protocols_and_metrics_need_a_class_column(tmp_path, capsys):
    err = refused(study(tmp_path, protocol="ideal"), capsys)
    assert "add a 'class' column" in err
    with_classes = CSV.replace("order,truth", "order,truth,class").replace("\n", ",k\n")
    with_classes = with_classes.replace("order,truth,class,k", "order,truth,class")
    assert main(["validate", str(study(tmp_path, with_classes, protocol="ideal"))]) == 0


def test_stop_beyond_the_shortest_stream_is_refused_for_protocols_that_need_every_sample(
    tmp_path, capsys
):
    err = refused(study(tmp_path, exhausted="stop", t_max=4, protocol="private-colme"), capsys)
    assert "agent 'a' has 3 rows but t_max = 4" in err
    assert "those that can stop sampling: " in err and "local" in err and "eb-gaussian" in err
    assert main(["validate", str(study(tmp_path, exhausted="stop", t_max=3))]) == 0
    assert main(["validate", str(study(tmp_path, exhausted="stop", t_max=4))]) == 0  # local


def _stopped(protocol, t_max=10, text=CSV, **data):
    """`protocol` run to `t_max` on the streams of `text` with ``exhausted = "stop"``."""
    from desim.kernel.engine import Simulation
    from desim.kernel.randomness import Streams

    source = TableData(file=str(text), exhausted="stop", **data).make(None)
    Simulation(protocol, source, t_max, Streams(1, 0, 1, 2), checkpoints=np.array([t_max])).run()
    return protocol, source


def test_an_agent_that_stops_sampling_keeps_the_mean_of_the_samples_it_had(tmp_path):
    from desim.models.baselines import Local, NoParams

    (tmp_path / "d.csv").write_text(CSV)
    local, source = _stopped(Local(NoParams()), text=tmp_path / "d.csv")
    assert source.stops_before(10) and not source.stops_before(3)
    np.testing.assert_array_equal(local.counts, [3, 4])
    np.testing.assert_array_equal(local.estimates(), [sum(s) / len(s) for s in STREAMS])


def test_ideal_pools_every_sample_its_class_took_when_agents_stop(tmp_path):
    from desim.models.baselines import Ideal, NoParams

    rows = CSV.replace("order,truth", "order,truth,class").splitlines()
    text = "\n".join([rows[0], *(r + ",0" for r in rows[1:]), "c,9.0,0,1.0,1", ""])
    (tmp_path / "d.csv").write_text(text)
    ideal, _ = _stopped(Ideal(NoParams()), text=tmp_path / "d.csv")
    pooled = sum(map(sum, STREAMS)) / sum(map(len, STREAMS))  # 11 / 7
    np.testing.assert_allclose(ideal.estimates(), [pooled, pooled, 9.0], rtol=1e-15)


def test_the_server_protocols_upload_each_agents_own_count_when_it_stops(
    tmp_path, capsys, no_figures
):
    from desim.kernel.params import build
    from desim.kernel.registry import PROTOCOLS

    (tmp_path / "d.csv").write_text(CSV)
    cls = PROTOCOLS.get("eb-gaussian")
    eb, _ = _stopped(cls(build(cls.Params, {}, "eb")), text=tmp_path / "d.csv")
    np.testing.assert_array_equal(eb.counts, [3, 4])
    np.testing.assert_array_equal(eb.sums, [sum(s) for s in STREAMS])
    folder = study(tmp_path, exhausted="stop", t_max=5, protocol="eb-gaussian")
    assert main(["run", str(folder), "--no-progress"]) == 0
    assert "stop sampling (shortest: 'a', 3 rows)" in capsys.readouterr().err + "".join(
        json.loads(p.read_text())["warnings"][0]
        for p in (folder / "results" / "runs").glob("*.json")
    )


def test_pm_uploads_are_refused_when_agents_stop_sampling(tmp_path, capsys):
    folder = study(tmp_path, exhausted="stop", t_max=5, protocol="eb-gaussian")
    toml = (folder / "study.toml").read_text()
    (folder / "study.toml").write_text(toml + 'mechanism = "pm1"\nepsilon = 1.0\n')
    err = refused(folder, capsys)
    assert "mechanism = 'pm1': agents that stop sampling" in err


def test_the_engine_refuses_stopped_samples_for_a_protocol_that_needs_every_one(tmp_path):
    from desim.kernel.engine import Simulation
    from desim.kernel.params import build
    from desim.kernel.randomness import Streams
    from desim.kernel.registry import PROTOCOLS

    (tmp_path / "d.csv").write_text(CSV)
    source = TableData(file=str(tmp_path / "d.csv"), exhausted="stop").make(None)
    cls = PROTOCOLS.get("private-colme")
    with pytest.raises(ValueError, match="needs a sample every slot"):
        Simulation(cls(build(cls.Params, {}, "p")), source, 5, Streams(1, 0, 1, 2))


def test_the_files_sha256_is_in_the_run_record_and_editing_it_makes_results_stale(
    tmp_path, capsys, no_figures
):
    folder = study(tmp_path)
    assert main(["run", str(folder), "--no-progress"]) == 0
    side = json.loads(next((folder / "results" / "runs").glob("*.json")).read_text())
    from desim.study.store import sha256_file

    assert side["data_file"] == {"file": "data.csv", "sha256": sha256_file(folder / "data.csv")}
    capsys.readouterr()
    assert main(["run", str(folder), "--no-progress"]) == 0
    assert "0 done, 1 skipped" in capsys.readouterr().out
    (folder / "data.csv").write_text(CSV.replace("b,4.0", "b,5.0"))
    assert main(["run", str(folder), "--no-progress"]) == 0
    assert "1 done, 0 skipped" in capsys.readouterr().out


def test_same_bytes_with_one_and_two_workers(tmp_path, no_figures):
    records = []
    for workers in ("1", "2"):
        folder = study(tmp_path / workers, exhausted="resample", replicates=2)
        assert main(["run", str(folder), "--no-progress", "--workers", workers]) == 0
        runs = sorted((folder / "results" / "runs").glob("*.parquet"))
        records.append({p.name: p.read_bytes() for p in runs})
    assert records[0] == records[1] and len(records[0]) == 2


def test_a_file_changed_after_expansion_is_refused_at_run(tmp_path):
    spec = TableData(file=str(study(tmp_path) / "data.csv"), sha256="0" * 64)
    with pytest.raises(ValueError, match="changed since the study was expanded"):
        spec.make(np.random.default_rng(0))


@pytest.mark.parametrize("kind", ["local", "ideal"])
def test_a_closed_form_curve_is_refused_naming_why(tmp_path, capsys, kind):
    """A table's samples are fixed rows: no curve is their expected MSE; validate says so in
    one line (before, the study validated and its run failed in the plot)."""
    folder = study(tmp_path)
    file = folder / "study.toml"
    curve = f'\n[[curve]]\nname = "c"\nscenario = "local"\nkind = "{kind}"\n'
    file.write_text(file.read_text() + curve)
    err = refused(folder, capsys)
    assert len(err.splitlines()) == 1
    assert f"curve 'c': kind '{kind}': data model 'table' has no closed-form curves" in err
    assert "remove the [[curve]]" in err


def test_a_forgetting_rule_is_refused_where_agents_stop_sampling(tmp_path, capsys):
    folder = study(tmp_path, exhausted="stop", t_max=5)
    toml = (folder / "study.toml").read_text()
    (folder / "study.toml").write_text(toml + "forget = {window = 2}\n")
    assert "forget: agents that stop sampling" in refused(folder, capsys)
    assert main(["validate", str(study(tmp_path, exhausted="stop", t_max=3))]) == 0


def test_plain_colme_is_refused_when_an_agents_samples_never_vary(tmp_path, capsys):
    constant = "agent,value\n" + "".join(f"a,0.5\nb,{v}\n" for v in (0.1, 0.9, 0.4))
    folder = study(tmp_path, constant, protocol="private-colme", t_max=3)
    toml = (folder / "study.toml").read_text()
    (folder / "study.toml").write_text(toml + 'noise = "none"\n')
    assert "agent 'a' has known variance σ² = 0" in refused(folder, capsys)
    (folder / "study.toml").write_text(toml)  # with noise every weight is finite
    assert main(["validate", str(folder)]) == 0
