"""The function graph core (kernel/trace/fgraph.c): an entry hook and a return hook on
every function of a set of ftrace sites, for one user at a time (the function_graph
tracer or the function profiler; a second registration is EBUSY, as in 6.1).

Entries come through an ftrace ops; a function whose entry hook accepts it has its
return diverted through the rethook trampoline (the fprobe exits' machinery:
:meth:`FprobeManager.hook_return`).  Each task keeps its ``ret_stack``: the
:class:`FtraceGraphEnt` of every hooked call it is inside, whose index is the call's
``depth``.

``sleep_time`` is 6.1's fgraph_sleep_time (options/sleep-time): off, a task's time
switched out is left out of the calls it is inside, as ftrace_graph_probe_sched_switch
does, by an ops on ``__switch_to``'s site that moves their ``calltime`` (read with the
user's ``clock``) forward by the time since the task was switched out.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Callable

from ..errors import ProbeError
from .ftrace import FtraceOps

__all__ = ["FgraphOps", "FtraceGraphEnt", "FunctionGraph", "FTRACE_RETFUNC_DEPTH"]

#: The depth of a task's ret_stack; deeper calls are overruns.
FTRACE_RETFUNC_DEPTH = 50
#: Functions marked __notrace_funcgraph: __switch_to runs on the next task's stack
#: while the previous one is still current, so its return cannot be hooked for the
#: task that entered it.
NOTRACE_FUNCGRAPH = frozenset({"__switch_to"})
_SWITCH_FUNC = "__switch_to"


@dataclass(eq=False)
class FtraceGraphEnt:
    """One hooked call (Linux's ftrace_graph_ent and its ret_stack slot): ``func`` is
    the ftrace site, ``depth`` its index on the task's stack, ``parent`` the call it is
    nested in (or None).  ``calltime``, ``subtime`` and ``data`` are the user's."""

    func: int
    depth: int
    parent: "FtraceGraphEnt | None" = None
    calltime: int = 0
    subtime: int = 0
    data: object = None
    overrun: int = 0


@dataclass(eq=False)
class FgraphOps:
    """struct fgraph_ops: ``entryfunc(ent) -> bool`` at the entry of a call (False: its
    return is not hooked), ``retfunc(ent)`` at its return, with the task's stack still
    holding ``ent``."""

    entryfunc: Callable[[FtraceGraphEnt], bool]
    retfunc: Callable[[FtraceGraphEnt], None]
    #: The clock of the calltimes it keeps (for sleep-time off), ns.
    clock: Callable[[], int] | None = None


class FunctionGraph:
    """register_ftrace_graph for one engine (``engine.ftrace``, ``engine.fprobes``,
    ``engine.kernel``); sets ``engine.fgraph``."""

    def __init__(self, engine):
        self._ftrace = engine.ftrace
        self._rethook = engine.fprobes
        self._kernel = engine.kernel
        self.active: FgraphOps | None = None
        self._ops = FtraceOps(func=self._entry)
        self._ret_stacks: dict[int, list[FtraceGraphEnt]] = {}
        self._overrun: dict[int, int] = {}
        self._kernel.exit_listeners.append(self._task_exited)
        self.sleep_time = True
        self._switch_ops = FtraceOps(func=self._sched_switch)
        self._switched_out: dict[int, int] = {}       # pid -> when (ftrace_timestamp)
        engine.fgraph = self

    def register_ftrace_graph(self, gops: FgraphOps, sites: set[int]) -> None:
        """Start calling gops at the entries and returns of ``sites``; EBUSY when
        another user has the function graph."""
        if self.active is not None:
            raise ProbeError(errno.EBUSY, "the function graph is in use")
        self.active = gops
        self._ops.filter = self._graphable(sites)
        try:
            self._ftrace.register_ftrace_function(self._ops)
        except Exception:
            self.active = None
            raise
        self._update_switch_ops()

    def unregister_ftrace_graph(self, gops: FgraphOps) -> None:
        """Stop; calls still in flight return without their retfunc."""
        if self.active is not gops:
            return
        self._ftrace.unregister_ftrace_function(self._ops)
        self.active = None
        self._update_switch_ops()

    def set_sleep_time(self, on: bool) -> None:
        """options/sleep-time (ftrace_graph_sleep_time_control)."""
        self.sleep_time = on
        self._update_switch_ops()

    def _update_switch_ops(self) -> None:
        """Watch context switches while a user is active with sleep-time off."""
        want = self.active is not None and not self.sleep_time
        if want == self._switch_ops.registered:
            return
        if want:
            image = self._kernel.image
            sites = {site for site in getattr(self._ftrace, "sites", ())
                     if (sym := image.symbol_at(site)) is not None
                     and sym.name == _SWITCH_FUNC}
            if not sites:
                return
            self._switch_ops.filter = sites
            self._ftrace.register_ftrace_function(self._switch_ops)
        else:
            self._ftrace.unregister_ftrace_function(self._switch_ops)
            self._switched_out.clear()

    def _sched_switch(self, _site: int, _parent_ip: int, _ops, regs) -> None:
        """``__switch_to(prev, next)`` is entered: prev leaves now; next comes back, and
        the calls it is inside did not run while it was out."""
        gops = self.active
        if gops is None or gops.clock is None or self.sleep_time:
            return
        now = gops.clock()
        prev = self._kernel.current_pid()
        self._switched_out[prev] = now
        task = regs.regs_get_kernel_argument(1)
        raw = self._kernel.read(task + self._kernel.kabi["task.pid"], 4)
        nxt = int.from_bytes(raw, "little", signed=True)
        since = self._switched_out.pop(nxt, None)
        if since is None:
            return
        for ent in self._ret_stacks.get(nxt, ()):
            ent.calltime += now - since

    def set_sites(self, sites: set[int]) -> None:
        """The functions traced changed (set_ftrace_filter and notrace)."""
        if self.active is None:
            return
        sites = self._graphable(sites)
        current = set(self._ops.filter)
        for site in sorted(current - sites):
            self._ftrace.ftrace_set_filter_ip(self._ops, site, remove=True)
        for site in sorted(sites - current):
            self._ftrace.ftrace_set_filter_ip(self._ops, site)

    def _graphable(self, sites: set[int]) -> set[int]:
        image = self._kernel.image
        out = set()
        for site in sites:
            sym = image.symbol_at(site)
            if sym is None or sym.name not in NOTRACE_FUNCGRAPH:
                out.add(site)
        return out

    def ret_stack(self, pid: int) -> list[FtraceGraphEnt]:
        return self._ret_stacks.get(pid, [])

    def _task_exited(self, pid: int) -> None:
        self._ret_stacks.pop(pid, None)
        self._overrun.pop(pid, None)
        self._switched_out.pop(pid, None)

    def _entry(self, site: int, _parent_ip: int, _ops, regs) -> None:
        gops = self.active
        if gops is None:
            return
        pid = self._kernel.current_pid()
        stack = self._ret_stacks.setdefault(pid, [])
        if len(stack) >= FTRACE_RETFUNC_DEPTH:
            self._overrun[pid] = self._overrun.get(pid, 0) + 1
            return
        ent = FtraceGraphEnt(site, len(stack), stack[-1] if stack else None)
        stack.append(ent)
        if not gops.entryfunc(ent):
            stack.pop()
            return
        self._rethook.hook_return(regs, site, lambda _regs: self._return(pid, ent, gops))

    def _return(self, pid: int, ent: FtraceGraphEnt, gops: FgraphOps) -> None:
        stack = self._ret_stacks.get(pid)
        if not stack or ent not in stack:
            return                          # the task's stack was dropped meanwhile
        # calls above ent never returned through the trampoline (longjmp-like exits)
        while stack[-1] is not ent:
            stack.pop()
        ent.overrun = self._overrun.get(pid, 0)
        try:
            if gops is self.active:
                gops.retfunc(ent)
        finally:
            stack.pop()
