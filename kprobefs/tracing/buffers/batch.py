"""Records read as columns, for ``trace`` text made in bulk (output.TraceFormatter).

A full buffer holds tens of thousands of records, and a Python statement per record costs
more than its line's formatting.  Records whose fields are laid out alike are read here
a field at a time: every record's value of one field in one list, taken from their bytes
by a ``memoryview`` cast and slice (a field aligned to its size) or one
``struct.iter_unpack``.  The formatter then makes the lines with ``map`` and ``zip``
over the columns, one ``%`` a line, and Python runs only where a line's format is new.
"""

from __future__ import annotations

import struct
import sys
from itertools import repeat
from operator import add, floordiv, mod
from typing import Iterable, Iterator, Sequence

__all__ = ["struct_columns", "line_values"]

_US_PER_S = 1_000_000
_LITTLE = sys.byteorder == "little"
_SIZES = {code: struct.calcsize(code) for code in "bBhHiIqQ"}


def struct_columns(data: bytes, offset: int, stride: int, codes: str) -> list[Sequence]:
    """The values of the fields ``codes`` gives (struct codes, little-endian, packed one
    after another from ``offset``) of each record of ``data``, a record every
    ``stride`` bytes (``len(data)`` a multiple of it): one sequence a field, in the
    records' order."""
    count = len(data) // stride
    if not codes:
        return []
    if not count:
        return [[] for _code in codes]
    if _LITTLE:
        view = memoryview(data)
        columns, at = [], offset
        for code in codes:
            size = _SIZES[code]
            if at % size or stride % size:
                break
            columns.append(view.cast(code)[at // size::stride // size].tolist())
            at += size
        else:
            return columns
    size = struct.calcsize("<" + codes)
    rows = struct.Struct(f"<{offset}x{codes}{stride - offset - size}x").iter_unpack(data)
    return list(zip(*rows))


def line_values(stamps: Sequence[int], columns: Sequence[Sequence] | None,
                rows: Iterable[tuple] | None, options, contexts: Iterable[str] | None
                ) -> Iterator[tuple]:
    """What each line's ``%`` takes, in the records' order: with ``options.context_info``
    the line's context columns (from ``contexts``) and the timestamp's numbers
    (seconds and microseconds, rounded as format_timestamp rounds them, or the raw
    count unless ``options.in_ns``), then the record's arguments, from ``columns``
    (one sequence a field) or else ``rows`` (a tuple a record)."""
    if not options.context_info:
        if rows is not None:
            return iter(rows)
        return zip(*columns) if columns else repeat((), len(stamps))
    if options.in_ns:
        usecs = list(map(floordiv, map(add, stamps, repeat(500)), repeat(1000)))
        head = (contexts, map(floordiv, usecs, repeat(_US_PER_S)),
                map(mod, usecs, repeat(_US_PER_S)))
    else:
        head = (contexts, stamps)
    if rows is not None:
        return map(add, zip(*head), rows)
    return zip(*head, *columns)
