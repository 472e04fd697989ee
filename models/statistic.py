"""The statistic T_{b→a} of seed 002 eq. (1) and its exact variance, kept in O(1) per pair.

T_{b→a} = Σ_j w_j R_j is a weighted average of b's releases R_j to a (made when b had t_j
samples). All three weight choices of the paper average uniformly over a block of recent
releases [J0, κ]:

- ``last`` (non-MoM): the block is the last release alone;
- ``mom`` (mean of means): every release, J0 = 1;
- ``wmom`` (windowed MoM, corrected weight of the digest): J0 = 2^⌊log₂ κ⌋, the current
  dyadic block, so the block restarts whenever κ is a power of two.

Var[T] (eq. (2) with (20) for PM-I and the exact dyadic-node form of (21) for PM-II) is
(σ_b²·D + σ_DP²·A)/n² with n the block length, D = Σ_r (2r−1)/t_{J0+r−1} the data term and A
the noise term Σ_nodes (Σ_{j in block using the node} 1/t_j)². Each release updates D and A
incrementally, so no per-pair history is stored.
"""

from __future__ import annotations

import numpy as np

from models.bits import lowest_set_bit, set_bits


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
    ) -> None:
        self.n_agents = n_agents
        self.mechanism = mechanism
        self.weights = weights
        self.sigma2_dp = float(sigma2_dp)
        self._state = np.zeros((n_agents, n_agents, self._ROWS))
        self._flat = self._state.reshape(-1, self._ROWS)  # one contiguous row per pair
        if mechanism == "pm2":
            self.levels = levels
            self._node = np.zeros((n_agents * n_agents, levels))  # 1/t sum of each level's node

    @property
    def kappa(self) -> np.ndarray:
        """κ_{b→a}: releases a has received from b."""
        return self._state[..., 0].astype(np.int64)

    @property
    def value(self) -> np.ndarray:
        """T_{b→a} (0 before the first release)."""
        n, total = self._state[..., 1], self._state[..., 2]
        return np.divide(total, n, out=np.zeros_like(total), where=n > 0)

    def variance(self, sigma2_data: np.ndarray) -> np.ndarray:
        """Var[T_{b→a}] of every pair given σ_b² as a matrix [a, b] or a row of agents b.

        +∞ before b's first release to a, and wherever σ_b² is +∞ (unknown).
        """
        n, data, noise = self._state[..., 1], self._state[..., 3], self._state[..., 4]
        with np.errstate(invalid="ignore"):
            num = sigma2_data * data + self.sigma2_dp * noise
        return np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)

    def update(
        self, a: np.ndarray, b: np.ndarray, values: np.ndarray, t: np.ndarray, j: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Take releases `values` from b to a, the j-th each, made when b had t samples.

        Returns T_{b→a}, D, A and n of the updated pairs, so that Var[T] = (σ_b²D + σ_DP²A)/n².
        """
        pair = a * self.n_agents + b
        rows = self._flat.take(pair, axis=0)
        kappa, n, total, data, noise, node_total = rows.T  # views: updated in place below
        if (kappa + 1 != j).any():
            raise ValueError("releases must arrive in order, one per index j")
        if self.weights == "last":
            rows[:, 1:] = 0.0
        else:
            restart = j == 1 if self.weights == "mom" else (j & (j - 1)) == 0
            rows[restart, 1:] = 0.0
        u = 1.0 / t
        kappa[:] = j
        n += 1
        total += values
        data += (2 * n - 1) * u
        if self.mechanism == "pm1":
            # every p-sum 1..j is used by release j, and each gains u
            noise += 2 * u * node_total + j * u * u
            node_total += j * u
        else:
            nodes = self._node.take(pair, axis=0)
            if self.weights != "last":
                nodes *= ~restart[:, None]
            else:
                nodes[:] = 0.0
            nodes[np.arange(len(pair)), lowest_set_bit(j)] = 0.0  # the node that starts at j
            used = set_bits(j, self.levels)
            noise += (used * (2 * u[:, None] * nodes + (u * u)[:, None])).sum(axis=1)
            self._node[pair] = nodes + used * u[:, None]
        self._flat[pair] = rows
        return total / n, data, noise, n
