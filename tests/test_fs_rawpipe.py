"""per_cpu/cpuN/trace_pipe_raw through a real mount: pages decoded with the layout
events/header_page, events/header_event and the event's format describe (raw_decoder.py),
records from the kernel's recorder and from the host, a time extend, short reads,
O_NONBLOCK, splice(2) and a blocked reader that is killed."""

import errno
import os
import signal
import subprocess
import time

import pytest

from raw_decoder import decode_page, get_field, parse_format, parse_layout
from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

PAGE = 4096


def _default_sigint():
    """In a child before exec: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    script = (f"echo 'p:rawprobe vfs_read count=%dx:u64' > {t}/kprobe_events && "
              f"echo 1 > {t}/events/kprobes/rawprobe/enable")
    assert sh(script).returncode == 0
    yield t
    sh(f"echo 0 > {t}/events/kprobes/rawprobe/enable; echo > {t}/kprobe_events; "
       f"echo 1408 > {t}/buffer_size_kb; echo > {t}/trace")


def stop_probe(t):
    """Each read of trace_pipe_raw is a vfs_read the probe would record: stop it before
    reading, or the reader never runs out of pages."""
    assert sh(f"echo 0 > {t}/events/kprobes/rawprobe/enable").returncode == 0


def read_pages(t, cpu):
    """Every page trace_pipe_raw has now (O_NONBLOCK until EAGAIN)."""
    fd = os.open(f"{t}/per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
    pages = []
    try:
        while True:
            try:
                page = os.read(fd, PAGE)
            except BlockingIOError:
                return pages
            assert len(page) == PAGE
            pages.append(page)
    finally:
        os.close(fd)


def decode_all(t):
    layout = parse_layout(open(f"{t}/events/header_page").read(),
                          open(f"{t}/events/header_event").read())
    nr_cpus = len(os.listdir(f"{t}/per_cpu"))
    return [[decode_page(p, layout) for p in read_pages(t, cpu)] for cpu in range(nr_cpus)]


def test_kernel_and_host_records_decode(t):
    ident, fields = parse_format(open(f"{t}/events/kprobes/rawprobe/format").read())
    vfs_read = next(int(line.split()[0], 16) for line in open(f"{t}/../proc/kallsyms")
                    if line.split()[2] == "vfs_read")
    marker_id = int(open(f"{t}/events/ftrace/print/id").read()) if os.path.exists(
        f"{t}/events/ftrace/print/id") else 5
    # both on host CPU 0, so on one emulated CPU (a request runs on its host CPU's)
    r = sh(f"echo $$; exec taskset -c 0 dd if={t}/README of=/dev/null bs=123 count=2 "
           "2>/dev/null")
    reader = int(r.stdout.split()[0])
    time.sleep(0.3)                       # over 2^27 ns: the next record needs a time extend
    assert sh(f"exec taskset -c 0 sh -c 'echo raw-marker > {t}/trace_marker'").returncode == 0
    stop_probe(t)
    cpus = decode_all(t)
    events = [ev for pages in cpus for page in pages for ev in page.events]
    mine = [rec for _ts, rec in events
            if get_field(rec, fields, "common_type") == ident
            and get_field(rec, fields, "common_pid") == reader]
    assert [get_field(rec, fields, "count") for rec in mine][:2] == [123, 123]
    assert all(get_field(rec, fields, "__probe_ip") == vfs_read for rec in mine)
    markers = [rec for _ts, rec in events
               if int.from_bytes(rec[:2], "little") == marker_id]
    assert any(rec[16:].startswith(b"raw-marker\n\0") for rec in markers)
    assert any(page.extends for pages in cpus for page in pages)
    for pages in cpus:                    # time order within each CPU
        stamps = [ts for page in pages for ts, _rec in page.events]
        assert stamps == sorted(stamps)
    trace = open(f"{t}/trace").read()     # consumed: trace no longer shows them
    assert f"dd-{reader} " not in trace and "raw-marker" not in trace


def test_short_reads_split_one_page(t):
    assert sh(f"cat {t}/README > /dev/null").returncode == 0
    stop_probe(t)
    sizes = []
    for cpu in range(len(os.listdir(f"{t}/per_cpu"))):
        fd = os.open(f"{t}/per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        try:
            first = os.read(fd, 1000)
        except BlockingIOError:
            os.close(fd)
            continue
        rest = os.read(fd, PAGE)
        sizes.append((len(first), len(rest)))
        os.close(fd)
    assert (1000, PAGE - 1000) in sizes


def splice_pages(t, cpu):
    """Every page trace_pipe_raw has now, as splice(2) moves them into a pipe (trace-cmd's
    recorders), O_NONBLOCK until EAGAIN."""
    fd = os.open(f"{t}/per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
    r, w = os.pipe()
    pages = []
    try:
        while True:
            try:
                n = os.splice(fd, w, PAGE)
            except BlockingIOError:
                return pages
            assert n > 0, "splice found the end of the file"
            pages.append(os.read(r, n))
    finally:
        for f in (fd, r, w):
            os.close(f)


def test_splice_moves_whole_pages(t):
    ident, fields = parse_format(open(f"{t}/events/kprobes/rawprobe/format").read())
    r = sh(f"echo $$; exec dd if={t}/README of=/dev/null bs=123 count=2 2>/dev/null")
    reader = int(r.stdout.split()[0])
    stop_probe(t)
    layout = parse_layout(open(f"{t}/events/header_page").read(),
                          open(f"{t}/events/header_event").read())
    pages = [page for cpu in range(len(os.listdir(f"{t}/per_cpu")))
             for page in splice_pages(t, cpu)]
    assert pages and all(len(page) == PAGE for page in pages)
    events = [rec for page in pages for _ts, rec in decode_page(page, layout).events]
    mine = [rec for rec in events if get_field(rec, fields, "common_type") == ident
            and get_field(rec, fields, "common_pid") == reader]
    assert [get_field(rec, fields, "count") for rec in mine][:2] == [123, 123]
    with open(f"{t}/per_cpu/cpu0/trace_pipe_raw", "rb", buffering=0) as f:
        with pytest.raises(OSError) as e:       # nonseekable, as in Linux
            f.seek(0)
        assert e.value.errno == errno.ESPIPE


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_blocked_reader_ends_on_signal(real, sig):
    t = f"{real}/tracing"
    sh(f"echo > {t}/trace")
    # SIGINT at its default in the child: a shell's background job inherits it ignored
    reader = subprocess.Popen(["dd", f"if={t}/per_cpu/cpu1/trace_pipe_raw", "of=/dev/null",
                               "bs=4096", "count=1"], stderr=subprocess.DEVNULL,
                              preexec_fn=_default_sigint)
    time.sleep(0.5)
    assert reader.poll() is None           # blocked: the buffer is empty
    reader.send_signal(sig)
    assert reader.wait(timeout=10) == -sig
    assert sh(f"cat {real}/kprobes/enabled").stdout == "1\n"
