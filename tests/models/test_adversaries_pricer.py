"""Adversaries of PriCER (`desim.models.adversaries.VectorAdversaries`): what the shares and
relays of an adversary carry, against the closed form of Alg. 2's sum, and the server's defence
(`aggregation = "median" | "trimmed"` over the relays received) against its order statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.adversaries import Adversaries, VectorAdversaries
from desim.study.cli import main
from desim.testing import check_modes

load_plugins()

N, D = 10, 5


def _vectors():
    """n = 10 nodes holding normal vectors of d = 5 coordinates, largest norm R = 1."""
    spec = build(
        DATA.get("vectors"), {"agents": N, "dimension": D, "distribution": "normal"}, "data"
    )
    return spec.make(np.random.default_rng(3))


def _run(params: dict, t_max: int = 3):
    """(protocol, metrics at t_max) of one PriCER run on reliable links, fixed stream keys: the
    noise draws are those of the same run without adversaries."""
    cls = PROTOCOLS.get("pricer")
    proto = cls(build(cls.Params, {"l1": 200, "l2": 200, **params}, "test"))
    sim = Simulation(
        proto,
        _vectors(),
        t_max,
        Streams(7, 0, 11, 22),
        checkpoints=np.array([t_max]),
        metrics=[METRICS.get("adversaries")],
    )
    out = sim.run()
    return proto, dict(zip(out.metrics.metric, out.metrics.value, strict=True))


def test_a_shift_moves_the_servers_sum_by_every_share_the_adversaries_send_and_relay():
    """Reliable links, every pair sends: an adversary b shifts its own shares α_bj (x_b + s)
    and its own term, and every share α_ib x_i an honest i sent it, by s·α. Alg. 2's estimate
    moves by (s/n)(Σ_{b∈A} Σ_j α_bj + Σ_{b∈A} Σ_{i∉A} α_ib) in every coordinate, exactly (the
    noise draws are the honest run's)."""
    s, bad = 0.5, [2, 7]
    clean, _ = _run({})
    proto, metrics = _run({"adversaries": {"agents": bad, "behaviour": "shift", "shift": s}})
    A, adv = proto.A, proto.adversaries.mask
    assert proto.sigma > 0 and (A[~np.eye(N, dtype=bool)] != 0).any()  # (relays carry shares)
    off = ~np.eye(N, dtype=bool)
    weight = A[adv].sum() + (A * (off & ~adv[:, None] & adv[None, :])).sum()
    np.testing.assert_allclose(proto.estimate - clean.estimate, s * weight / N, rtol=1e-9)
    x = _vectors().x
    assert metrics["mse_honest"] == pytest.approx(((proto.estimate - x.mean(axis=0)) ** 2).sum())
    assert "accepting_adversaries" not in metrics  # the server takes every relay


def test_collusion_relays_shares_as_if_their_senders_held_the_target():
    """Collusion to target τ makes an adversary's shares α_bj τ + n_bj and the honest shares
    it relays α_ib τ + n_ib (their noise as it came): with the honest run's noise draws the
    estimate moves by (1/n) Σ of α(τ − x) over those shares, exactly."""
    tau, bad = 3.0, [4]
    clean, _ = _run({})
    proto, _ = _run({"adversaries": {"agents": bad, "behaviour": "collude", "target": tau}})
    A, adv, x = proto.A, proto.adversaries.mask, _vectors().x
    off = ~np.eye(N, dtype=bool)
    relays = off & ~adv[:, None] & adv[None, :]
    assert A[relays].any()  # (honest shares reach the adversary)
    moved = A[adv].sum(axis=1)[:, None] * (tau - x[adv])  # own shares, own term included
    relayed = (A * relays)[:, :, None] * (tau - x)[:, None, :]
    expected = (moved.sum(axis=0) + relayed.sum(axis=(0, 1))) / N
    np.testing.assert_allclose(proto.estimate - clean.estimate, expected, rtol=1e-9, atol=1e-12)


def test_a_flipping_relay_reflects_the_honest_shares_it_forwards_noise_and_all():
    """A flipping relay j forwards −(α_ij x_i + n_ij) + 2α_ij x̄ for a share of honest i, and a
    share of another adversary as it came; an honest relay forwards every share as it came."""
    x = _vectors().x
    spec = Adversaries.from_table({"agents": [1, 2], "behaviour": "flip"}, ("flip",), "pricer")
    adv = VectorAdversaries(spec, spec.draw(N, np.random.default_rng(0)), x)
    src, dst = np.array([0, 2, 0, 5]), np.array([1, 1, 3, 2])
    alpha = np.array([[0.5], [0.25], [0.75], [2.0]])
    rows = alpha * x[src] + np.arange(4 * D).reshape(4, D) / 100  # shares with their noise
    got = adv.relayed(src, dst, alpha, rows)
    centre = x.mean(axis=0)
    np.testing.assert_allclose(got[0], -rows[0] + 2 * 0.5 * centre)  # honest 0 → adversary 1
    np.testing.assert_array_equal(got[1], rows[1])  # adversary 2 → adversary 1: as it came
    np.testing.assert_array_equal(got[2], rows[2])  # honest relay 3
    np.testing.assert_allclose(got[3], -rows[3] + 2 * 2.0 * centre)  # honest 5 → adversary 2


def test_flip_reflects_an_adversarys_vector_and_skip_noise_drops_only_its_noise():
    spec = Adversaries.from_table({"agents": [1], "behaviour": "flip"}, ("flip",), "pricer")
    x = _vectors().x
    adv = VectorAdversaries(spec, spec.draw(N, np.random.default_rng(0)), x)
    sent = adv.vectors(x)
    np.testing.assert_allclose(sent[1], 2 * x.mean(axis=0) - x[1])
    np.testing.assert_array_equal(sent[[0, *range(2, N)]], x[[0, *range(2, N)]])
    noise = np.ones((3, D))
    who = np.array([0, 1, 2])
    assert adv.own_noise(who, noise) is noise  # noise stays by default
    skip = Adversaries.from_table(
        {"agents": [1], "behaviour": "flip", "skip_noise": True}, ("flip",), "pricer"
    )
    quiet = VectorAdversaries(skip, adv.mask, x)
    np.testing.assert_array_equal(quiet.own_noise(who, noise).sum(axis=1), [D, 0, D])


@pytest.mark.parametrize("how", ["median", "trimmed"])
def test_the_robust_server_cuts_the_adversaries_own_relays_to_the_honest_order_statistics(how):
    """Naive uploads (each relay is a node's vector), two adversaries shifted by 100 lie above
    every honest value of every coordinate: the median of the ten relays is the mean of the
    honest 5th and 6th values, the trimmed mean (β = 0.2: two cut at each end) the mean of the
    honest 3rd…8th; both times 10/10 relays received."""
    table = {"agents": [0, 5], "behaviour": "shift", "shift": 100.0}
    params = {"strategy": "naive", "adversaries": table, "aggregation": how}
    if how == "trimmed":
        params["trim"] = 0.2
    proto, _ = _run(params)
    honest = np.sort(np.delete(_vectors().x, [0, 5], axis=0), axis=0)
    expected = honest[4:6].mean(axis=0) if how == "median" else honest[2:8].mean(axis=0)
    np.testing.assert_allclose(proto.estimate, expected, rtol=1e-12, atol=1e-15)
    plain, _ = _run({"strategy": "naive", "adversaries": table})
    assert np.all(plain.estimate > expected + 100 * 2 / N - 1)  # the mean moves by ≈ f·s


def test_check_modes_gives_the_same_bytes_with_pricer_adversaries():
    params = {
        "l1": 100,
        "l2": 100,
        "adversaries": {"fraction": 0.2, "behaviour": "flip"},
        "aggregation": "trimmed",
        "trim": 0.2,
    }
    check_modes(
        PROTOCOLS.get("pricer"),
        {**params, "relay_deadline": 1.25},
        networks=[{"latency": {"model": "exponential", "mean": 0.6}}],
        data=("vectors", {"agents": 8, "dimension": 5, "distribution": "normal"}),
        metrics=["adversaries"],
        t_max=6,
    )


STUDY = """
[study]
title = "pricer adversaries"
t_max = 3
checkpoints = 2
metrics = ["adversaries"]

[data]
model = "vectors"
agents = 8
dimension = 4

{table}

[[scenario]]
name = "P"
protocol = "pricer"
l1 = 50
l2 = 50
{extra}
"""


@pytest.mark.parametrize(
    ("table", "extra", "fragment"),
    [
        ('[adversaries]\nfraction = 0.2\nbehaviour = "mimic"\nclass = 0', "", "not meaningful"),
        ('[adversaries]\nfraction = 0.2\nbehaviour = "inflate"\nfactor = 2', "", "not meaningful"),
        ("", "trim = 0.2", "aggregation = 'trimmed' needs trim"),
        ("", 'aggregation = "trimmed"', "aggregation = 'trimmed' needs trim"),
        ('[adversaries]\nagents = [8]\nbehaviour = "flip"', "", "8 is not an agent"),
    ],
)
def test_validate_refuses_what_pricer_cannot_simulate_in_one_line(
    tmp_path: Path, capsys, table, extra, fragment
):
    (tmp_path / "study.toml").write_text(STUDY.format(table=table, extra=extra))
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
