"""Defences of eb-bernoulli (robust moments: the uploads' median or trimmed mean and their
MAD) and eb-mixture (trimmed k-means) against adversarial uploads, checked against their
contamination closed forms with fixed seeds and tolerances from standard errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _runs import adversary_run
from scipy.stats import betabinom

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.registry import DATA, PROTOCOLS
from desim.models.eb.estimators import trimmed_cluster, trimmed_cluster_restarts
from desim.study.cli import main
from desim.testing import check_modes

load_plugins()


# -------------------------------------------------------------------------- eb-bernoulli

M, N, A, F = 10000, 20, 3.5, 0.15


def _bernoulli(params: dict):
    """One-shot eb-bernoulli (n = 20 samples, m = 10⁴ agents, Beta(3.5, 3.5) prior) with a
    share f = 0.15 of adversaries shifting their uploads by 10: above every honest one."""
    spec = build(DATA.get("bernoulli-prior"), {"agents": M, "alpha": A, "beta": A}, "data")
    table = {"fraction": F, "behaviour": "shift", "shift": 10.0}
    return adversary_run("eb-bernoulli", {"adversaries": table, **params}, spec.make(_rng()), N)


def _rng():
    return np.random.default_rng(4)


def _honest_law():
    """Support z/n and CDF of an honest upload X̄ = Z/n, Z ~ BetaBinomial(n, α, α)."""
    z = np.arange(N + 1)
    return z / N, betabinom.cdf(z, N, A, A)


def test_the_robust_median_is_the_honest_uploads_quantile_one_over_two_one_minus_f():
    """Every adversary's upload lies above every honest one, so the median of all m uploads is
    the honest uploads' quantile q = 1/(2(1 − f)): that of the Beta-binomial law whenever q is
    more than 5 standard errors √(q(1 − q)/m_h) from every jump of its CDF."""
    proto, _ = _bernoulli({"robust": "median"})
    values, cdf = _honest_law()
    q = 0.5 / (1 - F)
    m_h = M - round(F * M)
    assert np.abs(cdf - q).min() > 5 * math.sqrt(q * (1 - q) / m_h)  # (the premise)
    expected = values[np.searchsorted(cdf, q)]
    assert np.all(proto.received[:, 0] == expected)  # one fit for every agent
    plain, _ = _bernoulli({})
    mean = (values * np.diff(cdf, prepend=0.0)).sum()
    sd = math.sqrt(((values - mean) ** 2 * np.diff(cdf, prepend=0.0)).sum())
    # the mean's leave-one-out μ̂: moved by f·s, within 5 standard errors
    assert abs(plain.received[0, 0] - mean - F * 10.0) <= 5 * sd / math.sqrt(M)


def test_the_robust_trimmed_mean_is_the_honest_uploads_mean_between_two_quantiles():
    """β = 0.2 ≥ f: the trimmed mean keeps the honest uploads between their quantiles
    lo = β/(1 − f) and hi = (1 − β)/(1 − f): (1/(hi − lo)) ∫_lo^hi Q(u) du of the Beta-binomial
    law, within 5 standard errors σ_y/√(m(1 − 2β))."""
    beta = 0.2
    proto, metrics = _bernoulli({"robust": "trimmed", "trim": beta})
    values, cdf = _honest_law()
    lo, hi = beta / (1 - F), (1 - beta) / (1 - F)
    below = np.concatenate([[0.0], cdf[:-1]])
    mass = np.clip(np.minimum(cdf, hi) - np.maximum(below, lo), 0.0, None)
    expected = (values * mass).sum() / (hi - lo)
    pmf = np.diff(cdf, prepend=0.0)
    sd = math.sqrt((values**2 * pmf).sum() - (values * pmf).sum() ** 2)
    assert abs(proto.received[0, 0] - expected) <= 5 * sd / math.sqrt(M * (1 - 2 * beta))
    assert "mse_honest" in metrics


def test_without_adversaries_the_robust_centres_of_a_symmetric_prior_are_its_mean():
    """Beta(α, α): the honest uploads' law is symmetric about 1/2 with an atom there (n even),
    so the median is 1/2 exactly (F(9) = (1 − P(Z = 10))/2 lies 5 standard errors below 1/2)
    and the trimmed mean within 5 standard errors σ_y/√(m(1 − 2β)) of it."""
    spec = build(DATA.get("bernoulli-prior"), {"agents": M, "alpha": A, "beta": A}, "data")
    values, cdf = _honest_law()
    assert 0.5 - cdf[N // 2 - 1] > 5 * 0.5 / math.sqrt(M)  # (the premise)
    proto, _ = adversary_run("eb-bernoulli", {"robust": "median"}, spec.make(_rng()), N)
    assert proto.received[0, 0] == 0.5
    pmf = np.diff(cdf, prepend=0.0)
    sd = math.sqrt(((values - 0.5) ** 2 * pmf).sum())
    proto, _ = adversary_run(
        "eb-bernoulli", {"robust": "trimmed", "trim": 0.1}, spec.make(_rng()), N
    )
    assert abs(proto.received[0, 0] - 0.5) <= 5 * sd / math.sqrt(M * 0.8)


# --------------------------------------------------------------------------- eb-mixture


def test_trimmed_k_means_drops_far_outliers_and_finds_the_honest_cluster_means_exactly():
    """Three tight clusters and β·m uploads far away: every start that puts one centre in each
    cluster trims exactly the outliers, and such a start has the least trimmed objective."""
    rng = np.random.default_rng(9)
    clusters = [c + rng.uniform(-0.05, 0.05, 30) for c in (0.0, 1.0, 2.0)]
    y = np.concatenate([*clusters, np.full(10, 10.0)])
    rng.shuffle(y)
    centres, weights = trimmed_cluster_restarts(y, 3, np.random.default_rng(1), 5, 0.1)
    np.testing.assert_allclose(centres, [c.mean() for c in clusters], rtol=0, atol=1e-12)
    np.testing.assert_allclose(weights, [1 / 3] * 3)
    # from centres on the outliers' side, the plain step would keep them; trimming drops them
    got = trimmed_cluster(y, np.array([0.0, 1.0, 2.0]), 3, 0.1)
    np.testing.assert_allclose(got[0], centres, atol=1e-12)


def _mixture(params: dict):
    """One-shot eb-mixture (k = 3) on three classes of 100 agents (means 0.2, 0.4, 0.8,
    uniform samples of σ = 1/2, n = 400), a share 0.1 of them shifting their uploads by 1."""
    spec = build(
        DATA.get("classes"),
        {"agents": 300, "class_means": [0.2, 0.4, 0.8], "sigma": 0.5, "assignment": "balanced"},
        "data",
    )
    table = {"fraction": 0.1, "behaviour": "shift", "shift": 1.0}
    return adversary_run("eb-mixture", {"adversaries": table, **params}, spec.make(_rng()), 400)


def test_trimmed_k_means_puts_the_servers_centres_on_the_honest_class_means():
    """β = 0.2 ≥ f: the adversaries' uploads (≥ 1.2) are the farthest from every centre on the
    honest clusters, so each centre is the trimmed mean of its class's honest uploads X̄_i
    (σ/√n = 0.025 each, ≥ 1 − (β − f)/(1 − f) of them kept): within 5 standard errors
    0.025/√(100 (1 − 0.2)) of the class mean."""
    proto, metrics = _mixture({"trim": 0.2})
    centres = proto.received[0, :3]
    se = 0.025 / math.sqrt(100 * (1 - 0.2))
    np.testing.assert_allclose(centres, [0.2, 0.4, 0.8], atol=5 * se)
    plain, plain_metrics = _mixture({})
    moved = np.abs(plain.received[0, :3] - [0.2, 0.4, 0.8]).max()
    assert moved > 5 * se  # plain k-means: the adversaries pull a centre out of tolerance
    assert metrics["mse_honest"] < plain_metrics["mse_honest"]


def test_check_modes_gives_the_same_bytes_with_the_eb_defences():
    adv = {"fraction": 0.2, "behaviour": "shift", "shift": 1.0}
    mixture = {"round": 10, "k": 2, "trim": 0.2, "adversaries": adv}
    check_modes(PROTOCOLS.get("eb-mixture"), mixture, metrics=["adversaries"], t_max=40)
    bern = {"round": 10, "robust": "median", "adversaries": adv}
    check_modes(PROTOCOLS.get("eb-bernoulli"), bern, metrics=["adversaries"], t_max=40)


STUDY = """
[study]
title = "eb defences"
t_max = 10
checkpoints = 2

[data]
model = "bernoulli-prior"
agents = 30

[[scenario]]
name = "P"
protocol = "{protocol}"
{extra}
"""


@pytest.mark.parametrize(
    ("protocol", "extra", "fragment"),
    [
        ("eb-bernoulli", "trim = 0.2", "robust = 'trimmed' needs trim"),
        ("eb-bernoulli", 'robust = "trimmed"', "robust = 'trimmed' needs trim"),
        ("eb-bernoulli", 'robust = "median"\nmechanism = "rr"', "two-valued"),
        (
            "eb-bernoulli",
            'robust = "median"\nmoments = "known"\nalpha = 1\nbeta = 1',
            "known prior",
        ),
        ("eb-mixture", 'prior = "known"\ncentres = [0.1, 0.5, 0.9]\ntrim = 0.1', "remove trim"),
        ("eb-mixture", "trim = 0.5", "trim"),
    ],
)
def test_validate_refuses_a_defence_that_cannot_apply_in_one_line(
    tmp_path: Path, capsys, protocol, extra, fragment
):
    (tmp_path / "study.toml").write_text(STUDY.format(protocol=protocol, extra=extra))
    assert main(["validate", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err
