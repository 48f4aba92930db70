"""Physical memory, the page tables and virtual-address access from the host.

One address space serves every task: the kernel image at __START_KERNEL_map, a direct map
of all RAM at PAGE_OFFSET, and a window of user pages per task in the low half.  The host
builds every page-table entry, so it translates addresses from its own record of the
mappings instead of walking the tables.
"""

from __future__ import annotations

import ctypes
import mmap
import struct

from unicorn import UC_PROT_ALL, Uc

from ..errors import MachineError

__all__ = ["PhysicalLayout", "AddressSpace", "FaultError"]

PAGE = 4096
LARGE = 2 << 20
START_KERNEL_MAP = 0xFFFFFFFF80000000
PAGE_OFFSET = 0xFFFF888000000000
USER_WINDOW_BASE = 0x0000_0001_0000_0000
USER_WINDOW_SIZE = 16 << 20

_P, _W, _U, _PS = 1, 2, 4, 0x80
_NX = 1 << 63
_ADDR_MASK = 0x000FFFFFFFFFF000
#: EFER.NXE: page-table entries may forbid instruction fetch.
EFER_NXE = 1 << 11


class FaultError(MachineError):
    """The host touched a virtual address that is not mapped."""

    def __init__(self, addr: int):
        super().__init__(f"no mapping for {addr:#x}")
        self.addr = addr


class PhysicalLayout:
    """Where things live in physical memory: page tables, the image, the kernel's heap
    (what its page allocator manages: MemTotal), then the user pool (task windows,
    module memory) to the end of RAM.

    The defaults fit the documented limits together with room to spare: 4,096 tasks
    take about 21 KiB of heap each (a 4 KiB task_struct, a 16 KiB stack, mm, files
    and fs), 84 MiB; 16,384 dynamic events about 0.4 KiB each (their tracefs
    directory), 7 MiB; instances and ring buffers are the host's.  A 192 MiB heap is
    twice that.  RAM is a host mapping whose untouched pages cost the host nothing."""

    def __init__(self, ram_mb: int = 512, kernel_heap_mb: int = 192):
        self.ram_size = ram_mb << 20
        self.page_tables = (0x100000, 0x800000)
        self.kernel_load = 0x1000000
        self.kernel_heap_size = kernel_heap_mb << 20
        self.kernel_heap = None  # set once the image size is known

    def place_heap(self, image_end_pa: int) -> tuple[int, int]:
        start = (image_end_pa + LARGE - 1) & ~(LARGE - 1)
        self.kernel_heap = (start, start + self.kernel_heap_size)
        if self.kernel_heap[1] > self.ram_size - (16 << 20):
            raise MachineError("not enough RAM for the kernel heap and user pages")
        return self.kernel_heap


class AddressSpace:
    """The page tables (built by the host) and virtual reads/writes over them."""

    def __init__(self, uc: Uc, layout: PhysicalLayout):
        self.uc = uc
        self.layout = layout
        # RAM is a host buffer Unicorn runs on: the host reads and writes guest memory
        # as plain buffer slices, ~10x cheaper than uc.mem_read/mem_write.
        self.ram = mmap.mmap(-1, layout.ram_size)
        self._ram_ptr = ctypes.addressof(ctypes.c_char.from_buffer(self.ram))
        #: RAM as an array of 64-bit words, for hot paths: ``words[pa >> 3]`` reads or
        #: writes the aligned word at pa in half the time of a struct call.
        self.words = memoryview(self.ram).cast("Q")
        uc.mem_map_ptr(0, layout.ram_size, UC_PROT_ALL, self._ram_ptr)
        self._pt_next, self._pt_end = layout.page_tables
        self.pml4 = self._alloc_table()
        self._pages: dict[int, int] = {}  # virtual page number -> physical page address
        self._exec_pages: set[int] = set()  # virtual page numbers mapped executable
        self._ro_pages: set[int] = set()    # virtual page numbers mapped read-only
        #: physical page number -> how many virtual pages map it executable
        self._exec_frames: dict[int, int] = {}
        #: user window slot -> its mapped virtual page numbers (release without a scan
        #: of every page of the machine)
        self._window_pages: dict[int, list[int]] = {}
        self._user_free: list[int] = []
        self._user_start = self._user_next = 0
        self._user_end = layout.ram_size
        self._ram_size = layout.ram_size
        #: (PAGE_OFFSET, RAM size): a virtual address va in the direct map is at
        #: physical va - PAGE_OFFSET when that is below the size (translate's first case).
        self.direct_map = (PAGE_OFFSET, layout.ram_size)
        self._linear = (0, 0, 0)    # (start, end, va - pa) of a linearly mapped range

    # ---- page-table construction --------------------------------------------------------
    def _alloc_table(self) -> int:
        if self._pt_next >= self._pt_end:
            raise MachineError("out of page-table memory")
        pa = self._pt_next
        self._pt_next += PAGE
        self.ram[pa:pa + PAGE] = bytes(PAGE)
        return pa

    def _entry_addr(self, va: int, levels: int) -> int:
        """Physical address of the entry for va at depth `levels` (1 = PDPT … 3 = PT)."""
        table = self.pml4
        for shift in (39, 30, 21)[:levels]:
            slot = table + ((va >> shift) & 511) * 8
            (e,) = struct.unpack_from("<Q", self.ram, slot)
            if not e & _P:
                nxt = self._alloc_table()
                struct.pack_into("<Q", self.ram, slot, nxt | _P | _W | _U)
                e = nxt | _P
            table = e & _ADDR_MASK
        shift = (39, 30, 21, 12)[levels]
        return table + ((va >> shift) & 511) * 8

    def map_page(self, va: int, pa: int, writable: bool = True, user: bool = False,
                 executable: bool | None = None) -> None:
        """Map one 4 KiB page.  Unless told otherwise a page is executable exactly when it
        is not writable (W^X, as Linux maps its kernel): Unicorn keeps every store to an
        executable page on its slow path, checking for self-modifying code (about 20x the
        cost of a store to a no-execute page), so data must be NX."""
        if executable is None:
            executable = not writable
        flags = (_P | (_W if writable else 0) | (_U if user else 0)
                 | (0 if executable else _NX))
        struct.pack_into("<Q", self.ram, self._entry_addr(va, 3), pa | flags)
        self._forget_page(va >> 12)
        self._pages[va >> 12] = pa
        if executable:
            self._exec_pages.add(va >> 12)
            self._exec_frames[pa >> 12] = self._exec_frames.get(pa >> 12, 0) + 1
        if not writable:
            self._ro_pages.add(va >> 12)

    def unmap_page(self, va: int) -> None:
        struct.pack_into("<Q", self.ram, self._entry_addr(va, 3), 0)
        self._forget_page(va >> 12)

    def _forget_page(self, vpn: int) -> None:
        """Drops the host's record of virtual page vpn's mapping."""
        pa = self._pages.pop(vpn, None)
        self._ro_pages.discard(vpn)
        if vpn in self._exec_pages:
            self._exec_pages.discard(vpn)
            left = self._exec_frames.pop(pa >> 12, 1) - 1
            if left:
                self._exec_frames[pa >> 12] = left

    def is_executable(self, va: int) -> bool:
        """Whether the page of va is mapped executable (kernel or module text)."""
        return (va & 0xFFFFFFFFFFFFFFFF) >> 12 in self._exec_pages

    def map_large(self, va: int, pa: int, writable: bool = True) -> None:
        """Map one 2 MiB page of data (never executable)."""
        flags = _P | _PS | (_W if writable else 0) | _NX
        struct.pack_into("<Q", self.ram, self._entry_addr(va, 2), pa | flags)

    def setup_kernel_mappings(self, image_segments) -> None:
        """Map the image with 4 KiB pages (text read-only) and all RAM at PAGE_OFFSET."""
        for seg in image_segments:
            start = seg.vaddr & ~(PAGE - 1)
            end = (seg.vaddr + seg.memsz + PAGE - 1) & ~(PAGE - 1)
            for va in range(start, end, PAGE):
                self.map_page(va, seg.paddr + (va - seg.vaddr), writable=seg.writable,
                              executable=seg.executable)
        for off in range(0, self.layout.ram_size, LARGE):
            self.map_large(PAGE_OFFSET + off, off)
        # The image's last segment (data and bss: the boot and idle stacks) is mapped
        # linearly: translate() finds it by a range check, not a page lookup.
        last = max(image_segments, key=lambda seg: seg.vaddr)
        start = last.vaddr & ~(PAGE - 1)
        end = (last.vaddr + last.memsz + PAGE - 1) & ~(PAGE - 1)
        self._linear = (start, end, start - self._pages[start >> 12])

    # ---- translation --------------------------------------------------------------------
    def translate(self, va: int) -> int:
        """Physical address of va; raises FaultError if unmapped.  (The direct map,
        where task stacks and the heap live, and the image's data are checked first:
        no page is mapped in either one by one.)"""
        va &= 0xFFFFFFFFFFFFFFFF
        pa = va - PAGE_OFFSET
        if 0 <= pa < self._ram_size:
            return pa
        start, end, delta = self._linear
        if start <= va < end:
            return va - delta
        pa = self._pages.get(va >> 12)
        if pa is not None:
            return pa | (va & 0xFFF)
        raise FaultError(va)

    def is_mapped(self, va: int) -> bool:
        try:
            self.translate(va)
            return True
        except FaultError:
            return False

    def _run(self, va: int, size: int) -> tuple[int, int]:
        """(physical address, length) of the longest physically contiguous run of at
        most size bytes at va (va masked to 64 bits); raises FaultError if va is
        unmapped.  The direct map and the image's data are one run; other pages (a
        user window's) are joined while each next page follows the last."""
        pa = va - PAGE_OFFSET
        if 0 <= pa and pa + size <= self._ram_size:
            return pa, size
        pa = self.translate(va)
        n = PAGE - (va & 0xFFF)
        if n >= size:
            return pa, size
        start, end, _delta = self._linear
        if start <= va < end:
            return pa, min(size, end - va)
        # an unmapped page ends it: the caller meets it next
        return pa, self._following(va >> 12, pa - (va & 0xFFF), n, size)

    def _following(self, vpn: int, frame: int, n: int, size: int,
                   refused: frozenset | set = frozenset()) -> int:
        """``n``, the bytes of a run to the end of virtual page ``vpn`` (at physical
        ``frame``), taken on over the pages that follow it physically but those in
        ``refused``, up to ``size``."""
        pages = self._pages
        while n < size:
            vpn += 1
            frame += PAGE
            if pages.get(vpn) != frame or vpn in refused:
                break
            n += PAGE
        return min(n, size)

    def spans(self, va: int, size: int, write: bool) -> tuple[list[tuple[int, int]], int]:
        """The physical runs ``[(pa, length)]`` of the longest start of [va, va+size)
        that the CPU may read (with write: write, where CR0.WP holds it to the page
        tables, and not onto a page of code, whose translations the emulator would keep),
        and how many bytes they hold."""
        runs = []
        done = 0
        ram_size = self._ram_size
        start, end, delta = self._linear
        pages, read_only, code = self._pages, self._ro_pages, self._exec_frames
        while done < size:
            at = (va + done) & 0xFFFFFFFFFFFFFFFF
            want = size - done
            pa = at - PAGE_OFFSET
            if 0 <= pa < ram_size:                  # the direct map, writable
                n = min(want, ram_size - pa)
            elif start <= at < end:                 # the image's data, writable
                pa, n = at - delta, min(want, end - at)
            else:
                vpn = at >> 12
                frame = pages.get(vpn)
                if frame is None or (write and vpn in read_only):
                    break
                pa = frame | (at & 0xFFF)
                n = self._following(vpn, frame, PAGE - (at & 0xFFF), want,
                                    read_only if write else frozenset())
            if write and code and not code.keys().isdisjoint(
                    range(pa >> 12, ((pa + n - 1) >> 12) + 1)):
                break
            if runs and runs[-1][0] + runs[-1][1] == pa:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((pa, n))
            done += n
        return runs, done

    def read(self, va: int, size: int) -> bytes:
        """Read size bytes at a virtual address (may span pages)."""
        va &= 0xFFFFFFFFFFFFFFFF
        if (va & 0xFFF) + size <= PAGE:
            pa = self.translate(va)
            return self.ram[pa:pa + size]
        parts = []
        while size > 0:
            pa, n = self._run(va, size)
            parts.append(self.ram[pa:pa + n])
            va += n
            size -= n
        return b"".join(parts)

    def write(self, va: int, data: bytes) -> None:
        """Write bytes at a virtual address, ignoring page protections (as the host)."""
        va &= 0xFFFFFFFFFFFFFFFF
        if (va & 0xFFF) + len(data) <= PAGE:       # one page: one slice assignment
            pa = self.translate(va)
            self.ram[pa:pa + len(data)] = data
            return
        mv = memoryview(data)
        while mv:
            pa, n = self._run(va, len(mv))
            self.ram[pa:pa + n] = mv[:n]
            va += n
            mv = mv[n:]

    def view(self, va: int, size: int) -> memoryview:
        """A writable view of ``size`` bytes at ``va``, which must be physically
        contiguous (the kernel image's own data is); raises FaultError otherwise."""
        pa = self.translate(va)
        last = va + size - 1
        if self.translate(last) != pa + size - 1 or any(
                self.translate(page) != pa + (page - va)
                for page in range((va | 0xFFF) + 1, last, PAGE)):
            raise FaultError(va)
        return memoryview(self.ram)[pa:pa + size]

    def write_u64(self, va: int, value: int) -> None:
        va &= 0xFFFFFFFFFFFFFFFF
        if va & 0xFFF <= PAGE - 8:
            struct.pack_into("<Q", self.ram, self.translate(va), value & 0xFFFFFFFFFFFFFFFF)
        else:
            self.write(va, struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF))

    def read_u64(self, va: int) -> int:
        if va & 0xFFF <= PAGE - 8:
            return struct.unpack_from("<Q", self.ram, self.translate(va))[0]
        return struct.unpack("<Q", self.read(va, 8))[0]

    def read_cstring(self, va: int, limit: int = 4096) -> bytes:
        """Bytes up to (not including) the first NUL, at most limit bytes."""
        out = bytearray()
        while len(out) < limit:
            n = min(limit - len(out), PAGE - (va & 0xFFF))
            chunk = self.read(va, n)
            nul = chunk.find(b"\0")
            if nul >= 0:
                return bytes(out + chunk[:nul])
            out += chunk
            va += n
        return bytes(out)

    # ---- user windows -------------------------------------------------------------------
    def set_user_pool(self, start_pa: int) -> None:
        self._user_start = self._user_next = start_pa

    def user_pages_in_use(self) -> int:
        """Pages of the user pool handed out (task windows, module memory)."""
        return (self._user_next - self._user_start) // PAGE - len(self._user_free)

    def _alloc_user_page(self) -> int:
        if self._user_free:
            return self._user_free.pop()
        if self._user_next + PAGE > self._user_end:
            raise MachineError("out of user memory")
        pa = self._user_next
        self._user_next += PAGE
        return pa

    def alloc_page(self) -> int:
        """A zeroed physical page from the free pool user windows draw from too (module
        memory comes from here); give it back with free_page()."""
        pa = self._alloc_user_page()
        self.ram[pa:pa + PAGE] = bytes(PAGE)
        return pa

    def free_page(self, pa: int) -> None:
        """Return a page alloc_page() gave; the caller has unmapped it."""
        self._user_free.append(pa)

    def ensure_user_pages(self, va: int, size: int) -> None:
        """Back [va, va+size) with zeroed user pages where not yet mapped."""
        first, last = va & ~(PAGE - 1), (va + max(size, 1) - 1) & ~(PAGE - 1)
        if first == last and first >> 12 in self._pages:
            return      # one page, mapped (a system call's arguments, mostly)
        for page in range(first, last + PAGE, PAGE):
            if page >> 12 not in self._pages:
                pa = self._alloc_user_page()
                self.ram[pa:pa + PAGE] = bytes(PAGE)
                self.map_page(page, pa, writable=True, user=True)
                self._window_pages.setdefault(_window_slot(page), []).append(page >> 12)

    def release_user_window(self, base: int) -> None:
        """Unmap and free every page of the window at base.  The highest first: the
        free list gives its last page first, so a window mapped upwards next gets them
        in the order they had, one physical run as read() and write() like them."""
        for vpn in reversed(self._window_pages.pop(_window_slot(base), ())):
            pa = self._pages.get(vpn)
            if pa is not None:
                self.unmap_page(vpn << 12)
                self._user_free.append(pa)

    def flush_tlb(self) -> None:
        """Drop the CPU's cached translations after page-table changes (a CR3 reload,
        as on real hardware)."""
        from unicorn.x86_const import UC_X86_REG_CR3

        self.uc.reg_write(UC_X86_REG_CR3, self.pml4)


def _window_slot(va: int) -> int:
    """The user window slot va falls in (-1 below the windows)."""
    return (va - USER_WINDOW_BASE) // USER_WINDOW_SIZE if va >= USER_WINDOW_BASE else -1
