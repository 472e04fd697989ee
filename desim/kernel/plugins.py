"""Loading the packages that register protocols, data models, links and curves.

desim never imports a protocol package by name: packages announce themselves through the
``desim.plugins`` entry-point group (`desim.models` and `desim.topologies` do, in
pyproject.toml; a third-party package can do the same).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

_loaded: dict[str, str] | None = None


def load_plugins() -> dict[str, str]:
    """Import every registered plugin package once, filling the registries.

    Returns the loaded plug-ins, entry-point name → package (e.g. ``models`` → `desim.models`).
    """
    global _loaded
    if _loaded is None:
        loaded = {}
        for ep in entry_points(group="desim.plugins"):
            importlib.import_module(ep.value)
            loaded[ep.name] = ep.value
        _loaded = loaded
    return dict(_loaded)
