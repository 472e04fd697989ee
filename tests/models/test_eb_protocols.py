"""The empirical-Bayes protocols simulated: Theorems 1–2 and the Beta-Bernoulli posterior MSE
within standard errors, the privacy boundary through the message log, rounds over links that
fail or are late, deterministic k-means, and study-file errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import CURVES, METRICS, PROTOCOLS
from desim.models.data import ClassData
from desim.models.eb import analytic
from desim.models.eb import mechanisms as mech
from desim.models.eb.data import BernoulliPrior, HierarchicalGaussian
from desim.network_models.links import BernoulliLinks, FixedLatency
from desim.study.spec import load_study

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def simulate(name, params, data_spec, t_max, seed=0, links=None, log=None):
    """One run of protocol `name`; returns (protocol, data source). `log` collects every send."""
    proto = PROTOCOLS.get(name)(build(PROTOCOLS.get(name).Params, params, "test"))
    streams = Streams(seed, 0, 1, 2)
    data = data_spec.make(streams.get("population"))
    sim = Simulation(
        proto,
        data,
        t_max,
        streams,
        links=links,
        checkpoints=np.array([t_max]),
        metrics=[METRICS.get("eb")],
    )
    if log is not None:
        send = sim.network.send

        def logged(kind, src, dst, payload=None):
            log.append(
                (
                    kind,
                    float(sim.env.now),
                    np.array(src),
                    np.array(payload, float),
                    proto.sums.copy(),
                    proto.counts.copy(),
                )
            )
            send(kind, src, dst, payload)

        sim.network.send = logged
    out = sim.run()
    return proto, data, out


def agent_mse(proto, data) -> float:
    return float(np.mean((proto.estimates() - data.means) ** 2))


# -- closed forms --------------------------------------------------------------------------------
GAUSS = HierarchicalGaussian(agents=2000, mean=0.3, sigma_theta=0.1, sigma_x=0.5)
M, N, ST2, SX2 = 2000, 10, 0.01, 0.25


def replicate_mse(name, params, spec, t_max, reps):
    errs = np.array(
        [agent_mse(*simulate(name, params, spec, t_max, seed=s)[:2]) for s in range(reps)]
    )
    return errs.mean(), errs.std(ddof=1) / math.sqrt(reps)


@pytest.mark.slow
def test_eb_gaussian_matches_theorem_1_exactly_within_standard_errors():
    """Known σ_θ, no mechanism: the MSE is (σ_x²/n)((1 − a)/m + a) (the bound is exact).

    Agents share μ̂, so runs, not agents, are the independent units: the tolerance is 4 standard
    errors of the mean over replicates."""
    mean, se = replicate_mse("eb-gaussian", {"sigma_theta": 0.1}, GAUSS, N, 30)
    assert abs(mean - analytic.theorem_mse(M, N, ST2, SX2)) <= 4 * se
    assert mean < 0.8 * SX2 / N  # far below local (a = 0.286)


@pytest.mark.slow
def test_eb_gaussian_private_matches_theorem_2_within_standard_errors():
    """Theorem 2's Gaussian mechanism at ε₀ = 0.5, δ = 10⁻⁵: MSE = the bound at σ_q² of (41).
    b is Theorem 2's radius, so clipping happens with probability ≤ 2/(mn) (negligible)."""
    params = {"sigma_theta": 0.1, "mechanism": "gaussian", "epsilon": 0.5, "delta": 1e-5, "r": 1.0}
    mean, se = replicate_mse("eb-gaussian", params, GAUSS, N, 30)
    b = mech.clip_radius(1.0, 0.1, 0.5, M, N)
    sq2 = mech.gaussian_ldp_sigma2(b, 0.5, 1e-5)
    assert abs(mean - analytic.theorem_mse(M, N, ST2, SX2, sq2)) <= 4 * se
    assert analytic.theorem_mse(M, N, ST2, SX2, sq2) > analytic.theorem_mse(M, N, ST2, SX2)


def test_eb_gaussian_quantiser_stays_below_theorem_2_bound():
    """k = 2 bits: the quantiser's variance is ≤ σ_q², so the MSE is at most the bound."""
    params = {"sigma_theta": 0.1, "mechanism": "quantiser", "bits": 2, "r": 1.0}
    mean, se = replicate_mse("eb-gaussian", params, GAUSS, N, 20)
    b = mech.clip_radius(1.0, 0.1, 0.5, M, N)
    assert mean <= analytic.theorem_mse(M, N, ST2, SX2, mech.quantiser_sigma2(b, 2)) + 4 * se


@pytest.mark.slow
def test_eb_gaussian_method_of_moments_is_close_to_theorem_1():
    """σ_θ unknown: the plug-in σ̂_θ² costs little at m = 2000 (within 5 % of Theorem 1)."""
    mean, se = replicate_mse("eb-gaussian", {}, GAUSS, N, 20)
    assert mean <= 1.05 * analytic.theorem_mse(M, N, ST2, SX2) + 4 * se


def test_beta_bernoulli_posterior_mean_matches_its_mse_within_standard_errors():
    """Known Beta(2, 5): agents are independent, so the per-agent errors give the SE."""
    spec = BernoulliPrior(agents=40_000, prior="beta", alpha=2.0, beta=5.0)
    proto, data, _ = simulate(
        "eb-bernoulli", {"moments": "known", "alpha": 2.0, "beta": 5.0}, spec, 14
    )
    err2 = (proto.estimates() - data.means) ** 2
    assert abs(err2.mean() - analytic.beta_bernoulli_mse(14, 2.0, 5.0)) <= 4 * err2.std() / 200
    # and the local mean's MSE is αβ/(n(α+β)(α+β+1))
    local = (proto.local() - data.means) ** 2
    assert (
        abs(local.mean() - analytic.beta_bernoulli_mse(14, 2, 5) * 21 / 14) <= 4 * local.std() / 200
    )


@pytest.mark.slow
def test_eb_bernoulli_leave_one_out_approaches_the_posterior_mean():
    """The consistent plug-in loses little to the known prior at m = 20000; as printed, (6)
    over-estimates σ² (it ignores the sampling variance) and shrinks less."""
    spec = BernoulliPrior(agents=20_000, prior="beta", alpha=2.0, beta=5.0)
    post = analytic.beta_bernoulli_mse(14, 2.0, 5.0)
    consistent = agent_mse(*simulate("eb-bernoulli", {}, spec, 14)[:2])
    printed = agent_mse(*simulate("eb-bernoulli", {"moments": "printed"}, spec, 14)[:2])
    assert consistent <= 1.03 * post
    assert consistent < printed < post * 21 / 14  # printed still beats local


# -- privacy boundary ----------------------------------------------------------------------------
CLASSES = ClassData(agents=30, class_means=[0.2, 0.8], sigma=0.5)
PRIVATE = [
    ("eb-gaussian", {"mechanism": "pm1", "round": 5}, CLASSES),
    ("eb-gaussian", {"mechanism": "pm2", "round": 5}, CLASSES),
    ("eb-gaussian", {"mechanism": "gaussian", "sigma_theta": 0.3}, CLASSES),
    ("eb-gaussian", {"mechanism": "quantiser", "clip": 2.0, "bits": 3}, CLASSES),
    ("eb-mixture", {"mechanism": "pm1", "round": 4, "k": 2}, CLASSES),
    ("eb-bernoulli", {"mechanism": "rr", "round": 10}, BernoulliPrior(agents=30, prior="uniform")),
]


@pytest.mark.parametrize("name,params,spec", PRIVATE)
def test_nothing_leaves_an_agent_un_noised(name, params, spec):
    """Every upload differs from the agent's running mean at the time it was sent, and the
    server's broadcasts are computed only from uploads (the only kinds sent)."""
    log: list = []
    simulate(name, params, spec, 40, log=log)
    kinds = {entry[0] for entry in log}
    assert kinds == {"upload", "broadcast"}
    uploads = [e for e in log if e[0] == "upload"]
    assert uploads
    for _, _, src, payload, sums, counts in uploads:
        raw = sums[src] / counts[src]
        assert not np.isclose(payload[:, 1], raw).any()  # column 0 is the round tag
    broadcasts = [e for e in log if e[0] == "broadcast"]
    assert broadcasts and all((e[2] == 30).all() for e in broadcasts)  # from the server only


def test_the_boundary_check_can_fail():
    """Without a mechanism the uploads are the raw means: the check above would catch it."""
    log: list = []
    simulate("eb-gaussian", {"round": 5}, CLASSES, 20, log=log)
    _, _, src, payload, sums, counts = next(e for e in log if e[0] == "upload")
    assert np.allclose(payload[:, 1], sums[src] / counts[src])


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_upload_noise_variance_counts_the_p_sums(mechanism):
    """The κ-th upload carries κ p-sum noises (PM-I) or w_H(κ) dyadic nodes (PM-II): variance
    κ σ_DP²/n² or w_H(κ) σ_DP²/n², sent along for the server."""
    log: list = []
    proto, _, _ = simulate(
        "eb-gaussian", {"mechanism": mechanism, "round": 2}, CLASSES, 30, log=log
    )
    ups = [e for e in log if e[0] == "upload"]
    assert len(ups) == 15
    for kappa, (_, _, _, payload, _, counts) in enumerate(ups, start=1):
        nodes = kappa if mechanism == "pm1" else bin(kappa).count("1")
        assert np.allclose(payload[:, 3], nodes * proto.sigma2_dp / counts[0] ** 2)


def test_randomised_response_uploads_leave_the_consistent_plug_in_local():
    """Eq. (7) uploads have a law that depends on μ only, so S² ≈ e^ε/(e^ε−1)² + μ(1−μ) and the
    consistent σ̂² exceeds μ̂(1−μ̂): â = 1 and every estimate is the agent's own mean."""
    spec = BernoulliPrior(agents=20_000, prior="beta", alpha=2.0, beta=5.0)
    proto, _, _ = simulate("eb-bernoulli", {"mechanism": "rr", "epsilon": 2.0}, spec, 14)
    assert np.array_equal(proto.estimates(), proto.local())
    subtracted, _, _ = simulate(
        "eb-bernoulli",
        {"mechanism": "rr", "epsilon": 2.0, "moments": "printed", "subtract": True},
        spec,
        14,
    )
    # subtracting e^ε/(e^ε−1)² leaves σ̂² ≈ μ(1−μ): â ≈ n/(n + 1) whatever the prior
    assert np.allclose(subtracted.weight(np.arange(100)), 14 / 15, atol=0.01)


# -- rounds over real links ----------------------------------------------------------------------
def test_uplink_outages_reduce_the_uploads_the_server_uses():
    links = BernoulliLinks(p_server=0.5)
    spec = ClassData(agents=400)
    proto, _, out = simulate(
        "eb-gaussian", {"mechanism": "pm1", "round": 1}, spec, 200, links=links
    )
    used = np.array(proto.uploads_per_round)
    assert len(used) == 200
    # Binomial(400, 0.5) per round: mean 200, sd 10
    assert abs(used.mean() - 200) <= 4 * 10 / math.sqrt(200)
    m = out.metrics.set_index("metric")["value"]
    assert m["dropped_upload"] == 200 * 400 - used.sum()
    assert m["dropped_broadcast"] == 0  # server → agent links are always up here


def test_late_uploads_miss_the_deadline_and_agents_keep_the_last_broadcast():
    spec = ClassData(agents=50)
    late, _, _ = simulate(
        "eb-gaussian", {"round": 2, "deadline": 0.5}, spec, 20, links=FixedLatency(slots=1.0)
    )
    # rounds open at 2, 4, …, 20; the last one's uploads would arrive at 21, after the run
    assert late.uploads_per_round == [0] * 10 and late.server.late == 9 * 50
    assert (late.received_round == 0).all()  # nothing broadcast: local means
    ok, _, _ = simulate(
        "eb-gaussian", {"round": 2, "deadline": 1.0}, spec, 20, links=FixedLatency(slots=1.0)
    )
    assert ok.uploads_per_round == [50] * 9 and ok.server.late == 0
    # the broadcast of the round opened at slot 18 closes at 19 and arrives at 20
    assert (ok.received_round == 9).all()


def test_eb_mixture_is_deterministic_for_a_seed_and_reaches_the_ideal():
    spec = ClassData(agents=90, class_means=[0.2, 0.4, 0.8], sigma=0.5)
    a, data, _ = simulate("eb-mixture", {"round": 50}, spec, 2000, seed=4)
    b, _, _ = simulate("eb-mixture", {"round": 50}, spec, 2000, seed=4)
    assert np.array_equal(a.estimates(), b.estimates())
    assert np.allclose(a.received[0, :3], [0.2, 0.4, 0.8], atol=0.02)
    local = np.mean((a.local() - data.means) ** 2)
    assert agent_mse(a, data) < local / 10  # the posterior concentrates on the class means


def test_known_priors_send_nothing():
    spec = ClassData(agents=20, class_means=[0.2, 0.8])
    proto, _, out = simulate(
        "eb-mixture", {"prior": "known", "k": 2, "centres": [0.2, 0.8]}, spec, 50
    )
    m = out.metrics.set_index("metric")["value"]
    assert m["messages_upload"] == 0 and m["messages_broadcast"] == 0


@pytest.mark.parametrize(
    "name,params,match",
    [
        ("eb-gaussian", {"mechanism": "gaussian"}, "sigma_theta or clip"),
        ("eb-bernoulli", {"moments": "known"}, "alpha and beta"),
        ("eb-mixture", {"prior": "known", "k": 2, "centres": [0.1]}, "k = 2"),
        ("eb-gaussian", {"mechanism": "rr"}, "mechanism"),
    ],
)
def test_bad_parameters_are_one_line_config_errors(name, params, match):
    with pytest.raises(ConfigError, match=match):
        build(PROTOCOLS.get(name).Params, params, "scenario 'x'")


# -- curves and the bundled studies --------------------------------------------------------------
def test_curves_are_the_closed_forms():
    t = np.array([1.0, 15.0, 100.0])
    gauss = HierarchicalGaussian(agents=10_000, sigma_theta=0.1, sigma_x=0.5)
    theorem = CURVES.get("eb-theorem")(mechanism="gaussian", epsilon=0.5, delta=1e-5, clip=2.0)
    sq2 = mech.gaussian_ldp_sigma2(2.0, 0.5, 1e-5)
    assert np.allclose(theorem.curve(t, gauss)[0], analytic.theorem_mse(10_000, t, 0.01, 0.25, sq2))
    assert np.allclose(
        CURVES.get("eb-van-trees")().curve(t, gauss)[0], analytic.theorem_mse(10_000, t, 0.01, 0.25)
    )
    assert np.allclose(CURVES.get("eb-local")().curve(t, gauss)[0], 0.25 / t)
    beta = BernoulliPrior(prior="beta", alpha=2.0, beta=5.0)
    assert np.allclose(
        CURVES.get("eb-linear-shrinkage")().curve(t, beta)[0],
        analytic.beta_bernoulli_mse(t, 2.0, 5.0),
    )


@pytest.mark.parametrize(
    "name, runs, curves",
    [
        ("eb-gaussian-dp", 3600, 36),
        ("eb-bernoulli", 240, 12),
        ("eb-bernoulli/private", 1000, 0),
        ("server-vs-peers", 72, 0),
        ("server-vs-peers/outages", 128, 0),
    ],
)
def test_the_bundled_eb_studies_are_valid(name, runs, curves):
    study = load_study(STUDIES / name)
    assert len(study.runs) == runs and len(study.curve_jobs) == curves


def test_the_old_curve_name_is_refused_with_its_new_name(tmp_path, capsys):
    """`eb-posterior` computed linear shrinkage: a study still using it is told the new name,
    not pointed at `eb-posterior-mean` (a different quantity) by spelling alone."""
    from desim.study.cli import main

    text = (STUDIES / "eb-bernoulli" / "study.toml").read_text(encoding="utf-8")
    (tmp_path / "study.toml").write_text(
        text.replace('kind = "eb-linear-shrinkage"', 'kind = "eb-posterior"'), encoding="utf-8"
    )
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown curve 'eb-posterior' (renamed 'eb-linear-shrinkage')" in err
    assert len(err.strip().splitlines()) == 1
