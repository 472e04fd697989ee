"""B-ColME (Galante, Neglia, Leonardi): message passing of k-hop tables over a graph.

Galante et al.'s second scalable algorithm (docs/papers.md §2.6; their code's
``belief_propagation_v1``, class ``NodeB``). Where C-ColME mixes consensus estimates, B-ColME
rebuilds, at every agent a, the sample-weighted average of the running means of every agent
up to κ − 1 hops away over the optimistic subgraph (κ = ``up_to``; the authors use 5), counting
each along non-backtracking paths, as belief propagation does. Every slot t, each agent a

1. takes its sample (with privacy, X_a + Z_a, Z_a Laplace of variance σ_DP² = 8L²/ε²), so its
   running mean is X̃_a^(t);
2. tests every neighbour b it still keeps against the newest table b sent it, by the optimistic
   distance |X̃_a^(t) − X̃_b| ≤ β(t) + β(n_b), γ = δ/(4 Σ_a deg a) (or the Bernstein test, or
   the true classes for ``rule = "oracle"``); a dropped neighbour stays dropped
   (``decisions = "irrevocable"``, the authors' code) or is tested again;
3. holds, for every kept neighbour b and depth k = 0 … κ − 2, the sum S_{b→a}^(k) of the
   running means of the agents k + 1 hops away through b, and how many they are, c_{b→a}^(k);
   depth 0 is b itself (X̃_b, 1);
4. estimates, with n_b the samples behind b's newest table (t − 1 on ideal links),

       μ̂_a = (t X̃_a + Σ_b Σ_k (n_b − k) S_{b→a}^(k)) / (t + Σ_b Σ_k (n_b − k) c_{b→a}^(k)),

   each mean at depth k being k slots older than b's and so resting on n_b − k samples;
5. sends every neighbour b its table for b: (X̃_a^(t), t) and, for k = 1 … κ − 2,
   S_{a→b}^(k) = Σ_{c ∈ C_a \\ {b}} S_{c→a}^(k−1) and the same sum of counts — everything a
   holds but what came from b (non-backtracking).

On ideal links this is the authors' synchronous round: agent a at round t reads its
neighbours' means, tables and decisions of round t − 1 (their ``curr`` copies) and writes its
own (``new``), so the estimates are the code's, up to its single precision. Under latency and
losses (desim's extension), a keeps per edge b's newest table by its sample count n_b and
weighs its depth-k entries by n_b − k; a message older than the one held is ignored.

Privacy (seed 001's reconstruction carries over, desim's extension): with ``noise =
"laplace"`` every sample is privatised once, and everything an agent sends — X̃_a, its sample
count and sums of neighbours' messages — is computed from privatised samples and received
messages, so each sample is one Laplace release (ε per sample, to one neighbour as to all
colluding), as for Private-C-ColME. The estimate uses X̃_a as well.

Adversaries (``adversaries``, docs/adversaries.md; the hooks in `desim.models.ccolme.robust`).
What an adversary b controls is what its tables carry: its own mean X̃_b (depth 0), the sample
count n_b it tells, and the sums S^(k), c^(k) it forwards. ``shift``, ``flip``, ``mimic`` and
``collude`` replace X̃_b every slot, noise added first as for an honest agent (its raw mean under
``skip_noise``), so its depth-0 entry, its own tests (and so which neighbours' sums it forwards)
and its estimate derive from the corrupted mean; honest agents forward it further inside their
sums as they forward any mean. ``inflate`` multiplies the n_b it tells by ``factor`` ≥ 1: its
receivers weigh its depth-k entries by factor·n_b − k (and test it with n_b so told); its mean
stays honest. By default (``forwarded = "unchanged"``) it forwards the sums and counts it
received unchanged under every behaviour; with ``forwarded = "corrupted"`` (not with
``inflate``: multiplying counts c^(k) alone would shrink the forwarded means S/c, a value
attack, not a weight) it sends its behaviour's report of every mean in each sum S^(k) (shift:
+ s each, flip: reflected, mimic and collude: at their centre), counts unchanged
(`desim.models.ccolme.robust.GraphAdversaries.forwarded`). The defence
(``combination = "median"`` or ``"trimmed"`` with ``trim``) replaces the estimate by Yin et
al.'s median or trimmed mean of X̃_a and the depth-0 means of a's kept neighbours: depth 0 is
the only entry that is one agent's value; deeper entries are sums over paths, in which an
adversary's mean sits inside honest neighbours' sums where no per-message aggregate can cut it.

On a graph that changes during a run (desim's extension), a new link holds no table until b's
first message, a dropped link's table leaves the estimate and the sums at once, and messages in
flight on a link that changed are dropped on arrival (`desim.models.ccolme.brewire`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context
from desim.kernel.registry import PROTOCOLS
from desim.models.ccolme import brewire, rewire
from desim.models.ccolme.edges import newest
from desim.models.ccolme.family import CColMEFamily
from desim.models.ccolme.params import Decisions, Noise, Rule, Threshold, _p
from desim.models.ccolme.robust import TableAdversarial, check_table_params


@dataclass(frozen=True)
class BColMEParams:
    """B-ColME as in Galante et al.'s code: optimistic distance, irrevocable, κ = 5."""

    up_to: int = param(
        5, "κ, the authors' table_up_to: tables hold depths 0 … κ−2 (up to κ−1 hops)", ge=2
    )
    rule: Rule = _p("rule", "optimistic")
    noise: Noise = _p("noise", "none")
    epsilon: float = _p("epsilon", 1.0)
    delta: float = _p("delta", 0.1)
    theta: float = _p("theta", 0.05)
    threshold: Threshold = _p("threshold", "exact")
    threshold_scale: float = _p("threshold_scale", 1.0)
    decisions: Decisions = _p("decisions", "irrevocable")
    adversaries: dict | None = param(
        None,
        "an [adversaries] table {fraction | agents, behaviour = shift | flip | mimic | collude | "
        "inflate, forwarded = unchanged | corrupted, …}: agents whose own mean or told sample "
        "count, and optionally the sums they forward, are corrupted (`desim.models.ccolme.robust`)",
    )
    combination: Literal["weighted", "median", "trimmed"] = param(
        "weighted",
        "estimate: the tables' sample-weighted mean, or the median or trimmed mean of the "
        "kept neighbours' own means (Yin et al. 2018)",
    )
    trim: float | None = param(
        None,
        "combination = 'trimmed': the share β of kept neighbours dropped at each end",
        ge=0,
        lt=0.5,
    )

    def __post_init__(self) -> None:
        check_table_params(self)


@dataclass(frozen=True)
class PrivateBColMEParams(BColMEParams):
    """Private-B-ColME: seed 001's privacy (Laplace noise per sample, the Bernstein test,
    re-tested decisions) on B-ColME's tables."""

    rule: Rule = _p("rule", "bernstein")
    noise: Noise = _p("noise", "laplace")
    decisions: Decisions = _p("decisions", "retest")


def row_sums(indptr: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Σ over each agent's edges (CSR rows of `indptr`) of `values` (one per edge, along the
    last axis: (edges,) or (columns, edges))."""
    n = len(indptr) - 1
    out = np.zeros(values.shape[:-1] + (n,))
    rows = np.flatnonzero(indptr[1:] > indptr[:-1])
    if len(rows):
        out[..., rows] = np.add.reduceat(values, indptr[:-1][rows], axis=-1)
    return out


def outgoing_tables(
    indptr: np.ndarray,
    dst: np.ndarray,
    reverse: np.ndarray,
    held: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """What b = dst[s] sends a = src[s] for a's slot s = (a, b): for each row k of `held`
    (every agent's tables, one column per slot, zero where the neighbour is not kept), the sum
    of b's entries over all its slots but the one about a (reverse[s]): non-backtracking.
    Written into `out` (rows × slots) when given."""
    sums = row_sums(indptr, held)
    out = np.empty_like(held) if out is None else out
    for k in range(len(held)):  # row by row: np.take is several times faster than [:, idx]
        np.take(sums[k], dst, out=out[k])
        out[k] -= np.take(held[k], reverse)
    return out


def table_estimate(
    t: int, mean: np.ndarray, indptr: np.ndarray, n_held: np.ndarray, s: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """μ̂_a = (t X̃_a + Σ_b Σ_k (n_b − k) S_{b→a}^(k)) / (t + Σ_b Σ_k (n_b − k) c_{b→a}^(k)):
    `s` and `c` are a's tables (depth k in row k, one column per slot), zero where b is not
    kept, `n_held` the samples behind b's newest table."""
    age = n_held - np.arange(len(s))[:, None]  # samples behind a depth-k mean: n_b − k
    num = t * mean + row_sums(indptr, np.einsum("ks,ks->s", age, s))
    den = t + row_sums(indptr, np.einsum("ks,ks->s", age, c))
    return num / den


@PROTOCOLS.register("b-colme")
class BColME(TableAdversarial, CColMEFamily, rewire.Follows):
    """B-ColME (Galante et al.): k-hop tables of neighbours' means, passed along the graph."""

    Params = BColMEParams
    message_kinds = ("table",)
    memory = {"edge": 360.0, "agent": 200.0}

    @classmethod
    def memory_per_unit(cls, params: Any, t_max: int, sizes: Any = None) -> dict[str, float]:
        """Bytes per directed edge: the held message and two payload buffers (2κ floats
        each), the tables of the slot (2κ), flags; per agent a few vectors."""
        return {"edge": 8.0 * 8 * int(params.up_to) + 16.0, "agent": 200.0}

    def on_window_end(self) -> None:
        """Nothing to finish: a window's tables are filed per edge, newest wins, as they come."""

    def on_graph_change(self, t: int, added: np.ndarray, dropped: np.ndarray) -> None:
        """Lay the tables out on the new graph (`desim.models.ccolme.brewire.follow`)."""
        brewire.follow(self, t)

    def setup(self, ctx: Context) -> None:
        """Read the graph and the data's constants; empty tables, every neighbour kept."""
        super().setup(ctx)
        g = self._setup_graph(ctx)
        # ideal links (`_in_order`) deliver every send whole, in send order: a's slots in order
        self.depth = self.params.up_to - 1  # depths 0 … κ−2
        self.t = 0
        self.priv_sum = np.zeros(g.n)  # Σ (X_a + Z_a): everything a shares derives from it
        self.mean = np.zeros(g.n)  # X̃_a^(t)
        #: b ∈ C_a, per directed edge (a, b) in a's slot: kept by the neighbour test.
        self.kept = np.ones(g.n_directed, dtype=bool)
        #: b's newest message held by a, one column per slot (a, b): row 0 X̃_b, row 1 n_b
        #: (0: none yet), then S at depths 1 … κ−2, then c at depths 1 … κ−2.
        self.held = np.zeros((2 * self.depth, g.n_directed))
        self._held_own = True  # `held` is this protocol's array (not a delivered payload)
        self._whole_t: float | None = None  # n_b of every held message when one whole send
        self._buffers = [np.empty_like(self.held) for _ in range(2)] if self._in_order else []
        self._estimate = np.zeros(g.n)
        self._tables: tuple[np.ndarray, np.ndarray] | None = None  # (S, c) buffers of `tables`
        self.setup_robustness(ctx)

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """a's tables (S, c) at depths 0 … κ−2 (rows), one column per slot (a, b): b's newest
        message where b is kept and heard from, zero elsewhere. The arrays are reused: they
        hold this slot's tables until the next call."""
        h, d = self.held, self.depth
        use = np.logical_and(self.kept, h[1] > 0).astype(float)  # one cast, reused by rows
        if self._tables is None:  # reused: read only within the slot (fresh ones fault pages)
            self._tables = np.empty((d, h.shape[1])), np.empty((d, h.shape[1]))
        s, c = self._tables
        np.multiply(h[0], use, out=s[0])
        c[0] = use
        np.multiply(h[2 : d + 1], use, out=s[1:])
        np.multiply(h[d + 1 :], use, out=c[1:])
        return s, c

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        """Slot t: the sample, the neighbour tests and tables from what was held, the
        estimate, then every neighbour's table for the next slot."""
        self.t = t
        self.priv_sum += self.privatise(samples)
        self.mean = self.own_mean(t, samples)
        self._test_neighbours(t)
        s, c = self.tables()
        g = self.graph
        robust = self.robust_estimate()
        self._estimate = (
            table_estimate(t, self.mean, g.indptr, self.held[1], s, c) if robust is None else robust
        )
        self._send(t, s[:-1], c[:-1])

    def _test_neighbours(self, t: int) -> None:
        """χ_a(b) for the edges with a newest table held (irrevocable: the kept ones only)."""
        heard = self.held[1] > 0
        tested = heard & self.kept if self.params.decisions == "irrevocable" else heard
        e = np.flatnonzero(tested)
        if len(e) == 0:
            return
        if self.uses_oracle:
            self.kept[e] = self._oracle_chi[e]
            return
        a, b = self.src[e], self.dst[e]
        n_b = self.held[1, e]
        if self._whole_t is not None:  # one whole send of one slot: every n_b is its t
            n_b = self._whole_t
        diff = np.abs(self.mean[a] - self.held[0, e])
        self.kept[e] = self._test.keep(diff, float(t), n_b, a, b)

    def _send(self, t: int, s: np.ndarray, c: np.ndarray) -> None:
        """Message s = (a, b) goes from b to a, filed in a's slot s: X̃_b, t, then the sums
        S and c at depths 1 … κ−2 of b's tables but the entry about a."""
        g, d = self.graph, self.depth
        if self._buffers:  # ideal links: the send before last is held by nobody now
            self._buffers.reverse()
            payload = self._buffers[0]
        else:
            payload = np.empty_like(self.held)
        np.take(self.mean, self.dst, out=payload[0])
        payload[1] = t
        if self.told is not None:  # inflating adversaries tell factor·t samples (per sender)
            payload[1] *= self.told[self.dst]
        outgoing_tables(g.indptr, self.dst, self.reverse, s, out=payload[2 : d + 1])
        outgoing_tables(g.indptr, self.dst, self.reverse, c, out=payload[d + 1 :])
        self.corrupt_forwarded(payload[2 : d + 1], payload[d + 1 :])
        self.ctx.send("table", self.dst, self.src, payload.T)

    def on_deliver(self, batch: Batch) -> None:
        """File each neighbour's newest table (by its sample count) in the receiver's slot."""
        e = None  # the receivers' slots, when already found
        if self.in_flight is not None:  # a changed graph: tables of links gone are dropped
            batch, e = self.in_flight.slots_in_force(self, batch)
        payload = batch.payload
        if len(batch) == 0:
            return
        if self._in_order and len(batch) == self.graph.n_directed:
            self.held = payload.T  # a whole send, in a's slot order: held as it is
            self._held_own = False
            # one n_b for all, unless adversaries tell inflated counts
            self._whole_t = float(payload[0, 1]) if self.told is None else None
            return
        if not self._held_own:
            self.held, self._held_own = self.held.copy(), True
        self._whole_t = None
        e = self._slot_of.find(batch.dst, batch.src) if e is None else e
        e, rows, _ = newest(e, payload[:, 1], self.held[1, e], strict=True)
        self.held[:, e] = payload[rows].T

    def estimates(self) -> np.ndarray:
        """μ̂_a of the last slot (X̃_a before any table arrives)."""
        return self._estimate.copy() if self.t else self.mean.copy()


@PROTOCOLS.register("private-b-colme")
class PrivateBColME(BColME):
    """Private-B-ColME: Laplace noise per sample, the Bernstein test, re-tested decisions."""

    Params = PrivateBColMEParams
