"""The kernel's log as the host reads it: dmesg text from log_buf, and the report of an
oops the kernel just printed (kernel/kernel/printk.c keeps each line as "<level>[secs]
text"; /dev/kmsg is served by the kernel itself)."""

from __future__ import annotations

import re
from typing import Callable

__all__ = ["read_log_buf", "oops_report"]

LOG_BUF_LEN = 64 * 1024
_LEVEL_PREFIX = re.compile(r"^<[0-7]>", re.M)
_RIP_LINE = re.compile(r"RIP: ([0-9a-f]{16})")


def read_log_buf(mem, symbol: Callable[[str], int]) -> str:
    """log_buf from its oldest whole line to the newest, as dmesg prints it ("[seconds]
    text" lines, without the levels)."""
    first, end = mem.read_u64(symbol("log_first")), mem.read_u64(symbol("log_next"))
    data = mem.read(symbol("log_buf"), LOG_BUF_LEN)
    start, size = first % LOG_BUF_LEN, end - first
    text = data[start:start + size] if start + size <= LOG_BUF_LEN else \
        data[start:] + data[:size - (LOG_BUF_LEN - start)]
    return _LEVEL_PREFIX.sub("", text.decode("utf-8", "replace"))


def oops_report(console: list[str], format_address: Callable[[int], str]) -> str:
    """The oops the kernel just printed to the console: from its BUG line (or its Oops
    line) to the registers, with RIP as function+offset."""
    lines = console[-12:]
    start = max((i for i, line in enumerate(lines) if "Oops: " in line), default=0)
    while start > 0 and not lines[start - 1].startswith(("RIP:", "RAX:", "RDX:")) \
            and "BUG" in lines[start - 1]:
        start -= 1
    out = []
    for line in lines[start:]:
        m = _RIP_LINE.match(line)
        if m:
            line += f" ({format_address(int(m.group(1), 16))})"
        out.append(line)
    return "\n".join(out)
