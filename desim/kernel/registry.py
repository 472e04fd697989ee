"""Name → class registries: how study files refer to protocols, data, links, topologies, curves,
and metrics.

Nothing in a study file is imported or evaluated from a string: a name is looked up here, and
an unknown name is an error that lists what is allowed.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from desim.kernel.params import ConfigError

T = TypeVar("T")


class UnknownName(KeyError):
    """A name that is not in a registry; its message lists the allowed names."""

    def __str__(self) -> str:  # KeyError quotes its argument; people want a sentence
        return str(self.args[0])


class RegistryWarning(UserWarning):
    """A name registered again: the new object replaces the old one."""


def _origin(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


class Registry(Generic[T]):
    """A mapping from the names used in study files to registered objects of one kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        #: Old names → current ones, so a study file using an old name is told the new one
        #: instead of the closest-looking (possibly different) entry.
        self.renamed: dict[str, str] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its argument under `name`.

        Registering a name again replaces the old object with a `RegistryWarning` (a notebook
        cell that defines a protocol, run twice, must not fail; two plug-ins that claim one name
        are told which wins).
        """

        def add(obj: T) -> T:
            old = self._items.get(name)
            if old is not None and old is not obj:
                warnings.warn(
                    f"{self.kind} {name!r} registered again: {_origin(obj)} replaces "
                    f"{_origin(old)}",
                    RegistryWarning,
                    stacklevel=2,
                )
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        """The object registered as `name`; `UnknownName` says what is allowed otherwise."""
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(self.unknown_message(name)) from None

    def lookup(self, name: Any, where: str) -> T:
        """Like `get`, for names read from a study file: a `ConfigError` naming `where`."""
        if not isinstance(name, str):
            raise ConfigError(f"{where} = {name!r}: must be a string naming a {self.kind}")
        try:
            return self.get(name)
        except UnknownName as exc:
            raise ConfigError(f"{where}: {exc}") from None

    def unknown_message(self, name: object) -> str:
        """One line explaining that `name` is not a known name of this kind."""
        close = difflib.get_close_matches(str(name), list(self._items), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if isinstance(name, str) and name in self.renamed:
            hint = f" (renamed {self.renamed[name]!r})"
        allowed = ", ".join(sorted(self._items)) or "none"
        return f"unknown {self.kind} {name!r}{hint}; allowed: {allowed}"

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def items(self) -> list[tuple[str, T]]:
        """(name, object) pairs in name order."""
        return sorted(self._items.items())


#: Protocol classes (subclasses of `desim.kernel.protocol.Protocol`).
PROTOCOLS: Registry = Registry("protocol")
#: Data models: callables building a `desim.kernel.protocol.DataSource` from validated parameters.
DATA: Registry = Registry("data model")
#: Link models (classes implementing `desim.kernel.links.LinkModel`).
LINKS: Registry = Registry("link model")
#: Closed-form curves: classes with a `curve(t) -> (mean, stderr)` method.
CURVES: Registry = Registry("curve")
#: Communication-graph models (classes with `check(n)` and `make(n, rng) -> Graph`).
TOPOLOGIES: Registry = Registry("topology")
#: Extra metrics: functions `(protocol, data_source) -> dict[str, float]` the recorder calls
#: (declare what they record with `records`, so that plots of them are checked before a run).
METRICS: Registry = Registry("metric")
#: Non-negative distributions (subclasses of `desim.network_models.distributions.Distribution`).
DISTRIBUTIONS: Registry = Registry("distribution")
#: Availability models of links and nodes (subclasses of
#: `desim.network_models.availability.Availability`).
AVAILABILITY: Registry = Registry("availability model")


def records(*names: str) -> Callable[[T], T]:
    """Decorator declaring the names (glob patterns such as ``eps_*``) a metric function
    records, as its ``outputs``: `desim validate` refuses a plot of a name no metric records."""

    def mark(fn: T) -> T:
        fn.outputs = names  # type: ignore[attr-defined]
        return fn

    return mark


def applies_to(*what: type | str) -> Callable[[T], T]:
    """Decorator declaring the protocols a metric function records anything for: subclasses of
    the classes given, or protocols implementing the `Protocol` hooks named (e.g.
    ``"privacy_spend"``); `desim validate` refuses a metric no scenario of a study records."""

    def mark(fn: T) -> T:
        fn.applies_to = what  # type: ignore[attr-defined]
        return fn

    return mark


def reads_tables(*tables: str) -> Callable[[T], T]:
    """Decorator declaring the study tables beyond [data] a metric function reads, as
    `desim.kernel.protocol.Protocol.reads` names them (undeclared: ``network`` and ``topology``):
    runs whose protocol and metrics read neither are simulated once for a whole network sweep."""

    def mark(fn: T) -> T:
        fn.reads = frozenset(tables)  # type: ignore[attr-defined]
        return fn

    return mark


def metric_applies(metric: object, protocol: type) -> bool:
    """Whether `metric` (a `METRICS` function) records anything for protocol class `protocol`,
    per its `applies_to` declaration (undeclared: every protocol)."""
    from desim.kernel.protocol import Protocol  # here: the registries import no protocol

    what = getattr(metric, "applies_to", None)
    if not what:
        return True
    for item in what:
        if isinstance(item, str):
            if getattr(protocol, item, None) is not getattr(Protocol, item, None):
                return True
        elif isinstance(protocol, type) and issubclass(protocol, item):
            return True
    return False
