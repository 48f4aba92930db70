"""The markers through a real mount: ``trace_marker_raw`` as 6.1's tracing_mark_raw_write
(an id and a payload, one ``raw_data`` record, printed by trace_raw_data's rule, and
whole in ``trace_pipe_raw`` pages; its errors)."""

import errno
import os

import pytest

from raw_decoder import decode_page, get_field, parse_format, parse_layout
from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

PAGE = 4096


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    assert sh(f"echo > {t}/trace").returncode == 0
    yield t
    sh(f"echo 1 > {t}/options/markers; echo 1 > {t}/tracing_on; echo > {t}/trace; "
       f"rmdir {t}/instances/raw 2>/dev/null")


def write_raw(path, data):
    """os.write's count on one open file description of ``path``."""
    fd = os.open(path, os.O_WRONLY)
    try:
        return os.write(fd, data)
    finally:
        os.close(fd)


def lines_of(t, needle):
    return [line.split(": ", 1)[1] for line in open(f"{t}/trace").read().splitlines()
            if needle in line and not line.startswith("#")]


def test_raw_markers_print_as_6_1s_trace_raw_data(t):
    # 6.1 reserves sizeof(raw_data_entry) + count bytes (at least 25) and prints buf up
    # to the event's length rounded to 4: the payload, then what the write left (0 here)
    assert write_raw(f"{t}/trace_marker_raw", b"\x01\x00\x00\x00hello") == 9
    assert write_raw(f"{t}/trace_marker_raw", b"\xef\xbe\xad\xde" + bytes(range(20))) == 24
    assert lines_of(t, " buf: ") == [
        "# 1 buf: 68 65 6c 6c 6f" + " 00" * 11,
        "# deadbeef buf: " + " ".join(f"{b:02x}" for b in range(20)) + " 00" * 4,
    ]


def test_raw_marker_errors_are_6_1s(t):
    path = f"{t}/trace_marker_raw"
    with pytest.raises(OSError) as e:
        write_raw(path, b"abc")                       # shorter than the id
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        write_raw(path, b"\x07\x00\x00\x00" + b"x" * 3069)   # over RAW_DATA_MAX_SIZE
    assert e.value.errno == errno.EINVAL
    assert write_raw(path, b"\x07\x00\x00\x00" + b"x" * 3068) == 1024   # cut to 1 KiB
    (line,) = lines_of(t, "# 7 buf:")
    assert line == "# 7 buf:" + " 78" * 1020 + " 00" * 4
    assert sh(f"echo 0 > {t}/options/markers").returncode == 0
    with pytest.raises(OSError) as e:
        write_raw(path, b"\x08\x00\x00\x00")
    assert e.value.errno == errno.EINVAL
    assert sh(f"echo 1 > {t}/options/markers; echo 0 > {t}/tracing_on").returncode == 0
    with pytest.raises(OSError) as e:
        write_raw(path, b"\x08\x00\x00\x00")
    assert e.value.errno == errno.EBADF


def test_raw_markers_are_in_trace_pipe_raw_pages(t):
    assert write_raw(f"{t}/trace_marker_raw", b"\x2a\x00\x00\x00payload") == 11
    ident, fields = parse_format(open(f"{t}/events/ftrace/raw_data/format").read())
    layout = parse_layout(open(f"{t}/events/header_page").read(),
                          open(f"{t}/events/header_event").read())
    found = []
    for cpu in range(len(os.listdir(f"{t}/per_cpu"))):
        fd = os.open(f"{t}/per_cpu/cpu{cpu}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True:
                try:
                    page = os.read(fd, PAGE)
                except BlockingIOError:
                    break
                found += [rec for _ts, rec in decode_page(page, layout).events
                          if get_field(rec, fields, "common_type") == ident]
        finally:
            os.close(fd)
    (rec,) = found
    assert get_field(rec, fields, "common_pid") == os.getpid()
    assert get_field(rec, fields, "id") == 42
    buf = fields["buf"][0]
    assert len(rec) == 28                  # 12 + max(11, 13) = 25, rounded to 4
    assert rec[buf:buf + 7] == b"payload"


def test_an_instance_has_its_own_raw_marker(t):
    os.mkdir(f"{t}/instances/raw")
    assert oct(os.stat(f"{t}/instances/raw/trace_marker_raw").st_mode & 0o777) == "0o220"
    assert write_raw(f"{t}/instances/raw/trace_marker_raw", b"\x05\x00\x00\x00ab") == 6
    assert lines_of(f"{t}/instances/raw", "# 5 buf:") == ["# 5 buf: 61 62" + " 00" * 14]
    assert lines_of(t, "# 5 buf:") == []


# ---- the writer's CPU ---------------------------------------------------------------------
def test_a_pinned_writers_markers_are_on_its_cpus_buffer(t):
    """A request runs on the emulated CPU of the host CPU its caller is on (modulo the
    machine's CPUs): a writer pinned to host CPU N leaves its markers in cpuN's."""
    nr_cpus = len(os.listdir(f"{t}/per_cpu"))
    host_cpus = sorted(os.sched_getaffinity(0))
    if len(host_cpus) < 2:
        pytest.skip("one host CPU")
    for host in host_cpus:
        for i in range(3):
            r = sh(f"exec taskset -c {host} sh -c 'echo pinned-{host}-{i} > {t}/trace_marker; "
                   f"printf \"\\{host:03o}\\0\\0\\0raw\" > {t}/trace_marker_raw'")
            assert r.returncode == 0, r.stderr
    for host in host_cpus:
        cpu = host % nr_cpus
        mine = open(f"{t}/per_cpu/cpu{cpu}/trace").read()
        others = "".join(open(f"{t}/per_cpu/cpu{c}/trace").read()
                         for c in range(nr_cpus) if c != cpu)
        for i in range(3):
            assert f"tracing_mark_write: pinned-{host}-{i}" in mine
            assert f"pinned-{host}-{i}" not in others
        assert mine.count(f"# {host:x} buf: 72 61 77") == 3
        assert f"# {host:x} buf: 72 61 77" not in others


def test_a_writer_that_moves_leaves_its_markers_where_it_is_now(t):
    """The host CPU of a caller is looked up at each request: one thread that pins
    itself to one host CPU, writes, pins itself to another and writes again at once
    (the file held open, nothing between) has each marker on its CPU's buffer."""
    nr_cpus = len(os.listdir(f"{t}/per_cpu"))
    host_cpus = sorted(os.sched_getaffinity(0))
    if len(host_cpus) < 2 or nr_cpus < 2:
        pytest.skip("one host CPU or one emulated CPU")
    first, second = host_cpus[1], host_cpus[0]
    fd = os.open(f"{t}/trace_marker", os.O_WRONLY)
    try:
        for i in range(3):
            for host in (first, second):
                os.sched_setaffinity(0, {host})
                os.write(fd, f"moved-{host}-{i}".encode())
    finally:
        os.close(fd)
        os.sched_setaffinity(0, host_cpus)
    for host in (first, second):
        mine = open(f"{t}/per_cpu/cpu{host % nr_cpus}/trace").read()
        others = "".join(open(f"{t}/per_cpu/cpu{c}/trace").read()
                         for c in range(nr_cpus) if c != host % nr_cpus)
        for i in range(3):
            assert f"tracing_mark_write: moved-{host}-{i}" in mine
            assert f"moved-{host}-{i}" not in others
