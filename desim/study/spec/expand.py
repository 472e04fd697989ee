"""Stage 3, expand: a validated study unrolled into its grid points, runs (scenario × point ×
replicate, each with its id and config hash) and curve jobs (curve × point)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

from desim.kernel.params import ConfigError, build, field_names
from desim.kernel.registry import CURVES, DATA
from desim.study.scenario import Scenario, resolve
from desim.study.spec.hashing import curve_hash, run_hash
from desim.study.spec.limits import Horizon
from desim.study.spec.model import (
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


def expand_runs(doc: StudyDocument, h: Horizon, v: Validated, points: list[GridPoint]) -> list[Run]:
    """Every run of the study: each scenario at each grid point and replicate, validated
    through the registries, run ids checked to be unique."""
    runs: list[Run] = []
    for i, spec in enumerate(v.scenarios):
        reach = reaching(spec, doc.grid)
        for point in points:
            base = _scenario_at(spec, point, doc, h)
            _resolve(base, point, spec, doc.defaults)
            values = {p: val for p, val in point.values.items() if p in reach}
            columns = {v.grid_columns[p]: point.columns[v.grid_columns[p]] for p in values}
            for rep in range(h.replicates):
                s = dataclasses.replace(base, replicate=rep)
                h_run = run_hash(s, values)
                runs.append(Run(_run_id(spec.name, columns, rep), s, i, point, h_run, columns))
    _check_unique_ids(runs)
    return runs


def expand_curves(
    doc: StudyDocument, h: Horizon, v: Validated, points: list[GridPoint]
) -> list[CurveJob]:
    """Every curve job of the study: each curve at each grid point."""
    return [
        _curve_job(curve, j, point, doc, h) for j, curve in enumerate(v.curves) for point in points
    ]


def reaching(spec: ScenarioSpec | CurveSpec, grid: dict) -> set[str]:
    """The grid paths that reach `spec`: its own tables always; a [defaults] key only when
    `spec` declares it; for a curve, data and (if it declares one) the topology."""
    names = set(declared(spec))
    out = set()
    for path in grid:
        root, _, key = path.partition(".")
        if root == "defaults":
            ok = key in names
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
        if subkey:  # network.<sub-table>.<key>: a copy of the sub-table, shared by every point
            tables[root][sub] = {**tables[root].get(sub, {}), subkey: value}
        else:
            tables[root][key] = value
    return data, network, defaults, topology


def _trace_files(network: dict, folder: Path) -> dict:
    """`network` with the trace `file` of its outages and nodes tables checked.

    A trace file is relative to the study folder and stays so in the scenario (its config hash
    holds no absolute path); the scenario resolves it against its folder when it runs.
    """
    for sub in TRACE_TABLES:
        table = network.get(sub)
        if is_table(table) and "file" in table:
            check_input_file(folder, table["file"], f"[network.{sub}]: file", "trace file")
    return network


def _scenario_at(spec: ScenarioSpec, point: GridPoint, doc: StudyDocument, h: Horizon) -> Scenario:
    """The scenario `spec` at grid `point` (replicate 0): defaults first, its own keys win."""
    folder = doc.file.parent
    data, network, defaults, topology = _apply_point(
        point, h.data, doc.network, doc.defaults, doc.topology
    )
    network = _trace_files(network, folder)
    names = set(declared(spec))
    params = {k: v for k, v in defaults.items() if k in names}
    params.update(spec.params)
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


def _resolve(s: Scenario, point: GridPoint, spec: ScenarioSpec, defaults: dict) -> None:
    """Validate `s` through the registries, saying where a bad value came from."""
    try:
        resolve(s)
    except ConfigError as exc:
        message = str(exc)
        for key in defaults:
            if key not in spec.params and f": {key} = " in message:
                message += " (set in [defaults])"
                break
        raise ConfigError(at_point(point, message)) from None


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
        check = getattr(params, "check", None)  # a curve's own limits, given the data
        if check is not None:
            try:
                check(data_params)
            except ValueError as exc:
                raise ConfigError(f"curve {curve.name!r}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(at_point(point, str(exc))) from None
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


def _run_id(name: str, columns: dict[str, Any], replicate: int) -> str:
    parts = [slug(name)]
    parts += [f"{col}-{slug(v)}" for col, v in columns.items()]
    parts.append(f"r{replicate:03d}")
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
