"""desim.fast: the compiled sums give numpy's bytes, compiled or not, and the switch is honoured."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from desim import fast

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
