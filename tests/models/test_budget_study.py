"""What studies/privacy-budgets/README.md claims, checked against its committed results (a
re-run that moves a number past what the text says fails here instead of leaving it wrong)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

STUDY = Path(__file__).resolve().parents[2] / "studies" / "privacy-budgets"


def _at_end(sub: str, metric: str = "mse") -> pd.DataFrame:
    """Replicates × scenarios of `metric` at the last checkpoint."""
    m = pd.read_parquet(STUDY / sub / "results" / "metrics.parquet")
    m = m[(m["metric"] == metric) & (m["t"] == m["t"].max())]
    return m.pivot_table(index="replicate", columns="scenario", values="value")


def _se(x: pd.Series) -> float:
    return float(x.std() / math.sqrt(len(x)))


def test_pm1_is_as_good_or_better_than_pm2_under_every_budget_and_worse_unlimited():
    x = _at_end("colme")
    assert x["PM-II unlimited"].mean() < x["PM-I unlimited"].mean()
    for eps in ("0.5", "1", "2", "4"):
        pm1, pm2 = x[f"PM-I ε_B={eps} stop"], x[f"PM-II ε_B={eps} stop"]
        assert pm1.mean() <= pm2.mean() + 1e-12, eps
    local = x["local"]
    assert (x["PM-I ε_B=0.5 stop"] == local).all()  # k* = 0: no release at all
    assert x["PM-I ε_B=4 stop"].mean() < 0.7 * local.mean()


def test_eb_one_upload_is_as_good_as_unlimited_and_degrade_loses_at_4():
    x = _at_end("eb")
    one, free = x["ε_B=4 stop"], x["unlimited"]
    assert abs(one.mean() - free.mean()) <= math.hypot(_se(one), _se(free))
    for eps in ("0.5", "1", "2"):  # no upload fits: every agent keeps its local mean
        assert (x[f"ε_B={eps} stop"] == x["local"]).all()
    assert x["ε_B=4 degrade"].mean() > x["ε_B=4 stop"].mean()
    assert x["ε_B=2 degrade"].mean() < 0.83 * x["local"].mean()


def test_degrade_ends_at_the_budget_and_ccolme_binds_all_or_nothing():
    eps = _at_end("eb", "eps_server_max")
    for b in (0.5, 1, 2, 4):
        spent = eps[f"ε_B={b:g} degrade"]
        assert (spent <= b * (1 + 1e-9)).all() and (spent >= 0.99 * b).all()
    out = _at_end("ccolme", "budget_exhausted")
    assert (out["ε_B=0.5 stop"] == 1).all() and (out["ε_B=0.5 degrade"] == 1).all()
    assert (out.drop(columns=["ε_B=0.5 stop", "ε_B=0.5 degrade"]) == 0).all().all()
    x = _at_end("ccolme")
    assert (x["ε_B=0.5 stop"] == x["local"]).all()


def test_colme_degrade_spends_its_budget_and_never_beats_stop():
    eps = _at_end("colme", "eps_all_max")
    x = _at_end("colme")
    for mech in ("PM-I", "PM-II"):
        for b in (0.5, 1, 2, 4):
            spent = eps[f"{mech} ε_B={b:g} degrade"]
            assert (spent <= b * (1 + 1e-9)).all() and (spent >= 0.99 * b).all()
            degraded, stopped = x[f"{mech} ε_B={b:g} degrade"], x[f"{mech} ε_B={b:g} stop"]
            assert degraded.mean() >= stopped.mean() - math.hypot(_se(degraded), _se(stopped))
        assert x[f"{mech} ε_B=0.5 degrade"].mean() > x["local"].mean()
