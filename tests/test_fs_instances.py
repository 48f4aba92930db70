"""Many instances through a real mount: after tracing has run, each new instance takes
its full default buffers (6.1's ring_buffer_expanded), and 100 of them, made and removed
twice, fit; the daemon's memory comes back, since an instance that records nothing holds
no pages; past the bound a resize is still ENOMEM."""

import errno
import os

import pytest

from kprobefs.tracing.buffers.ring_buffer import MAX_TOTAL_BUFFER_KB
from test_fs_mount import _need_fuse, daemon_pids, real, sh  # noqa: F401 (fixtures)

INSTANCES = 100
#: What two rounds of 100 instances may leave behind in the daemon's RSS (the
#: emulator's translated code and the allocator's free lists among it).
RSS_SLACK_KB = 12 * 1024


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    for i in range(INSTANCES):
        if os.path.isdir(f"{t}/instances/many{i}"):
            os.rmdir(f"{t}/instances/many{i}")


def make_and_remove(t, total):
    for i in range(INSTANCES):
        os.mkdir(f"{t}/instances/many{i}")
    for i in (0, INSTANCES - 1):       # made at the full size, as the top level is
        assert open(f"{t}/instances/many{i}/buffer_total_size_kb").read() == total
    with open(f"{t}/instances/many7/trace_marker", "w") as f:
        f.write("one record")
    assert "one record" in open(f"{t}/instances/many7/trace").read()
    for i in range(INSTANCES):
        os.rmdir(f"{t}/instances/many{i}")


def test_100_instances_with_default_buffers_twice(t, real):
    (daemon,) = daemon_pids(real)
    nr_cpus = len(os.listdir(f"{t}/per_cpu"))
    enable = f"{t}/events/sched/sched_switch/enable"
    assert sh(f"echo 1 > {enable}; echo 0 > {enable}").returncode == 0   # expands them
    total = open(f"{t}/buffer_total_size_kb").read()
    assert total == f"{1410 * nr_cpus}\n"       # 1408 KiB in whole pages
    make_and_remove(t, total)                  # warms the caches a round fills
    start = rss_kb(daemon)
    make_and_remove(t, total)
    make_and_remove(t, total)
    assert rss_kb(daemon) - start < RSS_SLACK_KB
    assert os.listdir(f"{t}/instances") == []


def test_past_the_bound_an_instance_resize_is_enomem(t):
    os.mkdir(f"{t}/instances/many0")
    fd = os.open(f"{t}/instances/many0/buffer_size_kb", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, b"%d" % MAX_TOTAL_BUFFER_KB)
    finally:
        os.close(fd)
    assert e.value.errno == errno.ENOMEM
    assert open(f"{t}/instances/many0/buffer_size_kb").read() == (
        open(f"{t}/buffer_size_kb").read())
