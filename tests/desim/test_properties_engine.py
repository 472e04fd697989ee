"""Property tests (hypothesis) of engine invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from desim.kernel.messages import Batch
from desim.kernel.params import ConfigError, build
from desim.kernel.recorder import log_checkpoints
from desim.models.colme.protocol import PrivateColMEParams


@given(t_max=st.integers(1, 10**6), n=st.integers(2, 200))
def test_checkpoints_sorted_unique_in_range_and_end_at_t_max(t_max, n):
    c = log_checkpoints(t_max, n)
    assert c[0] == 1 and c[-1] == t_max and np.all(np.diff(c) > 0) and len(c) <= n + 1


@given(kinds=st.lists(st.integers(0, 2), min_size=1, max_size=50))
def test_of_kind_partitions_a_batch_in_order(kinds):
    n = len(kinds)
    batch = Batch(
        np.arange(n), np.arange(n), np.array(kinds), np.zeros((n, 1)), np.zeros(n), ("a", "b", "c")
    )
    parts = [batch.of_kind(k) for k in ("a", "b", "c")]
    assert sum(len(p) for p in parts) == n
    for code, p in enumerate(parts):
        assert np.all(np.diff(p.src) > 0) and np.all(p.kind == code)


@given(
    epsilon=st.floats(allow_nan=True, allow_infinity=False, width=32),
    delta=st.floats(allow_nan=True, width=32),
)
def test_privacy_parameters_are_accepted_exactly_in_their_ranges(epsilon, delta):
    table = {"epsilon": epsilon, "delta": delta}
    valid = epsilon > 0 and 0 < delta < 1
    if valid:
        assert build(PrivateColMEParams, table, "s").epsilon == epsilon
    else:
        with pytest.raises(ConfigError, match="epsilon|delta"):
            build(PrivateColMEParams, table, "s")
