"""The parameters of C-ColME and Private-C-ColME: one table of docs and bounds, two sets of
defaults (Galante et al.'s code and seed 001; docs/papers.md §2.3, §3.7)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from desim.kernel.params import param
from desim.models.ccolme.robust import check_params
from desim.models.privacy.budget import SAMPLE_DELTA, set_budget

_DOCS: dict[str, tuple[str, dict[str, float]]] = {
    "rule": ("neighbour test: optimistic distance, Bernstein test, or the true classes", {}),
    "noise": ("DP noise on every sample: Laplace of variance 8L²/ε², or none", {}),
    "epsilon": ("privacy budget ε of every sample (inf: no noise)", {"gt": 0}),
    "delta": ("optimistic distance: confidence δ, γ = δ/(4 Σ_a deg a)", {"gt": 0, "lt": 1}),
    "theta": ("Bernstein test level θ_t = theta/ln(t+1)", {"gt": 0, "lt": 1}),
    "threshold": ("Bernstein threshold: exact root z_t, or the simpler upper bound z'_t", {}),
    "threshold_scale": ("factor on the Bernstein threshold (seed 001 tuned it)", {"gt": 0}),
    "alpha_c": ("α schedule 1−α = min(1, c·s^(−p)) at age s: the c", {"gt": 0}),
    "alpha_p": ("α schedule 1−α = min(1, c·s^(−p)) at age s: the p", {"gt": 0, "le": 1}),
    "reset": ("restart the age s when neighbour sets change: never, all agents, per agent", {}),
    "restart": ("after a change: α = 0 in that slot (hard) or α = 1/2 in the next (galante)", {}),
    "decisions": ("re-test every neighbour each slot, or never re-add a dropped one", {}),
    "initial": ("C_a before slot 1: every neighbour, or none", {}),
    "values": ("test against neighbours' values of this slot (fresh) or the last (stale)", {}),
    "symmetric": ("keep b only if a and b both keep each other (exchanges decisions)", {}),
    "weights": ("W: 1/(1+max(|C_a|,|C_b|)) (metropolis) or 1/(1+max degree of G)", {}),
    "fallback": ("report the local mean (raw or privatised) when |C̃_a| seems 1 or 2", {}),
    "max_age": ("mix only neighbours whose latest state is at most this many slots old", {"ge": 0}),
    "adversaries": (
        "an [adversaries] table {fraction | agents, behaviour = shift | flip | mimic | collude | "
        "inflate, …}: agents whose states or sizes are corrupted (`desim.models.ccolme.robust`)",
        {},
    ),
    "consensus": ("mix: eq. (2)'s weights, or the median or trimmed mean (Yin et al. 2018)", {}),
    "trim": (
        "consensus = 'trimmed': the share β of mixed neighbours dropped at each end",
        {"ge": 0, "lt": 0.5},
    ),
}


def _p(name: str, default: Any) -> Any:
    doc, bounds = _DOCS[name]
    return param(default, doc, **bounds)


Rule = Literal["optimistic", "bernstein", "oracle"]
Noise = Literal["none", "laplace"]
Threshold = Literal["exact", "simple"]
Reset = Literal["none", "global", "agent"]
Restart = Literal["hard", "galante"]
Decisions = Literal["retest", "irrevocable"]
Initial = Literal["all", "none"]
Values = Literal["fresh", "stale"]
Weights = Literal["metropolis", "max-degree"]
Fallback = Literal["none", "local", "private-local"]
Consensus = Literal["weighted", "median", "trimmed"]


def _check(p: Any) -> None:
    check_params(p, "C-ColME and Private-C-ColME")
    if p.decisions == "irrevocable" and p.initial == "none":
        raise ValueError(
            "decisions = 'irrevocable' only drops neighbours, so it needs initial = 'all'"
        )


@dataclass(frozen=True)
class CColMEParams:
    """C-ColME as in Galante et al.'s code: optimistic distance, irrevocable, global reset."""

    rule: Rule = _p("rule", "optimistic")
    noise: Noise = _p("noise", "none")
    epsilon: float = _p("epsilon", 1.0)
    delta: float = _p("delta", 0.1)
    theta: float = _p("theta", 0.05)
    threshold: Threshold = _p("threshold", "exact")
    threshold_scale: float = _p("threshold_scale", 1.0)
    alpha_c: float = _p("alpha_c", 1.0)
    alpha_p: float = _p("alpha_p", 1.0)
    reset: Reset = _p("reset", "global")
    restart: Restart = _p("restart", "galante")
    decisions: Decisions = _p("decisions", "irrevocable")
    initial: Initial = _p("initial", "all")
    values: Values = _p("values", "stale")
    symmetric: bool = _p("symmetric", False)
    weights: Weights = _p("weights", "metropolis")
    fallback: Fallback = _p("fallback", "none")
    max_age: float = _p("max_age", math.inf)
    adversaries: dict | None = _p("adversaries", None)
    consensus: Consensus = _p("consensus", "weighted")
    trim: float | None = _p("trim", None)

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True)
class PrivateCColMEParams(CColMEParams):
    """Private-C-ColME as in seed 001: Laplace noise, Bernstein test, re-tested symmetric
    decisions, per-agent reset, fallback to the local mean (the other fields as C-ColME's)."""

    rule: Rule = _p("rule", "bernstein")
    noise: Noise = _p("noise", "laplace")
    reset: Reset = _p("reset", "agent")
    restart: Restart = _p("restart", "hard")
    decisions: Decisions = _p("decisions", "retest")
    initial: Initial = _p("initial", "none")
    values: Values = _p("values", "fresh")
    symmetric: bool = _p("symmetric", True)
    fallback: Fallback = _p("fallback", "local")
    accountant: Literal["pld", "rdp"] = param(
        "pld", "accountant of the ledger and the budget: privacy loss distributions, or Rényi DP"
    )
    budget: dict | None = param(
        None,
        "per-agent privacy budget {epsilon, delta (default 1e-12, the ledger's), action = stop "
        "| degrade}: an agent whose samples do not fit shares nothing, or more noise "
        "(`desim.models.privacy.budget.SampleGate`)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget is not None and (self.noise != "laplace" or math.isinf(self.epsilon)):
            raise ValueError("budget: needs noise = 'laplace' and a finite epsilon")
        set_budget(self, SAMPLE_DELTA)
