"""The Prop. 3 oracle curve of Private-ColME that study files plot next to simulations.

Each curve is a frozen params dataclass registered in `desim.kernel.registry.CURVES`; its
`curve(t, data)` returns (mean, stderr) of the average MSE (1/M) Σ_a E[(μ_a^{(t)} − μ_a)²] on the
time grid `t`, given the study's validated data parameters `data` (agents, class_means, sigma,
distribution, support_half_width()). Agents are assumed to pick their class uniformly at random,
as in seed 002 §VII; the stderr is zero for exact closed forms.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from desim.kernel.params import build, param
from desim.kernel.registry import CURVES, TOPOLOGIES
from desim.models.baselines import class_variances
from desim.models.colme.analytic import MAX_EXACT_OTHERS, oracle_mse, oracle_mse_rrr
from desim.models.colme.schedule import max_pair_releases
from desim.models.privacy.tree import calibrated_psum_noise


@CURVES.register("oracle")
@dataclass(frozen=True)
class OracleCurve:
    """Prop. 3 (RR) or Remark 3 (rRR): Private-ColME with an oracle class estimator.

    Every other agent is a class-mate with probability p = 1/Γ; the noise variance is the
    paper's calibration for the data's L and (ε, δ), split by ⌊log₂ t_max⌋+1 for PM-II, or with
    ``calibration = "tight"`` / ``"tight-tree"`` the least noise the PLD accountant allows (the
    same σ_DP² the protocol uses).
    """

    mechanism: Literal["pm1", "pm2"] = param("pm1", "p-sum mechanism: PM-I or PM-II")
    weights: Literal["last", "mom", "wmom"] = param(
        "last", "weights of the statistic T: non-MoM (last release), MoM or windowed MoM"
    )
    noise: Literal["gaussian", "laplace", "none"] = param("gaussian", "law of the DP noise")
    epsilon: float = param(1.0, "overall privacy parameter ε", gt=0)
    delta: float = param(1e-6, "overall privacy parameter δ (Gaussian noise only)", gt=0, lt=1)
    schedule: Literal["rr", "rrr"] = param(
        "rr", "round robin (Prop. 3) or restricted round robin (Remark 3)"
    )
    agents: int | None = param(
        None, "number of agents M of the curve; absent: the data's number of agents", ge=2
    )
    t_max_budget: int | None = param(
        None, "t_max of the PM-II budget split; absent: the largest time of the grid", ge=1
    )
    method: Literal["exact", "montecarlo"] = param(
        "montecarlo", "sum over all class-mate subsets (M ≤ 21) or stratified Monte Carlo"
    )
    draws: int = param(20000, "Monte Carlo draws of class-mate subsets", ge=1)
    seed: int = param(0, "seed of the Monte Carlo draws", ge=0)
    formula: Literal["exact", "eq21"] = param(
        "exact", "PM-II noise variance: exact dyadic-node sum, or eq. (21) as printed"
    )
    calibration: Literal["paper", "tight", "tight-tree"] = param(
        "paper",
        "noise calibration: the paper's formulas, or the least noise for (ε, δ) per the "
        "PLD accountant for ⌊log₂ t_max⌋+1 PM-II levels (tight) or for the tree nodes one "
        "querier really gets (tight-tree)",
    )
    #: Bytes per draw and other agent in the largest stratum (its random keys, order, members).
    memory = {"draw-agent": 40.0}

    def __post_init__(self) -> None:
        if self.agents is not None:
            self._check_agents(self.agents)

    def check(self, data: Any) -> None:
        """ValueError unless this curve can be computed for the study's data (validated before
        any run: the exact sum has a limit on M)."""
        self._check_agents(int(self.agents if self.agents is not None else data.agents))

    def _check_agents(self, agents: int) -> None:
        if self.method == "exact" and self.schedule == "rr" and agents - 1 > MAX_EXACT_OTHERS:
            raise ValueError(
                f"method = 'exact' needs agents ≤ {MAX_EXACT_OTHERS + 1}, got {agents}; "
                "use method = 'montecarlo'"
            )

    def sigma2_dp(self, data: Any, t_max: int) -> float:
        """σ_DP² of Lemma 1 or 2 at this curve's budget (split for PM-II as in §VII), or the
        tight σ_DP² (`desim.models.privacy.tree.calibrated_psum_noise`)."""
        agents = int(self.agents if self.agents is not None else data.agents)
        return self._calibrated(data, t_max, agents)

    def _calibrated(self, data: Any, t_max: int, agents: int) -> float:
        """σ_DP² for a querier whose round robin runs over `agents` − 1 peers (κ_max)."""
        return calibrated_psum_noise(
            self.noise,
            data.support_half_width(),
            self.mechanism,
            self.epsilon,
            self.delta,
            t_max,
            self.calibration,
            max_pair_releases(self.schedule, agents, t_max),
        )[0]

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, stderr) of Prop. 3 (or Remark 3) on the grid `t` of integer times."""
        s2 = class_variances(data)
        M = int(self.agents if self.agents is not None else data.agents)
        p = 1.0 / len(s2)
        t_max = int(self.t_max_budget if self.t_max_budget is not None else np.max(t))
        return self._at(t, M, p, s2, self.sigma2_dp(data, t_max))

    def _at(
        self, t: np.ndarray, m: int, p: float, s2: np.ndarray, s2_dp: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Prop. 3 (or Remark 3) with M = m agents (on a graph: an agent of degree m − 1)."""
        if self.schedule == "rrr":
            return oracle_mse_rrr(t, m, p, s2, s2_dp, self.mechanism, self.weights, self.formula)
        return oracle_mse(
            t,
            m,
            p,
            s2,
            s2_dp,
            self.mechanism,
            self.weights,
            method=self.method,
            n_draws=self.draws,
            seed=self.seed,
            formula=self.formula,
        )


@CURVES.register("oracle-neighbours")
@dataclass(frozen=True)
class NeighbourOracleCurve(OracleCurve):
    """Prop. 3 (RR) or Remark 3 (rRR) on a graph (peers = "topology"): Private-ColME with an
    oracle class estimator whose agents query only their neighbours.

    Each of agent a's deg(a) neighbours is a class-mate with probability p = 1/Γ, and RR over
    them queries position ℓ at ℓ, ℓ + deg(a), …: Prop. 3 with M − 1 replaced by deg(a). The
    curve averages it over the agents' degrees in `graphs` draws of the study's [topology] (an
    agent without neighbours keeps its local mean, σ²/t); κ_max, for the tight-tree noise, is
    that of the smallest degree.
    """

    topology: dict | None = param(None, "the graph model (default: the study's [topology])")
    graphs: int = param(1, "draws of the graph whose degrees are averaged over", ge=1)

    def check(self, data: Any) -> None:
        """ValueError unless the curve can be computed: a [topology] on these agents, and the
        exact sum only up to its limit on degrees."""
        degrees = self.degrees(data)
        if self.method == "exact" and self.schedule == "rr" and degrees.max() > MAX_EXACT_OTHERS:
            raise ValueError(
                f"method = 'exact' needs degrees ≤ {MAX_EXACT_OTHERS}, got {degrees.max()}; "
                "use method = 'montecarlo'"
            )

    def degrees(self, data: Any) -> np.ndarray:
        """The degree of every agent in each of the `graphs` draws (concatenated)."""
        if self.topology is None:
            raise ValueError("the curve 'oracle-neighbours' needs the study's [topology] table")
        table = dict(self.topology)
        spec = build(TOPOLOGIES.get(table.pop("model")), table, "topology")
        agents = int(self.agents if self.agents is not None else data.agents)
        rng = np.random.default_rng(self.seed)
        with warnings.catch_warnings():  # a disconnected graph is expected here
            warnings.simplefilter("ignore")
            return np.concatenate([spec.build(agents, rng).degree for _ in range(self.graphs)])

    def sigma2_dp(self, data: Any, t_max: int) -> float:
        """σ_DP² as the protocol on the graph calibrates it (κ_max of the smallest degree)."""
        degrees = self.degrees(data)
        smallest = int(degrees[degrees > 0].min(initial=1))
        return self._calibrated(data, t_max, smallest + 1)

    def curve(self, t: np.ndarray, data: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mean, stderr) of Prop. 3 (or Remark 3) over neighbours on the grid `t`."""
        s2 = class_variances(data)
        degrees, counts = np.unique(self.degrees(data), return_counts=True)
        share = counts / counts.sum()
        t_max = int(self.t_max_budget if self.t_max_budget is not None else np.max(t))
        s2_dp = self.sigma2_dp(data, t_max)
        mean, var = np.zeros(len(t)), np.zeros(len(t))
        for d, w in zip(degrees, share, strict=True):
            if d == 0:  # no neighbour: the local mean, σ²/t averaged over classes
                mean += w * np.mean(s2) / np.asarray(t, dtype=float)
                continue
            m, se = self._at(t, int(d) + 1, 1.0 / len(s2), s2, s2_dp)
            mean += w * m
            var += (w * se) ** 2
        return mean, np.sqrt(var)
