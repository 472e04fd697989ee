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

Budgets (``budget = {epsilon, delta, against = "neighbour" | "server", action = "stop"}``,
`desim.models.privacy.budget`, PriCER only): node i's r rounds spend ε(m_i, r) against the
threat model named, m_i its multiplier in the ledger (`privacy_spend`), so its budget is a
count of rounds k*_i = max{r : ε(m_i, r) ≤ ε_budget}, found once per distinct m_i by the
accountant (`capacity`, up to t_max). From round k*_i + 1 on node i sends nothing, as if all its
links were down: no shares to its neighbours and no relay to the server (its relay holds its own
α_ii x_i + n_ii). The server keeps PriCER's rule for missing relays, x̂̄ = (1/n) Σ of the
relays received, so the estimate loses the stopped nodes' own terms and the shares they would
have relayed (biased towards 0); once every node has stopped it is 0. The noise of every pair
is still drawn (and dropped for the stopped nodes), so the other nodes' noise is that of the
run without a budget. ``degrade`` is refused: Alg. 3 optimises A and σ jointly for the
pairwise ε_ij, and a node's noisier later shares would break both the unbiasedness of (3) and
the design's MSE, which a per-node σ' would have to be re-optimised for.

Adversaries (``adversaries = {…}``, `desim.models.adversaries.VectorAdversaries`): an
adversary controls what its messages carry — the shares it sends (of x'_b instead of x_b, with
its noise unless ``skip_noise``) and the relay it forwards (its own term and, for every share
an honest node sent it, what that share would carry had its sender been such an adversary). It
never touches another node's vector or shares elsewhere. The defence is what the relays
allow (``aggregation = "median" | "trimmed"``): the server sees one sum per relay, never who
contributed what, so it can cut whole relays — an adversary's own — by the coordinate-wise
median or trimmed mean (Yin et al. 2018) of the relays received, scaled by (relays
received)/n to stay comparable with Alg. 2's (1/n) Σ; the shares an adversary sent honest
relays are inside their sums and stay. Without adversaries the robust aggregate is biased
wherever the relays' expectations differ (the design makes only their sum unbiased).

A graph that changes during a run ([topology] ``rewire`` or ``sequence``) is refused
(`GRAPH_CHANGES`): each round is one slot, complete in itself, and its estimate replaces the
last, so nothing is held across rounds that a change could move; what a graph decides is the
design, A and σ, which Alg. 3 optimises once for the link probabilities of the set-up graph.
A run over a changing graph would be a run per graph, each with its own design: one study per
graph asks that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from desim.kernel.links import Connectivity
from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context, DataSource, FollowsGraph, Protocol, WindowSafe
from desim.kernel.registry import METRICS, PROTOCOLS, applies_to, records
from desim.kernel.server import ParameterServer, Round, RoundCollector, tag
from desim.models.adversaries import (
    STREAM,
    Adversaries,
    VectorAdversaries,
    coordinatewise_location,
)
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
from desim.models.privacy.budget import Budget, capacity, set_budget

#: PriCER's threat models, as its ledger names them (`Pricer.privacy_spend`).
THREATS = ("neighbour", "server")
#: Why PriCER refuses a changing graph (`Pricer.check_graph_changes`), in one line.
GRAPH_CHANGES = (
    "pricer: a changing graph has no meaning here: each slot is one round, complete in itself, "
    "whose weights and noise Alg. 3 designs once for the set-up graph's links; give one study "
    "per graph"
)


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
    budget: dict | None = param(
        None,
        "per-node privacy budget {epsilon, delta (default: delta), against = neighbour | "
        "server, action = stop}: a node whose next round would exceed it stops sending "
        "(`desim.models.pricer.protocol`)",
    )
    adversaries: dict | None = param(
        None,
        "an [adversaries] table {fraction | agents, behaviour = shift | flip | collude, …}: "
        "nodes whose shares and relays are corrupted (`desim.models.adversaries`)",
    )
    aggregation: Literal["mean", "median", "trimmed"] = param(
        "mean",
        "the server's x̂̄: the sum of the relays received over n (Alg. 2), or their coordinate-"
        "wise median or trimmed mean times (relays received)/n (a defence against adversaries)",
    )
    trim: float | None = param(
        None, "aggregation = 'trimmed': the share β of relays dropped at each end", ge=0, lt=0.5
    )
    #: Without a budget the config hash is the one from before the parameter existed.
    hash_omits_absent: ClassVar = ("budget",)

    def __post_init__(self) -> None:
        if self.budget is not None and self.strategy != "pricer":
            raise ValueError(
                f"budget: needs strategy = 'pricer' (private relaying); "
                f"strategy = {self.strategy!r}"
            )
        if (self.aggregation == "trimmed") != (self.trim is not None):
            raise ValueError(
                f"trim = {self.trim!r}: aggregation = 'trimmed' needs trim (β in [0, 0.5)) and "
                f"reads it alone (aggregation = {self.aggregation!r})"
            )
        set_budget(self, self.delta, ("stop",), THREATS)
        if self.adversaries is not None:  # kept as a (hashable) Adversaries
            table = Adversaries.from_table(self.adversaries, ADVERSARY_BEHAVIOURS, "pricer")
            object.__setattr__(self, "adversaries", table)


#: The [adversaries] behaviours meaningful for PriCER (shares carry a vector; no classes to
#: mimic, no counts to inflate).
ADVERSARY_BEHAVIOURS = ("shift", "flip", "collude")


class RoundGate:
    """PriCER's ``stop`` budget: node i sends in rounds 1 … k*_i and withholds every later one
    (one withheld release per node and round, for the `budget` metric)."""

    def __init__(self, budget: Budget, k_star: np.ndarray) -> None:
        self.budget = budget
        #: k*_i, node i's budget as a count of rounds.
        self.capacity = k_star
        n = len(k_star)
        #: Rounds each node withheld, and the time of its first (+∞: none).
        self.withheld = np.zeros(n, dtype=np.int64)
        self.hit_at = np.full(n, math.inf)

    def admit(self, r: int, now: float) -> np.ndarray:
        """Which nodes send in round r (a mask); records the others as withheld at `now`."""
        ok = r <= self.capacity
        if not ok.all():
            self.withheld += ~ok
            np.minimum(self.hit_at, np.where(ok, math.inf, now), out=self.hit_at)
        return ok


@PROTOCOLS.register("pricer")
class Pricer(WindowSafe, FollowsGraph):
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
    def check_graph_changes(cls, params: PricerParams, links: Any) -> None:
        """Refuse every changing graph, saying why (`GRAPH_CHANGES`)."""
        raise ValueError(GRAPH_CHANGES)

    def on_graph_change(self, t: int, added: np.ndarray, dropped: np.ndarray) -> None:
        """Refused before any run (`check_graph_changes`); an engine driven by hand gets why."""
        raise ValueError(GRAPH_CHANGES)

    @classmethod
    def check_setup(cls, params: PricerParams, data: DataSource, links: Any) -> None:
        """Raise `InfeasibleError` (one line) when a node cannot reach the server at all (no
        direct link and no relay), or `ValueError` when `trusted` does not fit n, so that
        `desim validate` refuses the study before any run.

        Only the link probabilities are needed: the condition (3) of unbiasedness fails for
        such a node whatever the privacy budgets, so the optimiser is not run.
        """
        if params.adversaries is not None:
            params.adversaries.check(data.n_agents, data.classes)
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
        self.gate = self._budget_gate(ctx.t_max)
        #: The run's adversaries (None without an [adversaries] table).
        self.adversaries = VectorAdversaries.build(
            p.adversaries, ctx.adversary_truth, ctx.streams.get(STREAM)
        )

    @property
    def has_adversaries(self) -> bool:
        """Whether the run has an [adversaries] table (`Context.adversary_truth` is then set)."""
        return self.params.adversaries is not None

    def adversary_state(self) -> tuple[np.ndarray, None] | None:
        """(which nodes are adversaries, None: the server takes every relay), for the
        `adversaries` metric; None without an [adversaries] table."""
        return None if self.adversaries is None else (self.adversaries.mask, None)

    def _budget_gate(self, t_max: int) -> RoundGate | None:
        """The budget's gate: k*_i per node for its multiplier against the threat model (None
        without a budget; a node that spends nothing against it is never stopped)."""
        budget = self.params.budget
        if budget is None:
            return None
        if self.sigma == 0:
            raise ValueError("budget: needs σ > 0 (a finite epsilon_low or epsilon_high)")
        mult = self._multipliers()[budget.against]
        k_star = np.full(len(mult), t_max, dtype=np.int64)
        for m in np.unique(mult[np.isfinite(mult)]):
            k_star[mult == m] = capacity("gaussian", float(m), budget.epsilon, budget.delta, t_max)
        return RoundGate(budget, k_star)

    def budget_gate(self) -> RoundGate | None:
        """The per-node budget's state (None without one), for the `budget` metric."""
        return self.gate

    def _noise(self, rows: int) -> np.ndarray | float:
        """n ~ N(0, σ² I_d) for `rows` messages (0 without privacy, drawing nothing)."""
        if self.sigma == 0:
            return 0.0
        return self.sigma * self._rng.standard_normal((rows, self.d))

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        x = samples  # (n, d): the nodes' fixed vectors
        self.share_rounds = t  # rounds started: every share of round t is sent in it
        now = self.ctx.now()
        adv = self.adversaries
        if self.params.strategy == "naive":  # straight to the server
            self.server.open(t, now + self.params.server_deadline)
            sent = x if adv is None else adv.vectors(x)
            self.ctx.send("relay", self._nodes, np.full(len(x), self.server.address), tag(t, sent))
            return
        if adv is None:
            shares = self._weights * x[self._src] + self._noise(len(self._src))
            self._own[t] = np.diag(self.A)[:, None] * x + self._noise(len(x))  # x̃_jj
        else:  # adversaries send shares of x'_b (`VectorAdversaries`); same noise draws
            xs = adv.vectors(x)
            shares = self._weights * xs[self._src] + adv.own_noise(
                self._src, self._noise(len(self._src))
            )
            own = adv.own_noise(self._nodes, self._noise(len(x)))
            self._own[t] = np.diag(self.A)[:, None] * xs + own
        self.stage1.open(t, now + self.params.relay_deadline)
        src, dst = self._src, self._dst
        if self.gate is not None:
            ok = self.gate.admit(t, now)
            if not ok.all():  # stopped nodes: their shares are not sent
                keep = ok[src]
                src, dst, shares = src[keep], dst[keep], shares[keep]
                if not len(src):
                    return
        self.ctx.send("share", src, dst, tag(t, shares))

    def _forward(self, r: Round) -> None:
        """Stage-1 deadline of round r: every node forwards its aggregate (2) to the server."""
        local = self._own.pop(r.r)
        if len(r):
            payload = r.payload
            if self.adversaries is not None:  # what adversary relays forward instead
                alpha = self.A[r.src, r.dst][:, None]
                payload = self.adversaries.relayed(r.src, r.dst, alpha, payload)
            np.add.at(local, r.dst, payload)
        self.server.open(r.r, self.ctx.now() + self.params.server_deadline)
        nodes = self._nodes
        if self.gate is not None:  # stopped nodes: no relay either (it holds their own share)
            ok = r.r <= self.gate.capacity
            nodes, local = nodes[ok], local[ok]
            if not len(nodes):
                return
        self.ctx.send("relay", nodes, np.full(len(local), self.server.address), tag(r.r, local))

    def _aggregate(self, r: Round) -> None:
        """The server's deadline of round r: x̂̄ = (1/n) Σ of the aggregates received (Alg. 2),
        or (m_r/n) × their coordinate-wise median or trimmed mean (`aggregation`)."""
        p = self.params
        if p.aggregation == "mean":
            self.estimate = r.payload.sum(axis=0) / self.ctx.n_agents
        elif len(r):
            centre = coordinatewise_location(r.payload, p.aggregation, p.trim)
            self.estimate = centre * (len(r) / self.ctx.n_agents)
        else:
            self.estimate = np.zeros(self.d)

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
        count = np.full(len(self.A), self.share_rounds)
        if self.gate is not None:  # a stopped node sends nothing more
            count = np.minimum(count, self.gate.capacity)
        spend = {
            name: (mult, np.where(np.isfinite(mult), count, 0))
            for name, mult in self._multipliers().items()
        }
        return Spend("gaussian", self.params.delta, spend)

    def _multipliers(self) -> dict[str, np.ndarray]:
        """Every node's Gaussian multiplier per round against each threat model (+∞: none)."""
        reach = (self.conn.P > 0) | np.eye(len(self.A), dtype=bool)
        alpha = np.where(reach, self.A, 0.0)
        others = alpha.copy()
        np.fill_diagonal(others, 0.0)
        scale = self.sigma / (2.0 * self.R)
        with np.errstate(divide="ignore"):
            neighbour = scale / others.max(axis=1)
            server = scale / np.sqrt((alpha**2).sum(axis=1))
        return {"neighbour": neighbour, "server": server}


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
