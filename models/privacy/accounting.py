"""Privacy accounting with Google's dp-accounting: tight calibration and the spent-ε ledger.

Every mechanism here adds noise to a quantity whose sensitivity Δ is known (a p-sum of samples
in [μ−L, μ+L] has Δ = 2L; Lemma 3's variance release has Δ = 4L²). What the accountant needs
is the *noise multiplier* m = (noise std)/Δ for Gaussian noise, or (Laplace scale b)/Δ for
Laplace noise, and how many releases contain the most exposed sample. A change of one sample
shifts each release containing it by at most Δ, so the privacy loss is that of an additive
mechanism with shift Δ — the accountant's ADD_OR_REMOVE_ONE events with sensitivity 1 describe
it exactly (for these symmetric noises the two neighbouring relations give the same loss).

Two things are computed, both by the PLD (privacy loss distribution) accountant of dp-accounting
(Meiser & Mohammadi 2018; Koskela et al. 2020; Doroshenko et al. 2022):

- `tight_multiplier(noise, ε, δ, count)`: the smallest m for which `count` adaptive
  compositions of the mechanism are (ε, δ)-DP, found by Brent's bisection on the accountant
  (dp-accounting's `calibrate_dp_mechanism`) and cached per (noise, ε, δ, count). For one
  Gaussian release this is the analytic Gaussian mechanism of Balle & Wang, "Improving the
  Gaussian Mechanism for Differential Privacy: Analytical Calibration and Optimal Denoising"
  (ICML 2018); `count` Gaussian releases of one sample compose exactly to one release with
  √count times the sensitivity.
- `epsilon_spent(noise, m, count, δ)`: the ε at δ of `count` releases with multiplier m — what
  the `privacy` ledger metric reports. Gaussian compositions use that exact identity and
  dp-accounting's closed-form ε of the Gaussian mechanism (fast, exact); Laplace compositions
  use the PLD accountant.

A second accountant, RDP (Rényi DP; Mironov 2017, dp-accounting's `RdpAccountant`), is there as
a cross-check (`accountant = "rdp"` in `tight_multiplier`, `epsilon_spent` and `Spend`; the
``privacy-rdp`` ledger metric): it is never tighter than PLD on these mechanisms, so an RDP ε
bounds the PLD one from above. PLD stays the default everywhere.

`calibration = "paper"` keeps each paper's formulas (`desim.models.privacy.calibration`);
`calibration = "tight"` asks for the least noise per the accountant. `psum_noise` gives both
for the p-sum mechanisms of Private-ColME; any other family calibrates a Gaussian or Laplace
mechanism of known sensitivity and release count with `tight_sigma` (a pure, cached function).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from desim.models.privacy.calibration import (
    mechanism_budget,
    noise_sigma2,
    pm2_levels,
    variance_sigma2,
)

if TYPE_CHECKING:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant


def _dp() -> Any:
    """dp_accounting, imported on first use: it loads scipy.signal and friends (about a second),
    which a run that never accounts privacy should not pay."""
    import dp_accounting
    import dp_accounting.pld.pld_privacy_accountant  # noqa: F401  (_accountant)
    import dp_accounting.pld.privacy_loss_distribution  # noqa: F401  (rr_epsilon)
    import dp_accounting.rdp.rdp_privacy_accountant  # noqa: F401  (rdp_epsilon)

    return dp_accounting


Calibration = Literal["paper", "tight"]
CALIBRATIONS: tuple[str, ...] = ("paper", "tight")
#: The accountants: privacy loss distributions (the default) and Rényi DP (a cross-check).
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
#: Width of the PLD's privacy-loss grid: the accountant's ε is an upper bound within about this.
PLD_INTERVAL = 1e-4
#: Above this ε a Gaussian is calibrated by dp-accounting's exact closed form alone (the PLD of
#: so small a noise would need an enormous grid; it would agree to within the grid anyway).
PLD_MAX_EPSILON = 10.0
#: Relative precision of the bisection on the noise multiplier.
REL_TOL = 1e-9


def check_calibration(calibration: str) -> None:
    """ValueError unless `calibration` is "paper" or "tight"."""
    if calibration not in CALIBRATIONS:
        raise ValueError(f"calibration = {calibration!r}: must be one of {', '.join(CALIBRATIONS)}")


def check_accountant(accountant: str) -> None:
    """ValueError unless `accountant` is "pld" or "rdp"."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant = {accountant!r}: must be one of {', '.join(ACCOUNTANTS)}")


def _check_noise(noise: str) -> None:
    if noise not in ("gaussian", "laplace"):
        raise ValueError(f"noise = {noise!r}: the accountant knows gaussian and laplace")


def _event(noise: str, multiplier: float, count: int) -> dp_accounting.DpEvent:
    """The dp-accounting event of `count` releases of one sample with noise multiplier m."""
    if noise == "gaussian":
        one: dp_accounting.DpEvent = _dp().GaussianDpEvent(multiplier)
    else:
        one = _dp().LaplaceDpEvent(multiplier)
    return one if count == 1 else _dp().SelfComposedDpEvent(one, int(count))


def _accountant(interval: float = PLD_INTERVAL) -> pld_privacy_accountant.PLDAccountant:
    return _dp().pld.pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)


def pld_epsilon(
    noise: str, multiplier: float, count: int, delta: float, interval: float = PLD_INTERVAL
) -> float:
    """ε at δ of `count` compositions of the mechanism, per the PLD accountant (no cache)."""
    _check_noise(noise)
    if count == 0:
        return 0.0
    return float(_accountant(interval).compose(_event(noise, multiplier, count)).get_epsilon(delta))


def rdp_epsilon(noise: str, multiplier: float, count: int, delta: float) -> float:
    """ε at δ of `count` compositions of the mechanism, per the RDP accountant (no cache): its
    default orders, the Gaussian's and Laplace's exact Rényi divergences, and dp-accounting's
    conversion to (ε, δ). ``rr``: binary randomised response of ε₀ = `multiplier` (replace-one
    neighbours, as the PLD of `rr_epsilon`)."""
    if count == 0:
        return 0.0
    if noise == "rr":
        dp = _dp()
        acc = dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.REPLACE_ONE)
        one = dp.RandomizedResponseDpEvent(2.0 / (math.exp(multiplier) + 1.0), 2)
        event = one if count == 1 else dp.SelfComposedDpEvent(one, int(count))
        return float(acc.compose(event).get_epsilon(delta))
    _check_noise(noise)
    acc = _dp().rdp.RdpAccountant()
    return float(acc.compose(_event(noise, multiplier, count)).get_epsilon(delta))


@lru_cache(maxsize=4096)
def gaussian_sigma(epsilon: float, delta: float) -> float:
    """σ*: the least noise multiplier of one Gaussian release that is (ε, δ)-DP, by the analytic
    Gaussian mechanism's closed form (Balle & Wang; dp-accounting's `get_sigma_gaussian`)."""
    return float(_dp().get_sigma_gaussian(epsilon, delta))


def _tight_rdp(noise: str, epsilon: float, delta: float, count: int) -> float:
    """`tight_multiplier` per the RDP accountant: a bracket grown from the PLD-free first guess
    (the exact Gaussian, or basic composition for Laplace), Brent's bisection, a nudge up."""
    if noise == "gaussian":
        hi = gaussian_sigma(epsilon, delta) * math.sqrt(count)
    else:
        hi = count / epsilon
    while rdp_epsilon(noise, hi, count, delta) > epsilon:  # RDP needs more than the exact noise
        hi *= 2.0
    lo = hi / 2.0
    while rdp_epsilon(noise, lo, count, delta) <= epsilon:
        hi, lo = lo, lo / 2.0
    m = float(
        _dp().calibrate_dp_mechanism(
            _dp().rdp.RdpAccountant,
            lambda x: _event(noise, x, count),
            epsilon,
            delta,
            _dp().ExplicitBracketInterval(lo, hi),
            tol=hi * REL_TOL,
        )
    )
    step = REL_TOL
    while rdp_epsilon(noise, m, count, delta) > epsilon:
        m *= 1.0 + step
        step *= 2.0
    return m


@cache
def tight_multiplier(
    noise: str, epsilon: float, delta: float, count: int = 1, accountant: str = "pld"
) -> float:
    """Least noise multiplier m for which `count` compositions are (ε, δ)-DP (PLD accountant,
    or RDP with `accountant` = "rdp").

    Brent's bisection on the accountant (`dp_accounting.calibrate_dp_mechanism`), then the
    result is nudged up until the accountant confirms (ε, δ), so the returned m is valid and
    within a relative 10⁻⁹ of the least valid one (on the accountant's grid). A Gaussian with
    ε > 10 (PriCER's "trusted" pairs) takes dp-accounting's exact closed form of the analytic
    Gaussian mechanism with √count times the sensitivity. Cached.
    """
    _check_noise(noise)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon = {epsilon!r}: must be a finite number > 0")
    if not 0 < delta < 1:
        raise ValueError(f"delta = {delta!r}: must lie in (0, 1)")
    if int(count) != count or count < 1:
        raise ValueError(f"count = {count!r}: must be an integer ≥ 1")
    count = int(count)
    check_accountant(accountant)
    if accountant == "rdp":
        return _tight_rdp(noise, epsilon, delta, count)
    # bracket the root: a multiplier that is certainly enough (the exact Gaussian value, which
    # the accountant's pessimistic grid needs a hair more than; basic composition for Laplace),
    # halved until it is not
    if noise == "gaussian":
        exact = gaussian_sigma(epsilon, delta) * math.sqrt(count)
        if epsilon > PLD_MAX_EPSILON:  # the PLD grid would be huge; the closed form is exact
            return exact
        hi = 1.01 * exact
    else:
        hi = count / epsilon
    lo = hi / 2.0
    while pld_epsilon(noise, lo, count, delta) <= epsilon:
        hi, lo = lo, lo / 2.0
    m = _dp().calibrate_dp_mechanism(
        _accountant,
        lambda x: _event(noise, x, count),
        epsilon,
        delta,
        _dp().ExplicitBracketInterval(lo, hi),
        tol=hi * REL_TOL,
    )
    m = float(m)
    step = REL_TOL
    while pld_epsilon(noise, m, count, delta) > epsilon:  # Brent may stop just below the root
        m *= 1.0 + step
        step *= 2.0
    return m


def tight_sigma(
    noise: str,
    sensitivity: float,
    epsilon: float,
    delta: float,
    count: int = 1,
    accountant: str = "pld",
) -> float:
    """Noise std (Gaussian) or Laplace scale b for `count` releases of sensitivity Δ to be
    (ε, δ)-DP together: Δ · `tight_multiplier`. The calibration API for any family."""
    if not (sensitivity >= 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity = {sensitivity!r}: must be a finite number ≥ 0")
    m = tight_multiplier(noise, float(epsilon), float(delta), int(count), accountant)
    return sensitivity * m


def noise_variance(noise: str, scale: float) -> float:
    """Variance of the noise whose std (Gaussian) or scale b (Laplace: 2b²) is `scale`."""
    return scale**2 if noise == "gaussian" else 2.0 * scale**2


def psum_releases(mechanism: str, t_max: int) -> int:
    """Releases to one querier that contain a given sample, at most: 1 for PM-I; one node per
    level of the binary tree, ⌊log₂ t_max⌋+1, for PM-II."""
    return 1 if mechanism == "pm1" else pm2_levels(t_max)


def psum_noise(
    noise: str,
    L: float,
    mechanism: str,
    epsilon: float,
    delta: float,
    t_max: int,
    calibration: str = "paper",
    variance_release: bool = False,
    accountant: str = "pld",
) -> tuple[float, float]:
    """(σ_DP², σ_{2,DP}²): the noise variances of Private-ColME's p-sums (and of Sch-Var-1's
    variance p-sums, 0 without `variance_release`) for an overall (ε, δ) against one querier.

    "paper": §VII's choices — PM-II's (ε, δ) divided by ⌊log₂ t_max⌋+1, Sch-Var-1's split in
    half between mean and variance, Lemmas 1–3 per p-sum. "tight": the least noise for which
    the releases one querier gets of a sample — one p-sum (PM-I) or ⌊log₂ t_max⌋+1 tree nodes
    (PM-II), each with its variance p-sum under Sch-Var-1 — are (ε, δ)-DP together per the
    PLD accountant (or `accountant`). Sch-Var-1 keeps the paper's equal noise multipliers
    (σ_DP/2L = σ_{2,DP}/4L², which the equal split gives), now composed instead of split.
    """
    check_calibration(calibration)
    if calibration == "paper":
        share = 2.0 if variance_release else 1.0  # the mean release's budget share
        eps, dlt = mechanism_budget(mechanism, epsilon / share, delta / share, t_max)
        s2 = noise_sigma2(noise, L, eps, dlt)
        return s2, variance_sigma2(L, eps, dlt, noise) if variance_release else 0.0
    mechanism_budget(mechanism, epsilon, delta, t_max)  # validates mechanism and t_max
    if noise == "none":
        return 0.0, 0.0
    count = psum_releases(mechanism, t_max) * (2 if variance_release else 1)
    m = tight_multiplier(noise, float(epsilon), float(delta), count, accountant)
    s2 = noise_variance(noise, 2.0 * L * m)
    return s2, noise_variance(noise, 4.0 * L**2 * m) if variance_release else 0.0


def psum_multiplier(noise: str, sigma2: float, L: float) -> float:
    """Noise multiplier of a p-sum release with noise variance σ² and sensitivity 2L."""
    scale = math.sqrt(sigma2) if noise == "gaussian" else math.sqrt(sigma2 / 2.0)
    return scale / (2.0 * L)


# -- the ledger ---------------------------------------------------------------------------------


@lru_cache(maxsize=100_000)
def epsilon_spent(
    noise: str, multiplier: float, count: int, delta: float, accountant: str = "pld"
) -> float:
    """ε at δ spent by `count` releases of one sample with noise multiplier m (0 if none).

    Gaussian: k releases are exactly one with multiplier m/√k, whose ε dp-accounting computes
    in closed form (Balle & Wang's formula). Laplace: the PLD accountant (an upper bound), on a
    grid whose width grows with √k up to 10⁻³. With `accountant` = "rdp": the RDP accountant
    for every mechanism (`rdp_epsilon`).
    """
    if accountant != "pld":
        check_accountant(accountant)
        if multiplier == 0 and count:
            return math.inf
        return rdp_epsilon(noise, float(multiplier), int(count), float(delta))
    if noise == "rr":  # binary randomised response, `multiplier` = its ε₀ per release
        return rr_epsilon(float(multiplier), int(count), float(delta))
    _check_noise(noise)
    if count == 0:
        return 0.0
    if multiplier == 0:
        return math.inf
    if noise == "gaussian":
        return float(_dp().get_epsilon_gaussian(multiplier / math.sqrt(count), delta))
    # a grid growing like √k keeps the cost of long compositions down; measured against a
    # 5× finer grid, ε stays within a relative 10⁻³ (k = 1…1600, m = 1 and 14.6)
    interval = min(1e-3, PLD_INTERVAL * max(1.0, math.sqrt(count)))
    return pld_epsilon(noise, multiplier, count, delta, interval)


@lru_cache(maxsize=4096)
def rr_epsilon(epsilon0: float, count: int, delta: float) -> float:
    """ε at δ spent by `count` binary randomised responses of ε₀ each about one input.

    The PLD of randomised response (dp-accounting's ``from_randomized_response`` with two
    buckets and noise parameter 2/(e^ε₀ + 1), so that the true answer comes out with probability
    e^ε₀/(e^ε₀ + 1)), composed `count` times; never more than basic composition, count·ε₀.
    """
    if count == 0:
        return 0.0
    pld = _dp().pld.privacy_loss_distribution.from_randomized_response(
        noise_parameter=2.0 / (math.exp(epsilon0) + 1.0), num_buckets=2
    )
    if count > 1:
        pld = pld.self_compose(count)
    return min(float(pld.get_epsilon_for_delta(delta)), count * epsilon0)


@dataclass(frozen=True)
class Spend:
    """What a protocol's agents released so far, as the `privacy` ledger needs it.

    `against[name]` = (m, k) for a recipient set `name` (e.g. "one": the most informed single
    recipient, "all": every recipient colluding): for every agent, k releases containing its
    most exposed sample reached that set, each with noise multiplier m (a scalar, or one per
    agent; several Gaussian releases of different multipliers are given as one, of multiplier
    (Σ 1/m_i²)^(-1/2), which they compose to exactly). `accountant` turns the releases into ε
    ("pld", the default, or "rdp").
    """

    noise: str
    delta: float
    against: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    accountant: str = "pld"

    def epsilons(self) -> dict[str, np.ndarray]:
        """ε at δ spent by every agent against each recipient set."""
        out = {}
        for name, (multiplier, count) in self.against.items():
            count = np.asarray(count, dtype=np.int64)
            mult = np.broadcast_to(np.asarray(multiplier, dtype=float), count.shape)
            keys, inverse = np.unique(np.stack([mult, count]), axis=1, return_inverse=True)
            eps = np.array(
                [
                    epsilon_spent(self.noise, float(m), int(k), self.delta, self.accountant)
                    for m, k in keys.T
                ]
            )
            out[name] = eps[inverse.ravel()]
        return out


def ledger(spend: Spend | None, per_agent: bool = False, prefix: str = "eps_") -> dict[str, Any]:
    """Mean and maximum over agents of the ε spent against each recipient set
    (``eps_<who>_mean``, ``eps_<who>_max``), and with `per_agent` every agent's ε as an array
    (``eps_<who>``: what the recorder keeps in agents.parquet)."""
    if spend is None:
        return {}
    out: dict[str, Any] = {}
    for name, eps in spend.epsilons().items():
        out[f"{prefix}{name}_mean"] = float(eps.mean())
        out[f"{prefix}{name}_max"] = float(eps.max())
        if per_agent:
            out[f"{prefix}{name}"] = eps
    return out
