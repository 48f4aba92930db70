"""The TSC clocks: the host's time-stamp counter scaled to nanoseconds, as Linux's
sched_clock scales the TSC, or taken as raw cycles.

Unicorn's ``rdtsc`` returns the host's TSC, so kernel code (kernel/trace_native.c's
``trace_clock_read``) and the host read one counter.  The host reads it through a
ten-byte function in an executable page; both sides apply the same ``mult``/``shift``
and ``offset`` from the same base, so a record stamped in the kernel and one stamped by
the host fall on one timeline, in order.
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
    """A clock the TSC drives: ``offset + ((tsc - tsc_base) * mult >> shift)``.  Made
    with no arguments, nanoseconds since it was made (the scale calibrated once per
    process); :meth:`cycles` is the raw counter and :meth:`shifted` the same clock
    moved by an offset.  :meth:`read` is the host's reading; :meth:`kernel_layout` the
    ``struct trace_clock_tsc`` the kernel reads."""

    _LAYOUT = struct.Struct("<QIIq")

    def __init__(self, *, tsc_base: int | None = None, mult: int | None = None,
                 shift: int = _SHIFT, offset: int = 0):
        if mult is None:
            mult = round(_calibrate() * (1 << shift))
        if not 0 < mult < 1 << 32:
            raise ValueError(f"TSC scale out of range: {mult}")
        self.mult, self.shift, self.offset = mult, shift, offset
        self.tsc_base = read_tsc() if tsc_base is None else tsc_base

    @classmethod
    def cycles(cls) -> "TscClock":
        """The counter itself (x86-tsc): base 0, no scaling."""
        return cls(tsc_base=0, mult=1, shift=0)

    def shifted(self, offset: int) -> "TscClock":
        """This clock plus ``offset``."""
        return TscClock(tsc_base=self.tsc_base, mult=self.mult, shift=self.shift,
                        offset=self.offset + offset)

    def read(self) -> int:
        """Return the clock's value now (nanoseconds, or cycles for :meth:`cycles`)."""
        return self.offset + ((read_tsc() - self.tsc_base) * self.mult >> self.shift)

    #: The machine's name for reading the nanosecond clock it makes at boot.
    ns = read

    def kernel_layout(self) -> bytes:
        """Return struct trace_clock_tsc (include/trace_native.h) for this clock."""
        return self._LAYOUT.pack(self.tsc_base, self.mult, self.shift, self.offset)
