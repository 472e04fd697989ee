"""desim: a discrete-event network simulator for private collaborative estimation."""

from desim.engine import RunOutput, Simulation
from desim.params import ConfigError
from desim.scenario import Scenario, run

__all__ = ["ConfigError", "RunOutput", "Scenario", "Simulation", "run", "__version__"]
__version__ = "0.1.0"
