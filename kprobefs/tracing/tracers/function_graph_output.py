"""The function_graph tracer's text (kernel/trace/trace_functions_graph.c's output side):
the header, ``func() {`` / ``}`` pairs, leaves folded to ``func();``, the DURATION
column with its overhead marks, the CPU and TASK/PID columns, task-switch blocks, and
other records as ``/* comments */``.  Durations are printed as 6.1's
trace_print_graph_duration does, which the function profiler's ``trace_stat`` uses too.

Nothing here runs on the hit path.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

__all__ = ["graph_header", "print_graph", "format_duration", "duration_mark",
           "GRAPH_ENT_ID", "GRAPH_RET_ID", "GRAPH_FLAG_DEFAULTS"]

GRAPH_RET_ID = 10                  # TRACE_GRAPH_RET
GRAPH_ENT_ID = 11                  # TRACE_GRAPH_ENT
_TRACE_FN_ID = 1
_TRACE_STACK_ID = 4
_TRACE_PRINT_ID = 5
_INDENT = 2                        # TRACE_GRAPH_INDENT
_PROC_WIDTH = 14                   # TRACE_GRAPH_PROCINFO_LENGTH
_SEPARATOR = " ------------------------------------------\n"

#: The tracer's options (options/ and trace_options), in 6.1's order, with defaults.
GRAPH_FLAG_DEFAULTS = {
    "funcgraph-overrun": False,
    "funcgraph-cpu": True,
    "funcgraph-overhead": True,
    "funcgraph-proc": False,
    "funcgraph-duration": True,
    "funcgraph-abstime": False,
    "funcgraph-irqs": True,
    "funcgraph-tail": False,
    "sleep-time": True,
    "graph-time": True,
}

# trace_find_mark: the first threshold (ns) a duration passes picks its mark.
_MARKS = ((1_000_000_000, "$"), (100_000_000, "@"), (10_000_000, "*"),
          (1_000_000, "#"), (100_000, "!"), (10_000, "+"))


def duration_mark(ns: int) -> str:
    for limit, mark in _MARKS:
        if ns > limit:
            return mark
    return " "


def format_duration(ns: int) -> str:
    """``trace_print_graph_duration``: µs with as many ns digits as fit in seven
    characters, `` us ``, padded to the column."""
    usecs, nsecs = divmod(ns & 0xFFFFFFFFFFFFFFFF, 1000)
    text = str(usecs)
    length = len(text)
    if length < 7:
        digits = f"{nsecs:03d}"[:min(5, 8 - length) - 1]
        text += "." + digits
        length += len(digits) + 1
    return text + " us " + " " * max(0, 8 - length)


def graph_header(flags: Mapping[str, bool], context_info: bool) -> str:
    """``print_graph_headers``: the two column lines (nothing without context-info)."""
    if not context_info:
        return ""
    first, second = ["#"], ["#"]
    if flags["funcgraph-abstime"]:
        first.append("     TIME       ")
        second.append("      |         ")
    if flags["funcgraph-cpu"]:
        first.append(" CPU")
        second.append(" |  ")
    if flags["funcgraph-proc"]:
        first.append("  TASK/PID       ")
        second.append("   |    |        ")
    if flags["funcgraph-duration"]:
        first.append("  DURATION   ")
        second.append("   |   |      ")
    first.append("               FUNCTION CALLS\n")
    second.append("               |   |   |   |\n")
    return "".join(first) + "".join(second)


def _proc(comm: str, pid: int) -> str:
    """``print_graph_proc``: ``comm-pid`` (comm cut to 7) centred in 14 columns."""
    text = f"{comm[:7]}-{pid}"
    spaces = max(0, _PROC_WIDTH - len(text))
    return " " * (spaces // 2) + text + " " * (spaces - spaces // 2)


class _CpuState:
    """fgraph_cpu_data: the last pid printed on a CPU, the depth reached, and the
    function entered at each depth (whether a ``}`` matches its ``{``)."""

    __slots__ = ("last_pid", "depth", "enter_funcs")

    def __init__(self):
        self.last_pid = -1
        self.depth = 0
        self.enter_funcs: dict[int, int] = {}


class _Printer:
    def __init__(self, flags: Mapping[str, bool], nr_cpus: int, context_info: bool,
                 find_comm: Callable[[int], str], func_name: Callable[[int], str],
                 comment: Callable[[tuple], str], default: Callable[[int, tuple], str]):
        self.flags = flags
        self.context_info = context_info
        self.cpu_width = len(str(max(nr_cpus - 1, 0)))
        self.find_comm = find_comm
        self.func_name = func_name
        self.comment = comment
        self.default = default
        self.cpus: dict[int, _CpuState] = {}

    def state(self, cpu: int) -> _CpuState:
        st = self.cpus.get(cpu)
        if st is None:
            st = self.cpus[cpu] = _CpuState()
        return st

    def _cpu(self, cpu: int) -> str:
        return " %*d) " % (self.cpu_width, cpu)

    def prologue(self, cpu: int, rec: tuple) -> str:
        out = []
        pid = rec[1]
        st = self.state(cpu)
        if st.last_pid != pid:
            prev, st.last_pid = st.last_pid, pid
            if prev != -1:
                out.append(_SEPARATOR + self._cpu(cpu)
                           + _proc(self.find_comm(prev), prev) + " => "
                           + _proc(self.find_comm(pid), pid) + "\n" + _SEPARATOR + "\n")
        if not self.context_info:
            return "".join(out)
        flags = self.flags
        if flags["funcgraph-abstime"]:
            secs, rem = divmod(rec[0], 1_000_000_000)
            out.append("%5d.%06d |  " % (secs, rem // 1000))
        if flags["funcgraph-cpu"]:
            out.append(self._cpu(cpu))
        if flags["funcgraph-proc"]:
            out.append(_proc(self.find_comm(pid), pid) + " | ")
        return "".join(out)

    def duration(self, ns: int | None) -> str:
        """The DURATION column; ``None`` fills it with blanks (FLAGS_FILL_FULL)."""
        if not self.flags["funcgraph-duration"] or not self.context_info:
            return ""
        if ns is None:
            return "              |  "
        mark = duration_mark(ns) if self.flags["funcgraph-overhead"] else " "
        return f"{mark} {format_duration(ns)}|  "

    def entry(self, cpu: int, rec: tuple, leaf: tuple | None) -> str:
        depth = rec[5]
        st = self.state(cpu)
        head = self.prologue(cpu, rec)
        name = self.func_name(rec[4])
        if leaf is not None:
            st.depth = depth - 1
            st.enter_funcs.pop(depth, None)
            return (head + self.duration(leaf[8] - leaf[7]) + " " * (depth * _INDENT)
                    + name + "();\n")
        st.depth = depth
        st.enter_funcs[depth] = rec[4]
        return head + self.duration(None) + " " * (depth * _INDENT) + name + "() {\n"

    def ret(self, cpu: int, rec: tuple) -> str:
        func, depth = rec[4], rec[5]
        st = self.state(cpu)
        st.depth = depth - 1
        match = st.enter_funcs.pop(depth, None) == func
        text = (self.prologue(cpu, rec) + self.duration(rec[8] - rec[7])
                + " " * (depth * _INDENT))
        if match and not self.flags["funcgraph-tail"]:
            text += "}\n"
        else:
            text += f"}} /* {self.func_name(func)} */\n"
        if self.flags["funcgraph-overrun"]:
            text += f" (Overruns: {rec[6]})\n"
        return text

    def other(self, cpu: int, rec: tuple) -> str:
        """print_graph_comment; the function tracer's and stack records are printed
        as the default output prints them."""
        if rec[3].id in (_TRACE_FN_ID, _TRACE_STACK_ID):
            return self.default(cpu, rec)
        depth = self.state(cpu).depth
        text = self.comment(rec)
        if text.endswith("\n"):
            text = text[:-1]
        indent = " " * ((depth + 1) * _INDENT) if depth > 0 else ""
        return (self.prologue(cpu, rec) + self.duration(None) + indent
                + "/* " + text + " */\n")


def print_graph(pairs: Iterable[tuple[int, tuple]], flags: Mapping[str, bool],
                nr_cpus: int, context_info: bool, find_comm: Callable[[int], str],
                func_name: Callable[[int], str], comment: Callable[[tuple], str],
                default: Callable[[int, tuple], str]) -> str:
    """The graph text of (cpu, record) pairs in the order ``trace`` reads them.  An
    entry whose next record on its CPU is its own return (same task and function) is
    a leaf: printed once, as ``func();`` with the return's duration.  ``comment(rec)``
    gives another record's event text; ``default(cpu, rec)`` a default line."""
    pairs = list(pairs)
    following: list[int | None] = [None] * len(pairs)
    seen: dict[int, int] = {}
    for i in range(len(pairs) - 1, -1, -1):
        cpu = pairs[i][0]
        following[i] = seen.get(cpu)
        seen[cpu] = i
    printer = _Printer(flags, nr_cpus, context_info, find_comm, func_name, comment,
                       default)
    out = []
    consumed: set[int] = set()
    for i, (cpu, rec) in enumerate(pairs):
        if i in consumed:
            continue
        kind = rec[3].id
        if kind == GRAPH_ENT_ID:
            leaf = None
            j = following[i]
            if j is not None:
                nxt = pairs[j][1]
                if nxt[3].id == GRAPH_RET_ID and nxt[1] == rec[1] and nxt[4] == rec[4]:
                    leaf = nxt
                    consumed.add(j)
            out.append(printer.entry(cpu, rec, leaf))
        elif kind == GRAPH_RET_ID:
            out.append(printer.ret(cpu, rec))
        else:
            out.append(printer.other(cpu, rec))
    return "".join(out)
