"""Hints to the processor's caches for the compiled kernels (`desim.fast`).

On graphs of 10⁶ agents a slot's passes over the edges move hundreds of megabytes, far more than
any cache holds, and their time is the memory's. Two hints help there, and neither changes a
value:

- `prefetch` asks for a row that a random read will want a few iterations later, when the reads
  are random within a block the cache holds but in an order no hardware prefetcher can guess;
- `stream` writes past the caches (a non-temporal store): for an output written once in order
  and read again only after more than the caches hold, the processor then neither reads each
  line before writing it nor evicts the inputs for it. A kernel that streams ends with `fence`,
  which orders those stores before anything after it.

In Python (and so without numba) `prefetch` and `fence` do nothing and `stream` is an
assignment; `overload` gives them their compiled versions (LLVM's ``llvm.prefetch``, a store
marked ``!nontemporal`` and a fence), once, before any kernel is compiled.
"""

from __future__ import annotations

from typing import Any

_overloaded = False  # whether the compiled versions are registered


def prefetch(rows: Any, i: int) -> None:
    """Ask for rows[i] (its first value if `rows` has more dimensions), to be read soon."""


def stream(values: Any, i: int, value: Any) -> None:
    """values[i] = value (a 1-D array), written past the caches when compiled."""
    values[i] = value


def stream_row(rows: Any, i: int, j: int, value: Any) -> None:
    """rows[i, j] = value (a 2-D array), written past the caches when compiled."""
    rows[i, j] = value


def fence() -> None:
    """Order the streamed stores before every load and store that follows (when compiled)."""


def overload() -> None:
    """Register the compiled versions of the hints with numba (once)."""
    global _overloaded
    if _overloaded:
        return
    _overloaded = True
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
    from numba.extending import overload as numba_overload

    def pointer(context, builder, array_type, array, indices):
        """The address of array[indices] (missing trailing indices: 0)."""
        at = context.make_array(array_type)(context, builder, array)
        index = [context.cast(builder, value, kind, types.intp) for value, kind in indices]
        index += [context.get_constant(types.intp, 0)] * (array_type.ndim - len(index))
        return cgutils.get_item_pointer(context, builder, array_type, at, index, wraparound=False)

    @intrinsic
    def hint(typingctx, rows, i):
        if not isinstance(rows, types.Array) or not isinstance(i, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            at = pointer(context, builder, signature.args[0], args[0], [(args[1], i)])
            byte, word = ir.IntType(8).as_pointer(), ir.IntType(32)
            function = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.VoidType(), [byte, word, word, word]),
                "llvm.prefetch.p0i8",
            )
            # (address, 0: a read, 3: kept in every level, 1: a data cache)
            flags = [ir.Constant(word, flag) for flag in (0, 3, 1)]
            builder.call(function, [builder.bitcast(at, byte), *flags])
            return context.get_dummy_value()

        return types.void(rows, i), codegen

    @intrinsic
    def store(typingctx, values, i, j, value):
        if not isinstance(values, types.Array) or values.ndim not in (1, 2):
            return None

        def codegen(context, builder, signature, args):
            indices = [(args[1], i), (args[2], j)][: values.ndim]
            at = pointer(context, builder, values, args[0], indices)
            written = builder.store(context.cast(builder, args[3], value, values.dtype), at)
            written.set_metadata(
                "nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
            )
            return context.get_dummy_value()

        return types.void(values, i, j, value), codegen

    @intrinsic
    def barrier(typingctx):
        def codegen(context, builder, signature, args):
            builder.fence("seq_cst")
            return context.get_dummy_value()

        return types.void(), codegen

    @numba_overload(prefetch)
    def _prefetch(rows, i):
        return lambda rows, i: hint(rows, i)

    @numba_overload(stream)
    def _stream(values, i, value):
        return lambda values, i, value: store(values, i, 0, value)

    @numba_overload(stream_row)
    def _stream_row(rows, i, j, value):
        return lambda rows, i, j, value: store(rows, i, j, value)

    @numba_overload(fence)
    def _fence():
        return lambda: barrier()
