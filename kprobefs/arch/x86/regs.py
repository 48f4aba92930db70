"""The pt_regs view handed to probe handlers.

Handlers run in a hook on the CPU that hit the probe, so the view reads and writes that
CPU's registers directly, lazily (a handler pays only for the registers it touches).
``ip`` and ``sp`` are what the probe model says they are: for an int3 hit ``ip`` is the
probed address + 1; in an ftrace callback ``sp`` is the traced function's stack pointer
at entry, one slot above the trampoline's return address.
"""

from __future__ import annotations

import struct

from ...machine.cpu import PT_REGS_FIELDS, UC_REG

__all__ = ["ProbeRegs", "SavedSpRegs", "REGS_FIELDS"]

REGS_FIELDS = PT_REGS_FIELDS
_U64 = 0xFFFFFFFFFFFFFFFF
_Q = struct.Struct("<Q")
_GPR = {name: reg for name, reg in UC_REG.items() if name not in ("ip", "cs", "ss", "sp")}
_RSP = UC_REG["sp"]
_ARG_REGS = ("di", "si", "dx", "cx", "r8", "r9")


class ProbeRegs:
    """struct pt_regs of the CPU in a probe handler.  ``ip`` is a plain attribute the
    arch code reads back after the handler; ``sp`` is the live %rsp plus ``sp_offset``
    (read-only);
    ``orig_ax`` is -1 and ``cs``/``ss`` the kernel's, as for any kprobe.  ``trapped``
    says the hit came through an int3 (interrupts off, an NMI-like context, as a
    tracer's records show), not a detour or an ftrace trampoline."""

    __slots__ = ("_fast", "_mem", "ip", "sp_offset", "trapped")
    orig_ax = _U64
    cs = 0x10
    ss = 0x18

    def __init__(self, fast, mem, ip: int, sp_offset: int = 0, trapped: bool = True):
        self._fast = fast
        self._mem = mem
        self.ip = ip
        self.sp_offset = sp_offset
        self.trapped = trapped

    @property
    def sp(self) -> int:
        return self._fast.get(_RSP) + self.sp_offset

    @sp.setter
    def sp(self, value: int) -> None:
        self._fast.set(_RSP, value - self.sp_offset)

    # ---- the helpers Linux has for pt_regs ------------------------------------------------
    def read_memory(self, addr: int, size: int) -> bytes:
        return self._mem.read(addr, size)

    def regs_get_kernel_argument(self, n: int) -> int:
        """The n-th (0-based) argument of a function at its entry."""
        if n < 6:
            return getattr(self, _ARG_REGS[n])
        return self.regs_get_kernel_stack_nth(n - 5)

    def regs_get_kernel_stack_nth(self, n: int) -> int:
        return _Q.unpack(self._mem.read(self.sp + 8 * n, 8))[0]

    def regs_return_value(self) -> int:
        return self.ax

    def snapshot(self) -> dict:
        """Every field, as a dict."""
        return {name: getattr(self, name) for name in REGS_FIELDS}


class SavedSpRegs(ProbeRegs):
    """ProbeRegs where the code that called the handler left %rsp in memory: the arch
    sets ``saved_sp`` before each handler runs (a memory read, where the live register
    costs a call into the emulator); a handler that sets ``sp`` moves %rsp too."""

    __slots__ = ("saved_sp",)

    def __init__(self, fast, mem, ip: int, trapped: bool = True):
        super().__init__(fast, mem, ip, trapped=trapped)
        self.saved_sp = 0

    @property
    def sp(self) -> int:
        return self.saved_sp

    @sp.setter
    def sp(self, value: int) -> None:
        self._fast.set(_RSP, value)
        self.saved_sp = value


def _gpr_property(reg: int) -> property:
    def get(self) -> int:
        return self._fast.get(reg)

    def set_(self, value: int) -> None:
        self._fast.set(reg, value)

    return property(get, set_)


for _name, _reg in _GPR.items():
    setattr(ProbeRegs, _name, _gpr_property(_reg))
del _name, _reg
