"""Private-ColME as a protocol: simulated MSE against Props. 1–3 and the paper's claims."""

from __future__ import annotations

import numpy as np
import pytest

import desim
from desim.models import baselines
from desim.models.colme import analytic
from desim.models.colme.protocol import PrivateColME, PrivateColMEParams
from desim.models.privacy.calibration import mechanism_budget, noise_sigma2
from desim.study.scenario import Scenario

SIGMA = 0.5
L = SIGMA * np.sqrt(3)


def data(m: int, means=(0.2, 0.4, 0.8)) -> dict:
    return {"model": "classes", "agents": m, "class_means": list(means), "sigma": SIGMA}


def final_mse(
    protocol: str, params: dict, m: int, t_max: int, replicates: int, seed: int = 5
) -> np.ndarray:
    """(replicates, checkpoints) MSE trajectories, and the checkpoint times."""
    rows = []
    for r in range(replicates):
        out = desim.run(
            Scenario(protocol, params, data(m), t_max=t_max, seed=seed, replicate=r, checkpoints=12)
        )
        mse = out.metrics[out.metrics.metric == "mse"]
        rows.append(mse.value.to_numpy())
    return np.array(rows), mse.t.to_numpy()


def assert_within_se(sim: np.ndarray, expect: np.ndarray, extra_se: np.ndarray | float = 0.0):
    """Replicate mean within 4 standard errors (simulation SE ⊕ closed-form MC SE)."""
    mean = sim.mean(axis=0)
    se = np.sqrt(sim.var(axis=0, ddof=1) / len(sim) + np.asarray(extra_se) ** 2)
    assert np.all(np.abs(mean - expect) < 4 * se), (mean, expect, se)


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        {"mechanism": "pm1", "weights": "last"},
        {"mechanism": "pm1", "weights": "mom"},
        {"mechanism": "pm2", "weights": "last"},
        {"mechanism": "pm2", "weights": "wmom", "noise": "laplace"},
    ],
)
def test_oracle_class_mse_matches_prop3(params):
    m, t_max = 12, 1500
    sim, t = final_mse("private-colme-oracle", params, m, t_max, replicates=40)
    p = PrivateColMEParams(**params)
    eps, delta = mechanism_budget(p.mechanism, p.epsilon, p.delta, t_max)
    s2dp = noise_sigma2(p.noise, L, eps, delta)
    expect, _ = analytic.oracle_mse(
        t, m, 1 / 3, SIGMA**2, s2dp, p.mechanism, p.weights, method="exact"
    )
    keep = t >= 20  # a few agents per class: skip the first, nearly noiseless-free checkpoints
    assert_within_se(sim[:, keep], expect[keep])


def test_local_and_ideal_match_props_1_and_2():
    m, t_max = 40, 400
    local, t = final_mse("local", {}, m, t_max, replicates=30)
    assert_within_se(local, baselines.local_mse(t, SIGMA**2))
    ideal, t = final_mse("ideal", {}, m, t_max, replicates=30)
    inv_size = baselines.expected_inverse_class_size(m, 3)
    assert_within_se(ideal, SIGMA**2 * inv_size / t)


def log_gap(better: dict, worse: dict, m=100, t_max=6000, replicates=4) -> tuple[float, float]:
    """Mean and SE over replicates of log(MSE_worse / MSE_better) at t_max (paired data)."""
    a, _ = final_mse("private-colme", better, m, t_max, replicates)
    b, _ = final_mse("private-colme" if worse else "local", worse, m, t_max, replicates)
    gap = np.log(b[:, -1] / a[:, -1])
    return gap.mean(), gap.std(ddof=1) / np.sqrt(len(gap))


@pytest.mark.slow
@pytest.mark.parametrize(
    "claim, better, worse",
    [
        ("1: PM-I non-MoM beats MoM", {}, {"weights": "mom"}),
        ("3: RR beats rRR under privacy", {}, {"schedule": "rrr"}),
        ("2: PM-I non-MoM beats PM-II non-MoM at M=100", {}, {"mechanism": "pm2"}),
        ("4: collaboration beats local", {}, {}),
    ],
)
def test_paper_claims_at_reduced_scale(claim, better, worse):
    mean, se = log_gap(better, worse)
    assert mean > 3 * se and mean > 0, (claim, mean, se)


@pytest.mark.slow
def test_without_privacy_plain_colme_beats_local_and_reaches_ideal_order():
    sim, t = final_mse("private-colme", {"noise": "none"}, 60, 3000, replicates=3)
    local = baselines.local_mse(t, SIGMA**2)
    assert sim.mean(axis=0)[-1] < 0.25 * local[-1]


def test_rrr_agent_that_excludes_everyone_stops_querying_and_stays_local():
    """Three agents in three far-apart classes, no noise: all exclusions become permanent."""
    spec = {
        "model": "classes",
        "agents": 3,
        "class_means": [0.0, 10.0, 20.0],
        "sigma": 0.5,
        "assignment": "balanced",
    }
    s = Scenario(
        "private-colme", {"schedule": "rrr", "noise": "none"}, spec, t_max=50, checkpoints=50
    )
    out = desim.run(s)
    queries = out.metrics[out.metrics.metric == "messages_query"].set_index("t").value
    assert queries[2] == 6 and queries[50] == 6  # two rounds of queries, then none
    mse = out.metrics[out.metrics.metric == "mse"].value.to_numpy()
    local = desim.run(Scenario("local", {}, spec, t_max=50, checkpoints=50)).metrics
    np.testing.assert_allclose(mse, local[local.metric == "mse"].value.to_numpy())


class Tap:
    """Records every message a protocol sends (the privacy-boundary check)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, np.ndarray, np.ndarray, np.ndarray | None]] = []

    def send(self, kind, src, dst, payload=None):
        self.sent.append(
            (kind, np.array(src), np.array(dst), None if payload is None else np.array(payload))
        )


def test_only_privatised_values_leave_an_agent():
    """Queries carry nothing; a release is (S_b + Z)/t with Z of variance k σ_DP², b's count,
    its index and the echoed send time of the query it answers."""
    from desim.kernel.protocol import Context
    from desim.kernel.randomness import Streams

    m, t_max = 40, 60
    proto = PrivateColME(PrivateColMEParams(mechanism="pm1"))
    tap = Tap()
    rng = np.random.default_rng(0)
    ctx = Context(
        m,
        t_max,
        {"L": L, "sigma2": np.full(m, SIGMA**2)},
        Streams(1, 0, 1, 1),
        tap.send,
        lambda: 0.0,
    )
    proto.setup(ctx)
    noise = []
    for t in range(1, t_max + 1):
        proto.on_samples(t, rng.uniform(-L, L, m))
        kind, src, dst, payload = tap.sent[-1]
        assert kind == "query" and payload is None
        from desim.kernel.messages import Batch

        proto.on_deliver(
            Batch(src, dst, np.zeros(m, int), np.empty((m, 0)), np.zeros(m), proto.message_kinds)
        )
        kind, src, dst, payload = tap.sent[-1]
        assert kind == "release" and payload.shape == (m, 4)
        np.testing.assert_array_equal(payload[:, [1, 3]], np.c_[proto.counts[src], np.zeros(m)])
        exact = proto.sums[src] / proto.counts[src]
        j = payload[:, 2]
        noise.append((payload[:, 0] - exact) * t / np.sqrt(j))  # ~ N(0, σ_DP²) under PM-I
        proto.on_deliver(
            Batch(src, dst, np.ones(m, int), payload, np.zeros(m), proto.message_kinds)
        )
    z = np.concatenate(noise)
    assert np.all(z != 0.0)
    se = proto.sigma2_dp * np.sqrt(2 / len(z))
    assert abs(z.var() - proto.sigma2_dp) < 4 * se


def test_same_seed_same_bytes_and_protocols_share_the_data():
    s = Scenario("private-colme", {"mechanism": "pm2"}, data(20), t_max=300, seed=9)
    a, b = desim.run(s).metrics, desim.run(s).metrics
    assert a.to_csv().encode() == b.to_csv().encode()
    other = desim.run(
        Scenario("private-colme", {"mechanism": "pm2"}, data(20), t_max=300, seed=10)
    ).metrics
    assert not a.equals(other)
    # the local baseline run under another scenario sees the same samples
    l1 = desim.run(Scenario("local", {}, data(20), t_max=300, seed=9)).metrics
    l2 = desim.run(
        Scenario(
            "local",
            {},
            data(20),
            t_max=300,
            seed=9,
            network={"links": "fixed-latency", "slots": 2.0},
        )
    ).metrics
    np.testing.assert_array_equal(l1[l1.metric == "mse"].value, l2[l2.metric == "mse"].value)
