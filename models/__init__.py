"""What desim simulates: data models, privacy mechanisms, protocols and their closed forms.

Importing this package registers its protocols, data models and curves with desim.
"""

import models.pricer  # noqa: F401  (PriCER, seed 004: protocol, data, curves)
from models import baselines, ccolme, ccolme_analytic, colme, curves, data, metrics  # noqa: F401
