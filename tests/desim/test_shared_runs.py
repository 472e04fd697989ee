"""Runs that give one trajectory are simulated once (`desim.study.sharing`): a protocol whose
`Protocol.reads` is exact (`Protocol.reads_exact`) gives the same trajectory at every value of
a table it does not read, and every run of such a group is written as its own fresh run would
have been (the same record bytes, its own warnings), locally, on a pool and on a cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _toy import write_study

from desim.kernel.plugins import load_plugins
from desim.kernel.protocol import Protocol
from desim.kernel.registry import PROTOCOLS
from desim.study.cli import main
from desim.study.results import run_study
from desim.study.scenario import Scenario
from desim.study.scenario import run as run_scenario
from desim.study.sharing import Lead, share_runs, unread_tables
from desim.study.spec import load_study
from desim.study.store import fingerprint

# two settings of every table a protocol may leave unread: links that fail and delay, graphs
# of other degrees (the runs' own streams are keyed on both: `Scenario.run_key`)
NETWORKS = (
    {"links": "ideal"},
    {
        "links": "bernoulli",
        "p_link": 0.6,
        "latency": {"model": "exponential", "mean": 2.0},
        "outages": {"model": "markov", "mean_up": 5.0, "mean_down": 2.0},
    },
)
TOPOLOGIES = ({"model": "regular", "degree": 2}, {"model": "regular", "degree": 5})
DATA = {"model": "classes", "agents": 12, "class_means": [0.2, 0.8], "sigma": 0.5}

load_plugins()  # the registries fill when the plug-in packages are imported
DECLARED = sorted(name for name, cls in PROTOCOLS.items() if getattr(cls, "reads_exact", False))


def _scenario(protocol: str, network: dict, topology: dict, metrics=("accuracy",)) -> Scenario:
    return Scenario(
        protocol,
        data=DATA,
        network=network,
        topology=topology,
        t_max=60,
        seed=3,
        replicate=1,
        checkpoints=8,
        per_agent=True,
        metrics=metrics,
    )


def test_the_baselines_declare_it_and_the_default_is_false():
    assert Protocol.reads_exact is False
    assert {"local", "ideal", "ideal-component"} <= set(DECLARED)
    for name in ("private-colme", "c-colme", "pricer", "eb-gaussian"):
        assert not PROTOCOLS.get(name).reads_exact


@pytest.mark.parametrize("protocol", DECLARED)
def test_a_declaring_protocol_gives_one_trajectory_whatever_it_does_not_read(protocol):
    """Every protocol declaring `reads_exact`: runs at two settings of each table it does not
    read (whose own random streams differ) give identical records, bit for bit."""
    cls = PROTOCOLS.get(protocol)
    tops = TOPOLOGIES if "topology" not in cls.reads else TOPOLOGIES[:1]
    runs = [_scenario(protocol, n, t) for n in NETWORKS for t in tops]
    assert len({s.run_key for s in runs}) == len(runs)  # their own streams all differ
    first = run_scenario(runs[0])
    for s in runs[1:]:
        out = run_scenario(s)
        pd.testing.assert_frame_equal(out.metrics, first.metrics, check_exact=True)
        pd.testing.assert_frame_equal(out.agents, first.agents, check_exact=True)
        assert fingerprint(out.metrics) == fingerprint(first.metrics)


def test_what_a_run_may_leave_unread():
    net, top = NETWORKS[1], TOPOLOGIES[0]
    assert unread_tables(_scenario("local", net, top)) == {"network", "topology"}
    assert unread_tables(_scenario("ideal-component", net, top)) == {"network"}
    # a metric reading the graph keeps the topology; undeclared metrics keep both
    assert unread_tables(_scenario("local", net, top, ("corollary1",))) == {"network"}
    assert unread_tables(_scenario("local", net, top, ("toy-undeclared",))) == set()
    # a protocol not declaring it, or reading the network, shares nothing
    assert unread_tables(_scenario("private-colme", net, None)) == set()
    assert unread_tables(_scenario("c-colme", net, top)) == set()


# --------------------------------------------------------------------------------------------
# studies

STUDY = """\
[study]
title = "shared"
seed = 5
replicates = 2
t_max = 25
checkpoints = 4
metrics = ["accuracy"]

[data]
model = "classes"
agents = 8
class_means = [0.2, 0.8]
sigma = 0.5

[network]
links = "ideal"

[network.latency]
model = "exponential"
mean = 1.0

[grid]
"network.latency.mean" = [0.5, 2.0, 5.0]

[[scenario]]
name = "Private-ColME"
protocol = "private-colme"
epsilon = 1.0

[[scenario]]
name = "local"
protocol = "local"

[[scenario]]
name = "ideal"
protocol = "ideal"
"""

# a topology sweep: the graph is disconnected at p = 0.05 (a warning of that run's set-up)
TOPOLOGY_STUDY = """\
[study]
title = "graphs"
seed = 2
replicates = 2
t_max = 30
checkpoints = 5
metrics = {metrics}

[data]
model = "classes"
agents = 12
class_means = [0.2, 0.8]
sigma = 0.5

[topology]
model = "erdos-renyi"
p = 0.5

[grid]
"topology.p" = [0.05, 0.9]

[[scenario]]
name = "ideal-component"
protocol = "ideal-component"

[[scenario]]
name = "local"
protocol = "local"
"""


def _records(folder: Path) -> dict[str, bytes]:
    """Every record and table a run writes, by name (the bytes that must not change)."""
    res = folder / "results"
    out = {p.name: p.read_bytes() for p in (res / "runs").glob("*.parquet")}
    out["metrics.parquet"] = (res / "metrics.parquet").read_bytes()
    return out


def _sidecars(folder: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (folder / "results" / "runs").glob("*.json")}


def _fresh(folder: Path) -> None:
    """Run the study with no protocol declaring `reads_exact` (every run simulated)."""
    with pytest.MonkeyPatch.context() as m:
        for name in DECLARED:
            m.setattr(PROTOCOLS.get(name), "reads_exact", False)
        summary = run_study(load_study(folder), progress=False)
    assert summary.ok and summary.shared == 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The study with every run simulated (sharing off): records and sidecars."""
    folder = write_study(tmp_path_factory.mktemp("fresh") / "s", STUDY)
    _fresh(folder)
    return _records(folder), _sidecars(folder)


def test_a_network_sweep_simulates_the_baselines_once(tmp_path, reference, capsys, no_figures):
    folder = write_study(tmp_path / "s", STUDY)
    assert main(["run", str(folder), "--no-progress"]) == 0
    out = capsys.readouterr().out
    # 3 scenarios × 3 points × 2 replicates; local and ideal: 2 simulated each, 8 shared
    assert "18 runs: 18 done (10 computed, 8 shared with an identical run), 0 skipped" in out
    assert _records(folder) == reference[0]
    sides, fresh = _sidecars(folder), reference[1]
    assert sides.keys() == fresh.keys()
    shared = {n: s for n, s in sides.items() if "shared_with" in s}
    assert len(shared) == 8
    for name, side in sides.items():
        for key in ("run_id", "grid", "spawn", "warnings", "fingerprint", "files"):
            assert side[key] == fresh[name][key], (name, key)
    runs = {s["run_id"]: s for s in sides.values()}
    for side in shared.values():  # shared with the run of its scenario and replicate simulated
        lead = runs[side["shared_with"]]
        assert "shared_with" not in lead
        assert (lead["scenario"], lead["replicate"]) == (side["scenario"], side["replicate"])
    manifest = json.loads((folder / "results" / "manifest.json").read_text())
    assert (manifest["invocations"][-1]["ran"], manifest["invocations"][-1]["shared"]) == (18, 8)
    assert main(["verify", str(folder)]) == 0  # every run, shared or not, re-run on its own


def test_a_pool_gives_the_same_bytes(tmp_path, reference):
    folder = write_study(tmp_path / "s", STUDY)
    summary = run_study(load_study(folder), workers=2, progress=False)
    assert summary.ok and (summary.done, summary.shared) == (18, 8)
    assert _records(folder) == reference[0]


def test_a_resume_runs_what_is_missing_as_a_fresh_run_would(tmp_path, reference):
    folder = write_study(tmp_path / "s", STUDY)
    assert run_study(load_study(folder), progress=False).shared == 8
    sides = _sidecars(folder)
    # an interrupted group: the simulated run of local's replicate 0 and one of its followers
    follower = next(s for s in sides.values() if s["scenario"] == "local" and "shared_with" in s)
    gone = [follower["shared_with"], follower["run_id"]]
    for side in sides.values():
        if side["run_id"] in gone:
            for name in [*side["files"], f"{side['config_hash']}.json"]:
                (folder / "results" / "runs" / name).unlink()
    summary = run_study(load_study(folder), progress=False)
    assert (summary.done, summary.shared, summary.skipped) == (2, 1, 16)
    assert _records(folder) == reference[0]


def test_a_failed_simulation_fails_every_run_it_stands_for(tmp_path, monkeypatch):
    folder = write_study(tmp_path / "s", STUDY)

    def fail(self):
        raise RuntimeError("local estimates fail")

    monkeypatch.setattr(PROTOCOLS.get("local"), "estimates", fail)  # not ideal's own
    summary = run_study(load_study(folder), progress=False)
    failed = {run_id for run_id, error in summary.failures if "local estimates fail" in error}
    assert len(failed) == 6 and all(r.startswith("local") for r in failed)
    assert (summary.done, summary.failed, summary.pending) == (12, 6, 0)


def test_a_topology_sweep_keeps_each_runs_own_warnings(tmp_path):
    """local shares across graphs; each of its runs keeps the disconnection warning of its own
    graph (ideal-component reads the graph: nothing to share between its points)."""
    text = TOPOLOGY_STUDY.format(metrics='["accuracy"]')
    shared, fresh = write_study(tmp_path / "shared", text), write_study(tmp_path / "fresh", text)
    summary = run_study(load_study(shared), progress=False)
    assert summary.ok and (summary.done, summary.shared) == (8, 2)
    _fresh(fresh)
    assert _records(shared) == _records(fresh)
    a, b = _sidecars(shared), _sidecars(fresh)
    assert {n: s["warnings"] for n, s in a.items()} == {n: s["warnings"] for n, s in b.items()}
    assert any(s["warnings"] and s["scenario"] == "local" for s in a.values())
    manifests = [json.loads((f / "results" / "manifest.json").read_text()) for f in (shared, fresh)]
    assert manifests[0]["warnings"] == manifests[1]["warnings"] != []


def test_a_metric_reading_the_graph_stops_sharing_across_graphs(tmp_path):
    folder = write_study(tmp_path / "s", TOPOLOGY_STUDY.format(metrics='["corollary1"]'))
    summary = run_study(load_study(folder), progress=False)
    assert summary.ok and (summary.done, summary.shared) == (8, 0)


def test_groups_follow_the_order_of_the_study(tmp_path):
    study = load_study(write_study(tmp_path / "s", STUDY))
    planned = share_runs(list(study.unique_runs))
    leads = [r for r in planned if isinstance(r, Lead)]
    assert [r.scenario.name for r in leads] == ["local", "local", "ideal", "ideal"]
    assert all(len(r.followers) == 2 for r in leads)
    members = [m.config_hash for r in planned for m in (r, *getattr(r, "followers", ()))]
    assert sorted(members) == sorted(r.config_hash for r in study.unique_runs)
    assert planned[0] is study.unique_runs[0]  # a run that shares nothing is handed on as is


@pytest.mark.slow
def test_a_cluster_gives_the_same_bytes(tmp_path, reference):
    pytest.importorskip("distributed")
    folder = write_study(tmp_path / "s", STUDY)
    summary = run_study(load_study(folder), progress=False, scheduler="local:1")
    assert summary.ok and (summary.done, summary.shared) == (18, 8)
    assert _records(folder) == reference[0]
