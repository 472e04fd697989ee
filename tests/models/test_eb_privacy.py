"""Calibration and the privacy ledger of the empirical-Bayes uploads (issue 13): the tight
Gaussian noise is the accountant's edge for all the run's rounds composed, `paper` keeps (41)
bit for bit, Theorem 2's curve uses the same σ_q², and the ledger against the server equals the
composition of the uploads made (lost ones included)."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.params import build
from desim.kernel.randomness import Streams
from desim.kernel.registry import CURVES, METRICS, PROTOCOLS
from desim.models.data import ClassData
from desim.models.eb import analytic
from desim.models.eb import mechanisms as mech
from desim.models.eb.data import HierarchicalGaussian
from desim.models.eb.server import gaussian_multiplier
from desim.models.privacy.accounting import pld_epsilon, psum_multiplier, psum_noise
from desim.network_models.links import BernoulliLinks

PRIVACY = METRICS.get("privacy")
GAUSS = HierarchicalGaussian(agents=300, mean=0.3, sigma_theta=0.1, sigma_x=0.5)
EPS, DELTA = 1.0, 1e-5


def simulate(params, t_max, data_spec=GAUSS, links=None, seed=0, log=None):
    """One eb-gaussian run with the ledger at every slot; (protocol, wide metrics by t).
    `log` collects (kind, time, payload) of every send."""
    cls = PROTOCOLS.get("eb-gaussian")
    proto = cls(build(cls.Params, params, "test"))
    streams = Streams(seed, 0, 1, 2)
    data = data_spec.make(streams.get("population"))
    sim = Simulation(
        proto,
        data,
        t_max,
        streams,
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        metrics=[PRIVACY],
    )
    if log is not None:
        send = sim.network.send

        def logged(kind, src, dst, payload=None):
            log.append((kind, float(sim.env.now), np.array(payload, float)))
            send(kind, src, dst, payload)

        sim.network.send = logged
    out = sim.run()
    return proto, out.metrics.pivot(index="t", columns="metric", values="value")


@pytest.mark.parametrize("rounds", [pytest.param(1, marks=pytest.mark.slow), 10])
def test_tight_gaussian_upload_is_the_accountant_s_edge_for_all_rounds(rounds):
    """R uploads of sensitivity 2b with σ_q = 2b m: the PLD accountant gives ε ≤ ε₀ at m and
    ε > ε₀ at 0.99 m (tight, not merely valid); paper's multiplier is √(2 log(2/δ))/ε₀."""
    m = gaussian_multiplier("tight", EPS, DELTA, rounds)
    assert pld_epsilon("gaussian", m, rounds, DELTA) <= EPS
    assert pld_epsilon("gaussian", 0.99 * m, rounds, DELTA) > EPS
    assert gaussian_multiplier("paper", EPS, DELTA, rounds) == math.sqrt(2 * math.log(2 / DELTA))
    # R Gaussian releases compose exactly to one of multiplier m/√R (closed form, PLD grid 1e-4)
    exact = dp_accounting.get_epsilon_gaussian(m / math.sqrt(rounds), DELTA)
    assert EPS - 1e-3 <= exact <= EPS


def test_protocol_uploads_use_the_calibrated_noise_and_paper_is_unchanged():
    """The noise variance each upload carries (public) is (41) under paper — equal as floats to
    the formula — and (2b m)² under tight, with b of Theorem 2 for the round's n."""
    base = {"sigma_theta": 0.1, "mechanism": "gaussian", "epsilon": EPS, "delta": DELTA, "round": 5}
    for calibration in ("paper", "tight"):
        log: list = []
        simulate({**base, "calibration": calibration}, 10, log=log)
        uploads = [(t, p) for kind, t, p in log if kind == "upload"]
        assert [t for t, _ in uploads] == [5.0, 10.0]
        for n, payload in uploads:
            b = mech.clip_radius(1.0, 0.1, 0.5, 300, int(n))
            want = (
                mech.gaussian_ldp_sigma2(b, EPS, DELTA)
                if calibration == "paper"
                else (2 * b * gaussian_multiplier("tight", EPS, DELTA, 2)) ** 2
            )
            assert (payload[:, 3] == want).all()  # columns: round, value, count, noise variance
    # one round: the analytic Gaussian mechanism, Balle & Wang's published σ = 3.7306 at
    # (1, 10⁻⁵) for sensitivity 1 (the PLD grid rounds up: within 10⁻³ above)
    one = gaussian_multiplier("tight", EPS, DELTA, 1)
    assert 3.7306 * (1 - 1e-5) <= one <= 3.7306 * (1 + 1e-3)


def test_theorem_curve_uses_the_protocol_s_noise():
    """eb-theorem under tight: Theorem 2 with σ_q² = (2b m)² of one upload (a one-shot round),
    or of the last of R rounds calibrated together."""
    n = np.array([5.0, 20.0])
    m, st2, sx2 = 300, 0.01, 0.25
    for calibration in ("paper", "tight"):
        curve = build(
            CURVES.get("eb-theorem"),
            {"mechanism": "gaussian", "epsilon": EPS, "delta": DELTA, "calibration": calibration},
            "curve",
        )
        mean, _ = curve.curve(n, GAUSS)
        b = np.array([mech.clip_radius(1.0, 0.1, 0.5, m, int(k)) for k in n])
        mult = gaussian_multiplier(calibration, EPS, DELTA, 1)
        sq2 = (2 * b * mult) ** 2
        np.testing.assert_allclose(mean, analytic.theorem_mse(m, n, st2, sx2, sq2), rtol=1e-12)
    three = build(
        CURVES.get("eb-theorem"),
        {
            "mechanism": "gaussian",
            "calibration": "tight",
            "rounds": 3,
            "epsilon": EPS,
            "delta": DELTA,
        },
        "curve",
    ).curve(n, GAUSS)[0]
    sq2 = (2 * b * gaussian_multiplier("tight", EPS, DELTA, 3)) ** 2
    np.testing.assert_allclose(three, analytic.theorem_mse(m, n, st2, sx2, sq2), rtol=1e-12)
    paper = build(CURVES.get("eb-theorem"), {"mechanism": "gaussian"}, "curve").curve(n, GAUSS)
    tight = build(
        CURVES.get("eb-theorem"), {"mechanism": "gaussian", "calibration": "tight"}, "curve"
    ).curve(n, GAUSS)
    assert np.all(tight[0] < paper[0])


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_gaussian_ledger_under_ideal_links_is_the_rounds_composed(calibration):
    """Rounds every 3 slots for 12 slots: after r rounds every agent has spent the ε of r
    Gaussian releases of multiplier m, i.e. one of m/√r (closed form); tight ends at ≤ ε₀ and
    within the PLD grid of it; nothing before the first round."""
    params = {
        "sigma_theta": 0.1,
        "mechanism": "gaussian",
        "epsilon": EPS,
        "delta": DELTA,
        "round": 3,
        "calibration": calibration,
    }
    proto, wide = simulate(params, 12)
    m = gaussian_multiplier(calibration, EPS, DELTA, 4)
    assert "eps_server_max" in wide
    for t in range(1, 13):
        r = t // 3
        want = 0.0 if r == 0 else dp_accounting.get_epsilon_gaussian(m / math.sqrt(r), DELTA)
        assert wide.loc[t, "eps_server_mean"] == pytest.approx(want, rel=1e-9, abs=1e-12)
        assert wide.loc[t, "eps_server_max"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    if calibration == "tight":
        assert EPS - 1e-3 <= wide.loc[12, "eps_server_max"] <= EPS
    else:  # (41) is a one-release guarantee: four rounds spend more than ε₀
        assert wide.loc[3, "eps_server_max"] <= EPS < wide.loc[12, "eps_server_max"]


def test_uploads_lost_on_links_still_count():
    """Uplinks that drop half the uploads: the server uses fewer, the ledger counts them all."""
    params = {"sigma_theta": 0.1, "mechanism": "gaussian", "round": 2, "calibration": "tight"}
    proto, wide = simulate(params, 8, links=BernoulliLinks(p_server=0.5))
    assert max(proto.uploads_per_round) < 300  # some were lost
    assert (proto.uploads_sent == 4).all()
    assert wide.loc[8, "eps_server_max"] == pytest.approx(
        dp_accounting.get_epsilon_gaussian(proto.multiplier / 2.0, 1e-6), rel=1e-9
    )


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
@pytest.mark.parametrize("calibration", ["paper", pytest.param("tight", marks=pytest.mark.slow)])
def test_item_level_uploads_take_private_colme_s_calibration_and_ledger(mechanism, calibration):
    """pm1 / pm2: σ_DP² is `psum_noise` with the same arguments as Private-ColME (paper: the old
    path); the ledger is one p-sum (PM-I) or bit_length(κ) tree nodes (PM-II) per agent, and
    tight spends at most ε once the tree is full."""
    spec = ClassData(agents=50, class_means=[0.2, 0.8], sigma=0.25, distribution="uniform")
    t_max = 16
    proto, wide = simulate(
        {"mechanism": mechanism, "round": 1, "calibration": calibration, "sigma_theta": 0.1},
        t_max,
        data_spec=spec,
    )
    L = proto.ctx.public["L"]
    s2 = psum_noise("gaussian", L, mechanism, 1.0, 1e-6, t_max, calibration)[0]
    assert proto.sigma2_dp == s2
    m = psum_multiplier("gaussian", s2, L)
    for t in range(1, t_max + 1):
        k = 1 if mechanism == "pm1" else t.bit_length()
        want = dp_accounting.get_epsilon_gaussian(m / math.sqrt(k), 1e-6)
        assert wide.loc[t, "eps_server_max"] == pytest.approx(want, rel=1e-9)
    if calibration == "tight":  # ⌊log₂ 16⌋ + 1 = 5 levels = bit_length(16): ε at the edge
        assert 1.0 - 1e-3 <= wide.loc[t_max, "eps_server_max"] <= 1.0


def test_mechanisms_without_dp_noise_have_no_ledger():
    """none and quantiser add no DP noise: no ledger columns."""
    for params in ({"sigma_theta": 0.1}, {"sigma_theta": 0.1, "mechanism": "quantiser"}):
        _, wide = simulate({**params, "calibration": "tight"}, 3)
        assert not any(c.startswith("eps_") for c in wide.columns)


def _rr_exact_delta(eps0: float, k: int, eps: float) -> float:
    """Exact δ(ε) of k binary randomised responses of ε₀ (the worst pair X̄ = 0 against 1):
    with J ~ Binomial(k, e^ε₀/(1 + e^ε₀)) truthful answers the privacy loss is (2J − k)ε₀, and
    δ(ε) = E[(1 − e^{ε − loss})₊]."""
    q = math.exp(eps0) / (1 + math.exp(eps0))
    j = np.arange(k + 1)
    pmf = np.array([math.comb(k, int(i)) for i in j]) * q**j * (1 - q) ** (k - j)
    return float(np.sum(pmf * np.maximum(0.0, 1.0 - np.exp(eps - (2 * j - k) * eps0))))


@pytest.mark.parametrize("eps0,k", [(1.0, 1), (1.0, 4), (0.5, 30), (2.0, 100)])
def test_rr_ledger_matches_the_exact_composition_of_randomised_response(eps0, k):
    """The accountant's ε for k randomised responses is valid (exact δ(ε) ≤ δ) and tight: the
    exact δ at ε − 0.01 exceeds δ (unless ε is already basic composition, k·ε₀)."""
    from desim.models.privacy.accounting import rr_epsilon

    eps = rr_epsilon(eps0, k, DELTA)
    assert eps <= k * eps0
    assert _rr_exact_delta(eps0, k, eps) <= DELTA * (1 + 1e-9)
    if eps < k * eps0 - 0.01:
        assert _rr_exact_delta(eps0, k, eps - 0.01) > DELTA


def test_rr_uploads_of_eb_bernoulli_enter_the_ledger():
    """eb-bernoulli with eq. (7) uploads every 3 slots, ideal links: after the r-th round the
    ledger against the server is r randomised responses of ε₀ composed."""
    from desim.models.eb.data import BernoulliPrior
    from desim.models.privacy.accounting import rr_epsilon

    cls = PROTOCOLS.get("eb-bernoulli")
    proto = cls(
        build(cls.Params, {"mechanism": "rr", "epsilon": EPS, "delta": DELTA, "round": 3}, "test")
    )
    streams = Streams(0, 0, 1, 2)
    data = BernoulliPrior(agents=50, prior="uniform").make(streams.get("population"))
    out = Simulation(
        proto, data, 12, streams, checkpoints=np.arange(1, 13), metrics=[PRIVACY]
    ).run()
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    for t in range(1, 13):
        want = rr_epsilon(EPS, t // 3, DELTA)
        assert wide.loc[t, "eps_server_max"] == pytest.approx(want, rel=1e-12)
        assert wide.loc[t, "eps_server_mean"] == pytest.approx(want, rel=1e-12)
