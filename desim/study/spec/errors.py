"""Every error of a study file at once: a collector that independent checks report to, and the
error that carries what it collected.

A study file is checked in stages (`desim.study.spec`); within a stage, the checks that do not
depend on each other (each table, each scenario, each curve, each plot, each grid path, each
file) each report their own error, so that one `desim validate` names everything wrong with a
file, not just the first thing. A check that needs an earlier one to have passed is skipped
when it did not: its error would only repeat the first one. (`ConfigErrors` itself is
`desim.kernel.params`'s, where `build` raises it for a table with several bad fields.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from desim.kernel.params import MAX_SHOWN, ConfigError, ConfigErrors, shown_lines

__all__ = [
    "MAX_SHOWN",
    "ConfigErrors",
    "Errors",
    "messages_of",
    "relative_to_folder",
    "shown_lines",
    "shown_path",
    "with_file",
]

T = TypeVar("T")


def messages_of(exc: ConfigError) -> tuple[str, ...]:
    """The one-line messages `exc` carries (several for a `ConfigErrors`)."""
    found = exc.messages if isinstance(exc, ConfigErrors) else (str(exc),)
    return tuple(" ".join(m.split()) for m in found)


class Errors:
    """What independent checks found: each check runs under `check` (or through `attempt`)
    and its `ConfigError` is kept; `raise_any` then raises them all as one `ConfigErrors`."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.messages)

    def add(self, message: str) -> None:
        """Keep `message` (once: two checks reaching the same fault say it once)."""
        if message not in self.messages:
            self.messages.append(message)

    @contextmanager
    def check(self) -> Iterator[None]:
        """Run the block as one check: a `ConfigError` it raises is kept, not raised."""
        try:
            yield
        except ConfigError as exc:
            for message in messages_of(exc):
                self.add(message)

    def attempt(self, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)`, or None when it raised a `ConfigError` (which is kept)."""
        with self.check():
            return fn(*args)
        return None

    def passes(self, fn: Callable[..., object], *args: Any) -> bool:
        """Whether `fn(*args)` passes; a `ConfigError` it raises is kept."""
        try:
            fn(*args)
        except ConfigError as exc:
            for message in messages_of(exc):
                self.add(message)
            return False
        return True

    def raise_any(self) -> None:
        """Raise every kept error as one `ConfigErrors` (nothing when none was kept)."""
        if self.messages:
            raise ConfigErrors(self.messages)


def shown_path(path: Path) -> str:
    """`path` relative to the current directory when it is below it, else as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except (ValueError, OSError):
        return str(path)


def relative_to_folder(message: str, folder: Path) -> str:
    """`message` with paths inside the study `folder` written relative to it (a study
    folder may move; its messages read the same wherever it is)."""
    return message.replace(str(folder.resolve()) + os.sep, "")


def with_file(exc: ConfigError, file: str, folder: Path) -> ConfigErrors:
    """The messages of `exc`, each prefixed with the study `file` as shown and its paths made
    relative to the study `folder`."""
    return ConfigErrors(f"{file}: {relative_to_folder(m, folder)}" for m in messages_of(exc))
