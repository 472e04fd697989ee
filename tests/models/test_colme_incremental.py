"""Private-ColME's incremental combination sums equal the full recomputation over the pair
state (to 1e-12 relative) in random runs: every mechanism, weight, variance scheme, schedule,
and under losses and latencies; the full path (small populations) is unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from _runs import run_private_colme
from hypothesis import example, given, settings
from hypothesis import strategies as st

from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA
from desim.models.colme.protocol import CombinationSums, PrivateColME
from desim.testing import ScriptedLinks

RTOL = 1e-12
CHECKPOINTS = np.unique(np.geomspace(1, 120, 25).astype(int))


class Checked(PrivateColME):
    """Incremental sums at any size, checked against the full sums at every measurement."""

    incremental_above = 0

    def setup(self, ctx):
        super().setup(ctx)
        self.checks = 0

    def estimates(self):
        num, den = self.sums_w.totals(self.row_sums)
        full_num, full_den = self.row_sums(slice(None))
        # the scale of Σ T/Var: the sum of the terms' magnitudes (terms may cancel)
        weight = np.where(
            self.included,
            1.0 / self.stat.variance(self.sigma2[None, :] if self.known else self.v_hat),
            0.0,
        )
        np.fill_diagonal(weight, 0.0)
        scale = np.nan_to_num(np.abs(weight * self.stat.value).sum(axis=1))
        np.testing.assert_allclose(den, full_den, rtol=RTOL, atol=0)
        np.testing.assert_allclose(num, full_num, rtol=0, atol=RTOL * scale.max(initial=0.0))
        got = super().estimates()
        self.incremental = False
        want = super().estimates()
        self.incremental = True
        np.testing.assert_allclose(got, want, rtol=RTOL)
        self.checks += 1
        return got


def run(params: dict, m: int, t_max: int, links, seed: int) -> Checked:
    return run_private_colme(Checked, params, m, t_max, seed, CHECKPOINTS, links)


def incremental_sums_equal_the_full_recomputation(
    seed, mechanism, weights, variance, schedule, lossy, noise
):
    links = None
    if lossy:  # 20 % drops, exponential delays: gaps, stale releases, repeated answers
        links = ScriptedLinks(
            down=lambda rng, t, src, dst: rng.random(len(src)) < 0.2,
            delay=lambda rng, t, n: rng.exponential(2.0, n),
        )
    proto = run(
        {
            "mechanism": mechanism,
            "weights": weights,
            "variance": variance,
            "schedule": schedule,
            "noise": noise,
            "timeout": 6.0,
        },
        9,
        120,
        links,
        seed,
    )
    assert proto.checks == len(CHECKPOINTS)


def _incremental_cases(test):
    """`test` over drawn runs, and the example that once failed."""
    # a large 1/Var term replaced by a small one: its difference, formed in plain floating point,
    # once lost ulps of the large term (1.4e-12 relative); old and new terms now enter separately
    return example(
        seed=0,
        mechanism="pm1",
        weights="last",
        variance="sch-var-2",
        schedule="rr",
        lossy=True,
        noise="none",
    )(
        given(
            seed=st.integers(0, 10**6),
            mechanism=st.sampled_from(["pm1", "pm2"]),
            weights=st.sampled_from(["last", "mom", "wmom"]),
            variance=st.sampled_from(["known", "sch-var-1", "sch-var-2", "sch-var-2-bayes"]),
            schedule=st.sampled_from(["rr", "rrr"]),
            lossy=st.booleans(),
            noise=st.sampled_from(["gaussian", "laplace", "none"]),
        )(test)
    )


# A few cases in the default set, more in the slow set: each case is a full run.
test_incremental_sums_equal_the_full_recomputation = settings(max_examples=8, deadline=None)(
    _incremental_cases(incremental_sums_equal_the_full_recomputation)
)
test_incremental_sums_equal_the_full_recomputation_more_cases = pytest.mark.slow(
    settings(max_examples=20, deadline=None)(
        _incremental_cases(incremental_sums_equal_the_full_recomputation)
    )
)


def test_large_populations_use_the_incremental_sums_small_ones_the_full_sum():
    """Above `incremental_above` agents the sums are incremental (and agree with the full sum);
    at or below it `estimates` recomputes them in full."""
    spec = build(DATA.get("classes"), {"agents": 1001, "class_means": [0.2, 0.8]}, "data")
    proto = PrivateColME(build(PrivateColME.Params, {}, "test"))
    Simulation(
        proto,
        spec.make(np.random.default_rng(0)),
        6,
        Streams(0, 0, 1, 2),
        checkpoints=np.array([6]),
    ).run()
    assert proto.incremental
    got = proto.estimates()
    proto.incremental = False
    np.testing.assert_allclose(got, proto.estimates(), rtol=RTOL)
    plain = PrivateColME(build(PrivateColME.Params, {}, "test"))
    spec = build(DATA.get("classes"), {"agents": 1000, "class_means": [0.2, 0.8]}, "data")
    Simulation(
        plain,
        spec.make(np.random.default_rng(0)),
        6,
        Streams(0, 0, 1, 2),
        checkpoints=np.array([6]),
    ).run()
    assert not plain.incremental


@given(seed=st.integers(0, 10**6), n=st.integers(2, 40), m=st.integers(1, 6))
@settings(max_examples=50, deadline=None)
def test_replacing_terms_of_repeated_agents_at_once_is_replacing_them_one_by_one(seed, n, m):
    """A window may bring one agent several releases: `replace` takes them in rounds of distinct
    agents, and every sum, carry and count is the same float as removing the old terms one at a
    time, then adding the new ones one at a time (an agent's terms keep their order)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, m, n)
    terms = rng.standard_normal((4, n)) * 10.0 ** rng.integers(-8, 9, (4, n))
    terms[[1, 3]] = np.abs(terms[[1, 3]])
    terms[:, rng.random(n) < 0.2] = 0.0  # excluded pairs: zero terms
    start = np.abs(rng.standard_normal((2, m))) * 1e3  # a common start, something to cancel
    at_once, one_by_one = CombinationSums(m), CombinationSums(m)
    for sums in (at_once, one_by_one):
        sums.replace(np.arange(m), *np.zeros((2, m)), *start)
    at_once.replace(a, *terms)
    zero = np.zeros((2, 1))
    for i in range(n):  # the old terms leave first, then the new ones enter (see `replace`)
        one_by_one.replace(a[i : i + 1], *terms[:2, i : i + 1], *zero)
    for i in range(n):
        one_by_one.replace(a[i : i + 1], *zero, *terms[2:, i : i + 1])
    for name in ("sums", "carry", "terms", "dirty"):
        np.testing.assert_array_equal(getattr(at_once, name), getattr(one_by_one, name))


@given(seed=st.integers(0, 10**6), m=st.integers(1, 30))
@settings(max_examples=50, deadline=None)
def test_replacing_every_agent_in_order_is_the_indexed_replacement(seed, m):
    """A synchronous slot replaces every agent's terms once, in order, without index arrays:
    every sum, carry and count is the float the indexed path (agents in another order) gives."""
    rng = np.random.default_rng(seed)
    terms = rng.standard_normal((4, m)) * 10.0 ** rng.integers(-8, 9, (4, m))
    terms[[1, 3]] = np.abs(terms[[1, 3]])
    terms[:, rng.random(m) < 0.2] = 0.0
    terms[3, rng.random(m) < 0.1] = np.inf  # Var[T] = 0: the agent is recomputed later
    start = np.abs(rng.standard_normal((2, m))) * 1e3
    in_order, indexed = CombinationSums(m), CombinationSums(m)
    backwards = np.arange(m)[::-1].copy()
    for sums in (in_order, indexed):
        sums.replace(np.arange(m), *np.zeros((2, m)), *start)
    with np.errstate(invalid="ignore"):  # an infinite term makes its sums NaN until recomputed
        in_order.replace(np.arange(m), *terms)
        indexed.replace(backwards, *terms[:, backwards])
    for name in ("sums", "carry", "terms", "dirty"):
        np.testing.assert_array_equal(getattr(in_order, name), getattr(indexed, name))
