"""Private-ColME with forgetting (desim's extension, `desim.models.forgetting`): windows over
the releases already made.

Agent b's release j to a is R_j = (S_b(t_j) + Z_j)/t_j, a noisy prefix sum over its first t_j
samples. The difference of two releases of the same pair,

    t_j R_j − t_i R_i = S_b(t_i + 1 … t_j) + (Z_j − Z_i),

is the sum of b's samples t_i + 1 … t_j plus the noise of the p-sums between them: under PM-I
the p-sums i + 1 … j (Z_j − Z_i carries j − i of them), under PM-II the tree nodes of j and of i
that are not shared (a node at level ℓ is (ℓ, j >> ℓ); shared ones cancel). So a querier makes
its windowed statistic from releases it holds — post-processing — and

    T^W_{b→a} = (t_j R_j − t_i R_i)/n,  Var[T^W] = (σ_b² n + σ_DP² N)/n²,  n = t_j − t_i,

N the p-sums or nodes the difference keeps (`difference_noise_count`). What it costs in
releases: nothing. Every release is still made and counted when made (a sample that leaves the
window was released all the same): the `privacy` ledger is the one without forgetting, release
for release.

``window = W``: the base i is the oldest release a holds with t_j − t_i ≤ W (the empty prefix
while t_j ≤ W), so the window holds the whole p-sums within b's last W samples (a p-sum is the
granularity: under RR, M − 1 samples); until one fits, T is undefined (weight 0, b kept in C_a).
``reset = τ``: the base is the first release at or after b's slot τ − 1. Agent a's own mean is
the same rule over its own samples (`ForgettingSums`), in the z-test (σ_a²/n_a) and in Lemma 4's
combination (weight n_a/σ_a²).

Refused, with why: ``rate`` (a p-sum's samples are released summed: weights λ^(t − s) within one
cannot be applied); unknown variances, MoM weights, budgets, the trimmed combination, a graph
and asynchronous links (this first version keeps one statistic per pair, taken in order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.models.colme.model import combine, z_accepts
from desim.models.forgetting import Forget, ForgettingSums, PrefixWindow, difference_noise_count

#: The forgetting rules Private-ColME computes exactly.
PEER_FORGET = ("window", "reset")


def check_forget(params: Any) -> None:
    """Check a scenario's ``forget`` table against Private-ColME's other parameters and keep it
    as a `Forget`; ValueError (one line) naming the field for what this version refuses."""
    if params.forget is None:
        return
    why = "a p-sum's samples are released summed: no weights λ^(t − s) within one"
    forget = Forget.from_table(params.forget, PEER_FORGET, "private-colme", why)
    object.__setattr__(params, "forget", forget)
    needs = {
        "variance": "known",
        "weights": "last",
        "peers": "all",
        "combination": "weighted",
        "budget": None,
    }
    for name, allowed in needs.items():
        if getattr(params, name) != allowed:
            raise ValueError(
                f"forget: with {name} = {getattr(params, name)!r} not yet (allowed with forget: "
                f"{name} = {allowed!r})"
            )


def check_forget_links(params: Any, links: Any) -> None:
    """Refuse forgetting over links that are not ideal (one line)."""
    if params.forget is not None and links is not None and not links.ideal:
        raise ValueError("forget: needs ideal links (releases taken in order, one per query)")


def release_windows(protocol: Any) -> ReleaseWindows | None:
    """The windows of a Private-ColME run with a ``forget`` table (None without one): their
    rings hold the most releases of one pair within W + 1 slots (`kappa_max`), plus one."""
    p = protocol.params
    if p.forget is None:
        return None
    kept = protocol.kappa_max((p.forget.window or 1) + 1) + 1
    return ReleaseWindows(p.forget, protocol.ctx.n_agents, p.mechanism, kept)


class ReleaseWindows:
    """The windowed statistic T^W_{b→a} and Var[T^W] of every ordered pair, and every agent's
    own forgetting mean (the strategy Private-ColME chooses once under ``forget``)."""

    def __init__(self, forget: Forget, n_agents: int, mechanism: str, kept: int) -> None:
        # `kept`: the most releases of one pair within a window, plus one
        self.mechanism = mechanism
        self.own = ForgettingSums(forget, n_agents)
        self.prefixes = PrefixWindow(forget, n_agents * n_agents, kept)
        #: T^W and Var[T^W] of every pair [a, b] (+∞: undefined, weight 0).
        self.value = np.zeros((n_agents, n_agents))
        self.var = np.full((n_agents, n_agents), np.inf)

    def add(self, t: int, samples: np.ndarray) -> None:
        """Slot t's own samples; at a reset every pair's T^W is undefined until its next
        difference (T over samples before τ is forgotten too)."""
        self.own.add(t, samples)
        if t == self.own.forget.reset:
            self.var.fill(np.inf)
            self.value.fill(0.0)

    def take(
        self,
        pair: np.ndarray,
        values: np.ndarray,
        t_b: np.ndarray,
        j: np.ndarray,
        sigma2_b: np.ndarray,
        sigma2_dp: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Take releases (value R_j, made at t_b) of pairs `pair`: their (T^W, Var[T^W])."""
        n, noisy_sum, i = self.prefixes.take(pair, values, t_b, j)
        # (PM-I: the p-sums between, j − i, inline: the usual case, every slot)
        noise = j - i if self.mechanism == "pm1" else difference_noise_count("pm2", j, i)
        if n.all():  # (the usual case: every window holds a p-sum)
            value = noisy_sum / n
            var = (sigma2_b * n + sigma2_dp * noise) / (n * n)
        else:
            have = n > 0
            n_safe = np.where(have, n, 1.0)
            value = np.where(have, noisy_sum / n_safe, 0.0)
            var = np.where(have, (sigma2_b * n + sigma2_dp * noise) / (n_safe * n_safe), np.inf)
        self.value.ravel()[pair] = value
        self.var.ravel()[pair] = var
        return value, var

    def accepts(
        self, a: np.ndarray, sigma2_a: np.ndarray, value: np.ndarray, var: np.ndarray, z: Any
    ) -> np.ndarray:
        """The z-test of §III-C1 with a's own window (its n_a samples' sum) for X̄_a."""
        # (a window's or a reset's weights are 1: the weight total is n_a)
        return z_accepts(self.own.sums[a], self.own.weight, sigma2_a, value, var, z)

    def estimates(self, included: np.ndarray, sigma2: np.ndarray) -> np.ndarray:
        """Lemma 4 over the pairs' windowed statistics and each agent's own forgetting mean."""
        local = self.own.mean()
        with np.errstate(divide="ignore"):
            own = self.own.effective() / sigma2
            weight = np.where(included, 1.0 / self.var, 0.0)
        np.fill_diagonal(weight, 0.0)  # a itself
        return combine(local, own, (weight * self.value).sum(axis=1), weight.sum(axis=1))
