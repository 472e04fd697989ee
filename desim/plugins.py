"""Loading the packages that register protocols, data models, links and curves.

desim never imports a protocol package by name: packages announce themselves through the
``desim.plugins`` entry-point group (``models`` and ``topologies`` do, in pyproject.toml).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

_loaded = False


def load_plugins() -> None:
    """Import every registered plugin package once, filling the registries."""
    global _loaded
    if _loaded:
        return
    for ep in entry_points(group="desim.plugins"):
        importlib.import_module(ep.value)
    _loaded = True
