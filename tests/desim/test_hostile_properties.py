"""The hostile-input classes of issue 27 as properties: a small valid study, mutated (values of
the wrong type, huge, tiny or non-finite; keys missing, misspelt or unknown at any depth, under
[grid] too; files that are not UTF-8), either validates or is refused by `desim validate` with
exit status 2 and one ``desim: error:`` line per error; never another exception, never a
traceback, never a file written.

Examples are drawn from a fixed seed (`derandomize`), so a run is repeatable and bounded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from _toy import TOY_STUDY, write_study
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DataObject

from desim.study.cli import EXIT_CONFIG, EXIT_OK, main
from desim.study.scenario import Scenario
from desim.study.spec import MAX_SHOWN
from desim.study.spec.hashing import replicate_hashes, run_hash

#: The study every example starts from: the toy study with lossy links, an outage model, a
#: node trace and a grid over a default and a network sub-table key (it validates).
BASE = (
    TOY_STUDY
    + """
[network]
links = "bernoulli"
p_link = 0.9

[network.outages]
model = "bernoulli"
p = 0.9

[network.nodes]
model = "trace"
file = "n.csv"

[grid]
"defaults.epsilon" = [0.5, 1.0]
"network.outages.p" = [0.8, 0.9]
"""
)
TRACE = "node,start,end,state,note\n0,1,3,down,é\n2,5,9,down,\n"

RUN = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def toml_key(key: str) -> str:
    """`key` quoted as a TOML key."""
    return json.dumps(key)


def toml_value(value: Any) -> str:
    """`value` written as a TOML value (inline tables and arrays for containers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def _tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def toml_text(doc: dict) -> str:
    """`doc` written as a TOML document: its tables as [tables], arrays of tables as [[...]]."""
    lines = [
        f"{toml_key(k)} = {toml_value(v)}"
        for k, v in doc.items()
        if not isinstance(v, dict) and not _tables(v)
    ]
    for k, v in doc.items():
        for table in [v] if isinstance(v, dict) else v if _tables(v) else []:
            lines.append(f"[[{toml_key(k)}]]" if _tables(v) else f"[{toml_key(k)}]")
            lines += [f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in table.items()]
    return "\n".join(lines) + "\n"


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """The path (keys and list indices) of every value inside `value`, at any depth."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, inner in items:
        out.append((*prefix, key))
        if isinstance(inner, dict | list):
            out += paths(inner, (*prefix, key))
    return out


def containers(doc: dict) -> list[tuple]:
    """The paths of the tables of `doc` (where a new key can go), the document itself first."""
    found = [p for p in paths(doc) if isinstance(_at(doc, p), dict)]
    return [(), *found]


def _at(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.0, -0.0, -1.0]),
    st.sampled_from([0, -1, 1, 2, 2**63 - 1, -(2**63), 10**12, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
values = st.one_of(
    numbers,
    st.booleans(),
    text,
    st.sampled_from(["", "bernoulli", "trace", "toy-local-mean", "n.csv", "../n.csv", "mse"]),
    st.lists(numbers, max_size=4),
    st.lists(text, max_size=3),
    st.dictionaries(st.sampled_from(["model", "p", "name", "x"]), numbers, max_size=2),
    st.just([]),
    st.just({}),
)
#: Keys a mutation adds: misspellings of real ones, real ones where they do not belong, others.
new_keys = st.one_of(
    st.sampled_from(
        ["nmae", "protcol", "epsilonn", "modle", "p", "model", "name", "agents", "file", "x"]
    ),
    st.sampled_from(["data.agentz", "network.outages.q", "network.nodes.p", "defaults.x"]),
    text.filter(bool),
)


def mutate(doc: dict, data: DataObject) -> None:
    """Apply one mutation to `doc`: a value replaced, a key deleted, or a key added."""
    kind = data.draw(st.sampled_from(["set", "delete", "add"]))
    if kind == "add":
        where = _at(doc, data.draw(st.sampled_from(containers(doc))))
        where[data.draw(new_keys)] = data.draw(values)
        return
    path = data.draw(st.sampled_from(paths(doc)))
    parent, key = _at(doc, path[:-1]), path[-1]
    if kind == "set":
        parent[key] = data.draw(values)
    else:
        del parent[key]


def validate(text: str | bytes, trace: bytes = TRACE.encode(), capsys=None) -> None:
    """Write the study (and its trace) to a fresh folder and check what `desim validate` does
    with it: exit 0, or exit 2 with every stderr line one ``desim: error:`` (or note) line."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "s"
        if isinstance(text, str):
            write_study(folder, text)
        else:
            folder.mkdir()
            (folder / "study.toml").write_bytes(text)
        (folder / "n.csv").write_bytes(trace)
        capsys.readouterr()
        status = main(["validate", str(folder)])
        out, err = capsys.readouterr()
        assert status in (EXIT_OK, EXIT_CONFIG), (status, err)
        lines = err.splitlines()
        assert "Traceback" not in err
        assert all(line.startswith(("desim: error: ", "desim: note: ")) for line in lines)
        assert all(len(line) < 3000 for line in lines)  # lines for a person, not dumps
        if status == EXIT_OK:
            assert out.startswith("ok: ") and not [x for x in lines if "error" in x[:13]]
        else:
            assert 1 <= sum(x.startswith("desim: error: ") for x in lines) <= MAX_SHOWN + 1
        assert sorted(p.name for p in folder.iterdir()) == ["n.csv", "study.toml"]


def test_the_base_study_validates(tmp_path, capsys):
    folder = write_study(tmp_path / "s", BASE)
    (folder / "n.csv").write_text(TRACE)
    assert main(["validate", str(folder)]) == EXIT_OK
    assert capsys.readouterr().out.startswith("ok: 16 runs")


@RUN
@given(data=st.data(), n=st.integers(1, 3))
def test_a_mutated_study_validates_or_is_refused_line_by_line(capsys, data, n):
    doc = tomllib.loads(BASE)
    for _ in range(n):
        if paths(doc):
            mutate(doc, data)
    validate(toml_text(doc), capsys=capsys)


@RUN
@given(
    path=st.one_of(
        st.sampled_from(
            [
                "data.agents",
                "data.sigma",
                "data.class_means",
                "data.model",
                "network.links",
                "network.p_link",
                "network.outages",
                "network.outages.model",
                "network.outages.p",
                "network.nodes.file",
                "network.nodes.default",
                "network.latency.mean",
                "defaults.epsilon",
                "defaults.noise",
                "topology.model",
            ]
        ),
        st.sampled_from(["data.agentz", "network.outages.pp", "defaults", "grid", "x.y.z"]),
        text,
    ),
    grid_values=st.one_of(st.lists(values, max_size=4), values),
    model=st.sampled_from(["bernoulli", "bernouli", "markov", "trace", 3]),
)
def test_any_grid_path_and_values_validate_or_are_refused_line_by_line(
    capsys, path, grid_values, model
):
    doc = tomllib.loads(BASE)
    doc["network"]["outages"]["model"] = model
    doc["grid"][path] = grid_values
    validate(toml_text(doc), capsys=capsys)


@RUN
@given(
    encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-32", "latin-1", "cp1252"]),
    which=st.sampled_from(["study", "trace"]),
    noise=st.binary(max_size=8),
    at=st.floats(0, 1),
)
def test_files_that_are_not_utf8_are_refused_line_by_line(capsys, encoding, which, noise, at):
    study = BASE.replace('title = "toy"', 'title = "toy é"')
    raw = (study if which == "study" else TRACE).encode(encoding, errors="replace")
    cut = int(at * len(raw))
    raw = raw[:cut] + noise + raw[cut:]
    if which == "study":
        validate(raw, capsys=capsys)
    else:
        validate(study, trace=raw, capsys=capsys)


@RUN
@given(
    params=st.dictionaries(st.sampled_from(["epsilon", "x", "replicate", "name"]), values),
    grid=st.dictionaries(st.sampled_from(["defaults.epsilon", "data.agents"]), values),
    slot=st.booleans(),
)
def test_the_hashes_of_a_runs_replicates_are_its_run_hashes(params, grid, slot):
    # the replicate number is written into one JSON text; whatever the values hold (the
    # slot's own text included), the hashes are those of each replicate hashed in full
    if slot:
        params["x"] = "\x00desim replicate\x00"
    s = Scenario(protocol="toy-local-mean", params=params, name="A", seed=3)
    expected = [run_hash(dataclasses.replace(s, replicate=r), grid) for r in range(5)]
    assert replicate_hashes(s, grid, 5) == expected
