"""Private-ColME under asynchrony: gaps in the releases a takes keep T, Var[T] and Sch-Var-2
exact, stale and late releases are discarded and counted exactly, nobody stalls, and zero
latency through the general path reproduces ideal links bit for bit."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from _runs import every_slot
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.links import IdealLinks, LinkModel
from desim.kernel.params import ConfigError, build
from desim.kernel.registry import PROTOCOLS
from desim.models.colme.protocol import PrivateColME, asynchrony
from desim.models.colme.statistic import PairStatistic, SchVar2, noise_difference
from desim.models.privacy.release import PSumRelease
from desim.network_models.links import FixedLatency
from desim.testing import ScriptedLinks

LEVELS = 8  # PM-II levels of the unit tests: release indices up to 255


# -- references from scratch --------------------------------------------------------------------
def nodes(mechanism: str, j: int) -> set:
    """The p-sums whose noises make up release j: PM-I p-sums 1..j, PM-II dyadic (ℓ, j >> ℓ)."""
    if mechanism == "pm1":
        return set(range(1, j + 1))
    return {(level, j >> level) for level in range(LEVELS) if j >> level & 1}


def reference(mechanism, weights, js, ts, values, s2, s2dp):
    """T and Var[T] over the releases js (increasing) taken, made at times ts, from scratch.

    Cov of releases r, s: σ_b²/max(t_r, t_s) (data) + σ_DP² × shared p-sums/(t_r t_s) (noise).
    """
    top = js[-1].bit_length()
    block = {
        "last": [len(js) - 1],
        "mom": list(range(len(js))),
        "wmom": [i for i, j in enumerate(js) if j.bit_length() == top],
    }[weights]
    w = 1.0 / len(block)
    shared = [[len(nodes(mechanism, r) & nodes(mechanism, s)) for s in js] for r in js]
    cov = sum(
        s2 / max(ts[r], ts[s]) + s2dp * shared[r][s] / (ts[r] * ts[s]) for r in block for s in block
    )
    return w * sum(values[r] for r in block), w * w * cov


def patterns(max_j: int = 40):
    """Received subsets of releases 1..J (at least one), with b's sample count at each release."""
    return st.integers(1, max_j).flatmap(
        lambda n: st.tuples(
            st.lists(st.booleans(), min_size=n, max_size=n).filter(any),
            st.lists(st.integers(1, 9), min_size=n, max_size=n),
        )
    )


# -- (1) T and Var[T] with gaps and reordering ---------------------------------------------------
def statistic_with_gaps_equals_a_reference_from_scratch(pattern, mechanism, weights, seed):
    """Pair (0, 1) takes a gappy subset while pair (1, 0) takes every release in the same calls,
    so consecutive rows also go through the gap path (and through the fast path otherwise)."""
    received, steps = pattern
    ts = np.cumsum(steps).astype(float)  # b's sample count at releases 1..J
    values = np.random.default_rng(seed).normal(size=len(ts))
    js = [j for j, got in enumerate(received, start=1) if got]
    s2, s2dp = 0.7, 3.0
    stat = PairStatistic(2, mechanism, weights, s2dp, LEVELS)
    for i, j in enumerate(js):
        stat.update(
            np.array([0, 1]),
            np.array([1, 0]),
            values[[j - 1, i]],
            ts[[j - 1, i]],
            np.array([j, i + 1]),
        )
        var = stat.variance(np.full(2, s2))
        for (a, b), taken in (((0, 1), js[: i + 1]), ((1, 0), list(range(1, i + 2)))):
            at = [k - 1 for k in taken]
            t_ref, var_ref = reference(mechanism, weights, taken, ts[at], values[at], s2, s2dp)
            assert stat.value[a, b] == pytest.approx(t_ref, rel=1e-12, abs=1e-12)
            assert var[a, b] == pytest.approx(var_ref, rel=1e-10)
    assert stat.last_index(np.array([1]))[0] == js[-1]


GAP_CASES = given(
    pattern=patterns(),
    mechanism=st.sampled_from(["pm1", "pm2"]),
    weights=st.sampled_from(["last", "mom", "wmom"]),
    seed=st.integers(0, 2**16),
)
# A few cases in the default set, more in the slow set.
test_statistic_with_gaps_equals_a_reference_from_scratch = settings(max_examples=50, deadline=None)(
    GAP_CASES(statistic_with_gaps_equals_a_reference_from_scratch)
)
test_statistic_with_gaps_equals_a_reference_from_scratch_more_cases = pytest.mark.slow(
    settings(max_examples=150, deadline=None)(
        GAP_CASES(statistic_with_gaps_equals_a_reference_from_scratch)
    )
)


@given(pattern=patterns(), mechanism=st.sampled_from(["pm1", "pm2"]), seed=st.integers(0, 2**16))
@settings(max_examples=100, deadline=None)
def test_sch_var_2_with_gaps_equals_its_formula_over_explicit_node_sets(pattern, mechanism, seed):
    """V' and K from the received releases: P_i over d_i samples, c_i = |N_i Δ N_{i−1}| noises."""
    received, steps = pattern
    ts = np.cumsum(steps).astype(float)
    values = np.random.default_rng(seed).normal(size=len(ts))
    js = [j for j, got in enumerate(received, start=1) if got]
    est = SchVar2(1, mechanism, LEVELS)
    for k, j in enumerate(js, start=1):
        prev = js[k - 2] if k > 1 else 0
        v_raw, k_noise, _ = est.update(
            np.array([0]),
            values[[j - 1]],
            ts[[j - 1]],
            np.array([j]),
            2.0,
            np.array([prev]),
            np.array([k]),
        )
        if k < 2:
            continue
        y = [0.0] + [ts[i - 1] * values[i - 1] for i in js[:k]]
        t = [0.0] + [ts[i - 1] for i in js[:k]]
        sets = [set()] + [nodes(mechanism, i) for i in js[:k]]
        p2d = sum((y[i] - y[i - 1]) ** 2 / (t[i] - t[i - 1]) for i in range(1, k + 1))
        cd = sum(len(sets[i] ^ sets[i - 1]) / (t[i] - t[i - 1]) for i in range(1, k + 1))
        assert v_raw[0] == pytest.approx((p2d - y[k] ** 2 / t[k]) / (k - 1), rel=1e-9, abs=1e-9)
        assert k_noise[0] == pytest.approx(
            2.0 * (cd - len(sets[k]) / t[k]) / (k - 1), rel=1e-9, abs=1e-12
        )


def test_noise_difference_of_consecutive_releases_is_the_synchronous_count():
    j = np.arange(1, 200)
    np.testing.assert_array_equal(noise_difference("pm1", j, j - 1, LEVELS), 1.0)
    lsb = np.log2(j & -j)
    np.testing.assert_array_equal(noise_difference("pm2", j, j - 1, LEVELS), 1.0 + lsb)
    w_h = [bin(x).count("1") for x in j]
    np.testing.assert_array_equal(noise_difference("pm2", j, 0 * j, LEVELS), w_h)


# -- (2) Sch-Var-2 with gaps is unbiased ---------------------------------------------------------
@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_sch_var_2_with_gaps_is_unbiased(mechanism):
    """b makes all 12 releases (its mechanism counts every p-sum); a takes 7 of them."""
    n = 150  # n² pairs b → a are the Monte Carlo replicates
    sigma, s2dp = 1.3, 4.0
    ts = np.array([2, 5, 7, 10, 14, 15, 19, 22, 26, 27, 31, 35])
    taken = [2, 3, 6, 7, 8, 11, 12]  # first taken is release 2; gaps of 1, 2 and 3
    rng = np.random.default_rng(11)
    b, a = np.divmod(np.arange(n * n), n)
    sums = np.cumsum(0.6 + sigma * rng.standard_normal((n * n, ts[-1])), axis=1)
    mech = PSumRelease(n, mechanism, "gaussian", s2dp, rng, 16)
    est = SchVar2(n * n, mechanism, 5)
    prev, k = np.zeros(n * n, dtype=np.int64), 0
    for j, t in enumerate(ts, start=1):
        values, index, _ = mech.release(b, a, sums[:, t - 1], np.full(n * n, float(t)))
        assert (index == j).all()
        if j in taken:
            k += 1
            v_raw, k_noise, _ = est.update(
                np.arange(n * n),
                values,
                np.full(n * n, float(t)),
                index,
                s2dp,
                prev,
                np.full(n * n, k),
            )
            prev = index
    v = v_raw - k_noise
    se = v.std(ddof=1) / math.sqrt(len(v))
    assert abs(v.mean() - sigma**2) < 4 * se, (v.mean(), sigma**2, se)


# -- protocol runs -------------------------------------------------------------------------------
class Counting(PrivateColME):
    """Private-ColME that also counts the queries and releases delivered and taken."""

    def setup(self, ctx):
        super().setup(ctx)
        self.queries_in = self.releases_in = self.taken = 0

    def on_deliver(self, batch):
        self.queries_in += len(batch.of_kind("query"))
        self.releases_in += len(batch.of_kind("release"))
        super().on_deliver(batch)

    def take(self, got, last=None, taken=None):
        self.taken += len(got.a)
        super().take(got, last, taken)


def simulate(
    params: dict,
    m: int,
    t_max: int,
    links: LinkModel | None,
    cls=None,
    protocol: str = "private-colme",
    seed: int = 0,
):
    return every_slot(
        params,
        m,
        t_max,
        links,
        seed,
        protocol=protocol,
        cls=cls,
        metrics=[asynchrony],
        per_agent=True,
    )


def metric(out, name: str) -> np.ndarray:
    rows = out.metrics[out.metrics.metric == name]
    return rows.value.to_numpy()


@pytest.mark.parametrize(
    "params",
    [
        {"mechanism": "pm1", "weights": "last"},
        pytest.param(
            {
                "mechanism": "pm2",
                "weights": "wmom",
                "schedule": "rrr",
                "variance": "sch-var-2-bayes",
            },
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"mechanism": "pm2", "weights": "mom", "variance": "sch-var-1", "welch_df": "kappa"},
            marks=pytest.mark.slow,
        ),
        pytest.param(
            {"mechanism": "pm1", "weights": "mom", "variance": "sch-var-2", "welch_df": "kappa"},
            marks=pytest.mark.slow,
        ),
    ],
)
def test_lossy_laggy_run_accounts_for_every_message(params):
    """Exponential latencies (mean 3 slots) and 20% drops: every release delivered is taken,
    stale or timed out, every query delivered gets a new release or a repeat, and all happen."""
    m, t_max = 6, 300
    links = ScriptedLinks(
        down=lambda rng, t, src, dst: rng.random(len(src)) < 0.2,
        delay=lambda rng, t, n: rng.exponential(3.0, n),
    )
    proto, out = simulate({**params, "timeout": 8.0}, m, t_max, links, Counting)
    assert proto.releases_in == proto.taken + proto.stale.sum() + proto.timed_out.sum()
    assert proto.queries_in == proto.mech.count.sum() + proto.repeated.sum()
    assert min(proto.stale.sum(), proto.timed_out.sum(), proto.repeated.sum()) > 0
    if params.get("schedule", "rr") == "rr":  # nobody waits for answers: one query per slot
        assert metric(out, "messages_query")[-1] == m * t_max
    assert np.isfinite(proto.estimates()).all()
    assert metric(out, "stale")[-1] <= proto.stale.sum()  # later arrivals: after the last record


def test_release_older_than_one_taken_is_stale():
    """Messages sent at odd slots take 2 slots, others none. With two agents, the query of slot s
    is answered at s (even s) or s + 2 (odd s), so release j = x − 1 answered at x arrives at x
    (x even) or x + 2 (x odd): j = 1, 3, 2, 5, 4, … — every even j arrives after j + 1."""
    links = ScriptedLinks(delay=lambda rng, t, n: 2.0 if t == int(t) and int(t) % 2 else 0.0)
    t_max = 40
    proto, out = simulate({"mechanism": "pm2", "weights": "mom"}, 2, t_max, links, Counting)
    t = np.arange(1, t_max + 1)
    np.testing.assert_array_equal(metric(out, "stale"), 2 * np.maximum((t - 3) // 2, 0))
    np.testing.assert_array_equal(metric(out, "timed_out"), 0)
    np.testing.assert_array_equal(metric(out, "repeated"), 0)
    assert proto.taken == 2 * (t_max // 2)
    last = 2 * (t_max // 2) - 1
    assert proto.stat.kappa[0, 1] == proto.stat.kappa[1, 0] == last
    # mean of means over the odd releases 1, 3, …, last: n = their number
    n = proto.stat.terms(np.array([0 * 2 + 1]))[3]  # pair (a, b) = (0, 1)
    assert n[0] == (last + 1) // 2


@pytest.mark.parametrize("timeout", [math.inf, 1.0])
def test_query_answered_in_a_slot_already_answered_repeats_the_release(timeout):
    """Queries of odd slots take 1.5 slots, so b answers at s + 1.5 with the count s + 1 it had
    when it answered the query of slot s + 1: it re-sends that release, which a took already
    (stale) — or which arrives 1.5 slots after the query, beyond a timeout of 1 (timed out)."""
    links = ScriptedLinks(delay=lambda rng, t, n: 1.5 if t == int(t) and int(t) % 2 else 0.0)
    t_max = 30
    proto, out = simulate({"mechanism": "pm1", "timeout": timeout}, 2, t_max, links, Counting)
    t = np.arange(1, t_max + 1)
    expect = 2 * ((t - 1) // 2)  # odd s with s + 1.5 ≤ t, for each of the two agents
    np.testing.assert_array_equal(metric(out, "repeated"), expect)
    late = metric(out, "timed_out")
    np.testing.assert_array_equal(metric(out, "stale") + late, expect)
    np.testing.assert_array_equal(late, expect if timeout == 1.0 else 0)
    assert proto.mech.count[0, 1] == t_max // 2  # one new release per even slot


@pytest.mark.parametrize(
    "params",
    [
        {"mechanism": "pm1"},
        {"mechanism": "pm2", "variance": "sch-var-1"},
    ],
)
def test_a_repeated_answer_is_the_release_it_repeats(params):
    """Under the timing above, every repeated answer carries the columns of b's last release to
    a bit for bit — value, count, index j and Sch-Var-1's variance release — though only the
    value and count are kept per pair and j is read back from the mechanism's count."""
    answers = []

    class Recording(PrivateColME):
        def setup(self, ctx):
            def send(kind, src, dst, payload=None, **how):
                if kind == "release":
                    answers.append((src.copy(), dst.copy(), payload.copy()))
                return ctx.send(kind, src, dst, payload, **how)

            super().setup(dataclasses.replace(ctx, send=send))

    links = ScriptedLinks(delay=lambda rng, t, n: 1.5 if t == int(t) and int(t) % 2 else 0.0)
    simulate(params, 2, 30, links, Recording)
    first: dict[tuple[int, int, int], np.ndarray] = {}
    repeats = 0
    asked = 3  # the ASKED column (the query's send time): not part of the release
    for b, a, payload in answers:
        for bi, ai, row in zip(b, a, payload, strict=True):
            key = (int(bi), int(ai), int(row[2]))
            kept = np.delete(row, asked)
            if key in first:
                repeats += 1
                np.testing.assert_array_equal(kept, first[key])
            else:
                first[key] = kept
    assert repeats == 2 * 15  # every odd slot's query, each agent's (slot 29's answered at 30.5)


@pytest.mark.parametrize(
    ("variance", "extra"),
    [
        ("known", 12),  # the last answer's value (float64) and count (int32)
        ("sch-var-2", 12 + 8),  # … and the releases taken per pair
        ("sch-var-1", 12 + 8 + 8),  # … and the last answer's variance release
    ],
)
def test_asynchrony_adds_only_the_last_answer_per_pair(variance, extra):
    """Pair-sized state beyond the synchronous protocol's: the bytes per ordered pair that
    asynchrony costs (at M = 5000, 12 bytes a pair are 0.3 GB)."""
    m = 7

    def pair_bytes(proto) -> int:
        """Bytes of the pair-sized arrays of the protocol and of the model parts it holds."""
        seen, total, todo = set(), 0, [proto]
        while todo:
            for v in vars(todo.pop()).values():
                if id(v) in seen:
                    continue
                seen.add(id(v))
                if isinstance(v, np.ndarray):
                    total += v.nbytes if v.size >= m * m else 0
                elif type(v).__module__.startswith("desim.models"):
                    todo.append(v)
        return total

    params = {"mechanism": "pm1", "variance": variance}
    ideal, _ = simulate(params, m, 4, None)
    laggy, _ = simulate(params, m, 4, FixedLatency(slots=1.0))
    assert laggy.asynchronous and not ideal.asynchronous
    assert pair_bytes(laggy) - pair_bytes(ideal) == extra * m * m


@pytest.mark.parametrize("timeout, lost", [(1.5, True), (2.0, False)])
def test_round_trip_beyond_the_timeout_is_discarded(timeout, lost):
    """Fixed latency 1: each answer arrives 2 slots after its query. A timeout below that
    discards all M(t − 2) of them by slot t and leaves every estimate at the local mean."""
    m, t_max = 5, 30
    proto, out = simulate(
        {"mechanism": "pm1", "timeout": timeout}, m, t_max, FixedLatency(slots=1.0)
    )
    t = np.arange(1, t_max + 1)
    arrived = m * np.maximum(t - 2, 0)
    np.testing.assert_array_equal(metric(out, "timed_out"), arrived if lost else 0)
    np.testing.assert_array_equal(metric(out, "stale"), 0)
    local = proto.sums / proto.counts
    if lost:
        np.testing.assert_allclose(proto.estimates(), local, rtol=1e-14)
        assert (proto.stat.kappa == 0).all()
    else:
        assert (proto.stat.kappa[~np.eye(m, dtype=bool)] > 0).all()


@pytest.mark.parametrize("schedule", ["rr", "rrr"])
def test_a_stalled_agent_blocks_nobody(schedule):
    """Agent 0 neither answers nor is heard: everyone keeps querying every slot (agent 0 too)
    and takes every release of the others, one per query to them."""
    m, t_max = 5, 40
    links = ScriptedLinks(down=lambda rng, t, src, dst: (src == 0) | (dst == 0))
    proto, out = simulate(
        {"mechanism": "pm2", "weights": "mom", "schedule": schedule},
        m,
        t_max,
        links,
        protocol="private-colme-oracle",
    )
    assert metric(out, "messages_query")[-1] == m * t_max
    kappa = proto.stat.kappa
    others = ~np.eye(m, dtype=bool)
    others[:, 0] = others[0, :] = False
    assert (kappa[:, 0] == 0).all() and (kappa[0, :] == 0).all()
    same = proto.ctx.oracle_classes[:, None] == proto.ctx.oracle_classes[None, :]
    if schedule == "rr":  # each of the M − 1 others is queried every M − 1 slots
        assert (kappa[others] == t_max // (m - 1)).all()
    else:  # rRR skips the other class (the oracle), never the silent agent 0
        assert (kappa[others & same] > 0).all() and (kappa[others & ~same] == 0).all()


# -- (4) zero latency through the general path: ideal links bit for bit -------------------------
@pytest.mark.parametrize(
    "params",
    [
        {"mechanism": "pm1", "weights": "last"},
        {"mechanism": "pm2", "weights": "mom", "schedule": "rrr"},
        {"mechanism": "pm2", "weights": "wmom", "variance": "sch-var-2"},
        {
            "mechanism": "pm1",
            "weights": "mom",
            "schedule": "rrr",
            "variance": "sch-var-2-bayes",
            "welch_df": "kappa",
        },
        {"mechanism": "pm2", "variance": "sch-var-1", "welch_df": "kappa"},
        {"mechanism": "pm1", "variance": "sch-var-2", "timeout": 3.0},
    ],
)
def test_zero_latency_reproduces_ideal_links_bit_for_bit(params):
    m, t_max = 9, 120
    ideal, out_ideal = simulate(params, m, t_max, IdealLinks(), seed=4)
    general, out_general = simulate(params, m, t_max, FixedLatency(slots=0.0), seed=4)
    assert general.asynchronous and not ideal.asynchronous
    keep = ~out_general.metrics.metric.str.startswith("dropped")
    assert (
        out_ideal.metrics.to_csv().encode()
        == out_general.metrics[keep].reset_index(drop=True).to_csv().encode()
    )
    assert out_ideal.agents.to_csv().encode() == out_general.agents.to_csv().encode()
    pairs = np.arange(m * m)
    for got, expect in zip(general.stat.terms(pairs), ideal.stat.terms(pairs), strict=True):
        np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(general.stat.kappa, ideal.stat.kappa)


def test_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="timeout"):
        build(PROTOCOLS.get("private-colme").Params, {"timeout": 0}, "test")


def test_async_metric_ignores_other_protocols():
    assert asynchrony(object(), None) == {}
