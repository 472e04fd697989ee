"""Adversarial agents ([adversaries], `desim.models.adversaries`): the table's validation, who
the adversaries are, what their releases (Private-ColME) and uploads (eb-gaussian) carry, the
honest agents' metrics, and the defences (trimmed combination; the server's median and trimmed
moments) against their closed forms."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from _runs import adversary_run
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from desim.kernel.params import build
from desim.kernel.plugins import load_plugins
from desim.kernel.randomness import Streams
from desim.kernel.registry import DATA, METRICS, PROTOCOLS
from desim.models.adversaries import Adversaries
from desim.models.colme.combination import trimmed_sums
from desim.models.eb.estimators import gaussian_weight
from desim.study.cli import main
from desim.study.spec import load_study
from desim.testing import check_modes

load_plugins()


def _classes(m: int, sigma: float = 0.5, seed: int = 0):
    """M agents of three classes (means 0.2, 0.4, 0.8), uniform samples of σ = `sigma`."""
    spec = build(
        DATA.get("classes"),
        {"agents": m, "class_means": [0.2, 0.4, 0.8], "sigma": sigma, "assignment": "balanced"},
        "data",
    )
    return spec.make(np.random.default_rng(seed))


# ------------------------------------------------------------------------------- validation

STUDY = """
[study]
title = "adversaries"
t_max = 50
checkpoints = 5
metrics = ["adversaries"]

[data]
model = "classes"
agents = 30

{table}

[[scenario]]
name = "P"
protocol = "{protocol}"
{extra}
"""


def _validate(tmp_path: Path, capsys, table: str, protocol="private-colme", extra="", data=""):
    folder = tmp_path / f"s-{protocol}"
    folder.mkdir()
    text = STUDY.format(table=table, protocol=protocol, extra=extra)
    if data:
        text = text.replace('model = "classes"\nagents = 30', data)
    (folder / "study.toml").write_text(text)
    code = main(["validate", str(folder)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ('[adversaries]\nfraction = 1.0\nbehaviour = "shift"\nshift = 1', "must lie in [0, 1)"),
        ('[adversaries]\nfraction = -0.1\nbehaviour = "shift"\nshift = 1', "must lie in [0, 1)"),
        ('[adversaries]\nagents = [3, 30]\nbehaviour = "flip"', "30 is not an agent"),
        ('[adversaries]\nagents = [3, 3]\nbehaviour = "flip"', "distinct agent ids"),
        ('[adversaries]\nfraction = 0.1\nagents = [1]\nbehaviour = "flip"', "either fraction"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "inflate"\nfactor = 2', "not meaningful"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "bribe"', "must be one of shift"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "shift"', "needs shift"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "shift"\nshift = 1\ntarget = 2', "remove"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "flip"\nshfit = 1', "did you mean 'shift'"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "mimic"\nclass = 7', "class = 7"),
        ('[adversaries]\nfraction = 0.1\nbehaviour = "flip"\nskip_noise = 1', "true or false"),
    ],
)
def test_validate_refuses_a_bad_adversaries_table_in_one_line(tmp_path, capsys, table, fragment):
    code, err = _validate(tmp_path, capsys, table)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1, err


def test_an_adversaries_table_no_scenario_reads_is_refused(tmp_path, capsys):
    # every protocol simulates adversaries: a study of curves alone has no scenario to read it
    folder = tmp_path / "s"
    folder.mkdir()
    text = STUDY.format(
        table='[adversaries]\nfraction = 0.1\nbehaviour = "flip"', protocol="{protocol}", extra=""
    )
    text = text.replace('[[scenario]]\nname = "P"\nprotocol = "{protocol}"', "")
    (folder / "study.toml").write_text(text + '\n[[curve]]\nname = "L"\nkind = "local"\n')
    code, err = main(["validate", str(folder)]), capsys.readouterr().err
    assert code == 2 and "no scenario's protocol simulates adversaries" in err, err


def test_mimicry_is_not_meaningful_for_the_server_protocols(tmp_path, capsys):
    data = 'model = "hierarchical-gaussian"\nagents = 30'
    code, err = _validate(
        tmp_path,
        capsys,
        '[adversaries]\nfraction = 0.1\nbehaviour = "mimic"\nclass = 0',
        protocol="eb-gaussian",
        data=data,
    )
    assert code == 2 and "not meaningful for the empirical-Bayes" in err, err


def test_trim_is_read_only_by_the_trimmed_combination(tmp_path, capsys):
    code, err = _validate(tmp_path, capsys, "", extra="trim = 0.2")
    assert code == 2 and "combination = 'trimmed' needs trim" in err, err
    data = 'model = "hierarchical-gaussian"\nagents = 30'
    code, err = _validate(
        tmp_path,
        capsys,
        "",
        protocol="eb-gaussian",
        extra="trim = 0.2\nsigma_theta = 0.1",
        data=data,
    )
    assert code == 2 and "moments = 'trimmed' needs trim" in err, err


def _hashes(tmp_path: Path, name: str, table: str, extra: str = "") -> list[str]:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "study.toml").write_text(
        STUDY.format(table=table, protocol="private-colme", extra=extra)
    )
    return [run.config_hash for run in load_study(folder).runs]


def test_the_table_enters_config_hashes_only_when_present(tmp_path):
    plain = _hashes(tmp_path, "a", "")
    assert _hashes(tmp_path, "b", "", 'combination = "weighted"') == plain  # the legacy value
    table = '[adversaries]\nfraction = 0.1\nbehaviour = "flip"'
    assert _hashes(tmp_path, "c", table) != plain


# -------------------------------------------------------------------------- who they are


def test_fractions_draw_nested_sets_of_round_f_m_agents_and_lists_name_them():
    rng = [np.random.default_rng(5) for _ in range(3)]
    masks = [
        Adversaries.from_table({"fraction": f, "behaviour": "flip"}, ("flip",), "test").draw(200, r)
        for f, r in zip((0.1, 0.2, 0.3), rng, strict=True)
    ]
    assert [int(m.sum()) for m in masks] == [20, 40, 60]
    assert not (masks[0] & ~masks[1]).any() and not (masks[1] & ~masks[2]).any()
    listed = Adversaries.from_table({"agents": [4, 1], "behaviour": "flip"}, ("flip",), "test")
    assert np.flatnonzero(listed.draw(10, rng[0])).tolist() == [1, 4]


def test_every_protocol_of_a_study_meets_the_same_adversaries(tmp_path, capsys):
    table = '[adversaries]\nfraction = 0.2\nbehaviour = "shift"\nshift = 0.5'
    folder = tmp_path / "s"
    folder.mkdir()
    text = STUDY.format(table=table, protocol="private-colme", extra="")
    text += '\n[[scenario]]\nname = "Q"\nprotocol = "private-colme"\nweights = "mom"\n'
    (folder / "study.toml").write_text(text.replace("agents = 30", "agents = 30\nsigma = 0.1"))
    study = load_study(folder)
    keys = {
        Streams(7, 0, r.scenario.shared_key, r.scenario.run_key).spawn_key("adversaries")
        for r in study.runs
    }
    assert len(keys) == 1  # the stream is keyed by the data set-up and replicate only


# ----------------------------------------------------------------------- Private-ColME


def _last_release_counts(m: int, t: int) -> np.ndarray:
    """t_{b→a} under RR at the end of slot t: agent a queries its k-th other agent, (a + k) mod M,
    at slots s ≡ k (mod M − 1), and the release carries the responder's s samples."""
    counts = np.zeros((m, m))
    for k in range(1, m):
        s = t - ((t - k) % (m - 1))
        a = np.arange(m)
        counts[a, (a + k) % m] = s if s >= 1 else 0
    return counts


def test_shift_biases_the_oracle_combination_by_the_adversaries_share_of_the_weights():
    """With accepted peers weighted by t_b/σ² (noise none, last release), an adversary's shift
    s moves an honest agent's estimate by s · Σ_{b∈A∩C_a} t_b / (t + Σ_{b∈C_a∖a} t_b): the
    weighted analogue of f·s (exactly f·s for the ideal estimator, equal weights)."""
    m, t, s = 30, 120, 2.0
    base = {"noise": "none", "weights": "last"}
    table = {"fraction": 0.2, "behaviour": "shift", "shift": s}
    clean, _ = adversary_run("private-colme-oracle", base, _classes(m), t)
    proto, metrics = adversary_run(
        "private-colme-oracle", {**base, "adversaries": table}, _classes(m), t
    )
    adv, classes = proto.adversaries.mask, _classes(m).classes
    same = (classes[:, None] == classes[None, :]) & ~np.eye(m, dtype=bool)
    counts = _last_release_counts(m, t) * same
    expected = s * (counts * adv[None, :]).sum(axis=1) / (t + counts.sum(axis=1))
    diff = proto.estimates() - clean.estimates()
    np.testing.assert_allclose(diff[~adv], expected[~adv], rtol=1e-9, atol=1e-12)
    # the oracle accepts every adversary of its class and no other
    per_agent = (same & adv[None, :]).sum(axis=1)[~adv]
    assert metrics["adversaries_accepted"] == pytest.approx(per_agent.mean())
    assert metrics["accepting_adversaries"] == pytest.approx(np.mean(per_agent > 0))


def test_the_trimmed_combination_removes_the_shift_to_within_the_releases_error():
    """β = 0.25 ≥ the adversaries' share of every honest agent's peers: the trimmed
    combination lies among the honest T_b and the agent's own mean, each within 5 standard
    errors σ/√(t − M) of the class mean, where the weighted one is off by the closed form."""
    m, t, s, sigma = 60, 300, 3.0, 0.5
    base = {"noise": "none", "weights": "last"}
    table = {"fraction": 0.1, "behaviour": "shift", "shift": s}
    trimmed = {**base, "adversaries": table, "combination": "trimmed", "trim": 0.25}
    proto, _ = adversary_run("private-colme-oracle", trimmed, _classes(m, sigma), t)
    weighted, _ = adversary_run(
        "private-colme-oracle", {**base, "adversaries": table}, _classes(m), t
    )
    data = _classes(m, sigma)
    adv = proto.adversaries.mask
    same = (data.classes[:, None] == data.classes[None, :]) & ~np.eye(m, dtype=bool)
    peers, bad = same.sum(axis=1), (same & adv[None, :]).sum(axis=1)
    assert (bad[~adv] <= np.floor(0.25 * peers[~adv])).all()  # (the premise)
    err = (proto.estimates() - data.means)[~adv]
    assert np.abs(err).max() <= 5 * sigma / math.sqrt(t - m)
    shifted = (weighted.estimates() - data.means)[~adv]
    assert shifted.mean() > 10 * np.abs(err).max()


def test_a_mimic_is_accepted_by_the_class_it_mimics_and_only_there():
    m, t = 45, 400
    table = {"fraction": 0.2, "behaviour": "mimic", "class": 2}
    proto, metrics = adversary_run("private-colme", {"adversaries": table}, _classes(m, 0.1), t)
    adv, classes = proto.adversaries.mask, _classes(m).classes
    accepted = proto.included[:, adv].sum(axis=1)
    honest = ~adv
    in_two = honest & (classes == 2)
    assert accepted[in_two].min() == adv.sum()  # every class-2 agent accepts them all
    assert accepted[honest & (classes != 2)].max() == 0
    assert metrics["accepting_adversaries"] == pytest.approx(in_two.sum() / honest.sum())


def test_flip_reflects_and_collusion_targets_and_skip_noise_drops_the_noise():
    m, t = 20, 60
    data = _classes(m)
    centre = data.means.mean()
    for table, expected in (
        ({"agents": [3], "behaviour": "flip"}, lambda x, mu: 2 * centre - x),
        ({"agents": [3], "behaviour": "collude", "target": 5.0}, lambda x, mu: x - mu + 5.0),
    ):
        honest, _ = adversary_run("private-colme", {"noise": "none"}, _classes(m), t)
        proto, _ = adversary_run(
            "private-colme", {"noise": "none", "adversaries": table}, _classes(m), t
        )
        x = honest.sums[3] / honest.counts[3]
        got = proto.adversaries.report(np.array([3]), np.array([x]), None)[0]
        assert got == pytest.approx(expected(x, data.means[3]))
    table = {"agents": [3], "behaviour": "shift", "shift": 1.0, "skip_noise": True}
    proto, _ = adversary_run("private-colme", {"adversaries": table}, _classes(m), t)
    reported = proto.adversaries.report(np.array([3]), np.array([99.0]), np.array([0.5]))
    assert reported[0] == 1.5  # from the noiseless mean, not the noisy release


def test_check_modes_gives_the_same_bytes_with_adversaries():
    params = {
        "adversaries": {"fraction": 0.2, "behaviour": "mimic", "class": 0, "shift": 0.05},
        "combination": "trimmed",
        "trim": 0.2,
    }
    check_modes(PROTOCOLS.get("private-colme"), params, metrics=["adversaries"], t_max=40)
    eb = {
        "sigma_theta": 0.1,
        "round": 10,
        "mechanism": "gaussian",
        "moments": "median",
        "adversaries": {"fraction": 0.2, "behaviour": "collude", "target": 3.0},
    }
    check_modes(PROTOCOLS.get("eb-gaussian"), eb, metrics=["adversaries"], t_max=40)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 9),
    st.floats(0, 0.49),
    st.integers(0, 2**31),
)
def test_trimmed_sums_drop_the_lowest_and_highest_floor_beta_n_of_each_rows_peers(
    rows, cols, beta, seed
):
    rng = np.random.default_rng(seed)
    weight = np.where(rng.random((rows, cols)) < 0.7, rng.random((rows, cols)) + 0.1, 0.0)
    value = rng.normal(size=(rows, cols))
    num, den = trimmed_sums(weight, value, beta)
    for r in range(rows):
        peers = np.flatnonzero(weight[r] > 0)
        cut = math.floor(beta * len(peers))
        kept = peers[np.argsort(value[r, peers], kind="stable")][cut : len(peers) - cut]
        assert num[r] == pytest.approx((weight[r, kept] * value[r, kept]).sum(), abs=1e-12)
        assert den[r] == pytest.approx(weight[r, kept].sum(), abs=1e-12)


# --------------------------------------------------------------------------- eb-gaussian


def _eb(params: dict, m: int = 4000):
    spec = build(
        DATA.get("hierarchical-gaussian"),
        {"agents": m, "mean": 0.5, "sigma_theta": 0.3, "sigma_x": 0.4},
        "data",
    )
    source = spec.make(np.random.default_rng(1))
    proto, metrics = adversary_run("eb-gaussian", {"sigma_theta": 0.3, **params}, source, 1)
    return proto, metrics, source


def test_shifted_uploads_move_the_servers_mean_by_k_s_over_m():
    s = 10.0
    table = {"fraction": 0.1, "behaviour": "shift", "shift": s}
    clean, _, source = _eb({})
    proto, metrics, _ = _eb({"adversaries": table})
    k, m = int(proto.adversaries.mask.sum()), source.n_agents
    assert proto.received[0, 0] - clean.received[0, 0] == pytest.approx(s * k / m, rel=1e-9)
    a = gaussian_weight(0.09, 0.0, m, np.array([0.16]))[0]
    honest = ~proto.adversaries.mask
    diff = (proto.estimates() - clean.estimates())[honest]
    np.testing.assert_allclose(diff, (1 - a) * s * k / m, rtol=1e-9)
    assert "accepting_adversaries" not in metrics  # the server accepts every upload


def test_the_servers_median_and_trimmed_mean_follow_their_contamination_closed_forms():
    """Uploads y ~ N(μ, σ_y²), σ_y² = σ_θ² + σ_x² (n = 1), a fraction f shifted far up. The
    median solves (1 − f) Φ(z) = 1/2: bias σ_y Φ⁻¹(1/(2(1 − f))), standard error 1/(2√m g)
    with g = (1 − f) φ(z)/σ_y. The trimmed mean (β ≥ f) keeps the honest uploads between their
    quantiles β/(1 − f) and (1 − β)/(1 − f): bias σ_y (φ(z_lo) − φ(z_hi))/(hi − lo), standard
    error at most σ_y/√(m(1 − 2β))."""
    f, s, beta, m = 0.1, 50.0, 0.2, 4000
    table = {"fraction": f, "behaviour": "shift", "shift": s}
    sigma_y = math.sqrt(0.3**2 + 0.4**2)
    med, _, source = _eb({"adversaries": table, "moments": "median"}, m)
    mu = source.means.mean()  # the θ_i drawn: the servers' target
    z = norm.ppf(0.5 / (1 - f))
    se = sigma_y / (2 * math.sqrt(m) * (1 - f) * norm.pdf(z))
    assert abs(med.received[0, 0] - mu - sigma_y * z) <= 4 * se + 4 * 0.3 / math.sqrt(m)
    trim, _, _ = _eb({"adversaries": table, "moments": "trimmed", "trim": beta}, m)
    lo, hi = beta / (1 - f), (1 - beta) / (1 - f)
    bias = sigma_y * (norm.pdf(norm.ppf(lo)) - norm.pdf(norm.ppf(hi))) / (hi - lo)
    se = sigma_y / math.sqrt(m * (1 - 2 * beta))
    assert abs(trim.received[0, 0] - mu - bias) <= 4 * se + 4 * 0.3 / math.sqrt(m)
    plain, _, _ = _eb({"adversaries": table}, m)
    assert abs(plain.received[0, 0] - mu - f * s) <= 4 * sigma_y / math.sqrt(m)  # the mean: f·s


def test_inflated_counts_reach_the_servers_moments():
    table = {"fraction": 0.5, "behaviour": "inflate", "factor": 1000.0}
    clean, _, _ = _eb({"sigma_theta": None})
    proto, _, _ = _eb({"sigma_theta": None, "adversaries": table})
    assert proto.received[0, 0] == clean.received[0, 0]  # μ̂ does not weigh by counts
    assert proto.received[0, 1] > clean.received[0, 1]  # σ̂_θ² subtracts less sampling noise


def test_a_grid_sweeps_whole_tables_and_baselines_record_nothing_of_them(tmp_path):
    sweep = [{"fraction": 0.1, "behaviour": "flip"}, {"fraction": 0.2, "behaviour": "flip"}]
    text = STUDY.format(
        table='[grid]\n"defaults.adversaries" = [{fraction = 0.1, behaviour = "flip"}, '
        '{fraction = 0.2, behaviour = "flip"}]',
        protocol="private-colme",
        extra='\n[[scenario]]\nname = "local"\nprotocol = "local"',
    )
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.toml").write_text(text)
    study = load_study(folder)
    tables = [r.scenario.params.get("adversaries") for r in study.runs if r.scenario.name == "P"]
    assert tables == sweep
    local, _ = adversary_run(
        "local", {}, _classes(20), 5
    )  # (the metric reads no state of a baseline)
    assert METRICS.get("adversaries")(local, _classes(20)) == {}


def test_the_top_level_table_reaches_the_scenarios_that_simulate_adversaries(tmp_path, capsys):
    table = '[adversaries]\nfraction = 0.1\nbehaviour = "flip"'
    folder = tmp_path / "top"
    folder.mkdir()
    text = STUDY.format(table=table, protocol="private-colme", extra="")
    (folder / "study.toml").write_text(text + '\n[[scenario]]\nname = "L"\nprotocol = "local"\n')
    params = {r.scenario.name: r.scenario.params for r in load_study(folder).runs}
    assert params["P"]["adversaries"] == {"fraction": 0.1, "behaviour": "flip"}
    assert params["L"]["adversaries"] == params["P"]["adversaries"]  # (for its metric)
    both = table + '\n\n[defaults]\nadversaries = {fraction = 0.1, behaviour = "flip"}'
    code, err = _validate(tmp_path, capsys, both)
    assert code == 2 and "also set in [defaults]" in err and len(err.strip().splitlines()) == 1
