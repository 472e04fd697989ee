"""The package layout: one import name, dependencies pointing one way, a wheel that installs.

`models/` and `topologies/` install as `desim.models` and `desim.topologies`; a user's own
``models.py`` next to their notebook must not matter, whether desim is installed editable (as
here) or from a wheel.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Repository folder → the import path it installs as.
FOLDERS = {"desim": "desim", "models": "desim.models", "topologies": "desim.topologies"}
#: Sub-packages of models/ that the families share; every other one is a protocol family.
SHARED = ("privacy",)
#: The protocol families: discovered from the folders, so adding one needs no edit here.
FAMILIES = tuple(
    sorted(
        p.name
        for p in (ROOT / "models").iterdir()
        if (p / "__init__.py").is_file() and p.name not in SHARED
    )
)


def _modules() -> dict[str, Path]:
    """Every module of the installed packages: dotted name → source file."""
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _imports(name: str, path: Path) -> set[str]:
    """The absolute names `path` imports (relative imports resolved against `name`)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def _packages(folder: Path) -> list[Path]:
    """Every folder under `folder` holding Python modules (not caches or build output)."""
    return sorted(
        d
        for d in [folder, *folder.rglob("*")]
        if d.is_dir()
        and any(d.glob("*.py"))
        and not any(
            part.startswith((".", "__")) or part.endswith(".egg-info")
            for part in d.relative_to(folder).parts
        )
    )


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


MODULES = _modules()


def test_the_layout_has_the_layers_and_families_it_documents():
    for package in (
        "desim.kernel",
        "desim.network_models",
        "desim.study",
        "desim.models",
        "desim.models.privacy",
        "desim.topologies",
        *(f"desim.models.{f}" for f in FAMILIES),
    ):
        assert package in MODULES, f"{package} is missing"


def test_the_families_are_discovered_from_the_models_folder():
    assert {"colme", "ccolme", "pricer", "eb"} <= set(FAMILIES)


def test_every_module_folder_is_a_package_setup_installs():
    # setup.py installs every folder with an __init__.py: a folder of modules without one
    # would be left out of a non-editable install while an editable one still imports it
    for folder in FOLDERS:
        for d in _packages(ROOT / folder):
            assert (d / "__init__.py").is_file(), (
                f"{d.relative_to(ROOT)} holds modules but no __init__.py: add one, or a "
                "non-editable install (pip install .) leaves it out"
            )


def test_models_imports_every_family_so_that_it_registers():
    imported = _imports("desim.models", ROOT / "models" / "__init__.py")
    for family in FAMILIES:
        assert f"desim.models.{family}" in imported, (
            f"models/__init__.py does not import the family {family!r}: its protocols and "
            f"curves would never register (add it to the import line there, or to SHARED in "
            f"{Path(__file__).name} if it is code the families share)"
        )


@pytest.mark.parametrize("name", sorted(MODULES))
def test_dependencies_point_one_way(name):
    imports = _imports(name, MODULES[name])
    assert not any(i.split(".")[0] in ("models", "topologies") for i in imports), (
        f"{name} imports a top-level 'models' or 'topologies': use desim.models / desim.topologies"
    )
    if _under(name, "desim.kernel"):
        # the kernel knows nothing of protocols, graphs, network models or studies
        banned = ("desim.models", "desim.topologies", "desim.network_models", "desim.study")
    elif _under(name, "desim.network_models"):
        banned = ("desim.models", "desim.topologies", "desim.study")
    elif _under(name, "desim.models") or _under(name, "desim.topologies"):
        banned = ("desim.study",)
        family = next((f for f in FAMILIES if _under(name, f"desim.models.{f}")), None)
        if family is not None:  # one family can be read without opening another's folder
            banned += tuple(f"desim.models.{f}" for f in FAMILIES if f != family)
        elif name != "desim.models" and _under(name, "desim.models"):
            banned += tuple(f"desim.models.{f}" for f in FAMILIES)  # shared code: no family
    else:
        banned = ()
    wrong = sorted(i for i in imports if any(_under(i, b) for b in banned))
    assert not wrong, f"{name} imports {wrong}"


def test_the_dependency_check_catches_a_kernel_import_of_a_protocol(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from desim.models.colme.protocol import PrivateColME\nimport desim.study.cli\n")
    assert {"desim.models.colme.protocol", "desim.study.cli"} <= _imports("desim.kernel.bad", bad)


USER_FOLDER_FILES = {
    # what an ML project's notebook folder often holds: its own models and topologies modules
    "models.py": "raise ImportError('the user models module must not be imported by desim')\n",
    "topologies.py": "raise ImportError('the user topologies module must not be imported')\n",
}

SMOKE = textwrap.dedent("""
    import importlib.util, sys
    import desim
    from desim.models.colme.protocol import PrivateColME
    out = desim.run(desim.Scenario("private-colme", {}, data={"model": "classes", "agents": 6},
                                   t_max=40, seed=1, checkpoints=3))
    assert len(out.metrics) > 0
    spec = importlib.util.find_spec("models")
    print(desim.__file__)
    print(spec.origin if spec else None)
""")


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name, text in USER_FOLDER_FILES.items():
        (folder / name).write_text(text)
    return folder


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MPLBACKEND="Agg", **extra)
    return env


def test_a_users_own_models_module_does_not_matter(tmp_path):
    folder = _user_folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SMOKE],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    desim_file, models_origin = done.stdout.split()[-2:]
    assert Path(models_origin) == folder / "models.py"  # the user's module is theirs alone
    listed = subprocess.run(
        [sys.executable, "-m", "desim.study.cli", "list"],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr
    assert "private-colme" in listed.stdout and "[desim.models.colme.protocol]" in listed.stdout


@pytest.mark.slow
def test_a_built_wheel_installs_desim_only(tmp_path):
    source = tmp_path / "source"  # a copy, so that building leaves nothing in the repository
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in FOLDERS:
        shutil.copytree(
            ROOT / folder,
            source / folder,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
        )
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("desim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"desim"}
    for module in (
        "desim/models/colme/protocol.py",
        "desim/models/pricer/optimiser.py",
        "desim/topologies/graph.py",
        "desim/kernel/engine.py",
        "desim/network_models/availability.py",
        "desim/study/cli.py",
        "desim/study/spec/parse.py",
        "desim/topologies/data/county_adjacency.txt.gz",  # package data: the bundled graph
        *(f"desim/models/{family}/__init__.py" for family in FAMILIES),
    ):
        assert module in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "[desim.plugins]" in text and "models = desim.models" in text

    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    folder = _user_folder(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", SMOKE],
        cwd=folder,
        capture_output=True,
        text=True,
        env=_env(PYTHONPATH=str(target)),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    desim_file, models_origin = done.stdout.split()[-2:]
    assert Path(desim_file).is_relative_to(target)  # the wheel's copy, not the repository's
    assert Path(models_origin) == folder / "models.py"
