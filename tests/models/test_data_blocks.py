"""Data do not depend on how the engine blocks them: slots are drawn in order, and the block
shrinks only for populations whose 1024 slots would exceed the memory budget."""

from __future__ import annotations

import numpy as np
import pytest

from desim.kernel.engine import DATA_BLOCK, DATA_BLOCK_BYTES, data_block
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import DATA

load_plugins()


@pytest.mark.parametrize("distribution", ["gaussian", "uniform", "bernoulli"])
def test_class_data_split_into_blocks_gives_the_same_samples(distribution):
    means = [0.2, 0.8] if distribution == "bernoulli" else [-1.0, 0.5]
    spec = build(
        DATA.get("classes"),
        {"agents": 7, "class_means": means, "distribution": distribution},
        "data",
    )
    data = spec.make(np.random.default_rng(0))
    whole = data.sample(np.random.default_rng(5), 11)
    rng = np.random.default_rng(5)
    parts = np.concatenate([data.sample(rng, 3), data.sample(rng, 1), data.sample(rng, 7)])
    np.testing.assert_array_equal(whole, parts)
    old = data.means + spec.sigma * np.random.default_rng(5).standard_normal((11, 7))
    if distribution == "gaussian":  # the in-place form gives the earlier expression's bits
        np.testing.assert_array_equal(whole, old)


def test_block_is_1024_slots_up_to_the_budget_then_shrinks():
    assert data_block(200) == data_block(16_384) == DATA_BLOCK == 1024
    assert data_block(100_000) == DATA_BLOCK_BYTES // 800_000 < 1024
    assert data_block(10**9) == 1
