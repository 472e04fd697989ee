"""Private-ColME's model parts alone, against the paper: the z-test, the combination of Lemma 4,
Sch-Var-2's final estimate, the schedules, class beliefs and the per-slot view."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from desim.models.colme import model
from desim.models.colme.pairs import ClassBeliefs
from desim.models.colme.schedule import RestrictedRoundRobin, RoundRobin
from desim.models.colme.view import OneSlot, SlotBatch


def test_thresholds_are_theta_over_log_and_the_normal_quantile():
    theta, z = model.thresholds(0.05, 10)
    t = np.arange(1, 12)
    np.testing.assert_allclose(theta[1:], 0.05 / np.log(t + 1.0))
    np.testing.assert_allclose(z[1:], norm.ppf(1 - theta[1:] / 2))
    assert z[0] == np.inf


def test_z_test_accepts_exactly_inside_the_interval_of_section_3c1():
    t, sigma2, var, z = 10.0, np.array([4.0, 4.0]), np.array([0.6, 0.6]), 2.0
    half = z * np.sqrt(4.0 / t + 0.6)  # the accepted half-width around X̄_a = 1
    value = np.array([1.0 + 0.999 * half, 1.0 - 1.001 * half])
    got = model.z_accepts(np.array([10.0, 10.0]), t, sigma2, value, var, z)
    np.testing.assert_array_equal(got, [True, False])


def test_combination_is_lemma_4_and_falls_back_to_the_local_mean():
    local, own = np.array([1.0, 2.0, 3.0]), np.array([4.0, np.inf, 0.0])
    num, den = np.array([2.0, 1.0, 0.0]), np.array([1.0, 1.0, 0.0])
    got = model.combine(local, own, num, den)
    np.testing.assert_allclose(got, [(4.0 * 1.0 + 2.0) / (4.0 + 1.0), 2.0, 3.0])
    terms = model.contribution(np.array([True, False]), np.array([3.0, 5.0]), np.array([2.0, 1.0]))
    np.testing.assert_array_equal(terms, [[1.5, 0.0], [0.5, 0.0]])


@pytest.mark.parametrize("bayes", [False, True])
def test_sch_var_2_estimate_is_unknown_before_two_releases_and_when_negative(bayes):
    v_raw, k_noise, k = np.array([5.0, 1.0, 1.0]), np.array([1.0, 3.0, 0.5]), np.array([1, 4, 4])
    v = model.sch_var_2_estimate(v_raw.copy(), k_noise, k, bayes, "paper")
    assert v[0] == np.inf and v[2] == 0.5
    assert (v[1] > 0 and np.isfinite(v[1])) if bayes else v[1] == np.inf


def test_round_robin_queries_everyone_once_per_slot_never_oneself():
    m = 5
    rr = RoundRobin(m)
    for t in range(1, 3 * m):
        a, b = rr.targets(t)
        assert sorted(b) == list(range(m)) and (a != b).all()
        assert ((b - a) % m == model.rr_offset(t, m)).all()
    a, b = rr.batch(np.arange(3, 7))
    np.testing.assert_array_equal(b, np.concatenate([rr.targets(t)[1] for t in range(3, 7)]))
    np.testing.assert_array_equal(a, np.tile(np.arange(m), 4))


def test_restricted_round_robin_skips_excluded_agents_and_stops_when_alone():
    beliefs = ClassBeliefs(np.ones((4, 4), dtype=bool))
    beliefs.revise(np.array([0, 0, 1]), np.array([1, 2, 0]), np.array([False, False, True]))
    assert beliefs.n_included.tolist() == [2, 4, 4, 4]
    beliefs.revise(np.array([2, 2, 2]), np.array([0, 1, 3]), np.zeros(3, dtype=bool))
    rrr = RestrictedRoundRobin(beliefs)
    for t in range(1, 4):
        a, b = rrr.targets(t)
        assert 2 not in a.tolist()  # it excludes everyone else
        assert b[a.tolist().index(0)] == 3  # agent 0 includes only 3 besides itself


def test_a_batch_view_reads_what_slot_by_slot_sums_read():
    rng = np.random.default_rng(1)
    samples = rng.normal(size=(4, 3))
    sums, sumsq, counts = np.zeros(3), np.zeros(3), np.zeros(3)
    batch = SlotBatch()
    batch.advance(1, sums, sumsq, counts, samples)
    one_sums, one_sumsq, one_counts = np.zeros(3), np.zeros(3), np.zeros(3)
    now = OneSlot(one_sums, one_sumsq, one_counts)
    who = np.array([2, 0])
    for i, row in enumerate(samples):
        one_sums += row
        one_sumsq += row * row
        one_counts += 1
        slot = batch.slots(np.array([1.5 + i, 1.0 + i]), 2)
        assert slot.tolist() == [i, i]
        for got, expect in zip(batch.own(who, slot), now.own(who, now.slots(None, 2)), strict=True):
            np.testing.assert_array_equal(got, expect)  # the same floats
        assert (batch.clock(slot) == now.clock(slot)).all()
    np.testing.assert_array_equal(sums, one_sums)
    assert batch.slots(None, 1).tolist() == [3]  # no time: now, the last slot
