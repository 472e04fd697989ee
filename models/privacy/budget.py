"""Per-agent privacy budgets: an agent whose next release would take its ε past its budget
does not make it (``action = "stop"``), or makes it and every later one with more noise
(``action = "degrade"``).

A study gives a private protocol ``budget = {epsilon = …, delta = …, against = "one" |
"colluding", action = "stop"}``: every agent may spend at most (ε, δ) against the recipient set
named — the most informed single recipient ("one"), or all recipients colluding
("colluding", the ledger's ``all``). The `privacy` ledger's accountant decides: the spend of k
releases of the most exposed sample at the run's noise multiplier m is ε(m, k) at δ
(`desim.models.privacy.accounting.epsilon_spent`), increasing in k, so the budget is one
number per run, the capacity k* = max{k : ε(m, k) ≤ ε_budget}, found once by bisection on the
accountant (`capacity`). Each release then costs an integer comparison: it is made iff the
count of releases holding the agent's most exposed sample stays ≤ k* (`StopGate.admit`). The
ledger counts the same releases, so an agent's ε never exceeds its budget, and an agent that
withheld a release had no room for it.

``degrade`` (Gaussian noise): the agent whose count would pass k* makes that release and every
later one with the multiplier m' for which its whole horizon fits the budget exactly: k* releases
at m and r more at m' compose to one Gaussian release of multiplier (k*/m² + r/m'²)^(−1/2), so
m' = √(r / (1/m_B² − k*/m²)), where m_B is the least multiplier one release within the budget
needs and r the releases of the most exposed sample the horizon still allows
(`degraded_multiplier`, once per run, at the first refusal). Every release carries its noise
variance (public arithmetic), so the receiver weighs the noisier ones for what they are.

On Private-ColME ``degrade`` is per pair: pair b → a degrades from the first of its releases
the gate refuses, j_d, and stays degraded (against ``one``: j_d = 2^k* under PM-II, 1 under
PM-I with k* = 0; against ``colluding``: the releases that would add a p-sum of b's first sample
past k*, and every later release of those pairs). A pair's releases at m are thus a prefix
1 … j_d − 1, so any later sample lies in no more p-sums at m than the first (which the gate
counts, ≤ k*) and in no more p-sums in all: a ≤ k* at m and d ≤ `most` − a at m' compose to at
most k*/m² + (`most` − k*)/m'², the budget. The querier's Var[T] weighs each p-sum by the
variance it was drawn with (`desim.models.colme.statistic.PairStatistic`), and the ledger splits
each first-sample count into those before and from j_d (`split_degraded`). It is refused with
Laplace noise (releases of two Laplace scales compose to no one Laplace release, which k*, m'
and the ledger assume) and with estimated variances (Sch-Var-1's release and Sch-Var-2's
estimate subtract a bias that assumes one σ_DP² for every p-sum): `check_degrade`.

The budget's δ is the ledger's: the `privacy` metric reports ε at the budget's δ when a run has
a budget (its default is the protocol's δ, which the ledger reports otherwise), so the ledger
answers the question the budget asks.

The same budget table serves every private protocol (`set_budget`): Private-ColME (``stop``,
``degrade``), the empirical-Bayes uploads (`desim.models.eb.server`), Private-C-ColME
(`SampleGate`) and PriCER (`desim.models.pricer.protocol`: ``stop`` against its own recipient
sets, "neighbour" or "server", given to `set_budget` as `recipients`; one count of rounds per
node).

The `budget` metric records at every checkpoint the fraction of agents that have hit their
budget (``budget_exhausted``: withheld a release, or degraded one) and the releases withheld so
far (``budget_withheld``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from desim.kernel.registry import METRICS, applies_to, records
from desim.models.privacy.accounting import epsilon_spent, gaussian_sigma, tight_multiplier

#: The budget's recipient sets, as the ledger names them.
AGAINST: dict[str, str] = {"one": "one", "colluding": "all"}
#: What an agent does when its next release would exceed its budget.
ACTIONS: tuple[str, ...] = ("stop", "degrade")
_KEYS = ("epsilon", "delta", "against", "action")


@dataclass(frozen=True)
class Budget:
    """A per-agent privacy budget (ε, δ) against a recipient set, and the action at its end."""

    epsilon: float
    delta: float
    against: str = "one"
    action: str = "stop"

    @classmethod
    def from_table(
        cls,
        table: Any,
        default_delta: float,
        actions: tuple[str, ...] = ("stop",),
        recipients: tuple[str, ...] = tuple(AGAINST),
    ) -> Budget:
        """The budget of a study's ``budget = {…}`` table (δ defaults to the protocol's; the
        protocol allows `actions` and the recipient sets `recipients`, the first the default);
        ValueError with one line naming the key, its value and what is allowed."""
        if not isinstance(table, dict):
            raise ValueError(f"budget = {table!r}: must be a table {{epsilon = …, …}}")
        for key in table:
            if key not in _KEYS:
                raise ValueError(f"budget.{key}: unknown key; allowed: {', '.join(_KEYS)}")
        eps = table.get("epsilon")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < math.inf:
            raise ValueError(f"budget.epsilon = {eps!r}: must be a finite number > 0")
        delta = table.get("delta", default_delta)
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0 < delta < 1:
            raise ValueError(f"budget.delta = {delta!r}: must lie in (0, 1)")
        against = table.get("against", recipients[0])
        if against not in recipients:
            raise ValueError(
                f"budget.against = {against!r}: must be one of {', '.join(recipients)}"
            )
        action = table.get("action", "stop")
        if action not in actions:
            raise ValueError(f"budget.action = {action!r}: must be one of {', '.join(actions)}")
        return cls(float(eps), float(delta), against, action)


def set_budget(
    params: Any,
    default_delta: float,
    actions: tuple[str, ...] = ACTIONS,
    recipients: tuple[str, ...] = tuple(AGAINST),
) -> None:
    """Check a frozen Params' ``budget`` table and keep it as a (hashable) `Budget`, in place
    (ValueError, one line, when it is malformed, its action is not among `actions` or its
    recipient set not among `recipients`)."""
    if params.budget is not None and not isinstance(params.budget, Budget):
        budget = Budget.from_table(params.budget, default_delta, actions, recipients)
        object.__setattr__(params, "budget", budget)


@lru_cache(maxsize=1024)
def degraded_multiplier(
    multiplier: float,
    k_star: int,
    remaining: int,
    epsilon: float,
    delta: float,
    accountant: str = "pld",
) -> float:
    """m', the Gaussian multiplier of the `remaining` releases after k* at m for which all of
    them compose to ε ≤ `epsilon` at δ, exactly at the budget (+∞: no room left). The identity
    holds for both accountants: RDP adds the Gaussians' α/(2m²) exactly as PLD does."""
    if remaining <= 0:
        return math.inf
    fits = _multiplier_fits(epsilon, delta, accountant)
    hi = 1.0
    while not fits(hi):
        hi *= 2.0
    lo = hi / 2.0
    while fits(lo):
        hi, lo = lo, lo / 2.0
    for _ in range(200):  # bisection to a relative 10⁻¹² on m_B (fits(hi), not fits(lo))
        if hi - lo <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    room = 1.0 / hi**2 - (k_star / multiplier**2 if k_star else 0.0)
    return math.sqrt(remaining / room) if room > 0 else math.inf


#: Relative width of the bracket around σ* inside which `_multiplier_fits` asks the ledger.
SIGMA_BRACKET = 1e-6


def _multiplier_fits(epsilon: float, delta: float, accountant: str) -> Callable[[float], bool]:
    """Whether one Gaussian release of multiplier x spends ≤ `epsilon` at δ per the ledger,
    as a function of x. Under PLD the ledger's boundary is σ* (`gaussian_sigma`, the same
    closed form): once the ledger confirms that σ*(1 + w) fits and σ*(1 − w) does not, every x
    outside that bracket is decided without it (the ledger's ε falls as x grows), so a search
    asks the ledger only near σ* and gets the very answers it would get asking every time."""

    def ledger(x: float) -> bool:
        return epsilon_spent("gaussian", x, 1, delta, accountant) <= epsilon

    if accountant != "pld":
        return ledger
    sigma = gaussian_sigma(epsilon, delta)
    low, high = sigma * (1 - SIGMA_BRACKET), sigma * (1 + SIGMA_BRACKET)
    if not ledger(high) or ledger(low):
        return ledger

    def fits(x: float) -> bool:
        return x >= high or (x > low and ledger(x))

    return fits


def degraded_spend(
    multiplier: float, count: np.ndarray, k_star: int, degraded: float
) -> tuple[np.ndarray, np.ndarray]:
    """(multipliers, counts) for the ledger's `Spend` of agents whose most exposed sample is in
    `count` Gaussian releases, the first k* at m and the rest at m' = `degraded`: those past k*
    as one release of (k*/m² + (count − k*)/m'²)^(−1/2), which they compose to exactly."""
    count = np.asarray(count, dtype=np.int64)
    past = count > k_star
    mult = np.full(count.shape, float(multiplier))
    if past.any():
        inv = (k_star / multiplier**2 if k_star else 0.0) + (count[past] - k_star) / degraded**2
        mult[past] = 1.0 / np.sqrt(inv)
    return mult, np.where(past, 1, count)


def check_degrade(noise: str, variance: str) -> None:
    """Refuse Private-ColME's ``degrade`` where it is not exact (ValueError, one line): with
    Laplace noise, or with data variances estimated (Sch-Var-1, Sch-Var-2)."""
    if noise != "gaussian":
        raise ValueError(
            f"budget.action = 'degrade': needs noise = 'gaussian' (noise = {noise!r}: Laplace "
            "releases of two scales do not compose to one, as k* and m' assume); use 'stop'"
        )
    if variance != "known":
        raise ValueError(
            f"budget.action = 'degrade': needs variance = 'known' (variance = {variance!r} "
            "corrects a bias that assumes one σ_DP² per p-sum); use 'stop'"
        )


def split_degraded(
    mechanism: str, kappa: np.ndarray, degraded_from: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(early, late): the p-sums holding a responder's first sample after κ releases to one
    recipient (`first_sample_psums`) made by releases before j_d = `degraded_from` (at m) and
    from it on (at m'); the node of level s is made by release 2^s, PM-I's p-sum by release 1."""
    early = first_sample_psums(mechanism, np.minimum(kappa, degraded_from - 1))
    return early, first_sample_psums(mechanism, kappa) - early


def capacity(
    noise: str,
    multiplier: float,
    epsilon: float,
    delta: float,
    cap: int,
    accountant: str = "pld",
) -> int:
    """k* = the most releases of one sample at noise multiplier m whose ε at δ, per the ledger's
    accountant, stays ≤ `epsilon` (0 if one release is too many), searched up to `cap`."""

    def fits(k: int) -> bool:
        return epsilon_spent(noise, float(multiplier), int(k), float(delta), accountant) <= epsilon

    if cap <= 0 or not fits(1):
        return 0
    if noise == "gaussian" and accountant == "pld":
        return _gaussian_capacity(float(multiplier), float(epsilon), float(delta), cap, fits)
    lo, hi = 1, 2  # fits(lo); grow hi until it does not fit or passes cap
    while hi <= cap and fits(hi):
        lo, hi = hi, 2 * hi
    if hi > cap:
        if fits(cap):
            return cap
        hi = cap
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _gaussian_capacity(
    multiplier: float, epsilon: float, delta: float, cap: int, fits: Callable[[int], bool]
) -> int:
    """`capacity` for Gaussian noise under the PLD ledger, which takes k releases as exactly one
    of multiplier m/√k (`epsilon_spent`): k* = ⌊(m/σ*)²⌋ for σ* the least multiplier with
    (ε, δ), then stepped to the ledger's own boundary (both calibrations are searches with a
    tolerance), so the answer is the bisection's in two or three ledger calls, not twelve."""
    sigma = gaussian_sigma(epsilon, delta)
    k = max(1, min(cap, math.floor((multiplier / sigma) ** 2)))
    while k > 1 and not fits(k):
        k -= 1
    while k < cap and fits(k + 1):
        k += 1
    return k


def first_sample_psums(mechanism: str, kappa: np.ndarray) -> np.ndarray:
    """P-sums holding a responder's first (most exposed) sample after κ releases to one
    recipient: 1 once it released at all (PM-I), one tree node per level ⌊log₂ κ⌋+1 (PM-II),
    κ for user-level uploads (``gaussian``, ``rr``: each holds the agent's whole data)."""
    kappa = np.asarray(kappa)
    if mechanism in ("gaussian", "rr"):  # user-level uploads: every one holds every sample
        return kappa.astype(np.int64)
    if mechanism == "pm1":
        return (kappa > 0).astype(np.int64)
    return np.frexp(kappa)[1].astype(np.int64)  # the bit length of every κ ≥ 0


class StopGate:
    """Admits a release only if the agent's count stays within k*; the others are withheld
    (``action = "stop"``) or made noisier by the protocol (``degrade``), and their time kept.

    `per_release` p-sums go out with each release (2 under Sch-Var-1: mean and variance).
    `exposure[b]` is the count the ledger gives agent b against the budget's recipient set:
    the most p-sums holding its first sample that one recipient got ("one"), or their sum over
    recipients ("colluding"). `kappa_max` (the most releases to one recipient, if known) sizes
    the tables `quiet` reads.
    """

    def __init__(
        self,
        budget: Budget,
        mechanism: str,
        per_release: int,
        n_agents: int,
        k_star: int,
        kappa_max: int = 0,
    ) -> None:
        self.budget = budget
        self.mechanism = mechanism
        self.per_release = per_release
        #: k*, the budget as a count of releases of the most exposed sample.
        self.capacity = k_star
        self.exposure = np.zeros(n_agents, dtype=np.int64)
        #: Releases each agent withheld, and the time of its first (+∞: none).
        self.withheld = np.zeros(n_agents, dtype=np.int64)
        self.hit_at = np.full(n_agents, math.inf)
        self._after = np.zeros(0, dtype=np.int64)
        self._grows = np.zeros(0, dtype=bool)
        if kappa_max:  # tables by κ up to the most releases to one recipient, for `quiet`
            self._tables(np.array([kappa_max]))

    def quiet(self, b: np.ndarray, kappa: np.ndarray, before: np.ndarray | None = None) -> bool:
        """Whether `admit` would admit every one of the next releases of agents b (κ releases
        so far each) and change nothing: none adds to its agent's count (against colluding:
        none completes a new p-sum of the first sample; against one: none passes the agent's
        count). Most releases do not, and this costs a look-up, not the whole gate."""
        try:
            if self.budget.against == "one":
                after = self._after.take(kappa)
                if before is not None:
                    after += before
                return bool((after <= self.exposure.take(b)).all())
            return not self._grows.take(kappa).any()
        except IndexError:  # the tables do not reach this κ yet: the gate decides
            return False

    def admit(
        self, b: np.ndarray, kappa: np.ndarray, now: Any, before: np.ndarray | None = None
    ) -> np.ndarray:
        """Which of the next releases of agents b (to distinct recipients, each with κ releases
        so far) fit the budget, in order; counts them, and records the others at time `now`.
        `before` (against one): the p-sums holding the first sample each recipient got from
        earlier incarnations of its link (a link dropped and made again; None: none)."""
        after, grows = self._tables(kappa)
        if self.budget.against == "one":
            after = after.take(kappa)
            if before is not None:
                after += before
            ok = after <= self.capacity
            # the count grows only at a recipient's first release (PM-I) or a power of two
            grows = ok & (after > self.exposure[b])
            if grows.any():
                np.maximum.at(self.exposure, b[grows], after[grows])
        else:
            ok = self._admit_colluding(b, grows.take(kappa))
        if not ok.all():
            refused = b[~ok]
            if self.budget.action == "stop":  # (degrade: the release is made, noisier)
                self.withheld += np.bincount(refused, minlength=len(self.withheld))
            when = np.broadcast_to(np.asarray(now, dtype=float), b.shape)[~ok]
            # only refusals earlier than an agent's recorded hit change it (after its first
            # refusal, none): the minimum over few entries, not over every refused release
            earlier = when < self.hit_at[refused]
            if earlier.any():
                np.minimum.at(self.hit_at, refused[earlier], when[earlier])
        return ok

    def withhold(self, b: np.ndarray) -> None:
        """Count releases of agents b withheld again (a query repeating one this gate refused
        in the same slot, with the same count: the decision cannot change)."""
        if len(b):
            self.withheld += np.bincount(b, minlength=len(self.withheld))

    def _tables(self, kappa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """By κ, at least up to max(κ): the p-sums holding the first sample after κ + 1
        releases to one recipient, and whether that is more than after κ (a look-up is cheaper
        than computing them at every release)."""
        top = int(kappa.max(initial=0)) + 1
        if top >= len(self._after):
            psums = first_sample_psums(self.mechanism, np.arange(2 * top + 3)) * self.per_release
            self._after, self._grows = psums[1:], psums[1:] > psums[:-1]
        return self._after, self._grows

    def _admit_colluding(self, b: np.ndarray, grows: np.ndarray) -> np.ndarray:
        """`admit` against all recipients colluding: a release that `grows` the count adds
        `per_release` p-sums holding the agent's first sample (one more recipient's, or one
        more tree level's), so the r-th such release of an agent in this call fits iff its
        count plus r·`per_release` stays within k*."""
        ok = np.ones(len(b), dtype=bool)
        if not grows.any():  # (most calls: counts grow at powers of two only)
            return ok
        bg = b[grows]
        # under RR each agent answers one querier per slot: no agent twice, every rank 1
        rank = 1 if np.bincount(bg).max() == 1 else _rank_in_group(bg)
        fits = self.exposure[bg] + rank * self.per_release <= self.capacity
        ok[grows] = fits
        np.add.at(self.exposure, bg[fits], self.per_release)
        return ok


#: δ at which the ledger reports the pure-ε Laplace noise of every sample (`SampleGate`).
SAMPLE_DELTA = 1e-12


class SampleGate:
    """The budget of a protocol that noises every sample once, with Laplace noise of scale b,
    and shares only what it computes from the noised samples (Private-C-ColME).

    Every sample is then one release of multiplier b/2L whatever is sent later, so k* is 0 or 1:
    with k* = 1 the budget never binds; with k* = 0 no sample fits, and from its first slot an
    agent shares nothing (``stop``: neighbours never hear from it, as if its links were down)
    or noises its samples with the least Laplace scale that fits the budget (``degrade``: one
    scale for every agent and slot, so the protocol's tests and weights stay exact).
    """

    def __init__(
        self, budget: Budget, L: float, scale: float, n_agents: int, accountant: str = "pld"
    ) -> None:
        self.budget = budget
        eps, delta = budget.epsilon, budget.delta
        #: k*, the budget as a count of releases of one sample (0 or 1).
        self.capacity = capacity("laplace", scale / (2.0 * L), eps, delta, 1, accountant)
        #: The Laplace scale of every sample's noise under the budget.
        self.scale = scale
        if self.capacity == 0 and budget.action == "degrade":
            self.scale = 2.0 * L * tight_multiplier("laplace", eps, delta, 1, accountant)
        #: Whether the agents share nothing (``stop`` with no room for one sample).
        self.silent = self.capacity == 0 and budget.action == "stop"
        self.withheld = np.zeros(n_agents, dtype=np.int64)
        self.hit_at = np.full(n_agents, math.inf)

    def sample(self, t: float, senders: np.ndarray) -> None:
        """Slot t's samples of the agents `senders` (a mask): those past the budget hit it
        (from their first slot on: withheld under ``stop``)."""
        if self.capacity == 0:
            np.minimum(self.hit_at, np.where(senders, t, math.inf), out=self.hit_at)
            if self.silent:
                self.withheld += senders


def _rank_in_group(keys: np.ndarray) -> np.ndarray:
    """1, 2, … for the occurrences of each key, in order of appearance."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.r_[0, np.flatnonzero(sorted_keys[1:] != sorted_keys[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(keys)]))
    rank = np.empty(len(keys), dtype=np.int64)
    rank[order] = np.arange(len(keys)) - run_start + 1
    return rank


@METRICS.register("budget")
@records("budget_exhausted", "budget_withheld")
@applies_to("budget_gate")
def budget_use(protocol: Any, data: Any) -> dict[str, float]:
    """Per-agent budgets: ``budget_exhausted``, the fraction of agents that have hit their
    budget (withheld a release, or degraded one), and ``budget_withheld``, the releases withheld
    so far (nothing without a ``budget``)."""
    # the engine records a study's metrics for every scenario, budget hooks or not
    gate = protocol.budget_gate() if hasattr(protocol, "budget_gate") else None
    if gate is None:
        return {}
    return {
        "budget_exhausted": float(np.mean(np.isfinite(gate.hit_at))),
        "budget_withheld": float(gate.withheld.sum()),
    }
