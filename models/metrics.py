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
import weakref
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
    same, n_same = _SAME_CLASS(a, b, data.classes)
    both = np.count_nonzero(kept & same)
    # kept across = kept − kept within; dropped within = within − kept within (exact counts)
    return {
        "wrong_kept": float(np.count_nonzero(kept) - both),
        "wrong_dropped": float(n_same - both),
    }


class SameClass:
    """classes[a] == classes[b] for every edge (a, b), and how many, kept for the last edges
    asked while their classes stay the same.

    A run's edges are fixed (the graph's read-only arrays, held weakly) and its classes move only
    with drift, while every checkpoint would gather both ends' classes over every edge again:
    at 10⁶ agents that is most of a checkpoint's cost. Writeable edge arrays are never kept
    (they could change under the cache), and the classes are compared in full each time.
    """

    def __init__(self) -> None:
        self._edges: tuple[weakref.ref, weakref.ref] | None = None
        self._classes = np.empty(0)
        self._value: tuple[np.ndarray, int] = (np.empty(0, dtype=bool), 0)

    def __call__(self, a: np.ndarray, b: np.ndarray, classes: np.ndarray) -> tuple[np.ndarray, int]:
        """(the mask classes[a] == classes[b], its number of True)."""
        edges = self._edges
        if (
            edges is not None
            and edges[0]() is a
            and edges[1]() is b
            and np.array_equal(self._classes, classes)
        ):
            return self._value
        same = classes[a] == classes[b]
        value = (same, int(np.count_nonzero(same)))
        frozen = isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
        if frozen and not (a.flags.writeable or b.flags.writeable):
            self._edges = (weakref.ref(a, self._forget), weakref.ref(b, self._forget))
            self._classes, self._value = np.array(classes, copy=True), value
        return value

    def _forget(self, _: weakref.ref) -> None:
        """The edges are gone (their run is over): drop what was kept for them."""
        self.__init__()


_SAME_CLASS = SameClass()


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
