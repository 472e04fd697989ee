"""C-ColME (Galante, Neglia, Leonardi) and Private-C-ColME (seed 001): consensus over a graph.

Agents sit on a communication graph G (`ctx.public["graph"]`, a `desim.topologies.graph.Graph`) and
talk only to their neighbours N_a. Every slot t, each agent a

1. takes its sample X_a^(t); with privacy it adds Laplace noise Z_a^(t) of variance
   σ_DP² = 8L²/ε² to it (Lemma 1 of seed 001 with n = 1), so its privatised running mean is
   X̃_a^(t) = x̄_a^(t) + (1/t) Σ_s Z_a^(s) (without privacy X̃_a = x̄_a);
2. sends ``state`` = (X̃_a^(t), t, Y_a^(t−1)) to every neighbour;
3. decides χ_a(b) for every neighbour b from privatised values only, by the optimistic
   distance (docs/papers.md §2.2, §3.4), the Bernstein test (§3.3) or, for ``rule = "oracle"``, the
   true classes; with ``symmetric`` it sends χ_a(b) to b (``decision``) and keeps
   C_a^(t) = {b : χ_a(b) ∧ χ_b(a)}, so that W is symmetric and doubly stochastic;
4. sends ``size`` = |C_a^(t)| to the neighbours it keeps, and mixes with the Metropolis-type
   weights of eq. (2), W_ab = 1/(1 + max(|C_a|, |C_b|)) for b ∈ C_a, W_aa = 1 − Σ_b W_ab;
5. updates Y_a^(t) = (1−α) X̃_a^(t) + α Σ_b W_ab Y_b^(t−1), with 1−α = min(1, c·s^(−p)) at
   age s = t − t_a^start (s = 1: α = 0), restarting its age when its neighbour set changes
   (``reset``), and reports Y_a^(t) — or its local mean when its estimated class component has
   1 or 2 agents (``fallback``, seed 001's last if-then-else, §3.6).

Everything an agent sends is computed from privatised values (docs/papers.md §3.2): X̃, and Y,
the decisions and |C| computed from X̃ and neighbours' messages. The raw running mean x̄_a is
used only for the agent's own, unshared fallback output.

Reconstructions (docs/papers.md §3), implemented as options with the defaults named
there: the α schedule c/s^p (default c = p = 1, Theorem 1's 1−α = 1/t); ``restart`` ``hard``
(α = 0 in the slot of the change: the literal reading of seed 001) or ``galante`` (α = 1/2 in
the next slot, as Galante's code); the Bernstein pair test (§3.3: σ_ab² = σ̃_a² + σ̃_b²,
β_ab = √k·max(β_a, β_b, σ_a, σ_b, β_DP, σ_DP) over the k = 2 or 4 independent terms of
X̃_a − X̃_b, exact or simplified threshold, θ_t = θ/ln(t+1)); the DP-adjusted optimistic distance
with σ̃² = σ² + σ_DP² (§3.4); the size-1-or-2 detector and its output (§3.6). Galante's
reset freeze once the simulator sees no wrong link uses the truth and is not reproduced.

Data Bernstein parameters β_a (Lemma 2 and the like): uniform σ√(3/20), Gaussian σ/2, Bernoulli
1/3 (|X − μ| ≤ 1); Laplace noise: β_DP = σ_DP/√2.

Under asynchrony (latency, losses, churn: `desim.kernel.links`), message handlers only store what
arrives, and every agent makes exactly one consensus step per slot, at the end of instant t (two
engine deadlines, `Context.call_at`): first C_a^(t) from its own χ_a and the last χ_b(a) it
received (restart, send |C_a|), then, once zero-latency sizes are delivered, the update. Per
directed edge a keeps b's newest state (X̃_b, t_b, Y_b) by t_b and, for ``values = "stale"``,
the one before it; a state older than the one held (non-FIFO links) is ignored, and so are
decisions and sizes older than those held (they carry their send time). The neighbour test runs
when a newer state arrives, on received values only, and χ_a(b) is sent then (``symmetric``);
a neighbour never heard from keeps its ``initial`` χ, and a stale test without a previous state
keeps b. The update mixes the kept neighbours heard from (t_b > 0) whose latest state is at most
``max_age`` slots old (t − t_b ≤ max_age), with the latest Y_b (that is Y_b^(t_b−1)) and the
latest |C_b| received (before any, |C_b| of ``initial``: deg b or 0). W_ab keeps a's own |C_a|
(kept, heard from or not), so W stays row-stochastic with W_aa ≥ 1/(1 + |C_a|) (Metropolis) or
1/(1 + max degree) and Y_a remains a convex combination of privatised running means: bounded, and
unbiased when every mixed neighbour shares a's mean. But W is no longer exactly symmetric: a may
exclude b for lack of recent data while b includes a, or weigh b with an outdated |C_b|. Its
column sums then differ from 1, so a step no longer preserves the network average of Y: agents
heard more often weigh more in the consensus, which costs variance (not bias) among agents of one
mean; and the Y_b^(t_b−1) mixed lags the synchronous Y_b^(t−1) by the age t − t_b. The fallback
is decided on C_a and the latest |C_b|, heard recently or not. With ideal links, or zero latency
and always-up links, every state of slot t arrives at t (t_b = t): the synchronous protocol,
bit for bit (the same operations in the same order).

Window-safe (exact delivery times, `desim.kernel.network`): what arrives between two instants
that matter comes as one time-ordered batch. The result of one instant at a time depends on the
order of arrivals only edge by edge — which state an edge holds and the one before it, whether
an irrevocable test ever failed, the last χ_a(b) for a retest — since an edge's test reads only
its own states, a's own running mean (fixed between ticks) and t. So a window's states are taken
in rounds, round k holding each edge's k-th delivery instant (all messages of that instant, as
its batch had them); each round files and tests its edges as those instants would, and the
decisions are told in the order single instants send them (time, then edge), each at its
delivery time. Decisions and sizes keep per edge the newest by send time (ties: the later
arrival), which a window's time-ordered batch gives as single instants do. The consensus step
runs at deadlines, which no window spans. Tests check the whole run bit for bit against one
message per instant.

Live-first (ideal links, irrevocable decisions): an edge a dropped never returns to C_a, so
nothing reads b's states on it again. Every edge still gets its state message in every slot
(message counts are results), but those of the edges still tested come first and carry values;
the others carry NaN (`_send_live_first`). The test runs on the edges still tested only, and Y_b
is gathered from the send by a cached index: the operations of the per-edge path on the same
values, over fewer edges, so the results are the same bit for bit (tests check it).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.protocol import Context, Protocol
from desim.kernel.registry import PROTOCOLS
from desim.models.baselines import Local
from desim.models.ccolme.model import (
    bernstein_keep,
    bernstein_threshold,  # noqa: F401  (re-exported: the formulas' former home)
    confidence_radius,  # noqa: F401  (re-exported)
    consensus_update,
    data_bernstein_parameter,
    edge_weight,
    metropolis_weights,  # noqa: F401  (re-exported)
    mix,
    one_minus_alpha,
    optimistic_keep,
    pair_parameters,
    row_sums,  # noqa: F401  (re-exported)
    small_component,
)
from desim.models.ccolme.params import CColMEParams, PrivateCColMEParams
from desim.models.privacy.accounting import Spend
from desim.models.privacy.calibration import laplace_scale
from desim.network_models.rowindex import RowIndex
from desim.topologies.graph import Graph

if TYPE_CHECKING:  # scipy.sparse is imported where used (mixing_matrix)
    import scipy.sparse as sp

#: Edge keys up to which `CColME._edge_slots` keeps a direct table (int32: 16 MiB).
_TABLE_KEYS = 1 << 22


def _common(x: np.ndarray) -> float | None:
    """The value every element of x shares, or None (also for an empty x)."""
    if len(x) == 0 or not (x == x[0]).all():
        return None
    return float(x[0])


def _newest(
    e: np.ndarray, stamp: np.ndarray, held: np.ndarray, strict: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Messages for edge slots e with time stamps: which ones to keep, per edge the newest.

    Messages not newer than the stamp `held` of their edge (strictly, or as new) are dropped.
    Returns the distinct edges left, the row of each one's newest message (ties: the last to
    arrive) and the row of the message just before it for that edge (−1 if none).
    """
    ok = stamp > held if strict else stamp >= held
    rows = np.flatnonzero(ok)
    if len(rows) <= 1:
        return e[rows], rows, np.full(len(rows), -1)
    order = rows[np.lexsort((stamp[rows], e[rows]))]  # by edge, then stamp; stable
    es = e[order]
    last = np.ones(len(es), dtype=bool)
    last[:-1] = es[1:] != es[:-1]
    pos = np.flatnonzero(last)
    has = (pos > 0) & (es[pos - 1] == es[pos])
    return es[pos], order[pos], np.where(has, order[pos - 1], -1)


class _SendTimes:
    """Per directed edge, the send time of the message a holds (decision or size), to ignore
    older ones; stored once when one send (all at one time) reached every edge, as in sync."""

    def __init__(self, n_edges: int) -> None:
        self._n = n_edges
        self._all: float | None = 0.0  # 0: the prior, before any message
        self._each = np.zeros(n_edges)

    def sent(self, e: np.ndarray, at: float) -> None:
        """The newest send, at time `at`, filled the distinct edge slots e."""
        if len(e) == self._n:
            self._all = at
        else:
            self.each[e] = at

    @property
    def each(self) -> np.ndarray:
        """The send time held for every edge (materialised; callers may write into it)."""
        if self._all is not None:
            self._each[:] = self._all
            self._all = None
        return self._each


# --------------------------------------------------------------------------------------------
# the protocol


@PROTOCOLS.register("c-colme")
class CColME(Protocol):
    """C-ColME (Galante et al.): consensus over estimated same-class neighbours of a graph."""

    Params = CColMEParams
    message_kinds = ("state", "decision", "size")
    #: Exact with windows: see `_states_in_window` (the kernel's contract in desim.kernel.protocol).
    window_safe: ClassVar[bool] = True
    #: The scenario must have a [topology]: the graph arrives as ctx.public["graph"].
    needs_topology: ClassVar[bool] = True

    def __init__(self, params: Any) -> None:
        super().__init__(params)
        # rule = "oracle" is the explicitly named oracle variant: only it sees the classes
        self.uses_oracle = params.rule == "oracle"

    # -- set-up ------------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        p = self.params
        g: Graph = ctx.public["graph"]
        if g.n != ctx.n_agents:
            raise ValueError(f"the graph has {g.n} agents, the data {ctx.n_agents}")
        if ctx.call_at is None:
            raise ValueError(
                "this engine gives no timers (Context.call_at); the consensus "
                "step runs at a deadline"
            )
        self.graph = g
        m, e = g.n, g.n_directed
        self.src, self.dst, self.reverse = g.src, g.dst, g.reverse
        self._keys = g.src * m + g.dst  # sorted (CSR order): finds an edge's slot
        self._slot_table: np.ndarray | RowIndex | None = None  # (`_edge_slots`)
        self._rows = g.degree > 0
        self._starts = g.indptr[:-1][self._rows]
        L = float(ctx.public["L"])
        self._L = L
        sigma2 = np.broadcast_to(np.asarray(ctx.public["sigma2"], dtype=float), (m,))
        private = p.noise == "laplace" and math.isfinite(p.epsilon)
        #: Laplace scale b = 2L/ε of the per-sample noise (0 without privacy).
        self.laplace_b = laplace_scale(L, p.epsilon) if private else 0.0
        #: σ_DP² = 2b² = 8L²/ε², the variance of each sample's noise.
        self.sigma2_dp = 2.0 * self.laplace_b**2
        self._noise = ctx.streams.get("dp-noise")
        #: σ̃_a² = σ_a² + σ_DP², the variance of a privatised sample.
        self.sigma2_tilde = sigma2 + self.sigma2_dp
        self._equal_var = bool(np.all(sigma2 == sigma2[0])) if m else True
        self._beta_data = data_bernstein_parameter(
            ctx.public.get("distribution", "uniform"), sigma2
        )
        self._sigma = np.sqrt(sigma2)
        self._gamma = p.delta / (4.0 * max(e, 1))
        self._w_const = 1.0 / (1.0 + (g.degree.max() if m else 0))

        # own state
        self.t = 0
        self.raw_sum = np.zeros(m)  # Σ X_a: never leaves the agent
        self.priv_sum = np.zeros(m)  # Σ (X_a + Z_a): what everything shared derives from
        self.y = np.zeros(m)  # Y_a, the consensus estimate
        self.start = np.zeros(m)  # t_a^start: age s = t − start (float: α needs no cast)
        # per directed edge e = (a, b), what a holds about its neighbour b: its last state
        # (X̃_b, t_b, Y_b) and, for values = "stale", the one before; t_b = 0: none yet
        self._nb_x, self._nb_n, self._nb_y = np.zeros(e), np.zeros(e), np.zeros(e)
        self._nb_x_prev, self._nb_n_prev = np.zeros(e), np.zeros(e)
        # t_b shared by every stored state (synchronous agents), None when they differ
        self._nb_n_all: float | None = 0.0
        self._nb_n_prev_all: float | None = 0.0
        self.chi = np.full(e, p.initial == "all")  # χ_a(b), a's own decision
        self.their_chi = self.chi.copy()  # χ_b(a), as b told a
        self.their_chi_at = _SendTimes(e)  # when b sent it (0: the prior `initial`)
        self.kept = self.chi.copy()  # C_a as a boolean per edge
        self.size = self._count(self.kept)  # |C_a|
        self._nb_size = self.size[self.dst].astype(float)  # |C_b| as b told a (`nb_size`)
        self.nb_size_at = _SendTimes(e)  # the slot b sent it in (0: the prior)
        # ideal links deliver every send whole, at once and in order: no send times to keep
        self._in_order = ctx.links is None or ctx.links.ideal
        self._kept_idx = np.flatnonzero(self.kept)
        # the edges of the last consensus step and their weights W_ab (for mixing_matrix)
        self._mixed_idx: np.ndarray = np.empty(0, dtype=np.int64)
        self._w: np.ndarray | float = 0.0
        self._fallback = np.zeros(m, dtype=bool)
        self._unchanged = np.zeros(m, dtype=bool)
        self._unchanged.flags.writeable = False
        self._changed = self._unchanged  # C_a changed in this slot
        self._agents = np.arange(m)
        #: r when every agent has r ≥ 1 neighbours (r-regular: rows of r edges)
        self._degree = (
            int(g.degree[0]) if m and g.degree[0] > 0 and np.all(g.degree == g.degree[0]) else None
        )
        #: X̃_a^(t) = priv_sum / t, the privatised running mean of this slot
        self._mean = np.zeros(m)
        # Caches of the consensus step, valid while C (all agents' kept sets) is unchanged.
        # `_size_send`: (sender, receiver) of the size messages (None once C moved), and
        # `_sent_key` the one of the latest send; `_heard`: (slots, |C_b| column, its
        # _size_send) of the latest size send when it arrived whole (nb_size[slots] is that
        # column: written into `_nb_size` only when read, or for the edges C drops); `_w_cache`:
        # (the _size_send, W_ab) of the last update that mixed exactly those sizes.
        self._size_send: tuple[np.ndarray, np.ndarray] | None = None
        self._sent_key: tuple[np.ndarray, np.ndarray] | None = None
        self._heard: tuple[np.ndarray, np.ndarray, Any] | None = None
        self._heard_filed = True
        self._starts_of: tuple[np.ndarray, tuple[np.ndarray, np.ndarray]] | None = None
        # Ideal links deliver every send at once, so the state payload of slot t − 3 is held by
        # nobody at slot t (a keeps t − 1's and t − 2's states): three buffers in turn save
        # fresh pages (the faults cost more than the gathers that fill them)
        self._state_buffers: list[np.ndarray] = []
        self._size_payload: np.ndarray | None = None
        self._size_buffers: list[np.ndarray] = []
        if self._in_order:  # per edge: |C_b| (float) and eq. (2)'s W_ab, updated where C moves
            self._size_dst = self.size[self.dst].astype(float)
            self._w_full = edge_weight(self.size[self.src], self._size_dst)
        self._w_cache: tuple[Any, np.ndarray | float] | None = None
        self._sent: dict[str, tuple[np.ndarray, np.ndarray | slice]] = {}
        # Live-first state sends (ideal links, irrevocable decisions; see `_send_live_first`):
        # S, the edges whose states carry values (CSR order, a superset of χ), and χ over S
        self._live_first = self._in_order and p.decisions == "irrevocable"
        self._sent_set = self._kept_idx
        self._alive = np.ones(len(self._sent_set), dtype=bool)
        self._dead_in_set = 0  # edges of S dropped for good since S was last compacted
        self._died = self._kept_idx[:0]  # edges dropped for good in this slot's test
        # (S, its message senders, receivers, slots) of the live-first send
        self._state_send: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._nan_from: dict[int, int] = {}  # per state buffer: rows from here on are NaN
        # the newest and the previous live-first send as a holds them: (S, X̃_b, Y_b) over S
        self._held = (self._sent_set, self._nb_x, self._nb_y)
        self._held_prev = (self._sent_set, self._nb_x_prev)
        # positions of one edge set within a larger one, for the two latest pairs (`_within`)
        self._within_cache: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._sends_sizes = p.weights == "metropolis" or p.fallback != "none"
        self._handlers = (self._on_state, self._on_decision, self._on_size)
        if self.uses_oracle:
            cls = ctx.oracle_classes
            self._oracle_chi = cls[g.src] == cls[g.dst]

    def _count(self, mask: np.ndarray) -> np.ndarray:
        """Number of True edges of each agent (CSR rows)."""
        if len(self._starts) == self.graph.n:  # nobody isolated: one call
            return np.add.reduceat(mask, self._starts, dtype=np.int64)
        out = np.zeros(self.graph.n, dtype=np.int64)
        if len(self._starts):
            out[self._rows] = np.add.reduceat(mask, self._starts, dtype=np.int64)
        return out

    # -- slot: sample, privatise, share ------------------------------------------------------
    def privatise(self, samples: np.ndarray) -> np.ndarray:
        """X_a + Z_a with Z_a ~ Laplace(0, 2L/ε) drawn from ``dp-noise`` (X_a without privacy)."""
        if self.laplace_b == 0.0:
            return samples
        return samples + self._noise.laplace(0.0, self.laplace_b, size=len(samples))

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.t = t
        self.raw_sum += samples
        self.priv_sum += self.privatise(samples)
        self._mean = self.priv_sum / t
        # message e carries the state of b = dst[e] to a = src[e], filed in a's slot e;
        # columns are contiguous (the transpose of a C array) for the receiver's arithmetic;
        # mode="clip" (the indices are valid): "raise" would gather into a buffered copy
        payload = self._state_payload()
        if self._live_first:
            self._send_live_first(payload)
        else:
            np.take(self._mean, self.dst, out=payload[:, 0], mode="clip")
            payload[:, 1] = t
            np.take(self.y, self.dst, out=payload[:, 2], mode="clip")
            self._send("state", self.dst, self.src, payload, slice(None))
        # the slot's consensus step, after this instant's deliveries (whatever arrived)
        self.ctx.call_at(t, self._decided)

    def _state_payload(self) -> np.ndarray:
        """An (edges × 3) array for this slot's states, columns contiguous."""
        if not self._in_order:
            return np.empty((3, self.graph.n_directed)).T
        if not self._state_buffers:
            self._state_buffers = [np.empty((3, self.graph.n_directed)).T for _ in range(3)]
        self._state_buffers.append(self._state_buffers.pop(0))  # the oldest, in turn
        return self._state_buffers[-1]

    def _send_live_first(self, payload: np.ndarray) -> None:
        """This slot's states, live first: the messages of the edges of S come first and carry
        (X̃_b, t, Y_b), those of the other edges, dropped for good, carry NaN.

        Under irrevocable decisions an edge a dropped never returns to χ_a, and its states are
        never read again: the test runs on χ_a's edges only (it could only confirm the drop),
        and a mixes only kept edges. So only their values are gathered; every edge still gets
        its message (the counts are results), in the order S, then the others. S is χ as of
        its last compaction: it holds the edges dropped since then until they are an eighth
        of it (their values are sent and not read), so that S, its message order and the
        index arrays built from it change a few times per run, not in every slot with a drop.
        """
        if self._dead_in_set * 8 > len(self._sent_set):  # compact S to χ's edges
            # (C = χ without symmetric: then the kept edges are these already, as an array)
            keep = self._sent_set[self._alive] if self.params.symmetric else self._kept_idx
            self._seed_within(keep, self._sent_set, np.flatnonzero(self._alive))
            self._sent_set, self._alive, self._dead_in_set = keep, np.ones(len(keep), bool), 0
        s = self._sent_set
        if self._state_send is None or self._state_send[0] is not s:
            rest = np.ones(self.graph.n_directed, dtype=bool)
            rest[s] = False
            order = np.concatenate([s, np.flatnonzero(rest)])
            self._state_send = (s, self.dst[order], self.src[order], order)
        _, sender, receiver, slots = self._state_send
        k = len(s)
        np.take(self._mean, sender[:k], out=payload[:k, 0], mode="clip")
        payload[:k, 1] = self.t
        np.take(self.y, sender[:k], out=payload[:k, 2], mode="clip")
        nan_from = self._nan_from.get(id(payload), self.graph.n_directed)
        if k < nan_from:  # the buffer's rows past S (S only shrinks): NaN, once
            payload[k:nan_from] = np.nan
            self._nan_from[id(payload)] = k
        self._send("state", sender, receiver, payload, slots)

    def _on_live_states(self, x: np.ndarray, y: np.ndarray) -> None:
        """A live-first send of this slot, whole: hold its columns over S, test χ's edges."""
        s = self._sent_set
        k = len(s)
        self._held_prev = self._held[:2]
        self._held = (s, x[:k], y[:k])
        self._nb_n_prev_all, self._nb_n_all = self._nb_n_all, float(self.t)
        keep = self._rule(s)
        keep &= self._alive  # irrevocable: an edge of S dropped before stays dropped
        died = self._alive & ~keep
        if died.any():
            self._died = s[died]
            self.chi[self._died] = False
            self._alive = keep
            self._dead_in_set += len(self._died)
        if self.params.symmetric:  # χ_a(b) told on every edge, as a slot's tests tell it
            self._tell(slice(None), self.chi, self.ctx.now())

    def _within(self, idx: np.ndarray, s: np.ndarray) -> np.ndarray:
        """The positions in the sorted edge set s of the edges idx (a subset of s): cached for
        the two latest pairs, which the next slots ask for again."""
        for cached in self._within_cache:
            if cached[0] is idx and cached[1] is s:
                return cached[2]
        pos = np.searchsorted(s, idx)
        self._seed_within(idx, s, pos)
        return pos

    def _seed_within(self, idx: np.ndarray, s: np.ndarray, pos: np.ndarray) -> None:
        """Remember that the edges idx sit at positions pos of the edge set s."""
        self._within_cache = [(idx, s, pos), *self._within_cache[:1]]

    def _held_y(self, idx: np.ndarray) -> np.ndarray:
        """Live-first: Y_b of the newest send on the edges idx (a subset of its S), gathered
        by a cached index (no gather while no edge was dropped since S was compacted)."""
        s, _, y = self._held
        return y if idx is s else y.take(self._within(idx, s))

    def _per_edge(self, s: np.ndarray, values: np.ndarray | float | None) -> np.ndarray:
        """Live-first: values over the edge set s as an array over every edge (NaN off s)."""
        out = np.full(self.graph.n_directed, np.nan)
        out[s] = values
        return out

    @property
    def nb_x(self) -> np.ndarray:
        """X̃_b of b's newest state held by a, per directed edge (a's slot); NaN where the
        message carried none (live-first: edges dropped for good)."""
        return self._per_edge(*self._held[:2]) if self._live_first else self._nb_x

    @property
    def nb_n(self) -> np.ndarray:
        """t_b of b's newest state held by a (0: none yet), per directed edge (live-first: the
        slot of the latest send, which reached every edge, with values or not)."""
        if self._live_first:
            return np.full(self.graph.n_directed, self._nb_n_all)
        return self._nb_n

    @property
    def nb_y(self) -> np.ndarray:
        """Y_b (that is Y_b^(t_b − 1)) of b's newest state held by a, per directed edge."""
        return self._per_edge(self._held[0], self._held[2]) if self._live_first else self._nb_y

    @property
    def nb_x_prev(self) -> np.ndarray:
        """X̃_b of the state before b's newest, per directed edge (``values = "stale"``)."""
        return self._per_edge(*self._held_prev) if self._live_first else self._nb_x_prev

    @property
    def nb_n_prev(self) -> np.ndarray:
        """t_b of the state before b's newest, per directed edge."""
        if self._live_first:
            return np.full(self.graph.n_directed, self._nb_n_prev_all)
        return self._nb_n_prev

    def _leave_live_first(self) -> None:
        """Hold per-edge arrays from now on (a state send that did not arrive whole, which
        ideal links never do): the per-edge path, NaN values held on edges dropped for good."""
        self._nb_x, self._nb_n, self._nb_y = self.nb_x, self.nb_n, self.nb_y
        self._nb_x_prev, self._nb_n_prev = self.nb_x_prev, self.nb_n_prev
        self._live_first = False

    def _send(
        self,
        kind: str,
        src: np.ndarray,
        dst: np.ndarray,
        payload: np.ndarray,
        slots: np.ndarray | slice,
    ) -> None:
        """Send and remember which receiver slots the messages fill (for the fast path)."""
        self._sent[kind] = (src, slots)
        self.ctx.send(kind, src, dst, payload)

    def _slots(self, batch: Batch, kind: str) -> tuple[np.ndarray | slice, bool]:
        """The receiver's edge slot of every message of `batch` (receiver dst, sender src), and
        whether the batch is the last send of its kind as sent (so the newest of its kind)."""
        src, slots = self._sent.get(kind, (None, None))
        if batch.src is src:  # delivered as sent (e.g. ideal links): no lookup needed
            return slots, True
        return self._edge_slots(batch.dst * self.graph.n + batch.src), False

    def _edge_slots(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each edge key a·n + b (receiver a, sender b): a direct table up to 2²²
        keys (16 MiB), else a hash index, built at the first call — several times faster than a
        binary search of the sorted keys on a window's 10⁴–10⁵ messages."""
        if self._slot_table is None:
            n = self.graph.n
            if n * n <= _TABLE_KEYS:
                self._slot_table = np.full(n * n, -1, dtype=np.int32)
                self._slot_table[self._keys] = np.arange(len(self._keys), dtype=np.int32)
            else:
                self._slot_table = RowIndex()  # rows in order of adding: the slots
                self._slot_table.add(self._keys)
        if isinstance(self._slot_table, RowIndex):
            return self._slot_table.find(keys)
        return self._slot_table[keys].astype(np.int64)

    # -- deliveries: store what arrived ----------------------------------------------------
    def on_deliver(self, batch: Batch) -> None:
        if batch.only >= 0:  # one kind (always so with ideal links): no need to split
            self._handlers[batch.only](batch)
            return
        for kind, handle in zip(self.message_kinds, self._handlers, strict=True):
            part = batch.of_kind(kind)
            if len(part):
                handle(part)

    def _on_state(self, batch: Batch) -> None:
        e, as_sent = self._slots(batch, "state")
        x, n, y = batch.payload[:, 0], batch.payload[:, 1], batch.payload[:, 2]
        if self._live_first:
            if as_sent:  # in order, every send arrives whole, at once
                self._on_live_states(x, y)
                return
            self._leave_live_first()
        if batch.delivered_at is not None:  # a window's, with exact times (window_safe)
            if isinstance(e, slice):
                e = np.arange(self.graph.n_directed)[e]
            self._states_in_window(e, x, n, y, batch.delivered_at)
            return
        if isinstance(e, slice) and len(n) and n[0] > self._newest_state():
            # every neighbour's state of one slot, newer than all held: keep the columns
            self._nb_x_prev, self._nb_n_prev = self._nb_x, self._nb_n
            self._nb_n_prev_all = self._nb_n_all
            self._nb_x, self._nb_n, self._nb_y = x, n, y
            self._nb_n_all = float(n[0])
        else:
            if isinstance(e, slice):
                e = np.arange(self.graph.n_directed)[e]
            e, _ = self._store_states(e, x, n, y)
            if len(e) == 0:
                return
        chi = self._decide(e)
        if self.params.symmetric:
            self._tell(e, chi, self.ctx.now())

    def _decide(self, e: np.ndarray | slice) -> np.ndarray:
        """Test the edges e (just given newer states) and file a's decisions χ_a(b)."""
        chi = self._rule(e)
        if self.params.decisions == "irrevocable":
            chi &= self.chi[e]
        self.chi[e] = chi
        return chi

    def _tell(self, e: np.ndarray | slice, chi: np.ndarray, at: float | np.ndarray) -> None:
        """a = src[e] tells b = dst[e] χ_a(b), with the time it decided (`at`, ascending: in a
        window, the delivery times of the states tested); b files it in reverse[e]."""
        payload = np.empty((2, len(chi))).T  # contiguous columns, as for states
        payload[:, 0] = chi
        payload[:, 1] = at
        src = self.src[e]
        self._sent["decision"] = (src, self.reverse[e])
        if isinstance(at, np.ndarray):
            self.ctx.send("decision", src, self.dst[e], payload, at=at)
        else:
            self.ctx.send("decision", src, self.dst[e], payload)

    def _states_in_window(
        self, e: np.ndarray, x: np.ndarray, n: np.ndarray, y: np.ndarray, at: np.ndarray
    ) -> None:
        """A window's states, sorted by delivery time `at`: filed and tested as single
        instants would. Edges are independent (each has its own held states and χ), so each
        edge's instants are taken in time order, in rounds: round k holds the k-th delivery
        instant of every edge that has one, all messages of that instant together (as one
        instant's batch, in send order). The decisions are told in the order single instants
        send them (by time, then edge), each at its instant."""
        by_edge = np.argsort(e, kind="stable")  # edge, then delivery time, then send order
        es, ts = e[by_edge], at[by_edge]
        new_edge = np.ones(len(es), dtype=bool)
        new_edge[1:] = es[1:] != es[:-1]
        instant = new_edge.copy()
        instant[1:] |= ts[1:] != ts[:-1]
        group = np.cumsum(instant) - 1
        first = group[new_edge][np.cumsum(new_edge) - 1]  # first group of each one's edge
        rounds = np.empty(len(e), dtype=np.int64)
        rounds[by_edge] = group - first
        told = []
        for k in range(int(rounds.max()) + 1):
            sel = np.flatnonzero(rounds == k)  # delivery order
            edges, rows = self._store_states(e[sel], x[sel], n[sel], y[sel])
            if len(edges):
                chi = self._decide(edges)
                told.append((at[sel][rows], edges, chi))
        if self.params.symmetric and told:
            when, edges, chi = (np.concatenate(part) for part in zip(*told, strict=True))
            order = np.lexsort((edges, when))
            self._tell(edges[order], chi[order], when[order])

    def _newest_state(self) -> float:
        """The largest t_b of every state held (0 when none)."""
        if self._nb_n_all is not None:
            return self._nb_n_all
        return float(self._nb_n.max())

    def _store_states(
        self, e: np.ndarray, x: np.ndarray, n: np.ndarray, y: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """File states (x, n, y) in the edge slots e, keeping per edge the newest two by t_b.

        Returns the edges that got a newer state (older ones than held are ignored) and the row
        of each one's newest. In place and O(len(e)): with spread latencies batches are small
        and many.
        """
        edges, rows, before = _newest(e, n, self._nb_n[e], strict=True)
        if len(edges) == 0:
            return edges, rows
        # the state this one replaces: an older one of this batch, or the newest held
        had = before >= 0
        self._nb_x_prev[edges] = np.where(had, x[before], self._nb_x[edges])
        self._nb_n_prev[edges] = np.where(had, n[before], self._nb_n[edges])
        self._nb_x[edges], self._nb_n[edges], self._nb_y[edges] = x[rows], n[rows], y[rows]
        self._nb_n_prev_all = self._nb_n_all = None
        return edges, rows

    def _on_decision(self, batch: Batch) -> None:
        e, as_sent = self._slots(batch, "decision")
        chi, at = batch.payload[:, 0] > 0.5, batch.payload[:, 1]
        if as_sent:  # the last send, so the newest: one send time for all
            self.their_chi[e] = chi
            if not self._in_order:
                self.their_chi_at.sent(e, float(at[0]))
            return
        # keep per edge the newest decision (by send time), drop older ones
        times = self.their_chi_at.each
        e, rows, _ = _newest(e, at, times[e], strict=False)
        self.their_chi[e], times[e] = chi[rows], at[rows]

    def _on_size(self, batch: Batch) -> None:
        e, as_sent = self._slots(batch, "size")
        size, at = batch.payload[:, 0], batch.payload[:, 1]
        if as_sent:
            if not self._heard_filed and self._heard[0] is not e:  # type: ignore[index]
                self._file_heard()  # the new sizes do not cover the same slots
            self._heard, self._heard_filed = (e, size, self._sent_key), False
            if not self._in_order:
                self.nb_size_at.sent(e, float(at[0]))
            return
        self._file_heard()
        self._heard = None
        times = self.nb_size_at.each
        e, rows, _ = _newest(e, at, times[e], strict=False)
        self._nb_size[e], times[e] = size[rows], at[rows]

    def _refresh_edges(self, agents: np.ndarray) -> None:
        """In order: after |C_a| changed for `agents`, recompute |C_b| (`_size_dst`) and, for
        Metropolis weights, W_ab = 1/(1 + max(|C_a|, |C_b|)) (`_w_full`) on the edges that
        touch them (their own rows and the reverse edges): the floats eq. (2) gives for all."""
        g = self.graph
        deg = g.degree[agents]
        first = g.indptr[agents]
        own = np.repeat(first - (np.cumsum(deg) - deg), deg) + np.arange(int(deg.sum()))
        e = np.concatenate([own, self.reverse[own]])
        self._size_dst[e] = self.size[self.dst[e]]
        if self.params.weights == "metropolis":
            self._w_full[e] = edge_weight(self.size[self.src[e]], self._size_dst[e])

    def _file_dropped(self, gone: np.ndarray) -> None:
        """C changed (in order, before this slot's size send): file the sizes last heard only
        for the edges dropped from C, the `gone`; the send about to arrive at once overwrites
        every other slot they filled."""
        heard = self._heard
        if self._heard_filed or heard is None or heard[0] is not self._kept_idx:
            return
        self._nb_size[gone] = heard[1][np.searchsorted(heard[0], gone)]
        self._heard_filed = True

    def _size_buffer(self, k: int) -> np.ndarray:
        """A (k × 2) array for a size send, columns contiguous; in order, one of two buffers in
        turn (the other holds the sizes last heard, not yet filed)."""
        if not self._in_order:
            return np.empty((2, k)).T
        if not self._size_buffers:
            self._size_buffers = [np.empty((2, self.graph.n_directed)) for _ in range(2)]
        self._size_buffers.reverse()
        return self._size_buffers[0][:, :k].T

    @property
    def nb_size(self) -> np.ndarray:
        """|C_b| as b told a, per directed edge (a's slot)."""
        self._file_heard()
        return self._nb_size

    def _file_heard(self) -> None:
        """Write the sizes of the latest whole send into `_nb_size` (if not done yet)."""
        if not self._heard_filed:
            e, size, _ = self._heard  # type: ignore[misc]
            self._nb_size[e] = size
            self._heard_filed = True

    # -- the slot's consensus step (deadlines at the end of instant t) -----------------------
    def _decided(self) -> None:
        """C_a^(t) from χ_a and the last χ_b(a): restart ages where it changed, tell kept
        neighbours |C_a|, then update (once sizes sent with zero latency are delivered)."""
        live = self._live_first and not self.params.symmetric
        if live:  # C_a = χ_a: the only flips are the drops of this slot's test
            flipped, self._died = self._died, self._died[:0]
            kept = self.kept
            kept[flipped] = False
        else:
            kept = self.chi & self.their_chi if self.params.symmetric else self.chi.copy()
            flips = kept != self.kept
            self.kept = kept
            flipped = np.flatnonzero(flips) if flips.any() else self._died[:0]
        if len(flipped):  # else |C_a|, the kept edges and the caches stay as they are
            # few: |C_a| and "changed" follow from them
            owner = self.src[flipped]
            self._changed = np.zeros(self.graph.n, dtype=bool)
            self._changed[owner] = True
            self.size = self.size.copy()
            np.add.at(self.size, owner, np.where(kept[flipped], 1, -1))
            if self._in_order:
                self._file_dropped(flipped[~kept[flipped]])
                self._refresh_edges(np.flatnonzero(self._changed))
            if live:  # χ's edges: those of S still alive, at known positions of S
                s = self._sent_set
                self._kept_idx = s[self._alive]
                self._seed_within(self._kept_idx, s, np.flatnonzero(self._alive))
            else:
                self._kept_idx = np.flatnonzero(kept)
            self._size_send = None
        else:
            self._changed = self._unchanged
        if self.params.restart == "hard":
            self._restart(self._changed)
        if not self._sends_sizes or len(self._kept_idx) == 0:
            self._update()
            return
        # b = dst[idx] tells a = src[idx] its |C_b| of slot t, filed in a's slot idx
        if self._size_send is None:
            sender = self.dst[self._kept_idx]
            receiver = np.repeat(self._agents, self.size)  # src[idx]: idx is in CSR order
            self._size_send = (sender, receiver)
        sender, receiver = self._size_send
        if not self._in_order:  # a late batch of an earlier send must not pass for this one
            sender, receiver = sender.copy(), receiver.copy()
        payload = self._size_payload
        if payload is None or self._sent_key is not self._size_send:
            payload = self._size_buffer(len(sender))
            if self._in_order:  # |C_b| per edge, kept up to date: a gather in CSR order
                np.take(self._size_dst, self._kept_idx, out=payload[:, 0], mode="clip")
            else:
                payload[:, 0] = self.size[sender]
        # in order (ideal links) and unchanged: the last payload, delivered at once and read
        # only for its sizes (not its send times), is taken again
        self._size_payload = payload if self._in_order else None
        payload[:, 1] = self.t
        self._sent_key = self._size_send
        self._send("size", sender, receiver, payload, self._kept_idx)
        self.ctx.call_at(self.t, self._update)

    # -- neighbour test ----------------------------------------------------------------------
    def _rule(self, e: np.ndarray | slice) -> np.ndarray:
        """χ_a(b) for the edges e (a = src[e], b = dst[e]) from privatised values only."""
        if self.uses_oracle:
            return self._oracle_chi[e].copy()
        x_b, n_all, n_b = self._held_states(e)
        if n_all is None:  # states of different ages held; maybe not on these edges
            n_all = _common(n_b)
        if n_all == 0.0:  # nothing from these neighbours yet (stale, t = 1): keep them all
            return np.ones(len(x_b), dtype=bool)
        a, b = self._ends(e)
        n_a = float(self.t)
        # |X̃_a − X̃_b|, in place; every edge: CSR order, a = src, agents' rows
        if isinstance(e, slice) or (self._live_first and len(e) == self.graph.n_directed):
            # r-regular: a scalar count repeats faster
            diff = np.repeat(self._mean, self._degree or self.graph.degree)
        else:
            diff = self._mean.take(a)
        np.subtract(diff, x_b, out=diff)
        np.abs(diff, out=diff)
        if n_all is None:  # states of different ages; none yet (t_b = 0) counts as a keep
            unknown = n_b == 0
            n_b = np.where(unknown, n_a, n_b)
        else:
            unknown, n_b = None, n_all
        p = self.params
        if p.rule == "optimistic":
            keep = optimistic_keep(diff, n_a, n_b, self._s2(a), self._s2(b), self._gamma)
        else:
            s2, beta = self._pair(a, b)
            exact = p.threshold == "exact"
            n = np.minimum(n_a, n_b)
            keep = bernstein_keep(diff, n, s2, beta, p.theta, p.threshold_scale, exact)
        return keep if unknown is None else keep | unknown

    def _held_states(
        self, e: np.ndarray | slice
    ) -> tuple[np.ndarray, float | None, np.ndarray | float | None]:
        """(X̃_b, t_b shared by all or None, t_b) of the states the test reads on edges e: the
        newest (``values = "fresh"``) or the one before (``"stale"``). Live-first, e is S."""
        fresh = self.params.values == "fresh"
        if self._live_first:  # the columns of the sends over their S (which holds e)
            s, x = self._held[:2] if fresh else self._held_prev
            n_all = self._nb_n_all if fresh else self._nb_n_prev_all
            return (x if s is e else x.take(self._within(e, s))), n_all, n_all
        if fresh:
            return self._nb_x[e], self._nb_n_all, self._nb_n[e]
        return self._nb_x_prev[e], self._nb_n_prev_all, self._nb_n_prev[e]

    def _ends(self, e: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) = (src[e], dst[e]); live-first, e is S and they are its send's receivers
        and senders (no gather)."""
        send = self._state_send
        if send is not None and send[0] is e:
            return send[2][: len(e)], send[1][: len(e)]
        return self.src[e], self.dst[e]

    def _s2(self, agents: np.ndarray) -> np.ndarray | float:
        """σ̃² of the given agents (one float when all agents share it)."""
        return float(self.sigma2_tilde[0]) if self._equal_var else self.sigma2_tilde[agents]

    def _pair(self, a: np.ndarray, b: np.ndarray) -> tuple[Any, Any]:
        """(σ_ab², β_ab) of the Bernstein pair test for the edges (a, b)."""
        if self._equal_var:
            s2, beta, sigma = (
                float(v[0]) for v in (self.sigma2_tilde, self._beta_data, self._sigma)
            )
            return pair_parameters(s2, s2, beta, beta, sigma, sigma, self.sigma2_dp)
        st, bd, sg = self.sigma2_tilde, self._beta_data, self._sigma
        return pair_parameters(st[a], st[b], bd[a], bd[b], sg[a], sg[b], self.sigma2_dp)

    # -- consensus step ----------------------------------------------------------------------
    def _restart(self, changed: np.ndarray) -> None:
        """Reset the age s of agents whose C_a changed (or of everyone, for a global reset)."""
        reset = self.params.reset
        if reset == "agent":
            self.start[changed] = self.t - 1
        elif reset == "global" and changed.any():
            self.start[:] = self.t - 1

    def _mixed(self) -> tuple[np.ndarray, np.ndarray]:
        """The kept edges a mixes over in slot t (heard from, at most max_age slots old), in
        CSR order, and how many each agent has."""
        n_all, max_age = self._nb_n_all, self.params.max_age
        if n_all is not None and n_all > 0 and self.t - n_all <= max_age:
            return self._kept_idx, self.size  # every state of one slot: all kept are mixed
        nb_n = self.nb_n  # (live-first: derived from the latest send, held per edge otherwise)
        mixed = self.kept & (nb_n > 0)
        if math.isfinite(max_age):
            mixed &= self.t - nb_n <= max_age
        return np.flatnonzero(mixed), self._count(mixed)

    def _update(self) -> None:
        """Y_a ← (1−α) X̃_a + α (W_aa Y_a + Σ_b W_ab Y_b), then the fallback decision."""
        p = self.params
        m = self.graph.n
        idx, counts = self._mixed()
        every = len(idx) == self.graph.n_directed  # every link mixed: no need to compress
        if self._live_first:
            nb_y = self._held_y(idx)
        else:
            nb_y = self._nb_y if every else self._nb_y[idx]
        self._mixed_idx, self._w = idx, self._mixing_weights(idx, counts, every)
        # W_aa Y_a + Σ_b W_ab Y_b = Y_a + Σ_b W_ab (Y_b − Y_a) over the mixed b ∈ C_a; they are
        # in CSR order, so agent a's are the `counts[a]` consecutive ones
        rows, starts = self._row_starts(counts)
        mixed = mix(self.y, nb_y, self._w, counts, rows, starts)
        oma = one_minus_alpha(self.t - self.start, p.alpha_c, p.alpha_p)
        self.y = consensus_update(self._mean, mixed, oma)
        if p.restart == "galante":
            self._restart(self._changed)
        if p.fallback != "none":
            size = self.size
            if idx is not self._kept_idx:  # C̃_a is about the kept b, heard recently or not
                rows = size > 0
                starts = np.cumsum(size)[rows] - size[rows]
                nb_size = self.nb_size[self._kept_idx]
            else:
                nb_size = self._sizes_heard(idx, every)
            # |C̃_a| = 1: nobody kept; = 2: one neighbour b kept, and b keeps only a
            single = np.zeros(m)
            if len(starts):
                single[rows] = np.add.reduceat(nb_size, starts)
            self._fallback = small_component(size, single)

    def _row_starts(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(counts > 0, where each such agent's run of `counts` consecutive edges starts)."""
        if self._starts_of is not None and self._starts_of[0] is counts:  # |C| unchanged
            return self._starts_of[1]
        rows = counts > 0
        out = rows, np.cumsum(counts)[rows] - counts[rows]
        self._starts_of = (counts, out)
        return out

    def _mixing_weights(
        self, idx: np.ndarray, counts: np.ndarray, every: bool
    ) -> np.ndarray | float:
        """W_ab of the mixed edges idx (CSR order, `counts` per agent) given |C_b| as each b
        told: eq. (2) with a's own |C_a|, or 1/(1+d)."""
        if self.params.weights != "metropolis":
            return self._w_const
        heard = self._heard
        whole = heard is not None and heard[0] is idx  # the sizes of the latest send, whole
        if whole and self._w_cache is not None and self._w_cache[0] is heard[2]:
            return self._w_cache[1]  # the same C and sizes as the last step: the same W
        if whole and self._in_order:  # they are this slot's |C_b|: W_ab is kept per edge
            w = self._w_full.take(idx, mode="clip")
        else:
            w = edge_weight(np.repeat(self.size, counts), self._sizes_heard(idx, every))
        if whole:
            self._w_cache = (heard[2], w)
        return w

    def _sizes_heard(self, idx: np.ndarray, every: bool) -> np.ndarray:
        """|C_b| as b told a, for the edges idx (all edges if `every`)."""
        heard = self._heard
        if heard is not None and heard[0] is idx:  # the latest send arrived whole: its column
            return heard[1]
        return self.nb_size if every else self.nb_size[idx]

    def mixing_matrix(self) -> sp.csr_array:
        """W^(t) of the last consensus step as a sparse M×M matrix (W_aa on the diagonal)."""
        import scipy.sparse as sp

        idx, m = self._mixed_idx, self.graph.n
        w = np.broadcast_to(self._w, idx.shape)
        off = sp.csr_array((w, (self.src[idx], self.dst[idx])), shape=(m, m))
        return (off + sp.diags_array(1.0 - off.sum(axis=1))).tocsr()

    # -- what the recorder reads -------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        """Y_a, or the local mean for agents in the fallback case."""
        if self.params.fallback == "none" or self.t == 0:
            return self.y.copy()
        local = (self.raw_sum if self.params.fallback == "local" else self.priv_sum) / self.t
        return np.where(self._fallback, local, self.y)

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
        shared = np.where((self.graph.degree > 0) & (self.t > 0), 1, 0)
        m = self.laplace_b / (2.0 * self._L)
        return Spend("laplace", 1e-12, {"one": (m, shared), "all": (m, shared)})

    def neighbour_decisions(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, b ∈ C_a) for every directed edge of G: the estimated same-class links."""
        return self.src, self.dst, self.kept.copy()


@PROTOCOLS.register("private-c-colme")
class PrivateCColME(CColME):
    """Private-C-ColME (seed 001): Laplace noise per sample, Bernstein test, fallback."""

    Params = PrivateCColMEParams


@PROTOCOLS.register("ideal-component")
class IdealComponent(Local):
    """Prop. 2 of seed 001: agent a pools every sample of C̃_a (its class component in G).

    MSE (1/M) Σ_a σ̄²_{C̃_a}/(n_a t): what no algorithm restricted to G can beat. It uses the
    true classes, as the paper's benchmark does.
    """

    uses_oracle = True
    needs_topology: ClassVar[bool] = True

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        graph: Graph = ctx.public["graph"]
        self.labels = graph.restricted_components(ctx.oracle_classes)
        self.sizes = np.bincount(self.labels)

    def estimates(self) -> np.ndarray:
        pooled = np.bincount(self.labels, weights=self.sums) / self.sizes
        return pooled[self.labels] / max(self.counts, 1)
