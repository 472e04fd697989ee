"""The kernels of `desim.models.ccolme.compiled` (numba's, through `desim.fast`): imported only
when a run takes the compiled passes, so that runs that do not never import numba."""

import numpy as np

from desim import cache_hints, fast


@fast.kernel
def _side_by_side(mean, y):
    """X̃_b and Y_b side by side, row b: one cache line serves both reads of a sender."""
    pair = np.empty((len(mean), 2))
    for b in range(len(mean)):
        pair[b, 0] = mean[b]
        pair[b, 1] = y[b]
    return pair


@fast.kernel
def gather_states(mean, y, sender, x_out, y_out):
    """x_out[i], y_out[i] = mean[b], y[b] for b = sender[i] (copies)."""
    pair = _side_by_side(mean, y)
    for i in range(len(sender)):
        b = sender[i]
        x_out[i] = pair[b, 0]
        y_out[i] = pair[b, 1]


@fast.kernel
def gather_pairs(mean, y, sender, pairs):
    """pairs[i] = (mean[b], y[b]) for b = sender[i] (copies)."""
    gather_table(_side_by_side(mean, y), sender, pairs)


#: How many reads ahead `gather_table` asks for its row (`desim.cache_hints.prefetch`): enough
#: to cover a read from the shared cache, where a block of senders' rows sits.
AHEAD = 32


@fast.kernel
def gather_table(pair, sender, pairs):
    """pairs[i] = pair[b] for b = sender[i], from the two values side by side (copies; the
    rows written past the caches: they are read by the next pass, after all of them)."""
    k = len(sender)
    for i in range(k):
        if i + AHEAD < k:
            cache_hints.prefetch(pair, sender[i + AHEAD])
        b = sender[i]
        cache_hints.stream_row(pairs, i, 0, pair[b, 0])
        cache_hints.stream_row(pairs, i, 1, pair[b, 1])
    cache_hints.fence()


@fast.kernel
def gather_blocked(mean, y, sorted_sender, back, read, x_out, y_out):
    """`gather_states` in `desim.models.ccolme.edges.BlockedTake`'s two passes: read the pairs
    by block of senders (`sorted_sender`), then put each back in place (`back`)."""
    gather_pairs(mean, y, sorted_sender, read)
    for i in range(len(back)):
        j = back[i]
        x_out[i] = read[j, 0]
        y_out[i] = read[j, 1]


@fast.kernel
def keep_within(mean, x_b, a, bound, strict, keep):
    """keep[i] = |mean[a[i]] − x_b[i]| < bound (strict) or ≤ bound."""
    # one loop per comparison: no branch on `strict` inside the loop
    if strict:
        for i in range(len(x_b)):
            keep[i] = abs(mean[a[i]] - x_b[i]) < bound
    else:
        for i in range(len(x_b)):
            keep[i] = abs(mean[a[i]] - x_b[i]) <= bound


@fast.kernel
def _term(nb_y, at, w, w_at, w_const, ya, i):
    """(Y_b − Y_a)·W_ab of mixed edge i: Y_b = nb_y[i], or nb_y[at[i]] (`at` not None); W_ab
    = w[i], or w[w_at[i]] (`w_at` not None), or `w_const` when `w` is None. All are
    compile-time choices: a run-time flag here is a branch in the mix's innermost loop."""
    y_b = nb_y[i] if at is None else nb_y[at[i]]
    if w is None:
        return (y_b - ya) * w_const
    return (y_b - ya) * (w[i] if w_at is None else w[w_at[i]])


@fast.kernel
def mix_rows(y, nb_y, at, w, w_at, w_const, counts, out, step, table):
    """out[a] = Y_a + Σ_b (Y_b − Y_a)·W_ab over a's `counts[a]` consecutive edges (Y_b from
    nb_y, through `at` when given; W_ab from `w`, through `w_at` when given, or `w_const` when
    `w` is None), the sum in `np.add.reduceat`'s order: the first term plus the pairwise sum of
    the m = counts[a] − 1 others. For m < 8 that is −0.0 plus the others one by one, and for
    8 ≤ m ≤ 128 (graphs of degree 9 to 129) `desim.fast.pairwise_sum`'s branch of eight
    partial sums and a tail, both written out here on terms read straight from the edges
    (never stored: one loop, in registers). With `step` (not None), out[a] is then the
    consensus step on (W Y)_a (`_stepped`), and with `table` (not None, with `step`) the row
    (X̃_a, out[a]) is written into table[a] too (the next send's pairs, `_side_by_side`)."""
    width = 1
    for a in range(len(counts)):
        width = max(width, counts[a])
    terms = np.empty(width)
    j = 0
    for a in range(len(y)):
        c, ya = counts[a], y[a]
        m, s = c - 1, j + 1
        if 8 <= m <= 128:
            r0 = _term(nb_y, at, w, w_at, w_const, ya, s)
            r1 = _term(nb_y, at, w, w_at, w_const, ya, s + 1)
            r2 = _term(nb_y, at, w, w_at, w_const, ya, s + 2)
            r3 = _term(nb_y, at, w, w_at, w_const, ya, s + 3)
            r4 = _term(nb_y, at, w, w_at, w_const, ya, s + 4)
            r5 = _term(nb_y, at, w, w_at, w_const, ya, s + 5)
            r6 = _term(nb_y, at, w, w_at, w_const, ya, s + 6)
            r7 = _term(nb_y, at, w, w_at, w_const, ya, s + 7)
            i, end = s + 8, s + m - m % 8
            while i < end:
                r0 += _term(nb_y, at, w, w_at, w_const, ya, i)
                r1 += _term(nb_y, at, w, w_at, w_const, ya, i + 1)
                r2 += _term(nb_y, at, w, w_at, w_const, ya, i + 2)
                r3 += _term(nb_y, at, w, w_at, w_const, ya, i + 3)
                r4 += _term(nb_y, at, w, w_at, w_const, ya, i + 4)
                r5 += _term(nb_y, at, w, w_at, w_const, ya, i + 5)
                r6 += _term(nb_y, at, w, w_at, w_const, ya, i + 6)
                r7 += _term(nb_y, at, w, w_at, w_const, ya, i + 7)
                i += 8
            rest = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
            while i < s + m:
                rest += _term(nb_y, at, w, w_at, w_const, ya, i)
                i += 1
            mixed = ya + (_term(nb_y, at, w, w_at, w_const, ya, j) + rest)
        elif c == 0:
            mixed = ya
        elif m < 8:  # short rows: `desim.fast.reduceat_sum`'s order, the first term plus the
            # others summed from −0.0 one by one (written out: that sum is a call numba does
            # not inline)
            rest = -0.0
            for k in range(s, s + m):
                rest += _term(nb_y, at, w, w_at, w_const, ya, k)
            mixed = ya + (_term(nb_y, at, w, w_at, w_const, ya, j) + rest)
        else:  # long rows: numpy's order by `desim.fast.reduceat_sum`
            for k in range(c):
                terms[k] = _term(nb_y, at, w, w_at, w_const, ya, j + k)
            mixed = ya + fast.reduceat_sum(terms, 0, c)
        out[a] = _stepped(a, step, mixed)
        if table is not None:
            table[a, 0] = step[0][a]
            table[a, 1] = out[a]
        j += c


@fast.kernel
def _stepped(a, step, mixed):
    """(W Y)_a = `mixed`, or with `step` = (X̃, t^start, t, c) (not None: a compile-time choice)
    (1 − α) X̃_a + α (W Y)_a with 1 − α = min(1, c/s) at age s = t − t^start_a: the operations
    of `model.one_minus_alpha` (p = 1, c ≥ 1) and `model.consensus_update`."""
    if step is None:
        return mixed
    mean, start, t, c = step
    decay = c / (t - start[a])
    oma = 1.0 if decay >= 1.0 else decay  # np.minimum(1.0, decay), NaN kept
    return oma * mean[a] + (1.0 - oma) * mixed


@fast.kernel
def consensus_step(mean, mixed, start, t, c, out):
    """out[a] = (1 − α) X̃_a + α (W Y)_a (`_stepped`) for every agent a."""
    step = (mean, start, t, c)
    for a in range(len(mean)):
        out[a] = _stepped(a, step, mixed[a])


@fast.kernel
def take_samples(raw_sum, priv_sum, samples, t, mean):
    """raw_sum += samples, priv_sum += samples and mean = priv_sum / t, in one loop."""
    for a in range(len(samples)):
        raw_sum[a] += samples[a]
        priv_sum[a] += samples[a]
        mean[a] = priv_sum[a] / t


@fast.kernel
def size_send(kept_idx, dst, size_dst, t, sender, sizes, times):
    """The size send over the kept edges e: sender dst[e], |C_b| = size_dst[e], slot t."""
    for j in range(len(kept_idx)):
        e = kept_idx[j]
        sender[j] = dst[e]
        sizes[j] = size_dst[e]
        times[j] = t


@fast.kernel
def alive_edges(alive, s, pos, edges):
    """The positions of the alive flags (`np.flatnonzero`) and the edges of S there, written
    into `pos` and `edges`; returns how many."""
    return _alive(alive, s, len(alive), pos, edges)


@fast.kernel
def _alive(alive, s, stop, pos, edges):
    """The positions of S's alive flags before `stop` (into `pos`, unless it is None: a
    compile-time choice) and their graph edges (`_edge`) into `edges`; returns how many."""
    k = 0
    for i in range(stop):
        if alive[i]:
            if pos is not None:
                pos[k] = i
            edges[k] = _edge(s, i)
            k += 1
    return k


@fast.kernel
def refresh_weights(size, src, dst, size_dst, w):
    """|C_b| as a float and eq. (2)'s W_ab = 1/(1 + max(|C_a|, |C_b|)) on every edge."""
    for e in range(len(dst)):
        b = float(size[dst[e]])
        size_dst[e] = b
        w[e] = 1.0 / (max(float(size[src[e]]), b) + 1.0)


@fast.kernel
def block_order(index, bits, blocks, sorted_index, back):
    """`index` sorted by block index >> bits, stably (a counting sort), into `sorted_index`,
    and where each index went into `back`."""
    starts = np.zeros(blocks + 1, dtype=np.int64)
    for i in range(len(index)):
        starts[(index[i] >> bits) + 1] += 1
    for b in range(blocks):
        starts[b + 1] += starts[b]
    for i in range(len(index)):
        b = index[i] >> bits
        p = starts[b]
        sorted_index[p] = index[i]
        back[i] = p
        starts[b] = p + 1


@fast.kernel
def _where(back, i):
    """The row of S's edge i in the send's pairs: back[i], or i when they are in S's order
    (`back` None: a compile-time choice)."""
    return i if back is None else back[i]


@fast.kernel
def _edge(s, i):
    """The graph's edge of S's edge i: s[i], or i when S is every edge (`s` None)."""
    return i if s is None else s[i]


@fast.kernel
def test_pairs(mean, receiver, pairs, back, alive, s, bound, strict, died, y_kept, kept):
    """The neighbour test on the edges of S still alive (edge i's receiver a = receiver[i]):
    keep when |mean[a] − X̃_b| < bound (strict) or ≤ bound, X̃_b = pairs[·, 0]. An edge that
    fails is no longer alive and its graph edge goes into `died`; Y_b (pairs[·, 1]) of the
    edges still alive (C's, CSR order) goes into `y_kept`, and if any died, their graph edges
    into `kept` (if none did, C is as it was); both written past the caches (the mix reads
    them after all of them). Returns (how many died, how many kept)."""
    # one loop over the edges, not one per agent's row: a row's end is a branch the processor
    # mispredicts, once per agent
    k = 0
    c = 0
    for i in range(len(receiver)):
        if alive[i]:
            j = _where(back, i)
            d = abs(mean[receiver[i]] - pairs[j, 0])
            if d < bound if strict else d <= bound:
                cache_hints.stream(y_kept, c, pairs[j, 1])
                if k:
                    cache_hints.stream(kept, c, _edge(s, i))
                c += 1
            else:
                if not k:  # the first to die: C's edges before it are written then
                    _alive(alive, s, i, None, kept)
                alive[i] = False
                died[k] = _edge(s, i)
                k += 1
    cache_hints.fence()
    return k, c


@fast.kernel
def refresh_rows(agents, indptr, reverse, dst, size, size_dst, w):
    """`refresh_weights` on the edges of `agents` only: their own rows and the reverse edges
    (W_ab = W_ba: one weight serves an edge and its reverse)."""
    for a in agents:
        size_a = float(size[a])
        for e in range(indptr[a], indptr[a + 1]):
            b = float(size[dst[e]])
            w_ab = 1.0 / (max(size_a, b) + 1.0)
            size_dst[e], w[e] = b, w_ab
            f = reverse[e]
            size_dst[f], w[f] = size_a, w_ab
