"""Batches of messages: a window's row batch reads, selects and joins as a column batch does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.messages import (
    DST,
    DUE,
    KIND,
    PAYLOAD,
    SENT,
    SRC,
    Batch,
    RowBatch,
    SenderBatch,
)

KINDS = ("a", "b")
FIELDS = ("src", "dst", "kind", "payload", "sent_at", "delivered_at")


def _rows(n: int, seed: int, kinds: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = np.empty((n, PAYLOAD + 2))
    rows[:, DUE], rows[:, SENT] = np.sort(rng.random(n)) + 2, rng.random(n)
    rows[:, SRC], rows[:, DST] = rng.integers(0, 50, n), rng.integers(0, 50, n)
    rows[:, KIND], rows[:, PAYLOAD:] = rng.integers(0, kinds, n), rng.random((n, 2))
    return rows


def _columns(rows: np.ndarray) -> Batch:
    return Batch(
        rows[:, SRC].astype(np.int64),
        rows[:, DST].astype(np.int64),
        rows[:, KIND].astype(np.int64),
        rows[:, PAYLOAD:],
        rows[:, SENT],
        KINDS,
        None,
        rows[:, DUE],
    )


def _same(x: Batch, y: Batch) -> None:
    assert len(x) == len(y)
    for name in FIELDS:
        got, want = getattr(x, name), getattr(y, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert x.single_kind is None or (x.kind == x.single_kind).all()


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 12), seed=st.integers(0, 2**32 - 1), kinds=st.integers(1, 2))
def test_row_batches_select_and_join_as_column_batches(n, seed, kinds):
    rows = _rows(n, seed, kinds)
    held, plain = Batch.from_rows(rows, KINDS), _columns(rows)
    assert isinstance(held, RowBatch)
    _same(held, plain)
    rng = np.random.default_rng(seed)
    for index in (held.kind == 1, rng.integers(0, max(n, 1), n // 2), slice(1, 5)):
        _same(held.select(index), plain.select(index))
    for name in KINDS:
        _same(held.of_kind(name), plain.of_kind(name))
    cut = n // 3
    parts = [held.select(slice(0, cut)), held.select(slice(cut, n))]
    joined = Batch.concat(parts)
    assert isinstance(joined, RowBatch)  # one matrix, not one array per column
    _same(joined, plain)
    _same(Batch.concat([parts[0], plain.select(slice(cut, n))]), plain)  # mixed: columns


def test_single_kind_is_known_for_rows_and_kept_by_column_selections():
    rows = _rows(6, 1)
    rows[:, KIND] = 1
    held = Batch.from_rows(rows, KINDS)
    assert held.single_kind == 1 and held.of_kind("b") is held and len(held.of_kind("a")) == 0
    assert Batch.from_rows(rows[:0], KINDS).single_kind is None
    one = Batch(
        np.arange(3), np.arange(3), np.ones(3, int), np.empty((3, 0)), np.zeros(3), KINDS, 1
    )
    assert one.select(np.array([True, False, True])).single_kind == 1
    assert one.of_kind("b") is one and len(one.of_kind("a")) == 0
    other = Batch(
        np.arange(2), np.arange(2), np.zeros(2, int), np.ones((2, 1)), np.zeros(2), KINDS, 0
    )
    both = Batch.concat([one, other])
    assert both.single_kind is None
    assert both.payload.shape == (5, 1) and np.isnan(both.payload[:3]).all()
    np.testing.assert_array_equal(both.of_kind("a").src, [0, 1])
    assert Batch.concat([one, one]).single_kind == 1


def test_a_row_batch_has_no_other_attributes():
    held = Batch.from_rows(_rows(3, 2), KINDS)
    with pytest.raises(AttributeError, match="only"):
        held.only  # noqa: B018
    assert "3 messages" in repr(held)


@pytest.mark.parametrize("carried", [None, 0, 4, 9])
def test_a_sender_batch_carries_rows_up_to_carried_then_nan(carried):
    """Message i carries its sender's row of the table when i < carried (all when None), a row
    of NaN after, read whole, by positions or by a slice."""
    table = np.arange(12.0).reshape(6, 2)
    edges = np.array([3, 0, 5, 1, 4, 2, 6, 7, 8])
    senders = np.array([5, 4, 3, 2, 1, 0, 2, 3, 4])
    batch = SenderBatch(lambda: table, edges, senders, np.zeros(9, dtype=np.int64), carried)
    k = 9 if carried is None else carried
    expected = table[senders[edges]]
    expected[k:] = np.nan
    assert batch.payload.tobytes() == expected.tobytes()
    picked = np.array([8, 0, 3])
    assert batch.rows(picked).tobytes() == expected[picked].tobytes()
    assert batch.rows(slice(2, 6)).tobytes() == expected[2:6].tobytes()
