"""DP calibration of seed 002 §II-C and §VII: hand-computed values and the noise samplers."""

from __future__ import annotations

import math

import numpy as np
import pytest

from desim.models.privacy.calibration import (
    gaussian_sigma2,
    laplace_scale,
    mechanism_budget,
    noise_sigma2,
    pm2_levels,
    sample_noise,
    variance_sigma2,
)

L_FIG2 = math.sqrt(3) / 2  # σ = 1/2 uniform data: L = σ√3


def test_gaussian_sigma2_matches_lemma1_by_hand():
    # 8 · (3/4) · ln(1.25e6) = 6 · 14.03868... = 84.232 (docs/papers.md §1.5: 84.23).
    assert gaussian_sigma2(L_FIG2, 1.0, 1e-6) == pytest.approx(6 * math.log(1.25e6), rel=1e-12)
    assert gaussian_sigma2(L_FIG2, 1.0, 1e-6) == pytest.approx(84.23, abs=0.005)
    assert gaussian_sigma2(1.0, 2.0, 0.25) == pytest.approx(8 * math.log(5) / 4, rel=1e-12)


def test_laplace_scale_and_variance_match_lemma2():
    assert laplace_scale(L_FIG2, 1.0) == pytest.approx(math.sqrt(3), rel=1e-12)
    assert noise_sigma2("laplace", L_FIG2, 1.0, 1e-6) == pytest.approx(6.0, rel=1e-12)
    # δ plays no role for Laplace noise, so δ = 0 is allowed there.
    assert noise_sigma2("laplace", L_FIG2, 1.0, 0.0) == pytest.approx(6.0, rel=1e-12)


def test_noise_none_is_zero():
    assert noise_sigma2("none", L_FIG2, 1.0, 1e-6) == 0.0
    assert variance_sigma2(L_FIG2, 1.0, 1e-6, "none") == 0.0


@pytest.mark.parametrize(
    ("t_max", "levels"), [(1, 1), (2, 2), (3, 2), (4, 3), (30000, 15), (32767, 15), (32768, 16)]
)
def test_pm2_levels_is_floor_log2_plus_one(t_max, levels):
    assert pm2_levels(t_max) == levels


def test_mechanism_budget_pm1_unchanged_pm2_split():
    assert mechanism_budget("pm1", 1.0, 1e-6, 30000) == (1.0, 1e-6)
    eps, delta = mechanism_budget("pm2", 1.0, 1e-6, 30000)
    assert eps == pytest.approx(1 / 15) and delta == pytest.approx(1e-6 / 15)


def test_pm2_split_values_of_reference_table():
    eps, delta = mechanism_budget("pm2", 1.0, 1e-6, 30000)
    # 6 · 225 · ln(1.875e7) = 22608.05; Laplace 6 · 225 = 1350 (scale 25.98).
    assert noise_sigma2("gaussian", L_FIG2, eps, delta) == pytest.approx(22608.05, abs=0.01)
    assert noise_sigma2("laplace", L_FIG2, eps, delta) == pytest.approx(1350.0, rel=1e-12)
    assert laplace_scale(L_FIG2, eps) == pytest.approx(25.98, abs=0.005)


def test_variance_sigma2_matches_lemma3():
    # 32 · (9/16) · ln(1.25e6) = 18 · ln(1.25e6); Laplace 32 L⁴ / ε² = 18.
    assert variance_sigma2(L_FIG2, 1.0, 1e-6, "gaussian") == pytest.approx(
        18 * math.log(1.25e6), rel=1e-12
    )
    assert variance_sigma2(L_FIG2, 1.0, 1e-6, "laplace") == pytest.approx(18.0, rel=1e-12)
    # Sch-Var-1 with (ε/2, δ/2) for each release (docs/papers.md §1.5): 353.6 and ≈ 1061.
    assert gaussian_sigma2(L_FIG2, 0.5, 0.5e-6) == pytest.approx(353.6, abs=0.05)
    assert variance_sigma2(L_FIG2, 0.5, 0.5e-6, "gaussian") == pytest.approx(1061, abs=0.5)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: gaussian_sigma2(1.0, 0.0, 1e-6), "epsilon"),
        (lambda: gaussian_sigma2(1.0, -1.0, 1e-6), "epsilon"),
        (lambda: gaussian_sigma2(1.0, 1.0, 0.0), "delta"),
        (lambda: gaussian_sigma2(1.0, 1.0, 1.0), "delta"),
        (lambda: gaussian_sigma2(-1.0, 1.0, 1e-6), "L"),
        (lambda: laplace_scale(1.0, 0.0), "epsilon"),
        (lambda: noise_sigma2("gauss", 1.0, 1.0, 1e-6), "noise"),
        (lambda: mechanism_budget("pm3", 1.0, 1e-6, 10), "mechanism"),
        (lambda: pm2_levels(0), "t_max"),
        (lambda: pm2_levels(2.5), "t_max"),
        (lambda: variance_sigma2(1.0, 1.0, 2.0, "gaussian"), "delta"),
        (lambda: sample_noise(np.random.default_rng(0), "gaussian", -1.0, 3), "sigma2"),
    ],
)
def test_bad_arguments_name_the_argument(call, name):
    with pytest.raises(ValueError, match=rf"^{name} = "):
        call()


N = 400_000


def test_gaussian_samples_have_the_requested_variance():
    x = sample_noise(np.random.default_rng(1), "gaussian", 84.23, N)
    se = 84.23 * math.sqrt(2 / (N - 1))  # SE of a Gaussian sample variance
    assert abs(x.var(ddof=1) - 84.23) < 4 * se
    assert abs(x.mean()) < 4 * math.sqrt(84.23 / N)


def test_laplace_samples_have_the_requested_variance_and_shape():
    s2 = 6.0
    x = sample_noise(np.random.default_rng(2), "laplace", s2, N)
    # Laplace has kurtosis 6, so Var[s²] ≈ (μ₄ − σ⁴)/n = 5σ⁴/n.
    assert abs(x.var(ddof=1) - s2) < 4 * s2 * math.sqrt(5 / N)
    # E|X| = b = sqrt(σ²/2) for Laplace (a Gaussian would give σ·sqrt(2/π), 13% more);
    # Var|X| = b², so the SE of the mean absolute value is b/√n.
    b = math.sqrt(s2 / 2)
    assert abs(np.abs(x).mean() - b) < 4 * b / math.sqrt(N)


def test_sample_noise_none_and_reproducibility():
    zeros = sample_noise(np.random.default_rng(0), "none", 5.0, (2, 3))
    assert np.array_equal(zeros, np.zeros((2, 3)))
    a = sample_noise(np.random.default_rng(7), "gaussian", 2.0, 10)
    b = sample_noise(np.random.default_rng(7), "gaussian", 2.0, 10)
    assert np.array_equal(a, b)
    assert sample_noise(np.random.default_rng(0), "laplace", 1.0, (4, 5)).shape == (4, 5)
