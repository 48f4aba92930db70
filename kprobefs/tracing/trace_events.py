"""Static trace events: the kernel's TRACE_EVENT tracepoints (kernel/trace_events.c).

The kernel describes each of its events in ``__trace_events`` (include/tracepoint.h):
system, name, fields (type, name, size, alignment, signedness), print format, the
static key of its call sites and its ``struct trace_native_probe`` (the recording
flag, the event id, the filter, the counts).  Everything here is read from there;
nothing about an event is written twice.  Offsets follow C's struct layout, as 6.1's
``event_define_fields`` computes them.

Enabling an event patches its call sites from a NOP into a jump (machine/jump_label.py)
and sets the recording flag; a hit then runs only kernel code: the event's probe fills
the record in the kernel recorder's stage, the kernel evaluates the filter, and the
host decodes the pages (tracing/native.py), as for kprobe events.

Limits: the kernel records, so a static event records only with the trace clocks the
TSC drives and without ``options/stacktrace``, and a filter the kernel cannot evaluate
(a ``[...]`` glob, more than 64 terms) leaves the event not recording.  Char-array
fields are not string fields for filters yet.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import ImageError
from .fetch import RecordField, format_fields_text
from .print_fmt import PrintFmt, parse_print_fmt
from .raw_page import raw_common

__all__ = ["StaticEvent", "StaticEvents", "FIRST_STATIC_ID"]

_log = logging.getLogger(__name__)

FIRST_STATIC_ID = 20        # the ids after ftrace's own record types, as Linux numbers them
_CALL = struct.Struct("<QQQQII QQ".replace(" ", ""))       # struct trace_event_call
_FIELD = struct.Struct("<QQIIII")                          # struct trace_event_field
_COMMON_SIZE = 8


@dataclass(frozen=True, slots=True)
class StaticField:
    """One field of a static event, as its ``format`` file shows it."""

    type: str           # "pid_t", "char[16]"
    name: str
    offset: int
    size: int
    is_signed: bool
    len: int            # an array's elements, 0 otherwise

    @property
    def is_char_array(self) -> bool:
        return self.len > 0 and self.type.startswith("char[")


@dataclass(eq=False)
class StaticEvent:
    """A static event: ``events/<system>/<name>`` (the same interface as a kprobe
    event's TraceEvent, without probes)."""

    group: str
    name: str
    id: int
    fields: tuple[StaticField, ...]
    print_fmt_text: str
    print_fmt: PrintFmt
    size: int                   # sizeof(struct trace_event_raw_*)
    key: int                    # its struct static_key
    tp_addr: int                # its struct trace_native_probe
    native: Any = None          # the NativeProbe view of tp_addr
    probes: list = field(default_factory=list)      # none: no kprobes
    enabled: bool = False
    was_enabled: bool = False
    filter: Any = None
    filter_text: str | None = None
    dir_handle: Any = None
    is_return = False
    static = True

    def record_fields(self) -> list[RecordField]:
        return [RecordField(f.type, f.name, f.offset, f.size, f.is_signed)
                for f in self.fields]

    def format_text(self) -> str:
        return format_fields_text(self.name, self.id, self.fields, self.print_fmt_text)

    def raw(self, record: tuple) -> bytes:
        """The record's binary form: the common fields, then the fields as staged."""
        _ts, pid, flags, _ev, _ip, _ret, data = record
        return raw_common(self.id, flags, pid) + data

    def values(self, data: bytes) -> dict[str, Any]:
        """Field values of a record's data (after the common fields): ints, and
        strings for char arrays."""
        out: dict[str, Any] = {}
        for f in self.fields:
            at = f.offset - _COMMON_SIZE
            chunk = data[at:at + f.size]
            if f.is_char_array:
                out[f.name] = chunk.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif f.len:
                out[f.name] = 0
            else:
                out[f.name] = int.from_bytes(chunk, "little", signed=f.is_signed)
        return out

    def render(self, record: tuple, tracer, options) -> str:
        values = self.values(record[6])
        return (f"{self.name}: "
                + self.print_fmt.render(lambda n: values.get(n, 0), lambda n: "") + "\n")


def _layout(raw_fields) -> tuple[StaticField, ...]:
    """Offsets as C lays the struct out after struct trace_entry."""
    out, offset = [], _COMMON_SIZE
    for type_, name, size, align, signed, length in raw_fields:
        offset = -(-offset // max(align, 1)) * max(align, 1)
        out.append(StaticField(type_, name, offset, size, bool(signed), length))
        offset += size
    return tuple(out)


class StaticEvents:
    """The kernel's static events, their keys and their recording state.

    ``kernel`` is the machine (``read``, ``write``, ``text_poke``, ``image``);
    ``native`` the tracer's :class:`~kprobefs.tracing.native.NativeRecorder`.
    Raises :class:`ImageError` when the kernel has no events table.
    """

    def __init__(self, kernel, native, first_id: int = FIRST_STATIC_ID):
        from kprobefs.machine.jump_label import JumpLabels
        self.kernel = kernel
        self.native = native
        self.jump_labels = JumpLabels(kernel)
        self.events: list[StaticEvent] = []
        start = kernel.image.symbol_value("__start___trace_events")
        stop = kernel.image.symbol_value("__stop___trace_events")
        if start is None or stop is None:
            raise ImageError("the kernel has no __trace_events")
        for n, call in enumerate(_CALL.iter_unpack(kernel.read(start, stop - start))):
            self.events.append(self._read_event(call, first_id + n))

    def _cstring(self, addr: int) -> str:
        out = b""
        while b"\0" not in out:
            out += self.kernel.read(addr + len(out), 64)
        return out.split(b"\0", 1)[0].decode("latin-1")

    def _read_event(self, call, event_id: int) -> StaticEvent:
        system, name, fmt, fields_at, size, _pad, key, tp = call
        raw, at = [], fields_at
        while True:
            type_at, name_at, fsize, align, signed, length = _FIELD.unpack(
                self.kernel.read(at, _FIELD.size))
            if not name_at:
                break
            raw.append((self._cstring(type_at), self._cstring(name_at), fsize, align,
                        signed, length))
            at += _FIELD.size
        text = self._cstring(fmt)
        event = StaticEvent(self._cstring(system), self._cstring(name), event_id,
                            _layout(raw), text, parse_print_fmt(text), size, key, tp)
        event.native = self.native.adopt(tp, event_id)
        return event

    def sync(self, recording: bool, usable: bool) -> None:
        """Make each event's call sites and recording flag follow its state:
        ``recording`` = tracing is on, ``usable`` = the kernel can stamp records."""
        for ev in self.events:
            self.jump_labels.set_enabled(ev.key, ev.enabled)
            flt = ev.filter
            here = usable and self.native.set_filter(
                ev.native, flt.program if flt is not None else None)
            if ev.enabled and not here:
                _log.info("%s:%s cannot record in the kernel now", ev.group, ev.name)
            self.native.set_recording(ev.native, ev.enabled and recording and here)

    def hits(self, ev: StaticEvent) -> int:
        return self.native.hits(ev.native)
