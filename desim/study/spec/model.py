"""What a study file becomes: its tables as dataclasses, the runs and curve jobs, and the constants
the stages share (`desim.study.spec.parse` → `validate` → `expand` → `hashing`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from desim.kernel.params import param
from desim.study.scenario import Scenario

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
    "adversaries",
)
#: The top-level table that reaches, as the parameter of that name, every scenario whose protocol
#: declares it (as a [defaults] key would): the adversaries of `desim.models.adversaries`.
ADVERSARIES = "adversaries"
#: The tables a grid path may start with (``adversaries.<key>``: a key of the [adversaries] table).
GRID_ROOTS = ("data", "network", "topology", "defaults", ADVERSARIES)
#: The [network] sub-tables whose `file` (a trace) is relative to the study folder.
TRACE_TABLES = ("outages", "nodes")
#: The curve parameter that receives the study's [topology] table (at each grid point).
CURVE_TOPOLOGY_KEY = "topology"
#: Column names of the results tables, which grid columns must not shadow.
RESERVED_COLUMNS = frozenset(
    {"scenario", "replicate", "t", "metric", "value", "curve", "stderr", "agent"}
)
#: Names of the privacy ledger's metrics start so; a [[plot]] may take one as its x axis.
LEDGER_PREFIX = "eps_"
#: What `--quick` uses when a study has no [quick] table (values never exceed the study's).
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
    where: dict[str, list] = dataclasses.field(default_factory=dict)
    """The grid values this scenario runs at (``{"data.agents": [100, 1000]}``), by grid
    path; a path it does not name runs at all its values (empty: every grid point)."""

    def runs_at(self, point: GridPoint) -> bool:
        """Whether the scenario runs at grid `point` (each path it restricts has a value
        it lists there)."""
        return all(point.values[path] in allowed for path, allowed in self.where.items())


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
    notes: tuple[str, ...] = ()
    """What validation tells the user without refusing (e.g. scenarios that ignore a table)."""

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
# small helpers shared by the stages


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


def is_table(value: Any) -> bool:
    """Whether `value` is a TOML table (a dict)."""
    return isinstance(value, dict)


def did_you_mean(name: str, allowed: list[str]) -> str:
    """`` (did you mean 'x'?)`` for the allowed name closest to `name`, else ''."""
    close = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def params_class(obj: Any) -> type:
    """The params dataclass of a registered object: its `Params`, or itself."""
    return getattr(obj, "Params", obj)


def at_point(point: GridPoint, message: str) -> str:
    """`message` prefixed with the grid point it arose at (unchanged without a grid)."""
    return f"grid point {point.label}: {message}" if point.columns else message


def default_scale(metric: str) -> str:
    """The y scale a metric is drawn on by default: log for errors, variances and bounds
    (they span decades), linear for counts and fractions (which may be 0)."""
    return "log" if any(k in metric for k in ("mse", "var", "bound", "error")) else "linear"
