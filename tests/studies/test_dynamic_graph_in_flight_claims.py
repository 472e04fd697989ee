"""studies/robustness/dynamic-graph/latency/README.md, its section on messages lost in flight
(the sub-study `in-flight/`): the claims, on the stored results at t = 1000 (2 replicates)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

STUDY = Path(__file__).resolve().parents[2] / "studies" / "robustness/dynamic-graph/latency"
T, R, RHO, REPLICATES = 1000, 50, 0.1, 2
LAMBDAS, PERIODS = (0.5, 1.0, 2.0), (100, 20)
PROTOCOLS = ("B-ColME", "C-ColME", "Private-C-ColME", "Private-ColME")
TABLE = {  # the README's table: k = 100 / 20 at λ = 0.5, 1, 2, lost (per change)
    "B-ColME": "121 (13) / 744 (15) | 514 (57) / 2885 (59) | 1409 (157) / 7564 (154)",
    "C-ColME": "232 (26) / 1176 (24) | 793 (88) / 4385 (89) | 2089 (232) / 11681 (238)",
    "Private-C-ColME": "497 (55) / 2717 (55) | 1405 (156) / 7597 (155) | 3129 (348) / 17202 (351)",
    "Private-ColME": "44 (5) / 238 (5) | 135 (15) / 732 (15) | 310 (34) / 1703 (35)",
}


def q(lam: float) -> float:
    """Σ_{j≥1} e^(−j/λ): the messages in flight on one direction of a link at a change, sent
    one per slot."""
    return 1.0 / math.expm1(1.0 / lam)


def changes(k: int) -> np.ndarray:
    """The slots before which the graph changes: k, 2k, … ≤ T."""
    return np.arange(k, T + 1, k)


def expected_b_colme(k: int, lam: float) -> float:
    """E[lost by T] for B-ColME (a table each way on every link every slot): a message sent j
    slots before the change at τ is counted if it arrives in (τ, T], probability
    e^(−j/λ) − e^(−(T−τ+j)/λ); summed over j ≥ 1, 2R directions of the moved links and the
    changes (messages sent on a link more than k slots before it was made are none: a relative
    error of e^(−k/λ) ≤ e^(−10))."""
    return 2 * R * q(lam) * float(np.sum(-np.expm1(-(T - changes(k)) / lam)))


@pytest.fixture(scope="module")
def runs() -> pd.DataFrame:
    """Per run at T: lost_in_flight and the messages sent (all kinds)."""
    m = pd.read_parquet(STUDY / "in-flight" / "results" / "metrics.parquet")
    m = m[m["t"] == T]
    keys = ["scenario", "every", "mean", "replicate"]
    lost = m[m["metric"] == "lost_in_flight"].set_index(keys)["value"]
    sent = m[m["metric"].str.startswith("messages_")].groupby(keys)["value"].sum()
    return pd.DataFrame({"lost": lost, "sent": sent})


def _lost(runs: pd.DataFrame, name: str, k: int, lam: float) -> float:
    return float(runs.loc[(name, k, lam), "lost"].mean())


def test_the_latency_study_keeps_its_runs_and_hash_without_the_metric():
    """'A study of its own because a metric enters every run's config hash'."""
    text = (STUDY / "study.toml").read_text()
    assert "lost-in-flight" not in text
    assert "lost-in-flight" in (STUDY / "in-flight" / "study.toml").read_text()


def test_the_table(runs):
    for name in PROTOCOLS:
        quoted = TABLE[name].replace("|", " ").replace("/", " ").split()
        found = []
        for lam in LAMBDAS:
            for k in PERIODS:
                lost = _lost(runs, name, k, lam)
                per = lost / len(changes(k)[changes(k) < T])
                found += [str(math.floor(lost + 0.5)), f"({math.floor(per + 0.5)})"]  # half up
        assert found == quoted, name


@pytest.mark.parametrize("k", PERIODS)
@pytest.mark.parametrize("lam", LAMBDAS)
def test_b_colme_loses_what_the_closed_form_says(runs, k, lam):
    """'B-ColME loses what the closed form says: 2R·q(λ) per change, within 2.5 standard errors
    (Poisson) in each of the six cells.' The count is a sum of independent Bernoulli trials (one
    per message on a moved link), so its variance is at most its mean."""
    expected = expected_b_colme(k, lam)
    se = math.sqrt(expected / REPLICATES)
    assert abs(_lost(runs, "B-ColME", k, lam) - expected) < 2.5 * se
    assert abs(2 * R * q(lam) - [15.7, 58.2, 154.1][LAMBDAS.index(lam)]) < 0.05


def test_losses_grow_with_the_changes_and_with_q(runs):
    """'k = 100 to 20 multiplies the losses by 5.1–6.2; λ = 0.5 to 2 by 9–12 for B-ColME and
    C-ColME (q: ×9.8), 6.3 for Private-C-ColME and 7 for Private-ColME.'"""
    for name in PROTOCOLS:
        for lam in LAMBDAS:
            assert 5.05 <= _lost(runs, name, 20, lam) / _lost(runs, name, 100, lam) < 6.25
    assert round(q(2.0) / q(0.5), 1) == 9.8
    for name, low, high in [
        ("B-ColME", 9, 12),
        ("C-ColME", 9, 12),
        ("Private-C-ColME", 6.25, 6.35),
        ("Private-ColME", 6.95, 7.25),
    ]:
        for k in PERIODS:
            assert low <= _lost(runs, name, k, 2.0) / _lost(runs, name, k, 0.5) < high, name


def test_the_share_lost_is_about_rho_q_over_k(runs):
    """'At k = 20, 0.07–0.08 %, 0.28–0.29 % and 0.75–0.76 % for B-ColME and C-ColME (at
    k = 100, 0.9 of ρ·q/k); Private-C-ColME and Private-ColME up to 1.5× that at λ = 0.5;
    under 1 % of the messages.'"""
    share = (runs["lost"] / runs["sent"]).groupby(level=[0, 1, 2]).mean()
    bounds = {0.5: (0.0007, 0.0008), 1.0: (0.0028, 0.0029), 2.0: (0.0075, 0.0076)}
    for name in ("B-ColME", "C-ColME"):
        for lam, (low, high) in bounds.items():
            assert low <= round(share[name, 20, lam], 4) <= high
            ratio = share[name, 100, lam] / (0.9 * RHO * q(lam) / 100)
            assert 0.85 < ratio < 1.1
    for name in ("Private-C-ColME", "Private-ColME"):
        for k in PERIODS:
            assert share[name, k, 0.5] / (RHO * q(0.5) / k) < 1.55
    assert share.max() < 0.01


def test_counts_follow_what_each_protocol_sends(runs):
    """'B-ColME 1 table each way; C-ColME 1.55 …, losing 1.5–1.65× B-ColME's 2R·q(λ) per
    change; Private-C-ColME 2.24 …, 2.25–3.55×; Private-ColME 0.2 …, 0.22–0.31×.'"""
    per_link_slot = (runs["sent"] / (T * 2 * 500)).groupby(level=0).mean()
    for name, sends in [("B-ColME", 1.0), ("C-ColME", 1.55), ("Private-C-ColME", 2.24)]:
        assert round(per_link_slot[name], 2) == pytest.approx(sends, abs=0.01)
    assert round(per_link_slot["Private-ColME"], 1) == 0.2
    for name, low, high in [
        ("C-ColME", 1.5, 1.65),
        ("Private-C-ColME", 2.25, 3.55),
        ("Private-ColME", 0.22, 0.315),
    ]:
        for k in PERIODS:
            for lam in LAMBDAS:
                ratio = _lost(runs, name, k, lam) / expected_b_colme(k, lam)
                assert low <= ratio < high, (name, k, lam)
