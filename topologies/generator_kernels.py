"""The random regular graph's shuffles as a compiled loop (`desim.fast.kernel`): the same
permutation as `desim.topologies.generators`' numpy path from the same draws (this module draws
nothing). `generators.shuffled` takes it for lists of at least `generators.COMPILED_FROM` items
when `desim.fast.compiled()`; importing this module imports numba, where it is installed."""

from __future__ import annotations

from desim import fast


@fast.kernel
def shuffled(x, j):  # pragma: no cover
    """A copy of x after the swaps x[i] ↔ x[j_i] for i = len(x) − 1, …, 1 in turn (`j` in
    that order): `random.shuffle`'s own loop, given its draws."""
    out = x.copy()
    count = len(x)
    for k in range(count - 1):
        i = count - 1 - k
        other = j[k]
        out[i], out[other] = out[other], out[i]
    return out
