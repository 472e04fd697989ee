"""The `adversaries` metric of the local and ideal baselines (their honest agents' MSE) and a
[grid] over a key of the [adversaries] table (``"adversaries.fraction"``), through the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _runs import adversary_run, run_study_text

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import DATA
from desim.study.cli import main
from desim.study.spec import load_study

load_plugins()


def _classes():
    spec = build(
        DATA.get("classes"), {"agents": 30, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    )
    return spec.make(np.random.default_rng(2))


def _run(protocol: str, params: dict, t_max: int = 20):
    source = _classes()
    return (*adversary_run(protocol, params, source, t_max), source)


@pytest.mark.parametrize("protocol", ["local", "ideal"])
def test_a_baseline_scores_the_honest_agents_of_the_same_adversaries(protocol):
    table = {"fraction": 0.3, "behaviour": "shift", "shift": 1.0}
    proto, metrics, source = _run(protocol, {"adversaries": table})
    colme, _, _ = _run("private-colme", {"adversaries": table})
    mask = proto.adversary_state()[0]
    np.testing.assert_array_equal(mask, colme.adversaries.mask)  # every protocol meets them
    honest = ~mask
    err2 = (proto.estimates() - source.means) ** 2
    assert metrics["mse_honest"] == pytest.approx(err2[honest].mean(), rel=1e-12)
    assert "accepting_adversaries" not in metrics  # a baseline accepts no one
    plain, _, _ = _run(protocol, {})
    np.testing.assert_array_equal(plain.estimates(), proto.estimates())  # nothing else changes
    assert plain.adversary_state() is None


STUDY = """
[study]
title = "adversaries grid"
t_max = 30
checkpoints = 2
metrics = ["adversaries"]

[data]
model = "classes"
agents = 20
class_means = [0.2, 0.8]

[adversaries]
fraction = 0.1
behaviour = "shift"
shift = 1.0

[grid]
"adversaries.fraction" = [0.1, 0.3]

[[scenario]]
name = "P"
protocol = "private-colme"

[[scenario]]
name = "local"
protocol = "local"
"""


def test_a_grid_sweeps_the_adversaries_fraction_for_every_scenario(tmp_path: Path, no_figures):
    folder = run_study_text(tmp_path / "s", STUDY)
    runs = load_study(folder).runs
    got = {(r.scenario.name, r.columns["fraction"]) for r in runs}
    assert got == {(n, f) for n in ("P", "local") for f in (0.1, 0.3)}
    for r in runs:
        assert r.scenario.params["adversaries"] == {
            "fraction": r.columns["fraction"],
            "behaviour": "shift",
            "shift": 1.0,
        }
    import desim

    metrics = desim.load(folder).metrics
    honest = metrics[metrics.metric == "mse_honest"]
    assert sorted(set(zip(honest.scenario, honest.fraction, strict=True))) == sorted(got)


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (lambda t: t.replace("[adversaries]\nfraction = 0.1\n", "[x]\n"), "no [adversaries]"),
        (
            lambda t: t.replace('protocol = "local"', 'protocol = "local"\nadversaries = {}'),
            "scenario 'local' sets adversaries itself",
        ),
        (lambda t: t.replace('"adversaries.fraction"', '"adversaries.fractoin"'), "fraction"),
        (lambda t: t.replace("[0.1, 0.3]", "[0.1, 1.0]"), "must lie in [0, 1)"),
    ],
)
def test_a_bad_adversaries_sweep_is_refused_in_one_line(tmp_path: Path, capsys, edit, fragment):
    text = edit(STUDY)
    if "[x]" in text:  # the table gone: its keys with it
        text = text.replace('[x]\nbehaviour = "shift"\nshift = 1.0\n', "")
    (tmp_path / "study.toml").write_text(text)
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_a_baseline_refuses_adversaries_that_are_not_its_agents(tmp_path: Path, capsys):
    text = STUDY.replace("fraction = 0.1\n", "agents = [25]\n").replace(
        '[grid]\n"adversaries.fraction" = [0.1, 0.3]\n', ""
    )
    text = text[: text.index("[[scenario]]")] + '[[scenario]]\nname = "local"\nprotocol = "local"\n'
    (tmp_path / "study.toml").write_text(text)
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "25 is not an agent" in err and len(err.strip().splitlines()) == 1, err
