"""Static keys: the kernel's ``__jump_table``, and patching its sites with text_poke.

A static branch (include/tracepoint.h) compiles to a 5-byte NOP in the caller's text,
and an entry ``{code, target, key}`` in ``__jump_table``.  Enabling the key turns every
site of that key into ``jmp target`` (x86's ``e9 rel32``), disabling it back into the
NOP, as arch/x86/kernel/jump_label.c does; ``key->enabled`` says which, for the kernel.
"""

from __future__ import annotations

import bisect
import struct
import threading
from typing import NamedTuple

from ..errors import ImageError

__all__ = ["JumpEntry", "JumpLabels", "NOP5"]

NOP5 = bytes.fromhex("0f1f440000")     # nopl 0x0(%rax,%rax,1): what gcc's asm goto emits
_ENTRY = struct.Struct("<QQQ")          # struct jump_entry
_JMP32 = 0xE9


class JumpEntry(NamedTuple):
    code: int       # the site: 5 bytes, a NOP or a jmp
    target: int     # where the branch goes when the key is on
    key: int        # the struct static_key


class JumpLabels:
    """The jump table of ``kernel`` (anything with ``image.symbol_value``, ``read``,
    ``write`` and ``text_poke``); empty for an image without one.  Raises
    :class:`ImageError` when a site does not hold the NOP."""

    def __init__(self, kernel):
        self.kernel = kernel
        start = kernel.image.symbol_value("__start___jump_table")
        stop = kernel.image.symbol_value("__stop___jump_table")
        data = kernel.read(start, stop - start) if start is not None and stop else b""
        self.entries = tuple(JumpEntry(*e) for e in _ENTRY.iter_unpack(data))
        self._by_key: dict[int, list[JumpEntry]] = {}
        for entry in self.entries:
            if kernel.read(entry.code, 5) != NOP5:
                raise ImageError(f"jump label site {entry.code:#x} is not a NOP")
            self._by_key.setdefault(entry.key, []).append(entry)
        self._codes = sorted(e.code for e in self.entries)
        self._lock = threading.Lock()       # jump_label_mutex
        self._enabled: set[int] = set()

    def sites(self, key: int) -> list[int]:
        """Return the addresses of the key's sites (none: an unused key)."""
        return [e.code for e in self._by_key.get(key, ())]

    def is_site(self, start: int, end: int) -> bool:
        """Whether [start, end) overlaps a site (jump_label_text_reserved): the last
        site that begins before end is the only one that can."""
        i = bisect.bisect_left(self._codes, end) - 1
        return i >= 0 and start < self._codes[i] + 5

    def is_enabled(self, key: int) -> bool:
        return key in self._enabled

    def set_enabled(self, key: int, on: bool) -> None:
        """Turn the key's branches on (jumps) or off (NOPs), and tell the kernel."""
        with self._lock:
            if (key in self._enabled) == on:
                return
            for entry in self._by_key.get(key, ()):
                if on:
                    rel = entry.target - (entry.code + 5)
                    code = bytes([_JMP32]) + struct.pack("<i", rel)
                else:
                    code = NOP5
                self.kernel.text_poke(entry.code, code)
            self.kernel.write(key, struct.pack("<i", int(on)))
            (self._enabled.add if on else self._enabled.discard)(key)
