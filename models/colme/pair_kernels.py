"""The compiled kernels of Private-ColME's per-pair update on an irregular graph, and the
mechanism, statistic and beliefs classes that take them (`desim.models.colme.compiled` chooses
them; importing this module imports numba, where it is installed)."""

from __future__ import annotations

import numpy as np

from desim import fast
from desim.models.colme.graph import EdgeBeliefs
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.calibration import sample_noise
from desim.models.privacy.release import PSumRelease


@fast.kernel
def release_pm1(count, total, pair, fresh, sums, counts, j, values):  # pragma: no cover
    """PM-I releases of distinct pairs: κ + 1 into `j` and κ, the noise total Z plus the new
    p-sum's noise into Z, and (S_b + Z)/t_b into `values` (`PSumRelease.release`'s floats)."""
    for i in range(len(pair)):
        e = pair[i]
        k = count[e] + 1
        count[e] = k
        j[i] = k
        z = total[e] + fresh[i]
        total[e] = z
        values[i] = (sums[i] + z) / counts[i]


@fast.kernel
def take_last_pm1(kappa, cells, pair, values, t, j, total, u, noise):  # pragma: no cover
    """``last`` under PM-I: κ = j, the block sum 0 + R and D = 1/t of distinct pairs written,
    and (block sum, D, A = j·u·u) returned in `total`, `u`, `noise`
    (`PairStatistic._update_last_pm1`'s floats)."""
    for i in range(len(pair)):
        e = pair[i]
        v = 1.0 / t[i]
        s = values[i] + 0.0
        kappa[e] = j[i]
        cells[e, 0] = s
        cells[e, 1] = v
        total[i] = s
        u[i] = v
        noise[i] = j[i] * v * v


@fast.kernel
def revise_pairs(flat, n_included, a, pair, decision):  # pragma: no cover
    """χ_a(b) of distinct pairs set to `decision`, each querier's count of included pairs kept
    in step (`pairs.revise`'s integers)."""
    for i in range(len(pair)):
        e = pair[i]
        now = decision[i]
        if flat[e] != now:
            flat[e] = now
            n_included[a[i]] += 1 if now else -1


@fast.kernel
def rr_next(ahead, last):  # pragma: no cover
    """RR's next pairs and their neighbours (`NeighbourRoundRobin.targets`): row `last[i]` of
    `ahead` (`Neighbours.ahead`) for each querier, one row read per querier."""
    pair = np.empty(len(last), dtype=np.int64)
    neighbour = np.empty(len(last), dtype=np.int64)
    for i in range(len(last)):
        pair[i] = ahead[last[i], 0]
        neighbour[i] = ahead[last[i], 1]
    return pair, neighbour


class CompiledRelease(PSumRelease):
    """`PSumRelease` whose PM-I releases of pairs given as indices run in one kernel."""

    def release(
        self,
        b: np.ndarray | None,
        a: np.ndarray | None,
        sums: np.ndarray,
        counts: np.ndarray,
        scale: np.ndarray | None = None,
        pair: np.ndarray | slice | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`PSumRelease.release`, the same bytes (and the same noise draws, in order)."""
        if self.mechanism != "pm1" or scale is not None or not isinstance(pair, np.ndarray):
            return super().release(b, a, sums, counts, scale, pair)
        fresh = sample_noise(self.rng, self.noise, self.sigma2, len(pair))
        j = np.empty(len(pair), dtype=self._count_flat.dtype)
        values = np.empty(len(pair))
        release_pm1(self._count_flat, self._total_flat, pair, fresh, sums, counts, j, values)
        return values, j, fresh


class CompiledStatistic(PairStatistic):
    """`PairStatistic` whose ``last`` PM-I update of pairs given as indices runs in one kernel
    (before any degraded release: no budget)."""

    def _update_last_pm1(
        self,
        pair: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`PairStatistic._update_last_pm1`, the same bytes."""
        if degraded_from is not None or not isinstance(pair, np.ndarray):
            return super()._update_last_pm1(pair, values, t, j, degraded_from)
        n = len(pair)
        total, u, noise = np.empty(n), np.empty(n), np.empty(n)
        take_last_pm1(self._kappa, self._flat, pair, values, t, j, total, u, noise)
        return total, u, noise, 1.0


class CompiledBeliefs(EdgeBeliefs):
    """`EdgeBeliefs` whose revision of pairs given as indices runs in one kernel."""

    def revise_pairs(
        self,
        a: np.ndarray,
        pair: np.ndarray,
        decision: np.ndarray,
        current: np.ndarray | None = None,
    ) -> None:
        """`EdgeBeliefs.revise_pairs`, the same bytes."""
        if current is not None or not isinstance(pair, np.ndarray):
            super().revise_pairs(a, pair, decision, current)
        else:
            revise_pairs(self.flat, self.n_included, a, pair, decision)


def warm() -> None:
    """Call every kernel once on a few pairs: numba loads (or compiles) them now, not in the
    first slot that takes them (benchmarks time this apart)."""
    pair, values, ones = np.arange(2), np.zeros(2), np.ones(2)
    kappa = np.zeros(2, dtype=np.int32)
    release_pm1(kappa, values.copy(), pair, values, values, ones, kappa.copy(), values.copy())
    take_last_pm1(kappa, np.zeros((2, 2)), pair, values, ones, pair, *np.zeros((3, 2)))
    revise_pairs(np.zeros(2, dtype=bool), np.zeros(2, dtype=np.int64), pair, pair, ones > 0)
    # and with the argument types of a run on a graph whose agents all query: the queriers
    # read-only (`every_agent`), their sample counts a read-only strided view
    agents, t_b = np.arange(2), np.ones(4)[::2]
    agents.flags.writeable = t_b.flags.writeable = False
    release_pm1(kappa, values.copy(), pair, values, values, t_b, kappa.copy(), values.copy())
    revise_pairs(np.zeros(2, dtype=bool), np.zeros(2, dtype=np.int64), agents, pair, ones > 0)
    ahead = np.zeros((2, 2), dtype=np.int32)  # (`Neighbours.ahead`'s rows)
    ahead.flags.writeable = False  # (a graph's numbering is read-only)
    rr_next(ahead, pair)
