"""Private-ColME's dense path (`desim.models.colme.dense`): the compiled take and its numpy twin
give the bytes of the a·M + b path, κ and D are read from the mechanism and RR, not stored."""

from __future__ import annotations

import numpy as np
import pytest
from _runs import run_private_colme
from hypothesis import given, settings
from hypothesis import strategies as st

from desim import fast
from desim.models.colme.delivery import Synchronous
from desim.models.colme.dense import DenseSynchronous, RoundRobinStatistic
from desim.models.colme.protocol import PrivateColME, PrivateColMEOracle
from desim.models.colme.statistic import PairStatistic


class Plain(PrivateColME):
    """Incremental combination sums at any size, pairs numbered a·M + b."""

    incremental_above = 0


class Dense(Plain):
    """The same with the pairs numbered by RR position at any size: the dense path."""

    positions_above = 0


def run(cls: type, params: dict, m: int, t_max: int, seed: int = 4) -> PrivateColME:
    return run_private_colme(cls, params, m, t_max, seed, [1, t_max])


def assert_same_run(dense: PrivateColME, plain: PrivateColME) -> None:
    """Every reader of the state gives the same bits on both paths."""
    np.testing.assert_array_equal(dense.estimates(), plain.estimates())
    np.testing.assert_array_equal(dense.sums_w.sums, plain.sums_w.sums)
    np.testing.assert_array_equal(dense.sums_w.carry, plain.sums_w.carry)
    np.testing.assert_array_equal(dense.sums_w.terms, plain.sums_w.terms)
    for x, y in zip(dense.row_sums(slice(None)), plain.row_sums(slice(None)), strict=True):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(dense.stat.kappa, plain.stat.kappa)
    np.testing.assert_array_equal(dense.stat.value, plain.stat.value)
    sigma2 = plain.sigma2[None, :]
    np.testing.assert_array_equal(dense.stat.variance(sigma2), plain.stat.variance(sigma2))
    np.testing.assert_array_equal(dense.positions.matrix(dense.beliefs.flat), plain.included)
    np.testing.assert_array_equal(dense.beliefs.n_included, plain.beliefs.n_included)


VARIANTS = [
    {},
    {"noise": "laplace"},
    {"noise": "none"},
    {"theta": 0.4, "epsilon": 3.0},
    {"noise": "laplace", "epsilon": 0.3, "delta": 1e-3},
]


@pytest.mark.parametrize("compiled", ["1", "0"])
@pytest.mark.parametrize("params", VARIANTS)
def test_the_dense_path_gives_the_bytes_of_the_plain_path(params, compiled, monkeypatch):
    monkeypatch.setenv("DESIM_COMPILED", compiled)
    dense, plain = run(Dense, params, 11, 60), run(Plain, params, 11, 60)
    assert isinstance(dense.delivery, DenseSynchronous)
    assert (dense.delivery.taker.kernel is not None) == (compiled == "1" and fast.AVAILABLE)
    assert_same_run(dense, plain)


def _compiled_and_numpy(params: dict, m: int, t_max: int, monkeypatch) -> None:
    monkeypatch.setenv("DESIM_COMPILED", "1")
    compiled = run(PrivateColME, params, m, t_max)
    monkeypatch.setenv("DESIM_COMPILED", "0")
    numpy_path = run(PrivateColME, params, m, t_max)
    assert isinstance(compiled.stat, RoundRobinStatistic)
    np.testing.assert_array_equal(compiled.estimates(), numpy_path.estimates())
    np.testing.assert_array_equal(compiled.stat.total, numpy_path.stat.total)
    np.testing.assert_array_equal(compiled.beliefs.flat, numpy_path.beliefs.flat)
    np.testing.assert_array_equal(compiled.beliefs.n_included, numpy_path.beliefs.n_included)
    for x, y in zip(
        compiled.sums_w.totals(compiled.row_sums),
        numpy_path.sums_w.totals(numpy_path.row_sums),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(compiled.sums_w.carry, numpy_path.sums_w.carry)
    np.testing.assert_array_equal(compiled.mech.count, numpy_path.mech.count)


@pytest.mark.parametrize("m", [1001, 1002, 1500])
@pytest.mark.parametrize("params", [{}, {"noise": "laplace", "theta": 0.3}])
def test_compiled_and_numpy_takes_agree_bit_for_bit_above_1000_agents(params, m, monkeypatch):
    _compiled_and_numpy(params, m, 25, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("params", [{}, {"noise": "none"}])
def test_compiled_and_numpy_takes_agree_past_one_round_of_rr(params, monkeypatch):
    # t_max past M − 1: every pair released to twice, so D comes from κ = 2 too
    _compiled_and_numpy(params, 1001, 1004, monkeypatch)


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(3, 17),
    t_max=st.integers(1, 70),
    seed=st.integers(0, 2**16),
    noise=st.sampled_from(["gaussian", "laplace", "none"]),
    theta=st.floats(0.01, 0.9),
    compiled=st.sampled_from(["1", "0"]),
)
def test_property_dense_runs_match_the_plain_numbering(m, t_max, seed, noise, theta, compiled):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DESIM_COMPILED", compiled)
        params = {"noise": noise, "theta": theta}
        assert_same_run(run(Dense, params, m, t_max, seed), run(Plain, params, m, t_max, seed))


def test_the_dense_statistic_stores_t_only_and_reads_kappa_from_the_mechanism():
    dense = run(Dense, {}, 9, 30)
    stat = dense.stat
    assert stat.total.shape == (81,) and stat.total.dtype == np.float64
    assert np.shares_memory(stat.counts, dense.mech.count)
    with pytest.raises(NotImplementedError, match="graph"):
        stat.last_pm1_columns(np.zeros(81))


@pytest.mark.parametrize(
    ("cls", "params"),
    [
        (PrivateColMEOracle, {}),
        (PrivateColME, {"mechanism": "pm2"}),
        (PrivateColME, {"weights": "mom"}),
        (PrivateColME, {"schedule": "rrr"}),
    ],
)
def test_the_dense_path_applies_only_to_the_z_test_with_pairs_by_rr_position(cls, params):
    proto = run(cls, params, 1001, 2)
    assert type(proto.stat) is PairStatistic
    assert type(proto.delivery) is Synchronous
