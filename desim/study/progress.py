"""Progress of long commands on stderr: a live bar on a terminal, a few plain lines elsewhere.

A bar redraws itself many times a second; written into a log file (stderr redirected, a batch
job, CI) every frame becomes a line. When the stream is not a terminal, `progress_bar` returns
a `LogProgress` instead, which prints one line when it starts, at most one per `LOG_STEP` of the
total and `LOG_INTERVAL` seconds, and one when it ends.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm

#: Least time between two lines of a `LogProgress` (seconds).
LOG_INTERVAL = 30.0
#: Least share of the total between two lines of a `LogProgress`.
LOG_STEP = 0.1


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def progress_bar(
    total: int, desc: str, unit: str, disable: bool = False, file: TextIO | None = None
) -> Any:
    """A progress display of `total` steps with `update(n)` and `close()`: a tqdm bar when
    `file` (default stderr) is a terminal, a `LogProgress` otherwise, nothing when `disable`."""
    stream = sys.stderr if file is None else file
    if disable:
        return tqdm(total=total, disable=True)
    if _is_terminal(stream):
        return tqdm(total=total, desc=desc, unit=unit, file=stream)
    return LogProgress(total, desc, unit, stream)


class LogProgress:
    """Progress for a log: a line at the start, at most one per `step` of the total and
    `interval` seconds while it runs, and a line at the end (`close`)."""

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        file: TextIO,
        interval: float = LOG_INTERVAL,
        step: float = LOG_STEP,
        clock: Any = time.monotonic,
    ) -> None:
        self.total, self.desc, self.unit, self.file = total, desc, unit, file
        self.interval, self.step, self.clock = interval, step, clock
        self.n = 0
        self.start = clock()
        self._last_time = self.start
        self._last_n = 0
        self._closed = False
        self._print()

    def update(self, n: int = 1) -> None:
        """Count `n` more steps done; print a line if enough time and progress passed."""
        self.n += n
        now = self.clock()
        moved = self.n - self._last_n >= max(self.step * self.total, 1)
        if moved and now - self._last_time >= self.interval:
            self._last_time, self._last_n = now, self.n
            self._print()

    def close(self) -> None:
        """Print the final line (once; nothing more when nothing moved since the last)."""
        if self._closed:
            return
        self._closed = True
        if self.n != self._last_n:
            self._print()

    def _print(self) -> None:
        elapsed = self.clock() - self.start
        share = f" ({100 * self.n / self.total:.0f} %)" if self.total else ""
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit}s{share}, {elapsed:.0f} s",
            file=self.file,
            flush=True,
        )
