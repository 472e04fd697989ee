"""What a study costs: the horizon `--quick` runs with, and the size checks that refuse a study
too large for one machine before its grid is expanded."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from desim.kernel.engine import data_block
from desim.kernel.params import ConfigError, build, field_names
from desim.kernel.registry import CURVES, PROTOCOLS
from desim.study.spec.model import QUICK_FALLBACK, TRACE_TABLES, CurveSpec, ScenarioSpec
from desim.study.spec.parse import StudyDocument, check_input_file


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
#: Bytes a run holds per agent and checkpoint when it keeps per-agent records (each value,
#: then the columns t, agent and value of their table).
BYTES_PER_AGENT_CHECKPOINT = 64
#: Bytes a run holds per agent besides its protocol's declared `memory`.
BYTES_PER_AGENT = 64
#: Arrays of a data block's size alive while it is drawn (the data models draw in place).
BLOCK_COPIES = 1


def check_size(
    h: Horizon, grid: dict, n_scenarios: int, cap: int | None = None, folder: Path | None = None
) -> None:
    """Refuse a study too large to finish: run count, time and memory (against what this
    machine has available, or `cap` bytes: `memory_limit`), estimated up front.

    A run costs about agents × t_max agent-slots of work and holds agents × checkpoints
    values; the estimate uses the largest agent count the grid reaches (a data file's agents,
    counted in the study `folder`).
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
    sizes = [data.get("agents"), table_sizes(data, grid, folder)[0]]
    sizes += list(grid.get("data.agents", []))
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
    memory = _agent_bytes(agents, t_max, checkpoints, per_agent=False)
    available, has = memory_limit(cap)
    if available and memory > available:
        raise ConfigError(
            f"[data]: agents = {agents}: one run needs about {_gib(memory)}; {has} "
            "(--force to run it anyway)"
        )


def _agent_bytes(agents: int, t_max: int, checkpoints: int, per_agent: bool = True) -> int:
    """What every run holds per agent: its state besides the protocol's own (estimates, data
    means), the block of samples drawn at once and, with `per_agent` records, its value at
    each checkpoint."""
    records = agents * min(checkpoints, t_max) * BYTES_PER_AGENT_CHECKPOINT if per_agent else 0
    block = data_block(max(agents, 1)) * agents * 8 * BLOCK_COPIES
    return records + agents * BYTES_PER_AGENT + block


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
    the number of classes; and what bounds per-pair windows: the graph's smallest degree and
    whether every link is ideal."""

    agents: int
    dimension: int
    edges: int
    classes: int = 2
    #: The smallest degree every graph of the study is sure to have (None: unknown, e.g. a
    #: random graph, or one that changes during the run).
    min_degree: int | None = None
    #: Whether every run's links are ideal (none lost or late).
    ideal: bool = True

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
    h: Horizon,
    doc: StudyDocument,
    scenarios: list[ScenarioSpec],
    curves: list[CurveSpec],
    cap: int | None = None,
) -> None:
    """Refuse a scenario or curve whose run needs more memory than this machine has available
    (or than `cap` bytes, `--memory`), by the bytes its protocol (or curve kind) declares per
    unit (`Protocol.memory`) at the largest sizes the grid reaches; the message gives the
    estimate and what drives it."""
    available, has = memory_limit(cap)
    if not available:
        return
    sizes = study_sizes(h, doc)
    traces = {"trace": float(TRACE_BYTES_PER_BYTE * _trace_file_bytes(doc))}
    keep = bool(doc.settings.per_agent)
    for spec in scenarios:
        cls = PROTOCOLS.get(spec.protocol)
        # the sizes of the grid points the scenario runs at
        own = dataclasses.replace(doc, grid={**doc.grid, **spec.where}) if spec.where else None
        at = sizes if own is None else study_sizes(h, own)
        extra = traces if "network" in getattr(cls, "reads", {"network"}) else {}
        need, driver = max(
            run_bytes(
                cls, at, h.t_max, h.checkpoints, per_unit=per_unit, extra=extra, per_agent=keep
            )
            for per_unit in _per_unit(cls, spec, doc, h.t_max, at)
        )
        if need > available:
            raise ConfigError(
                f"scenario {spec.name!r}: {spec.protocol} with agents = {at.agents}"
                f"{_dimension(at, driver)} needs about {_gib(need)} ({driver}); "
                f"{has} (--force to run it anyway)"
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
                f"needs about {_gib(need)} ({driver}); {has} (--force to run it anyway)"
            )


def _per_unit(
    cls: type, spec: ScenarioSpec, doc: StudyDocument, t_max: int, sizes: Sizes
) -> list[dict]:
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
            out.append(cls.memory_per_unit(build(cls.Params, table, "scenario"), t_max, sizes))
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
    per_agent: bool = False,
) -> tuple[int, str]:
    """(bytes, what drives them) of one run of protocol (or curve) class `cls` at `sizes`: its
    `memory` per unit (or `per_unit`), the data, every agent's state (and records, with
    `per_agent`), `extra` (e.g. trace files) and `BASE_BYTES`."""
    units = sizes.units(draws)
    declared = getattr(cls, "memory", {}) if per_unit is None else per_unit
    parts = {unit: units.get(unit, 0) * float(b) for unit, b in declared.items()}
    parts.update({k: v for k, v in (extra or {}).items() if v})
    if sizes.dimension > 1:
        parts["coordinate"] = parts.get("coordinate", 0.0) + DATA_COPIES * 8 * units["coordinate"]
    records = _agent_bytes(sizes.agents, t_max, checkpoints, per_agent)
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


def table_sizes(data: dict, grid: dict, folder: Path | None) -> tuple[int, int]:
    """(agents, rows) of the largest data file a ``table`` study reads (its [data] file and
    the grid's ``data.file`` values), counted from the agent column alone; (0, 0) without
    one, and a file that cannot be read counts nothing (the set-up checks name it)."""
    if folder is None or data.get("model") != "table":
        return 0, 0
    from desim.models.table import agent_counts  # here: only table studies read files

    agents = rows = 0
    for name in [data.get("file"), *grid.get("data.file", [])]:
        try:
            check_input_file(folder, name, "[data]: file", "data file", limit=None)
            ids, counts = agent_counts(folder / name)
        except (ConfigError, ValueError, TypeError, KeyError, OSError):
            continue
        agents, rows = max(agents, len(ids)), max(rows, int(counts.sum()))
    return agents, rows


def vector_sizes(data: dict, folder: Path | None) -> tuple[int, int]:
    """(nodes, dimension) of the file a ``vector-table`` study reads, from its agent column and
    header alone; (0, 0) without one or when it cannot be read (the set-up checks name it)."""
    if folder is None or data.get("model") != "vector-table":
        return 0, 0
    from desim.models.table import agent_counts, column_names  # here: only such studies read

    try:
        check_input_file(folder, data.get("file"), "[data]: file", "data file", limit=None)
        columns = data.get("columns")
        d = (
            len(columns)
            if isinstance(columns, list)
            else len(column_names(folder / data["file"])) - 1
        )
        return len(agent_counts(folder / data["file"])[0]), d
    except (ConfigError, ValueError, TypeError, KeyError, OSError):
        return 0, 0


def study_sizes(h: Horizon, doc: StudyDocument) -> Sizes:
    """The largest agents, dimension and directed edges the study's grid reaches."""
    table = table_sizes(h.data, doc.grid, doc.file.parent)[0]
    vectors = vector_sizes(h.data, doc.file.parent)
    agents = max(_largest_in(h.data, doc.grid, "data", "agents") or 1, table, vectors[0])
    dimension = max(_largest_in(h.data, doc.grid, "data", "dimension") or 1, vectors[1])
    means = h.data.get("class_means")
    classes = len(means) if isinstance(means, list) and means else 2
    ideal = doc.network == {"links": "ideal"} and not any(
        k.startswith("network.") for k in doc.grid
    )
    return Sizes(agents, dimension, _edges(doc, agents), classes, _min_degree(doc, agents), ideal)


#: Directed edges of a topology model per agent, from its parameter (M·(M−1) for others).
_EDGES_PER_AGENT = {"degree": 1.0, "k": 2.0, "m": 2.0}


def _edges(doc: StudyDocument, agents: int) -> int:
    """Directed edges of the largest graph the study's [topology] (and grid) makes."""
    topology = doc.topology
    if topology is None:
        return 0
    dense = agents * (agents - 1)
    if topology.get("model") == "file":
        return min(dense, _file_edges(topology, doc.file.parent) or dense)
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


#: The smallest degree of a topology model's graph, from its parameter's smallest value (a
#: complete graph: M − 1; the others, e.g. a grid of one row or a Barabási–Albert graph's first
#: agents, may have agents of degree 1: unknown).
_MIN_DEGREE = {
    "regular": ("degree", 1),
    "ring": ("k", 2),
    # networkx rewires one end of each lattice link: an agent keeps its k/2 own links
    "watts-strogatz": ("k", 0.5),
}


def _min_degree(doc: StudyDocument, agents: int) -> int | None:
    """The smallest degree the study's graphs of (at most) `agents` agents are sure to have
    (None: unknown, or changing)."""
    topology = doc.topology
    if topology is None or "topology.model" in doc.grid:
        return None
    rewire = topology.get("rewire")
    every = rewire.get("every", 0) if isinstance(rewire, dict) else 0
    if every or topology.get("sequence") or any(k.startswith("topology.rewire.") for k in doc.grid):
        return None
    model = topology.get("model")
    if model == "complete":  # (at the largest M, where the pairs' memory is largest)
        return agents - 1
    if model not in _MIN_DEGREE:
        return None
    key, factor = _MIN_DEGREE[model]
    values = [topology.get(key), *doc.grid.get(f"topology.{key}", [])]
    found = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return int(factor * min(found)) if found else None


def _file_edges(topology: dict, folder: Path) -> int:
    """Directed edges of the graph file a ``file`` topology reads (0 when it cannot be read:
    the set-up checks name it)."""
    from desim.topologies.files import FromFile, read_graph  # here: only graph files need it

    table = {k: v for k, v in topology.items() if k != "model"}
    try:
        if isinstance(table.get("path"), str):
            check_input_file(folder, table["path"], "[topology]: path", "graph file")
            table["path"] = str(folder / table["path"])
        graph = FromFile(**table)
        return 2 * len(read_graph(graph.file(), graph.kind()).u)
    except (ConfigError, ValueError, TypeError, OSError):
        return 0


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
    """Memory a run may use on this machine, in bytes: MemAvailable (Linux's estimate of what
    can be allocated without swapping), less where a cgroup's limit leaves less; physical
    memory where neither is known (None when nothing is)."""
    known = [b for b in (_meminfo_available(), _cgroup_left()) if b is not None]
    if known:
        return min(known)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where the file or the line is absent)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


#: cgroup v2 and v1: (controller folder, limit file, usage file) under /sys/fs/cgroup.
_CGROUP_FILES = (
    ("", "memory.max", "memory.current"),
    ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
)
#: cgroup v1 writes "no limit" as the largest page-aligned 64-bit number: above this, none.
_NO_LIMIT = 2**60


def _cgroup_left(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """What the memory limits of this process's cgroup and its ancestors leave: limit − usage
    + the inactive file cache (the kernel reclaims it first), the least over the limits set
    (None when no limit is set or cgroups cannot be read)."""
    left = []
    for controller, path in _cgroup_paths():
        limit_file, usage_file = next(
            (lim, use) for sub, lim, use in _CGROUP_FILES if sub == controller
        )
        folder = root / controller / path.lstrip("/")
        while True:
            limit = _read_int(folder / limit_file)
            if limit is not None and limit < _NO_LIMIT:
                usage = _read_int(folder / usage_file) or 0
                left.append(max(0, limit - usage + _inactive_file(folder)))
            if folder == root / controller or root not in folder.parents:
                break
            folder = folder.parent
    return min(left) if left else None


def _cgroup_paths() -> list[tuple[str, str]]:
    """(controller folder, cgroup path) of this process: "" for v2, "memory" for v1."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            out.append(("", path))
        elif "memory" in controllers.split(","):
            out.append(("memory", path))
    return out


def _read_int(file: Path) -> int | None:
    """The integer a cgroup file holds (None: absent, unreadable or "max")."""
    try:
        return int(file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _inactive_file(folder: Path) -> int:
    """Bytes of inactive file cache a cgroup's memory.stat reports (0 when unknown)."""
    try:
        for line in (folder / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "inactive_file":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_limit(cap: int | None = None) -> tuple[int | None, str]:
    """(bytes a run may use, how to say it): what this machine has available, or less when
    `cap` (`--memory`) says less."""
    available = _memory_bytes()
    if cap is not None and (available is None or cap < available):
        return cap, f"--memory allows {_gib(cap)}"
    if available is None:
        return None, ""
    return available, f"this machine has {_gib(available)} available"


#: Suffixes of a `--memory` size and their bytes (binary multiples; B and iB optional).
_SIZE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """Bytes of a size such as 512M, 2G, 1.5GiB or 1000000 (binary multiples); ValueError
    naming the text and what is allowed otherwise."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", text.upper())
    if match is None or float(match[1]) <= 0:
        raise ValueError(f"{text!r}: must be a size > 0 such as 512M, 2G or 1.5GiB")
    return int(float(match[1]) * _SIZE_UNITS[match[2]])
