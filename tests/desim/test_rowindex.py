"""`RowIndex`, the hash index of the ids seen so far: rows in order of adding, found again for any
array of ids, across the table's growth."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.rowindex import RowIndex

#: ids as the models make them: runs of neighbours (a·n + b), far apart ones, and the largest
IDS = st.one_of(st.integers(0, 3000), st.integers(0, 2**62), st.just(2**63 - 1))


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.lists(IDS, max_size=700), min_size=1, max_size=8),
    asked=st.lists(IDS, max_size=200),
)
def test_rows_are_given_in_order_of_adding_and_found_again(batches, asked):
    index, want = RowIndex(), {}
    for batch in batches:
        new = np.array(sorted(set(batch) - set(want)), dtype=np.int64)
        rows = index.add(new)
        np.testing.assert_array_equal(rows, np.arange(len(want), len(want) + len(new)))
        want.update(zip(new.tolist(), rows.tolist(), strict=True))
        assert len(index) == len(want)
        held = np.array(list(want), dtype=np.int64)
        np.testing.assert_array_equal(index.find(held), list(want.values()))
    ids = np.array(asked, dtype=np.int64)
    np.testing.assert_array_equal(index.find(ids), [want.get(i, -1) for i in asked])


def test_an_empty_index_finds_nothing_and_a_full_table_grows():
    index = RowIndex()
    assert index.find(np.arange(5)).tolist() == [-1] * 5
    assert len(index.find(np.empty(0, dtype=np.int64))) == 0
    ids = np.arange(0, 10**6, 7)  # 142 858 ids: the table grows from 1024 slots many times
    index.add(ids)
    np.testing.assert_array_equal(index.find(ids[::-1]), np.arange(len(ids))[::-1])
    assert index.find(np.array([1, 10**6 + 7])).tolist() == [-1, -1]
