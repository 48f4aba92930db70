"""The function profiler (kernel/trace/ftrace.c's CONFIG_FUNCTION_PROFILER part):
``function_profile_enabled`` and ``trace_stat/functionN``.

Enabled, it is the function graph core's user (so it and the function_graph tracer
exclude each other, EBUSY, as in 6.1) on the sites of the top level's
``set_ftrace_filter``: each call counts a hit for its function on the CPU it entered on,
and its return adds the time it took (less the time of its traced children when the
``graph-time`` option is off) to its function on the CPU it returned on.  Enabling it
again starts from zero; disabling keeps the numbers for reading.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from kprobefs.tracing.tracers.function_graph import GraphHook
from kprobefs.tracing.tracers.function_graph_output import format_duration

__all__ = ["FunctionProfiler", "PROFILE_HEADER"]

_U64 = (1 << 64) - 1

PROFILE_HEADER = (
    "  Function                               Hit    Time            Avg             s^2\n"
    "  --------                               ---    ----            ---             ---\n"
)


class _Profile:
    """struct ftrace_profile: one function's hits and times on one CPU."""

    __slots__ = ("func", "counter", "time", "time_squared")

    def __init__(self, func: int):
        self.func = func
        self.counter = 0
        self.time = 0
        self.time_squared = 0


class FunctionProfiler:
    """``fgraph`` is the engine's function graph core, ``functions`` the top array's
    function tracer (its filters choose the sites), ``sites()`` every (site, name),
    ``cpu()`` the running CPU, ``clock()`` trace_clock_local in ns, ``graph_flags`` the
    function_graph tracer's options (``graph-time``), ``thresh()`` tracing_thresh in
    ns, ``func_name(site)`` the function's name."""

    def __init__(self, fgraph, functions, sites: Callable[[], Iterable[tuple[int, str]]],
                 nr_cpus: int, cpu: Callable[[], int], clock: Callable[[], int],
                 graph_flags: Mapping[str, bool], thresh: Callable[[], int],
                 func_name: Callable[[int], str]):
        from kprobefs.kprobes import FgraphOps
        self._cpu = cpu
        self._clock = clock
        self._graph_flags = graph_flags
        self._thresh = thresh
        self._func_name = func_name
        self.nr_cpus = nr_cpus
        self.enabled = False
        #: Per CPU, the profiled functions in the order they were first hit; None
        #: until the profiler was first enabled.
        self.stats: list[dict[int, _Profile]] | None = None
        self._hook = GraphHook(fgraph, functions, sites,
                               FgraphOps(self._entry, self._return, clock=clock))

    # ---- function_profile_enabled -------------------------------------------------------
    def enabled_text(self) -> str:
        return f"{int(self.enabled)}\n"

    def set_enabled(self, on: bool) -> None:
        """A write of ``function_profile_enabled``: on resets the numbers and starts
        (EBUSY while the function_graph tracer has the graph); off stops."""
        if on == self.enabled:
            return
        if on:
            self.stats = [{} for _ in range(self.nr_cpus)]
            self._hook.start()
            self.enabled = True
        else:
            self.enabled = False
            self._hook.stop()

    # ---- the hit path -------------------------------------------------------------------
    def _entry(self, ent) -> bool:
        """profile_graph_entry: one more hit; the call's own time starts."""
        stats = self.stats
        if not self.enabled or stats is None:
            return False
        table = stats[self._cpu()]
        rec = table.get(ent.func)
        if rec is None:
            rec = table[ent.func] = _Profile(ent.func)
        rec.counter += 1
        ent.subtime = 0
        ent.calltime = self._clock()
        return True

    def _return(self, ent) -> None:
        """profile_graph_return."""
        stats = self.stats
        if not self.enabled or stats is None or not ent.calltime:
            return
        calltime = self._clock() - ent.calltime
        if not self._graph_flags["graph-time"]:
            if ent.parent is not None:
                ent.parent.subtime += calltime
            calltime = calltime - ent.subtime if ent.subtime < calltime else 0
        rec = stats[self._cpu()].get(ent.func)
        if rec is not None:
            rec.time = (rec.time + calltime) & _U64
            rec.time_squared = (rec.time_squared + calltime * calltime) & _U64

    # ---- trace_stat/functionN -----------------------------------------------------------
    def stat_text(self, cpu: int) -> str:
        """The header, then one line per function hit on ``cpu``, most time first (equal
        times: the function first hit last comes first, as 6.1's rbtree puts them)."""
        out = [PROFILE_HEADER]
        if self.stats is None:
            return PROFILE_HEADER
        records = list(reversed(list(self.stats[cpu].values())))
        records.sort(key=lambda rec: rec.time, reverse=True)
        thresh = self._thresh()
        for rec in records:
            if not rec.counter:
                continue
            n = rec.counter
            avg = rec.time // n
            if thresh and avg < thresh:
                continue
            stddev = 0
            denom = (n * (n - 1) * 1000) & _U64
            if denom:
                stddev = ((n * rec.time_squared - rec.time * rec.time) & _U64) // denom
            out.append("  %-30.30s  %10d    %s    %s    %s\n" % (
                self._func_name(rec.func), n, format_duration(rec.time),
                format_duration(avg), format_duration(stddev)))
        return "".join(out)

