"""Closed-form PriCER curves: the optimised objective of problem (8) (seed 004 Fig. 3).

A curve here is a number per grid point, flat in t: a study sweeps a grid column (e.g.
``defaults.trusted``) and plots it on the x axis (`[[plot]] x = "trusted"`). The links come from
the same parameters as the ``bernoulli`` link model (p_server, p_link, reciprocity, an optional
[topology] graph), the trust and privacy levels from the same names as the ``pricer`` protocol,
so one [defaults] table reaches both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.params import build, param
from desim.kernel.registry import CURVES, TOPOLOGIES
from desim.models.pricer.optimiser import Problem, epsilon_matrix, optimise, trust_matrix
from desim.network_models.links import BernoulliLinks


@CURVES.register("pricer-objective")
@dataclass(frozen=True)
class PricerObjective:
    """The optimised worst-case MSE, objective of (8) (R² σ²_tv + σ²_pr), for n = data.agents.

    With `sigma_search` false it is Algorithm 3 as printed (σ stays at σ_thr).
    """

    p_server: float | list[float] = param(
        1.0, "p_i of every node (one for all, or a list of n)", ge=0, le=1
    )
    p_link: float = param(
        1.0, "p_ij = p_c of every link (every pair without a topology: Erdős–Rényi)", ge=0, le=1
    )
    reciprocity: float = param(1.0, "ρ of E[τ_ij τ_ji] (0 independent, 1 reciprocal)", ge=0, le=1)
    topology: dict | None = param(None, "a [topology] table (graph model); absent: every pair")
    trust: Literal["links", "ring", "random", "all", "none"] = param(
        "ring", "trusted pairs: link neighbours, i+1…i+k (ring), k random, all or none"
    )
    trusted: int = param(0, "k, the trusted neighbours of every node (ring, random)", ge=0)
    epsilon_high: float = param(1e3, "ε_ij of trusted pairs and of a node to itself", gt=0)
    epsilon_low: float = param(0.1, "ε_ij of the other pairs", gt=0)
    delta: float = param(1e-3, "δ_ij of every pair", gt=0, le=1)
    sigma_search: bool = param(True, "search σ beyond σ_thr (false: Alg. 3 as printed)")
    iterations: int = param(2, "K, outer iterations of Alg. 3", ge=1)
    dimension: int | None = param(None, "d (default: the data's dimension)", ge=1)
    radius: float | None = param(None, "R (default: the data's radius)", gt=0)
    seed: int = param(0, "seed of a random graph or random trust", ge=0)
    calibration: Literal["paper", "tight"] = param(
        "paper",
        "σ_thr and the privacy box from Thm. 4.1's classical bound, or tight per the "
        "PLD accountant",
    )

    def problem(self, data: Any) -> Problem:
        """Problem (8) of this curve for the study's data parameters (n, d, R)."""
        n = int(data.agents)
        rng = np.random.default_rng(self.seed)
        graph = None
        if self.topology is not None:
            table = dict(self.topology)
            model = TOPOLOGIES.get(table.pop("model"))
            graph = build(model, table, "topology").make(n, rng)
        links = BernoulliLinks(
            p_server=self.p_server, p_link=self.p_link, reciprocity=self.reciprocity
        )
        conn = links.connectivity(n, graph)
        trusted = trust_matrix(self.trust, n, self.trusted, conn.P, rng)
        return Problem(
            conn,
            epsilon_matrix(trusted, self.epsilon_high, self.epsilon_low),
            np.full((n, n), self.delta),
            float(self.radius if self.radius is not None else data.radius),
            int(self.dimension if self.dimension is not None else data.dimension),
            self.calibration,
        )

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(objective of (8) at every t, zeros): an optimiser result does not depend on t."""
        value = optimise(
            self.problem(data), K=self.iterations, sigma_search=self.sigma_search
        ).objective
        tt = np.asarray(t, dtype=float)
        return np.full(tt.shape, value), np.zeros(tt.shape)
