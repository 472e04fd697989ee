"""Study files: one TOML file that says what to run, how often, over which grid, and what to draw.

`load_study` reads ``study.toml``, validates every table (unknown keys, types, ranges, names of
protocols, data models, link models, topologies, curves and metrics, references between tables)
and expands the study into its runs, before anything is run or written: a bad file stops with one
`ConfigError` line that names the field, the value and what is allowed (DESIGN principle 9).

A run is one (grid point, scenario, replicate): a `desim.study.scenario.Scenario` with a stable,
readable id and a config hash, which is what lets `desim run` resume where it stopped.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import itertools
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desim.kernel.params import ConfigError, build, field_names, param, unknown_key_message
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import CURVES, DATA, LINKS, METRICS, PROTOCOLS, TOPOLOGIES
from desim.network_models.realistic import NETWORK_TABLES, table_keys, unknown_table_message
from desim.study.scenario import Scenario, resolve

#: The file a study folder holds its specification in.
STUDY_FILE = "study.toml"
#: The top-level tables a study file may have.
TOP_KEYS = (
    "study", "quick", "data", "network", "topology", "defaults", "scenario", "curve", "plot",
    "grid",
)
#: The tables a grid path may start with.
GRID_ROOTS = ("data", "network", "topology", "defaults")
#: The [network] sub-tables whose `file` (a trace) is relative to the study folder.
TRACE_TABLES = ("outages", "nodes")
#: The curve parameter that receives the study's [topology] table (at each grid point).
CURVE_TOPOLOGY_KEY = "topology"
#: Column names of the results tables, which grid columns must not shadow.
RESERVED_COLUMNS = frozenset(
    {"scenario", "replicate", "t", "metric", "value", "curve", "stderr", "agent"}
)
#: What `--quick` uses when a study has no [quick] table (values never exceed the study's).
#: Names of the privacy ledger's metrics start so; a [[plot]] may take one as its x axis.
LEDGER_PREFIX = "eps_"
QUICK_FALLBACK = {"replicates": 2, "t_max": 1000}
#: File types a plot may be written as.
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


@dataclass(frozen=True)
class StudyTable:
    """The [study] table: title, root seed, replicates, horizon and checkpoints."""

    title: str = param("", "title of the study, shown on figures (required)")
    seed: int = param(0, "root seed of every random stream", ge=0)
    replicates: int = param(1, "independent replicates of every scenario", ge=1)
    t_max: int = param(1000, "horizon T: the number of slots simulated", ge=1)
    checkpoints: int = param(60, "number of log-spaced measurement times in [1, T]", ge=2)
    per_agent: bool = param(False, "also keep every agent's squared error (agents.parquet)")
    metrics: list[str] = param([], "extra metrics recorded at every checkpoint (`desim list`)")


@dataclass(frozen=True)
class QuickTable:
    """The [quick] table: what `--quick` changes to make a seconds-long smoke run."""

    replicates: int | None = param(None, "replicates in a quick run", ge=1)
    t_max: int | None = param(None, "horizon T in a quick run", ge=1)
    agents: int | None = param(None, "data.agents in a quick run", ge=2)
    checkpoints: int | None = param(None, "checkpoints in a quick run", ge=2)


@dataclass(frozen=True)
class PlotTable:
    """A [[plot]] table: one figure of one metric, some scenarios and some curves."""

    file: str = param("mse.png", "file name in figures/ (.png, .pdf or .svg)")
    title: str = param("", "figure title (default: the study title)")
    metric: str = param("mse", "the metric on the y axis")
    scenarios: list[str] | None = param(None, "scenarios drawn (default: all)")
    curves: list[str] = param([], "closed-form curves drawn dashed (default: none)")
    xlim: list[float] | None = param(None, "x-axis limits [low, high]")
    ylim: list[float] | None = param(None, "y-axis limits [low, high]")
    x: str = param("t", "x axis: the slot t (log scale), a grid column (linear; values at `at`) "
                   "or a privacy ledger metric (eps_…: the metric against the ε spent)")
    at: float | None = param(None, "with x a grid column: the slot drawn (default: the last)", ge=1)
    dashed: list[str] = param([], "more metrics of the same scenarios, drawn dashed (e.g. bound)")

    def __post_init__(self) -> None:
        name = Path(self.file).name
        if name != self.file or Path(name).suffix not in FIGURE_SUFFIXES:
            raise ValueError(
                f"file = {self.file!r}: must be a file name ending in "
                f"{', '.join(FIGURE_SUFFIXES)} (it is written to figures/)"
            )
        for key in ("xlim", "ylim"):
            lim = getattr(self, key)
            # a grid column: linear, may hold 0 (the ε spent is drawn on a log axis)
            linear = key == "xlim" and self.x != "t" and not self.x.startswith(LEDGER_PREFIX)
            ok = lim is None or (len(lim) == 2 and (linear or 0 < lim[0]) and lim[0] < lim[1])
            if not ok:
                low = "low < high" if linear else "0 < low < high"
                raise ValueError(f"{key} = {lim!r}: must be [low, high] with {low}")


@dataclass(frozen=True)
class ScenarioSpec:
    """A [[scenario]] table: its name, protocol name and the protocol parameters it sets."""

    name: str
    protocol: str
    params: dict[str, Any]


@dataclass(frozen=True)
class CurveSpec:
    """A [[curve]] table: its name, curve kind (a `CURVES` name) and the parameters it sets."""

    name: str
    kind: str
    params: dict[str, Any]


@dataclass(frozen=True)
class PlotSpec:
    """A validated [[plot]]: file, title, metric, the scenarios and curves drawn, axis limits."""

    file: str
    title: str
    metric: str
    scenarios: tuple[str, ...]
    curves: tuple[str, ...]
    xlim: tuple[float, float] | None
    ylim: tuple[float, float] | None
    x: str = "t"
    at: float | None = None
    dashed: tuple[str, ...] = ()


@dataclass(frozen=True)
class GridPoint:
    """One point of the [grid] sweep.

    `values` maps each grid path (``data.agents``) to its value here; `columns` maps the
    results column of each path (``agents``) to the value stored in results tables.
    """

    index: int
    values: dict[str, Any]
    columns: dict[str, Any]

    @property
    def label(self) -> str:
        """A short human label such as ``agents = 30, epsilon = 0.5`` ('' without a grid)."""
        return ", ".join(f"{k} = {_show(v)}" for k, v in self.columns.items())


@dataclass(frozen=True)
class Run:
    """One run of a study: a scenario at a grid point and replicate, with id and config hash."""

    run_id: str
    scenario: Scenario
    scenario_index: int
    point: GridPoint
    config_hash: str

    @property
    def spawn(self) -> dict[str, int]:
        """The spawn-key information of the run's random streams (recorded in the manifest)."""
        s = self.scenario
        return {
            "seed": s.seed,
            "replicate": s.replicate,
            "shared_key": s.shared_key,
            "run_key": s.run_key,
        }


@dataclass(frozen=True)
class CurveJob:
    """One closed-form curve at one grid point: its validated parameters and data parameters."""

    curve: CurveSpec
    curve_index: int
    point: GridPoint
    params: Any
    data: Any


@dataclass(frozen=True)
class Study:
    """A validated study: its settings, scenarios, curves, plots, grid and expanded runs."""

    file: Path
    title: str
    seed: int
    replicates: int
    t_max: int
    checkpoints: int
    per_agent: bool
    quick: bool
    scenarios: tuple[ScenarioSpec, ...]
    curves: tuple[CurveSpec, ...]
    plots: tuple[PlotSpec, ...]
    grid_columns: dict[str, str]
    points: tuple[GridPoint, ...]
    runs: tuple[Run, ...]
    curve_jobs: tuple[CurveJob, ...]
    config_hash: str

    @property
    def folder(self) -> Path:
        """The study folder (the one holding study.toml)."""
        return self.file.parent

    @property
    def output_root(self) -> Path:
        """Where results/ and figures/ go: the study folder, or its quick/ sub-folder."""
        return self.folder / "quick" if self.quick else self.folder

    @property
    def results_dir(self) -> Path:
        """The results folder of this study (quick runs have their own)."""
        return self.output_root / "results"

    @property
    def figures_dir(self) -> Path:
        """The figures folder of this study (quick runs have their own)."""
        return self.output_root / "figures"


# --------------------------------------------------------------------------------------------
# small helpers


def canonical_hash(obj: Any) -> str:
    """sha256 hex digest of the canonical JSON of `obj` (sorted keys, no spaces)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def slug(value: Any) -> str:
    """A file-name-safe lower-case form of `value` (letters, digits, '.', '-')."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, float):
        text = f"{value:g}"
    elif isinstance(value, list | tuple):
        text = "-".join(slug(v) for v in value)
    else:
        text = str(value)
    text = re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")
    return text or "x"


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _did_you_mean(name: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _params_class(obj: Any) -> type:
    """The params dataclass of a registered object: its `Params`, or itself."""
    return getattr(obj, "Params", obj)


def find_study_file(path: str | Path) -> Path:
    """The study.toml of `path`, which may be the study folder or the file itself."""
    p = Path(path)
    file = p / STUDY_FILE if p.is_dir() else p
    if not file.is_file():
        where = f"{p}: no {STUDY_FILE} in this folder" if p.is_dir() else f"{p}: no such file"
        raise ConfigError(f"{where} (STUDY is a study folder or its {STUDY_FILE})")
    return file


# --------------------------------------------------------------------------------------------
# reading and validating


def load_study(path: str | Path, quick: bool = False) -> Study:
    """Read, validate and expand the study at `path` (folder or study.toml).

    [defaults] reach every scenario and curve that declares the key (their own keys win).
    With `quick`, the [quick] table (or `QUICK_FALLBACK`) overrides replicates, t_max,
    data.agents and checkpoints (a [grid] on data.agents still wins), and outputs go under
    ``<study>/quick/``. Raises `ConfigError` with one line naming the file, the field, the
    value and what is allowed.
    """
    file = find_study_file(path)
    try:
        with file.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot be read: {exc}") from None
    try:
        return _parse(raw, file.resolve(), quick)
    except ConfigError as exc:
        message = " ".join(str(exc).split("\n"))
        raise ConfigError(f"{file}: {message}") from None


def _table(raw: dict, key: str, default: Any) -> Any:
    value = raw.get(key, default)
    if key in ("scenario", "curve", "plot"):
        if not isinstance(value, list) or not all(_is_table(v) for v in value):
            raise ConfigError(f"{key} must be an array of tables, written [[{key}]]")
    elif not _is_table(value):
        raise ConfigError(f"{key} must be a table, written [{key}]")
    return value


def _parse(raw: dict, file: Path, quick: bool) -> Study:
    load_plugins()
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(unknown_key_message("top level", key, list(TOP_KEYS)))
    if "study" not in raw:
        raise ConfigError("[study] is missing; it needs at least title = \"...\"")
    study_raw = _table(raw, "study", {})
    if "title" not in study_raw:
        raise ConfigError("[study]: title is required (a string)")
    settings = build(StudyTable, study_raw, "[study]")
    if not settings.title.strip():
        raise ConfigError(f"[study]: title = {settings.title!r}: must be a non-empty string")
    quick_table = build(QuickTable, _table(raw, "quick", {}), "[quick]")
    data = dict(_table(raw, "data", {"model": "classes"}))
    network = _network_table(raw)
    topology = _topology_table(raw, file)
    for name in settings.metrics:
        METRICS.lookup(name, "[study]: metrics")
    defaults = dict(_table(raw, "defaults", {}))
    grid = dict(_table(raw, "grid", {}))

    replicates, t_max, checkpoints = settings.replicates, settings.t_max, settings.checkpoints
    if quick:
        q = {k: v for k, v in dataclasses.asdict(quick_table).items() if v is not None}
        if "quick" not in raw:
            q = {k: min(v, getattr(settings, k)) for k, v in QUICK_FALLBACK.items()}
        replicates = q.get("replicates", replicates)
        t_max = q.get("t_max", t_max)
        checkpoints = q.get("checkpoints", checkpoints)
        if "agents" in q:
            data["agents"] = q["agents"]

    if "model" not in data:
        raise ConfigError(
            f"[data]: model is required (a data model name; allowed: {', '.join(DATA)})"
        )
    data_cls = _params_class(DATA.lookup(data["model"], "[data]: model"))
    link_cls = _params_class(LINKS.lookup(network["links"], "[network]: links"))
    topo_cls = (
        _params_class(TOPOLOGIES.get(topology["model"])) if topology is not None else None
    )

    curves = _curves(_table(raw, "curve", []))
    scenarios = _scenarios(_table(raw, "scenario", []), bool(curves))
    declared = _declared_defaults(scenarios, curves)
    for key in defaults:
        if key not in declared:
            raise ConfigError(unknown_key_message("[defaults]", key, sorted(declared)))
    grid_columns = _grid_columns(grid, data_cls, link_cls, topo_cls, declared, network)
    _check_grid_reaches(grid, [*scenarios, *curves])
    plots = _plots(_table(raw, "plot", []), scenarios, curves, settings.title,
                   list(grid_columns.values()))

    points = _points(grid, grid_columns)
    runs: list[Run] = []
    jobs: list[CurveJob] = []
    for i, spec in enumerate(scenarios):
        for point in points:
            base = _scenario_at(spec, point, data, network, topology, defaults, t_max,
                                checkpoints, settings, file.parent)
            _resolve(base, point, spec, defaults)
            for rep in range(replicates):
                s = dataclasses.replace(base, replicate=rep)
                runs.append(Run(_run_id(spec.name, point, rep), s, i, point,
                                canonical_hash({"scenario": s.as_dict(), "grid": point.values})))
    _check_unique_ids(runs)
    for j, curve in enumerate(curves):
        for point in points:
            jobs.append(_curve_job(curve, j, point, data, topology, defaults))

    effective = copy.deepcopy(raw)
    effective["study"] = {**raw["study"], "replicates": replicates, "t_max": t_max,
                          "checkpoints": checkpoints}
    effective["data"] = data
    effective.pop("quick", None)
    return Study(
        file=file,
        title=settings.title,
        seed=settings.seed,
        replicates=replicates,
        t_max=t_max,
        checkpoints=checkpoints,
        per_agent=settings.per_agent,
        quick=quick,
        scenarios=tuple(scenarios),
        curves=tuple(curves),
        plots=tuple(plots),
        grid_columns=grid_columns,
        points=tuple(points),
        runs=tuple(runs),
        curve_jobs=tuple(jobs),
        config_hash=canonical_hash(effective),
    )


def _named_tables(tables: list[dict], kind: str, type_key: str) -> list[tuple[str, str, dict]]:
    """(name, type name, other keys) of [[scenario]] or [[curve]] tables, names unique."""
    out: list[tuple[str, str, dict]] = []
    seen: set[str] = set()
    for n, table in enumerate(tables, start=1):
        where = f"[[{kind}]] #{n}"
        name = table.get("name")
        if not isinstance(name, str) or not name.strip():
            shown = "is missing" if name is None else f"= {name!r}"
            raise ConfigError(f"{where}: name {shown}: must be a non-empty string")
        if name in seen:
            raise ConfigError(f"{kind} {name!r}: name is used twice; {kind} names must be unique")
        seen.add(name)
        if type_key not in table:
            raise ConfigError(f"{kind} {name!r}: {type_key} is required")
        rest = {k: v for k, v in table.items() if k not in ("name", type_key)}
        out.append((name, table[type_key], rest))
    return out


def _scenarios(tables: list[dict], has_curves: bool = False) -> list[ScenarioSpec]:
    if not tables and not has_curves:
        raise ConfigError("no [[scenario]] and no [[curve]]: a study needs at least one")
    out = []
    for name, protocol, params in _named_tables(tables, "scenario", "protocol"):
        PROTOCOLS.lookup(protocol, f"scenario {name!r}: protocol")
        out.append(ScenarioSpec(name, protocol, params))
    return out


def _curves(tables: list[dict]) -> list[CurveSpec]:
    out = []
    for name, kind, params in _named_tables(tables, "curve", "kind"):
        CURVES.lookup(kind, f"curve {name!r}: kind")
        out.append(CurveSpec(name, kind, params))
    return out


def _declared(spec: ScenarioSpec | CurveSpec) -> list[str]:
    if isinstance(spec, ScenarioSpec):
        return field_names(_params_class(PROTOCOLS.get(spec.protocol)))
    return field_names(_params_class(CURVES.get(spec.kind)))


def _declared_defaults(scenarios: list[ScenarioSpec], curves: list[CurveSpec]) -> set[str]:
    """Every parameter name that some scenario's protocol or some curve declares."""
    return {name for spec in [*scenarios, *curves] for name in _declared(spec)}


def _grid_columns(
    grid: dict, data_cls: type, link_cls: type, topo_cls: type | None, declared: set[str],
    network: dict | None = None,
) -> dict:
    """Results column (last path component) of every grid path, after checking the paths.

    A path may reach into a [network] sub-table (``network.latency.mean``) or replace a whole
    one (``network.outages``, with tables as values).
    """
    network = network or {}
    allowed = {
        "data": field_names(data_cls),
        "network": [*field_names(link_cls), *NETWORK_TABLES],
        "topology": field_names(topo_cls) if topo_cls is not None else [],
        "defaults": sorted(declared),
    }
    columns: dict[str, str] = {}
    for path, values in grid.items():
        root, _, key = path.partition(".")
        if root == "network" and "." in key:
            key = _network_grid_key(path, grid, network)
        elif root not in GRID_ROOTS or not key or "." in key:
            raise ConfigError(
                f"[grid]: {path!r}: a grid path must be data.<key>, network.<key>, "
                "network.<sub-table>.<key>, topology.<key> or defaults.<key>"
            )
        elif root == "topology" and topo_cls is None:
            raise ConfigError(f"[grid]: {path!r}: the study has no [topology] table to sweep")
        elif key not in allowed[root]:
            raise ConfigError(unknown_key_message(f"[grid]: {path!r}", key, allowed[root]))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"[grid]: {path!r} = {values!r}: must be a non-empty list of values")
        shown = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(shown)) < len(shown):
            raise ConfigError(f"[grid]: {path!r} = {values!r}: values must be distinct")
        if key in RESERVED_COLUMNS or key in columns.values():
            raise ConfigError(
                f"[grid]: {path!r}: column name {key!r} is already used; grid columns are named "
                f"by their last component and must differ from each other and from "
                f"{', '.join(sorted(RESERVED_COLUMNS))}"
            )
        columns[path] = key
    return columns


def _network_grid_key(path: str, grid: dict, network: dict) -> str:
    """The key of a grid path ``network.<sub-table>.<key>``, checked against the sub-table."""
    parts = path.split(".")
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"[grid]: {path!r}: a path into a [network] sub-table must be "
                          "network.<sub-table>.<key>")
    _, sub, key = parts
    if sub not in NETWORK_TABLES:
        raise ConfigError(f"[grid]: {path!r}: {unknown_table_message(sub)}")
    table = network.get(sub)
    if not _is_table(table):
        raise ConfigError(f"[grid]: {path!r}: the study has no [network.{sub}] table to sweep")
    models = grid.get(f"network.{sub}.model")
    models = models if isinstance(models, list) else [table.get("model")]
    allowed = sorted({k for m in models for k in table_keys(sub, {**table, "model": m})})
    if key not in allowed:
        raise ConfigError(unknown_key_message(f"[grid]: {path!r}", key, allowed))
    return key


def _check_grid_reaches(grid: dict, specs: list[ScenarioSpec | CurveSpec]) -> None:
    """Refuse a swept default that a scenario or curve overrides: its column would lie."""
    for path in grid:
        root, _, key = path.partition(".")
        for spec in specs:
            if root == "defaults" and key in spec.params:
                kind = "scenario" if isinstance(spec, ScenarioSpec) else "curve"
                raise ConfigError(
                    f"[grid]: {path!r}: {kind} {spec.name!r} sets {key} = "
                    f"{spec.params[key]!r} itself, so the sweep would not reach it; "
                    f"remove {key} from that {kind}"
                )


def _column_values(values: list) -> list:
    """Values as stored in a results column: numbers of one type, other values as JSON text."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if numbers and any(isinstance(v, float) for v in values):
        return [float(v) for v in values]
    if numbers or all(isinstance(v, str) for v in values) or all(
        isinstance(v, bool) for v in values
    ):
        return list(values)
    return [json.dumps(v, default=str) for v in values]


def _points(grid: dict, columns: dict[str, str]) -> list[GridPoint]:
    """The cartesian product of the grid, in file order (one point without a grid)."""
    paths = list(grid)
    stored = [_column_values(grid[p]) for p in paths]
    points = []
    for index, combo in enumerate(itertools.product(*(range(len(grid[p])) for p in paths))):
        values = {p: grid[p][i] for p, i in zip(paths, combo, strict=True)}
        cols = {columns[p]: stored[k][i] for k, (p, i) in enumerate(zip(paths, combo, strict=True))}
        points.append(GridPoint(index, values, cols))
    return points


def _apply_point(point: GridPoint, data: dict, network: dict, defaults: dict,
                 topology: dict | None = None):
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


def _network_table(raw: dict) -> dict:
    """The [network] table (links = "ideal" by default), its sub-tables' names checked."""
    network = dict(_table(raw, "network", {}))
    network.setdefault("links", "ideal")
    for key, value in network.items():
        if _is_table(value) and key not in NETWORK_TABLES:
            raise ConfigError(unknown_table_message(key))
    return network


def _trace_files(network: dict, folder: Path) -> dict:
    """`network` with the trace `file` of its outages and nodes tables made absolute.

    A trace file is relative to the study folder, wherever desim runs.
    """
    for sub in TRACE_TABLES:
        table = network.get(sub)
        path = table.get("file") if _is_table(table) else None
        if isinstance(path, str) and path and not Path(path).is_absolute():
            network = {**network, sub: {**table, "file": str((folder / path).resolve())}}
    return network


def _topology_table(raw: dict, file: Path) -> dict | None:
    """The [topology] table (None without one), its model checked, a relative path made absolute.

    A `path` parameter (a graph file) is relative to the study folder, wherever desim runs.
    """
    if "topology" not in raw:
        return None
    topology = dict(_table(raw, "topology", {}))
    if "model" not in topology:
        raise ConfigError(
            f"[topology]: model is required (a topology name; allowed: {', '.join(TOPOLOGIES)})"
        )
    TOPOLOGIES.lookup(topology["model"], "[topology]: model")
    path = topology.get("path")
    if isinstance(path, str) and path and not Path(path).is_absolute():
        topology["path"] = str((file.parent / path).resolve())
    return topology


def _scenario_at(spec, point, data, network, topology, defaults, t_max, checkpoints,
                 settings, folder: Path) -> Scenario:
    """The scenario `spec` at grid `point` (replicate 0): defaults first, its own keys win."""
    data, network, defaults, topology = _apply_point(point, data, network, defaults, topology)
    network = _trace_files(network, folder)
    declared = set(_declared(spec))
    params = {k: v for k, v in defaults.items() if k in declared}
    params.update(spec.params)
    return Scenario(
        protocol=spec.protocol,
        params=params,
        data=data,
        network=network,
        t_max=t_max,
        seed=settings.seed,
        replicate=0,
        checkpoints=checkpoints,
        per_agent=settings.per_agent,
        name=spec.name,
        topology=topology,
        metrics=tuple(settings.metrics),
    )


def _at_point(point: GridPoint, message: str) -> str:
    return f"grid point {point.label}: {message}" if point.columns else message


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
        raise ConfigError(_at_point(point, message)) from None


def _curve_job(curve: CurveSpec, index: int, point: GridPoint, data: dict,
               topology: dict | None, defaults: dict):
    """A curve at a grid point; a curve declaring `topology` receives the [topology] table."""
    data, _, defaults, topology = _apply_point(point, data, {}, defaults, topology)
    cls = _params_class(CURVES.get(curve.kind))
    declared = set(field_names(cls))
    table = {k: v for k, v in defaults.items() if k in declared}
    if CURVE_TOPOLOGY_KEY in declared and topology is not None:
        table[CURVE_TOPOLOGY_KEY] = topology
    table.update(curve.params)
    try:
        data_cls = _params_class(DATA.get(data["model"]))
        data_params = build(data_cls, {k: v for k, v in data.items() if k != "model"}, "data")
        params = build(cls, table, f"curve {curve.name!r}")
    except ConfigError as exc:
        raise ConfigError(_at_point(point, str(exc))) from None
    return CurveJob(curve, index, point, params, data_params)


def _plots(tables: list[dict], scenarios, curves, title: str,
           columns: list[str] | None = None) -> list[PlotSpec]:
    names = [s.name for s in scenarios]
    curve_names = [c.name for c in curves]
    if not tables:
        return [PlotSpec("mse.png", title, "mse", tuple(names), tuple(curve_names), None, None)]
    out: list[PlotSpec] = []
    for n, table in enumerate(tables, start=1):
        where = f"plot {table['file']!r}" if isinstance(table.get("file"), str) else f"plot #{n}"
        p = build(PlotTable, table, where)
        if p.file in {q.file for q in out}:
            raise ConfigError(f"{where}: file is used by two plots; each plot needs its own file")
        chosen = names if p.scenarios is None else p.scenarios
        for name in chosen:
            if name not in names:
                raise ConfigError(
                    f"{where}: scenarios: unknown scenario {name!r}{_did_you_mean(name, names)}; "
                    f"allowed: {', '.join(names)}"
                )
        for name in p.curves:
            if name not in curve_names:
                raise ConfigError(
                    f"{where}: curves: unknown curve {name!r}{_did_you_mean(name, curve_names)}; "
                    f"allowed: {', '.join(curve_names) or 'none (no [[curve]] tables)'}"
                )
        if p.curves and p.metric != "mse":
            raise ConfigError(
                f"{where}: curves = {p.curves!r}: closed-form curves are of metric 'mse', "
                f"not {p.metric!r}"
            )
        if p.x != "t" and p.x not in (columns or []) and not p.x.startswith(LEDGER_PREFIX):
            raise ConfigError(
                f"{where}: x = {p.x!r}: must be 't' or a grid column "
                f"({', '.join(columns or []) or 'the study has no [grid]'}), or a privacy "
                f"ledger metric ({LEDGER_PREFIX}…)"
            )
        out.append(PlotSpec(
            p.file, p.title or title, p.metric, tuple(chosen), tuple(p.curves),
            tuple(p.xlim) if p.xlim else None, tuple(p.ylim) if p.ylim else None,
            p.x, p.at, tuple(p.dashed),
        ))
    return out


def _run_id(name: str, point: GridPoint, replicate: int) -> str:
    parts = [slug(name)]
    parts += [f"{col}-{slug(v)}" for col, v in point.columns.items()]
    parts.append(f"r{replicate:03d}")
    return "_".join(parts)


def _check_unique_ids(runs: list[Run]) -> None:
    seen: dict[str, Run] = {}
    for run in runs:
        other = seen.get(run.run_id)
        if other is not None and other.scenario.name != run.scenario.name:
            raise ConfigError(
                f"scenarios {other.scenario.name!r} and {run.scenario.name!r} give the same run "
                f"id {run.run_id!r}; rename one"
            )
        if other is not None:
            raise ConfigError(f"grid points give the same run id {run.run_id!r}; "
                              "make the grid values distinct")
        seen[run.run_id] = run
