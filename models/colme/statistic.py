"""The statistic T_{b→a} of seed 002 eq. (1) and its exact variance, kept in O(1) per pair.

T_{b→a} = Σ_j w_j R_j is a weighted average of b's releases R_j to a (made when b had t_j
samples). All three weight choices of the paper average uniformly over a block of recent
releases [J0, κ]:

- ``last`` (non-MoM): the block is the last release alone;
- ``mom`` (mean of means): every release, J0 = 1;
- ``wmom`` (windowed MoM, corrected weight, docs/papers.md §1.1): J0 = 2^⌊log₂ κ⌋, the current
  dyadic block, so the block restarts whenever κ is a power of two.

Var[T] (eq. (2) with (20) for PM-I and the exact dyadic-node form of (21) for PM-II) is
(σ_b²·D + σ_DP²·A)/n² with n the block length, D = Σ_r (2r−1)/t_{J0+r−1} the data term and A
the noise term Σ_nodes (Σ_{j in block using the node} 1/t_j)². Each release updates D and A
incrementally, so no per-pair history is stored.

Under asynchrony a receives a subset of b's releases (some are lost or discarded), always in
increasing j, so the block is taken over the releases a received: ``mom`` restarts at the first
one, ``wmom`` when the highest bit of j differs from that of the last received index κ (a new
dyadic block), ``last`` at every release. D is exact for any received subset (its t's
increase with j); so is PM-I's noise term (release j uses p-sums 1..j, whatever a missed).
PM-II's node at level ℓ of release j is identified by j >> ℓ, so a level's running 1/t sum is
reset when j >> ℓ differs from κ >> ℓ (a node a has not seen before), not only at j's lowest set
bit. When every j is κ + 1 (always so with ideal links) the update does exactly the synchronous
arithmetic.

Under a ``degrade`` budget (`desim.models.privacy.budget`) the p-sums a pair's releases complete
from its release j_d on carry ρσ_DP² (ρ = (m'/m)², one per run) instead of σ_DP². Each node then
enters A with the variance it was drawn with: A = Σ_nodes ρ_node (Σ_{j in block using it} 1/t_j)².
PM-I's update needs only c_j = Var Z_j/σ_DP² = Σ_{i ≤ j} ρ_i in place of j (`noise_count`);
PM-II's weighs each node by whether the release that made it, ⌊j/2^ℓ⌋·2^ℓ, is ≥ j_d
(`node_noise`). Without a degraded release the updates are the ones above, bit for bit.

`SchVar2` is Sch-Var-2 (§V-B), a's estimate of σ_b² from the same releases.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from desim.models.privacy.bits import lowest_set_bit, set_bits

if TYPE_CHECKING:
    from desim.models.colme.positions import RoundRobinPairs


class PairStatistic:
    """T_{b→a} and the terms of Var[T_{b→a}] for every ordered pair, indexed [a, b].

    The data variance σ_b² is the caller's (known, or estimated in the unknown-variance
    schemes): `variance` combines it with the exact DP term, σ_DP² = `sigma2_dp`. Before b's
    first release, T = 0 and Var = +∞ (the paper's convention, so b gets weight 0).
    """

    # rows of the packed per-pair state (one gather and one scatter per update): κ, block
    # length n, block sum, D, A and, for PM-I, the sum over p-sums of their running 1/t sums
    _ROWS = 6

    def __init__(
        self,
        n_agents: int,
        mechanism: str,
        weights: str,
        sigma2_dp: float,
        levels: int,
        n_pairs: int | None = None,
        degraded_ratio: float = 1.0,
        positions: RoundRobinPairs | None = None,
    ) -> None:
        # `degraded_ratio` is ρ, a degraded p-sum's noise variance over σ_DP² (`update`).
        # `n_pairs` (default M²) holds only the pairs that exist, by the caller's pair index
        # (Private-ColME on a graph: its edges); the [a, b] views are then not available.
        # `positions`: the M² pairs are numbered by RR position, and the [a, b] views read
        # through that numbering
        n_pairs = n_agents * n_agents if n_pairs is None else n_pairs
        self.n_agents = n_agents
        self.positions = positions
        self.mechanism = mechanism
        self.weights = weights
        self.sigma2_dp = float(sigma2_dp)
        self.degraded_ratio = float(degraded_ratio)
        # ``last`` under PM-I after a degraded release: c_j of each pair's last release, where
        # A = c_j·D·D (κ·D·D until then, so it is made at the first degraded update)
        self._count: np.ndarray | None = None
        # ... unless every pair is degraded from its first release (j_d = 1 for all, a scalar):
        # then c = κ·ρ, computed where read, and nothing per pair is kept or scattered
        self._from_first = False
        # PM-II: row r is ρ at the r lowest levels and 1 above (`node_noise`), made at first use
        self._noise_rows: np.ndarray | None = None
        # ``last`` keeps no block: n is 1 from the first release on and every sum restarts at
        # each release, so only what the last release fixed is stored: the block sum, D and,
        # under PM-II, A (under PM-I, A = κ·D·D, the very floats the update computes), with κ
        # as int32 — 20 bytes per pair instead of 48 under PM-I (M = 5000: 0.5 GB, not 1.2).
        self.compact = weights == "last"
        self._stored = (
            ([2, 3] if mechanism == "pm1" else [2, 3, 4])
            if self.compact
            else list(range(self._ROWS))
        )
        self._flat = np.zeros((n_pairs, len(self._stored)))  # one row per pair
        if n_pairs == n_agents * n_agents:
            self._state = self._flat.reshape(n_agents, n_agents, -1)
        if self.compact and mechanism == "pm1":
            # ``last`` under PM-I: the block sum and D of a pair as one complex cell (real, imag),
            # so an update scatters once, 1-D (far cheaper than a (pairs, column) index)
            self._pairs = self._flat.view(np.complex128).reshape(-1)
        if self.compact:
            self._kappa = np.zeros(n_pairs, dtype=np.int32)
        if mechanism == "pm2":
            self.levels = levels
            if not self.compact:  # ``last`` restarts every node at each release
                self._node = np.zeros((n_pairs, levels))  # 1/t sum of each node

    def _rows(self, pair: np.ndarray, kappa_only: bool = False) -> np.ndarray:
        """The full rows (κ, n, block sum, D, A, node sum) of the flat pairs (a copy); with
        `kappa_only` (``last``, about to restart) only κ is filled in."""
        if not self.compact:
            return self._flat.take(pair, axis=0)
        rows = np.zeros((len(pair), self._ROWS))
        rows[:, 0] = self._kappa.take(pair)
        if kappa_only:
            return rows
        rows[:, 2 : 2 + len(self._stored)] = self._flat.take(pair, axis=0)
        rows[:, 1] = rows[:, 0] > 0
        if self.mechanism == "pm1":
            rows[:, 4] = rows[:, 0] * rows[:, 3] * rows[:, 3]
        return rows

    def _put(self, pair: np.ndarray, rows: np.ndarray) -> None:
        """Store full `rows` of the flat pairs."""
        if self.compact:
            self._kappa[pair] = rows[:, 0]
            self._flat[pair] = rows[:, 2 : 2 + len(self._stored)]
        else:
            self._flat[pair] = rows

    def _columns(
        self, rows: np.ndarray | slice
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """n, block sum, D and A of the agents a in `rows` (every b), as [a, b] arrays."""
        if self.positions is not None:
            pairs = self.positions.querier_rows(rows)
            return tuple(x.reshape(pairs.shape) for x in self.pair_columns(pairs.ravel()))
        state = self._state[rows]
        if not self.compact:
            return state[..., 1], state[..., 2], state[..., 3], state[..., 4]
        kappa = self._kappa.reshape(self.n_agents, self.n_agents)[rows].astype(float)
        total, data = state[..., 0], state[..., 1]
        if self.mechanism == "pm2":
            noise = state[..., 2]
        else:
            count = self._count_of(kappa, lambda c: c.reshape(self.n_agents, -1)[rows])
            noise = count * data * data
        return (kappa > 0).astype(float), total, data, noise

    def pair_columns(
        self, pair: np.ndarray | slice
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """n, block sum, D and A of the flat pairs `pair` (indices or a slice), as `_columns`
        forms them."""
        state = self._flat[pair]
        if not self.compact:
            return state[:, 1], state[:, 2], state[:, 3], state[:, 4]
        kappa = self._kappa[pair].astype(float)
        total, data = state[:, 0], state[:, 1]
        if self.mechanism == "pm2":
            noise = state[:, 2]
        else:
            noise = self._count_of(kappa, lambda c: c[pair]) * data * data
        return (kappa > 0).astype(float), total, data, noise

    def last_pm1_columns(self, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``last`` under PM-I, every pair: κ as stored, the block sum and D, with A = c·D·D
        written into `noise` (one float per pair): `pair_columns`' floats (an integer κ times
        a float is κ cast, then multiplied) without its temporaries."""
        total, data = self._flat[:, 0], self._flat[:, 1]
        if self._count is not None:
            np.multiply(self._count, data, out=noise)
        elif self._from_first:
            np.multiply(self._kappa, self.degraded_ratio, out=noise)
            noise *= data
        else:
            np.multiply(self._kappa, data, out=noise)
        noise *= data
        return self._kappa, total, data

    @property
    def kappa(self) -> np.ndarray:
        """κ_{b→a}: releases a has received from b."""
        if self.positions is not None:
            return self.positions.matrix(self._kappa).astype(np.int64)
        if self.compact:
            return self._kappa.reshape(self.n_agents, self.n_agents).astype(np.int64)
        return self._state[..., 0].astype(np.int64)

    @property
    def value(self) -> np.ndarray:
        """T_{b→a} (0 before the first release)."""
        return self.value_of(slice(None))

    def value_of(self, rows: np.ndarray | slice) -> np.ndarray:
        """T_{b→a} of the agents a in `rows` (every b), 0 before the first release."""
        n, total, _data, _noise = self._columns(rows)
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)

    def variance(
        self, sigma2_data: np.ndarray, rows: np.ndarray | slice = slice(None)
    ) -> np.ndarray:
        """Var[T_{b→a}] of every pair given σ_b² as a matrix [a, b] or a row of agents b
        (only the agents a in `rows`, if given; a matrix σ² then has those rows only).

        +∞ before b's first release to a, and wherever σ_b² is +∞ (unknown).
        """
        n, _total, data, noise = self._columns(rows)
        with np.errstate(invalid="ignore"):
            num = sigma2_data * data + self.sigma2_dp * noise
        return np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)

    def terms(self, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """T_{b→a}, D, A and n of the flat pairs a·n_agents + b (T = 0 before a release)."""
        if self.compact and self.mechanism == "pm1":
            return self._terms_last_pm1(pair)
        rows = self._rows(pair)
        n, total = rows[:, 1], rows[:, 2]
        return (
            np.divide(total, n, out=np.zeros_like(total), where=n > 0),
            rows[:, 3],
            rows[:, 4],
            n,
        )

    def _terms_last_pm1(
        self, pair: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`terms` for ``last`` weights under PM-I: the floats `_rows` forms, read column by
        column (n = [κ > 0], A = κ·D·D)."""
        kappa = self._kappa.take(pair).astype(float)
        total, data = self._flat.take(pair, axis=0).T  # (one pass: a pair's cells are adjacent)
        n = (kappa > 0).astype(float)
        value = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
        count = self._count_of(kappa, lambda c: c.take(pair))
        return value, data, count * data * data, n

    def last_terms(
        self, pair: np.ndarray | slice
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``last`` under PM-I (n is 0 or 1): whether each of the flat pairs (a slice: a run of
        them, whose block sums and D are then views of the state) has a release, its block sum
        (T itself: 0 before a release), D and A, without forming n and T."""
        run = isinstance(pair, slice)
        kappa = self._kappa[pair] if run else self._kappa.take(pair)
        total, data = (self._flat[pair] if run else self._flat.take(pair, axis=0)).T
        count = self._count_of(kappa.astype(float), lambda c: c[pair] if run else c.take(pair))
        return kappa > 0, total, data, count * data * data

    def _keep_count(self, pair: np.ndarray, count: np.ndarray, degraded_from: Any) -> None:
        """PM-I ``last``: keep c of the pairs' new releases (before their κ is), per pair, or
        not at all while every pair is degraded from its first release (j_d = 1, a scalar,
        before any pair took a release at m)."""
        if self._count is None:
            if _from_first(degraded_from) and (self._from_first or not self._kappa.any()):
                self._from_first = True
                return
            self._count = self._count_of(self._kappa.astype(float), None)
            self._from_first = False
        self._count[pair] = count

    def _count_of(self, kappa: np.ndarray, kept: Any) -> np.ndarray:
        """PM-I ``last``: c of the pairs' last releases given their κ (floats): κ before any
        degraded release, κ·ρ (the bits of the j·ρ `noise_count` gives) while every pair is
        degraded from its first release, else `kept(c)` of the per-pair c."""
        if self._count is not None:
            return kept(self._count)
        return kappa * self.degraded_ratio if self._from_first else kappa

    def last_index(self, pair: np.ndarray) -> np.ndarray:
        """κ of the flat pairs a·n_agents + b: the index j of the last release a took from b."""
        if self.compact:
            return self._kappa[pair].astype(float)
        return self._flat[pair, 0]

    def update(
        self,
        a: np.ndarray,
        b: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        consecutive: bool = False,
        pair: np.ndarray | None = None,
        degraded_from: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Take releases `values` from b to a, the j-th each, made when b had t samples
        (`pair`: their pair indices, default a·M + b; `degraded_from`: each pair's j_d, from
        which its p-sums carry ρσ_DP², or None when no release anywhere was degraded).

        Every j must exceed the pair's κ (gaps are allowed) and the pairs must be distinct;
        `consecutive` says that every j is κ + 1 (the caller knows: nothing was lost).
        Returns T_{b→a}, D, A and n of the updated pairs, so that Var[T] = (σ_b²D + σ_DP²A)/n²
        (n is the scalar 1.0 when every block is the last release alone: ``last`` under PM-I).
        """
        if pair is None:
            pair = a * self.n_agents + b
        if self.compact and self.mechanism == "pm1":  # gaps change nothing: every sum restarts
            if not consecutive and (j <= self._kappa[pair]).any():
                raise ValueError("a release index j must exceed the last one taken (κ)")
            return self._update_last_pm1(pair, values, t, j, degraded_from)
        rows = self._rows(pair, kappa_only=self.compact)  # ``last`` restarts every sum below
        kappa, n, total, data, noise, node_total = rows.T  # views: updated in place below
        if not consecutive and (kappa + 1 != j).any():
            return self._update_with_gaps(pair, rows, values, t, j, degraded_from)
        if self.weights == "last":
            rows[:, 1:] = 0.0
        else:
            restart = j == 1 if self.weights == "mom" else (j & (j - 1)) == 0
            rows[restart, 1:] = 0.0
        u = self._take(rows, values, t, j, degraded_from)
        if self.mechanism == "pm2":
            if self.weights != "last":
                nodes = self._node.take(pair, axis=0)
                nodes *= ~restart[:, None]
            else:
                nodes = np.zeros((len(pair), self.levels))
            nodes[np.arange(len(pair)), lowest_set_bit(j)] = 0.0  # the node that starts at j
            self._take_nodes(pair, rows, j, u, nodes, degraded_from)
        return self._finish(pair, rows)

    def noise_count(self, j: np.ndarray, degraded_from: np.ndarray) -> np.ndarray:
        """PM-I: c_j = Var Z_j/σ_DP² of releases j, whose p-sums i ≥ j_d carry ρσ_DP² (j_d = 1,
        a scalar: every p-sum, c_j = j·ρ, the bits of 0 + (j − 0)·ρ)."""
        if _from_first(degraded_from):
            return j * self.degraded_ratio
        early = np.minimum(j, degraded_from - 1)
        return early + (j - early) * self.degraded_ratio

    def node_noise(self, j: np.ndarray, degraded_from: np.ndarray) -> np.ndarray:
        """PM-II: each level's node variance over σ_DP² in releases j (ρ where the release that
        made the node, ⌊j/2^ℓ⌋·2^ℓ, is ≥ j_d; 1 otherwise), as (releases, levels).

        ⌊j/2^ℓ⌋·2^ℓ ≥ j_d ⟺ j >> ℓ > (j_d − 1) >> ℓ, which for j > j_d − 1 holds exactly at the
        levels below the bit length of j XOR (j_d − 1): the ρ levels are a prefix, so each row
        is one of L + 1 rows built once (one look-up, not four passes over (releases, levels)).
        """
        if self._noise_rows is None:
            level = np.arange(self.levels)
            self._noise_rows = np.where(
                level < np.arange(self.levels + 1)[:, None], self.degraded_ratio, 1.0
            )
        low = degraded_from - 1  # j_d ≥ 1
        prefix = np.frexp(j ^ low)[1]  # the bit length of every j XOR (j_d − 1)
        return self._noise_rows[np.where(j > low, prefix, 0)]

    def _update_last_pm1(
        self,
        pair: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`update` for ``last`` weights under PM-I: the general path's floats (with gaps in j
        or not), without its packed rows.

        That path restarts every sum at 0 and adds the release once (`_take`): n = 1, block sum
        0 + R, D = 0 + (2·1 − 1)·u = u and A = 0 + (2u·0 + j·u·u) = j·u·u exactly, u = 1/t
        (c_j·u·u after a degraded release: c_j is then kept per pair).
        """
        u = 1.0 / t
        count = j
        if degraded_from is not None:
            count = self.noise_count(j, degraded_from)
            self._keep_count(pair, count, degraded_from)
        total = values + 0.0  # 0 + R as `_take` forms it (a −0.0 becomes +0.0 there too)
        self._kappa[pair] = j.astype(np.int32)  # (a cast before the scatter is cheaper)
        if isinstance(pair, slice):  # a run of pairs: their cells written where they are
            cell = self._pairs[pair]
        else:
            cell = np.empty(len(pair), dtype=np.complex128)
        cell.real, cell.imag = total, u  # the bits of total and u, unchanged
        if not isinstance(pair, slice):
            self._pairs[pair] = cell
        return total, u, count * u * u, 1.0

    def _take(
        self,
        rows: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add release j (value, made at t) to the packed `rows` in place: κ, block length and
        sum, the data term and, for PM-I, the noise term; returns u = 1/t.

        PM-I: release j uses every p-sum 1..j and each gains u (p-sums after the last one taken
        are new, their sums 0, so this holds with gaps too). With p-sum variances ρ_i σ_DP²,
        ΔA = Σ_{i≤j} ρ_i (2u S_i + u²) = 2u·Σ_i ρ_i S_i + c_j u², so the last row keeps
        Σ_i ρ_i S_i and j becomes c_j (`noise_count`).
        """
        kappa, n, total, data, noise, node_total = rows.T
        u = 1.0 / t
        kappa[:] = j
        n += 1
        total += values
        data += (2 * n - 1) * u
        if self.mechanism == "pm1":
            count = j if degraded_from is None else self.noise_count(j, degraded_from)
            noise += 2 * u * node_total + count * u * u
            node_total += count * u
        return u

    def _update_with_gaps(
        self,
        pair: np.ndarray,
        rows: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`update` when some j skips indices: blocks and PM-II nodes follow j's identity."""
        kappa, n, total, data, noise, node_total = rows.T
        if (j <= kappa).any():
            raise ValueError("a release index j must exceed the last one taken (κ)")
        last = kappa.astype(np.int64)  # κ before this release
        if self.weights == "last":
            restart = np.ones(len(pair), dtype=bool)
        elif self.weights == "mom":
            restart = last == 0
        else:  # j's highest set bit lies above κ's (every bit of κ), so a new dyadic block
            restart = (j ^ last) > last
        rows[restart, 1:] = 0.0
        u = self._take(rows, values, t, j, degraded_from)
        if self.mechanism == "pm2":
            level = np.arange(self.levels)
            # the node a level holds is j's own only if j and κ agree on every bit from ℓ up
            same = (j[:, None] >> level) == (last[:, None] >> level)
            nodes = (
                np.zeros((len(pair), self.levels))
                if self.compact  # ``last``: restart
                else np.where(same & ~restart[:, None], self._node.take(pair, axis=0), 0.0)
            )
            self._take_nodes(pair, rows, j, u, nodes, degraded_from)
        return self._finish(pair, rows)

    def _take_nodes(
        self,
        pair: np.ndarray,
        rows: np.ndarray,
        j: np.ndarray,
        u: np.ndarray,
        nodes: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> None:
        """PM-II: release j uses the tree nodes of its set bits; each gains u. `nodes` holds
        each used node's sum before this release (0 for a node that starts with it); a node
        adds to A in proportion to its variance (`node_noise`)."""
        noise = rows[:, 4]
        used = set_bits(j, self.levels)
        gain = used * (2 * u[:, None] * nodes + (u * u)[:, None])
        if degraded_from is not None:
            gain *= self.node_noise(j, degraded_from)
        noise += gain.sum(axis=1)
        if not self.compact:
            self._node[pair] = nodes + used * u[:, None]

    def _finish(
        self, pair: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Store the updated `rows`; return T_{b→a}, D, A and n of the pairs."""
        kappa, n, total, data, noise, node_total = rows.T
        self._put(pair, rows)
        return total / n, data, noise, n


def noise_difference(mechanism: str, j: np.ndarray, j_prev: np.ndarray, levels: int) -> np.ndarray:
    """Number of p-sum noises in exactly one of releases j and j_prev < j (0: none before).

    The noise of t_j R_j − t_{j'} R_{j'} is the sum of these (shared noises cancel). PM-I:
    j − j'. PM-II: the symmetric difference of the dyadic node sets, a node (ℓ, j >> ℓ) being
    shared when bit ℓ is set in both and j, j' agree from bit ℓ up; 1 + lsb(j) when j' = j − 1.
    """
    if mechanism == "pm1":
        return (j - j_prev).astype(float)
    used, used_prev = set_bits(j, levels), set_bits(j_prev, levels)
    level = np.arange(levels)
    shared = used & ((j[:, None] >> level) == (j_prev[:, None] >> level))
    return (used.sum(axis=1) + used_prev.sum(axis=1) - 2 * shared.sum(axis=1)).astype(float)


class SchVar2:
    """Sch-Var-2 (§V-B): a's estimate of σ_b² from the noisy p-sums it recovers from b's releases.

    Differencing received releases i−1, i gives P_i = t_i R_i − t_{i−1} R_{i−1} over
    d_i = t_i − t_{i−1} samples, with noise variance c_i σ_DP² (`noise_difference`: 1 under
    PM-I and 1 + lsb(j) under PM-II when consecutive). With k received releases,
    V' = (Σ P_i²/d_i − (ΣP)²/D)/(k−1) and K = (Σ c_i/d_i − c/D)/(k−1), D = t_κ, ΣP = t_κ R_κ,
    c = the noise count of the last release (PM-I: j; PM-II: w_H(j)); V = V' − Kσ_DP² is
    unbiased (the unbiased form of (16) for unequal d_i; a gap is a longer p-sum with more
    noises). Per pair: the last t·R and t, Σ P²/d and Σ c/d.
    """

    def __init__(self, n_pairs: int, mechanism: str, levels: int) -> None:
        self.mechanism = mechanism
        self.levels = levels
        self._state = np.zeros((n_pairs, 4))

    def update(
        self,
        pair: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        sigma2_dp: float,
        j_prev: np.ndarray | None = None,
        k: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Take release j (value R, made at t) of each pair; returns V', Kσ_DP² and k.

        `j_prev` is the index of the pair's previous received release and `k` the number
        received including this one; `j_prev` None means every release was received (j − 1,
        and k = j). V' and K are meaningless while k < 2 (the caller sets V = +∞).
        """
        rows = self._state.take(pair, axis=0)
        sum_prev, t_prev, p2d, cd = rows.T  # t_{i−1}R_{i−1} (the noisy running sum), t_{i−1}
        total = t * values
        psum = total - sum_prev
        inv_d = 1.0 / (t - t_prev)
        if j_prev is None:
            k = j
            cd += inv_d if self.mechanism == "pm1" else (1.0 + lowest_set_bit(j)) * inv_d
        else:
            cd += noise_difference(self.mechanism, j, j_prev, self.levels) * inv_d
        c_total = (
            j.astype(float)
            if self.mechanism == "pm1"
            else set_bits(j, self.levels).sum(axis=1).astype(float)
        )
        p2d += psum * psum * inv_d
        sum_prev[:], t_prev[:] = total, t
        self._state[pair] = rows
        k1 = np.maximum(k - 1.0, 1.0)  # k − 1; k = 1 is the caller's +∞
        v_raw = (p2d - total * values) / k1
        k_noise = sigma2_dp * (cd - c_total / t) / k1
        return v_raw, k_noise, k


def _from_first(degraded_from: Any) -> bool:
    """Whether j_d is the scalar 1: every pair degraded from its first release."""
    return isinstance(degraded_from, int) and degraded_from == 1
