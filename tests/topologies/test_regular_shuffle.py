"""The random regular graph's shuffles with numpy: `random.shuffle`'s permutation and stream."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.topologies import generators
from desim.topologies.generators import SMALL, random_regular_keys, shuffled


def _python_shuffle(x: list[int], seed: int) -> tuple[list[int], random.Random]:
    draw = random.Random(seed)
    out = list(x)
    draw.shuffle(out)
    return out, draw


@settings(max_examples=40, deadline=None)  # timing varies with the machine's load
@given(st.integers(0, 2**32 - 1), st.integers(0, 3 * SMALL), st.integers(1, 7))
def test_shuffled_is_python_shuffle(seed, size, repeat):
    """The same order and the stream left in the same state, for any list (repeats included;
    short lists go to `random.shuffle` itself)."""
    x = [(v * 7919) % (size // repeat + 1) for v in range(size)]
    want, draw_want = _python_shuffle(x, seed)
    draw = random.Random(seed)
    got = shuffled(np.array(x, dtype=np.int64), draw)
    assert got.tolist() == want
    assert draw.getstate() == draw_want.getstate()
    assert draw.random() == draw_want.random()


@pytest.mark.parametrize("size", [SMALL, SMALL + 1, 8191, 8192, 8193, 20_001])
def test_shuffled_across_bit_lengths_and_chunks(size):
    """Sizes at powers of two (randbelow's bit length changes) and beyond one chunk of words,
    several seeds; the stream goes on as Python's does (a second shuffle agrees too)."""
    for seed in (0, 12345, 2**31 + 11):
        x = list(range(size))
        want, draw_want = _python_shuffle(x, seed)
        draw_want.shuffle(want)
        draw = random.Random(seed)
        got = shuffled(shuffled(np.arange(size), draw), draw)
        assert got.tolist() == want
        assert draw.getstate() == draw_want.getstate()


def test_a_large_regular_graph_is_the_networkx_graph():
    """n·r = 50,000 stubs: the first shuffle spans many chunks; the edge set is networkx's."""
    n, d, seed = 5000, 10, 77
    ref = nx.random_regular_graph(d, n, seed=seed)
    keys = sorted(min(a, b) * n + max(a, b) for a, b in ref.edges())
    assert random_regular_keys(d, n, seed).tolist() == keys


@pytest.mark.parametrize("kernels", ["1", "0"])
@pytest.mark.parametrize("size", [SMALL, 8193, 70_001])
def test_the_compiled_swaps_are_python_shuffle(monkeypatch, kernels, size):
    """From `COMPILED_FROM` items on, with the kernels, the swaps run as a compiled loop; with
    them or without (`DESIM_COMPILED=0`: `_swapped`'s sorts), Python's order and stream."""
    monkeypatch.setenv("DESIM_COMPILED", kernels)
    monkeypatch.setattr(generators, "COMPILED_FROM", SMALL)
    for seed in (3, 2**32 - 5):
        x = [(v * 31) % (size // 3 + 1) for v in range(size)]  # repeats
        want, draw_want = _python_shuffle(x, seed)
        draw = random.Random(seed)
        assert shuffled(np.array(x, dtype=np.int64), draw).tolist() == want
        assert draw.getstate() == draw_want.getstate()


def test_a_large_regular_graph_through_the_compiled_swaps_is_the_networkx_graph(monkeypatch):
    """The regular graph's shuffles through the compiled loop: networkx's edge set."""
    monkeypatch.setenv("DESIM_COMPILED", "1")
    monkeypatch.setattr(generators, "COMPILED_FROM", SMALL)
    n, d, seed = 5000, 10, 78
    ref = nx.random_regular_graph(d, n, seed=seed)
    keys = sorted(min(a, b) * n + max(a, b) for a, b in ref.edges())
    assert random_regular_keys(d, n, seed).tolist() == keys
