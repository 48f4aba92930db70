"""Registers: the x86_64 register file of the CPU being emulated, and pt_regs frames in
kernel memory."""

from __future__ import annotations

import struct

from unicorn.x86_const import (
    UC_X86_REG_CS, UC_X86_REG_RFLAGS, UC_X86_REG_R8, UC_X86_REG_R9, UC_X86_REG_R10,
    UC_X86_REG_R11, UC_X86_REG_R12, UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15,
    UC_X86_REG_RAX, UC_X86_REG_RBP, UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDI,
    UC_X86_REG_RDX, UC_X86_REG_RIP, UC_X86_REG_RSI, UC_X86_REG_RSP, UC_X86_REG_SS,
)

KERNEL_CS, KERNEL_DS = 0x10, 0x18

__all__ = ["PT_REGS_FIELDS", "PT_REGS_SIZE", "UC_REG", "Registers", "pack_pt_regs",
           "pack_syscall_regs", "unpack_pt_regs"]

#: struct pt_regs, in memory order.
PT_REGS_FIELDS = ("r15", "r14", "r13", "r12", "bp", "bx", "r11", "r10", "r9", "r8", "ax",
                  "cx", "dx", "si", "di", "orig_ax", "ip", "cs", "flags", "sp", "ss")
PT_REGS_SIZE = 8 * len(PT_REGS_FIELDS)
_PT_REGS = struct.Struct(f"<{len(PT_REGS_FIELDS)}Q")

#: Unicorn register ids by Linux pt_regs name (orig_ax has no hardware register).  All
#: are 64-bit reads except cs and ss, which FastRegs must not be used for.
UC_REG = {
    "r15": UC_X86_REG_R15, "r14": UC_X86_REG_R14, "r13": UC_X86_REG_R13,
    "r12": UC_X86_REG_R12, "bp": UC_X86_REG_RBP, "bx": UC_X86_REG_RBX,
    "r11": UC_X86_REG_R11, "r10": UC_X86_REG_R10, "r9": UC_X86_REG_R9,
    "r8": UC_X86_REG_R8, "ax": UC_X86_REG_RAX, "cx": UC_X86_REG_RCX,
    "dx": UC_X86_REG_RDX, "si": UC_X86_REG_RSI, "di": UC_X86_REG_RDI,
    "ip": UC_X86_REG_RIP, "cs": UC_X86_REG_CS, "flags": UC_X86_REG_RFLAGS,
    "sp": UC_X86_REG_RSP, "ss": UC_X86_REG_SS,
}


def pack_pt_regs(values: dict) -> bytes:
    return _PT_REGS.pack(*(values.get(f, 0) & 0xFFFFFFFFFFFFFFFF for f in PT_REGS_FIELDS))


_NO_ARGS = (0,) * 6
_ENOSYS = -38 & 0xFFFFFFFFFFFFFFFF


def pack_syscall_regs(nr: int, args) -> bytes:
    """The pt_regs of a system call about to run: its number in orig_ax, -ENOSYS in ax
    (as entry code leaves it), up to six arguments in di, si, dx, r10, r8, r9, the rest
    zero."""
    m = 0xFFFFFFFFFFFFFFFF
    di, si, dx, r10, r8, r9 = (*args[:6], *_NO_ARGS[len(args):])
    # in PT_REGS_FIELDS' order: r15 r14 r13 r12 bp bx r11 r10 r9 r8 ax cx dx si di
    # orig_ax ip cs flags sp ss
    return _PT_REGS.pack(0, 0, 0, 0, 0, 0, 0, r10 & m, r9 & m, r8 & m, _ENOSYS, 0, dx & m,
                         si & m, di & m, nr & m, 0, 0, 0, 0, 0)


def unpack_pt_regs(data: bytes) -> dict:
    return dict(zip(PT_REGS_FIELDS, _PT_REGS.unpack(data)))


class Registers:
    """The live registers of the CPU now executing, by pt_regs name.

    Valid only inside a hook or trap handler; ``orig_ax`` reads as -1 (no system call),
    as in a kprobe's pt_regs.  Setting ``ip`` redirects execution.
    """

    __slots__ = ("_uc", "_fast")

    def __init__(self, uc):
        from ._fastuc import FastRegs

        object.__setattr__(self, "_uc", uc)
        object.__setattr__(self, "_fast", FastRegs(uc))

    def __getattr__(self, name):
        if name == "orig_ax":
            return 0xFFFFFFFFFFFFFFFF
        try:
            return self._fast.get(UC_REG[name])
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        if name == "orig_ax":
            return
        try:
            self._fast.set(UC_REG[name], value)
        except KeyError:
            raise AttributeError(name) from None

    def snapshot(self) -> dict:
        """Every pt_regs field as a dict (orig_ax = -1)."""
        get = self._fast.get
        d = {name: get(reg) for name, reg in UC_REG.items() if name not in ("cs", "ss")}
        d.update(orig_ax=0xFFFFFFFFFFFFFFFF, cs=KERNEL_CS, ss=KERNEL_DS)
        return d

    def restore(self, values: dict) -> None:
        for name, reg in UC_REG.items():
            if name in values and name not in ("cs", "ss"):
                self._fast.set(reg, values[name])
