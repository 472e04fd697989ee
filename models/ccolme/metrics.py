"""Corollary 1 of seed 001 ("Communication-Constrained Private Decentralized Online Personalized
Mean Estimation", C-ColME) as a metric: the noise bound evaluated on each run's graph and
classes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from desim.kernel.registry import METRICS, reads_tables, records
from desim.models.ccolme.analytic import corollary1_rhs, privacy_threshold
from desim.topologies.graph import component_sizes


@METRICS.register("corollary1")
@reads_tables("topology")
@records(
    "cor1_rhs", "cor1_epsilon", "class_components", "small_share", "cor1_sigma2_dp", "cor1_holds"
)
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
