"""Trace arrays: what each tracing instance has of its own (Linux's ``trace_array``).

The top-level ``tracing/`` directory is one trace array, and every directory made under
``tracing/instances/`` is another.  A :class:`TraceArray` holds the ring buffer, the
options, ``tracing_on`` (and pauses), the trace clock, the current tracer's name, the
error log, ``set_event_pid`` and ``set_event_notrace_pid`` (:class:`PidFilter`),
``tracing_cpumask`` (the CPUs its buffer records on), ``tracing_max_latency``, and one
:class:`EventFile` per event: the event's enable bit and filter in this array (Linux's
``trace_event_file``), where triggers hang too.

The events themselves are defined once, in the registry (:class:`registry.Tracer`), for
every array.  The registry is what a trace array calls back (documented on
:class:`TraceArray`): to arm the event's probes when its first file is enabled, to
point the kernel's recorder at the right place when something that decides it
changes.  Every control method takes the registry's lock (event_mutex).
"""

from __future__ import annotations

import errno
import struct
import weakref
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from kprobefs.tracing.error_log import ErrorLog
from kprobefs.tracing.events.fetch import RecordField
from kprobefs.tracing.triggers.filter import (
    EventFilter, FilterParseError, FILTER_ERRORS, compile_filter, filter_fields,
)
from kprobefs.tracing.events.ftrace_events import FTRACE_EVENTS
from kprobefs.tracing.gcpause import gc_paused
from kprobefs.tracing.tracers.latency_format import (
    kernel_release, latency_header, render_latency,
)
from kprobefs.tracing.buffers.marker import write_marker_raw
from kprobefs.tracing.buffers.output import (
    FLAGS_NONE, KeptTrace, TraceFormatter, TraceOptions, format_header, format_ip_sym,
    new_text_caches,
)
from kprobefs.tracing.buffers.text_caches import SharedTextCaches, TextCaches
from kprobefs.tracing.pid_filter import PidFilter
from kprobefs.tracing.buffers.raw_output import LINE_MODES, render_line_mode
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.buffers.ring_buffer import (
    DEFAULT_BUFFER_BYTES, MAX_TOTAL_BUFFER_KB, RingBuffer, decode_runs, merge_runs,
)
from kprobefs.tracing.buffers.snapshot import MaxData, MaxTrace, snapshot_help
from kprobefs.tracing.tracers.plugin import NopTracer, TracerPlugin
from kprobefs.tracing.triggers.trigger import TriggerHit
from kprobefs.tracing.triggers.trigger_actions import TracerTriggerHost

__all__ = [
    "TraceArray",
    "EventFile",
    "OPTION_DEFAULTS",
    "PRINT_EVENT",
    "STACK_EVENT",
]

# The options a trace array implements (options/<name>), with their defaults.
OPTION_DEFAULTS = {
    "bin": False,
    "context-info": True,
    "event-fork": False,
    "function-fork": False,
    "hex": False,
    "irq-info": True,
    "latency-format": False,
    "markers": True,
    "overwrite": True,
    "pause-on-trace": False,
    "print-parent": True,
    "raw": False,
    "record-cmd": True,
    "record-tgid": False,
    "stacktrace": False,
    "sym-addr": False,
    "sym-offset": False,
    "trace_printk": True,
}

# The order of 6.1's trace_options (TRACE_FLAGS), for the names this tracer has.
_OPTION_ORDER = ("print-parent", "sym-offset", "sym-addr", "verbose", "raw", "hex", "bin",
                 "block", "fields", "trace_printk", "annotate", "userstacktrace",
                 "sym-userobj", "printk-msg-only", "context-info", "latency-format",
                 "record-cmd", "record-tgid", "overwrite", "disable_on_free", "irq-info",
                 "markers", "event-fork", "pause-on-trace", "hash-ptr", "function-trace",
                 "function-fork", "display-graph", "stacktrace")
_OPTION_MAX = 64                 # trace_options takes writes shorter than this

_QWORD = struct.Struct("<Q")
_TRACE_PRINT_ID = 5              # the record types of marker and stack records
_TRACE_STACK_ID = 4
_TRACE_BUF_SIZE = 1024           # longest trace_marker write


class _PrintEvent:
    """trace_marker records: ``(ts, pid, flags, PRINT_EVENT, text)``.  As ``ftrace/print``
    it is an event triggers can be attached to in each array (``trace_marker_file``):
    no enable or filter file, but ``trigger`` and ``hist``."""

    id = _TRACE_PRINT_ID
    group = "ftrace"
    name = "print"
    # the registry's per-event arming state (registry.Tracer.enable_file)
    enabled = False
    was_enabled = False
    on: tuple = ()

    @staticmethod
    def record_fields() -> list[RecordField]:
        """``ip``, then ``buf``: a char array to the end of the record (size 0: Linux's
        filters then compare up to the NUL)."""
        return [RecordField("unsigned long", "ip", 8, 8, False),
                RecordField("char[]", "buf", 16, 0, True)]

    def format_text(self) -> str:
        return FTRACE_EVENTS["print"].format

    def raw(self, record: tuple) -> bytes:
        """``ftrace/print``: the common fields, ``ip`` (0: not kept), ``buf``."""
        text = record[4]
        if not text.endswith(b"\0"):
            text += b"\0"
        return raw_common(self.id, record[2], record[1]) + _QWORD.pack(0) + text

    def render(self, record: tuple, tr: "TraceArray", options: TraceOptions) -> str:
        """``FUNC: text``: FUNC is trace_marker's writer, or the function a record the
        tracer wrote itself names (``record[5]``: trace_array_puts's caller)."""
        text = record[4]
        nul = text.find(b"\0")
        if nul >= 0:
            text = text[:nul]
        func = record[5] if len(record) > 5 else "tracing_mark_write"
        return f"{func}: " + text.decode("utf-8", "replace")

    @staticmethod
    def raw_text(record: tuple) -> str:
        """options/raw: 6.1's trace_print_raw, ``# ip buf``; the ip is not kept (0),
        as in the record's raw bytes."""
        text = record[4]
        nul = text.find(b"\0")
        if nul >= 0:
            text = text[:nul]
        return "# 0 " + text.decode("utf-8", "replace")


class _StackEvent:
    """Stack trace records (options/stacktrace): ``(ts, pid, flags, STACK_EVENT, addrs)``."""

    id = _TRACE_STACK_ID

    def raw(self, record: tuple) -> bytes:
        """``ftrace/kernel_stack``: the common fields, ``size``, then the callers."""
        addrs = record[4]
        return (raw_common(self.id, record[2], record[1])
                + struct.pack(f"<i4x{len(addrs)}Q", len(addrs), *addrs))

    def render(self, record: tuple, tr: "TraceArray", options: TraceOptions) -> str:
        sym = tr.symbols.symbolize
        lines = ["<stack trace>\n"]
        for addr in record[4]:
            lines.append(f" => {format_ip_sym(addr, sym, options.sym_offset, options.sym_addr)}\n")
        return "".join(lines)


PRINT_EVENT = _PrintEvent()
STACK_EVENT = _StackEvent()


@dataclass(eq=False)
class EventFile:
    """One event in one trace array (Linux's ``trace_event_file``): its filter here
    (``filter_text`` is what the filter file shows, without the newline), the triggers
    attached to it here, and its enable state.

    ``enabled`` is Linux's ENABLED flag: the event's probes are armed for this array.
    ``soft_mode`` counts the soft references (Linux's sm_ref: the file's own triggers,
    and ``enable_event`` triggers aiming at it); a file armed in soft mode runs its
    triggers on every hit and records only when not also ``soft_disabled``."""

    event: Any
    tr: "TraceArray"
    enabled: bool = False
    filter: EventFilter | None = None
    filter_text: str | None = None
    soft_mode: int = 0
    soft_disabled: bool = False
    triggers: Any = None                  # its EventTriggers, once a trigger was written

    @property
    def records(self) -> bool:
        """Whether a hit is written to this array's buffer (triggers aside)."""
        return self.enabled and not self.soft_disabled


class TraceArray:
    """One tracing instance: ``name`` is ``""`` for the top level, else its directory
    name under ``instances/``.

    ``registry`` is the event registry (:class:`registry.Tracer`); the array uses its
    ``lock``, ``clocks``, ``comm_cache``, ``symbols``, ``kernel``, ``nr_cpus``,
    ``events_newest_first()``, and the callbacks ``enable_file(file, on)`` (arm or
    disarm the event's probes as its first file is enabled or its last disabled; raises
    OSError with nothing changed) and ``array_changed(tr, events=None)`` (something that
    decides where the given events, or all, are recorded has changed).
    ``function_tracer`` is the array's function tracer (``current_tracer`` =
    ``function``), ``None`` when the kernel has no ftrace sites; the registry sets it.
    """

    def __init__(self, name: str, registry, function_tracer=None):
        self.name = name
        self.registry = registry
        self.lock = registry.lock
        self.clocks = registry.clocks
        self.comm_cache = registry.comm_cache
        self.symbols = registry.symbols
        self.nr_cpus = registry.nr_cpus
        self.function_tracer = function_tracer
        #: set_ftrace_filter's commands (ftrace_probes.FunctionProbes), with the
        #: function tracer; the registry sets it.
        self.func_probes = None
        self.buffer = RingBuffer(self.nr_cpus)
        #: The snapshot buffer (max_tr), allocated on demand.
        self.max_tr = MaxTrace(self.buffer)
        #: buffer -> cpu -> the lines its records printed as at the last read.
        self._kept_lines: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        #: the texts of lines, kept from one read of ``trace`` to the next
        self._text_caches = SharedTextCaches()
        self.error_log = ErrorLog(registry.clock)
        self.options = dict(OPTION_DEFAULTS)
        #: current_tracer's choices (tracers/plugin.py), in registration order.
        self.tracers: dict[str, TracerPlugin] = {"nop": NopTracer()}
        self.current_tracer: TracerPlugin = self.tracers["nop"]
        self.tracer_name = "nop"
        self.trace_clock = "local"
        self.now = self.clocks["local"].read      # the trace clock's reading, ns (or ticks)
        self.tracing_on = True
        #: buffer_percent: how full a CPU's buffer is before poll(2) on its pipes says
        #: readable (6.1's default 50)
        self.buffer_percent = 50
        self._stop_count = 0
        self.recording = True                     # tracing_on and not paused
        self.stacktrace = False
        #: set_event_pid / set_event_notrace_pid: the kernel's recorder cannot filter by
        #: pid, so while either is set this array's events are recorded by the host.
        self.event_pids = PidFilter(lambda: registry.array_changed(self))
        #: tracing_max_latency, in ns (no latency tracer here changes it).
        self.max_latency_ns = 0
        self.files: dict[tuple[str, str], EventFile] = {}
        self.group_filter_text: dict[str, str] = {}
        #: Open files of this instance (Linux's tr->ref less its own): rmdir is EBUSY
        #: while any is open.
        self.ref = 0
        #: What this array's triggers act on (its buffer, tracing_on, event files).
        self.trigger_host = TracerTriggerHost(self)

    #: ``ftrace/print``: trace_marker's event, which triggers can be attached to.
    marker_event = PRINT_EVENT

    @property
    def is_top(self) -> bool:
        return not self.name

    def __repr__(self) -> str:
        return f"<TraceArray {self.name or '(top)'}>"

    # ================================================================ event files
    def file(self, event) -> EventFile:
        """Return ``event``'s file in this array (made on first use)."""
        key = (event.group, event.name)
        ef = self.files.get(key)
        if ef is None or ef.event is not event:
            ef = self.files[key] = EventFile(event, self)
        return ef

    def forget_event(self, event) -> None:
        """The event is gone: drop its file (the registry checked it is disabled)."""
        key = (event.group, event.name)
        ef = self.files.get(key)
        if ef is not None and ef.event is event:
            del self.files[key]

    def forget_group(self, group: str) -> None:
        self.group_filter_text.pop(group, None)

    # ================================================================ buffer size
    def buffer_total_kb(self) -> int:
        """KiB of this array's buffers: the main one and an allocated snapshot."""
        return (sum(self.buffer.size_kb(cpu) for cpu in range(self.nr_cpus))
                + self.max_tr.total_kb())

    def _check_room(self, total_kb: int) -> None:
        """OSError(ENOMEM) when this array's buffers at ``total_kb`` and every other
        array's would pass MAX_TOTAL_BUFFER_KB: the bound holds for all arrays
        together, so instances cannot multiply the memory it bounds."""
        others = sum(tr.buffer_total_kb() for tr in self.registry.arrays()
                     if tr is not self)
        if others + total_kb > MAX_TOTAL_BUFFER_KB:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")

    def update_buffers(self) -> None:
        """Expand the ring buffer to its default size on first use
        (tracing_update_buffers); ENOMEM when the arrays' buffers have no room for it."""
        with self.lock:
            if not self.buffer.expanded:
                self._check_room((DEFAULT_BUFFER_BYTES >> 10) * self.nr_cpus
                                 * (2 if self.max_tr.allocated else 1))
                self.buffer.expand()
                self.max_tr.follow_resize(None)

    def resize_kb(self, kb: int, cpu: int | None = None) -> None:
        """Set ``buffer_size_kb`` of one CPU or (``None``) all; ENOMEM, nothing changed,
        past the bound (this array's alone, or all arrays' together)."""
        with self.lock:
            self._check_room(sum(kb if cpu is None or c == cpu else self.buffer.size_kb(c)
                                 for c in range(self.nr_cpus))
                             * (2 if self.max_tr.allocated else 1))
            self.buffer.resize_kb(kb, cpu)
            self.max_tr.follow_resize(cpu)

    # ================================================================ enable
    def set_enabled(self, event, on: bool) -> None:
        """Enable or disable ``event`` in this array (its ``enable`` file); an enable
        failure changes nothing."""
        self.file_enable_disable(self.file(event), on, soft=False)

    def file_enable_disable(self, ef: EventFile, on: bool, soft: bool) -> None:
        """Linux's __ftrace_event_enable_disable on one event file: a ``soft`` enable
        takes a soft-mode reference (arming the file soft disabled if it was not
        armed), a soft disable drops one; a plain enable clears soft disabled, a plain
        disable disarms unless the file is in soft mode.  An enable failure changes
        nothing."""
        with self.lock:
            if on:
                self._file_on(ef, soft)
            elif ef.enabled:
                self._file_off(ef, soft)

    def _file_on(self, ef: EventFile, soft: bool) -> None:
        if soft:
            ef.soft_mode += 1
            if ef.soft_mode > 1:
                return
        elif ef.soft_disabled:
            ef.soft_disabled = False
            self.registry.array_changed(self, (ef.event,))
        if ef.enabled:
            return
        ef.soft_disabled = soft             # armed soft disabled: it records nothing yet
        try:
            self.registry.enable_file(ef, True)
        except OSError:
            if soft:
                ef.soft_mode -= 1
            ef.soft_disabled = False
            raise

    def _file_off(self, ef: EventFile, soft: bool) -> None:
        if soft:
            ef.soft_mode -= 1
            if ef.soft_mode > 0:
                return
            disable = ef.soft_disabled
        else:
            disable = not ef.soft_mode
        if disable:
            self.registry.enable_file(ef, False)
        ef.soft_disabled = bool(ef.soft_mode)
        self.registry.array_changed(self, (ef.event,))

    def set_events_enabled(self, on: bool, *, match: str | None = None,
                           group: str | None = None, event: str | None = None,
                           allow_none: bool = False) -> None:
        """Enable/disable the events selected like ``set_event`` does (``match`` = an
        event or group name, ``group``/``event`` = exact parts, ``None`` = any).

        Every matching event is changed; the first error is raised afterwards.  No
        match is EINVAL unless ``allow_none``.
        """
        with self.lock:
            first_error = None
            matched = False
            for ev in self.registry.events_newest_first():
                if match is not None and match != ev.name and match != ev.group:
                    continue
                if group is not None and group != ev.group:
                    continue
                if event is not None and event != ev.name:
                    continue
                matched = True
                try:
                    self.set_enabled(ev, on)
                except OSError as exc:
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error
            if not matched and not allow_none:
                raise OSError(errno.EINVAL, "no such event")

    def _file_of(self, event) -> EventFile | None:
        """``event``'s file here if it has one (no file is made)."""
        ef = self.files.get((event.group, event.name))
        return ef if ef is not None and ef.event is event else None

    def is_enabled(self, event) -> bool:
        """Whether ``event`` is armed here (Linux's ENABLED flag, soft mode included:
        what ``set_event`` and a group's ``enable`` show)."""
        ef = self._file_of(event)
        return ef is not None and ef.enabled

    def enable_text(self, event) -> str:
        """What ``events/G/E/enable`` reads: ``0``/``1``, ``*`` added in soft mode."""
        ef = self._file_of(event)
        if ef is None:
            return "0\n"
        soft = "*" if ef.soft_mode or ef.soft_disabled else ""
        return f"{int(ef.records)}{soft}\n"

    def enable_state(self, group: str | None = None) -> str:
        """Return ``0``/``1``/``X``/``?`` for the events of ``group`` (or all)."""
        with self.lock:
            states = {self.is_enabled(ev) for ev in self.registry.events_newest_first()
                      if group is None or ev.group == group}
        if not states:
            return "?"
        if len(states) == 2:
            return "X"
        return "1" if True in states else "0"

    def set_event_tokens(self, data: bytes) -> int:
        """Apply a write to ``set_event``: whitespace-separated ``[!][grp:]ev`` tokens."""
        self.update_buffers()
        for token in data.decode("latin-1").split():
            on = not token.startswith("!")
            if not on:
                token = token[1:]
            sub, sep, name = token.partition(":")
            if sep:
                group = None if sub in ("", "*") else sub
                event = None if name in ("", "*") else name
                self.set_events_enabled(on, group=group, event=event)
            else:
                self.set_events_enabled(on, match=token)
        return len(data)

    def enabled_event_lines(self) -> str:
        return "".join(f"{ev.group}:{ev.name}\n"
                       for ev in self.registry.events_newest_first() if self.is_enabled(ev))

    # ================================================================ filters
    def filter_text(self, event) -> str | None:
        ef = self._file_of(event)
        return ef.filter_text if ef is not None else None

    def set_filter(self, event, text: str) -> None:
        """Apply a write to ``event``'s filter file (trailing blanks already removed)."""
        with self.lock:
            try:
                self._set_filter(self.file(event), text)
            finally:
                self.registry.array_changed(self, (event,))

    def _set_filter(self, ef: EventFile, text: str) -> None:
        if text.strip(" \t\n\v\f\r") == "0":
            ef.filter = None
            ef.filter_text = None
            return
        try:
            ef.filter = compile_filter(text, filter_fields(ef.event.record_fields()))
            ef.filter_text = text
        except FilterParseError as exc:
            ef.filter = None
            ef.filter_text = exc.file_text(text)
            self.error_log.add("event filter parse error", text, exc.message,
                               exc.log_pos)
            raise OSError(exc.errno, exc.message) from None

    def set_group_filter(self, group: str, text: str) -> None:
        """Apply a write to ``events/<group>/filter``: every event of the group gets the
        filter; an event it does not fit gets it disabled with an error shown."""
        with self.lock:
            events = [ev for ev in self.registry.events_newest_first() if ev.group == group]
            try:
                self._set_group_filter(group, events, text)
            finally:
                self.registry.array_changed(self, events)

    def _set_group_filter(self, group: str, events: list, text: str) -> None:
        if not events:
            raise OSError(errno.ENODEV, "no events")
        self.group_filter_text.pop(group, None)
        if text.strip(" \t\n\v\f\r") == "0":
            for ev in events:
                ef = self.file(ev)
                ef.filter = None
                ef.filter_text = None
            return
        bad = FilterParseError(errno.EINVAL, FILTER_ERRORS.index(
            "Couldn't find or set field in one of a subsystem's events"), 0)
        for ev in events:
            ef = self.file(ev)
            try:
                ef.filter = compile_filter(text, filter_fields(ev.record_fields()))
                ef.filter_text = text
            except FilterParseError:
                ef.filter = None
                ef.filter_text = bad.file_text(text)
                self.error_log.add("event filter parse error", text, bad.message, 0)

    # ================================================================ triggers
    def triggers_of(self, event):
        """``event``'s EventTriggers here, ``None`` when no trigger was ever written."""
        ef = self._file_of(event)
        return ef.triggers if ef is not None else None

    def event_triggers(self, ef: EventFile):
        """Return the file's EventTriggers, made on first use."""
        if ef.triggers is None:
            ef.triggers = self.trigger_host.new_triggers(ef)
        return ef.triggers

    def set_triggers(self, event, text: str) -> None:
        """Apply one write to ``event``'s ``trigger`` file (blanks already stripped)."""
        with self.lock:
            ef = self.file(event)
            try:
                self.event_triggers(ef).write(text)
            finally:
                self.registry.array_changed(self, (event,))

    def truncate_triggers(self, event) -> None:
        """open(O_TRUNC) of ``trigger`` for writing: the hist triggers go."""
        with self.lock:
            ef = self._file_of(event)
            if ef is not None and ef.triggers is not None:
                ef.triggers.truncate()
                self.registry.array_changed(self, (event,))

    def remove_triggers(self) -> None:
        """Drop every trigger of this array (it or the daemon is going away): they
        hold event files armed in soft mode."""
        with self.lock:
            for ef in list(self.files.values()):
                if ef.triggers is not None:
                    ef.triggers.remove_all()

    def set_soft_disabled(self, ef: EventFile, disabled: bool) -> None:
        """An enable_event/disable_event trigger fired (the hit path: no lock)."""
        if ef.soft_disabled != disabled:
            ef.soft_disabled = disabled
            self.registry.array_changed(self, (ef.event,))

    def record_triggered(self, ef: EventFile, raw: bytes, rec: tuple, size: int,
                         hit: TriggerHit) -> None:
        """The hit path of an event file with triggers (the host records it: the
        kernel's recorder leaves such events alone): run the triggers on ``raw`` (the
        record's binary form, common fields included), write ``rec`` (``size`` bytes in
        the buffer) unless tracing is off here, the file soft disabled or the record
        filtered out, then run the post triggers (traceoff, stacktrace)."""
        triggers = ef.triggers
        reserved = self.buffer.cpus[hit.cpu]
        posts = triggers.call(raw, hit)
        flt = ef.filter
        if self.recording and not ef.soft_disabled and (
                flt is None or flt.match(raw, hit.cpu, hit.comm)):
            pid, cache = hit.pid, self.comm_cache
            if (pid not in cache.names or pid in cache.stale) and self.options["record-cmd"]:
                cache.save(pid, hit.comm())
            buffer = self._reserved_in(hit.cpu, reserved)
            if self.stacktrace:
                stack = hit.stack()
                buffer.write_many(hit.cpu, ((rec, size), (
                    (rec[0], pid, rec[2], STACK_EVENT, stack), 16 + 8 * len(stack))))
            else:
                buffer.write(hit.cpu, rec, size)
        if posts:
            triggers.post_call(posts, hit)

    def commit_event(self, ef: EventFile, raw: bytes, rec: tuple, size: int,
                     hit: TriggerHit) -> None:
        """Record an event generated inside another's hit (a synthetic event, an event
        probe's) into its file ``ef`` here: through its triggers when it has some
        (record_triggered), else written when the file records, tracing is on, and
        the pid sets and its filter pass (``raw``: the record's binary form)."""
        triggers = ef.triggers
        if triggers is not None and triggers.items:
            self.record_triggered(ef, raw, rec, size, hit)
            return
        if not ef.records or not self.recording:
            return
        pids = self.event_pids
        if pids.active and pids.ignores(hit.pid):
            return
        if ef.filter is not None and not ef.filter.match(raw, hit.cpu, hit.comm):
            return
        cache = self.comm_cache
        if (hit.pid not in cache.names or hit.pid in cache.stale) \
                and self.options["record-cmd"]:
            cache.save(hit.pid, hit.comm())
        self.buffer.write(hit.cpu, rec, size)

    def _reserved_in(self, cpu: int, reserved) -> RingBuffer:
        """The buffer that now holds ``reserved``, the CPU's page set an event was
        reserved in before its triggers ran: Linux commits the event where it was
        reserved, so a ``snapshot`` trigger that swapped meanwhile sends it into the
        snapshot."""
        max_buffer = self.max_tr.buffer
        return max_buffer if max_buffer.cpus[cpu] is reserved else self.buffer

    def write_stack(self, hit: TriggerHit) -> None:
        """A stacktrace trigger fired: the hit's kernel stack into this buffer."""
        if self.recording:
            stack = hit.stack()
            self.buffer.write(hit.cpu, (hit.ts, hit.pid, FLAGS_NONE, STACK_EVENT, stack),
                              16 + 8 * len(stack))

    def set_tracing_on_hit(self, on: bool) -> None:
        """A traceon/traceoff trigger fired (the hit path: no lock)."""
        self.tracing_on = on
        self._update_recording()

    # ================================================================ buffer control
    def clear_trace(self) -> None:
        """``echo > trace``: the buffer ``trace`` shows is emptied (and the lines kept
        for its records let go)."""
        buffer = self.trace_buffer()
        buffer.reset()
        self._kept_lines.pop(buffer, None)

    def set_tracing_on(self, on: bool) -> None:
        with self.lock:
            self.tracing_on = on
            self._update_recording()

    def pause(self) -> None:
        """Stop recording while a ``trace`` reader is open (options/pause-on-trace)."""
        with self.lock:
            self._stop_count += 1
            self._update_recording()

    def unpause(self) -> None:
        with self.lock:
            self._stop_count = max(0, self._stop_count - 1)
            self._update_recording()

    def _update_recording(self) -> None:
        self.recording = self.tracing_on and not self._stop_count
        self.registry.array_changed(self)

    def set_option(self, name: str, on: bool) -> None:
        with self.lock:
            self.options[name] = on
            self.stacktrace = self.options["stacktrace"]
            self.buffer.overwrite = self.options["overwrite"]
            self.max_tr.buffer.overwrite = self.options["overwrite"]
            if name == "record-tgid":
                self.registry.record_tgid_changed()
            self.registry.array_changed(self)       # stack traces are taken by the host

    def set_tracing_cpumask(self, mask: int) -> None:
        """``tracing_cpumask``: only the CPUs in ``mask`` record into this array's
        buffer (ring_buffer_record_disable_cpu for the others).  The kernel's recorder
        writes every CPU's buffer, so while a CPU is masked the host records."""
        with self.lock:
            self.buffer.record_disabled = frozenset(
                cpu for cpu in range(self.nr_cpus) if not mask >> cpu & 1)
            self.max_tr.buffer.record_disabled = self.buffer.record_disabled
            self.registry.array_changed(self)

    def tracing_cpumask(self) -> int:
        return sum(1 << cpu for cpu in range(self.nr_cpus)
                   if cpu not in self.buffer.record_disabled)

    def trace_options_text(self) -> str:
        """``trace_options``: every option as ``name`` or ``noname``, in 6.1's order."""
        order = sorted(self.options, key=lambda name: (
            _OPTION_ORDER.index(name) if name in _OPTION_ORDER else len(_OPTION_ORDER),
            name))
        flags = self.current_tracer.flags
        return "".join(("" if on else "no") + name + "\n" for name, on in (
            *((name, self.options[name]) for name in order), *flags.items()))

    def write_trace_option(self, data: bytes) -> int:
        """A write to ``trace_options``: ``name`` sets one option, ``noname`` clears it;
        EINVAL for a write of 64 bytes or more, or a name this array does not have."""
        if len(data) >= _OPTION_MAX:
            raise OSError(errno.EINVAL, "option too long")
        name = bytes(data).split(b"\0", 1)[0].decode("latin-1").strip(" \t\n\v\f\r")
        on = not name.startswith("no")
        if not on:
            name = name[2:]
        if name in self.options:
            self.set_option(name, on)
        elif name in self.current_tracer.flags:
            self.set_tracer_flag(self.current_tracer, name, on)
        else:
            raise OSError(errno.EINVAL, f"no option {name!r}")
        return len(data)

    def set_tracer_flag(self, tracer: TracerPlugin, name: str, on: bool) -> None:
        """One of a tracer's own options (``options/NAME``, or ``trace_options`` while
        it is current)."""
        with self.lock:
            tracer.set_flag(self, name, on)

    def tracer_flags(self) -> dict[str, TracerPlugin]:
        """Each tracer option offered here (options/), with the tracer it belongs to."""
        return {name: tracer for tracer in self.tracers.values() for name in tracer.flags}

    def set_trace_clock(self, name: str) -> None:
        """Select a trace clock (clears the buffer); EINVAL for an unknown name."""
        clock = self.clocks.get(name)
        if clock is None:
            raise OSError(errno.EINVAL, "unknown clock")
        with self.lock:
            self.trace_clock = name
            self.now = clock.read
            self.registry.clock_changed(self, clock)
            self.buffer.reset()                 # what the kernel staged goes too
            self.max_tr.buffer.reset()
            self.registry.array_changed(self)   # the kernel stamps with TSC clocks only

    def add_tracer(self, tracer: TracerPlugin) -> None:
        """Offer ``tracer`` in ``current_tracer`` (the registry's factories call this)."""
        self.tracers[tracer.name] = tracer

    def set_current_tracer(self, name: str) -> None:
        """Switch tracers: the old one is reset, the buffer cleared, the new one
        initialised (tracing_set_tracer).  An unknown name is EINVAL."""
        tracer = self.tracers.get(name)
        if tracer is None:
            raise OSError(errno.EINVAL, "unknown tracer")
        with self.lock:
            self.update_buffers()
            if tracer is self.current_tracer:
                return
            self.current_tracer.reset(self)
            had_max_tr = self.current_tracer.use_max_tr
            self.tracer_name = "nop"
            self.current_tracer = self.tracers["nop"]
            self.buffer.reset()
            if had_max_tr and not tracer.use_max_tr:
                self.max_tr.free()
            if tracer.use_max_tr:
                self.alloc_snapshot()
            tracer.init(self)
            self.tracer_name = name
            self.current_tracer = tracer

    # ================================================================ snapshot
    def alloc_snapshot(self) -> None:
        """tracing_alloc_snapshot_instance: ENOMEM past the buffers' bound."""
        with self.lock:
            if not self.max_tr.allocated:
                self._check_room(2 * sum(self.buffer.size_kb(cpu)
                                         for cpu in range(self.nr_cpus)))
                self.max_tr.alloc()

    def write_snapshot(self, value: int, cpu: int | None = None) -> None:
        """A write of ``value`` to ``snapshot`` (``cpu``: per_cpu/cpuN/snapshot),
        as tracing_snapshot_write: EBUSY while a latency tracer or a hist
        ``snapshot()`` owns the buffer; 0 frees it (EINVAL per CPU), 1 allocates it
        if needed and swaps, anything else empties it."""
        self.update_buffers()
        with self.lock:
            max_tr = self.max_tr
            if self.current_tracer.use_max_tr or max_tr.cond_owner is not None:
                raise OSError(errno.EBUSY, "snapshot in use")
            if value == 0:
                if cpu is not None:
                    raise OSError(errno.EINVAL, "per-CPU snapshot cannot be freed")
                if max_tr.allocated:
                    max_tr.free()
            elif value == 1:
                if max_tr.allocated:
                    max_tr.follow_resize(cpu)
                else:
                    self.alloc_snapshot()
                self.update_max_tr(cpu)
            elif max_tr.allocated:
                max_tr.clear(cpu)

    def tracing_stopped(self) -> bool:
        """is_tracing_stopped: a reader paused tracing (options/pause-on-trace)."""
        return bool(self._stop_count)

    def update_max_tr(self, cpu: int | None = None) -> None:
        """Swap the buffers (update_max_tr, update_max_tr_single for one CPU); not
        while tracing is stopped."""
        if not self._stop_count:
            self.max_tr.swap(cpu)

    def take_snapshot(self, cond=None) -> None:
        """tracing_snapshot_instance_cond (the ``snapshot`` trigger, a hist
        ``snapshot()`` action, ``func:snapshot``; the hit path): swap the buffers.
        Unallocated, it says so in the trace and stops tracing; a latency tracer's
        buffer is not taken.  With a conditional snapshot set, the owner's update
        decides on ``cond`` (the hit's data) whether to swap."""
        max_tr = self.max_tr
        if not max_tr.allocated:
            self._puts("*** SNAPSHOT NOT ALLOCATED ***\n", "*** stopping trace here!   ***\n")
            self.set_tracing_on_hit(False)
            return
        if self.current_tracer.use_max_tr:
            self._puts("*** LATENCY TRACER ACTIVE ***\n",
                       "*** Can not use snapshot (sorry) ***\n")
            return
        update = max_tr.cond_update
        if update is not None and not update(cond):
            return
        self.update_max_tr()

    def _puts(self, *lines: str) -> None:
        """trace_array_puts from tracing_snapshot_instance_cond: print records."""
        if not self.recording:
            return
        cpu_obj = getattr(self.registry.kernel, "cpu", None)
        cpu = cpu_obj.index if cpu_obj is not None else 0
        kernel = self.registry.kernel
        pid = kernel.current_pid() if callable(getattr(kernel, "current_pid", None)) else 0
        if self.options["record-cmd"] and callable(getattr(kernel, "current_comm", None)):
            self.comm_cache.save(pid, kernel.current_comm())
        for line in lines:
            text = line.encode()
            self.buffer.write(cpu, (self.now(), pid, FLAGS_NONE, PRINT_EVENT, text,
                                    "tracing_snapshot_instance_cond"), 16 + len(text) + 2)

    def cond_snapshot_enable(self, owner, update) -> None:
        """A hist ``snapshot()`` action takes the snapshot over (EBUSY if taken)."""
        with self.lock:
            self.alloc_snapshot()
            self.max_tr.cond_enable(owner, update, self.current_tracer.use_max_tr)

    def cond_snapshot_disable(self, owner) -> None:
        with self.lock:
            self.max_tr.cond_disable(owner)

    def snapshot_text(self, options: TraceOptions, cpu: int | None = None) -> str:
        """What ``snapshot`` (or ``per_cpu/cpuN/snapshot``) reads: the snapshot
        buffer's trace, or the help when it holds nothing there."""
        buffer = self.max_tr.buffer
        if buffer.is_empty(cpu):
            return (f"# tracer: {self.tracer_name}\n#\n"
                    + snapshot_help(self.max_tr.allocated, cpu is not None))
        return self.trace_text(options, cpu, buffer)

    def trace_text(self, options: TraceOptions, cpu: int | None = None,
                   buffer: RingBuffer | None = None) -> str:
        """The header and lines of ``buffer`` (default: the buffer ``trace`` shows)."""
        buffer = buffer or self.trace_buffer()
        header = self.trace_header(options, cpu, buffer)
        return header + self.render_runs(self.trace_runs(buffer, cpu), options, buffer)

    def trace_runs(self, buffer: RingBuffer, cpu: int | None = None) -> list[tuple[int, list]]:
        """What :meth:`render_runs` takes: ``buffer.runs(cpu)``, the chunks the kernel
        recorded left undecoded when the formatter makes their text from their bytes
        (not for a tracer that prints records its own way)."""
        staged = type(self.current_tracer).print_trace is TracerPlugin.print_trace
        return buffer.runs(cpu, staged=staged)

    def trace_buffer(self) -> RingBuffer:
        """What ``trace`` shows: the main buffer, or the snapshot where the current
        tracer keeps its maximum there (print_max: the latency tracers)."""
        return self.max_tr.buffer if self.current_tracer.print_max else self.buffer

    def available_tracers(self) -> list[str]:
        """Newest registered first, as Linux lists them."""
        return list(reversed(self.tracers))

    def trace_options(self) -> TraceOptions:
        options = self.options
        return TraceOptions(options["context-info"], options["irq-info"],
                            options["sym-offset"], options["sym-addr"],
                            self.clocks[self.trace_clock].in_ns, options["print-parent"],
                            next((mode for mode in LINE_MODES if options[mode]), ""))

    # ================================================================ trace_marker
    def writer_cpu(self) -> int:
        """The CPU a marker write is recorded on: the one the writing task's system
        call runs on (0 where nothing is emulating)."""
        cpu = getattr(self.registry.kernel, "cpu", None)
        return cpu.index if cpu is not None else 0

    def write_marker_raw(self, data: bytes, pid: int, comm: str) -> int:
        """A ``trace_marker_raw`` write (marker.write_marker_raw)."""
        return write_marker_raw(self, data, pid, comm)

    def write_marker(self, data: bytes, pid: int, comm: str) -> int:
        """Record a ``tracing_mark_write`` line; return the bytes taken (at most 1024)."""
        if not self.options["markers"]:
            raise OSError(errno.EINVAL, "markers disabled")
        count = min(len(data), _TRACE_BUF_SIZE)
        if not self.recording:
            raise OSError(errno.EBADF, "tracing is off")
        text = bytes(data[:count])
        if not text.endswith(b"\n"):
            text += b"\n"
        if self.options["record-cmd"]:
            self.comm_cache.save(pid, comm[:15])
        cpu = self.writer_cpu()
        ts = self.now()
        ef = self.files.get(("ftrace", "print"))
        triggers = ef.triggers if ef is not None and ef.event is PRINT_EVENT else None
        posts = hit = None
        reserved = self.buffer.cpus[cpu]
        if triggers is not None and triggers.items:
            # the triggers see the text as written, NUL-terminated, before the newline
            raw = (raw_common(PRINT_EVENT.id, FLAGS_NONE, pid) + _QWORD.pack(0)
                   + bytes(data[:count]) + b"\0")
            hit = TriggerHit(cpu, pid, ts, lambda: comm[:15])
            posts = triggers.call(raw, hit)
        self._reserved_in(cpu, reserved).write(cpu, (ts, pid, FLAGS_NONE, PRINT_EVENT, text),
                                               16 + count + 2)
        if posts:
            triggers.post_call(posts, hit)
        return count

    # ================================================================ trace text
    def render(self, pairs: Sequence[tuple[int, tuple]], options: TraceOptions) -> str:
        """Return the trace lines of (cpu, record) pairs (output.TraceFormatter: events
        that compile their text, kprobe events with numeric arguments, by that; the rest
        by their ``render``).  With options/raw, hex or bin, the lines are in that
        mode (raw_output.py), but under function_graph, which prints every record its
        own way (6.1's print_graph_function handles them all)."""
        if options.line_mode and not self.current_tracer.prints_every_record:
            return render_line_mode(pairs, options.line_mode, options.context_info)
        with gc_paused():
            text = self.current_tracer.print_trace(self, pairs, options)
            if text is not None:
                return text
            return self._formatter(options).render(
                pairs, lambda rec: rec[3].render(rec, self, options))

    def render_runs(self, runs: Sequence[tuple[int, list]], options: TraceOptions,
                    buffer: RingBuffer | None = None) -> str:
        """:meth:`render` of what RingBuffer.runs gave: the CPUs' records merged by
        time.  Given the ``buffer`` they are from, the lines of the records the last
        call for it had too are taken from that call (TraceFormatter.render_runs:
        reading ``trace`` again formats only what is new).  A tracer that prints
        records its own way gets them merged by time."""
        if type(self.current_tracer).print_trace is not TracerPlugin.print_trace \
                or options.line_mode:
            return self.render(merge_runs(decode_runs(runs)), options)
        if self.options["latency-format"]:
            return self._render_latency(merge_runs(decode_runs(runs)), options)
        kept = None
        if buffer is not None:
            kept = self._kept_lines.get(buffer)
            if kept is None:
                kept = self._kept_lines[buffer] = KeptTrace()
        symbolize, token = self.symbols.symbolize, self.symbols.modules_token()
        find_comm = self.comm_cache.find
        with gc_paused(), self._text_caches.lend(
                (options, symbolize, token),
                lambda: new_text_caches((options, symbolize, token), find_comm,
                                        options)) as caches:
            return self._formatter(options, caches).render_runs(
                runs, lambda rec: rec[3].render(rec, self, options), kept, (options, token))

    def _render_latency(self, pairs: list[tuple[int, tuple]], options: TraceOptions) -> str:
        """``trace`` with options/latency-format: each record's text after the latency
        format's context (trace_print_lat_context), its time counted from the first
        record's (6.1: from the buffer's last reset, which is not kept here)."""
        text_only = options._replace(context_info=False)
        formatter = self._formatter(text_only)

        def general(rec: tuple) -> str:
            return rec[3].render(rec, self, text_only)
        with gc_paused():
            return render_latency(pairs, pairs[0][1][0] if pairs else 0,
                                  self.comm_cache.find,
                                  lambda rec: formatter.render(((0, rec),), general), options)

    def _formatter(self, options: TraceOptions,
                   caches: TextCaches | None = None) -> TraceFormatter:
        """A formatter of this array's records under ``options``, its texts kept in
        ``caches`` (those that reads of ``trace`` share), else its own."""
        symbolize, token = self.symbols.symbolize, self.symbols.modules_token()

        def compile_text(ev):
            compile_ = getattr(ev, "compile_text", None)
            return compile_(symbolize, token) if compile_ is not None else None
        return TraceFormatter(self.comm_cache.find, options, compile_text, caches)

    def trace_header(self, options: TraceOptions, cpu: int | None = None,
                     buffer: RingBuffer | None = None) -> str:
        buffer = buffer or self.trace_buffer()
        header = self.current_tracer.print_header(self, options)
        if header is not None:
            return header
        entries, written = buffer.counts(None)
        if self.options["latency-format"]:
            # print_trace_header of the main buffer: no maximum saved, CPU 0's data
            return latency_header(self.tracer_name, kernel_release(self.registry.kernel),
                                  entries, written, self.nr_cpus, MaxData(),
                                  self.symbols.symbolize, options)
        return format_header(self.tracer_name, entries, written, self.nr_cpus, options)
