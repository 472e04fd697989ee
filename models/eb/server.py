"""What the empirical-Bayes protocols share: rounds of privatised uploads to the parameter
server, the server's broadcast, and agents that combine it with their own running mean.

Time is desim's: agents receive one sample per slot. Every `round` slots (default: once, at
t_max — the paper's one-shot setting with n = t_max samples) round r opens: every agent uploads
[value, count, noise variance] to the server (`desim.kernel.server.ParameterServer`, address
m) over the run's links, so outages, latency and stragglers apply; at the round's deadline
(`deadline` slots later) the server aggregates what arrived and broadcasts to every agent
(server → agent links; what arrives late is counted, not used). An agent keeps the latest
round's broadcast it received and combines it with its current running mean, which never leaves
it un-noised; before its first broadcast its estimate is its local mean.

Upload mechanisms (the value is computed from the agent's sum S_i and count n_i only):

- ``none``: X̄_i itself (non-private).
- ``gaussian``: user-level (ε₀, δ)-LDP of Theorem 2, part 2: X̄_i projected on [−b, b] plus
  N(0, σ_q²), σ_q² = 8b² log(2/δ)/ε₀² (`mechanisms.gaussian_ldp_sigma2`); b is `clip` or
  Theorem 2's radius for the run's m, n and the known σ_θ, σ_x and r. The guarantee is for one
  release: under ``calibration = "paper"`` repeated rounds compose (the `privacy` ledger reports
  what they spend); ``calibration = "tight"`` gives instead the least noise for which all the
  run's rounds together are (ε₀, δ)-DP (see *Calibration* below).
- ``quantiser``: the k-bit stochastic quantiser of eq. (37) on [−b, b] (communication, not
  privacy); noise variance reported as its bound b²/(2^k − 1)².
- ``rr``: the randomised response of eq. (7) on X̄_i ∈ [0, 1] (Bernoulli data), user-level
  ε₀-LDP for one release; noise variance reported as its x-free part e^ε₀/(e^ε₀ − 1)².
- ``pm1`` / ``pm2``: item-level DP for repeated rounds with the p-sum releases of
  Private-ColME (`desim.models.privacy.release.PSumRelease`, one "pair" per agent: agent →
  server) and the same calibration (σ_DP² of Lemma 1/2 for the data's L, PM-II's budget split by
  ⌊log₂ t_max⌋ + 1), so the two families compare at equal ε. The upload is (S_i + Z)/n_i with
  Var Z = κ σ_DP² (PM-I, κ-th upload) or w_H(κ) σ_DP² (PM-II).

The noise variance sent along is public arithmetic (calibration, count, release index), not data.

Calibration (`calibration`, `desim.models.privacy.accounting`). An upload of the ``gaussian``
mechanism changes by at most Δ = 2b when the agent's whole data set changes (user level), so
its noise multiplier is σ_q/(2b). ``paper``: σ_q² = 8b² log(2/δ)/ε₀², multiplier
√(2 log(2/δ))/ε₀, a per-release guarantee. ``tight``: the multiplier of
`tight_multiplier("gaussian", ε₀, δ, R)` for the R = ⌊t_max/round⌋ rounds of the run, so that
the R uploads the protocol really makes, composed, are (ε₀, δ)-DP per the PLD accountant; each
round's σ_q = 2b_r × that multiplier (b_r: that round's radius; Gaussian releases of equal
multiplier compose exactly like one of multiplier m/√R). ``pm1`` / ``pm2`` take Private-ColME's
path, `psum_noise(..., calibration)`. ``rr`` is exactly ε₀-DP per release already and
``quantiser`` / ``none`` add no privacy noise: ``tight`` changes nothing for them.

Budgets (``budget = {epsilon, delta, action}``, `desim.models.privacy.budget`): every agent may
spend at most (ε, δ) against the server, δ defaulting to the protocol's. The ledger's count of
uploads holding the agent's most exposed sample (its first: R_i user-level uploads, 1 under PM-I,
⌊log₂ κ_i⌋ + 1 tree nodes under PM-II) may reach k*, found once per run by the accountant.
``stop``: an upload that would pass k* is not made (the server's round has one upload fewer, as
when one is lost). ``degrade`` (Gaussian noise: the ``gaussian`` mechanism, or ``pm1`` / ``pm2``
with ``noise = "gaussian"``): it and every later upload (PM-II: every later tree node) carry
noise of multiplier m' > m, the one for which the whole horizon of R rounds spends the budget
exactly; the upload's noise variance column says so, and the server's estimators use it. The
rounds are synchronous, so all agents of a budget degrade in the same round.

The `privacy` ledger (`privacy_spend`): ε at δ spent by every agent against the server
(``eps_server_mean`` / ``eps_server_max``), from the uploads it made — counted when sent, so an
upload lost on its link still counts: R_i Gaussian uploads of multiplier m compose to one of
m/√R_i; a PM-I agent's first sample lies in one p-sum, a PM-II agent's in ⌊log₂ κ_i⌋ + 1 tree
nodes after κ_i uploads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.protocol import Context, StopsSampling, WindowSafe
from desim.kernel.registry import METRICS, applies_to, records
from desim.kernel.server import ParameterServer, Round, server_address
from desim.models.adversaries import STREAM, ActiveAdversaries, Adversaries
from desim.models.eb import mechanisms as mech
from desim.models.eb.forgetting import UploadForgetting
from desim.models.forgetting import refuse_when_stopping
from desim.models.privacy.accounting import Spend, psum_multiplier, psum_noise, tight_multiplier
from desim.models.privacy.bits import popcount, set_bits
from desim.models.privacy.budget import (
    StopGate,
    capacity,
    degraded_multiplier,
    degraded_spend,
    first_sample_psums,
    set_budget,
)
from desim.models.privacy.release import PSumRelease

#: Columns of an upload (after the round tag): privatised value, sample count, noise variance.
VALUE, COUNT, NOISE_VAR = range(3)


class ServerEstimation(WindowSafe, StopsSampling):
    """Base of the empirical-Bayes protocols: rounds, uploads, broadcasts, local state.

    Subclasses set `broadcast_width`, and implement `aggregate` (the server's round) and
    `combine` (the agents' estimates from their broadcasts). Their Params have at least
    ``round``, ``deadline`` and ``mechanism`` (and ε, δ, ... when a mechanism needs them).

    Window-safe (`desim.kernel.protocol.WindowSafe`): nothing is sent in reply to a delivery and
    the state changes only at ticks and deadlines (uploads, the server's rounds), which are
    window boundaries; within a window the server files uploads under their rounds in delivery
    order, and each agent keeps the broadcast one-message-per-instant delivery leaves it
    (`_first_of_latest`), so a window ends in that delivery's state.
    """

    message_kinds = ("upload", "broadcast")
    reads = frozenset({"network"})  # uploads to a server: no [topology]
    broadcast_width: int = 1

    @classmethod
    def memory_per_unit(cls, params: Any, t_max: int, sizes: Any = None) -> dict[str, float]:
        """The declared bytes, and per agent what a ``forget`` table keeps (its window of
        samples; with p-sum uploads, the prefixes its uploads difference)."""
        agent = cls.memory.get("agent", 0.0) + UploadForgetting.bytes_per_agent(params, t_max)
        return {**cls.memory, "agent": agent}

    def on_window_end(self) -> None:
        """Nothing left to finish: deliveries only file uploads and keep broadcasts (above)."""

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        p = self.params
        m = ctx.n_agents
        self.sums = np.zeros(m)
        self.counts = np.zeros(m)
        self._agents = np.arange(m)
        #: Slots between rounds (the one-shot default: one round, at t_max).
        self.every = int(p.round) if p.round is not None else ctx.t_max
        #: The latest broadcast each agent received, and its round (0: none yet).
        self.received = np.full((m, self.broadcast_width), np.nan)
        self.received_round = np.zeros(m, dtype=np.int64)
        #: Uploads the server used in each closed round, in order.
        self.uploads_per_round: list[int] = []
        self._rng = ctx.streams.get("dp-noise")
        #: R, the rounds of the run (one upload per agent each).
        self.rounds = max(1, ctx.t_max // self.every)
        #: Uploads each agent has sent so far (lost on a link or not).
        self.uploads_sent = np.zeros(m, dtype=np.int64)
        self.sigma2_dp = 0.0
        #: Noise multiplier (noise std or Laplace scale over the upload's sensitivity).
        self.multiplier = 0.0
        if p.mechanism in ("pm1", "pm2"):
            L = ctx.public["L"]
            self.sigma2_dp = psum_noise(
                p.noise,
                L,
                p.mechanism,
                p.epsilon,
                p.delta,
                p.budget_t_max or ctx.t_max,
                p.calibration,
                accountant=p.accountant,
            )[0]
            self.multiplier = psum_multiplier(p.noise, self.sigma2_dp, L) if L > 0 else 0.0
            self.release = PSumRelease(
                m, p.mechanism, p.noise, self.sigma2_dp, self._rng, self.rounds, receivers=1
            )
        elif p.mechanism == "gaussian":
            self.multiplier = gaussian_multiplier(
                p.calibration, p.epsilon, p.delta, self.rounds, p.accountant
            )
        self.gate = self._budget_gate()
        self.forgetting = UploadForgetting.build(p, m, self.every)  # (None: the running mean)
        if self.communicates():
            self.server = ParameterServer(ctx, "upload", 3, self._close)
            self._kind_codes = (
                self.message_kinds.index("upload"),
                self.message_kinds.index("broadcast"),
            )
        self._to_server: np.ndarray | None = None
        self._from_server: np.ndarray | None = None
        #: The run's adversaries (None without an [adversaries] table).
        self.adversaries = (
            ActiveAdversaries.build(p.adversaries, ctx.adversary_truth, ctx.streams.get(STREAM))
            if getattr(p, "adversaries", None) is not None
            else None
        )

    @property
    def has_adversaries(self) -> bool:
        """Whether the run has an [adversaries] table (`Context.adversary_truth` is then set)."""
        return getattr(self.params, "adversaries", None) is not None

    @classmethod
    def check_setup(cls, params: Any, data: Any, links: Any) -> None:
        """Refuse adversaries that are not agents of this population."""
        if getattr(params, "adversaries", None) is not None:
            params.adversaries.check(data.n_agents, data.classes)

    def adversary_state(self) -> tuple[np.ndarray, None] | None:
        """(which agents are adversaries, None: the server accepts every upload), for the
        `adversaries` metric; None without an [adversaries] table."""
        return None if self.adversaries is None else (self.adversaries.mask, None)

    def communicates(self) -> bool:
        """Whether this configuration talks to the server at all (known priors do not)."""
        return True

    # -- agents: samples, uploads ----------------------------------------------------------
    def on_samples(self, t: int, samples: np.ndarray) -> None:
        if self.forgetting is None:
            self._take(samples)
        else:  # sums/counts become the forgetting mean and n_eff
            self.forgetting.add(t, samples, self.sums, self.counts)
        if t % self.every or not self.communicates():
            return
        r = t // self.every
        self.server.open(r, self.ctx.now() + self.params.deadline)
        if self._to_server is None:
            self._to_server = np.full(len(self._agents), self.server.address)
        if self.gate is None:
            self.ctx.send(
                "upload", self._agents, self._to_server, _tagged(r, self.upload(self._agents))
            )
            self.uploads_sent += 1
            return
        agents, dst = self._agents, self._to_server
        ok = self.gate.admit(agents, self.uploads_sent, self.ctx.now())
        if self.gate.budget.action == "stop" and not ok.all():  # over budget: not uploaded
            agents, dst = agents[ok], dst[ok]
        if len(agents):
            self.ctx.send("upload", agents, dst, _tagged(r, self.upload(agents)))
        self.uploads_sent[agents] += 1

    def _take(self, samples: np.ndarray) -> None:
        """Add a slot's samples to the agents' sums and counts."""
        self.sums += samples
        self.counts += 1

    def _take_fresh(self, samples: np.ndarray) -> None:
        """`_take` when agents stop sampling: a NaN sample adds nothing."""
        fresh = ~np.isnan(samples)
        self.sums += np.where(fresh, samples, 0.0)
        self.counts += fresh

    @classmethod
    def check_stops(cls, params: Any) -> None:
        """Refuse PM-I/PM-II uploads when agents stop sampling: a stopped agent would upload
        the p-sums of the same samples again, which the ledger (per sample) does not count."""
        if params.mechanism in ("pm1", "pm2"):
            raise ValueError(
                f"mechanism = {params.mechanism!r}: agents that stop sampling would release "
                "the same samples' p-sums again; use 'gaussian', or exhausted = 'cycle'"
            )
        refuse_when_stopping(params)

    def stop_sampling(self) -> None:
        """Each agent's count is its own (a stopped agent uploads the mean of what it had)."""
        self.check_stops(self.params)
        self._take = self._take_fresh  # chosen once: the common case stays as it is

    def upload(self, agents: np.ndarray) -> np.ndarray:
        """Upload rows [value, count, noise variance] of `agents`, through the mechanism."""
        p = self.params
        sums, counts = self.sums[agents], self.counts[agents]
        xbar = sums / counts
        noise_var = np.zeros(len(agents))
        if p.mechanism == "none":
            value = xbar
        elif p.mechanism in ("pm1", "pm2") and self.forgetting is not None:
            value, counts, noise_var = self.forgetting.release(self.release, agents, self.sigma2_dp)
        elif p.mechanism in ("pm1", "pm2"):
            scale = None
            if self.degraded_after is not None:
                later = self.uploads_sent[agents] + 1 > self.degraded_after
                scale = np.where(later, self.degraded_m / self.multiplier, 1.0)
            value, j, _ = self.release.release(
                agents, np.zeros(len(agents), dtype=np.int64), sums, counts, scale
            )
            if scale is None:
                nodes = j if p.mechanism == "pm1" else popcount(j)
                noise_var = self.sigma2_dp * nodes / (counts * counts)
            else:
                noise_var = self._degraded_psum_variance(j) / (counts * counts)
        elif p.mechanism == "rr":
            value = mech.randomised_response(np.clip(xbar, 0.0, 1.0), p.epsilon, self._rng)
            noise_var[:] = mech.rr_noise_variance(p.epsilon)
        else:  # gaussian or quantiser: clip to [−b, b] first (Theorem 2)
            b = self.radius(int(counts.max()))
            clipped = np.clip(xbar, -b, b)
            if p.mechanism == "gaussian":
                s2 = self.gaussian_sigma2(b)
                if self.degraded_after is not None:  # uploads past k*: multiplier m'
                    later = self.uploads_sent[agents] + 1 > self.degraded_after
                    s2 = np.where(later, (2.0 * b * self.degraded_m) ** 2, s2)
                value = clipped + np.sqrt(s2) * self._rng.standard_normal(len(agents))
            else:
                s2 = mech.quantiser_sigma2(b, p.bits)
                value = mech.quantise(clipped, b, p.bits, self._rng)
            noise_var[:] = s2
        if self.adversaries is not None:  # what an adversary's upload carries instead
            value = self.adversaries.report(agents, value, xbar)
            counts = self.adversaries.counts(agents, counts)
        return np.stack([value, counts, noise_var], axis=1)

    def gaussian_sigma2(self, b: float) -> float:
        """σ_q² of a ``gaussian`` upload clipped to [−b, b]: (41) as printed (``paper``), or
        (2b m)² with the tight multiplier m for the run's rounds (``tight``)."""
        p = self.params
        if p.calibration == "paper":
            return mech.gaussian_ldp_sigma2(b, p.epsilon, p.delta)
        return (2.0 * b * self.multiplier) ** 2

    def privacy_spend(self) -> Spend | None:
        """The uploads so far, for the `privacy` ledger: ε against the server (None when the
        uploads carry no DP noise: ``none``, ``quantiser``, known priors). ``rr`` uploads are
        binary randomised responses of ε₀ each about the agent's data (eq. (7) at X̄ = 0 and 1 is
        exactly that; other X̄ are mixtures of the two), composed by the accountant."""
        p = self.params
        if not self.communicates() or p.mechanism not in ("gaussian", "pm1", "pm2", "rr"):
            return None
        if p.mechanism == "rr":
            return Spend("rr", p.delta, {"server": (p.epsilon, self.uploads_sent)}, p.accountant)
        if p.mechanism == "gaussian":
            per = self.uploads_sent
        else:
            kappa = self.release.count[:, 0]
            per = (kappa > 0) if p.mechanism == "pm1" else np.frexp(kappa)[1]  # bit length of κ
        if self.degraded_after is not None:  # the first k* at m, the later ones at m'
            mult, per = degraded_spend(self.multiplier, per, self.gate.capacity, self.degraded_m)
            return Spend("gaussian", p.delta, {"server": (mult, per)}, p.accountant)
        noise = "gaussian" if p.mechanism == "gaussian" else p.noise
        return Spend(noise, p.delta, {"server": (self.multiplier, per)}, p.accountant)

    def budget_gate(self) -> StopGate | None:
        """The per-agent budget's state (None without a budget), for the `budget` metric."""
        return self.gate

    def _budget_gate(self) -> StopGate | None:
        """The budget's gate: k* for this run's multiplier, found once by the accountant, and
        for ``degrade`` m' and the last upload made at m (`degraded_after`)."""
        p = self.params
        #: Uploads past this count carry degraded noise (None: none ever does).
        self.degraded_after: int | None = None
        self.degraded_m = math.inf
        budget = getattr(p, "budget", None)
        if budget is None or not self.communicates():
            return None
        if p.mechanism == "rr":  # randomised responses of ε₀ each
            noise, mult = "rr", p.epsilon
        else:
            noise = "gaussian" if p.mechanism == "gaussian" else p.noise
            mult = self.multiplier
        counts = first_sample_psums(p.mechanism, np.arange(self.rounds + 1))
        most = int(counts[-1])  # the count of R uploads, the most the run makes
        k_star = capacity(noise, mult, budget.epsilon, budget.delta, most, p.accountant)
        if budget.action == "degrade":
            m_prime = degraded_multiplier(
                mult, k_star, most - k_star, budget.epsilon, budget.delta, p.accountant
            )
            if math.isfinite(m_prime) and k_star < most:
                self.degraded_m = m_prime
                self.degraded_after = int(np.count_nonzero(counts[1:] <= k_star))
        return StopGate(budget, p.mechanism, 1, len(self._agents), k_star)

    def _degraded_psum_variance(self, j: np.ndarray) -> np.ndarray:
        """Var Z of releases j when the p-sums completed after release `degraded_after` carry
        σ'² = σ_DP² (m'/m)²: PM-I sums p-sums 1…j; PM-II the node at each set bit l of j, made
        by release ⌊j/2^l⌋·2^l."""
        s2, s2_later = self.sigma2_dp, self.sigma2_dp * (self.degraded_m / self.multiplier) ** 2
        after = self.degraded_after
        j = np.asarray(j, dtype=np.int64)
        if self.params.mechanism == "pm1":
            early = np.minimum(j, after)
            return early * s2 + (j - early) * s2_later
        levels = np.arange(self.release.levels)
        made_by = (j[:, None] >> levels) << levels
        var = np.where(made_by > after, s2_later, s2)
        return (var * set_bits(j, self.release.levels)).sum(axis=1)

    def radius(self, n: int) -> float:
        """b of the clipping: `clip` if set, else Theorem 2's radius for m agents and n samples."""
        p = self.params
        if p.clip is not None:
            return float(p.clip)
        sigma_x = math.sqrt(float(np.mean(self.ctx.public["sigma2"])))
        return mech.clip_radius(p.r, p.sigma_theta, sigma_x, self.ctx.n_agents, n)

    # -- server: close a round, broadcast --------------------------------------------------
    def _close(self, r: Round) -> None:
        self.uploads_per_round.append(len(r))
        out = self.aggregate(r)
        if out is None:  # too few uploads arrived: no broadcast this round
            return
        dst, payload = out
        if self._from_server is None or len(self._from_server) != len(dst):
            self._from_server = np.full(len(dst), server_address(self.ctx.n_agents))
        self.ctx.send("broadcast", self._from_server, dst, _tagged(r.r, payload))

    def aggregate(self, r: Round) -> tuple[np.ndarray, np.ndarray] | None:
        """The server's round: (destinations, payload rows) to broadcast, or None."""
        raise NotImplementedError

    def sampling_variance(self, agents: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """σ_x²/n of the uploads of `agents` (known variances, as in §2.1)."""
        return np.asarray(self.ctx.public["sigma2"], dtype=float)[agents] / counts

    def on_deliver(self, batch: Batch) -> None:
        if not self.communicates():
            return
        upload, broadcast = self._kind_codes
        if batch.single_kind != broadcast:
            self.server.receive(batch)
        if batch.single_kind == upload:
            return
        got = batch.of_kind("broadcast")
        if len(got) == 0:
            return
        rounds = got.payload[:, 0].astype(np.int64)
        if (
            len(got) == len(self._agents)
            and (got.dst == self._agents).all()
            and (rounds > self.received_round).all()
        ):
            # the usual case: one broadcast to every agent, in order (no fancy indexing)
            self.received[:] = got.payload[:, 1 : 1 + self.broadcast_width]
            self.received_round[:] = rounds
            return
        # an agent may get several broadcasts here (a window's, or overtaking ones): keep the
        # one delivery one at a time would leave it, then only if newer than what it holds
        keep = _first_of_latest(got.dst, rounds)
        keep = keep[rounds[keep] > self.received_round[got.dst[keep]]]  # late: never overwrites
        dst = got.dst[keep]
        self.received[dst] = got.payload[keep, 1 : 1 + self.broadcast_width]
        self.received_round[dst] = rounds[keep]

    # -- estimates -------------------------------------------------------------------------
    def local(self) -> np.ndarray:
        """X̄_i of every agent (0 before its first sample)."""
        return self.sums / np.maximum(self.counts, 1)

    def estimates(self) -> np.ndarray:
        out = self.local()
        have = self.received_round > 0 if self.communicates() else np.ones(len(out), bool)
        if self.counts[0] > 0 and have.any():
            idx = np.flatnonzero(have)
            out[idx] = self.combine(idx)
        return out

    def combine(self, agents: np.ndarray) -> np.ndarray:
        """Estimates of `agents`, each of which has a broadcast (or a known prior)."""
        raise NotImplementedError


def gaussian_multiplier(
    calibration: str, epsilon: float, delta: float, rounds: int, accountant: str = "pld"
) -> float:
    """Noise multiplier σ_q/(2b) of the ``gaussian`` upload: √(2 log(2/δ))/ε₀ as (41) prints it
    (``paper``, one release), or the least one for which `rounds` uploads composed are
    (ε₀, δ)-DP per the PLD (or `accountant`) accountant (``tight``)."""
    if calibration == "paper":
        return math.sqrt(2.0 * math.log(2.0 / delta)) / epsilon
    return tight_multiplier("gaussian", float(epsilon), float(delta), int(rounds), accountant)


def _first_of_latest(dst: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """Index, for each destination in `dst`, of its first message (in delivery order) of the
    latest round it gets in `rounds`, ordered by destination.

    Delivered one at a time, a broadcast replaces an agent's only when of a later round than the
    one it holds: the agent ends with the latest round's, and of several of that round the first
    to arrive (later ones are not newer). Writing a batch's broadcasts at once would instead
    keep the last written for each agent: an older round's that arrived after a newer one (links
    are not FIFO), when a window holds both.
    """
    # stable: delivery order among a destination's messages of one round
    order = np.lexsort((-rounds, dst))
    d = dst[order]
    first = np.ones(len(d), dtype=bool)
    first[1:] = d[1:] != d[:-1]
    return order[first]


def _tagged(r: int, payload: np.ndarray) -> np.ndarray:
    """`payload` rows with the round r as column 0 (`desim.kernel.server.tag`, one copy)."""
    out = np.empty((len(payload), payload.shape[1] + 1))
    out[:, 0] = r
    out[:, 1:] = payload
    return out


#: The [adversaries] behaviours meaningful for the server protocols (uploads carry a mean and a
#: count, which the server's moments read).
ADVERSARY_BEHAVIOURS = ("shift", "flip", "collude", "inflate")


def check_upload_adversaries(params: Any) -> None:
    """Check an upload protocol's ``adversaries`` table and keep it as a (hashable)
    `Adversaries`."""
    if params.adversaries is not None:
        table = Adversaries.from_table(
            params.adversaries, ADVERSARY_BEHAVIOURS, "the empirical-Bayes server protocols"
        )
        object.__setattr__(params, "adversaries", table)


def check_upload_budget(params: Any) -> None:
    """Check an upload protocol's ``budget`` (`set_budget`): only for uploads with DP noise,
    ``degrade`` only for Gaussian noise (whose mixed compositions the ledger adds exactly)."""
    if params.budget is None:
        return
    mechanism = getattr(params, "mechanism", "none")
    if mechanism not in ("gaussian", "rr", "pm1", "pm2"):
        raise ValueError(
            f"budget: needs an upload mechanism with DP noise (gaussian, rr, pm1, pm2); "
            f"mechanism = {mechanism!r}"
        )
    gaussian = mechanism == "gaussian" or (mechanism != "rr" and params.noise == "gaussian")
    set_budget(params, params.delta, ("stop", "degrade") if gaussian else ("stop",))


@METRICS.register("eb")
@records("eb_uploads")
@applies_to(ServerEstimation)
def eb_metrics(protocol: Any, data: Any) -> dict[str, float]:
    """``eb_uploads``: uploads the server used in its latest round (NaN before one closes)."""
    if not isinstance(protocol, ServerEstimation):
        return {}
    rounds = protocol.uploads_per_round
    return {"eb_uploads": float(rounds[-1]) if rounds else float("nan")}
