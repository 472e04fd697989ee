"""Metrics beyond the MSE, registered in `desim.registry.METRICS` and named in a study's
``[study] metrics``. Each is a function (protocol, data source) → {name: value} that reads state
a protocol exposes and compares it with the truth the data source holds; it returns {} when the
protocol exposes nothing it can measure (so one study can mix protocols).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.registry import METRICS
from models.ccolme_analytic import corollary1_rhs, privacy_threshold
from topologies.graph import component_sizes

#: Accuracy tolerance of Galante et al.'s metric: an agent is right when |μ̂_a − μ_a| ≤ 0.1.
TOLERANCE = 0.1


@METRICS.register("accuracy")
def accuracy(protocol: Any, data: Any) -> dict[str, float]:
    """Share of agents within 0.1 of their true mean (Galante et al.'s metric).

    ``within_0.1`` = share with |μ̂_a − μ_a| ≤ 0.1 and ``outside_0.1`` = 1 − that (what their
    figures plot on a log scale).
    """
    est = np.asarray(protocol.estimates(), dtype=float)
    within = float(np.mean(np.abs(est - data.means) <= TOLERANCE))
    return {"within_0.1": within, "outside_0.1": 1.0 - within}


@METRICS.register("links")
def links(protocol: Any, data: Any) -> dict[str, float]:
    """Wrong neighbour decisions: links kept across classes or dropped within a class.

    ``wrong_kept`` / ``wrong_dropped`` count ordered neighbour pairs (a, b) with b ∈ C_a across
    classes / b ∉ C_a within a class (a link decided alike at both ends counts twice).
    """
    decisions = getattr(protocol, "neighbour_decisions", None)
    if decisions is None:
        return {}
    a, b, kept = decisions()
    same = data.classes[a] == data.classes[b]
    return {"wrong_kept": float(np.sum(kept & ~same)),
            "wrong_dropped": float(np.sum(~kept & same))}


@METRICS.register("corollary1")
def corollary1(protocol: Any, data: Any) -> dict[str, float]:
    """Corollary 1 of seed 001 evaluated on this run's graph and classes.

    ``cor1_rhs`` (the bound on σ_DP²), ``cor1_epsilon`` (ε above which it holds for Laplace
    noise), ``class_components`` (K, the number of C̃), ``small_share`` (share of agents with
    |C̃_a| ≤ 2); with a protocol exposing ``sigma2_dp`` also ``cor1_sigma2_dp`` and
    ``cor1_holds`` (1 if σ_DP² < bound).
    """
    graph = data.public.get("graph")
    if graph is None:
        return {}
    labels = graph.restricted_components(data.classes)
    rhs = corollary1_rhs(labels, data.public["sigma2"])
    out = {
        "cor1_rhs": rhs,
        "cor1_epsilon": privacy_threshold(rhs, float(data.public["L"])),
        "class_components": float(labels.max() + 1),
        "small_share": float(np.mean(component_sizes(labels) <= 2)),
    }
    s2_dp = getattr(protocol, "sigma2_dp", None)
    if s2_dp is not None:
        out["cor1_sigma2_dp"] = float(s2_dp)
        out["cor1_holds"] = float(s2_dp < rhs)
    return out
