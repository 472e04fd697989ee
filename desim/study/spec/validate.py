"""Stage 2, validate: the parsed tables checked against each other and the registries (names of
protocols, curves, metrics; [defaults] and [grid] keys; plots), before anything is expanded."""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
import typing
from dataclasses import dataclass

from desim.kernel.params import (
    ConfigError,
    field_names,
    unknown_key_message,
    without_negative_zero,
)
from desim.kernel.protocol import Protocol
from desim.kernel.recorder import log_checkpoints
from desim.kernel.registry import (
    CURVES,
    DATA,
    LINKS,
    METRICS,
    PROTOCOLS,
    TOPOLOGIES,
    metric_applies,
)
from desim.models.adversaries import KEYS as ADVERSARY_KEYS
from desim.network_models.realistic import NETWORK_TABLES, table_keys, unknown_table_message
from desim.study.scenario import Scenario, check_setup
from desim.study.spec.errors import Errors, messages_of
from desim.study.spec.figures import plot_specs
from desim.study.spec.hashing import canonical_hash
from desim.study.spec.model import (
    ADVERSARIES,
    CURVE_TOPOLOGY_KEY,
    GRID_ROOTS,
    LEDGER_PREFIX,
    RESERVED_COLUMNS,
    CurveSpec,
    PlotSpec,
    ScenarioSpec,
    Study,
    at_point,
    is_table,
    params_class,
)
from desim.study.spec.parse import StudyDocument, check_name
from desim.topologies.dynamic import DYNAMIC_KEYS, Rewire


@dataclass(frozen=True)
class Validated:
    """What validation makes of a study's tables: its scenarios, curves, plots (titles not yet
    filled in), grid columns and the params classes of its data, links and topology."""

    scenarios: list[ScenarioSpec]
    curves: list[CurveSpec]
    plots: list[PlotSpec]
    grid_columns: dict[str, str]
    data_cls: type
    link_cls: type
    topo_cls: type | None


def validate_study(doc: StudyDocument) -> Validated:
    """Check the tables of `doc` against each other and against the registries."""
    data_cls = params_class(DATA.lookup(doc.data["model"], "[data]: model"))
    link_cls = params_class(LINKS.lookup(doc.network["links"], "[network]: links"))
    topology = doc.topology
    topo_cls = params_class(TOPOLOGIES.get(topology["model"])) if topology is not None else None
    curves = _curves(doc.curves, [t.get("name") for t in doc.scenarios])
    scenarios = _scenarios(doc.scenarios, bool(curves))
    known = declared_defaults(scenarios, curves)
    for key in doc.defaults:
        if key not in known:
            raise ConfigError(unknown_key_message("[defaults]", key, sorted(known)))
    columns = grid_columns(doc.grid, data_cls, link_cls, topo_cls, known, doc.network)
    _check_grid_reaches(doc.grid, [*scenarios, *curves])
    _check_adversaries_grid(doc.grid, doc.defaults, scenarios)
    for spec in scenarios:
        check_where(spec, doc.grid)
    plots = plot_specs(doc.plots, scenarios, curves, doc.settings.title, list(columns.values()))
    return Validated(scenarios, curves, plots, columns, data_cls, link_cls, topo_cls)


def _named_tables(tables: list[dict], kind: str, type_key: str) -> list[tuple[str, str, dict]]:
    """(name, type name, other keys) of [[scenario]] or [[curve]] tables, names unique."""
    out: list[tuple[str, str, dict]] = []
    seen: set[str] = set()
    for n, table in enumerate(tables, start=1):
        name = check_name(table, n, kind)
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
        where = params.pop("where", {})
        if not is_table(where) or not all(
            isinstance(v, list) and v and not any(isinstance(x, bool) for x in v)
            for v in where.values()
        ):
            raise ConfigError(
                f"scenario {name!r}: where = {where!r}: must be a table of grid paths, each "
                'with the list of its values the scenario runs at (where = {"data.agents" = '
                "[100, 1000]})"
            )
        out.append(ScenarioSpec(name, protocol, params, dict(where)))
    return out


def check_where(spec: ScenarioSpec, grid: dict) -> None:
    """Refuse a scenario's `where` that names a path the [grid] does not sweep, or a value
    the grid does not take there (the scenario would silently never run)."""
    for path, allowed in spec.where.items():
        if path not in grid:
            raise ConfigError(
                f"scenario {spec.name!r}: where: {path!r} is not swept by the [grid]; allowed: "
                + (", ".join(repr(p) for p in grid) or "none (the study has no [grid])")
            )
        values = grid[path] if isinstance(grid[path], list) else []
        for value in allowed:
            if value not in values:
                raise ConfigError(
                    f"scenario {spec.name!r}: where: {path!r} = {value!r} is not a value of "
                    f"the grid there; allowed: {', '.join(repr(v) for v in values)}"
                )


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


def declared(spec: ScenarioSpec | CurveSpec) -> list[str]:
    """The parameter names the protocol of a scenario, or the kind of a curve, declares."""
    if isinstance(spec, ScenarioSpec):
        return field_names(params_class(PROTOCOLS.get(spec.protocol)))
    return field_names(params_class(CURVES.get(spec.kind)))


def declared_defaults(scenarios: list[ScenarioSpec], curves: list[CurveSpec]) -> set[str]:
    """Every parameter name that some scenario's protocol or some curve declares."""
    return {name for spec in [*scenarios, *curves] for name in declared(spec)}


def grid_columns(
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
        "topology": [*field_names(topo_cls), *DYNAMIC_KEYS] if topo_cls is not None else [],
        "defaults": sorted(declared),
        ADVERSARIES: list(ADVERSARY_KEYS),
    }
    columns: dict[str, str] = {}
    for path, values in grid.items():
        root, _, key = path.partition(".")
        if root == "network" and "." in key:
            key = _network_grid_key(path, grid, network)
        elif root == "topology" and key.startswith("rewire.") and topo_cls is not None:
            key = key.partition(".")[2]
            if key not in field_names(Rewire):
                raise ConfigError(
                    unknown_key_message(f"[grid]: {path!r}", key, field_names(Rewire))
                )
        elif root not in GRID_ROOTS or not key or "." in key:
            raise ConfigError(
                f"[grid]: {path!r}: a grid path must be data.<key>, network.<key>, "
                "network.<sub-table>.<key>, topology.<key>, topology.rewire.<key>, "
                "adversaries.<key> or defaults.<key>"
            )
        elif root == "topology" and topo_cls is None:
            raise ConfigError(f"[grid]: {path!r}: the study has no [topology] table to sweep")
        elif key not in allowed[root]:
            raise ConfigError(unknown_key_message(f"[grid]: {path!r}", key, allowed[root]))
        if not isinstance(values, list) or not values:
            raise ConfigError(f"[grid]: {path!r} = {values!r}: must be a non-empty list of values")
        # -0.0 is 0.0 (`build` reads it so): two such values would be one grid point twice
        shown = [json.dumps(without_negative_zero(v), sort_keys=True, default=str) for v in values]
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
    if not is_table(table):
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


def _check_adversaries_grid(grid: dict, defaults: dict, scenarios: list[ScenarioSpec]) -> None:
    """Refuse a sweep of an [adversaries] key without that table, or that a scenario's own
    ``adversaries = {…}`` would hide."""
    for path in grid:
        if path.partition(".")[0] != ADVERSARIES:
            continue
        if ADVERSARIES not in defaults:
            raise ConfigError(f"[grid]: {path!r}: the study has no [adversaries] table to sweep")
        for spec in scenarios:
            if ADVERSARIES in spec.params:
                raise ConfigError(
                    f"[grid]: {path!r}: scenario {spec.name!r} sets adversaries itself, so the "
                    "sweep would not reach it; remove adversaries from that scenario"
                )


def _short_doc(doc: str) -> str:
    """The first phrase of a parameter's description, for an axis label."""
    for phrase in re.split(r";|:", doc):
        text = re.split(r" \(|, ", phrase.strip(), maxsplit=1)[0].strip()
        if text and not text.startswith(("if ", "with ")):
            return text if len(text) <= 32 else ""
    return ""


def labels(v: Validated) -> dict[str, str]:
    """Axis label of every grid column: ``<description> (<column>)`` when one is declared."""
    out = {}
    for path, column in v.grid_columns.items():
        short = _short_doc(_path_doc(v, path))
        out[column] = f"{short} ({column})" if short and short != column else column
    return out


def _path_doc(v: Validated, path: str) -> str:
    """The description of the parameter a grid path sweeps ('' when none is declared)."""
    root, _, key = path.partition(".")
    if root == "data":
        return _doc_of(v.data_cls, key)
    if root == "topology":
        return _doc_of(v.topo_cls, key)
    if root == "network" and "." not in key:
        return _doc_of(v.link_cls, key)
    if root == "network":
        sub, _, inner = key.partition(".")
        return f"{sub} {inner}"
    if root == "defaults":
        for spec in [*v.scenarios, *v.curves]:
            doc = _doc_of(
                params_class(PROTOCOLS.get(spec.protocol))
                if isinstance(spec, ScenarioSpec)
                else params_class(CURVES.get(spec.kind)),
                key,
            )
            if doc:
                return doc
    return ""


def _doc_of(cls: type | None, key: str) -> str:
    """The description of parameter `key` of params class `cls` ('' when none)."""
    if cls is None:
        return ""
    for f in dataclasses.fields(cls):
        if f.name == key:
            return f.metadata.get("doc", "")
    return ""


def check_setups(study: Study) -> None:
    """`check_setup` for every distinct data, network and topology set-up of the study's runs
    (replicate 0), and for every distinct protocol and parameters there when the protocol has
    checks of its own (`Protocol.check_setup`): what `desim validate` and `desim run` check
    before any run. Every failing set-up is reported (`ConfigErrors`), a fault found at
    several grid points once (at the first); a set-up too large to build in memory (possible
    only with ``--force``, which skips the size estimates) is one of them."""
    errors = Errors()
    seen: set[str] = set()
    said: set[str] = set()
    for run in study.unique_runs:
        s = run.scenario
        if s.replicate != 0:
            continue
        key = _setup_key(s)
        if key in seen:
            continue
        seen.add(key)
        try:
            check_setup(s)
        except ConfigError as exc:
            faults = messages_of(exc)
        except MemoryError as exc:
            label = f"scenario {s.name!r}"
            faults = (f"{label}: {' '.join(str(exc).split()) or 'out of memory'}",)
        else:
            continue
        for fault in faults:
            if fault not in said:
                said.add(fault)
                errors.add(f"{study.file}: {at_point(run.point, fault)}")
    errors.raise_any()


def _setup_key(s: Scenario) -> str:
    """What makes two runs' set-ups the same for `check_setup`: data, network, topology and
    seed, and the protocol and its parameters when the protocol checks a set-up itself."""
    parts = [s.data, s.network, s.topology, s.seed]
    cls = PROTOCOLS.get(s.protocol)
    if getattr(cls.check_setup, "__func__", None) is not Protocol.check_setup.__func__:
        parts += [s.protocol, s.params]  # e.g. PriCER's trusted = 100 for n = 10 nodes
    return canonical_hash(parts)


# --------------------------------------------------------------------------------------------
# every table, metric and plotted slot read by someone


#: The study tables a protocol may declare it reads (`Protocol.reads`), as a study file names
#: them.
READ_TABLES = {"network": "[network]", "topology": "[topology]"}
#: Largest magnitude of a number in [data], and the smallest of one that is not 0: squares,
#: precision weights 1/σ² and their products with the data (Private-ColME's combination)
#: stay finite over a run.
MAX_DATA_MAGNITUDE = 1e50
MIN_DATA_MAGNITUDE = 1e-50
#: Smallest privacy budget ε (parameters named epsilon…): noise variances grow as 1/ε² and
#: Sch-Var-1's variance of a variance as 1/ε⁴, which overflows below about 1e-77; a margin
#: for PM-II's split of ε over up to 30 levels and for sums over a run.
MIN_EPSILON = 1e-50


def study_checks(doc: StudyDocument, v: Validated) -> list[str]:
    """Refuse a table, metric, plotted slot or [data] value that no run would use as written
    (`ConfigErrors`, one line each: every check reports every fault it finds, and all checks
    run); return notes on tables some scenarios ignore."""
    errors = Errors()
    if errors.passes(check_data_values, doc):  # (a value refused there is not also unread)
        errors.passes(check_data_read, doc, v)
    errors.passes(check_privacy_budgets, doc)
    errors.passes(check_choices_said, doc, v)
    notes = errors.attempt(check_tables_read, doc, v) or []
    for check in (check_metrics_recorded, check_plot_recorders):
        errors.passes(check, doc, v)
    errors.passes(check_plot_slots, v.plots, doc.settings.t_max, doc.settings.checkpoints)
    errors.raise_any()
    return notes


def reads_table(protocol: type, table: str, link_cls: type | None = None) -> bool:
    """Whether a scenario of `protocol` reads the study's `table` ("network" or "topology"):
    its declaration (`Protocol.reads`), or for the topology, links that follow the graph
    (``reads_topology``) carrying its messages."""
    declared = getattr(protocol, "reads", frozenset(READ_TABLES))
    if table in declared:
        return True
    follows_graph = getattr(link_cls, "reads_topology", False)
    return table == "topology" and "network" in declared and bool(follows_graph)


def check_tables_read(doc: StudyDocument, v: Validated) -> list[str]:
    """Refuse a [network] or [topology] table that no scenario (nor curve) of the study reads,
    naming who would read it; return a note naming the scenarios that ignore a table others
    read (baselines that read nothing, like local and ideal, are not named)."""
    present = [t for t in READ_TABLES if t in doc.raw]
    notes = []
    errors = Errors()
    for table in present:
        readers = {s.name for s in v.scenarios if _reads(s, table, v, doc.defaults)}
        curves = [c for c in v.curves if table == "topology" and CURVE_TOPOLOGY_KEY in declared(c)]
        if not readers and not curves:
            errors.add(_unread_message(table, v))
            continue
        ignoring = [s for s in v.scenarios if s.name not in readers and _worth_noting(s, table)]
        if ignoring:
            notes.append(_ignored_note(table, ignoring))
    errors.raise_any()
    return notes


def _worth_noting(spec: ScenarioSpec, table: str) -> bool:
    """Whether a scenario ignoring `table` is news: not for a baseline that reads no table, nor
    for a protocol that sends no messages ignoring [network]."""
    cls = PROTOCOLS.get(spec.protocol)
    if table == "network" and not getattr(cls, "message_kinds", True):
        return False
    return bool(getattr(cls, "reads", True))


def _reads(spec: ScenarioSpec, table: str, v: Validated, defaults: dict | None = None) -> bool:
    cls = PROTOCOLS.get(spec.protocol)
    # a protocol may read a table only under one parameter value (`reads_when`)
    param, value = cls.reads_when.get(table, (None, None))
    if param is not None and {**(defaults or {}), **spec.params}.get(param) == value:
        return True
    return reads_table(cls, table, v.link_cls)


def check_choices_said(doc: StudyDocument, v: Validated) -> None:
    """Refuse a scenario that leaves unsaid a choice its protocol must be told when the study
    has a table (`must_say`: private-colme's `peers` beside a [topology]), naming the choice."""
    errors = Errors()
    for s in v.scenarios:
        cls = PROTOCOLS.get(s.protocol)
        for table, param in cls.must_say.items():
            if table in doc.raw and param not in s.params and param not in doc.defaults:
                allowed = typing.get_args(typing.get_type_hints(cls.Params)[param])
                errors.add(
                    f"scenario {s.name!r}: the study has a {READ_TABLES[table]} table: say "
                    f"{param} = {' or '.join(json.dumps(x) for x in allowed)} "
                    f"(protocol {s.protocol!r})"
                )
    errors.raise_any()


def _unread_message(table: str, v: Validated) -> str:
    """'[topology] is read by c-colme, …; no scenario here reads it' (and the curves)."""
    who = [name for name, cls in PROTOCOLS.items() if reads_table(cls, table, v.link_cls)]
    if table == "topology":
        kinds = [k for k, c in CURVES.items() if CURVE_TOPOLOGY_KEY in field_names(params_class(c))]
        if kinds:
            who.append(f"curves {', '.join(kinds)}")
    here = sorted({s.protocol for s in v.scenarios}) or ["none (curves only)"]
    return (
        f"{READ_TABLES[table]} is read by {', '.join(who) or 'no protocol'}; no scenario here "
        f"reads it (protocols here: {', '.join(here)}): remove the table"
    )


def _ignored_note(table: str, ignoring: list[ScenarioSpec]) -> str:
    """'private-colme scenarios 'A', 'B' ignore [topology] (…)' grouped by protocol."""
    groups: dict[str, list[str]] = {}
    for s in ignoring:
        groups.setdefault(s.protocol, []).append(repr(s.name))
    parts = [
        f"{protocol} scenario{'s' if len(names) > 1 else ''} {', '.join(names)}"
        for protocol, names in groups.items()
    ]
    verb = "ignores" if len(ignoring) == 1 else "ignore"
    return f"{'; '.join(parts)} {verb} {READ_TABLES[table]} (other scenarios here read it)"


def check_data_read(doc: StudyDocument, v: Validated) -> None:
    """Refuse a [data] key, set or swept by the grid, that the data model reads only under
    settings of another key (its ``read_only_when`` declaration: key -> (setting, values that
    read it)) which no grid point of the study has, naming the settings that would read it."""
    declared = getattr(v.data_cls, "read_only_when", {})
    grid = {p[len("data.") :]: vs for p, vs in doc.grid.items() if p.startswith("data.")}
    hints = typing.get_type_hints(v.data_cls)
    defaults = {f.name: f.default for f in dataclasses.fields(v.data_cls)}
    errors = Errors()
    for key in dict.fromkeys([*doc.data, *grid]):
        if key not in declared:
            continue
        setting, readers = declared[key]
        values = grid.get(setting, [doc.data.get(setting, defaults.get(setting))])
        known = typing.get_args(hints[setting])
        if not isinstance(values, list) or not all(x in known for x in values):
            continue  # a bad setting is its own error (the data model's check names it)
        if any(x in readers for x in values):
            continue
        where = f"[grid]: 'data.{key}'" if key in grid else f"[data]: {key} = {doc.data[key]!r}"
        here = f"{setting} = {values[0]!r}" if len(values) == 1 else f"{setting} in {values!r}"
        errors.add(
            f"{where}: {doc.data['model']} data read {key} only with {setting} = "
            f"{' or '.join(map(repr, readers))} (here {here}); remove {key}"
        )
    errors.raise_any()


def check_metrics_recorded(doc: StudyDocument, v: Validated) -> None:
    """Refuse a [study] metric that records nothing for any scenario's protocol (its
    `desim.kernel.registry.applies_to` declaration), naming the protocols it is for."""
    protocols = [PROTOCOLS.get(s.protocol) for s in v.scenarios]
    errors = Errors()
    for name in doc.settings.metrics:
        fn = METRICS.get(name)
        if any(metric_applies(fn, cls) for cls in protocols):
            continue
        who = [p for p, cls in PROTOCOLS.items() if metric_applies(fn, cls)]
        here = sorted({s.protocol for s in v.scenarios}) or ["none (curves only)"]
        errors.add(
            f"[study]: metrics: {name!r} records something for {', '.join(who) or 'no protocol'}"
            f" scenarios; no scenario here is one (protocols here: {', '.join(here)})"
        )
    errors.raise_any()


def check_plot_recorders(doc: StudyDocument, v: Validated) -> None:
    """Refuse a plot of a metric that none of its own scenarios records: a message count of a
    kind their protocols never send, or a name only a [study] metric records that applies to
    none of them (`desim.kernel.registry.applies_to`); the figure would be empty."""
    protocols = {s.name: PROTOCOLS.get(s.protocol) for s in v.scenarios}
    outputs = [(name, METRICS.get(name)) for name in doc.settings.metrics]
    errors = Errors()
    for plot in v.plots:
        classes = [protocols[name] for name in plot.scenarios if name in protocols]
        if not classes:
            continue
        for key, metric in [("metric", plot.metric), *(("dashed", m) for m in plot.dashed)]:
            recorders = _recorders(metric, outputs)
            if recorders is None or any(r(cls) for r in recorders for cls in classes):
                continue
            errors.add(
                f"plot {plot.file!r}: {key} = {metric!r}: none of its scenarios "
                f"({', '.join(sorted({s for s in plot.scenarios}))}) records it; "
                "name scenarios whose protocol does"
            )
    errors.raise_any()


def _recorders(metric: str, outputs: list) -> list | None:
    """Tests `protocol class -> bool` of who records `metric` (None: every protocol, or a name
    this check does not know, which `figures` checks)."""
    for what in ("messages_", "dropped_"):
        if metric.startswith(what):
            kind = metric[len(what) :]
            return [lambda cls, kind=kind: kind in getattr(cls, "message_kinds", ())]
    found = [
        fn
        for _, fn in outputs
        if any(fnmatch.fnmatchcase(metric, p) for p in getattr(fn, "outputs", None) or ())
    ]
    if metric == "mse" or not found:
        return None
    return [lambda cls, fn=fn: metric_applies(fn, cls) for fn in found]


def check_plot_slots(plots: list[PlotSpec], t_max: int, checkpoints: int) -> None:
    """Refuse a plot's `at` that is not a measured slot of the study (beyond t_max, or between
    two checkpoints): its figure would silently have no point."""
    slots = None
    errors = Errors()
    for plot in plots:
        if plot.at is None:
            continue
        if plot.x == "t" or plot.x.startswith(LEDGER_PREFIX):
            errors.add(
                f"plot {plot.file!r}: at = {plot.at:g}: read only with x a grid column "
                f"(here x = {plot.x!r}, drawn at every slot): remove at"
            )
            continue
        slots = log_checkpoints(t_max, checkpoints) if slots is None else slots
        if plot.at in slots:
            continue
        below, above = slots[slots < plot.at], slots[slots > plot.at]
        near = [int(x) for x in (below[-1:].tolist() + above[:1].tolist())]
        where = (
            f"beyond t_max = {t_max}"
            if plot.at > t_max
            else f"between the measured slots {near[0]} and {near[1]}"
        )
        errors.add(
            f"plot {plot.file!r}: at = {plot.at:g}: {where}; at must be a measured slot "
            f"(the {len(slots)} log-spaced checkpoints in [1, {t_max}], e.g. {near[-1]})"
        )
    errors.raise_any()


def check_data_values(doc: StudyDocument) -> None:
    """Refuse a [data] number (also under a grid) that is not finite, or whose magnitude exceeds
    `MAX_DATA_MAGNITUDE` or, not being 0, is below `MIN_DATA_MAGNITUDE`: squared errors and
    precision-weighted sums of such data overflow, and runs would "succeed" with inf or nan."""
    tables = [("[data]", doc.data)]
    tables += [(f"[grid]: {p!r}", {p: vs}) for p, vs in doc.grid.items() if p.startswith("data.")]
    errors = Errors()
    for where, table in tables:
        for key, value in table.items():
            bad = _first_huge(value)
            if bad is not None:
                shown = f"{key} = {bad!r}" if bad is value else f"{key} holds {bad!r}"
                errors.add(
                    f"{where}: {shown}: numbers in [data] must be finite, 0 or of magnitude "
                    f"in [{MIN_DATA_MAGNITUDE:g}, {MAX_DATA_MAGNITUDE:g}] (squared errors and "
                    "precision weights 1/σ² must stay finite)"
                )
    errors.raise_any()


def check_privacy_budgets(doc: StudyDocument) -> None:
    """Refuse a privacy budget (a parameter named epsilon…, in a scenario, curve, [defaults] or
    the grid) below `MIN_EPSILON`: its noise variance overflows and the runs fail."""
    tables = [(f"scenario {t.get('name')!r}", t) for t in doc.scenarios]
    tables += [(f"curve {t.get('name')!r}", t) for t in doc.curves]
    tables += [("[defaults]", doc.defaults)]
    tables += [("[grid]", {p.partition(".")[2]: vs for p, vs in doc.grid.items()})]
    errors = Errors()
    for where, table in tables:
        for key, value in table.items():
            if not key.startswith("epsilon"):
                continue
            for x in value if isinstance(value, list) else [value]:
                small = isinstance(x, int | float) and not isinstance(x, bool) and 0 < x
                if small and x < MIN_EPSILON:
                    errors.add(
                        f"{where}: {key} = {x!r}: must be at least {MIN_EPSILON:g} (the noise "
                        "variance grows as 1/ε² and overflows for smaller budgets)"
                    )
    errors.raise_any()


def _first_huge(value: object) -> float | None:
    """The first number in `value` (nested lists and tables) not finite, 0 or of magnitude in
    [`MIN_DATA_MAGNITUDE`, `MAX_DATA_MAGNITUDE`]."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        size = abs(value)
        ok = math.isfinite(value) and (
            size == 0 or MIN_DATA_MAGNITUDE <= size <= MAX_DATA_MAGNITUDE
        )
        return None if ok else value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for item in items:
        bad = _first_huge(item)
        if bad is not None:
            return bad
    return None
