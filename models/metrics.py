"""Metrics beyond the MSE, registered in `desim.kernel.registry.METRICS` and named in a study's
``[study] metrics``. Each is a function (protocol, data source) → {name: value} that reads state
a protocol exposes and compares it with the truth the data source holds; it returns {} when the
protocol exposes nothing it can measure (so one study can mix protocols). A value may also be
an array of one value per agent: the recorder keeps it as a column of agents.parquet when the
study keeps per-agent results (`per_agent = true`) and drops it otherwise. When the means move
(`[data.drift]`), the source a metric receives is the one at the checkpoint's slot
(`desim.kernel.protocol.DataSource.at`): `accuracy` scores against the means then and `links`
against the classes then.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from desim.kernel.registry import METRICS, applies_to, reads_tables, records
from desim.models.adversaries import honest_mse
from desim.models.privacy.accounting import ledger

#: Accuracy tolerance of Galante et al.'s metric: an agent is right when |μ̂_a − μ_a| ≤ 0.1.
TOLERANCE = 0.1


@METRICS.register("accuracy")
@records("within_0.1", "outside_0.1")
@reads_tables()
def accuracy(protocol: Any, data: Any) -> dict[str, float]:
    """Share of agents within 0.1 of their true mean (Galante et al.'s metric).

    ``within_0.1`` = share with |μ̂_a − μ_a| ≤ 0.1 and ``outside_0.1`` = 1 − that (what their
    figures plot on a log scale).
    """
    est = np.asarray(protocol.estimates(), dtype=float)
    within = float(np.mean(np.abs(est - data.means) <= TOLERANCE))
    return {"within_0.1": within, "outside_0.1": 1.0 - within}


@METRICS.register("links")
@records("wrong_kept", "wrong_dropped")
@applies_to("neighbour_decisions")
def links(protocol: Any, data: Any) -> dict[str, float]:
    """Wrong neighbour decisions: links kept across classes or dropped within a class.

    ``wrong_kept`` / ``wrong_dropped`` count ordered neighbour pairs (a, b) with b ∈ C_a across
    classes / b ∉ C_a within a class (a link decided alike at both ends counts twice).
    """
    decisions = protocol.neighbour_decisions()
    if decisions is None:
        return {}
    a, b, kept = decisions
    same = data.classes[a] == data.classes[b]
    return {"wrong_kept": float(np.sum(kept & ~same)), "wrong_dropped": float(np.sum(~kept & same))}


@METRICS.register("privacy")
@records("eps_*")
@applies_to("privacy_spend")
def privacy(protocol: Any, data: Any) -> dict[str, Any]:
    """The privacy ledger: ε each agent has spent so far at the protocol's δ (its budget's, with
    a ``budget``), per the accountant (`desim.models.privacy.accounting`), from the releases it
    made (lost on a link or not).

    ``eps_<who>_mean`` / ``eps_<who>_max`` over agents, for each recipient set the protocol
    names: Private-ColME ``one`` (the most informed single querier, the papers' threat model)
    and ``all`` (every querier colluding); Private-C-ColME ``one`` and ``all``; PriCER
    ``neighbour`` (the most informed neighbour) and ``server``; the empirical-Bayes uploads
    ``server``. Every agent's own ε, ``eps_<who>``, goes to agents.parquet (`per_agent`).
    """
    spend = _at_budget_delta(protocol, protocol.privacy_spend())
    return ledger(spend, per_agent=True) if spend is not None else {}


def _at_budget_delta(protocol: Any, spend: Any) -> Any:
    """`spend` at the δ of the protocol's budget, if it has one (the δ its budget is checked
    at, `desim.models.privacy.budget`), so the ledger answers the budget's question."""
    gate = protocol.budget_gate() if hasattr(protocol, "budget_gate") else None
    if spend is None or gate is None or gate.budget.delta == spend.delta:
        return spend
    return dataclasses.replace(spend, delta=gate.budget.delta)


@METRICS.register("privacy-rdp")
@records("eps_rdp_*")
@applies_to("privacy_spend")
def privacy_rdp(protocol: Any, data: Any) -> dict[str, Any]:
    """The `privacy` ledger per the RDP accountant instead of PLD, a cross-check beside it:
    ``eps_rdp_<who>_mean`` / ``eps_rdp_<who>_max`` (and ``eps_rdp_<who>`` per agent), never
    below the PLD ledger's ε for the same releases."""
    spend = _at_budget_delta(protocol, protocol.privacy_spend())
    if spend is None:
        return {}
    return ledger(dataclasses.replace(spend, accountant="rdp"), per_agent=True, prefix="eps_rdp_")


@METRICS.register("adversaries")
@records("mse_honest", "accepting_adversaries", "adversaries_accepted")
@applies_to("adversary_state")
@reads_tables()
def adversaries(protocol: Any, data: Any) -> dict[str, float]:
    """Scores over the honest agents of a run with an [adversaries] table.

    ``mse_honest`` is the MSE over honest agents; where the protocol decides whom it accepts
    (Private-ColME's class beliefs), ``accepting_adversaries`` is the share of honest agents
    that currently accept at least one adversary and ``adversaries_accepted`` the adversaries
    an honest agent accepts, on average.
    """
    hook = getattr(protocol, "adversary_state", None)  # (protocols without adversaries)
    state = hook() if hook is not None else None
    if state is None:
        return {}
    mask, accepted = state
    out = {"mse_honest": honest_mse(protocol.estimates(), data.means, mask)}
    if accepted is not None:
        honest = accepted[~mask]
        out["accepting_adversaries"] = float(np.mean(honest > 0))
        out["adversaries_accepted"] = float(np.mean(honest))
    return out
