"""``events/ftrace/``: the tracer's own record types (kernel/trace/trace_entries.h), which
trace-cmd and libtraceevent read to decode the binary pages of ``trace_pipe_raw``.

Each entry is a name, its record type (the ``TRACE_*`` number, also its ``ID``), its
fields after the common ones and its ``print fmt``; :func:`ftrace_format_text` renders the
``format`` file as 6.1's f_show does (a fixed array shows its length, a dynamic one
``[]``).  As in 6.1, every such event has a ``format``; only those with a register
function (``function`` and ``print``) have an ``id``, and none has ``enable``.
"""

from __future__ import annotations

from typing import NamedTuple

from kprobefs.tracing.fetch import COMMON_FIELDS

__all__ = ["FtraceEvent", "FTRACE_EVENTS", "ftrace_format_text"]


class _Field(NamedTuple):
    ctype: str          # the C type, without the array part
    name: str
    offset: int
    size: int
    is_signed: bool
    length: int | None = None       # None: a scalar; 0: a dynamic array; N: [N]


class FtraceEvent(NamedTuple):
    name: str
    id: int
    fields: tuple[_Field, ...]
    print_fmt: str
    has_id_file: bool = False


_STACK_ENTRIES = 8
_STACK_FMT = ('"\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n" "\\t=> %ps\\n\\t=> %ps\\n\\t=> %ps\\n" '
              '"\\t=> %ps\\n\\t=> %ps\\n", '
              + ", ".join(f"(void *)REC->caller[{i}]" for i in range(_STACK_ENTRIES)))
_CALLERS = _Field("unsigned long", "caller", 16, 8 * _STACK_ENTRIES, False, _STACK_ENTRIES)

#: The record types this tracer writes, and the ones trace-cmd expects beside them
#: (in 6.1's order and numbering: TRACE_FN is 1, ... TRACE_RAW_DATA 18).
FTRACE_EVENTS: tuple[FtraceEvent, ...] = (
    FtraceEvent("function", 1, (
        _Field("unsigned long", "ip", 8, 8, False),
        _Field("unsigned long", "parent_ip", 16, 8, False)),
        '" %ps <-- %ps", (void *)REC->ip, (void *)REC->parent_ip', True),
    FtraceEvent("kernel_stack", 4, (_Field("int", "size", 8, 4, True), _CALLERS),
                _STACK_FMT),
    FtraceEvent("print", 5, (
        _Field("unsigned long", "ip", 8, 8, False),
        _Field("char", "buf", 16, 0, True, 0)),
        '"%ps: %s", (void *)REC->ip, REC->buf', True),
    FtraceEvent("bprint", 6, (
        _Field("unsigned long", "ip", 8, 8, False),
        _Field("const char *", "fmt", 16, 8, False),
        _Field("u32", "buf", 24, 0, False, 0)),
        '"%ps: %s", (void *)REC->ip, REC->fmt'),
    FtraceEvent("user_stack", 12, (_Field("unsigned int", "tgid", 8, 4, False), _CALLERS),
                _STACK_FMT),
    FtraceEvent("bputs", 14, (
        _Field("unsigned long", "ip", 8, 8, False),
        _Field("const char *", "str", 16, 8, False)),
        '"%ps: %s", (void *)REC->ip, REC->str'),
    FtraceEvent("raw_data", 18, (
        _Field("unsigned int", "id", 8, 4, False),
        _Field("char", "buf", 12, 0, True, 0)),
        '"id:%04x %08x", REC->id, (int)REC->buf[0]'),
)


def _field_line(ctype: str, name: str, offset: int, size: int, is_signed: bool,
                length: int | None = None) -> str:
    if length is None:
        decl = f"{ctype} {name}"
    elif length:
        decl = f"{ctype} {name}[{length}]"
    else:
        decl = f"{ctype} {name}[]"
    return f"\tfield:{decl};\toffset:{offset};\tsize:{size};\tsigned:{int(is_signed)};\n"


def ftrace_format_text(event: FtraceEvent) -> str:
    """The ``events/ftrace/<name>/format`` file."""
    lines = [f"name: {event.name}\n", f"ID: {event.id}\n", "format:\n"]
    lines.extend(_field_line(f.type, f.name, f.offset, f.size, f.is_signed)
                 for f in COMMON_FIELDS)
    lines.append("\n")
    lines.extend(_field_line(*f) for f in event.fields)
    lines.append("\n")
    lines.append(f"print fmt: {event.print_fmt}\n")
    return "".join(lines)
