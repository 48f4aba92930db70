"""``trace_marker_raw``: binary markers (6.1's tracing_mark_raw_write).

A write is a 4-byte id (host order) and a payload, recorded as one ftrace ``raw_data``
record (``TRACE_RAW_DATA``) in the array's buffer, on the CPU the writer runs on.  The
rules are 6.1's: the ``markers`` option off, or a write shorter than the id or longer
than ``RAW_DATA_MAX_SIZE`` (3 KiB), is ``EINVAL``; a longer write than
``TRACE_BUF_SIZE`` (1 KiB) is cut to it and 1024 is returned; tracing off (the buffer
refuses the reservation) is ``EBADF``.  No trigger sees these records (6.1 has none on
them).

6.1 reserves the record at ``sizeof(struct raw_data_entry) + count`` bytes (the id is
counted twice), at least 25, and prints every byte of ``buf`` up to the event's length
rounded to 4: ``# <id in hex> buf: xx xx ...``, so the payload is followed by bytes
the write did not fill.  In 6.1 they are whatever the ring buffer page held; here they
are zeros.
"""

from __future__ import annotations

import errno
import struct

from kprobefs.tracing.buffers.output import FLAGS_NONE
from kprobefs.tracing.buffers.raw_page import raw_common

__all__ = ["RAW_DATA_EVENT", "RAW_DATA_MAX_SIZE", "write_marker_raw"]

RAW_DATA_MAX_SIZE = 3 * 1024     # the longest write taken
_TRACE_BUF_SIZE = 1024           # the most of one write recorded
_ENTRY_SIZE = 12                 # struct raw_data_entry: trace_entry, id
_FAULT_SIZE_ID = 9 + 4           # strlen("<faulted>") + the id: the least reserved
_ID = struct.Struct("<I")


class _RawDataEvent:
    """``ftrace/raw_data`` records: ``(ts, pid, flags, RAW_DATA_EVENT, body)``, where
    ``body`` is the record after its common fields (the id, then ``buf`` to the
    record's end), as long as the ring buffer's event is."""

    id = 18                      # TRACE_RAW_DATA
    group = "ftrace"
    name = "raw_data"

    def raw(self, record: tuple) -> bytes:
        return raw_common(self.id, record[2], record[1]) + record[4]

    def render(self, record: tuple, tr, options) -> str:
        """6.1's trace_raw_data: the id in hex, then each byte of ``buf``."""
        body = record[4]
        return (f"# {_ID.unpack_from(body)[0]:x} buf:"
                + "".join(f" {b:02x}" for b in body[4:]) + "\n")

    def raw_text(self, record: tuple) -> str:
        """options/raw: the same (6.1's raw_data has one function for both)."""
        return self.render(record, None, None)


RAW_DATA_EVENT = _RawDataEvent()


def write_marker_raw(tr, data: bytes, pid: int, comm: str) -> int:
    """Record a ``trace_marker_raw`` write in trace array ``tr``; return the bytes
    taken (the write's length, at most 1024).  Raises OSError as 6.1 fails it."""
    if not tr.options["markers"]:
        raise OSError(errno.EINVAL, "markers disabled")
    count = len(data)
    if count < _ID.size or count > RAW_DATA_MAX_SIZE:
        raise OSError(errno.EINVAL, "a raw marker is an id and at most 3 KiB")
    count = min(count, _TRACE_BUF_SIZE)
    if not tr.recording:
        raise OSError(errno.EBADF, "tracing is off")
    size = _ENTRY_SIZE + max(count, _FAULT_SIZE_ID)   # as 6.1 reserves it
    length = (size + 3) & ~3                           # the event's length
    body = bytes(data[:count]).ljust(length - 8, b"\0")
    if tr.options["record-cmd"]:
        tr.comm_cache.save(pid, comm[:15])
    cpu = tr.writer_cpu()
    tr.buffer.write(cpu, (tr.now(), pid, FLAGS_NONE, RAW_DATA_EVENT, body), size)
    return count
