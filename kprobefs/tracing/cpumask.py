"""``tracing_cpumask``: the CPUs whose ring buffers record, as a hex bitmap.

Read as the kernel prints ``%*pb``: hex digits, zero-padded to the width of the CPU
count, in comma-separated 32-bit groups (highest first).  A write is parsed as
bitmap_parse does: those groups, each one to eight hex digits, a trailing newline
allowed; anything else is ``EINVAL``, a bit at or past the CPU count ``EOVERFLOW``.
A CPU cleared from the mask stops recording (ring_buffer_record_disable_cpu) until it
is set again; what its buffer holds stays readable.
"""

from __future__ import annotations

import errno

__all__ = ["format_cpumask", "parse_cpumask"]

_HEX = frozenset("0123456789abcdefABCDEF")


def format_cpumask(mask: int, nr_cpus: int) -> str:
    """The file's text for ``mask`` over ``nr_cpus`` CPUs."""
    groups = []
    bits = nr_cpus
    while bits > 0:
        low = (bits - 1) // 32 * 32
        groups.append(f"{(mask >> low) & 0xFFFFFFFF:0{(bits - low + 3) // 4}x}")
        bits = low
    return ",".join(groups) + "\n"


def parse_cpumask(data: bytes, nr_cpus: int) -> int:
    """The mask one write holds; OSError(EINVAL / EOVERFLOW) as above."""
    text = bytes(data).split(b"\0", 1)[0].decode("latin-1")
    if text.endswith("\n"):
        text = text[:-1]
    mask = 0
    for chunk in text.split(","):
        if not 1 <= len(chunk) <= 8 or not set(chunk) <= _HEX:
            raise OSError(errno.EINVAL, f"bad cpumask chunk {chunk!r}")
        mask = (mask << 32) | int(chunk, 16)
    if mask >> nr_cpus:
        raise OSError(errno.EOVERFLOW, "cpumask names a CPU that does not exist")
    return mask
