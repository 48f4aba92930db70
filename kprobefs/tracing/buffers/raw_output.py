"""``trace`` and ``trace_pipe`` lines under options/raw, hex and bin (6.1's print_raw_fmt,
print_hex_fmt and print_bin_fmt, bin first, then hex, then raw, as print_trace_line
tries them).

Each line is the context (with options/context-info) then the event's part:

* raw: ``pid cpu ts `` in decimal, then the event's ``raw_text(record)``;
* hex: pid, cpu (4 bytes each) and ts (8) each as ``trace_seq_putmem_hex`` writes a
  field (its value in hex, two digits a byte, and a blank), the event's
  ``hex_text(record)``, then a newline;
* bin: the same fields' bytes as the machine holds them, then ``bin_text(record)``.

An event without the method prints what 6.1's default (trace_nop_print) does,
``type: N`` and a newline: every trace event (kprobes, eprobes, synthetic and static
events, whose trace_event_functions have only ``trace``), and the ftrace records that
have no such function in 6.1 (kernel_stack's, for one).  The text is a ``str`` whose
characters are the bytes (bin's are not text): ``trace`` encodes it as Latin-1, and so
does ``trace_pipe`` in bin mode.
"""

from __future__ import annotations

import struct
from typing import Sequence

__all__ = ["LINE_MODES", "hex_field", "bin_fields", "render_line_mode"]

#: options that print records as raw, hex or bin lines, in print_trace_line's order
LINE_MODES = ("bin", "hex", "raw")

_CONTEXT_BIN = struct.Struct("<iiQ")        # entry->pid, iter->cpu, iter->ts


def hex_field(value: int, size: int) -> str:
    """SEQ_PUT_HEX_FIELD of a ``size``-byte little-endian field: its bytes from the
    last to the first, two hex digits each, then a blank (a field over 8 bytes is
    written 8 bytes at a time; none here is)."""
    return f"{value & ((1 << (8 * size)) - 1):0{2 * size}x} "


def bin_fields(fmt: str, *values: int) -> str:
    """SEQ_PUT_FIELD of each value, packed with struct format ``fmt`` (little-endian),
    as a str of one character a byte."""
    return struct.pack("<" + fmt, *values).decode("latin-1")


def _nop(record: tuple) -> str:
    return f"type: {record[3].id}\n"


def render_line_mode(pairs: Sequence[tuple[int, tuple]], mode: str,
                     context_info: bool) -> str:
    """The lines of (cpu, record) pairs in ``mode`` (one of LINE_MODES)."""
    out = []
    append = out.append
    method = mode + "_text"
    for cpu, rec in pairs:
        body = getattr(rec[3], method, None)
        text = body(rec) if body is not None else _nop(rec)
        if mode == "raw":
            append(f"{rec[1]} {cpu} {rec[0]} {text}" if context_info else text)
        elif mode == "hex":
            if context_info:
                append(hex_field(rec[1], 4) + hex_field(cpu, 4) + hex_field(rec[0], 8))
            append(text + "\n")
        else:
            if context_info:
                append(_CONTEXT_BIN.pack(rec[1], cpu, rec[0]).decode("latin-1"))
            append(text)
    return "".join(out)
