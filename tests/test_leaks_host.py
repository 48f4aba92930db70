"""The host side of a daemon's memory (issue 29): what the C heap frees is given back to
the host now and then, so a daemon's RSS does not creep up with the holes that Unicorn's
allocations leave under probe churn."""

from __future__ import annotations

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
