"""The ``table`` data model, what is said about it: the run record states how many agents ran
out of rows (and cycled or resampled them), and the study's size estimates count the file's
agents (read from its agent column alone) instead of taking a table for one agent."""

from __future__ import annotations

import json
import tomllib

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_table_data import CSV, study

from desim.kernel.params import ConfigError
from desim.models.table import agent_counts
from desim.study.cli import main
from desim.study.spec import load_study
from desim.study.spec.limits import check_size, horizon, table_sizes
from desim.study.spec.parse import parse_study


@pytest.mark.parametrize("exhausted, did", [("cycle", "cycle"), ("resample", "resample")])
def test_the_sidecar_says_how_many_agents_ran_out_of_rows(tmp_path, no_figures, exhausted, did):
    folder = study(tmp_path, exhausted=exhausted, t_max=4)
    assert main(["run", str(folder), "--no-progress"]) == 0
    side = json.loads(next((folder / "results" / "runs").glob("*.json")).read_text())
    assert (
        f"ExhaustedWarning: data.csv: exhausted = {exhausted!r}: 1 of 2 agents have fewer rows "
        f"than t_max = 4 and {did} their rows (shortest: 'a', 3 rows)"
    ) in side["warnings"]


def test_no_note_when_every_stream_lasts_the_run(tmp_path, no_figures):
    folder = study(tmp_path, t_max=3)
    assert main(["run", str(folder), "--no-progress"]) == 0
    side = json.loads(next((folder / "results" / "runs").glob("*.json")).read_text())
    assert not [w for w in side["warnings"] if "Exhausted" in w]


@pytest.mark.parametrize("file", ["data.csv", "data.parquet"])
def test_agent_counts_read_the_agent_column(tmp_path, file):
    folder = study(tmp_path, text=None, file=file)
    frame = pd.DataFrame({"agent": [5, 3, 5, 7, 5, 3], "value": np.arange(6.0)})
    if file.endswith(".csv"):
        frame.to_csv(folder / file, index=False)
    else:
        frame.to_parquet(folder / file)
    ids, rows = agent_counts(folder / file)
    assert ids == [3, 5, 7] and rows.tolist() == [2, 3, 1]


def test_size_estimates_use_the_tables_agent_count(tmp_path):
    many = "agent,value\n" + "".join(f"g{a:03d},{a}\n" for a in range(300))
    folder = study(tmp_path, text=many)
    doc_data = {"model": "table", "file": "data.csv"}
    assert table_sizes(doc_data, {}, folder) == (300, 300)
    assert table_sizes({"model": "classes", "agents": 9}, {}, folder) == (0, 0)
    assert load_study(folder).runs  # within every limit
    file = folder / "study.toml"
    doc = parse_study(tomllib.loads(file.read_text()), file)
    with pytest.raises(ConfigError, match="agents = 300: one run needs about"):
        check_size(horizon(doc, False), {}, 1, 1, folder)


def test_a_file_outside_the_folder_is_not_counted(tmp_path):
    folder = study(tmp_path)
    outside = tmp_path / "outside.csv"
    outside.write_text(CSV)
    (folder / "link.csv").symlink_to(outside)
    assert table_sizes({"model": "table", "file": "link.csv"}, {}, folder) == (0, 0)


@pytest.mark.parametrize("file", ["data.csv", "data.parquet"])
def test_blockwise_reading_gives_the_streams_of_a_sort_by_agent_and_order(
    tmp_path, monkeypatch, file
):
    """Small blocks and sort groups (so every agent spans several of each): each agent's
    values in increasing order, ties in file order, as pandas' stable sort gives them."""
    import desim.models.table as table

    monkeypatch.setattr(table, "_BLOCK", 256)
    monkeypatch.setattr(table, "_ROWS", 7)
    monkeypatch.setattr(table, "_GROUP", 16)
    rng = np.random.default_rng(4)
    n = 600
    agent = rng.choice([f"k{i:02d}" for i in range(23)], n)
    frame = pd.DataFrame(
        {"agent": agent, "value": rng.normal(size=n), "order": rng.integers(0, 9, n) * 1.0}
    )
    frame["class"] = [int(a[1:]) % 3 for a in agent]
    folder = study(tmp_path, text=None, file=file)
    if file.endswith(".csv"):
        frame.to_csv(folder / file, index=False)
    else:
        frame.to_parquet(folder / file)
    rows = table.read_table(folder / file, False)
    expected = frame.sort_values(["agent", "order"], kind="stable")
    assert rows.ids == sorted(set(agent))
    np.testing.assert_array_equal(rows.values, expected["value"].to_numpy())
    first = expected.groupby("agent", sort=True)["class"].first().to_numpy()
    np.testing.assert_array_equal(rows.classes, first)


def test_a_class_that_changes_in_a_later_block_is_refused(tmp_path, monkeypatch, capsys):
    import desim.models.table as table

    monkeypatch.setattr(table, "_BLOCK", 64)
    text = "agent,value,class\n" + "a,1,x\n" * 40 + "a,1,y\n"
    folder = study(tmp_path, text=text)
    assert main(["validate", str(folder)]) == 2
    assert "column 'class' differs within agent 'a'" in capsys.readouterr().err


@settings(max_examples=15, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 3), st.floats(-1e3, 1e3)),
        min_size=1,
        max_size=60,
    ),
    block=st.integers(1, 9),
    group=st.integers(1, 20),
)
def test_any_table_read_in_any_blocks_is_the_stable_sort_by_agent_and_order(
    tmp_path_factory, rows, block, group
):
    """Property: whatever the row order, ties, parquet batch and sort-group sizes, each
    agent's stream is its rows sorted by order, ties in file order."""
    import desim.models.table as table

    frame = pd.DataFrame(rows, columns=["agent", "order", "value"]).astype({"order": float})
    path = tmp_path_factory.mktemp("p") / "data.parquet"
    frame.to_parquet(path)
    saved = table._ROWS, table._GROUP
    table._ROWS, table._GROUP = block, group
    try:
        read = table.read_table(path, False)
    finally:
        table._ROWS, table._GROUP = saved
    expected = frame.sort_values(["agent", "order"], kind="stable")
    assert read.ids == sorted(set(frame["agent"]))
    np.testing.assert_array_equal(read.values, expected["value"].to_numpy())
    np.testing.assert_array_equal(read.length, expected.groupby("agent").size().to_numpy())
