"""The ftrace system's own events (``events/ftrace/``): the record types the tracer itself
writes, described as Linux 6.1 describes them (kernel/trace/trace_entries.h), so that
tools decoding ``trace_pipe_raw`` pages (trace-cmd record and report) can read them.

All of 6.1's ``TRACE_*`` record types are here, numbered as 6.1 numbers them, as 6.1
lists every one whatever its configuration: those this tracer writes (``function``,
``func_repeats``, ``funcgraph_entry`` and ``funcgraph_exit``, ``kernel_stack``,
``print``, ``raw_data``) and those it never does (the scheduler tracers'
``context_switch`` and ``wakeup``, ``bprint``, ``bputs``, ``user_stack``, mmiotrace's,
``branch``, ``hwlat``, ``osnoise``, ``timerlat``).  Each is 6.1's
TRACE_EVENT_FL_IGNORE_ENABLE event (event_create_dir): ``format`` and ``hist`` (empty:
no trigger can be set) and no ``enable``, ``filter`` or ``trigger``, but ``print``,
trace_marker's event, which has a ``trigger`` in each array (files.py,
init_tracer_tracefs); only an event with a register function (function, print) has an
``id`` file, and the ftrace system directory has no ``enable`` or ``filter``.
"""

from __future__ import annotations

from typing import NamedTuple

from kprobefs.tracing.events.fetch import RecordField, format_fields_text

__all__ = ["FtraceEvent", "FTRACE_EVENTS", "FTRACE_SYSTEM"]

FTRACE_SYSTEM = "ftrace"


class FtraceEvent(NamedTuple):
    name: str
    id: int
    has_id_file: bool
    format: str


def _event(name: str, event_id: int, has_id_file: bool, fields, print_fmt: str):
    return FtraceEvent(name, event_id, has_id_file,
                       format_fields_text(name, event_id, fields, print_fmt))


_STACK_PRINT = ('"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n" '
                '"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n" '
                '"\\t=> %ps\\n\\t=> %ps\\n", '
                + ", ".join(f"(void *)REC->caller[{i}]" for i in range(8)))

def _fields(*fields) -> tuple[RecordField, ...]:
    """RecordFields from ``(type, name, offset, size, signed)`` tuples."""
    return tuple(RecordField(*f) for f in fields)


def _u64(name: str, offset: int):
    return ("u64", name, offset, 8, False)


def _u32(name: str, offset: int):
    return ("unsigned int", name, offset, 4, False)


# context_switch and wakeup share 6.1's ctx_switch_entry (FTRACE_CTX_FIELDS)
_CTX_FIELDS = _fields(
    _u32("prev_pid", 8), _u32("next_pid", 12), _u32("next_cpu", 16),
    ("unsigned char", "prev_prio", 20, 1, False), ("unsigned char", "prev_state", 21, 1, False),
    ("unsigned char", "next_prio", 22, 1, False), ("unsigned char", "next_state", 23, 1, False))


def _ctx_print(arrow: str) -> str:
    return (f'"%u:%u:%u  {arrow} %u:%u:%u [%03u]", REC->prev_pid, REC->prev_prio, '
            'REC->prev_state, REC->next_pid, REC->next_prio, REC->next_state, REC->next_cpu')


#: name -> the event, in Linux's order (trace_entries.h); every one of 6.1's, whether
#: or not a tracer here writes it, as 6.1 lists them all.
FTRACE_EVENTS: dict[str, FtraceEvent] = {e.name: e for e in (
    _event("function", 1, True,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("unsigned long", "parent_ip", 16, 8, False)),
           '" %ps <-- %ps", (void *)REC->ip, (void *)REC->parent_ip'),
    _event("funcgraph_entry", 11, False,
           (RecordField("unsigned long", "func", 8, 8, False),
            RecordField("int", "depth", 16, 4, True)),
           '"--> %ps (%d)", (void *)REC->func, REC->depth'),
    _event("funcgraph_exit", 10, False,
           (RecordField("unsigned long", "func", 8, 8, False),
            RecordField("int", "depth", 16, 4, True),
            RecordField("unsigned int", "overrun", 20, 4, False),
            RecordField("unsigned long long", "calltime", 24, 8, False),
            RecordField("unsigned long long", "rettime", 32, 8, False)),
           '"<-- %ps (%d) (start: %llx  end: %llx) over: %d", (void *)REC->func, '
           'REC->depth, REC->calltime, REC->rettime, REC->depth'),
    _event("context_switch", 2, False, _CTX_FIELDS, _ctx_print("==>")),
    _event("wakeup", 3, False, _CTX_FIELDS, _ctx_print("==+")),
    _event("kernel_stack", 4, False,
           (RecordField("int", "size", 8, 4, True),
            # a fixed-length array: the format file shows its length
            RecordField("unsigned long", "caller[8]", 16, 64, False)),
           _STACK_PRINT),
    _event("user_stack", 12, False,
           (RecordField("unsigned int", "tgid", 8, 4, False),
            RecordField("unsigned long", "caller[8]", 16, 64, False)),
           _STACK_PRINT),
    _event("bprint", 6, False,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("const char *", "fmt", 16, 8, False),
            RecordField("u32[]", "buf", 24, 0, False)),
           '"%ps: %s", (void *)REC->ip, REC->fmt'),
    _event("print", 5, True,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("char[]", "buf", 16, 0, True)),
           '"%ps: %s", (void *)REC->ip, REC->buf'),
    _event("raw_data", 18, False,
           (RecordField("unsigned int", "id", 8, 4, False),
            RecordField("char[]", "buf", 12, 0, True)),
           '"id:%04x %08x", REC->id, (int)REC->buf[0]'),
    _event("bputs", 14, False,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("const char *", "str", 16, 8, False)),
           '"%ps: %s", (void *)REC->ip, REC->str'),
    # the mmiotrace records: struct mmiotrace_rw and mmiotrace_map's members
    _event("mmiotrace_rw", 7, False, _fields(
        ("resource_size_t", "phys", 8, 8, False), ("unsigned long", "value", 16, 8, False),
        ("unsigned long", "pc", 24, 8, False), ("int", "map_id", 32, 4, True),
        ("unsigned char", "opcode", 36, 1, False), ("unsigned char", "width", 37, 1, False)),
           '"%lx %lx %lx %d %x %x", (unsigned long)REC->phys, REC->value, REC->pc, '
           'REC->map_id, REC->opcode, REC->width'),
    _event("mmiotrace_map", 8, False, _fields(
        ("resource_size_t", "phys", 8, 8, False), ("unsigned long", "virt", 16, 8, False),
        ("unsigned long", "len", 24, 8, False), ("int", "map_id", 32, 4, True),
        ("unsigned char", "opcode", 36, 1, False)),
           '"%lx %lx %lx %d %x", (unsigned long)REC->phys, REC->virt, REC->len, '
           'REC->map_id, REC->opcode'),
    # char is signed on 6.1's x86 (-funsigned-char came in 6.2)
    _event("branch", 9, False, _fields(
        _u32("line", 8), ("char", "func[31]", 12, 31, True),
        ("char", "file[21]", 43, 21, True), ("char", "correct", 64, 1, True),
        ("char", "constant", 65, 1, True)),
           '"%u:%s:%s (%u)%s", REC->line, REC->func, REC->file, REC->correct, '
           'REC->constant ? " CONSTANT" : ""'),
    _event("hwlat", 15, False, _fields(
        _u64("duration", 8), _u64("outer_duration", 16), _u64("nmi_total_ts", 24),
        ("s64", "tv_sec", 32, 8, True), ("long", "tv_nsec", 40, 8, True),
        _u32("nmi_count", 48), _u32("seqnum", 52), _u32("count", 56)),
           r'"cnt:%u\tts:%010llu.%010lu\tinner:%llu\touter:%llu\tcount:%d\tnmi-ts:%llu'
           r'\tnmi-count:%u\n", REC->seqnum, REC->tv_sec, REC->tv_nsec, REC->duration, '
           'REC->outer_duration, REC->count, REC->nmi_total_ts, REC->nmi_count'),
    _event("func_repeats", 19, False, _fields(
        ("unsigned long", "ip", 8, 8, False), ("unsigned long", "parent_ip", 16, 8, False),
        ("u16", "count", 24, 2, False), ("u16", "top_delta_ts", 26, 2, False),
        ("u32", "bottom_delta_ts", 28, 4, False)),
           r'" %ps <-%ps\t(repeats:%u  delta: -%llu)", (void *)REC->ip, '
           '(void *)REC->parent_ip, REC->count, '
           '(((u64)(REC)->top_delta_ts << 32) | (REC)->bottom_delta_ts)'),
    _event("osnoise", 16, False, _fields(
        _u64("noise", 8), _u64("runtime", 16), _u64("max_sample", 24),
        _u32("hw_count", 32), _u32("nmi_count", 36), _u32("irq_count", 40),
        _u32("softirq_count", 44), _u32("thread_count", 48)),
           r'"noise:%llu\tmax_sample:%llu\thw:%u\tnmi:%u\tirq:%u\tsoftirq:%u\tthread:%u\n", '
           'REC->noise, REC->max_sample, REC->hw_count, REC->nmi_count, REC->irq_count, '
           'REC->softirq_count, REC->thread_count'),
    _event("timerlat", 17, False, _fields(
        _u32("seqnum", 8), ("int", "context", 12, 4, True), _u64("timer_latency", 16)),
           r'"seq:%u\tcontext:%d\ttimer_latency:%llu\n", REC->seqnum, REC->context, '
           'REC->timer_latency'),
)}
