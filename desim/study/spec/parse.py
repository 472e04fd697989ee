"""Stage 1, parse: a study file read into a `StudyDocument`, each table checked for its shape and
its own fields (unknown keys, types, ranges), before any table is compared with another."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from desim.kernel.params import ConfigError, build, field_names, unknown_key_message
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import (
    AVAILABILITY,
    CURVES,
    DATA,
    DISTRIBUTIONS,
    METRICS,
    PROTOCOLS,
    TOPOLOGIES,
    Registry,
)
from desim.network_models.latency import SIZE_PROPORTIONAL, latency_model
from desim.network_models.realistic import NETWORK_TABLES, unknown_table_message
from desim.study.spec.errors import ConfigErrors, Errors, messages_of
from desim.study.spec.model import (
    ADVERSARIES,
    MAX_DEPTH,
    MAX_NAME,
    MAX_STUDY_BYTES,
    STUDY_FILE,
    TOP_KEYS,
    TRACE_TABLES,
    QuickTable,
    StudyTable,
    is_table,
)

#: Largest file (trace, graph) a study may read, in bytes.
MAX_INPUT_BYTES = 64 << 20


@dataclass(frozen=True)
class StudyDocument:
    """A study file's tables, each checked on its own: what the later stages start from."""

    file: Path
    raw: dict
    """The file as read (what the study's config hash covers)."""
    settings: StudyTable
    quick: QuickTable
    data: dict
    network: dict
    topology: dict | None
    defaults: dict
    grid: dict
    scenarios: list[dict]
    curves: list[dict]
    plots: list[dict]


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


def read_study_file(file: Path) -> dict:
    """The TOML of `file` as a dict; a file that is not valid TOML, cannot be read or nests
    too deep is refused in one line naming the file."""
    try:
        with file.open("rb") as fh:
            raw = tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"{file}: tables or arrays nested too deep (at most {MAX_DEPTH} levels)"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{file}: not UTF-8 text (byte {exc.start}); a study file is a UTF-8 TOML file"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot be read: {exc.strerror or type(exc).__name__}") from None
    if _depth(raw, MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(f"{file}: tables or arrays nested too deep (at most {MAX_DEPTH} levels)")
    return raw


def parse_study(raw: dict, file: Path) -> StudyDocument:
    """The tables of a study file read as `raw` from `file`, each checked on its own.

    Every table (and every [[scenario]], [[curve]] and [[plot]]) is checked even when another
    is wrong: all their errors are raised together (`desim.study.spec.errors.ConfigErrors`).
    """
    load_plugins()
    errors = Errors()
    for key in raw:
        if key not in TOP_KEYS:
            errors.add(unknown_key_message("top level", key, list(TOP_KEYS)))
    settings = errors.attempt(_settings, raw)
    quick = errors.attempt(lambda: build(QuickTable, _table(raw, "quick", {}), "[quick]"))
    data = errors.attempt(_data_table, raw)
    network = errors.attempt(_network_table, raw)
    topology = errors.attempt(_topology_table, raw, file)
    for name in settings.metrics if settings is not None else []:
        with errors.check():
            METRICS.lookup(name, "[study]: metrics")
    defaults = errors.attempt(lambda: dict(_table(raw, "defaults", {})))
    if ADVERSARIES in raw and defaults is not None:
        with errors.check():
            defaults[ADVERSARIES] = _adversaries_table(raw)
    grid = errors.attempt(lambda: dict(_table(raw, "grid", {})))
    tables = {}
    for key, type_key, registry in (
        ("scenario", "protocol", PROTOCOLS),
        ("curve", "kind", CURVES),
        ("plot", None, None),
    ):
        tables[key] = errors.attempt(_table, raw, key, [])
        for n, table in enumerate(tables[key] or [], start=1):
            if type_key is not None:
                with errors.check():
                    _named_table(table, n, key, type_key, registry)
    errors.raise_any()
    return StudyDocument(
        file=file,
        raw=raw,
        settings=settings,
        quick=quick,
        data=data,
        network=network,
        topology=topology,
        defaults=defaults,
        grid=grid,
        scenarios=tables["scenario"],
        curves=tables["curve"],
        plots=tables["plot"],
    )


def check_name(table: dict, n: int, kind: str) -> str:
    """The name of the `n`-th [[scenario]] or [[curve]] table, refused unless it is a non-empty
    printable string of at most `MAX_NAME` characters."""
    where = f"[[{kind}]] #{n}"
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        shown = "is missing" if name is None else f"= {name!r}"
        raise ConfigError(f"{where}: name {shown}: must be a non-empty string")
    if len(name) > MAX_NAME or not name.isprintable():
        raise ConfigError(
            f"{where}: name = {name[:40]!r}...: must be at most {MAX_NAME} printable characters"
        )
    return name


def _named_table(table: dict, n: int, kind: str, type_key: str, registry: Registry) -> None:
    """Check the name of the `n`-th [[scenario]] or [[curve]] table on its own, and that it
    has a type (protocol, curve kind); whether names are unique and types exist is `validate`'s
    business."""
    name = check_name(table, n, kind)
    if type_key not in table:
        raise ConfigError(
            f"{kind} {name!r}: {type_key} is required (allowed: {', '.join(registry)})"
        )


def _data_table(raw: dict) -> dict:
    """The [data] table, which names its data model (classes by default)."""
    data = dict(_table(raw, "data", {"model": "classes"}))
    if "model" not in data:
        raise ConfigError(
            f"[data]: model is required (a data model name; allowed: {', '.join(DATA)})"
        )
    return data


def _adversaries_table(raw: dict) -> dict:
    """The [adversaries] table, which reaches every scenario whose protocol simulates adversaries
    (declares the parameter `ADVERSARIES`) as a [defaults] key would; its keys are checked by
    the protocols (`desim.models.adversaries`)."""
    table = _table(raw, ADVERSARIES, {})
    if ADVERSARIES in raw.get("defaults", {}):
        raise ConfigError("[adversaries]: also set in [defaults]; keep one of them")
    scenarios = raw.get("scenario") if isinstance(raw.get("scenario"), list) else []
    readers = [name for name, cls in PROTOCOLS.items() if ADVERSARIES in field_names(cls.Params)]
    if not any(is_table(t) and t.get("protocol") in readers for t in scenarios):
        raise ConfigError(
            f"[adversaries]: no scenario's protocol simulates adversaries (those that do: "
            f"{', '.join(readers)})"
        )
    return dict(table)


def _settings(raw: dict) -> StudyTable:
    """The [study] table, which every study file needs, with a non-empty title."""
    if "study" not in raw:
        raise ConfigError('[study] is missing; it needs at least title = "..."')
    study_raw = _table(raw, "study", {})
    if "title" not in study_raw:
        raise ConfigError("[study]: title is required (a string)")
    settings = build(StudyTable, study_raw, "[study]")
    if not settings.title.strip():
        raise ConfigError(f"[study]: title = {settings.title!r}: must be a non-empty string")
    return settings


def _table(raw: dict, key: str, default: Any) -> Any:
    value = raw.get(key, default)
    if key in ("scenario", "curve", "plot"):
        if not isinstance(value, list) or not all(is_table(v) for v in value):
            raise ConfigError(f"{key} must be an array of tables, written [[{key}]]")
    elif not is_table(value):
        raise ConfigError(f"{key} must be a table, written [{key}]")
    return value


def _network_table(raw: dict) -> dict:
    """The [network] table (links = "ideal" by default), its sub-tables' names checked, and
    the model of each sub-table the [grid] does not replace."""
    network = dict(_table(raw, "network", {}))
    network.setdefault("links", "ideal")
    grid = raw.get("grid") if is_table(raw.get("grid")) else {}
    for key, value in network.items():
        if not is_table(value):
            continue
        if key not in NETWORK_TABLES:
            raise ConfigError(unknown_table_message(key))
        swept = grid.get(f"network.{key}.model")
        if f"network.{key}" in grid:
            continue  # the grid's whole tables are checked where they are used
        if swept is None:
            _check_model(key, value)
        for model in swept if isinstance(swept, list) else []:
            try:
                _check_model(key, {**value, "model": model})
            except ConfigError as exc:
                raise ConfigErrors(
                    f"[grid]: 'network.{key}.model': {m}" for m in messages_of(exc)
                ) from None
    return network


def _check_model(sub: str, table: dict) -> None:
    """Refuse an unknown or missing model in sub-table [network.`sub`] with the message a run
    would give, also when a [grid] sweeps one of its keys (whose allowed keys the model
    decides, so a misspelt model would otherwise read as an unknown key)."""
    where = f"[network.{sub}]"
    if sub == "latency":
        if table.get("model") not in [*DISTRIBUTIONS, SIZE_PROPORTIONAL]:
            latency_model({k: v for k, v in table.items() if k == "model"}, where)
    elif sub in TRACE_TABLES:
        if "model" not in table:
            raise ConfigError(
                f"{where}: missing key 'model'; allowed models: {', '.join(AVAILABILITY)}"
            )
        AVAILABILITY.lookup(table["model"], f"{where}: model")


def check_input_file(
    folder: Path, path: Any, field: str, what: str = "file", limit: int | None = MAX_INPUT_BYTES
) -> None:
    """Refuse a file a study reads unless it is a regular file inside the study `folder`.

    `path` is relative to the study folder; an absolute path, a path climbing out with '..'
    or through a link, a FIFO or device, and a file over `limit` bytes are refused in one
    line that never shows the file's content (a study file may come from someone else).
    """
    if not isinstance(path, str):
        return  # the component's own validation names a bad type
    if not path.strip():
        raise ConfigError(
            f"{field} = {path!r}: names no file; give a path relative to the study folder"
        )
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
    if limit is not None and size > limit:
        raise ConfigError(f"{field} = {path!r}: {size} bytes; at most {limit}")


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
    sequence = topology.get("sequence")
    for i, entry in enumerate(sequence if isinstance(sequence, list) else []):
        if is_table(entry):  # the entries' other faults: `desim.topologies.dynamic.dynamics`
            where = f"[topology]: sequence[{i}]: file"
            check_input_file(file.parent, entry.get("file"), where, "graph file")
    return topology
