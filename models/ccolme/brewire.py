"""B-ColME and Private-B-ColME on a graph that changes during a run (`desim.topologies.dynamic`).

Before slot t's samples the graph G becomes G' (`BColME.on_graph_change`). What a holds per
directed edge (a, b) — whether b is kept (b ∈ C_a) and b's newest table (X̃_b, n_b, then
S_{b→a}^(k) and c_{b→a}^(k) for k = 1 … κ − 2) — is re-laid out in G''s CSR order, as for
C-ColME (`desim.models.ccolme.rewire`):

- a link of both graphs keeps both: b's table stays until b's next message replaces it;
- a **new link** starts as a neighbour does at set-up: kept, and no table of b held yet
  (n_b = 0), so b enters neither a's estimate nor the sums a forwards until b's first message
  arrives (sent in the slot the link appears in: on ideal links it is read one slot later,
  as every table is); from then on the neighbour test judges b by the rule as it judges a
  neighbour at set-up (``irrevocable``: kept until a test drops it; ``retest``: tested at
  every table). A link dropped and made again starts afresh (an earlier drop of b is
  forgotten);
- a **dropped link**'s table is discarded: it leaves a's estimate, and the non-backtracking
  sums a sends its other neighbours, from slot t on. A table a still holds from a kept
  neighbour may count agents reached through the dropped link (b computed it on G); each
  neighbour's next message is computed on G', so what lay beyond the dropped link leaves a's
  depth-k entries k slots later, as any news travels through the tables.

The test's γ = δ/(4 Σ_a deg a) keeps the set-up's Σ_a deg a, an agent's constant (a graph
file of a sequence may change Σ_a deg a; rewiring keeps it).

Over links that are not ideal a message may be in flight when its link changes: one whose
link is gone, or that was sent before its link was made again, is dropped on arrival and
counted (`desim.models.ccolme.rewire.InFlight`, C-ColME's code; the ``lost-in-flight``
metric). Privacy is unchanged by a change: every sample is privatised once and all an agent
sends derives from the privatised samples, so each sample stays one release, and an agent
that shared on an earlier graph is counted by the ``privacy`` ledger after it loses its last
link (`desim.models.ccolme.rewire.note_shared`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from desim.models.ccolme.rewire import Remap, adopt, carried, note_shared, track_in_flight

if TYPE_CHECKING:
    from desim.models.ccolme.bcolme import BColME


def follow(proto: BColME, t: int) -> None:
    """Move `proto`'s per-edge state to the graph in force from slot t (the module's rules)."""
    old, graph = proto.graph, proto.ctx.public["graph"]
    remap = Remap(carried(old, graph))
    proto.kept = remap(proto.kept, True)
    # a column per edge: rows as `remap` takes them (n_b = 0 on new links: none held yet)
    proto.held = np.stack([remap(row, 0.0) for row in proto.held])
    proto._held_own = True
    # `_whole_t` (when set, the n_b of every table held) still holds: a carried table keeps its
    # n_b, and a new link holds none, so is neither tested nor counted
    note_shared(proto, old)
    adopt(proto, graph)
    if getattr(proto, "told_edges", None) is not None:  # b's told factor, per edge (a, b)
        proto.told_edges = proto.told[graph.dst]  # (inflating adversaries: `Adversarial.told`)
    proto._buffers = [np.empty_like(proto.held) for _ in range(2)] if proto._in_order else []
    proto._tables = None  # (S, c) buffers of the old edges
    track_in_flight(proto, remap, old.n_directed)
