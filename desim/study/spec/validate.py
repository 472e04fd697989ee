"""Stage 2, validate: the parsed tables checked against each other and the registries (names of
protocols, curves, metrics; [defaults] and [grid] keys; plots), before anything is expanded."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from desim.kernel.params import ConfigError, field_names, unknown_key_message
from desim.kernel.registry import CURVES, DATA, LINKS, PROTOCOLS, TOPOLOGIES
from desim.network_models.realistic import NETWORK_TABLES, table_keys, unknown_table_message
from desim.study.scenario import check_setup
from desim.study.spec.figures import plot_specs
from desim.study.spec.hashing import canonical_hash
from desim.study.spec.model import (
    GRID_ROOTS,
    MAX_NAME,
    RESERVED_COLUMNS,
    CurveSpec,
    PlotSpec,
    ScenarioSpec,
    Study,
    at_point,
    is_table,
    params_class,
)
from desim.study.spec.parse import StudyDocument


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
    plots = plot_specs(doc.plots, scenarios, curves, doc.settings.title, list(columns.values()))
    return Validated(scenarios, curves, plots, columns, data_cls, link_cls, topo_cls)


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
                raise ConfigError(f"{study.file}: {at_point(run.point, str(exc))}") from None
