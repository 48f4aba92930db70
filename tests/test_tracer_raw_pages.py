"""trace_pipe_raw of records the kernel recorded (tracing/buffers/native.py,
ring_buffer.py): each ring-buffer page is handed out whole, made from the staged bytes
without decoding a record, and is byte for byte the page the record-by-record path makes
of the same records (the common fields, then the event's data, as its ``raw`` lays them
out): short and long events, time extends, the lost-events count, and a page being
written."""

import os
import struct
import time

import pytest

from kprobefs.tracing.buffers.raw_page import PageWriter
from kprobefs.tracing.buffers.ring_buffer import Chunk

from raw_decoder import decode_page, parse_layout
from test_tracer_e2e import node, read, write
from test_tracer_native import make

EVENTS = ("p:short kprobe_target_traced+5 a=%di b=%si:u32 c=%dx:u8\n"
          # 8 + 8 + 13 * 8 bytes: over type_len's 112, a length word follows
          "p:long kprobe_target_traced+5 " + " ".join(f"x{i}=%di" for i in range(13)) + "\n"
          "r:ret kprobe_target_traced rv=$retval:s32\n")


def expected_pages(pages, overrun: int) -> list[bytes]:
    """Each of the ring-buffer ``pages`` built record by record from its chunks'
    decoded records (event.raw, PageWriter), the first flagged with ``overrun`` lost
    events."""
    out = []
    for page in pages:
        records = [rec for chunk in page for rec in chunk.decode(chunk.data)]
        if not records:
            continue
        writer = PageWriter(records[0][0])
        for rec in records:
            data = rec[3].raw(rec)
            assert writer.fits(len(data), rec[0])
            writer.add(data, rec[0])
        out.append(writer.page(overrun if not out else 0))
    return out


def read_raw(root, cpu: int) -> list[bytes]:
    h = node(root, f"per_cpu/cpu{cpu}/trace_pipe_raw").open(os.O_RDONLY, 1, "cat")
    pages = []
    try:
        while page := h.read(4096, 0):
            assert len(page) == 4096
            pages.append(page)
    finally:
        h.release()
    return pages


def recording(events: str, kb: int):
    """A one-CPU kernel whose ``events`` record, optimized, into ``kb`` KiB."""
    kernel, tracer, root = make(True, cpus=1)
    write(root, "buffer_size_kb", str(kb))
    write(root, "kprobe_events", events)
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    return kernel, tracer, root


def stop(tracer, root) -> None:
    write(root, "events/kprobes/enable", "0")
    tracer.buffer.counts()              # the staged records taken into their pages


@pytest.fixture
def recorded():
    kernel, tracer, root = recording(EVENTS, 12)
    kernel.upcall("kprobe_bench_loop", 400, 1)
    time.sleep(0.3)                     # over 2^27 ns: the next record needs a time extend
    kernel.upcall("kprobe_bench_loop", 20, 1)
    stop(tracer, root)
    return kernel, tracer, root


def no_decoding(data):
    raise AssertionError("a record was decoded")


def test_pages_are_the_records_page_by_page_without_decoding(recorded):
    kernel, tracer, root = recorded
    buf = tracer.buffer.cpus[0]
    assert buf.overrun > 0 and len(buf.pages) > 2
    assert all(type(item) is Chunk for page in buf.pages for item in page)
    expected = expected_pages(buf.pages, buf.overrun)
    for page in buf.pages:
        for chunk in page:
            chunk.decode = no_decoding
    pages = read_raw(root, 0)
    assert pages == expected
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    decoded = [decode_page(page, layout) for page in pages]
    assert decoded[0].missed is not None      # lost events flagged
    assert any(page.extends for page in decoded)
    sizes = {len(rec) for page in decoded for _ts, rec in page.events}
    assert max(sizes) > 112 and min(sizes) < 112
    assert tracer.buffer.counts()[0] == 0 and buf.read_events == sum(
        len(page.events) for page in decoded)


def test_raw_pages_and_trace_show_the_same_records(recorded):
    """The records trace prints are the ones the pages then hold, in order."""
    kernel, tracer, root = recorded
    lines = [line for line in read(root, "trace").splitlines() if not line.startswith("#")]
    pages = read_raw(root, 0)
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    stamps = [ts for page in pages for ts, _rec in decode_page(page, layout).events]
    assert len(stamps) == len(lines)
    assert [f"{(ts + 500) // 1000 // 1_000_000:d}.{(ts + 500) // 1000 % 1_000_000:06d}"
            for ts in stamps] == [line.split(": ")[0].split()[-1] for line in lines]


def test_a_page_partly_read_as_text_goes_record_by_record(recorded):
    """trace_pipe took records from the first page: the rest of it is made record by
    record, and what follows page by page, together every record once."""
    kernel, tracer, root = recorded
    total = tracer.buffer.counts()[0]
    h = node(root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    taken = h.read(300, 0).decode().count("\n")
    h.release()
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    events = [ev for page in read_raw(root, 0) for ev in decode_page(page, layout).events]
    assert 0 < taken and len(events) + taken >= total - 3     # a line cut short stays


def test_a_page_made_record_by_record_ends_with_its_ring_buffer_page(recorded):
    """A page made record by record (trace_pipe took the first records of the oldest
    page) holds the rest of that ring-buffer page only, as 6.1's ring_buffer_read_page
    copies from the reader page only: the pages after it are still whole and handed
    out without decoding a record."""
    kernel, tracer, root = recorded
    buf = tracer.buffer.cpus[0]
    h = node(root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    assert h.read(300, 0)
    h.release()
    rest = list(buf.pages)[1:]
    assert len(rest) > 1
    left = buf.pages[0].entries
    expected = expected_pages(rest, 0)
    for page in rest:
        for chunk in page:
            chunk.decode = no_decoding
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    pages = read_raw(root, 0)
    assert len(decode_page(pages[0], layout).events) == left
    assert pages[1:] == expected


def test_the_page_being_written_is_taken_and_recording_goes_on(recorded):
    kernel, tracer, root = recorded
    read_raw(root, 0)
    write(root, "events/kprobes/enable", "1")
    kernel.upcall("kprobe_bench_loop", 3, 1)
    write(root, "events/kprobes/enable", "0")
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    pages = read_raw(root, 0)
    assert len(pages) == 1 and decode_page(pages[0], layout).missed is None
    assert len(decode_page(pages[0], layout).events) == 3 * 3
    kernel.upcall("kprobe_bench_loop", 0, 1)
    write(root, "events/kprobes/enable", "1")
    kernel.upcall("kprobe_bench_loop", 2, 1)
    pages = read_raw(root, 0)
    assert len(decode_page(pages[0], layout).events) == 2 * 3


# One event: every chunk's entries are alike, and its page is gathered from the entries.
# SHORT's data is 21 bytes, 3 of padding that the kernel zeroes (%si:u8 is stored as 8
# bytes of the register); LONG's payload is past 112 bytes (a length word follows).
SHORT = "p:one kprobe_target_traced+5 a=%di b=%si:u32 c=%si:u8\n"
LONG = "p:one kprobe_target_traced+5 " + " ".join(f"x{i}=%si" for i in range(13)) + "\n"


def staged_events(data: bytes) -> list[tuple[int, bytes]]:
    """What the kernel recorded in a chunk, read with struct tn_entry's layout (ts,
    size, len, the event header, then the record: the common fields, the data): each
    entry's (time, record), the record padded to 4 bytes with zeroes."""
    out, at = [], 0
    while at < len(data):
        ts, size, length = struct.unpack_from("<QII", data, at)
        record = data[at + 24:at + 32 + length]
        out.append((ts, record + bytes(-len(record) % 4)))
        at += size
    return out


@pytest.mark.parametrize("events", [SHORT, LONG], ids=["short", "long"])
def test_pages_of_one_event_are_what_the_kernel_recorded(events):
    """Each page holds the kernel's staged records byte for byte, at their times, and
    is the page the record-by-record path makes.  A chunk's events are gathered from
    its entries (NativeRecorder._raw_whole) where the kernel wrote each one's header
    word, a chunk continuing a page taking its first delta from the chunk before; a
    chunk with a time extend inside goes entry by entry."""
    kernel, tracer, root = recording(events, 64)
    kernel.upcall("kprobe_bench_loop", 250, 1)
    tracer.buffer.counts()              # the chunk taken: the next one goes on in its page
    kernel.upcall("kprobe_bench_loop", 30, 1)
    time.sleep(0.3)                     # over 2^27 ns: the next record needs a time extend
    kernel.upcall("kprobe_bench_loop", 30, 1)
    stop(tracer, root)
    buf = tracer.buffer.cpus[0]
    assert buf.overrun == 0 and len(buf.pages) > 2
    chunks = [chunk for page in buf.pages for chunk in page]
    assert all(type(chunk) is Chunk for chunk in chunks)
    recorded = [[ev for chunk in page for ev in staged_events(chunk.data)]
                for page in buf.pages]
    expected = expected_pages(buf.pages, 0)
    sizes = {len(record) for page in recorded for _ts, record in page}
    assert sizes == {8 + 21 + 3} or min(sizes) > 112
    # every chunk but the one with the time extend in it is gathered whole
    native = tracer.native
    whole = [native._raw_whole(chunk.data, None) is not None for chunk in chunks]
    assert whole.count(False) == 1 and len(whole) > 2
    pages = read_raw(root, 0)
    assert pages == expected
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    decoded = [decode_page(page, layout) for page in pages]
    assert [page.events for page in decoded] == recorded
    assert sum(page.extends for page in decoded) == 1


def test_records_of_a_gone_event_are_left_out_and_the_next_delta_made(monkeypatch):
    """The records of an event that is gone (the recorder no longer knows its type)
    are left out of the pages, as trace leaves them out; the event after one of them
    takes its delta from the event kept before it, not the kernel's from the record
    left out."""
    kernel, tracer, root = recording(EVENTS, 64)
    kernel.upcall("kprobe_bench_loop", 40, 1)
    stop(tracer, root)
    gone = int(read(root, "events/kprobes/long/id"))
    known = tracer.native._event_of
    monkeypatch.setattr(tracer.native, "_event_of", lambda i: None if i == gone else known(i))
    expected = expected_pages(tracer.buffer.cpus[0].pages, 0)
    layout = parse_layout(read(root, "events/header_page"), read(root, "events/header_event"))
    pages = read_raw(root, 0)
    assert pages == expected
    assert sum(len(decode_page(page, layout).events) for page in pages) == 40 * 2
