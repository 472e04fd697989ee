"""`accountant = "pld" | "rdp"` on every private protocol, from a study file (issue 30): the RDP
ledger is the `privacy-rdp` cross-check's, tight calibrations and budgets follow the accountant
chosen (RDP is never tighter: more noise, fewer releases), and PLD stays the default."""

from __future__ import annotations

import pandas as pd
import pytest

from desim.kernel.params import ConfigError, build
from desim.kernel.registry import PROTOCOLS
from desim.study.cli import main

STUDY = """
[study]
title = "accountants"
seed = 3
replicates = 1
t_max = 24
checkpoints = 3
metrics = ["privacy", "privacy-rdp", "budget"]

[data]
model = "{data}"
{data_table}

{topology}

[[scenario]]
name = "pld"
protocol = "{protocol}"
{params}

[[scenario]]
name = "rdp"
protocol = "{protocol}"
accountant = "rdp"
{params}
"""

CLASSES = "agents = 8\nclass_means = [0.2, 0.8]\nsigma = 0.5"
GAUSS = "agents = 20\nmean = 0.5\nsigma_theta = 0.1\nsigma_x = 0.5"
CASES = {
    "private-colme": ("classes", CLASSES, "", 'mechanism = "pm2"\nbudget = {epsilon = 2.0}'),
    "eb-gaussian": (
        "hierarchical-gaussian",
        GAUSS,
        "",
        'mechanism = "gaussian"\nclip = 2.0\nround = 2\nbudget = {epsilon = 3.0}',
    ),
    "private-c-colme": (
        "classes",
        CLASSES,
        '[topology]\nmodel = "regular"\ndegree = 3',
        "budget = {epsilon = 2.0}",
    ),
}


def run_study(tmp_path, protocol: str) -> pd.DataFrame:
    data, table, topology, params = CASES[protocol]
    folder = tmp_path / protocol
    folder.mkdir()
    text = STUDY.format(
        data=data, data_table=table, topology=topology, protocol=protocol, params=params
    )
    (folder / "study.toml").write_text(text)
    assert main(["run", str(folder)]) == 0
    import desim

    return desim.load(folder).metrics


@pytest.mark.parametrize("protocol", list(CASES))
def test_the_rdp_ledger_is_the_cross_check_s_and_never_below_pld(tmp_path, protocol, no_figures):
    metrics = run_study(tmp_path, protocol)
    wide = metrics.pivot_table(index=["scenario", "t"], columns="metric", values="value")
    rdp, pld = wide.loc["rdp"], wide.loc["pld"]
    eps = [c for c in wide.columns if c.startswith("eps_") and not c.startswith("eps_rdp_")]
    assert eps
    for col in eps:  # same noise (paper calibration): the ledger is the cross-check's
        pd.testing.assert_series_equal(
            rdp[col], rdp[col.replace("eps_", "eps_rdp_")], check_names=False
        )
        assert (pld[col] <= pld[col.replace("eps_", "eps_rdp_")] + 1e-12).all()
    # the budget's k* follows the accountant: RDP's is never larger, so it binds no later
    assert (rdp["budget_withheld"] >= pld["budget_withheld"]).all()


def test_a_tight_calibration_follows_the_accountant():
    """RDP bounds PLD from above, so the least multiplier it accepts is larger."""
    cls = PROTOCOLS.get("eb-gaussian")
    from desim.models.eb.server import gaussian_multiplier

    pld = gaussian_multiplier("tight", 1.0, 1e-6, 2)
    rdp = gaussian_multiplier("tight", 1.0, 1e-6, 2, "rdp")
    assert rdp > pld
    params = build(cls.Params, {"mechanism": "gaussian", "clip": 1.0, "calibration": "tight"}, "x")
    assert params.accountant == "pld"  # the default: no change to committed runs


def test_an_unknown_accountant_is_a_one_line_config_error():
    for protocol in CASES:
        cls = PROTOCOLS.get(protocol)
        with pytest.raises(ConfigError, match="accountant = 'moments'"):
            build(cls.Params, {"accountant": "moments"}, "scenario 'x'")
