"""The compiled pass of `desim.models.colme.dense.DenseTake`: a slot's releases in one loop.

Imported only where a run takes the dense path with numba present (`desim.fast.compiled`). The
loop does `DenseTake._take_numpy`'s operations element by element, in the same order, with only
+, −, ×, ÷, sqrt and comparisons, so it gives the same bytes.
"""

from __future__ import annotations

import math

import numpy as np

from desim import fast


@fast.kernel
def _responder(a, o, m):
    """b = a + o mod M, the agent that answers a at RR offset o (0 ≤ a, o < M)."""
    b = a + o
    return b - m if b >= m else b


@fast.kernel
def _inverse(x):
    """1/x as numpy divides (±∞ at ±0) without numba's division check."""
    if x == 0.0:
        return math.copysign(math.inf, x)
    return 1.0 / x


@fast.kernel
def _two_sum(sums, carry, row, a, x):
    """`CombinationSums._add_exact` for one cell: sums += x, its rounding error to carry."""
    s = sums[row, a]
    total = s + x
    x_part = total - s
    s_part = total - x_part
    s_part -= s
    x_part -= x
    s_part += x_part
    carry[row, a] -= s_part
    sums[row, a] = total


@fast.kernel
def _replace(sums, carry, terms, dirty, a, old_num, old_den, new_num, new_den):
    """`CombinationSums.replace` for agent a: the old terms leave, then the new ones enter."""
    finite = (
        np.isfinite(old_num)
        and np.isfinite(new_num)
        and np.isfinite(old_den)
        and np.isfinite(new_den)
    )
    if not finite:
        dirty[a] = True
    terms[a] += np.int64(new_den != 0.0) - np.int64(old_den != 0.0)
    _two_sum(sums, carry, 0, a, -old_num)
    _two_sum(sums, carry, 1, a, -old_den)
    _two_sum(sums, carry, 0, a, new_num)
    _two_sum(sums, carry, 1, a, new_den)


@fast.kernel
def _accepts(own, t, sigma2_own, value, var, z):
    """`model.z_accepts` for one pair: |X̄_a − T| < z·√(σ_a²/t + Var[T]) in its operations."""
    spread = sigma2_own / t
    spread += var
    spread = np.sqrt(spread)
    spread *= z
    gap = own / t
    gap -= value
    return abs(gap) < spread


@fast.kernel
def take_run(
    start,
    m,
    values,
    counts,
    index,
    totals,
    flat,
    n_included,
    sigma2,
    sigma2_dp,
    own,
    t,
    z,
    sums,
    carry,
    terms,
    dirty,
):
    """A slot's releases b = a + o → a, pairs start … start + M − 1 (o = start / M), taken as
    `DenseTake._take_numpy` takes them, element by element in the same operations."""
    o = start // m
    for a in range(m):
        pair = start + a
        b = _responder(a, o, m)
        j = np.int64(index[a])
        before = j - 1
        s2b = sigma2[b]
        # the pair's old terms in a's sums
        data = 0.0
        if before > 0:
            data = 1.0 / np.float64((before - 1) * (m - 1) + o)
        num = s2b * data
        num += sigma2_dp * (np.float64(before) * data * data)
        included = flat[pair]
        old_den = 0.0
        if included and before > 0:
            old_den = _inverse(num)
        old_num = old_den * totals[pair]
        # the new release: T, Var[T], the z-test
        u = 1.0 / counts[a]
        value = values[a] + 0.0
        var = s2b * u + sigma2_dp * (np.float64(j) * u * u)
        decision = _accepts(own[a], t, sigma2[a], value, var, z)
        new_den = 0.0
        if decision:
            new_den = _inverse(var)
        new_num = new_den * value
        totals[pair] = value
        _replace(sums, carry, terms, dirty, a, old_num, old_den, new_num, new_den)
        if decision != included:
            flat[pair] = decision
            n_included[a] += 1 if decision else -1


@fast.kernel
def release_run(start, m, count, noise_total, fresh, sums, t, values, index):
    """`PSumRelease.release` (PM-I) of b = a + o to a, pairs start … start + M − 1: j = κ + 1,
    the noise total plus the fresh draw, R = (S_b + Z)/t into `values`, j into `index`."""
    o = start // m
    for a in range(m):
        pair = start + a
        b = _responder(a, o, m)
        j = count[pair] + 1
        count[pair] = j
        z = noise_total[pair] + fresh[a]
        noise_total[pair] = z
        values[a] = (sums[b] + z) / t
        index[a] = j
