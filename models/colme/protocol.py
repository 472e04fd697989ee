"""Private-ColME (seed 002): query, privatised release, class test, inverse-variance combine.

Each slot, every agent a queries one other agent b (schedule RR or rRR, §III-E). Agent b answers
with a privatised running mean (PM-I or PM-II, `desim.models.privacy.release`). Agent a keeps the
statistic T_{b→a} with its exact variance (`desim.models.colme.statistic`), decides whether b is in
its class by the z-test of §III-C1 when b answers, and estimates its mean by the inverse-variance
combination of Lemma 4 over the agents it currently believes are in its class, with the bracketing
of (3)–(4) corrected (docs/papers.md §1.2):

    μ_a = (t/σ_a² · X̄_a + Σ_b T_{b→a}/Var[T_{b→a}]) / (t/σ_a² + Σ_b 1/Var[T_{b→a}]).

With unknown data variances (§III-C2, §V) agent a uses its own sample variance V_a, an
estimate V_{b→a} of σ_b² — released by b (Sch-Var-1) or computed by a from b's releases
(Sch-Var-2, optionally with the Bayesian correction (19)) — the plug-in V̂ar[T], the Welch
t-test, and the random weights of eq. (5). Until V_{b→a} exists (or when it is negative and not
corrected), V̂ar[T_{b→a}] = +∞: b is kept in C_a but gets weight 0.

Choices the paper leaves open, made here:
- RR order: agent a queries a+1, a+2, … (mod M), skipping itself, so every agent is queried
  exactly once per slot; agent a's k-th other agent is at RR position k (Prop. 3's ℓ).
- rRR skips agents outside C_a^{(t-1)}. A decision about b is revised only when b answers, so an
  excluded agent is never queried again; if a excludes everyone, a sends no more queries and
  its estimate is its local mean from then on.
- The test is evaluated when b's release arrives, with t = a's current sample count.
- Sch-Var-1 splits (ε, δ) equally between the mean and the variance release (§VII-B).
- Sch-Var-2 uses the unbiased form of (16) for unequal p-sum lengths (it equals (16) when
  all gaps are equal, as under RR after the first query); under PM-II a differences
  consecutive releases, whose noises are correlated, and the correction accounts for it.

Under asynchrony (links with latency, losses, outages or stragglers):
- The querier never stalls: RR and rRR advance every slot whatever is outstanding, and an
  unanswered query is simply never used.
- b answers when the query arrives, with its running mean then; its mechanism counts the p-sum
  (and spends the privacy) when it releases, whether or not the release arrives. If b has no
  new sample since its last release to a (two queries of a answered in one slot), it re-sends
  that release unchanged (same j: post-processing, no new p-sum; counted in `repeated`), so
  every p-sum covers at least one sample and t_j increases strictly with j.
- A release echoes the send time of the query it answers (the links need not be FIFO). a
  discards a release arriving more than `timeout` slots after that time (`timed_out`), then one
  whose j is not above the last index κ it took from b (`stale`: older than, or the same as, a
  release already used); releases arriving together are taken in increasing j.
- a uses every other release when it arrives: gaps in j (lost or discarded releases) are
  normal. T and Var[T] stay exact for the releases taken (`desim.models.colme.statistic`); Sch-Var-2
  differences consecutive taken releases (a gap is a longer p-sum carrying the noises of both
  node sets' symmetric difference); Welch's κ (welch_df = "kappa") and the Bayesian shape
  count releases taken. Sch-Var-1's release is self-contained: a uses the last one it took.
- With ideal links none of this bookkeeping runs (every release arrives at once, in order);
  with zero latency through other link models it runs and gives the same numbers.

Window-safe (`desim.kernel.protocol.WindowSafe`): between ticks an agent's samples do not
change, so answering a query depends only on b's state at the tick and on the queries of the
same pair answered before it (in time order, as a batch is); taking a release touches only the
querier's state, never what answers read. In a window the queries are answered batch by batch
(replies at their exact times) and the releases are kept until `on_window_end`, which takes
them in the order one-message-per-instant delivery would: per pair by delivery time (then by
batch, then by j among releases of one instant), timeouts against each exact delivery time.
Under RR the queries never depend on deliveries, so the engine may hand over several slots at
once (`on_slots`, `batches_slots`): the sums after each slot are kept, and a query (a release)
delivered at x is answered (taken) with the responder's (the querier's) state of slot ⌊x⌋.
Messages are named for the links' latency (`Network.send`'s ids): a query by (slot, querier,
responder), a release by the query it answers; so their delays do not depend on how sends
are grouped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.params import param
from desim.kernel.protocol import Context, SlotBatched
from desim.kernel.registry import METRICS, PROTOCOLS, records
from desim.models.colme.statistic import PairStatistic, SchVar2
from desim.models.colme.variance import bayes_posterior_mean, sample_variance, welch_accepts
from desim.models.privacy.accounting import Spend, psum_multiplier, psum_noise
from desim.models.privacy.release import PSumRelease, SampleVarianceRelease, levels_for


@dataclass(frozen=True)
class PrivateColMEParams:
    """Parameters of Private-ColME with known data variance."""

    mechanism: Literal["pm1", "pm2"] = param("pm1", "release mechanism: PM-I or PM-II")
    weights: Literal["last", "mom", "wmom"] = param(
        "last", "weights of T: last release (non-MoM), mean of means, windowed MoM"
    )
    schedule: Literal["rr", "rrr"] = param("rr", "round robin, or restricted round robin")
    noise: Literal["gaussian", "laplace", "none"] = param(
        "gaussian", "DP noise on each p-sum; none gives plain (non-private) ColME"
    )
    epsilon: float = param(1.0, "privacy budget ε of every sample", gt=0)
    delta: float = param(1e-6, "privacy budget δ (Gaussian noise)", gt=0, lt=1)
    theta: float = param(0.05, "test level numerator: θ_t = theta/ln(t+1)", gt=0, lt=1)
    budget_t_max: int | None = param(
        None, "t_max in PM-II's budget split ⌊log₂ t_max⌋+1 (default: the run's t_max)", ge=1
    )
    variance: Literal["known", "sch-var-1", "sch-var-2", "sch-var-2-bayes"] = param(
        "known", "data variances known, or estimated by Sch-Var-1 / Sch-Var-2 (plain, Bayesian)"
    )
    prior: Literal["paper", "jeffreys"] = param(
        "paper", "Sch-Var-2 Bayesian prior: the paper's (shape (κ+2)/2) or Jeffreys ((κ+1)/2)"
    )
    welch_df: Literal["printed", "kappa"] = param(
        "printed", "Welch ν second term over t_κ − 1 (as printed) or κ − 1 (releases)"
    )
    timeout: float = param(
        math.inf, "slots after sending a query beyond which its answer is discarded", gt=0
    )
    calibration: Literal["paper", "tight"] = param(
        "paper",
        "noise calibration: the paper's formulas, or the least noise for (ε, δ) per the "
        "PLD accountant (`desim.models.privacy.accounting`)",
    )


# Columns of a release's payload: b's privatised mean R, b's sample count t_b, the release
# index j, the send time of the query it answers (echoed), and Sch-Var-1's variance release.
_VALUE, _COUNT, _INDEX, _ASKED, _VARIANCE = range(5)
# Indices of the message kinds (`PrivateColME.message_kinds`), as `Batch.single_kind` holds them.
_QUERY, _RELEASE = range(2)


@PROTOCOLS.register("private-colme")
class PrivateColME(SlotBatched):
    """Private-ColME: privatised queries, z-test class estimates, inverse-variance combination."""

    Params = PrivateColMEParams
    message_kinds = ("query", "release")
    #: Populations above this size keep each agent's combination sums Σ_b T/Var[T] and
    #: Σ_b 1/Var[T] up to date at every release (`estimates` in O(M)); up to it `estimates`
    #: sums over the M × M pair state at each call, which costs little there and gives the same
    #: bits as earlier versions (committed results stay byte-identical).
    incremental_above: ClassVar[int] = 1000

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        p = self.params
        m = ctx.n_agents
        self.known = p.variance == "known"
        #: σ_a² of every agent, used only when variances are known.
        self.sigma2 = np.asarray(ctx.public["sigma2"], dtype=float) if self.known else None
        L = ctx.public["L"]
        #: σ_DP², the noise variance of every p-sum (and σ_{2,DP}², Sch-Var-1's variance p-sums)
        self.sigma2_dp, sigma2_var = psum_noise(
            p.noise,
            L,
            p.mechanism,
            p.epsilon,
            p.delta,
            p.budget_t_max or ctx.t_max,
            p.calibration,
            p.variance == "sch-var-1",
        )
        self._multiplier = psum_multiplier(p.noise, self.sigma2_dp, L) if L > 0 else 0.0
        self.mech = PSumRelease(
            m, p.mechanism, p.noise, self.sigma2_dp, ctx.streams.get("dp-noise"), ctx.t_max
        )
        if p.variance == "sch-var-1":
            self.var_release = SampleVarianceRelease(
                m,
                p.mechanism,
                p.noise,
                sigma2_var,
                self.sigma2_dp,
                ctx.streams.get("dp-noise-variance"),
                ctx.t_max,
            )
        levels = levels_for(ctx.t_max)
        self.stat = PairStatistic(m, p.mechanism, p.weights, self.sigma2_dp, levels)
        #: V_{b→a}, a's current estimate of σ_b² (+∞: none yet), when variances are unknown.
        self.v_hat = None if self.known else np.full((m, m), np.inf)
        if p.variance in ("sch-var-2", "sch-var-2-bayes"):
            self.schvar2 = SchVar2(m * m, p.mechanism, levels)
        self._width = _VARIANCE + (p.variance == "sch-var-1")  # payload columns
        # Ideal links deliver every message at once: releases arrive in order, one per query.
        self.asynchronous = ctx.links is not None and not ctx.links.ideal
        #: Releases each querier a discarded: older than one it took (stale), or answering a
        #: query sent more than `timeout` slots before they arrived (timed out).
        self.stale = np.zeros(m, dtype=np.int64)
        self.timed_out = np.zeros(m, dtype=np.int64)
        #: Answers each responder b re-sent unchanged (no new sample since its last to a).
        self.repeated = np.zeros(m, dtype=np.int64)
        if self.asynchronous:
            # b's last release to a, [b·m + a]: its value, b's sample count then (j < 2³¹, as
            # `mech.count`, which holds its index j) and Sch-Var-1's variance release
            self._last_value = np.zeros(m * m)
            self._last_count = np.zeros(m * m, dtype=np.int32)
            if p.variance == "sch-var-1":
                self._last_variance = np.zeros(m * m)
            if not self.known:  # releases a took from b, [a·m + b]
                self._received = np.zeros(m * m, dtype=np.int64)
        #: Running sum, sum of squares and count of each agent's own samples.
        self.sums = np.zeros(m)
        self.sumsq = np.zeros(m)
        self.counts = np.zeros(m)
        #: C_a^{(t)} as a boolean matrix [a, b]: a believes b is in its class (χ_a(b) = 1).
        self.included = np.ones((m, m), dtype=bool)
        self._n_included = np.full(m, m)  # row sums of `included`, kept current
        self._agents = np.arange(m)
        self._twice = np.concatenate((self._agents, self._agents))  # read-only: RR's targets
        self._twice.flags.writeable = False
        self._offset = np.zeros(m, dtype=np.int64)  # RR position last queried, 0 = none yet
        # θ_t = theta/ln(t+1) and the z-test quantile Φ⁻¹(1 − θ_t/2) of every t (index 0 unused)
        t = np.arange(1, ctx.t_max + 2, dtype=float)
        self._theta = np.concatenate([[1.0], p.theta / np.log(t + 1.0)])
        from scipy.special import ndtri  # here, not at module level: plug-in loading is cheap

        self._z = np.concatenate([[np.inf], ndtri(1.0 - self._theta[1:] / 2.0)])
        self.incremental = m > self.incremental_above
        self._window: list[Batch] = []  # releases delivered in the current window
        # under slot batches (`batches_slots`) windows read the state of each slot from these
        self._slot0 = 0  # the first slot of the current batch
        self._slot_sums: np.ndarray | None = None  # [i, a]: sums after slot _slot0 + i
        self._slot_sumsq: np.ndarray | None = None  # (unknown variances only)
        self._slot_counts: np.ndarray | None = None  # [i]: every agent's count then
        if self.incremental:
            self.sums_w = CombinationSums(m)

    def batches_slots(self) -> bool:
        """Only RR: its queries never depend on deliveries (rRR's skip excluded agents), so the
        engine may hand over several slots at once (`on_slots`)."""
        return self.params.schedule == "rr"

    # -- slot: new samples, then queries ---------------------------------------------------
    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.sums += samples
        if not self.known:
            self.sumsq += samples * samples
        self.counts += 1
        if self.params.schedule == "rr":
            a = self._agents
            offset = self._rr_offset(t)
            b = self._twice[offset : offset + len(a)]  # (a + offset) mod M: a window of 0…M−1 twice
        else:
            a, offset = self._next_included()
            self._offset[a] = offset
            b = (a + offset) % len(self._agents)
        if self.asynchronous:
            self.ctx.send("query", a, b, ids=self._query_ids(t, a, b))
        else:
            self.ctx.send("query", a, b)

    def on_slots(self, t: int, samples: np.ndarray) -> None:
        """Slots t … t + k − 1 under RR: the samples, kept per slot for the windows that follow
        (summed in the order slot-by-slot `on_samples` sums them), then every slot's queries."""
        k, m = samples.shape
        self._slot0 = t
        self._slot_sums = _running(self.sums, samples)
        self.sums[:] = self._slot_sums[-1]
        if not self.known:
            self._slot_sumsq = _running(self.sumsq, samples * samples)
            self.sumsq[:] = self._slot_sumsq[-1]
        self._slot_counts = self.counts[0] + np.arange(1.0, k + 1.0)
        self.counts += k
        slots = np.arange(t, t + k)
        b = (self._agents + self._rr_offset(slots)[:, None]) % m
        b = b.ravel()
        a = np.tile(self._agents, k)
        sent = np.repeat(slots, m)
        self.ctx.send("query", a, b, at=sent.astype(float), ids=self._query_ids(sent, a, b))

    def _rr_offset(self, t: int | np.ndarray) -> int | np.ndarray:
        """RR's position in slot(s) t: every agent a queries a + offset (mod M), offset in 1…M−1."""
        return (t - 1) % (len(self._agents) - 1) + 1

    def _query_ids(self, t: int | np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The ids of queries a → b sent in slots t, (t·M + a)·M + b; a release carries the id
        of the query it answers (`desim.kernel.network.Network.send`)."""
        m = len(self._agents)
        return (np.asarray(t, dtype=np.int64) * m + a) * m + b

    def _own(
        self, who: np.ndarray, slot: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """Sums, sums of squares (None with known variances) and counts of agents `who`: now,
        or after slots `_slot0 + slot` of the current batch (`on_slots`)."""
        if slot is None:
            return self.sums[who], None if self.known else self.sumsq[who], self.counts[who]
        return (
            self._slot_sums[slot, who],
            None if self.known else self._slot_sumsq[slot, who],
            self._slot_counts[slot],
        )

    def _slot_of(self, when: np.ndarray | None) -> np.ndarray | None:
        """The slot of the current batch each time falls in (None: not in a batch)."""
        if when is None or self._slot_sums is None:
            return None
        return (np.floor(when) - self._slot0).astype(np.intp)

    def _next_included(self) -> tuple[np.ndarray, np.ndarray]:
        """rRR: each agent's next RR position whose agent it still includes."""
        m = len(self._agents)
        agents = self._agents[self._n_included > 1]  # those including someone besides self
        offset = self._offset[agents]
        ahead = np.arange(1, min(16, m - 1) + 1)
        todo = np.arange(len(agents))
        while len(todo):  # look a window of positions ahead; rarely nobody in it is included
            a = agents[todo]
            cand = (offset[todo, None] + ahead - 1) % (m - 1) + 1
            hit = self.included[a[:, None], (a[:, None] + cand) % m]
            first = hit.argmax(axis=1)
            rows = np.arange(len(todo))
            found = hit[rows, first]
            offset[todo] = np.where(found, cand[rows, first], cand[:, -1])
            todo = todo[~found]
        return agents, offset

    # -- deliveries: answer queries, take releases -----------------------------------------
    def on_deliver(self, batch: Batch) -> None:
        # a batch of one kind (the usual case) skips the other: no empty selection is made
        if batch.single_kind == _QUERY:
            queries, releases = batch, None
        elif batch.single_kind == _RELEASE:
            queries, releases = None, batch
        else:  # both kinds (a window's): one mask, two selections
            is_query = batch.kind == _QUERY
            queries, releases = batch.select(is_query), batch.select(~is_query)
        if queries is not None and len(queries):
            b, a = queries.dst, queries.src
            if self.asynchronous:
                payload = self._answer(b, a, self._slot_of(queries.delivered_at))
                payload[:, _ASKED] = queries.sent_at
                # a release is named by the query it answers; in a window it leaves at that
                # query's exact delivery time
                self.ctx.send(
                    "release",
                    b,
                    a,
                    payload,
                    at=queries.delivered_at,
                    ids=self._query_ids(queries.sent_at, a, b),
                )
            else:
                payload = self._release(b, a)
                payload[:, _ASKED] = queries.sent_at
                self.ctx.send("release", b, a, payload)
        if releases is not None and len(releases):
            if releases.delivered_at is not None:  # in a window: taken at its end
                self._window.append(releases)
            elif self.asynchronous:
                self._take_arrivals(releases)
            else:
                self._take_releases(releases.dst, releases.src, releases.payload)

    def _release(self, b: np.ndarray, a: np.ndarray, slot: np.ndarray | None = None) -> np.ndarray:
        """Payloads of new releases of agents b to agents a (distinct pairs; _ASKED unset), with
        b's state now or after slots `slot` of the batch."""
        sums, sumsq, counts = self._own(b, slot)
        values, j, fresh = self.mech.release(b, a, sums, counts)
        payload = np.empty((len(b), self._width))
        if self.params.variance == "sch-var-1":
            payload[:, _VARIANCE] = self.var_release.release(
                b, a, j, fresh, sums, sumsq, counts, values
            )
        payload[:, _VALUE], payload[:, _COUNT], payload[:, _INDEX] = values, counts, j
        return payload

    def _answer(self, b: np.ndarray, a: np.ndarray, slot: np.ndarray | None = None) -> np.ndarray:
        """Payloads answering queries a → b that may repeat a pair or find no new sample, with
        b's state now or (in a batch of slots) after the slot each query arrives in (`slot`,
        ascending).

        A pair's first query in a slot gets a new release if b has a sample its last release to
        a lacked; every other query gets that last release again (`repeated`).
        """
        pair = b * len(self._agents) + a
        repeats = len(pair) > 1 and _has_repeats(pair)
        if repeats and slot is not None and slot[0] != slot[-1]:
            # slot by slot, in order: a pair asked again in a later slot may have a new sample
            cuts = [0, *(slot[1:] != slot[:-1]).nonzero()[0] + 1, len(slot)]
            return np.concatenate(
                [
                    self._answer(b[i:j], a[i:j], slot[i:j])
                    for i, j in zip(cuts[:-1], cuts[1:], strict=True)
                ]
            )
        counts = self._own(b, slot)[2]
        if not repeats:
            if (counts > self._last_count[pair]).all():  # the usual case
                payload = self._release(b, a, slot)
                self._keep_answer(pair, payload)
                return payload
            first = np.arange(len(pair))
        else:
            first = np.sort(np.unique(pair, return_index=True)[1])  # send order: noise draws
        new = first[counts[first] > self._last_count[pair[first]]]
        if len(new):
            self._keep_answer(
                pair[new], self._release(b[new], a[new], None if slot is None else slot[new])
            )
        again = np.ones(len(b), dtype=bool)
        again[new] = False
        self.repeated += np.bincount(b[again], minlength=len(self._agents))
        payload = np.empty((len(pair), self._width))  # b's last releases to a (_ASKED unset)
        payload[:, _VALUE], payload[:, _COUNT] = self._last_value[pair], self._last_count[pair]
        payload[:, _INDEX] = self.mech.count.ravel()[pair]  # (no release since: still its j)
        if self.params.variance == "sch-var-1":
            payload[:, _VARIANCE] = self._last_variance[pair]
        return payload

    def _keep_answer(self, pair: np.ndarray, payload: np.ndarray) -> None:
        """Keep the new releases of distinct pairs [b·m + a] as b's last to a."""
        self._last_value[pair], self._last_count[pair] = payload[:, _VALUE], payload[:, _COUNT]
        if self.params.variance == "sch-var-1":
            self._last_variance[pair] = payload[:, _VARIANCE]

    def on_window_end(self) -> None:
        if not self._window:
            return
        parts, self._window = self._window, []
        releases = Batch.concat(parts)
        batch_no = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        self._take_arrivals(releases, releases.delivered_at, batch_no)

    def _take_arrivals(
        self, releases: Batch, when: np.ndarray | None = None, batch_no: np.ndarray | None = None
    ) -> None:
        """Discard timed-out and stale releases, take the others pair by pair in order of j.

        A window's releases come with their delivery times `when` and the number of the batch
        that delivered each: a pair's releases are then taken by time, batch, then j. In a
        batch of slots each is tested with a's state of the slot it arrived in.
        """
        a, b, payload = releases.dst, releases.src, releases.payload
        slot = self._slot_of(when)
        m = len(self._agents)
        if math.isfinite(self.params.timeout):
            now = self.ctx.now() if when is None else when
            late = now - payload[:, _ASKED] > self.params.timeout
            if late.any():
                self.timed_out += np.bincount(a[late], minlength=m)
                a, b, payload = a[~late], b[~late], payload[~late]
                if when is not None:
                    when, batch_no = when[~late], batch_no[~late]
                if slot is not None:
                    slot = slot[~late]
        pair = a * m + b
        if len(pair) > 1 and _has_repeats(pair):
            # several releases of one pair: round r takes the r-th of every pair (lowest j;
            # in a window, earliest)
            j = payload[:, _INDEX]
            keys = (j, pair) if when is None else (j, batch_no, when, pair)
            for take in _rounds(pair, np.lexsort(keys)):
                self._take_fresh(
                    a[take],
                    b[take],
                    pair[take],
                    payload[take],
                    None if slot is None else slot[take],
                )
        elif len(pair):
            self._take_fresh(a, b, pair, payload, slot)

    def _take_fresh(
        self,
        a: np.ndarray,
        b: np.ndarray,
        pair: np.ndarray,
        payload: np.ndarray,
        slot: np.ndarray | None = None,
    ) -> None:
        """Take the releases of distinct pairs whose j is above κ; count the others stale."""
        last = self.stat.last_index(pair)
        fresh = payload[:, _INDEX] > last
        if not fresh.all():
            self.stale += np.bincount(a[~fresh], minlength=len(self._agents))
            a, b, payload, last = a[fresh], b[fresh], payload[fresh], last[fresh]
            if slot is not None:
                slot = slot[fresh]
        if len(a):
            self._take_releases(a, b, payload, last.astype(np.int64), slot)

    def _take_releases(
        self,
        a: np.ndarray,
        b: np.ndarray,
        payload: np.ndarray,
        last: np.ndarray | None = None,
        slot: np.ndarray | None = None,
    ) -> None:
        """Take releases from b to a (distinct pairs, each j above κ): T, V_{b→a}, the test.

        `last` is each pair's κ before these releases; None when every j is κ + 1. `slot`: the
        slot of the batch whose state a tests with (None: now).
        """
        values, t_b = payload[:, _VALUE], payload[:, _COUNT]
        j = payload[:, _INDEX].astype(np.int64)
        if self.incremental:  # the terms these pairs contributed so far, to be replaced
            old = self._terms(a, b, *self.stat.terms(a * len(self._agents) + b))
        value, data, noise, n = self.stat.update(a, b, values, t_b, j, consecutive=last is None)
        if self.known:
            var = self.sigma2[b] * data + self.sigma2_dp * noise
            if not isinstance(n, float):  # (the scalar n = 1: x/1 is x, no pass needed)
                var /= n * n
            n_other = t_b
        else:
            pair = a * len(self._agents) + b
            if last is None:
                k = j  # every release was taken
            else:
                k = self._received[pair] + 1
                self._received[pair] = k
            if self.params.variance == "sch-var-1":
                v_b = payload[:, _VARIANCE]
                v_b = np.where(v_b >= 0, v_b, np.inf)  # a negative release means "unknown"
            else:
                v_b = self._sch_var_2(a, b, values, t_b, j, last, k)
            self.v_hat.ravel()[pair] = v_b
            var = (v_b * data + self.sigma2_dp * noise) / (n * n)  # data > 0: ∞ stays ∞
            n_other = t_b if self.params.welch_df == "printed" else k.astype(float)
        decision = self._test(a, b, value, var, n_other, slot)
        if self.incremental:
            self.sums_w.replace(a, *old, *_contribution(decision, value, var))
        pair = a * len(self._agents) + b
        before = self.included.ravel().take(pair)
        if np.count_nonzero(decision != before):  # decisions settle: most releases change none
            self.included[a, b] = decision
            change = decision.astype(np.int64) - before
            self._n_included += np.bincount(a, weights=change, minlength=len(self._agents)).astype(
                np.int64
            )

    def _terms(
        self,
        a: np.ndarray,
        b: np.ndarray,
        value: np.ndarray,
        data: np.ndarray,
        noise: np.ndarray,
        n: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The current terms T/Var[T] and 1/Var[T] of pairs (a, b) in a's combination sums
        (0 for excluded pairs), from their statistic state as `estimates` computes them."""
        sigma2 = self.sigma2[b] if self.known else self.v_hat[a, b]
        with np.errstate(invalid="ignore"):
            num = sigma2 * data + self.sigma2_dp * noise
        var = np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)
        return _contribution(self.included[a, b], value, var)

    def _test(
        self,
        a: np.ndarray,
        b: np.ndarray,
        value: np.ndarray,
        var: np.ndarray,
        n_other: np.ndarray,
        slot: np.ndarray | None = None,
    ) -> np.ndarray:
        """χ_a(b): the z-test with known variances, the Welch t-test otherwise (a's state now,
        or after slots `slot` of the batch)."""
        if self.known:
            return self._z_test(a, value, var, slot)
        return self._welch_test(a, value, var, n_other, slot)

    def _z_test(
        self, a: np.ndarray, value: np.ndarray, var: np.ndarray, slot: np.ndarray | None = None
    ) -> np.ndarray:
        """χ_a(b) of §III-C1: |X̄_a − T_{b→a}| < Φ⁻¹(1−θ_t/2)·√(σ_a²/t + Var[T_{b→a}])."""
        if slot is None:
            t = self.counts[0]  # every agent has t samples (one per slot): one t, one quantile
            z = self._z[int(t)]
            sums = self.sums[a]
        else:
            t = self._slot_counts[slot]
            z = self._z[t.astype(np.int64)]
            sums = self._slot_sums[slot, a]
        spread = self.sigma2[a] / t  # (in place: the same floats, fewer temporaries)
        spread += var
        np.sqrt(spread, out=spread)
        spread *= z
        gap = sums / t
        gap -= value
        return np.abs(gap, out=gap) < spread

    def own_variance(self, a: np.ndarray | slice = slice(None)) -> np.ndarray:
        """V_a^{(t)}, each agent's sample variance of its own data (+∞ before 2 samples)."""
        return sample_variance(self.sums[a], self.sumsq[a], self.counts[a])

    def _welch_test(
        self,
        a: np.ndarray,
        value: np.ndarray,
        var: np.ndarray,
        n_other: np.ndarray,
        slot: np.ndarray | None = None,
    ) -> np.ndarray:
        """χ_a(b) of §III-C2, the Welch t-test with V_a and V̂ar[T_{b→a}] (kept if unknown)."""
        sums, sumsq, t = self._own(a, slot)
        theta = self._theta[t.astype(np.int64)]
        return welch_accepts(
            sums / t - value, sample_variance(sums, sumsq, t), t, var, n_other, theta
        )

    def _sch_var_2(
        self,
        a: np.ndarray,
        b: np.ndarray,
        values: np.ndarray,
        t: np.ndarray,
        j: np.ndarray,
        last: np.ndarray | None = None,
        k: np.ndarray | None = None,
    ) -> np.ndarray:
        """V_{b→a} of Sch-Var-2 (`desim.models.colme.statistic.SchVar2`): +∞ before two releases,
        and where negative unless the Bayesian correction (19) replaces it.

        `last` (the previous index taken) and `k` (releases taken) are None when every release
        was taken.
        """
        pair = a * len(self._agents) + b
        v_raw, k_noise, k = self.schvar2.update(pair, values, t, j, self.sigma2_dp, last, k)
        v = v_raw - k_noise
        v[k < 2] = np.inf
        negative = v < 0
        if negative.any():
            if self.params.variance == "sch-var-2-bayes":
                v[negative] = bayes_posterior_mean(
                    np.maximum(v_raw[negative], 0.0),
                    k_noise[negative],
                    k[negative],
                    self.params.prior,
                    check=False,
                )
            else:
                v[negative] = np.inf
        return v

    # -- estimates -------------------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        local = self.sums / np.maximum(self.counts, 1)
        own_var = self.sigma2 if self.known else self.own_variance()
        with np.errstate(divide="ignore"):
            own = self.counts / own_var  # t/σ_a² (or t/V_a, eq. (5))
        if self.incremental:
            pairs_num, pairs_den = self.sums_w.totals(self._row_sums)
        else:
            pairs_num, pairs_den = self._row_sums(slice(None))
        num = own * local + pairs_num
        den = own + pairs_den
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = num / den
        # nothing to weigh yet (t < 2 with unknown variances) or an exact own mean (σ_a = 0)
        return np.where(np.isfinite(own) & (den > 0), mu, local)

    def privacy_spend(self) -> Spend | None:
        """The releases so far, for the `privacy` ledger (None without noise).

        κ_{b→a} = `mech.count` counts b's releases to a when made, lost on a link or not.
        Agent b's first sample is its most exposed: it lies in one p-sum per querier under
        PM-I and, under PM-II, in one tree node per level that some release to a completed,
        ⌊log₂ κ⌋+1 of them; Sch-Var-1 adds a variance p-sum (same multiplier) to each.
        """
        if self.params.noise == "none":
            return None
        kappa = self.mech.count
        per = (kappa > 0) if self.params.mechanism == "pm1" else np.frexp(kappa)[1]  # bit length
        if self.params.variance == "sch-var-1":
            per = 2 * per
        m = self._multiplier
        return Spend(
            self.params.noise,
            self.params.delta,
            {"one": (m, per.max(axis=1)), "all": (m, per.sum(axis=1))},
        )

    def _row_sums(self, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
        """Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}] over the b ≠ a that agents a in
        `rows` include, recomputed from the pair state (O(M) per row)."""
        sigma2 = self.sigma2[None, :] if self.known else self.v_hat[rows]
        var = self.stat.variance(sigma2, rows)
        with np.errstate(divide="ignore"):
            weight = np.where(self.included[rows], 1.0 / var, 0.0)
        agents = self._agents[rows]
        weight[np.arange(len(agents)), agents] = 0.0  # a itself
        return (weight * self.stat.value_of(rows)).sum(axis=1), weight.sum(axis=1)


def _contribution(
    included: np.ndarray, value: np.ndarray, var: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(T/Var[T], 1/Var[T]) of pairs, 0 where excluded, as `PrivateColME._row_sums` forms them."""
    with np.errstate(divide="ignore"):
        weight = np.where(included, 1.0 / var, 0.0)
    return weight * value, weight


def _running(before: np.ndarray, samples: np.ndarray) -> np.ndarray:
    """[i]: `before` plus samples[0], …, samples[i], added one row at a time (as slot-by-slot
    updates add them: the same floats)."""
    out = np.empty((len(samples) + 1, len(before)))
    out[0] = before
    out[1:] = samples
    return np.add.accumulate(out, axis=0, out=out)[1:]


class CombinationSums:
    """Each agent's Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}], kept up to date.

    A release replaces one pair's terms (old by new). Sums are compensated (Neumaier), so their
    error stays at a few ulps of the sum of the terms' magnitudes whatever the number of
    replacements; the number of non-zero terms is counted exactly, so an agent that excludes
    every other one has sums of exactly 0. A non-finite term (Var[T] = 0) marks its agent for
    recomputation from the pair state at the next `totals`.
    """

    def __init__(self, n_agents: int) -> None:
        self.sums = np.zeros((2, n_agents))  # Σ T/Var and Σ 1/Var
        self.carry = np.zeros((2, n_agents))  # Neumaier compensation of each sum
        self.terms = np.zeros(n_agents, dtype=np.int64)  # non-zero 1/Var terms
        self.dirty = np.zeros(n_agents, dtype=bool)

    def replace(
        self,
        a: np.ndarray,
        old_num: np.ndarray,
        old_den: np.ndarray,
        new_num: np.ndarray,
        new_den: np.ndarray,
    ) -> None:
        """Replace the terms (old_num, old_den) of agents a by (new_num, new_den)."""
        ok = (
            np.isfinite(old_num)
            & np.isfinite(new_num)
            & np.isfinite(old_den)
            & np.isfinite(new_den)
        )
        if not ok.all():
            self.dirty[a[~ok]] = True
        self.terms += np.bincount(
            a, weights=(new_den != 0).astype(float) - (old_den != 0), minlength=len(self.terms)
        ).astype(np.int64)
        # the old terms leave and the new ones enter as separate compensated additions: their
        # difference, formed in plain floating point, would lose the ulps of a large term
        if len(a) > 1 and _has_repeats(a):  # several releases to one agent (in a window):
            rounds = _rounds(a, np.argsort(a, kind="stable"))  # its r-th term in round r
        else:
            rounds = [slice(None)]
        for x in (-np.stack([old_num, old_den]), np.stack([new_num, new_den])):
            for i in rounds:
                self._add(a[i], x[:, i])

    def _add(self, a: np.ndarray, x: np.ndarray) -> None:
        """Add x (2 × len(a)) to the sums of distinct agents a (Neumaier's step)."""
        s = self.sums[:, a]
        total = s + x
        self.carry[:, a] += np.where(np.abs(s) >= np.abs(x), (s - total) + x, (x - total) + s)
        self.sums[:, a] = total

    def totals(self, row_sums: Any) -> tuple[np.ndarray, np.ndarray]:
        """The two sums of every agent; `row_sums(rows)` recomputes those marked dirty."""
        if self.dirty.any():
            rows = np.flatnonzero(self.dirty)
            self.sums[0, rows], self.sums[1, rows] = row_sums(rows)
            self.carry[:, rows] = 0.0
            self.dirty[rows] = False
        out = self.sums + self.carry
        out[:, self.terms == 0] = 0.0  # every term removed: exactly nothing to weigh
        return out[0], out[1]


def _rounds(key: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """Indices of `key` in rounds of distinct keys: round r holds the r-th occurrence of each
    key, where `order` sorts `key` and ranks equal keys (e.g. a stable argsort: send order)."""
    ordered = key[order]
    head = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    rank = np.arange(len(order)) - np.repeat(head, np.diff(np.append(head, len(order))))
    return [order[rank == r] for r in range(int(rank.max()) + 1)]


def _has_repeats(pair: np.ndarray) -> bool:
    """Whether some pair id occurs more than once."""
    ordered = np.sort(pair)
    return bool((ordered[1:] == ordered[:-1]).any())


@PROTOCOLS.register("private-colme-oracle")
class PrivateColMEOracle(PrivateColME):
    """Private-ColME with the true classes instead of the z-test (the Prop. 3 oracle)."""

    uses_oracle = True

    def _test(
        self,
        a: np.ndarray,
        b: np.ndarray,
        value: np.ndarray,
        var: np.ndarray,
        n_other: np.ndarray,
        slot: np.ndarray | None = None,
    ) -> np.ndarray:
        classes = self.ctx.oracle_classes
        return classes[a] == classes[b]

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        # The oracle knows C_a from the start, so rRR never queries other classes.
        self.included = ctx.oracle_classes[:, None] == ctx.oracle_classes[None, :]
        self._n_included = self.included.sum(axis=1)


@METRICS.register("colme-async")
@records("repeated", "stale", "timed_out")
def asynchrony(protocol: Any, data: Any) -> dict[str, float]:
    """Private-ColME's releases lost to asynchrony, totals since the start.

    ``stale`` and ``timed_out`` count releases queriers discarded (older than one taken;
    answering a query sent more than `timeout` slots before), ``repeated`` answers re-sent
    unchanged because the responder had no new sample.
    """
    if not isinstance(protocol, PrivateColME):
        return {}
    return {
        "stale": float(protocol.stale.sum()),
        "timed_out": float(protocol.timed_out.sum()),
        "repeated": float(protocol.repeated.sum()),
    }
