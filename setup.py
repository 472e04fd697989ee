"""The package list, discovered: every sub-package (a folder with an ``__init__.py``) of desim/,
models/ and topologies/ installs, the last two as `desim.models` and `desim.topologies` (the
mapping is ``[tool.setuptools.package-dir]`` in pyproject.toml). A new protocol family is a new
folder under models/; nothing else needs listing.

``pip install -e .`` installs through setuptools' import finder, which Python asks only after
the folders on ``sys.path``; the current directory is the first of them, so in the folder that
holds a clone named ``desim/`` the clone itself (a folder without ``__init__.py``) would be
imported as an empty namespace package and ``import desim`` would break. `EditableFirst` adds a
finder asked first that takes a regular package from ``sys.path`` and otherwise the
repository, never such a namespace package (setuptools issue 3557).
"""

from setuptools import find_packages, setup
from setuptools.command.editable_wheel import editable_wheel

#: Import name → repository folder (the same mapping as pyproject.toml's package-dir).
ROOTS = {"desim": "desim", "desim.models": "models", "desim.topologies": "topologies"}


def packages() -> list[str]:
    """Every package under `ROOTS`, by import name."""
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        found += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return sorted(set(found))


#: A module beside setuptools' finder module: a meta-path finder asked first that returns a
#: regular package sys.path holds (an installed wheel on PYTHONPATH keeps its precedence) and
#: otherwise setuptools' answer (the repository), never the namespace package a folder named
#: like the package would make. Its ``.pth`` line imports it.
FIRST_MODULE = '''"""desim's editable install: sys.path's regular package first, else the repo."""
import sys
from importlib.machinery import PathFinder

import {finder} as editable


class RegularFirst:
    """Finds a top-level package of the editable install: sys.path's regular one, else the
    repository's (not the empty namespace package a folder named like it would give)."""

    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname not in editable.MAPPING or "." in fullname:
            return None
        spec = PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin is not None:
            return spec
        return editable._EditableFinder.find_spec(fullname, path, target)


editable.install()
if RegularFirst not in sys.meta_path:
    sys.meta_path.insert(0, RegularFirst)
'''


class EditableFirst(editable_wheel):
    """setuptools' editable install, with its import finder asked before ``sys.path``."""

    def _select_strategy(self, name, tag, build_lib):
        return _FinderFirst(super()._select_strategy(name, tag, build_lib))


class _FinderFirst:
    """An editable strategy that adds `FIRST_MODULE` for every finder module the strategy it
    wraps writes (none for a strategy of plain ``.pth`` paths or links)."""

    def __init__(self, strategy) -> None:
        self.strategy = strategy

    def __enter__(self):
        self.strategy.__enter__()
        return self

    def __exit__(self, *exc):
        return self.strategy.__exit__(*exc)

    def __call__(self, wheel, files, mapping) -> None:
        recording = _Recording(wheel)
        self.strategy(recording, files, mapping)
        for name in recording.names:
            if name.endswith("_finder.py") and "/" not in name:
                finder = name.removesuffix(".py")
                module = FIRST_MODULE.format(finder=finder)
                wheel.writestr(f"{finder}_first.py", module.encode())
                wheel.writestr(f"{finder}_first.pth", f"import {finder}_first\n".encode())


class _Recording:
    """A wheel being written that remembers the names of the files written into it."""

    def __init__(self, wheel) -> None:
        self.wheel = wheel
        self.names: list[str] = []

    def writestr(self, name, data, *args, **kwargs):
        self.names.append(str(name))
        return self.wheel.writestr(name, data, *args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self.wheel, attr)


setup(packages=packages(), cmdclass={"editable_wheel": EditableFirst})
