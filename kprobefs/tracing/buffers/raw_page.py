"""Ring-buffer pages in Linux 6.1's binary layout, for ``per_cpu/cpuN/trace_pipe_raw``.

The layout is the one ``events/header_page`` and ``events/header_event`` describe
(REFERENCE.md): a page is a u64 timestamp, a ``local_t commit`` (8 bytes) holding the
data size, and 4080 data bytes.  The top bits of ``commit`` flag lost events: bit 31
(``RB_MISSED_EVENTS``) when events were lost before this page, bit 30
(``RB_MISSED_STORED``) when their count follows the data as an unsigned long.  Each
event starts with a u32 header: 5 bits of ``type_len``, 27 bits of ``time_delta`` from
the previous event (the page timestamp for the first).  ``type_len`` 1..28 is a data
event of ``4 * type_len`` bytes; 0 a data event whose length is the next u32; 30 a time
extend (the delta's upper bits in the next u32); 29 padding; 31 an absolute timestamp.
"""

from __future__ import annotations

import struct

__all__ = [
    "PAGE_SIZE",
    "PAGE_HEADER_SIZE",
    "RB_MISSED_EVENTS",
    "RB_MISSED_STORED",
    "TYPE_PADDING",
    "TYPE_TIME_EXTEND",
    "TYPE_TIME_STAMP",
    "TYPE_DATA_MAX",
    "PageWriter",
    "make_page",
    "raw_size",
    "raw_common",
]

PAGE_SIZE = 4096
PAGE_HEADER_SIZE = 16
_DATA_SIZE = PAGE_SIZE - PAGE_HEADER_SIZE
RB_MISSED_EVENTS = 1 << 31
RB_MISSED_STORED = 1 << 30
TYPE_DATA_MAX = 28
TYPE_PADDING = 29
TYPE_TIME_EXTEND = 30
TYPE_TIME_STAMP = 31
_DELTA_BITS = 27
_DELTA_MASK = (1 << _DELTA_BITS) - 1
_U32 = struct.Struct("<I")
_EXTEND = struct.Struct("<II")                  # two header words
_PADS = (b"", b"\0\0\0", b"\0\0", b"\0")         # by data length % 4
_COMMON = struct.Struct("<HBBi")


def raw_common(type_id: int, flags: int, pid: int) -> bytes:
    """Return the common fields of a record: common_type, _flags, _preempt_count, _pid."""
    return _COMMON.pack(type_id & 0xffff, flags & 0xff, 0, pid)


def raw_size(data_len: int, delta: int) -> int:
    """Return the page bytes an event of ``data_len`` bytes takes ``delta`` ns after
    the previous one (its header, length word, padding to 4 and any time extend)."""
    size = 4 + ((max(data_len, 1) + 3) & ~3)
    if size - 4 > TYPE_DATA_MAX * 4:
        size += 4
    if delta > _DELTA_MASK:
        size += 8
    return size


class PageWriter:
    """Builds one page: ``add`` events in time order while they fit, then ``page``."""

    def __init__(self, timestamp: int):
        self.timestamp = timestamp
        self._last = timestamp
        self._parts: list[bytes] = []
        self.used = 0

    def fits(self, data_len: int, ts: int) -> bool:
        return self.used + raw_size(data_len, max(0, ts - self._last)) <= _DATA_SIZE

    def add(self, data: bytes, ts: int) -> bool:
        """Append an event stamped ``ts`` if it fits, or the page is empty; return
        whether it did (``fits`` and ``add`` in one, its size reckoned once)."""
        last = self._last
        delta = ts - last if ts > last else 0
        length = len(data)
        if not length:
            data, length = b"\0", 1
        padded = (length + 3) & ~3
        size = padded + (4 if padded <= TYPE_DATA_MAX * 4 else 8)
        if delta > _DELTA_MASK:
            size += 8
        if self.used and self.used + size > _DATA_SIZE:
            return False
        self.used += size
        parts = self._parts
        if delta > _DELTA_MASK:
            parts.append(_EXTEND.pack(TYPE_TIME_EXTEND | (delta & _DELTA_MASK) << 5,
                                      delta >> _DELTA_BITS))
            delta = 0
        if padded <= TYPE_DATA_MAX * 4:
            parts.append(_U32.pack(padded >> 2 | delta << 5))
        else:
            # type_len 0: the length word counts itself as well as the data.
            parts.append(_EXTEND.pack(delta << 5, padded + 4))
        parts.append(data)
        if padded != length:
            parts.append(_PADS[length & 3])
        self._last = ts
        return True

    def page(self, missed: int = 0) -> bytes:
        """Return the 4096-byte page; ``missed`` events lost before it set the flags
        (and the count after the data, when it fits)."""
        return make_page(self.timestamp, b"".join(self._parts), missed)


def make_page(timestamp: int, data: bytes, missed: int = 0) -> bytes:
    """The 4096-byte page of events ``data`` (at most 4080 bytes, already in the
    page's layout) from ``timestamp`` on; ``missed`` events lost before it set the
    flags (and the count after the data, when it fits)."""
    commit = len(data)
    tail = b""
    if missed:
        commit |= RB_MISSED_EVENTS
        if _DATA_SIZE - len(data) >= 8:
            commit |= RB_MISSED_STORED
            tail = struct.pack("<Q", missed)
    return b"".join((struct.pack("<QQ", timestamp, commit), data, tail,
                     bytes(_DATA_SIZE - len(data) - len(tail))))
