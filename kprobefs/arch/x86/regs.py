"""pt_regs views handed to probe handlers.

Two backings with one interface: :class:`TrapRegs` reads and writes the live registers of
the CPU that hit an int3, :class:`FrameRegs` a struct pt_regs a trampoline saved on the
kernel stack (ftrace, optimized probes, return trampolines).  Both read lazily: a
handler pays only for the registers it touches.
"""

from __future__ import annotations

import struct

from unicorn.x86_const import (
    UC_X86_REG_EFLAGS, UC_X86_REG_R8, UC_X86_REG_R9, UC_X86_REG_R10, UC_X86_REG_R11,
    UC_X86_REG_R12, UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15, UC_X86_REG_RAX,
    UC_X86_REG_RBP, UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDI, UC_X86_REG_RDX,
    UC_X86_REG_RIP, UC_X86_REG_RSI, UC_X86_REG_RSP,
)

__all__ = ["PT_REGS_OFFSETS", "TrapRegs", "FrameRegs", "REGS_FIELDS"]

REGS_FIELDS = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax",
               "cx", "dx", "si", "di", "orig_ax", "ip", "cs", "flags", "sp", "ss")
PT_REGS_OFFSETS = {name: 8 * i for i, name in enumerate(REGS_FIELDS)}
_U64 = 0xFFFFFFFFFFFFFFFF
_Q = struct.Struct("<Q")

_UC = {
    "r15": UC_X86_REG_R15, "r14": UC_X86_REG_R14, "r13": UC_X86_REG_R13,
    "r12": UC_X86_REG_R12, "bp": UC_X86_REG_RBP, "bx": UC_X86_REG_RBX,
    "r11": UC_X86_REG_R11, "r10": UC_X86_REG_R10, "r9": UC_X86_REG_R9, "r8": UC_X86_REG_R8,
    "ax": UC_X86_REG_RAX, "cx": UC_X86_REG_RCX, "dx": UC_X86_REG_RDX, "si": UC_X86_REG_RSI,
    "di": UC_X86_REG_RDI, "flags": UC_X86_REG_EFLAGS, "sp": UC_X86_REG_RSP,
}
_ARG_REGS = ("di", "si", "dx", "cx", "r8", "r9")


class _RegsBase:
    """Shared helpers: function arguments and the stack, by the x86_64 calling convention."""

    __slots__ = ()

    def regs_get_kernel_argument(self, n: int) -> int:
        """The n-th (0-based) argument of a function at its entry."""
        if n < 6:
            return getattr(self, _ARG_REGS[n])
        return self.regs_get_kernel_stack_nth(n - 5)

    def regs_get_kernel_stack_nth(self, n: int) -> int:
        return _Q.unpack(self.read_memory(self.sp + 8 * n, 8))[0]

    def regs_return_value(self) -> int:
        return self.ax

    def snapshot(self) -> dict:
        return {name: getattr(self, name) for name in REGS_FIELDS}


class TrapRegs(_RegsBase):
    """The registers of the CPU that hit a breakpoint.  ``ip`` reads as the address after
    the int3; writing it redirects the CPU.  ``orig_ax`` is -1, ``cs``/``ss`` the kernel's."""

    __slots__ = ("_fast", "_mem", "ip", "_changed")

    def __init__(self, fast, mem, ip: int):
        object.__setattr__(self, "_fast", fast)
        object.__setattr__(self, "_mem", mem)
        object.__setattr__(self, "ip", ip)

    def __getattr__(self, name):
        reg = _UC.get(name)
        if reg is not None:
            return self._fast.get(reg)
        if name == "orig_ax":
            return _U64
        if name == "cs":
            return 0x10
        if name == "ss":
            return 0x18
        raise AttributeError(name)

    def __setattr__(self, name, value):
        if name == "ip":
            object.__setattr__(self, "ip", value & _U64)
            return
        reg = _UC.get(name)
        if reg is None:
            if name in ("orig_ax", "cs", "ss"):
                return
            raise AttributeError(name)
        self._fast.set(reg, value)

    def read_memory(self, addr: int, size: int) -> bytes:
        return self._mem.read(addr, size)

    def apply_ip(self) -> None:
        """Make the CPU resume at ``ip``."""
        self._fast.set(UC_X86_REG_RIP, self.ip)


class FrameRegs(_RegsBase):
    """A struct pt_regs in kernel memory (a trampoline's saved registers)."""

    __slots__ = ("_ram", "_pa", "_mem", "frame")

    def __init__(self, mem, frame: int):
        object.__setattr__(self, "_ram", mem.ram)
        object.__setattr__(self, "_mem", mem)
        object.__setattr__(self, "frame", frame)
        # The frame lies in one kernel stack page pair; translate both halves once.
        pa = mem.translate(frame)
        if (frame & 0xFFF) + 168 > 0x1000 and mem.translate(frame + 167) != pa + 167:
            pa = None
        object.__setattr__(self, "_pa", pa)

    def __getattr__(self, name):
        off = PT_REGS_OFFSETS.get(name)
        if off is None:
            raise AttributeError(name)
        if self._pa is None:
            return _Q.unpack(self._mem.read(self.frame + off, 8))[0]
        return _Q.unpack_from(self._ram, self._pa + off)[0]

    def __setattr__(self, name, value):
        off = PT_REGS_OFFSETS.get(name)
        if off is None:
            raise AttributeError(name)
        if self._pa is None:
            self._mem.write(self.frame + off, _Q.pack(value & _U64))
        else:
            _Q.pack_into(self._ram, self._pa + off, value & _U64)

    def read_memory(self, addr: int, size: int) -> bytes:
        return self._mem.read(addr, size)
