"""robustness/drift/README.md, "Unknown variances": what the README claims about the Sch-Var-2
scenarios with and without forgetting, checked against the committed results."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from desim.study.summary import summarise_runs

DRIFT = Path(__file__).resolve().parents[2] / "studies" / "robustness" / "drift" / "results"
SLOTS = [1874, 2057, 2984, 5214, 10_000]

#: The README's table (two significant figures) and median recovery times.
TABLE = {
    "Private-ColME, Sch-Var-2": [7.2e-6, 3.7e-2, 1.6e-2, 4.7e-3, 1.7e-3],
    "Private-ColME, Sch-Var-2, window 1000": [1.2e-5, 3.7e-2, 2.0e-4, 1.0e-5, 1.4e-5],
    "Private-ColME, Sch-Var-2, reset at 2000": [7.0e-6, 4.3e-3, 1.5e-5, 3.2e-6, 1.3e-6],
}
RECOVERS = {
    "Private-ColME, Sch-Var-2, window 1000": 1211,
    "Private-ColME, Sch-Var-2, reset at 2000": 999,
}
KNOWN = {
    "Private-ColME, Sch-Var-2, window 1000": "Private-ColME, window 1000",
    "Private-ColME, Sch-Var-2, reset at 2000": "Private-ColME, reset at 2000",
    "Private-ColME, Sch-Var-2": "Private-ColME (PM-I, RR, ε = 1)",
}


def _means() -> tuple[pd.DataFrame, pd.DataFrame]:
    m = pd.read_parquet(DRIFT / "metrics.parquet")
    values = m[m["metric"] == "mse"].groupby(["scenario", "t"])["value"]
    return values.mean().unstack(0), (values.std() / np.sqrt(values.count())).unstack(0)


def test_the_table_and_its_standard_errors():
    mean, se = _means()
    for name, row in TABLE.items():
        for t, want in zip(SLOTS, row, strict=True):
            assert float(f"{mean.loc[t, name]:.1e}") == want, (name, t)
            assert se.loc[t, name] < 0.13 * mean.loc[t, name]


def test_forgetting_recovers_every_replicate_and_nothing_does_without():
    table = summarise_runs(pd.read_parquet(DRIFT / "metrics.parquet"), recover=(2000, 2.0))
    table = table.set_index("scenario")
    for name, slots in RECOVERS.items():
        assert table.loc[name, "recovered"] == 8
        assert round(table.loc[name, "t_recover_median"]) == slots
    assert table.loc["Private-ColME, Sch-Var-2", "recovered"] == 0


def test_the_ratios_to_the_known_variance_runs():
    mean, _ = _means()
    ratio = {u: mean[u] / mean[k] for u, k in KNOWN.items()}
    after = mean.index > 2000
    window = ratio["Private-ColME, Sch-Var-2, window 1000"][after]
    assert 0.795 <= window.min() and window.max() < 1.245
    reset = ratio["Private-ColME, Sch-Var-2, reset at 2000"]
    early, late = reset[after & (mean.index < 2984)], reset[mean.index >= 2984]
    assert 0.795 <= early.min() and early.max() < 1.685
    assert 0.975 <= late.min() and late.max() < 1.065
    assert math.isclose(round(reset.loc[10_000], 2), 1.01)
    assert round(window.loc[10_000], 2) == 1.08
    assert round(ratio["Private-ColME, Sch-Var-2"].loc[10_000], 2) == 1.15
