"""Declared, validated parameters: what protocols, data models, links and curves accept.

A component declares its parameters as a frozen dataclass whose fields are made with `param`
(default, one-sentence doc, optional bounds). `build` turns a table read from a study file into
that dataclass, or raises `ConfigError` with one line naming the field, the value and what is
allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A study file or argument that cannot be run; the message is one line for a person."""


#: Errors shown at most; the rest are counted (``… and N more``).
MAX_SHOWN = 20


class ConfigErrors(ConfigError):
    """Several independent errors of one study file: `messages` holds each, one line apiece.

    Its text is the first `MAX_SHOWN` messages, one per line, then ``… and N more`` when
    there are more; with one message it is that message, as a plain `ConfigError` would be.
    """

    def __init__(self, messages: Iterable[str]) -> None:
        self.messages: tuple[str, ...] = tuple(messages)
        super().__init__("\n".join(shown_lines(self.messages)))


def shown_lines(messages: tuple[str, ...] | list[str]) -> list[str]:
    """The lines a person is shown for `messages`: at most `MAX_SHOWN`, then a count."""
    lines = list(messages[:MAX_SHOWN])
    if len(messages) > MAX_SHOWN:
        lines.append(f"… and {len(messages) - MAX_SHOWN} more")
    return lines


def param(
    default: Any,
    doc: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    nonempty: bool = False,
) -> Any:
    """A dataclass field with a default, a one-sentence doc and optional bounds.

    Bounds apply to a number, or to every element of a list of numbers.
    """
    meta = {"doc": doc, "gt": gt, "ge": ge, "lt": lt, "le": le, "nonempty": nonempty}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _bounds_text(meta: dict) -> str:
    parts = []
    for key, sym in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
        if meta.get(key) is not None:
            parts.append(f"{sym} {meta[key]:g}")
    return " and ".join(parts)


def _check_bounds(x: float, meta: dict) -> bool:
    if isinstance(x, float) and math.isnan(x):
        return False
    return not (
        (meta.get("gt") is not None and not x > meta["gt"])
        or (meta.get("ge") is not None and not x >= meta["ge"])
        or (meta.get("lt") is not None and not x < meta["lt"])
        or (meta.get("le") is not None and not x <= meta["le"])
    )


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if tp is type(None):
        return "absent"
    return {
        float: "a number",
        int: "an integer",
        bool: "true or false",
        str: "a string",
        dict: "a table",
    }.get(tp, str(tp))


def _coerce(value: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, converted value) for `value` against the annotation `tp`."""
    origin = get_origin(tp)
    if origin is Literal:
        return (value in get_args(tp) and isinstance(value, str | bool | int)), value
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, get_args(tp))
    if origin is list:
        return _coerce_list(value, get_args(tp)[0])
    return _coerce_plain(value, tp)


def _coerce_union(value: Any, args: tuple) -> tuple[bool, Any]:
    """`value` against the first member of a union it fits (None only for an Optional)."""
    for arg in args:
        if arg is type(None):
            if value is None:
                return True, None
            continue
        ok, v = _coerce(value, arg)
        if ok:
            return True, v
    return False, value


def _coerce_list(value: Any, item_type: Any) -> tuple[bool, Any]:
    """`value` as a list whose every item fits `item_type`."""
    if not isinstance(value, list | tuple):
        return False, value
    out = []
    for item in value:
        ok, v = _coerce(item, item_type)
        if not ok:
            return False, value
        out.append(v)
    return True, out


def _coerce_plain(value: Any, tp: Any) -> tuple[bool, Any]:
    """`value` against a plain type: a bool is never a number, an int is a float."""
    if tp is bool:
        return isinstance(value, bool), value
    if tp is int:
        return (isinstance(value, int) and not isinstance(value, bool)), value
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return True, float(value)
        return False, value
    if tp is str:
        return isinstance(value, str), value
    return isinstance(value, tp), value


def field_names(cls: type) -> list[str]:
    """The parameter names a params dataclass accepts."""
    return [f.name for f in dataclasses.fields(cls)]


def unknown_key_message(where: str, key: str, allowed: list[str]) -> str:
    """One line for an unknown key, with a 'did you mean' when one is close."""
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{where}: unknown key {key!r}{hint}; allowed: {', '.join(allowed) or 'none'}"


@functools.cache  # evaluating string annotations costs more than the rest of `build`
def _hints(cls: type) -> dict[str, Any]:
    """The type hints of a params class (read-only: shared by every `build` of it)."""
    return typing.get_type_hints(cls)


def build(cls: type[T], table: dict[str, Any], where: str) -> T:
    """Validate `table` against the params dataclass `cls` and return an instance.

    `where` names the table in messages, e.g. ``scenario 'PM-I RR'``. Every bad field is
    reported: one `ConfigError`, or a `ConfigErrors` when several fields are bad. A negative
    zero is the number 0 (its checks, its messages and the value built are those of 0.0).
    """
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    problems = [unknown_key_message(where, key, list(fields)) for key in table if key not in fields]
    values = {}
    for name, value in table.items():
        if name not in fields:
            continue
        value = without_negative_zero(value)
        ok, v, problem = _field_value(fields[name], hints[name], value)
        if ok:
            values[name] = v
        else:
            problems.append(f"{where}: {name} = {value!r}: {problem}")
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigErrors(problems)
    try:
        return cls(**values)
    except (TypeError, ValueError, ArithmeticError) as exc:  # cross-field checks
        raise ConfigError(f"{where}: {' '.join(str(exc).split())}") from None


def _field_value(f: dataclasses.Field, tp: Any, value: Any) -> tuple[bool, Any, str]:
    """(ok, the value converted to the field's type, what is allowed when not ok)."""
    ok, v = _coerce(value, tp)
    if not ok:
        return False, value, f"must be {_type_name(tp)}"
    meta = f.metadata
    if not _finite_ok(v, f):
        return False, value, f"must be a finite number{' (or inf)' if _allows_inf(f) else ''}"
    if meta.get("nonempty") and isinstance(v, list) and not v:
        return False, value, "must not be empty"
    bounds = _bounds_text(meta)
    numbers = v if isinstance(v, list) else [v]
    if bounds and not all(_check_bounds(x, meta) for x in numbers if isinstance(x, int | float)):
        return False, value, f"must be {bounds}"
    return True, v, ""


def without_negative_zero(value: Any) -> Any:
    """`value` with every -0.0 in it (also inside lists and tables) as 0.0: a study file's
    -0.0 is the number 0, and a sign bit must not reach a run (1/-0.0 is -inf, and
    uniform(0, -0.0) draws from an empty interval)."""
    if isinstance(value, float):
        return value + 0.0  # -0.0 + 0.0 is 0.0; every other float is unchanged
    if isinstance(value, list):
        return [without_negative_zero(v) for v in value]
    if isinstance(value, dict):
        return {k: without_negative_zero(v) for k, v in value.items()}
    return value


def _allows_inf(f: dataclasses.Field) -> bool:
    """A parameter may be infinite when its default is, or its doc says what inf means."""
    default = f.default
    if isinstance(default, float) and math.isinf(default):
        return True
    return re.search(r"\binf\b", f.metadata.get("doc", "")) is not None


def _finite_ok(value: Any, f: dataclasses.Field) -> bool:
    """False for NaN anywhere in `value`, and for ±inf unless the parameter allows it."""
    if isinstance(value, float):
        return not math.isnan(value) and (math.isfinite(value) or _allows_inf(f))
    if isinstance(value, list | tuple):
        return all(_finite_ok(v, f) for v in value)
    return True


def describe(cls: type) -> list[tuple[str, str, Any, str]]:
    """(name, type, default, doc) for every parameter of `cls`, for `desim list` and docs."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((f.name, _type_name(hints[f.name]), default, f.metadata.get("doc", "")))
    return rows
