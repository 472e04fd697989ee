"""Runs that give one trajectory: simulated once, written for each.

A network or topology sweep changes every run's config hash (the scenario holds its tables) and
the key of its own random streams (`Scenario.run_key`), so committed results keep their hashes;
yet a protocol whose `Protocol.reads` is exact (`Protocol.reads_exact`), with metrics that read
no more than it does (`desim.kernel.registry.reads_tables`), gives the same trajectory at every
value of a table it does not read: the local and oracle baselines at each point of an outage or
latency sweep. `share_runs` groups such runs, the first of each group (a `Lead`) is simulated,
and every other one is written as its own fresh run would have been: the same record bytes under
its own config hash and grid columns, the warnings its own set-up raises (a graph disconnected
at one degree and not at another), and ``shared_with`` in its sidecar naming the run simulated.
The grouping is made before any run is handed to a worker, so results do not depend on how many
workers (or which cluster) compute them; a resume groups only what is left; `desim verify`
re-runs each run on its own.
"""

from __future__ import annotations

import dataclasses
import warnings

from desim.kernel.randomness import Streams
from desim.kernel.registry import METRICS, PROTOCOLS, metric_applies
from desim.study.scenario import Scenario, resolve
from desim.study.spec import Run
from desim.study.spec.hashing import canonical_text
from desim.topologies.files import build_graph

#: The study tables beyond [data] a protocol or metric may leave unread.
TABLES = frozenset({"network", "topology"})


@dataclasses.dataclass(frozen=True)
class Lead(Run):
    """A run simulated for a group of runs that give its trajectory (`followers`, written
    from it)."""

    followers: tuple[Run, ...] = ()


def members(run: Run) -> tuple[Run, ...]:
    """The runs `run` stands for: itself, and a `Lead`'s followers after it."""
    return (run, *getattr(run, "followers", ()))


def unread_tables(scenario: Scenario) -> frozenset[str]:
    """The tables of `scenario` its trajectory cannot depend on: those neither its protocol
    (when it declares `Protocol.reads_exact`) nor a metric recording for it reads.

    A protocol reading the network keeps the topology (its links may follow the graph), and
    one declaring message kinds keeps the network (the recorder counts drops on links that
    can fail).
    """
    cls = PROTOCOLS.get(scenario.protocol)
    if not getattr(cls, "reads_exact", False):
        return frozenset()
    read = set(cls.reads)
    for name in scenario.metrics:
        metric = METRICS.get(name)
        if metric_applies(metric, cls):
            read |= getattr(metric, "reads", TABLES)
    if "network" in read or cls.message_kinds:
        return frozenset()
    return TABLES - read


def share_key(scenario: Scenario) -> str | None:
    """What runs of one trajectory have in common: the scenario without its unread tables
    (None when it has none: the run shares with no other)."""
    unread = unread_tables(scenario)
    if not unread:
        return None
    plain = scenario.as_dict()
    for table in unread:
        plain.pop(table, None)
    return canonical_text(plain)


def share_runs(todo: list[Run]) -> list[Run]:
    """`todo` with each group of runs sharing a trajectory replaced by one `Lead` (its first
    run, in `todo` order, with the others as followers); the other runs as they are."""
    groups: dict[str, list[Run]] = {}
    order: list[Run | str] = []
    for run in todo:
        key = share_key(run.scenario)
        if key is None:
            order.append(run)
        elif key in groups:
            groups[key].append(run)
        else:
            groups[key] = [run]
            order.append(key)
    out: list[Run] = []
    for item in order:
        if isinstance(item, Run):
            out.append(item)
            continue
        first, *rest = groups[item]
        fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(Run)}
        out.append(Lead(**fields, followers=tuple(rest)) if rest else first)
    return out


def warning_texts(caught: list[warnings.WarningMessage]) -> set[str]:
    """The distinct warnings of `caught` as one-line texts (what sidecars record)."""
    return {f"{w.category.__name__}: {' '.join(str(w.message).split())}" for w in caught}


def setup_notes(scenario: Scenario) -> set[str]:
    """The warnings a run of `scenario` raises while it builds its data, graph and links
    (e.g. a disconnected graph): what differs between the runs of one trajectory."""
    r = resolve(scenario)
    s = scenario
    streams = Streams(s.seed, s.replicate, s.shared_key, s.run_key)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = r.data_params.make(streams.get("population"))
        if r.topology is not None:
            data.public["graph"] = build_graph(r.topology, data, streams.get("topology"))
        r.links.bind(data.n_agents, data.public, streams)
    return warning_texts(caught)


def follower_notes(lead: Run, notes: list[str]) -> list[list[str]]:
    """The warnings of each follower of `lead`, whose run raised `notes`: those of the lead's
    set-up replaced by the follower's own."""
    own = set(notes) - setup_notes(lead.scenario)
    followers: tuple[Run, ...] = getattr(lead, "followers", ())
    return [sorted(own | setup_notes(f.scenario)) for f in followers]
