"""Hooks for every test folder: the default set's time budget is watched, not assumed.

The default run (`pytest`) leaves out the tests marked slow so that it stays within a few
minutes; a test that grows slow without its mark would quietly eat that budget, so the end of
every run names each test not marked slow that took longer than `slow_seconds` (5 by default,
`-o slow_seconds=N` to change it). It is a note, not a failure: timings depend on the machine.

Property tests are derandomised by default (the "reproducible" Hypothesis profile);
`pytest --hypothesis-profile explore` searches with fresh random examples.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (a CI run is reproducible, and a failure in
# it is a failure on every machine); `--hypothesis-profile explore` draws fresh ones on every
# run, to look for new counter-examples (each then becomes an @example of its test).
settings.register_profile("reproducible", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("reproducible")

# pytest put this folder on sys.path to import this file; left there, its sub-folder desim/
# (the package's tests, no __init__.py) would shadow the installed desim as a namespace package.
if str(Path(__file__).parent) in sys.path:
    sys.path.remove(str(Path(__file__).parent))


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare `slow_seconds`, the budget of one test not marked slow."""
    parser.addini(
        "slow_seconds",
        "a test not marked slow that takes longer than this (setup, call and teardown) is named "
        "at the end of the run",
        default="5",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the budget's tally for this run."""
    config.pluginmanager.register(Budget(float(config.getini("slow_seconds"))), "desim-budget")


class Budget:
    """Seconds spent by each test not marked slow, and the ones over the budget at the end."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spent: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add the time of one phase (setup, call or teardown) of a test not marked slow."""
        if "slow" not in report.keywords:
            self.spent[report.nodeid] = self.spent.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Name every test not marked slow that took longer than the budget, slowest first."""
        over = sorted((s, n) for n, s in self.spent.items() if s > self.seconds)
        if not over:
            return
        terminalreporter.section(f"tests not marked slow that took over {self.seconds:g} s")
        for seconds, nodeid in reversed(over):
            terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
        terminalreporter.write_line(
            "mark each @pytest.mark.slow (run by `pytest -m slow`) or make it faster"
        )


@pytest.fixture
def no_figures(monkeypatch):
    """`desim run` draws no figure in this test (it never looks at one, and drawing takes most of
    a small study's run)."""
    figures = types.ModuleType("desim.study.plots")
    figures.draw_figures = lambda study: []
    monkeypatch.setitem(sys.modules, "desim.study.plots", figures)
