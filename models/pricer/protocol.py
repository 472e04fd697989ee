"""PriCER (seed 004, Algs. 1–2): private collaborative relaying to a parameter server.

Every slot is one round r = t of mean estimation over the nodes' fixed vectors x_i
(`desim.models.pricer.data`). Stage 1 (Alg. 1): node i sends x̃_ij = α_ij x_i + n_ij, n_ij ~ N(0,
σ²I_d), to every node j that it can ever reach (p_ij > 0); the link model drops it unless τ_ij = 1.
At the Stage-1 deadline node j forwards x̃_j = α_jj x_j + n_jj + Σ_received x̃_ij to the server
(Alg. 2), which arrives if τ_j = 1; at the server's deadline the estimate is
x̂̄ = (1/n) Σ_received x̃_j. With zero latency and both deadlines 0 (the paper's synchronous
model) every round completes within its slot; with latency, late messages miss the deadline
and are counted as late, like a failed link.

Strategies: ``pricer`` (A and σ from `desim.models.pricer.optimiser.optimise`), ``colrel`` (ColRel:
the same relaying without privacy, σ = 0) and ``naive`` (no relaying: node i sends x_i to the
server, which computes (1/n) Σ_i τ_i x_i as in §VI — biased). A and σ are computed at set-up for the
run's link probabilities (`desim.kernel.links.LinkModel.probabilities`, public knowledge as in the
paper) and trust: trusted pairs and self get ε_high, other pairs ε_low, every pair δ.

Under asynchrony (latency, stragglers, outages, churn): a round's shares that reach node j after
its Stage-1 deadline, and aggregates that reach the server after the server's deadline, are
lost — counted as late, exactly like a failed link (τ = 0). The optimiser sees the nominal
link probabilities by default; with ``effective = true`` it is given the effective ones, the
probability that a message is sent on an up link, between up nodes, and arrives before its
deadline (`LinkModel.probabilities` with ``within`` = the relay deadline and
``server_within`` = the server deadline). That product treats the events as independent, which
they are per message; correlations between messages of one node in one round (a node that is
down loses all its shares) are not modelled by Thm. 3.2 and are left to the simulation.

Window-safe (exact delivery times, `desim.kernel.network`): deliveries only file messages under
their rounds, and a window's batch is in delivery-time order (send order among equal times),
so every round gets its messages in the order single instants append them — the same sums, bit
for bit; rounds close at deadlines, which no window spans, and nothing is sent on delivery.

The recorder's ``mse`` is ‖x̂̄ − x̄‖² (every agent reports the server's estimate). The metric
functions ``pricer`` (`[study] metrics = ["pricer"]`) add ``bound`` (the worst-case MSE: the
Thm. 3.2 bound (4) for PriCER and ColRel, at the probabilities the optimiser was given),
``expected_mse`` (the exact E‖x̂̄ − x̄‖² for the run's data and its network's effective
probabilities, deadlines included) and ``sigma`` (σ).

ColRel and naive are non-private baselines: they send the raw x_i (scaled by α_ij) over links.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.links import Connectivity
from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context, DataSource, Protocol, WindowSafe
from desim.kernel.registry import METRICS, PROTOCOLS, applies_to, records
from desim.kernel.server import ParameterServer, Round, RoundCollector, tag
from desim.models.pricer.optimiser import (
    Problem,
    Solution,
    colrel,
    epsilon_matrix,
    expected_mse,
    optimise,
    trust_matrix,
    worst_case_mse,
)
from desim.models.privacy.accounting import Spend


@dataclass(frozen=True)
class PricerParams:
    """Parameters of PriCER and its baselines."""

    strategy: Literal["pricer", "colrel", "naive"] = param(
        "pricer", "pricer: private relaying; colrel: relaying without privacy; naive: no relays"
    )
    trust: Literal["links", "ring", "random", "all", "none"] = param(
        "links", "trusted pairs: link neighbours, i+1…i+k (ring), k random, all or none"
    )
    trusted: int = param(0, "k, the trusted neighbours of every node (ring, random)", ge=0)
    epsilon_high: float = param(
        1e3, "ε_ij of trusted pairs and of a node to itself (inf: no constraint)", gt=0
    )
    epsilon_low: float = param(0.1, "ε_ij of the other pairs (inf: no constraint)", gt=0)
    delta: float = param(1e-3, "δ_ij of every pair", gt=0, le=1)
    sigma_search: bool = param(
        True, "search σ beyond σ_thr after Alg. 3 (false: Alg. 3 as printed, σ = σ_thr)"
    )
    iterations: int = param(2, "K, outer iterations of Alg. 3", ge=1)
    l1: int | None = param(None, "L1, row updates of the relaxed pass (default 400·n)", ge=1)
    l2: int | None = param(None, "L2, row updates of the fine-tuning pass (default 400·n)", ge=1)
    relay_deadline: float = param(
        0.0, "slots after a round starts when nodes forward what they received", ge=0
    )
    server_deadline: float = param(
        0.0, "slots after the forwarding when the server closes the round", ge=0
    )
    effective: bool = param(
        False, "optimise for the effective p_i, p_ij: link up and delivered before the deadline"
    )
    calibration: Literal["paper", "tight"] = param(
        "paper",
        "σ_thr and the privacy box from Thm. 4.1's classical bound, or tight per the "
        "PLD accountant",
    )


@PROTOCOLS.register("pricer")
class Pricer(WindowSafe):
    """PriCER (Algs. 1–2) with weights and noise of Alg. 3, or the ColRel / naive baselines."""

    Params = PricerParams
    message_kinds = ("share", "relay")
    reads = frozenset({"network", "topology"})  # the graph through its links' probabilities
    memory = {"pair": 200.0, "pair-coordinate": 16.0}  # a round's shares and noise: n² × d

    # Exact with windows: deliveries only file messages under their rounds, in delivery order
    # (a window's batch is in time order, as single instants append them), and every round
    # closes at a deadline, which no window spans; nothing is sent from `on_deliver`.
    def on_window_end(self) -> None:
        """Nothing left to finish: deliveries only file messages under their rounds."""

    @classmethod
    def check_setup(cls, params: PricerParams, data: DataSource, links: Any) -> None:
        """Raise `InfeasibleError` (one line) when a node cannot reach the server at all (no
        direct link and no relay), or `ValueError` when `trusted` does not fit n, so that
        `desim validate` refuses the study before any run.

        Only the link probabilities are needed: the condition (3) of unbiasedness fails for
        such a node whatever the privacy budgets, so the optimiser is not run.
        """
        if params.strategy == "naive" or "R" not in data.public or "d" not in data.public:
            return
        n = data.n_agents
        conn = links.probabilities(n) if links is not None else Connectivity.reliable(n)
        trust_matrix(params.trust, n, params.trusted, conn.P, np.random.default_rng(0))
        Problem(
            conn,
            np.full((n, n), np.inf),
            np.full((n, n), params.delta),
            float(data.public["R"]),
            int(data.public["d"]),
        )

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        p = self.params
        n = ctx.n_agents
        if "R" not in ctx.public or "d" not in ctx.public:
            raise ValueError(
                "pricer needs vector data with a radius R and dimension d (data model 'vectors')"
            )
        self.R, self.d = float(ctx.public["R"]), int(ctx.public["d"])
        links = ctx.links
        if links is None:
            self.conn = self.effective_conn = Connectivity.reliable(n)
        else:
            #: p, P, E of a message arriving in time at this run's network (payload: tag + d)
            self.effective_conn = links.probabilities(
                n, within=p.relay_deadline, server_within=p.server_deadline, width=self.d + 1
            )
            #: p, P, E the optimiser designs for: nominal, or effective with `effective`
            self.conn = self.effective_conn if p.effective else links.probabilities(n)
        trusted = trust_matrix(p.trust, n, p.trusted, self.conn.P, ctx.streams.get("topology"))
        eps = epsilon_matrix(trusted, p.epsilon_high, p.epsilon_low)
        self.solution: Solution | None = None
        if p.strategy == "naive":
            self.A, self.sigma = np.eye(n), 0.0
        else:
            problem = Problem(
                self.conn, eps, np.full((n, n), p.delta), self.R, self.d, p.calibration
            )
            if p.strategy == "colrel":
                self.solution = colrel(problem, p.l1, p.l2)
            else:
                self.solution = optimise(problem, p.iterations, p.l1, p.l2, p.sigma_search)
            self.A, self.sigma = self.solution.A, self.solution.sigma
        # Stage-1 messages: every ordered pair i ≠ j whose link can be up (Alg. 1, line 3)
        pairs = (self.conn.P > 0) & ~np.eye(n, dtype=bool)
        self._src, self._dst = np.nonzero(pairs)
        self._weights = self.A[self._src, self._dst][:, None]
        self._rng = ctx.streams.get("dp-noise")
        self._nodes = np.arange(n)
        self._own: dict[int, np.ndarray] = {}
        self.stage1 = RoundCollector(ctx, "share", self.d, self._forward)
        self.server = ParameterServer(ctx, "relay", self.d, self._aggregate)
        self.share_rounds = 0
        #: The server's current estimate x̂̄ (zero before the first round closes).
        self.estimate = np.zeros(self.d)

    def _noise(self, rows: int) -> np.ndarray | float:
        """n ~ N(0, σ² I_d) for `rows` messages (0 without privacy, drawing nothing)."""
        if self.sigma == 0:
            return 0.0
        return self.sigma * self._rng.standard_normal((rows, self.d))

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        x = samples  # (n, d): the nodes' fixed vectors
        self.share_rounds = t  # rounds started: every share of round t is sent in it
        now = self.ctx.now()
        if self.params.strategy == "naive":  # straight to the server
            self.server.open(t, now + self.params.server_deadline)
            self.ctx.send("relay", self._nodes, np.full(len(x), self.server.address), tag(t, x))
            return
        shares = self._weights * x[self._src] + self._noise(len(self._src))
        self._own[t] = np.diag(self.A)[:, None] * x + self._noise(len(x))  # x̃_jj
        self.stage1.open(t, now + self.params.relay_deadline)
        self.ctx.send("share", self._src, self._dst, tag(t, shares))

    def _forward(self, r: Round) -> None:
        """Stage-1 deadline of round r: every node forwards its aggregate (2) to the server."""
        local = self._own.pop(r.r)
        if len(r):
            np.add.at(local, r.dst, r.payload)
        self.server.open(r.r, self.ctx.now() + self.params.server_deadline)
        self.ctx.send(
            "relay", self._nodes, np.full(len(local), self.server.address), tag(r.r, local)
        )

    def _aggregate(self, r: Round) -> None:
        """The server's deadline of round r: x̂̄ = (1/n) Σ of the aggregates received (Alg. 2)."""
        self.estimate = r.payload.sum(axis=0) / self.ctx.n_agents

    def on_deliver(self, batch: Batch) -> None:
        self.stage1.receive(batch)
        self.server.receive(batch)

    def estimates(self) -> np.ndarray:
        return np.broadcast_to(self.estimate, (self.ctx.n_agents, self.d))

    def privacy_spend(self) -> Spend | None:
        """The releases so far, for the `privacy` ledger (None without noise: ColRel, naive).

        Every round (slot) node i sends α_ij x_i + n_ij to each j it can reach, sent whether or
        not the link is up: a Gaussian release of sensitivity 2R α_ij. Against neighbour j after
        r rounds: r releases of multiplier σ/(2R α_ij) — reported for the most exposed
        neighbour. Against the server: at most every share of i (its own α_ii x_i + n_ii
        included) reaches it in its relays' sums, each with noise at least n_ij — together one
        Gaussian of multiplier σ/(2R ‖α_i·‖₂) per round (an upper bound on what it learns).
        """
        if self.sigma == 0 or not self.share_rounds:
            return None
        reach = (self.conn.P > 0) | np.eye(len(self.A), dtype=bool)
        alpha = np.where(reach, self.A, 0.0)
        others = alpha.copy()
        np.fill_diagonal(others, 0.0)
        scale = self.sigma / (2.0 * self.R)
        with np.errstate(divide="ignore"):
            neighbour = scale / others.max(axis=1)
            server = scale / np.sqrt((alpha**2).sum(axis=1))
        n = len(alpha)
        count = np.full(n, self.share_rounds)
        spend = {
            "neighbour": (neighbour, np.where(np.isfinite(neighbour), count, 0)),
            "server": (server, np.where(np.isfinite(server), count, 0)),
        }
        return Spend("gaussian", self.params.delta, spend)


@METRICS.register("pricer")
@records("bound", "expected_mse", "sigma")
@applies_to(Pricer)
def pricer_metrics(protocol: Protocol, data: DataSource) -> dict[str, float]:
    """bound (worst-case MSE, Thm. 3.2, for the probabilities designed for), expected_mse (exact
    for these data and the run's effective probabilities: in time at its network), σ."""
    if not isinstance(protocol, Pricer):
        return {}
    x: Any = getattr(data, "x", None)
    out = {
        "bound": worst_case_mse(protocol.conn, protocol.A, protocol.sigma, protocol.R, protocol.d),
        "sigma": protocol.sigma,
    }
    if x is not None:
        out["expected_mse"] = expected_mse(protocol.effective_conn, protocol.A, protocol.sigma, x)
    return out
