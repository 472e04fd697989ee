"""What the PriCER tests share: the small intermittent network and a PriCER that logs rounds.

A test module imports them (`from _pricer_helpers import NETWORK, Logged`): pytest puts this
folder on sys.path to import the module.
"""

from __future__ import annotations

import numpy as np

from desim.kernel.server import Round
from desim.models.pricer.protocol import Pricer

#: Five nodes' links to the server and to each other (Bernoulli links).
NETWORK = {"p_server": [0.2, 0.9, 0.5, 0.3, 1.0], "p_link": 0.6, "reciprocity": 0.5}


class Logged(Pricer):
    """PriCER that keeps the server's estimate of every round."""

    def setup(self, ctx):
        super().setup(ctx)
        self.rounds: list[np.ndarray] = []

    def _aggregate(self, r: Round) -> None:
        super()._aggregate(r)
        self.rounds.append(self.estimate.copy())
