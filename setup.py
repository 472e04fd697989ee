"""The package list, discovered: every sub-package (a folder with an ``__init__.py``) of desim/,
models/ and topologies/ installs, the last two as `desim.models` and `desim.topologies` (the
mapping is ``[tool.setuptools.package-dir]`` in pyproject.toml). A new protocol family is a new
folder under models/; nothing else needs listing."""

from setuptools import find_packages, setup

#: Import name → repository folder (the same mapping as pyproject.toml's package-dir).
ROOTS = {"desim": "desim", "desim.models": "models", "desim.topologies": "topologies"}


def packages() -> list[str]:
    """Every package under `ROOTS`, by import name."""
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return sorted(set(found))


setup(packages=packages())
