"""Long `rep movs`/`rep stos` carried out by the host (machine/strings.py): the same
bytes, registers and faults as the emulator's own iterations give."""

import errno

import pytest

from kprobefs.machine import Kernel, UserBuffer
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDONLY, O_RDWR
from kprobefs.machine.memory import PAGE, PAGE_OFFSET


@pytest.fixture
def kernel():
    return Kernel(cpus=1, seed=0)


def _file(kernel, task, path, data):
    fd = kernel.syscall(task, "openat", AT_FDCWD, path, O_CREAT | O_RDWR, 0o644)
    assert fd >= 0
    assert kernel.syscall(task, "write", fd, data, len(data)) == len(data)
    return fd


def test_a_long_copy_to_and_from_user_is_the_hosts_and_moves_the_same_bytes(kernel):
    bulk = kernel.bulk_strings
    assert len(bulk.sites) == 5             # memcpy, memset, the user copy, clear_user
    t = kernel.spawn("copy")
    data = bytes(range(251)) * 100          # 25,100 bytes: not a whole number of quads
    done, moved = bulk.done, bulk.bytes
    fd = _file(kernel, t, "/tmp/long", data)
    assert bulk.done > done and bulk.bytes - moved >= len(data) // 8 * 8
    for offset, size in ((0, len(data)), (3, 20_000), (len(data) - 17_000, 32_768)):
        assert kernel.syscall(t, "lseek", fd, offset, 0) == offset
        buf = UserBuffer(size)
        done = bulk.done
        n = kernel.syscall(t, "read", fd, buf, size)
        assert n == min(size, len(data) - offset)
        assert buf.data[:n] == data[offset:offset + n]
        assert bulk.done == done + 1
    # a shorter copy stays with the emulator
    assert kernel.syscall(t, "lseek", fd, 0, 0) == 0
    done = bulk.done
    buf = UserBuffer(4096)
    assert kernel.syscall(t, "read", fd, buf, 4096) == 4096 and buf.data == data[:4096]
    assert bulk.done == done


def test_a_long_clear_user_fills_with_zeroes(kernel):
    t = kernel.spawn("zero")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/dev/zero", O_RDONLY, 0)
    buf = UserBuffer(20_000, b"\xff" * 20_000)
    done = kernel.bulk_strings.done
    assert kernel.syscall(t, "read", fd, buf, 20_000) == 20_000
    assert buf.data == bytes(20_000) and kernel.bulk_strings.done == done + 1


def _read_at_unmapped_tail(kernel, data, into, size):
    """read(2) of size bytes of a file holding data into user memory at into, whose
    pages from into + 2 pages on are unmapped; (result, the bytes that arrived, the
    instructions the host carried out)."""
    t = kernel.spawn("fault")
    fd = _file(kernel, t, "/tmp/fault", data)
    assert kernel.syscall(t, "lseek", fd, 0, 0) == 0
    mem = kernel.mem
    page = into & ~(PAGE - 1)
    mem.ensure_user_pages(page, 2 * PAGE)
    mem.write(page, b"\xee" * 2 * PAGE)
    for extra in range(2, 6):
        mem.unmap_page(page + extra * PAGE)
    mem.flush_tlb()
    done = kernel.bulk_strings.done
    n = kernel.syscall(t, "read", fd, into, size)
    return n, mem.read(into, page + 2 * PAGE - into), kernel.bulk_strings.done - done


@pytest.mark.parametrize("misalign", [0, 5, PAGE - 3])
def test_a_copy_that_runs_into_an_unmapped_page_stops_where_the_emulator_stops(misalign):
    """The host copies what it can and the emulator faults at the same iteration: the
    exception table's fixup returns the same count left, and the same bytes arrived."""
    data = bytes(range(256)) * 64           # 16 KiB
    results = []
    for hooked in (True, False):
        kernel = Kernel(cpus=1, seed=0)
        if not hooked:
            kernel.bulk_strings.close()
        t_window = kernel.spawn("w").window
        into = t_window + 8 * PAGE + misalign
        results.append(_read_at_unmapped_tail(kernel, data, into, len(data)))
    (n, arrived, by_host), (n_ref, arrived_ref, _) = results
    assert by_host == 1 and (n, arrived) == (n_ref, arrived_ref)
    assert 0 < n < len(data) and arrived[:n] == data[:n]


def test_a_buffer_wholly_unmapped_is_efault(kernel):
    t = kernel.spawn("efault")
    fd = _file(kernel, t, "/tmp/efault", bytes(20_000))
    assert kernel.syscall(t, "lseek", fd, 0, 0) == 0
    assert kernel.syscall(t, "read", fd, t.window + 0x800000, 20_000) == -errno.EFAULT


def test_memory_the_host_may_not_write_is_left_to_the_emulator(kernel):
    """Read-only pages and the pages of code (through any mapping) are not spans the
    host writes; the direct map and user pages are."""
    mem = kernel.mem
    (fn,) = kernel.image.lookup_name("vfs_read")
    text_alias = PAGE_OFFSET + mem.translate(fn.addr)
    assert mem.spans(fn.addr, 64, False)[1] == 64
    assert mem.spans(fn.addr, 64, True) == ([], 0)
    assert mem.spans(text_alias, 64, True) == ([], 0)
    data = PAGE_OFFSET + 0x900000
    runs, n = mem.spans(data, 3 * PAGE, True)
    assert runs == [(0x900000, 3 * PAGE)] and n == 3 * PAGE
    t = kernel.spawn("spans")
    mem.ensure_user_pages(t.window, 2 * PAGE)
    assert mem.spans(t.window + 10, 2 * PAGE, True)[1] == 2 * PAGE - 10


def test_overlapping_moves_give_memmoves_result(kernel):
    """memmove to a lower address of a direct-map range is memcpy's forward copy, done
    by the host from a copy of the source; to a higher address the byte loop."""
    base = PAGE_OFFSET + 0x900000
    data = bytes(range(256)) * 80           # 20 KiB
    for dst, src in ((base, base + 100), (base + 100, base)):
        kernel.write(base, data + bytes(256))
        done = kernel.bulk_strings.done
        kernel.upcall("memmove", dst, src, len(data))
        assert kernel.bulk_strings.done == done + (dst < src)
        expect = bytearray(data + bytes(256))
        expect[dst - base:dst - base + len(data)] = data[:len(data)] if src == base else \
            (data + bytes(256))[100:100 + len(data)]
        assert kernel.read(base, len(data) + 256) == bytes(expect)
