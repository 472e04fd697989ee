"""Private-ColME's dense round robin over ideal links: a slot's releases taken in one pass.

Where the pairs are numbered by RR position (`desim.models.colme.positions`) and every release
arrives at once, in order (ideal links), a pair's state is fixed by what RR and the mechanism
already hold:

- κ_{b→a}, the releases a took from b, is the mechanism's count of releases b made to a (every
  release made is taken in the same slot), so `RoundRobinStatistic` reads the mechanism's count
  instead of keeping its own;
- D of the last release, 1/t_κ, follows from κ and the pair's RR position o: its κ-th release
  was made in slot o + (κ − 1)(M − 1), when b had that many samples, so only the block sum T
  is stored (8 bytes per pair instead of 20).

A slot's releases are then taken by `DenseTake` in one pass over the run of pairs: the pair's
old terms in Lemma 4's sums (from κ − 1), the new T and Var[T], the z-test, the compensated
replacement of the terms (`CombinationSums`) and the revised beliefs — a compiled loop where
numba is installed (`desim.models.colme.dense_kernel`), else the same arithmetic in numpy. Both
give the bytes of `PrivateColME.take` on the same state. Where compiled, the slot's releases
are made in one pass too (the mechanism's count, noise total and R = (S_b + Z)/t, after the
same draws).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from desim.models.colme.delivery import Arrivals, Synchronous
from desim.models.colme.model import contribution
from desim.models.colme.pairs import ASKED, COUNT, INDEX, VALUE
from desim.models.colme.statistic import PairStatistic
from desim.models.privacy.calibration import sample_noise

if TYPE_CHECKING:
    from desim.models.colme.protocol import PrivateColME


def applies(protocol: Any) -> bool:
    """Whether a run takes the dense path: pairs numbered by RR position (ideal links, ``last``
    PM-I, known variances, …), incremental combination sums and the z-test (not the oracle)."""
    return (
        protocol.positions is not None
        and protocol.ctx.n_agents > protocol.incremental_above
        and not protocol.uses_oracle
    )


def statistic_class(protocol: Any) -> type[PairStatistic]:
    """The statistic of this run: `RoundRobinStatistic` on the dense path, else `PairStatistic`."""
    return RoundRobinStatistic if applies(protocol) else PairStatistic


def synchronous(protocol: PrivateColME) -> Synchronous:
    """The delivery over ideal links: `DenseSynchronous` on the dense path, else `Synchronous`."""
    return DenseSynchronous(protocol) if applies(protocol) else Synchronous(protocol)


class RoundRobinStatistic(PairStatistic):
    """``last`` PM-I T_{b→a} of pairs numbered by RR position: T stored, κ the mechanism's count,
    D = 1/t_κ from κ and the pair's position (see the module)."""

    def __init__(self, n_agents: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(n_agents, *args, **kwargs)  # (its per-pair arrays are never touched)
        self.total = np.zeros(n_agents * n_agents)  # T of every pair, by pair number

    def share_count(self, count: np.ndarray) -> None:
        """Read κ from the mechanism's count of releases (flat, by pair number): every release
        made is taken at once, so the two are equal after each slot."""
        self._kappa = count

    @property
    def counts(self) -> np.ndarray:
        """κ of every pair by pair number, as read (the mechanism's count, once shared)."""
        return self._kappa

    def data_of(self, pair: np.ndarray | slice, kappa: np.ndarray) -> np.ndarray:
        """D = 1/t_κ of the pairs (0 before their first release): their κ-th release was made in
        slot o + (κ − 1)(M − 1), o their RR position."""
        m = self.n_agents
        o = pair.start // m if isinstance(pair, slice) else pair // m
        slot = (kappa - 1) * (m - 1) + o
        return np.divide(1.0, slot, out=np.zeros(len(kappa)), where=kappa > 0)

    def pair_columns(
        self, pair: np.ndarray | slice
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """n, block sum, D and A of the flat pairs `pair` (`PairStatistic.pair_columns`)."""
        taken, total, data, noise = self.last_terms(pair)
        return taken.astype(float), total, data, noise

    def last_terms(
        self, pair: np.ndarray | slice
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Whether each pair has a release, T, D and A = κ·D·D (`PairStatistic.last_terms`)."""
        kappa = self._kappa[pair].astype(np.int64)
        data = self.data_of(pair, kappa)
        return kappa > 0, self.total[pair], data, kappa.astype(float) * data * data

    def _terms_last_pm1(
        self, pair: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """T, D, A and n of the pairs (`PairStatistic.terms`): T is 0 before a release."""
        n, total, data, noise = self.pair_columns(pair)
        return total.copy(), data, noise, n

    def last_pm1_columns(self, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Not kept here: this layout is the dense one, the columns are a graph's."""
        raise NotImplementedError("last_pm1_columns: a graph's statistic, not the dense one")

    def _update_last_pm1(
        self,
        pair: np.ndarray | slice,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        degraded_from: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """Take release j of each pair (`PairStatistic._update_last_pm1`'s floats): T is stored,
        κ is the mechanism's (already j) and D is t's inverse."""
        if degraded_from is not None:
            raise NotImplementedError("degraded releases: not on the dense path (no budget)")
        u = 1.0 / t
        total = values + 0.0
        self.total[pair] = total
        return total, u, j * u * u, 1.0


class DenseSynchronous(Synchronous):
    """Ideal links on the dense path: the releases of a slot are taken by `DenseTake`."""

    def __init__(self, protocol: PrivateColME) -> None:
        super().__init__(protocol)
        protocol.stat.share_count(protocol.mech.count.reshape(-1))
        self.taker = DenseTake(protocol)

    def answer(self, queries: Any) -> None:
        """Answer a slot's queries, as sent, with new releases made in one compiled pass (the
        mechanism's `PSumRelease.release` on the run: the same draws and floats); else as
        `Synchronous.answer` does."""
        p, kernel = self.p, self.taker.release_kernel
        b, a = queries.dst, queries.src
        asked_a, asked_b, run = self._run
        if kernel is None or a is not asked_a or b is not asked_b:
            super().answer(queries)
            return
        mech = p.mech
        fresh = sample_noise(mech.rng, mech.noise, mech.sigma2, len(b))
        payload = np.empty((len(b), p.release_width), order="F")
        t = p.view.clock(None)  # every agent has t samples (`OneSlot.counts_of`)
        payload[:, COUNT] = t
        # (the mechanism's totals by pair number: `PSumRelease` keeps them per pair b·M + a,
        # here the RR numbering's, as `PrivateColME._release` hands it over)
        kernel(
            run.start,
            len(b),
            mech.count.reshape(-1),
            mech._total_flat,
            fresh,
            p.sums,
            t,
            payload[:, VALUE],
            payload[:, INDEX],
        )
        payload[:, ASKED] = queries.sent_at
        self._answered = (payload, run)
        p.ctx.send("release", b, a, payload)

    def receive(self, releases: Any) -> None:
        """Take releases (one per pair, each j = κ + 1), a slot's run in one pass."""
        a = releases.dst
        sent, run = self._answered
        got = Arrivals(a, releases.src, releases.payload, self.p.view.slots(None, len(a)))
        if run is not None and releases.payload is sent:  # the answers sent last, as sent
            got.pair = run
        else:
            got.pair = self.p.positions.of(a, got.b)
        self.taker.take(got)


class DenseTake:
    """Take a slot's releases on the dense path: compiled where numba is, else numpy (the
    same bytes); chosen once."""

    def __init__(self, protocol: PrivateColME) -> None:
        self.p = protocol
        # numba is imported here, on the dense path only: plug-in loading stays as cheap
        from desim import fast

        #: The compiled passes (`dense_kernel.take_run`, `release_run`), or None: numpy's.
        self.kernel = self.release_kernel = None
        if fast.compiled():
            from desim.models.colme.dense_kernel import release_run, take_run

            self.kernel, self.release_kernel = take_run, release_run

    def take(self, got: Arrivals) -> None:
        """Take releases of distinct pairs (each j = κ + 1): what `PrivateColME.take` does."""
        p = self.p
        run = got.pair if isinstance(got.pair, slice) else None
        if self.kernel is not None and run is not None and _every_agent(got.a, p.schedule.agents):
            self._take_compiled(got, run)
        else:
            self._take_numpy(got)

    def _take_numpy(self, got: Arrivals) -> None:
        """`PrivateColME.take`'s arithmetic with κ before these releases as j − 1."""
        p, stat = self.p, self.p.stat
        a, b, payload, pair = got.a, got.b, got.payload, got.pair
        values, t_b = payload[:, VALUE], payload[:, COUNT]
        j = payload[:, INDEX].astype(np.int64)
        sigma2 = p.sigma2[b]
        # the old terms (`_pair_terms`), κ − 1 = j − 1 releases in
        before = j - 1
        data = stat.data_of(pair, before)
        with np.errstate(invalid="ignore", divide="ignore"):
            num = sigma2 * data
            num += p.sigma2_dp * (before.astype(float) * data * data)
            flat = p.beliefs.flat
            included = flat[pair] if isinstance(pair, slice) else flat.take(pair)
            weight = np.divide(1.0, num, out=np.zeros_like(num), where=included & (before > 0))
        total = stat.total[pair] if isinstance(pair, slice) else stat.total.take(pair)
        old = (weight * total, weight)
        value, data, noise, _n = stat.update(a, b, values, t_b, j, consecutive=True, pair=pair)
        var = sigma2 * data + p.sigma2_dp * noise
        decision = p._test(a, b, value, var, t_b, got.slot)
        p.sums_w.replace(a, *old, *contribution(decision, value, var))
        p.beliefs.revise_pairs(a, pair, decision, included)

    def _take_compiled(self, got: Arrivals, run: slice) -> None:
        """The same in one compiled pass over the run (every agent a = 0 … M − 1 in order)."""
        p = self.p
        m = p.ctx.n_agents
        t = p.view.clock(got.slot)
        sums_w = p.sums_w
        self.kernel(
            run.start,
            m,
            got.payload[:, VALUE],
            got.payload[:, COUNT],
            got.payload[:, INDEX],
            p.stat.total,
            p.beliefs.flat,
            p.beliefs.n_included,
            p.sigma2,
            float(p.sigma2_dp),
            p.sums,
            float(t),
            float(p._z[int(t)]),
            sums_w.sums,
            sums_w.carry,
            sums_w.terms,
            sums_w.dirty,
        )


def _every_agent(a: np.ndarray, agents: np.ndarray) -> bool:
    """Whether `a` is every agent in order (RR's queriers, the array the schedule sent)."""
    return a is agents or (len(a) == len(agents) and bool((a == agents).all()))
