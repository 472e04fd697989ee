"""desim: a discrete-event network simulator for private collaborative estimation.

The package is cut in layers that import one way only:

- `desim.kernel`: the simulation kernel — SimPy engine, protocol interface, messages, network,
  parameter server, named random streams, recorder, registries and validated parameters.
- `desim.network_models`: what links do — fixed delays, Bernoulli links, latency, availability
  (outages, churn, traces), stragglers, and their composition.
- `desim.study`: study files, scenarios, results folders, summaries, figures and the CLI.
- `desim.models` (the repository's ``models/`` folder): the protocol families and their maths.
- `desim.topologies` (the ``topologies/`` folder): communication graphs.
"""

__version__ = "0.1.0"

from typing import Any

from desim.kernel.params import ConfigError

#: Public names imported on first use (module-level __getattr__): the study layer and the
#: engine load pandas, pyarrow and the plug-ins, which `import desim` alone should not pay.
_LAZY = {
    "RunOutput": "desim.kernel.engine",
    "Simulation": "desim.kernel.engine",
    "run_study": "desim.study.results",
    "Scenario": "desim.study.scenario",
    "run": "desim.study.scenario",
    "load_study": "desim.study.spec",
    "load": "desim.study.export",
    "Results": "desim.study.export",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip __getattr__
        return value
    raise AttributeError(f"module 'desim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ConfigError",
    "Results",
    "RunOutput",
    "Scenario",
    "Simulation",
    "load",
    "load_study",
    "run",
    "run_study",
    "__version__",
]
