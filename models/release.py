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

from models.privacy import sample_noise


def levels_for(t_max: int) -> int:
    """Number of binary levels PM-II needs for at most `t_max` releases per pair."""
    return max(1, int(t_max).bit_length())


def set_bits(j: np.ndarray, levels: int) -> np.ndarray:
    """Boolean matrix (len(j), levels): bit s of every j."""
    return ((j[:, None] >> np.arange(levels)) & 1).astype(bool)


def lowest_set_bit(j: np.ndarray) -> np.ndarray:
    """Level of the lowest set bit of every j ≥ 1 (the level of PM-II's new node)."""
    return np.log2(j & -j).astype(np.int64)


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
    ) -> None:
        self.mechanism = mechanism
        self.noise = noise
        self.sigma2 = sigma2
        self.rng = rng
        #: κ_{b→a}: releases made so far by b to a, indexed [b, a].
        self.count = np.zeros((n_agents, n_agents), dtype=np.int64)
        if mechanism == "pm1":
            self._total = np.zeros((n_agents, n_agents))
        else:
            self.levels = levels_for(max_releases)
            self._node = np.zeros((n_agents, n_agents, self.levels))

    def release(
        self, b: np.ndarray, a: np.ndarray, sums: np.ndarray, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Releases of agents b to agents a; `sums`, `counts` are b's sample sums and counts.

        Returns (values, j): the privatised means (S_b + Z)/t and each release's index j.
        Pairs (b[i], a[i]) must be distinct within one call.
        """
        pair = b * self.count.shape[1] + a
        j = self.count.ravel()[pair] + 1
        self.count.ravel()[pair] = j
        fresh = sample_noise(self.rng, self.noise, self.sigma2, len(b))
        if self.mechanism == "pm1":
            z = self._total.ravel()[pair] + fresh
            self._total.ravel()[pair] = z
        else:
            nodes = self._node[b, a]
            nodes[np.arange(len(b)), lowest_set_bit(j)] = fresh
            self._node[b, a] = nodes
            z = (nodes * set_bits(j, self.levels)).sum(axis=1)
        return (sums + z) / counts, j
