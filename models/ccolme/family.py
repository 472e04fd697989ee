"""What every member of the C-ColME family (C-ColME, B-ColME and their private variants) shares.

Agents sit on the graph G of `ctx.public["graph"]` and talk to their neighbours only; each
sample is privatised once (Laplace noise of scale b = 2L/ε, seed 001's Lemma 1 with n = 1) and
everything an agent sends derives from the privatised samples; the neighbour test
(`desim.models.ccolme.model.NeighbourTest`) decides χ_a(b) from privatised values, or from the
true classes for ``rule = "oracle"``. `CColMEFamily` sets this up once (`_setup_graph`) and gives
the ledgers' hooks (`privacy_spend`, `neighbour_decisions`) the same way for every member.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from desim.kernel.protocol import Context, WindowSafe
from desim.models.ccolme.edges import EdgeSlots
from desim.models.ccolme.model import NeighbourTest
from desim.models.privacy.accounting import Spend
from desim.models.privacy.budget import SampleGate
from desim.models.privacy.calibration import laplace_scale
from desim.topologies.graph import Graph


class CColMEFamily(WindowSafe):
    """A protocol of agents on a graph with privatised samples and a neighbour test."""

    reads = frozenset({"network", "topology"})
    #: The scenario must have a [topology]: the graph arrives as ctx.public["graph"].
    needs_topology: ClassVar[bool] = True
    #: Agents that had a neighbour in an earlier graph of a changing one (None: no change).
    shared_before: np.ndarray | None = None

    @property
    def uses_oracle(self) -> bool:
        """Only rule = "oracle", the explicitly named oracle variant, sees the classes."""
        return self.params.rule == "oracle"

    def _setup_graph(self, ctx: Context) -> Graph:
        """Read the graph, the noise and the test's constants (sets `graph`, `src`, `dst`,
        `reverse`, `laplace_b`, `sigma2_dp`, the test and the delivery mode); returns G."""
        p = self.params
        g: Graph = ctx.public["graph"]
        if g.n != ctx.n_agents:
            raise ValueError(f"the graph has {g.n} agents, the data {ctx.n_agents}")
        self.graph = g
        self.src, self.dst, self.reverse = g.src, g.dst, g.reverse
        self._slot_of = EdgeSlots(g.n, g.src * g.n + g.dst)
        self._L = L = float(ctx.public["L"])
        private = p.noise == "laplace" and math.isfinite(p.epsilon)
        #: Laplace scale b = 2L/ε of the per-sample noise (0 without privacy).
        self.laplace_b = laplace_scale(L, p.epsilon) if private else 0.0
        budget = getattr(p, "budget", None)  # Private-C-ColME's, `SampleGate`
        accountant = getattr(p, "accountant", "pld")
        self.gate = (
            None if budget is None else SampleGate(budget, L, self.laplace_b, g.n, accountant)
        )
        if self.gate is not None:
            self.laplace_b = self.gate.scale
        #: σ_DP² = 2b² = 8L²/ε², the variance of each sample's noise.
        self.sigma2_dp = 2.0 * self.laplace_b**2
        self._noise = ctx.streams.get("dp-noise")
        sigma2 = np.broadcast_to(np.asarray(ctx.public["sigma2"], dtype=float), (g.n,))
        distribution = ctx.public.get("distribution", "uniform")
        self._test = NeighbourTest(p, sigma2, self.sigma2_dp, distribution, g.n_directed)
        if self.uses_oracle:
            cls = ctx.oracle_classes
            self._oracle_chi = cls[g.src] == cls[g.dst]
        # ideal links deliver every send whole, at once and in send order
        self._in_order = ctx.links is None or ctx.links.ideal
        return g

    def privatise(self, samples: np.ndarray) -> np.ndarray:
        """X_a + Z_a with Z_a ~ Laplace(0, 2L/ε) drawn from ``dp-noise`` (X_a without privacy)."""
        if self.laplace_b == 0.0:
            return samples
        return samples + self._noise.laplace(0.0, self.laplace_b, size=len(samples))

    def privacy_spend(self) -> Spend | None:
        """The releases so far, for the `privacy` ledger (None without noise).

        Each sample gets its Laplace noise once, and all an agent sends is computed from the
        privatised samples: every sample is one Laplace release of sensitivity 2L (multiplier
        b/2L = 1/ε), to one neighbour as to all of them colluding, once the agent has sent
        anything (t ≥ 1, a neighbour). The mechanism is pure ε-DP; the accountant's truncated
        privacy-loss distribution needs δ > 0, so the ledger reports ε at δ = 10⁻¹².
        """
        if self.laplace_b == 0.0:
            return None
        linked = self.graph.degree > 0
        if self.shared_before is not None:  # a changing graph: shared on an earlier graph
            linked = linked | self.shared_before
        shared = np.where(linked & (self.t > 0), 1, 0)
        if self.gate is not None and self.gate.silent:
            shared[:] = 0
        m = self.laplace_b / (2.0 * self._L)
        accountant = getattr(self.params, "accountant", "pld")
        return Spend("laplace", 1e-12, {"one": (m, shared), "all": (m, shared)}, accountant)

    def budget_gate(self) -> SampleGate | None:
        """The per-agent budget's state (None without one), for the `budget` metric."""
        return self.gate

    def neighbour_decisions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, b ∈ C_a) for every directed edge of G: the estimated same-class links."""
        return self.src, self.dst, self.kept.copy()
