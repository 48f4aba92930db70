"""The host side of a daemon's memory (issue 29): what the C heap frees is given back to
the host now and then, so a daemon's RSS does not creep up with the holes that Unicorn's
allocations leave under probe churn."""

from __future__ import annotations

import re
import subprocess
import sys
import types

from kprobefs import daemon as daemon_module
from kprobefs.daemon import Daemon, trim_host_heap


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_trimming_gives_the_heaps_free_holes_back_to_the_host():
    """Blocks of the C heap (bytes objects past Python's small-object allocator), every
    other one freed: the holes stay in the process until the trim gives their pages
    back.  (The allocator keeps each hole's first bytes for its own lists, so the trim
    frees the pages in between.)"""
    blocks = [bytes(16 << 10) for _ in range(8192)]       # 128 MiB in 16 KiB blocks
    for i in range(len(blocks)):
        blocks[i] = bytearray(blocks[i]) if i % 2 else None  # touch, then free half
    del i
    before = _rss_kb()
    assert trim_host_heap()
    after = _rss_kb()
    assert before - after > 32 << 10, (before, after)     # most of the 64 MiB of holes
    assert all(len(b) == 16 << 10 for b in blocks[1::2])   # what is live stays


def test_the_daemons_housekeeping_trims_the_heap_now_and_then(monkeypatch):
    """The reaper's loop trims once every TRIM_INTERVAL, not at each reap (counted on a
    clock the loop's own waits move)."""
    clock = [1000.0]
    trims, reaps = [], []

    class Stop:
        def wait(self, timeout):
            clock[0] += timeout
            return len(reaps) >= 300           # set once 300 reaps have run

    monkeypatch.setattr(daemon_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(daemon_module, "trim_host_heap", lambda: trims.append(clock[0]))
    stub = types.SimpleNamespace(
        _stop=Stop(), REAP_INTERVAL=2.0, TRIM_INTERVAL=60.0,
        gateway=types.SimpleNamespace(reap=lambda: reaps.append(1) or 0))
    Daemon._reap(stub)
    assert len(reaps) == 300                   # 600 s of reaps
    assert len(trims) == 10                    # one a minute
    assert all(b - a == 60.0 for a, b in zip(trims, trims[1:]))


_THRESHOLD_CHECK = r"""
import ctypes, sys
from kprobefs.daemon import fix_host_heap_threshold

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "fixed":
    assert fix_host_heap_threshold()
libc.free(libc.malloc(8 << 20))          # a mapped block freed: glibc's threshold rises
mapped = libc.mallinfo2().hblkhd         # (what the imports left mapped aside)
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd - mapped >= 1 << 20)  # the next big block mapped on its own?
"""


def test_big_blocks_stay_mapped_on_their_own_after_one_is_freed():
    """With glibc's sliding threshold a 1 MiB block after a freed 8 MiB one comes from
    the heap (and leaves a hole there when freed); with the threshold fixed it is
    mapped on its own, and unmapped when freed."""
    def run(mode):
        return subprocess.run([sys.executable, "-c", _THRESHOLD_CHECK, mode], check=True,
                              capture_output=True, text=True, timeout=60).stdout.strip()

    assert run("sliding") == "False"
    assert run("fixed") == "True"


_REQUEST_BLOCKS_CHECK = r"""
import mmap, resource, threading
from kprobefs.daemon import fix_host_heap_threshold

assert fix_host_heap_threshold()
text, ram = bytes(8 << 20), mmap.mmap(-1, 1 << 20)


def requests():     # a 128 KiB read's blocks: its text, the user buffer, the reply
    for i in range(200):
        data = text[i * 4096:i * 4096 + 131072]
        user = ram[4096:4096 + 131072]
        reply = b"h" * 16 + user
        del data, user, reply


faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
thread = threading.Thread(target=requests)      # as a FUSE thread, in its own arena
thread.start()
thread.join()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / 200)
"""


def test_a_requests_blocks_are_not_faulted_in_again_at_every_request():
    """A 128 KiB read's blocks (its data, the user buffer read back, the reply) come
    from the heap and stay there once freed: mapped on their own each would be faulted
    in again, 32 pages, at every request (about 67 faults a request, against 2)."""
    out = subprocess.run([sys.executable, "-c", _REQUEST_BLOCKS_CHECK], check=True,
                         capture_output=True, text=True, timeout=60).stdout
    assert float(out) < 16


def test_the_status_says_where_the_daemons_own_memory_is():
    """kprobefs/status's host line: the resident set, the C heap in use, free in its
    arenas and mapped on their own, and the interpreter's blocks; a block mapped on its
    own shows in the mapped figure while it lives (what a soak watches for)."""
    from kprobefs.health import host_memory, status_text
    from kprobefs.machine import Kernel

    line = next(line for line in status_text(Kernel(cpus=1, seed=0)).splitlines()
                if line.startswith("host: "))
    assert re.fullmatch(r"host: RSS \d+ kB, heap in use \d+ kB, heap free \d+ kB, "
                        r"heap mapped \d+ kB; Python blocks \d+", line), line
    before = host_memory()
    block = bytearray(32 << 20)
    during = host_memory()
    del block
    after = host_memory()
    assert during["heap mapped"] - before["heap mapped"] >= 32 << 10
    assert during["heap mapped"] - after["heap mapped"] >= 32 << 10
    assert during["RSS"] > 0
