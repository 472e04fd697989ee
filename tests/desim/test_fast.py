"""desim.fast: the compiled sums give numpy's bytes, compiled or not, and the switch is honoured."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from desim import cache_hints, fast

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


def _bytes(x: float) -> bytes:
    return np.float64(x).tobytes()


def _versions(function):  # the compiled function and, with numba, its Python original
    return [function, getattr(function, "py_func", function)]


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 16, 17, 127, 128, 129, 255, 256, 1000, 4097])
def test_reduce_sum_is_numpys_add_reduce_bit_for_bit(n):
    rng = np.random.default_rng(n)
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n)
    for start in {0, min(1, n), min(3, n)}:
        expected = _bytes(np.add.reduce(values[start:]))
        for reduce_sum in _versions(fast.reduce_sum):
            assert _bytes(reduce_sum(values, start, n)) == expected, (n, start)


def test_signed_zeros_follow_numpy():
    zeros = -np.zeros(9)
    assert _bytes(fast.reduce_sum(zeros, 0, 0)) == _bytes(np.add.reduce(zeros[:0]))  # +0.0
    assert _bytes(fast.reduce_sum(zeros, 0, 3)) == _bytes(np.add.reduce(zeros[:3]))
    assert _bytes(fast.reduceat_sum(zeros, 0, 9)) == _bytes(np.add.reduceat(zeros, [0])[0])


@settings(max_examples=200, deadline=None)
@given(arrays(np.float64, st.integers(1, 300), elements=finite), st.data())
def test_reduceat_sum_is_each_segment_of_numpys_reduceat(values, data):
    cuts = sorted(
        set(data.draw(st.lists(st.integers(1, len(values) - 1), max_size=6)))
        if len(values) > 1
        else []
    )
    starts = np.array([0, *cuts])
    stops = np.array([*cuts, len(values)])
    with np.errstate(over="ignore", invalid="ignore"):
        expected = np.add.reduceat(values, starts)
        for reduceat_sum in _versions(fast.reduceat_sum):
            got = [reduceat_sum(values, a, b) for a, b in zip(starts, stops, strict=True)]
            assert np.array(got).tobytes() == expected.tobytes()


def test_compiled_is_off_when_switched_off(monkeypatch):
    monkeypatch.setenv("DESIM_COMPILED", "0")
    assert not fast.compiled()
    monkeypatch.setenv("DESIM_COMPILED", "1")
    assert fast.compiled() == fast.AVAILABLE


def _gather_ahead(rows, index, out):
    """out[i] = rows[index[i]] (its first value for 2-D rows), each row asked for three reads
    ahead (`cache_hints.prefetch`), written past the caches (`stream`, then `fence`)."""
    for i in range(len(index)):
        if i + 3 < len(index):
            cache_hints.prefetch(rows, index[i + 3])
        cache_hints.stream(out, i, rows[index[i]] if rows.ndim == 1 else rows[index[i], 0])
    cache_hints.fence()


def _pairs_ahead(rows, index, out):
    """out[i] = rows[index[i]] for 2-D rows of two, written past the caches by value."""
    for i in range(len(index)):
        cache_hints.stream_row(out, i, 0, rows[index[i], 0])
        cache_hints.stream_row(out, i, 1, rows[index[i], 1])
    cache_hints.fence()


@pytest.mark.parametrize("index_type", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize("ndim", [1, 2])
def test_cache_hints_change_no_value(index_type, ndim):
    """Kernels that ask for their rows ahead (1-D or 2-D rows, any integer index) and write
    past the caches read and write the same values as plain ones, compiled or not (in Python
    `prefetch` and `fence` do nothing and `stream` assigns)."""
    rng = np.random.default_rng(5)
    rows = rng.random((200, 2)) if ndim == 2 else rng.random(200)
    index = rng.integers(0, 200, 64).astype(index_type)
    for kernel in _versions(fast.kernel(_gather_ahead)):
        out = np.empty(len(index))
        kernel(rows, index, out)
        expected = rows[index] if ndim == 1 else rows[index, 0]
        assert out.tobytes() == expected.tobytes()
    if ndim == 2:
        for kernel in _versions(fast.kernel(_pairs_ahead)):
            out = np.empty((len(index), 2))
            kernel(rows, index, out)
            assert out.tobytes() == rows[index].tobytes()
    ints = np.zeros(3, dtype=np.int64)
    for kernel in _versions(fast.kernel(cache_hints.stream)):
        kernel(ints, 1, 7)  # an int into an int array
        assert ints.tolist() == [0, 7, 0]
    assert cache_hints.prefetch(rows, 0) is None and cache_hints.fence() is None
