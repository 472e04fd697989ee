"""Every error of a study at once, and values read as the numbers they are: the set-up checks
report every failing scenario and grid point, a table reports every bad field, a [data] key
the data model would not read is refused naming who reads it, -0.0 is 0, and a set-up too
large for memory (``--force``) is one line naming the run, the field and the memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _toy import PRICER_HEAD, TOY_STUDY, write_study

import desim
from desim.kernel.params import ConfigError, ConfigErrors
from desim.study.cli import main
from desim.study.spec import load_study

PRICER = (
    PRICER_HEAD.format(dimension=5)
    + """
[defaults]
trust = "ring"

[grid]
"defaults.trusted" = [1, 100, 200]

[[scenario]]
name = "P1"
protocol = "pricer"

[[scenario]]
name = "P2"
protocol = "pricer"
epsilon_low = 0.2
"""
)


def _errors(folder: Path, capsys, *args: str) -> list[str]:
    """The error lines of `desim validate FOLDER` (or of ARGS), which must fail cleanly."""
    capsys.readouterr()
    code = main([*(args or ("validate",)), str(folder)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.splitlines()
    assert all(line.startswith(("desim: error: ", "desim: note: ")) for line in lines), err
    return [line.removeprefix("desim: error: ") for line in lines if "desim: error: " in line]


# --------------------------------------------------------------------------------------------
# the set-up checks: every failing scenario and grid point


def test_every_failing_set_up_is_reported_once_with_the_study_file_relative(
    tmp_path, capsys, monkeypatch
):
    write_study(tmp_path / "p", PRICER)
    monkeypatch.chdir(tmp_path)
    errors = _errors(Path("p"), capsys)
    # two scenarios × two bad grid points; trusted = 1 passes
    assert len(errors) == 4, errors
    for name in ("P1", "P2"):
        for k in (100, 200):
            assert sum(f"scenario '{name}'" in e and f"trusted = {k}:" in e for e in errors) == 1
    assert all(e.startswith("p/study.toml: grid point trusted = ") for e in errors)
    assert not any(str(tmp_path) in e for e in errors)


def test_a_fault_shared_by_grid_points_is_said_once(tmp_path, capsys):
    text = PRICER.replace('"defaults.trusted" = [1, 100, 200]', '"defaults.delta" = [0.1, 0.2]')
    text = text.replace('trust = "ring"', 'trust = "ring"\ntrusted = 100')
    errors = _errors(write_study(tmp_path / "p", text), capsys)
    # the same fault of P1 (and of P2) at both grid points: once each, at the first point
    assert len(errors) == 2, errors
    assert all("grid point delta = 0.1: " in e for e in errors)


def test_every_study_wide_check_reports_together(tmp_path, capsys):
    # a [topology] no scenario reads and a metric no scenario records: both said at once
    text = """
[study]
title = "w"
t_max = 10
checkpoints = 3
metrics = ["pricer"]

[data]
model = "classes"
agents = 6

[topology]
model = "regular"
degree = 2

[[scenario]]
name = "local"
protocol = "local"
"""
    errors = _errors(write_study(tmp_path / "w", text), capsys)
    assert len(errors) == 2, errors
    assert "[topology] is read by " in errors[0] and "metrics: 'pricer'" in errors[1]


def test_each_check_reports_every_fault_it_finds(tmp_path, capsys):
    text = TOY_STUDY.replace("class_means = [0.2, 0.8]", "class_means = [1e300, 0.8]")
    text = text.replace("sigma = 0.5", "sigma = 1e200")
    text += '\n[[plot]]\nfile = "a.png"\nat = 7\n\n[[plot]]\nfile = "b.png"\nat = 9\n'
    errors = _errors(write_study(tmp_path / "s", text), capsys)
    for fault in (
        "class_means holds 1e+300",
        "sigma = 1e+200",
        "'a.png': at = 7",
        "'b.png': at = 9",
    ):
        assert sum(fault in e for e in errors) == 1, (fault, errors)


# --------------------------------------------------------------------------------------------
# a table with several bad fields


def test_every_bad_field_of_a_scenario_is_reported(tmp_path, capsys):
    text = TOY_STUDY.replace(
        'noise = "gaussian"', 'noise = "loud"\ndelta = 2.0\nepsilon = -1.0\nfail_replicat = 1'
    )
    errors = _errors(write_study(tmp_path / "s", text), capsys)
    fields = ["unknown key 'fail_replicat'", "noise = 'loud'", "delta = 2.0", "epsilon = -1.0"]
    assert len(errors) == len(fields), errors
    for field in fields:
        assert sum(f"scenario 'Toy B': {field}" in e for e in errors) == 1, (field, errors)


def test_bad_fields_at_a_grid_point_and_from_defaults_each_say_where_they_come_from(tmp_path):
    text = TOY_STUDY.replace("epsilon = 1.0", "epsilon = -1.0").replace(
        'noise = "gaussian"', 'noise = "gaussian"\ndelta = 2.0'
    )
    text += '\n[grid]\n"data.agents" = [4, 6]\n'
    with pytest.raises(ConfigErrors) as info:
        load_study(write_study(tmp_path / "s", text))
    messages = info.value.messages
    # Toy B's own bad delta beside the bad epsilon it takes from [defaults], which Toy A
    # takes too (said once, for Toy A)
    assert (
        "grid point agents = 4: scenario 'Toy A': epsilon = -1.0: must be > 0 (set in [defaults])"
    ) in messages[0]
    assert messages[1].endswith(
        "grid point agents = 4: scenario 'Toy B': delta = 2.0: must be > 0 and < 1"
    )
    assert len(messages) == 2, messages


@pytest.mark.parametrize(
    ("table", "fields"),
    [
        ("[study]", ["seed = -1", "replicates = 0"]),
        ("[[plot]]", ["xscale = 'loglog'", "ylim = 'low'"]),
    ],
)
def test_every_bad_field_of_the_study_and_a_plot_table_is_reported(tmp_path, capsys, table, fields):
    if table == "[study]":
        text = TOY_STUDY.replace("seed = 7", "seed = -1").replace(
            "replicates = 2", "replicates = 0"
        )
    else:
        text = TOY_STUDY.replace('title = "Toy"', 'title = "Toy"\nxscale = "loglog"\nylim = "low"')
    errors = _errors(write_study(tmp_path / "s", text), capsys)
    for field in fields:
        assert sum(f"{field}: must be" in e for e in errors) == 1, errors


# --------------------------------------------------------------------------------------------
# a [data] key the data model would not read


@pytest.mark.parametrize(
    ("data", "refused"),
    [
        ('model = "classes"\ndistribution = "bernoulli"\nsigma = 0.3', "sigma"),
        ('model = "bernoulli-prior"\nagents = 6\nprior = "beta"\nsd = 0.3', "sd"),
        ('model = "bernoulli-prior"\nagents = 6\nspikes = [0.5]', "spikes"),
        ('model = "vectors"\ndistribution = "sphere"\nnormalise = "each"', "normalise"),
    ],
)
def test_a_data_key_its_settings_leave_unread_is_refused_naming_who_reads_it(
    tmp_path, capsys, data, refused
):
    text = _with_data(data)
    (error,) = _errors(write_study(tmp_path / "s", text), capsys)
    assert f"[data]: {refused} = " in error and f"read {refused} only with " in error, error
    assert "remove" in error


def test_a_data_key_read_at_some_grid_point_is_accepted_and_one_read_at_none_refused(
    tmp_path, capsys
):
    data = 'model = "bernoulli-prior"\nagents = 6\nprior = "beta"\nsd = 0.3'
    swept = _with_data(data) + '\n[grid]\n"data.prior" = ["beta", "normal"]\n'
    assert load_study(write_study(tmp_path / "a", swept)).points
    unread = _with_data(data.replace("sd = 0.3", "")) + '\n[grid]\n"data.sd" = [0.1, 0.2]\n'
    (error,) = _errors(write_study(tmp_path / "b", unread), capsys)
    assert error.endswith(
        "[grid]: 'data.sd': bernoulli-prior data read sd only with prior = 'normal' "
        "(here prior = 'beta'); remove sd"
    )


def _with_data(data: str) -> str:
    """The toy study with its [data] table replaced by `data` (and a scenario reading any)."""
    head, _, rest = TOY_STUDY.partition("[data]")
    rest = rest[rest.index("[defaults]") :]
    text = f"{head}[data]\n{data}\n\n{rest}"
    return text.replace('[[curve]]\nname = "toy curve"\nkind = "toy-local"\n', "").replace(
        'curves = ["toy curve"]', ""
    )


# --------------------------------------------------------------------------------------------
# -0.0 is the number 0


def test_negative_zero_is_refused_or_accepted_as_zero_with_the_same_message(tmp_path):
    messages = []
    for zero in ("0.0", "-0.0"):
        text = TOY_STUDY.replace('noise = "gaussian"', f'noise = "gaussian"\nepsilon = {zero}')
        with pytest.raises(ConfigError) as info:
            load_study(write_study(tmp_path / zero, text))
        messages.append(str(info.value).replace(str(tmp_path / zero), "S"))
    assert messages[0] == messages[1]
    assert "epsilon = 0.0: must be > 0" in messages[1]


def test_negative_zero_in_data_runs_as_zero(tmp_path):
    runs = []
    for zero in ("0.0", "-0.0"):
        text = TOY_STUDY.replace("sigma = 0.5", f"sigma = {zero}")
        runs.append(desim.run(load_study(write_study(tmp_path / zero, text)).runs[0].scenario))
    assert np.array_equal(runs[0].metrics["value"], runs[1].metrics["value"])


def test_a_grid_of_zero_and_negative_zero_is_one_value_twice(tmp_path):
    text = TOY_STUDY + '\n[grid]\n"data.sigma" = [0.0, -0.0]\n'
    with pytest.raises(ConfigError, match=r"'data.sigma' = \[0.0, -0.0\]: values must be distinct"):
        load_study(write_study(tmp_path / "s", text))


# --------------------------------------------------------------------------------------------
# too large for memory, under --force


def test_a_pricer_dimension_too_large_for_memory_is_one_line_under_force(tmp_path, capsys):
    # 10 × 10¹⁴ coordinates of 8 bytes: more than any address space, refused at once
    text = PRICER.replace("dimension = 5", "dimension = 100000000000000")
    text = text.replace('"defaults.trusted" = [1, 100, 200]', '"defaults.trusted" = [1]')
    folder = write_study(tmp_path / "p", text)
    errors = _errors(folder, capsys, "run", "--force", "--no-progress")
    assert len(errors) == 2, errors  # P1 and P2, each checked as it would run
    for name, error in zip(("P1", "P2"), errors, strict=True):
        assert f"scenario '{name}': [data]: dimension = 100000000000000: " in error, error
        assert " GiB per copy" in error
    assert not (folder / "results" / "runs").exists()
