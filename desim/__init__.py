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

from desim.kernel.engine import RunOutput, Simulation
from desim.kernel.params import ConfigError
from desim.study.export import Results, load
from desim.study.results import run_study
from desim.study.scenario import Scenario, run
from desim.study.spec import load_study

__all__ = [
    "ConfigError", "Results", "RunOutput", "Scenario", "Simulation", "load", "load_study", "run",
    "run_study",
    "__version__",
]
