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
host decodes the pages (tracing/buffers/native.py), as for kprobe events.  The kernel
records into the top trace array; for an event enabled in an instance it first hands the
record to the host (HC_TRACE_EVENT), which files it into each such instance by its
filter.

Limits: the kernel records, so a static event records in the top array only with the
trace clocks the TSC drives and without ``options/stacktrace``, and a filter the kernel
cannot evaluate (a ``[...]`` glob, more than 64 terms) leaves it not recording there.
An instance's records carry no stack trace; the pid filter is the top array's.
"""

from __future__ import annotations

import errno
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ...errors import ImageError
from .fetch import RecordField, format_fields_text
from .print_fmt import PrintFmt, PrintFmtError, fields_print_fmt, parse_print_fmt
from ..buffers.raw_page import raw_common

__all__ = ["StaticEvent", "SyscallEvent", "StaticEvents", "FIRST_STATIC_ID"]

_log = logging.getLogger(__name__)

FIRST_STATIC_ID = 20        # the ids after ftrace's own record types, as Linux numbers them
_CALL = struct.Struct("<QQQQII QQ".replace(" ", ""))       # struct trace_event_call
_FIELD = struct.Struct("<QQIIII")                          # struct trace_event_field
_COMMON_SIZE = 8
_META = struct.Struct("<QiI6Q6QQQ")                        # struct syscall_metadata
_U64 = (1 << 64) - 1
_PID_MAX = 32768                # TRACE_PID_MAX: the kernel's pid_max
_PID_MAPS = 16                  # struct trace_pid_filter: the bitmaps after 4 u32s


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
    print_fmt: PrintFmt | None  # None: the event prints itself (SyscallEvent)
    size: int                   # sizeof(struct trace_event_raw_*)
    key: int                    # its struct static_key
    tp_addr: int                # its struct trace_native_probe
    native: Any = None          # the NativeProbe view of tp_addr
    recording: tuple = (False, False)   # its kernel flags: record, hand to the host
    probes: list = field(default_factory=list)      # none: no kprobes
    enabled: bool = False       # in some trace array (the registry keeps it)
    was_enabled: bool = False
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
            if f.type.startswith("__data_loc"):     # u32: length << 16 | offset
                loc = int.from_bytes(chunk, "little")
                at = (loc & 0xFFFF) - _COMMON_SIZE
                text = data[at:at + (loc >> 16)].split(b"\0", 1)[0]
                out[f.name] = text.decode("utf-8", "replace")
            elif f.is_char_array:
                out[f.name] = chunk.split(b"\0", 1)[0].decode("utf-8", "replace")
            elif f.len:
                size = f.size // f.len
                out[f.name] = [int.from_bytes(chunk[i:i + size], "little", signed=f.is_signed)
                               for i in range(0, f.size, size)]
            else:
                out[f.name] = int.from_bytes(chunk, "little", signed=f.is_signed)
        return out

    def render(self, record: tuple, tracer, options) -> str:
        values = self.values(record[6])
        text = self.print_fmt.render(lambda n: values.get(n, 0), lambda n: values.get(n, ""),
                                     tracer.symbols.hash_pointer, tracer.symbols.symbolize)
        return f"{self.name}: {text}\n"


@dataclass(eq=False)
class SyscallEvent(StaticEvent):
    """``syscalls/sys_enter_NAME`` or ``sys_exit_NAME``: printed as 6.1's
    print_syscall_enter/exit print them, not through the print fmt and without the
    event's name: ``sys_openat(dfd: ffffffffffffff9c, filename: 7ffc..., ...)`` (each
    argument in hex without 0x) and ``sys_openat -> 0x3``."""

    syscall: str = ""                   # "sys_openat"
    args: tuple[str, ...] = ()          # the argument names (enter)

    def render(self, record: tuple, tracer, options) -> str:
        values = self.values(record[6])
        if self.name.startswith("sys_exit_"):
            return f"{self.syscall} -> 0x{values['ret'] & _U64:x}\n"
        args = ", ".join(f"{a}: {values[a] & _U64:x}" for a in self.args)
        return f"{self.syscall}({args})\n"


def _syscall_events(name: str, types: Sequence[str], args: Sequence[str]):
    """The fields and print fmts of a system call's two events (6.1's
    syscall_enter_define_fields and set_syscall_print_fmt)."""
    nr = StaticField("int", "__syscall_nr", 8, 4, True, 0)
    enter = (nr, *(StaticField(t, a, 16 + 8 * i, 8, False, 0)
                   for i, (t, a) in enumerate(zip(types, args))))
    enter_fmt = ('"' + ", ".join(f"{a}: 0x%08lx" for a in args) + '"'
                 + "".join(f", ((unsigned long)(REC->{a}))" for a in args))
    exit_ = (nr, StaticField("long", "ret", 16, 8, True, 0))
    return (enter, enter_fmt), (exit_, '"0x%lx", REC->ret')


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
    ``native`` the tracer's :class:`~kprobefs.tracing.buffers.native.NativeRecorder`.
    Raises :class:`ImageError` when the kernel has no events table.
    """

    def __init__(self, kernel, native, first_id: int = FIRST_STATIC_ID, deliver=None):
        self.kernel = kernel
        self.native = native
        #: deliver(event, cpu, record): a record for the instances (HC_TRACE_EVENT)
        self.deliver = deliver
        self.jump_labels = kernel.jump_labels        # machine/jump_label.py
        self._pids_at = kernel.image.symbol_value("trace_event_pids")
        if self._pids_at is None:
            raise ImageError("the kernel has no trace_event_pids")
        self.events: list[StaticEvent] = []
        start = kernel.image.symbol_value("__start___trace_events")
        stop = kernel.image.symbol_value("__stop___trace_events")
        if start is None or stop is None:
            raise ImageError("the kernel has no __trace_events")
        for n, call in enumerate(_CALL.iter_unpack(kernel.read(start, stop - start))):
            self.events.append(self._read_event(call, first_id + n))
        self._read_syscalls(first_id + len(self.events))
        self._by_id = {ev.id: ev for ev in self.events}
        kernel.add_hypercall("TRACE_EVENT", self._hc_event)

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
        fields = _layout(raw)
        try:
            print_fmt = parse_print_fmt(text)
        except PrintFmtError as exc:        # one unreadable format costs one event's text
            _log.warning("%s: %s; its fields are printed instead", self._cstring(name), exc)
            print_fmt = fields_print_fmt([f.name for f in fields])
        event = StaticEvent(self._cstring(system), self._cstring(name), event_id,
                            fields, text, print_fmt, size, key, tp)
        event.native = self.native.adopt(tp, event_id)
        return event

    def _read_syscalls(self, next_id: int) -> None:
        """The syscalls events, from the kernel's __syscalls_metadata: an enter and an
        exit event per system call, all behind the one syscall_trace_key."""
        image = self.kernel.image
        start = image.symbol_value("__start___syscalls_metadata")
        stop = image.symbol_value("__stop___syscalls_metadata")
        key = image.symbol_value("syscall_trace_key")
        if start is None or stop is None or key is None:
            return
        for meta in _META.iter_unpack(self.kernel.read(start, stop - start)):
            name_at, _nr, nb_args = meta[:3]
            types = [self._cstring(a) for a in meta[3:3 + nb_args]]
            args = [self._cstring(a) for a in meta[9:9 + nb_args]]
            enter_tp, exit_tp = meta[15:17]
            syscall = self._cstring(name_at)
            short = syscall.removeprefix("sys_")
            for (fields, fmt), kind, tp in zip(_syscall_events(syscall, types, args),
                                               ("enter", "exit"), (enter_tp, exit_tp)):
                ev = SyscallEvent("syscalls", f"sys_{kind}_{short}", next_id, fields, fmt,
                                  None, 0, key, tp, syscall=syscall, args=tuple(args))
                ev.native = self.native.adopt(tp, next_id)
                self.events.append(ev)
                next_id += 1

    def sync(self, recording: bool, usable: bool, file_of, to_host) -> None:
        """Make each event's call sites and kernel flags follow its state.  The kernel
        records into the top trace array: ``recording`` = its tracing is on, ``usable``
        = the kernel can stamp its records, ``file_of((group, name))`` = its EventFile of
        an event (trace_array.py) or None.  ``to_host(ev)``: the event is enabled in an
        instance, or has triggers in some array, so the kernel hands each record to the
        host (``deliver``).  A top-level file with triggers is recorded by the host,
        which runs them; a soft-disabled one keeps its call sites on but records
        nothing."""
        states = []
        keys: dict[int, bool] = {}
        for ev in self.events:                  # a key is on while one of its events is
            ef = file_of((ev.group, ev.name))
            if ef is not None and ef.event is not ev:
                ef = None
            on_top = ef is not None and ef.enabled
            host = to_host(ev)
            states.append((ev, ef, on_top, host))
            keys[ev.key] = keys.get(ev.key, False) or on_top or host
        for key, on in keys.items():
            self.jump_labels.set_enabled(key, on)
        for ev, ef, on_top, host in states:
            if not on_top and not host and ev.recording == (False, False):
                continue                        # off and staying off: nothing to write
            records = on_top and ef.records and not (ef.triggers is not None
                                                     and ef.triggers.items)
            flt = ef.filter if ef is not None else None
            here = usable and self.native.set_filter(
                ev.native, flt.program if flt is not None else None)
            want = (records and recording and here, host)
            if want != ev.recording:
                if records and not here:
                    _log.info("%s:%s stops: the kernel cannot record it now (clock, "
                              "stacktrace or filter)", ev.group, ev.name)
                self.native.set_recording(ev.native, *want)
                ev.recording = want

    def _hc_event(self, cpu: int, entry: int, length: int, *_args) -> int:
        """HC_TRACE_EVENT: a record of an event enabled in an instance, its common
        fields and ``length`` bytes of data at ``entry``, not yet filtered."""
        try:
            data = self.kernel.read(entry, _COMMON_SIZE + length)
        except Exception:                       # the machine's fault: nothing to give
            return 0
        ev = self._by_id.get(int.from_bytes(data[:2], "little"))
        if ev is not None and self.deliver is not None:
            try:
                self.deliver(ev, cpu, data)
            except Exception:                   # the record is lost, not the machine
                _log.exception("%s:%s: a record could not be delivered", ev.group, ev.name)
        return 0

    # ------------------------------------------------ set_event_pid, event-fork
    def set_pid_filter(self, pids: Iterable[int] | None, no_pids: Iterable[int] | None) -> None:
        """Make the kernel record static events only for ``pids`` (None or empty: every
        pid) and never for ``no_pids`` (set_event_pid, set_event_notrace_pid).  Pids at or
        past pid_max are EINVAL, as 6.1's trace_pid_write says."""
        sets = [set(pids or ()), set(no_pids or ())]
        if any(not 0 <= p < _PID_MAX for s in sets for p in s):
            raise OSError(errno.EINVAL, "pid out of range")
        maps = []
        for s in sets:
            bits = bytearray(_PID_MAX // 8)
            for p in s:
                bits[p // 8] |= 1 << (p % 8)
            maps.append(bytes(bits))
        at = self._pids_at
        self.kernel.write(at + _PID_MAPS, maps[0] + maps[1])
        self.kernel.write(at, struct.pack("<II", bool(sets[0]), bool(sets[1])))

    def pid_filter(self) -> tuple[set[int], set[int]]:
        """The pids the kernel filters on now (event-fork adds children, drops exits)."""
        data = self.kernel.read(self._pids_at + _PID_MAPS, _PID_MAX // 4)
        out = []
        for half in (data[:_PID_MAX // 8], data[_PID_MAX // 8:]):
            out.append({i * 8 + b for i, byte in enumerate(half) if byte
                        for b in range(8) if byte >> b & 1})
        return out[0], out[1]

    def set_event_fork(self, on: bool) -> None:
        """options/event-fork: children of listed tasks are listed, exits leave."""
        self.kernel.write(self._pids_at + 8, struct.pack("<I", int(on)))

    def hits(self, ev: StaticEvent) -> int:
        return self.native.hits(ev.native)
