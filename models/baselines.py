"""The local and ideal baselines (seed 002 Props. 1 and 2): protocols, closed forms and curves.

Every protocol family compares against these two. The protocols exchange no messages; the
closed forms are Props. 1–2 of Yakimenka et al., "Differentially-Private Collaborative Online
Personalized Mean Estimation" (seed 002); the curves
are registered in `desim.kernel.registry.CURVES` as ``local`` and ``ideal``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike

from desim.kernel.params import param
from desim.kernel.protocol import Context, StopsSampling
from desim.kernel.registry import CURVES, PROTOCOLS
from desim.models.adversaries import BEHAVIOURS, STREAM, Adversaries
from desim.models.forgetting import (
    Forget,
    ForgettingSums,
    forget_param,
    refuse_when_stopping,
    weighted_mean_mse,
)


@dataclass(frozen=True)
class NoParams:
    """A protocol without parameters."""


#: The forgetting rules of the baselines: each is a weighted mean of an agent's own samples with
#: public weights, so all three are exact (`desim.models.forgetting`).
BASELINE_FORGET = ("window", "rate", "reset")


@dataclass(frozen=True)
class BaselineParams(NoParams):
    """Parameters of the local and ideal baselines: their forgetting rule, and an
    [adversaries] table read only by the metric."""

    forget: dict | None = forget_param()
    adversaries: dict | None = param(
        None,
        "an [adversaries] table: which agents are adversaries, so that the `adversaries` "
        "metric scores the honest ones (a baseline sends nothing an adversary could corrupt)",
    )
    #: Without these the config hash is the one from before the parameters existed.
    hash_omits_absent: ClassVar = ("forget", "adversaries")

    def __post_init__(self) -> None:
        if self.forget is not None:  # the study's table, checked, kept as a (hashable) Forget
            forget = Forget.from_table(self.forget, BASELINE_FORGET, "local / ideal", "all")
            object.__setattr__(self, "forget", forget)
        if self.adversaries is not None:  # every behaviour: none changes what a baseline does
            table = Adversaries.from_table(
                self.adversaries, tuple(BEHAVIOURS), "the baselines", forwards=True
            )
            object.__setattr__(self, "adversaries", table)


@PROTOCOLS.register("local")
class Local(StopsSampling):
    """Every agent estimates its mean by its own running mean X̄_a (MSE σ²/t, Prop. 1)."""

    Params = BaselineParams
    reads = frozenset()  # no messages, no graph: [network] and [topology] are not its
    reads_exact = True  # no draws of its own: one trajectory whatever the network and graph

    @classmethod
    def check_setup(cls, params: Any, data: Any, links: Any) -> None:
        """Refuse adversaries that are not agents of this population."""
        if getattr(params, "adversaries", None) is not None:
            params.adversaries.check(data.n_agents, data.classes)

    @classmethod
    def memory_per_unit(cls, params: Any, t_max: int, sizes: Any = None) -> dict[str, float]:
        """The declared bytes, and per agent a ``forget`` table's sums (a window's samples)."""
        forget = getattr(params, "forget", None)
        own = 0.0 if forget is None else ForgettingSums.bytes_per_agent(forget)
        return {**cls.memory, "agent": cls.memory.get("agent", 0.0) + own}

    def setup(self, ctx: Context) -> None:
        super().setup(ctx)
        self.sums = np.zeros(ctx.n_agents)
        #: Samples taken: one count for all, or each agent's own once some stop sampling.
        self.counts: int | np.ndarray = 0
        spec = getattr(self.params, "adversaries", None)
        #: Which agents are adversaries (the same draw as every protocol's), None without.
        self.adversary_mask = (
            None if spec is None else spec.draw(ctx.n_agents, ctx.streams.get(STREAM))
        )
        forget = getattr(self.params, "forget", None)
        #: The forgetting statistic of every agent's samples (None: every sample counts).
        self.forgetting = None if forget is None else ForgettingSums(forget, ctx.n_agents)

    def adversary_state(self) -> tuple[np.ndarray, None] | None:
        """(which agents are adversaries, None: a baseline accepts no one), for the
        `adversaries` metric; None without an [adversaries] table."""
        return None if self.adversary_mask is None else (self.adversary_mask, None)

    def on_samples(self, t: int, samples: np.ndarray) -> None:
        if self.forgetting is not None:
            self.forgetting.add(t, samples)
            return
        self.sums += samples
        self.counts += 1

    @classmethod
    def check_stops(cls, params: Any) -> None:
        """Refuse a ``forget`` rule when agents stop sampling."""
        refuse_when_stopping(params)

    def stop_sampling(self) -> None:
        """Count each agent's own samples (a stopped agent's mean is over those it had)."""
        self.check_stops(self.params)
        self.counts = np.zeros(self.ctx.n_agents, dtype=np.int64)
        self.on_samples = self._on_fresh_samples  # chosen once: the common case stays as it is

    def _on_fresh_samples(self, t: int, samples: np.ndarray) -> None:
        fresh = ~np.isnan(samples)
        self.sums += np.where(fresh, samples, 0.0)
        self.counts += fresh

    def estimates(self) -> np.ndarray:
        if self.forgetting is not None:
            return self.forgetting.mean()
        return self.sums / np.maximum(self.counts, 1)


@PROTOCOLS.register("ideal")
class Ideal(Local):
    """Every agent averages all samples of its true class (MSE σ²/(|C_a| t), Prop. 2; when
    agents stop sampling, all the samples its class has taken).

    This is the paper's "public data with known classes" benchmark, so it uses the truth.
    """

    uses_oracle = True
    reads_exact = True  # the true classes and the data only

    def estimates(self) -> np.ndarray:
        classes = self.ctx.oracle_classes
        if np.ndim(self.counts):  # some agents stopped: the class's samples over their number
            taken = np.bincount(classes, weights=self.counts)
            return (np.bincount(classes, weights=self.sums) / np.maximum(taken, 1))[classes]
        size = np.bincount(classes)
        if self.forgetting is not None:  # the class's forgetting sums over its weight total
            sums, weight = self.forgetting.sums, self.forgetting.weight
        else:
            sums, weight = self.sums, self.counts
        class_mean = np.bincount(classes, weights=sums) / np.maximum(size, 1)
        return class_mean[classes] / max(weight, 1)


# ------------------------------------------------------------------ closed forms


def local_mse(t: ArrayLike, sigma2: ArrayLike) -> np.ndarray:
    """Prop. 1: (1/(M t)) Σ_a σ_a² (σ²/t for equal variances)."""
    return np.mean(np.asarray(sigma2, dtype=float)) / np.asarray(t, dtype=float)


def ideal_mse(t: ArrayLike, sigma2: ArrayLike, class_sizes_per_agent: ArrayLike) -> np.ndarray:
    """Prop. 2: (1/(M t)) Σ_a σ_a²/|C_a| for given per-agent σ_a² and class sizes |C_a|."""
    sizes = np.asarray(class_sizes_per_agent, dtype=float)
    s2 = np.broadcast_to(np.asarray(sigma2, dtype=float), sizes.shape)
    return np.mean(s2 / sizes) / np.asarray(t, dtype=float)


def expected_inverse_class_size(M: int, n_classes: int) -> float:
    """E[1/|C_a|] for |C_a| = 1 + Binomial(M−1, 1/Γ), classes drawn uniformly (for Prop. 2).

    Uses the identity E[1/(1+X)] = (1 − (1−q)^{n+1}) / ((n+1) q) for X ~ Binomial(n, q).
    """
    if isinstance(M, bool) or int(M) != M or M < 2:
        raise ValueError(f"M = {M!r}: must be an integer ≥ 2")
    M = int(M)
    if int(n_classes) != n_classes or n_classes < 1:
        raise ValueError(f"n_classes = {n_classes!r}: must be an integer ≥ 1")
    q = 1.0 / n_classes
    return float(-np.expm1(M * np.log1p(-q)) / (M * q)) if q < 1 else 1.0 / M


def drift_mse(t: ArrayLike, data: Any) -> np.ndarray:
    """What a `[data.drift]` adds to the MSE of a running mean over every slot so far (the
    local baseline's, and the ideal one's for drift that keeps classes), against the means at
    t: its squared bias, in expectation over the drift's draws (0 without drift).

    Linear: r²(t − 1)²/4. Random walk: step²(t − 1)(2t − 1)/(6t), the variance of
    (1/t) Σ_{j=2..t} (j − 1) z_j. Switch at τ (local only): from t = τ on, the switched share
    times E[(μ_c − μ_{c+1})²] times ((τ − 1)/t)², the class c of a switched agent drawn like
    the agents' classes.
    """
    tt = np.asarray(t, dtype=float)
    drift = getattr(data, "drift_model", None)
    if drift is None:
        return np.zeros_like(tt)
    if drift.model == "linear":
        return (drift.rate * (tt - 1)) ** 2 / 4
    if drift.model == "random-walk":
        return drift.step**2 * (tt - 1) * (2 * tt - 1) / (6 * tt)
    after = tt >= drift.at
    return np.where(after, switch_jump2(data) * ((drift.at - 1) / tt) ** 2, 0.0)


def switch_jump2(data: Any) -> float:
    """A switch's squared jump over the population: the switched share times E[(μ_c −
    μ_{c+1})²], the class c of a switched agent drawn like the agents' classes."""
    drift = data.drift_model
    means = np.asarray(data.class_means, dtype=float)
    jump2 = (np.roll(means, -1) - means) ** 2  # class c to c + 1 (the last to the first)
    M = int(data.agents)
    if data.assignment == "balanced":
        weights = np.bincount(np.arange(M) % len(means), minlength=len(means)) / M
    else:
        weights = np.full(len(means), 1 / len(means))
    share = max(1, round(drift.fraction * M)) / M
    return share * float(weights @ jump2)


# ------------------------------------------------------------------ curves


def class_variances(data: Any) -> np.ndarray:
    """σ_c² of every class: μ_c(1−μ_c) for Bernoulli data, σ² otherwise."""
    means = np.asarray(data.class_means, dtype=float)
    if data.distribution == "bernoulli":
        return means * (1.0 - means)
    return np.full(len(means), float(data.sigma) ** 2)


def time_grid(t: np.ndarray) -> np.ndarray:
    """`t` as a 1-D float array of times > 0, or a ValueError naming it."""
    tt = np.asarray(t, dtype=float)
    if tt.ndim != 1 or np.any(~(tt > 0)):
        raise ValueError(f"t = {t!r}: must be a 1-D array of times > 0")
    return tt


@CURVES.register("local")
@dataclass(frozen=True)
class LocalCurve:
    """Prop. 1: every agent keeps its own running mean, MSE = mean_a σ_a² / t (plus the squared
    bias a [data.drift] gives, `drift_mse`)."""

    forget: dict | None = param(
        None,
        "the local baseline's forget table {window = W | rate = λ | reset = τ} "
        "(`desim.models.forgetting`; with drift: linear or switch)",
    )
    #: Whether the curve is the closed form under [data.drift] too (others are refused then).
    follows_drift: ClassVar[bool] = True
    #: Curves from before `forget` keep their config hashes (`desim.study.spec.hashing`).
    hash_omits_absent: ClassVar = ("forget",)

    def check(self, data: Any) -> None:
        """Refuse a bad forget table, and one under a random walk (no closed form here)."""
        if self.forget is not None:
            Forget.from_table(self.forget, BASELINE_FORGET, "kind 'local'", "all")
        drift = getattr(data, "drift_model", None)
        if self.forget is not None and drift is not None and drift.model == "random-walk":
            raise ValueError(
                "kind 'local' with forget: no closed form under drift model = 'random-walk' "
                "(allowed: linear, switch)"
            )

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) of Prop. 1 on the grid `t` (with forget: `weighted_mean_mse`)."""
        tt = time_grid(t)
        if self.forget is not None:
            return _forgetting_curve(tt, data, self.forget), np.zeros_like(tt)
        # Classes are equally likely, so the agent average of σ_a² is the class average.
        mse = local_mse(tt, class_variances(data))
        if getattr(data, "drift", None) is not None:
            mse = mse + drift_mse(tt, data)
        return mse, np.zeros_like(tt)


def _forgetting_curve(t: np.ndarray, data: Any, table: dict) -> np.ndarray:
    """The local baseline's MSE with a forget table at times `t` (their integer slots)."""
    forget = Forget.from_table(table, BASELINE_FORGET, "kind 'local'", "all")
    drift = getattr(data, "drift_model", None)
    rate = drift.rate if drift is not None and drift.model == "linear" else 0.0
    switch = (drift.at, switch_jump2(data)) if drift is not None and drift.model == "switch" else ()
    sigma2 = float(np.mean(class_variances(data)))
    return weighted_mean_mse(np.rint(t), sigma2, forget, rate, switch)


@CURVES.register("ideal")
@dataclass(frozen=True)
class IdealCurve:
    """Prop. 2: agents know their classes and average all class data, MSE = E[σ_a²/|C_a|]/t.

    With random assignment |C_a| = 1 + Binomial(M−1, 1/Γ) (Γ classes) and the exact
    E[1/|C_a|] = (1 − (1−1/Γ)^M)/(M/Γ) is used; with `assignment = "balanced"` the class sizes
    are known exactly and Prop. 2 is evaluated on them.
    """

    agents: int | None = param(None, "number of agents M (default: the study's data.agents)", ge=2)
    #: Whether the curve is the closed form under [data.drift] too (a switch is refused).
    follows_drift: ClassVar[bool] = True

    def check(self, data: Any) -> None:
        """Refuse a switch: the ideal baseline knows the classes of slot 1 only."""
        drift = getattr(data, "drift_model", None)
        if drift is not None and drift.model == "switch":
            raise ValueError(
                "kind 'ideal' knows the classes of slot 1 only: no closed form under "
                "drift model = 'switch' (allowed: linear, random-walk)"
            )

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, zeros) of Prop. 2 on the grid `t` (plus `drift_mse` under [data.drift])."""
        tt = time_grid(t)
        s2 = class_variances(data)
        M, n_classes = int(self.agents or data.agents), len(s2)
        if getattr(data, "assignment", "random") == "balanced":
            classes = np.arange(M) % n_classes
            sizes = np.bincount(classes, minlength=n_classes)
            mse = ideal_mse(tt, s2[classes], sizes[classes])
        else:
            mse = float(np.mean(s2)) * expected_inverse_class_size(M, n_classes) / tt
        if getattr(data, "drift", None) is not None:
            mse = mse + drift_mse(tt, data)
        return mse, np.zeros_like(tt)
