"""What CI runs: the default test set (`pytest` with no arguments) leaves out the tests marked
slow; `.ci/run` runs the README's test command, then the slow tests and ruff while `.ci/lowest`
runs beside them: the default set against the lowest versions the dependencies allow
(`.ci/lowest.txt` pins every floor of pyproject.toml); its status ends the run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
LOWEST = ROOT / ".ci" / "lowest.txt"
REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?(?P<spec>.*)$")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _normal(name: str) -> str:
    """A distribution's name as pip compares it: lower case, runs of -_. as one hyphen."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements() -> list[str]:
    """Every requirement of the project and of its optional extras, as written in pyproject."""
    project = _pyproject()["project"]
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    return [*project["dependencies"], *extras]


def floors() -> dict[str, Version]:
    """The floor (the `>=` bound) of every requirement with one, by normalised name."""
    out = {}
    for requirement in requirements():
        m = REQUIREMENT.match(requirement)
        for clause in m["spec"].split(","):
            if clause.strip().startswith(">="):
                out[_normal(m["name"])] = Version(clause.strip()[2:].strip())
    return out


def pins() -> dict[str, Version]:
    """The versions `.ci/lowest.txt` pins (`name==version` a line, `#` starts a comment)."""
    out = {}
    for number, line in enumerate(LOWEST.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        name, sep, version = text.partition("==")
        assert sep, f".ci/lowest.txt:{number}: {text!r} is not name==version"
        out[_normal(name.strip())] = Version(version.strip())
    return out


def test_every_requirement_has_a_floor():
    bare = [r for r in requirements() if ">=" not in r]
    assert not bare, f"pyproject.toml: no floor (>=) to test the lowest versions against: {bare}"


def test_lowest_pins_every_floor_of_pyproject():
    pinned = pins()
    wrong = [
        f"{name}: pyproject.toml's floor {floor}, .ci/lowest.txt pins {pinned.get(name, 'nothing')}"
        for name, floor in sorted(floors().items())
        if pinned.get(name) != floor
    ]
    assert not wrong, "\n".join(wrong)


def test_pytest_leaves_out_slow_tests_unless_asked():
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    assert any(m.startswith("slow:") for m in options["markers"])
    args = shlex.split(options["addopts"])
    assert "--strict-markers" in args  # a misspelt mark would run in the default set unnoticed
    assert args[args.index("-m") + 1] == "not slow"


def _collect(folder: Path, capsys, *args: str) -> str:
    """The tests pytest would run in `folder` under this repository's pytest configuration (in
    this process: a fresh interpreter would spend seconds importing pytest's plug-ins)."""
    capsys.readouterr()
    code = pytest.main(
        ["--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(folder), *args, str(folder)]
    )
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    return out.out


def test_the_default_run_deselects_a_slow_test_and_m_slow_selects_only_those(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))  # collecting puts tmp_path on it
    (tmp_path / "test_marks.py").write_text(
        "import pytest\n@pytest.mark.slow\ndef test_marked():\n    pass\n"
        "def test_unmarked():\n    pass\n"
    )
    default = _collect(tmp_path, capsys)
    assert "test_unmarked" in default and "test_marked" not in default, default
    assert "1 deselected" in default, default
    only = _collect(tmp_path, capsys, "-m", "slow")
    assert "test_marked" in only and "test_unmarked" not in only, only
    sys.modules.pop("test_marks", None)  # the collected module, imported in this process


def _commands() -> list[str]:
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]


def test_ci_runs_the_default_set_then_the_slow_tests_then_ruff_then_the_lowest_versions():
    commands = _commands()

    def first(pattern: str) -> int:
        found = [i for i, c in enumerate(commands) if re.search(pattern, c)]
        assert found, f".ci/run: no command matches {pattern!r}"
        return found[0]

    readme = first(r"^python3 -m venv \.venv && .*\.venv/bin/pytest$")
    slow = first(r"^\.venv/bin/pytest .*-m slow")
    ruff = first(r"^\.venv/bin/ruff check")
    lowest = first(r"^\.ci/lowest\b.*&$")  # started in the background, beside the slow tests
    waited = first(r"^wait \"\$lowest\"")
    ends = first(r"^exit \"\$status\"$")
    assert readme < lowest < slow < ruff < waited < ends, commands


def test_the_lowest_versions_script_installs_the_floors_and_runs_the_default_set():
    script = ROOT / ".ci" / "lowest"
    assert os.access(script, os.X_OK)  # .ci/run runs it as a command
    text = script.read_text()
    assert re.search(r"^set -euo pipefail$", text, re.M)  # a failed install fails CI
    assert re.search(r"^\.venv-lowest/bin/pip install .*-c \.ci/lowest\.txt", text, re.M)
    assert re.search(r"^\.venv-lowest/bin/pytest -n 0$", text, re.M)  # one process per stage


def test_a_test_not_marked_slow_over_the_budget_is_named_at_the_end(tmp_path):
    (tmp_path / "conftest.py").write_bytes((ROOT / "tests" / "conftest.py").read_bytes())
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    (tmp_path / "test_timed.py").write_text(
        "import time, pytest\n"
        "def test_unmarked():\n    time.sleep(0.3)\n"
        "@pytest.mark.slow\ndef test_marked():\n    time.sleep(0.3)\n"
        "def test_quick():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "slow_seconds=0.2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = done.stdout.split("tests not marked slow that took over 0.2 s", 1)[1]
    assert "test_timed.py::test_unmarked" in summary, done.stdout
    assert "test_marked" not in summary and "test_quick" not in summary, done.stdout
