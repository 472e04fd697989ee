"""Hostile and careless study files: whatever a declared parameter is set to (non-finite,
huge, mis-shaped, of the wrong type, unicode), desim either accepts the study or refuses it
with one `ConfigError` line, before anything is written; it never ends in a traceback.

The values are generated for every parameter every registered component declares, not
picked per example, so that fixes stay general.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _toy import TOY_STUDY, write_study
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.messages import Batch
from desim.kernel.params import ConfigError
from desim.kernel.plugins import load_plugins
from desim.kernel.protocol import Protocol
from desim.kernel.registry import CURVES, DATA, LINKS, PROTOCOLS, TOPOLOGIES
from desim.study.cli import main
from desim.study.spec import load_study

load_plugins()


def toml_value(value) -> str:
    """`value` written as a TOML value (inline tables and arrays for containers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(value)


def _fields(registry) -> list[tuple[str, str]]:
    out = []
    for name, obj in registry.items():
        cls = getattr(obj, "Params", obj)
        if dataclasses.is_dataclass(cls):
            out += [(name, f.name) for f in dataclasses.fields(cls)]
    return out


#: (where, component name, parameter name) of every declared parameter.
TARGETS = (
    [("scenario", c, p) for c, p in _fields(PROTOCOLS)]
    + [("data", c, p) for c, p in _fields(DATA)]
    + [("network", c, p) for c, p in _fields(LINKS)]
    + [("topology", c, p) for c, p in _fields(TOPOLOGIES)]
    + [("curve", c, p) for c, p in _fields(CURVES)]
)

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)
numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, 0.0, -0.0, -1.0]),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 10**12, 10**15]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
values = st.one_of(
    numbers,
    st.booleans(),
    text,
    st.lists(numbers, max_size=12),
    st.lists(st.lists(numbers, max_size=4), max_size=4),
    st.lists(text, max_size=3),
    st.dictionaries(st.sampled_from(["model", "p", "x", "mean"]), numbers, max_size=3),
    st.just([]),
    st.just({}),
    st.just("$x_$"),
    st.just("é" * 300),
)


def study_text(where: str, component: str, key: str, value) -> str:
    """A small valid study with `key = value` set on `component` at `where`."""
    head = TOY_STUDY.split("[[scenario]]")[0]
    line = f"{json.dumps(key)} = {toml_value(value)}\n"
    scenario = '[[scenario]]\nname = "A"\nprotocol = "toy-local-mean"\n'
    if where == "scenario":
        return head + f'[[scenario]]\nname = "X"\nprotocol = {json.dumps(component)}\n' + line
    if where == "data":
        head = (
            head.split("[data]")[0]
            + f"[data]\nmodel = {json.dumps(component)}\n"
            + line
            + "\n[defaults]\nepsilon = 1.0\n\n"
        )
        return head + scenario
    if where == "network":
        return head + f"[network]\nlinks = {json.dumps(component)}\n" + line + "\n" + scenario
    if where == "topology":
        return head + f"[topology]\nmodel = {json.dumps(component)}\n" + line + "\n" + scenario
    return head + scenario + f'\n[[curve]]\nname = "c"\nkind = {json.dumps(component)}\n' + line


def assert_accepted_or_one_line(folder: Path) -> None:
    try:
        load_study(folder)
    except ConfigError as exc:
        message = str(exc)
        assert "\n" not in message and message
        assert len(message) < 2000  # a line for a person, not a dump
    assert not (folder / "results").exists()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=st.sampled_from(TARGETS), value=values)
# a non-finite probability reached the graph-size estimate before its own check refused it
@example(target=("topology", "watts-strogatz", "p"), value=-math.inf)
@example(target=("topology", "geometric", "radius"), value=math.nan)
# an empty file name read the study folder itself (a directory) as the data file
@example(target=("data", "vector-table", "file"), value="")
def test_any_value_of_any_parameter_is_accepted_or_refused_in_one_line(tmp_path, target, value):
    where, component, key = target
    folder = write_study(tmp_path / "s", study_text(where, component, key, value))
    assert_accepted_or_one_line(folder)


def study_with(study: dict, data: dict | None = None, grid: str = "") -> str:
    """The toy study with [study] (and [data]) keys replaced."""
    settings = {"title": "toy", "seed": 7, "replicates": 2, "t_max": 50, "checkpoints": 8}
    settings.update(study)
    table = {"model": "classes", "agents": 6, "class_means": [0.2, 0.8], "sigma": 0.5}
    table.update(data or {})
    rest = TOY_STUDY[TOY_STUDY.index("[defaults]") :]
    return (
        "[study]\n"
        + "".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items())
        + "\n[data]\n"
        + "".join(f"{k} = {toml_value(v)}\n" for k, v in table.items())
        + "\n"
        + rest
        + grid
    )


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(
        ["seed", "replicates", "t_max", "checkpoints", "title", "metrics", "per_agent"]
    ),
    value=values,
)
def test_any_study_setting_is_accepted_or_refused_in_one_line(tmp_path, key, value):
    folder = write_study(tmp_path / "s", study_with({key: value}))
    assert_accepted_or_one_line(folder)


@pytest.mark.parametrize(
    "extra,fragment",
    [
        ('[[plot]]\nfile = "y.png"\nylim = [1e-6, inf]\n', "ylim"),
        ('[[plot]]\nfile = "y.png"\ntitle = "M = {agnets}"\n', "unknown field {agnets}"),
        ('[[plot]]\nfile = "y.png"\nyscale = "symlog"\n', "yscale"),
    ],
)
def test_bad_plot_tables_are_refused(tmp_path, extra, fragment):
    folder = write_study(tmp_path / "s", TOY_STUDY + extra)
    with pytest.raises(ConfigError, match=fragment.replace("{", r"\{").replace("}", r"\}")):
        load_study(folder)


MANY = "[" + ", ".join(f"{1 + i}.0" for i in range(1000)) + "]"


@pytest.mark.parametrize(
    "study,data,grid,fragment",
    [
        ({"replicates": 10**9}, {}, "", "runs: at most"),
        ({}, {"agents": 10**12}, "", "agent-slots per run"),
        ({"t_max": 10**15}, {}, "", "agent-slots per run"),
        ({"checkpoints": 10**15}, {}, "", "checkpoints"),
        ({}, {}, f'[grid]\n"defaults.epsilon" = {MANY}\n"data.sigma" = {MANY}\n', "runs"),
    ],
)
def test_absurd_sizes_are_refused_with_an_estimate(tmp_path, study, data, grid, fragment):
    folder = write_study(tmp_path / "s", study_with(study, data, grid))
    with pytest.raises(ConfigError, match=fragment):
        load_study(folder)
    if data.get("agents"):  # --force accepts it (the runs are only counted here)
        assert len(load_study(folder, force=True).runs) == 4


def test_deep_toml_is_refused_in_one_line(tmp_path):
    folder = write_study(
        tmp_path / "s", TOY_STUDY + '[grid]\n"data.x" = ' + "[" * 600 + "]" * 600 + "\n"
    )
    with pytest.raises(ConfigError, match="nested too deep"):
        load_study(folder)


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "sub/../../outside.txt"])
def test_files_outside_the_study_folder_are_not_read(tmp_path, capsys, path):
    (tmp_path / "outside.txt").write_text("SECRET first line\n")
    folder = write_study(
        tmp_path / "s", TOY_STUDY + f'[network.nodes]\nmodel = "trace"\nfile = "{path}"\n'
    )
    (folder / "sub").mkdir()
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SECRET" not in err and "root:" not in err
    assert "study folder" in err


def test_a_fifo_or_a_huge_study_file_is_refused(tmp_path):
    import os

    folder = tmp_path / "s"
    folder.mkdir()
    os.mkfifo(folder / "study.toml")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_study(folder)
    (folder / "study.toml").unlink()
    (folder / "study.toml").write_text(TOY_STUDY + "#" * (2 << 20))
    with pytest.raises(ConfigError, match="at most"):
        load_study(folder)


def test_mathtext_in_names_and_titles_is_drawn_as_text(tmp_path):
    from desim.study.plots import draw_figures
    from desim.study.results import run_study

    text = TOY_STUDY.replace('"Toy B"', '"$x_$ cost"').replace(
        'title = "Toy"', 'title = "Toy $\\\\alpha_$"'
    )
    folder = write_study(tmp_path / "s", text)
    study = load_study(folder)
    run_study(study, progress=False)
    assert [p.name for p in draw_figures(study)] == ["toy.png"]


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("p_server", [0.5, 0.5, 0.5], "p_server has 3 values; the data have 6 nodes"),
        ("p_nodes", [[0.5] * 3] * 3, "p_nodes is 3×3"),
    ],
)
def test_shapes_are_checked_against_the_population_by_validate(
    tmp_path, capsys, key, value, fragment
):
    folder = write_study(tmp_path / "s", study_text("network", "bernoulli", key, value))
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err
    assert main(["run", str(folder), "--no-progress"]) == 2
    assert not (folder / "results").exists()


@pytest.mark.parametrize(
    "field,value,ok",
    [
        ("seed", 1.5, False),
        ("seed", -1, False),
        ("t_max", 10**15, False),
        ("t_max", True, False),
        ("t_max", "50", False),
        ("replicate", None, False),
        ("checkpoints", 1, False),
        ("t_max", __import__("numpy").int64(50), True),
        ("seed", __import__("numpy").uint32(3), True),
    ],
)
def test_the_python_api_validates_like_a_study_file(field, value, ok):
    import numpy as np

    import desim

    kwargs = {
        "protocol": "local",
        "data": {"model": "classes", "agents": np.int64(6)},
        "t_max": 50,
        "checkpoints": 4,
        field: value,
    }
    if ok:
        out = desim.run(desim.Scenario(**kwargs))
        assert len(out.metrics) > 0
    else:
        with pytest.raises(ConfigError, match=field):
            desim.run(desim.Scenario(**kwargs))


@pytest.mark.parametrize(
    "content,fragment",
    [
        (bytes(range(256)) * 10, "not UTF-8 text"),
        ("node,start,end,state\n0,1,3,dówn\n".encode("latin-1"), "not UTF-8 text"),
        (b"node,start,end,state\n0,1,3," + b"x" * 200_000 + b"\n", "field larger"),
        (b"node,start,end,state\n999,1,3,down\n", "999 is out of range"),
        (b"node,start,end,state\n-1,1,3,down\n", "-1 is out of range"),
    ],
)
def test_hostile_trace_files_are_one_line_without_their_content(
    tmp_path, capsys, content, fragment
):
    folder = write_study(
        tmp_path / "s", TOY_STUDY + '[network.nodes]\nmodel = "trace"\nfile = "n.csv"\n'
    )
    (folder / "n.csv").write_bytes(content)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and "xxxx" not in err


PRICER = """\
[study]
title = "stranded"
replicates = 1
t_max = 2

[data]
model = "vectors"
agents = 4
dimension = 3

[network]
links = "bernoulli"
p_server = [0.0, 0.5, 0.5, 0.5]
p_link = {p_link}

[[scenario]]
name = "PriCER"
protocol = "pricer"
"""


def test_a_pricer_study_whose_node_cannot_reach_the_server_fails_validate(tmp_path, capsys):
    folder = write_study(tmp_path / "s", PRICER.format(p_link=0.0))
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 0 cannot reach the server" in err
    folder = write_study(tmp_path / "t", PRICER.format(p_link=0.5))  # node 0 relays: fine
    assert main(["validate", str(folder)]) == 0


def test_a_plot_of_a_metric_no_scenario_records_fails_validate(tmp_path):
    folder = write_study(tmp_path / "s", TOY_STUDY + '[[plot]]\nfile = "m.png"\nmetric = "mse_"\n')
    with pytest.raises(
        ConfigError, match="metric = 'mse_': no scenario records it .did you mean 'mse'"
    ):
        load_study(folder)


@pytest.mark.parametrize(
    "text,fragment",
    [
        (PRICER.format(p_link=0.5) + 'trust = "ring"\ntrusted = 9\n', "trusted = 9"),
        (
            PRICER.format(p_link=0.5).replace("p_server = [0.0, 0.5, 0.5, 0.5]", "good = 9"),
            "good = 9: more good nodes than the 4 nodes",
        ),
        (
            TOY_STUDY + "[network.stragglers]\nfactors = [1.0, 2.0]\n",
            "factors has 2 values; the data have 6 agents",
        ),
    ],
)
def test_sizes_larger_than_the_population_fail_validate(tmp_path, capsys, text, fragment):
    folder = write_study(tmp_path / "s", text)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err


# --------------------------------------------------------------------------------------------
# every error at once, one line each, paths relative to the study folder


def _lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


MANY_ERRORS = TOY_STUDY.replace('noise = "gaussian"', 'noise = "gausian"') + (
    '\n[[scenario]]\nname = "C"\nprotocol = "toy-local-mean"\nepsilonn = 2.0\n'
    '\n[[curve]]\nname = "bad curve"\nkind = "toy-local"\nscale = -1.0\n'
    '\n[[plot]]\nfile = "y.png"\nylim = [1e-6, inf]\n'
    '\n[[plot]]\nfile = "z.png"\nscenarios = ["Toy Z"]\n'
    '\n[grid]\n"data.sigmaa" = [0.5, 1.0]\n"defaults.epsilon" = [1.0, -2.0]\n'
)


def test_independent_errors_are_reported_together_one_line_each(tmp_path, capsys):
    folder = write_study(tmp_path / "s", MANY_ERRORS)
    assert main(["validate", str(folder)]) == 2
    lines = _lines(capsys)
    assert all(line.startswith(f"desim: error: {folder / 'study.toml'}: ") for line in lines)
    text = "\n".join(lines)
    for fragment in ("ylim", "'Toy Z'", "'sigmaa'"):  # plots and the grid, each on its own
        assert fragment in text
    assert len(lines) == 3  # the scenarios and curves wait for the grid: they are expanded on it
    folder = write_study(tmp_path / "t", MANY_ERRORS.split("\n[grid]")[0])
    assert main(["validate", str(folder)]) == 2
    text = "\n".join(_lines(capsys))
    for fragment in ("'gausian'", "'epsilonn'", "scale = -1.0", "ylim", "'Toy Z'"):
        assert fragment in text
    assert not (folder / "results").exists()


def test_the_collected_errors_are_a_config_error_with_its_messages(tmp_path):
    from desim.study.spec import ConfigErrors

    folder = write_study(tmp_path / "s", MANY_ERRORS.split("\n[grid]")[0])
    with pytest.raises(ConfigError) as info:
        load_study(folder)
    assert isinstance(info.value, ConfigErrors) and len(info.value.messages) == 5
    assert str(info.value).splitlines() == list(info.value.messages)
    assert all("\n" not in m and m.startswith(str(folder)) for m in info.value.messages)


def test_at_most_twenty_errors_are_shown_then_a_count(tmp_path, capsys):
    extra = "".join(f"unknown{i} = 1\n" for i in range(25))
    folder = write_study(tmp_path / "s", extra + TOY_STUDY)
    assert main(["validate", str(folder)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 21 and lines[-1] == "desim: error: … and 5 more"
    assert "'unknown0'" in lines[0] and "'unknown19'" in lines[19]


def test_a_check_that_depends_on_a_failed_one_is_skipped(tmp_path, capsys):
    text = TOY_STUDY + (
        '[[plot]]\nfile = "e.png"\nx = "epsilonn"\n\n[grid]\n"defaults.epsilonn" = [1.0, 2.0]\n'
    )
    folder = write_study(tmp_path / "s", text)
    assert main(["validate", str(folder)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and "unknown key 'epsilonn'" in lines[0]


def test_paths_in_messages_are_relative_to_the_study_folder(tmp_path, capsys, monkeypatch):
    folder = write_study(
        tmp_path / "s", TOY_STUDY + '[network.nodes]\nmodel = "trace"\nfile = "n.csv"\n'
    )
    (folder / "n.csv").write_text("node,start,end,state\n0,1,3,sideways\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "s"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) not in err
    assert err.startswith("desim: error: s/study.toml: ") and "trace n.csv, line 2" in err
    (folder / "n.csv").write_text("node,start,end,state\n999,1,3,down\n")  # found at set-up
    assert main(["validate", "s"]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path) not in err and err.count("\n") == 1
    assert err.startswith("desim: error: s/study.toml: ") and "trace n.csv, line 2" in err


@pytest.mark.parametrize(
    "scenario,fragment",
    [
        ('protocol = "toy-local-mean"\n', "[[scenario]] #3: name is missing"),
        ('name = 7\nprotocol = "toy-local-mean"\n', "[[scenario]] #3: name = 7"),
        ('name = ["x"]\nprotocol = "toy-local-mean"\n', "must be a non-empty string"),
        ('name = "C"\n', "scenario 'C': protocol is required (allowed: "),
    ],
)
def test_a_scenario_without_a_proper_name_or_protocol_is_one_line(
    tmp_path, capsys, scenario, fragment
):
    text = TOY_STUDY + "\n[[scenario]]\n" + scenario
    text += '\n[[curve]]\nname = "c2"\nkind = "toy-local"\nscenario = "nope"\n'
    folder = write_study(tmp_path / "s", text)
    assert main(["validate", str(folder)]) == 2
    lines = _lines(capsys)
    assert len(lines) == 1 and fragment in lines[0]


def test_a_misspelt_sub_table_model_reads_the_same_with_or_without_a_grid(tmp_path, capsys):
    base = TOY_STUDY + '[network]\nlinks = "bernoulli"\n[network.outages]\nmodel = "bernouli"\n'
    messages = []
    for grid in ("", '[grid]\n"network.outages.p" = [0.5, 0.9]\n'):
        folder = write_study(tmp_path / f"s{len(messages)}", base + grid)
        assert main(["validate", str(folder)]) == 2
        messages.append(capsys.readouterr().err.split("study.toml: ", 1)[1])
    assert messages[0] == messages[1]
    assert "unknown availability model 'bernouli' (did you mean 'bernoulli'?)" in messages[0]


@pytest.mark.parametrize(
    "content",
    [
        "0 1\n1 2\n".encode("utf-16"),
        "0 1\n1 2\n".encode("utf-16-le"),  # no byte-order mark: decodes, with NUL bytes
        bytes(range(256)) * 4,
        "0 1  # Kanté\n".encode("latin-1"),
    ],
)
def test_an_edge_list_that_is_not_utf8_text_is_one_line_naming_it(tmp_path, capsys, content):
    text = TOY_STUDY.replace('protocol = "toy-local-mean"', 'protocol = "c-colme"', 1)
    text += '[topology]\nmodel = "file"\npath = "g.txt"\n'
    folder = write_study(tmp_path / "s", text)
    (folder / "g.txt").write_bytes(content)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "g.txt" in err and str(folder / "g.txt") not in err
    assert "must be a UTF-8 text file" in err and "codec" not in err


# --------------------------------------------------------------------------------------------
# a protocol sending a kind of message it did not declare


@dataclasses.dataclass(frozen=True)
class _NoParams:
    """No parameters."""


class _Undeclared(Protocol):
    """Sends 'pong', which it does not declare."""

    Params = _NoParams
    message_kinds = ("ping",)

    def on_samples(self, t, samples):
        self.ctx.send("pong", np.array([0]), np.array([1]))

    def estimates(self):
        return np.zeros(self.ctx.n_agents)


@pytest.mark.parametrize("links", ["ideal", "bernoulli"])
def test_sending_an_undeclared_message_kind_names_the_kind_and_the_declared_ones(links):
    if "test-undeclared-kind" not in PROTOCOLS:
        PROTOCOLS.register("test-undeclared-kind")(_Undeclared)
    s = desim.Scenario(
        protocol="test-undeclared-kind",
        data={"model": "classes", "agents": 4},
        network={"links": links},
        t_max=3,
        checkpoints=2,
    )
    with pytest.raises(ValueError, match=r"message kind 'pong' is not declared .* 'ping'"):
        desim.run(s)


def test_asking_a_batch_for_an_undeclared_kind_names_the_declared_ones():
    empty = np.empty(0)
    batch = Batch(empty, empty, empty, np.empty((0, 0)), empty, ("a", "b"))
    with pytest.raises(ValueError, match=r"'c' is not declared.*'a', 'b'"):
        batch.of_kind("c")


def test_a_trace_rewritten_with_the_same_size_is_read_again(tmp_path, capsys):
    folder = write_study(
        tmp_path / "s", TOY_STUDY + '[network.nodes]\nmodel = "trace"\nfile = "n.csv"\n'
    )
    (folder / "n.csv").write_text("node,start,end,state\n0,1,3,down\n")
    assert main(["validate", str(folder)]) == 0
    (folder / "n.csv").write_text("node,start,end,state\n9,1,3,down\n")  # same size, same second
    assert main(["validate", str(folder)]) == 2
    assert "address 9 is out of range" in capsys.readouterr().err


def test_import_desim_works_in_the_folder_holding_a_clone_named_desim(tmp_path):
    # the clone's root has no __init__.py: Python would import it as an empty namespace package
    # unless the editable install's finder comes first (setup.py's EditableFirst)
    clone = tmp_path / "desim"
    (clone / "desim").mkdir(parents=True)
    (clone / "models").mkdir()
    (clone / "pyproject.toml").write_text('[project]\nname = "desim"\n')
    (clone / "desim" / "__init__.py").write_text("raise ImportError('the clone, not desim')\n")
    code = "import desim; from desim import ConfigError; print(desim.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (
        f"{done.stderr[-500:]}\n(an editable install made before setup.py's EditableFirst: "
        "run `pip install -e .` again)"
    )
    assert Path(done.stdout.strip()) == Path(desim.__file__)
