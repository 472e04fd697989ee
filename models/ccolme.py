"""C-ColME (Galante, Neglia, Leonardi) and Private-C-ColME (seed 001): consensus over a graph.

Agents sit on a communication graph G (`ctx.public["graph"]`, a `topologies.graph.Graph`) and
talk only to their neighbours N_a. Every slot t, each agent a

1. takes its sample X_a^(t); with privacy it adds Laplace noise Z_a^(t) of variance
   σ_DP² = 8L²/ε² to it (Lemma 1 of seed 001 with n = 1), so its privatised running mean is
   X̃_a^(t) = x̄_a^(t) + (1/t) Σ_s Z_a^(s) (without privacy X̃_a = x̄_a);
2. sends ``state`` = (X̃_a^(t), t, Y_a^(t−1)) to every neighbour;
3. decides χ_a(b) for every neighbour b from privatised values only, by the optimistic
   distance (ccolme.md §1.2, §5.4), the Bernstein test (§5.3) or, for ``rule = "oracle"``, the
   true classes; with ``symmetric`` it sends χ_a(b) to b (``decision``) and keeps
   C_a^(t) = {b : χ_a(b) ∧ χ_b(a)}, so that W is symmetric and doubly stochastic;
4. sends ``size`` = |C_a^(t)| to the neighbours it keeps, and mixes with the Metropolis-type
   weights of eq. (2), W_ab = 1/(1 + max(|C_a|, |C_b|)) for b ∈ C_a, W_aa = 1 − Σ_b W_ab;
5. updates Y_a^(t) = (1−α) X̃_a^(t) + α Σ_b W_ab Y_b^(t−1), with 1−α = min(1, c·s^(−p)) at
   age s = t − t_a^start (s = 1: α = 0), restarting its age when its neighbour set changes
   (``reset``), and reports Y_a^(t) — or its local mean when its estimated class component has
   1 or 2 agents (``fallback``, seed 001's last if-then-else, §5.6).

Everything an agent sends is computed from privatised values (DESIGN principle 4): X̃, and Y,
the decisions and |C| computed from X̃ and neighbours' messages. The raw running mean x̄_a is
used only for the agent's own, unshared fallback output.

Reconstructions of ccolme.md, implemented as options with the digest's default (marked [R]
there): the α schedule c/s^p (default c = p = 1, Theorem 1's 1−α = 1/t); ``restart`` ``hard``
(α = 0 in the slot of the change: the literal reading of seed 001) or ``galante`` (α = 1/2 in
the next slot, as Galante's code); the Bernstein pair test (§5.3: σ_ab² = σ̃_a² + σ̃_b²,
β_ab = √k·max(β_a, β_b, σ_a, σ_b, β_DP, σ_DP) over the k = 2 or 4 independent terms of
X̃_a − X̃_b, exact or simplified threshold, θ_t = θ/ln(t+1)); the DP-adjusted optimistic distance
with σ̃² = σ² + σ_DP² (§5.4); the size-1-or-2 detector and its output (§5.6). Galante's
reset freeze once the simulator sees no wrong link uses the truth and is not reproduced.

Data Bernstein parameters β_a (Lemma 2 and the like): uniform σ√(3/20), Gaussian σ/2, Bernoulli
1/3 (|X − μ| ≤ 1); Laplace noise: β_DP = σ_DP/√2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import scipy.sparse as sp

from desim.messages import Batch
from desim.params import param
from desim.protocol import Context, Protocol
from desim.registry import PROTOCOLS
from models.baselines import Local
from models.privacy import laplace_scale
from topologies.graph import Graph

# --------------------------------------------------------------------------------------------
# parameters: one table of docs and bounds, two sets of defaults (Galante's and seed 001's)

_DOCS: dict[str, tuple[str, dict[str, float]]] = {
    "rule": ("neighbour test: optimistic distance, Bernstein test, or the true classes", {}),
    "noise": ("DP noise on every sample: Laplace of variance 8L²/ε², or none", {}),
    "epsilon": ("privacy budget ε of every sample (inf: no noise)", {"gt": 0}),
    "delta": ("optimistic distance: confidence δ, γ = δ/(4 Σ_a deg a)", {"gt": 0, "lt": 1}),
    "theta": ("Bernstein test level θ_t = theta/ln(t+1)", {"gt": 0, "lt": 1}),
    "threshold": ("Bernstein threshold: exact root z_t, or the simpler upper bound z'_t", {}),
    "threshold_scale": ("factor on the Bernstein threshold (seed 001 tuned it)", {"gt": 0}),
    "alpha_c": ("α schedule 1−α = min(1, c·s^(−p)) at age s: the c", {"gt": 0}),
    "alpha_p": ("α schedule 1−α = min(1, c·s^(−p)) at age s: the p", {"gt": 0, "le": 1}),
    "reset": ("restart the age s when neighbour sets change: never, all agents, per agent",
              {}),
    "restart": ("after a change: α = 0 in that slot (hard) or α = 1/2 in the next (galante)",
                {}),
    "decisions": ("re-test every neighbour each slot, or never re-add a dropped one", {}),
    "initial": ("C_a before slot 1: every neighbour, or none", {}),
    "values": ("test against neighbours' values of this slot (fresh) or the last (stale)", {}),
    "symmetric": ("keep b only if a and b both keep each other (exchanges decisions)", {}),
    "weights": ("W: 1/(1+max(|C_a|,|C_b|)) (metropolis) or 1/(1+max degree of G)", {}),
    "fallback": ("report the local mean (raw or privatised) when |C̃_a| seems 1 or 2", {}),
}


def _p(name: str, default: Any) -> Any:
    doc, bounds = _DOCS[name]
    return param(default, doc, **bounds)


Rule = Literal["optimistic", "bernstein", "oracle"]
Noise = Literal["none", "laplace"]
Threshold = Literal["exact", "simple"]
Reset = Literal["none", "global", "agent"]
Restart = Literal["hard", "galante"]
Decisions = Literal["retest", "irrevocable"]
Initial = Literal["all", "none"]
Values = Literal["fresh", "stale"]
Weights = Literal["metropolis", "max-degree"]
Fallback = Literal["none", "local", "private-local"]


def _check(p: Any) -> None:
    if p.decisions == "irrevocable" and p.initial == "none":
        raise ValueError("decisions = 'irrevocable' only drops neighbours, so it needs "
                         "initial = 'all'")


@dataclass(frozen=True)
class CColMEParams:
    """C-ColME as in Galante et al.'s code: optimistic distance, irrevocable, global reset."""

    rule: Rule = _p("rule", "optimistic")
    noise: Noise = _p("noise", "none")
    epsilon: float = _p("epsilon", 1.0)
    delta: float = _p("delta", 0.1)
    theta: float = _p("theta", 0.05)
    threshold: Threshold = _p("threshold", "exact")
    threshold_scale: float = _p("threshold_scale", 1.0)
    alpha_c: float = _p("alpha_c", 1.0)
    alpha_p: float = _p("alpha_p", 1.0)
    reset: Reset = _p("reset", "global")
    restart: Restart = _p("restart", "galante")
    decisions: Decisions = _p("decisions", "irrevocable")
    initial: Initial = _p("initial", "all")
    values: Values = _p("values", "stale")
    symmetric: bool = _p("symmetric", False)
    weights: Weights = _p("weights", "metropolis")
    fallback: Fallback = _p("fallback", "none")

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True)
class PrivateCColMEParams:
    """Private-C-ColME as in seed 001: Laplace noise, Bernstein test, re-tested symmetric
    decisions, per-agent reset, fallback to the local mean."""

    rule: Rule = _p("rule", "bernstein")
    noise: Noise = _p("noise", "laplace")
    epsilon: float = _p("epsilon", 1.0)
    delta: float = _p("delta", 0.1)
    theta: float = _p("theta", 0.05)
    threshold: Threshold = _p("threshold", "exact")
    threshold_scale: float = _p("threshold_scale", 1.0)
    alpha_c: float = _p("alpha_c", 1.0)
    alpha_p: float = _p("alpha_p", 1.0)
    reset: Reset = _p("reset", "agent")
    restart: Restart = _p("restart", "hard")
    decisions: Decisions = _p("decisions", "retest")
    initial: Initial = _p("initial", "none")
    values: Values = _p("values", "fresh")
    symmetric: bool = _p("symmetric", True)
    weights: Weights = _p("weights", "metropolis")
    fallback: Fallback = _p("fallback", "local")

    def __post_init__(self) -> None:
        _check(self)


# --------------------------------------------------------------------------------------------
# the formulas of the neighbour tests


def confidence_radius(n: np.ndarray | float, sigma2: np.ndarray | float,
                      gamma: float) -> np.ndarray:
    """β(n; σ, γ) = σ √((2/n)(1 + 1/n) ln(√(n+1)/γ)), +∞ for n < 2 (ccolme.md §1.1)."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt(sigma2 * (2.0 / n) * (1.0 + 1.0 / n) * np.log(np.sqrt(n + 1.0) / gamma))
    return np.where(n < 2, np.inf, r)


def bernstein_threshold(n: np.ndarray | float, sigma2: np.ndarray | float,
                        beta: np.ndarray | float, theta: np.ndarray | float,
                        exact: bool = True) -> np.ndarray:
    """z with 2 exp(−n z²/(2(σ² + βz))) = θ (exact), or z' = 2βℓ/n + σ√(2ℓ/n), ℓ = ln(2/θ).

    Accepting H0 (same mean) iff |S| < z bounds the type-I error of a mean of n terms with
    variance σ² and Bernstein parameter β by θ (seed 001 §II-D, Lemma 4).
    """
    n = np.asarray(n, dtype=float)
    ell = np.log(2.0 / np.asarray(theta, dtype=float))
    if exact:
        return (beta * ell + np.sqrt(beta * beta * ell * ell + 2.0 * n * sigma2 * ell)) / n
    return 2.0 * beta * ell / n + np.sqrt(sigma2 * 2.0 * ell / n)


def data_bernstein_parameter(distribution: str, sigma2: np.ndarray) -> np.ndarray:
    """β_a of every agent's data: uniform σ√(3/20) (Lemma 2), Gaussian σ/2, Bernoulli 1/3."""
    sigma = np.sqrt(np.asarray(sigma2, dtype=float))
    if distribution == "uniform":
        return sigma * math.sqrt(3.0 / 20.0)
    if distribution == "gaussian":
        return sigma / 2.0
    return np.full_like(sigma, 1.0 / 3.0)


def metropolis_weights(graph: Graph, kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w_e over directed edges, W_aa) of eq. (2) for the neighbour sets `kept`.

    W_ab = 1/(1 + max(|C_a|, |C_b|)) for kept edges, 0 otherwise; W_aa = 1 − Σ_b W_ab. With
    symmetric `kept` (kept[e] == kept[reverse[e]]) W is symmetric and doubly stochastic.
    """
    size = row_sums(graph, kept.astype(float))
    w = np.where(kept, 1.0 / (1.0 + np.maximum(size[graph.src], size[graph.dst])), 0.0)
    return w, 1.0 - row_sums(graph, w)


def row_sums(graph: Graph, x: np.ndarray) -> np.ndarray:
    """Σ over each agent's outgoing edges of the per-edge values x (CSR order)."""
    out = np.zeros(graph.n, dtype=np.result_type(x.dtype, np.int64))
    rows = graph.degree > 0
    if rows.any():
        out[rows] = np.add.reduceat(x, graph.indptr[:-1][rows])
    return out


# --------------------------------------------------------------------------------------------
# the protocol


@PROTOCOLS.register("c-colme")
class CColME(Protocol):
    """C-ColME (Galante et al.): consensus over estimated same-class neighbours of a graph."""

    Params = CColMEParams
    message_kinds = ("state", "decision", "size")
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
        self.graph = g
        m, e = g.n, g.n_directed
        self.src, self.dst, self.reverse = g.src, g.dst, g.reverse
        self._keys = g.src * m + g.dst  # sorted (CSR order): finds an edge's slot
        self._rows = g.degree > 0
        self._starts = g.indptr[:-1][self._rows]
        L = float(ctx.public["L"])
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
        self._beta_data = data_bernstein_parameter(ctx.public.get("distribution", "uniform"),
                                                   sigma2)
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
        self.nb_x, self.nb_n, self.nb_y = np.zeros(e), np.zeros(e), np.zeros(e)
        self.nb_x_prev, self.nb_n_prev = np.zeros(e), np.zeros(e)
        # t_b shared by every stored state (synchronous agents), None when they differ
        self._nb_n_all: float | None = 0.0
        self._nb_n_prev_all: float | None = 0.0
        self.chi = np.full(e, p.initial == "all")  # χ_a(b), a's own decision
        self.their_chi = self.chi.copy()  # χ_b(a), as b told a
        self.kept = self.chi.copy()  # C_a as a boolean per edge
        self.size = self._count(self.kept)  # |C_a|
        self.nb_size = self.size[self.dst].astype(float)  # |C_b| as b told a
        self._kept_idx = np.flatnonzero(self.kept)
        self._fallback = np.zeros(m, dtype=bool)
        self._changed = np.zeros(m, dtype=bool)  # C_a changed in this slot
        self._sent: dict[str, tuple[np.ndarray, np.ndarray | slice]] = {}
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
        # message e carries the state of b = dst[e] to a = src[e], filed in a's slot e;
        # columns are contiguous (the transpose of a C array) for the receiver's arithmetic
        payload = np.empty((3, self.graph.n_directed)).T
        np.take(self.priv_sum / t, self.dst, out=payload[:, 0])
        payload[:, 1] = t
        np.take(self.y, self.dst, out=payload[:, 2])
        self._send("state", self.dst, self.src, payload, slice(None))
        if self.graph.n_directed == 0:  # nobody to talk to: no message will trigger the step
            self._decided()

    def _send(self, kind: str, src: np.ndarray, dst: np.ndarray, payload: np.ndarray,
              slots: np.ndarray | slice) -> None:
        """Send and remember which receiver slots the messages fill (for the fast path)."""
        self._sent[kind] = (src, slots)
        self.ctx.send(kind, src, dst, payload)

    def _slots(self, batch: Batch, kind: str) -> np.ndarray | slice:
        """The receiver's edge slot of every message of `batch` (receiver dst, sender src)."""
        src, slots = self._sent.get(kind, (None, None))
        if batch.src is src:  # delivered as sent (e.g. ideal links): no lookup needed
            return slots
        return np.searchsorted(self._keys, batch.dst * self.graph.n + batch.src)

    # -- deliveries ------------------------------------------------------------------------
    def on_deliver(self, batch: Batch) -> None:
        if batch.only >= 0:  # one kind (always so with ideal links): no need to split
            self._handlers[batch.only](batch)
            return
        for kind, handle in zip(self.message_kinds, self._handlers, strict=True):
            part = batch.of_kind(kind)
            if len(part):
                handle(part)

    def _on_state(self, batch: Batch) -> None:
        e = self._slots(batch, "state")
        x, n, y = batch.payload[:, 0], batch.payload[:, 1], batch.payload[:, 2]
        if isinstance(e, slice):  # every neighbour's state of one slot: keep the columns
            self.nb_x_prev, self.nb_n_prev = self.nb_x, self.nb_n
            self._nb_n_prev_all = self._nb_n_all
            self.nb_x, self.nb_n, self.nb_y = x, n, y
            self._nb_n_all = float(n[0]) if len(n) else None
        else:
            self.nb_x_prev, self.nb_n_prev = self.nb_x.copy(), self.nb_n.copy()
            self.nb_x_prev[e], self.nb_n_prev[e] = self.nb_x[e], self.nb_n[e]
            self.nb_x, self.nb_n, self.nb_y = self.nb_x.copy(), self.nb_n.copy(), self.nb_y.copy()
            self.nb_x[e], self.nb_n[e], self.nb_y[e] = x, n, y
            self._nb_n_prev_all = self._nb_n_all = None
        chi = self._rule(e)
        if self.params.decisions == "irrevocable":
            chi &= self.chi[e]
        self.chi[e] = chi
        if self.params.symmetric:
            # a = src[e] tells b = dst[e]; b files it in its slot reverse[e]
            self._send("decision", self.src[e], self.dst[e], chi.astype(float), self.reverse[e])
        else:
            self._decided()

    def _on_decision(self, batch: Batch) -> None:
        self.their_chi[self._slots(batch, "decision")] = batch.payload[:, 0] > 0.5
        self._decided()

    def _decided(self) -> None:
        """C_a^(t) is known: restart ages where it changed, tell kept neighbours |C_a|."""
        kept = self.chi & self.their_chi if self.params.symmetric else self.chi.copy()
        self._changed = self._count(kept != self.kept) > 0
        self.kept = kept
        self.size = self._count(kept)
        self._kept_idx = np.flatnonzero(kept)
        if self.params.restart == "hard":
            self._restart(self._changed)
        if not self._sends_sizes or len(self._kept_idx) == 0:
            self._update()
            return
        # b = dst[idx] tells a = src[idx] its |C_b|, filed in a's slot idx
        sender = self.dst[self._kept_idx]
        self._send("size", sender, self.src[self._kept_idx],
                   self.size.astype(float)[sender], self._kept_idx)

    def _on_size(self, batch: Batch) -> None:
        self.nb_size[self._slots(batch, "size")] = batch.payload[:, 0]
        self._update()

    # -- neighbour test ----------------------------------------------------------------------
    def _rule(self, e: np.ndarray | slice) -> np.ndarray:
        """χ_a(b) for the edges e (a = src[e], b = dst[e]) from privatised values only."""
        if self.uses_oracle:
            return self._oracle_chi[e].copy()
        if self.params.values == "fresh":
            x_b, n_all, n_b = self.nb_x[e], self._nb_n_all, self.nb_n[e]
        else:
            x_b, n_all, n_b = self.nb_x_prev[e], self._nb_n_prev_all, self.nb_n_prev[e]
        if n_all == 0.0:  # nothing from the neighbours yet (stale, t = 1): keep them all
            return np.ones(len(x_b), dtype=bool)
        a, b = self.src[e], self.dst[e]
        n_a = float(self.t)
        diff = np.abs((self.priv_sum / n_a)[a] - x_b)
        if n_all is None:  # states of different ages; none yet (t_b = 0) counts as a keep
            unknown = n_b == 0
            n_b = np.where(unknown, n_a, n_b)
        else:
            unknown, n_b = None, n_all
        if self.params.rule == "optimistic":
            keep = diff <= self._radius(n_a, a) + self._radius(n_b, b)
        else:
            keep = diff < self._bernstein(np.minimum(n_a, n_b), a, b)
        return keep if unknown is None else keep | unknown

    def _radius(self, n: float | np.ndarray, agents: np.ndarray) -> np.ndarray:
        """β(n; σ̃_a, γ) of the DP-adjusted optimistic distance for the given agents."""
        s2 = float(self.sigma2_tilde[0]) if self._equal_var else self.sigma2_tilde[agents]
        return confidence_radius(n, s2, self._gamma)

    def _bernstein(self, n: float | np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """z_t of the Bernstein pair test on X̃_a − X̃_b (scaled by `threshold_scale`)."""
        p = self.params
        terms = 4 if self.sigma2_dp > 0 else 2  # X_a, X_b (and Z_a, Z_b) are independent
        s_dp = math.sqrt(self.sigma2_dp)
        if self._equal_var:
            s2: float | np.ndarray = 2.0 * float(self.sigma2_tilde[0])
            beta: float | np.ndarray = math.sqrt(terms) * max(
                float(self._beta_data[0]), float(self._sigma[0]), s_dp / math.sqrt(2.0), s_dp
            )
        else:
            s2 = self.sigma2_tilde[a] + self.sigma2_tilde[b]
            beta = math.sqrt(terms) * np.maximum.reduce(
                [self._beta_data[a], self._beta_data[b], self._sigma[a], self._sigma[b],
                 np.full(len(a), s_dp)]
            )
        theta = p.theta / np.log(np.asarray(n, dtype=float) + 1.0)
        return p.threshold_scale * bernstein_threshold(n, s2, beta, theta,
                                                       p.threshold == "exact")

    # -- consensus step ----------------------------------------------------------------------
    def _restart(self, changed: np.ndarray) -> None:
        """Reset the age s of agents whose C_a changed (or of everyone, for a global reset)."""
        reset = self.params.reset
        if reset == "agent":
            self.start[changed] = self.t - 1
        elif reset == "global" and changed.any():
            self.start[:] = self.t - 1

    def _update(self) -> None:
        """Y_a ← (1−α) X̃_a + α (W_aa Y_a + Σ_b W_ab Y_b), then the fallback decision."""
        p = self.params
        m = self.graph.n
        idx = self._kept_idx
        if len(idx) == self.graph.n_directed:  # every link kept: no need to compress
            nb_size, nb_y = self.nb_size, self.nb_y
        else:
            nb_size, nb_y = self.nb_size[idx], self.nb_y[idx]
        size = self.size
        w = self._weights(nb_size)
        # W_aa Y_a + Σ_b W_ab Y_b = Y_a + Σ_b W_ab (Y_b − Y_a) over b ∈ C_a; the kept edges are
        # in CSR order, so agent a's are the |C_a| consecutive ones
        rows = size > 0
        starts = np.cumsum(size)[rows] - size[rows]
        mixed = self.y.copy()
        if len(starts):
            mixed[rows] += np.add.reduceat(w * (nb_y - np.repeat(self.y, size)), starts)
        age = self.t - self.start
        decay = p.alpha_c / age if p.alpha_p == 1.0 else p.alpha_c * age ** (-p.alpha_p)
        one_minus_alpha = np.minimum(1.0, decay)
        if p.alpha_c < 1.0:  # α = 0 at age 1 (a (re)start) whatever the schedule
            one_minus_alpha[age <= 1] = 1.0
        self.y = one_minus_alpha * (self.priv_sum / self.t) + (1.0 - one_minus_alpha) * mixed
        if p.restart == "galante":
            self._restart(self._changed)
        if p.fallback != "none":
            # |C̃_a| = 1: nobody kept; = 2: one neighbour b kept, and b keeps only a
            single = np.zeros(m)
            if len(starts):
                single[rows] = np.add.reduceat(nb_size, starts)
            self._fallback = (size == 0) | ((size == 1) & (single == 1))

    def _weights(self, nb_size: np.ndarray) -> np.ndarray | float:
        """W_ab of the kept edges (CSR order) given |C_b| as each b told: eq. (2) or 1/(1+d)."""
        if self.params.weights == "metropolis":
            return 1.0 / (1.0 + np.maximum(np.repeat(self.size, self.size), nb_size))
        return self._w_const

    def mixing_matrix(self) -> sp.csr_array:
        """W^(t) of the last consensus step as a sparse M×M matrix (W_aa on the diagonal)."""
        idx, m = self._kept_idx, self.graph.n
        w = np.broadcast_to(self._weights(self.nb_size[idx]), idx.shape)
        off = sp.csr_array((w, (self.src[idx], self.dst[idx])), shape=(m, m))
        return (off + sp.diags_array(1.0 - off.sum(axis=1))).tocsr()

    # -- what the recorder reads -------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        """Y_a, or the local mean for agents in the fallback case."""
        if self.params.fallback == "none" or self.t == 0:
            return self.y.copy()
        local = (self.raw_sum if self.params.fallback == "local" else self.priv_sum) / self.t
        return np.where(self._fallback, local, self.y)

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
