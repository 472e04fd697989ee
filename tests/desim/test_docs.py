"""The documents run: every Python and shell block of README.md and docs/*.md, and every link.

Blocks run as a reader would run them, from the repository's root, but in a temporary folder
holding copies of the studies they name, so committed results are never touched:

- ``python`` blocks of one page run in order in one fresh interpreter and share its namespace
  (a page reads like one session: a later block may use what an earlier one imported).
- ``bash``, ``sh``, ``shell`` and unlabelled blocks run with ``bash -e``. The set-up prefix of the
  README's first command (``python3 -m venv .venv && .venv/bin/pip install … &&``) and the
  ``.venv/bin/`` of its commands map onto the environment running this test.
- ``toml`` blocks must parse; ``text`` blocks (console output) and other languages are shown,
  not run.
- A shell block that runs a study (``desim run``) runs whole in the slow set (``pytest -m
  slow``); the default set runs it up to that command, which becomes ``desim validate``.
- A block that cannot run here (a real cluster address, the test suite itself) carries
  ``<!-- not run: reason -->`` on the line before its fence; the test lists every such block.

A failing block fails its test with the page and line of its fence.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*PAGES, ROOT / "CHANGES.md", *sorted((ROOT / "studies").rglob("README.md"))]
SHELL = {"", "bash", "sh", "shell"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.*?)\s*-->\s*$")
SETUP = re.compile(r"python3 -m venv \.venv && \.venv/bin/pip install -q -e \S+ && ")
STUDY = re.compile(r"studies/[\w.-]+")
LINK = re.compile(r"(?<![!\\])\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
TIMEOUT = 300


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: where it starts, its language, its code."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given by a `<!-- not run: … -->` mark, or None

    @property
    def where(self) -> str:
        """The page and line of the fence, as a failure names it."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def _dedent(line: str, indent: int) -> str:
    """A line of a block indented under a list item, without the fence's indentation."""
    if not indent or line[:indent].isspace():
        return line[indent:]
    return line.lstrip()


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of a Markdown page, with the not-run mark before it, if any."""
    found, lines, i = [], page.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start = len(m["indent"]), m["fence"], i
        body, i = [], i + 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(_dedent(lines[i], indent))
            i += 1
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = NOT_RUN.match(prev)
        found.append(
            Block(
                page, start + 1, m["lang"].lower(), "\n".join(body) + "\n", mark and mark["reason"]
            )
        )
        i += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def _workspace(tmp_path: Path, code: str) -> Path:
    """A folder standing in for the repository's root: copies of the studies the code names."""
    for name in sorted(set(STUDY.findall(code))):
        source = ROOT / name
        if source.is_dir():
            ignore = shutil.ignore_patterns("quick", "results-*", "figures-*", "*.lock")
            shutil.copytree(source, tmp_path / name, ignore=ignore)
    return tmp_path


def _env() -> dict[str, str]:
    """This interpreter's environment first on PATH (its `desim`, `python`), figures headless."""
    env = dict(os.environ, MPLBACKEND="Agg")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.pop("PYTHONPATH", None)
    return env


def _shell(code: str) -> str:
    """A shell block as run here: the virtualenv set-up dropped, `.venv/bin/` commands on PATH."""
    return SETUP.sub("", code).replace(".venv/bin/", "")


def _run(args: list[str], cwd: Path, what: str) -> None:
    done = subprocess.run(
        args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert done.returncode == 0, (
        f"the block at {what} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )


SHELL_BLOCKS = [b for b in ALL if b.lang in SHELL and b.not_run is None]
PYTHON_PAGES = sorted({b.page for b in ALL if b.lang == "python" and b.not_run is None})
# A block that runs a study simulates (the README's quick Fig. 2 is the longest test there is):
# it runs whole in the slow set, and the default set runs it up to that command, validating.
RUN = re.compile(r"^\s*desim run (?P<study>\S+)(?P<options>.*)$", re.MULTILINE)


def _slow(block: Block):
    """A shell block as a test parameter, marked slow when it runs a study."""
    marks = [pytest.mark.slow] if RUN.search(_shell(block.code)) else []
    return pytest.param(block, id=block.where, marks=marks)


def _validated(code: str) -> str:
    """A shell block up to its first `desim run`, which becomes `desim validate` of that study
    (`--quick` kept, the options only `run` takes dropped), unless the block validated it."""
    m = RUN.search(code)
    quick = " --quick" if "--quick" in m["options"].split() else ""
    validate = f"desim validate {m['study']}{quick}\n"
    return code[: m.start()] + ("" if validate in code[: m.start()] else validate)


@pytest.mark.parametrize("block", [_slow(b) for b in SHELL_BLOCKS])
def test_shell_block_runs(block, tmp_path):
    code = _shell(block.code)
    _run(["bash", "-e", "-c", code], _workspace(tmp_path, code), block.where)


@pytest.mark.parametrize(
    "block", [b for b in SHELL_BLOCKS if RUN.search(_shell(b.code))], ids=lambda b: b.where
)
def test_a_block_that_runs_a_study_validates_it(block, tmp_path):
    code = _validated(_shell(block.code))
    _run(["bash", "-e", "-c", code], _workspace(tmp_path, code), block.where)


_DRIVER = """
import sys, traceback
for where, code in BLOCKS:
    try:
        exec(compile(code, where.rsplit(":", 1)[0], "exec"), NS)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"the block at {where} failed")
"""


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_of_a_page_run_in_order(page, tmp_path):
    mine = [b for b in ALL if b.page == page and b.lang == "python" and b.not_run is None]
    # Padded with blank lines so that a traceback's line numbers are the page's.
    todo = [(b.where, "\n" * b.line + b.code) for b in mine]
    script = f"BLOCKS = {todo!r}\nNS = {{'__name__': '__main__'}}\n{_DRIVER}"
    cwd = _workspace(tmp_path, "".join(c for _, c in todo))
    (tmp_path / "_docs_driver.py").write_text(script, encoding="utf-8")
    _run([sys.executable, "_docs_driver.py"], cwd, str(page.relative_to(ROOT)))


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "toml"], ids=lambda b: b.where)
def test_toml_block_parses(block):
    try:
        tomllib.loads(block.code)
    except tomllib.TOMLDecodeError as err:
        pytest.fail(f"the block at {block.where} is not TOML: {err}")


def test_blocks_not_run_are_marked_with_a_reason_and_listed():
    skipped = [b for b in ALL if b.not_run is not None]
    for b in skipped:
        assert b.not_run, f"the not-run mark before {b.where} gives no reason"
        assert b.lang in SHELL | {"python"}, f"{b.where}: only runnable blocks need a mark"
    run = [b for b in ALL if (b.lang in SHELL or b.lang == "python") and b.not_run is None]
    assert run, "no block runs"
    listing = "; ".join(f"{b.where} ({b.not_run})" for b in skipped)
    warnings.warn(f"{len(run)} blocks run, {len(skipped)} not run: {listing}", stacklevel=1)


def test_the_readme_test_command_is_what_ci_runs():
    readme = [b for b in blocks(ROOT / "README.md") if b.lang in SHELL]
    command = readme[1].code.strip()
    assert command.endswith(".venv/bin/pytest"), command
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(page: Path):
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
        if not fenced:
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                yield number, target


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for number, target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
