"""Helpers of the model tests: the two-class data set-up and one protocol run measured at every
slot (the ledger, budget and asynchrony tests read each slot's metrics), one run measured at
its end with the `adversaries` metric (the adversary tests of every family), and `desim validate`
of small studies on a 4-regular graph, static or rewired (the graph families' refusals), and a
Private-ColME class run on three classes (the dense, positions and incremental tests).

A test module imports them (`from _runs import class_data, every_slot`): pytest puts this folder
on sys.path to import the module.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.colme.protocol import PrivateColME
from desim.study.cli import main


def class_data(m: int, seed: int = 0):
    """M agents of two classes (means 0.2 and 0.8, uniform samples of σ = 0.5)."""
    spec = build(
        DATA.get("classes"), {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    )
    return spec.make(np.random.default_rng(seed))


def run_private_colme(
    cls: type, params: dict, m: int, t_max: int, seed: int, checkpoints, links=None
):
    """A Private-ColME class (or subclass) run on three classes of M agents (means −0.3, 0.2,
    0.8, σ = 0.5) for t_max slots, streams keyed by `seed`; the protocol after the run."""
    spec = build(
        DATA.get("classes"), {"agents": m, "class_means": [-0.3, 0.2, 0.8], "sigma": 0.5}, "data"
    )
    proto = cls(build(PrivateColME.Params, params, "test"))
    Simulation(
        proto,
        spec.make(np.random.default_rng(seed)),
        t_max,
        Streams(seed, 0, 1, 2),
        links=links,
        checkpoints=np.asarray(checkpoints),
    ).run()
    return proto


def adversary_run(protocol: str, params: dict, source, t_max: int):
    """(protocol, metrics at t_max) of one run of `protocol` on `source` with fixed stream keys
    and the `adversaries` metric: the honest agents' data and noise are those of the same run
    without adversaries."""
    cls = PROTOCOLS.get(protocol)
    proto = cls(build(cls.Params, params, "test"))
    out = Simulation(
        proto,
        source,
        t_max,
        Streams(7, 0, 11, 22),
        checkpoints=np.array([t_max]),
        metrics=[METRICS.get("adversaries")],
    ).run()
    return proto, dict(zip(out.metrics.metric, out.metrics.value, strict=True))


def every_slot(
    params: dict,
    m: int,
    t_max: int,
    links=None,
    seed: int = 0,
    *,
    protocol: str = "private-colme",
    cls: type | None = None,
    metrics=(),
    per_agent: bool = False,
):
    """(protocol, output) of one run of `protocol` (built from `params`; `cls` a subclass to run
    in its place) on `class_data(m, seed)`, measured at every slot."""
    base = PROTOCOLS.get(protocol)
    proto = (cls or base)(build(base.Params, params, "test"))
    sim = Simulation(
        proto,
        class_data(m, seed),
        t_max,
        Streams(seed, 0, 11, 22),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=per_agent,
        metrics=list(metrics),
    )
    return proto, sim.run()


def run_study_text(folder, text: str):
    """Write `text` as `folder`/study.toml, validate and run it through the CLI (each must
    exit 0); returns the folder."""
    from desim.study.cli import main  # here: importing this module loads no study layer

    folder.mkdir()
    (folder / "study.toml").write_text(text)
    assert main(["validate", str(folder)]) == 0
    assert main(["run", str(folder)]) == 0
    return folder


def summary_rows(folder, metric: str, capsys) -> dict[str, list[str]]:
    """`desim summary --metric` of the study in `folder`, its rows by first column (the
    scenario), each split on white space; output printed before is discarded."""
    from desim.study.cli import main

    capsys.readouterr()
    assert main(["summary", str(folder), "--metric", metric]) == 0
    return {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}


GRAPH_STUDY = """
[study]
title = "adversaries on a graph"
t_max = 50
checkpoints = 5
metrics = ["adversaries"]

[data]
model = "classes"
agents = 30

[topology]
model = "regular"
degree = 4

{table}

[[scenario]]
name = "C"
protocol = "{protocol}"
{extra}
"""


def validate_graph_study(
    tmp_path: Path, capsys, table: str, protocol: str, extra: str = ""
) -> tuple[int, str]:
    """(exit code, stderr) of `desim validate` on 30 agents of a 4-regular graph running
    `protocol` with the `table` (e.g. an [adversaries] table) and the scenario's `extra` keys."""
    folder = tmp_path / f"s-{protocol}"
    folder.mkdir()
    text = GRAPH_STUDY.format(table=table, protocol=protocol, extra=extra)
    (folder / "study.toml").write_text(text)
    code = main(["validate", str(folder)])
    return code, capsys.readouterr().err


REWIRED_STUDY = (
    '[study]\ntitle = "x"\nreplicates = 1\nt_max = 50\n\n[data]\nmodel = "classes"\n'
    'agents = 12\n\n[topology]\nmodel = "regular"\ndegree = 4\n'
    'rewire = {{every = 10}}\n\n[[scenario]]\nname = "P"\nprotocol = "private-colme"\n'
    'peers = "topology"\n{extra}\n'
)


def validate_rewired(tmp_path: Path, extra: str) -> int:
    """Exit code of `desim validate` on Private-ColME (``peers = "topology"``) over 12 agents
    of a 4-regular graph rewired every 10 slots, the scenario's `extra` keys added."""
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(REWIRED_STUDY.format(extra=extra))
    return main(["validate", str(folder)])
