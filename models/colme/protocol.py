"""Private-ColME (seed 002): query, privatised release, class test, inverse-variance combine.

Each slot, every agent a queries one other agent b (schedule RR or rRR, §III-E). Agent b answers
with a privatised running mean (PM-I or PM-II, `desim.models.privacy.release`). Agent a keeps the
statistic T_{b→a} with its exact variance (`desim.models.colme.statistic`), decides whether b is in
its class by the z-test of §III-C1 when b answers, and estimates its mean by the inverse-variance
combination of Lemma 4 over the agents it currently believes are in its class, with the bracketing
of (3)–(4) corrected (docs/papers.md §1.2):

    μ_a = (t/σ_a² · X̄_a + Σ_b T_{b→a}/Var[T_{b→a}]) / (t/σ_a² + Σ_b 1/Var[T_{b→a}]).

With unknown data variances (§III-C2, §V) agent a uses its own sample variance V_a, an
estimate V_{b→a} of σ_b² — released by b (Sch-Var-1) or computed by a from b's releases
(Sch-Var-2, optionally with the Bayesian correction (19)) — the plug-in V̂ar[T], the Welch
t-test, and the random weights of eq. (5). Until V_{b→a} exists (or when it is negative and not
corrected), V̂ar[T_{b→a}] = +∞: b is kept in C_a but gets weight 0.

Choices the paper leaves open, made here:
- RR order: agent a queries a+1, a+2, … (mod M), skipping itself, so every agent is queried
  exactly once per slot; agent a's k-th other agent is at RR position k (Prop. 3's ℓ).
- rRR skips agents outside C_a^{(t-1)}. A decision about b is revised only when b answers, so an
  excluded agent is never queried again; if a excludes everyone, a sends no more queries and
  its estimate is its local mean from then on.
- The test is evaluated when b's release arrives, with t = a's current sample count.
- Sch-Var-1 splits (ε, δ) equally between the mean and the variance release (§VII-B).
- Sch-Var-2 uses the unbiased form of (16) for unequal p-sum lengths (it equals (16) when
  all gaps are equal, as under RR after the first query); under PM-II a differences
  consecutive releases, whose noises are correlated, and the correction accounts for it.

Under asynchrony (links with latency, losses, outages or stragglers):
- The querier never stalls: RR and rRR advance every slot whatever is outstanding, and an
  unanswered query is simply never used.
- b answers when the query arrives, with its running mean then; its mechanism counts the p-sum
  (and spends the privacy) when it releases, whether or not the release arrives. If b has no
  new sample since its last release to a (two queries of a answered in one slot), it re-sends
  that release unchanged (same j: post-processing, no new p-sum; counted in `repeated`), so
  every p-sum covers at least one sample and t_j increases strictly with j.
- A release echoes the send time of the query it answers (the links need not be FIFO). a
  discards a release arriving more than `timeout` slots after that time (`timed_out`), then one
  whose j is not above the last index κ it took from b (`stale`: older than, or the same as, a
  release already used); releases arriving together are taken in increasing j.
- a uses every other release when it arrives: gaps in j (lost or discarded releases) are
  normal. T and Var[T] stay exact for the releases taken (`desim.models.colme.statistic`); Sch-Var-2
  differences consecutive taken releases (a gap is a longer p-sum carrying the noises of both
  node sets' symmetric difference); Welch's κ (welch_df = "kappa") and the Bayesian shape
  count releases taken. Sch-Var-1's release is self-contained: a uses the last one it took.
- With ideal links none of this bookkeeping runs (every release arrives at once, in order);
  with zero latency through other link models it runs and gives the same numbers.

Window-safe (`desim.kernel.protocol.WindowSafe`): between ticks an agent's samples do not
change, so answering a query depends only on b's state at the tick and on the queries of the
same pair answered before it (in time order, as a batch is); taking a release touches only the
querier's state, never what answers read. In a window the queries are answered batch by batch
(replies at their exact times) and the releases are kept until `on_window_end`, which takes
them in the order one-message-per-instant delivery would: per pair by delivery time (then by
batch, then by j among releases of one instant), timeouts against each exact delivery time.
Under RR the queries never depend on deliveries, so the engine may hand over several slots at
once (`on_slots`, `batches_slots`): the sums after each slot are kept, and a query (a release)
delivered at x is answered (taken) with the responder's (the querier's) state of slot ⌊x⌋.
Messages are named for the links' latency (`Network.send`'s ids): a query by (slot, querier,
responder), a release by the query it answers; so their delays do not depend on how sends
are grouped.

Where it lives: the model's pure functions in `model` (test, Sch-Var-2's estimate, combination),
T and Var[T] per pair in `statistic`, class beliefs and last releases per pair in `pairs`, the
schedules in `schedule`, the per-slot view of the agents' own data in `view`, and the two
delivery strategies (ideal links, everything else) in `delivery`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context, SlotBatched
from desim.kernel.registry import METRICS, PROTOCOLS, applies_to, records
from desim.models.adversaries import STREAM, ActiveAdversaries, Adversaries
from desim.models.colme.budget import ReleaseBudget
from desim.models.colme.combination import CombinationSums, trimmed_sums
from desim.models.colme.compiled import CompiledPairs
from desim.models.colme.delivery import Arrivals, Asynchronous, query_ids
from desim.models.colme.dense import statistic_class, synchronous
from desim.models.colme.forgetting import check_forget, release_windows, window_bytes
from desim.models.colme.graph import (
    EdgeBeliefs,
    NeighbourRestrictedRoundRobin,
    NeighbourRoundRobin,
    Neighbours,
    edge_row_sums,
    max_neighbour_releases,
    responder_spend,
)
from desim.models.colme.model import (
    combine,
    contribution,
    sch_var_2_estimate,
    thresholds,
    z_accepts,
)
from desim.models.colme.pairs import COUNT, INDEX, VALUE, VARIANCE, ClassBeliefs
from desim.models.colme.positions import round_robin_pairs
from desim.models.colme.rewire import ChangingNeighbours
from desim.models.colme.schedule import RestrictedRoundRobin, RoundRobin, max_pair_releases
from desim.models.colme.statistic import SchVar2
from desim.models.colme.variance import sample_variance, welch_accepts
from desim.models.colme.view import OneSlot, SlotBatch
from desim.models.forgetting import forget_param
from desim.models.privacy.accounting import Spend, psum_multiplier
from desim.models.privacy.budget import (
    ACTIONS,
    Budget,
    StopGate,
    check_degrade,
    first_sample_psums,
)
from desim.models.privacy.release import PSumRelease, SampleVarianceRelease, levels_for
from desim.models.privacy.tree import calibrated_psum_noise


@dataclass(frozen=True)
class PrivateColMEParams:
    """Parameters of Private-ColME with known data variance."""

    mechanism: Literal["pm1", "pm2"] = param("pm1", "release mechanism: PM-I or PM-II")
    weights: Literal["last", "mom", "wmom"] = param(
        "last", "weights of T: last release (non-MoM), mean of means, windowed MoM"
    )
    schedule: Literal["rr", "rrr"] = param("rr", "round robin, or restricted round robin")
    noise: Literal["gaussian", "laplace", "none"] = param(
        "gaussian", "DP noise on each p-sum; none gives plain (non-private) ColME"
    )
    epsilon: float = param(1.0, "privacy budget ε of every sample", gt=0)
    delta: float = param(1e-6, "privacy budget δ (Gaussian noise)", gt=0, lt=1)
    theta: float = param(0.05, "test level numerator: θ_t = theta/ln(t+1)", gt=0, lt=1)
    budget_t_max: int | None = param(
        None, "t_max in PM-II's budget split ⌊log₂ t_max⌋+1 (default: the run's t_max)", ge=1
    )
    variance: Literal["known", "sch-var-1", "sch-var-2", "sch-var-2-bayes"] = param(
        "known", "data variances known, or estimated by Sch-Var-1 / Sch-Var-2 (plain, Bayesian)"
    )
    prior: Literal["paper", "jeffreys"] = param(
        "paper", "Sch-Var-2 Bayesian prior: the paper's (shape (κ+2)/2) or Jeffreys ((κ+1)/2)"
    )
    welch_df: Literal["printed", "kappa"] = param(
        "printed", "Welch ν second term over t_κ − 1 (as printed) or κ − 1 (releases)"
    )
    timeout: float = param(
        math.inf, "slots after sending a query beyond which its answer is discarded", gt=0
    )
    calibration: Literal["paper", "tight", "tight-tree"] = param(
        "paper",
        "noise calibration: the paper's formulas, or the least noise for (ε, δ) per the "
        "PLD accountant (`desim.models.privacy.accounting`) for ⌊log₂ t_max⌋+1 PM-II levels "
        "(tight) or for the tree nodes one querier really gets (tight-tree)",
    )
    accountant: Literal["pld", "rdp"] = param(
        "pld",
        "accountant of the ledger, the budget and the tight calibrations: privacy loss "
        "distributions, or Rényi DP (`desim.models.privacy.accounting`)",
    )
    budget: dict | None = param(
        None,
        "per-agent privacy budget {epsilon, delta, against = one | colluding, action = stop | "
        "degrade}: a release that would exceed it is not made, or made with more noise "
        "(`desim.models.privacy.budget`)",
    )
    peers: Literal["all", "topology"] = param(
        "all", "whom an agent queries: every other agent, or its [topology] neighbours only"
    )
    adversaries: dict | None = param(
        None,
        "an [adversaries] table {fraction | agents, behaviour = shift | flip | mimic | collude, "
        "…}: agents whose releases are corrupted (`desim.models.adversaries`)",
    )
    combination: Literal["weighted", "trimmed"] = param(
        "weighted",
        "Lemma 4's inverse-variance combination over the accepted peers, or the same over "
        "those left after a coordinate-wise trimmed mean's trim (Yin et al. 2018)",
    )
    trim: float | None = param(
        None,
        "combination = 'trimmed': the share β of accepted peers dropped at each end",
        ge=0,
        lt=0.5,
    )
    forget: dict | None = forget_param()

    def __post_init__(self) -> None:
        check_forget(self)  # (a windowed statistic over the releases made: `colme.forgetting`)
        if self.adversaries is not None:
            # the study's table, checked, kept as a (hashable) Adversaries
            table = Adversaries.from_table(self.adversaries, ADVERSARY_BEHAVIOURS, "private-colme")
            object.__setattr__(self, "adversaries", table)
        if (self.combination == "trimmed") != (self.trim is not None):
            raise ValueError(
                f"trim = {self.trim!r}: combination = 'trimmed' needs trim (β in [0, 0.5)) "
                f"and reads it alone (combination = {self.combination!r})"
            )
        if self.budget is not None and not isinstance(self.budget, Budget):
            # the study's table, checked, kept as a (hashable) Budget
            budget = Budget.from_table(self.budget, self.delta, ACTIONS)
            object.__setattr__(self, "budget", budget)
        if self.budget is not None and self.noise == "none":
            raise ValueError("budget: needs noise = 'gaussian' or 'laplace' (noise = 'none')")
        if self.budget is not None and self.budget.action == "degrade":
            check_degrade(self.noise, self.variance)


#: The [adversaries] behaviours meaningful for Private-ColME (what a release carries is a mean).
ADVERSARY_BEHAVIOURS = ("shift", "flip", "mimic", "collude")

# Indices of the message kinds (`PrivateColME.message_kinds`), as `Batch.single_kind` holds them.
_QUERY, _RELEASE = range(2)


@PROTOCOLS.register("private-colme")
class PrivateColME(SlotBatched, ChangingNeighbours):
    """Private-ColME: privatised queries, z-test class estimates, inverse-variance combination."""

    Params = PrivateColMEParams
    message_kinds = ("query", "release")
    reads = frozenset({"network"})  # with peers = "all" every agent queries every other
    #: The [topology] is read with peers = "topology" (`reads_when`); a study with one must say
    #: which (`must_say`), and saying "all" is the scenario from before `peers` existed
    #: (`legacy_values`: left out of config hashes and random-stream keys).
    reads_when: ClassVar[dict[str, tuple[str, Any]]] = {"topology": ("peers", "topology")}
    must_say: ClassVar[dict[str, str]] = {"topology": "peers"}
    legacy_values: ClassVar[dict[str, Any]] = {"peers": "all", "combination": "weighted"}
    memory = {"pair": 40.0}
    #: Populations above this size number their pairs by RR position where that applies
    #: (`desim.models.colme.positions`: a slot's pairs are one run).
    positions_above: ClassVar[int] = 1000
    #: Populations above this size keep each agent's combination sums Σ_b T/Var[T] and
    #: Σ_b 1/Var[T] up to date at every release (`estimates` in O(M)); up to it `estimates`
    #: sums over the M × M pair state at each call, which costs little there and gives the same
    #: bits as earlier versions (committed results stay byte-identical).
    incremental_above: ClassVar[int] = 1000

    @classmethod
    def memory_per_unit(
        cls, params: PrivateColMEParams, t_max: int, sizes: Any = None
    ) -> dict[str, float]:
        """Bytes per agent pair: T and its variance, beliefs and last releases, more with MoM
        weights, estimated variances and a ``degrade`` budget, per dyadic level with PM-II
        and windowed MoM, and a ``forget`` table's windows (`forgetting.window_bytes`)."""
        levels = math.floor(math.log2(max(t_max, 1))) + 1
        per_pair = cls.memory["pair"]
        per_pair += 28.0 * (params.weights != "last") + 40.0 * (params.variance != "known")
        per_pair += 8.0 * levels * (params.mechanism == "pm2")
        per_pair += 10.0 * levels * (params.weights == "wmom")
        # ``degrade``: each pair's j_d (int32) and, under ``last`` weights, its release's c_j
        per_pair += 12.0 * (params.budget is not None and params.budget.action == "degrade")
        return window_bytes(params, t_max, sizes, per_pair)

    @classmethod
    def check_setup(cls, params: PrivateColMEParams, data: Any, links: Any) -> None:
        """Refuse peers = "topology" without a graph, a trimmed combination on a graph, and
        adversaries that are not agents of this population."""
        if params.peers == "topology" and data.public.get("graph") is None:
            raise ValueError(
                "peers = 'topology': needs a [topology] table (or peers = 'all': every agent)"
            )
        if params.combination == "trimmed" and params.peers == "topology":
            raise ValueError(
                "combination = 'trimmed': allowed with peers = 'all' (not yet on a graph)"
            )
        if params.adversaries is not None:
            params.adversaries.check(data.n_agents, data.classes)
        _check_exact_peers(params, data)

    @property
    def has_adversaries(self) -> bool:
        """Whether the run has an [adversaries] table (`Context.adversary_truth` is then set)."""
        return self.params.adversaries is not None

    def setup(self, ctx: Context) -> None:
        """The mechanisms, the per-pair state and the strategies of this run, chosen once."""
        super().setup(ctx)
        p = self.params
        m = ctx.n_agents
        #: The graph's neighbours (peers = "topology"), or None: every other agent is a peer.
        self.graph = Neighbours(ctx.public["graph"]) if p.peers == "topology" else None
        #: Pairs held: every ordered pair (a·M + b), or every directed edge a → b of the graph.
        self.n_pairs = m * m if self.graph is None else self.graph.n_pairs
        #: The dense pairs numbered by RR position where a slot's pairs are then one run (None:
        #: a·M + b). (`positions`: ideal links are `ctx.links` None or ideal, as `asynchronous`)
        self.positions = round_robin_pairs(self, ctx)
        self.known = p.variance == "known"
        #: σ_a² of every agent, used only when variances are known.
        self.sigma2 = np.asarray(ctx.public["sigma2"], dtype=float) if self.known else None
        self._setup_releases(ctx)
        levels = levels_for(ctx.t_max)
        self.stat = statistic_class(self)(
            m,
            p.mechanism,
            p.weights,
            self.sigma2_dp,
            levels,
            n_pairs=self.n_pairs,
            degraded_ratio=1.0 if self.release_budget is None else self.release_budget.ratio,
            positions=self.positions,
        )
        #: V_{b→a}, a's current estimate of σ_b² (+∞: none yet), when variances are unknown.
        shape = (m, m) if self.graph is None else self.n_pairs
        self.v_hat = None if self.known else np.full(shape, np.inf)
        if p.variance in ("sch-var-2", "sch-var-2-bayes"):
            self.schvar2 = SchVar2(self.n_pairs, p.mechanism, levels)
        #: Columns of a release's payload (on a graph, the edge it crosses comes last).
        self.release_width = VARIANCE + (p.variance == "sch-var-1")
        self.edge_column = self.release_width
        self.release_width += self.graph is not None
        #: Releases each querier a discarded: older than one it took (stale), or answering a
        #: query sent more than `timeout` slots before they arrived (timed out).
        self.stale = np.zeros(m, dtype=np.int64)
        self.timed_out = np.zeros(m, dtype=np.int64)
        #: Answers each responder b re-sent unchanged (no new sample since its last to a).
        self.repeated = np.zeros(m, dtype=np.int64)
        #: Running sum, sum of squares and count of each agent's own samples.
        self.sums = np.zeros(m)
        self.sumsq = np.zeros(m)
        self.counts = np.zeros(m)
        #: What the rules read of the agents' own data: the running sums now, one slot.
        self.view = OneSlot(self.sums, None if self.known else self.sumsq, self.counts)
        self._setup_beliefs(ctx)
        self._theta, self._z = thresholds(p.theta, ctx.t_max)
        # on a graph the sums are recomputed edge by edge at each estimate (O(M·r), see
        # `edge_row_sums`): cheaper than keeping them current at every release
        self.incremental = m > self.incremental_above and self.graph is None
        if self.incremental:
            self.sums_w = CombinationSums(m)
        # Ideal links deliver every message at once: releases arrive in order, one per query.
        self.asynchronous = ctx.links is not None and not ctx.links.ideal
        self.delivery = Asynchronous(self) if self.asynchronous else synchronous(self)
        #: Whether a slot's pairs may go as a slice (`Neighbours.span`), not as indices.
        self.runs = _slot_runs(self)
        CompiledPairs.install(self)  # (irregular graphs: the per-pair update in kernels)
        # where the engine hands over several slots at once (`on_slots`, `batches_slots`), the
        # windows read the state of each slot from a batch view
        self._batch_view = SlotBatch() if self.asynchronous and self.batches_slots() else None
        self.forget = release_windows(self)  # T^W over the releases (None: T over every one)

    def _setup_beliefs(self, ctx: Context) -> None:
        """C_a^{(0)} of every agent and the schedule that reads it (over every other agent, or
        over the graph's neighbours)."""
        p, m = self.params, ctx.n_agents
        #: C_a^{(t)}: `included[a, b]` says a believes b is in its class (χ_a(b) = 1); on a
        #: graph `included[e]` for the edge e = a → b.
        if self.graph is None:
            self.beliefs = ClassBeliefs(self._initially_included(ctx), self.positions)
            self.schedule = (
                RoundRobin(m) if p.schedule == "rr" else RestrictedRoundRobin(self.beliefs)
            )
        else:
            self.beliefs = EdgeBeliefs(self._initially_included(ctx), self.graph)
            self.schedule = (
                NeighbourRoundRobin(self.graph)
                if p.schedule == "rr"
                else NeighbourRestrictedRoundRobin(self.graph, self.beliefs)
            )
        self.included = self.beliefs.included

    def _setup_releases(self, ctx: Context) -> None:
        """The noise of every p-sum, its privacy multiplier and the release mechanisms."""
        p = self.params
        m, L = ctx.n_agents, ctx.public["L"]
        #: σ_DP², the noise variance of every p-sum (and σ_{2,DP}², Sch-Var-1's variance p-sums)
        horizon = p.budget_t_max or ctx.t_max
        self.sigma2_dp, sigma2_var = calibrated_psum_noise(
            p.noise,
            L,
            p.mechanism,
            p.epsilon,
            p.delta,
            horizon,
            p.calibration,
            self.kappa_max(horizon),
            p.variance == "sch-var-1",
            p.accountant,
        )
        #: m, the privacy multiplier of every p-sum (σ_DP over its sensitivity).
        self.multiplier = psum_multiplier(p.noise, self.sigma2_dp, L) if L > 0 else 0.0
        # on a graph the mechanisms hold a square of side ⌈√E⌉ ≥ the edges: edge e is their
        # pair (e // side, e % side), and their flat index is e
        side = m if self.graph is None else max(1, math.isqrt(self.n_pairs - 1) + 1)
        self._side = side
        self.mech = PSumRelease(
            side, p.mechanism, p.noise, self.sigma2_dp, ctx.streams.get("dp-noise"), ctx.t_max
        )
        #: The per-agent budget's strategy (None without a budget).
        self.release_budget = (
            ReleaseBudget(self, ctx, self.kappa_max(ctx.t_max)) if p.budget is not None else None
        )
        #: Its gate (None without a budget), for the `budget` metric.
        self.gate = None if self.release_budget is None else self.release_budget.gate
        #: The run's adversaries, whose releases carry what their behaviour says (None: none).
        self.adversaries = (
            ActiveAdversaries.build(p.adversaries, ctx.adversary_truth, ctx.streams.get(STREAM))
            if p.adversaries is not None
            else None
        )
        if p.variance == "sch-var-1":
            self.var_release = SampleVarianceRelease(
                side,
                p.mechanism,
                p.noise,
                sigma2_var,
                self.sigma2_dp,
                ctx.streams.get("dp-noise-variance"),
                ctx.t_max,
            )

    def kappa_max(self, t_max: int) -> int:
        """κ_max: the most releases one responder can make to one querier in slots 1…t_max."""
        p = self.params
        if self.graph is None:
            return max_pair_releases(p.schedule, self.ctx.n_agents, t_max)
        return max_neighbour_releases(p.schedule, self.graph, t_max)

    def pairs_of(
        self, a: np.ndarray, b: np.ndarray, payload: np.ndarray | None, column: int = 0
    ) -> np.ndarray:
        """The pair index of messages between querier a and responder b: a·M + b, or on a graph
        the edge a → b, which every query (column 0) and release (`edge_column`) carries."""
        if self.graph is not None:
            return payload[:, column].astype(np.int64)
        return a * len(self.sums) + b if self.positions is None else self.positions.of(a, b)

    def made(self, b: np.ndarray, a: np.ndarray, pair: np.ndarray) -> np.ndarray:
        """κ_{b→a}: the releases b has made to a, of the pairs `pair`."""
        if self.graph is None and self.positions is None:
            return self.mech.count[b, a]
        return self.mech.count.ravel()[pair]

    def budget_gate(self) -> StopGate | None:
        """The per-agent budget's state (None without a budget), for the `budget` metric."""
        return self.gate

    def _initially_included(self, ctx: Context) -> np.ndarray:
        """C_a^{(0)}: everyone (every neighbour, on a graph)."""
        if self.graph is not None:
            return np.ones(self.n_pairs, dtype=bool)
        return np.ones((ctx.n_agents, ctx.n_agents), dtype=bool)

    def batches_slots(self) -> bool:
        """Only RR: its queries never depend on deliveries (rRR's skip excluded agents), so the
        engine may hand over several slots at once (`on_slots`); not with a forget table, whose
        own windows are kept slot by slot."""
        return self.params.schedule == "rr" and self.params.forget is None

    # -- slot: new samples, then queries ---------------------------------------------------
    def on_samples(self, t: int, samples: np.ndarray) -> None:
        """Slot t: every agent's new sample, then the schedule's queries."""
        self.sums += samples
        if not self.known:
            self.sumsq += samples * samples
        self.counts += 1
        if self.forget is not None:
            self.forget.add(t, samples)
        self.delivery.ask(t, *self.schedule.targets(t))  # (a, b) or on a graph (a, b, edges)

    def on_slots(self, t: int, samples: np.ndarray) -> None:
        """Slots t … t + k − 1 under RR: the samples, kept per slot for the windows that follow
        (summed in the order slot-by-slot `on_samples` sums them), then every slot's queries."""
        k, m = samples.shape
        self.view = self._batch_view  # (every slot of a batched run comes this way)
        self.view.advance(t, self.sums, None if self.known else self.sumsq, self.counts, samples)
        slots = np.arange(t, t + k)
        a, b, *edge = self.schedule.batch(slots)
        sent = np.repeat(slots, len(a) // k)
        payload = edge[0].astype(float) if edge else None
        ids = query_ids(sent, a, b, m)
        self.ctx.send("query", a, b, payload, at=sent.astype(float), ids=ids)

    # -- deliveries: answer queries, take releases -----------------------------------------
    def on_deliver(self, batch: Batch) -> None:
        """Answer the queries and take the releases delivered (`delivery`'s way)."""
        # a batch of one kind (the usual case) skips the other: no empty selection is made
        if batch.single_kind == _QUERY:
            queries, releases = batch, None
        elif batch.single_kind == _RELEASE:
            queries, releases = None, batch
        else:  # both kinds (a window's): one mask, two selections
            is_query = batch.kind == _QUERY
            queries, releases = batch.select(is_query), batch.select(~is_query)
        if self.follower is not None:  # a changed graph: messages of links gone are dropped
            queries, releases = self.follower.in_force(queries, releases, self.edge_column)
        if queries is not None and len(queries):
            self.delivery.answer(queries)
        if releases is not None and len(releases):
            self.delivery.receive(releases)

    def on_window_end(self) -> None:
        """Take the releases kept in the window that ends."""
        self.delivery.window_end()

    def release(
        self, b: np.ndarray, a: np.ndarray, pair: np.ndarray, slot: np.ndarray
    ) -> np.ndarray:
        """Payloads of new releases of agents b to agents a (distinct pairs `pair`; ASKED
        unset), with b's state after `slot` of the view. Under a budget, a release it does not
        admit is not made (``stop``: its row has j = 0, `withheld`, and the delivery sends
        nothing for it) or made with more noise (``degrade``: `ReleaseBudget`)."""
        if self.release_budget is None or not self.release_budget.binds:
            return self._release(b, a, pair, slot)
        return self.release_budget.release(b, a, pair, slot)

    def _release(
        self,
        b: np.ndarray,
        a: np.ndarray,
        pair: np.ndarray,
        slot: np.ndarray,
        scale: np.ndarray | None = None,
    ) -> np.ndarray:
        """Payloads of releases b → a that are made (`release`; `scale`: their new noise's
        multiple under ``degrade``)."""
        sums, sumsq, counts = self.view.own(b, slot)
        # the mechanisms' flat pair b·M + a; on a graph (or numbered by RR position) their pair
        # is the protocol's own, the edge's place in their square (the pair's place)
        own = self.graph is None and self.positions is None
        mech_pair = b * self._side + a if own else pair
        values, j, fresh = self.mech.release(None, None, sums, counts, scale, pair=mech_pair)
        # by column (Fortran order): each column is written here and read on arrival whole
        payload = np.empty((len(b), self.release_width), order="F")
        if self.params.variance == "sch-var-1":
            who, to = np.divmod(mech_pair, self._side)
            payload[:, VARIANCE] = self.var_release.release(
                who, to, j, fresh, sums, sumsq, counts, values
            )
        if self.graph is not None:
            payload[:, self.edge_column] = (
                self.graph.floats[pair] if isinstance(pair, slice) else pair
            )
        if self.adversaries is not None:  # what an adversary's release carries instead
            values = self.adversaries.report(b, values, sums / counts)
        payload[:, VALUE], payload[:, COUNT], payload[:, INDEX] = values, counts, j
        return payload

    def take(
        self, got: Arrivals, last: np.ndarray | None = None, taken: np.ndarray | None = None
    ) -> None:
        """Take releases from b to a (distinct pairs, each j above κ): T, V_{b→a}, the test.

        `last` is each pair's κ before these releases and `taken` the releases a took from b
        with these (unknown variances); both None when every j is κ + 1.
        """
        a, b, payload = got.a, got.b, got.payload
        values, t_b = payload[:, VALUE], payload[:, COUNT]
        j = payload[:, INDEX].astype(np.int64)
        pair = got.pair if got.pair is not None else self.pairs_of(a, b, payload, self.edge_column)
        if self.forget is not None:  # T^W and its (estimated) variance replace T's
            value, var = self.forget.take(a, b, pair, values, t_b, j)
            self.beliefs.revise_pairs(a, pair, self._test(a, b, value, var, t_b, got.slot))
            return
        if self.incremental:  # the terms these pairs contributed so far, to be replaced
            *old, current = _pair_terms(self, b, pair)
        # j_d of the pair: public arithmetic a release carries (the responder's rule), read here
        # from the responder's record, which is final for every node release j uses
        budget = self.release_budget
        degraded_from = None if budget is None else budget.degraded_from_of(pair)
        value, data, noise, n = self.stat.update(
            a, b, values, t_b, j, consecutive=last is None, pair=pair, degraded_from=degraded_from
        )
        if self.known:
            # on a graph σ_b² by pair: a slot's pairs are mostly contiguous, its b scattered
            sigma2 = (
                self.sigma2[b]
                if self.graph is None
                else self.graph.of_responders(self.sigma2, pair)
            )
            var = sigma2 * data + self.sigma2_dp * noise
            if not isinstance(n, float):  # (the scalar n = 1: x/1 is x, no pass needed)
                var /= n * n
            n_other = t_b
        else:
            k = j if last is None else taken  # releases taken (every one, without gaps)
            v_b = _data_variance(self, pair, payload, j, last, k)
            self.v_hat.ravel()[pair] = v_b
            var = (v_b * data + self.sigma2_dp * noise) / (n * n)  # data > 0: ∞ stays ∞
            n_other = t_b if self.params.welch_df == "printed" else k.astype(float)
        decision = self._test(a, b, value, var, n_other, got.slot)
        if self.incremental:
            self.sums_w.replace(a, *old, *contribution(decision, value, var))
        self.beliefs.revise_pairs(a, pair, decision, current if self.incremental else None)

    def _test(
        self,
        a: np.ndarray,
        b: np.ndarray,
        value: np.ndarray,
        var: np.ndarray,
        n_other: np.ndarray,
        slot: np.ndarray,
    ) -> np.ndarray:
        """χ_a(b) with a's state after `slot` of the view: the z-test of §III-C1 with known
        variances, the Welch t-test of §III-C2 (with V_a and V̂ar[T_{b→a}]) otherwise."""
        if self.forget is not None:  # (a's own window for X̄_a and V_a: `colme.forgetting`)
            return self.forget.accepts(a, value, var, self.view.clock(slot))
        if self.known:
            t = self.view.clock(slot)  # every agent has t samples (one per slot)
            own = self.view.sums_of(a, slot)
            return z_accepts(own, t, self.sigma2[a], value, var, self._z[t.astype(np.int64)])
        sums, sumsq, t = self.view.own(a, slot)
        theta = self._theta[t.astype(np.int64)]
        return welch_accepts(
            sums / t - value, sample_variance(sums, sumsq, t), t, var, n_other, theta
        )

    # -- estimates -------------------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        """μ_a of every agent: Lemma 4's inverse-variance combination (`model.combine`)."""
        if self.forget is not None:
            return self.forget.estimates(self.included, self.sigma2)
        local = self.sums / np.maximum(self.counts, 1)
        own_var = self.sigma2 if self.known else sample_variance(self.sums, self.sumsq, self.counts)
        with np.errstate(divide="ignore"):
            own = self.counts / own_var  # t/σ_a² (or t/V_a, eq. (5))
        if self.params.combination == "trimmed":  # (the pair state, whatever the population)
            pairs_num, pairs_den = trimmed_sums(*_row_terms(self, slice(None)), self.params.trim)
        elif self.incremental:
            pairs_num, pairs_den = self.sums_w.totals(self.row_sums)
        else:
            pairs_num, pairs_den = self.row_sums(slice(None))
        return combine(local, own, pairs_num, pairs_den)

    def row_sums(self, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}] over the b ≠ a that agents a in
        `rows` include, recomputed from the pair state (O(M) per row)."""
        if self.graph is not None:
            return edge_row_sums(self, rows)
        weight, value = _row_terms(self, rows)
        return (weight * value).sum(axis=1), weight.sum(axis=1)

    def adversary_state(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(which agents are adversaries, how many adversaries each agent includes in C_a), for
        the `adversaries` metric; None without an [adversaries] table."""
        if self.adversaries is None:
            return None
        mask = self.adversaries.mask
        if self.graph is None:
            accepted = self.included[:, mask].sum(axis=1) - (self.included.diagonal() & mask)
        else:
            kept = self.included & mask[self.graph.dst]
            accepted = np.bincount(self.graph.src[kept], minlength=len(mask))
        return mask, accepted

    def privacy_spend(self) -> Spend | None:
        """The releases so far, for the `privacy` ledger (None without noise).

        κ_{b→a} = `mech.count` counts b's releases to a when made, lost on a link or not.
        Agent b's first sample is its most exposed: it lies in one p-sum per querier under
        PM-I and, under PM-II, in one tree node per level that some release to a completed,
        ⌊log₂ κ⌋+1 of them; Sch-Var-1 adds a variance p-sum (same multiplier) to each.
        """
        if self.params.noise == "none":
            return None
        one, every = _per_responder(self, first_sample_psums)
        if self.params.variance == "sch-var-1":
            one, every = 2 * one, 2 * every
        m = self.multiplier
        against = {"one": (m, one), "all": (m, every)}
        if self.release_budget is not None:
            against = self.release_budget.spend(lambda f: _per_responder(self, f), one, every)
        return Spend(self.params.noise, self.params.delta, against, self.params.accountant)


# -- the protocol's arithmetic over its pair state (functions: the class stays readable) --


def _check_exact_peers(params: Any, data: Any) -> None:
    """Refuse plain ColME (no noise, known variances) on data where an agent's variance is 0:
    its releases would have Var[T] = 0, an infinite weight in Lemma 4's combination."""
    if params.noise != "none" or params.variance != "known" or "sigma2" not in data.public:
        return
    sigma2 = np.broadcast_to(np.asarray(data.public["sigma2"], dtype=float), (data.n_agents,))
    if (sigma2 > 0).all():
        return
    a = int(np.argmin(sigma2))
    who = data.public.get("agent_ids", range(data.n_agents))[a]
    raise ValueError(
        f"noise = 'none': agent {who!r} has known variance σ² = 0 (its samples never vary), so "
        "its releases would weigh infinitely in Lemma 4's combination; add noise "
        "(noise = 'gaussian' or 'laplace')"
    )


def _slot_runs(protocol: Any) -> bool:
    """Whether a slot's pairs may go as a slice rather than indices: RR on a graph over ideal
    links, with the state every rule of it reads by slice (``last`` PM-I, known variances, no
    budget)."""
    p = protocol.params
    return (
        protocol.graph is not None
        and p.schedule == "rr"
        and not protocol.asynchronous
        and protocol.known
        and (p.mechanism, p.weights, p.budget) == ("pm1", "last", None)
    )


def _per_responder(protocol: Any, per_pair: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per responder b, the most of `per_pair(mechanism, κ)` over its queriers and their
    sum, κ being each pair's releases made (`mech.count`)."""
    if protocol.graph is None:
        per = per_pair(protocol.params.mechanism, protocol.mech.count)
        if protocol.positions is not None:  # (rows by RR position, not by responder)
            return protocol.positions.per_responder(per)
        return per.max(axis=1), per.sum(axis=1)
    return responder_spend(protocol, per_pair)


def _data_variance(
    protocol: Any,
    pair: np.ndarray,
    payload: np.ndarray,
    j: np.ndarray,
    last: np.ndarray | None,
    k: np.ndarray,
) -> np.ndarray:
    """V_{b→a}: Sch-Var-1's released variance (a negative one means "unknown": +∞), or
    Sch-Var-2's estimate from the releases taken (`model.sch_var_2_estimate`)."""
    if protocol.params.variance == "sch-var-1":
        v_b = payload[:, VARIANCE]
        return np.where(v_b >= 0, v_b, np.inf)
    v_raw, k_noise, k = protocol.schvar2.update(
        pair, payload[:, VALUE], payload[:, COUNT], j, protocol.sigma2_dp, last, k
    )
    bayes = protocol.params.variance == "sch-var-2-bayes"
    return sch_var_2_estimate(v_raw, k_noise, k, bayes, protocol.params.prior)


def _pair_terms(
    protocol: Any, b: np.ndarray, pair: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The current terms T/Var[T] and 1/Var[T] of pairs `pair` (from b) in their querier's
    combination sums (0 for excluded pairs), from their statistic state as `estimates` computes
    them, and the pairs' χ_a(b) read for it."""
    stat = protocol.stat
    sigma2 = protocol.sigma2[b] if protocol.known else protocol.v_hat.ravel()[pair]
    if stat.compact and stat.mechanism == "pm1":
        # n is 0 or 1, so T = block sum/n and Var[T] = numerator/n² are the block sum and the
        # numerator themselves: `contribution`'s floats without forming n, T and the quotients
        taken, total, data, noise = stat.last_terms(pair)
        with np.errstate(invalid="ignore", divide="ignore"):
            num = sigma2 * data
            num += protocol.sigma2_dp * noise
            flat = protocol.beliefs.flat
            included = flat[pair] if isinstance(pair, slice) else flat.take(pair)
            weight = np.divide(1.0, num, out=np.zeros_like(num), where=included & taken)
        return weight * total, weight, included
    value, data, noise, n = stat.terms(pair)
    with np.errstate(invalid="ignore"):
        num = sigma2 * data + protocol.sigma2_dp * noise
    var = np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)
    included = protocol.beliefs.flat[pair]
    return *contribution(included, value, var), included


def _row_terms(protocol: Any, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """1/Var[T_{b→a}] of the b ≠ a that agents a in `rows` include (0 for the others) and
    T_{b→a}, one row per agent a."""
    sigma2 = protocol.sigma2[None, :] if protocol.known else protocol.v_hat[rows]
    var = protocol.stat.variance(sigma2, rows)
    positions = protocol.positions
    included = (
        protocol.included[rows]
        if positions is None
        else protocol.beliefs.flat[positions.querier_rows(rows)]
    )
    with np.errstate(divide="ignore"):
        weight = np.where(included, 1.0 / var, 0.0)
    agents = np.arange(len(protocol.sums))[rows]
    weight[np.arange(len(agents)), agents] = 0.0  # a itself
    return weight, protocol.stat.value_of(rows)


@PROTOCOLS.register("private-colme-oracle")
class PrivateColMEOracle(PrivateColME):
    """Private-ColME with the true classes instead of the z-test (the Prop. 3 oracle)."""

    uses_oracle = True

    def _test(
        self,
        a: np.ndarray,
        b: np.ndarray,
        value: np.ndarray,
        var: np.ndarray,
        n_other: np.ndarray,
        slot: np.ndarray,
    ) -> np.ndarray:
        classes = self.ctx.oracle_classes
        return classes[a] == classes[b]

    def _initially_included(self, ctx: Context) -> np.ndarray:
        """The oracle knows C_a from the start, so rRR never queries other classes."""
        c = ctx.oracle_classes
        if self.graph is not None:
            return c[self.graph.src] == c[self.graph.dst]
        return c[:, None] == c[None, :]


@METRICS.register("colme-async")
@records("repeated", "stale", "timed_out")
@applies_to(PrivateColME)
def asynchrony(protocol: Any, data: Any) -> dict[str, float]:
    """Private-ColME's releases lost to asynchrony, totals since the start.

    ``stale`` and ``timed_out`` count releases queriers discarded (older than one taken;
    answering a query sent more than `timeout` slots before), ``repeated`` answers re-sent
    unchanged because the responder had no new sample.
    """
    if not isinstance(protocol, PrivateColME):
        return {}
    return {
        "stale": float(protocol.stale.sum()),
        "timed_out": float(protocol.timed_out.sum()),
        "repeated": float(protocol.repeated.sum()),
    }
