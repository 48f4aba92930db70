"""The emulated kernel's memory exhausted on purpose, seen and survived (issue 29): on a
mount whose kernel has a small heap, host processes that each hold a task (about
21 KiB of the kernel's memory) are started until a new one's request fails with ENOMEM;
then `kprobefs status` says degraded with the figures, new processes' requests fail
with ENOMEM, and once the processes are gone (their tasks released) the kernel log
has Linux's allocation-failure lines and every request works again, no restart."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from robust_mount import InProcessMount, need_fuse, read, write

pytestmark = pytest.mark.fuse

#: The test kernel's heap: a few hundred tasks fill it.
HEAP_MB = 8
MAX_HOLDERS = 2000


def small_kernel(cpus, seed):
    from kprobefs.system import Kernel
    return Kernel(cpus=cpus, seed=seed, heap_mb=HEAP_MB)


@pytest.fixture
def mnt(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt")
    m.daemon._kernel_factory = small_kernel
    yield m.start()
    m.stop()


def kmsg(path: str) -> str:
    """The records /dev/kmsg holds now (a read past the last is EAGAIN)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out = []
    try:
        while True:
            try:
                out.append(os.read(fd, 8192).decode("utf-8", "replace"))
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    return "".join(out)
                if e.errno != errno.EPIPE:      # overwritten records: read on
                    raise
    finally:
        os.close(fd)


def status(mnt) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "kprobefs", "status", str(mnt.path)],
                         capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return out.returncode, out.stdout


def test_exhaustion_is_seen_and_survived(mnt):
    t = mnt.p("tracing")
    memory = mnt.kernel.memory
    total = memory.info().total
    holders = []
    # Each holder opens a file of the mount from its own process (so it has a task and
    # an open file in the kernel) and sleeps; the first that cannot says why.
    script = f'exec 3< {t}/tracing_on && echo ok && exec sleep 300'
    try:
        while len(holders) < MAX_HOLDERS:
            p = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            holders.append(p)
            if p.stdout.readline().strip() != "ok":
                err = p.stderr.read()
                break
        else:
            pytest.fail(f"{MAX_HOLDERS} tasks fit in a {HEAP_MB} MiB heap")
        assert "Cannot allocate memory" in err, err
        assert memory.info().free < total * 0.05
        # A new process's request fails with ENOMEM as a fork without memory does.
        out = subprocess.run(["cat", f"{t}/README"], capture_output=True, text=True)
        assert out.returncode != 0 and "Cannot allocate memory" in out.stderr, out
        code, text = status(mnt)
        assert code == 1 and text.startswith("state: degraded"), text
        line = next(line for line in text.splitlines() if line.startswith("memory:"))
        assert "(low)" in line and "allocation failures" in line, line
        assert "page allocation failure" in text, text
    finally:
        for p in holders:
            p.kill()
        for p in holders:
            p.wait()
            p.stdout.close()
            p.stderr.close()
    # The tasks of the gone processes end (process events, or the reaper within 2 s) and
    # are released: the memory comes back.
    deadline = time.monotonic() + 30
    while memory.info().free < total * 0.9 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert memory.info().free >= total * 0.9, memory.info()
    log = kmsg(mnt.p("dev/kmsg"))
    assert "page allocation failure: order:" in log, log[-2000:]
    assert "Mem-Info:" in log
    # Every kind of request works again, no restart.
    out = subprocess.run(["cat", f"{t}/README"], capture_output=True, text=True)
    assert out.returncode == 0 and "tracing mini-HOWTO" in out.stdout, out.stderr
    assert write(f"{t}/kprobe_events", "p:after vfs_read\n") == 0
    assert write(f"{t}/events/kprobes/after/enable", "1\n", append=False) == 0
    os.mkdir(f"{t}/instances/after")
    assert write(f"{t}/instances/after/events/sched/sched_switch/enable", "1\n",
                 append=False) == 0
    assert write(f"{t}/instances/after/events/sched/sched_switch/enable", "0\n",
                 append=False) == 0
    os.rmdir(f"{t}/instances/after")
    assert write(f"{t}/events/kprobes/after/enable", "0\n", append=False) == 0
    assert write(f"{t}/kprobe_events", "-:after\n") == 0
    assert "MemFree:" in read(mnt.p("proc/meminfo"))
    code, text = status(mnt)
    line = next(line for line in text.splitlines() if line.startswith("memory:"))
    assert "(low)" not in line, text
