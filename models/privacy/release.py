"""PM-I and PM-II: privatised releases of a running mean built from noisy partial sums.

Agent b answers agent a with (S_b + Z)/t, where S_b is the sum of b's t samples and Z is the
noise of the p-sums (partial sums) that cover [1:t]. Noise is drawn per ordered pair (b → a)
and, as the paper requires, the same p-sum interval always carries the same noise value:

- PM-I (seed 002 §IV-A): one new p-sum per release, covering the samples since the previous
  release to a; Z is the sum of all noises so far, so one number per pair is kept (O(1)).
- PM-II (§IV-B, binary counting mechanism): release j uses one dyadic node per set bit of j;
  exactly one node is new (at the lowest set bit of j), the others are reused, so one noise
  value per level and pair is kept (O(log κ)).
"""

from __future__ import annotations

import numpy as np

from desim.models.privacy.bits import lowest_set_bit, set_bits
from desim.models.privacy.calibration import sample_noise


def levels_for(t_max: int) -> int:
    """Number of binary levels PM-II needs for at most `t_max` releases per pair."""
    return max(1, int(t_max).bit_length())


class PSumRelease:
    """The release mechanism of every ordered pair (b → a) of a population of `n_agents`.

    `sigma2` is σ_DP², the variance of the noise added to each p-sum; `noise` names its law.
    """

    def __init__(
        self,
        n_agents: int,
        mechanism: str,
        noise: str,
        sigma2: float,
        rng: np.random.Generator,
        max_releases: int,
        receivers: int | None = None,
    ) -> None:
        self.mechanism = mechanism
        self.noise = noise
        self.sigma2 = sigma2
        self.rng = rng
        # receivers a = 0…receivers−1 (default: the agents; 1: uploads to a server)
        shape = (n_agents, n_agents if receivers is None else receivers)
        #: κ_{b→a}: releases made so far by b to a, indexed [b, a].
        self.count = np.zeros(shape, dtype=np.int32)  # j < 2³¹: half the bytes
        self._receivers = shape[1]
        self._count_flat = self.count.reshape(-1)  # views indexed by pair b·receivers + a
        if mechanism == "pm1":
            self._total = np.zeros(shape)
            self._total_flat = self._total.reshape(-1)
        else:
            self.levels = levels_for(max_releases)
            self._node = np.zeros((*shape, self.levels))
            self._node_flat = self._node.reshape(-1, self.levels)

    def release(
        self,
        b: np.ndarray | None,
        a: np.ndarray | None,
        sums: np.ndarray,
        counts: np.ndarray,
        scale: np.ndarray | None = None,
        pair: np.ndarray | slice | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Releases of agents b to agents a; `sums`, `counts` are b's sample sums and counts.

        Returns (values, j, fresh): the privatised means (S_b + Z)/t, each release's index j,
        and the noise of the p-sum that release j completes (PM-I: p-sum j; PM-II: the node
        at the lowest set bit of j). Pairs (b[i], a[i]) must be distinct within one call.
        `scale` multiplies each release's new noise (a degraded budget's, after the same draws).
        `pair`, if given, is the flat index b·receivers + a of each pair (b and a may then be
        None): a caller that holds it spares the arithmetic of rebuilding it; a slice stands
        for a run of consecutive pairs.
        """
        if pair is None:
            pair = b * self._receivers + a
        run = isinstance(pair, slice)  # consecutive pairs: read and written as slices
        if run and self.mechanism != "pm1":
            pair = np.arange(pair.start, pair.stop)
            run = False
        j = (self._count_flat[pair] if run else self._count_flat.take(pair)) + 1
        self._count_flat[pair] = j
        fresh = sample_noise(self.rng, self.noise, self.sigma2, len(j))
        if scale is not None:
            fresh *= scale
        if self.mechanism == "pm1":
            z = self._total_flat[pair] if run else self._total_flat.take(pair)
            z += fresh  # (a slice's view: the noise totals themselves)
            if not run:
                self._total_flat[pair] = z
        else:
            nodes = self._node_flat.take(pair, axis=0)
            nodes[np.arange(len(pair)), lowest_set_bit(j)] = fresh
            self._node_flat[pair] = nodes
            z = (nodes * set_bits(j, self.levels)).sum(axis=1)
        values = sums + z
        values /= counts  # (in place: the floats of (sums + z)/counts, one array fewer)
        return values, j, fresh


class SampleVarianceRelease:
    """Sch-Var-1 (seed 002 §V-A): b also releases a privatised sample variance V_{b→a}.

    It reuses the mean release's split of [1:t] into p-sums (same intervals, same noises Z_i)
    and adds noise W_i of variance σ_{2,DP}² (Lemma 3) per p-sum, reused like Z_i. With S_i,
    SS_i and d_i the sum, sum of squares and length of p-sum i, eqs. (6)–(7) give
    Ṽ̃_i = SS_i + (2 S_i Z_i + Z_i²)/d_i + (d_i − 1) W_i/d_i, and the release (8) is

        V = (SS_b + Σ_i (2 S_i Z_i + Z_i² + (d_i−1) W_i)/d_i)/(t−1) − t R²/(t−1)
            − σ_DP² (Σ_i 1/d_i − k/t)/(t−1),

    with R the mean release. Only the noise part of each Ṽ̃_i is kept (one number per p-sum):
    a running total under PM-I, one value per level under PM-II. A release with t < 2 is
    +∞ (undefined). Negative releases are left to the receiver (which treats them as unknown).
    """

    def __init__(
        self,
        n_agents: int,
        mechanism: str,
        noise: str,
        sigma2_var: float,
        sigma2_dp: float,
        rng: np.random.Generator,
        max_releases: int,
    ) -> None:
        self.mechanism = mechanism
        self.noise = noise
        self.sigma2_var = sigma2_var
        self.sigma2_dp = sigma2_dp
        self.rng = rng
        self._n_agents = n_agents
        n_pairs = n_agents * n_agents
        if mechanism == "pm1":
            # per pair: prefix (S, t) at the last release, Σ_i noise part of Ṽ̃_i, Σ_i 1/d_i
            self._pm1 = np.zeros((n_pairs, 4))
        else:
            self.levels = levels_for(max_releases)
            # per pair and level: the prefix (S, t) at the release index whose lowest set bit
            # is that level (where the nodes that start later at lower levels begin), and the
            # noise part of Ṽ̃ and 1/d of the level's current node. Σ_i SS_i = SS_b needs no
            # prefix.
            self._prefix = np.zeros((n_pairs, self.levels, 2))
            self._part = np.zeros((n_pairs, self.levels, 2))

    def release(
        self,
        b: np.ndarray,
        a: np.ndarray,
        j: np.ndarray,
        fresh_z: np.ndarray,
        sums: np.ndarray,
        sumsq: np.ndarray,
        counts: np.ndarray,
        mean_release: np.ndarray,
    ) -> np.ndarray:
        """V_{b→a} of eq. (8) for releases j (with the mean-release noises `fresh_z`)."""
        pair = b * self._n_agents + a
        n = len(pair)
        fresh_w = sample_noise(self.rng, self.noise, self.sigma2_var, n)
        if self.mechanism == "pm1":
            state = self._pm1.take(pair, axis=0)
            s_prev, t_prev, total_part, inv_d = state.T  # views, updated in place
            d_i = counts - t_prev
            total_part += (2 * (sums - s_prev) * fresh_z + fresh_z**2 + (d_i - 1) * fresh_w) / d_i
            inv_d += 1.0 / d_i
            s_prev[:], t_prev[:] = sums, counts
            self._pm1[pair] = state
            k = j
        else:
            total_part, inv_d, k = self._pm2_parts(pair, j, fresh_z, fresh_w, sums, counts)
        t1 = np.maximum(counts - 1.0, 1.0)  # t = 1 is +∞ below
        v = (
            sumsq + total_part - counts * mean_release**2 - self.sigma2_dp * (inv_d - k / counts)
        ) / t1
        v[counts < 2] = np.inf
        return v

    def _pm2_parts(
        self,
        pair: np.ndarray,
        j: np.ndarray,
        fresh_z: np.ndarray,
        fresh_w: np.ndarray,
        sums: np.ndarray,
        counts: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Σ over the nodes of release j of the noise parts of Ṽ̃ and of 1/d, and their number."""
        rows = np.arange(len(pair))
        prefix = self._prefix.take(pair, axis=0)
        part = self._part.take(pair, axis=0)
        level = lowest_set_bit(j)
        # node (lsb, ·) covers releases (j − 2^lsb, j]; its start is the prefix at index
        # j − 2^lsb, stored under that index's own lowest set bit (or zero)
        before = j - (1 << level)
        start = np.where(
            (before > 0)[:, None],
            prefix[rows, np.where(before > 0, lowest_set_bit(np.maximum(before, 1)), 0)],
            0.0,
        )
        s_i = sums - start[:, 0]
        d_i = counts - start[:, 1]
        part[rows, level, 0] = (2 * s_i * fresh_z + fresh_z**2 + (d_i - 1) * fresh_w) / d_i
        part[rows, level, 1] = 1.0 / d_i
        prefix[rows, level, 0], prefix[rows, level, 1] = sums, counts
        self._prefix[pair] = prefix
        self._part[pair] = part
        used = set_bits(j, self.levels)
        return (part[:, :, 0] * used).sum(axis=1), (part[:, :, 1] * used).sum(axis=1), used.sum(1)
