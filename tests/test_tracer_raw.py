"""per_cpu/cpuN/trace_pipe_raw and stats, decoded with what tracefs says of its layout
(raw_decoder.py parses header_page, header_event and format; not kprobefs' writer)."""

import errno
import os
import re

import pytest

from kprobefs.tracing.buffers.raw_page import PageWriter
from raw_decoder import decode_page, get_field, parse_format, parse_layout
from tracer_fakes import VFS_READ, cat, echo, make_tracer, node

PAGE = 4096


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read a=%di:u32")
    echo(t.root, "events/kprobes/ev/enable", "1")
    return t


def _layout(t):
    return parse_layout(cat(t.root, "events/header_page"), cat(t.root, "events/header_event"))


def _pages(t, cpu=0, chunk=PAGE):
    handle = node(t.root, f"per_cpu/cpu{cpu}/trace_pipe_raw").open(os.O_RDONLY, 1, "rec")
    out = []
    while True:
        page = b""
        while len(page) < PAGE:
            data = handle.read(min(chunk, PAGE - len(page)), 0)
            if not data:
                break
            page += data
        if not page:
            break
        assert len(page) == PAGE
        out.append(page)
    assert not handle.wait(0)
    handle.release()
    return out


def test_header_files_match_6_1(t):
    layout = _layout(t)
    assert layout.ts == (0, 8) and layout.commit == (8, 8) and layout.data == (16, 4080)
    assert (layout.padding, layout.time_extend, layout.time_stamp, layout.data_max) == (
        29, 30, 31, 28)


def test_records_decode_with_the_format_file(t):
    ident, fields = parse_format(cat(t.root, "events/kprobes/ev/format"))
    start = t.clock.now
    for i in range(3):
        t.engine.hit(VFS_READ, di=100 + i)
        t.clock.advance(1000)
    echo(t.root, "trace_marker", "hello")
    pages = _pages(t, chunk=100)           # short reads: one page across many reads
    assert len(pages) == 1
    page = decode_page(pages[0], _layout(t))
    assert page.missed is None and page.timestamp == start
    assert [ts - start for ts, _ in page.events] == [0, 1000, 2000, 3000]
    for i, (_ts, rec) in enumerate(page.events[:3]):
        assert get_field(rec, fields, "common_type") == ident
        assert get_field(rec, fields, "__probe_ip") == VFS_READ
        assert get_field(rec, fields, "a") == 100 + i
    marker = page.events[3][1]
    assert marker[16:23] == b"hello\n\0"
    assert cat(t.root, "trace_pipe") == ""      # consumed by the raw read
    assert "entries-in-buffer/entries-written: 0/0" in cat(t.root, "trace")


def test_time_extend_for_a_gap_over_2_27_ns(t):
    t.engine.hit(VFS_READ, di=1)
    first = t.clock.now
    t.clock.advance(5 << 27)
    t.engine.hit(VFS_READ, di=2)
    page = decode_page(_pages(t)[0], _layout(t))
    assert page.extends == 1
    assert [ts - first for ts, _ in page.events] == [0, 5 << 27]


@pytest.mark.parametrize("arg_type,stored", [("u64", True), ("u32", False)])
def test_lost_events_are_flagged_with_their_count(arg_type, stored):
    # 20-byte u32 records (24 with their header) fill a page's 4080 bytes exactly,
    # leaving no room for the count: then only the flag says events were lost.
    t = make_tracer()
    echo(t.root, "kprobe_events", f"p:ev vfs_read a=%di:{arg_type}")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "buffer_size_kb", "4", append=False)     # two pages per CPU
    for i in range(1000):
        t.engine.hit(VFS_READ, di=i)
        t.clock.advance(10)
    stats = cat(t.root, "per_cpu/cpu0/stats")
    overrun = int(re.search(r"^overrun: (\d+)$", stats, re.M)[1])
    assert overrun > 0
    _ident, fields = parse_format(cat(t.root, "events/kprobes/ev/format"))
    pages = [decode_page(p, _layout(t)) for p in _pages(t)]
    assert pages[0].missed == (overrun if stored else -1)
    assert all(p.missed is None for p in pages[1:])
    values = [get_field(rec, fields, "a") for p in pages for _ts, rec in p.events]
    assert values == list(range(overrun, 1000))
    stats = cat(t.root, "per_cpu/cpu0/stats")
    assert re.search(r"^entries: 0$", stats, re.M)
    assert re.search(r"^read events: %d$" % len(values), stats, re.M)


def test_empty_buffer_reads_nothing_and_waits(t):
    handle = node(t.root, "per_cpu/cpu1/trace_pipe_raw").open(os.O_RDONLY, 1, "rec")
    assert handle.read(PAGE, 0) == b""
    assert handle.wait(0.01) is False
    with pytest.raises(OSError) as e:
        handle.write(b"x", 0)
    assert e.value.errno == errno.EINVAL


def test_stats_format(t):
    t.engine.hit(VFS_READ, di=1)
    lines = cat(t.root, "per_cpu/cpu0/stats").splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "entries", "overrun", "commit overrun", "bytes", "oldest event ts", "now ts",
        "dropped events", "read events"]
    assert lines[0] == "entries: 1"
    assert re.fullmatch(r"oldest event ts: +\d+\.\d{6}", lines[4])


def test_a_page_takes_events_while_they_fit(t):
    """PageWriter.add reckons an event's size once and takes it only while it fits
    (the first always): 40-byte events fill the 4080 data bytes exactly, a time
    extend and a long event's length word are counted."""
    writer = PageWriter(1000)
    taken = 0
    while writer.add(bytes(range(36)), 1000 + taken):
        taken += 1
    assert taken == 4080 // 40 and writer.used == 4080
    layout = _layout(t)
    page = decode_page(writer.page(), layout)
    assert [ts for ts, _rec in page.events] == [1000 + i for i in range(taken)]
    assert all(rec == bytes(range(36)) for _ts, rec in page.events)
    writer = PageWriter(0)
    assert writer.add(b"x", 0) and writer.add(bytes(113), 1 << 28)
    assert writer.used == 8 + (8 + 8 + 116)
    page = decode_page(writer.page(), layout)
    assert page.extends == 1 and [ts for ts, _rec in page.events] == [0, 1 << 28]
    assert [rec for _ts, rec in page.events] == [b"x\0\0\0", bytes(116)]
