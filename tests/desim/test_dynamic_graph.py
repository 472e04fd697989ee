"""Graphs that change during a run ([topology] rewire and sequence): the study syntax, its
one-line refusals, the schedule (`desim.topologies.dynamic`) and the engine's hook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from desim.kernel.randomness import Streams
from desim.study.cli import main
from desim.study.spec import load_study
from desim.topologies.dynamic import Dynamics, Rewire, difference, rewired
from desim.topologies.generators import RandomRegular

STUDY = """\
[study]
title = "changing graph"
replicates = 1
t_max = 200
checkpoints = 5

[data]
model = "classes"
agents = 12

[topology]
{topology}

[[scenario]]
name = "C"
protocol = "{protocol}"
"""

RING = "".join(f"{a} {(a + 1) % 12}\n" for a in range(12))
CHORDS = RING + "0 6\n3 9\n"


def write(folder: Path, topology: str, protocol: str = "c-colme", files=None) -> Path:
    """A study folder with this [topology] body and graph files."""
    folder.mkdir(parents=True)
    (folder / "study.toml").write_text(STUDY.format(topology=topology, protocol=protocol))
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    return folder


REGULAR = 'model = "regular"\ndegree = 4\n'


@pytest.mark.parametrize(
    ("topology", "files", "fragment"),
    [
        (REGULAR + "rewire = {every = 10, fraction = 0.0}", {}, "fraction = 0.0"),
        (REGULAR + "rewire = {every = 10, fraction = 1.5}", {}, "fraction = 1.5"),
        (REGULAR + "rewire = {every = -1}", {}, "every = -1"),
        (REGULAR + "rewire = {each = 3}", {}, "each"),
        (REGULAR + 'sequence = [{at = 500, file = "g.edges"}]', {"g.edges": RING}, "beyond t_max"),
        (
            REGULAR + 'sequence = [{at = 50, file = "g.edges"}, {at = 50, file = "g.edges"}]',
            {"g.edges": RING},
            "times must increase",
        ),
        (REGULAR + 'sequence = [{at = 50, file = "nope.edges"}]', {}, "no such graph file"),
        (REGULAR + 'sequence = [{at = 50, file = "../x.edges"}]', {}, "out of the study folder"),
        (REGULAR + 'sequence = [{at = 50, file = "g.edges"}]', {"g.edges": "0 12\n"}, "agent 12"),
        (
            REGULAR + 'rewire = {every = 5}\nsequence = [{at = 50, file = "g.edges"}]',
            {"g.edges": RING},
            "not both",
        ),
        (REGULAR + "sequence = []", {}, "non-empty list"),
        ('model = "complete"\nrewire = {every = 5, fraction = 0.5}', {}, "pairs are not linked"),
    ],
)
def test_bad_changing_graphs_are_refused_in_one_line(tmp_path, capsys, topology, files, fragment):
    folder = write(tmp_path / "s", topology, files=files)
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err


def test_a_protocol_that_cannot_follow_a_changing_graph_is_refused(tmp_path, capsys):
    folder = write(tmp_path / "s", REGULAR + "rewire = {every = 10}", protocol="ideal-component")
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not follow a graph that changes" in err


def test_the_graph_families_follow_changes_over_links_that_are_not_ideal(tmp_path):
    folder = write(tmp_path / "s", REGULAR + "rewire = {every = 10}")
    text = (folder / "study.toml").read_text()
    text += '\n[[scenario]]\nname = "P"\nprotocol = "private-colme"\npeers = "topology"\n'
    (folder / "study.toml").write_text(text + '\n[network]\nlinks = "fixed-latency"\nslots = 1.0\n')
    assert main(["validate", str(folder)]) == 0


def test_valid_changing_graphs_validate(tmp_path):
    ok = write(tmp_path / "a", REGULAR + "rewire = {every = 10, fraction = 0.2}")
    assert main(["validate", str(ok)]) == 0
    seq = write(
        tmp_path / "b",
        'model = "file"\npath = "g0.edges"\nsequence = [{at = 20, file = "g1.edges"}]',
        files={"g0.edges": RING, "g1.edges": CHORDS},
    )
    assert main(["validate", str(seq)]) == 0


def test_the_sequence_files_bytes_are_in_the_config_hash(tmp_path):
    folder = write(
        tmp_path / "s",
        'model = "file"\npath = "g0.edges"\nsequence = [{at = 20, file = "g1.edges"}]',
        files={"g0.edges": RING, "g1.edges": CHORDS},
    )
    before = load_study(folder).runs[0].config_hash
    (folder / "g1.edges").write_text(CHORDS + "1 7\n")
    assert load_study(folder).runs[0].config_hash != before


def test_a_grid_sweeps_the_rewiring_period(tmp_path):
    folder = write(tmp_path / "s", REGULAR + "rewire = {every = 0, fraction = 0.1}")
    text = (folder / "study.toml").read_text()
    (folder / "study.toml").write_text(text + '\n[grid]\n"topology.rewire.every" = [0, 50]\n')
    study = load_study(folder)
    tables = [run.scenario.topology["rewire"] for run in study.runs]
    assert tables == [{"every": 0, "fraction": 0.1}, {"every": 50, "fraction": 0.1}]
    assert [run.point.columns for run in study.runs] == [{"every": 0}, {"every": 50}]


def _streams(seed: int = 1) -> Streams:
    return Streams(seed, 0, 7, 9)


def test_rewiring_keeps_the_link_count_and_moves_round_q_links():
    g = RandomRegular(degree=4).make(40, np.random.default_rng(0))
    new = rewired(g, 0.25, np.random.default_rng(1))
    added, dropped = difference(g, new)
    assert new.n_links == g.n_links == 80
    assert len(added) == len(dropped) == 20  # round(0.25 · 80)
    assert (added[:, 0] < added[:, 1]).all()  # no self-loops
    assert new.degree.sum() == g.degree.sum()


def test_the_schedule_changes_at_every_kth_slot_and_replays_graph_at():
    g = RandomRegular(degree=4).make(30, np.random.default_rng(0))
    streams = _streams()
    dyn = Dynamics(rewire=Rewire(every=25, fraction=0.2))

    def fresh():
        return np.random.default_rng(list(streams.spawn_key("rewire")))

    schedule = dyn.schedule(g, 100, fresh)
    assert schedule.times.tolist() == [25, 50, 75, 100]
    graphs = [schedule.change(t)[0] for t in (25, 50, 75)]
    for t, expected in ((1, g), (24, g), (25, graphs[0]), (60, graphs[1]), (99, graphs[2])):
        got = schedule.graph_at(t)
        assert np.array_equal(got.indices, expected.indices), t
    again = dyn.schedule(g, 100, fresh)
    assert np.array_equal(again.change(25)[0].indices, graphs[0].indices)  # keyed: the same


def test_the_rewire_stream_is_common_to_the_protocols_of_a_study():
    assert "rewire" in Streams.SHARED
    a, b = Streams(1, 0, 5, 100), Streams(1, 0, 5, 200)  # same data set-up, other runs
    assert a.spawn_key("rewire") == b.spawn_key("rewire")


def test_the_engine_refuses_graph_changes_for_a_protocol_without_the_hook():
    from desim.kernel.engine import Simulation
    from desim.models.baselines import Local
    from desim.models.data import ClassData

    data = ClassData(agents=6).make(np.random.default_rng(0))

    class Changes:
        times = np.array([3])

    with pytest.raises(ValueError, match="does not follow graph changes"):
        Simulation(Local(None), data, 5, _streams(), graphs=Changes())
