"""C-ColME's compiled per-slot passes (`desim.fast`): the numpy path's bytes, in one loop each.

The passes of a slot that read or write every edge of S or C: the state send's gather (X̃_b and
Y_b by sender, by block of senders on large graphs, whose order a counting sort gives), the
neighbour test (|X̃_a − X̃_b| against one bound for every edge), the mix (W Y over each agent's
run of kept edges) and, when C moves over ideal links, C's edges, the size send and eq. (2)'s
weights. In numpy each is several passes over per-edge arrays that fit in no cache, with
temporaries between them; here each is one loop over the edges in CSR order. They give the
numpy path's bytes: the gathers copy, the test subtracts, takes the absolute value and compares
as numpy does, eq. (2) is max, +1 and a division as numpy's, and the mix forms (Y_b − Y_a)·W_ab
per edge and sums each agent's terms in `np.add.reduceat`'s order (`desim.fast.reduceat_sum`'s,
written out for rows of 9 to 129 terms), reading Y_b through C's positions in the state send
while C is smaller than S (no gathered copy).

`CompiledPass.choose` is called once at set-up by the parts that own these passes
(`desim.models.ccolme.live_first.LiveFirst`, `desim.models.ccolme.model.NeighbourTest`,
`desim.models.ccolme.edges.Rows`, `desim.models.ccolme.sizes.Sizes`): it returns the strategy
when the graph has at least `COMPILED_FROM` directed edges and the kernels are available
(`desim.fast.compiled`), else None (the numpy path). The kernels live in
`desim.models.ccolme._kernels`, imported only then, so runs that do not take them never import
numba.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np


class KeptWeights:
    """W_ab of the mixed edges `idx`, held per graph edge in `every` and read there (not
    copied) by the compiled mix; as an array (`mixing_matrix`), every[idx]."""

    def __init__(self, every: np.ndarray, idx: np.ndarray) -> None:
        self.every, self.idx = every, idx

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        """every[idx], a new array."""
        return self.every.take(self.idx).astype(dtype or float, copy=False)


class PairTable:
    """A send's table of (X̃_b, Y_b) per agent, written ahead by the consensus step of the slot
    before (`CompiledPass.mix`) and read by the next send's gather if it holds the arrays that
    send takes (`holds`: the same objects; X̃ and Y are never written in place)."""

    def __init__(self, n: int) -> None:
        self._n = n
        self._buffer: np.ndarray | None = None  # made at the first write
        #: The arrays (X̃, Y) the table holds side by side (None: nothing valid).
        self.of: tuple[np.ndarray, np.ndarray] | None = None

    def buffer(self) -> np.ndarray:
        """The (n × 2) rows to write; what they held is no longer valid."""
        if self._buffer is None:
            self._buffer = np.empty((self._n, 2))
        self.of = None
        return self._buffer

    def holds(self, x: np.ndarray, y: np.ndarray) -> bool:
        """Whether the rows are (x[b], y[b]) for every agent b."""
        return self.of is not None and self.of[0] is x and self.of[1] is y

    def buffer_held(self) -> np.ndarray:
        """The rows as written (`holds` first)."""
        assert self._buffer is not None
        return self._buffer


if TYPE_CHECKING:
    from desim.models.ccolme.edges import BlockedTake
    from desim.topologies.graph import Graph

#: Directed edges from which the compiled passes are taken (below, numpy's passes are in cache
#: and the kernels' first compilation would not pay; tests set it to 0).
COMPILED_FROM = 1 << 19


class CompiledPass:
    """The compiled passes of one run (the strategy chosen at set-up; None: numpy's)."""

    @classmethod
    def choose(cls, edges: int) -> CompiledPass | None:
        """The compiled passes for a graph of `edges` directed edges, or None for numpy's."""
        if edges < COMPILED_FROM:
            return None
        from desim import fast  # numba is imported only here: by runs that may use it

        return cls() if fast.compiled() else None

    def __init__(self) -> None:
        """The kernels, imported (and their compiled code loaded) at set-up."""
        from desim.models.ccolme import _kernels

        self._k = _kernels

    def gather_states(
        self,
        mean: np.ndarray,
        y: np.ndarray,
        sender: np.ndarray,
        x_out: np.ndarray,
        y_out: np.ndarray,
        blocked: BlockedTake | None = None,
    ) -> None:
        """x_out[i], y_out[i] = X̃_b, Y_b for b = sender[i], written in place; by block of
        senders when `blocked` (their `BlockedTake`) is given."""
        if blocked is None:
            self._k.gather_states(mean, y, sender, x_out, y_out)
        else:
            read = blocked.reads(2)
            self._k.gather_blocked(mean, y, blocked.sorted, blocked.back, read, x_out, y_out)

    def keep_within(
        self, mean: np.ndarray, x_b: np.ndarray, a: np.ndarray, bound: float, strict: bool
    ) -> np.ndarray:
        """|X̃_a − X̃_b| < bound (strict) or ≤ bound per edge, X̃_a = mean[a]."""
        keep = np.empty(len(x_b), dtype=bool)
        self._k.keep_within(mean, x_b, a, float(bound), strict, keep)
        return keep

    def mix(
        self,
        y: np.ndarray,
        nb_y: np.ndarray,
        w: np.ndarray | float | KeptWeights,
        counts: np.ndarray,
        at: np.ndarray | None = None,
        step: tuple[np.ndarray, np.ndarray, float, float] | None = None,
        table: PairTable | None = None,
    ) -> np.ndarray:
        """(W Y)_a of `desim.models.ccolme.model.mix`, a new array; with `at`, Y_b of mixed
        edge i is nb_y[at[i]], and W_ab as `KeptWeights` is read where they are kept per edge
        (each in place of a gathered copy: the same values). With `step` = (X̃, t^start, t, c),
        the consensus step on it in the same pass (`consensus_step`'s operations), and with
        `table` too, (X̃_a, Y_a^(t)) written there for the next send."""
        out = np.empty(len(y))
        rows = None
        if step is not None:  # (float t and c: one compiled signature)
            step = (step[0], step[1], float(step[2]), float(step[3]))
            rows = None if table is None else table.buffer()
        if isinstance(w, KeptWeights):  # read in place when every edge is mixed (idx, in
            # order, is then each edge once)
            w_at = w.idx if len(w.idx) < len(w.every) else None
            self._k.mix_rows(y, nb_y, at, w.every, w_at, 0.0, counts, out, step, rows)
        elif isinstance(w, np.ndarray):
            self._k.mix_rows(y, nb_y, at, w, None, 0.0, counts, out, step, rows)
        else:
            self._k.mix_rows(y, nb_y, at, None, None, float(w), counts, out, step, rows)
        if rows is not None:
            table.of = (step[0], out)  # type: ignore[union-attr,index]
        return out

    def consensus_step(
        self, mean: np.ndarray, mixed: np.ndarray, start: np.ndarray, t: float, c: float
    ) -> np.ndarray:
        """Y^(t) with 1 − α = min(1, c/s) at the ages s = t − start, a new array (see
        `desim.models.ccolme.model.consensus_step`)."""
        out = np.empty(len(mean))
        self._k.consensus_step(mean, mixed, start, float(t), float(c), out)
        return out

    def take_samples(
        self, raw_sum: np.ndarray, priv_sum: np.ndarray, samples: np.ndarray, t: int
    ) -> np.ndarray:
        """Σ X_a and Σ (X_a + Z_a) with the slot's samples added in place (no noise: Z = 0),
        and X̃_a = Σ (X_a + Z_a)/t, a new array."""
        mean = np.empty(len(samples))
        self._k.take_samples(raw_sum, priv_sum, samples, float(t), mean)
        return mean

    def size_send(
        self,
        kept_idx: np.ndarray,
        dst: np.ndarray,
        size_dst: np.ndarray,
        t: float,
        sender: np.ndarray,
        payload: np.ndarray,
    ) -> None:
        """The size send over the kept edges e: sender dst[e] into `sender`, (|C_b| held per
        edge, t) into the payload's columns."""
        self._k.size_send(kept_idx, dst, size_dst, float(t), sender, payload[:, 0], payload[:, 1])

    def alive_edges(
        self, alive: np.ndarray, s: np.ndarray, pos: np.ndarray, edges: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(`np.flatnonzero(alive)`, s there), written into the first slots of pos and edges."""
        k = self._k.alive_edges(alive, s, pos, edges)
        return pos[:k], edges[:k]

    def refresh_weights(
        self,
        size: np.ndarray,
        src: np.ndarray,
        dst: np.ndarray,
        size_dst: np.ndarray,
        w: np.ndarray,
    ) -> None:
        """|C_b| (a float) per edge into `size_dst` and eq. (2)'s W_ab into `w`, in place."""
        self._k.refresh_weights(size, src, dst, size_dst, w)

    def gather_pairs(
        self,
        mean: np.ndarray,
        y: np.ndarray,
        sender: np.ndarray,
        pairs: np.ndarray,
        table: PairTable | None = None,
    ) -> None:
        """pairs[i] = (X̃_b, Y_b) for b = sender[i], written in place; from `table` if it
        holds them side by side."""
        if table is not None and table.holds(mean, y):
            self._k.gather_table(table.buffer_held(), sender, pairs)
        else:
            self._k.gather_pairs(mean, y, sender, pairs)

    def test_pairs(
        self,
        mean: np.ndarray,
        receiver: np.ndarray,
        pairs: tuple[np.ndarray, np.ndarray | None],
        alive: np.ndarray,
        s: np.ndarray | None,
        bound: tuple[float, bool],
        out: tuple[np.ndarray, np.ndarray, np.ndarray],
    ) -> tuple[int, int]:
        """The test on S's alive edges (edge i's receiver: receiver[i]) against X̃_b of the
        send's `pairs` (the pairs and where S's edge i is in them, None: at i), with `bound`
        (the bound, whether strict). Graph edges (s[i], or i if `s` is None) that fail are no
        longer alive and go into out[0]; Y_b of those kept into out[1], and if any died, the
        kept ones into out[2] (if none did, C is as it was). Returns (how many died, how many
        kept)."""
        read, back = pairs
        died, y_kept, kept = out
        value, strict = float(bound[0]), bound[1]
        return self._k.test_pairs(
            mean, receiver, read, back, alive, s, value, strict, died, y_kept, kept
        )

    def refresh_rows(
        self,
        agents: np.ndarray,
        graph: Graph,
        size: np.ndarray,
        size_dst: np.ndarray,
        w: np.ndarray,
    ) -> None:
        """`refresh_weights` on the edges of `agents` and their reverse edges only."""
        g = graph
        self._k.refresh_rows(agents, g.indptr, g.reverse, g.dst, size, size_dst, w)

    def block_order(self, index: np.ndarray, bits: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(index sorted stably by block of 2^bits values, where each index went), for values
        of `n` entries: `desim.models.ccolme.edges.BlockedTake`'s order by a counting sort."""
        sorted_index, back = np.empty_like(index), np.empty(len(index), dtype=np.int64)
        self._k.block_order(index, bits, (n >> bits) + 1, sorted_index, back)
        return sorted_index, back
