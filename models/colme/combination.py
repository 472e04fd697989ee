"""Each agent's sums in Lemma 4's combination, kept up to date release by release.

`CombinationSums` holds Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}] of every agent a, for
populations where recomputing them from the M × M pair state at every estimate costs too much
(`PrivateColME.incremental_above`). `rounds` and `has_repeats` split batches in which a key
repeats into rounds of distinct keys, as the vectorised pair updates need. `trimmed_sums` gives
the same two sums over the peers a coordinate-wise trimmed mean keeps (``combination =
"trimmed"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


class CombinationSums:
    """Each agent's Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}], kept up to date.

    A release replaces one pair's terms (old by new). Sums are compensated (Neumaier), so their
    error stays at a few ulps of the sum of the terms' magnitudes whatever the number of
    replacements; the number of non-zero terms is counted exactly, so an agent that excludes
    every other one has sums of exactly 0. A non-finite term (Var[T] = 0) marks its agent for
    recomputation from the pair state at the next `totals`.
    """

    def __init__(self, n_agents: int) -> None:
        self.sums = np.zeros((2, n_agents))  # Σ T/Var and Σ 1/Var
        self.carry = np.zeros((2, n_agents))  # Neumaier compensation of each sum
        self.terms = np.zeros(n_agents, dtype=np.int64)  # non-zero 1/Var terms
        self.dirty = np.zeros(n_agents, dtype=bool)
        self._agents = np.arange(n_agents)

    def replace(
        self,
        a: np.ndarray,
        old_num: np.ndarray,
        old_den: np.ndarray,
        new_num: np.ndarray,
        new_den: np.ndarray,
    ) -> None:
        """Replace the terms (old_num, old_den) of agents a by (new_num, new_den)."""
        ok = (
            np.isfinite(old_num)
            & np.isfinite(new_num)
            & np.isfinite(old_den)
            & np.isfinite(new_den)
        )
        if not ok.all():
            self.dirty[a[~ok]] = True
        if len(a) == len(self.terms) and np.array_equal(a, self._agents):
            self._replace_all(old_num, old_den, new_num, new_den)
            return
        self.terms += np.bincount(
            a, weights=(new_den != 0).astype(float) - (old_den != 0), minlength=len(self.terms)
        ).astype(np.int64)
        # the old terms leave and the new ones enter as separate compensated additions: their
        # difference, formed in plain floating point, would lose the ulps of a large term
        if len(a) > 1 and has_repeats(a):  # several releases to one agent (in a window):
            parts = rounds(a, np.argsort(a, kind="stable"))  # its r-th term in round r
        else:
            parts = [slice(None)]
        for x in (-np.stack([old_num, old_den]), np.stack([new_num, new_den])):
            for i in parts:
                self._add(a[i], x[:, i])

    def _replace_all(
        self,
        old_num: np.ndarray,
        old_den: np.ndarray,
        new_num: np.ndarray,
        new_den: np.ndarray,
    ) -> None:
        """`replace` for every agent once, in order (a synchronous slot): the same floats, row
        by row, without index arrays (gathering and scattering both rows by an index array
        costs ten times the arithmetic)."""
        self.terms += (new_den != 0).astype(np.int64) - (old_den != 0)
        x = np.empty_like(self.sums)  # both rows at once: each row's additions in `_add`'s order
        np.negative(old_num, out=x[0])
        np.negative(old_den, out=x[1])
        self._add_exact(x)
        x[0], x[1] = new_num, new_den
        self._add_exact(x)

    def _add_exact(self, x: np.ndarray) -> None:
        """Add x (2 × every agent) to the sums, the rounding error of each addition to the
        carry: Knuth's TwoSum, whose error is exact as Neumaier's branch in `_add` is, so the
        same numbers, in branch-free passes."""
        s = self.sums
        total = s + x
        x_part = total - s  # x′
        s_part = total - x_part  # s′
        s_part -= s
        x_part -= x
        s_part += x_part  # (s′ − s) + (x′ − x): the error negated, exactly
        self.carry -= s_part
        self.sums = total

    def _add(self, a: np.ndarray, x: np.ndarray) -> None:
        """Add x (2 × len(a)) to the sums of distinct agents a (Neumaier's step)."""
        s = self.sums[:, a]
        total = s + x
        self.carry[:, a] += np.where(np.abs(s) >= np.abs(x), (s - total) + x, (x - total) + s)
        self.sums[:, a] = total

    def totals(self, row_sums: Any) -> tuple[np.ndarray, np.ndarray]:
        """The two sums of every agent; `row_sums(rows)` recomputes those marked dirty."""
        if self.dirty.any():
            rows = np.flatnonzero(self.dirty)
            self.sums[0, rows], self.sums[1, rows] = row_sums(rows)
            self.carry[:, rows] = 0.0
            self.dirty[rows] = False
        out = self.sums + self.carry
        out[:, self.terms == 0] = 0.0  # every term removed: exactly nothing to weigh
        return out[0], out[1]


def rounds(key: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """Indices of `key` in rounds of distinct keys: round r holds the r-th occurrence of each
    key, where `order` sorts `key` and ranks equal keys (e.g. a stable argsort: send order)."""
    ordered = key[order]
    head = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    rank = np.arange(len(order)) - np.repeat(head, np.diff(np.append(head, len(order))))
    return [order[rank == r] for r in range(int(rank.max()) + 1)]


def has_repeats(pair: np.ndarray) -> bool:
    """Whether some pair id occurs more than once."""
    ordered = np.sort(pair)
    return bool((ordered[1:] == ordered[:-1]).any())


def trimmed_sums(
    weight: np.ndarray, value: np.ndarray, beta: float
) -> tuple[np.ndarray, np.ndarray]:
    """Σ_b w_b T_b and Σ_b w_b over each row's peers left after a coordinate-wise trimmed mean's
    trim (Yin et al. 2018): of the n peers with weight w_b > 0, the ⌊β·n⌋ lowest and the ⌊β·n⌋
    highest T_b are dropped (ties in peer order), and Lemma 4's weights apply to the rest."""
    peers = weight > 0
    n = peers.sum(axis=1)
    cut = np.floor(beta * n).astype(np.int64)
    order = np.argsort(np.where(peers, value, np.inf), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None, :], axis=1)
    kept = peers & (rank >= cut[:, None]) & (rank < (n - cut)[:, None])
    w = np.where(kept, weight, 0.0)
    return np.where(kept, w * value, 0.0).sum(axis=1), w.sum(axis=1)
