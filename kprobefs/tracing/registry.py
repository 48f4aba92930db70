"""The event registry and the trace arrays: :class:`Tracer`.

:class:`Tracer` is the one registry of dynamic events shared by every trace array
(Linux's dyn_event list and ``ftrace_events``): kprobe events (:mod:`trace_kprobe`) and
synthetic events (:mod:`synth`), created, appended and deleted in Linux's order and with
its errno map (§2.3–§2.6); their probes, registered with the kprobes engine; and the
trace arrays (:mod:`trace_array`): the top level, :attr:`Tracer.top`, and the instances
made under ``instances/``.  An event's probes are armed while its file is armed in any
array (enabled, or in soft mode for triggers), and a hit records into each array it is
enabled in and runs the triggers of each array it has some in.  The kernel's recorder
(:mod:`native`) records an event in kernel code when it is enabled in the top array
only, with no triggers there; otherwise the host's handler records it.  The kernel's
own static events (:mod:`trace_events`, ``sched``, ``syscalls`` …) are in the registry
too, for every array: the kernel records them into the top array, and hands the host
each record of one enabled in an instance, which files it there
(:meth:`Tracer._static_record`).

The commands that create and delete dynamic events, and their listings, are
:class:`~kprobefs.tracing.events.trace_dynevent.DynamicEvents`, which Tracer inherits
(Linux's trace_dynevent.c beside trace_events.c); this module keeps the arrays, the
enable state, the kernel recorder's glue and the hit path.

It talks to the kprobes engine only through ``register_kprobe`` and friends, to the
emulated kernel only through what a handler may read (memory, current task, CPU,
symbols), and creates event directories through an injected ``create_dir_hook``.
Control operations take :attr:`Tracer.lock` (Linux's event_mutex); the probe-hit path
takes only the ring buffers' locks.

The attributes and methods of the top array (``buffer``, ``options``, ``set_enabled`` …)
are also reachable on the Tracer, for the callers that know only one array.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from typing import Any, Callable, Iterable

from kprobefs.errors import ImageError, MachineError
from kprobefs.tracing.buffers.clocks import trace_clocks
from kprobefs.tracing.tracers.ftrace_probes import (
    NO_ARRAY_COMMANDS, FunctionProbes, lat_context,
)
from kprobefs.tracing.tracers.function import FunctionTracer, StackTracer
from kprobefs.tracing.tracers.function_graph import FunctionGraphTracer
from kprobefs.tracing.tracers.function_profile import FunctionProfiler
from kprobefs.tracing.buffers.output import CommCache, format_ip_sym
from kprobefs.tracing.buffers.native import NativeRecorder
from kprobefs.tracing.files import tracing_root
from kprobefs.tracing.symbols import KernelSymbols
from kprobefs.tracing.events.synth import SynthEvent
from kprobefs.tracing.events.trace_dynevent import (
    COMMAND_WRITE_CHUNK, FIRST_EVENT_ID, KPROBE_FLAG_GONE, MAX_DYNAMIC_EVENTS, DynamicEvents,
    Group,
)
from kprobefs.tracing.events.trace_eprobe import EprobeEvent
from kprobefs.tracing.events.trace_events import StaticEvents
from kprobefs.tracing.events.trace_printk import TracePrintk
from kprobefs.tracing.trace_array import OPTION_DEFAULTS, STACK_EVENT, EventFile, TraceArray
from kprobefs.tracing.tracers.plugin import TracerFactory
from kprobefs.tracing.events.trace_kprobe import (
    TraceEvent, TraceProbe, is_call_return, make_recorder, unwind,
)
from kprobefs.tracing.triggers.trigger import TriggerHit

__all__ = [
    "Tracer",
    "TraceEvent",
    "TraceProbe",
    "TraceArray",
    "EventFile",
    "KernelSymbols",
    "OPTION_DEFAULTS",
    "FIRST_EVENT_ID",
    "MAX_DYNAMIC_EVENTS",
    "COMMAND_WRITE_CHUNK",
]

_log = logging.getLogger("kprobefs.tracing")

#: What one printk of an ftrace dump carries (TRACE_MAX_PRINT).
_DUMP_LINE_MAX = 1000

# Engine flag bits (Linux's KPROBE_FLAG_*).
KPROBE_FLAG_GONE = 1
_KPROBE_FLAG_DISABLED = 2

# Event names that are taken by the kernel's own (non-kprobe) events: a probe may not
# use them (EVENT_EXIST).  The ftrace internal events exist on every kernel.
_RESERVED_EVENTS = frozenset(("ftrace", name) for name in (
    "function", "funcgraph_entry", "funcgraph_exit", "context_switch", "wakeup",
    "kernel_stack", "user_stack", "bprint", "print", "raw_data", "bputs", "mmiotrace_rw",
    "mmiotrace_map", "branch", "hwlat", "func_repeats", "osnoise", "timerlat"))

def _default_clock() -> Callable[[], int]:
    start = time.monotonic_ns()
    return lambda: time.monotonic_ns() - start


# ------------------------------------------------------------------------- the tracer

class Tracer(DynamicEvents):
    """The event registry behind ``tracing/``, and its trace arrays: :attr:`top` and
    :attr:`instances` (by name).

    ``engine`` has Linux's kprobe API (``register_kprobe`` … ``disable_kretprobe``);
    ``kernel`` offers ``read``, ``current_pid``, ``current_comm``, ``cpu.index``,
    ``nr_cpus`` and ``image``.  ``clock()`` returns nanoseconds since boot, the
    ``local`` trace clock (default: the kernel's TSC clock ``trace_clock``, which its
    recorder reads too, else ``time.monotonic_ns`` since construction); the others
    (tracing/buffers/clocks.py) follow the kernel's ``clock_ns`` (ktime), or this one.
    ``create_dir_hook(name, parent)`` makes a tracefs directory in the emulated kernel
    and returns a handle (``parent`` is ``None`` for a group directory under
    ``events/``, else the group's handle);
    ``remove_dir_hook(handle)`` undoes it.  ``kprobe_factory`` / ``kretprobe_factory``
    build engine probe objects (default: :mod:`kprobefs.kprobes`' classes).
    """

    def __init__(self, engine, kernel, *, clock: Callable[[], int] | None = None,
                 create_dir_hook: Callable[[str, Any], Any] | None = None,
                 remove_dir_hook: Callable[[Any], None] | None = None,
                 nr_cpus: int | None = None, pointer_key: bytes | None = None,
                 first_event_id: int = FIRST_EVENT_ID,
                 kprobe_factory: Callable[..., Any] | None = None,
                 kretprobe_factory: Callable[..., Any] | None = None,
                 reserved_events: Iterable[tuple[str, str]] = _RESERVED_EVENTS):
        self.engine = engine
        self.kernel = kernel
        tsc = getattr(kernel, "trace_clock", None)
        if not callable(getattr(tsc, "shifted", None)):
            tsc = None                            # not the machine's TSC clock
        self.clock = clock or (tsc.read if tsc is not None else _default_clock())
        self.clocks = trace_clocks(self.clock, getattr(kernel, "clock_ns", None) or self.clock,
                                   tsc)
        self.create_dir_hook = create_dir_hook
        self.remove_dir_hook = remove_dir_hook
        self.nr_cpus = nr_cpus or int(getattr(kernel, "nr_cpus", 1) or 1)
        key = pointer_key if pointer_key is not None else str(
            getattr(kernel, "seed", 0)).encode()
        self.symbols = KernelSymbols(kernel.image, key)
        self._kprobe_factory = kprobe_factory
        self._kretprobe_factory = kretprobe_factory
        self._reserved = frozenset(reserved_events)

        self.lock = threading.RLock()             # event_mutex
        self.events: dict[tuple[str, str], TraceEvent] = {}   # creation order
        self._events_by_id: dict[int, TraceEvent] = {}
        self.probes: list[TraceProbe] = []        # the kprobes, creation order
        self.dynamic: list[TraceProbe | SynthEvent | EprobeEvent] = []   # dyn_event list
        self.groups: dict[str, Group] = {}
        self._next_id = first_event_id
        self._clear_trace = False
        self.comm_cache = CommCache()
        current_tgid = getattr(kernel, "current_tgid", None)
        if callable(current_tgid):
            self.comm_cache.tgid_of = self._current_tgid
        self.tracing_thresh_ns = 0          # tracing_thresh (global: function_graph's)

        self.function_tracer: FunctionTracer | None = None     # the top array's
        #: What current_tracer offers besides nop (tracers/plugin.py), in registration
        #: order.
        self.tracer_factories: list[TracerFactory] = []
        self.stack_tracer: StackTracer | None = None
        #: 6.1's func_flags: the function tracer's options, shared by every array's
        self._func_flags = {"func_stack_trace": False, "func-no-repeats": False}
        self._ftrace = getattr(engine, "ftrace", None)
        self._fgraph = getattr(engine, "fgraph", None)
        #: The top array's function_graph tracer, and the function profiler.
        self.graph_tracer: FunctionGraphTracer | None = None
        self.function_profiler: FunctionProfiler | None = None
        #: The top-level trace array, then the instances by name (creation order).
        self.top = TraceArray("", self)
        self.instances: dict[str, TraceArray] = {}
        listeners = getattr(kernel, "exit_listeners", None)
        if isinstance(listeners, list):
            listeners.append(self.comm_cache.forget)
        # A task leaves the pid lists as it is reaped, as 6.1's probe on
        # sched_process_free: its last events (its SIGCHLD) are still filtered by it.
        freed = getattr(kernel, "free_listeners", None)
        if not isinstance(freed, list):
            freed = listeners
        if isinstance(freed, list):
            freed.append(self._task_exited)
        listeners = getattr(kernel, "fork_listeners", None)
        if isinstance(listeners, list):
            listeners.append(self._task_forked)
        modules = getattr(kernel, "modules", None)
        if modules is not None and hasattr(modules, "register_module_notifier"):
            modules.register_module_notifier(self._module_notify)
        # Events are recorded by the kernel itself where they can be
        # (tracing/buffers/native.py): on the real machine, when records share its clock,
        # into the top array.
        self.native: NativeRecorder | None = None
        regs = getattr(engine, "pt_regs_fields", None)
        if NativeRecorder.available(kernel) and regs and self.clocks["local"].tsc:
            try:
                self.native = NativeRecorder(kernel, regs, self._save_current_comm,
                                             self._events_by_id.get)
            except MachineError:
                _log.info("the kernel's recorder serves another tracer: recording here")
            else:
                self.native.attach(self.top.buffer)
        self.static_events = self._init_static_events()
        self.trace_printk = self._init_trace_printk()
        if self._ftrace is not None:
            self._init_function_tracers(self._ftrace)
        self._install_tracers(self.top)
        self.function_tracer = self.top.function_tracer
        if self.graph_tracer is not None:
            cpu = lambda: kernel.cpu.index if kernel.cpu is not None else 0  # noqa: E731
            self.function_profiler = FunctionProfiler(
                self._fgraph, self.function_tracer, self.symbols.ftrace_site_names,
                self.nr_cpus, cpu, self.clock, self.graph_tracer.flags,
                lambda: self.tracing_thresh_ns, lambda site: self.symbols.symbolize(
                    site, False) or f"0x{site:x}")

    def _init_static_events(self):
        """The kernel's TRACE_EVENTs (tracing/events/trace_events.py), in the event registry
        with the ids below FIRST_EVENT_ID; None without the kernel's recorder."""
        if self.native is None:
            return None
        try:
            static = StaticEvents(self.kernel, self.native, deliver=self._static_record)
        except (ImageError, MachineError) as exc:
            _log.info("no static events: %s", exc)
            return None
        for ev in static.events:
            self.groups.setdefault(ev.group, Group(ev.group)).events += 1
            self.events[(ev.group, ev.name)] = ev
            self._events_by_id[ev.id] = ev
        return static

    def _init_trace_printk(self):
        """The kernel's trace_printk() records (tracing/events/trace_printk.py), decoded by
        their ids; None without the kernel's recorder or trace_printk()."""
        if self.native is None:
            return None
        try:
            printk = TracePrintk(self.kernel, self.native)
        except (KeyError, ImageError, MachineError) as exc:
            _log.info("no trace_printk: %s", exc)
            return None
        self._events_by_id.update(printk.events)
        top = self.top
        printk.sync(top.recording and not top.stacktrace and top.options["trace_printk"]
                    and self.clocks[top.trace_clock].tsc is not None)
        return printk

    def _init_function_tracers(self, ftrace) -> None:
        """The function tracer (each array's) and the stack tracer, on the engine's
        ftrace sites."""
        from kprobefs.kprobes import FtraceOps
        from kprobefs.tracing.tracers.latency_tracers import latency_tracer_factories
        self.tracer_factories.append(self._function_tracer_for)
        self.tracer_factories.extend(latency_tracer_factories(self, ftrace, FtraceOps))
        if self._fgraph is not None:
            self.tracer_factories.append(self._graph_tracer_for)
        self.stack_tracer = StackTracer(
            ftrace, FtraceOps, self.symbols.ftrace_site_names, read=self.kernel.read,
            is_call_return=lambda value: is_call_return(self.kernel, self.symbols, value),
            symbolize=lambda addr: format_ip_sym(addr, self.symbols.symbolize, True))
        self.stack_tracer.filter.commands = NO_ARRAY_COMMANDS

    def _install_tracers(self, tr: TraceArray) -> None:
        """Offer each registered tracer in ``tr`` (an instance only those that allow
        instances), in registration order."""
        for factory in self.tracer_factories:
            tracer = factory(self, tr)
            if tracer is not None and (tr.is_top or tracer.allow_instances):
                tr.add_tracer(tracer)

    @staticmethod
    def _function_tracer_for(registry: "Tracer", tr: TraceArray) -> FunctionTracer:
        """A function tracer recording into ``tr`` (each array has its own ops and
        filters, as Linux's instances do)."""
        tr.function_tracer = registry._new_function_tracer(tr)
        return tr.function_tracer

    @staticmethod
    def _graph_tracer_for(registry: "Tracer", tr: TraceArray) -> FunctionGraphTracer | None:
        """The function_graph tracer: the top array's only, on its function filters."""
        if not tr.is_top or tr.function_tracer is None:
            return None
        registry.graph_tracer = FunctionGraphTracer(
            tr, registry._fgraph, tr.function_tracer, registry.symbols.ftrace_site_names,
            registry._hit_context, lambda: registry.tracing_thresh_ns, registry.clock,
            registry._in_hardirq)
        return registry.graph_tracer

    def _in_hardirq(self) -> bool:
        """Whether the code the current CPU runs (inside a hook) is in hardirq context
        (6.1's in_hardirq: the preempt count's hardirq bits)."""
        irq, cpu = getattr(self.kernel, "irq", None), self.kernel.cpu
        return irq is not None and cpu is not None and bool(irq.context_flags(cpu) & 0x08)

    def _new_function_tracer(self, tr: TraceArray) -> FunctionTracer:
        from kprobefs.kprobes import FtraceOps
        tracer = FunctionTracer(
            self._ftrace, FtraceOps, self.symbols.ftrace_site_names,
            record=tr.buffer.write, context=self._hit_context,
            recording=lambda: tr.recording, now=lambda: tr.now(), flags=self._func_flags,
            record_stack=self._function_stack_recorder(tr))
        tr.func_probes = self._new_function_probes(tr, FtraceOps)
        tr.func_probes.hashes = {True: tracer.filter, False: tracer.notrace}
        tracer.filter.commands = tracer.notrace.commands = tr.func_probes
        tracer.notrace.enable = False
        return tracer

    def _function_stack_recorder(self, tr: TraceArray) -> Callable:
        """``record_stack`` of ``tr``'s function tracer: the entry, then the kernel
        stack at the site (the traced function first, as 6.1's STACK_SKIP leaves it)."""
        kernel, symbols, buffer = self.kernel, self.symbols, tr.buffer

        def record_stack(cpu: int, rec: tuple, size: int, regs) -> None:
            stack = unwind(kernel, symbols, regs, rec[4])
            buffer.write_many(cpu, ((rec, size), ((rec[0], rec[1], rec[2], STACK_EVENT,
                                                   stack), 16 + 8 * len(stack))))
        return record_stack

    def _new_function_probes(self, tr: TraceArray, ops_factory) -> FunctionProbes:
        """``tr``'s set_ftrace_filter commands (tracing/tracers/ftrace_probes.py)."""
        kernel, symbols = self.kernel, self.symbols

        def module_of(site: int) -> str | None:
            sym = symbols.image.symbol_at(site)
            return getattr(sym, "module", None) if sym is not None else None

        def make_hit(ip: int, regs) -> TriggerHit:
            pid, cpu = self._hit_context()
            return TriggerHit(cpu, pid, tr.now(), kernel.current_comm,
                              lambda: unwind(kernel, symbols, regs, ip))
        return FunctionProbes(tr, self._ftrace, ops_factory, symbols.ftrace_site_names,
                              module_of, make_hit, self._ftrace_dump,
                              symbols.module_loaded)

    def _ftrace_dump(self, cpu: int | None) -> None:
        """ftrace_dump (the ``dump``/``cpudump`` probes): tracing off in the top array,
        whose buffer (all CPUs, or ``cpu``'s) is consumed into the kernel log at
        KERN_EMERG in the latency format, a line a printk (queued: this runs on the hit
        path).  The times count from the first record dumped (6.1: from the buffer's
        last reset, which is not kept here)."""
        top = self.top
        top.set_tracing_on_hit(False)
        options = top.trace_options()
        text_only = options._replace(context_info=False)
        pairs = top.buffer.consume(cpu, limit=1 << 62)
        lines = ["Dumping ftrace buffer:\n"]
        if pairs:
            lines.append("---------------------------------\n")
            start = pairs[0][1][0]
            for i, (c, rec) in enumerate(pairs):
                next_ts = pairs[i + 1][1][0] if i + 1 < len(pairs) else rec[0]
                lines.append(lat_context(self.comm_cache.find(rec[1]), rec[1], c, rec[2],
                                         rec[0] - start, next_ts - rec[0], options.in_ns)
                             + top.render([(c, rec)], text_only))
        lines.append("---------------------------------\n" if pairs
                     else "   (ftrace buffer empty)\n")
        call = getattr(self.kernel, "call_in_process", None)
        for line in "".join(lines).splitlines(keepends=True):
            if call is None:
                _log.info("ftrace dump: %s", line.rstrip("\n"))
                continue
            call("printk", b"<0>%s\0",      # KERN_EMERG, the kernel's KERN_TRACE
                 line.encode("utf-8", "replace")[:_DUMP_LINE_MAX] + b"\0")

    # ================================================================ trace arrays
    def arrays(self) -> list[TraceArray]:
        """Return every trace array: the top level, then the instances."""
        with self.lock:
            return [self.top, *self.instances.values()]

    def new_instance(self, name: str) -> TraceArray:
        """``mkdir instances/NAME`` (instance_mkdir): EEXIST when the name is taken,
        ENOMEM when its buffers would pass the bound all arrays share."""
        with self.lock:
            if name in self.instances:
                raise OSError(errno.EEXIST, f"instance {name} exists")
            tr = TraceArray(name, self)
            self._install_tracers(tr)
            if self.top.buffer.expanded:
                # Linux allocates a new instance's buffers at the full size once
                # tracing has expanded them (ring_buffer_expanded)
                tr.update_buffers()
            self.instances[name] = tr
            return tr

    def remove_instance(self, name: str) -> None:
        """``rmdir instances/NAME`` (instance_rmdir): ENODEV when there is no such
        instance, EBUSY while one of its files is open; else its events are disabled
        and it goes."""
        with self.lock:
            tr = self.instances.get(name)
            if tr is None:
                raise OSError(errno.ENODEV, f"no instance {name}")
            if tr.ref:
                raise OSError(errno.EBUSY, f"instance {name} is in use")
            tr.remove_triggers()                    # they hold its event files armed
            if tr.func_probes is not None:
                tr.func_probes.remove_all()
            tr.set_events_enabled(False, allow_none=True)
            tr.set_current_tracer("nop")            # its tracer's hooks go
            del self.instances[name]
            self.record_tgid_changed()

    def _pid_filters_following_forks(self):
        """The pid sets that follow forks now: each array's event pids with its
        options/event-fork, its function tracer's with function-fork.  Called in the
        emulation, so without the lock: the instances are copied in one step."""
        for tr in (self.top, *list(self.instances.values())):
            if tr.options["event-fork"]:
                yield tr.event_pids
            if tr.options["function-fork"] and tr.function_tracer is not None:
                yield tr.function_tracer.pids

    def _task_forked(self, parent: int, child: int) -> None:
        for pids in self._pid_filters_following_forks():
            pids.fork(parent, child)

    def _task_exited(self, pid: int) -> None:
        for pids in self._pid_filters_following_forks():
            pids.exit(pid)

    def enable_file(self, ef: EventFile, on: bool) -> None:
        """Arm or disarm an event's file in one array (TraceArray.file_enable_disable,
        which keeps its soft mode): the event's probes are armed with its first armed
        file and disarmed with its last; an enable failure rolls back and changes
        nothing."""
        event = ef.event
        probes = getattr(event, "probes", ())
        arm = getattr(event, "arm_file", None)      # an event probe's trigger
        if on and arm is not None:
            arm(ef, True)
        first = on and not event.enabled
        if first:
            done = []
            try:
                for tp in probes:
                    if tp.registered:
                        self._engine_enable(tp, True)
                        done.append(tp)
            except OSError:
                for tp in done:
                    self._engine_enable(tp, False)
                raise
        ef.enabled = on
        files = tuple(f for f in (tr.files.get((event.group, event.name))
                                  for tr in self.arrays())
                      if f is not None and f.event is event and f.enabled)
        event.on = files
        event.enabled = bool(files)
        if on:
            event.was_enabled = True
        elif not files:
            for tp in probes:
                if tp.registered:
                    self._engine_enable(tp, False)
        if not on and arm is not None:
            arm(ef, False)
        self._native_sync(probes, statics=_is_static(event))

    def _current_tgid(self, pid: int) -> int | None:
        """The tgid of ``pid`` when it is the running task (whose comm is being saved)."""
        kernel = self.kernel
        if kernel.cpu is None or kernel.current_pid() != pid:
            return None
        return kernel.current_tgid()

    def record_tgid_changed(self) -> None:
        """options/record-tgid changed in some array: tgids are kept while one has it."""
        cache = self.comm_cache
        was = cache.record_tgid
        cache.set_record_tgid(any(
            tr.options["record-tgid"] for tr in (self.top, *self.instances.values())))
        if cache.record_tgid and not was and self.native is not None:
            self.native.forget_comms()          # the kernel's recorder asks again too

    def array_changed(self, tr: TraceArray, events: Iterable | None = None) -> None:
        """Something of ``tr`` that decides how ``events`` (None: all) are recorded
        changed: only the top array's recording is the kernel's."""
        if tr is not self.top:
            if events is not None and any(_is_static(ev) for ev in events):
                self._native_sync((), statics=True)     # instances get them from the host
            return
        if events is None:
            if self.static_events is not None:     # the kernel's pid filter is the top's
                self.static_events.set_event_fork(tr.options["event-fork"])
                pids = tr.event_pids
                self.static_events.set_pid_filter(pids.pids, pids.notrace_pids)
            self._native_sync(self.probes)
        else:
            events = list(events)
            self._native_sync([tp for ev in events for tp in getattr(ev, "probes", ())],
                              statics=any(_is_static(ev) for ev in events))

    def clock_changed(self, tr: TraceArray, clock) -> None:
        if tr is self.top and self.native is not None and clock.tsc is not None:
            self.native.set_clock(clock.tsc)

    def tracefs_root(self):
        """Return the ``tracing/`` directory node (built once)."""
        root = getattr(self, "_root", None)
        if root is None:
            root = self._root = tracing_root(self)
        return root

    def teardown(self) -> None:
        """Take every probe and ftrace hook out of the kernel text (the daemon is going
        away): triggers removed, events disabled, the function and stack tracers
        stopped, every dynamic event deleted.  The event directories are left to the
        dying kernel."""
        with self.lock:
            self.remove_dir_hook = None
            arrays = self.arrays()
            for tr in arrays:
                tr.remove_triggers()                # they hold event files armed
                if tr.func_probes is not None:
                    tr.func_probes.remove_all()
            for tr in arrays:
                tr.set_events_enabled(False, allow_none=True)
                tr.set_current_tracer("nop")
            if self.stack_tracer is not None:
                self.stack_tracer.set_enabled(0)
            if self.function_profiler is not None:
                self.function_profiler.set_enabled(False)
            # event probes first: the synthetic events they are attached to wait
            self.release_all(kprobes=False, eprobes=True)
            self.release_all(kprobes=True, synthetic=True)

    # ================================================================ read-back
    def events_newest_first(self) -> list[TraceEvent]:
        """Return the events in the kernel's list order (newest first)."""
        with self.lock:
            return list(reversed(self.events.values()))

    # ================================================================ enable
    def _engine_enable(self, tp: TraceProbe, on: bool) -> None:
        engine = self.engine
        if on and getattr(tp.entry_kprobe, "flags", 0) & KPROBE_FLAG_GONE:
            return      # its module went away: enabling succeeds, nothing to arm (§8.10)
        if tp.spec.is_return:
            (engine.enable_kretprobe if on else engine.disable_kretprobe)(tp.engine_probe)
        else:
            (engine.enable_kprobe if on else engine.disable_kprobe)(tp.engine_probe)

    # ================================================================ native recording
    def _native_prepare(self, tp: TraceProbe, address: int) -> None:
        """Give tp a struct trace_native_probe in the kernel if its arguments can be
        recorded there, and set its kprobe's native handler (before registration)."""
        if tp.native is not None and tp.native.ip != address:
            self._native_free(tp)           # a module came back elsewhere
        if self.native is not None and tp.native is None:
            spec = tp.spec
            maxactive = spec.maxactive or self.engine.default_maxactive() \
                if spec.is_return else 0
            tp.native = self.native.new_probe(tp.event.id, address, spec.programs,
                                              sum(p.record_size for p in spec.programs),
                                              maxactive)
        self._native_sync((tp,), statics=False)

    def _native_free(self, tp: TraceProbe) -> None:
        if tp.native is not None:
            tp.nhit += self.native.hits(tp.native)
            tp.native_missed += self.native.misses(tp.native)
            self.native.free_probe(tp.native)
            tp.native = None
            kp = tp.entry_kprobe
            if kp is not None and kp.native is not None:
                kp.native = None
                if tp.registered:
                    self.engine.refresh_kprobe(kp)

    def _native_sync(self, probes: Iterable[TraceProbe], statics: bool = True) -> None:
        """Point each probe's kprobe at the kernel's recorder when it can record the
        event as things stand (armed in no array but the top one, no triggers there, a
        filter it can evaluate, no stack traces, no pid filter, every CPU recording, the
        kernel's clock), else at the host's handler; and tell the recorder whether the
        event records, and its filter.  With ``statics`` (something of a static event, or
        of the top array, changed) the static events follow too
        (trace_events.StaticEvents.sync); the kernel filters those by pid itself."""
        native = self.native
        if native is None:
            return
        top = self.top
        usable = not top.stacktrace and self.clocks[top.trace_clock].tsc is not None
        if statics and self.static_events is not None:
            instances = list(self.instances.values())

            def to_host(ev) -> bool:
                if any(tr.is_enabled(ev) for tr in instances):
                    return True
                return any(ef.triggers is not None and ef.triggers.items
                           for ef in (tr.files.get((ev.group, ev.name))
                                      for tr in (top, *instances))
                           if ef is not None and ef.event is ev)
            self.static_events.sync(top.recording, usable, top.files.get, to_host)
        if statics and self.trace_printk is not None:
            self.trace_printk.sync(top.recording and usable and top.options["trace_printk"])
        usable = (usable and not top.event_pids.active
                  and not top.buffer.record_disabled)
        for tp in probes:
            np, kp = tp.native, tp.entry_kprobe
            if np is None or kp is None:
                continue
            ef = top.file(tp.event)
            # a file with triggers is recorded by the host, which runs them
            triggered = ef.triggers is not None and bool(ef.triggers.items)
            native.set_recording(np, ef.records and top.recording and not triggered)
            flt = ef.filter
            here = (usable and not triggered and all(f is ef for f in tp.event.on)
                    and native.set_filter(np, flt.program if flt is not None else None))
            handler = native.ret_entry if np.is_return else native.handler
            want = (handler, np.addr) if here else None
            if kp.native != want:
                kp.native = want
                if tp.registered:
                    self.engine.refresh_kprobe(kp)

    # ================================================================ the hit path
    def _kprobe_handler(self, tp: TraceProbe):
        record = self._recorder(tp, False)

        def pre_handler(kp, regs):
            tp.nhit += 1
            record(kp, regs, None)
            return 0
        return pre_handler

    def _kretprobe_handler(self, tp: TraceProbe):
        record = self._recorder(tp, True)

        def handler(ri, regs):
            tp.nhit += 1
            record(None, regs, ri)
            return 0
        return handler

    def _recorder(self, tp: TraceProbe, is_return: bool):
        """Return the function that records one hit of ``tp`` into the arrays its event
        is enabled in (trace_kprobe.make_recorder)."""
        return make_recorder(tp, is_return, self.kernel, self.symbols, self.comm_cache)

    def _hit_context(self) -> tuple[int, int]:
        """Return (pid, cpu) of the running task, saving its comm for the output (the
        function tracer's hit path)."""
        kernel = self.kernel
        pid = kernel.current_pid()
        cache = self.comm_cache
        if (pid not in cache.names or pid in cache.stale) \
                and self.top.options["record-cmd"]:
            cache.save(pid, kernel.current_comm())
        cpu = kernel.cpu
        return pid, cpu.index if cpu is not None else 0

    def _static_record(self, event, cpu: int, record: bytes) -> None:
        """A static event's record handed over by the kernel (trace_events.StaticEvents,
        not yet filtered): its triggers run in each array that has them, and it is
        written to each instance that has the event enabled, records, and whose filter
        and pid sets pass, and to the top array when the kernel left that one to the
        host (the top file has triggers)."""
        pid = int.from_bytes(record[4:8], "little", signed=True)
        data = record[8:]
        kernel = self.kernel
        comm = kernel.current_comm
        cache = self.comm_cache
        kernel_has_top = event.recording[0]
        for tr in (self.top, *list(self.instances.values())):
            ef = tr.files.get((event.group, event.name))
            if ef is None or ef.event is not event or not ef.enabled:
                continue
            if ef.triggers is not None and ef.triggers.items:
                hit = TriggerHit(cpu, pid, tr.now(), comm,
                                 lambda: unwind(kernel, self.symbols, kernel.regs, 0))
                tr.record_triggered(ef, record, (hit.ts, pid, record[2], event, 0, 0, data),
                                    len(record), hit)
                continue
            if (tr is self.top and kernel_has_top) or not ef.records or not tr.recording:
                continue
            if tr.event_pids.active and tr.event_pids.ignores(pid):
                continue
            if ef.filter is not None and not ef.filter.match(record, cpu, comm):
                continue
            if pid and (pid not in cache.names or pid in cache.stale) \
                    and tr.options["record-cmd"]:
                cache.save(pid, comm())
            tr.buffer.write(cpu, (tr.now(), pid, record[2], event, 0, 0, data),
                            len(record))

    def _save_current_comm(self) -> None:
        """Save the running task's comm: the kernel's recorder asks when a CPU's task
        changed or the task was renamed (saved_cmdlines keeps the latest name)."""
        pid = self.kernel.current_pid()
        if pid and self.top.options["record-cmd"]:  # pid 0 stays <idle>, as in Linux
            self.comm_cache.save(pid, self.kernel.current_comm())

    # ================================================================ misc
    def available_event_lines(self) -> str:
        return "".join(f"{ev.group}:{ev.name}\n" for ev in self.events_newest_first())

    # ================================================================ the top array
    # The top array's state and controls, for callers that know only one array.
    buffer = property(lambda self: self.top.buffer)
    options = property(lambda self: self.top.options)
    error_log = property(lambda self: self.top.error_log)
    tracing_on = property(lambda self: self.top.tracing_on)
    recording = property(lambda self: self.top.recording)
    trace_clock = property(lambda self: self.top.trace_clock)
    tracer_name = property(lambda self: self.top.tracer_name)
    trigger_host = property(lambda self: self.top.trigger_host)
    group_filter_text = property(lambda self: self.top.group_filter_text)

    def __getattr__(self, name: str):
        # The top array's control methods (set_enabled, set_filter, write_marker …).
        if name in _TOP_METHODS:
            return getattr(self.top, name)
        raise AttributeError(name)


def _is_static(event) -> bool:
    """Whether ``event`` is one of the kernel's static events (trace_events.py)."""
    return getattr(event, "static", False)


_TOP_METHODS = frozenset((
    "update_buffers", "set_enabled", "set_events_enabled", "enable_state", "set_filter",
    "set_group_filter", "clear_trace", "set_tracing_on", "pause", "unpause", "set_option",
    "set_trace_clock", "set_current_tracer", "available_tracers", "trace_options",
    "write_marker", "render", "trace_header", "set_event_tokens", "enabled_event_lines",
    "enable_text", "set_triggers", "truncate_triggers", "triggers_of"))
