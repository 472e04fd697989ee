"""Every table, metric and plotted slot of a study is read by someone, and every value validate
accepts runs: what `desim validate` refuses (one line each) and what it only notes.

Protocols declare the tables they read (`Protocol.reads`) and metrics the protocols they record
for (`desim.kernel.registry.applies_to`); a [topology], [network] or metric that no scenario of
a study reads is refused with the names of who would read it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _toy import PRICER_HEAD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import desim
from desim.kernel.params import ConfigError
from desim.kernel.protocol import Protocol
from desim.kernel.registry import METRICS, PROTOCOLS, metric_applies
from desim.study.cli import main
from desim.study.spec import load_study

ROOT = Path(__file__).resolve().parents[2]

HEAD = """
[study]
title = "t"
seed = 1
replicates = 1
t_max = 20
checkpoints = 5
{study}

[data]
model = "classes"
agents = 12
class_means = [0.2, 0.8]
sigma = 0.5
{data}
"""


def _study(tmp_path: Path, body: str, study: str = "", data: str = "") -> Path:
    folder = tmp_path / "s"
    folder.mkdir(exist_ok=True)
    (folder / "study.toml").write_text(HEAD.format(study=study, data=data) + body)
    return folder


def _validate(folder: Path, capsys) -> tuple[int, str, str]:
    code = main(["validate", str(folder)])
    out = capsys.readouterr()
    return code, out.out, out.err


PRIVATE = """
[[scenario]]
name = "PM-I"
protocol = "private-colme"
peers = "all"
"""
CCOLME = """
[[scenario]]
name = "C-ColME"
protocol = "c-colme"
"""
LOCAL = """
[[scenario]]
name = "local"
protocol = "local"
"""
TOPOLOGY = """
[topology]
model = "regular"
degree = 3
"""


# --------------------------------------------------------------------------------------------
# tables


def test_a_topology_no_scenario_reads_is_refused_naming_who_reads_one(tmp_path, capsys):
    folder = _study(tmp_path, TOPOLOGY + PRIVATE + LOCAL)
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "[topology] is read by b-colme, c-colme" in err
    assert "pricer" in err and "private-c-colme" in err
    assert "no scenario here reads it" in err
    assert len(err.strip().splitlines()) == 1


def test_a_topology_some_scenarios_ignore_is_kept_with_a_note_naming_them(tmp_path, capsys):
    folder = _study(tmp_path, TOPOLOGY + PRIVATE + CCOLME + LOCAL)
    code, out, err = _validate(folder, capsys)
    assert code == 0, err
    assert out.startswith("ok:")
    note = [line for line in err.splitlines() if "note:" in line]
    assert len(note) == 1
    assert "private-colme scenario 'PM-I'" in note[0] and "ignores [topology]" in note[0]
    assert "local" not in note[0]  # a baseline that reads nothing is not worth a note


def test_links_that_follow_the_graph_read_the_topology_for_any_protocol(tmp_path, capsys):
    links = '\n[network]\nlinks = "bernoulli"\np_link = 0.9\n'
    folder = _study(tmp_path, TOPOLOGY + links + PRIVATE)
    code, _, err = _validate(folder, capsys)
    assert code == 0, err
    assert "note" not in err


def test_a_network_no_scenario_reads_is_refused(tmp_path, capsys):
    network = '\n[network.latency]\nmodel = "constant"\nvalue = 1.0\n'
    folder = _study(tmp_path, network + LOCAL)
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "[network] is read by" in err and "private-colme" in err
    assert "protocols here: local" in err


def test_a_curve_of_the_topology_reads_it(tmp_path, capsys):
    curve = '\n[[curve]]\nname = "ideal (Prop. 2)"\nkind = "ideal-component"\ndraws = 2\n'
    folder = _study(tmp_path, TOPOLOGY + LOCAL + curve)
    code, _, err = _validate(folder, capsys)
    assert code == 0, err


# --------------------------------------------------------------------------------------------
# metrics


def test_a_metric_for_another_protocol_is_refused_naming_its_protocols(tmp_path, capsys):
    folder = _study(tmp_path, PRIVATE + LOCAL, study='metrics = ["pricer"]')
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "metrics: 'pricer' records something for pricer scenarios" in err
    assert "protocols here: local, private-colme" in err


def test_a_metric_one_scenario_records_is_accepted(tmp_path, capsys):
    folder = _study(tmp_path, PRIVATE + LOCAL, study='metrics = ["privacy", "colme-async"]')
    code, _, err = _validate(folder, capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("metric", "scenarios", "ok"),
    [
        ("stale", '["local"]', False),
        ("stale", '["PM-I", "local"]', True),
        ("messages_query", '["local"]', False),
        ("messages_query", '["PM-I"]', True),
    ],
)
def test_a_plot_none_of_whose_scenarios_records_its_metric_is_refused(
    tmp_path, capsys, metric, scenarios, ok
):
    plot = f'\n[[plot]]\nmetric = "{metric}"\nscenarios = {scenarios}\n'
    folder = _study(tmp_path, PRIVATE + LOCAL + plot, study='metrics = ["colme-async"]')
    code, _, err = _validate(folder, capsys)
    assert (code == 0) is ok, err
    if not ok:
        assert f"metric = '{metric}': none of its scenarios (local) records it" in err


def test_metrics_declare_their_protocols():
    names = dict(PROTOCOLS.items())
    assert [p for p in names if metric_applies(METRICS.get("links"), names[p])] == [
        "b-colme",
        "c-colme",
        "private-b-colme",
        "private-c-colme",
    ]
    assert not metric_applies(METRICS.get("privacy"), names["local"])
    assert metric_applies(METRICS.get("accuracy"), Protocol)  # undeclared: every protocol


# --------------------------------------------------------------------------------------------
# values accepted, then failing or wrong at run time


def test_a_plot_at_a_slot_beyond_t_max_is_refused(tmp_path, capsys):
    plot = '\n[grid]\n"defaults.epsilon" = [0.5, 1.0]\n\n[[plot]]\nx = "epsilon"\nat = 5000\n'
    folder = _study(tmp_path, PRIVATE + plot)
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "at = 5000: beyond t_max = 20" in err


def test_a_plot_at_with_x_the_slot_is_refused_as_unread(tmp_path):
    folder = _study(tmp_path, PRIVATE + "\n[[plot]]\nat = 20\n")
    with pytest.raises(ConfigError, match="at = 20: read only with x a grid column"):
        load_study(folder)


def test_a_plot_at_a_slot_between_checkpoints_is_refused_and_one_measured_is_not(tmp_path):
    grid = '\n[grid]\n"defaults.epsilon" = [0.5, 1.0]\n'
    folder = _study(tmp_path, PRIVATE + grid + '\n[[plot]]\nx = "epsilon"\nat = 7\n')
    with pytest.raises(ConfigError, match="at = 7: between the measured slots"):
        load_study(folder)
    (folder / "study.toml").write_text(
        (folder / "study.toml").read_text().replace("at = 7", "at = 20")
    )
    assert load_study(folder).plots[0].at == 20


@pytest.mark.parametrize(
    "data",
    [
        "class_means = [1e308, -1e308]",
        "class_means = [0.5, nan]",
        "sigma = 1e200",
        # precision weights 1/σ² times the data overflow Private-ColME's combination
        "class_means = [0.0, 2.6198662883850947e+57]\nsigma = 3.491637494131078e-127",
        "sigma = 1e-60",
    ],
)
def test_data_whose_squares_overflow_is_refused(tmp_path, capsys, data):
    text = HEAD.replace("class_means = [0.2, 0.8]\n", "").replace("sigma = 0.5\n", "")
    folder = tmp_path / "s"
    folder.mkdir()
    defaults = {"class_means": "class_means = [0.2, 0.8]", "sigma": "sigma = 0.5"}
    rest = "\n".join(v for k, v in defaults.items() if f"{k} =" not in data)
    (folder / "study.toml").write_text(text.format(study="", data=data + "\n" + rest) + PRIVATE)
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "numbers in [data] must be finite, 0 or of magnitude in [1e-50, 1e+50]" in err


def test_data_overflowing_under_a_grid_is_refused(tmp_path):
    folder = _study(tmp_path, PRIVATE + '\n[grid]\n"data.sigma" = [0.5, 1e300]\n')
    with pytest.raises(ConfigError, match=r"\[grid\]: 'data.sigma': data.sigma holds 1e\+300"):
        load_study(folder)


@pytest.mark.parametrize(
    "where",
    [
        "epsilon = 1e-300\n",
        '\n[grid]\n"defaults.epsilon" = [1.0, 1e-300]\n',
        "\n[defaults]\nepsilon = 1e-60\n",
    ],
)
def test_a_privacy_budget_whose_noise_overflows_is_refused(tmp_path, capsys, where):
    body = PRIVATE + where if where.startswith("epsilon") else where + PRIVATE
    code, _, err = _validate(_study(tmp_path, body), capsys)
    assert code != 0
    assert "must be at least 1e-50" in err


def test_the_smallest_privacy_budget_allowed_runs_finite(tmp_path):
    from desim.study.spec.validate import MIN_EPSILON

    for params in ({"variance": "sch-var-1"}, {"mechanism": "pm2", "noise": "laplace"}):
        out = desim.run(
            desim.Scenario(
                "private-colme",
                {"epsilon": MIN_EPSILON, **params},
                data={"model": "classes", "agents": 6},
                t_max=30,
                checkpoints=3,
            )
        )
        assert np.isfinite(out.metrics["value"]).all()


PRICER = (
    PRICER_HEAD.format(dimension=5)
    + """
[defaults]
trust = "ring"

[grid]
"defaults.trusted" = [1, 100]

[[scenario]]
name = "local"
protocol = "local"

[[scenario]]
name = "PriCER"
protocol = "pricer"
"""
)


def test_a_protocol_check_reaches_every_grid_point_and_scenario(tmp_path, capsys):
    # the set-up checks once ran once per data set-up: a PriCER scenario after another one, or
    # at a second grid point, was never checked (trusted = 100 for n = 10 failed every run)
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "study.toml").write_text(PRICER)
    code, _, err = _validate(folder, capsys)
    assert code != 0
    assert "trusted = 100" in err and "scenario 'PriCER'" in err


# --------------------------------------------------------------------------------------------
# the committed studies


@pytest.mark.parametrize(
    "name",
    [
        "latency-whatif",
        "server-vs-peers",
        "stragglers-whatif/estimation",
        "connectivity-sweep/pricer-geometric",
    ],
)
def test_committed_studies_with_a_table_some_scenarios_ignore_still_validate(name, capsys):
    # (every committed study is loaded by test_study_spec; these are the ones these checks
    # touch: a [topology] beside Private-ColME or EB, links that follow the graph)
    code = main(["validate", str(ROOT / "studies" / name)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("ok:")
    if name != "connectivity-sweep/pricer-geometric":
        assert "ignore [topology]" in out.err and "private-colme scenario" in out.err


# --------------------------------------------------------------------------------------------
# the classes stay closed: whatever validate accepts runs to finite numbers

HYPOTHESIS = dict(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e308, -1e308, 1e-300])


def _accepted_runs_finite(folder: Path) -> None:
    """`folder`'s study is refused, one line per fault, or its first run records finite
    numbers."""
    try:
        study = load_study(folder)
    except ConfigError as exc:  # every fault found, each one line
        assert all("\n" not in m for m in getattr(exc, "messages", [str(exc)]))
        return
    out = desim.run(study.runs[0].scenario)
    assert np.isfinite(out.metrics["value"]).all()


@settings(**HYPOTHESIS)
@given(mean=FLOATS, sigma=st.floats(min_value=0.0, allow_nan=False) | FLOATS)
def test_any_class_mean_and_sigma_is_refused_or_runs_finite(tmp_path, mean, sigma):
    text = HEAD.format(study="", data="").replace("t_max = 20", "t_max = 8")
    text = text.replace("agents = 12", "agents = 4")
    text = text.replace("class_means = [0.2, 0.8]", f"class_means = [0.0, {_toml(mean)}]")
    text = text.replace("sigma = 0.5", f"sigma = {_toml(sigma)}")
    folder = tmp_path / "h"
    folder.mkdir(exist_ok=True)
    (folder / "study.toml").write_text(text + PRIVATE)
    _accepted_runs_finite(folder)


@settings(**HYPOTHESIS)
@given(
    epsilon=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
    variance=st.sampled_from(["known", "sch-var-1", "sch-var-2"]),
    mechanism=st.sampled_from(["pm1", "pm2"]),
)
def test_any_privacy_budget_is_refused_or_runs_finite(tmp_path, epsilon, variance, mechanism):
    text = HEAD.format(study="", data="").replace("t_max = 20", "t_max = 8")
    text = text.replace("agents = 12", "agents = 4")
    scenario = f'epsilon = {epsilon!r}\nvariance = "{variance}"\nmechanism = "{mechanism}"\n'
    folder = tmp_path / "h"
    folder.mkdir(exist_ok=True)
    (folder / "study.toml").write_text(text + PRIVATE + scenario)
    _accepted_runs_finite(folder)


def _toml(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return repr(x)
