"""The tracefs tree as FUSE-free nodes: one object per file, one per directory.

The FUSE layer mounts :func:`tracing_root` as ``tracing/`` and maps requests onto the
protocol below (:mod:`nodes` defines it and the generic nodes; :mod:`buffer_files` has
``trace``, ``snapshot`` and the pipes); every tracing decision is made here or in
:class:`registry.Tracer`.

* A directory has ``mode`` and ``children()`` (computed on each call: events come and go).
* A file has ``mode`` and ``open(flags, pid, comm)``, which returns a handle.  Opening
  with write access and ``O_TRUNC`` performs the file's "clear" action (REFERENCE.md §1)
  in ``open`` itself, so its error (``EBUSY``…) fails the open.
* A handle has ``read(size, offset)`` (content generated once per open file, so any
  offset/chunking is consistent; ``trace_pipe`` consumes instead), ``write(data, offset)``
  (one call = one write(2), parsed and applied now; errors raise OSError with Linux's
  errno), ``release()``, and for ``trace_pipe`` ``wait(timeout) -> bool``.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Any, Callable, Collection

from kprobefs.kprobes import KPROBE_FLAG_FTRACE
from kprobefs.tracing.buffer_files import (
    _SnapshotFile, _TraceFile, _TracePipeFile, _TracePipeRawFile,
)
from kprobefs.tracing.cpumask import format_cpumask, parse_cpumask
from kprobefs.tracing.events.ftrace_events import FTRACE_EVENTS, FTRACE_SYSTEM
from kprobefs.tracing.nodes import (
    MODE_DIR, MODE_READ, MODE_WRITE, MODE_WRITE_ONLY, Directory, FileHandle, Mutexes,
    TraceDir, TraceFile, TraceNode, _c_string, _File, _kstrtoul, _text_file,
)
from kprobefs.tracing.trace_array import OPTION_DEFAULTS, TraceArray
from kprobefs.tracing.events.trace_printk import printk_formats_text
from kprobefs.tracing.buffers.ring_buffer import DEFAULT_BUFFER_BYTES
from kprobefs.tracing.triggers.trigger import TRIGGER_HELP
from kprobefs.tracing.events.trace_kprobe import TraceEvent

if TYPE_CHECKING:       # the registry imports this module to build its tree
    from kprobefs.tracing.registry import Tracer

__all__ = [
    "TraceNode",
    "TraceDir",
    "TraceFile",
    "FileHandle",
    "tracing_root",
    "Directory",
    "README_TEXT",
    "HEADER_PAGE",
    "HEADER_EVENT",
    "MODE_DIR",
    "MODE_WRITE",
    "MODE_READ",
]

_PAGE_SIZE = 4096
_PID_MAX_DEFAULT = 0x8000
_U64_MAX = (1 << 64) - 1
_BLANKS = " \t\n\v\f\r"

# The kernel mutexes 6.1's handlers of these files hold; fs/hostfs.c takes them around
# the host's work (nodes.Mutexes).
_EV, _TT = ("event_mutex",), ("trace_types_lock",)
_KP, _FT, _TEXT = ("kprobe_mutex",), ("ftrace_lock",), ("text_mutex",)
#: An event's enable, filter and trigger: tracing_open_file_tr (every open), their
#: reads and writes hold event_mutex.
_EVENT_FILE = Mutexes(open=_EV, read=_EV, write=_EV)
#: A group's enable and filter: subsystem_open takes event_mutex, then
#: trace_types_lock; reads and writes hold event_mutex.
_SYSTEM_FILE = Mutexes(open=_EV + _TT, read=_EV, write=_EV)
#: set_event, set_event_pid, kprobe_events, dynamic_events, synthetic_events: the
#: listing (seq_file start), the clearing open (O_TRUNC) and the commands.
_EVENT_LIST = Mutexes(trunc=_EV, read=_EV, write=_EV)
#: kprobe_events besides registers and unregisters kprobes (kprobe_mutex), and
#: register_kprobe prepares one under text_mutex; its clearing open unregisters them.
_KPROBE_EVENTS = Mutexes(trunc=_EV + _KP, read=_EV, write=_EV + _KP + _TEXT)
#: set_ftrace_filter, set_ftrace_notrace, stack_trace_filter: t_start lists and
#: match_records matches functions under ftrace_lock.
_FTRACE_FILTER = Mutexes(read=_FT, write=_FT)
#: set_graph_function, set_graph_notrace: ftrace_graph_set_hash matches under
#: ftrace_lock (their listing takes graph_lock, which the kernel does not have).
_GRAPH_FILTER = Mutexes(write=_FT)
#: set_ftrace_pid, set_ftrace_notrace_pid: fpid_start, pid_write and the clearing
#: open's ftrace_pid_reset.
_FTRACE_PID = Mutexes(trunc=_FT, read=_FT, write=_FT)
#: current_tracer, buffer_size_kb: tracing_set_trace_read and tracing_set_tracer,
#: tracing_entries_read and tracing_resize_ring_buffer.
_TRACER_FILE = Mutexes(read=_TT, write=_TT)
#: trace_options and options/ of the core flags: trace_set_options and
#: trace_options_core_write take event_mutex, then trace_types_lock.
_OPTION_FILE = Mutexes(read=_TT, write=_EV + _TT)


def _enable_mutexes(ev) -> Mutexes:
    """What an event's ``enable`` holds: event_mutex, and for a kprobe event what
    enable_kprobe and disable_kprobe take besides to arm or disarm its kprobes:
    kprobe_mutex, then ftrace_lock for a kprobe on an ftrace site (arm_kprobe_ftrace),
    text_mutex for one armed with int3 (arm_kprobe)."""
    if not isinstance(ev, TraceEvent):
        return _EVENT_FILE
    on_ftrace = [bool(tp.entry_kprobe.flags & KPROBE_FLAG_FTRACE)
                 for tp in ev.probes if tp.registered]
    arm = (_FT if any(on_ftrace) else ()) + (_TEXT if not all(on_ftrace) else ())
    return Mutexes(open=_EV, read=_EV, write=_EV + _KP + arm)


# ----------------------------------------------------------------------- fixed texts

HEADER_PAGE = (
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:1;\n"
)
HEADER_EVENT = (
    "# compressed entry header\n"
    "\ttype_len    :    5 bits\n"
    "\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n"
    "\n"
    "\tpadding     : type == 29\n"
    "\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n"
    "\tdata max type_len  == 28\n"
)
# The dynamic-event part of Linux 6.1's README (byte-exact); the uprobe lines are left
# out because this tracer does not implement them.
_README_PROBES = (
    "  dynamic_events\t\t- Create/append/remove/show the generic dynamic events\n"
    "\t\t\t  Write into this file to define/undefine new trace events.\n"
    "  kprobe_events\t\t- Create/append/remove/show the kernel dynamic events\n"
    "\t\t\t  Write into this file to define/undefine new trace events.\n"
    "\t  accepts: event-definitions (one definition per line)\n"
    "\t   Format: p[:[<group>/][<event>]] <place> [<args>]\n"
    "\t           r[maxactive][:[<group>/][<event>]] <place> [<args>]\n"
    "\t           s:[synthetic/]<event> <field> [<field>]\n"
    "\t           e[:[<group>/][<event>]] <attached-group>.<attached-event> [<args>]"
    " [if <filter>]\n"
    "\t           -:[<group>/][<event>]\n"
    "\t    place: [<module>:]<symbol>[+<offset>]|<memaddr>\n"
    "place (kretprobe): [<module>:]<symbol>[+<offset>]%return|<memaddr>\n"
    "\t     args: <name>=fetcharg[:type]\n"
    "\t fetcharg: (%<register>|$<efield>), @<address>, @<symbol>[+|-<offset>],\n"
    "\t           $stack<index>, $stack, $retval, $comm, $arg<N>,\n"
    "\t           +|-[u]<offset>(<fetcharg>), \\imm-value, \\\"imm-string\"\n"
    "\t     type: s8/16/32/64, u8/16/32/64, x8/16/32/64, string, symbol,\n"
    "\t           b<bit-width>@<bit-offset>/<container-size>, ustring,\n"
    "\t           symstr, <type>\\[<array-size>\\]\n"
    "\t    field: <stype> <name>;\n"
    "\t    stype: u8/u16/u32/u64, s8/s16/s32/s64, pid_t,\n"
    "\t           [unsigned] char/int/long\n"
    "\t    efield: For event probes ('e' types), the field is on of the fields\n"
    "\t            of the <attached-group>/<attached-event>.\n"
    "  synthetic_events\t- Create/append/remove/show synthetic events\n"
    "\t  Write into this file to define/undefine new synthetic events.\n"
    "\t     example: echo 'myevent u64 lat; char name[]' >> synthetic_events\n"
)

# The trigger and hist syntax (events/<system>/<event>/trigger and hist), in the terms
# 6.1's README uses, which tools look for.
_README_TRIGGERS = (
    "  events/<system>/<event>/trigger - commands run when the event is hit\n"
    "\t    Format: <trigger>[:count][if <filter>]\n"
    "\t   trigger: traceon, traceoff, stacktrace, snapshot,\n"
    "\t            enable_event:<system>:<event>, disable_event:<system>:<event>,\n"
    "\t            enable_hist:<system>:<event>, disable_hist:<system>:<event>,\n"
    "\t            hist; '!<trigger>' removes one\n"
    "      hist trigger\t- hits summed in a table, read from the event's hist file\n"
    "\t    Format: hist:keys=<field1[,field2,...]>\n"
    "\t            [:<var1>=<field|var_ref|numeric_literal>[,<var2>=...]]\n"
    "\t            [:values=<field1[,field2,...]>]\n"
    "\t            [:sort=<field1[,field2,...]>]\n"
    "\t            [:size=#entries]\n"
    "\t            [:pause][:continue][:clear]\n"
    "\t            [:name=histname1]\n"
    "\t            [:<handler>.<action>]\n"
    "\t            [if <filter>]\n"
    "\t    fields: event fields, common_timestamp, common_cpu, stacktrace (keys)\n"
    "\t    modifiers: .hex .sym .sym-offset .execname .syscall .log2\n"
    "\t               .buckets=size .usecs .percent .graph\n"
    "\t    handlers: onmatch(matching.event), onmax(var), onchange(var)\n"
    "\t    actions: trace(<synthetic_event>,param list), <synthetic_event>(params),\n"
    "\t             save(field,...), snapshot()\n"
)

# The function tracer's and the stack tracer's files, listed when the kernel has them.
_README_FUNCTIONS = (
    "  set_ftrace_filter\t- function names (or globs) the function tracer traces\n"
    "\t\t\t  (empty: all); !name removes one; echo > clears\n"
    "\t     accepts: func_full_name or glob-matching-pattern\n"
    "  set_ftrace_notrace\t- function names (or globs) it never traces\n"
    "  stack_trace\t\t- Shows the max stack trace when active\n"
    "  stack_max_size\t- Shows current max stack size that was traced\n"
    "\t\t\t  Write into this file to reset the max size (trigger a\n"
    "\t\t\t  new trace)\n"
    "  stack_trace_filter\t- Like set_ftrace_filter but limits what stack_trace\n"
    "\t\t\t  traces (echo 1 > /proc/sys/kernel/stack_tracer_enabled)\n"
)

# The function_graph tracer's files (6.1's words), listed before the stack tracer's.
_README_GRAPH = (
    "  set_graph_function\t- Trace the nested calls of a function (function_graph)\n"
    "  set_graph_notrace\t- Do not trace the nested calls of a function (function_graph)\n"
    "  max_graph_depth\t- Trace a limited depth of nested calls (0 is unlimited)\n"
)

README_TEXT = (
    "tracing mini-HOWTO:\n\n"
    "# echo 0 > tracing_on : stop recording into the buffer\n"
    "# echo 1 > tracing_on : resume recording\n\n"
    " Files:\n"
    "  trace\t\t\t- what the buffer holds, read without consuming it\n"
    "\t\t\t  echo > trace empties the buffer\n"
    "  trace_pipe\t\t- the same lines, each consumed by the read that returns it\n"
    "  per_cpu/cpuN/\t\t- trace, trace_pipe, trace_pipe_raw, stats and buffer_size_kb of one CPU\n"
    "  current_tracer\t- the tracer in use\n"
    "  available_tracers\t- tracers current_tracer accepts\n"
    "  error_log\t- why recent commands failed (echo > error_log clears it)\n"
    "  buffer_size_kb\t- size of each CPU's buffer, in KiB\n"
    "  buffer_total_size_kb  - size of all CPU buffers together\n"
    "  trace_clock\t\t- the clock that stamps records: local global counter\n"
    "\t\t\t  uptime perf mono mono_raw boot tai x86-tsc\n"
    "  trace_marker\t\t- text written here is recorded as a trace line\n"
    "  trace_marker_raw\t- a 4-byte id and binary data written here are recorded as\n"
    "\t\t\t  one raw_data record\n"
    "  snapshot\t\t- Like 'trace' but shows the content of the static\n"
    "\t\t\t  snapshot buffer. Read the contents for more\n"
    "\t\t\t  information\n"
    "  options/\t\t- one file per output or recording option (0 or 1)\n"
    "  available_filter_functions - functions with an ftrace site\n"
    "  available_events\t- every event as <group>:<event>\n"
    "  set_event\t\t- write [!]<group>:<event> to enable (disable) events\n"
    "  kprobe_profile\t- hits and misses of every kprobe event probe\n"
    "  events/\t\t- enable, filter, format, id, trigger, hist of every event, by group\n"
    + _README_TRIGGERS
    + _README_PROBES
)


def _ftrace_event_dir(event) -> Directory:
    files = {"format": _text_file(lambda: event.format), "hist": _text_file(lambda: "")}
    if event.has_id_file:
        files["id"] = _text_file(lambda: f"{event.id}\n")
    return Directory(files)


#: events/ftrace: the ftrace system's own events, the same in every trace array.
_FTRACE_DIR = Directory({name: _ftrace_event_dir(event)
                         for name, event in FTRACE_EVENTS.items()})


# ----------------------------------------------------------------------- the tree

def tracing_root(tracer: Tracer) -> Directory:
    """Return the directory the FUSE layer mounts as ``tracing/``."""
    return _Root(tracer, tracer.top).directory


class _Root:
    """Builds every node of one trace array's directory: ``tracing/`` itself for the
    top array, with the files only the top level has, or ``instances/NAME``."""

    def __init__(self, tracer: Tracer, tr: TraceArray):
        self.tracer = tracer
        self.tr = tr
        # Per group, each event's directory as last listed, with the event it was made
        # for: a lookup under events/GROUP lists the group, and 10,000 kprobe events
        # must not cost 10,000 new directories per lookup.
        self._event_dirs: dict[str, dict[str, tuple[Any, Directory]]] = {}
        self._ftrace_events: Directory | None = None
        t = tracer
        self.files: dict[str, Any] = {
            "trace": _TraceFile(tr, None),
            "trace_pipe": _TracePipeFile(tr, None),
            "snapshot": _SnapshotFile(tr, None),
            "tracing_on": _File(MODE_WRITE, read=lambda: f"{int(tr.tracing_on)}\n",
                                write=self._write_tracing_on,
                                mutexes=Mutexes(write=_TT)),    # rb_simple_write
            "trace_marker": _File(MODE_WRITE_ONLY,
                                  write=lambda d, p, c: tr.write_marker(d, p, c)),
            "trace_marker_raw": _File(MODE_WRITE_ONLY, write=tr.write_marker_raw),
            "buffer_size_kb": _File(MODE_WRITE, read=lambda: self._size_text(None),
                                    write=lambda d, p, c: self._write_size(d, None),
                                    mutexes=_TRACER_FILE),
            "buffer_total_size_kb": _text_file(self._total_size_text),
            "buffer_percent": _File(MODE_WRITE, read=lambda: f"{tr.buffer_percent}\n",
                                    write=self._write_buffer_percent),
            "trace_clock": _File(MODE_WRITE, read=self._clock_text,
                                 write=self._write_clock,
                                 mutexes=Mutexes(write=_TT)),    # tracing_set_clock
            "current_tracer": _File(MODE_WRITE, read=lambda: f"{tr.tracer_name}\n",
                                    write=self._write_tracer, mutexes=_TRACER_FILE),
            "available_tracers": _text_file(
                lambda: " ".join(tr.available_tracers()) + "\n"),
            "available_events": _text_file(t.available_event_lines),
            "set_event": _File(MODE_WRITE, read=tr.enabled_event_lines,
                               write=lambda d, p, c: tr.set_event_tokens(d),
                               trunc=lambda: tr.set_events_enabled(False, allow_none=True),
                               mutexes=_EVENT_LIST),
            "error_log": _File(MODE_WRITE, read=tr.error_log.text,
                               write=lambda d, p, c: len(d), trunc=tr.error_log.clear),
            "tracing_cpumask": _File(
                MODE_WRITE, read=lambda: format_cpumask(tr.tracing_cpumask(), tr.nr_cpus),
                write=self._write_cpumask),
            "trace_options": _File(MODE_WRITE, read=tr.trace_options_text,
                                   write=lambda d, p, c: tr.write_trace_option(d),
                                   mutexes=_OPTION_FILE),
            "timestamp_mode": _text_file(lambda: "[delta] absolute\n"),
            # No latency tracer here updates it: it keeps what is written.
            "tracing_max_latency": self._usecs_file(tr, "max_latency_ns"),
            "set_event_pid": self._pid_file(tr.event_pids, False, mutexes=_EVENT_LIST),
            "set_event_notrace_pid": self._pid_file(tr.event_pids, True,
                                                    mutexes=_EVENT_LIST),
            "options": Directory(self._options),
            "per_cpu": Directory(self._per_cpu),
            "events": Directory(self._events),
        }
        if tr.function_tracer is not None:
            functions = tr.function_tracer
            self.files["set_ftrace_filter"] = self._filter_file(functions.filter)
            self.files["set_ftrace_notrace"] = self._filter_file(functions.notrace)
            self.files["set_ftrace_pid"] = self._pid_file(functions.pids, False, "no pid\n",
                                                          _FTRACE_PID)
            self.files["set_ftrace_notrace_pid"] = self._pid_file(functions.pids, True,
                                                                  "no pid\n", _FTRACE_PID)
        if tr.is_top:
            self._add_top_files()
        self.directory = Directory(self.files)

    def _add_top_files(self) -> None:
        """The files only the top level has: the event definitions, the stack tracer's
        files, README, the saved comms, ``tracing_thresh``, ``instances/``."""
        t = self.tracer
        readme = README_TEXT
        if t.function_tracer is not None:
            at = readme.index("  available_events")
            readme = readme[:at] + _README_FUNCTIONS + readme[at:]
        if t.graph_tracer is not None:
            at = readme.index("  stack_trace\t")
            readme = readme[:at] + _README_GRAPH + readme[at:]
        self.files.update({
            "README": _text_file(lambda: readme),
            "kprobe_events": _File(MODE_WRITE, read=t.probe_lines,
                                   write=lambda d, p, c: t.run_commands(d),
                                   trunc=t.release_all, mutexes=_KPROBE_EVENTS),
            "dynamic_events": _File(MODE_WRITE, read=t.dynamic_lines,
                                    write=lambda d, p, c: t.run_commands(
                                        d, dynamic_events=True),
                                    trunc=t.release_all_dynamic, mutexes=_EVENT_LIST),
            "synthetic_events": _File(MODE_WRITE, read=t.synth_lines,
                                      write=lambda d, p, c: t.run_synth_commands(d),
                                      trunc=t.release_all_synthetic, mutexes=_EVENT_LIST),
            "kprobe_profile": _text_file(t.profile_text),
            "available_filter_functions": _File(MODE_READ, read=lambda: "".join(
                f"{name}\n" for name in t.symbols.ftrace_functions()),
                mutexes=Mutexes(read=_FT)),     # t_start
            "saved_cmdlines": _text_file(t.comm_cache.saved_cmdlines),
            "saved_tgids": _text_file(t.comm_cache.saved_tgids),
            "saved_cmdlines_size": _File(MODE_WRITE, read=lambda: f"{t.comm_cache.size}\n",
                                         write=self._write_cmdlines_size),
            "tracing_thresh": self._usecs_file(t, "tracing_thresh_ns"),
            # trace_printk() formats (the kernel has no tracepoint strings)
            "printk_formats": _text_file(
                lambda: printk_formats_text(t.trace_printk.formats())
                if t.trace_printk is not None else ""),
            "instances": _InstancesDir(t),
        })
        if t.graph_tracer is not None:
            graph = t.graph_tracer
            self.files["set_graph_function"] = self._filter_file(graph.graph_filter,
                                                                 _GRAPH_FILTER)
            self.files["set_graph_notrace"] = self._filter_file(graph.graph_notrace,
                                                                _GRAPH_FILTER)
            self.files["max_graph_depth"] = _File(
                MODE_WRITE, read=graph.max_depth_text,
                write=lambda d, p, c: self._locked_number(graph.set_max_depth, d))
        if t.function_profiler is not None:
            profiler = t.function_profiler
            self.files["function_profile_enabled"] = _File(
                MODE_WRITE, read=profiler.enabled_text,
                write=lambda d, p, c: self._locked_number(
                    lambda value: profiler.set_enabled(bool(value)), d))
            self.files["trace_stat"] = Directory({
                f"function{cpu}": _text_file(lambda cpu=cpu: profiler.stat_text(cpu))
                for cpu in range(profiler.nr_cpus)})
        if t.stack_tracer is not None:
            stack = t.stack_tracer
            self.files["stack_trace"] = _text_file(stack.trace_text)
            self.files["stack_max_size"] = _File(
                MODE_WRITE, read=stack.max_size_text,
                write=lambda d, p, c: self._write_stack_max(d))
            self.files["stack_trace_filter"] = self._filter_file(stack.filter)

    def _filter_file(self, hash_, mutexes: Mutexes = _FTRACE_FILTER) -> _File:
        """A function filter file (set_ftrace_filter and its kin): O_TRUNC clears it,
        each write adds (``!``: removes) functions; changes apply now, under the event
        lock, since they patch ftrace sites."""
        lock = self.tracer.lock

        def write(data: bytes, pid: int, comm: str) -> int:
            with lock:
                return hash_.write(data)

        def trunc() -> None:
            with lock:
                hash_.clear()
        return _File(MODE_WRITE, read=hash_.text, write=write, trunc=trunc,
                     mutexes=mutexes)

    def _pid_file(self, pids, notrace: bool, empty: str = "",
                  mutexes: Mutexes | None = None) -> _File:
        """``set_event_pid``, ``set_ftrace_pid`` and their ``notrace`` kin over a
        :class:`~kprobefs.tracing.pid_filter.PidFilter`; ``empty`` is read when the set
        is."""
        lock = self.tracer.lock

        def write(data: bytes, pid: int, comm: str) -> int:
            with lock:
                return pids.write(notrace, data)

        def trunc() -> None:
            with lock:
                pids.clear(notrace)
        return _File(MODE_WRITE, write=write, trunc=trunc, read=lambda: pids.text(
            pids.notrace_pids if notrace else pids.pids) or empty, mutexes=mutexes)

    @staticmethod
    def _usecs_file(owner, attr: str) -> _File:
        """``tracing_max_latency`` / ``tracing_thresh``: written in microseconds
        (kstrtoul base 10), kept in nanoseconds in ``owner.attr``, read in µs."""
        def read() -> str:
            ns = getattr(owner, attr)
            if ns == _U64_MAX:
                return "-1\n"
            us = ns // 1000
            return f"{us - (1 << 64) if us >> 63 else us}\n"

        def write(data: bytes, pid: int, comm: str) -> int:
            setattr(owner, attr, _kstrtoul(data, 10) * 1000 & _U64_MAX)
            return len(data)
        return _File(MODE_WRITE, read=read, write=write)

    def _locked_number(self, apply: Callable[[int], None], data: bytes) -> int:
        """A file that takes one unsigned decimal (kstrtoul base 10), applied under the
        event lock (it may patch ftrace sites)."""
        value = _kstrtoul(data, 10)
        with self.tracer.lock:
            apply(value)
        return len(data)

    def _write_cpumask(self, data: bytes, pid: int, comm: str) -> int:
        self.tr.set_tracing_cpumask(parse_cpumask(data, self.tr.nr_cpus))
        return len(data)

    def _write_cmdlines_size(self, data: bytes, pid: int, comm: str) -> int:
        size = _kstrtoul(data, 10)
        if not size or size > _PID_MAX_DEFAULT:
            raise OSError(errno.EINVAL, "saved_cmdlines_size takes 1 to 32768")
        with self.tracer.lock:
            self.tracer.comm_cache.resize(size)
        return len(data)

    def _write_stack_max(self, data: bytes) -> int:
        self.tracer.stack_tracer.set_max_size(_kstrtoul(data, 10))
        return len(data)

    # ---------------------------------------------------------------- small files
    def _write_tracing_on(self, data: bytes, pid: int, comm: str) -> int:
        value = _kstrtoul(data, 10)
        if bool(value) != self.tr.tracing_on:
            self.tr.set_tracing_on(bool(value))
        return len(data)

    def _write_buffer_percent(self, data: bytes, pid: int, comm: str) -> int:
        """How full a CPU's buffer must be before poll(2) on its pipes says readable
        (0 to 100, base 10)."""
        value = _kstrtoul(data, 10)
        if value > 100:
            raise OSError(errno.EINVAL, "buffer_percent is at most 100")
        self.tr.buffer_percent = value
        return len(data)

    def _size_text(self, cpu: int | None) -> str:
        buffer = self.tr.buffer
        if cpu is not None:
            return f"{buffer.size_kb(cpu)}\n"
        sizes = {buffer.size_kb(c) for c in range(buffer.nr_cpus)}
        if len(sizes) > 1:
            return "X\n"
        size = sizes.pop()
        if not buffer.expanded:
            return f"{size} (expanded: {DEFAULT_BUFFER_BYTES >> 10})\n"
        return f"{size}\n"

    def _total_size_text(self) -> str:
        buffer = self.tr.buffer
        total = sum(buffer.size_kb(c) for c in range(buffer.nr_cpus))
        if not buffer.expanded:
            return f"{total} (expanded: {(DEFAULT_BUFFER_BYTES >> 10) * buffer.nr_cpus})\n"
        return f"{total}\n"

    def _write_size(self, data: bytes, cpu: int | None) -> int:
        kb = _kstrtoul(data, 10)
        if not kb:
            raise OSError(errno.EINVAL, "size must be positive")
        self.tr.resize_kb(kb, cpu)
        return len(data)

    def _clock_text(self) -> str:
        current = self.tr.trace_clock
        return " ".join(f"[{name}]" if name == current else name
                        for name in self.tracer.clocks) + "\n"

    def _write_clock(self, data: bytes, pid: int, comm: str) -> int:
        name = _c_string(data[:63]).decode("latin-1").strip(_BLANKS)
        self.tr.set_trace_clock(name)
        return len(data)

    def _write_tracer(self, data: bytes, pid: int, comm: str) -> int:
        name = _c_string(data[:100]).decode("latin-1").strip(_BLANKS)
        self.tr.set_current_tracer(name)
        return len(data)

    # ------------------------------------------------------------------- options
    def _options(self) -> dict[str, Any]:
        files = {name: _File(MODE_WRITE, read=self._option_reader(name),
                             write=self._option_writer(name),
                             mutexes=Mutexes(write=_OPTION_FILE.write))
                 for name in sorted(OPTION_DEFAULTS)}
        for name, tracer in self.tr.tracer_flags().items():
            # trace_options_write: trace_types_lock only
            files[name] = _File(MODE_WRITE, read=lambda t=tracer, n=name: f"{int(t.flags[n])}\n",
                                write=self._option_writer(name, tracer),
                                mutexes=Mutexes(write=_TT))
        return files

    def _option_reader(self, name: str):
        return lambda: f"{int(self.tr.options[name])}\n"

    def _option_writer(self, name: str, tracer=None):
        """options/NAME: 0 or 1; ``tracer``: one of that tracer's own options."""
        def write(data: bytes, pid: int, comm: str) -> int:
            value = _kstrtoul(data, 10)
            if value not in (0, 1):
                raise OSError(errno.EINVAL, "option takes 0 or 1")
            if tracer is not None:
                self.tr.set_tracer_flag(tracer, name, bool(value))
            else:
                self.tr.set_option(name, bool(value))
            return len(data)
        return write

    # ------------------------------------------------------------------- per_cpu
    def _per_cpu(self) -> dict[str, Any]:
        return {f"cpu{cpu}": Directory({
            "trace": _TraceFile(self.tr, cpu),
            "trace_pipe": _TracePipeFile(self.tr, cpu),
            "trace_pipe_raw": _TracePipeRawFile(self.tr, cpu),
            "snapshot": _SnapshotFile(self.tr, cpu),
            "snapshot_raw": _TracePipeRawFile(self.tr, cpu, snapshot=True),
            "stats": _text_file(self._cpu_stats(cpu)),
            "buffer_size_kb": _File(MODE_WRITE, read=self._cpu_size(cpu),
                                    write=self._cpu_size_writer(cpu),
                                    mutexes=_TRACER_FILE),
        }) for cpu in range(self.tr.nr_cpus)}

    def _cpu_stats(self, cpu: int):
        def produce() -> str:
            t = self.tr
            entries, overrun, used, dropped, oldest, read = t.buffer.stats(cpu)
            clock = t.clocks[t.trace_clock]
            now = clock.read()
            if clock.in_ns:
                times = (f"oldest event ts: {_seconds(oldest)}\n" if oldest is not None
                         else "") + f"now ts: {_seconds(now)}\n"
            else:
                times = (f"oldest event ts: {oldest}\n" if oldest is not None else "")
                times += f"now ts: {now}\n"
            return (f"entries: {entries}\noverrun: {overrun}\ncommit overrun: 0\n"
                    f"bytes: {used}\n{times}"
                    f"dropped events: {dropped}\nread events: {read}\n")
        return produce

    def _cpu_size(self, cpu: int):
        return lambda: self._size_text(cpu)

    def _cpu_size_writer(self, cpu: int):
        return lambda data, pid, comm: self._write_size(data, cpu)

    # -------------------------------------------------------------------- events
    def _events(self) -> dict[str, Any]:
        t = self.tracer
        entries: dict[str, Any] = {
            "enable": _File(MODE_WRITE, read=lambda: self.tr.enable_state() + "\n",
                            write=self._group_enable_writer(None),
                            mutexes=Mutexes(read=_EV, write=_EV)),
            "header_page": _text_file(lambda: HEADER_PAGE),
            "header_event": _text_file(lambda: HEADER_EVENT),
        }
        with t.lock:
            groups = list(t.groups)
        for group in groups:
            entries[group] = Directory(self._group_entries(group))
        for gone in self._event_dirs.keys() - set(groups):
            self._event_dirs.pop(gone, None)
        entries[FTRACE_SYSTEM] = self._ftrace_dir()
        return entries

    def _group_enable_writer(self, group: str | None):
        def write(data: bytes, pid: int, comm: str) -> int:
            value = _kstrtoul(data, 10)
            if value not in (0, 1):
                raise OSError(errno.EINVAL, "enable takes 0 or 1")
            self.tr.update_buffers()
            self.tr.set_events_enabled(bool(value), group=group,
                                           allow_none=group is None)
            return len(data)
        return write

    def _group_entries(self, group: str):
        t = self.tracer

        def entries() -> dict[str, Any]:
            out: dict[str, Any] = {
                "enable": _File(MODE_WRITE,
                                read=lambda: self.tr.enable_state(group) + "\n",
                                write=self._group_enable_writer(group),
                                mutexes=_SYSTEM_FILE),
                "filter": _File(MODE_WRITE, read=lambda: self._group_filter_text(group),
                                write=self._group_filter_writer(group),
                                mutexes=_SYSTEM_FILE),
            }
            with t.lock:
                evs = [ev for ev in t.events.values() if ev.group == group]
            known = self._event_dirs.get(group, {})
            dirs = {}
            for ev in evs:
                found = known.get(ev.name)
                if found is None or found[0] is not ev:     # new, or made again
                    found = (ev, Directory(self._event_entries(group, ev.name)))
                dirs[ev.name] = found
                out[ev.name] = found[1]
            self._event_dirs[group] = dirs
            return out
        return entries

    def _group_filter_text(self, group: str) -> str:
        text = self.tr.group_filter_text.get(group)
        if text is not None:
            return text + "\n"
        return ("### global filter ###\n"
                "# Use this to set filters for multiple events.\n"
                "# Only events with the given fields will be affected.\n"
                "# If no events are modified, an error message will be displayed here\n")

    def _group_filter_writer(self, group: str):
        def write(data: bytes, pid: int, comm: str) -> int:
            if len(data) >= _PAGE_SIZE:
                raise OSError(errno.EINVAL, "filter too long")
            text = _c_string(data).decode("latin-1").rstrip(_BLANKS)
            self.tr.set_group_filter(group, text)
            return len(data)
        return write

    def _event_entries(self, group: str, name: str):
        def event() -> TraceEvent:
            ev = self.tracer.events.get((group, name))
            if ev is None:
                raise OSError(errno.ENODEV, "event removed")
            return ev

        def write_enable(data: bytes, pid: int, comm: str) -> int:
            value = _kstrtoul(data, 10)
            self.tr.update_buffers()
            if value not in (0, 1):
                raise OSError(errno.EINVAL, "enable takes 0 or 1")
            self.tr.set_enabled(event(), bool(value))
            return len(data)

        def write_filter(data: bytes, pid: int, comm: str) -> int:
            if len(data) >= _PAGE_SIZE:
                raise OSError(errno.EINVAL, "filter too long")
            text = _c_string(data).decode("latin-1").rstrip(_BLANKS)
            self.tr.set_filter(event(), text)
            return len(data)

        def read_filter() -> str:
            text = self.tr.filter_text(event())
            return ("none" if text is None else text) + "\n"

        def entries() -> dict[str, Any]:
            return {
                "enable": _File(MODE_WRITE, read=lambda: self.tr.enable_text(event()),
                                write=write_enable,
                                mutexes=_enable_mutexes(self.tracer.events.get(
                                    (group, name)))),
                "filter": _File(MODE_WRITE, read=read_filter, write=write_filter,
                                mutexes=_EVENT_FILE),
                "format": _text_file(lambda: event().format_text()),
                "id": _text_file(lambda: f"{event().id}\n"),
                **self._trigger_files(event),
            }
        return entries

    def _trigger_files(self, event: Callable[[], Any]) -> dict[str, Any]:
        """An event's ``trigger`` and ``hist`` files in this array."""
        def write_trigger(data: bytes, pid: int, comm: str) -> int:
            if len(data) >= _PAGE_SIZE:
                raise OSError(errno.EINVAL, "trigger too long")
            text = _c_string(data).decode("latin-1").strip(_BLANKS)
            self.tr.set_triggers(event(), text)     # "" names no command: EINVAL
            return len(data)

        def read_triggers() -> str:
            triggers = self.tr.triggers_of(event())
            return triggers.text() if triggers is not None else TRIGGER_HELP

        def read_hist() -> str:
            triggers = self.tr.triggers_of(event())
            return triggers.hist_text() if triggers is not None else ""

        return {
            "trigger": _File(MODE_WRITE, read=read_triggers, write=write_trigger,
                             trunc=lambda: self.tr.truncate_triggers(event()),
                             mutexes=_EVENT_FILE),
            "hist": _text_file(read_hist),
        }

    def _ftrace_dir(self) -> Directory:
        """``events/ftrace``: the ftrace system's own events; ``print`` (trace_marker's
        event) has this array's ``trigger`` and ``hist`` (init_tracer_tracefs)."""
        if self._ftrace_events is None:
            marker = self.tr.marker_event
            dirs = dict(_FTRACE_DIR.children())
            print_files = dict(dirs["print"].children())
            print_files.update(self._trigger_files(lambda: marker))
            dirs["print"] = Directory(print_files)
            self._ftrace_events = Directory(dirs)
        return self._ftrace_events


def _seconds(ns: int) -> str:
    return f"{ns // 1_000_000_000:5d}.{ns // 1000 % 1_000_000:06d}"


# ---------------------------------------------------------------------- instances

class _InstancesDir:
    """``instances/``: one directory per trace array but the top one.  ``mkdir(name)``
    makes an instance and ``rmdir(name)`` removes one (hostfs's MKDIR and RMDIR
    hypercalls, as tracefs calls instance_mkdir and instance_rmdir)."""

    mode = MODE_DIR
    #: instance_mkdir and instance_rmdir take event_mutex, then trace_types_lock.
    mutexes = Mutexes(write=_EV + _TT)

    def __init__(self, tracer: Tracer):
        self.tracer = tracer
        self._dirs: dict[TraceArray, _RefDir] = {}

    def children(self) -> dict[str, Any]:
        with self.tracer.lock:
            dirs = {}
            for tr in self.tracer.instances.values():
                node = self._dirs.get(tr)
                dirs[tr] = node or _RefDir(_Root(self.tracer, tr).directory, tr)
            self._dirs = dirs
        return {tr.name: node for tr, node in dirs.items()}

    def mkdir(self, name: str, mode: int) -> None:
        self.tracer.new_instance(name)

    def rmdir(self, name: str) -> None:
        self.tracer.remove_instance(name)


class _RefDir:
    """A directory of an instance: each file opened below it holds a reference on the
    instance (``tr.ref``, Linux's trace_array_get), so that rmdir is EBUSY meanwhile."""

    mode = MODE_DIR

    def __init__(self, inner: Any, tr: TraceArray):
        self._inner = inner
        self.tr = tr

    @property
    def fixed_names(self) -> Collection[str]:
        return getattr(self._inner, "fixed_names", ())

    def children(self) -> dict[str, Any]:
        return {name: (_RefDir(node, self.tr) if hasattr(node, "children")
                       else _RefFile(node, self.tr))
                for name, node in self._inner.children().items()}


class _RefFile:
    def __init__(self, inner: Any, tr: TraceArray):
        self._inner = inner
        self.tr = tr
        self.mode = inner.mode
        self.mutexes = getattr(inner, "mutexes", None)

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        tr = self.tr
        with tr.lock:
            if tr.registry.instances.get(tr.name) is not tr:
                raise OSError(errno.ENODEV, "instance removed")
            tr.ref += 1
        try:
            return _RefHandle(self._inner.open(flags, pid, comm), tr)
        except BaseException:
            with tr.lock:
                tr.ref -= 1
            raise


class _RefHandle:
    """An open file of an instance: the inner handle, and the reference it holds."""

    def __init__(self, inner: FileHandle, tr: TraceArray | None):
        self._inner = inner
        self._tr = tr

    def read(self, size: int, offset: int) -> bytes:
        return self._inner.read(size, offset)

    def write(self, data: bytes, offset: int) -> int:
        return self._inner.write(data, offset)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)       # wait(), for the pipes

    def release(self) -> None:
        try:
            self._inner.release()
        finally:
            tr, self._tr = self._tr, None
            if tr is not None:
                with tr.lock:
                    tr.ref -= 1
