"""Private-ColME's per-pair update on an irregular graph, fused into compiled kernels.

On a regular graph RR's slot reads and writes one run of consecutive pairs (`graph.Neighbours`:
pairs numbered by RR position), as slices; on an irregular one (Erdős–Rényi, a real county
graph, a regular graph after a few rewirings) a slot's pairs are scattered, and each numpy pass
over them is a gather or a scatter: b's mechanism (κ and the noise total, read then written),
the statistic (κ, the block sum and D written) and the class beliefs (read, compared). Here each
of these updates is one loop over the slot's pairs (`desim.fast.kernel`), doing per pair the
same float operations in the same order as the numpy path, so the bytes are the same.

`CompiledPairs.install` chooses them once, at set-up, where they apply (ideal links, known
variances, ``last`` weights under PM-I without a budget: the synchronous slot of `_slot_runs`):
the protocol's mechanism, statistic and beliefs become the subclasses of
`desim.models.colme.pair_kernels`, which take the kernel for pairs given as indices and the
numpy path for everything else (a run of pairs: a regular graph's slot). A graph change
re-makes them of the same class, and installs them if the new graph is the first irregular one
(`desim.models.colme.rewire`). Without numba, with
``DESIM_COMPILED=0``, or up to `CompiledPairs.above` agents, nothing is installed.
"""

from __future__ import annotations

from typing import Any


class CompiledPairs:
    """The choice of the compiled per-pair update, made once at set-up (`install`)."""

    #: Populations up to this size keep the numpy path: a slot's pairs are few there, and
    #: numba's load (a fraction of a second, once per process) would cost more than the
    #: kernels save; nor is numba imported for them.
    above: int = 1000

    @classmethod
    def applies(cls, protocol: Any) -> bool:
        """Whether the run's slot is the synchronous ``last`` PM-I one on an irregular graph of
        more than `above` agents, with numba available and not switched off
        (``DESIM_COMPILED=0``). (A regular graph's slot is one run of pairs: slices.)"""
        p, nb = protocol.params, protocol.graph
        if (
            nb is None
            or nb.n <= cls.above
            or nb.min_degree() == nb.max_degree()
            or protocol.asynchronous
            or not protocol.known
            or (p.mechanism, p.weights, p.budget) != ("pm1", "last", None)
        ):
            return False
        from desim import fast  # (here: numba is imported only by the runs that may take it)

        return fast.compiled()

    @classmethod
    def install(cls, protocol: Any) -> None:
        """Make `protocol`'s mechanism, statistic and beliefs (fresh, or just re-made by a graph
        change) the compiled classes where they apply; otherwise leave them."""
        if not cls.applies(protocol):
            return
        from desim.models.colme import pair_kernels

        # (the subclasses add no state: the objects keep theirs)
        protocol.mech.__class__ = pair_kernels.CompiledRelease
        protocol.stat.__class__ = pair_kernels.CompiledStatistic
        protocol.beliefs.__class__ = pair_kernels.CompiledBeliefs
