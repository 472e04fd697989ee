"""Closed forms of the consensus family (seed 001 §IV, docs/papers.md §2.4, §3.8) and their curves.

On a class component c of n_c agents with a doubly stochastic W, the consensus
Y^(t) = (1−α_t) X̃^(t) + α_t W Y^(t−1) has a component average that obeys the scalar recursion
m^(t) = (1−α_t) X̄̃_c^(t) + α_t m^(t−1), so its error is Σ_i k_t(i) Z̄_i over the averaged sample
noises Z̄_i (variance (1/n_c²) Σ_b σ̃_b²) with coefficients k_t(i). `variance_factor` gives
V(t) = Σ_i k_t(i)², which is (2t − H_t)/t² ≈ 2/t for Theorem 1's 1−α = 1/t: consensus costs a
factor 2 against pooling (σ̃²/(n t)), while 1−α = t^(−1/2) tends to factor 1. The rest of the
error, (W^k − J) applied to the noise, is of lower order; `consensus_mse_exact` computes the
whole error of a given W exactly (used to test the simulation).

Averaged over agents, every component contributes (1/n_c) Σ_{b∈c} x_b, so
(1/M) Σ_a (1/n_a²) Σ_{b∈C̃_a} x_b = (1/M) Σ_c mean_{b∈c} x_b (`component_average`):
Prop. 2 (ideal) is that with x = σ² over t; Theorem 1's leading term that with x = σ² + σ_DP²
times V(t); Corollary 1 compares the latter with Prop. 1 (local, mean σ_a²/t).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.params import build, param
from desim.kernel.registry import CURVES, TOPOLOGIES
from desim.topologies.graph import Graph, component_sizes


def variance_factor(t: np.ndarray, c: float = 1.0, p: float = 1.0) -> np.ndarray:
    """V(t) = Σ_{i≤t} k_t(i)² for the schedule 1−α_s = min(1, c s^(−p)) (α_1 = 0).

    k_s(i) = α_s k_{s−1}(i) + (1−α_s)/s for i < s and k_s(s) = (1−α_s)/s, so the sums
    S1 = Σ_i k_s(i) and S2 = Σ_i k_s(i)² follow an O(t) recursion.
    """
    tt = np.asarray(t, dtype=np.int64)
    t_max = int(tt.max()) if tt.size else 0
    out = np.empty(t_max + 1)
    s1 = s2 = 0.0
    for s in range(1, t_max + 1):
        oma = 1.0 if s == 1 else min(1.0, c * s ** (-p))
        a, k = 1.0 - oma, oma / s
        s2 = a * a * s2 + 2.0 * a * k * s1 + s * k * k
        s1 = a * s1 + s * k
        out[s] = s2
    return out[tt]


def harmonic_factor(t: np.ndarray) -> np.ndarray:
    """(2t − H_t)/t², V(t) for Theorem 1's 1−α = 1/t in closed form (docs/papers.md §2.4)."""
    tt = np.asarray(t, dtype=np.int64)
    h = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, int(tt.max()) + 1))])
    return (2.0 * tt - h[tt]) / tt.astype(float) ** 2


def consensus_mse_exact(
    w: np.ndarray, sigma2: np.ndarray, t_max: int, c: float = 1.0, p: float = 1.0
) -> np.ndarray:
    """Exact mean over agents of E[(Y_a^(t) − μ_a)²], t = 1…t_max, for a fixed W.

    The errors e = Y − μ and ξ = X̃ − μ evolve as ξ_t = ((t−1)/t) ξ_{t−1} + Z_t/t and
    e_t = α_t W e_{t−1} + (1−α_t) ξ_t with Cov Z = diag(σ̃²); their joint covariance is
    propagated exactly (no asymptotics). `w` is the n×n mixing matrix of one component.
    """
    n = len(w)
    eye = np.eye(n)
    cov = np.zeros((2 * n, 2 * n))
    noise = np.diag(np.asarray(sigma2, dtype=float) * np.ones(n))
    out = np.empty(t_max)
    for t in range(1, t_max + 1):
        oma = 1.0 if t == 1 else min(1.0, c * t ** (-p))
        a, decay = 1.0 - oma, (t - 1) / t
        step = np.block([[a * w, oma * decay * eye], [np.zeros((n, n)), decay * eye]])
        inject = np.vstack([oma / t * eye, eye / t])
        cov = step @ cov @ step.T + inject @ noise @ inject.T
        out[t - 1] = np.trace(cov[:n, :n]) / n
    return out


def component_average(labels: np.ndarray, x: np.ndarray) -> float:
    """(1/M) Σ_c mean_{b∈c} x_b = (1/M) Σ_a (1/n_a²) Σ_{b∈C̃_a} x_b over component labels."""
    _, index = np.unique(np.asarray(labels), return_inverse=True)  # labels need not be 0…K−1
    sums = np.bincount(index, weights=np.asarray(x, dtype=float))
    return float(np.sum(sums / np.bincount(index)) / len(index))


def corollary1_rhs(labels: np.ndarray, sigma2: np.ndarray) -> float:
    """The bound on σ_DP² of Corollary 1 (docs/papers.md §3.8), from C̃_a labels and σ_a².

    Theorem 1's leading MSE (2/t)(1/M) Σ_c mean_c(σ² + σ_DP²) is below Prop. 1's
    (1/M) Σ_a σ_a²/t iff σ_DP² < (Σ_a σ_a² − 2 Σ_c mean_c σ²)/(2K), K components; with equal
    variances σ²(M/(2K) − 1).
    """
    labels = np.asarray(labels)
    sigma2 = np.broadcast_to(np.asarray(sigma2, dtype=float), labels.shape)
    k = len(np.unique(labels))
    m = len(labels)
    return float((sigma2.sum() - 2.0 * m * component_average(labels, sigma2)) / (2.0 * k))


def privacy_threshold(rhs: float, L: float) -> float:
    """ε* = √(8L²/rhs): Corollary 1 holds for Laplace noise with ε > ε* (+∞ if rhs ≤ 0)."""
    return math.sqrt(8.0 * L * L / rhs) if rhs > 0 else math.inf


# --------------------------------------------------------------------------------------------
# curves: averages over random class assignments and graphs (Monte Carlo)


def _draws(data: Any, topology: dict | None, draws: int, seed: int):
    """`draws` pairs (classes, σ², graph) from the study's data model and [topology]."""
    if topology is None:
        raise ValueError("this curve needs the study's [topology] table")
    table = dict(topology)
    spec = build(TOPOLOGIES.get(table.pop("model")), table, "topology")
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        source = data.make(rng)
        with warnings.catch_warnings():  # disconnected graphs are expected here
            warnings.simplefilter("ignore")
            graph: Graph = spec.build(source.n_agents, rng)
        yield source.classes, np.asarray(source.public["sigma2"], dtype=float), graph


def _mean_se(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows = np.atleast_2d(rows)
    se = rows.std(axis=0, ddof=1) / math.sqrt(len(rows)) if len(rows) > 1 else 0 * rows[0]
    return rows.mean(axis=0), se


def _grid(t: np.ndarray) -> np.ndarray:
    tt = np.asarray(t, dtype=float)
    if tt.ndim != 1 or np.any(~(tt >= 1)) or np.any(tt != np.round(tt)):
        raise ValueError(f"t = {t!r}: must be a 1-D array of integer times ≥ 1")
    return tt


@CURVES.register("ideal-component")
@dataclass(frozen=True)
class IdealComponentCurve:
    """Prop. 2 of seed 001: pooling all data of C̃_a, E[(1/M) Σ_c mean_c σ²]/t."""

    topology: dict | None = param(None, "the graph model (default: the study's [topology])")
    draws: int = param(40, "Monte Carlo draws of classes and graph", ge=1)
    seed: int = param(0, "seed of the Monte Carlo draws", ge=0)

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, stderr) on the grid `t`."""
        tt = _grid(t)
        rows = [
            component_average(g.restricted_components(cls), s2) / tt
            for cls, s2, g in _draws(data, self.topology, self.draws, self.seed)
        ]
        return _mean_se(np.array(rows))


@CURVES.register("consensus-oracle")
@dataclass(frozen=True)
class ConsensusOracleCurve:
    """Theorem 1 (leading term): oracle decisions, E[(1/M) Σ_c mean_c(σ² + σ_DP²)]·V(t).

    V(t) is exact for the α schedule (`variance_factor`); the lower-order (W^k − J) term is
    left out. With `fallback`, agents whose C̃_a has 1 or 2 agents report their local mean
    (σ_a²/t), as Private-C-ColME's oracle variant does.
    """

    noise: Literal["none", "laplace"] = param("laplace", "DP noise on every sample")
    epsilon: float = param(1.0, "privacy budget ε of every sample (inf: no noise)", gt=0)
    alpha_c: float = param(1.0, "α schedule 1−α = min(1, c·s^(−p)): the c", gt=0)
    alpha_p: float = param(1.0, "α schedule 1−α = min(1, c·s^(−p)): the p", gt=0, le=1)
    fallback: Literal["none", "local", "private-local"] = param(
        "none", "report the local mean (raw or privatised) when |C̃_a| ≤ 2"
    )
    topology: dict | None = param(None, "the graph model (default: the study's [topology])")
    draws: int = param(40, "Monte Carlo draws of classes and graph", ge=1)
    seed: int = param(0, "seed of the Monte Carlo draws", ge=0)

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, stderr) on the grid `t`."""
        tt = _grid(t)
        private = self.noise == "laplace" and math.isfinite(self.epsilon)
        s2_dp = 8.0 * data.support_half_width() ** 2 / self.epsilon**2 if private else 0.0
        v = variance_factor(tt.astype(np.int64), self.alpha_c, self.alpha_p)
        rows = []
        for cls, s2, g in _draws(data, self.topology, self.draws, self.seed):
            labels = g.restricted_components(cls)
            small = component_sizes(labels) <= 2 if self.fallback != "none" else None
            s2_tilde = s2 + s2_dp
            if small is None:
                rows.append(component_average(labels, s2_tilde) * v)
                continue
            m = len(labels)
            big = ~small
            consensus = (
                component_average(labels[big], s2_tilde[big]) * big.sum() / m if big.any() else 0.0
            )
            local = (s2 if self.fallback == "local" else s2_tilde)[small].sum() / m
            rows.append(consensus * v + local / tt)
        return _mean_se(np.array(rows))
