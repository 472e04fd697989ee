"""Private-ColME with ``peers = "topology"`` on a graph that changes during a run
(`desim.topologies.dynamic`).

Before slot t's samples the graph G becomes G' (`ChangingNeighbours.on_graph_change`). The pair
state is held per directed edge a → b (`desim.models.colme.graph`), numbered by RR position;
it is re-laid out in G''s numbering:

- a link of both graphs keeps everything a holds on it: T_{b→a} and its variance terms, χ_a(b),
  V_{b→a} and Sch-Var-2's sums, b's mechanism for a (κ_{b→a}, the noise of its p-sums), and
  under ``forget`` the releases its window holds (`ReleaseWindows.follow`: a new link's window
  starts empty, a dropped link's is discarded);
- a **new link** starts as a pair does at set-up: no release yet (κ = 0, T = 0, Var = +∞: b
  gets weight 0 until it answers), χ_a(b) = 1 (every neighbour is included at set-up; the
  oracle: the true classes), and b's mechanism for a starts a fresh p-sum tree, so its first
  release covers b's samples 1…t_b with new noise. Resuming an earlier incarnation of the
  link instead would mix a statistic that stopped at the drop with releases made after it;
  a fresh start keeps T and Var[T] exact with nothing new to prove;
- a **dropped link**'s state is discarded, but not its releases: the ``privacy`` ledger counts
  every release ever made (`RetiredPairs`), and a link dropped and linked again adds the new
  incarnation's p-sums to the old one's (its first release holds b's first sample again);
- RR goes on over the current neighbours (slot t: a's neighbour at position (t − 1) mod deg a
  + 1 of G'); rRR goes on from the neighbour after the one a queried last, in a's cyclic order
  (a + 1, a + 2, … mod M), over the neighbours of G' it includes.

Over links that are not ideal a message may be in flight when its link changes. Each message
names its pair by the querier and responder it crosses, so it is renumbered on arrival; a
message whose link is gone, or that belongs to an earlier incarnation of its link (its query
was sent before the link was made again), is dropped there (`lost`, per kind). A new link's
first query is the one of the slot it appears in.

A ``stop`` budget (`desim.models.colme.budget`) follows a changing graph: against one querier
its count adds a link's earlier incarnations (`ReleaseBudget.follow`). The runs whose bounds
assume the set-up graph (``calibration = "tight-tree"``, ``degrade``) are refused, each saying
why (`budget_on_changing_graph`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from desim import fast
from desim.kernel.messages import Batch
from desim.kernel.protocol import FollowsGraph
from desim.models.colme.budget import budget_on_changing_graph
from desim.models.colme.compiled import CompiledPairs
from desim.models.colme.delivery import Asynchronous
from desim.models.colme.graph import (
    NeighbourRestrictedRoundRobin,
    NeighbourRoundRobin,
    Neighbours,
)
from desim.models.colme.pairs import ASKED, LastReleases
from desim.models.colme.statistic import SchVar2
from desim.models.privacy.release import SampleVarianceRelease, levels_for
from desim.topologies.graph import Graph

if TYPE_CHECKING:
    from desim.models.colme.protocol import PrivateColME


class ChangingNeighbours(FollowsGraph):
    """Private-ColME's `FollowsGraph` side: with ``peers = "topology"`` it follows the graph
    (this module's rules); with ``peers = "all"`` it reads no graph and runs as on a static one."""

    #: The releases of links dropped so far, for the ledger (None: no link dropped yet).
    retired: RetiredPairs | None = None
    #: What follows the graph over links that are not ideal (None: ideal links, or no change).
    follower: InFlight | None = None

    @classmethod
    def check_graph_changes(cls, params: Any, links: Any) -> None:
        """Refuse the runs whose bounds assume the set-up graph's degrees."""
        if params.peers != "topology":
            return
        budget_on_changing_graph(params)

    def lost_in_flight(self) -> int:
        """Messages dropped on arrival because their link changed in flight, so far (the
        ``lost-in-flight`` metric, `desim.models.ccolme.rewire.in_flight_losses`)."""
        return 0 if self.follower is None else int(self.follower.lost.sum())

    def on_graph_change(self, t: int, added: np.ndarray, dropped: np.ndarray) -> None:
        """Re-lay the pair state out over the new graph (this module's rules)."""
        proto: Any = self
        if proto.graph is not None:
            follow(proto, proto.ctx.public["graph"], t, (added, dropped))


def carried(old: Neighbours, new: Neighbours) -> np.ndarray:
    """For every pair of `new` (its numbering), the pair of `old` of the same link a → b, or −1
    (a new link)."""
    n = new.n
    out = np.full(new.n_pairs, -1, dtype=np.int64)
    if old.n_pairs == 0:
        return out
    # both graphs' keys a·M + b in CSR order are sorted: a search of sorted keys, no sort
    order = old.csr_pairs
    ranked = old.csr_src * n + old.dst[order]
    keys = new.csr_src * n + new.dst[new.csr_pairs]
    pos = np.minimum(np.searchsorted(ranked, keys), len(ranked) - 1)
    out[new.csr_pairs] = np.where(ranked[pos] == keys, order[pos], -1)
    return out


def carried_by_change(
    old: Neighbours, new: Neighbours, added: np.ndarray, dropped: np.ndarray
) -> np.ndarray | None:
    """`carried` from the change itself (links (u, v) `added` and `dropped`): the links kept
    are old's CSR edges without the dropped ones and new's without the added ones, in the same
    (sorted) order, so they pair up by rank: a search of the changed links only, not of every
    link. None when the change does not lead from `old` to `new` (then `carried`)."""
    kept_old, kept_new = _kept(old, dropped), _kept(new, added)
    if kept_old is None or kept_new is None:
        return None
    # (a check of the whole claim, at the cost of one compare: the kept keys are the same)
    if not np.array_equal(old.csr_keys[kept_old], new.csr_keys[kept_new]):
        return None
    out = np.full(new.n_pairs, -1, dtype=np.int64)
    out[new.csr_pairs[kept_new]] = old.csr_pairs[kept_old]
    return out


def _kept(nb: Neighbours, links: np.ndarray) -> np.ndarray | None:
    """Which CSR edges of `nb` are not among the links (u, v) in both directions (None when
    one is not an edge of `nb`)."""
    u, v = np.asarray(links, dtype=np.int64).reshape(-1, 2).T
    gone = np.sort(np.concatenate([u * nb.n + v, v * nb.n + u]))  # (sorted: a faster search)
    keys = nb.csr_keys
    pos = np.searchsorted(keys, gone)
    if len(gone) and (pos.max() >= len(keys) or (keys[pos] != gone).any()):
        return None
    kept = np.ones(len(keys), dtype=bool)
    kept[pos] = False
    return kept


class _Carry:
    """Per-pair arrays of the old numbering laid out over the new pairs (`carried`): one
    gather over every new pair (a link's pairs move with its agents' RR positions, which most
    changes shift), the new links' rows then set."""

    def __init__(self, carry: np.ndarray) -> None:
        self._set(np.where(carry < 0, 0, carry), carry < 0, None)

    def _set(self, index: np.ndarray, new: np.ndarray, fresh: np.ndarray | None) -> None:
        """The map: the old pair each new pair reads (0 for a new link), which are new links,
        and their pairs (None: found here)."""
        self.n, self.index, self.new = len(index), index, new
        #: The new links' pairs, and the pair of the old numbering each new pair reads.
        self.fresh = np.flatnonzero(new) if fresh is None else fresh
        self.any_kept = len(self.fresh) < self.n

    @classmethod
    def merged(cls, old: Neighbours, nb: Neighbours) -> tuple[_Carry, np.ndarray, np.ndarray]:
        """The map from `old` to `nb` (`carried`'s), the old pairs whose links are gone (in
        CSR order) and their queriers, from one compiled merge of their rows
        (`change_kernels.carry_map`)."""
        from desim.models.colme.change_kernels import carry_map

        index, new, fresh, gone, gone_src = carry_map(
            old.indptr, old.csr_dst, old.csr_pairs, nb.indptr, nb.csr_dst, nb.csr_pairs
        )
        carry = cls.__new__(cls)
        carry._set(index, new, fresh)
        return carry, gone, gone_src

    def __call__(self, values: np.ndarray, fill: Any) -> np.ndarray:
        """`values` (pairs on axis 0) over the new pairs, `fill` on the new links."""
        if not self.any_kept:
            return np.full((self.n, *values.shape[1:]), fill, values.dtype)
        rows = _rows(values).take(self.index)
        out = rows.view(values.dtype).reshape(self.n, *values.shape[1:])
        out[self.fresh] = fill
        return out

    def into(self, new: np.ndarray, old: np.ndarray) -> None:
        """Copy the carried pairs' rows of `old` into `new` (a fresh array, in place: its
        new links' rows keep what it was made with)."""
        if not self.any_kept:
            return
        head, old = _rows(new[: self.n]), _rows(old)
        made = head[self.fresh]
        old.take(self.index, out=head, mode="clip")  # (clip: no buffered copy)
        head[self.fresh] = made


def _rows(values: np.ndarray) -> np.ndarray:
    """`values` (pairs on axis 0) as a 1-D array of one opaque item per pair, the same memory
    where `values` is C-contiguous (a copy otherwise; every array written into is): a gather
    of rows is then one copy per row, not numpy's indexing of a 2-D array, which costs many
    times more for rows of a few floats."""
    if values.ndim == 1:
        return values
    row = np.dtype((np.void, values.itemsize * math.prod(values.shape[1:])))
    return np.ascontiguousarray(values).reshape(len(values), -1).view(row).reshape(len(values))


class RetiredPairs:
    """The releases of every link incarnation dropped so far: responder b, querier a, κ."""

    def __init__(self, n: int) -> None:
        self.n = n
        # each change's pairs, joined when read (joining at every change costs the whole
        # history each time)
        self._keys: list[np.ndarray] = []  # b·M + a
        self._counts: list[np.ndarray] = []

    @property
    def keys(self) -> np.ndarray:
        """b·M + a of every retired pair, in the order dropped (a change's in CSR order)."""
        self._join()
        return self._keys[0] if self._keys else np.empty(0, dtype=np.int64)

    @property
    def counts(self) -> np.ndarray:
        """κ of every retired pair, in the order of `keys`."""
        self._join()
        return self._counts[0] if self._counts else np.empty(0, dtype=np.int64)

    def _join(self) -> None:
        """Join the changes' pieces into one array each."""
        if len(self._keys) > 1:
            self._keys, self._counts = [np.concatenate(self._keys)], [np.concatenate(self._counts)]

    def add(self, b: np.ndarray, a: np.ndarray, counts: np.ndarray) -> None:
        """Keep the releases κ of dropped pairs b → a (pairs without a release add nothing)."""
        made = counts > 0
        self._keys.append((b * self.n + a)[made])
        self._counts.append(counts[made].astype(np.int64))

    def spend(
        self, per_pair: Any, mechanism: str, nb: Neighbours, counts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per responder b, the most p-sums holding its first sample that one querier got over
        every incarnation of their link, and their sum over its queriers (`responder_spend`)."""
        per = per_pair(mechanism, np.concatenate([counts.astype(np.int64), self.counts]))
        keys = np.concatenate([nb.dst * self.n + nb.src, self.keys])
        uniq, inverse = np.unique(keys, return_inverse=True)
        by_link = np.zeros(len(uniq), dtype=per.dtype)
        np.add.at(by_link, inverse.ravel(), per)
        one = np.zeros(self.n, dtype=per.dtype)
        np.maximum.at(one, uniq // self.n, by_link)
        every = np.zeros(self.n, dtype=per.dtype)
        np.add.at(every, keys // self.n, per)
        return one, every


def follow(
    proto: PrivateColME,
    graph: Graph,
    t: int,
    change: tuple[np.ndarray, np.ndarray] | None = None,
) -> None:
    """Move `proto`'s pair state from its graph to `graph` before slot t (the module's rules;
    `change`: the links (added, dropped), which spare a search of every link)."""
    old = proto.graph
    compiled = graph.n > CompiledPairs.above and fast.compiled()
    nb = Neighbours(graph, compiled, previous=old)
    if compiled:  # (one merge of the old and new rows gives the map and the links lost)
        carry, gone, gone_src = _Carry.merged(old, nb)
    else:
        by_change = None if change is None else carried_by_change(old, nb, *change)
        carry = _Carry(carried(old, nb) if by_change is None else by_change)
        lost = np.ones(old.n_pairs, dtype=bool)
        lost[carry.index[~carry.new]] = False
        in_csr = lost[old.csr_pairs]  # (in CSR order, as the merge finds them)
        gone, gone_src = old.csr_pairs[in_csr], old.csr_src[in_csr]
    retired = proto.retired if proto.retired is not None else RetiredPairs(nb.n)
    # (the lost pairs, a few of all: gathers of them, not masks of every pair)
    counts = proto.mech.count.ravel()[: old.n_pairs]
    retired.add(old.dst.take(gone), gone_src, counts.take(gone))
    proto.retired = retired
    if proto.release_budget is not None:  # a budget's count over a link's incarnations
        proto.release_budget.follow(nb, carry, retired)
    proto.graph, proto.n_pairs = nb, nb.n_pairs
    _carry_releases(proto, carry)
    _carry_statistic(proto, carry)
    if proto.forget is not None:  # the windows of the releases held, by the same map
        proto.forget.follow(nb, carry)
    included, n_included = proto._initially_included(proto.ctx), None
    if compiled:  # (the carry and each querier's count in one pass)
        from desim.models.colme.change_kernels import carried_beliefs

        n_included = np.zeros(nb.n, dtype=np.int64)
        old_flat = proto.beliefs.flat
        args = carry.index, carry.new, nb.indptr, nb.csr_pairs, n_included
        carried_beliefs(included, old_flat, *args)
    else:
        carry.into(included, proto.beliefs.flat)
    beliefs = type(proto.beliefs)(included, nb, n_included)  # (the class the protocol chose)
    offset = _next_offsets(old, nb, proto.schedule) if proto.params.schedule == "rrr" else None
    proto.beliefs, proto.included = beliefs, beliefs.included
    if offset is None:
        proto.schedule = NeighbourRoundRobin(nb)
    else:
        proto.schedule = NeighbourRestrictedRoundRobin(nb, beliefs)
        proto.schedule.offset = offset
    _carry_delivery(proto, carry)
    CompiledPairs.install(proto)  # (a rewired regular graph is irregular from now on)
    if proto.asynchronous:
        follower = proto.follower if proto.follower is not None else InFlight(old.n_pairs)
        follower.follow(nb, carry, t)
        proto.follower = follower


def _side(n_pairs: int) -> int:
    """The side of the mechanisms' square over `n_pairs` edges (`PrivateColME._setup_releases`)."""
    return max(1, math.isqrt(n_pairs - 1) + 1)


def _carry_releases(proto: PrivateColME, carry: _Carry) -> None:
    """b's mechanisms for a (and Sch-Var-1's), over the new pairs: a new link's start afresh."""
    side, t_max = _side(carry.n), proto.ctx.t_max
    old = proto.mech
    mech = type(old)(side, old.mechanism, old.noise, old.sigma2, old.rng, t_max)
    carry.into(mech._count_flat, old._count_flat)
    if old.mechanism == "pm1":
        carry.into(mech._total_flat, old._total_flat)
    else:
        carry.into(mech._node_flat, old._node_flat)
    proto.mech, proto._side = mech, side
    if proto.params.variance == "sch-var-1":
        was = proto.var_release
        var = SampleVarianceRelease(
            side, was.mechanism, was.noise, was.sigma2_var, was.sigma2_dp, was.rng, t_max
        )
        for name in ("_pm1",) if was.mechanism == "pm1" else ("_prefix", "_part"):
            carry.into(getattr(var, name), getattr(was, name))
        proto.var_release = var


def _carry_statistic(proto: PrivateColME, carry: _Carry) -> None:
    """T_{b→a}, its variance terms, V_{b→a} and Sch-Var-2's sums over the new pairs (a new
    link's as at set-up: no release)."""
    old, levels = proto.stat, levels_for(proto.ctx.t_max)
    stat = type(old)(  # (the class the protocol chose: `desim.models.colme.compiled`)
        old.n_agents,
        old.mechanism,
        old.weights,
        old.sigma2_dp,
        levels,
        n_pairs=carry.n,
        degraded_ratio=old.degraded_ratio,
    )
    carry.into(stat._flat, old._flat)  # in place: the views made on it stay views
    for name in ("_kappa", "_node"):
        if hasattr(old, name):
            carry.into(getattr(stat, name), getattr(old, name))
    proto.stat = stat
    if proto.v_hat is not None:
        proto.v_hat = carry(proto.v_hat, np.inf)
    if hasattr(proto, "schvar2"):
        schvar2 = SchVar2(carry.n, proto.schvar2.mechanism, proto.schvar2.levels)
        carry.into(schvar2._state, proto.schvar2._state)
        proto.schvar2 = schvar2


def _carry_delivery(proto: PrivateColME, carry: _Carry) -> None:
    """The delivery's per-pair state (last releases, releases taken) over the new pairs."""
    delivery = proto.delivery
    delivery._asked = (None, None)  # the last send's pairs are of the old numbering
    if not isinstance(delivery, Asynchronous):
        return
    old = delivery.last
    last = LastReleases(carry.n, old.variance is not None)
    for name in ("value", "count", "variance"):
        if getattr(old, name) is not None:
            carry.into(getattr(last, name), getattr(old, name))
    delivery.last = last
    if delivery.received is not None:
        delivery.received = carry(delivery.received, 0)


def _next_offsets(old: Neighbours, new: Neighbours, schedule: Any) -> np.ndarray:
    """rRR's position last queried by each agent, in the new graph: the neighbours of G' up to
    the one last queried in a's cyclic order a + 1, a + 2, … (0: none queried yet)."""
    n = new.n
    offset = schedule.offset
    asked = np.flatnonzero(offset > 0)
    reach = np.full(n, -1, dtype=np.int64)  # cyclic rank of the neighbour last queried
    b = old.dst[old.at_place(asked, offset[asked] - 1)]
    reach[asked] = (b - asked) % n
    rank = (new.dst[new.csr_pairs] - new.csr_src) % n  # of every CSR edge a → c
    return np.bincount(new.csr_src[rank <= reach[new.csr_src]], minlength=n).astype(np.int64)


class InFlight:
    """Messages in flight when their link changes (links that are not ideal): renumbered on
    arrival by the link they cross; dropped where the link is gone or was made again since
    their query was sent (`lost`, per message kind: query, release)."""

    def __init__(self, n_pairs: int) -> None:
        #: The slot from which each current pair's link incarnation exists (0: from set-up).
        self.born = np.zeros(n_pairs)
        self.n = 0
        self.keys = np.empty(0, dtype=np.int64)
        self.pair_of_key = np.empty(0, dtype=np.int64)
        #: Messages dropped at delivery because their link changed: [queries, releases].
        self.lost = np.zeros(2, dtype=np.int64)

    def follow(self, nb: Neighbours, carry: _Carry, t: int) -> None:
        """The new numbering, and the slot t at which the new links appear."""
        self.born = carry(self.born, float(t))
        order = nb.csr_pairs  # CSR order is sorted by (a, b)
        self.keys, self.pair_of_key, self.n = nb.csr_src * nb.n + nb.dst[order], order, nb.n

    def in_force(
        self, queries: Batch | None, releases: Batch | None, column: int
    ) -> tuple[Batch | None, Batch | None]:
        """The queries and releases (pair in payload `column`) whose link is in force."""
        q = None if queries is None or not len(queries) else self._current(queries, 0, 0)
        r = None if releases is None or not len(releases) else self._current(releases, 1, column)
        return q, r

    def _current(self, batch: Batch, kind: int, column: int) -> Batch:
        """The messages of one `kind` (0 query, 1 release) whose link is in force, their pairs
        (payload `column`) renumbered."""
        key = batch.src * self.n + batch.dst if kind == 0 else batch.dst * self.n + batch.src
        pos = np.minimum(np.searchsorted(self.keys, key), max(len(self.keys) - 1, 0))
        found = self.keys[pos] == key if len(self.keys) else np.zeros(len(key), dtype=bool)
        pair = np.where(found, self.pair_of_key[pos], 0)
        asked = batch.sent_at if kind == 0 else batch.payload[:, ASKED]
        keep = found & (asked >= self.born[pair])
        if not keep.all():
            self.lost[kind] += int((~keep).sum())
            batch = batch.select(np.flatnonzero(keep))
            pair = pair[keep]
        payload = np.array(batch.payload, order="F")
        payload[:, column] = pair
        return Batch(
            batch.src,
            batch.dst,
            batch.kind,
            payload,
            batch.sent_at,
            batch.kinds,
            batch.single_kind,
            batch.delivered_at,
        )
