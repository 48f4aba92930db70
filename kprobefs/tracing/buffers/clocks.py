"""trace_clock: the clocks Linux 6.1 stamps records with (kernel/trace/trace.c's
trace_clocks[], kernel/trace/trace_clock.c), as the emulated kernel reads them.

=========  ==================================================  ===========  ==========
name       Linux                                               here         recorded by
=========  ==================================================  ===========  ==========
local      sched_clock(): the TSC in ns                        the TSC      kernel
global     sched_clock_cpu(), kept monotonic across CPUs       as perf      kernel
counter    an atomic counter, never reset                      a counter    host
uptime     jiffies since boot, as clock_t (USER_HZ = 100)      from ktime   host
perf       local_clock(): sched_clock plus the offset that     the TSC      kernel
           put it on ktime when it was marked stable
mono       ktime_get_mono_fast_ns(): CLOCK_MONOTONIC           ktime        host
mono_raw   ktime_get_raw_fast_ns(): CLOCK_MONOTONIC_RAW        the host's   host
boot       ktime_get_boot_fast_ns(): mono plus time suspended  the host's   host
tai        ktime_get_tai_fast_ns(): mono plus the TAI offset   the host's   host
x86-tsc    rdtsc: cycles, not ns                               the TSC      kernel
=========  ==================================================  ===========  ==========

``ktime`` is the kernel's CLOCK_MONOTONIC (``ktime_get_ns``, the host's
CLOCK_MONOTONIC since the kernel booted).  The kernel's timekeeping is the host's, so
the emulated kernel sees the host's clocks from its boot on: CLOCK_MONOTONIC_RAW and
CLOCK_BOOTTIME move as the host's do, from where ktime is when the tracer starts (the
kernel booted with them equal, moments before), and CLOCK_TAI is the host's (the
kernel's realtime is the host's).  Reading them takes the host, so records stamped with
them are recorded by the host; the TSC clocks the kernel reads itself (``tsc``).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Callable

__all__ = ["TRACE_CLOCK_NAMES", "TraceClock", "trace_clocks"]

TRACE_CLOCK_NAMES = ("local", "global", "counter", "uptime", "perf", "mono", "mono_raw",
                     "boot", "tai", "x86-tsc")

_TICK_NSEC = 4_000_000                  # HZ = 250
_NSEC_PER_CLOCK_T = 10_000_000          # USER_HZ = 100


@dataclass(frozen=True)
class TraceClock:
    """One trace clock.  ``read()`` is its value now; ``in_ns`` says whether that
    counts nanoseconds (``trace`` prints seconds.microseconds) or not (a plain
    number); ``tsc`` is the TSC clock the kernel's recorder stamps with when this one
    is selected (``read`` is its reading), or ``None``: the host records."""

    name: str
    read: Callable[[], int]
    in_ns: bool = True
    tsc: object | None = None


def trace_clocks(local: Callable[[], int], ktime: Callable[[], int], tsc=None,
                 gettime: Callable[[int], int] = time.clock_gettime_ns
                 ) -> dict[str, TraceClock]:
    """The trace clocks by name, in trace_clocks[] order.

    ``local()`` is sched_clock, ns since boot; ``ktime()`` the kernel's
    CLOCK_MONOTONIC.  ``tsc`` is the machine's TSC clock (machine/clock.py's
    ``TscClock``: ``read``, ``shifted``, ``cycles``), or ``None`` without one (a test's
    fake kernel: then perf and global are local plus its offset, and x86-tsc is local).
    ``tsc`` is local's kernel side only when ``local`` is its reading.  ``gettime`` reads
    a host clock by id (``time.clock_gettime_ns``)."""
    # sched_clock_cpu's offset, taken when the clock is marked stable: now.
    offset = ktime() - local()
    if tsc is not None:
        perf_tsc = tsc.shifted(offset)
        perf = TraceClock("perf", perf_tsc.read, tsc=perf_tsc)
        cycles = tsc.cycles()
        x86_tsc = TraceClock("x86-tsc", cycles.read, in_ns=False, tsc=cycles)
    else:
        perf = TraceClock("perf", lambda: local() + offset)
        x86_tsc = TraceClock("x86-tsc", local, in_ns=False)
    counter = itertools.count(1)

    def host_clock(name: str, clock_id: int) -> TraceClock:
        """The host's clock clock_id, from where ktime is now."""
        base = gettime(clock_id) - ktime()
        return TraceClock(name, lambda: gettime(clock_id) - base)

    def uptime() -> int:
        return ktime() // _TICK_NSEC * _TICK_NSEC // _NSEC_PER_CLOCK_T

    clocks = (
        TraceClock("local", local, tsc=tsc if tsc is not None and local == tsc.read else None),
        TraceClock("global", perf.read, tsc=perf.tsc),
        TraceClock("counter", counter.__next__, in_ns=False),
        TraceClock("uptime", uptime, in_ns=False),
        perf,
        TraceClock("mono", ktime),
        host_clock("mono_raw", time.CLOCK_MONOTONIC_RAW),
        host_clock("boot", time.CLOCK_BOOTTIME),
        TraceClock("tai", lambda: gettime(time.CLOCK_TAI)),
        x86_tsc,
    )
    return {clock.name: clock for clock in clocks}
