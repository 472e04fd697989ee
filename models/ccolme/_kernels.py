"""The kernels of `desim.models.ccolme.compiled` (numba's, through `desim.fast`): imported only
when a run takes the compiled passes, so that runs that do not never import numba."""

import numpy as np

from desim import fast


@fast.kernel
def gather_states(mean, y, sender, t, x_out, n_out, y_out):
    """x_out[i], n_out[i], y_out[i] = mean[b], t, y[b] for b = sender[i] (copies)."""
    m = len(mean)
    pair = np.empty((m, 2))  # X̃_b and Y_b side by side: one cache line serves both reads
    for b in range(m):
        pair[b, 0] = mean[b]
        pair[b, 1] = y[b]
    for i in range(len(sender)):
        b = sender[i]
        x_out[i] = pair[b, 0]
        n_out[i] = t
        y_out[i] = pair[b, 1]


@fast.kernel
def gather_blocked(mean, y, sorted_sender, back, t, read, x_out, n_out, y_out):
    """`gather_states` in `desim.models.ccolme.edges.BlockedTake`'s two passes: read the pairs
    by block of senders (`sorted_sender`), then put each back in place (`back`)."""
    m = len(mean)
    pair = np.empty((m, 2))
    for b in range(m):
        pair[b, 0] = mean[b]
        pair[b, 1] = y[b]
    for i in range(len(sorted_sender)):
        b = sorted_sender[i]
        read[i, 0] = pair[b, 0]
        read[i, 1] = pair[b, 1]
    for i in range(len(back)):
        j = back[i]
        x_out[i] = read[j, 0]
        n_out[i] = t
        y_out[i] = read[j, 1]


@fast.kernel
def keep_within(mean, x_b, a, bound, strict, keep):
    """keep[i] = |mean[a[i]] − x_b[i]| < bound (strict) or ≤ bound."""
    for i in range(len(x_b)):
        d = abs(mean[a[i]] - x_b[i])
        keep[i] = d < bound if strict else d <= bound


@fast.kernel
def mix_rows(y, nb_y, w, w_const, counts, out):
    """out[a] = Y_a + Σ_b (Y_b − Y_a)·W_ab over a's `counts[a]` consecutive edges (W_ab from
    `w`, or `w_const` when `w` is empty), the sum in `np.add.reduceat`'s order."""
    width = 1
    for a in range(len(counts)):
        width = max(width, counts[a])
    terms = np.empty(width)
    per_edge = len(w) > 0
    j = 0
    for a in range(len(y)):
        c = counts[a]
        ya = y[a]
        if c == 0:
            out[a] = ya
            continue
        for k in range(c):
            wk = w[j + k] if per_edge else w_const
            terms[k] = (nb_y[j + k] - ya) * wk
        out[a] = ya + fast.reduceat_sum(terms, 0, c)
        j += c


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
    k = 0
    for i in range(len(alive)):
        if alive[i]:
            pos[k] = i
            edges[k] = s[i]
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
