"""What the latency tracers share (6.1's trace.c max-latency code, trace_output.c's
latency format): their records, the latency-format trace, ``report_latency`` and the
swap of a new maximum into the snapshot buffer (update_max_tr).

Records, as every record, start ``(ts, pid, flags, event, ...)``:

* ``TRACE_CTX`` / ``TRACE_WAKE`` (:data:`CTX_EVENT`, :data:`WAKE_EVENT`): ``(..., prev_pid,
  prev_prio, prev_state, next_pid, next_prio, next_state, next_cpu)``, printed
  `` pid:prio:S ==> [cpu] pid:prio:T comm`` (``  +`` for a wakeup);
* function entries (function.py's ``FUNCTION_EVENT``) and stack traces
  (trace_array's ``STACK_EVENT``).

The latency tracers write their records with :func:`lat_flags` flags: 6.1's
trace_entry flag bits and preempt count, marked so the latency format prints them as
trace_print_lat_fmt does (other records keep output.py's flags).
"""

from __future__ import annotations

import struct
from kprobefs.tracing.buffers.output import TraceOptions, flags_text, format_ip_sym
from kprobefs.tracing.buffers.raw_output import bin_fields, hex_field
from kprobefs.tracing.buffers.raw_page import raw_common

__all__ = ["CTX_EVENT", "WAKE_EVENT", "lat_flags", "lat_flags_text", "task_state_char",
           "latency_header", "render_latency", "report_latency", "caller_addrs",
           "CTX_SIZE", "FUNCTION_SIZE", "stack_size", "kernel_release"]

TRACE_FLAG_IRQS_OFF = 0x01
TRACE_FLAG_NEED_RESCHED = 0x04
TRACE_FLAG_HARDIRQ = 0x08
TRACE_FLAG_SOFTIRQ = 0x10
_LAT = 1 << 20                     # flags written by a latency tracer (6.1's bits)
_U64 = (1 << 64) - 1

CTX_SIZE = 16                       # struct ctx_switch_entry
FUNCTION_SIZE = 16                  # struct ftrace_entry


def stack_size(addrs) -> int:
    return 16 + 8 * len(addrs)


def lat_flags(irqs_off: bool, preempt_count: int) -> int:
    """The flags of a latency tracer's record: irqs off, the preempt count."""
    return _LAT | (TRACE_FLAG_IRQS_OFF if irqs_off else 0) | (preempt_count & 0xFF) << 8


def lat_flags_text(flags: int) -> str:
    """trace_print_lat_fmt: irqs-off, need-resched, hard/softirq, preempt depth,
    migrate-disable."""
    if not flags & _LAT:
        return flags_text(flags)
    irqs_off = "d" if flags & TRACE_FLAG_IRQS_OFF else "."
    resched = "n" if flags & TRACE_FLAG_NEED_RESCHED else "."
    hard, soft = flags & TRACE_FLAG_HARDIRQ, flags & TRACE_FLAG_SOFTIRQ
    irq = "H" if hard and soft else "h" if hard else "s" if soft else "."
    pc = flags >> 8 & 0xFF
    return (irqs_off + resched + irq + (f"{pc & 0xF:x}" if pc & 0xF else ".")
            + (f"{pc >> 4:x}" if pc & 0xF0 else "."))


#: TASK_REPORT's letters, by task_state_index.
_STATE_CHARS = "RSDTtXZPI"


def task_state_index(state: int) -> int:
    """6.1's task_state_index of a task's __state (TASK_REPORT: running .. parked)."""
    return (state & 0x7F).bit_length()


def task_state_char(state: int) -> str:
    """The letter of a task's __state (task_state_index then task_index_to_char)."""
    index = task_state_index(state)
    return _STATE_CHARS[index] if index < len(_STATE_CHARS) else "?"


class _CtxEvent:
    """TRACE_CTX (``==>``) and TRACE_WAKE (``  +``) records."""

    def __init__(self, type_id: int, delim: str, raw_state: str):
        self.id = type_id
        self.delim = delim
        #: the prev state options/raw and hex print: its letter, or wakeup's "+"
        self._raw_state = raw_state

    def raw(self, record: tuple) -> bytes:
        """ctx_switch_entry: prev_pid, next_pid, next_cpu, then the prios and states."""
        prev_pid, prev_prio, prev_state, next_pid, next_prio, next_state, next_cpu = \
            record[4:11]
        return raw_common(self.id, record[2], record[1]) + struct.pack(
            "<IIIBBBB", prev_pid & 0xFFFFFFFF, next_pid & 0xFFFFFFFF, next_cpu,
            prev_prio & 0xFF, prev_state & 0xFF, next_prio & 0xFF, next_state & 0xFF)

    def render(self, record: tuple, tr, options: TraceOptions) -> str:
        prev_pid, prev_prio, prev_state, next_pid, next_prio, next_state, next_cpu = \
            record[4:11]
        return (f" {prev_pid:7d}:{prev_prio & 0xFF:3d}:{task_state_char(prev_state)} "
                f"{self.delim} [{next_cpu:03d}] {next_pid:7d}:{next_prio & 0xFF:3d}:"
                f"{task_state_char(next_state)} {tr.comm_cache.find(next_pid)}\n")

    # options/raw, hex, bin (raw_output.py): 6.1's trace_ctxwake_raw, _hex, _bin
    def _states(self, record: tuple) -> tuple[str, str]:
        return self._raw_state or task_state_char(record[6]), task_state_char(record[9])

    def raw_text(self, record: tuple) -> str:
        prev_pid, prev_prio, _, next_pid, next_prio, _, next_cpu = record[4:11]
        prev, next_ = self._states(record)
        return (f"{prev_pid} {prev_prio & 0xFF} {prev} {next_cpu} {next_pid} "
                f"{next_prio & 0xFF} {next_}\n")

    def hex_text(self, record: tuple) -> str:
        prev_pid, prev_prio, _, next_pid, next_prio, _, next_cpu = record[4:11]
        prev, next_ = self._states(record)
        # S is a char, T an int
        return (hex_field(prev_pid, 4) + hex_field(prev_prio, 1) + hex_field(ord(prev), 1)
                + hex_field(next_cpu, 4) + hex_field(next_pid, 4) + hex_field(next_prio, 1)
                + hex_field(ord(next_), 4))

    @staticmethod
    def bin_text(record: tuple) -> str:
        prev_pid, prev_prio, prev_state, next_pid, next_prio, next_state, next_cpu = \
            record[4:11]
        return bin_fields("IBBIIBB", prev_pid & 0xFFFFFFFF, prev_prio & 0xFF,
                          task_state_index(prev_state), next_cpu, next_pid & 0xFFFFFFFF,
                          next_prio & 0xFF, task_state_index(next_state))


CTX_EVENT = _CtxEvent(2, "==>", "")
WAKE_EVENT = _CtxEvent(3, "  +", "+")


def report_latency(delta: int, max_latency: int, thresh: int) -> bool:
    """Whether a latency of ``delta`` ns is a new maximum (or passes tracing_thresh)."""
    if thresh:
        return delta >= thresh
    return delta > max_latency


# --------------------------------------------------------------------------- output

_LAT_HELP = (
    "#                    _------=> CPU#            \n"
    "#                   / _-----=> irqs-off/BH-disabled\n"
    "#                  | / _----=> need-resched    \n"
    "#                  || / _---=> hardirq/softirq \n"
    "#                  ||| / _--=> preempt-depth   \n"
    "#                  |||| / _-=> migrate-disable \n"
    "#                  ||||| /     delay           \n"
    "#  cmd     pid     |||||| time  |   caller     \n"
    "#     \\   /        ||||||  \\    |    /       \n"
)


def latency_header(tracer: str, release: str, entries: int, total: int, nr_cpus: int,
                   max_data, symbolize, options: TraceOptions) -> str:
    """``trace`` of a latency tracer above the lines: ``# tracer:``, and when the buffer
    holds records, print_trace_header (``max_data``: the snapshot's MaxData) and the
    column help."""
    out = f"# tracer: {tracer}\n#\n"
    if not options.context_info or not entries:
        return out
    d = max_data
    out += (f"# {tracer} latency trace v1.1.5 on {release}\n"
            "# --------------------------------------------------------------------\n"
            f"# latency: {d.latency_ns // 1000} us, #{entries}/{total}, "
            f"CPU#{d.cpu} | (M:desktop VP:0, KP:0, SP:0 HP:0 #P:{nr_cpus})\n"
            "#    -----------------\n"
            f"#    | task: {d.comm[:16]}-{d.pid} (uid:{d.uid} nice:{d.nice} "
            f"policy:{d.policy} rt_prio:{d.rt_priority})\n"
            "#    -----------------\n")
    if d.critical_start:
        out += (f"#  => started at: {_ip_sym(d.critical_start, symbolize, options)}\n"
                f"#  => ended at:   {_ip_sym(d.critical_end, symbolize, options)}\n#\n")
    return out + "#\n" + _LAT_HELP


def kernel_release(kernel) -> str:
    """UTS_RELEASE of the emulated kernel (its /proc/version's third word), 6.1.0 when
    the kernel cannot say."""
    version = getattr(kernel, "proc_version", None)
    if callable(version):
        try:
            return version().split()[2]
        except Exception:
            pass
    return "6.1.0"


def _ip_sym(addr: int, symbolize, options: TraceOptions) -> str:
    return format_ip_sym(addr, symbolize, options.sym_offset, options.sym_addr)


def _mark(delta_ns: int) -> str:
    """trace_find_mark: the overhead mark of the gap to the next record."""
    for limit, sym in ((1_000_000_000, "$"), (100_000_000, "@"), (10_000_000, "*"),
                       (1_000_000, "#"), (100_000, "!"), (10_000, "+")):
        if delta_ns > limit:
            return sym
    return " "


def _signed(value: int) -> int:
    value &= _U64
    return value - (1 << 64) if value >> 63 else value


def render_latency(pairs: list[tuple[int, tuple]], time_start: int, find_comm,
                   body, options: TraceOptions) -> str:
    """The latency format's lines (trace_print_lat_context): ``comm-pid cpu flags``,
    the time since ``time_start`` with the mark of the gap to the next record, then
    ``body(record)``."""
    out = []
    in_ns = options.in_ns
    for i, (cpu, rec) in enumerate(pairs):
        text = body(rec)
        if not options.context_info:
            out.append(text)
            continue
        ts = rec[0]
        next_ts = pairs[i + 1][1][0] if i + 1 < len(pairs) else ts
        pid = rec[1]
        prefix = f"{find_comm(pid)[:8]:>8s}-{pid:<7d} {cpu:3d}{lat_flags_text(rec[2])}"
        abs_ts, rel_ts = (ts - time_start) & _U64, (next_ts - ts) & _U64
        if in_ns:
            abs_us, rel_us = (abs_ts + 500) // 1000 & _U64, (rel_ts + 500) // 1000
            stamp = f" {_signed(abs_us):4d}us{_mark(rel_us * 1000)}: "
        else:
            stamp = f" {_signed(abs_ts):4d}: "
        out.append(prefix + stamp + text)
    return "".join(out)


def caller_addrs(read, sp: int, bp: int, count: int) -> list[int]:
    """CALLER_ADDR0..count-1 at a function's entry (before it pushed %rbp): the return
    address at ``sp``, then those of the frames ``bp`` chains (the kernel keeps frame
    pointers); 0 past the end of the chain."""
    out = []
    try:
        out.append(int.from_bytes(read(sp, 8), "little"))
        while len(out) < count and bp:
            out.append(int.from_bytes(read(bp + 8, 8), "little"))
            bp = int.from_bytes(read(bp, 8), "little")
    except Exception:
        pass
    return (out + [0] * count)[:count]

