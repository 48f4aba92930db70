"""The ftrace system's own events (``events/ftrace/``): the record types the tracer itself
writes, described as Linux 6.1 describes them (kernel/trace/trace_entries.h), so that
tools decoding ``trace_pipe_raw`` pages (trace-cmd record and report) can read them.

The record types this tracer writes are here, ``function`` (the function tracer),
``funcgraph_entry`` and ``funcgraph_exit`` (the function_graph tracer), ``kernel_stack``
(options/stacktrace) and ``print`` (trace_marker), and beside them the
four that trace-cmd and libtraceevent look for among them (``user_stack``, ``bprint``,
``bputs``, ``raw_data``), numbered as 6.1 numbers its ``TRACE_*`` types.  As in
Linux, they have no ``enable`` or ``filter`` file (only ``print``, trace_marker's
event, has a ``trigger``, each array its own: files.py), the ftrace system directory
has no ``enable`` or ``filter`` either, and only an event with a register function
(function, print) has an ``id`` file.
"""

from __future__ import annotations

from typing import NamedTuple

from kprobefs.tracing.fetch import RecordField, format_fields_text

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

#: name -> the event, in Linux's order (trace_entries.h).
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
    _event("kernel_stack", 4, False,
           (RecordField("int", "size", 8, 4, True),
            # a fixed-length array: the format file shows its length
            RecordField("unsigned long", "caller[8]", 16, 64, False)),
           _STACK_PRINT),
    _event("print", 5, True,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("char[]", "buf", 16, 0, True)),
           '"%ps: %s", (void *)REC->ip, REC->buf'),
    _event("bprint", 6, False,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("const char *", "fmt", 16, 8, False),
            RecordField("u32[]", "buf", 24, 0, False)),
           '"%ps: %s", (void *)REC->ip, REC->fmt'),
    _event("user_stack", 12, False,
           (RecordField("unsigned int", "tgid", 8, 4, False),
            RecordField("unsigned long", "caller[8]", 16, 64, False)),
           _STACK_PRINT),
    _event("bputs", 14, False,
           (RecordField("unsigned long", "ip", 8, 8, False),
            RecordField("const char *", "str", 16, 8, False)),
           '"%ps: %s", (void *)REC->ip, REC->str'),
    _event("raw_data", 18, False,
           (RecordField("unsigned int", "id", 8, 4, False),
            RecordField("char[]", "buf", 12, 0, True)),
           '"id:%04x %08x", REC->id, (int)REC->buf[0]'),
)}
