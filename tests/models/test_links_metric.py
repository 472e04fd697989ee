"""The `links` metric: wrong neighbour decisions, with the class mask kept between checkpoints."""

from __future__ import annotations

import numpy as np

from desim.kernel.registry import METRICS
from desim.models.metrics import SameClass
from desim.topologies.generators import RandomRegular


class _Decisions:
    """Exposes a graph's edges and a kept mask, as the C-ColME family does."""

    def __init__(self, src: np.ndarray, dst: np.ndarray, kept: np.ndarray) -> None:
        self.src, self.dst, self.kept = src, dst, kept

    def neighbour_decisions(self):
        return self.src, self.dst, self.kept


def _data(classes: np.ndarray):
    data = type("D", (), {})()
    data.classes = classes
    return data


def _direct(a, b, kept, classes) -> dict[str, float]:
    same = classes[a] == classes[b]
    return {"wrong_kept": float(np.sum(kept & ~same)), "wrong_dropped": float(np.sum(~kept & same))}


def test_links_counts_are_the_direct_counts_as_classes_and_decisions_move():
    """Checkpoints on one graph (read-only edges, as a run's): the counts equal the direct
    formula when the kept set moves, when the classes move (drift) in place or anew, and on a
    second graph."""
    links = METRICS.get("links")
    rng = np.random.default_rng(4)
    for n in (400, 600):
        g = RandomRegular(6).make(n, rng)
        classes = rng.integers(0, 3, n)
        kept = np.ones(g.n_directed, dtype=bool)
        proto = _Decisions(g.src, g.dst, kept)
        for _ in range(4):
            assert links(proto, _data(classes)) == _direct(g.src, g.dst, kept, classes)
            kept &= rng.random(g.n_directed) < 0.8
            classes[rng.integers(0, n, 20)] = rng.integers(0, 3, 20)  # in place: as drift may
        moved = rng.integers(0, 3, n)
        assert links(proto, _data(moved)) == _direct(g.src, g.dst, kept, moved)


def test_writeable_edges_are_never_kept():
    """Edge arrays a caller may change (not a graph's) are read afresh every time."""
    same_class = SameClass()
    a, b = np.array([0, 1, 2]), np.array([1, 2, 0])
    classes = np.array([0, 0, 1])
    mask, count = same_class(a, b, classes)
    assert mask.tolist() == [True, False, False] and count == 1
    b[:] = [1, 0, 2]  # changed in place: a cache keyed by the arrays would be stale
    mask, count = same_class(a, b, classes)
    assert mask.tolist() == [True, True, True] and count == 3
