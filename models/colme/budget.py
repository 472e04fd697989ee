"""A per-agent privacy budget on Private-ColME's releases (``budget = {…}``), as a strategy the
protocol holds when a study sets one: the gate that decides which release fits (``stop``: the
others are not made), and under ``degrade`` from which release each pair b → a adds the larger
noise m' that keeps the horizon within the budget (its j_d), with the ledger's view of them.

Why per pair and as a prefix: a pair degrades from the first of its releases the gate refuses
and stays degraded, so the releases a pair makes at the nominal multiplier m are a prefix of its
releases and no sample enters more first-sample p-sums at m than the gate counted
(`desim.models.privacy.budget`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from desim.kernel.protocol import Context
from desim.models.privacy.budget import (
    StopGate,
    capacity,
    degraded_multiplier,
    first_sample_psums,
    split_degraded,
)

#: j_d of a pair none of whose releases was degraded (above every j: j < 2³¹).
NEVER = np.iinfo(np.int32).max


class ReleaseBudget:
    """The budget of one run of Private-ColME: its `gate` (k* found once by the accountant, for
    counts up to the most this run can make) and, under ``degrade``, m' found at the gate's
    first refusal (a run whose budget is never hit does not pay for it)."""

    def __init__(self, protocol: Any, ctx: Context, kappa_max: int) -> None:
        p, m = protocol.params, ctx.n_agents
        self.protocol = protocol
        per_release = 2 if p.variance == "sch-var-1" else 1
        most = int(first_sample_psums(p.mechanism, np.array([kappa_max]))[0]) * per_release
        if p.budget.against == "colluding":  # every querier of the responder
            most *= m - 1 if protocol.graph is None else protocol.graph.max_degree()
        if protocol.graph is not None and ctx.public.get("graph_changes"):
            # a changing graph (``stop`` only, `budget_on_changing_graph`): new links bring new
            # queriers and links made again new trees, so the set-up degrees bound nothing;
            # each release adds at most `per_release` p-sums holding the first sample, and b
            # makes at most t_max·(M − 1) releases (one query a slot from each other agent):
            # a bound for either recipient set, so the gate decides every release
            most = per_release * ctx.t_max * (m - 1)
        budget = p.budget
        k_star = capacity(
            p.noise, protocol.multiplier, budget.epsilon, budget.delta, most, p.accountant
        )
        self._most = most
        #: Whether the budget can bind at all (k* < the most this run can count): when it
        #: cannot, no release consults the gate (its counts stay 0), so it costs nothing.
        self.binds = k_star < most
        #: Whether refused releases are made at m' (``degrade`` that can bind, until the first
        #: refusal finds that no m' fits: then ``stop``).
        self.degrading = budget.action == "degrade" and self.binds
        #: m'/m, the noise scale of a degraded release (None: nothing degraded yet).
        self.scale: float | None = None
        #: ρ = (m'/m)², a degraded p-sum's noise variance over σ_DP².
        self.ratio = 1.0
        #: m', the multiplier of every degraded release (∞: none).
        self.degraded_m = math.inf
        #: j_d of each pair (its index): from its release j_d on, its p-sums carry ρσ_DP²
        #: (None until the first refusal).
        self.degraded_from: np.ndarray | None = None
        #: Whether some release was degraded yet.
        self.any_degraded = False
        # pairs that can release (no self-pairs) not degraded yet: at 0 no call needs the gate
        self._undegraded = protocol.n_pairs - (m if protocol.graph is None else 0)
        #: The gate every release passes while the budget can bind.
        self.gate = StopGate(budget, p.mechanism, per_release, m, k_star, kappa_max)
        #: On a changing graph, the p-sums holding b's first sample that a got over earlier
        #: incarnations of the link of each pair (None: no link was made again yet).
        self.before: np.ndarray | None = None

    def follow(self, nb: Any, carry: Any, retired: Any) -> None:
        """The graph changed (`desim.models.colme.rewire.follow`, with its new neighbours
        `nb`, the pairs `carry`ied over and the `retired` releases of every dropped link):
        `before` over the new pairs, a new link's from the incarnations of its link retired so
        far (a ``stop`` budget; ``degrade`` is refused on a changing graph)."""
        p = self.protocol.params
        if p.budget.against != "one":  # (against colluding every new p-sum counts as made)
            return
        kept = carry(self.before, 0) if self.before is not None else carry.new * 0
        fresh = np.flatnonzero(carry.new)
        if len(retired.keys) and len(fresh):
            per = first_sample_psums(p.mechanism, retired.counts)
            keys, inverse = np.unique(retired.keys, return_inverse=True)
            total = np.bincount(inverse.ravel(), weights=per, minlength=len(keys))
            link = nb.dst[fresh] * retired.n + nb.src[fresh]  # b·M + a, as `retired` keys
            pos = np.minimum(np.searchsorted(keys, link), len(keys) - 1)
            found = keys[pos] == link
            kept[fresh[found]] = total[pos[found]].astype(np.int64) * self.gate.per_release
        self.before = kept.astype(np.int64) if kept.any() else None

    def _start_degrading(self, refused: np.ndarray) -> bool:
        """At the gate's first refusal (agents `refused`) under ``degrade``: m' for the
        `most` − k* releases past k*, and ρ into the statistic. False, and the gate switched to
        ``stop`` (these releases withheld), when k* releases at m already use the whole budget
        (no m' fits: the rest cannot be made at any noise)."""
        protocol = self.protocol
        p, budget, k_star = protocol.params, protocol.params.budget, self.gate.capacity
        m_prime = degraded_multiplier(
            protocol.multiplier,
            k_star,
            self._most - k_star,
            budget.epsilon,
            budget.delta,
            p.accountant,
        )
        if not math.isfinite(m_prime):
            self.degrading = False
            self.gate.budget = replace(budget, action="stop")
            self.gate.withhold(refused)
            return False
        self.degraded_m = m_prime
        self.scale = m_prime / protocol.multiplier
        self.ratio = self.scale**2
        protocol.stat.degraded_ratio = self.ratio
        self.degraded_from = np.full(protocol.n_pairs, NEVER, dtype=np.int32)
        return True

    def release(
        self, b: np.ndarray, a: np.ndarray, pair: np.ndarray, slot: np.ndarray
    ) -> np.ndarray:
        """The protocol's `release` under a budget that can bind: a release the gate does not
        admit is not made (``stop``: its row has j = 0, `withheld`, and the delivery sends
        nothing for it) or made with more noise (``degrade``)."""
        protocol = self.protocol
        if self.any_degraded and self._undegraded == 0:  # every release at m'
            return protocol._release(b, a, pair, slot, self.scale)
        made = protocol.made(b, a, pair)
        if self.any_degraded:
            return protocol._release(b, a, pair, slot, self._degrade(b, made, pair, slot))
        before = None if self.before is None else self.before.take(pair)
        if self.gate.quiet(b, made, before):  # (a budget not hit yet costs this look-up)
            return protocol._release(b, a, pair, slot)
        ok = self.gate.admit(b, made, protocol.view.clock(slot), before)
        if ok.all():
            return protocol._release(b, a, pair, slot)
        if self.degrading and (self.scale is not None or self._start_degrading(b[~ok])):
            return protocol._release(b, a, pair, slot, self._mark(ok, made, pair, None))
        payload = np.zeros((len(b), protocol.release_width))
        if ok.any():
            payload[ok] = protocol._release(b[ok], a[ok], pair[ok], slot[ok])
        return payload

    def _degrade(
        self, b: np.ndarray, made: np.ndarray, pair: np.ndarray, slot: np.ndarray
    ) -> float | np.ndarray | None:
        """The gate's decision on the releases b → pairs `pair` (`made` so far) under
        ``degrade`` once some release was degraded, as their noise scale (`_mark`).

        A pair stays degraded once it is (j ≥ j_d), and the gate's state cannot change with
        its releases: it refuses each that adds to the count (against one, the count passed
        k* and never falls; against colluding, the agent's first refusal left its count less
        than one release's p-sums below k*, and counts never fall) and the agent's hit time is
        already that of its first refusal. So a call whose every pair is degraded skips it.
        """
        degraded = made >= self.degraded_from.take(pair)
        if degraded.all():
            return self.scale
        ok = self.gate.admit(b, made, self.protocol.view.clock(slot))
        return self._mark(ok, made, pair, degraded)

    def _mark(
        self, ok: np.ndarray, made: np.ndarray, pair: np.ndarray, degraded: np.ndarray | None
    ) -> float | np.ndarray | None:
        """Set j_d of the pairs whose release the gate refused (`ok` false): from that release
        on; return the noise scale of the releases (`degraded`: the pairs degraded before):
        m'/m where every one is degraded (the same bits as an array of it), None where none
        is."""
        if not ok.all():
            refused = ~ok
            first = pair[refused]
            before = self.degraded_from[first]
            self._undegraded -= int(np.count_nonzero(before == NEVER))
            self.degraded_from[first] = np.minimum(before, made[refused] + 1)
            degraded = refused if degraded is None else degraded | refused
            self.any_degraded = True
        if degraded is None or not degraded.any():
            return None
        if degraded.all():
            return self.scale
        return np.where(degraded, self.scale, 1.0)

    def degraded_from_of(self, pair: np.ndarray) -> np.ndarray | int | None:
        """j_d of the pairs `pair` (None while no release was degraded: the old arithmetic;
        the scalar 1 when k* = 0, where the gate refuses every pair's first release, so every
        pair that released is degraded from release 1 and no per-pair look-up is needed)."""
        if not self.any_degraded:
            return None
        return 1 if self.gate.capacity == 0 else self.degraded_from.take(pair)

    def spend(self, per_responder: Any, one: np.ndarray, every: np.ndarray) -> dict[str, tuple]:
        """The ledger's (multipliers, counts) per recipient set: (m, `one`) and (m, `every`)
        while nothing was degraded; after, an agent with a degraded p-sum holding its first
        sample gives one Gaussian release of multiplier (k/m² + k'/m'²)^(−1/2) for k such
        p-sums at m and k' at m' (the most precise querier's for ``one``, their sum for
        ``all``), which they compose to exactly; the others keep (m, count).
        `per_responder(per_pair)` gives per responder the most of `per_pair(mechanism, κ)`
        over its queriers and their sum."""
        m = self.protocol.multiplier
        if not self.any_degraded:
            return {"one": (m, one), "all": (m, every)}
        m_prime, first = self.degraded_m, self.degraded_from
        if self.gate.capacity == 0:  # every p-sum at m': early = 0, so these are the same bits
            return _spend_degraded(m, m_prime, one, every)
        if self.protocol.graph is None:  # [a, b] → the mechanism's [b, a]
            first = first.reshape(self.protocol.mech.count.shape).T

        def precision(mechanism: str, kappa: np.ndarray) -> np.ndarray:
            early, late = split_degraded(mechanism, kappa, first)
            return early / m**2 + late / m_prime**2

        one_p = per_responder(precision)[0]
        # ``all`` from the integer sums: the same bits whatever order the queriers are summed in
        # (`every` is the sum of early + late: known variances, one p-sum per release)
        early = per_responder(lambda mech, kappa: split_degraded(mech, kappa, first)[0])[1]
        late = every - early
        every_p = early / m**2 + late / m_prime**2
        hit = late > 0
        with np.errstate(divide="ignore"):
            return {
                "one": (np.where(hit, 1 / np.sqrt(one_p), m), np.where(hit, 1, one)),
                "all": (np.where(hit, 1 / np.sqrt(every_p), m), np.where(hit, 1, every)),
            }


def _spend_degraded(
    m: float, m_prime: float, one: np.ndarray, every: np.ndarray
) -> dict[str, tuple]:
    """`ReleaseBudget.spend` when every release was made at m' (k* = 0): its precisions
    0/m² + late/m'² with late = the whole count, the most over queriers taken after the
    division (which keeps order), so the arithmetic is the general case's, bit for bit."""
    hit = every > 0
    with np.errstate(divide="ignore"):
        return {
            "one": (np.where(hit, 1 / np.sqrt(one / m_prime**2), m), np.where(hit, 1, one)),
            "all": (np.where(hit, 1 / np.sqrt(every / m_prime**2), m), np.where(hit, 1, every)),
        }


def budget_on_changing_graph(params: Any) -> None:
    """Refuse (ValueError, one line, saying why) the runs on a changing graph whose bounds
    assume the set-up graph: ``calibration = "tight-tree"`` and ``degrade``. ``stop`` is exact
    there: against colluding queriers the gate counts every new p-sum of the first sample as it
    is made, on a new link as on an old one, and against one querier it adds the p-sums of a
    link's earlier incarnations (`ReleaseBudget.before`), as the ledger does (it keeps the
    releases of dropped links)."""
    if params.calibration == "tight-tree":
        raise ValueError(
            "calibration = 'tight-tree': not on a changing graph (κ_max comes from the set-up "
            "degrees, and a link made again starts a new tree holding the first sample "
            "again); use 'paper' or 'tight'"
        )
    budget = params.budget
    if budget is None:
        return
    if budget.action == "degrade":
        raise ValueError(
            "budget.action = 'degrade': not on a changing graph (m' spreads the budget over "
            "the most p-sums the first sample can enter by t_max, which new links and links "
            "made again leave unbounded by the set-up graph); use 'stop'"
        )
