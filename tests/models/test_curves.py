"""The registered closed-form curves: local, ideal and oracle, on a stand-in data object."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest

from desim.kernel.params import ConfigError, build
from desim.kernel.registry import CURVES
from desim.models.baselines import IdealCurve, LocalCurve, expected_inverse_class_size
from desim.models.colme.analytic import oracle_mse
from desim.models.colme.curves import OracleCurve
from desim.models.privacy.calibration import mechanism_budget, noise_sigma2


@dataclass(frozen=True)
class FakeData:
    """Stand-in for the study's data parameters (the attributes the curves read)."""

    agents: int = 200
    class_means: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.8])
    sigma: float = 0.5
    distribution: str = "uniform"
    assignment: str = "random"

    def support_half_width(self) -> float:
        if self.distribution == "uniform":
            return self.sigma * math.sqrt(3)
        return 0.5


T = np.array([3000, 30000])


def test_curves_are_registered():
    assert CURVES.get("local") is LocalCurve
    assert CURVES.get("ideal") is IdealCurve
    assert CURVES.get("oracle") is OracleCurve


def test_local_curve():
    mean, se = build(LocalCurve, {}, "curve").curve(T, FakeData())
    np.testing.assert_allclose(mean, 0.25 / T, rtol=1e-12)
    assert np.all(se == 0)
    data = FakeData(class_means=[0.5, 0.1], distribution="bernoulli")
    mean, _ = LocalCurve().curve(T, data)
    np.testing.assert_allclose(mean, (0.25 + 0.09) / 2 / T, rtol=1e-12)


def test_ideal_curve_random_and_balanced():
    mean, se = IdealCurve().curve(T, FakeData())
    # docs/papers.md §1.7: 1.25e-6 at t = 3000 and 1.25e-7 at t = 30000 for M = 200, three classes.
    np.testing.assert_allclose(mean, [1.25e-6, 1.25e-7], rtol=4e-3)
    np.testing.assert_allclose(mean, 0.25 * expected_inverse_class_size(200, 3) / T, rtol=1e-12)
    assert np.all(se == 0)
    mean, _ = IdealCurve().curve(T, FakeData(agents=6, assignment="balanced"))
    np.testing.assert_allclose(mean, 0.25 / 2 / T, rtol=1e-12)
    # Balanced, 7 agents in 3 classes: sizes 3, 2, 2 → (1/7) Σ_a σ²/|C_a| = 3σ²/7.
    mean, _ = IdealCurve().curve(T, FakeData(agents=7, assignment="balanced"))
    np.testing.assert_allclose(mean, 3 * 0.25 / 7 / T, rtol=1e-12)


def test_oracle_defaults_and_reference_value():
    curve = build(OracleCurve, {"mechanism": "pm2", "weights": "wmom"}, "curve")
    mean, se = curve.curve(T, FakeData())
    # docs/papers.md §1.7, M = 200, PM-II wMoM exact: 4.40e-5 and 6.82e-7; budget split by 15 since
    # the grid ends at 3·10⁴. Tolerance: its 3 digits + 1% for its own Monte Carlo.
    np.testing.assert_allclose(mean, [4.40e-5, 6.82e-7], rtol=0.015)
    assert np.all(se > 0) and np.all(se < 1e-3 * mean)


def test_oracle_uses_the_paper_calibration():
    curve = OracleCurve(mechanism="pm2", weights="mom", noise="laplace", epsilon=0.5, seed=3)
    s2dp = noise_sigma2("laplace", 0.5 * math.sqrt(3), *mechanism_budget("pm2", 0.5, 1e-6, 999))
    assert curve.sigma2_dp(FakeData(), 999) == pytest.approx(s2dp)
    t = np.array([10, 100, 999])
    got = curve.curve(t, FakeData(agents=40))
    want = oracle_mse(t, 40, 1 / 3, 0.25, s2dp, "pm2", "mom", n_draws=20000, seed=3)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_oracle_agents_and_budget_overrides():
    t = np.array([3000])
    curve = OracleCurve(mechanism="pm2", agents=30, t_max_budget=30000)
    mean, _ = curve.curve(t, FakeData(agents=200))
    s2dp = noise_sigma2("gaussian", 0.5 * math.sqrt(3), *mechanism_budget("pm2", 1, 1e-6, 30000))
    want, _ = oracle_mse(t, 30, 1 / 3, 0.25, s2dp, "pm2", "last", seed=0)
    np.testing.assert_array_equal(mean, want)
    # docs/papers.md §1.7: M = 30 PM-II non-MoM at t = 3000 is 7.70e-5.
    assert mean[0] == pytest.approx(7.70e-5, rel=0.015)


def test_oracle_exact_method_and_rrr_schedule():
    t = np.array([5, 50, 500])
    data = FakeData(agents=10)
    exact, se = OracleCurve(method="exact").curve(t, data)
    assert np.all(se == 0)
    mc, se = OracleCurve(draws=4000).curve(t, data)
    assert np.all(np.abs(mc - exact) < 4 * se + 1e-12)
    rrr, se = OracleCurve(schedule="rrr").curve(t, data)
    assert np.all(se == 0) and np.all(rrr > 0)


@pytest.mark.parametrize(
    ("table", "field_name"),
    [
        ({"epsilon": 0}, "epsilon"),
        ({"delta": 1.0}, "delta"),
        ({"weights": "wMoM"}, "weights"),
        ({"mechanism": "pm3"}, "mechanism"),
        ({"agents": 1}, "agents"),
        ({"method": "exact", "agents": 30}, "method"),
        ({"formla": "eq21"}, "formla"),
    ],
)
def test_oracle_bad_parameters_are_config_errors(table, field_name):
    with pytest.raises(ConfigError, match=field_name):
        build(OracleCurve, table, "curve 'oracle'")
