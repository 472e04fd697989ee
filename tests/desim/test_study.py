"""Study files: every validation error is one line naming the field, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
from _toy import TOY_STUDY, write_study

from desim.kernel.params import ConfigError
from desim.study.cli import main
from desim.study.spec import load_study, slug

# (name, edit of the toy study, fragments the one-line message must contain)
# An edit is (old, new): the first `old` in the file becomes `new`; old = "" appends `new`.
BAD_STUDIES = [
    (
        "unknown key",
        ("seed = 7", "sed = 7"),
        ["[study]", "unknown key 'sed'", "did you mean 'seed'"],
    ),
    (
        "unknown top-level table",
        ("[defaults]", "[defualts]"),
        ["unknown key 'defualts'", "did you mean 'defaults'"],
    ),
    (
        "unknown protocol param",
        ('noise = "gaussian"', 'noize = "gaussian"'),
        ["scenario 'Toy B'", "unknown key 'noize'", "did you mean 'noise'"],
    ),
    (
        "unknown [defaults] key",
        ("epsilon = 1.0", "epsilom = 1.0"),
        ["[defaults]", "unknown key 'epsilom'", "did you mean 'epsilon'"],
    ),
    (
        "wrong type",
        ("replicates = 2", 'replicates = "two"'),
        ["[study]", "replicates = 'two'", "must be an integer"],
    ),
    ("wrong type of a table", ("[study]", "grid = 3\n[study]"), ["grid must be a table"]),
    (
        "table instead of an array",
        ("[[curve]]", "[curve]"),
        ["curve must be an array of tables", "[[curve]]"],
    ),
    ("missing title", ('title = "toy"', ""), ["[study]", "title is required"]),
    ("negative seed", ("seed = 7", "seed = -1"), ["seed = -1", "must be ≥ 0"]),
    ("zero replicates", ("replicates = 2", "replicates = 0"), ["replicates = 0", "≥ 1"]),
    ("one checkpoint", ("checkpoints = 8", "checkpoints = 1"), ["checkpoints = 1", "≥ 2"]),
    ("T < 1", ("t_max = 50", "t_max = 0"), ["[study]", "t_max = 0", "must be ≥ 1"]),
    (
        "epsilon <= 0 in defaults",
        ("epsilon = 1.0", "epsilon = 0.0"),
        ["epsilon = 0.0", "must be > 0", "[defaults]"],
    ),
    (
        "epsilon <= 0 in a scenario",
        ('noise = "gaussian"', 'noise = "gaussian"\nepsilon = -1'),
        ["scenario 'Toy B'", "epsilon = -1", "must be > 0"],
    ),
    (
        "delta >= 1",
        ('noise = "gaussian"', 'noise = "gaussian"\ndelta = 1.5'),
        ["scenario 'Toy B'", "delta = 1.5", "> 0 and < 1"],
    ),
    (
        "delta <= 0",
        ('noise = "gaussian"', 'noise = "gaussian"\ndelta = 0'),
        ["delta = 0", "> 0 and < 1"],
    ),
    (
        "Literal protocol field",
        ('noise = "gaussian"', 'noise = "gausian"'),
        ["scenario 'Toy B'", "noise = 'gausian'", "one of 'none', 'gaussian'"],
    ),
    ("M < 2", ("agents = 6", "agents = 1"), ["data", "agents = 1", "must be ≥ 2"]),
    ("negative sigma", ("sigma = 0.5", "sigma = -0.5"), ["data", "sigma = -0.5", "≥ 0"]),
    (
        "empty class list",
        ("class_means = [0.2, 0.8]", "class_means = []"),
        ["data", "class_means = []", "must not be empty"],
    ),
    (
        "unknown protocol",
        ('protocol = "toy-local-mean"', 'protocol = "toy-local-meen"'),
        ["scenario 'Toy A'", "unknown protocol 'toy-local-meen'", "did you mean 'toy-local-mean'"],
    ),
    (
        "unknown data model",
        ('model = "classes"', 'model = "clases"'),
        ["[data]", "model", "unknown data model 'clases'", "did you mean 'classes'"],
    ),
    (
        "unknown link model",
        ("", '[network]\nlinks = "idael"\n'),
        ["[network]", "links", "unknown link model 'idael'", "did you mean 'ideal'"],
    ),
    (
        "bad link param",
        ("", '[network]\nlinks = "fixed-latency"\nslots = -2\n'),
        ["network", "slots = -2", "≥ 0"],
    ),
    (
        "unknown curve",
        ('kind = "toy-local"', 'kind = "toy-locl"'),
        ["curve 'toy curve'", "unknown curve 'toy-locl'", "did you mean 'toy-local'"],
    ),
    (
        "bad curve param",
        ('kind = "toy-local"', 'kind = "toy-local"\nscale = 0'),
        ["curve 'toy curve'", "scale = 0", "> 0"],
    ),
    (
        "duplicate scenario names",
        ('name = "Toy B"', 'name = "Toy A"'),
        ["scenario 'Toy A'", "used twice"],
    ),
    ("missing scenario name", ('name = "Toy B"\n', ""), ["[[scenario]] #2", "name is missing"]),
    (
        "unknown array of tables",
        ("[[scenario]]", "[[senario]]"),
        ["unknown key 'senario'", "did you mean 'scenario'"],
    ),
    (
        "plot of an unknown scenario",
        ('file = "toy.png"', 'file = "toy.png"\nscenarios = ["Toy C"]'),
        ["plot 'toy.png'", "unknown scenario 'Toy C'", "allowed: Toy A, Toy B"],
    ),
    (
        "plot of an unknown curve",
        ('curves = ["toy curve"]', 'curves = ["toy curv"]'),
        ["plot 'toy.png'", "unknown curve 'toy curv'", "did you mean 'toy curve'"],
    ),
    (
        "plot file with a folder",
        ('file = "toy.png"', 'file = "../toy.png"'),
        ["file = '../toy.png'", "file name ending in .png"],
    ),
    (
        "plot limits",
        ('file = "toy.png"', 'file = "toy.png"\nylim = [1.0, 0.1]'),
        ["ylim = [1.0, 0.1]", "0 < low < high"],
    ),
    (
        "bad grid root",
        ("", '[grid]\n"dat.agents" = [4, 6]\n'),
        ["[grid]", "'dat.agents'", "data.<key>"],
    ),
    (
        "bad grid key",
        ("", '[grid]\n"data.agentz" = [4, 6]\n'),
        ["[grid]", "unknown key 'agentz'", "did you mean 'agents'"],
    ),
    (
        "grid values not a list",
        ("", '[grid]\n"data.agents" = 4\n'),
        ["'data.agents' = 4", "non-empty list"],
    ),
    (
        "bad grid value",
        ("", '[grid]\n"data.agents" = [1, 6]\n'),
        ["grid point agents = 1", "agents = 1", "must be ≥ 2"],
    ),
    (
        "swept default overridden by a scenario",
        (
            'noise = "gaussian"',
            'noise = "gaussian"\nepsilon = 2.0\n[grid]\n"defaults.epsilon" = [1.0]',
        ),
        ["[grid]", "'defaults.epsilon'", "scenario 'Toy B' sets epsilon = 2.0 itself"],
    ),
    ("bad quick value", ("t_max = 20", "t_max = -5"), ["[quick]", "t_max = -5", "≥ 1"]),
    ("TOML syntax", ("seed = 7", "seed = = 7"), ["not valid TOML", "line"]),
]


def edit(text: str, change: tuple[str, str]) -> str:
    old, new = change
    if not old:
        return text + "\n" + new
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize("name,change,fragments", BAD_STUDIES, ids=[b[0] for b in BAD_STUDIES])
def test_bad_study_is_one_line_naming_the_field_and_writes_nothing(
    tmp_path, capsys, name, change, fragments
):
    folder = write_study(tmp_path / "s", edit(TOY_STUDY, change))
    with pytest.raises(ConfigError) as info:
        load_study(folder)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert str(folder / "study.toml") in message  # names the file

    assert main(["run", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("desim: error: ") and err.count("\n") == 1
    assert fragments[-1] in err
    assert not (folder / "results").exists() and not (folder / "figures").exists()


def test_a_study_needs_a_scenario(tmp_path):
    text = TOY_STUDY.split("[[scenario]]")[0]
    with pytest.raises(ConfigError, match=r"no \[\[scenario\]\]"):
        load_study(write_study(tmp_path / "s", text))


def test_the_toy_study_itself_is_valid(toy_study):
    study = load_study(toy_study)
    assert len(study.runs) == 4 and len(study.curve_jobs) == 1
    assert [r.run_id for r in study.runs] == [
        "toy-a_r000",
        "toy-a_r001",
        "toy-b_r000",
        "toy-b_r001",
    ]


def test_missing_study_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no study.toml in this folder"):
        load_study(tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        load_study(tmp_path / "nowhere" / "study.toml")


def test_study_path_may_be_the_folder_or_the_file(toy_study):
    assert load_study(toy_study).runs == load_study(toy_study / "study.toml").runs


def test_defaults_reach_declaring_protocols_and_curves_and_scenarios_win(tmp_path):
    text = TOY_STUDY.replace("epsilon = 1.0", "epsilon = 2.5").replace(
        'noise = "gaussian"', 'noise = "gaussian"\nepsilon = 4.0'
    )
    study = load_study(write_study(tmp_path / "s", text))
    by_name = {r.scenario.name: r.scenario.params for r in study.runs}
    assert by_name["Toy A"] == {"epsilon": 2.5}
    assert by_name["Toy B"] == {"epsilon": 4.0, "noise": "gaussian"}
    assert study.curve_jobs[0].params.epsilon == 2.5


def test_grid_expands_to_points_with_columns_ids_and_stable_hashes(tmp_path):
    grid = '[grid]\n"data.agents" = [4, 6]\n"defaults.epsilon" = [0.5, 1]\n'
    study = load_study(write_study(tmp_path / "s", TOY_STUDY + grid))
    assert study.grid_columns == {"data.agents": "agents", "defaults.epsilon": "epsilon"}
    assert [p.columns for p in study.points] == [
        {"agents": 4, "epsilon": 0.5},
        {"agents": 4, "epsilon": 1.0},
        {"agents": 6, "epsilon": 0.5},
        {"agents": 6, "epsilon": 1.0},
    ]
    assert len(study.runs) == 2 * 4 * 2 and len(study.curve_jobs) == 4
    first = study.runs[0]
    assert first.run_id == "toy-a_agents-4_epsilon-0.5_r000"
    assert first.scenario.data["agents"] == 4 and first.scenario.params["epsilon"] == 0.5
    assert len({r.run_id for r in study.runs}) == len(study.runs)
    assert len({r.config_hash for r in study.runs}) == len(study.runs)

    # adding a grid value leaves every existing run's id and hash alone (resume keeps them)
    more = grid.replace("[4, 6]", "[4, 6, 8]")
    bigger = load_study(write_study(tmp_path / "s2", TOY_STUDY + more))
    old = {(r.run_id, r.config_hash) for r in study.runs}
    new = {(r.run_id, r.config_hash) for r in bigger.runs}
    assert old < new and len(new - old) == 2 * 2 * 2


def test_changing_one_scenario_changes_only_its_hashes(tmp_path):
    a = load_study(write_study(tmp_path / "a"))
    b = load_study(
        write_study(
            tmp_path / "b",
            TOY_STUDY.replace('noise = "gaussian"', 'noise = "gaussian"\nepsilon = 3.0'),
        )
    )
    changed = {
        ra.run_id for ra, rb in zip(a.runs, b.runs, strict=True) if ra.config_hash != rb.config_hash
    }
    assert changed == {"toy-b_r000", "toy-b_r001"}
    assert a.config_hash != b.config_hash


def test_common_random_numbers_and_spawn_keys(toy_study):
    runs = load_study(toy_study).runs
    a0, a1, b0 = runs[0].spawn, runs[1].spawn, runs[2].spawn
    assert a0["shared_key"] == b0["shared_key"]  # same data set-up: same samples
    assert a0["run_key"] != b0["run_key"]  # different protocol params: own noise
    assert (a0["replicate"], a1["replicate"]) == (0, 1) and a0["seed"] == 7


def test_quick_overrides_and_writes_elsewhere(toy_study):
    full, quick = load_study(toy_study), load_study(toy_study, quick=True)
    assert (quick.replicates, quick.t_max, quick.checkpoints) == (1, 20, 8)
    assert quick.results_dir == toy_study / "quick" / "results"
    assert quick.figures_dir == toy_study / "quick" / "figures"
    assert full.results_dir == toy_study / "results"
    assert full.config_hash != quick.config_hash


def test_quick_without_a_quick_table_uses_a_small_fallback(tmp_path):
    text = TOY_STUDY.replace("[quick]\nreplicates = 1\nt_max = 20\n", "").replace(
        "t_max = 50", "t_max = 5000"
    )
    study = load_study(write_study(tmp_path / "s", text), quick=True)
    assert (study.replicates, study.t_max) == (2, 1000)


def test_quick_agents_override_data(tmp_path):
    text = TOY_STUDY.replace("t_max = 20", "t_max = 20\nagents = 3")
    study = load_study(write_study(tmp_path / "s", text), quick=True)
    assert study.runs[0].scenario.data["agents"] == 3


def test_default_plot_draws_all_scenarios_and_curves(tmp_path):
    text = TOY_STUDY.split("[[plot]]")[0]
    (plot,) = load_study(write_study(tmp_path / "s", text)).plots
    assert plot.file == "mse.png" and plot.metric == "mse"
    assert plot.scenarios == ("Toy A", "Toy B") and plot.curves == ("toy curve",)


def test_scenario_names_that_slug_alike_are_rejected(tmp_path):
    text = TOY_STUDY.replace('name = "Toy B"', 'name = "toy-a"')
    with pytest.raises(ConfigError, match="same run id"):
        load_study(write_study(tmp_path / "s", text))


def test_slug():
    assert slug("PM-I non-MoM RR") == "pm-i-non-mom-rr"
    assert slug(0.5) == "0.5" and slug(1e-6) == "1e-06" and slug([0.2, 0.8]) == "0.2-0.8"
    assert slug("!!!") == "x"


def test_list_valued_grid_column_is_stored_as_text(tmp_path):
    grid = '[grid]\n"data.class_means" = [[0.2, 0.8], [0.1, 0.9]]\n'
    study = load_study(write_study(tmp_path / "s", TOY_STUDY + grid))
    assert study.points[0].columns == {"class_means": "[0.2, 0.8]"}
    assert study.runs[0].scenario.data["class_means"] == [0.2, 0.8]
    assert Path(study.runs[0].run_id).name == "toy-a_class_means-0.2-0.8_r000"
