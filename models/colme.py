"""Private-ColME (seed 002, known data variance): query, privatised release, z-test, combine.

Each slot, every agent a queries one other agent b (schedule RR or rRR, §III-E). Agent b
answers with a privatised running mean (PM-I or PM-II, `models.release`). Agent a keeps the
statistic T_{b→a} with its exact variance (`models.statistic`), decides whether b is in its
class by the z-test of §III-C1 when b answers, and estimates its mean by the inverse-variance
combination of Lemma 4 over the agents it currently believes are in its class, with the
bracketing of (3)–(4) corrected as in the digest:

    μ_a = (t/σ_a² · X̄_a + Σ_b T_{b→a}/Var[T_{b→a}]) / (t/σ_a² + Σ_b 1/Var[T_{b→a}]).

Choices the paper leaves open, made here:
- RR order: agent a queries a+1, a+2, … (mod M), skipping itself, so every agent is queried
  exactly once per slot; agent a's k-th other agent is at RR position k (Prop. 3's ℓ).
- rRR skips agents outside C_a^{(t-1)}. A decision about b is revised only when b answers, so an
  excluded agent is never queried again; if a excludes everyone, a sends no more queries and
  its estimate is its local mean from then on.
- The z-test is evaluated when b's release arrives, with t = a's current sample count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.special import ndtri

from desim.messages import Batch
from desim.params import param
from desim.protocol import Context, Protocol
from desim.registry import PROTOCOLS
from models.privacy import mechanism_budget, noise_sigma2
from models.release import PSumRelease, levels_for
from models.statistic import PairStatistic


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


@PROTOCOLS.register("private-colme")
class PrivateColME(Protocol):
    """Private-ColME: privatised queries, z-test class estimates, inverse-variance combination."""

    Params = PrivateColMEParams
    message_kinds = ("query", "release")

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        p = self.params
        m = ctx.n_agents
        self.sigma2 = np.asarray(ctx.public["sigma2"], dtype=float)
        eps, delta = mechanism_budget(p.mechanism, p.epsilon, p.delta, p.budget_t_max or ctx.t_max)
        #: σ_DP², the noise variance of every p-sum.
        self.sigma2_dp = noise_sigma2(p.noise, ctx.public["L"], eps, delta)
        self.mech = PSumRelease(
            m, p.mechanism, p.noise, self.sigma2_dp, ctx.streams.get("dp-noise"), ctx.t_max
        )
        self.stat = PairStatistic(
            m, p.mechanism, p.weights, self.sigma2, self.sigma2_dp, levels_for(ctx.t_max)
        )
        #: Running sum and count of each agent's own samples.
        self.sums = np.zeros(m)
        self.counts = np.zeros(m)
        #: C_a^{(t)} as a boolean matrix [a, b]: a believes b is in its class (χ_a(b) = 1).
        self.included = np.ones((m, m), dtype=bool)
        self._n_included = np.full(m, m)  # row sums of `included`, kept current
        self._agents = np.arange(m)
        self._offset = np.zeros(m, dtype=np.int64)  # RR position last queried, 0 = none yet
        # z-test quantile Φ⁻¹(1 − θ_t/2) of every slot t, θ_t = theta/ln(t+1) (index 0 unused)
        t = np.arange(1, ctx.t_max + 2, dtype=float)
        self._z = np.concatenate([[np.inf], ndtri(1.0 - p.theta / (2.0 * np.log(t + 1.0)))])

    # -- slot: new samples, then queries ---------------------------------------------------
    def on_samples(self, t: int, samples: np.ndarray) -> None:
        self.sums += samples
        self.counts += 1
        if self.params.schedule == "rr":
            a = self._agents
            offset = (t - 1) % (len(a) - 1) + 1
        else:
            a, offset = self._next_included()
            self._offset[a] = offset
        self.ctx.send("query", a, (a + offset) % len(self._agents))

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
        queries = batch.of_kind("query")
        if len(queries):
            b, a = queries.dst, queries.src
            values, j = self.mech.release(b, a, self.sums[b], self.counts[b])
            payload = np.empty((len(b), 3))
            payload[:, 0], payload[:, 1], payload[:, 2] = values, self.counts[b], j
            self.ctx.send("release", b, a, payload)
        releases = batch.of_kind("release")
        if len(releases):
            self._take_releases(releases)

    def _take_releases(self, releases: Batch) -> None:
        a, b = releases.dst, releases.src
        values, t_b, j = releases.payload[:, 0], releases.payload[:, 1], releases.payload[:, 2]
        value, var = self.stat.update(a, b, values, t_b, j.astype(np.int64))
        decision = self._decide(a, b, value, var)
        change = decision.astype(np.int64) - self.included[a, b]
        self.included[a, b] = decision
        self._n_included += np.bincount(a, weights=change, minlength=len(self._agents)).astype(
            np.int64
        )

    def _decide(
        self, a: np.ndarray, b: np.ndarray, value: np.ndarray, var: np.ndarray
    ) -> np.ndarray:
        """χ_a(b) of §III-C1: |X̄_a − T_{b→a}| < Φ⁻¹(1−θ_t/2)·√(σ_a²/t + Var[T_{b→a}])."""
        t = self.counts[a]
        z = self._z[t.astype(np.int64)]
        spread = np.sqrt(self.sigma2[a] / t + var)
        return np.abs(self.sums[a] / t - value) < z * spread

    # -- estimates -------------------------------------------------------------------------
    def estimates(self) -> np.ndarray:
        local = self.sums / np.maximum(self.counts, 1)
        with np.errstate(divide="ignore"):
            own = self.counts / self.sigma2  # t/σ_a²
            weight = np.where(self.included, 1.0 / self.stat.var, 0.0)
        np.fill_diagonal(weight, 0.0)
        num = own * local + (weight * self.stat.value).sum(axis=1)
        den = own + weight.sum(axis=1)
        with np.errstate(invalid="ignore"):
            mu = num / den
        return np.where(np.isfinite(own) & (self.counts > 0), mu, local)


@PROTOCOLS.register("private-colme-oracle")
class PrivateColMEOracle(PrivateColME):
    """Private-ColME with the true classes instead of the z-test (the Prop. 3 oracle)."""

    uses_oracle = True

    def _decide(
        self, a: np.ndarray, b: np.ndarray, value: np.ndarray, var: np.ndarray
    ) -> np.ndarray:
        classes = self.ctx.oracle_classes
        return classes[a] == classes[b]

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        # The oracle knows C_a from the start, so rRR never queries other classes.
        self.included = ctx.oracle_classes[:, None] == ctx.oracle_classes[None, :]
        self._n_included = self.included.sum(axis=1)
