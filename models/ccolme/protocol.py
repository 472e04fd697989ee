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

Live-first (ideal links, irrevocable decisions; `desim.models.ccolme.live_first`): the states
of the edges still tested come first and carry values, the others NaN; the test runs on those
edges only, the same operations on the same values as the per-edge path
(`desim.models.ccolme.edges.EdgeStates`), so the results are the same bit for bit. The delivery
path is chosen once in `setup`; a state send that does not arrive whole (which ideal links never
do) moves the run to the per-edge path explicitly, never silently.

The model itself (tests, weights, update, fallback) is `desim.models.ccolme.model`; |C_b| and
W_ab are `desim.models.ccolme.sizes`; the graph, the noise, the test's set-up and the ledgers'
hooks, which B-ColME shares, are `desim.models.ccolme.family`. With numba installed, graphs from
2¹⁹ directed edges take compiled per-slot passes (the state send's gather, the test, the mix, the
moves of C) with the numpy path's bytes: `desim.models.ccolme.compiled`, chosen once at set-up.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from desim.kernel.messages import Batch, SenderBatch
from desim.kernel.protocol import Context
from desim.kernel.registry import PROTOCOLS
from desim.models.baselines import Local
from desim.models.ccolme import rewire
from desim.models.ccolme.compiled import CompiledPass, KeptWeights
from desim.models.ccolme.edges import EdgeStates, Rows, Turns, common, newest
from desim.models.ccolme.family import CColMEFamily
from desim.models.ccolme.live_first import BUFFERS, CHUNK, LiveFirst
from desim.models.ccolme.model import (
    bernstein_threshold,  # noqa: F401  (re-exported: the formulas' former home)
    confidence_radius,  # noqa: F401  (re-exported)
    consensus_step,
    data_bernstein_parameter,  # noqa: F401  (re-exported)
    metropolis_weights,  # noqa: F401  (re-exported)
    row_sums,  # noqa: F401  (re-exported)
    small_component,
)
from desim.models.ccolme.paired import live_first
from desim.models.ccolme.params import CColMEParams, PrivateCColMEParams
from desim.models.ccolme.robust import Adversarial
from desim.models.ccolme.sizes import Sizes
from desim.topologies.graph import Graph

if TYPE_CHECKING:  # scipy.sparse is imported where used (mixing_matrix)
    import scipy.sparse as sp


class _View:
    """A per-edge array a holds, read-only: attribute `name` of the protocol's `EdgeStates`
    (`LiveFirst.view` on the live-first path) or of another part (`of`)."""

    def __init__(self, name: str, doc: str, of: str = "states") -> None:
        self._name, self._of, self.__doc__ = name, of, doc

    def __get__(self, proto: Any, owner: type | None = None) -> Any:
        if proto is None:
            return self
        states = getattr(proto, self._of)
        if isinstance(states, LiveFirst):
            return states.view(self._name)
        return getattr(states, self._name)


def _same_ends(batch: Batch, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether `batch` is the send (src, dst) as sent, by its length and end messages: ideal
    links hand every send over whole and in order; a batch filtered or reordered on the way
    (a test's device) is looked up edge by edge instead, with the same results."""
    if isinstance(src, SenderBatch):  # a built send (`Sizes.send`): its columns
        src, dst = src.src, src.dst
    n = len(src)
    if len(batch) != n:
        return False
    s, d = batch.src, batch.dst
    return bool(s[0] == src[0] and s[-1] == src[-1] and d[0] == dst[0] and d[-1] == dst[-1])


@PROTOCOLS.register("c-colme")
class CColME(Adversarial, CColMEFamily, rewire.Follows):
    """C-ColME (Galante et al.): consensus over estimated same-class neighbours of a graph."""

    Params = CColMEParams
    message_kinds = ("state", "decision", "size")
    # per directed edge: the graph's arrays, three state buffers, the size sends, |C_b| and
    # W_ab, and on the live-first path S's send order (senders, receivers, slots), the
    # positions of S and of C within S, C's receivers and S's blocked gather: nine of 8 bytes
    memory = {"edge": 328.0, "agent": 400.0}

    nb_x = _View("x", "X̃_b of b's newest state held by a, per directed edge (a's slot).")
    nb_n = _View("n", "t_b of b's newest state held by a (0: none yet), per directed edge.")
    nb_y = _View("y", "Y_b (that is Y_b^(t_b − 1)) of b's newest state held by a, per edge.")
    nb_x_prev = _View("x_prev", "X̃_b of the state before b's newest (values = 'stale').")
    nb_n_prev = _View("n_prev", "t_b of the state before b's newest, per directed edge.")
    nb_size = _View("nb_size", "|C_b| as b told a, per directed edge (a's slot).", "_sizes")
    nb_size_at = _View("at", "When b sent the |C_b| a holds, per edge (ideal links: 0).", "_sizes")

    def on_graph_change(self, t: int, added: np.ndarray, dropped: np.ndarray) -> None:
        """Lay the per-edge state out on the new graph (`desim.models.ccolme.rewire.follow`)."""
        rewire.follow(self, self.ctx.public["graph"])

    def on_window_end(self) -> None:
        """Nothing left to finish: a window's batches are filed as they come, exactly
        (`_states_in_window`; the kernel's contract in desim.kernel.protocol.WindowSafe)."""

    # -- set-up ------------------------------------------------------------------------------
    def setup(self, ctx: Context) -> None:
        """Read the graph and the data's constants; set up the state and the delivery path."""
        super().setup(ctx)
        g = self._setup_graph(ctx)
        if ctx.call_at is None:
            raise ValueError(
                "this engine gives no timers (Context.call_at); the consensus "
                "step runs at a deadline"
            )
        self._csr = Rows(g)
        #: σ̃_a² = σ_a² + σ_DP², the variance of a privatised sample.
        self.sigma2_tilde = self._test.sigma2_tilde
        self.setup_robustness(ctx)
        self._setup_state(g.n, g.n_directed)

    def _setup_state(self, m: int, e: int) -> None:
        """The agents' own state, what they hold per edge, and the delivery path."""
        p = self.params
        self.t = 0
        self.raw_sum = np.zeros(m)  # Σ X_a: never leaves the agent
        self.priv_sum = np.zeros(m)  # Σ (X_a + Z_a): what everything shared derives from
        self._mean = np.zeros(m)  # X̃_a^(t) = priv_sum / t, the privatised running mean
        self.y = np.zeros(m)  # Y_a, the consensus estimate
        self.start = np.zeros(m)  # t_a^start: age s = t − start (float: α needs no cast)
        self.chi = np.full(e, p.initial == "all")  # χ_a(b), a's own decision
        self.their_chi = self.chi.copy()  # χ_b(a), as b told a
        self.their_chi_at = np.zeros(e)  # when b sent it (0: the prior `initial`)
        self.kept = self.chi.copy()  # C_a as a boolean per edge
        self.size = self._csr.count(self.kept)  # |C_a|
        self._kept_idx = np.flatnonzero(self.kept)
        self._kept_version = 0  # counted up whenever C (any agent's kept set) moves
        metropolis = p.weights == "metropolis"
        self._sizes = Sizes(self.graph, self.size, self._in_order, metropolis, self.told)
        self._sends_sizes = metropolis or p.fallback != "none"
        # the delivery path, chosen once: live-first or per edge (see the module's docstring)
        live = self._in_order and p.decisions == "irrevocable"
        #: What a holds of b's states: the live-first or the per-edge delivery path.
        self.states: LiveFirst | EdgeStates = (
            live_first(self.graph, self._kept_idx, p.values == "fresh") if live else EdgeStates(e)
        )
        # Ideal links deliver every send at once, so the state payload of slot t − 3 is held by
        # nobody at slot t (a keeps t − 1's and t − 2's states): buffers in turn save fresh pages
        self._payloads = Turns(3 * e, float, BUFFERS)
        # kind: (src, dst, receivers' slots) of the last send
        self._sent: dict[str, tuple[np.ndarray, np.ndarray, Any]] = {}
        # the edges of the last consensus step and their weights W_ab (for mixing_matrix)
        self._mixed_idx: np.ndarray = np.empty(0, dtype=np.int64)
        self._w: np.ndarray | float | KeptWeights = 0.0
        self._fallback = np.zeros(m, dtype=bool)
        self._unchanged = np.zeros(m, dtype=bool)
        self._unchanged.flags.writeable = False
        self._changed = self._unchanged  # C_a changed in this slot
        self._rewired: np.ndarray | None = None  # C_a changed by a graph change (`rewire`)
        self._relive = False  # back to the live-first path when it can (`rewire.relive`)
        self._handlers = (self._on_state, self._on_decision, self._on_size)
        self._compiled = CompiledPass.choose(e)  # the consensus step's pass, chosen once

    # -- slot: sample, privatise, share ------------------------------------------------------
    def on_samples(self, t: int, samples: np.ndarray) -> None:
        """Slot t: take and privatise the samples, send the states, then (a deadline at the end
        of the instant) the consensus step."""
        self.t = t
        if self._compiled is not None and self.laplace_b == 0.0 and self.adversaries is None:
            self._mean = self._compiled.take_samples(self.raw_sum, self.priv_sum, samples, t)
        else:  # (the same operations, in one pass above)
            self.raw_sum += samples
            self.priv_sum += self.privatise(samples)
            self._mean = self.shared_mean(t)
        # message e carries the state of b = dst[e] to a = src[e], filed in a's slot e;
        # columns are contiguous (the transpose of a C array) for the receiver's arithmetic;
        # mode="clip" (the indices are valid): "raise" would gather into a buffered copy
        if self.gate is not None:
            self.gate.sample(t, self.graph.degree > 0)
            if self.gate.silent:  # no room in the budget for any sample: nothing is shared
                self.ctx.call_at(t, self._decided)
                return
        if self._relive:  # after a graph change (`rewire`)
            rewire.relive(self)
        states = self.states
        if isinstance(states, LiveFirst):
            states.compact(self._kept_idx, self._kept_version, self.params.symmetric)
            self._sent["state"] = states.send(self.ctx, self._mean, self.y, t)
        else:
            payload = self._state_payload()
            np.take(self._mean, self.dst, out=payload[:, 0], mode="clip")
            payload[:, 1] = t
            np.take(self.y, self.dst, out=payload[:, 2], mode="clip")
            self._sent["state"] = (self.dst, self.src, slice(None))
            self.ctx.send("state", self.dst, self.src, payload)
        # the slot's consensus step, after this instant's deliveries (whatever arrived)
        self.ctx.call_at(t, self._decided)

    def _state_payload(self) -> np.ndarray:
        """An (edges × 3) array for this slot's states on the per-edge path, columns
        contiguous: in order, the next of `BUFFERS` in turn."""
        e = self.graph.n_directed
        if not self._in_order:
            return np.empty((3, e)).T
        return self._payloads.next(3 * e).reshape(3, e).T

    def _slots(self, batch: Batch, kind: str) -> tuple[np.ndarray | slice, bool]:
        """The receiver's edge slot of every message of `batch` (receiver dst, sender src), and
        whether the batch is the last send of its kind, whole (so the newest of its kind)."""
        if self._in_order:  # ideal links: every send arrives whole, at once, in send order
            sent = self._sent.get(kind)
            if sent is not None and (batch is sent[0] or _same_ends(batch, sent[0], sent[1])):
                return sent[2], True
        return self._slot_of.find(batch.dst, batch.src), False

    # -- deliveries: store what arrived ----------------------------------------------------
    def on_deliver(self, batch: Batch) -> None:
        """File what arrived: each kind of message to its handler."""
        if self.in_flight is not None:  # a changed graph: messages of links gone are dropped
            batch = self.in_flight.in_force(self, batch)
        if batch.single_kind is not None:  # one kind (always so with ideal links): no need to split
            self._handlers[batch.single_kind](batch)
            return
        for kind, handle in zip(self.message_kinds, self._handlers, strict=True):
            part = batch.of_kind(kind)
            if len(part):
                handle(part)

    def _on_state(self, batch: Batch) -> None:
        e, whole = self._slots(batch, "state")
        states = self.states
        if isinstance(states, LiveFirst):
            if whole:  # in order, every send arrives whole, at once
                self._on_live_states(states, batch)
                return
            self.states = states = states.to_edge_states()  # per edge from now on
        x, n, y = batch.payload[:, 0], batch.payload[:, 1], batch.payload[:, 2]
        if batch.delivered_at is not None:  # a window's, with exact times (window_safe)
            if isinstance(e, slice):
                e = np.arange(self.graph.n_directed)[e]
            self._states_in_window(states, e, x, n, y, batch.delivered_at)
            return
        if isinstance(e, slice) and len(n) and n[0] > states.newest_stamp():
            states.take_columns(x, n, y)  # every neighbour's state of one slot, newer
        else:
            if isinstance(e, slice):
                e = np.arange(self.graph.n_directed)[e]
            e, _ = states.store(e, x, n, y)
            if len(e) == 0:
                return
        chi = self._decide(e)
        if self.params.symmetric:
            self._tell(e, chi, self.ctx.now())

    def _on_live_states(self, states: LiveFirst, batch: Batch) -> None:
        """A live-first send of this slot, whole: hold its values over S, test χ's edges."""
        states.receive(batch, self.t)  # irrevocable: a drop of S stays dropped
        died = states.test(self._rule, self._test, self._mean, float(self.t))
        if len(died):
            self.chi[died] = False
        if self.params.symmetric:  # χ_a(b) told on every edge, as a slot's tests tell it
            self._tell(slice(None), self.chi, self.ctx.now())

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
        src, dst = self.src[e], self.dst[e]
        self._sent["decision"] = (src, dst, self.reverse[e])
        if isinstance(at, np.ndarray):
            self.ctx.send("decision", src, dst, payload, at=at)
        else:
            self.ctx.send("decision", src, dst, payload)

    def _states_in_window(
        self,
        states: EdgeStates,
        e: np.ndarray,
        x: np.ndarray,
        n: np.ndarray,
        y: np.ndarray,
        at: np.ndarray,
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
            edges, rows = states.store(e[sel], x[sel], n[sel], y[sel])
            if len(edges):
                chi = self._decide(edges)
                told.append((at[sel][rows], edges, chi))
        if self.params.symmetric and told:
            when, edges, chi = (np.concatenate(part) for part in zip(*told, strict=True))
            order = np.lexsort((edges, when))
            self._tell(edges[order], chi[order], when[order])

    def _on_decision(self, batch: Batch) -> None:
        e, whole = self._slots(batch, "decision")
        chi, at = batch.payload[:, 0] > 0.5, batch.payload[:, 1]
        if whole:  # the last send, in order: the newest (no send times kept)
            self.their_chi[e] = chi
            return
        # keep per edge the newest decision (by send time), drop older ones
        times = self.their_chi_at
        e, rows, _ = newest(e, at, times[e], strict=False)
        self.their_chi[e], times[e] = chi[rows], at[rows]

    def _on_size(self, batch: Batch) -> None:
        e, whole = self._slots(batch, "size")
        if whole:
            self._sizes.heard_whole(e, batch)  # type: ignore[arg-type]
        else:
            self._sizes.heard(e, batch.payload[:, 0], batch.payload[:, 1])  # type: ignore[arg-type]

    # -- the slot's consensus step (deadlines at the end of instant t) -----------------------
    def _decided(self) -> None:
        """C_a^(t) from χ_a and the last χ_b(a): restart ages where it changed, tell kept
        neighbours |C_a|, then update (once sizes sent with zero latency are delivered)."""
        states = self.states
        live = isinstance(states, LiveFirst) and not self.params.symmetric
        if live:  # C_a = χ_a: the only flips are the drops of this slot's test
            flipped, states.died = states.died, states.died[:0]  # type: ignore[union-attr]
            kept = self.kept
            kept[flipped] = False
        else:
            kept = self.chi & self.their_chi if self.params.symmetric else self.chi.copy()
            flips = kept != self.kept
            self.kept = kept
            flipped = np.flatnonzero(flips) if flips.any() else self._kept_idx[:0]
        if len(flipped):  # else |C_a|, the kept edges and the caches stay as they are
            # few: |C_a| and "changed" follow from them
            owner = self.src[flipped]
            self._changed = np.zeros(self.graph.n, dtype=bool)
            self._changed[owner] = True
            self.size = self.size.copy()
            np.add.at(self.size, owner, np.where(kept[flipped], 1, -1))
            if self._in_order:
                gone = flipped[~kept[flipped]]
                changed = np.flatnonzero(self._changed)
                self._sizes.moved(gone, changed, self.size, self._kept_version)
            self._kept_version += 1
            if live:  # χ's edges: those of S still alive
                self._kept_idx = states.kept_moved(self._kept_version)  # type: ignore[union-attr]
            else:
                self._kept_idx = np.flatnonzero(kept)
        else:
            self._changed = self._unchanged
        if self._rewired is not None:  # the graph changed before this slot
            self._changed, self._rewired = self._changed | self._rewired, None
        if self.params.restart == "hard":
            self._restart(self._changed)
        if not self._sends_sizes or len(self._kept_idx) == 0:
            self._update()
            return
        self._sent["size"] = self._sizes.send(
            self.ctx, self._kept_idx, self._kept_version, self.size, self.t, self._csr
        )
        self.ctx.call_at(self.t, self._update)

    # -- neighbour test ----------------------------------------------------------------------
    def _rule(self, e: np.ndarray | slice) -> np.ndarray:
        """χ_a(b) for the edges e (a = src[e], b = dst[e]) from privatised values only."""
        if self.uses_oracle:
            return self._oracle_chi[e].copy()
        states = self.states
        live = isinstance(states, LiveFirst)
        x_b, n_all, n_b = states.read(e, self.params.values == "fresh")  # type: ignore[arg-type]
        if n_all is None:  # states of different ages held; maybe not on these edges
            n_all = common(n_b)  # type: ignore[arg-type]
        if n_all == 0.0:  # nothing from these neighbours yet (stale, t = 1): keep them all
            return np.ones(len(x_b), dtype=bool)
        # live-first, e is S: (a, b) are its send's receivers and senders (no gather)
        a, b = states.ends(e) if live else (self.src[e], self.dst[e])  # type: ignore[union-attr,arg-type]
        n_a = float(self.t)
        if n_all is not None and len(x_b) > CHUNK:  # one t_b: element-wise in pieces
            return self._test.keep_in_chunks(self._mean, x_b, a, b, n_a, n_all, CHUNK)
        # |X̃_a − X̃_b|, in place; every edge: CSR order, a = src, agents' rows
        if isinstance(e, slice) or (live and len(e) == self.graph.n_directed):
            # r-regular: a scalar count repeats faster
            diff = self._csr.spread(self._mean)
        else:
            diff = self._csr.gather(self._mean, a)
        np.subtract(diff, x_b, out=diff)
        np.abs(diff, out=diff)
        if n_all is None:  # states of different ages; none yet (t_b = 0) counts as a keep
            unknown = n_b == 0
            n_b = np.where(unknown, n_a, n_b)
        else:
            unknown, n_b = None, n_all
        keep = self._test.keep(diff, n_a, n_b, a, b)
        return keep if unknown is None else keep | unknown

    # -- consensus step ----------------------------------------------------------------------
    def _restart(self, changed: np.ndarray) -> None:
        """Reset the age s of agents whose C_a changed (or of everyone, for a global reset)."""
        reset = self.params.reset
        if reset == "agent":
            self.start[changed] = self.t - 1
        elif reset == "global" and changed.any():
            self.start[:] = self.t - 1

    def _mixed(self) -> tuple[np.ndarray, np.ndarray, bool]:
        """The kept edges a mixes over in slot t (heard from, at most max_age slots old), in
        CSR order, how many each agent has, and whether they are all the kept edges."""
        n_all, max_age = self.states.n_all, self.params.max_age
        if n_all is not None and n_all > 0 and self.t - n_all <= max_age:
            return self._kept_idx, self.size, True  # every state of one slot: all kept mixed
        nb_n = self.nb_n  # (live-first: derived from the latest send, held per edge otherwise)
        mixed = self.kept & (nb_n > 0)
        if math.isfinite(max_age):
            mixed &= self.t - nb_n <= max_age
        return np.flatnonzero(mixed), self._csr.count(mixed), False

    def _update(self) -> None:
        """Y_a ← (1−α) X̃_a + α (W_aa Y_a + Σ_b W_ab Y_b), then the fallback decision."""
        p = self.params
        idx, counts, all_kept = self._mixed()
        every = len(idx) == self.graph.n_directed  # every link mixed: no need to compress
        states = self.states
        version = self._kept_version if all_kept else None
        if isinstance(states, LiveFirst):  # Y_b, or the send's Y and where each is (a robust
            nb_y, at = states.y_of(idx, version, self.robust is None)  # mix reads them gathered)
        else:
            nb_y, at = (states.y if every else states.y[idx]), None
        # the latest size send arrived whole and covers the kept edges: its column, as sent
        whole = all_kept and self._sizes.whole(self._kept_version)
        self._mixed_idx = idx
        self._w = self._sizes.weights(idx, counts, self.size, every, whole)
        # W Y over the mixed b ∈ C_a (CSR order: agent a's are the `counts[a]` consecutive
        # ones), then the step (a new array: sends hold the old), in one pass when it can
        step = (self._mean, self.start, float(self.t), p.alpha_c, p.alpha_p)
        if self.robust is None:  # (and the next send's rows, `desim.models.ccolme.paired`)
            table = states.table if isinstance(states, LiveFirst) else None
            self.y = self._csr.mix(self.y, nb_y, self._w, counts, version, at, step, table)
        else:
            mixed = self.robust.mix(self.y, nb_y, counts)  # the robust aggregate
            self.y = consensus_step(self._mean, mixed, *step[1:], self._compiled)
        if p.restart == "galante":
            self._restart(self._changed)
        if p.fallback != "none":
            size = self.size
            if not all_kept:  # C̃_a is about the kept b, heard recently or not
                rows = size > 0
                starts = np.cumsum(size)[rows] - size[rows]
                nb_size = self._sizes.nb_size[self._kept_idx]
            else:
                rows, starts = self._csr.starts(counts, version)
                nb_size = self._sizes.of(idx, every, whole)
            # |C̃_a| = 1: nobody kept; = 2: one neighbour b kept, and b keeps only a
            single = np.zeros(self.graph.n)
            if len(starts):
                single[rows] = np.add.reduceat(nb_size, starts)
            self._fallback = small_component(size, single)

    def mixing_matrix(self) -> sp.csr_array:
        """W^(t) of the last consensus step as a sparse M×M matrix (W_aa on the diagonal)."""
        import scipy.sparse as sp

        idx, m = self._mixed_idx, self.graph.n
        w = np.broadcast_to(self._w, idx.shape)
        off = sp.csr_array((w, (self.src[idx], self.dst[idx])), shape=(m, m))
        diagonal = (1.0 - off.sum(axis=1))[np.newaxis, :]
        # dia_array, not diags_array (which builds the same array): scipy 1.11 lacks the latter
        return (off + sp.dia_array((diagonal, [0]), shape=(m, m))).tocsr()

    # -- what the recorder reads -------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        """Y_a, or the local mean for agents in the fallback case."""
        if self.params.fallback == "none" or self.t == 0:
            return self.y.copy()
        local = (self.raw_sum if self.params.fallback == "local" else self.priv_sum) / self.t
        return np.where(self._fallback, local, self.y)


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
    reads = frozenset({"topology"})
    reads_exact = True  # no draws of its own: the graph, the true classes and the data only

    def setup(self, ctx: Context) -> None:
        """Label every agent with its class component C̃_a (the true classes)."""
        super().setup(ctx)
        graph: Graph = ctx.public["graph"]
        self.labels = graph.restricted_components(ctx.oracle_classes)
        self.sizes = np.bincount(self.labels)

    def estimates(self) -> np.ndarray:
        """The mean of every sample of C̃_a so far, for each agent a."""
        pooled = np.bincount(self.labels, weights=self.sums) / self.sizes
        return pooled[self.labels] / max(self.counts, 1)
