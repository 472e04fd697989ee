"""desim: a discrete-event network simulator for private collaborative estimation."""

__version__ = "0.1.0"

from desim.engine import RunOutput, Simulation
from desim.params import ConfigError
from desim.results import run_study
from desim.scenario import Scenario, run
from desim.study import load_study

__all__ = [
    "ConfigError", "RunOutput", "Scenario", "Simulation", "load_study", "run", "run_study",
    "__version__",
]
