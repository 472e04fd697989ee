"""Availability of links and nodes: Bernoulli, Gilbert–Elliott, churn and trace replay."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from desim.kernel.params import ConfigError
from desim.kernel.registry import AVAILABILITY
from desim.network_models.availability import (
    Always,
    BernoulliAvailability,
    BufferedRenewal,
    Markov,
    RenewalAvailability,
    RenewalBound,
    SteppedRenewal,
    Trace,
    availability,
    link_entity,
    n_entities,
    read_trace,
    renewal,
)
from desim.network_models.distributions import Weibull


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _links(model: RenewalAvailability, n_addresses: int, key: int, **options) -> RenewalBound:
    """`model` realised on the links of `n_addresses` addresses with draws keyed by `key`, its
    storage chosen by `options` (see `renewal`): every choice gives the same answers."""
    laws = model.laws()
    return renewal(*laws, n_entities(n_addresses, "link"), np.uint64(key), model.slotted, **options)


def test_every_model_is_registered_and_link_entities_are_unordered_pairs():
    assert set(AVAILABILITY) == {"always", "bernoulli", "markov", "trace", "churn"}
    np.testing.assert_array_equal(link_entity([1, 4, 2], [4, 1, 2], 5), [9, 9, 12])
    bound = Always().bind(5, "node", _rng())
    assert bound.up(3.5, np.arange(5)).all() and (bound.stationary(np.arange(5)) == 1).all()


def test_bernoulli_rate_slots_and_common_random_numbers():
    model = BernoulliAvailability(p=0.3)
    bound = model.bind(100, "link", _rng(1))
    slots, entity = 400, link_entity(*np.triu_indices(100, 1), 100)
    up = np.stack([bound.up(s + 0.5, entity) for s in range(slots)])
    n = up.size
    assert abs(up.mean() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)
    # one realisation per slot ⌊t⌋; consecutive slots independent (lag-1 correlation ≈ 0)
    assert np.array_equal(bound.up(7.0, entity), up[7])
    assert np.array_equal(bound.up(7.99, entity), up[7])
    x = up.astype(float) - 0.3
    lag1 = (x[1:] * x[:-1]).mean() / 0.21
    assert abs(lag1) < 4 / math.sqrt(x[1:].size)
    again = model.bind(100, "link", _rng(1))
    assert np.array_equal(again.up(12.0, entity[::-1])[::-1], up[12])
    assert (bound.stationary(entity[:3]) == 0.3).all()


# ---------------------------------------------------------------------------------------------
# Gilbert–Elliott


def _sojourns(bound: RenewalBound, entity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(state, length) of sojourn 1 of every entity: i.i.d. draws of the sojourn laws (sojourn 0
    may be special; sojourn 1 starts at a switch and is independent of everything before)."""
    t1 = bound.next_switch(0.0, entity)
    state, end = np.empty(len(entity), dtype=bool), np.empty(len(entity))
    order = np.argsort(t1, kind="stable")
    times, first = np.unique(t1[order], return_index=True)
    for t, rows in zip(times, np.split(order, first[1:]), strict=True):  # times ascending
        state[rows] = bound.up(t, entity[rows])
        end[rows] = bound.next_switch(t, entity[rows])
    return state, end - t1


def test_markov_is_stationary_at_every_slot_across_independent_links():
    model = Markov(mean_up=20.0, mean_down=5.0)
    bound = model.bind(300, "link", _rng(2))
    entity = link_entity(*np.triu_indices(300, 1), 300)  # 44 850 independent links
    assert isinstance(bound, SteppedRenewal)  # 300² link ids: too many to keep sojourns ahead
    pi = 0.8
    se = math.sqrt(pi * (1 - pi) / len(entity))
    for t in (0.0, 3.7, 250.0):
        assert abs(bound.up(t, entity).mean() - pi) < 4 * se
    assert (bound.stationary(entity[:4]) == pi).all()


def test_markov_long_run_fraction_up_within_four_standard_errors():
    mean_up, mean_down, slots, n = 4.0, 2.0, 2000, 500
    bound = Markov(mean_up=mean_up, mean_down=mean_down).bind(n, "node", _rng(3))
    entity = np.arange(n)
    fraction = np.mean([bound.up(s, entity).mean() for s in range(slots)])
    pi = mean_up / (mean_up + mean_down)
    # a two-state chain's time average has variance π(1−π)/T·(1+λ)/(1−λ), λ = 1 − a − b
    lam = 1 - 1 / mean_up - 1 / mean_down
    se = math.sqrt(pi * (1 - pi) / slots * (1 + lam) / (1 - lam) / n)
    assert abs(fraction - pi) < 4 * se


def test_markov_sojourns_are_geometric_in_whole_slots_with_the_given_means():
    mean_up, mean_down = 20.0, 5.0
    bound = Markov(mean_up=mean_up, mean_down=mean_down).bind(20_000, "node", _rng(4))
    state, length = _sojourns(bound, np.arange(20_000))
    assert (length >= 1).all() and (length == np.round(length)).all()
    for flag, mean in ((True, mean_up), (False, mean_down)):
        x = length[state == flag]
        assert abs(x.mean() - mean) < 4 * math.sqrt(mean * (mean - 1) / len(x))
    # the state is constant within a slot and changes at slot boundaries
    entity = np.arange(1000)
    again = Markov(mean_up=mean_up, mean_down=mean_down).bind(1000, "node", _rng(4))
    changed = 0
    for s in range(50):
        at_start = again.up(s, entity)
        assert np.array_equal(again.up(s + 0.99, entity), at_start)
        changed += int((again.up(s + 1, entity) != at_start).sum())
    assert changed > 0


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_answers_do_not_depend_on_which_entities_are_asked_or_when(seed, data):
    model = Markov(mean_up=3.0, mean_down=2.0)
    times = [0.0, 1.5, 4.0, 17.0, 60.0]
    entity = np.arange(0, 400, 7)
    reference = model.bind(20, "link", _rng(seed))
    expected = {t: reference.up(t, entity) for t in times}
    other = model.bind(20, "link", _rng(seed))
    for t in sorted(data.draw(st.lists(st.sampled_from(times), min_size=1, max_size=5))):
        pick = data.draw(st.permutations(range(len(entity))))[: data.draw(st.integers(1, 57))]
        assert np.array_equal(other.up(t, entity[pick]), expected[t][pick])
    # earlier times are replayed, not refused
    assert np.array_equal(other.up(1.5, entity), expected[1.5])


def test_sparse_storage_and_catch_up_blocks_give_the_same_floats():
    model = availability(
        {
            "model": "churn",
            "session": {"model": "lognormal", "mean": 3.0, "cv": 2.0},
            "offline": {"model": "pareto", "shift": 0.5, "scale": 1.0, "alpha": 2.5},
        },
        "x",
    )
    entity = np.array([5, 17, 3, 399, 17, 250])
    buffered = _links(model, 20, 9)  # asked often: small blocks
    for t in np.linspace(0, 500, 300):
        buffered.up(t, entity[: 1 + int(t) % 6])
    dense = _links(model, 20, 9, buffered_up_to=0)
    for t in np.linspace(0, 500, 300):
        dense.up(t, entity[: 1 + int(t) % 6])
    sparse = _links(model, 20, 9, buffered_up_to=0, dense_up_to=10)  # one catch-up, ~100 cycles
    assert isinstance(buffered, BufferedRenewal) and isinstance(dense, SteppedRenewal)
    assert dense.dense and not sparse.dense
    for other in (dense, buffered):
        assert np.array_equal(sparse.next_switch(500.0, entity), other.next_switch(500.0, entity))
        assert np.array_equal(sparse.up(500.0, entity), other.up(500.0, entity))
        assert np.array_equal(sparse.up(3.0, entity[::-1]), other.up(3.0, entity[::-1]))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), churn=st.booleans(), data=st.data())
def test_sparse_storage_grown_batch_by_batch_answers_as_dense(seed, churn, data):
    """Entities held in order of first sight (sparse storage, its arrays and hash index grown as
    new ones come) answer every question as dense storage does, for any batches of entities."""
    model = (
        availability(
            {
                "model": "churn",
                "session": {"model": "exponential", "mean": 2.0},
                "offline": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
            },
            "x",
        )
        if churn
        else Markov(mean_up=3.0, mean_down=2.0)
    )
    dense = _links(model, 60, seed, buffered_up_to=0)
    sparse = _links(model, 60, seed, buffered_up_to=0, dense_up_to=10)
    assert dense.dense and not sparse.dense
    rng = np.random.default_rng(seed)
    t = 0.0
    for _ in range(data.draw(st.integers(1, 12))):
        t += data.draw(st.sampled_from([0.0, 0.7, 5.0, 80.0]))
        entity = rng.integers(0, 3600, data.draw(st.integers(0, 900)))
        assert np.array_equal(sparse.up(t, entity), dense.up(t, entity))
        assert np.array_equal(sparse.next_switch(t, entity), dense.next_switch(t, entity))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), churn=st.booleans(), extend=st.booleans(), data=st.data())
def test_look_ahead_gives_the_floats_of_fresh_draws(seed, churn, extend, data):
    """Sojourns kept ahead (BufferedRenewal) are read instead of drawn again: every state and
    switch time equals that of the lazily stepped model, for any order of questions (forwards,
    gaps of many cycles, back in time), however many sojourns are kept, whether renewals extend
    worn rows or not (large questions do not)."""
    model = (
        availability(
            {
                "model": "churn",
                "session": {"model": "exponential", "mean": 2.0},
                "offline": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
            },
            "x",
        )
        if churn
        else Markov(mean_up=3.0, mean_down=2.0)
    )
    kept = data.draw(st.sampled_from([32, 1, 2, 7]))  # the default, and short rows
    options = {"ahead": kept} if extend else {"ahead": kept, "extend_up_to": 0}
    ahead = _links(model, 20, seed, **options)
    assert isinstance(ahead, BufferedRenewal)
    plain = _links(model, 20, seed, buffered_up_to=0)
    assert isinstance(plain, SteppedRenewal)
    entity = np.arange(0, 400, 5)
    steps = data.draw(
        st.lists(st.tuples(st.floats(0, 400), st.integers(1, len(entity))), min_size=1, max_size=30)
    )
    for t, n in sorted(steps)[: len(steps) - 2] + steps[-2:]:  # mostly forwards, then anywhere
        pick = data.draw(st.permutations(range(len(entity))))[:n]
        e = entity[pick]
        answer = ahead.up(t, e)
        assert np.array_equal(answer, plain.up(t, e))
        answer[:] = ~answer  # the caller's to write to: the same question again is unchanged
        assert np.array_equal(ahead.up(t, e), plain.up(t, e))
        assert np.array_equal(ahead.next_switch(t, e), plain.next_switch(t, e))


def one_time_per_entity_answers_as_one_question_per_time(seed, which, data):
    """`up(times, entity)` (the network asks once per window) gives what asking each entity at
    its own time gives, also for entities asked at several times, spans of many sojourns and
    times before earlier questions."""
    model = [
        BernoulliAvailability(p=0.6),
        Markov(mean_up=1.0, mean_down=1.0),  # geometric laws of mean 1: log(1 − p) = −∞
        Markov(mean_up=5.0, mean_down=2.0),
        availability(
            {
                "model": "churn",
                "session": {"model": "exponential", "mean": 2.0},
                "offline": {"model": "lognormal", "mean": 1.0, "cv": 2.0},
            },
            "x",
        ),
    ][which]
    if isinstance(model, RenewalAvailability):
        asked = _links(model, 12, seed)
        one = _links(model, 12, seed, buffered_up_to=0)  # asked one time at a time
        stepped = _links(model, 12, seed, buffered_up_to=0)  # no kept sojourns: time by time
    else:
        asked, one, stepped = (model.bind(12, "link", _rng(seed)) for _ in range(3))
    assert asked.per_message
    assert asked.up(np.empty(0), np.empty(0, dtype=np.int64)).shape == (0,)
    assert stepped.per_message
    rng = np.random.default_rng(seed)
    start = 0.0
    for _ in range(data.draw(st.integers(1, 8))):
        start = data.draw(st.floats(0, start + 200))  # mostly forwards, sometimes back
        times = np.sort(start + rng.uniform(0, data.draw(st.sampled_from([0.5, 20.0, 400.0])), 40))
        entity = rng.integers(0, 144, 40)
        want = np.array([one.up(float(t), entity[i : i + 1])[0] for i, t in enumerate(times)])
        assert np.array_equal(asked.up(times, entity), want)
        assert np.array_equal(stepped.up(times[::-1], entity[::-1]), want[::-1])
        if hasattr(asked, "next_switch"):
            want = [one.next_switch(float(t), entity[i : i + 1])[0] for i, t in enumerate(times)]
            assert np.array_equal(asked.next_switch(times, entity), want)
            assert np.array_equal(stepped.next_switch(times, entity), want)


ONE_TIME_CASES = given(seed=st.integers(0, 2**32 - 1), which=st.integers(0, 3), data=st.data())
# A few cases in the default set, more in the slow set.
test_one_time_per_entity_answers_as_one_question_per_time = settings(
    max_examples=10, deadline=None
)(ONE_TIME_CASES(one_time_per_entity_answers_as_one_question_per_time))
test_one_time_per_entity_answers_as_one_question_per_time_more_cases = pytest.mark.slow(
    settings(max_examples=30, deadline=None)(
        ONE_TIME_CASES(one_time_per_entity_answers_as_one_question_per_time)
    )
)


def test_different_seeds_differ_and_the_same_seed_repeats():
    assert isinstance(Markov().bind(50, "node", _rng(5)), BufferedRenewal)
    a = Markov().bind(50, "node", _rng(5)).up(100.0, np.arange(50))
    b = Markov().bind(50, "node", _rng(5)).up(100.0, np.arange(50))
    c = Markov().bind(50, "node", _rng(6)).up(100.0, np.arange(50))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


# ---------------------------------------------------------------------------------------------
# churn


def test_churn_long_run_fraction_up_and_session_lengths():
    model = availability(
        {
            "model": "churn",
            "session": {"model": "weibull", "shape": 0.7, "scale": 200.0},
            "offline": {"model": "exponential", "mean": 50.0},
        },
        "[network.nodes]",
    )
    session = Weibull(shape=0.7, scale=200.0)
    pi = session.mean / (session.mean + 50.0)
    n = 20_000
    bound = model.bind(n, "node", _rng(7))
    entity = np.arange(n)
    assert (bound.stationary(entity[:3]) == pi).all()
    state, length = _sojourns(bound, entity)
    var = 200.0**2 * (math.gamma(1 + 2 / 0.7) - math.gamma(1 + 1 / 0.7) ** 2)
    for flag, mean, v in ((True, session.mean, var), (False, 50.0, 50.0**2)):
        x = length[state == flag]
        assert abs(x.mean() - mean) < 4 * math.sqrt(v / len(x))
    # t = 100 mean cycles: the fresh first sojourn has long been forgotten
    up = bound.up(100 * (session.mean + 50.0), entity)
    assert abs(up.mean() - pi) < 4 * math.sqrt(pi * (1 - pi) / n)


def test_churn_defaults_and_continuous_time():
    model = availability({"model": "churn"}, "[network.nodes]")
    assert model.session_law.mean == 100.0 and model.offline_law.mean == 10.0
    bound = model.bind(1000, "node", _rng(8))
    t = bound.next_switch(0.0, np.arange(1000))
    assert (t != np.round(t)).all()  # switches fall between slots


# ---------------------------------------------------------------------------------------------
# traces


def _write(path: Path, text: str) -> Path:
    path.write_text(text.strip() + "\n")
    return path


def test_trace_replays_node_intervals_exactly_with_boundaries_and_default(tmp_path):
    _write(
        tmp_path / "nodes.csv",
        """
start,end,state,node
2,5,down,1
5,7.5,up,1
7.5,9,down,1
0,1,down,0
""",
    )
    bound = Trace(file="nodes.csv", default="up").bind(3, "node", _rng(), base_dir=tmp_path)
    expect = {  # t: (node 0, node 1, node 2)
        0.0: (False, True, True),
        0.999: (False, True, True),
        1.0: (True, True, True),
        1.99: (True, True, True),
        2.0: (True, False, True),
        4.99: (True, False, True),
        5.0: (True, True, True),
        7.49: (True, True, True),
        7.5: (True, False, True),
        8.0: (True, False, True),
        9.0: (True, True, True),
        1000.0: (True, True, True),
    }
    for t, states in expect.items():
        assert bound.up(t, np.arange(3)).tolist() == list(states), t
    # asked about the past: replayed from the start
    assert bound.up(2.0, np.array([1, 1, 0])).tolist() == [False, False, True]
    times = np.array(list(expect))[::-1]
    for node in range(3):  # one time per entity (a window's question), in any order
        got = bound.up(times, np.full(len(times), node))
        assert got.tolist() == [expect[t][node] for t in times]
    assert bound.horizon == 9.0
    np.testing.assert_allclose(bound.stationary(np.arange(3)), [8 / 9, 4.5 / 9, 1.0])


def test_trace_links_share_state_in_both_directions_and_default_down(tmp_path, monkeypatch):
    _write(tmp_path / "links.csv", "src,dst,start,end,state\n3,1,0,4,up\n0,3,2,3,up\n")
    monkeypatch.chdir(tmp_path)  # a relative file without base_dir: the current directory
    bound = Trace(file="links.csv", default="down").bind(4, "link", _rng())
    e13, e31, e03, e01 = link_entity([1, 3, 0, 0], [3, 1, 3, 1], 4)
    assert e13 == e31
    assert bound.up(0.0, np.array([e13, e31, e03, e01])).tolist() == [True, True, False, False]
    assert bound.up(2.5, np.array([e03, e13])).tolist() == [True, True]
    assert bound.up(3.0, np.array([e03, e13])).tolist() == [False, True]
    assert bound.up(4.0, np.array([e13])).tolist() == [False]
    np.testing.assert_allclose(bound.stationary(np.array([e13, e03, e01])), [1.0, 0.25, 0.0])


def test_trace_resolves_relative_paths_against_base_dir(tmp_path):
    _write(tmp_path / "t.csv", "start,end,state,node\n0,1,down,0\n")
    assert Trace(file="t.csv").path(tmp_path) == tmp_path / "t.csv"
    assert Trace(file=str(tmp_path / "t.csv")).path("/elsewhere") == tmp_path / "t.csv"
    with pytest.raises(ConfigError, match="cannot be read"):
        Trace(file="t.csv").bind(2, "node", _rng(), base_dir=tmp_path / "missing")


@pytest.mark.parametrize(
    ("scope", "text", "needles"),
    [
        ("node", "start,end,node\n0,1,0", ["missing column(s) state", "start, end, state, node"]),
        ("link", "start,end,state,node\n0,1,up,0", ["missing column(s) src, dst"]),
        ("node", "start,end,state,node\n0,1,up,0\n3,3,down,1", ["line 3", "end = 3", "> start"]),
        ("node", "start,end,state,node\n-1,1,up,0", ["line 2", "start = -1", "≥ 0"]),
        ("node", "start,end,state,node\n0,1,off,0", ["line 2", "state = 'off'", "'up' or 'down'"]),
        ("node", "start,end,state,node\n0,x,up,0", ["line 2", "end = 'x'", "a number"]),
        ("node", "start,end,state,node\n0,1,up,1.5", ["line 2", "node = '1.5'", "integer"]),
        ("link", "start,end,state,src,dst\n0,1,up,2,2", ["line 2", "src = dst = 2"]),
        (
            "node",
            "start,end,state,node\n0,5,up,0\n6,8,up,1\n4,6,down,0",
            ["lines 2 and 4 overlap", "node 0"],
        ),
        (
            "link",
            "start,end,state,src,dst\n0,5,up,1,2\n4.5,6,down,2,1",
            ["lines 2 and 3 overlap", "link 1–2"],
        ),
        ("node", "start,end,state,node\n0,5,up,0\n6,8,up,9", ["line 3", "address 9", "0…3"]),
        ("link", "start,end,state,src,dst\n0,5,up,0,4", ["line 2", "address 4", "0…3"]),
    ],
)
def test_bad_traces_give_one_line_errors(tmp_path, scope, text, needles):
    _write(tmp_path / "bad.csv", text)
    with pytest.raises(ConfigError) as exc:
        Trace(file="bad.csv").bind(4, scope, _rng(), base_dir=tmp_path)
    message = str(exc.value)
    assert "\n" not in message and "bad.csv" in message
    for needle in needles:
        assert needle in message


def test_touching_intervals_hand_over_and_read_trace_needs_no_run(tmp_path):
    path = _write(tmp_path / "t.csv", "start,end,state,node\n0,2,down,0\n2,4,down,0\n")
    rows = read_trace(path, "node")
    assert rows.line.tolist() == [2, 3]
    bound = Trace(file=str(path)).bind(1, "node", _rng())
    assert [bool(bound.up(t, np.array([0]))[0]) for t in (0, 1.9, 2, 3.9, 4)] == [
        False,
        False,
        False,
        False,
        True,
    ]


# ---------------------------------------------------------------------------------------------
# study-file tables


@pytest.mark.parametrize(
    ("table", "needles"),
    [
        ({"p": 0.5}, ["[network.outages]", "missing key 'model'", "markov"]),
        ({"model": "markv"}, ["[network.outages]: model", "did you mean 'markov'"]),
        ({"model": "markov", "mean_up": 0.5}, ["[network.outages]", "mean_up = 0.5", "≥ 1"]),
        ({"model": "bernoulli", "p": 1.5}, ["[network.outages]", "p = 1.5", "≤ 1"]),
        (
            {"model": "churn", "session": {"model": "exponential", "mean": -1.0}},
            ["[network.outages]", "session", "mean = -1.0", "> 0"],
        ),
        (
            {"model": "churn", "offline": {"model": "constant", "value": 0.0}},
            ["[network.outages]", "offline", "> 0"],
        ),
        ({"model": "churn", "session": 5.0}, ["[network.outages]", "session = 5.0", "table"]),
        ({"model": "trace"}, ["[network.outages]", "file", "missing"]),
        ({"model": "trace", "file": "x.csv", "default": "off"}, ["[network.outages]", "default"]),
    ],
)
def test_bad_tables_give_one_line_errors_naming_the_field(table, needles):
    with pytest.raises(ConfigError) as exc:
        availability(table, "[network.outages]")
    message = str(exc.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message


def test_tables_build_models():
    assert availability({"model": "markov", "mean_down": 3}, "x") == Markov(mean_down=3.0)
    assert availability({"model": "always"}, "x") == Always()
    m = Markov()
    assert availability(m, "x") is m


def test_markov_availability_parameterisation_fixes_p_up_and_burst_length():
    """availability = P fixes P(up) = P and mean_up = mean_down·P/(1−P); too short is an error."""
    from desim.network_models.availability import Markov

    m = Markov(mean_down=5.0, availability=0.8)
    assert m.up_mean == pytest.approx(20.0)
    bound = m.bind(4, "node", np.random.default_rng(0))
    assert bound.stationary(np.arange(4)) == pytest.approx(np.full(4, 0.8))
    with pytest.raises(ValueError, match="mean_up = 0.25"):
        Markov(mean_down=1.0, availability=0.2)
