"""Optional compiled kernels: numba's ``njit`` when the ``fast`` extra is installed.

A protocol that has a compiled kernel chooses it once, at set-up, with :func:`compiled`; without
numba (or with ``DESIM_COMPILED=0`` in the environment) it keeps its numpy path. A kernel gives
the same bytes as the numpy path it replaces: it uses only IEEE-exact operations (+, −, ×, ÷,
sqrt, comparisons) and sums in numpy's order (:func:`pairwise_sum`), so results do not depend on
whether numba is installed. Importing this module does not import numba (half a second at every
command): the sums below are compiled when first asked for, and a module of kernels is imported
only by the run that takes it.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import Any

__all__ = [  # noqa: F822 (the sums are made by __getattr__)
    "AVAILABLE",
    "compiled",
    "kernel",
    "pairwise_sum",
    "reduce_sum",
    "reduceat_sum",
]

AVAILABLE: bool = importlib.util.find_spec("numba") is not None
"""Whether numba is importable (the ``fast`` extra is installed)."""


def compiled() -> bool:
    """Whether protocols should take their compiled kernels: numba present and not switched off."""
    return AVAILABLE and os.environ.get("DESIM_COMPILED", "1") != "0"


def kernel(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` compiled by numba (no fastmath, cached on disk), or unchanged without numba."""
    if not AVAILABLE:
        return function
    import numba

    from desim import cache_hints

    cache_hints.overload()  # (once, before any kernel is compiled)
    return numba.njit(cache=True, nogil=True)(function)


_BLOCK = 128  # numpy's PW_BLOCKSIZE: the pairwise sum splits above it


def _pairwise_sum(values, start, stop):
    """Σ values[start:stop] in numpy's pairwise order (its float64 add loop given a whole run)."""
    n = stop - start
    if n < 8:
        total = -0.0
        for i in range(start, stop):
            total += values[i]
        return total
    if n <= _BLOCK:
        r0 = values[start]
        r1 = values[start + 1]
        r2 = values[start + 2]
        r3 = values[start + 3]
        r4 = values[start + 4]
        r5 = values[start + 5]
        r6 = values[start + 6]
        r7 = values[start + 7]
        i = start + 8
        end = stop - n % 8
        while i < end:
            r0 += values[i]
            r1 += values[i + 1]
            r2 += values[i + 2]
            r3 += values[i + 3]
            r4 += values[i + 4]
            r5 += values[i + 5]
            r6 += values[i + 6]
            r7 += values[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < stop:
            total += values[i]
            i += 1
        return total
    half = n // 2
    half -= half % 8
    # pairwise_sum (F821 below): bound, compiled, by __getattr__ before numba resolves the name
    left = pairwise_sum(values, start, start + half)  # noqa: F821
    return left + pairwise_sum(values, start + half, stop)  # noqa: F821


def _reduce_sum(values, start, stop):
    """The bytes of ``np.add.reduce(values[start:stop])``: 0.0 plus the pairwise sum."""
    return 0.0 + pairwise_sum(values, start, stop)  # noqa: F821


def _reduceat_sum(values, start, stop):
    """The bytes of a segment of ``np.add.reduceat``: its first value plus the rest, pairwise.

    ``stop > start`` (numpy's reduceat gives ``values[start]`` for an empty segment, which a
    caller handles).
    """
    return values[start] + pairwise_sum(values, start + 1, stop)  # noqa: F821


_SUMS = {"pairwise_sum": _pairwise_sum, "reduce_sum": _reduce_sum, "reduceat_sum": _reduceat_sum}


def __getattr__(name: str) -> Callable[..., Any]:
    """The sums, compiled at first use (kernels that call them resolve them here when compiled)."""
    if name not in _SUMS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # every sum is made before any is compiled: the compiled ones call each other by global name
    for each, function in _SUMS.items():
        globals()[each] = kernel(function)
    return globals()[name]
