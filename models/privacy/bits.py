"""Bit arithmetic on release indices j, which PM-II's binary tree of p-sums is built on.

Release j uses one dyadic node per set bit of j; the node that starts at j sits at the lowest
set bit, and w_H(j) nodes make up its noise.
"""

from __future__ import annotations

import numpy as np


def set_bits(j: np.ndarray, levels: int) -> np.ndarray:
    """Boolean matrix (len(j), levels): bit s of every j."""
    return ((j[:, None] >> np.arange(levels)) & 1).astype(bool)


def lowest_set_bit(j: np.ndarray) -> np.ndarray:
    """Level of the lowest set bit of every j ≥ 1 (the level of PM-II's new node)."""
    return np.log2(j & -j).astype(np.int64)


def popcount(j: np.ndarray) -> np.ndarray:
    """w_H(j), the Hamming weight of every j ≥ 0."""
    j = np.asarray(j, dtype=np.int64)
    count = np.zeros_like(j)
    for b in range(int(j.max(initial=0)).bit_length()):
        count += (j >> b) & 1
    return count


def floor_pow2(j: np.ndarray) -> np.ndarray:
    """2^{⌊log₂ j⌋} for every j ≥ 1, exactly in integers."""
    j = np.asarray(j, dtype=np.int64)
    out = np.ones_like(j)
    for b in range(1, int(j.max(initial=1)).bit_length()):
        out = np.where(j >> b > 0, np.int64(1) << b, out)
    return out
