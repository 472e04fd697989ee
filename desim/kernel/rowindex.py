"""The row of each id seen so far, for state kept only for the ids a run actually meets.

A run on 5000 agents has 2.5·10⁷ link ids and a graph of 10⁵ agents 10¹⁰, of which a run asks
a fraction. `RowIndex` gives those it has seen rows 0, 1, … in order of first sight, so state
arrays grow by appending, and finds the rows of a whole array of ids in a few numpy passes: an
open-addressing hash table with linear probing, probed for every id at once. Adding ids costs
in proportion to their number, not to the ids already held (a sorted index costs a shift of
everything it holds at each insertion). It lives in the kernel so that the kernel, the network
models and the protocol families may all use it (availability models index the links they were
asked about; C-ColME the edges of large graphs).
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1  # (ids are ≥ 0)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # 2⁶⁴/φ: Fibonacci hashing spreads runs of ids


class RowIndex:
    """Rows 0 … len − 1 of the distinct non-negative int64 ids added so far, in order of adding."""

    def __init__(self) -> None:
        self._keys = np.full(1 << 10, _EMPTY, dtype=np.int64)  # a power of two, at most half full
        self._rows = np.empty(1 << 10, dtype=np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row of each of `ids`, −1 where an id was never added."""
        out = np.full(len(ids), -1, dtype=np.int64)
        todo = np.arange(len(ids))
        slot = self._home(ids)
        while todo.size:
            key = self._keys[slot]
            hit = key == ids[todo]
            out[todo[hit]] = self._rows[slot[hit]]
            on = np.flatnonzero(~hit & (key != _EMPTY))  # an other id sits there: probe on
            todo, slot = todo[on], self._next(slot[on])
        return out

    def add(self, ids: np.ndarray) -> np.ndarray:
        """Give the distinct `ids`, none added before, the next rows; returns those rows."""
        rows = np.arange(self._size, self._size + len(ids))
        if 2 * (self._size + len(ids)) > len(self._keys):
            self._grow(2 * (self._size + len(ids)))
        self._place(np.asarray(ids, dtype=np.int64), rows)
        self._size += len(ids)
        return rows

    def _home(self, ids: np.ndarray) -> np.ndarray:
        bits = np.uint64(64 - (len(self._keys).bit_length() - 1))
        return ((ids.astype(np.uint64) * _GOLDEN) >> bits).astype(np.int64)

    def _next(self, slot: np.ndarray) -> np.ndarray:
        return (slot + 1) & (len(self._keys) - 1)

    def _place(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Put `ids` (not in the table) with their `rows` in the first free slot from home."""
        slot = self._home(ids)
        while ids.size:
            free = np.flatnonzero(self._keys[slot] == _EMPTY)
            # ids aiming at one free slot: the first takes it, the others probe on
            _, first = np.unique(slot[free], return_index=True)
            won = free[first]
            self._keys[slot[won]] = ids[won]
            self._rows[slot[won]] = rows[won]
            on = np.ones(len(ids), dtype=bool)
            on[won] = False
            ids, rows, slot = ids[on], rows[on], self._next(slot[on])

    def _grow(self, least: int) -> None:
        """Rehash into a table of the next power of two ≥ `least` slots."""
        held = np.flatnonzero(self._keys != _EMPTY)
        ids, rows = self._keys[held], self._rows[held]
        size = 1 << max(10, (least - 1).bit_length())
        self._keys = np.full(size, _EMPTY, dtype=np.int64)
        self._rows = np.empty(size, dtype=np.int64)
        self._place(ids, rows)
