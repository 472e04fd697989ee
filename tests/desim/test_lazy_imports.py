"""Import what a run needs, when it needs it: `import desim` and loading the plug-ins must not
pull in the heavy libraries (pandas, pyarrow, matplotlib, the privacy accountant, networkx,
scipy's sparse/stats/signal) — they cost about a second per process — while every public name
still resolves."""

from __future__ import annotations

import json
import subprocess
import sys

_CHILD = """
import json, sys
import desim
after_import = sorted(m for m in HEAVY if m in sys.modules)
from desim.kernel.plugins import load_plugins
load_plugins()
after_plugins = sorted(m for m in HEAVY if m in sys.modules)
names = {name: getattr(desim, name).__module__ for name in desim.__all__ if name != "__version__"}
print(json.dumps([after_import, after_plugins, names, sorted(dir(desim))]))
"""

HEAVY = [
    "pandas",
    "pyarrow",
    "matplotlib",
    "dp_accounting",
    "networkx",
    "scipy.sparse",
    "scipy.signal",
    "scipy.optimize",
    "scipy.stats",
    "scipy.cluster",
    "scipy.integrate",
]
#: what the plug-ins may still load (other families' modules import it at module level)
PLUGINS_MAY = {"pandas", "pyarrow", "scipy.optimize"}


def test_import_desim_loads_no_heavy_library_and_public_names_resolve():
    code = f"HEAVY = {HEAVY!r}\n" + _CHILD
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    after_import, after_plugins, names, listing = json.loads(out.stdout.strip().splitlines()[-1])
    assert after_import == []
    assert not {
        "matplotlib",
        "dp_accounting",
        "networkx",
        "scipy.signal",
        "scipy.sparse",
        "scipy.stats",
        "scipy.cluster",
        "scipy.integrate",
    } & set(after_plugins)
    assert set(after_plugins) <= PLUGINS_MAY
    assert names == {
        "ConfigError": "desim.kernel.params",
        "RunOutput": "desim.kernel.engine",
        "Simulation": "desim.kernel.engine",
        "Scenario": "desim.study.scenario",
        "load_study": "desim.study.spec",
        "run": "desim.study.scenario",
        "run_study": "desim.study.results",
        "load": "desim.study.export",
        "Results": "desim.study.export",
    }
    assert {"run", "Scenario", "load_study"} <= set(listing)


_RUN = """
import json, sys
import desim
s = desim.Scenario(protocol="c-colme", params={}, t_max=20,
                   data={"model": "classes", "agents": 40, "class_means": [0.0, 1.0]},
                   topology={"model": "regular", "degree": 4})
desim.run(s)
print(json.dumps(sorted(m for m in HEAVY if m in sys.modules)))
"""


def test_a_c_colme_run_on_a_regular_graph_needs_no_networkx_nor_scipy_sparse():
    """The regular graph is drawn without networkx, its components found without csgraph."""
    out = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n" + _RUN],
        check=True,
        capture_output=True,
        text=True,
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert not {"networkx", "scipy.sparse", "scipy.stats", "scipy.cluster"} & loaded
