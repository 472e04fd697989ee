"""Trace files read in bulk: a plain trace (ASCII numbers and state names, no quotes, every row
sound) is parsed by pyarrow's CSV reader in one pass, into the very columns the row-by-row
reader of `desim.network_models.availability.read_trace` gives; any other file is left to that
reader, which also names what is wrong with it (so messages never depend on this module)."""

from __future__ import annotations

import csv
import re
from typing import Literal

import numpy as np

#: The bytes a row of a plain trace may hold: digits, signs, points, exponents, the letters of
#: 'up' and 'down' in either case, commas, spaces and line ends. No quotes, tabs, control or
#: non-ASCII bytes (the row reader's handling of those is left to it), no 'inf' or 'nan'.
_PLAIN = b"0123456789+-.eE,updownUPDOWN \n"
#: A line of spaces only (the first line, or a later one): the row reader sees one empty field
#: there (an error), not a blank line.
_FIRST_SPACES, _SPACES = re.compile(rb" +\n"), re.compile(rb"\n +\n")
#: Spaces before or after a comma or a line end: the row reader skips leading ones
#: (`skipinitialspace`) and `float`, `int` and `str.strip` drop trailing ones.
_AROUND = re.compile(rb" *([,\n]) *")
#: The first byte of a row (blank lines are skipped).
_ROW = re.compile(rb"[^\n]")
#: Bytes scanned at once for line ends (a bool per byte).
_CHUNK = 1 << 23


def plain_rows(
    data: bytes, index: list[int], scope: Literal["link", "node"]
) -> dict[str, np.ndarray] | None:
    """The columns a, b, start, end, up and line (as `TraceRows` holds them) of the trace file
    whose content is `data`, given the positions `index` of its start, end, state and node (or
    src and dst) columns; None when the file is not plain or a row is not sound.

    Plain: the header is one line without quotes; after it only `_PLAIN` bytes, line ends
    ``\\n`` or ``\\r\\n``, no line longer than the csv module's field limit nor of spaces only,
    every row with as many fields as the first. Sound: what the row reader accepts (numbers,
    0 ≤ start < end, a state 'up' or 'down', distinct src and dst).
    """
    cut = data.find(b"\n") + 1
    if not cut or b'"' in data[:cut] or data.count(b"\r") != data.count(b"\r\n"):
        return None
    # the bytes outside `_PLAIN` must all be the header's (translate keeps their order)
    if len(data.translate(None, _PLAIN)) != len(data[:cut].translate(None, _PLAIN)):
        return None
    body, start = _lines(data, cut)
    line = _row_lines(body, start)
    if line is None:
        return None
    if body.find(b" ", start) >= 0:  # (after `_row_lines`, which reads the lines as written)
        body, start = _AROUND.sub(rb"\1", body[start:]).lstrip(b" "), 0
    first = _ROW.search(body, start).start()  # there is a row: `_row_lines` found one
    fields = body.count(b",", first, body.index(b"\n", first)) + 1
    if max(index) >= fields:
        return None
    columns = _arrow_columns(memoryview(body)[start:], fields, index, len(line))
    del body
    if columns is None:
        return None
    return _sound(columns, line, scope)


def _lines(data: bytes, cut: int) -> tuple[bytes, int]:
    """(buffer, offset) of the lines after the header, each ended by ``\\n``: `data` itself
    when it is so already (no copy of a large file), else a copy made so."""
    if data.endswith(b"\n") and data.find(b"\r", cut) < 0:
        return data, cut
    body = data[cut:].replace(b"\r\n", b"\n")
    return (body if body.endswith(b"\n") else body + b"\n"), 0


def _row_lines(body: bytes, start: int) -> np.ndarray | None:
    """The line number in the file of each row of ``body[start:]`` (the lines after the
    header; blank lines are no rows); None when a line is too long for the csv module, holds
    spaces only (both errors of the row reader) or when there is no row."""
    if start >= len(body) or _FIRST_SPACES.match(body, start) or _SPACES.search(body, start):
        return None
    buffer = np.frombuffer(body, dtype=np.uint8)
    ends = np.concatenate(
        [
            np.flatnonzero(buffer[i : i + _CHUNK] == ord("\n")) + i
            for i in range(start, len(buffer), _CHUNK)
        ]
    )
    lengths = np.diff(ends, prepend=start - 1) - 1
    del ends
    if lengths.max() > min(csv.field_size_limit(), _MAX_LINE):
        return None
    rows = np.flatnonzero(lengths)
    return rows + 2 if len(rows) else None  # the header is line 1


def _arrow_columns(
    body: memoryview, fields: int, index: list[int], rows: int
) -> list[np.ndarray] | None:
    """The start, end, up and address columns of the `rows` rows of `body` (rows of `fields`
    fields, no header) parsed by pyarrow, a block of lines at a time (its buffers stay small):
    floats, the states 'up' and 'down' as booleans, int64 addresses; None when pyarrow refuses
    a value or a row, or a state is neither."""
    import pyarrow as pa

    kinds = [np.float64, np.float64, np.bool_, np.int64, np.int64][: len(index)]
    out = [np.empty(rows, dtype=kind) for kind in kinds]
    done, begin = 0, 0
    while begin < len(body):
        end = bytes(body[begin + _BLOCK : begin + _BLOCK + _MAX_LINE]).find(b"\n")
        end = len(body) if end < 0 else begin + _BLOCK + end + 1
        try:
            block = _arrow_block(body[begin:end], fields, index)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return None
        if block is None or done + len(block[0]) > rows:
            return None
        for column, values in zip(out, block, strict=True):
            column[done : done + len(values)] = values
        done, begin = done + len(block[0]), end
    return out if done == rows else None


#: Bytes of the trace parsed by pyarrow at once (then the block ends with its line).
_BLOCK = 1 << 22
#: The longest line of a plain trace (`_row_lines` refuses longer ones).
_MAX_LINE = 1 << 20


def _arrow_block(body: memoryview, fields: int, index: list[int]) -> list | None:
    """`_arrow_columns` of one block of whole lines (None when a state is neither 'up' nor
    'down'; pyarrow's errors raised)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    names = [f"f{i}" for i in range(fields)]
    kinds = [pa.float64(), pa.float64(), pa.string(), pa.int64(), pa.int64()]
    wanted = [names[i] for i in index]
    table = pacsv.read_csv(
        pa.py_buffer(body),
        # one block: each column comes out as one array, read by numpy without a copy
        read_options=pacsv.ReadOptions(
            column_names=names, block_size=len(body) + 1, use_threads=False
        ),
        parse_options=pacsv.ParseOptions(
            quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True
        ),
        convert_options=pacsv.ConvertOptions(
            column_types=dict(zip(wanted, kinds, strict=False)),
            include_columns=wanted,
            null_values=[],
            strings_can_be_null=False,
            check_utf8=False,
        ),
        memory_pool=pa.system_memory_pool(),  # a block's buffers go back when it is read
    )
    if any(table.column(name).null_count for name in wanted):
        return None
    state = pc.ascii_lower(table.column(wanted[2]))
    up = pc.equal(state, "up")
    if not pc.all(pc.or_(up, pc.equal(state, "down"))).as_py():
        return None
    return [
        np.asarray(up.to_numpy()) if k == 2 else np.asarray(table.column(name).to_numpy())
        for k, name in enumerate(wanted)
    ]


def _sound(
    columns: list[np.ndarray], line: np.ndarray, scope: Literal["link", "node"]
) -> dict[str, np.ndarray] | None:
    """The `TraceRows` columns of parsed rows, or None when a row is not what the row reader
    accepts: 0 ≤ start < end < ∞, and in a link trace src ≠ dst."""
    start, end, up, x = columns[:4]
    if not ((start >= 0) & (start < end) & (end < np.inf)).all():
        return None
    if scope == "link":
        y = columns[4]
        if (x == y).any():
            return None
        a = np.minimum(x, y)
        b = np.maximum(x, y, out=y)  # (y is this module's own array)
    else:
        a, b = x, np.full(len(x), -1, dtype=np.int64)
    out = {"a": a, "b": b, "start": start, "end": end, "up": up, "line": line}
    out = {name: np.ascontiguousarray(values) for name, values in out.items()}
    for values in out.values():
        values.flags.writeable = False  # shared by every reader of the file (the cache)
    return out
