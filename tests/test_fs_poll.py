"""poll(2), select(2) and epoll on the pipes through a real mount (FUSE_POLL and its
FUSE_NOTIFY_POLL): an empty ``trace_pipe`` is not readable until a record arrives, as
6.1's trace_poll; a per-CPU pipe (``per_cpu/cpuN/trace_pipe_raw``, ``trace_pipe``)
until ``buffer_percent`` of its CPU's buffer is filled; a file without a poll of its
own is always readable and writable (Linux's DEFAULT_POLLMASK)."""

import os
import select
import threading
import time

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

READABLE = select.POLLIN | select.POLLRDNORM
DEFAULT_POLLMASK = select.POLLIN | select.POLLOUT | select.POLLRDNORM | select.POLLWRNORM
#: How long a poll that must not return waits (ms), and one that must at most (ms).
QUIET_MS, WAKE_MS = 400, 10_000


@pytest.fixture
def t(real):
    """MNT/tracing with an empty buffer, and the sizes and buffer_percent put back."""
    t = f"{real}/tracing"
    assert sh(f"echo > {t}/trace").returncode == 0
    yield t
    sh(f"echo 50 > {t}/buffer_percent; echo 1408 > {t}/buffer_size_kb; echo > {t}/trace; "
       f"rmdir {t}/instances/polled 2>/dev/null")


def mark(t, text="hello"):
    with open(f"{t}/trace_marker", "w") as f:
        f.write(text)


def mark_later(t, text="hello", delay=0.3):
    """A marker written by another thread after delay seconds."""
    thread = threading.Thread(target=lambda: (time.sleep(delay), mark(t, text)))
    thread.start()
    return thread


def poll_ms(fd, timeout_ms):
    """(revents or 0, milliseconds the poll took), asking for every event a file
    may have."""
    p = select.poll()
    p.register(fd, DEFAULT_POLLMASK)
    start = time.monotonic()
    events = p.poll(timeout_ms)
    return (events[0][1] if events else 0), (time.monotonic() - start) * 1000


def opened(path):
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def test_poll_on_an_empty_trace_pipe_waits_for_a_record(t):
    fd = opened(f"{t}/trace_pipe")
    try:
        revents, took = poll_ms(fd, QUIET_MS)
        assert revents == 0 and took >= QUIET_MS * 0.9
        writer = mark_later(t)
        revents, took = poll_ms(fd, WAKE_MS)
        writer.join()
        assert revents == READABLE and took < WAKE_MS
        assert os.read(fd, 4096).endswith(b": tracing_mark_write: hello\n")
        assert poll_ms(fd, 0)[0] == 0      # read empty again
    finally:
        os.close(fd)


def test_select_on_an_empty_trace_pipe_waits_for_a_record(t):
    fd = opened(f"{t}/trace_pipe")
    try:
        assert select.select([fd], [], [], QUIET_MS / 1000) == ([], [], [])
        writer = mark_later(t)
        assert select.select([fd], [], [], WAKE_MS / 1000) == ([fd], [], [])
        writer.join()
        assert b"tracing_mark_write: hello" in os.read(fd, 4096)
    finally:
        os.close(fd)


def test_epoll_on_an_empty_trace_pipe_waits_for_each_record(t):
    fd = opened(f"{t}/trace_pipe")
    ep = select.epoll()
    try:
        ep.register(fd, select.EPOLLIN)
        assert ep.poll(QUIET_MS / 1000) == []
        for word in ("one", "two"):     # level-triggered: polled again after each read
            writer = mark_later(t, word)
            assert ep.poll(WAKE_MS / 1000) == [(fd, select.EPOLLIN)]
            writer.join()
            assert os.read(fd, 4096).endswith(f"tracing_mark_write: {word}\n".encode())
            assert ep.poll(0) == []
    finally:
        ep.close()
        os.close(fd)


@pytest.fixture
def raw_pipes(t):
    """Every CPU's trace_pipe_raw, with buffer_percent 0 (a record makes a CPU's
    pipe readable; a marker lands on whichever CPU runs its write)."""
    assert sh(f"echo 0 > {t}/buffer_percent").returncode == 0
    fds = [opened(f"{t}/per_cpu/{cpu}/trace_pipe_raw") for cpu in os.listdir(f"{t}/per_cpu")]
    yield fds
    for fd in fds:
        os.close(fd)


def test_select_on_empty_trace_pipe_raws_waits_for_a_record(t, raw_pipes):
    assert select.select(raw_pipes, [], [], QUIET_MS / 1000) == ([], [], [])
    writer = mark_later(t, "raw hello")
    ready, _, _ = select.select(raw_pipes, [], [], WAKE_MS / 1000)
    writer.join()
    assert len(ready) == 1
    page = os.read(ready[0], 4096)
    assert len(page) == 4096 and b"raw hello" in page
    assert select.select(raw_pipes, [], [], 0) == ([], [], [])


def test_epoll_on_empty_trace_pipe_raws_waits_for_each_record(t, raw_pipes):
    ep = select.epoll()
    try:
        for fd in raw_pipes:
            ep.register(fd, select.EPOLLIN)
        assert ep.poll(QUIET_MS / 1000) == []
        for word in (b"first", b"second"):
            writer = mark_later(t, word.decode())
            ready = ep.poll(WAKE_MS / 1000)
            writer.join()
            assert [events for _fd, events in ready] == [select.EPOLLIN]
            assert word in os.read(ready[0][0], 4096)
            assert ep.poll(0) == []
    finally:
        ep.close()


def test_poll_on_an_instances_trace_pipe_waits_for_its_own_records(t):
    inst = f"{t}/instances/polled"
    os.mkdir(inst)
    fd = opened(f"{inst}/trace_pipe")
    try:
        mark(t, "top")          # the top buffer's: not the instance's
        assert poll_ms(fd, QUIET_MS)[0] == 0
        writer = mark_later(inst, "mine")
        assert poll_ms(fd, WAKE_MS)[0] == READABLE
        writer.join()
        assert os.read(fd, 4096).endswith(b"tracing_mark_write: mine\n")
    finally:
        os.close(fd)


def poll_all(fds, timeout_ms):
    """{fd: revents} of the fds ready within timeout_ms."""
    p = select.poll()
    for fd in fds:
        p.register(fd, DEFAULT_POLLMASK)
    return dict(p.poll(timeout_ms))


@pytest.mark.parametrize("pipe", ["trace_pipe_raw", "trace_pipe"])
def test_poll_on_a_cpus_pipe_waits_for_buffer_percent(t, pipe):
    """8 KiB is 3 pages a CPU: buffer_percent 50 wants 2 of them (the page being
    written counts), 0 wants a record; the top trace_pipe wants a record whatever
    buffer_percent says (6.1's ring_buffer_poll_wait on all CPUs).  A marker lands on
    whichever emulated CPU runs its write: every CPU's pipe is polled."""
    assert sh(f"echo 8 > {t}/buffer_size_kb; echo > {t}/trace").returncode == 0
    fds = [opened(f"{t}/per_cpu/{cpu}/{pipe}") for cpu in os.listdir(f"{t}/per_cpu")]
    top = opened(f"{t}/trace_pipe")
    try:
        writer = mark_later(t, "x" * 1000)
        assert poll_all(fds, QUIET_MS) == {}         # within a CPU's first page
        writer.join()
        assert poll_ms(top, 0)[0] == READABLE
        # ten records of a quarter page each: one CPU has two pages at least
        writer = threading.Thread(target=lambda: [mark(t, "z" * 1000) for _ in range(10)])
        writer.start()
        ready = poll_all(fds, WAKE_MS)
        writer.join()
        assert ready and set(ready.values()) == {READABLE}
        assert sh(f"echo > {t}/trace; echo 0 > {t}/buffer_percent").returncode == 0
        assert poll_all(fds, QUIET_MS) == {}
        writer = mark_later(t)
        assert len(poll_all(fds, WAKE_MS)) == 1
        writer.join()
    finally:
        for fd in fds + [top]:
            os.close(fd)


def test_buffer_percent_takes_0_to_100(t):
    assert open(f"{t}/buffer_percent").read() == "50\n"
    out = sh(f"echo 100 > {t}/buffer_percent && cat {t}/buffer_percent; "
             f"echo 101 > {t}/buffer_percent || echo refused; echo 0x10 > {t}/buffer_percent"
             f" || echo refused; cat {t}/buffer_percent")
    assert out.stdout == "100\nrefused\nrefused\n100\n", out.stderr


@pytest.mark.parametrize("name", ["trace", "README", "trace_marker", "buffer_percent"])
def test_a_file_without_poll_is_always_readable_and_writable(t, name):
    fd = os.open(f"{t}/{name}", os.O_WRONLY if name == "trace_marker" else os.O_RDONLY)
    try:
        assert poll_ms(fd, 0)[0] == DEFAULT_POLLMASK
    finally:
        os.close(fd)
