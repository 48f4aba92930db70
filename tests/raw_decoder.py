"""A decoder of trace_pipe_raw pages written from the tracefs description alone.

Offsets and sizes come from ``events/header_page``, the event header's type numbers
from ``events/header_event`` and record fields from each event's ``format`` file, as
libtraceevent's kbuffer takes them.  It shares nothing with kprobefs' writer; the
missed-events flags (bits 31 and 30 of ``commit``) are kbuffer's constants.
"""

import re
import struct
from typing import NamedTuple

MISSED_EVENTS = 1 << 31
MISSED_STORED = 1 << 30


class PageLayout(NamedTuple):
    ts: tuple[int, int]          # (offset, size)
    commit: tuple[int, int]
    data: tuple[int, int]
    padding: int
    time_extend: int
    time_stamp: int
    data_max: int


def parse_layout(header_page: str, header_event: str) -> PageLayout:
    fields = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(
        r"field: [^;]*?(\w+);\toffset:(\d+);\tsize:(\d+);", header_page)}
    types = {m[1]: int(m[2]) for m in re.finditer(r"(\w+)\s*: type == (\d+)", header_event)}
    data_max = int(re.search(r"data max type_len\s*== (\d+)", header_event)[1])
    return PageLayout(fields["timestamp"], fields["commit"], fields["data"],
                      types["padding"], types["time_extend"], types["time_stamp"], data_max)


def parse_format(text: str) -> tuple[int, dict[str, tuple[int, int, bool]]]:
    """Return the event's ID and its fields: name -> (offset, size, signed)."""
    ident = int(re.search(r"^ID: (\d+)$", text, re.M)[1])
    fields = {}
    for m in re.finditer(r"field:([^;]*);\toffset:(\d+);\tsize:(\d+);\tsigned:(\d);", text):
        name = re.sub(r"\[.*\]", "", m[1].split()[-1])
        fields[name] = (int(m[2]), int(m[3]), m[4] == "1")
    return ident, fields


class Page(NamedTuple):
    timestamp: int
    missed: int | None           # None: no loss flagged; -1: flagged, count not stored
    events: list[tuple[int, bytes]]   # (absolute timestamp, record data)
    extends: int                 # time extends seen


def _field(buf: bytes, where: tuple[int, int]) -> int:
    off, size = where
    return int.from_bytes(buf[off:off + size], "little")


def decode_page(page: bytes, layout: PageLayout) -> Page:
    ts = _field(page, layout.ts)
    commit_word = _field(page, layout.commit)
    size = commit_word & ((1 << 27) - 1)
    base = layout.data[0]
    data = page[base:base + size]
    missed = None
    if commit_word & MISSED_EVENTS:
        missed = -1
        if commit_word & MISSED_STORED:
            missed = int.from_bytes(page[base + size:base + size + 8], "little")
    events, extends, pos, now = [], 0, 0, ts
    while pos < size:
        (word,) = struct.unpack_from("<I", data, pos)
        type_len, delta = word & 31, word >> 5
        pos += 4
        if type_len == layout.time_extend:
            (high,) = struct.unpack_from("<I", data, pos)
            now += (high << 27) + delta
            pos += 4
            extends += 1
        elif type_len == layout.time_stamp:
            (high,) = struct.unpack_from("<I", data, pos)
            now = (high << 27) + delta
            pos += 4
        elif type_len == layout.padding:
            if not delta:
                break
            (length,) = struct.unpack_from("<I", data, pos)
            pos += length
        else:
            now += delta
            if type_len == 0:
                (length,) = struct.unpack_from("<I", data, pos)
                pos += 4
                length -= 4
            else:
                assert type_len <= layout.data_max
                length = type_len * 4
            events.append((now, data[pos:pos + length]))
            pos += length
    assert pos == size, (pos, size)
    return Page(ts, missed, events, extends)


def get_field(record: bytes, fields, name: str) -> int:
    off, size, signed = fields[name]
    return int.from_bytes(record[off:off + size], "little", signed=signed)
