"""Load: concurrent writers of kprobe_events, enable/disable togglers, trace_marker
writers, trace and trace_pipe readers and the background workload, all at once on a real
mount (served in-process), for a bounded time ($KPROBEFS_SOAK_SECONDS, default 12 s).
Then: no deadlock (every thread finished), no lost command (every accepted probe is
there, in kprobe_events and kprobes/list), no event delivered twice to the trace_pipe
readers (each marker carries a unique sequence number), and an overflowing buffer says
how many events it lost in the trace header.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter

import pytest

from robust_mount import InProcessMount, need_fuse, read, write

pytestmark = pytest.mark.fuse

SOAK_SECONDS = float(os.environ.get("KPROBEFS_SOAK_SECONDS", "12"))
FUNCTIONS = ["vfs_read", "vfs_write", "do_sys_open", "getname", "close_fd", "kernel_clone"]
_MARK = re.compile(r"tracing_mark_write: (m\d+-\d+)$")


@pytest.fixture
def mnt(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt", workload_rate=150, seed=3).start()
    yield m
    m.stop()


def test_soak_writers_togglers_readers_and_workload(mnt):
    t = mnt.p("tracing")
    assert write(f"{t}/buffer_size_kb", "256\n", append=False) == 0
    assert write(f"{t}/kprobe_events", "p:base vfs_write count=%dx:u64\n") == 0
    assert write(f"{t}/events/kprobes/base/enable", "1\n", append=False) == 0
    stop = threading.Event()
    errors: list[str] = []
    accepted: list[list[str]] = [[] for _ in range(4)]
    marks_written: list[int] = [0, 0]
    consumed: list[list[str]] = [[] for _ in range(3)]
    counts = Counter()

    def guard(fn):
        def run(*args):
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(f"{fn.__name__}{args}: {e!r}")
        return run

    @guard
    def writer(w):
        i = 0
        while not stop.is_set():
            name = f"w{w}_{i}"
            fn = FUNCTIONS[(w + i) % len(FUNCTIONS)]
            err = write(f"{t}/kprobe_events", f"p:{name} {fn} a=%di\n")
            assert err == 0, (name, err)
            accepted[w].append(name)
            if len(accepted[w]) > 25:    # delete an older, never enabled one of ours
                gone = accepted[w].pop(0)
                assert write(f"{t}/kprobe_events", f"-:{gone}\n") == 0, gone
            i += 1
            counts["commands"] += 1

    @guard
    def toggler(k):
        i = 0
        while not stop.is_set():
            on = "1\n" if i % 2 == 0 else "0\n"
            err = write(f"{t}/events/kprobes/base/enable", on, append=False)
            assert err == 0, err
            if k:
                err = write(f"{t}/set_event", "kprobes:base" if i % 3 else "!kprobes:base")
            else:
                err = write(f"{t}/tracing_on", "1\n", append=False)
            assert err == 0, err
            i += 1
            counts["toggles"] += 1

    @guard
    def marker(k):
        n = 0
        while not stop.is_set():
            err = write(f"{t}/trace_marker", f"m{k}-{n}")
            assert err == 0, err
            n += 1
            marks_written[k] = n

    @guard
    def pipe_reader(r):
        fd = os.open(f"{t}/trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    if stop.is_set():
                        break
                    time.sleep(0.01)
                    continue
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    m = _MARK.search(line.decode("utf-8", "replace"))
                    if m:
                        consumed[r].append(m.group(1))
        finally:
            os.close(fd)

    @guard
    def trace_reader():
        while not stop.is_set():
            text = read(f"{t}/trace")
            assert text.startswith("# tracer: nop")
            counts["trace reads"] += 1

    threads = ([threading.Thread(target=writer, args=(w,)) for w in range(4)]
               + [threading.Thread(target=toggler, args=(k,)) for k in range(2)]
               + [threading.Thread(target=marker, args=(k,)) for k in range(2)]
               + [threading.Thread(target=pipe_reader, args=(r,)) for r in range(3)]
               + [threading.Thread(target=trace_reader)])
    for th in threads:
        th.start()
    time.sleep(SOAK_SECONDS)
    stop.set()
    for th in threads:
        th.join(float(os.environ.get('KPROBEFS_SOAK_JOIN', '60')))
    alive = [th for th in threads if th.is_alive()]
    if alive:
        import sys
        import traceback
        frames = sys._current_frames()
        for ident, frame in frames.items():
            text = "".join(traceback.format_stack(frame))
            if "kprobefs" in text or "robust" in text:
                print(text[-2500:])
    assert not alive, "deadlock: threads still running"
    assert not errors, errors[:5]
    assert counts["commands"] > 20 and counts["toggles"] > 20 and sum(marks_written) > 50

    # Every accepted probe is there (and nothing else but base).
    want = {"base"} | {name for names in accepted for name in names}
    lines = read(f"{t}/kprobe_events").splitlines()
    have = {line.split()[0].split("/")[1] for line in lines}
    assert have == want
    assert len(read(mnt.p("kprobes/list")).splitlines()) == len(want)

    # No marker was consumed twice; every consumed marker was written.
    seen = Counter(mark for marks in consumed for mark in marks)
    assert seen and max(seen.values()) == 1, seen.most_common(3)
    for mark in seen:
        k, n = map(int, mark[1:].split("-"))
        assert n < marks_written[k]

    # The workload ran all along (the mount did not starve it, nor it the mount).
    assert mnt.daemon.workload is not None and mnt.daemon.workload.completed > 0


def test_an_overflowing_buffer_reports_lost_events(mnt):
    t = mnt.p("tracing")
    assert write(f"{t}/buffer_size_kb", "8\n", append=False) == 0
    assert write(f"{t}/trace", "", trunc=True) == 0
    fd = os.open(f"{t}/trace_marker", os.O_WRONLY)
    try:
        for n in range(3000):
            os.write(fd, f"lost-{n}".encode())
    finally:
        os.close(fd)
    header = read(f"{t}/trace").split("\n", 4)[2]
    m = re.match(r"# entries-in-buffer/entries-written: (\d+)/(\d+)", header)
    assert m, header
    entries, written = map(int, m.groups())
    assert written >= 3000 > entries
