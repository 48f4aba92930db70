"""The kernel's memory as its allocators count it: ``/proc/meminfo`` and ``/proc/slabinfo``.

Every figure is read from the kernel's own counters (mm/page_alloc.c, mm/slab.c,
kernel/fork.c), never from the host's view, so a leak in the kernel shows here as it
would on Linux.  MemTotal is the kernel's heap (the page allocator's pages); user tasks'
pages come from the machine's separate user pool (the host's record of it is shown as
AnonPages).  No lock is taken: each counter is one aligned word, read as the kernel
left it.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["KernelMemory", "MemInfo", "SlabInfo"]

_Q = struct.Struct("<Q")
_I = struct.Struct("<I")
_PAGE_KB = 4


class MemInfo(NamedTuple):
    """The page allocator's figures, in pages (``failures``: allocations that failed
    since boot)."""

    total: int
    free: int
    slab: int
    kernel_stack: int
    large_kmalloc: int
    failures: int

    @property
    def used(self) -> int:
        return self.total - self.free


class SlabInfo(NamedTuple):
    """One kmalloc cache, as a /proc/slabinfo line."""

    name: str
    active_objs: int
    num_objs: int
    objsize: int
    objperslab: int
    num_slabs: int


class KernelMemory:
    """Reads the allocators' counters of the booted ``kernel`` (``mem``, ``image``,
    ``kabi``) and the user pool of its address space."""

    def __init__(self, kernel):
        self._mem = kernel.mem
        sym = kernel.image.symbol_value
        self._counters = [sym(name) for name in (
            "totalram_pages", "nr_free_pages_count", "nr_kernel_stack_pages",
            "nr_kmalloc_large_pages", "nr_alloc_failures")]
        kabi = kernel.kabi
        self._caches = sym("kmalloc_caches")
        self._nr_caches = kabi["kmalloc.nr_caches"]
        self._cache_size = kabi["kmem_cache.size"]
        self._at = {field: kabi[f"kmem_cache.{field}"] for field in (
            "name", "object_size", "objs_per_slab", "nr_slabs", "nr_active")}
        self._names = [self._mem.read_cstring(self._word(i, "name")).decode()
                       for i in range(self._nr_caches)]

    def _word(self, cache: int, field: str) -> int:
        return self._mem.read_u64(self._caches + cache * self._cache_size + self._at[field])

    def _u32(self, cache: int, field: str) -> int:
        at = self._caches + cache * self._cache_size + self._at[field]
        return _I.unpack(self._mem.read(at, 4))[0]

    def slabs(self) -> list[SlabInfo]:
        """The kmalloc caches, largest objects first (as Linux lists them)."""
        out = []
        for i in reversed(range(self._nr_caches)):
            per = self._u32(i, "objs_per_slab")
            slabs = self._word(i, "nr_slabs")
            out.append(SlabInfo(self._names[i], self._word(i, "nr_active"), slabs * per,
                                self._u32(i, "object_size"), per, slabs))
        return out

    def info(self) -> MemInfo:
        total, free, stack, large, failures = (self._mem.read_u64(a) for a in self._counters)
        slab = sum(s.num_slabs for s in self.slabs())
        return MemInfo(total, free, slab, stack, large, failures)

    def anon_pages(self) -> int:
        """Pages of the user pool mapped in tasks' windows now."""
        return self._mem.user_pages_in_use()

    def meminfo_text(self) -> str:
        """/proc/meminfo, in Linux's layout (fs/proc/meminfo.c), the lines that mean
        something here."""
        m = self.info()
        rows = [("MemTotal", m.total), ("MemFree", m.free), ("MemAvailable", m.free),
                ("Buffers", 0), ("Cached", 0), ("SwapCached", 0), ("SwapTotal", 0),
                ("SwapFree", 0), ("AnonPages", self.anon_pages()), ("Shmem", 0),
                ("KReclaimable", 0), ("Slab", m.slab), ("SReclaimable", 0),
                ("SUnreclaim", m.slab), ("KernelStack", m.kernel_stack)]
        return "".join(f"{name + ':':<16}{pages * _PAGE_KB:>8} kB\n" for name, pages in rows)

    def slabinfo_text(self) -> str:
        """/proc/slabinfo, format 2.1 (mm/slab_common.c), one line a kmalloc cache."""
        lines = ["slabinfo - version: 2.1\n",
                 "# name            <active_objs> <num_objs> <objsize> <objperslab> "
                 "<pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : "
                 "slabdata <active_slabs> <num_slabs> <sharedavail>\n"]
        for s in self.slabs():
            lines.append(f"{s.name:<17} {s.active_objs:>6} {s.num_objs:>6} {s.objsize:>6} "
                         f"{s.objperslab:>4} {1:>4} : tunables {0:>4} {0:>4} {0:>4} : "
                         f"slabdata {s.num_slabs:>6} {s.num_slabs:>6} {0:>6}\n")
        return "".join(lines)
