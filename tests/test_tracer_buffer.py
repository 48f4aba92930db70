"""Ring buffer sizing, overwrite and counters; trace_pipe consumption and wait()."""

import errno
import os
import threading

import pytest

from kprobefs.tracing.buffers.ring_buffer import (
    PAGE_DATA_SIZE, RingBuffer, event_size, pages_for_kb,
)
from tracer_fakes import cat, echo, make_tracer, node, write_errno


def test_sizes_before_and_after_expansion():
    t = make_tracer()
    assert cat(t.root, "buffer_size_kb") == "7 (expanded: 1408)\n"
    assert cat(t.root, "buffer_total_size_kb") == "14 (expanded: 2816)\n"
    assert cat(t.root, "per_cpu/cpu0/buffer_size_kb") == "7\n"
    echo(t.root, "current_tracer", "nop")            # setting a tracer expands
    assert cat(t.root, "buffer_size_kb") == "1410\n"
    assert cat(t.root, "buffer_total_size_kb") == "2820\n"


def test_enabling_an_event_expands():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    echo(t.root, "events/kprobes/ev/enable", "1")
    assert cat(t.root, "buffer_size_kb") == "1410\n"


@pytest.mark.parametrize("kb, readback", [(1, "7"), (7, "7"), (8, "11"), (100, "103"),
                                          (1408, "1410")])
def test_resize_rounds_up_to_pages(kb, readback):
    t = make_tracer()
    echo(t.root, "buffer_size_kb", f"{kb}\n")
    assert cat(t.root, "buffer_size_kb") == f"{readback}\n"


def test_per_cpu_resize_and_mixed_sizes():
    t = make_tracer()
    echo(t.root, "buffer_size_kb", "100")
    echo(t.root, "per_cpu/cpu1/buffer_size_kb", "20")
    assert cat(t.root, "buffer_size_kb") == "X\n"
    assert cat(t.root, "per_cpu/cpu1/buffer_size_kb") == "23\n"
    assert cat(t.root, "buffer_total_size_kb") == "126\n"


@pytest.mark.parametrize("data", ["0", "abc", " 5", "5 ", "-1", "0x10", ""])
def test_bad_sizes(data):
    t = make_tracer()
    assert write_errno(t.root, "buffer_size_kb", data) == errno.EINVAL
    assert cat(t.root, "buffer_size_kb") == "7 (expanded: 1408)\n"


def test_overwrite_drops_oldest_pages_and_counts():
    buf = RingBuffer(1)
    per_page = PAGE_DATA_SIZE // event_size(60)
    for i in range(per_page * 5):
        buf.write(0, (i, "r"), 60)
    entries, written = buf.counts()
    assert written == per_page * 5
    assert per_page <= entries <= per_page * 2
    assert entries + buf.cpus[0].overrun == written
    first = buf.snapshot()[0][1][0]
    assert first == written - entries                 # the oldest records went first


def test_no_overwrite_drops_new_events():
    t = make_tracer()
    echo(t.root, "options/overwrite", "0")
    for i in range(2000):
        echo(t.root, "trace_marker", f"m{i}")
    text = cat(t.root, "trace")
    assert "tracing_mark_write: m0\n" in text and "m1999" not in text
    entries, written = t.tracer.buffer.counts()
    assert entries == written < 2000


def test_trace_header_counts_overrun():
    t = make_tracer()
    for i in range(1000):
        echo(t.root, "trace_marker", f"m{i}")
    entries, written = t.tracer.buffer.counts()
    assert written == 1000 and entries < 1000
    assert f"entries-in-buffer/entries-written: {entries}/1000   #P:2" in cat(t.root, "trace")
    assert "tracing_mark_write: m999\n" in cat(t.root, "trace")


def test_pages_for_kb():
    assert pages_for_kb(1408) == 354
    assert pages_for_kb(1) == 2


# ----------------------------------------------------------------------- trace_pipe

def test_trace_pipe_consumes_and_returns_empty():
    t = make_tracer()
    for text in ("a", "b", "c"):
        echo(t.root, "trace_marker", text)
    handle = node(t.root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    data = handle.read(65536, 0)
    assert data.decode().splitlines() == [
        "              sh-1       [000] .....  1234.567891: tracing_mark_write: a",
        "              sh-1       [000] .....  1234.567891: tracing_mark_write: b",
        "              sh-1       [000] .....  1234.567891: tracing_mark_write: c"]
    assert handle.read(65536, len(data)) == b""
    assert "0/0" in cat(t.root, "trace")            # consumed records left the buffer
    assert handle.wait(0.01) is False
    handle.release()


def test_trace_pipe_small_reads_keep_the_rest():
    t = make_tracer()
    echo(t.root, "trace_marker", "hello")
    handle = node(t.root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    out = b""
    while chunk := handle.read(7, len(out)):
        out += chunk
    assert out.decode().endswith("tracing_mark_write: hello\n")


def test_two_readers_never_get_the_same_record():
    t = make_tracer()
    echo(t.root, "buffer_size_kb", "1000")
    total = 600
    readers = [node(t.root, "trace_pipe").open(os.O_RDONLY, 1, "cat") for _ in range(2)]
    results = [[], []]
    done = threading.Event()

    def reader(i):
        handle = readers[i]
        while True:
            data = handle.read(200, 0)
            if data:
                results[i].append(data)
            elif done.is_set() and t.tracer.buffer.is_empty():
                return
            else:
                handle.wait(0.01)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for i in range(total):
        echo(t.root, "trace_marker", f"n{i}")
    done.set()
    for th in threads:
        th.join(10)
    lines = [line for i in range(2) for line in b"".join(results[i]).decode().splitlines()]
    seen = [line.rsplit(" ", 1)[1] for line in lines]
    assert sorted(seen) == sorted(f"n{i}" for i in range(total))


def test_wait_wakes_up_on_a_new_record():
    t = make_tracer()
    handle = node(t.root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    timer = threading.Timer(0.05, lambda: echo(t.root, "trace_marker", "late"))
    timer.start()
    assert handle.wait(5.0) is True
    assert b"late" in handle.read(4096, 0)
    timer.join()


def test_per_cpu_trace_pipe_only_reads_its_cpu():
    t = make_tracer()
    t.kernel.cpu.index = 1
    echo(t.root, "trace_marker", "one")
    t.kernel.cpu.index = 0
    echo(t.root, "trace_marker", "zero")
    data = node(t.root, "per_cpu/cpu1/trace_pipe").open(os.O_RDONLY, 1, "cat").read(4096, 0)
    assert b"one" in data and b"zero" not in data
    assert "zero" in cat(t.root, "trace")


def test_poll_readiness_follows_buffer_percent_on_a_cpus_pipes():
    """6.1's trace_poll: a per-CPU pipe is ready once buffer_percent of the CPU's pages
    are filled, the page being written counted (full_hit); 0 asks for a record; the
    top trace_pipe asks for a record whatever buffer_percent says."""
    t = make_tracer()
    echo(t.root, "buffer_size_kb", "8")                 # 3 pages a CPU
    t.kernel.cpu.index = 1
    raw = node(t.root, "per_cpu/cpu1/trace_pipe_raw").open(os.O_RDONLY, 1, "cat")
    pipe = node(t.root, "per_cpu/cpu1/trace_pipe").open(os.O_RDONLY, 1, "cat")
    top = node(t.root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    assert not raw.poll_wait(0) and not pipe.poll_wait(0) and not top.poll_wait(0)
    echo(t.root, "trace_marker", "x" * 1000)
    assert top.poll_wait(0) and not raw.poll_wait(0) and not pipe.poll_wait(0)
    echo(t.root, "trace_marker", "x" * 1000)
    echo(t.root, "trace_marker", "x" * 1000)
    assert not raw.poll_wait(0)                 # three fill the page being written
    timer = threading.Timer(0.05, lambda: echo(t.root, "trace_marker", "y" * 1000))
    timer.start()
    assert raw.poll_wait(5.0) and pipe.poll_wait(0)     # the fourth opens a second of 3
    timer.join()
    echo(t.root, "buffer_percent", "100")
    assert not raw.poll_wait(0)
    echo(t.root, "buffer_percent", "0")
    assert raw.poll_wait(0)
    assert not node(t.root, "per_cpu/cpu0/trace_pipe_raw").open(
        os.O_RDONLY, 1, "cat").poll_wait(0)
    assert write_errno(t.root, "buffer_percent", "101") == errno.EINVAL
