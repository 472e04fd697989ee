"""Every agent's ε in the per-agent results (issue 30): the privacy ledger of each agent equals
the hand count of the releases it sent (scripted links with outages and lost releases), for
Private-ColME (PM-I, PM-II) and the empirical-Bayes uploads; agents.parquet gets one column per
recipient set, `desim summary` its quantiles over agents, a [[plot]] its spread against t; the
dp-accounting version is in every run record and `desim verify` names a different one."""

from __future__ import annotations

import json
import math
from importlib.metadata import version

import dp_accounting
import numpy as np
import pandas as pd
import pytest

from desim.kernel.engine import Simulation
from desim.kernel.params import ConfigError, build
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.eb.data import HierarchicalGaussian
from desim.study.cli import main
from desim.testing import ScriptedLinks

PRIVACY = METRICS.get("privacy")
DELTA = 1e-6
#: Agents 1 and 4 are cut off (every link to or from them down) in slots 3 … 7.
OUT, OUTAGE = np.array([1, 4]), (3.0, 7.0)


def down(rng, t, src, dst):
    """Node outages, and links src → dst down in one slot of five (a query arriving whose
    release is then lost, and the other way round: the rule is not symmetric)."""
    t = np.asarray(t, dtype=float)
    cut = (np.isin(src, OUT) | np.isin(dst, OUT)) & (t >= OUTAGE[0]) & (t <= OUTAGE[1])
    return cut | ((src + 2 * dst + t) % 5 == 0)


def logged_run(proto, data, t_max: int, links, kind: str) -> tuple[pd.DataFrame, list]:
    """Run with the ledger kept per agent at every slot; (per-agent table, every `kind` message
    sent as (time, src, dst) arrays)."""
    sim = Simulation(
        proto,
        data,
        t_max,
        Streams(0, 0, 11, 22),
        links=links,
        checkpoints=np.arange(1, t_max + 1),
        per_agent=True,
        metrics=[PRIVACY],
    )
    sent: list = []
    send = sim.network.send

    def logged(what, src, dst, *args, **kwargs):
        if what == kind:
            at = kwargs.get("at")
            when = np.broadcast_to(sim.env.now if at is None else at, np.shape(src))
            sent.append((np.array(when, float), np.array(src), np.array(dst)))
        return send(what, src, dst, *args, **kwargs)

    sim.network.send = logged
    out = sim.run()
    return out.agents, sent


def releases_by(sent: list, t: float, m: int, n_dst: int) -> np.ndarray:
    """κ[b, a]: the releases b sent to a up to time t (lost on the way or not)."""
    kappa = np.zeros((m, n_dst), dtype=np.int64)
    for when, src, dst in sent:
        keep = when <= t
        np.add.at(kappa, (src[keep], dst[keep]), 1)
    return kappa


def gaussian_eps(multiplier: float, nodes: int) -> float:
    """ε at δ of `nodes` Gaussian releases of one sample (0 for none), in closed form."""
    if nodes == 0:
        return 0.0
    return dp_accounting.get_epsilon_gaussian(multiplier / math.sqrt(nodes), DELTA)


@pytest.mark.parametrize("mechanism", ["pm1", "pm2"])
def test_private_colme_per_agent_epsilon_is_the_hand_count_of_its_releases(mechanism):
    """Agent b's first sample lies in one p-sum per querier (PM-I) or one tree node per level
    that some release to a completed, bit_length(κ_{b→a}) of them (PM-II): ε against one querier
    is the largest such count's, against all colluding their sum's. Counted from the releases
    the network was handed, outages and lost releases included."""
    m, t_max, L = 6, 14, math.sqrt(3) / 2
    data = build(
        DATA.get("classes"), {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    ).make(np.random.default_rng(0))
    cls = PROTOCOLS.get("private-colme")
    proto = cls(build(cls.Params, {"mechanism": mechanism, "delta": DELTA}, "test"))
    agents, sent = logged_run(proto, data, t_max, ScriptedLinks(down=down), "release")
    assert list(agents.columns) == ["t", "agent", "value", "eps_one", "eps_all"]
    mult = math.sqrt(proto.sigma2_dp) / (2 * L)
    spread = set()
    for t in range(1, t_max + 1):
        kappa = releases_by(sent, t, m, m)
        nodes = (kappa > 0) if mechanism == "pm1" else np.frexp(kappa)[1]  # bit lengths
        here = agents[agents["t"] == t].sort_values("agent")
        one = [gaussian_eps(mult, int(k)) for k in nodes.max(axis=1)]
        all_ = [gaussian_eps(mult, int(k)) for k in nodes.sum(axis=1)]
        np.testing.assert_allclose(here["eps_one"], one, rtol=1e-12, atol=0)
        np.testing.assert_allclose(here["eps_all"], all_, rtol=1e-12, atol=0)
        spread.add(tuple(nodes.sum(axis=1)))
    # the outages made the agents' counts differ, and some releases were lost on their links
    final = releases_by(sent, t_max, m, m)
    assert len(set(final.sum(axis=1))) > 1
    lost = sum(int(down(None, w, s, d).sum()) for w, s, d in sent)
    assert lost > 0


def test_eb_uploads_per_agent_epsilon_is_the_count_of_uploads_sent():
    """Every agent uploads once per round whatever its links (a lost upload was still made): ε
    against the server after R_i uploads of multiplier m is one Gaussian of m/√R_i."""
    m, t_max = 5, 12
    cls = PROTOCOLS.get("eb-gaussian")
    params = {"sigma_theta": 0.1, "mechanism": "gaussian", "epsilon": 1.0, "delta": DELTA}
    proto = cls(build(cls.Params, {**params, "round": 3}, "test"))
    spec = HierarchicalGaussian(agents=m, mean=0.3, sigma_theta=0.1, sigma_x=0.5)
    data = spec.make(np.random.default_rng(0))
    agents, sent = logged_run(proto, data, t_max, ScriptedLinks(down=down), "upload")
    assert list(agents.columns) == ["t", "agent", "value", "eps_server"]
    for t in range(1, t_max + 1):
        uploads = releases_by(sent, t, m, m + 1).sum(axis=1)
        here = agents[agents["t"] == t].sort_values("agent")
        want = [gaussian_eps(proto.multiplier, int(r)) for r in uploads]
        np.testing.assert_allclose(here["eps_server"], want, rtol=1e-12, atol=0)
    assert any(down(None, w, s, d).any() for w, s, d in sent)  # some uploads were lost


def test_without_per_agent_the_ledger_keeps_only_its_summaries():
    m = 4
    data = build(
        DATA.get("classes"), {"agents": m, "class_means": [0.2, 0.8], "sigma": 0.5}, "data"
    ).make(np.random.default_rng(0))
    cls = PROTOCOLS.get("private-colme")
    proto = cls(build(cls.Params, {}, "test"))
    out = Simulation(proto, data, 5, Streams(0, 0, 1, 2), metrics=[PRIVACY]).run()
    assert out.agents is None
    assert set(out.metrics["metric"]) >= {"eps_one_max", "eps_one_mean", "eps_all_max"}
    assert not (out.metrics["metric"] == "eps_one").any()


# -- a study: agents.parquet, summary, figure, provenance -----------------------------------------
STUDY = """
[study]
title = "ledger per agent"
seed = 3
replicates = 2
t_max = 30
checkpoints = 6
metrics = ["privacy"]
per_agent = true

[data]
model = "classes"
agents = 8
class_means = [0.2, 0.8]
sigma = 0.5

[network]
links = "bernoulli"
p_link = 0.6

[[scenario]]
name = "pm1"
protocol = "private-colme"

[[scenario]]
name = "pm2"
protocol = "private-colme"
mechanism = "pm2"

[[scenario]]
name = "plain"
protocol = "local"

[[plot]]
file = "spread.png"
metric = "eps_all"
scenarios = ["pm1", "pm2"]
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ledger") / "study"
    folder.mkdir()
    (folder / "study.toml").write_text(STUDY)
    assert main(["run", str(folder), "--workers", "1", "--no-progress"]) == 0
    return folder


def test_agents_parquet_has_every_agent_s_epsilon_per_recipient_set(study):
    agents = pd.read_parquet(study / "results" / "agents.parquet")
    assert list(agents.columns) == [
        "scenario",
        "replicate",
        "t",
        "agent",
        "value",
        "eps_one",
        "eps_all",
    ]
    assert len(agents) == 3 * 2 * 6 * 8  # scenarios × replicates × checkpoints × agents
    plain = agents[agents["scenario"] == "plain"]
    assert plain["eps_one"].isna().all() and plain["value"].notna().all()
    metrics = pd.read_parquet(study / "results" / "metrics.parquet")
    for name in ("pm1", "pm2"):
        mine = agents[agents["scenario"] == name]
        assert mine["eps_all"].notna().all()
        # the per-run summaries are the mean and maximum of these columns
        for stat in ("max", "mean"):
            per_run = mine.groupby(["replicate", "t"])["eps_all"].agg(stat).to_numpy()
            rows = metrics[(metrics["scenario"] == name) & (metrics["metric"] == f"eps_all_{stat}")]
            np.testing.assert_allclose(per_run, rows["value"].to_numpy(), rtol=1e-12)


def test_summary_gives_quantiles_over_agents_at_t_max(study, capsys):
    capsys.readouterr()
    assert main(["summary", str(study), "--csv", str(study / "s.csv")]) == 0
    table = pd.read_csv(study / "s.csv").set_index("scenario")
    agents = pd.read_parquet(study / "results" / "agents.parquet")
    end = agents[agents["t"] == 30]
    for name in ("pm1", "pm2"):
        for who in ("one", "all"):
            values = end.loc[end["scenario"] == name, f"eps_{who}"]
            for q in (5, 50, 95):
                got = table.loc[name, f"eps_{who}_p{q}"]
                assert got == pytest.approx(values.quantile(q / 100), rel=1e-12)
    assert math.isnan(table.loc["plain", "eps_one_p50"])
    assert "eps_all_p95" in capsys.readouterr().out


def test_the_spread_figure_draws_median_band_and_histogram(study):
    import matplotlib

    matplotlib.use("Agg")
    from desim.study.plots import figure
    from desim.study.results import load_results
    from desim.study.spec import load_study

    spec = load_study(study)
    loaded = load_results(spec)
    fig = figure(spec, "spread.png", loaded.metrics, loaded.curves)
    band, hist = fig.axes[:2]
    assert band.get_xscale() == "log" and "per agent" in band.get_ylabel()
    assert hist.get_title() == "at t = 30" and hist.get_ylabel() == "share of agents"
    assert len(band.lines) == 2 and len(band.collections) == 2  # median and band per scenario
    shares = [p.get_path().vertices[:, 1].max() for p in hist.patches]
    assert len(shares) == 2 and all(0 < s <= 1 for s in shares)
    assert (study / "figures" / "spread.png").stat().st_size > 0  # drawn by the run


def test_a_per_agent_plot_needs_per_agent_results(tmp_path):
    from desim.study.spec import load_study

    (tmp_path / "study.toml").write_text(STUDY.replace("per_agent = true", ""))
    with pytest.raises(ConfigError, match="per_agent = true"):
        load_study(tmp_path)
    (tmp_path / "study.toml").write_text(
        STUDY.replace('metric = "eps_all"', 'metric = "eps_all"\nx = "eps_one_max"')
    )
    with pytest.raises(ConfigError, match="against x = 't' only"):
        load_study(tmp_path)


def test_every_run_record_names_its_dp_accounting_and_verify_names_another(study, capsys):
    sides = sorted((study / "results" / "runs").glob("*.json"))
    here = version("dp-accounting")
    assert sides and all(
        json.loads(p.read_text())["provenance"]["dp_accounting"] == here for p in sides
    )
    manifest = json.loads((study / "results" / "manifest.json").read_text())
    assert manifest["invocations"][-1]["dp_accounting"] == here
    side = json.loads(sides[0].read_text())
    side["provenance"]["dp_accounting"] = "0.0.1"
    sides[0].write_text(json.dumps(side))
    capsys.readouterr()
    try:
        assert main(["verify", str(study), "--no-progress"]) == 0
        err = capsys.readouterr().err
        assert f"computed with dp-accounting 0.0.1, this machine has {here}" in err
    finally:
        side["provenance"]["dp_accounting"] = here
        sides[0].write_text(json.dumps(side))
