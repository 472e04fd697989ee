"""What a study costs: the horizon `--quick` runs with, and the size checks that refuse a study
too large for one machine before its grid is expanded."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from desim.kernel.params import ConfigError, build, field_names
from desim.kernel.registry import CURVES, PROTOCOLS
from desim.study.spec.model import QUICK_FALLBACK, TRACE_TABLES, CurveSpec, ScenarioSpec
from desim.study.spec.parse import StudyDocument


@dataclass(frozen=True)
class Horizon:
    """Replicates, horizon, checkpoints and [data] table a study runs with (--quick changes
    them)."""

    replicates: int
    t_max: int
    checkpoints: int
    data: dict


def horizon(doc: StudyDocument, quick: bool) -> Horizon:
    """The study's horizon; with `quick`, the [quick] table (or `QUICK_FALLBACK`, never above
    the study's own values) overrides replicates, t_max, checkpoints and data.agents."""
    settings, data = doc.settings, dict(doc.data)
    if not quick:
        return Horizon(settings.replicates, settings.t_max, settings.checkpoints, data)
    q = {k: v for k, v in dataclasses.asdict(doc.quick).items() if v is not None}
    if "quick" not in doc.raw:
        q = {k: min(v, getattr(settings, k)) for k, v in QUICK_FALLBACK.items()}
    if "agents" in q:
        data["agents"] = q["agents"]
    return Horizon(
        q.get("replicates", settings.replicates),
        q.get("t_max", settings.t_max),
        q.get("checkpoints", settings.checkpoints),
        data,
    )


#: Largest study desim runs without --force: runs, agent-slots of one run, total agent-slots.
MAX_RUNS = 200_000
MAX_AGENT_SLOTS_PER_RUN = 10**11
MAX_AGENT_SLOTS = 10**13
MAX_CHECKPOINTS = 100_000
#: Bytes a run holds per agent and checkpoint (estimates, errors, per-agent records).
BYTES_PER_AGENT_CHECKPOINT = 64


def check_size(h: Horizon, grid: dict, n_scenarios: int) -> None:
    """Refuse a study too large to finish: run count, time and memory, estimated up front.

    A run costs about agents × t_max agent-slots of work and holds agents × checkpoints
    values; the estimate uses the largest agent count the grid reaches.
    """
    replicates, t_max, checkpoints, data = h.replicates, h.t_max, h.checkpoints, h.data
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
    memory = _agent_bytes(agents, t_max, checkpoints)
    available = _memory_bytes()
    if available and memory > available:
        raise ConfigError(
            f"[data]: agents = {agents}: one run needs about "
            f"{memory / 2**30:.3g} GiB; this machine has "
            f"{available / 2**30:.3g} GiB (--force to run it anyway)"
        )


def _agent_bytes(agents: int, t_max: int, checkpoints: int) -> int:
    """What every run holds per agent: its estimates and records at each checkpoint."""
    return agents * min(checkpoints, t_max) * BYTES_PER_AGENT_CHECKPOINT + agents * 4096


#: Bytes every run holds whatever its size (the interpreter, numpy, the engine's buffers).
BASE_BYTES = 128 * 2**20
#: Copies of the n × d data vectors made while they are drawn (draw, cube, normalise).
DATA_COPIES = 3
#: What drives each unit of a declared `Protocol.memory` (and a curve's), for messages.
UNITS = {
    "agent": "per-agent arrays",
    "pair": "M² pair arrays",
    "edge": "per-edge arrays of the graph",
    "coordinate": "M × d vectors",
    "pair-coordinate": "M² × d shares",
    "draw-agent": "draws × M class-mate subsets of the largest stratum",
    "trace": "trace files parsed into rows",
}
#: Bytes a trace file takes once parsed (Python rows, then arrays), per byte of the file.
TRACE_BYTES_PER_BYTE = 40


@dataclass(frozen=True)
class Sizes:
    """The largest sizes a study's runs reach: agents M, data dimension d, directed edges, and
    the number of classes."""

    agents: int
    dimension: int
    edges: int
    classes: int = 2

    def units(self, draws: int = 0) -> dict[str, float]:
        """How many of each `UNITS` a run of these sizes holds (`draws`: a curve's Monte Carlo
        draws, of which the largest stratum, k class-mates among M − 1, gets its binomial
        share; the normal approximation of the mode's probability)."""
        m, d = self.agents, self.dimension
        p = 1.0 / max(self.classes, 2)
        others = max(m - 1, 1)
        share = min(1.0, 1.0 / math.sqrt(2 * math.pi * others * p * (1 - p)))
        return {
            "agent": m,
            "pair": m * m,
            "edge": self.edges,
            "coordinate": m * d,
            "pair-coordinate": m * m * d,
            "draw-agent": (draws or 0) * others * share,
        }


def check_memory(
    h: Horizon, doc: StudyDocument, scenarios: list[ScenarioSpec], curves: list[CurveSpec]
) -> None:
    """Refuse a scenario or curve whose run needs more memory than this machine has, by the
    bytes its protocol (or curve kind) declares per unit (`Protocol.memory`) at the largest
    sizes the grid reaches; the message gives the estimate and what drives it."""
    available = _memory_bytes()
    if not available:
        return
    sizes = study_sizes(h, doc)
    traces = {"trace": float(TRACE_BYTES_PER_BYTE * _trace_file_bytes(doc))}
    for spec in scenarios:
        cls = PROTOCOLS.get(spec.protocol)
        # the sizes of the grid points the scenario runs at
        own = dataclasses.replace(doc, grid={**doc.grid, **spec.where}) if spec.where else None
        at = sizes if own is None else study_sizes(h, own)
        extra = traces if "network" in getattr(cls, "reads", {"network"}) else {}
        need, driver = max(
            run_bytes(cls, at, h.t_max, h.checkpoints, per_unit=per_unit, extra=extra)
            for per_unit in _per_unit(cls, spec, doc, h.t_max)
        )
        if need > available:
            raise ConfigError(
                f"scenario {spec.name!r}: {spec.protocol} with agents = {at.agents}"
                f"{_dimension(at, driver)} needs about {_gib(need)} ({driver}); "
                f"this machine has {_gib(available)} (--force to run it anyway)"
            )
    for curve in curves:
        cls = CURVES.get(curve.kind)
        draws = _largest("draws", curve.params, doc, _default(cls, "draws"))
        agents = _largest("agents", curve.params, doc, None) or sizes.agents
        own = dataclasses.replace(sizes, agents=agents)
        need, driver = run_bytes(cls, own, 1, 1, draws)
        if need > available:
            raise ConfigError(
                f"curve {curve.name!r}: {curve.kind} with draws = {draws} and agents = {agents} "
                f"needs about {_gib(need)} ({driver}); this machine has {_gib(available)} "
                "(--force to run it anyway)"
            )


def _per_unit(cls: type, spec: ScenarioSpec, doc: StudyDocument, t_max: int) -> list[dict]:
    """The bytes per unit a scenario's protocol gives for its parameters (`[defaults]` and each
    swept value of a [grid] default it declares); its declared `memory` when they are bad
    (expansion then says what is wrong with them)."""
    names = field_names(cls.Params) if hasattr(cls, "Params") else []
    base = {k: v for k, v in doc.defaults.items() if k in names}
    base.update(spec.params)
    tables = [base]
    for path, values in doc.grid.items():
        root, _, key = path.partition(".")
        if root == "defaults" and key in names and key not in spec.params:
            tables += [{**base, key: value} for value in values if isinstance(values, list)]
    out = []
    for table in tables:
        try:
            out.append(cls.memory_per_unit(build(cls.Params, table, "scenario"), t_max))
        except (ConfigError, AttributeError, TypeError, ValueError):
            out.append(dict(getattr(cls, "memory", {})))
    return out


def run_bytes(
    cls: type,
    sizes: Sizes,
    t_max: int,
    checkpoints: int,
    draws: int = 0,
    per_unit: dict[str, float] | None = None,
    extra: dict[str, float] | None = None,
) -> tuple[int, str]:
    """(bytes, what drives them) of one run of protocol (or curve) class `cls` at `sizes`: its
    `memory` per unit (or `per_unit`), the data, every agent's records, `extra` (e.g. trace
    files) and `BASE_BYTES`."""
    units = sizes.units(draws)
    declared = getattr(cls, "memory", {}) if per_unit is None else per_unit
    parts = {unit: units.get(unit, 0) * float(b) for unit, b in declared.items()}
    parts.update({k: v for k, v in (extra or {}).items() if v})
    if sizes.dimension > 1:
        parts["coordinate"] = parts.get("coordinate", 0.0) + DATA_COPIES * 8 * units["coordinate"]
    records = _agent_bytes(sizes.agents, t_max, checkpoints)
    driver = max(parts, key=parts.__getitem__) if parts else "agent"
    if not parts or parts[driver] < records:
        driver = "agent"
    return int(BASE_BYTES + records + sum(parts.values())), UNITS.get(driver, driver)


def _trace_file_bytes(doc: StudyDocument) -> int:
    """Bytes of the largest trace file each [network] sub-table (or a grid value of it)
    names, summed over the sub-tables; files that cannot be read count nothing (the checks of
    the files name them)."""
    total = 0
    for sub in TRACE_TABLES:
        grid = doc.grid.get(f"network.{sub}")
        tables = [doc.network.get(sub), *(grid if isinstance(grid, list) else [])]
        sizes = [0]
        for table in tables:
            name = table.get("file") if isinstance(table, dict) else None
            if isinstance(name, str) and name:
                try:
                    sizes.append((doc.file.parent / name).stat().st_size)
                except (OSError, ValueError):
                    pass
        total += max(sizes)
    return total


def study_sizes(h: Horizon, doc: StudyDocument) -> Sizes:
    """The largest agents, dimension and directed edges the study's grid reaches."""
    agents = _largest_in(h.data, doc.grid, "data", "agents") or 1
    dimension = _largest_in(h.data, doc.grid, "data", "dimension") or 1
    means = h.data.get("class_means")
    classes = len(means) if isinstance(means, list) and means else 2
    return Sizes(agents, dimension, _edges(doc, agents), classes)


#: Directed edges of a topology model per agent, from its parameter (M·(M−1) for others).
_EDGES_PER_AGENT = {"degree": 1.0, "k": 2.0, "m": 2.0}


def _edges(doc: StudyDocument, agents: int) -> int:
    """Directed edges of the largest graph the study's [topology] (and grid) makes."""
    topology = doc.topology
    if topology is None:
        return 0
    dense = agents * (agents - 1)
    for key, factor in _EDGES_PER_AGENT.items():
        value = _largest_in(topology, doc.grid, "topology", key)
        if value is not None:
            return min(dense, int(factor * value * agents))
    if topology.get("model") == "grid":
        return 4 * agents
    p = _largest_in(topology, doc.grid, "topology", "p", number=True)
    if p is not None:
        return int(min(1.0, max(0.0, p)) * dense)
    r = _largest_in(topology, doc.grid, "topology", "radius", number=True)
    if r is not None:
        return int(min(1.0, max(0.0, math.pi * r * r)) * dense)
    return dense


def _largest_in(
    table: dict, grid: dict, root: str, key: str, number: bool = False
) -> int | float | None:
    """The largest value of `key` in `table` and in the grid path ``<root>.<key>``."""
    values = [table.get(key), *grid.get(f"{root}.{key}", [])]
    kinds = (int, float) if number else (int,)
    # an out-of-range value is refused by the table's own check; sizes only skip it
    found = [
        v for v in values if isinstance(v, kinds) and not isinstance(v, bool) and math.isfinite(v)
    ]
    return max(found) if found else None


def _largest(key: str, own: dict, doc: StudyDocument, default: int | None) -> int | None:
    """The largest integer `key` a curve or scenario gets: its own value, else [defaults] and
    the grid's ``defaults.<key>``, else `default`."""
    if key in own:
        values = [own[key]]
    else:
        values = [doc.defaults.get(key, default), *doc.grid.get(f"defaults.{key}", [])]
    found = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
    return max(found) if found else default


def _default(cls: type, name: str) -> int | None:
    """The default of field `name` of dataclass `cls` (None when it has no such field)."""
    params = getattr(cls, "Params", cls)
    if not dataclasses.is_dataclass(params):
        return None
    for f in dataclasses.fields(params):
        if f.name == name and isinstance(f.default, int):
            return f.default
    return None


def _dimension(sizes: Sizes, driver: str) -> str:
    return f" and dimension = {sizes.dimension}" if "d" in driver.split() else ""


def _gib(n: float) -> str:
    return f"{n / 2**30:.3g} GiB"


def _memory_bytes() -> int | None:
    """Physical memory of this machine in bytes (None when unknown)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
