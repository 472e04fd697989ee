"""Private-ColME's dense pairs numbered by RR position (`desim.models.colme.positions`) give the
same run, bit for bit, as the a·M + b numbering: the same estimates, statistic, beliefs and
privacy ledger; the numbering names every ordered pair once and a slot's queries as one run."""

from __future__ import annotations

import numpy as np
import pytest
from _runs import run_private_colme

from desim.models.colme.model import rr_offset
from desim.models.colme.positions import RoundRobinPairs
from desim.models.colme.protocol import PrivateColME, PrivateColMEOracle


class Plain(PrivateColME):
    """Incremental combination sums at any size, pairs numbered a·M + b."""

    incremental_above = 0


class Numbered(Plain):
    """The same, with the pairs numbered by RR position at any size."""

    positions_above = 0


class NumberedOracle(PrivateColMEOracle):
    """The oracle (C_a^{(0)} not everyone) with pairs numbered by RR position."""

    incremental_above = 0
    positions_above = 0


class PlainOracle(PrivateColMEOracle):
    """The oracle with pairs numbered a·M + b."""

    incremental_above = 0


def run(cls: type, params: dict, m: int = 13, t_max: int = 50, seed: int = 4) -> PrivateColME:
    return run_private_colme(cls, params, m, t_max, seed, [1, 7, 20, t_max])


def test_the_numbering_names_every_pair_once_and_a_slot_as_one_run():
    m = 7
    pairs = RoundRobinPairs(m)
    a, b = np.divmod(np.arange(m * m), m)
    numbers = pairs.of(a, b)
    assert sorted(numbers) == list(range(m * m))
    for t in (1, 5, 6, 7, 13):
        run = pairs.run(t)
        np.testing.assert_array_equal(
            np.arange(run.start, run.stop),
            pairs.of(np.arange(m), (np.arange(m) + rr_offset(t, m)) % m),
        )
    x = np.random.default_rng(1).random((m, m))
    flat = pairs.number(x)
    np.testing.assert_array_equal(pairs.matrix(flat), x)
    np.testing.assert_array_equal(pairs.matrix(flat, "responder"), x.T)


@pytest.mark.parametrize(
    "params",
    [{}, {"noise": "laplace", "epsilon": 4.0}, {"noise": "none"}, {"theta": 0.3}],
)
@pytest.mark.parametrize("classes", [(Plain, Numbered), (PlainOracle, NumberedOracle)])
def test_pairs_numbered_by_rr_position_give_the_same_run_bit_for_bit(params, classes):
    plain, numbered = (run(cls, params) for cls in classes)
    assert plain.positions is None and numbered.positions is not None
    np.testing.assert_array_equal(numbered.estimates(), plain.estimates())
    for rows in (slice(None), np.array([0, 5, 12])):
        for x, y in zip(numbered.row_sums(rows), plain.row_sums(rows), strict=True):
            np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(numbered.stat.kappa, plain.stat.kappa)
    np.testing.assert_array_equal(numbered.stat.value, plain.stat.value)
    sigma2 = plain.sigma2[None, :]
    np.testing.assert_array_equal(numbered.stat.variance(sigma2), plain.stat.variance(sigma2))
    pairs = numbered.positions
    np.testing.assert_array_equal(pairs.matrix(numbered.beliefs.flat), plain.included)
    np.testing.assert_array_equal(numbered.beliefs.n_included, plain.beliefs.n_included)
    np.testing.assert_array_equal(
        pairs.matrix(numbered.mech.count.ravel(), "responder"), plain.mech.count
    )
    if params.get("noise") != "none":
        spent, plain_spent = numbered.privacy_spend(), plain.privacy_spend()
        for key, (multiplier, count) in plain_spent.against.items():
            assert spent.against[key][0] == multiplier
            np.testing.assert_array_equal(spent.against[key][1], count)


@pytest.mark.parametrize(
    "params",
    [{"schedule": "rrr"}, {"mechanism": "pm2"}, {"weights": "mom"}, {"variance": "sch-var-2"}],
)
def test_the_numbering_applies_only_where_every_rule_reads_a_slot_in_order(params):
    assert run(Numbered, params, t_max=5).positions is None


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_per_responder_reduces_the_rows_of_b_a(dtype):
    m = 9
    pairs = RoundRobinPairs(m)
    per = np.random.default_rng(3).integers(0, 50, m * m).astype(dtype)
    by_responder = pairs.matrix(per, "responder")
    most, total = pairs.per_responder(per.reshape(m, m))
    np.testing.assert_array_equal(most, by_responder.max(axis=1))
    np.testing.assert_array_equal(total, by_responder.sum(axis=1))
    assert most.dtype == total.dtype == dtype
