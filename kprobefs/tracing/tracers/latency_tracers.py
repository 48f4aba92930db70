"""The latency tracers: ``irqsoff``, ``preemptoff``, ``preemptirqsoff`` (6.1's
trace_irqsoff.c) and ``wakeup``, ``wakeup_rt``, ``wakeup_dl`` (trace_sched_wakeup.c).

Each keeps the trace of its maximum latency in the array's snapshot buffer (``use_max_tr``:
``snapshot`` writes are EBUSY meanwhile) and shows it in ``trace`` (``print_max``), in the
latency format (tracers/latency_format.py), with ``tracing_max_latency`` set to it;
``tracing_thresh``, when set, reports every latency past it instead of only new maxima.

They hook the kernel's hook points (kernel/trace_preemptirq.c) with ftrace ops while
current: ``tracer_hardirqs_off/on(a0, a1, preempt_count)`` and ``tracer_preempt_off/on``
(called as interrupts or preemption go off and come back, a0 and a1 being 6.1's
CALLER_ADDR0 and CALLER_ADDR1), ``tracer_sched_wakeup(p, prio, cpu, curr_prio)`` and
``tracer_sched_switch(prev, next, prev_prio, next_prio, next_cpu)`` beside the sched
tracepoints.  Not here: the function tracing 6.1 does inside a section
(options/function-trace), and the graph display.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass

from kprobefs.tracing.tracers.function import FUNCTION_EVENT
from kprobefs.tracing.tracers.latency_format import (
    CTX_EVENT, CTX_SIZE, FUNCTION_SIZE, WAKE_EVENT, caller_addrs, kernel_release,
    lat_flags, latency_header, render_latency, report_latency, stack_size,
)
from kprobefs.tracing.trace_array import STACK_EVENT
from kprobefs.tracing.tracers.plugin import TracerPlugin

__all__ = ["IrqsoffTracer", "WakeupTracer", "latency_tracer_factories", "HOOKS"]

_X86_EFLAGS_IF = 0x200
_TRACER_IRQS_OFF, _TRACER_PREEMPT_OFF = 1, 2
_MAX_RT_PRIO = 100
_U32 = 0xFFFFFFFF
_STACK_DEPTH = 32
#: The kernel's hook points each tracer attaches to.
HOOKS = ("tracer_hardirqs_off", "tracer_hardirqs_on", "tracer_preempt_off",
         "tracer_preempt_on", "tracer_sched_wakeup", "tracer_sched_switch")


def _s32(value: int) -> int:
    value &= _U32
    return value - (1 << 32) if value >> 31 else value


@dataclass
class _Task:
    """What a record or the latency header says of a task."""

    pid: int
    comm: str
    state: int = 0
    prio: int = 120


class _Machine:
    """The kernel as the tracers read it: the current task and CPU, task_structs (by
    the kernel's kabi offsets), stacks, the release."""

    def __init__(self, kernel, symbols):
        self.kernel = kernel
        self.symbols = symbols
        kabi = getattr(kernel, "kabi", {})
        self._pid_at = kabi.get("task.pid")
        self._comm_at = kabi.get("task.comm")
        self._state_at = kabi.get("task.state")
        #: family -> the array its tracer is current in (irqsoff_busy, wakeup_busy)
        self.busy: dict[str, object] = {}

    def cpu(self) -> int:
        cpu = getattr(self.kernel, "cpu", None)
        return cpu.index if cpu is not None else 0

    def current(self) -> _Task:
        return _Task(self.kernel.current_pid(), self.kernel.current_comm())

    def task(self, ptr: int, prio: int) -> _Task:
        read = self.kernel.read
        pid = int.from_bytes(read(ptr + self._pid_at, 4), "little", signed=True)
        comm = read(ptr + self._comm_at, 16).split(b"\0", 1)[0].decode("utf-8", "replace")
        state = int.from_bytes(read(ptr + self._state_at, 4), "little")
        return _Task(pid, comm, state, prio)

    def stack(self, regs, skip: int) -> tuple[int, ...]:
        """The call chain at a hook by its frame pointers, less ``skip`` callers."""
        return tuple(addr for addr in self.callers(regs, _STACK_DEPTH)[skip:] if addr)

    def callers(self, regs, count: int) -> list[int]:
        return caller_addrs(self.kernel.read, regs.sp, regs.bp, count)

    def release(self) -> str:
        return kernel_release(self.kernel)


class _LatencyTracer(TracerPlugin):
    """What the six share: the hooks (``hooks``: hook name -> handler), the busy flag of
    their family (one array at a time), overwrite forced on while current, and the
    latency-format ``trace``."""

    use_max_tr = True
    print_max = True
    hooks: dict = {}

    def __init__(self, name: str, tr, machine: _Machine, ftrace, ops_factory,
                 sites: dict[str, int], thresh):
        self.name = name
        self.tr = tr
        self.machine = machine
        self._ftrace = ftrace
        self._ops = []
        for hook, handler in self.hooks.items():
            ops = ops_factory(func=getattr(self, handler), want_parent_ip=False)
            ops.filter = {sites[hook]}
            self._ops.append(ops)
        self._thresh = thresh             # tracing_thresh, in ns
        self._saved_overwrite = True
        self.lock = threading.Lock()       # max_trace_lock / wakeup_lock

    family = ""

    def init(self, tr) -> None:
        busy = self.machine.busy
        if busy.get(self.family) is not None:
            raise OSError(errno.EBUSY, f"{self.family} tracer in use")
        busy[self.family] = tr
        self._saved_overwrite = tr.options["overwrite"]
        tr.set_option("overwrite", True)
        tr.max_latency_ns = 0
        self.start()
        for ops in self._ops:
            self._ftrace.register_ftrace_function(ops)

    def reset(self, tr) -> None:
        for ops in self._ops:
            if ops.registered:
                self._ftrace.unregister_ftrace_function(ops)
        tr.set_option("overwrite", self._saved_overwrite)
        self.machine.busy.pop(self.family, None)

    def start(self) -> None:
        """The tracer's own state back to nothing under way."""

    def enabled(self) -> bool:
        """tracer_enabled and tracing_is_enabled: the array records."""
        return self.tr.recording

    # -------------------------------------------------------------- records
    def _write(self, cpu: int, record: tuple, size: int) -> None:
        self.tr.buffer.write(cpu, record, size)

    def _function(self, cpu: int, flags: int, ip: int, parent: int,
                  ts: int | None = None) -> None:
        pid = self.machine.kernel.current_pid()
        self._write(cpu, (self.tr.now() if ts is None else ts, pid, flags, FUNCTION_EVENT,
                          ip, parent), FUNCTION_SIZE)

    def _stack(self, cpu: int, flags: int, regs, skip: int) -> None:
        stack = self.machine.stack(regs, skip)
        pid = self.machine.kernel.current_pid()
        self._write(cpu, (self.tr.now(), pid, flags, STACK_EVENT, stack), stack_size(stack))

    def _save_comm(self, task: _Task) -> None:
        if self.tr.options["record-cmd"]:
            self.tr.comm_cache.save(task.pid, task.comm)

    def _report(self, delta: int) -> bool:
        return report_latency(delta, self.tr.max_latency_ns, self._thresh())

    def _update_max(self, cpu: int | None, task: _Task, latency: int, time_start: int,
                    max_cpu: int, critical: tuple[int, int] = (0, 0)) -> bool:
        """update_max_tr (``cpu`` None: every CPU) or update_max_tr_single; False when
        tracing is stopped."""
        tr = self.tr
        if tr.tracing_stopped():
            return False
        tr.max_latency_ns = latency
        md = tr.max_tr.max_data
        md.cpu, md.latency_ns, md.time_start = max_cpu, latency, time_start
        md.critical_start, md.critical_end = critical
        md.comm, md.pid = task.comm, task.pid
        md.nice = task.prio - 120 if task.prio >= _MAX_RT_PRIO else 0
        md.policy = 1 if 0 <= task.prio < _MAX_RT_PRIO else 6 if task.prio < 0 else 0
        md.rt_priority = _MAX_RT_PRIO - 1 - task.prio if 0 <= task.prio < _MAX_RT_PRIO else 0
        self._save_comm(task)
        tr.update_max_tr(cpu)
        return True

    # --------------------------------------------------------------- output
    def print_header(self, tr, options) -> str:
        entries, total = tr.max_tr.buffer.counts(None)
        return latency_header(self.name, self.machine.release(), entries, total,
                              tr.nr_cpus, tr.max_tr.max_data, tr.symbols.symbolize,
                              options)

    def print_trace(self, tr, pairs, options) -> str:
        return render_latency(list(pairs), tr.max_tr.max_data.time_start,
                              tr.comm_cache.find,
                              lambda rec: rec[3].render(rec, tr, options), options)


@dataclass
class _CpuData:
    """trace_array_cpu's fields the irqsoff tracers use, and tracing_cpu."""

    tracing: bool = False
    critical_start: int = 0
    critical_end: int = 0
    critical_sequence: int = 0
    preempt_timestamp: int = 0


class IrqsoffTracer(_LatencyTracer):
    """``irqsoff`` (interrupts off), ``preemptoff`` (preemption off) or
    ``preemptirqsoff`` (either), by ``trace_type``.  Top level only, as in 6.1."""

    allow_instances = False
    family = "irqsoff"
    _HOOKS = {_TRACER_IRQS_OFF: {"tracer_hardirqs_off": "_hardirqs_off",
                                 "tracer_hardirqs_on": "_hardirqs_on"},
              _TRACER_PREEMPT_OFF: {"tracer_preempt_off": "_preempt_off",
                                    "tracer_preempt_on": "_preempt_on"}}

    def __init__(self, name: str, trace_type: int, *args):
        self.trace_type = trace_type
        self.hooks = {hook: handler for bit, hooks in self._HOOKS.items()
                      if trace_type & bit for hook, handler in hooks.items()}
        super().__init__(name, *args)
        self._cpus: dict[int, _CpuData] = {}
        self._max_sequence = 0
        self._saved_pause = False

    def start(self) -> None:
        self._cpus.clear()

    def init(self, tr) -> None:
        super().init(tr)
        self._saved_pause = tr.options["pause-on-trace"]
        tr.set_option("pause-on-trace", True)

    def reset(self, tr) -> None:
        super().reset(tr)
        tr.set_option("pause-on-trace", self._saved_pause)

    def _preempt_trace(self, pc: int) -> bool:
        return bool(self.trace_type & _TRACER_PREEMPT_OFF and pc)

    def _irq_trace(self, regs) -> bool:
        return bool(self.trace_type & _TRACER_IRQS_OFF and not regs.flags & _X86_EFLAGS_IF)

    # ------------------------------------------------------------------ hooks
    def _hardirqs_off(self, _ip, _parent, _ops, regs) -> None:
        if not self._preempt_trace(regs.dx & _U32):
            self._start_critical(regs.di, regs.si, regs)

    def _hardirqs_on(self, _ip, _parent, _ops, regs) -> None:
        if not self._preempt_trace(regs.dx & _U32):
            self._stop_critical(regs.di, regs.si, regs)

    def _preempt_off(self, _ip, _parent, _ops, regs) -> None:
        if self._preempt_trace(regs.dx & _U32) and not self._irq_trace(regs):
            self._start_critical(regs.di, regs.si, regs)

    def _preempt_on(self, _ip, _parent, _ops, regs) -> None:
        if self._preempt_trace(regs.dx & _U32) and not self._irq_trace(regs):
            self._stop_critical(regs.di, regs.si, regs)

    def _flags(self, regs) -> int:
        return lat_flags(not regs.flags & _X86_EFLAGS_IF, regs.dx & 0xFF)

    def _start_critical(self, ip: int, parent: int, regs) -> None:
        if not self.enabled():
            return
        cpu = self.machine.cpu()
        data = self._cpus.setdefault(cpu, _CpuData())
        if data.tracing:
            return
        data.critical_sequence = self._max_sequence
        data.preempt_timestamp = self.tr.now()
        data.critical_start = parent or ip
        self._function(cpu, self._flags(regs), ip, parent, data.preempt_timestamp)
        data.tracing = True

    def _stop_critical(self, ip: int, parent: int, regs) -> None:
        cpu = self.machine.cpu()
        data = self._cpus.get(cpu)
        if data is None or not data.tracing:
            return
        data.tracing = False
        if not self.enabled() or not data.critical_start:
            return
        flags = self._flags(regs)
        self._function(cpu, flags, ip, parent)
        self._check_critical(data, parent or ip, cpu, flags, regs)
        data.critical_start = 0

    def _check_critical(self, data: _CpuData, parent_ip: int, cpu: int, flags: int,
                        regs) -> None:
        """check_critical_timing: a new maximum is swapped into the snapshot (this
        CPU's buffer only); the next section is timed from now."""
        delta = self.tr.now() - data.preempt_timestamp
        with self.lock:
            if self._report(delta):
                self._function(cpu, flags, regs.ip, parent_ip)
                self._stack(cpu, flags, regs, 1)
                if data.critical_sequence == self._max_sequence:
                    data.critical_end = parent_ip
                    if self._update_max(cpu, self.machine.current(), delta,
                                        data.preempt_timestamp, cpu,
                                        (data.critical_start, data.critical_end)):
                        self._max_sequence += 1
        data.critical_sequence = self._max_sequence
        data.preempt_timestamp = self.tr.now()
        self._function(cpu, flags, regs.ip, parent_ip)


class WakeupTracer(_LatencyTracer):
    """``wakeup`` (any task waking with a better priority than the one running),
    ``wakeup_rt`` (real-time and deadline tasks), ``wakeup_dl`` (deadline tasks): the
    time from the wakeup of the best-priority task to the switch to it."""

    allow_instances = True
    family = "wakeup"
    hooks = {"tracer_sched_wakeup": "_probe_wakeup",
             "tracer_sched_switch": "_probe_switch"}

    def __init__(self, name: str, rt: bool, dl: bool, *args):
        self.wakeup_rt, self.wakeup_dl = rt, dl
        super().__init__(name, *args)
        self.start()

    def start(self) -> None:
        """__wakeup_reset: nobody waited for."""
        self._task = 0                      # the task_struct we wait to run
        self._task_info: _Task | None = None
        self._cpu = -1
        self._prio = -1
        self._tracing_dl = False
        self._timestamp = 0

    def _flags(self, regs) -> int:
        return lat_flags(not regs.flags & _X86_EFLAGS_IF, 0)

    def _probe_wakeup(self, _ip, _parent, _ops, regs) -> None:
        if not self.enabled():
            return
        m = self.machine
        prio, cpu_of_p, curr_prio = _s32(regs.si), regs.dx & _U32, _s32(regs.cx)
        wakee = m.task(regs.di, prio)
        curr = m.current()
        curr.prio = curr_prio
        self._save_comm(wakee)
        self._save_comm(curr)
        dl, rt = prio < 0, prio < _MAX_RT_PRIO
        if (self._tracing_dl or (self.wakeup_dl and not dl)
                or (self.wakeup_rt and not dl and not rt)
                or (not dl and ((prio & _U32) >= (self._prio & _U32) or prio >= curr_prio))):
            return
        with self.lock:
            if self._tracing_dl or (not dl and (prio & _U32) >= (self._prio & _U32)):
                return
            self.start()
            self._task, self._task_info = regs.di, wakee
            self._cpu, self._prio, self._tracing_dl = cpu_of_p, prio, dl
            self._timestamp = self.tr.now()
            cpu, flags = m.cpu(), self._flags(regs)
            self._write(cpu, (self._timestamp, curr.pid, flags, WAKE_EVENT, curr.pid,
                              curr_prio, 0, wakee.pid, prio, wakee.state, cpu_of_p),
                        CTX_SIZE)
            self._stack(cpu, flags, regs, 0)
            addrs = m.callers(regs, 3)
            self._function(cpu, flags, addrs[1], addrs[2])

    def _probe_switch(self, _ip, _parent, _ops, regs) -> None:
        m = self.machine
        prev_prio, next_prio, next_cpu = _s32(regs.dx), _s32(regs.cx), regs.r8 & _U32
        prev = m.task(regs.di, prev_prio)
        self._save_comm(prev)
        if not self.enabled() or regs.si != self._task:
            return
        with self.lock:
            if regs.si != self._task:
                return
            nxt = m.task(regs.si, next_prio)
            cpu, flags = m.cpu(), self._flags(regs)
            addrs = m.callers(regs, 2)
            self._function(cpu, flags, addrs[0], addrs[1])
            self._write(cpu, (self.tr.now(), prev.pid, flags, CTX_EVENT, prev.pid,
                              prev_prio, prev.state, nxt.pid, next_prio, nxt.state,
                              next_cpu), CTX_SIZE)
            self._stack(cpu, flags, regs, 0)
            delta = self.tr.now() - self._timestamp
            if self._report(delta):
                self._update_max(None, self._task_info, delta, self._timestamp, self._cpu)
            self.start()


def latency_tracer_factories(registry, ftrace, ops_factory) -> list:
    """The six tracers' factories (``factory(registry, tr) -> tracer or None``), in
    6.1's registration order; none when the kernel lacks the hook points."""
    sites = {name: site for site, name in registry.symbols.ftrace_site_names()
             if name in HOOKS}
    if set(sites) != set(HOOKS):
        return []
    machine = _Machine(registry.kernel, registry.symbols)

    def thresh() -> int:
        return registry.tracing_thresh_ns

    def make(cls, name, *extra):
        def factory(_registry, tr):
            return cls(name, *extra, tr, machine, ftrace, ops_factory, sites, thresh)
        return factory
    return [make(IrqsoffTracer, "irqsoff", _TRACER_IRQS_OFF),
            make(IrqsoffTracer, "preemptoff", _TRACER_PREEMPT_OFF),
            make(IrqsoffTracer, "preemptirqsoff", _TRACER_IRQS_OFF | _TRACER_PREEMPT_OFF),
            make(WakeupTracer, "wakeup", False, False),
            make(WakeupTracer, "wakeup_rt", True, False),
            make(WakeupTracer, "wakeup_dl", False, True)]
