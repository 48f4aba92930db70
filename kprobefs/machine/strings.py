"""Long `rep movs` and `rep stos` carried out by the host.

The emulator runs a rep-prefixed string instruction an iteration at a time: in process, a
`pread(2)` of 64 KiB from a ramfs file took 86 µs, 50 of them the `copy_to_user`'s
8,192 `movsq` iterations.  The kernel does every copy or fill of ``BULK_STRING_BYTES``
(16 KiB) or more at an instruction it lists in its ``__bulk_string`` section
(``memcpy``, ``memset``, the user copies, ``clear_user``); a code hook on each such
instruction moves the bytes through the host's record of the page tables and leaves the
registers as the last iteration would (count 0, the pointers past the end), so the
instruction then runs with nothing left to do.  The hook's call costs about as much as
the emulator's 16 KiB, so shorter ones are not listed.

Where the whole range cannot be done that way the hook does the part it can and leaves
the rest to the emulator, which then faults at the same iteration it would have: a page
not mapped (a bad user pointer: the exception table's fixup sees the count left), a
read-only page written, a page of code written (the emulator must see that store to
drop its translations), overlapping ranges, the direction flag set, or an instruction a
kprobe has replaced.
"""

from __future__ import annotations

import ctypes
import logging

from unicorn.x86_const import (UC_X86_REG_RAX, UC_X86_REG_RCX, UC_X86_REG_RDI,
                               UC_X86_REG_RFLAGS, UC_X86_REG_RSI)

from ._fastuc import GPR_INDEX, REG_WRITES

__all__ = ["BulkStrings"]

log = logging.getLogger("kprobefs.machine.strings")

U64 = 0xFFFFFFFFFFFFFFFF
_DF = 0x400

#: encoding -> (copies, element width): the forms the kernel's bulk sites use.
_FORMS = {
    b"\xf3\x48\xa5": (True, 8),     # rep movsq
    b"\xf3\xa4": (True, 1),         # rep movsb
    b"\xf3\x48\xab": (False, 8),    # rep stosq
    b"\xf3\xaa": (False, 1),        # rep stosb
}


class BulkStrings:
    """The code hooks on the kernel's bulk string instructions.  ``done`` counts the
    instructions the host carried out (whole or in part), ``bytes`` what they moved."""

    def __init__(self, kernel, sites: tuple[int, ...]):
        self.kernel = kernel
        self.done = 0
        self.bytes = 0
        #: site address -> its code hook
        self.sites: dict[int, int] = {}
        mem = kernel.mem
        for site in sites:
            for code, form in _FORMS.items():
                if mem.read(site, len(code)) == code:
                    self.sites[site] = kernel.hook_code_raw(
                        site, site, self._hook(site, code, *form))
                    break
            else:
                log.warning("bulk string site %#x holds no rep movs or stos", site)

    def close(self) -> None:
        """Removes the hooks: the emulator runs every iteration from then on."""
        while self.sites:
            self.kernel.hook_del(self.sites.popitem()[1])

    def _hook(self, site: int, code: bytes, copies: bool, width: int):
        kernel = self.kernel
        mem = kernel.mem
        ram, spans = mem.ram, mem.spans
        base = ctypes.addressof(ctypes.c_char.from_buffer(ram))
        memmove = ctypes.memmove
        rf = kernel.register_file
        if rf is not None:          # the registers as memory: a fifth of the API's cost
            get, put, down = rf.words.__getitem__, rf.words.__setitem__, rf.direction_flag
            rcx, rsi, rdi, rax = (GPR_INDEX[r] for r in (UC_X86_REG_RCX, UC_X86_REG_RSI,
                                                         UC_X86_REG_RDI, UC_X86_REG_RAX))
        else:
            get, put = kernel.fast.get, kernel.fast.set
            rcx, rsi, rdi, rax = (UC_X86_REG_RCX, UC_X86_REG_RSI, UC_X86_REG_RDI,
                                  UC_X86_REG_RAX)

            def down() -> bool:
                return bool(get(UC_X86_REG_RFLAGS) & _DF)
        at = mem.translate(site)        # kernel text: mapped for good
        end = at + len(code)

        def hook(_handle, _address, _size, _user_data):
            if ram[at:end] != code:
                return                  # a probe's int3 or jump is there now
            try:
                count = get(rcx)
                if not count or down():
                    return
                dst = get(rdi)
                size = count * width
                into, room = spans(dst, size, True)
                if copies:
                    src = get(rsi)
                    take, have = spans(src, size, False)
                    n = min(room, have) // width * width
                    if not n or _overlap(take, into) and not _forward_safe(
                            take, into, dst, src):
                        return
                    if len(take) == 1 and len(into) == 1:
                        memmove(base + into[0][0], base + take[0][0], n)
                    else:
                        _scatter(ram, into, b"".join(ram[pa:pa + k] for pa, k in take)[:n])
                else:
                    n = room // width * width
                    if not n:
                        return
                    value = get(rax)
                    if width == 1 or not value:
                        if len(into) == 1:
                            ctypes.memset(base + into[0][0], value & 0xFF, n)
                        else:
                            _scatter(ram, into, bytes((value & 0xFF,)) * n)
                    else:
                        _scatter(ram, into, (value & U64).to_bytes(8, "little") * (n // 8))
                REG_WRITES[0] += 1
                put(rcx, count - n // width)
                put(rdi, (dst + n) & U64)
                if copies:
                    put(rsi, (src + n) & U64)
                self.done += 1
                self.bytes += n
            except Exception:   # never unwind through Unicorn: the emulator goes on
                log.exception("bulk string instruction at %#x", site)

        return hook


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(pa < qb + nb and qb < pa + na for pa, na in a for qb, nb in b)


def _forward_safe(take: list[tuple[int, int]], into: list[tuple[int, int]], dst: int,
                  src: int) -> bool:
    """Whether a forward copy from src to dst over these overlapping runs may be made
    from a copy of the source taken first: the destination at or below the source, each
    one run, physically in the order they are virtually."""
    return (dst <= src and len(take) == 1 and len(into) == 1
            and into[0][0] - take[0][0] == dst - src)


def _scatter(ram, runs: list[tuple[int, int]], data: bytes) -> None:
    """Writes data over the physical runs, in order, until it is all written."""
    view = memoryview(data)
    for pa, k in runs:
        if not view:
            return
        k = min(k, len(view))
        ram[pa:pa + k] = view[:k]
        view = view[k:]
