"""Privacy accounting (issue 13): tight calibration by the PLD accountant, the paper's σ kept to
the last bit, exact composition identities, published analytic-Gaussian values, and the
`privacy` ledger of Private-ColME against its closed form."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from _runs import every_slot

from desim.kernel.params import ConfigError, build
from desim.kernel.registry import CURVES, DATA, METRICS, PROTOCOLS
from desim.models.privacy.accounting import (
    Spend,
    epsilon_spent,
    ledger,
    pld_epsilon,
    psum_multiplier,
    psum_noise,
    tight_multiplier,
    tight_sigma,
)
from desim.models.privacy.calibration import mechanism_budget, noise_sigma2, variance_sigma2
from desim.testing import ScriptedLinks

L_FIG2 = math.sqrt(3) / 2  # σ = 1/2 uniform data: L = σ√3

#: σ_DP² (and σ_{2,DP}²) the paper calibration gave before accounting existed, printed with
#: repr() from that code at ε = 1, δ = 10⁻⁶, t_max = 3·10⁴, L = √3/2.
PAPER_SIGMA2 = {
    ("pm1", "gaussian", False): (84.2319246556709, 0.0),
    ("pm1", "gaussian", True): (353.56323095612225, 1060.6896928683668),
    ("pm1", "laplace", False): (5.999999999999999, 0.0),
    ("pm1", "laplace", True): (23.999999999999996, 71.99999999999999),
    ("pm2", "gaussian", False): (22608.050819013934, 0.0),
    ("pm2", "gaussian", True): (94175.19805107944, 282525.59415323834),
    ("pm2", "laplace", False): (1349.9999999999998, 0.0),
    ("pm2", "laplace", True): (5399.999999999999, 16199.999999999996),
}


@pytest.mark.parametrize("key", sorted(PAPER_SIGMA2))
def test_paper_calibration_reproduces_todays_sigma_to_the_last_bit(key):
    mechanism, noise, var = key
    got = psum_noise(noise, L_FIG2, mechanism, 1.0, 1e-6, 30000, "paper", var)
    assert got == PAPER_SIGMA2[key]  # exact float equality
    share = 2.0 if var else 1.0
    eps, delta = mechanism_budget(mechanism, 1.0 / share, 1e-6 / share, 30000)
    assert got[0] == noise_sigma2(noise, L_FIG2, eps, delta)
    if var:
        assert got[1] == variance_sigma2(L_FIG2, eps, delta, noise)


@pytest.mark.slow
def test_tight_gaussian_gains_the_ratios_the_issue_states():
    """1.57× less variance for one release at ε = 1, δ = 10⁻⁶; 28× for PM-II at t_max = 3·10⁴."""
    for mech, ratio in (("pm1", 1.573), ("pm2", 28.15)):
        paper = psum_noise("gaussian", L_FIG2, mech, 1.0, 1e-6, 30000, "paper")[0]
        tight = psum_noise("gaussian", L_FIG2, mech, 1.0, 1e-6, 30000, "tight")[0]
        assert paper / tight == pytest.approx(ratio, abs=0.005)


# Balle & Wang (ICML 2018), analytic Gaussian mechanism, Δ = 1: σ = 3.7306 at ε = 1, δ = 10⁻⁵
# (their reference implementation's value); the rest from the same closed form in dp-accounting.
@pytest.mark.parametrize(("epsilon", "delta", "sigma"), [(1.0, 1e-5, 3.7306316)])
def test_tight_single_gaussian_matches_the_published_analytic_value(epsilon, delta, sigma):
    m = tight_multiplier("gaussian", epsilon, delta, 1)
    # The PLD accountant rounds privacy losses up on a 10⁻⁴ grid: its σ may exceed the exact
    # one by about that relative amount, never fall below it.
    assert sigma * (1 - 1e-9) <= m <= sigma * (1 + 1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [0.25, 1.0, 2.0])
@pytest.mark.parametrize("count", [1, 15])
def test_tight_gaussian_agrees_with_the_closed_form_of_its_composition(epsilon, count):
    exact = dp_accounting.get_sigma_gaussian(epsilon, 1e-6) * math.sqrt(count)
    m = tight_multiplier("gaussian", epsilon, 1e-6, count)
    assert exact * (1 - 1e-9) <= m <= exact * (1 + 1e-3)


@pytest.mark.parametrize("k", [2, 15])
def test_k_gaussian_releases_compose_to_one_with_sqrt_k_sensitivity(k):
    """The PLD accountant composing k separate Gaussian events (by FFT) against the closed-form
    ε of one Gaussian with √k times the sensitivity (multiplier m/√k)."""
    m, delta = 10.0, 1e-6
    events = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(m)] * k)
    pld = dp_accounting.pld.PLDAccountant().compose(events).get_epsilon(delta)
    closed = dp_accounting.get_epsilon_gaussian(m / math.sqrt(k), delta)
    # each composed PLD is rounded up by ≤ 10⁻⁴ in privacy loss: ε within k·10⁻⁴ above
    assert closed - 1e-9 <= pld <= closed + k * 1e-4
    assert epsilon_spent("gaussian", m, k, delta) == pytest.approx(closed, rel=1e-9)


# The default set takes each noise, mechanism and variance choice at least once; Gaussian PM-I
# with Sch-Var-1 (two releases: a tight multiplier no other default test computes) runs with
# `-m slow`.
CALIBRATED = [
    pytest.param("gaussian", "pm1", False, marks=pytest.mark.slow),
    pytest.param("gaussian", "pm2", False, marks=pytest.mark.slow),
    pytest.param("gaussian", "pm1", True, marks=pytest.mark.slow),
    ("gaussian", "pm2", True),
    pytest.param("laplace", "pm1", False, marks=pytest.mark.slow),
    ("laplace", "pm2", False),
    ("laplace", "pm2", True),
]


@pytest.mark.parametrize(("noise", "mechanism", "var"), CALIBRATED)
def test_accountant_confirms_tight_noise_and_rejects_99_percent_of_it(noise, mechanism, var):
    eps, delta, t_max = 1.0, 1e-6, 30000
    s2, s2_var = psum_noise(noise, L_FIG2, mechanism, eps, delta, t_max, "tight", var)
    m = psum_multiplier(noise, s2, L_FIG2)
    count = (1 if mechanism == "pm1" else 15) * (2 if var else 1)
    assert pld_epsilon(noise, m, count, delta) <= eps
    assert pld_epsilon(noise, 0.99 * m, count, delta) > eps
    if var:  # Sch-Var-1: the variance p-sums have the same multiplier (Δ = 4L²)
        assert psum_multiplier(noise, s2_var, 2 * L_FIG2**2) == pytest.approx(m, rel=1e-12)


@pytest.mark.parametrize(
    ("noise", "mechanism"),
    [("gaussian", "pm1"), ("gaussian", "pm2"), ("laplace", "pm1"), ("laplace", "pm2")],
)
def test_paper_calibration_is_valid_but_not_tight(noise, mechanism):
    """The paper's noise passes the accountant with room to spare (what tight recovers)."""
    s2, _ = psum_noise(noise, L_FIG2, mechanism, 1.0, 1e-6, 30000, "paper")
    m = psum_multiplier(noise, s2, L_FIG2)
    count = 1 if mechanism == "pm1" else 15
    assert pld_epsilon(noise, m, count, 1e-6) <= 1.0


def test_tight_sigma_is_the_family_api():
    assert tight_sigma("gaussian", 2.0, 1.0, 1e-6, 3) == pytest.approx(
        2.0 * tight_multiplier("gaussian", 1.0, 1e-6, 3), rel=1e-15
    )
    with pytest.raises(ValueError, match="sensitivity"):
        tight_sigma("gaussian", -1.0, 1.0, 1e-6)
    with pytest.raises(ValueError, match="calibration = 'loose'"):
        psum_noise("gaussian", 1.0, "pm1", 1.0, 1e-6, 10, "loose")
    with pytest.raises(ValueError, match="noise = 'uniform'"):
        tight_multiplier("uniform", 1.0, 1e-6, 1)


def test_laplace_ledger_of_one_release_is_its_pure_epsilon():
    # one Laplace release with b = Δ/ε is ε-DP: at δ > 0 the accountant gives at most ε
    assert epsilon_spent("laplace", 2.0, 1, 1e-6) <= 0.5 + 1e-4
    assert epsilon_spent("laplace", 2.0, 1, 1e-6) == pytest.approx(0.5, abs=1e-3)
    assert epsilon_spent("laplace", 2.0, 0, 1e-6) == 0.0


def test_ledger_summarises_mean_and_max():
    spend = Spend(
        "gaussian", 1e-6, {"one": (5.0, np.array([1, 1, 0])), "all": (5.0, np.array([4, 1, 0]))}
    )
    e1 = dp_accounting.get_epsilon_gaussian(5.0, 1e-6)
    e4 = dp_accounting.get_epsilon_gaussian(2.5, 1e-6)
    out = ledger(spend)
    assert out["eps_one_max"] == pytest.approx(e1)
    assert out["eps_one_mean"] == pytest.approx(2 * e1 / 3)
    assert out["eps_all_max"] == pytest.approx(e4)
    assert out["eps_all_mean"] == pytest.approx((e4 + e1) / 3)
    assert ledger(None) == {}


# -- the ledger of Private-ColME runs -------------------------------------------------------------
def run(params: dict, m: int, t_max: int, links=None, seed: int = 0):
    proto, out = every_slot(params, m, t_max, links, seed, metrics=[METRICS.get("privacy")])
    wide = out.metrics.pivot(index="t", columns="metric", values="value")
    return proto, wide


@pytest.mark.parametrize("calibration", ["paper", "tight"])
def test_pm1_ledger_under_ideal_links_equals_the_closed_form(calibration):
    """RR: after t slots each agent has released to min(t, M−1) queriers, one p-sum per sample
    each: ε against one querier is one Gaussian's, against all colluding one with √min(t, M−1)
    times the sensitivity."""
    m, t_max, delta = 8, 20, 1e-6
    proto, wide = run({"mechanism": "pm1", "calibration": calibration}, m, t_max)
    mult = math.sqrt(proto.sigma2_dp) / (2 * L_FIG2)
    one = dp_accounting.get_epsilon_gaussian(mult, delta)
    t = wide.index.to_numpy()
    all_ = [dp_accounting.get_epsilon_gaussian(mult / math.sqrt(min(s, m - 1)), delta) for s in t]
    np.testing.assert_allclose(wide["eps_one_max"], one, rtol=1e-9)
    np.testing.assert_allclose(wide["eps_one_mean"], one, rtol=1e-9)
    np.testing.assert_allclose(wide["eps_all_max"], all_, rtol=1e-9)
    if calibration == "tight":  # spends (almost exactly) the budget against one querier
        assert 1.0 - 2e-3 <= one <= 1.0
    else:
        assert one < 0.8  # the classical formula leaves a fifth of the budget unspent


def test_pm2_ledger_counts_one_tree_node_per_level():
    m, t_max, delta = 5, 40, 1e-6
    proto, wide = run({"mechanism": "pm2", "calibration": "tight"}, m, t_max)
    mult = math.sqrt(proto.sigma2_dp) / (2 * L_FIG2)
    for t in (1, 4, 9, 17, 40):
        kappa = np.array([(t - k) // (m - 1) + 1 if t >= k else 0 for k in range(1, m)])
        nodes = np.array([int(k).bit_length() for k in kappa])  # per querier, worst sample
        one = dp_accounting.get_epsilon_gaussian(mult / math.sqrt(nodes.max()), delta)
        all_ = dp_accounting.get_epsilon_gaussian(mult / math.sqrt(nodes.sum()), delta)
        assert wide.loc[t, "eps_one_max"] == pytest.approx(one, rel=1e-9)
        assert wide.loc[t, "eps_all_max"] == pytest.approx(all_, rel=1e-9)
    # tight calibration for t_max = 40 (6 levels) never exceeds the budget per querier
    assert wide["eps_one_max"].max() <= 1.0


def test_sch_var_1_ledger_counts_mean_and_variance_releases():
    m, t_max, delta = 6, 10, 1e-6
    proto, wide = run(
        {"mechanism": "pm1", "variance": "sch-var-1", "calibration": "tight"}, m, t_max
    )
    mult = math.sqrt(proto.sigma2_dp) / (2 * L_FIG2)
    assert wide["eps_one_max"].iloc[-1] == pytest.approx(
        dp_accounting.get_epsilon_gaussian(mult / math.sqrt(2), delta), rel=1e-9
    )
    assert 1.0 - 2e-3 <= wide["eps_one_max"].iloc[-1] <= 1.0


def test_releases_lost_on_links_still_count():
    """Half the messages dropped: the ledger counts every release the responders made (the
    network's sent counter), not the ones that arrived."""
    m, t_max, delta = 6, 30, 1e-6
    links = ScriptedLinks(down=lambda rng, t, src, dst: rng.random(len(src)) < 0.5)
    proto, wide = run({"mechanism": "pm1"}, m, t_max, links)
    assert wide["dropped_release"].iloc[-1] > 0
    assert proto.mech.count.sum() == wide["messages_release"].iloc[-1]
    mult = math.sqrt(proto.sigma2_dp) / (2 * L_FIG2)
    recipients = (proto.mech.count > 0).sum(axis=1)
    eps = [
        dp_accounting.get_epsilon_gaussian(mult / math.sqrt(k), delta) if k else 0.0
        for k in recipients
    ]
    assert wide["eps_all_max"].iloc[-1] == pytest.approx(max(eps), rel=1e-9)
    assert wide["eps_all_mean"].iloc[-1] == pytest.approx(np.mean(eps), rel=1e-9)


def test_calibration_is_a_checked_parameter():
    cls = PROTOCOLS.get("private-colme")
    with pytest.raises(ConfigError, match="calibration"):
        build(cls.Params, {"calibration": "loose"}, "scenario 'x'")


def test_oracle_curve_uses_the_same_calibrated_noise():
    data = build(
        DATA.get("classes"), {"agents": 30, "class_means": [0.2, 0.4, 0.8], "sigma": 0.5}, "data"
    )
    cls = CURVES.get("oracle")
    for mech in ("pm1", "pm2"):
        for cal in ("paper", "tight"):
            curve = build(cls, {"mechanism": mech, "calibration": cal}, "curve")
            assert (
                curve.sigma2_dp(data, 30000)
                == psum_noise("gaussian", L_FIG2, mech, 1.0, 1e-6, 30000, cal)[0]
            )


# -- privacy next to the MSE: summary columns and the trade-off figure ---------------------------
STUDY = """
[study]
title = "ledger"
seed = 1
replicates = 2
t_max = 40
checkpoints = 8
metrics = ["privacy"]

[data]
model = "classes"
agents = 6
class_means = [0.2, 0.8]
sigma = 0.5

[[scenario]]
name = "paper"
protocol = "private-colme"

[[scenario]]
name = "tight"
protocol = "private-colme"
calibration = "tight"

[[plot]]
file = "tradeoff.png"
x = "eps_all_max"
"""


def test_summary_and_a_figure_show_privacy_spent_next_to_mse(tmp_path, capsys):
    from desim.study.cli import main
    from desim.study.plots import draw_figures
    from desim.study.results import run_study
    from desim.study.spec import load_study

    folder = tmp_path / "ledger"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY)
    study = load_study(folder)
    run_study(study, progress=False)
    (path,) = draw_figures(study)
    assert path.name == "tradeoff.png" and path.stat().st_size > 0
    assert main(["summary", str(folder)]) == 0
    table = capsys.readouterr().out
    header = table.splitlines()[0].split()
    assert header[:2] == ["scenario", "value"] and "eps_one_max" in header
    assert "eps_all_max" in header
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    one = header.index("eps_one_max")
    assert float(rows["tight"][one]) == pytest.approx(1.0, abs=2e-3)  # tight spends ε = 1
    assert float(rows["paper"][one]) < 0.8


def test_a_plot_against_an_unknown_x_is_a_config_error(tmp_path):
    from desim.study.spec import load_study

    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY.replace('x = "eps_all_max"', 'x = "privacy"'))
    with pytest.raises(ConfigError, match="privacy ledger metric"):
        load_study(folder)


def test_laplace_ledger_grid_keeps_long_compositions_accurate():
    """The ledger's coarser grid for many Laplace releases stays within 10⁻³ of a fine grid
    (both upper bounds: the PLD rounds privacy losses up)."""
    for m, k in ((14.57, 64),):
        fine = pld_epsilon("laplace", m, k, 1e-6, 4e-5)
        assert fine <= epsilon_spent("laplace", m, k, 1e-6) <= fine * (1 + 1e-3)
