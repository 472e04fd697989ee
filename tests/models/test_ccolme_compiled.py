"""C-ColME's compiled per-slot passes (`desim.models.ccolme.compiled`): the numpy path's bytes.

Every run here is made twice, with the kernels (``DESIM_COMPILED=1``, taken from any size) and
without (``DESIM_COMPILED=0``), and must give the same estimates in every slot, the same kept
sets and the same metrics, bit for bit; small sizes switch on the paths large graphs take (the
blocked gather, the test in chunks, eq. (2) refreshed on every edge)."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from _ccolme_helpers import GraphData, regular
from hypothesis import given, settings
from hypothesis import strategies as st

from desim import fast
from desim.kernel.engine import Simulation
from desim.kernel.links import IdealLinks
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import PROTOCOLS
from desim.models.ccolme import compiled, edges, live_first, paired, protocol, sizes
from desim.models.ccolme.compiled import CompiledPass
from desim.models.ccolme.model import consensus_step, consensus_update, mix, one_minus_alpha
from desim.network_models.links import FixedLatency
from desim.topologies.dynamic import Dynamics, Rewire

needs_numba = pytest.mark.skipif(not fast.AVAILABLE, reason="the kernels need numba")
# (over ideal links the size send is a `SenderBatch`: no per-edge pass; `size_send` serves
# the sends of inflating adversaries, whose told |C_b| is not the table's)
PASSES = ("gather_states", "keep_within", "mix", "alive_edges", "block_order", "consensus_step")
#: The passes of a live-first run (`desim.models.ccolme.paired`): the send held as pairs, the
#: test writing C and its Y_b, the mix with the consensus step in its pass, eq. (2) refreshed
#: around the agents whose C moved.
LIVE = ("gather_pairs", "test_pairs", "mix")


@pytest.fixture
def calls(monkeypatch):
    """How often each compiled pass ran (a counter wrapped around each)."""
    counter: collections.Counter = collections.Counter()
    for name in (*PASSES, *LIVE, "size_send", "refresh_weights", "refresh_rows"):
        original = getattr(CompiledPass, name)

        def counted(self, *args, _name=name, _original=original, **kw):
            counter[_name] += 1
            return _original(self, *args, **kw)

        monkeypatch.setattr(CompiledPass, name, counted)
    return counter


class Slots:
    """Mixin: the bytes of Y at the start of every slot."""

    def setup(self, ctx):
        super().setup(ctx)
        self.trace = []

    def on_samples(self, t, samples):
        self.trace.append(self.y.tobytes())
        super().on_samples(t, samples)


def run(
    monkeypatch, kernels, name, params, links=None, sigma2=None, rewire=None, blocked=True, degree=6
):
    """60 agents of two close classes on a `degree`-regular graph, 60 slots, with or without
    the kernels; returns (per-slot Y, final Y, C, metrics) as bytes."""
    monkeypatch.setenv("DESIM_COMPILED", "1" if kernels else "0")
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    monkeypatch.setattr(live_first, "BLOCKED_FROM", 0 if blocked else 1 << 30)
    monkeypatch.setattr(edges, "BLOCK_BITS", 2)  # many blocks of four senders
    monkeypatch.setattr(protocol, "CHUNK", 16)  # the test in chunks, as on large graphs
    monkeypatch.setattr(live_first, "CHUNK", 16)
    monkeypatch.setattr(paired.PairedLiveFirst, "block_bits", 2)
    # eq. (2) refreshed on every edge at each move of C, or only around the agents that moved
    monkeypatch.setattr(sizes, "EVERY_EDGE_FROM", 0.0 if blocked else float("inf"))
    base = PROTOCOLS.get(name)
    proto = type("Traced", (Slots, base), {})(build(base.Params, params, "test"))
    g = regular(60, degree, seed=4)
    data = GraphData(g, np.arange(60) % 2, [0.0, 1.0], sigma=0.3)
    if sigma2 is not None:
        data.public["sigma2"] = sigma2
    streams = Streams(5, 0, 11, 22)
    graphs = None
    if rewire is not None:
        rng = np.random.default_rng(rewire)
        graphs = Dynamics(rewire=Rewire(every=7, fraction=0.2)).schedule(g, 60, lambda: rng)
    sim = Simulation(
        proto,
        data,
        60,
        streams,
        links=links or IdealLinks(),
        checkpoints=np.arange(1, 61),
        graphs=graphs,
    )
    metrics = sim.run().metrics.to_csv().encode()
    return proto.trace, proto.y.tobytes(), proto.kept.tobytes(), metrics


PRIVATE_LIVE = {"decisions": "irrevocable", "initial": "all", "symmetric": False, "epsilon": 50.0}
#: (protocol, parameters, the passes the kernel run must take)
VARIANTS = [
    ("c-colme", {}, LIVE),
    ("c-colme", {"weights": "max-degree"}, LIVE),
    ("c-colme", {"symmetric": True}, LIVE),
    ("c-colme", {"alpha_c": 2.0, "restart": "galante"}, LIVE),
    ("c-colme", {"delta": 0.9, "restart": "hard", "reset": "agent"}, LIVE),
    ("c-colme", {"values": "fresh", "fallback": "local"}, LIVE),
    # α's schedules the mix's pass does not take (c < 1, p ≠ 1): the step after it
    ("c-colme", {"alpha_c": 0.5, "reset": "agent"}, LIVE),
    ("c-colme", {"alpha_p": 0.6}, LIVE),
    ("private-c-colme", PRIVATE_LIVE, LIVE),
    ("private-c-colme", {"epsilon": 20.0}, ("keep_within", "mix")),
    ("private-c-colme", {"threshold": "simple", "values": "stale"}, ("keep_within", "mix")),
]


@needs_numba
@pytest.mark.parametrize(("name", "params", "taken"), VARIANTS)
@pytest.mark.parametrize("blocked", [True, False])
def test_the_kernels_give_the_numpy_paths_bytes(monkeypatch, calls, name, params, taken, blocked):
    """Over ideal links, C moving in most slots (drops before and after the kept sets settle):
    every slot's Y, the kept sets and the metrics are the numpy path's, bit for bit."""
    # eq. (2) on every edge, or around the agents that moved: where C's edges move by drops
    # (live-first, Metropolis weights)
    if taken == LIVE:
        taken = (*taken, "block_order") if blocked else taken
        if params.get("weights") != "max-degree":
            taken = (*taken, "refresh_weights" if blocked else "refresh_rows")
    numpy_run = run(monkeypatch, False, name, params, blocked=blocked)
    assert not calls
    kernel_run = run(monkeypatch, True, name, params, blocked=blocked)
    assert kernel_run == numpy_run
    assert set(taken) <= set(calls), calls
    assert blocked or "refresh_weights" not in calls  # only around the agents that moved
    assert len(set(numpy_run[0])) == 61 - 1  # Y moves in every slot after the first


@needs_numba
@pytest.mark.parametrize("params", [{}, {"weights": "max-degree", "reset": "agent"}])
def test_rows_summed_in_registers_give_the_numpy_paths_bytes(monkeypatch, calls, params):
    """On a 12-regular graph most agents mix 9 to 12 neighbours (the mix's eight partial sums
    in registers), with W per edge or one W for all: every slot's Y, C and the metrics are the
    numpy path's, bit for bit."""
    numpy_run = run(monkeypatch, False, "c-colme", params, degree=12)
    kernel_run = run(monkeypatch, True, "c-colme", params, degree=12)
    assert kernel_run == numpy_run
    assert calls["mix"]


@needs_numba
@pytest.mark.parametrize(
    ("name", "params", "links", "rewire"),
    [
        ("c-colme", {}, FixedLatency(slots=1.0), None),
        ("private-c-colme", {"epsilon": 20.0}, FixedLatency(slots=0.5), None),
        ("c-colme", {}, None, 3),
        ("private-c-colme", {"epsilon": 20.0}, None, 4),
        (
            "c-colme",
            {"adversaries": {"fraction": 0.2, "behaviour": "inflate", "factor": 3.0}},
            None,
            None,
        ),
        (
            "c-colme",
            {
                "adversaries": {"fraction": 0.2, "behaviour": "shift", "shift": 2.0},
                "consensus": "median",
            },
            None,
            None,
        ),
    ],
)
def test_links_with_latency_rewiring_and_adversaries_give_the_same_bytes(
    monkeypatch, calls, name, params, links, rewire
):
    """Where the kernels serve (the mix over any links; the rest after a rewiring, with lying
    sizes or a robust consensus) the run is the numpy path's, bit for bit."""
    numpy_run = run(monkeypatch, False, name, params, links=links, rewire=rewire)
    kernel_run = run(monkeypatch, True, name, params, links=links, rewire=rewire)
    assert kernel_run == numpy_run
    assert calls["mix"] or calls["keep_within"] or calls["test_pairs"]


@needs_numba
def test_unequal_variances_keep_the_numpy_test(monkeypatch, calls):
    """Agents of different variances have one bound per edge: the test stays numpy's (its
    logarithms are numpy's), the other passes are compiled, and the bytes are the same."""
    sigma2 = np.where(np.arange(60) % 3 == 0, 0.04, 0.09)
    numpy_run = run(monkeypatch, False, "c-colme", {}, sigma2=sigma2)
    kernel_run = run(monkeypatch, True, "c-colme", {}, sigma2=sigma2)
    assert kernel_run == numpy_run
    assert calls["mix"] and calls["gather_pairs"] and not calls["keep_within"]
    assert not calls["test_pairs"]


def test_small_graphs_and_switched_off_take_numpy(monkeypatch):
    """Below COMPILED_FROM directed edges, or with DESIM_COMPILED=0, no compiled pass."""
    monkeypatch.setenv("DESIM_COMPILED", "1")
    assert CompiledPass.choose(compiled.COMPILED_FROM - 1) is None
    monkeypatch.setenv("DESIM_COMPILED", "0")
    assert CompiledPass.choose(compiled.COMPILED_FROM) is None
    monkeypatch.setenv("DESIM_COMPILED", "1")
    assert (CompiledPass.choose(compiled.COMPILED_FROM) is not None) == fast.AVAILABLE


def _runs(rng, n, top):
    """Per-agent run lengths 0..top (some agents mixing nobody)."""
    return rng.integers(0, top + 1, n) * (rng.random(n) < 0.8)


@needs_numba
@pytest.mark.parametrize("seed", range(6))
def test_passes_are_numpys_on_random_arrays(seed):
    """Each pass against the numpy operations it replaces: rows of 0 to 300 terms (numpy's
    pairwise sum splits above 128), NaN and signed zeros in the test, a per-edge or one W."""
    rng = np.random.default_rng(seed)
    k = CompiledPass()
    n = 50
    counts = _runs(rng, n, 300 if seed % 2 else 12)
    y = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
    nb_y = rng.standard_normal(int(counts.sum()))
    rows = counts > 0
    starts = (np.cumsum(counts) - counts)[rows]
    for w in (rng.random(len(nb_y)), 0.125):
        assert (
            k.mix(y, nb_y, w, counts).tobytes() == mix(y, nb_y, w, counts, rows, starts).tobytes()
        )
    a = rng.integers(0, n, 400)
    x_b = np.where(rng.random(400) < 0.1, np.nan, rng.standard_normal(400))
    x_b[:5] = -0.0
    mean = y.copy()
    mean[:3] = 0.0
    diff = np.abs(mean[a] - x_b)
    for strict in (False, True):
        expected = diff < 0.7 if strict else diff <= 0.7
        assert (k.keep_within(mean, x_b, a, 0.7, strict) == expected).all()
    sender = rng.integers(0, n, 400)
    blocked = edges.BlockedTake(sender, n, 2, compiled=k)
    numpy_blocked = edges.BlockedTake(sender, n, 2)
    assert (blocked.sorted == numpy_blocked.sorted).all()
    assert (blocked.back == numpy_blocked.back).all()
    for by_block in (blocked, None):
        x_out, y_out = np.empty(400), np.empty(400)
        k.gather_states(mean, y, sender, x_out, y_out, by_block)
        assert x_out.tobytes() == mean[sender].tobytes()
        assert y_out.tobytes() == y[sender].tobytes()


@needs_numba
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 140), min_size=1, max_size=30),
    st.integers(0, 2**32 - 1),
    st.sampled_from([1e-300, 1.0, 1e300]),
)
def test_the_compiled_mix_is_numpys_for_any_runs_and_values(counts, seed, scale):
    """For any runs of terms and values of any magnitude (overflow to inf included), the
    compiled W Y is `model.mix`'s, bit for bit."""
    counts = np.array(counts)
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(len(counts)) * scale
    nb_y = rng.standard_normal(int(counts.sum())) * scale
    rows = counts > 0
    starts = (np.cumsum(counts) - counts)[rows]
    for w in (rng.random(len(nb_y)), float(rng.random())):  # W per edge, or one W (max degree)
        with np.errstate(over="ignore", invalid="ignore"):
            expected = mix(y, nb_y, w, counts, rows, starts)
        assert CompiledPass().mix(y, nb_y, w, counts).tobytes() == expected.tobytes()


@needs_numba
@pytest.mark.parametrize("w", [0.25, None])
def test_agents_mixing_nobody_keep_their_y_in_the_compiled_mix(monkeypatch, w):
    """Every agent with no mixed edge (all runs empty): Y's bytes, as numpy's copy gives
    (`Rows.mix` hands them to the kernel: nothing checks for an empty mix first)."""
    monkeypatch.setattr(compiled, "COMPILED_FROM", 0)
    monkeypatch.setenv("DESIM_COMPILED", "1")
    rows = edges.Rows(regular(12, 3, seed=1))
    y = np.array([-0.0, 1.5, np.nan, -2.0, 0.0, 1e300, -1e-300, 3.0, 4.0, 5.0, 6.0, 7.0])
    counts = np.zeros(12, dtype=np.int64)
    weight = 0.25 if w is not None else np.empty(0)
    assert rows.mix(y, np.empty(0), weight, counts, None).tobytes() == y.tobytes()


@needs_numba
@pytest.mark.parametrize("scale", [1e-300, 1.0, 1e300])
def test_the_compiled_mix_is_numpys_for_every_row_length(scale):
    """Rows of every length from 0 to 300 (the unrolled branch of 9 to 129 terms, its edges,
    and the buffered sums on either side), with per-edge or one W: `model.mix`'s bytes."""
    counts = np.arange(301)
    rng = np.random.default_rng(9)
    y = rng.standard_normal(len(counts)) * scale
    nb_y = rng.standard_normal(int(counts.sum())) * scale
    rows = counts > 0
    starts = (np.cumsum(counts) - counts)[rows]
    # Y_b read through positions in a longer column (the send's Y over S)
    column = rng.standard_normal(2 * len(nb_y)) * scale
    at = np.sort(rng.choice(len(column), len(nb_y), replace=False))
    column[at] = nb_y
    for w in (rng.random(len(nb_y)), 0.0625):
        with np.errstate(over="ignore", invalid="ignore"):
            expected = mix(y, nb_y, w, counts, rows, starts)
        assert CompiledPass().mix(y, nb_y, w, counts).tobytes() == expected.tobytes()
        assert CompiledPass().mix(y, column, w, counts, at).tobytes() == expected.tobytes()


@needs_numba
def test_the_mix_reads_y_b_where_the_send_holds_it(monkeypatch):
    """On `LiveFirst` (a run back on the live-first path after a graph change), once C is
    smaller than S (edges dropped since S was last compacted), the compiled mix reads Y_b
    through C's positions in the send instead of a gathered copy: the same bytes as the numpy
    path, which gathers. On `PairedLiveFirst` it reads the Y_b the test wrote in C's order."""
    lazy = collections.Counter()
    original = CompiledPass.mix

    def counted(self, y, nb_y, w, counts, at=None, step=None, table=None):
        lazy[at is not None] += 1
        return original(self, y, nb_y, w, counts, at, step, table)

    monkeypatch.setattr(CompiledPass, "mix", counted)
    numpy_run = run(monkeypatch, False, "c-colme", {})
    assert run(monkeypatch, True, "c-colme", {}) == numpy_run
    assert lazy[False] == 60 and not lazy[True]  # paired: Y_b of C, written by the test
    lazy.clear()
    monkeypatch.setattr(
        protocol, "live_first", lambda g, kept, fresh: live_first.LiveFirst(g, kept)
    )
    assert run(monkeypatch, True, "c-colme", {}) == numpy_run
    assert lazy[True] and lazy[False]  # S is C in the first slots, then C is smaller


@needs_numba
@pytest.mark.parametrize("c", [1.0, 1.5, 4.0])
def test_the_compiled_consensus_step_is_numpys(c):
    """Y^(t) in one pass: the bytes of `one_minus_alpha` and `consensus_update` (restarted
    agents, ages 1 to 10⁶, magnitudes 10⁻³⁰⁰ to 10³⁰⁰, −0.0); other schedules take numpy."""
    rng = np.random.default_rng(int(c * 10))
    n, t = 500, 1_000_000
    start = np.where(rng.random(n) < 0.2, t - 1.0, rng.integers(0, t, n).astype(float))
    mean = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    mixed = rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n)
    mean[:3], mixed[2:5] = -0.0, -0.0
    expected = consensus_update(mean, mixed, one_minus_alpha(t - start, c, 1.0))
    got = consensus_step(mean, mixed, start, t, c, 1.0, CompiledPass())
    assert got.tobytes() == expected.tobytes()
    for c_p in ((0.5, 1.0), (1.0, 0.6)):  # c < 1 or p ≠ 1: numpy's operations
        expected = consensus_update(mean, mixed, one_minus_alpha(t - start, *c_p))
        assert consensus_step(mean, mixed, start, t, *c_p, CompiledPass()).tobytes() == (
            expected.tobytes()
        )
