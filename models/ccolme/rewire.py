"""C-ColME and Private-C-ColME on a graph that changes during a run (`desim.topologies.dynamic`).

Before slot t's samples the graph G becomes G' (`CColME.on_graph_change`). What a holds per
directed edge (a, b) is re-laid out in G''s CSR order:

- a link of both graphs keeps everything a held on it: χ_a(b), χ_b(a) as b told it, b's states
  (X̃_b, t_b, Y_b and the one before), |C_b| as b told it;
- a new link starts as a neighbour does at set-up (seed 001's initialisation, Algorithm 1):
  χ_a(b) = χ_b(a) = ``initial`` (C-ColME: kept; Private-C-ColME: not kept until a test keeps
  it), no state of b held (t_b = 0: the optimistic distance keeps b, a stale test without a
  previous state keeps b, the update does not mix b before it is heard from), and |C_b| = b's
  |C_b| now (what set-up holds before any message; b's size send of the slot replaces it
  before a mixes);
- a dropped link's state is discarded: b leaves C_a, so |C_a| and the weights
  W_ab = 1/(1 + max(|C_a|, |C_b|)), W_aa = 1 − Σ_b W_ab renormalise over the neighbours left
  (W stays row-stochastic, and doubly stochastic where the decisions are symmetric).

An agent whose C_a gained or lost a link this way has a changed neighbour set, so ``reset``
restarts its age as a test's change would (``global``: everyone's). The run goes on on the
per-edge delivery path (`desim.models.ccolme.edges.EdgeStates`): the live-first path holds one
age for every state and cannot hold a new link's "none yet"; a run that was live-first returns
to it (`relive`) once the newest state held on every edge is of one slot again (the next
slot), with the same bits (the two paths give the same results). The test's
γ = δ/(4 Σ_a deg a) keeps the set-up's Σ_a deg a (rewiring keeps it; a graph file of a
sequence may not), as an agent's constant.

Over links that are not ideal a message may be in flight when its link changes (`InFlight`):
one whose link is gone, or that was sent before its link was made again (its sender's earlier
incarnation of the link), is dropped on arrival and counted in `InFlight.lost` (per kind:
state, decision, size); a new link's first messages are those of the slot it appears in (its
sender's state, then its decision and size at the slot's consensus step), and until they
arrive it holds what set-up holds (χ = ``initial``, no state of b). The metric
``lost-in-flight`` records how many were dropped so far (`Follows.lost_in_flight`), for every
protocol that follows a changing graph. An agent that had a neighbour in an earlier graph has
shared its samples, and the ``privacy`` ledger keeps counting them after it loses its last
link (`note_shared`).

B-ColME and Private-B-ColME follow a changing graph the same way (`desim.models.ccolme.brewire`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from desim.kernel.messages import Batch
from desim.kernel.protocol import FollowsGraph
from desim.kernel.registry import METRICS, applies_to, records
from desim.models.ccolme.edges import EdgeSlots, EdgeStates, Rows, Turns
from desim.models.ccolme.live_first import BUFFERS, LiveFirst
from desim.models.ccolme.sizes import Sizes
from desim.topologies.graph import Graph

if TYPE_CHECKING:
    from desim.models.ccolme.family import CColMEFamily
    from desim.models.ccolme.protocol import CColME


class InFlight:
    """The slot each directed edge's link was made (0: at set-up), and the messages dropped
    on arrival because their link changed while they were in flight (per kind)."""

    def __init__(self, n_edges: int, kinds: int) -> None:
        self.born = np.zeros(n_edges)
        #: Messages dropped at delivery, per message kind (state, decision, size).
        self.lost = np.zeros(kinds, dtype=np.int64)

    def in_force(self, proto: CColMEFamily, batch: Batch) -> Batch:
        """The messages of `batch` whose link is in force and was made before they were sent."""
        return self.slots_in_force(proto, batch)[0]

    def slots_in_force(self, proto: CColMEFamily, batch: Batch) -> tuple[Batch, np.ndarray]:
        """`in_force`'s messages and their receivers' edge slots (found once: a receiver
        filing them by slot need not look them up again)."""
        e = proto._slot_of.find(batch.dst, batch.src)
        keep = e >= 0
        keep[keep] = batch.sent_at[keep] >= self.born[e[keep]]
        if keep.all():
            return batch, e
        np.add.at(self.lost, batch.kind[~keep], 1)
        rows = np.flatnonzero(keep)
        return batch.select(rows), e[rows]


class Follows(FollowsGraph):
    """The C-ColME family's side of a changing graph: the messages its links lost in flight."""

    #: Messages of links changed while in flight (`InFlight`; None: none yet).
    in_flight: InFlight | None = None

    def lost_in_flight(self) -> int:
        """Messages dropped on arrival because their link was dropped or made again while they
        were in flight, so far (0 on ideal links or a graph that never changed)."""
        return 0 if self.in_flight is None else int(self.in_flight.lost.sum())


@METRICS.register("lost-in-flight")
@records("lost_in_flight")
@applies_to("lost_in_flight")
def in_flight_losses(protocol: Any, data: Any) -> dict[str, float]:
    """``lost_in_flight``: the messages dropped on arrival so far because their link was
    dropped or made again while they were in flight (a changing graph over links that are not
    ideal; C-ColME's and B-ColME's `InFlight.lost`, Private-ColME's
    `desim.models.colme.rewire.InFlight.lost`, all kinds together)."""
    hook = getattr(protocol, "lost_in_flight", None)  # (protocols that follow no graph)
    return {} if hook is None else {"lost_in_flight": float(hook())}


def carried(old: Graph, new: Graph) -> np.ndarray:
    """For every directed edge of `new` (CSR order), its index in `old`, or −1 (a new link)."""
    n = old.n
    old_keys = old.src * n + old.dst  # CSR order: sorted
    new_keys = new.src * n + new.dst
    if len(old_keys) == 0:
        return np.full(len(new_keys), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(old_keys, new_keys), len(old_keys) - 1)
    return np.where(old_keys[pos] == new_keys, pos, -1)


class Remap:
    """Per-edge arrays of the old graph laid out over the new edges (`carried`)."""

    def __init__(self, carry: np.ndarray) -> None:
        self.n = len(carry)
        self.new = carry < 0
        self.any_new = bool(self.new.any())
        self._at = np.flatnonzero(~self.new)
        self._from = carry[self._at]

    def __call__(self, values: np.ndarray, fresh: Any) -> np.ndarray:
        """`values` over the new edges, `fresh` on the new links."""
        if not self.any_new:
            return values.take(self._from)
        out = np.full(self.n, fresh, dtype=values.dtype)
        out[self._at] = values.take(self._from)
        return out


def _edge_states(states: EdgeStates | LiveFirst, remap: Remap) -> EdgeStates:
    """b's states as a holds them, over the new edges (none yet on new links)."""
    if isinstance(states, LiveFirst):
        states = states.to_edge_states()
    out = EdgeStates(remap.n)
    for name in ("x", "n", "y", "x_prev", "n_prev"):
        setattr(out, name, remap(getattr(states, name), 0.0))
    out.n_all = None if remap.any_new else states.n_all
    out.n_prev_all = None if remap.any_new else states.n_prev_all
    return out


def follow(proto: CColME, graph: Graph) -> None:
    """Move `proto`'s per-edge state from its graph to `graph` (the module's rules)."""
    old = proto.graph
    remap = Remap(carried(old, graph))
    initial = proto.params.initial == "all"
    kept_before = proto.kept
    proto.chi = remap(proto.chi, initial)
    proto.their_chi = remap(proto.their_chi, initial)
    proto.their_chi_at = remap(proto.their_chi_at, 0.0)
    proto.kept = kept = remap(kept_before, initial)
    proto.states = _edge_states(proto.states, remap)
    nb_size = remap(proto._sizes.nb_size, 0.0)
    nb_at = remap(proto._sizes.at, 0.0)
    # C_a moved where a kept link was dropped or a new link is kept
    lost = np.bincount(old.src[kept_before], minlength=old.n)
    lost -= np.bincount(graph.src[kept & ~remap.new], minlength=graph.n)
    gained = np.bincount(graph.src[kept & remap.new], minlength=graph.n)
    proto._rewired = (lost > 0) | (gained > 0)
    note_shared(proto, old)
    adopt(proto, graph)  # the graph's own arrays and everything built on them
    proto._csr = Rows(graph)
    proto.size = proto._csr.count(kept)
    proto._kept_idx = np.flatnonzero(kept)
    proto._kept_version += 1
    p = proto.params
    metropolis, told = p.weights == "metropolis", proto._sizes.told
    proto._sizes = sizes = Sizes(graph, proto.size, proto._in_order, metropolis, told)
    sizes._nb_size[~remap.new] = nb_size[~remap.new]
    sizes.at = nb_at
    proto._payloads, proto._sent = Turns(3 * graph.n_directed, float, BUFFERS), {}
    proto._mixed_idx, proto._w = np.empty(0, dtype=np.int64), 0.0
    proto._relive = proto._in_order and p.decisions == "irrevocable"
    track_in_flight(proto, remap, old.n_directed)


def adopt(proto: CColMEFamily, graph: Graph) -> None:
    """Give `proto` the arrays `CColMEFamily._setup_graph` reads from its graph, of `graph`:
    the edges, their slots, the oracle's decisions."""
    proto.graph = graph
    proto.src, proto.dst, proto.reverse = graph.src, graph.dst, graph.reverse
    proto._slot_of = EdgeSlots(graph.n, graph.src * graph.n + graph.dst)
    if proto.uses_oracle:
        classes = proto.ctx.oracle_classes
        proto._oracle_chi = classes[graph.src] == classes[graph.dst]


def note_shared(proto: CColMEFamily, old: Graph) -> None:
    """Remember, before `old` gives way, the agents that shared on it (a neighbour and a slot
    run): the ``privacy`` ledger counts their samples even once they have no link left."""
    if proto.t > 0:
        before = proto.shared_before
        linked = old.degree > 0
        proto.shared_before = linked if before is None else before | linked


def track_in_flight(proto: Any, remap: Remap, n_old: int) -> None:
    """Over links that are not ideal, where messages may be in flight: each edge's link made
    before slot t + 1 (t = `proto.t`, the last slot run) is of a new incarnation if new."""
    if not proto._in_order:
        in_flight = proto.in_flight or InFlight(n_old, len(proto.message_kinds))
        in_flight.born = remap(in_flight.born, float(proto.t + 1))
        proto.in_flight = in_flight


def relive(proto: CColME) -> None:
    """Back to the live-first path, before slot t's send, once every edge holds b's state of
    one slot (S = χ's edges, holding those states; the previous ones are not read again)."""
    states = proto.states
    if not isinstance(states, EdgeStates) or states.n_all is None:
        return
    s = np.flatnonzero(proto.chi)
    live = LiveFirst(proto.graph, s)
    live._held = (0, s, states.x[s], states.y[s])
    live._held_prev = (0, s, states.x_prev[s])
    live.n_all = states.n_all
    live.n_prev_all = states.n_prev_all if states.n_prev_all is not None else states.n_all
    # S is C (C = χ without symmetric decisions): the update's Y_b need no gather
    live._s_is_kept = None if proto.params.symmetric else proto._kept_version
    proto.states, proto._relive = live, False
