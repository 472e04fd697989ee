"""Forgetting for data whose means move (desim's extension: no seed paper gives one).

A scenario's ``forget = {…}`` table names one rule, applied to every agent's own samples:

- ``window = W``: a sliding window, the statistic uses the agent's last W samples;
- ``rate = λ``: exponential weights, sample s weighs λ^(t − s) at slot t;
- ``reset = τ``: a restart at a known slot, the statistic uses the samples from slot τ on.

`Forget` is the table, checked; `ForgettingSums` keeps the statistic of every agent's own
samples (the local and ideal baselines, the empirical-Bayes uploads, Private-ColME's own mean).
Each family allows the rules it computes exactly (`Forget.from_table`); Private-ColME's windows
over privatised releases are `desim.models.colme.forgetting`.

Every rule gives a weighted mean Σ_s w_s x_s / Σ_s w_s with weights known to everyone, so its
variance is σ² Σ w_s² / (Σ w_s)² = σ²/n_eff, n_eff = (Σ w_s)²/Σ w_s² (`effective`): W (or the
samples so far) in a window, t − τ + 1 after a reset, (1 + λ)/(1 − λ) in the exponential
steady state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from desim.kernel.params import build, param

#: The rules of a forget table, in the order messages list them.
RULES = ("window", "rate", "reset")


@dataclass(frozen=True)
class Forget:
    """A ``forget = {window = W | rate = λ | reset = τ}`` table: one forgetting rule."""

    window: int | None = param(None, "sliding window: the last W samples of every agent", ge=1)
    rate: float | None = param(
        None, "exponential forgetting: sample s weighs λ^(t − s) at slot t", gt=0, lt=1
    )
    reset: int | None = param(None, "restart at slot τ: the samples from slot τ on", ge=2)

    def __post_init__(self) -> None:
        given = [name for name in RULES if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                f"forget = {{{', '.join(given)}}}: give exactly one of {', '.join(RULES)}"
            )

    @property
    def rule(self) -> str:
        """The rule given: window, rate or reset."""
        return next(name for name in RULES if getattr(self, name) is not None)

    @property
    def value(self) -> float:
        """The rule's parameter (W, λ or τ)."""
        return getattr(self, self.rule)

    def check_horizon(self, t_max: int) -> None:
        """Refuse a reset after the horizon (`ValueError`, one line): it would never happen."""
        if self.reset is not None and self.reset > t_max:
            raise ValueError(
                f"forget: reset = {self.reset}: after t_max = {t_max}, so it never happens "
                f"(allowed: 2 to {t_max})"
            )

    @classmethod
    def from_table(cls, table: Any, allowed: tuple[str, ...], family: str, why: str) -> Forget:
        """The checked table of a protocol `family` that computes the rules `allowed` exactly;
        ValueError with one line naming the rule, its value, what is allowed and `why`."""
        if isinstance(table, Forget):
            forget = table
        elif isinstance(table, dict):
            forget = build(cls, table, "forget")
        else:
            raise ValueError(f"forget = {table!r}: must be a table {{window | rate | reset = …}}")
        if forget.rule not in allowed:
            raise ValueError(
                f"forget: {forget.rule} = {forget.value!r}: {family} allows "
                f"{', '.join(allowed)} ({why})"
            )
        return forget


def forget_param() -> Any:
    """The ``forget`` parameter of a protocol's Params (absent: every sample counts forever)."""
    return param(
        None,
        "a forget table {window = W | rate = λ | reset = τ}: the statistics forget old samples "
        "(desim's extension, `desim.models.forgetting`)",
    )


def refuse_when_stopping(params: Any) -> None:
    """Refuse a ``forget`` rule when agents stop sampling (`ValueError`, one line): its weights
    are per slot, and a stopped agent has no sample in some slots."""
    if getattr(params, "forget", None) is not None:
        raise ValueError(
            "forget: agents that stop sampling (exhausted = 'stop') have no sample in some "
            "slots, which the forgetting weights do not allow; use exhausted = 'cycle'"
        )


class ForgettingSums:
    """Every agent's forgetting statistic of its own samples: the weighted sum Σ w_s x_s, the
    weight total Σ w_s and Σ w_s² (the same for every agent: one sample each per slot); with
    `squares` (window or reset only: weights 1) also Σ w_s x_s², for the sample variance over
    the same samples."""

    def __init__(self, forget: Forget, n_agents: int, squares: bool = False) -> None:
        self.forget = forget
        self.rule = forget.rule
        self.sums = np.zeros(n_agents)
        #: Σ x_s² over the samples the rule keeps (None without `squares`).
        self.sumsq = np.zeros(n_agents) if squares else None
        #: Σ_s w_s and Σ_s w_s² of the samples so far.
        self.weight = 0.0
        self.weight2 = 0.0
        self._seen = 0
        if forget.rule == "window":
            # the last W samples, row (s − 1) mod W: what leaves the window is subtracted
            self._ring = np.zeros((forget.window, n_agents))

    @staticmethod
    def bytes_per_agent(forget: Forget, squares: bool = False) -> float:
        """Bytes these sums hold per agent under `forget` (the last W samples of a window, the
        sums), for the memory estimate of `desim validate`."""
        return 8.0 * ((forget.window or 0) * (forget.rule == "window") + 1 + squares)

    def add(self, t: int, samples: np.ndarray) -> None:
        """Take every agent's sample of slot `t` (slots in order)."""
        f, rule = self.forget, self.rule
        if rule == "rate":
            self.sums *= f.rate
            self.sums += samples
            self.weight = f.rate * self.weight + 1.0
            self.weight2 = f.rate * f.rate * self.weight2 + 1.0
            return
        squares = self.sumsq
        if rule == "reset" and t == f.reset:
            self.sums[:] = 0.0
            self.weight = self.weight2 = 0.0
            if squares is not None:
                squares[:] = 0.0
        if rule == "window":
            row = self._ring[self._seen % f.window]
            if self._seen >= f.window:
                self.sums -= row
                if squares is not None:
                    squares -= row * row
            row[:] = samples
            self.weight = self.weight2 = float(min(self._seen + 1, f.window))
        else:
            self.weight += 1.0
            self.weight2 += 1.0
        self._seen += 1
        self.sums += samples
        if squares is not None:  # (in the order the protocol's own Σx² adds them)
            squares += samples * samples

    @property
    def slots(self) -> int:
        """The slots taken so far (the agents' clock)."""
        return self._seen

    def mean(self) -> np.ndarray:
        """The weighted mean of every agent (0 before its first sample)."""
        return self.sums / self.weight if self.weight > 0 else np.zeros_like(self.sums)

    def effective(self) -> float:
        """n_eff = (Σ w_s)²/Σ w_s²: the weighted mean's variance is σ²/n_eff."""
        return self.weight * self.weight / self.weight2 if self.weight2 > 0 else 0.0


def forgetting_weights(slot: int, forget: Forget) -> np.ndarray:
    """w_k of the samples of ages k = 0 … slot − 1 (k = t − s) in the forgetting mean at `slot`."""
    ages = np.arange(slot, dtype=float)
    if forget.rule == "window":
        return (ages < forget.window).astype(float)
    if forget.rule == "rate":
        return forget.rate**ages
    last = slot - forget.reset if slot >= forget.reset else slot  # the oldest age kept
    return (ages <= last).astype(float)


def weighted_mean_mse(
    t: np.ndarray, sigma2: float, forget: Forget, rate: float = 0.0, switch: tuple = ()
) -> np.ndarray:
    """MSE at slots `t` of an agent's forgetting mean of independent samples of variance σ²
    (the local baseline's closed form): σ²/n_eff plus the squared bias of a mean that moves by
    `rate` per slot, (rate · Σ_k w_k k/Σ_k w_k)², or of a `switch` = (τ, E[Δ²] times the share
    that switches) at slot τ, E[Δ²]·(Σ_{k ≥ t − τ + 1} w_k/Σ_k w_k)² from τ on (the weight left
    on samples drawn before it)."""
    out = np.empty(len(t))
    for i, slot in enumerate(np.asarray(t, dtype=np.int64)):
        w = forgetting_weights(int(slot), forget)
        ages = np.arange(len(w), dtype=float)
        total = w.sum()
        bias2 = (rate * (w * ages).sum() / total) ** 2
        if switch and slot >= switch[0]:
            bias2 += switch[1] * (w[int(slot - switch[0] + 1) :].sum() / total) ** 2
        out[i] = sigma2 * (w * w).sum() / total**2 + bias2
    return out


def difference_noise_count(
    mechanism: str, j: np.ndarray, i: np.ndarray, weights: tuple | None = None
) -> np.ndarray:
    """The p-sum noises, in units of σ_DP², of the difference of a pair's released prefixes
    j > i ≥ 0 (release 0: the empty prefix, no noise): PM-I, the p-sums i + 1 … j; PM-II, the
    tree nodes of j and of i that are not shared (node (ℓ, j >> ℓ) at each set bit ℓ of j).
    PM-II's `weights` (of j's nodes, of i's; each (releases, levels)) weigh each node by its
    variance over σ_DP² (a degraded node's ρ); None: every node 1."""
    j = np.asarray(j, dtype=np.int64)
    i = np.asarray(i, dtype=np.int64)
    if mechanism == "pm1":
        return (j - i).astype(float)
    levels = max(1, int(j.max(initial=1)).bit_length())
    shift = np.arange(levels)
    bit_j, bit_i = (j[:, None] >> shift) & 1, (i[:, None] >> shift) & 1
    shared = bit_j & bit_i & ((j[:, None] >> shift) == (i[:, None] >> shift))
    if weights is not None:
        w_j, w_i = (w[:, :levels] for w in weights)
        return ((bit_j - shared) * w_j + (bit_i - shared) * w_i).sum(axis=1)
    return (bit_j.sum(axis=1) + bit_i.sum(axis=1) - 2 * shared.sum(axis=1)).astype(float)


class PrefixWindow:
    """Per pair (a responder and its receiver), the prefixes it released — (t_j, t_j R_j, j),
    each a noisy sum of its first t_j samples — kept as long as a window may start at one, and
    the base a ``forget`` rule differences against: the statistic over samples t_i + 1 … t_j is
    (t_j R_j − t_i R_i)/(t_j − t_i), post-processing of releases already made (no new release,
    nothing more for the ledger).

    A window's base is the oldest release held among the pair's `kept` before j (j − kept …
    j − 1) with t_j − t_i ≤ W. Taking every release in order (ideal links), `kept` ≥ the most
    releases of one pair within W + 1 slots makes it the oldest within W. With `gaps` (links
    that are not ideal: some releases never taken) a cell may hold an older release than its
    index, so each cell also keeps its j and a cell whose j is not the one looked for is
    skipped."""

    def __init__(self, forget: Forget, n_pairs: int, kept: int, gaps: bool = False) -> None:
        self.forget = forget
        self.reset = forget.rule == "reset"
        # Pair p's release k (k = 0: the empty prefix, t = 0) is one complex cell (t_k, t_k R_k)
        # at p·depth + k mod depth: one gather reads both. depth, a power of two ≥ kept + 1
        # (any such depth finds the same base), makes the cell index a shift and a mask.
        self._shift = kept.bit_length() if forget.rule == "window" else 0
        self._mask = (1 << self._shift) - 1
        self._kept = kept
        self._ring = np.zeros(n_pairs << self._shift, dtype=np.complex128)
        self.gaps = gaps
        # with gaps: the j each cell holds (0 everywhere: the empty prefix, release 0, at k = 0)
        self._held = np.zeros(len(self._ring), dtype=np.int64) if gaps else None
        self._j = np.zeros(n_pairs, dtype=np.int64)  # (reset: the base's j)
        #: Whether a reset's base is stored, per pair.
        self._stored = np.zeros(n_pairs, dtype=np.int64)
        #: The oldest release of each pair still inside its window.
        self._head = np.zeros(n_pairs, dtype=np.int64)

    @staticmethod
    def bytes_per_pair(forget: Forget, kept: int, gaps: bool = False) -> float:
        """Bytes a `PrefixWindow` of these arguments holds per pair (its ring's cells, each
        cell's j with `gaps`, the heads and a reset's base), for the memory estimate of
        `desim validate`."""
        cells = 1 << kept.bit_length() if forget.rule == "window" else 1
        return (16.0 + 8.0 * gaps) * cells + 24.0

    def take(
        self, pair: np.ndarray, value: np.ndarray, t: np.ndarray, j: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Take releases (distinct pairs, j above each pair's last): (n, S̃, i) with n = t_j − t_i
        the samples the window keeps, S̃ its noisy sum and i the base release (n = 0: no whole
        p-sum in the window yet)."""
        prefix = value * t
        if self.reset:
            return self._take_reset(pair, prefix, t, j)
        mask = self._mask
        first = pair << self._shift
        cell = first + (j & mask)
        # this release first (`kept` bounds the releases in a window, so it never overwrites
        # one inside), so the search below stops at it at the latest (n = 0: no whole p-sum);
        # its two parts written in place (a complex t + i·prefix would be built first)
        self._ring.real[cell], self._ring.imag[cell] = t, prefix
        head = self._head.take(pair)
        if self.gaps:
            return self._search_gaps(pair, cell, head, first, j, prefix, t, t - self.forget.window)
        # the oldest release with n = t_j − t_i ≤ W (integers: exact): heads move on (about one
        # release a call); `count_nonzero` is numpy's cheapest test of a flag on a few hundred
        window = self.forget.window
        old = self._ring.take(first + (head & mask))
        n = t - old.real
        move = n > window
        while np.count_nonzero(move):
            head += move
            old = self._ring.take(first + (head & mask))
            n = t - old.real
            move = n > window
        self._head[pair] = head
        return n, prefix - old.imag, head

    def _search_gaps(
        self,
        pair: np.ndarray,
        cell: np.ndarray,
        head: np.ndarray,
        first: np.ndarray,
        j: np.ndarray,
        prefix: np.ndarray,
        t: np.ndarray,
        start: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`take`'s search with gaps: from the head (or the oldest index a cell can still hold),
        skip the indices not held and the releases older than the window."""
        self._held[cell] = j
        # the last `kept` indices before j: their cells are not overwritten (depth > kept)
        head = np.maximum(head, j - self._kept)
        at = first + (head & self._mask)
        old, held = self._ring.take(at), self._held.take(at)
        move = (held != head) | (old.real < start)
        while move.any():  # (it stops at j itself, held and inside the window)
            head += move
            at = first + (head & self._mask)
            old, held = self._ring.take(at), self._held.take(at)
            move = (held != head) | (old.real < start)
        self._head[pair] = head
        return t - old.real, prefix - old.imag, head

    def increments(
        self, pair: np.ndarray, head: np.ndarray, j: np.ndarray, mechanism: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Under ``window``, right after `take` (`head`: its bases): over the consecutive
        releases held from each base to j, the p-sum differences P = t_k R_k − t_k' R_k' over
        d = t_k − t_k' samples with c (`difference_noise_count`) noises, (Σ P²/d, Σ c/d, their
        number), summed from the base on (Sch-Var-2 over the window's samples)."""
        prev = self._ring.take((pair << self._shift) + (head & self._mask))
        prev_j = head.copy()
        p2d, cd = np.zeros(len(pair)), np.zeros(len(pair))
        count = np.zeros(len(pair))
        for k, cell, live in self.walk(pair, head, j):
            if not live.all():
                k = np.where(live, k, prev_j)
                cell = np.where(live, cell, prev)
            psum = cell.imag - prev.imag
            c = difference_noise_count(mechanism, k, prev_j)
            with np.errstate(divide="ignore", invalid="ignore"):  # (d = 0 where not live)
                inv_d = 1.0 / (cell.real - prev.real)
                # (the no-forget Sch-Var-2's floats: psum·psum·(1/d) and c·(1/d), base on)
                p2d += np.where(live, psum * psum * inv_d, 0.0)
                cd += np.where(live, c * inv_d, 0.0)
            count += live
            prev, prev_j = cell, k
        return p2d, cd, count

    def walk(self, pair: np.ndarray, head: np.ndarray, j: np.ndarray) -> Any:
        """Under ``window``, right after `take` (`head`: its bases): the releases held after
        each base up to j, one index a step: (k, its cell t_k + i·t_k R_k, whether the pair
        holds release k: k ≤ j and, with gaps, received)."""
        first = pair << self._shift
        for step in range(1, int((j - head).max(initial=0)) + 1):
            k = head + step
            live = k <= j
            at = first + (k & self._mask)
            cell = self._ring.take(at)
            if self.gaps:  # (a cell of an index never received holds an older release)
                live &= self._held.take(at) == k
            yield k, cell, live

    def base_index(self, pair: np.ndarray) -> np.ndarray:
        """Under ``reset``: each pair's base release j (0 while none is stored)."""
        return np.where(self._stored.take(pair) == 1, self._j.take(pair), 0)

    def _take_reset(
        self, pair: np.ndarray, prefix: np.ndarray, t: np.ndarray, j: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`take` under ``reset = τ``: before slot τ the base is the empty prefix; from τ on it is
        the first release whose prefix ends at or after slot τ − 1 (n = 0 until a later one)."""
        tau = self.forget.reset
        if t.max(initial=0) < tau - 1:  # (before τ − 1: every sample, nothing to keep)
            return t, prefix, np.zeros_like(j)
        record = (t >= tau - 1) & (self._stored.take(pair) == 0)  # the first such: the base
        if record.any():
            new = pair[record]
            self._ring[new] = t[record] + 1j * prefix[record]
            self._j[new] = j[record]
            self._stored[new] = 1
        base, base_j = self._ring.take(pair), self._j.take(pair)
        if t.min() < tau:  # before τ the statistic is every sample's
            use = t >= tau
            base, base_j = np.where(use, base, 0.0), np.where(use, base_j, 0)
        return t - base.real, prefix - base.imag, base_j
