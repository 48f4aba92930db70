"""The trace clock: the host's time-stamp counter scaled to nanoseconds, as Linux's
sched_clock scales the TSC.

Unicorn's ``rdtsc`` returns the host's TSC, so kernel code (kernel/trace_native.c's
``trace_clock_local``) and the host read one counter.  The host reads it through a
ten-byte function in an executable page; both sides apply the same ``mult``/``shift``
from the same base, so a record stamped in the kernel and one stamped by the host fall
on one timeline, in order.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
import time

__all__ = ["TscClock", "read_tsc"]

# rdtsc; shl $32, %rdx; or %rdx, %rax; ret
_RDTSC_CODE = bytes.fromhex("0f31" "48c1e220" "4809d0" "c3")
_SHIFT = 24
_CALIBRATE_SECONDS = 0.01


def _make_rdtsc():
    page = mmap.mmap(-1, mmap.PAGESIZE,
                     prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(_RDTSC_CODE)
    fn = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    fn.page = page              # the mapping lives as long as the function
    return fn


read_tsc = _make_rdtsc()
_ns_per_tick: float | None = None


def _calibrate() -> float:
    """Nanoseconds per TSC tick, measured once per process against CLOCK_MONOTONIC_RAW
    (the clock the TSC drives without NTP slewing)."""
    global _ns_per_tick
    if _ns_per_tick is None:
        raw = time.CLOCK_MONOTONIC_RAW
        t0, c0 = time.clock_gettime_ns(raw), read_tsc()
        time.sleep(_CALIBRATE_SECONDS)
        t1, c1 = time.clock_gettime_ns(raw), read_tsc()
        _ns_per_tick = (t1 - t0) / max(1, c1 - c0)
    return _ns_per_tick


class TscClock:
    """Nanoseconds since the clock was made, from the TSC.  :meth:`ns` is the host's
    reading; :meth:`kernel_layout` the ``struct trace_clock_tsc`` the kernel reads."""

    _LAYOUT = struct.Struct("<QII")

    def __init__(self):
        self.mult = round(_calibrate() * (1 << _SHIFT))
        if not 0 < self.mult < 1 << 32:
            raise ValueError(f"TSC scale out of range: {self.mult}")
        self.shift = _SHIFT
        self.tsc_base = read_tsc()

    def ns(self) -> int:
        """Return nanoseconds since the clock was made."""
        return (read_tsc() - self.tsc_base) * self.mult >> _SHIFT

    def kernel_layout(self) -> bytes:
        """Return struct trace_clock_tsc (include/trace_native.h) for this clock."""
        return self._LAYOUT.pack(self.tsc_base, self.mult, self.shift)
