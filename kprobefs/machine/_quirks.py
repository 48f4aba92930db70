"""Workarounds for Unicorn behaviour that differs from hardware.

Unicorn hands every exception to the UC_HOOK_INTR hook instead of delivering it through
the IDT, so QEMU never clears its record of the exception in progress
(``CPUX86State.old_exception``).  The next page fault is then taken for a fault during
delivery and turned into a double fault, and the one after that into a triple-fault reset.
Hardware clears that record once the handler is entered; :func:`clear_exception_state`
does the same through the CPU context, at an offset found once by experiment.
"""

from __future__ import annotations

import ctypes
import struct
from functools import lru_cache

from unicorn import UC_ARCH_X86, UC_HOOK_INTR, UC_MODE_64, Uc
from unicorn.x86_const import (
    UC_X86_REG_CR0, UC_X86_REG_CR3, UC_X86_REG_CR4, UC_X86_REG_RIP, UC_X86_REG_RSP,
)

from ..errors import MachineError

__all__ = ["clear_exception_state", "old_exception_offset"]

_CLEARED = struct.pack("<i", -1)


def _ctx_bytes(ctx) -> bytes:
    return bytes(ctx)


@lru_cache(maxsize=1)
def old_exception_offset() -> int:
    """Byte offset of old_exception within a saved Unicorn context."""
    uc = Uc(UC_ARCH_X86, UC_MODE_64)
    uc.mem_map(0, 0x10000)
    # Identity-map the first 2 MiB with one large page; faults come from above it.
    uc.mem_write(0x1000, struct.pack("<Q", 0x2000 | 7))
    uc.mem_write(0x2000, struct.pack("<Q", 0x3000 | 7))
    uc.mem_write(0x3000, struct.pack("<Q", 0x0 | 0x83))
    code = bytes.fromhex("488b042500004000" "488b042500005000" "90")  # two faulting loads
    uc.mem_write(0x8000, code)
    uc.reg_write(UC_X86_REG_CR3, 0x1000)
    uc.reg_write(UC_X86_REG_CR4, uc.reg_read(UC_X86_REG_CR4) | (1 << 5))
    uc.reg_write(UC_X86_REG_CR0, uc.reg_read(UC_X86_REG_CR0) | (1 << 31) | 1)
    uc.reg_write(UC_X86_REG_RSP, 0xF000)
    before = _ctx_bytes(uc.context_save())
    found: dict = {}

    def hook(uc_, intno, _ud):
        rip = uc_.reg_read(UC_X86_REG_RIP)
        if "candidates" not in found:
            after = _ctx_bytes(uc_.context_save())
            found["candidates"] = [
                off for off in range(0, len(after) - 3, 4)
                if before[off:off + 4] == _CLEARED and after[off:off + 4] == struct.pack("<i", 14)
            ]
            if found["candidates"]:
                _patch(uc_, found["candidates"][0])
        else:
            found["second"] = intno
        uc_.reg_write(UC_X86_REG_RIP, rip + 8)

    uc.hook_add(UC_HOOK_INTR, hook)
    uc.emu_start(0x8000, 0x8000 + len(code))
    if found.get("second") != 14 or not found.get("candidates"):
        raise MachineError("cannot locate Unicorn's exception state; unsupported version")
    return found["candidates"][0]


def _patch(uc, offset: int) -> None:
    ctx = uc.context_save()
    ctypes.memmove(ctx.context.value + offset, _CLEARED, 4)
    uc.context_restore(ctx)


def clear_exception_state(uc) -> None:
    """Forget the exception in progress, as entering its handler does on hardware."""
    _patch(uc, old_exception_offset())
