"""Return probes whose entry runs as kernel code: the host side of the return-probe half
of kernel/kprobes_native.c.

A kretprobe with a Python return handler and no entry handler gets a ``struct
kretprobe_native`` in the kernel: how many instances it may still take (maxactive less
its pending returns), how many are pending in the kernel, and its id.  The engine names
``kretprobe_native_entry`` as the probe's native pre-handler, so a boosted int3, a
detour or an ftrace trampoline hijacks the return address in the kernel, as Linux's
``pre_handler_kretprobe`` does, with no host code on the entry.  The function then
returns into ``kretprobe_native_trampoline``: the kernel finds the instance on the
task's list, puts the real return address back and leaves the probe's id, the return
address, the slot and the task in its CPU's ``struct kretprobe_native_ret``; the
host's code hook after it (:meth:`KprobeEngine.kretprobe_native_return`) runs the
Python handler with the registers as the function returned them.  A task freed with
returns pending gives their instances back in the kernel (rethook_flush_task).

The host's own entry path (single-stepped or emulated instructions, several probes at
one address) takes and gives back instances through the same count (:meth:`take`,
:meth:`give`), so ``maxactive`` bounds both paths together.  A miss in the kernel is
counted on the probe's ``nmissed`` at once, by ``HC_KRETPROBE_MISSED``.
"""

from __future__ import annotations

import struct

__all__ = ["KretprobeNatives"]

_LAYOUT = struct.Struct("<4Q")
_FREE, _PENDING, _ID = 0, 1, 2      # words of struct kretprobe_native


class KretprobeNatives:
    """The kernel's struct kretprobe_native slots and per-CPU return records."""

    def __init__(self, kernel):
        img = kernel.image
        self.entry = img.symbol_value("kretprobe_native_entry")
        base = img.symbol_value("kretprobe_natives")
        rets = img.symbol_value("kretprobe_native_rets")
        layout = img.symbol_value("kretprobe_native_layout")
        add_hypercall = getattr(kernel, "add_hypercall", None)
        self.available = None not in (self.entry, base, rets, layout, add_hypercall)
        self.words = self._words = kernel.mem.words
        self._slots: list[int] = []                   # free struct addresses
        self._retired: list[tuple[int, int]] = []     # (address, word): returns pending
        self.by_id: dict[int, object] = {}            # id -> Kretprobe
        self._next_id = 1
        self.rets: list[int] = []                     # each CPU's record, as a word index
        if not self.available:
            return
        size, count, ret_size, cpus = _LAYOUT.unpack(kernel.read(layout, _LAYOUT.size))
        self._slots = [base + i * size for i in range(count - 1, -1, -1)]
        self._translate = kernel.mem.translate
        self.rets = [self._translate(rets + cpu * ret_size) >> 3
                     for cpu in range(min(cpus, kernel.nr_cpus))]
        add_hypercall("KRETPROBE_MISSED", self._hc_missed)

    # ---- per probe ----------------------------------------------------------------------
    def attach(self, rp) -> bool:
        """Give rp a struct in the kernel with every instance free (False: none left,
        the host's entry handler serves it)."""
        if not self.available:
            return False
        self._reclaim()
        if not self._slots:
            return False
        addr = self._slots.pop()
        rp_id, self._next_id = self._next_id, self._next_id + 1
        word = self._translate(addr) >> 3
        words = self._words
        words[word + _FREE] = len(rp.free_instances)
        words[word + _PENDING] = 0
        words[word + _ID] = rp_id
        self.by_id[rp_id] = rp
        rp.native_at, rp.native_word, rp.native_id = addr, word, rp_id
        return True

    def detach(self, rp) -> None:
        """rp is unregistered: its returns still pending in the kernel come back
        without a handler, and its struct is reused once none is left."""
        if not rp.native_at:
            return
        self._words[rp.native_word + _ID] = 0
        self.by_id.pop(rp.native_id, None)
        self._retired.append((rp.native_at, rp.native_word))
        rp.native_at = rp.native_word = rp.native_id = 0
        self._reclaim()

    def _reclaim(self) -> None:
        words = self._words
        still = []
        for addr, word in self._retired:
            if words[word + _PENDING]:
                still.append((addr, word))
            else:
                self._slots.append(addr)
        self._retired = still

    def take(self, rp) -> bool:
        """The host's entry path takes one of rp's instances; False when none is free."""
        word = rp.native_word + _FREE
        free = self._words[word]
        if not free:
            return False
        self._words[word] = free - 1
        return True

    def give(self, rp) -> None:
        """One of rp's instances the host's entry path took is free again."""
        if rp.native_at:
            self._words[rp.native_word + _FREE] += 1

    def _hc_missed(self, rp_id: int, *_args) -> int:
        rp = self.by_id.get(rp_id)
        if rp is not None:
            rp.nmissed += 1
        return 0
