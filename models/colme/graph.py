"""Private-ColME on a communication graph (``peers = "topology"``): an agent queries only its
neighbours, and every per-pair state is held for the directed edges that exist.

A pair b → a is named by the index e of the directed edge a → b in the graph's compressed sparse
rows (`desim.topologies.graph.Graph`: ordered by querier a, then by neighbour b), so the pair
state of M agents of degree r takes O(M·r) memory, not O(M²). Edge indices grow with a·M + b, the
dense layout's pair index, so batches sorted by pair are in the same order in both layouts.

RR over neighbours keeps the dense RR's order: agent a's neighbours taken cyclically from the
first one above a (a+1, a+2, … mod M, skipping non-neighbours), one per slot; rRR skips the
neighbours a has excluded. On a complete graph both are the dense schedules exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from desim.models.colme.schedule import max_pair_releases
from desim.topologies.graph import Graph


class Neighbours:
    """Each agent's neighbours in RR order, and the edge index of each (agent, RR position)."""

    def __init__(self, graph: Graph) -> None:
        self.n = graph.n
        self.indptr, self.src, self.dst = graph.indptr, graph.src, graph.dst
        self.degree = graph.degree
        #: Edges, one per ordered pair (querier, neighbour): the number of pairs held.
        self.n_pairs = graph.n_directed
        # neighbours below a come first in a's row: RR starts after them (at the first above a)
        self.below = np.bincount(self.src[self.dst < self.src], minlength=self.n)
        #: Agents with at least one neighbour: those that query.
        self.querying = np.flatnonzero(self.degree > 0)

    def edge(self, a: np.ndarray, position: np.ndarray) -> np.ndarray:
        """Edge index of agent a's neighbour at RR position(s) 1 … deg(a) (cyclic)."""
        d = self.degree[a]
        return self.indptr[a] + (self.below[a] + position - 1) % d

    def min_degree(self) -> int:
        """The smallest degree of a querying agent (0 when none queries)."""
        return int(self.degree[self.querying].min()) if len(self.querying) else 0

    def max_degree(self) -> int:
        """The largest degree: the most queriers one responder has."""
        return int(self.degree.max(initial=0))

    def edges_of(self, agents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The edges of `agents` (their rows, in order) and the position in `agents` of each."""
        d = self.degree[agents]
        owner = np.repeat(np.arange(len(agents)), d)
        first = np.repeat(self.indptr[agents] - np.cumsum(d) + d, d)
        return first + np.arange(len(owner)), owner


def max_neighbour_releases(schedule: str, neighbours: Neighbours, t_max: int) -> int:
    """κ_max on the graph: under RR agent a queries each neighbour once every deg(a) slots, so
    ⌈t_max/d_min⌉ (the dense bound with M − 1 = d_min); under rRR, t_max as in the dense case."""
    return max_pair_releases(schedule, neighbours.min_degree() + 1, t_max)


class EdgeBeliefs:
    """C_a^{(t)} restricted to neighbours: `flat[e]` is χ_a(b) of edge e = a → b, with each
    agent's number of included neighbours (itself not counted)."""

    def __init__(self, included: np.ndarray, neighbours: Neighbours) -> None:
        self.flat = self.included = included
        self.n_included = np.bincount(
            neighbours.src, weights=included, minlength=neighbours.n
        ).astype(np.int64)

    def revise_pairs(self, a: np.ndarray, pair: np.ndarray, decision: np.ndarray) -> None:
        """Set χ_a(b) of distinct edges `pair` (from agents a) to `decision`."""
        before = self.flat.take(pair)
        if np.count_nonzero(decision != before):
            self.flat[pair] = decision
            change = decision.astype(np.int64) - before
            m = len(self.n_included)
            self.n_included += np.bincount(a, weights=change, minlength=m).astype(np.int64)


class NeighbourRoundRobin:
    """RR over neighbours: in slot t agent a queries its neighbour at position (t−1) mod deg(a)
    + 1."""

    def __init__(self, neighbours: Neighbours) -> None:
        self.nb = neighbours
        self.agents = a = neighbours.querying
        # each querier's row start, RR start within it and degree, read every slot
        self._first, self._below = neighbours.indptr[a], neighbours.below[a]
        self._degree = neighbours.degree[a]
        # each querier's place in its row in the slot last asked for: slot t + 1 moves it one
        # step (an add and a compare, not two integer divisions per querier)
        self._slot, self._place = 0, np.zeros(0, dtype=np.int64)

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers a, queried neighbours b and edges a → b of slot t (`Neighbours.edge`
        at position (t − 1) mod deg(a) + 1)."""
        d, place = self._degree, self._place
        if t == self._slot + 1 and self._slot > 0:
            place += 1
            place[place == d] = 0
        else:
            place = self._below + (t - 1) % d
            place %= d
        self._slot, self._place = t, place
        e = place + self._first
        return self.agents, self.nb.dst.take(e), e

    def batch(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers, queried neighbours and edges of several slots, slot by slot."""
        a = np.tile(self.agents, len(slots))
        d = np.tile(self.nb.degree[self.agents], len(slots))
        e = self.nb.edge(a, (np.repeat(slots, len(self.agents)) - 1) % d + 1)
        return a, self.nb.dst[e], e


class NeighbourRestrictedRoundRobin:
    """rRR over neighbours: each agent queries its next RR position whose neighbour it still
    includes."""

    def __init__(self, neighbours: Neighbours, beliefs: EdgeBeliefs) -> None:
        self.nb = neighbours
        self.beliefs = beliefs
        self.agents = np.arange(neighbours.n)
        self.offset = np.zeros(neighbours.n, dtype=np.int64)  # position last queried, 0 = none

    def targets(self, t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The queriers a (those including some neighbour), their neighbours b and edges."""
        nb = self.nb
        agents = self.agents[self.beliefs.n_included > 0]
        offset = self.offset[agents]
        degree = nb.degree[agents]
        ahead = np.arange(1, min(16, nb.max_degree()) + 1)
        todo = np.arange(len(agents))
        flat = self.beliefs.flat
        while len(todo):  # look a window of positions ahead, as the dense rRR does
            a, d = agents[todo], degree[todo, None]
            cand = (offset[todo, None] + ahead - 1) % d + 1
            hit = flat[nb.indptr[a][:, None] + (nb.below[a][:, None] + cand - 1) % d]
            first = hit.argmax(axis=1)
            rows = np.arange(len(todo))
            found = hit[rows, first]
            offset[todo] = np.where(found, cand[rows, first], cand[:, -1])
            todo = todo[~found]
        self.offset[agents] = offset
        e = nb.edge(agents, offset)
        return agents, nb.dst[e], e


def edge_row_sums(protocol: Any, rows: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """`PrivateColME.row_sums` on a graph: Σ_b T_{b→a}/Var[T_{b→a}] and Σ_b 1/Var[T_{b→a}] over
    the neighbours b that agents a in `rows` include, from the edge state.

    Up to `incremental_above` agents each row is laid out as the dense one (M columns, 0 where
    there is no pair) and summed the same way, so a complete graph gives the bits of
    peers = "all"; above, the rows are summed edge by edge (O(M·r)).
    """
    p, nb = protocol, protocol.graph
    agents = np.arange(nb.n)[rows]
    if isinstance(rows, slice) and len(agents) == nb.n:  # every agent: every edge, in order
        e, owner = slice(None), nb.src
    else:
        e, owner = nb.edges_of(agents)
    weight, value = _edge_terms(p, e)
    k = len(agents)
    if nb.n > p.incremental_above:
        return np.bincount(owner, weight * value, minlength=k), np.bincount(
            owner, weight, minlength=k
        )
    w, v = np.zeros((k, nb.n)), np.zeros((k, nb.n))
    w[owner, nb.dst[e]], v[owner, nb.dst[e]] = weight, value
    return (w * v).sum(axis=1), w.sum(axis=1)


def _edge_terms(p: Any, e: np.ndarray | slice) -> tuple[np.ndarray, np.ndarray]:
    """The weight 1/Var[T_{b→a}] (0 for an excluded b) and T_{b→a} of edges `e`.

    Where every block is the last release alone (``last`` under PM-I) n is 0 or 1, so T = block
    sum / 1 and Var = (σ_b²D + σ_DP²A)/1 are the block sum and the numerator themselves: the
    divisions by n and n², and their passes, are skipped for the same bits.
    """
    n, total, data, noise = p.stat.pair_columns(e)
    last_only = p.stat.compact and p.stat.mechanism == "pm1"
    sigma2 = p.sigma2[p.graph.dst[e]] if p.known else p.v_hat[e]
    with np.errstate(invalid="ignore"):
        num = sigma2 * data + p.sigma2_dp * noise
    if last_only:
        taken = n > 0
        value = np.where(taken, total, 0.0)
        with np.errstate(divide="ignore"):
            return np.where(p.beliefs.flat[e] & taken, 1.0 / num, 0.0), value
    value = np.divide(total, n, out=np.zeros_like(total), where=n > 0)
    var = np.divide(num, n * n, out=np.full_like(num, np.inf), where=n > 0)
    with np.errstate(divide="ignore"):
        return np.where(p.beliefs.flat[e], 1.0 / var, 0.0), value


def responder_spend(
    protocol: Any, first_sample_psums: Callable[[str, np.ndarray], np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per responder b, the most p-sums holding its first sample that one neighbour got, and
    their sum over its neighbours (`PrivateColME.privacy_spend` on a graph)."""
    nb = protocol.graph
    per = first_sample_psums(protocol.params.mechanism, protocol.mech.count.ravel()[: nb.n_pairs])
    one = np.zeros(nb.n, dtype=per.dtype)
    np.maximum.at(one, nb.dst, per)
    every = np.zeros(nb.n, dtype=per.dtype)
    np.add.at(every, nb.dst, per)
    return one, every
