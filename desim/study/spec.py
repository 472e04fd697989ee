"""Study files: one TOML file that says what to run, how often, over which grid, and what to draw.

`load_study` reads ``study.toml``, validates every table (unknown keys, types, ranges, names of
protocols, data models, link models, topologies, curves and metrics, references between tables)
and expands the study into its runs, before anything is run or written: a bad file stops with one
`ConfigError` line that names the field, the value and what is allowed.

A run is one (grid point, scenario, replicate): a `desim.study.scenario.Scenario` with a
stable, readable id and a config hash, which is what lets `desim run` resume where it stopped.
The config hash covers the scenario and the grid values that reach it: a scenario whose
parameters do not include a swept key is the same run at every value of that key, runs once
and is shown at every grid point (curves likewise).

A study file reads only files inside its own folder (a study file may be shared and run by
someone else), and a folder without a study.toml whose sub-folders hold study files is a
*suite* (`find_studies`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import fnmatch
import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from desim.kernel.params import ConfigError, build, field_names, param, unknown_key_message
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import CURVES, DATA, LINKS, METRICS, PROTOCOLS, TOPOLOGIES
from desim.network_models.realistic import NETWORK_TABLES, table_keys, unknown_table_message
from desim.study.scenario import Scenario, check_setup, resolve

#: The file a study folder holds its specification in.
STUDY_FILE = "study.toml"
#: The top-level tables a study file may have.
TOP_KEYS = (
    "study",
    "quick",
    "data",
    "network",
    "topology",
    "defaults",
    "scenario",
    "curve",
    "plot",
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
#: Largest study file read (bytes) and deepest nesting of tables and arrays allowed in it.
MAX_STUDY_BYTES = 1 << 20
MAX_DEPTH = 16
#: Longest scenario or curve name (characters; files are named by hash, not by name).
MAX_NAME = 500
#: Values a plot title may use, as {name}.
TITLE_FIELDS = ("agents", "replicates", "t_max", "checkpoints", "seed")


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
    x: str = param(
        "t",
        "x axis: the slot t (log scale), a grid column (linear; values at `at`) "
        "or a privacy ledger metric (eps_…: the metric against the ε spent)",
    )
    at: float | None = param(None, "with x a grid column: the slot drawn (default: the last)", ge=1)
    dashed: list[str] = param([], "more metrics of the same scenarios, drawn dashed (e.g. bound)")
    xscale: Literal["linear", "log"] | None = param(
        None, "x-axis scale (default: log for the slot t, linear for a grid column)"
    )
    yscale: Literal["linear", "log"] | None = param(
        None,
        "y-axis scale (default: log for errors and variances, linear for counts and fractions)",
    )

    def __post_init__(self) -> None:
        name = Path(self.file).name
        if name != self.file or Path(name).suffix not in FIGURE_SUFFIXES:
            raise ValueError(
                f"file = {self.file!r}: must be a file name ending in "
                f"{', '.join(FIGURE_SUFFIXES)} (it is written to figures/)"
            )
        for key in ("xlim", "ylim"):
            lim = getattr(self, key)
            if key == "xlim":  # a grid column is on a linear axis by default: may hold 0
                # the slot and the ε spent (a privacy ledger metric) are log by default
                log_x = self.x == "t" or self.x.startswith(LEDGER_PREFIX)
                linear = (self.xscale or ("log" if log_x else "linear")) == "linear"
            else:
                linear = (self.yscale or default_scale(self.metric)) == "linear"
            ok = lim is None or (
                len(lim) == 2
                and all(map(math.isfinite, lim))
                and (linear or 0 < lim[0])
                and lim[0] < lim[1]
            )
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
    scenario: str | None = None
    """The scenario this curve is the closed form of (drawn in its colour), if any."""


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
    xscale: str = "log"
    yscale: str = "log"


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
    columns: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The grid columns that reach the run (the others leave it unchanged)."""

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
    config_hash: str = ""


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
    agents: int | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    """Axis label of each grid column, from its parameter's description."""

    def label(self, column: str) -> str:
        """The axis label of a grid column (the column name when it has no description)."""
        return self.labels.get(column, column)

    def curve_scenario(self, curve: CurveSpec) -> str | None:
        """The scenario `curve` is the closed form of: its ``scenario`` key, else the longest
        scenario name its name starts or ends with (``local (Prop. 1)`` → ``local``,
        ``oracle PM-I Laplace`` → ``PM-I Laplace``), else None."""
        if curve.scenario is not None:
            return curve.scenario
        names = [
            s.name
            for s in self.scenarios
            if curve.name == s.name
            or any(curve.name.startswith(s.name + sep) for sep in (" ", ",", ":"))
            or curve.name.endswith(" " + s.name)
        ]
        return max(names, key=len) if names else None

    @property
    def folder(self) -> Path:
        """The study folder (the one holding the study file)."""
        return self.file.parent

    @property
    def output_root(self) -> Path:
        """Where the results and figures folders go: the study folder, or its quick/ folder."""
        return self.folder / "quick" if self.quick else self.folder

    @property
    def _suffix(self) -> str:
        # study.toml keeps results/ and figures/; another file <name>.toml in the same folder
        # gets results-<name>/ and figures-<name>/, so two files never share results
        return "" if self.file.name == STUDY_FILE else f"-{self.file.stem}"

    @property
    def results_dir(self) -> Path:
        """The results folder of this study file (quick runs have their own)."""
        return self.output_root / f"results{self._suffix}"

    @property
    def figures_dir(self) -> Path:
        """The figures folder of this study file (quick runs have their own)."""
        return self.output_root / f"figures{self._suffix}"

    @property
    def unique_runs(self) -> tuple[Run, ...]:
        """The runs to execute: one per config hash, in study order (a grid key that does not
        reach a scenario repeats its run at every value; it runs once)."""
        seen: dict[str, Run] = {}
        for run in self.runs:
            seen.setdefault(run.config_hash, run)
        return tuple(seen.values())

    def command(self, verb: str) -> str:
        """The desim command line that does `verb` on this study (for messages)."""
        flag = " --quick" if self.quick else ""
        target = self.folder if self.file.name == STUDY_FILE else self.file
        return f"desim {verb} {target}{flag}"


# --------------------------------------------------------------------------------------------
# small helpers


def canonical_hash(obj: Any) -> str:
    """sha256 (hex) of the canonical JSON of `obj` (sorted keys, no spaces)."""
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
    """The study file of `path`, which may be the study folder or the file itself.

    The file must be a regular file of at most `MAX_STUDY_BYTES` (never a FIFO or a device,
    which would hang or flood the reader).
    """
    if not isinstance(path, str | Path):
        raise ConfigError(f"study = {path!r}: must be a path (a study folder or its study file)")
    p = Path(path)
    file = p / STUDY_FILE if p.is_dir() else p
    if not file.exists():
        where = f"{p}: no {STUDY_FILE} in this folder" if p.is_dir() else f"{p}: no such file"
        raise ConfigError(
            f"{where} (STUDY is a study folder, its {STUDY_FILE}, or a folder of study folders)"
        )
    if not file.is_file():
        raise ConfigError(f"{file}: not a regular file; a study file is a TOML text file")
    size = file.stat().st_size
    if size > MAX_STUDY_BYTES:
        raise ConfigError(
            f"{file}: {size} bytes; a study file may hold at most {MAX_STUDY_BYTES} bytes"
        )
    return file


def find_studies(path: str | Path) -> list[Path]:
    """The study files `path` names: one, or every sub-study of a suite, in name order.

    A suite is a folder without a study.toml whose sub-folders (at any depth, not inside
    results or figures folders) hold study.toml files.
    """
    p = Path(path)
    if p.is_dir() and not (p / STUDY_FILE).exists():
        found = sorted(
            f
            for f in p.rglob(STUDY_FILE)
            if not any(
                part.startswith(("results", "figures", "quick", "."))
                for part in f.relative_to(p).parts[:-1]
            )
        )
        if found:
            return found
    return [find_study_file(p)]


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of tables and arrays in `value`, counted up to `limit` + 1."""
    if limit < 0:
        return 1
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


# --------------------------------------------------------------------------------------------
# reading and validating


def load_study(path: str | Path, quick: bool = False, force: bool = False) -> Study:
    """Read, validate and expand the study at `path` (folder or study.toml).

    [defaults] reach every scenario and curve that declares the key (their own keys win).
    With `quick`, the [quick] table (or `QUICK_FALLBACK`) overrides replicates, t_max,
    data.agents and checkpoints (a [grid] on data.agents still wins), and outputs go under
    ``<study>/quick/``. Raises `ConfigError` with one line naming the file, the field, the
    value and what is allowed. A study larger than one machine can run (run count, work,
    memory: `_check_size`) is refused unless `force`.
    """
    file = find_study_file(path)
    try:
        with file.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{file}: tables or arrays nested too deep (at most {MAX_DEPTH} levels)"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot be read: {type(exc).__name__}") from None
    if _depth(raw, MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(f"{file}: tables or arrays nested too deep (at most {MAX_DEPTH} levels)")
    try:
        return _parse(raw, file.resolve(), quick, force)
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


def _parse(raw: dict, file: Path, quick: bool, force: bool = False) -> Study:
    load_plugins()
    for key in raw:
        if key not in TOP_KEYS:
            raise ConfigError(unknown_key_message("top level", key, list(TOP_KEYS)))
    if "study" not in raw:
        raise ConfigError('[study] is missing; it needs at least title = "..."')
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
    topo_cls = _params_class(TOPOLOGIES.get(topology["model"])) if topology is not None else None

    scenario_names = [t.get("name") for t in _table(raw, "scenario", [])]
    curves = _curves(_table(raw, "curve", []), scenario_names)
    scenarios = _scenarios(_table(raw, "scenario", []), bool(curves))
    declared = _declared_defaults(scenarios, curves)
    for key in defaults:
        if key not in declared:
            raise ConfigError(unknown_key_message("[defaults]", key, sorted(declared)))
    grid_columns = _grid_columns(grid, data_cls, link_cls, topo_cls, declared, network)
    _check_grid_reaches(grid, [*scenarios, *curves])
    plots = _plots(
        _table(raw, "plot", []), scenarios, curves, settings.title, list(grid_columns.values())
    )

    if not force:  # before the grid is expanded: a grid of 10⁹ points is refused, not built
        _check_size(settings, replicates, t_max, checkpoints, data, grid, len(scenarios))
    points = _points(grid, grid_columns)
    runs: list[Run] = []
    jobs: list[CurveJob] = []
    for i, spec in enumerate(scenarios):
        reach = _reaching(spec, grid)
        for point in points:
            base = _scenario_at(
                spec,
                point,
                data,
                network,
                topology,
                defaults,
                t_max,
                checkpoints,
                settings,
                file.parent,
            )
            _resolve(base, point, spec, defaults)
            values = {p: v for p, v in point.values.items() if p in reach}
            columns = {grid_columns[p]: point.columns[grid_columns[p]] for p in values}
            for rep in range(replicates):
                s = dataclasses.replace(base, replicate=rep)
                # only the grid values that reach the scenario: a run the sweep does not
                # change has one hash (and runs once); a reached one keeps its old hash
                h = canonical_hash({"scenario": s.as_dict(), "grid": values})
                runs.append(Run(_run_id(spec.name, columns, rep), s, i, point, h, columns))
    _check_unique_ids(runs)
    for j, curve in enumerate(curves):
        for point in points:
            jobs.append(
                _curve_job(
                    curve, j, point, data, topology, defaults, t_max, checkpoints, file.parent
                )
            )
    agents = data.get("agents") if isinstance(data.get("agents"), int) else None
    fields = {
        "agents": "varied" if "data.agents" in grid else agents,
        "replicates": replicates,
        "t_max": t_max,
        "checkpoints": checkpoints,
        "seed": settings.seed,
    }
    plots = [dataclasses.replace(q, title=_fill_title(q.title, fields, q.file)) for q in plots]
    declared = [
        getattr(METRICS.lookup(name, "study: metrics"), "outputs", None)
        for name in settings.metrics
    ]
    if all(d is not None for d in declared):  # a metric that declares nothing: not checkable
        _check_plot_metrics(plots, scenarios, [p for d in declared for p in d])

    effective = copy.deepcopy(raw)
    effective["study"] = {
        **raw["study"],
        "replicates": replicates,
        "t_max": t_max,
        "checkpoints": checkpoints,
    }
    effective["data"] = data
    effective.pop("quick", None)
    effective.pop("plot", None)  # figures do not change results: retitling keeps the hash
    for table in effective.get("curve", []):  # nor does which scenario's colour a curve takes
        if isinstance(table, dict):
            table.pop("scenario", None)
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
        agents=agents,
        labels=_labels(grid_columns, data_cls, link_cls, topo_cls, [*scenarios, *curves]),
    )


def _short_doc(doc: str) -> str:
    """The first phrase of a parameter's description, for an axis label."""
    for phrase in re.split(r";|:", doc):
        text = re.split(r" \(|, ", phrase.strip(), maxsplit=1)[0].strip()
        if text and not text.startswith(("if ", "with ")):
            return text if len(text) <= 32 else ""
    return ""


def _labels(
    columns: dict[str, str], data_cls: type, link_cls: type, topo_cls: type | None, specs: list
) -> dict[str, str]:
    """Axis label of every grid column: ``<description> (<column>)`` when one is declared."""

    def doc_of(cls: type | None, key: str) -> str:
        if cls is None:
            return ""
        for f in dataclasses.fields(cls):
            if f.name == key:
                return f.metadata.get("doc", "")
        return ""

    out = {}
    for path, column in columns.items():
        root, _, key = path.partition(".")
        doc = ""
        if root == "data":
            doc = doc_of(data_cls, key)
        elif root == "topology":
            doc = doc_of(topo_cls, key)
        elif root == "network" and "." not in key:
            doc = doc_of(link_cls, key)
        elif root == "network":
            sub, _, inner = key.partition(".")
            doc = f"{sub} {inner}"
        elif root == "defaults":
            for spec in specs:
                doc = doc_of(
                    _params_class(PROTOCOLS.get(spec.protocol))
                    if isinstance(spec, ScenarioSpec)
                    else _params_class(CURVES.get(spec.kind)),
                    key,
                )
                if doc:
                    break
        short = _short_doc(doc)
        out[column] = f"{short} ({column})" if short and short != column else column
    return out


def _check_plot_metrics(
    plots: list[PlotSpec], scenarios: list[ScenarioSpec], extra: list[str] | None = None
) -> None:
    """Refuse a plot of a metric no scenario records: the recorder's own (mse,
    messages_<kind>, dropped_<kind>) and `extra`, the names (glob patterns) the study's
    [study] metrics declare (`desim.kernel.registry.records`)."""
    recorded = {"mse"}
    for spec in scenarios:
        kinds = getattr(PROTOCOLS.get(spec.protocol), "message_kinds", ())
        recorded |= {f"{what}_{kind}" for kind in kinds for what in ("messages", "dropped")}
    patterns = list(extra or [])
    recorded |= {p for p in patterns if not any(c in p for c in "*?[")}
    for plot in plots:
        if not plot.scenarios:
            continue
        for key, metric in [("metric", plot.metric), *(("dashed", m) for m in plot.dashed)]:
            if metric not in recorded and not any(fnmatch.fnmatchcase(metric, p) for p in patterns):
                raise ConfigError(
                    f"plot {plot.file!r}: {key} = {metric!r}: no scenario records it"
                    f"{_did_you_mean(metric, sorted(recorded))}; recorded: "
                    f"{', '.join(sorted(recorded | set(patterns)))}"
                    f"{'' if extra else ' (more with [study] metrics)'}"
                )


def check_setups(study: Study) -> None:
    """`check_setup` for every distinct data, network and topology set-up of the study's runs
    (replicate 0): what `desim validate` and `desim run` check before any run."""
    seen = set()
    for run in study.unique_runs:
        s = run.scenario
        key = canonical_hash([s.data, s.network, s.topology, s.seed])
        if s.replicate == 0 and key not in seen:
            seen.add(key)
            try:
                check_setup(s)
            except ConfigError as exc:
                raise ConfigError(f"{study.file}: {_at_point(run.point, str(exc))}") from None


def _fill_title(title: str, fields: dict[str, Any], file: str) -> str:
    """`title` with {agents}, {replicates}, {t_max}, ... replaced by the study's values."""

    def value(match: re.Match) -> str:
        name = match.group(1)
        if name not in fields:
            raise ConfigError(
                f"plot {file!r}: title: unknown field {{{name}}}; allowed: "
                + ", ".join(f"{{{k}}}" for k in TITLE_FIELDS)
            )
        v = fields[name]
        if isinstance(v, int) and v >= 10_000:
            return f"{v:,}".replace(",", " ")  # 10 000: a thin grouping, as in the papers
        return "?" if v is None else str(v)

    return re.sub(r"\{([^{}]*)\}", value, title)


def _reaching(spec: ScenarioSpec | CurveSpec, grid: dict) -> set[str]:
    """The grid paths that reach `spec`: its own tables always; a [defaults] key only when
    `spec` declares it; for a curve, data and (if it declares one) the topology."""
    declared = set(_declared(spec))
    out = set()
    for path in grid:
        root, _, key = path.partition(".")
        if root == "defaults":
            ok = key in declared
        elif isinstance(spec, CurveSpec):
            ok = root == "data" or (root == "topology" and CURVE_TOPOLOGY_KEY in declared)
        else:
            ok = True
        if ok:
            out.add(path)
    return out


#: Largest study desim runs without --force: runs, agent-slots of one run, total agent-slots.
MAX_RUNS = 200_000
MAX_AGENT_SLOTS_PER_RUN = 10**11
MAX_AGENT_SLOTS = 10**13
MAX_CHECKPOINTS = 100_000
#: Bytes a run holds per agent and checkpoint (estimates, errors, per-agent records).
BYTES_PER_AGENT_CHECKPOINT = 64


def _check_size(
    settings,
    replicates: int,
    t_max: int,
    checkpoints: int,
    data: dict,
    grid: dict,
    n_scenarios: int,
) -> None:
    """Refuse a study too large to finish: run count, time and memory, estimated up front.

    A run costs about agents × t_max agent-slots of work and holds agents × checkpoints
    values; the estimate uses the largest agent count the grid reaches.
    """
    points = math.prod(len(v) for v in grid.values() if isinstance(v, list))
    runs = points * max(n_scenarios, 1) * replicates
    if runs > MAX_RUNS:
        raise ConfigError(
            f"[study]: replicates = {replicates} × {points} grid points × "
            f"{n_scenarios} scenarios = {runs} runs: at most {MAX_RUNS} allowed "
            "(--force to run it anyway)"
        )
    if checkpoints > MAX_CHECKPOINTS:
        raise ConfigError(f"[study]: checkpoints = {checkpoints}: at most {MAX_CHECKPOINTS}")
    sizes = [data.get("agents")] + list(grid.get("data.agents", []))
    agents = max((a for a in sizes if isinstance(a, int) and not isinstance(a, bool)), default=1)
    per_run = agents * t_max
    if per_run > MAX_AGENT_SLOTS_PER_RUN:
        raise ConfigError(
            f"[study]: t_max = {t_max} with {agents} agents = {per_run:.3g} "
            f"agent-slots per run: at most {MAX_AGENT_SLOTS_PER_RUN:.0e} "
            "(--force to run it anyway)"
        )
    if per_run * runs > MAX_AGENT_SLOTS:
        raise ConfigError(
            f"[study]: {runs} runs of {per_run:.3g} agent-slots = "
            f"{per_run * runs:.3g}: at most {MAX_AGENT_SLOTS:.0e} in one study "
            "(--force to run it anyway)"
        )
    memory = agents * min(checkpoints, t_max) * BYTES_PER_AGENT_CHECKPOINT + agents * 4096
    available = _memory_bytes()
    if available and memory > available:
        raise ConfigError(
            f"[data]: agents = {agents}: one run needs about "
            f"{memory / 2**30:.3g} GiB; this machine has "
            f"{available / 2**30:.3g} GiB (--force to run it anyway)"
        )


def _memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (None when unknown)."""
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


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
        if len(name) > MAX_NAME or not name.isprintable():
            raise ConfigError(
                f"{where}: name = {name[:40]!r}...: must be at most {MAX_NAME} printable characters"
            )
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


def _curves(tables: list[dict], scenarios: list[str] | None = None) -> list[CurveSpec]:
    out = []
    for name, kind, params in _named_tables(tables, "curve", "kind"):
        CURVES.lookup(kind, f"curve {name!r}: kind")
        scenario = params.pop("scenario", None)
        if scenario is not None and scenario not in (scenarios or []):
            raise ConfigError(
                f"curve {name!r}: scenario = {scenario!r}: must name a [[scenario]] (the one "
                f"the curve is the closed form of); allowed: {', '.join(scenarios or [])}"
            )
        out.append(CurveSpec(name, kind, params, scenario))
    return out


def _declared(spec: ScenarioSpec | CurveSpec) -> list[str]:
    if isinstance(spec, ScenarioSpec):
        return field_names(_params_class(PROTOCOLS.get(spec.protocol)))
    return field_names(_params_class(CURVES.get(spec.kind)))


def _declared_defaults(scenarios: list[ScenarioSpec], curves: list[CurveSpec]) -> set[str]:
    """Every parameter name that some scenario's protocol or some curve declares."""
    return {name for spec in [*scenarios, *curves] for name in _declared(spec)}


def _grid_columns(
    grid: dict,
    data_cls: type,
    link_cls: type,
    topo_cls: type | None,
    declared: set[str],
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
        raise ConfigError(
            f"[grid]: {path!r}: a path into a [network] sub-table must be network.<sub-table>.<key>"
        )
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
    if (
        numbers
        or all(isinstance(v, str) for v in values)
        or all(isinstance(v, bool) for v in values)
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


def _network_table(raw: dict) -> dict:
    """The [network] table (links = "ideal" by default), its sub-tables' names checked."""
    network = dict(_table(raw, "network", {}))
    network.setdefault("links", "ideal")
    for key, value in network.items():
        if _is_table(value) and key not in NETWORK_TABLES:
            raise ConfigError(unknown_table_message(key))
    return network


#: Largest file (trace, graph) a study may read, in bytes.
MAX_INPUT_BYTES = 64 << 20


def check_input_file(folder: Path, path: Any, field: str, what: str = "file") -> None:
    """Refuse a file a study reads unless it is a regular file inside the study `folder`.

    `path` is relative to the study folder; an absolute path, a path climbing out with '..'
    or through a link, a FIFO or device, and a file over `MAX_INPUT_BYTES` are refused in one
    line that never shows the file's content (a study file may come from someone else).
    """
    if not isinstance(path, str) or not path:
        return  # the component's own validation names a bad type
    if Path(path).is_absolute():
        raise ConfigError(f"{field} = {path!r}: must be a path relative to the study folder")
    target = folder / path
    shown = path if len(path) <= 80 else path[:77] + "..."
    try:
        target.resolve().relative_to(folder.resolve())
    except ValueError:
        raise ConfigError(
            f"{field} = {shown!r}: leads out of the study folder; a study reads "
            "only files inside its own folder"
        ) from None
    try:
        exists, regular = target.exists(), target.is_file()
        size = target.stat().st_size if regular else 0
    except OSError as exc:  # e.g. a name too long for the file system
        raise ConfigError(f"{field} = {shown!r}: {exc.strerror or exc}") from None
    if not exists:
        raise ConfigError(f"{field} = {shown!r}: no such {what} in the study folder")
    if not regular:
        raise ConfigError(f"{field} = {shown!r}: not a regular file (a {what} is a text file)")
    if size > MAX_INPUT_BYTES:
        raise ConfigError(f"{field} = {path!r}: {size} bytes; at most {MAX_INPUT_BYTES}")


def _trace_files(network: dict, folder: Path) -> dict:
    """`network` with the trace `file` of its outages and nodes tables checked.

    A trace file is relative to the study folder and stays so in the scenario (its config hash
    holds no absolute path); the scenario resolves it against its folder when it runs.
    """
    for sub in TRACE_TABLES:
        table = network.get(sub)
        if _is_table(table) and "file" in table:
            check_input_file(folder, table["file"], f"[network.{sub}]: file", "trace file")
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
    if "path" in topology:
        check_input_file(file.parent, topology["path"], "[topology]: path", "graph file")
    return topology


def _scenario_at(
    spec, point, data, network, topology, defaults, t_max, checkpoints, settings, folder: Path
) -> Scenario:
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
        folder=str(folder),
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


def _curve_job(
    curve: CurveSpec,
    index: int,
    point: GridPoint,
    data: dict,
    topology: dict | None,
    defaults: dict,
    t_max: int = 0,
    checkpoints: int = 0,
    folder: Path | None = None,
):
    """A curve at a grid point; a curve declaring `topology` receives the [topology] table."""
    data, _, defaults, topology = _apply_point(point, data, {}, defaults, topology)
    cls = _params_class(CURVES.get(curve.kind))
    declared = set(field_names(cls))
    table = {k: v for k, v in defaults.items() if k in declared}
    if CURVE_TOPOLOGY_KEY in declared and topology is not None:
        if isinstance(topology.get("path"), str) and folder is not None:  # a graph file
            topology = {**topology, "path": str(folder / topology["path"])}
        table[CURVE_TOPOLOGY_KEY] = topology
    table.update(curve.params)
    try:
        data_cls = _params_class(DATA.get(data["model"]))
        data_params = build(data_cls, {k: v for k, v in data.items() if k != "model"}, "data")
        params = build(cls, table, f"curve {curve.name!r}")
        check = getattr(params, "check", None)  # a curve's own limits, given the data
        if check is not None:
            try:
                check(data_params)
            except ValueError as exc:
                raise ConfigError(f"curve {curve.name!r}: {exc}") from None
    except ConfigError as exc:
        raise ConfigError(_at_point(point, str(exc))) from None
    # what the curve's values depend on: equal hashes are one computation (and a cache hit)
    h = canonical_hash(
        {
            "kind": curve.kind,
            "params": _plain(params),
            "data": _plain(data_params),
            "t_max": t_max,
            "checkpoints": checkpoints,
        }
    )
    return CurveJob(curve, index, point, params, data_params, h)


def _plain(obj: Any) -> Any:
    """A params dataclass as plain data (other objects as they are)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj


def _plots(
    tables: list[dict], scenarios, curves, title: str, columns: list[str] | None = None
) -> list[PlotSpec]:
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
        out.append(
            PlotSpec(
                p.file,
                p.title or title,
                p.metric,
                tuple(chosen),
                tuple(p.curves),
                tuple(p.xlim) if p.xlim else None,
                tuple(p.ylim) if p.ylim else None,
                p.x,
                p.at,
                tuple(p.dashed),
                p.xscale or ("log" if p.x == "t" or p.x.startswith(LEDGER_PREFIX) else "linear"),
                p.yscale or default_scale(p.metric),
            )
        )
    return out


def default_scale(metric: str) -> str:
    """The y scale a metric is drawn on by default: log for errors, variances and bounds
    (they span decades), linear for counts and fractions (which may be 0)."""
    return "log" if any(k in metric for k in ("mse", "var", "bound", "error")) else "linear"


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
