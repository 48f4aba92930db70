"""The daemon's health, as ``MNT/kprobefs/status`` shows it and ``kprobefs status`` prints
it.

The first line is ``state: ok`` or ``state: degraded`` (the machine is stuck, a CPU is
out of service, the kernel's free memory is below ``LOW_MEMORY`` of its total, or a
request or a kernel allocation failed in the last ``RECENT`` seconds); ``key: value`` lines
follow, then the recent errors, newest last.  Everything is read without taking the
machine's or the tracer's locks, so the file answers while the machine is stuck.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

__all__ = ["status_text", "host_memory", "RECENT", "LOW_MEMORY"]

#: Errors younger than this (seconds) make the daemon degraded.
RECENT = 300.0
#: Free kernel memory below this share of the total makes the daemon degraded.
LOW_MEMORY = 0.05


def status_text(kernel, engine=None, tracer=None, gateway=None,
                started: float | None = None) -> str:
    now = time.monotonic()
    cpus = list(getattr(kernel, "cpus", ()))
    in_service = [c for c in cpus if c.state != "wedged"]
    incidents = list(getattr(kernel, "incidents", ()))
    recent = [(when, text) for when, text in incidents if now - when <= RECENT]
    stats = getattr(gateway, "stats", {}) if gateway is not None else {}
    stuck = getattr(kernel, "stuck", None)
    memory = getattr(kernel, "memory", None)
    mem = memory.info() if memory is not None else None
    low = mem is not None and mem.free < mem.total * LOW_MEMORY
    degraded = bool(stuck) or len(in_service) < len(cpus) or bool(recent) or low
    lines = [f"state: {'degraded' if degraded else 'ok'}"]
    if started is not None:
        lines.append(f"uptime: {now - started:.1f} s")
    if stuck:
        lines.append(f"stuck: {stuck}")
    lines.append(f"cpus: {len(in_service)} in service of {len(cpus)}")
    for cpu in cpus:
        where = f", spinning at {cpu.wedged_at}" if cpu.state == "wedged" else ""
        state = "out of service" if cpu.state == "wedged" else cpu.state
        lines.append(f"cpu{cpu.index}: {state}{where}")
    lines.append(f"tasks: {len(getattr(kernel, 'tasks', {}))}")
    if mem is not None:
        lines.append(f"memory: {mem.free * 4} kB free of {mem.total * 4} kB"
                     f"{' (low)' if low else ''}, slab {mem.slab * 4} kB, "
                     f"{mem.failures} allocation failures")
    if engine is not None:
        lines.append(f"probes: {len(engine.registered())}")
    if tracer is not None:
        lines.append(f"events: {len(tracer.events)}")
        lines.append(f"buffer: {_buffer_use(tracer.buffer)}")
    if stats:
        lines.append(f"requests: {stats.get('calls', 0)} system calls, "
                     f"{stats.get('failed', 0)} failed, "
                     f"{stats.get('timed_out', 0)} timed out")
    if stats.get("prespawned"):
        lines.append(f"prespawned: {stats['prespawned']} tasks made as their process "
                     f"forked, {stats.get('prespawn_hits', 0)} of which made a request")
    if stats.get("mirrored"):
        lines.append(f"mirrored: {stats['mirrored']} system calls of `kprobefs exec` "
                     f"processes")
    host = host_memory()
    if host:
        lines.append("host: " + ", ".join(f"{name} {kb} kB" for name, kb in host.items())
                     + f"; Python blocks {sys.getallocatedblocks()}")
    lines.append(f"errors: {len(incidents)}, {len(recent)} in the last {RECENT:.0f} s")
    for when, text in incidents[-10:]:
        lines.append(f"  {now - when:.1f} s ago: {text}")
    return "\n".join(lines) + "\n"


def _buffer_use(buffer) -> str:
    cpus = list(buffer.cpus)
    used = sum(len(b.pages) for b in cpus)
    total = sum(b.nr_pages for b in cpus)
    entries = sum(b.entries for b in cpus)
    return f"{used} of {total} pages, {entries} events"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None                     # not glibc 2.33 or later
    fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def host_memory() -> dict[str, int]:
    """The daemon's own memory on the host, kB by name: its resident set, and where the
    C heap (glibc's malloc, which Unicorn and the interpreter's larger blocks use) has it:
    in use in the arenas, free in the arenas (held, not given back), and in blocks
    mapped on their own.  Empty where /proc or glibc is not there."""
    out = {}
    try:
        with open("/proc/self/statm") as f:
            out["RSS"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
    except OSError:
        return out
    if _MALLINFO2 is not None:
        m = _MALLINFO2()
        out.update({"heap in use": m.uordblks >> 10, "heap free": m.fordblks >> 10,
                    "heap mapped": m.hblkhd >> 10})
    return out
