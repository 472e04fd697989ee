"""Forgetting for the empirical-Bayes uploads (desim's extension, `desim.models.forgetting`).

With ``forget = {…}`` every agent's upload and its own mean are the forgetting statistic of its
samples instead of the running mean:

- ``none``, ``gaussian``, ``quantiser``, ``rr``: the upload is the weighted mean
  Σ w_s x_s/Σ w_s (window, rate or reset), sent with n_eff = (Σ w_s)²/Σ w_s² as its count, so
  the server's σ_x²/n is its sampling variance. A weighted mean of samples in the support is in
  the support, so the user-level mechanisms' sensitivity (2b after clipping, 1 for ``rr``) and
  noise are those of the running mean: each upload reveals no more, and the ledger counts the
  same R uploads.
- ``pm1``, ``pm2``: the agent still makes its p-sum release of its whole prefix
  (`desim.models.privacy.release.PSumRelease`), and uploads the difference of two prefixes it
  has released, (t_j R_j − t_i R_i)/(t_j − t_i) over the samples t_i + 1 … t_j
  (`RoundPrefixes`: `desim.models.forgetting.PrefixWindow`'s rule for agents that all release
  at every round): post-processing of releases, so the ledger is the one without forgetting.
  Its noise variance is σ_DP² times the p-sums (PM-I) or tree nodes (PM-II) the difference
  keeps (`difference_noise_count`). Exponential weights are refused: a
  p-sum's samples are released summed, so weights λ^(t − s) within one cannot be applied. A
  window must hold a whole round (W ≥ round) and a reset fall on a round (τ − 1 a multiple of
  round), so that every upload covers samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.models.forgetting import RULES, Forget, ForgettingSums, difference_noise_count

#: Why p-sum uploads allow no exponential weights (the message of a refused rate).
_PSUM_WHY = "a p-sum's samples are released summed: no weights λ^(t − s) within one"


def check_upload_forget(params: Any) -> None:
    """Check a scenario's ``forget`` table against its upload mechanism and rounds, and keep it
    as a `Forget`; ValueError (one line) for what cannot be computed exactly."""
    if params.forget is None:
        return
    psums = params.mechanism in ("pm1", "pm2")
    allowed = ("window", "reset") if psums else RULES
    why = _PSUM_WHY if psums else "all"
    forget = Forget.from_table(params.forget, allowed, f"mechanism = {params.mechanism!r}", why)
    object.__setattr__(params, "forget", forget)
    every = params.round
    if psums and every is None:
        raise ValueError(
            f"forget: {forget.rule} = {forget.value!r}: p-sum uploads need rounds (set round): "
            "one upload has no earlier release to difference"
        )
    if getattr(params, "budget", None) is not None:
        raise ValueError("forget: not with a budget yet (remove budget or forget)")
    if psums and every is not None and forget.rule == "window" and forget.window < every:
        raise ValueError(
            f"forget: window = {forget.window}: p-sum uploads every round = {every} slots need "
            f"window ≥ round"
        )
    if psums and every is not None and forget.rule == "reset" and (forget.reset - 1) % every:
        raise ValueError(
            f"forget: reset = {forget.reset}: p-sum uploads every round = {every} slots need "
            f"τ − 1 a multiple of round"
        )


class UploadForgetting:
    """The forgetting statistic of every agent's samples and, for p-sum uploads, the prefixes
    its uploads difference (one per agent; the server is every agent's one receiver)."""

    def __init__(self, forget: Forget, n_agents: int, mechanism: str, every: int) -> None:
        self.forget = forget
        self.mechanism = mechanism
        self.samples = ForgettingSums(forget, n_agents)
        self.psums = mechanism in ("pm1", "pm2")
        if self.psums:
            #: The running sum and count of every agent's samples (what its p-sums cover).
            self.full_sums = np.zeros(n_agents)
            self.full_count = 0
            self.prefixes = RoundPrefixes(forget, n_agents, every)

    @staticmethod
    def bytes_per_agent(params: Any, t_max: int) -> float:
        """Bytes this forgetting holds per agent (nothing without a ``forget`` table), for the
        memory estimate of `desim validate`."""
        forget = getattr(params, "forget", None)
        if forget is None:
            return 0.0
        own = ForgettingSums.bytes_per_agent(forget)
        if params.mechanism not in ("pm1", "pm2"):
            return own
        every = int(params.round) if params.round is not None else t_max
        return own + 8.0 + RoundPrefixes.bytes_per_agent(forget, every)

    @classmethod
    def build(cls, params: Any, n_agents: int, every: int) -> UploadForgetting | None:
        """The forgetting of a run with these parameters (None without a ``forget`` table)."""
        forget = getattr(params, "forget", None)
        return None if forget is None else cls(forget, n_agents, params.mechanism, every)

    def add(self, t: int, samples: np.ndarray, sums: np.ndarray, counts: np.ndarray) -> None:
        """Take slot t's samples; write into the protocol's `sums` and `counts` the forgetting
        mean times n_eff and n_eff (so that sums/counts is the mean and σ²/counts its
        variance: everything that reads them is the forgetting statistic's)."""
        self.samples.add(t, samples)
        n = self.samples.effective()
        counts[:] = n
        np.multiply(self.samples.mean(), n, out=sums)
        if self.psums:
            self.full_sums += samples
            self.full_count += 1

    def release(
        self, release: Any, agents: np.ndarray, sigma2_dp: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, count, noise variance) of the p-sum uploads of `agents`: the release of the
        whole prefix, differenced against the window's base release."""
        t = float(self.full_count)
        value, j, _ = release.release(
            agents,
            np.zeros(len(agents), dtype=np.int64),
            self.full_sums[agents],
            np.full(len(agents), t),
        )
        # every agent releases at every round, so j (as t) is every agent's
        n, noisy_sum, i = self.prefixes.take(value, t, int(j[0]))
        n_safe = max(n, 1.0)  # (n ≥ round by the checks above)
        if self.mechanism == "pm1":  # (the p-sums i + 1 … j: an integer, exact as a float)
            count = float(j[0] - i)
        else:
            count = difference_noise_count(self.mechanism, j[:1], np.array([i]))[0]
        noise = sigma2_dp * count / (n_safe * n_safe)
        k = len(agents)
        return noisy_sum / n_safe, np.full(k, n), np.full(k, noise)


class RoundPrefixes:
    """The prefixes every agent released, one row a round, and the base a ``forget`` rule
    differences against: `desim.models.forgetting.PrefixWindow`'s rule (the same base, n and
    noisy sum) for agents that all release at every round. A ``forget`` table refuses budgets,
    so no upload is withheld, and the releases' t and j, the base and n are every agent's: the
    base is searched once a round, over scalars.

    ``window = W``: the base i is the oldest release with t_j − t_i ≤ W (row k mod rows holds
    release k; rows = W // round + 2 bounds the releases in a window, plus this one);
    ``reset = τ``: the first release whose prefix ends at or after slot τ − 1, from slot τ on
    (before it, every sample)."""

    def __init__(self, forget: Forget, n_agents: int, every: int) -> None:
        self.forget = forget
        rows = forget.window // every + 2 if forget.rule == "window" else 1
        # row 0 starts as release 0, the empty prefix (t = 0); under reset it is the base
        self._prefix = np.zeros((rows, n_agents))
        self._t = np.zeros(rows)
        self._head = 0  # the window's base
        self._base_j = 0  # the reset's base (0: none stored yet)

    @staticmethod
    def bytes_per_agent(forget: Forget, every: int) -> float:
        """Bytes per agent of the rows a `RoundPrefixes` of this rule and round keeps."""
        return 8.0 * (forget.window // every + 2 if forget.rule == "window" else 1)

    def take(self, value: np.ndarray, t: float, j: int) -> tuple[float, np.ndarray, int]:
        """Take every agent's release j (values R_j, made at t): (n, S̃, i) with n = t_j − t_i
        the samples kept, S̃ each agent's noisy sum over them and i the base release."""
        prefix = value * t
        if self.forget.rule == "reset":
            return self._take_reset(prefix, t, j)
        rows = len(self._t)
        self._prefix[j % rows], self._t[j % rows] = prefix, t
        head = self._head
        while t - self._t[head % rows] > self.forget.window:  # (it stops at j at the latest)
            head += 1
        self._head = head
        return t - self._t[head % rows], prefix - self._prefix[head % rows], head

    def _take_reset(self, prefix: np.ndarray, t: float, j: int) -> tuple[float, np.ndarray, int]:
        """`take` under ``reset = τ``: the empty prefix before slot τ; from τ on the first release
        whose prefix ends at or after slot τ − 1 (n = 0 until a later one)."""
        tau = self.forget.reset
        if t >= tau - 1 and self._base_j == 0:  # the first such release: the base
            self._prefix[0], self._t[0], self._base_j = prefix, t, j
        if t < tau:  # before τ the statistic is every sample's
            return t, prefix, 0
        return t - self._t[0], prefix - self._prefix[0], self._base_j
