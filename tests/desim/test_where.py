"""A scenario that runs on part of the grid (`where`): its runs, its hashes, its checks."""

from __future__ import annotations

import pytest
from _toy import TOY_STUDY, write_study

from desim.kernel.params import ConfigError
from desim.study.spec import load_study

GRID = '\n[grid]\n"data.agents" = [6, 12, 24]\n'
WHERE = 'noise = "gaussian"\nwhere = { "data.agents" = [6, 24] }\n'


def _with_where(where: str = WHERE, grid: str = GRID) -> str:
    head, tail = TOY_STUDY.split('noise = "gaussian"\n')
    return head + where + tail + grid


def test_a_scenario_runs_only_at_the_grid_values_it_lists(tmp_path):
    study = load_study(write_study(tmp_path / "s", _with_where()))
    agents = {}
    for run in study.runs:
        agents.setdefault(run.scenario.name, set()).add(run.columns["agents"])
    assert agents == {"Toy A": {6, 12, 24}, "Toy B": {6, 24}}
    # `where` chooses runs; it is not part of what a run computes, so their hashes stay
    whole = load_study(write_study(tmp_path / "w", _with_where('noise = "gaussian"\n')))
    hashes = {r.run_id: r.config_hash for r in whole.runs}
    assert all(hashes[r.run_id] == r.config_hash for r in study.runs)
    assert len(whole.runs) - len(study.runs) == 2  # Toy B at 12 agents, 2 replicates


@pytest.mark.parametrize(
    "where,grid,fragment",
    [
        ('where = { "data.sigma" = [0.5] }\n', GRID, "'data.sigma' is not swept by the [grid]"),
        ('where = { "data.agents" = [7] }\n', GRID, "'data.agents' = 7 is not a value of the"),
        ('where = { "data.agents" = [6] }\n', "", "(the study has no [grid])"),
        ("where = 5\n", GRID, "where = 5: must be a table of grid paths"),
        ('where = { "data.agents" = [] }\n', GRID, "must be a table of grid paths"),
    ],
)
def test_a_where_that_would_never_run_is_refused_in_one_line(tmp_path, where, grid, fragment):
    folder = write_study(tmp_path / "s", _with_where('noise = "gaussian"\n' + where, grid))
    with pytest.raises(ConfigError) as info:
        load_study(folder)
    message = str(info.value)
    assert "scenario 'Toy B': where" in message and fragment in message
    assert "\n" not in message


def test_memory_is_estimated_at_the_grid_points_a_scenario_runs_at(tmp_path):
    # Private-ColME holds M² pair state: 10⁶ agents is refused, unless it never runs there
    text = _with_where(
        'where = { "data.agents" = [6] }\n', '\n[grid]\n"data.agents" = [6, 1000000]\n'
    ).replace('protocol = "toy-local-mean"\nwhere', 'protocol = "private-colme"\nwhere')
    text = text.replace("epsilon = 1.0\n", "")
    study = load_study(write_study(tmp_path / "s", text))
    assert {r.columns["agents"] for r in study.runs if r.scenario.name == "Toy B"} == {6}
    everywhere = text.replace('where = { "data.agents" = [6] }\n', "")
    with pytest.raises(ConfigError, match="scenario 'Toy B': private-colme with agents = 1000000"):
        load_study(write_study(tmp_path / "e", everywhere))
