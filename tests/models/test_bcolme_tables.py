"""B-ColME's outgoing tables: the non-backtracking sums, exactly as row by row."""

from __future__ import annotations

import numpy as np

from desim.models.ccolme.bcolme import outgoing_tables, row_sums
from desim.topologies.generators import RandomRegular


def test_outgoing_tables_are_the_row_by_row_sums_bit_for_bit():
    """Each row k and slot s = (a, b): Σ of b's row-k entries minus the one about a, the same
    floats as a plain gather per row (several rows, and zero rows)."""
    rng = np.random.default_rng(8)
    g = RandomRegular(7).make(500, rng)
    for rows in (0, 1, 6):
        held = rng.standard_normal((rows, g.n_directed))
        sums = row_sums(g.indptr, held)
        want = np.array([sums[k][g.dst] - held[k][g.reverse] for k in range(rows)])
        got = outgoing_tables(g.indptr, g.dst, g.reverse, held)
        assert got.tobytes() == want.reshape(rows, g.n_directed).tobytes()
        out = np.empty((rows, g.n_directed))
        assert outgoing_tables(g.indptr, g.dst, g.reverse, held, out=out) is out
        assert out.tobytes() == want.reshape(rows, g.n_directed).tobytes()
