"""The fast paths of `desim validate` on large studies (issue 27) give what the slow ones gave:
trace files read in bulk hold the rows, line numbers and errors of the row-by-row reader; a
grid expands into the same runs, in the same order, with the same config hashes. (Timings are
in tests/benchmarks/bench_validate.py, not here.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _toy import write_study
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.params import ConfigError
from desim.network_models import availability
from desim.network_models.availability import Trace, read_trace
from desim.study.cli import EXIT_OK, main
from desim.study.spec import canonical_hash, load_study
from desim.study.spec.expand import reaching
from desim.study.spec.hashing import run_hash

FIELDS = ("a", "b", "start", "end", "up", "line")


def _read(path: Path, scope: str, bulk: bool, monkeypatch) -> object:
    """`read_trace` of `path` in bulk (every size) or row by row: its rows, or its error."""
    monkeypatch.setattr(availability, "PLAIN_TRACE_BYTES", 0 if bulk else 1 << 62)
    availability._TRACES.clear()  # a fresh read, not the other path's cached rows
    try:
        rows = read_trace(path, scope)
    except Exception as exc:  # noqa: BLE001 (whatever the row reader raises, the same)
        return type(exc).__name__, str(exc)
    return {name: getattr(rows, name) for name in FIELDS}


def _same(bulk: object, rows: object) -> None:
    if isinstance(rows, tuple):
        assert bulk == rows
        return
    assert isinstance(bulk, dict), bulk
    for name in FIELDS:
        assert bulk[name].dtype == rows[name].dtype, name
        np.testing.assert_array_equal(bulk[name], rows[name], err_msg=name)
        assert not bulk[name].flags.writeable


def _both(tmp_path: Path, content: bytes, scope: str, monkeypatch) -> object:
    path = tmp_path / "t.csv"
    path.write_bytes(content)
    bulk = _read(path, scope, True, monkeypatch)
    rows = _read(path, scope, False, monkeypatch)
    _same(bulk, rows)
    return rows


@pytest.mark.parametrize(
    ("scope", "content"),
    [
        ("node", b"start,end,state,node\n0,1,down,0\n2.5,3e1,UP,3\n4,5,Down,1\n"),
        # spaces around fields, Windows line ends, blank lines, no final line end
        ("node", b"start, end ,state,node\r\n\r\n 0 , 1 , down , 0 \r\n\r\n2,3,up,1"),
        # a link trace in file order, columns in another order, an extra column, signs, zeros
        ("link", b"src,note,dst,start,end,state\n3,1,1,+0.5,1.5,down\n01,2,0,-0.0,1E-3,up\n"),
        # a header with a repeated name (its last column wins) and quoted names
        ("node", b'"start",x,end,state,node,x\n0,1,1,down,0,2\n'),
        # the same node twice, intervals touching
        ("node", b"start,end,state,node\n0,2,down,0\n2,4,up,0\n"),
    ],
)
def test_a_plain_trace_read_in_bulk_has_the_rows_and_lines_read_one_by_one(
    tmp_path, monkeypatch, scope, content
):
    rows = _both(tmp_path, content, scope, monkeypatch)
    assert isinstance(rows, dict) and len(rows["line"]) >= 1


@pytest.mark.parametrize(
    "content",
    [
        b"start,end,state,node\n0,1,down,0\n   \n2,3,up,1\n",  # a line of spaces: an empty field
        b"start,end,state,node\n0,1,down,0\n2,3,up,1,\n",  # one field more
        b"start,end,state,node\n0,1,down\n",  # one field less
        b"start,end,state,node\n0,1 5,down,0\n",  # a space inside a number
        b"start,end,state,node\n0,1_5,down,0\n",  # valid for float(): read row by row
        b"start,end,state,node\n0,inf,down,0\n",
        b"start,end,state,node\n0,nan,down,0\n",
        b"start,end,state,node\n0,1e999,down,0\n",
        b"start,end,state,node\n0,1,,0\n",
        b"start,end,state,node\n0,1,dow,0\n",
        b"start,end,state,node\n0,1,down,1e1\n",
        b"start,end,state,node\n0,1,down,99999999999999999999\n",
        b"start,end,state,node\n1,1,down,0\n",
        b"start,end,state,node\n-1,1,down,0\n",
        b'start,end,state,node\n0,1,"down",0\n',
        b"start,end,state,node\r0,1,down,0\r",
        b"start,end,state,node\n0,1,down,0\n0.5,2,up,0\n",  # overlapping
        b"start,end,state,node\n0,1,d\xc3\xb6wn,0\n",
        b"start,end,state,node\n0,1,d\xf6wn,0\n",
        b"start,end,state,node\n0,1,down,0\x00\n",
        b"start,end,state,node\n0,1,down,0" + b" " * 200_000 + b"\n",  # a field too large
        b"start,end,state,node\n",
        b"start,end,state\n0,1,down\n",
    ],
)
def test_a_trace_the_bulk_reader_leaves_gets_the_row_readers_rows_or_message(
    tmp_path, monkeypatch, content
):
    _both(tmp_path, content, "node", monkeypatch)


def test_a_link_trace_with_a_self_link_gets_the_row_readers_message(tmp_path, monkeypatch):
    found = _both(tmp_path, b"start,end,state,src,dst\n0,1,down,2,2\n", "link", monkeypatch)
    assert found == (
        "ConfigError",
        f"trace {tmp_path / 't.csv'}, line 2: src = dst = 2: not a link",
    )


#: What a field of a generated trace is made of: the bytes the bulk reader accepts, and some.
TOKENS = st.text(alphabet="0123456789+-.eEupdownUPDOWN _x", min_size=0, max_size=6)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    rows=st.lists(st.lists(TOKENS, min_size=4, max_size=4), min_size=1, max_size=6),
    sound=st.lists(
        st.tuples(st.integers(0, 50), st.integers(1, 5), st.sampled_from(["up", "down"])),
        max_size=6,
    ),
    ends=st.sampled_from(["\n", "\r\n"]),
)
def test_any_trace_reads_the_same_in_bulk_and_row_by_row(tmp_path_factory, rows, sound, ends):
    # sound rows (one node each, so no overlap) with arbitrary ones among them
    lines = [f"{s},{s + n},{state},{k}" for k, (s, n, state) in enumerate(sound)]
    lines += [",".join(row) for row in rows]
    content = ("start,end,state,node" + ends + ends.join(sorted(lines)) + ends).encode()
    with pytest.MonkeyPatch.context() as monkeypatch:
        _both(tmp_path_factory.mktemp("t"), content, "node", monkeypatch)


def test_a_trace_bound_lazily_replays_what_it_was_given(tmp_path, monkeypatch):
    # bound only (as validate does), then asked: the same answers as a bound object asked at once
    monkeypatch.setattr(availability, "PLAIN_TRACE_BYTES", 0)
    (tmp_path / "t.csv").write_text("start,end,state,node\n0,2,down,0\n1,3,down,1\n2,4,up,0\n")
    model = Trace(file="t.csv", default="up")
    bound = model.bind(3, "node", np.random.default_rng(0), base_dir=tmp_path)
    assert bound.horizon == 4.0
    np.testing.assert_allclose(bound.stationary(np.arange(3)), [0.5, 0.5, 1.0])
    assert [bound.up(t, np.arange(3)).tolist() for t in (0, 1, 2, 3.5, 5)] == [
        [False, True, True],
        [False, False, True],
        [True, False, True],
        [True, True, True],
        [True, True, True],
    ]


# --------------------------------------------------------------------------------------------
# a grid's runs

GRID_STUDY = """\
[study]
title = "grid"
seed = 4
replicates = 3
t_max = 100
checkpoints = 4

[data]
model = "classes"
agents = 8
class_means = [0.2, 0.8]
sigma = 0.5

[topology]
model = "regular"
degree = 2

[network]
links = "bernoulli"
p_link = 0.9

[network.latency]
model = "lognormal"
mean = 1.0
cv = 1.0

[defaults]
epsilon = 1.0

[grid]
"defaults.epsilon" = [0.5, 1.0, 2.0]
"network.latency.mean" = [0.0, 2.0]
"data.sigma" = [0.25, 0.5]
"network.p_link" = [0.8, 0.9]

[[scenario]]
name = "Private-ColME"
protocol = "private-colme"
peers = "all"
mechanism = "pm1"

[[scenario]]
name = "ColME"
protocol = "private-colme"
peers = "all"
noise = "none"

[[scenario]]
name = "C-ColME"
protocol = "c-colme"

[[scenario]]
name = "local"
protocol = "local"
"""
#: Digest of the run ids and config hashes, in study order, of `GRID_STUDY` (taken before the
#: fast paths of issue 27's validate speed).
GRID_DIGEST = "13dda6cc74038b04"


def test_a_grid_expands_into_the_runs_and_hashes_it_always_did(tmp_path):
    study = load_study(write_study(tmp_path / "s", GRID_STUDY))
    assert (len(study.runs), len(study.unique_runs)) == (4 * 24 * 3, 3 * 24 * 3 + 8 * 3)
    assert canonical_hash([(r.run_id, r.config_hash) for r in study.runs])[:16] == GRID_DIGEST
    grid = {p: None for p in study.grid_columns}
    for run in study.runs:  # each hash is the run's scenario and reaching values hashed in full
        reach = reaching(study.scenarios[run.scenario_index], grid)
        assert run.scenario.replicate == int(run.run_id[-3:])
        assert run.config_hash == run_hash(
            run.scenario, {p: v for p, v in run.point.values.items() if p in reach}
        )
    assert main(["validate", str(tmp_path / "s")]) == EXIT_OK


@pytest.mark.parametrize("far", [7, 2**62])
def test_overlapping_intervals_are_named_by_their_lines_whatever_the_addresses(tmp_path, far):
    # far apart addresses do not fit one sort key: sorted by each address then
    text = f"start,end,state,src,dst\n0,5,up,{-far},{far}\n6,8,up,1,2\n4,6,down,{far},{-far}\n"
    (tmp_path / "t.csv").write_text(text)
    with pytest.raises(ConfigError) as exc:
        read_trace(tmp_path / "t.csv", "link")
    assert str(exc.value) == (
        f"trace {tmp_path / 't.csv'}: lines 2 and 4 overlap (intervals of link {-far}–{far})"
    )
