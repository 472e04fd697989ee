"""What desim simulates: data models, privacy mechanisms, protocols and their closed forms.

Importing this package registers its protocols, data models and curves with desim.
"""

from models import baselines, colme, curves, data  # noqa: F401  (registration side effects)
