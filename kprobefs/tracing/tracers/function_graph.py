"""The function_graph tracer (kernel/trace/trace_functions_graph.c, the recording side)
and the files that steer it: ``set_graph_function``, ``set_graph_notrace``,
``max_graph_depth``, and the top level's ``tracing_thresh``.

It is a user of the function graph core (kprobes/fgraph.py) on the sites the top
level's ``set_ftrace_filter`` and ``set_ftrace_notrace`` choose (graph_ops shares the
global ops' hash in 6.1), for the top array only.  Each hooked call records a
``funcgraph_entry`` at its entry and a ``funcgraph_exit`` at its return, unless:

* the task is inside a ``set_graph_notrace`` function (nothing nested is traced);
* ``set_ftrace_pid`` / ``set_ftrace_notrace_pid`` leave the task out;
* ``set_graph_function`` is not empty and the call is neither one of its functions
  nor nested inside one (per task, as 6.1's TRACE_GRAPH_BIT and its depth);
* ``max_graph_depth`` is set and the call is that deep or deeper;
* tracing is off (the entry cannot be recorded, so its return is not hooked).

With ``tracing_thresh`` set, only returns are recorded, of calls that took at least
that long.
"""

from __future__ import annotations

import errno
import struct
from typing import Callable, Iterable

from kprobefs.tracing.tracers.function import FunctionFilter
from kprobefs.tracing.tracers.function_graph_output import (
    GRAPH_ENT_ID, GRAPH_FLAG_DEFAULTS, GRAPH_RET_ID, graph_header, print_graph,
)
from kprobefs.tracing.buffers.output import FLAGS_NONE, TraceFormatter, TraceOptions
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.tracers.plugin import TracerPlugin

__all__ = ["FunctionGraphTracer", "GraphHook", "GRAPH_ENTRY_EVENT", "GRAPH_EXIT_EVENT",
           "graph_sites"]

_ENT_SIZE = 12                    # struct ftrace_graph_ent, packed
_RET_SIZE = 32                    # struct ftrace_graph_ret, packed
_U32 = 0xFFFFFFFF
_TRACE_PRINT_ID = 5
_NOTRACE = object()               # an FtraceGraphEnt's data: a set_graph_notrace call


class _GraphEntryEvent:
    """``funcgraph_entry`` records: ``(ts, pid, flags, GRAPH_ENTRY_EVENT, func, depth)``."""

    id = GRAPH_ENT_ID

    def raw(self, record: tuple) -> bytes:
        return raw_common(self.id, record[2], record[1]) + struct.pack(
            "<Qi", record[4], record[5])

    def render(self, record: tuple, tr, options: TraceOptions) -> str:
        return f"--> {function_name(tr.symbols, record[4])} ({record[5]})\n"


class _GraphExitEvent:
    """``funcgraph_exit`` records: ``(ts, pid, flags, GRAPH_EXIT_EVENT, func, depth,
    overrun, calltime, rettime)``."""

    id = GRAPH_RET_ID

    def raw(self, record: tuple) -> bytes:
        return raw_common(self.id, record[2], record[1]) + struct.pack(
            "<QiIQQ", *record[4:9])

    def render(self, record: tuple, tr, options: TraceOptions) -> str:
        name = function_name(tr.symbols, record[4])
        return (f"<-- {name} ({record[5]}) (start: {record[7]:x}  end: {record[8]:x}) "
                f"over: {record[5]}\n")


GRAPH_ENTRY_EVENT = _GraphEntryEvent()
GRAPH_EXIT_EVENT = _GraphExitEvent()


def function_name(symbols, addr: int) -> str:
    """``%ps``: the function's name, `` [module]`` after one in a module."""
    sym = symbols.image.symbol_at(addr)
    if sym is None:
        return f"0x{addr:x}"
    module = getattr(sym, "module", None)
    return f"{sym.name} [{module}]" if module else sym.name


def graph_sites(functions, sites: Callable[[], Iterable[tuple[int, str]]]) -> set[int]:
    """The sites the function graph hooks: the top function tracer's filter (all
    ``sites()`` when empty) less its notrace set."""
    chosen = set(functions.filter.selected) or {site for site, _ in sites()}
    return chosen - functions.notrace.selected


class GraphHook:
    """One user of the function graph core (``fgraph``), ``gops``, on the sites the top
    array's function tracer ``functions`` chooses (following its filter files)."""

    def __init__(self, fgraph, functions, sites: Callable[[], Iterable[tuple[int, str]]],
                 gops):
        self.fgraph = fgraph
        self.gops = gops
        self._functions = functions
        self._sites = sites
        functions.filter.add_listener(self._retarget)
        functions.notrace.add_listener(self._retarget)

    def start(self) -> None:
        """register_ftrace_graph: EBUSY while another user has the graph."""
        self.fgraph.register_ftrace_graph(self.gops, graph_sites(self._functions, self._sites))

    def stop(self) -> None:
        self.fgraph.unregister_ftrace_graph(self.gops)

    def _retarget(self) -> None:
        if self.fgraph.active is self.gops:
            self.fgraph.set_sites(graph_sites(self._functions, self._sites))


class _GraphFilter(FunctionFilter):
    """``set_graph_function`` and ``set_graph_notrace``: set_ftrace_filter's language,
    except that a ``!`` that removes nothing is EINVAL too (ftrace_graph_set_hash), and
    there are no commands."""

    def write(self, data: bytes) -> int:
        for token in data.decode("latin-1").split():
            if ":" in token or (token.startswith("!") and not (
                    self._match(token[1:]) & self.selected)):
                raise OSError(errno.EINVAL, f"{token!r} changes nothing")
            super().write(token.encode("latin-1"))
        return len(data)


class _TaskState:
    """A task's trace_recursion bits for the graph: inside a notrace function, and the
    depth of the set_graph_function call it is inside (None: none)."""

    __slots__ = ("notrace", "graph_depth")

    def __init__(self):
        self.notrace = False
        self.graph_depth: int | None = None


class FunctionGraphTracer(TracerPlugin):
    """``current_tracer`` = ``function_graph`` in the top array ``tr``.

    Its ``trace`` ignores options/raw, hex and bin, as 6.1's print_graph_function
    handles every record before them.

    ``fgraph`` is the engine's function graph core; ``functions`` the top array's
    function tracer (whose filters and pid sets apply); ``sites()`` every (site, name);
    ``context()`` the ``(pid, cpu)`` of the running task (saving its comm);
    ``thresh()`` ``tracing_thresh`` in ns; ``clock()`` trace_clock_local, in ns, which
    times the calls whatever clock stamps the records."""

    prints_every_record = True

    name = "function_graph"
    allow_instances = False

    def __init__(self, tr, fgraph, functions, sites: Callable[[], Iterable[tuple[int, str]]],
                 context: Callable[[], tuple[int, int]], thresh: Callable[[], int],
                 clock: Callable[[], int], in_hardirq: Callable[[], bool] = lambda: False):
        from kprobefs.kprobes import FgraphOps
        self._tr = tr
        self._fgraph = fgraph
        self._functions = functions
        self._context = context
        self._thresh = thresh
        self._clock = clock
        self._in_hardirq = in_hardirq
        self.flags = dict(GRAPH_FLAG_DEFAULTS)
        self.graph_filter = _GraphFilter(sites, "#### all functions enabled ####\n")
        self.graph_notrace = _GraphFilter(sites, "#### no functions disabled ####\n")
        #: max_graph_depth (an unsigned int; 0: no limit).
        self.max_depth = 0
        self._tasks: dict[int, _TaskState] = {}
        self._hook = GraphHook(fgraph, functions, sites, FgraphOps(
            self._entry, self._return, clock=clock))

    # ---- the tracer ---------------------------------------------------------------------
    def init(self, tr) -> None:
        """graph_trace_init: EBUSY while the function profiler has the graph."""
        self._tasks.clear()
        self._hook.start()

    def reset(self, tr) -> None:
        self._hook.stop()
        self._tasks.clear()

    def set_flag(self, tr, name: str, on: bool) -> None:
        """func_graph_set_flag: sleep-time is the function graph's (the profiler's
        too); graph-time the profiler's; funcgraph-irqs what is recorded (_entry);
        the rest change the text."""
        self.flags[name] = on
        if name == "sleep-time":
            self._fgraph.set_sleep_time(on)

    # ---- max_graph_depth ----------------------------------------------------------------
    def max_depth_text(self) -> str:
        depth = self.max_depth
        return f"{depth - (1 << 32) if depth >> 31 else depth}\n"

    def set_max_depth(self, value: int) -> None:
        self.max_depth = value & _U32

    # ---- the hit path -------------------------------------------------------------------
    def _entry(self, ent) -> bool:
        """trace_graph_entry."""
        pid, cpu = self._context()
        task = self._tasks.get(pid)
        if task is None:
            task = self._tasks[pid] = _TaskState()
        if task.notrace:
            return False
        # ftrace_graph_ignore_irqs: with funcgraph-irqs off, no entry (so no return)
        # of a function called in hardirq context
        if not self.flags["funcgraph-irqs"] and self._in_hardirq():
            return False
        if ent.func in self.graph_notrace.selected:
            task.notrace = True
            ent.data = _NOTRACE
            return True                 # its return clears the notrace state
        pids = self._functions.pids
        if pids.active and pids.ignores(pid):
            return False
        graph = self.graph_filter.selected
        entered = False
        if task.graph_depth is None and graph:
            if ent.func not in graph:
                return False
            entered = True
        if self.max_depth and ent.depth >= self.max_depth:
            return False
        tr = self._tr
        ent.calltime = self._clock()
        # with tracing_thresh only returns are recorded; else an entry that cannot be
        # (tracing off, its CPU out of tracing_cpumask) gets no return either
        if not self._thresh() and not (tr.recording and tr.buffer.write(
                cpu, (tr.now(), pid, FLAGS_NONE, GRAPH_ENTRY_EVENT, ent.func, ent.depth),
                _ENT_SIZE)):
            return False
        if entered:
            task.graph_depth = ent.depth
        return True

    def _return(self, ent) -> None:
        """trace_graph_return (trace_graph_thresh_return with tracing_thresh)."""
        pid, cpu = self._context()
        task = self._tasks.get(pid)
        if task is not None and task.graph_depth == ent.depth:
            task.graph_depth = None
        if ent.data is _NOTRACE:
            if task is not None:
                task.notrace = False
            return
        tr = self._tr
        rettime = self._clock()
        thresh = self._thresh()
        if thresh and rettime - ent.calltime < thresh:
            return
        if tr.recording:
            tr.buffer.write(cpu, (tr.now(), pid, FLAGS_NONE, GRAPH_EXIT_EVENT, ent.func,
                                  ent.depth, ent.overrun & _U32, ent.calltime, rettime),
                            _RET_SIZE)

    # ---- the text -----------------------------------------------------------------------
    def print_header(self, tr, options: TraceOptions) -> str:
        return f"# tracer: {self.name}\n#\n" + graph_header(self.flags, options.context_info)

    def print_trace(self, tr, pairs, options: TraceOptions) -> str:
        formatter = TraceFormatter(tr.comm_cache.find, options, lambda ev: None)

        def general(rec: tuple) -> str:
            return rec[3].render(rec, tr, options)

        def comment(rec: tuple) -> str:
            if rec[3].id == _TRACE_PRINT_ID:     # trace_marker: the message only
                return rec[4].split(b"\0", 1)[0].decode("utf-8", "replace")
            return general(rec)

        return print_graph(
            pairs, self.flags, tr.nr_cpus, options.context_info, tr.comm_cache.find,
            lambda addr: function_name(tr.symbols, addr), comment,
            lambda cpu, rec: formatter.render(((cpu, rec),), general))
