"""Reading `trace` again: the lines of the records the last read printed are taken from
that read (TraceFormatter.render_runs with kept lines), and the text is always what a
read formatting every record writes, whatever happened in between."""

import os

import pytest

from kprobefs.tracing.buffers.output import TraceFormatter
from tracer_fakes import VFS_READ, cat, echo, make_tracer


@pytest.fixture
def formatted(monkeypatch):
    """How many records each read formatted (a list, one count per read)."""
    counts = []
    lines = TraceFormatter._lines

    def counting(self, cpus, records, *args):
        counts[-1] += len(records)
        return lines(self, cpus, records, *args)
    monkeypatch.setattr(TraceFormatter, "_lines", counting)
    return counts


@pytest.fixture
def t():
    t = make_tracer(nr_cpus=2)
    echo(t.root, "buffer_size_kb", "8", append=False)
    echo(t.root, "kprobe_events", "p:num vfs_read a=%di b=%si:s32\n"
                                  "r:ret vfs_read rv=$retval:x16\n")
    echo(t.root, "events/kprobes/enable", "1")
    return t


def hits(t, n, start=0):
    for i in range(start, start + n):
        t.kernel.run_as(100 + i % 3, f"task{i % 3}", cpu=i % 2)
        t.engine.hit(VFS_READ, di=i, si=-i)
        t.engine.ret(VFS_READ, VFS_READ + 0x40, ax=i, si=i)
        t.clock.advance(1_000 + 7 * i)


def read(t, formatted, path="trace"):
    formatted.append(0)
    return cat(t.root, path, chunk=1 << 20)


def formatted_anew(t, cpu=None, formatted=None):
    """The text of the same read with every record formatted (the pairs path; not
    counted in ``formatted``)."""
    tr = t.tracer.top
    options = tr.trace_options()
    if formatted is not None:
        formatted.append(0)
    try:
        return tr.trace_header(options, cpu) + tr.render(tr.buffer.snapshot(cpu), options)
    finally:
        if formatted is not None:
            formatted.pop()


def read_checked(t, formatted, path="trace", cpu=None):
    """Reads path, checks its text is formatted_anew's, and returns how many records
    the read formatted."""
    assert read(t, formatted, path) == formatted_anew(t, cpu, formatted)
    return formatted[-1]


def test_a_second_read_formats_nothing_and_prints_the_same(t, formatted):
    hits(t, 40)
    first = read(t, formatted)
    assert read(t, formatted) == first == formatted_anew(t, formatted=formatted)
    assert formatted == [80, 0]


def test_records_added_since_are_the_only_ones_formatted(t, formatted):
    hits(t, 40)
    read(t, formatted)
    hits(t, 5, start=40)
    assert read_checked(t, formatted) == 10


def test_pages_overwritten_since_leave_the_rest_kept(t, formatted):
    hits(t, 40)
    read(t, formatted)
    hits(t, 400, start=40)          # the 8 KiB buffer wraps many times over
    text = read(t, formatted)
    entries, written = text.split("entries-written: ")[1].split()[0].split("/")
    assert int(entries) < int(written)
    assert text == formatted_anew(t, formatted=formatted)
    hits(t, 3, start=440)
    assert read_checked(t, formatted) == 6


def test_a_comm_saved_since_is_printed(t, formatted):
    hits(t, 12)
    assert "task1-101" in read(t, formatted)
    t.tracer.comm_cache.save(101, "renamed")
    text = read(t, formatted)
    assert "task1-101" not in text and "renamed-101" in text
    assert text == formatted_anew(t, formatted=formatted)
    assert formatted[1] == 8                # pid 101's records only
    assert read(t, formatted) == text
    assert formatted[2] == 0


def test_a_comm_forgotten_since_is_printed_unknown(t, formatted):
    echo(t.root, "saved_cmdlines_size", "3", append=False)
    hits(t, 12)
    assert "<...>" not in read(t, formatted)
    for pid in (200, 201):
        t.kernel.run_as(pid, f"new{pid}", cpu=0)
        t.engine.hit(VFS_READ, di=pid, si=0)
    text = read(t, formatted)
    assert "<...>-100" in text and text == formatted_anew(t, formatted=formatted)


def test_options_changed_since_make_new_lines(t, formatted):
    hits(t, 12)
    read(t, formatted)
    echo(t.root, "options/irq-info", "0", append=False)
    assert read_checked(t, formatted) == 24


def test_modules_changed_since_make_new_lines(t, formatted):
    hits(t, 12)
    read(t, formatted)
    t.kernel.image.modules = {"mod": object()}
    assert read_checked(t, formatted) == 24


def test_consumed_and_cleared_records_are_gone(t, formatted):
    hits(t, 12)
    read(t, formatted)
    pipe = t.tracer.top.buffer.consume(None, limit=5)
    assert len(pipe) == 5
    assert read_checked(t, formatted) == 0
    echo(t.root, "trace", "", append=False)
    hits(t, 2, start=12)
    assert read_checked(t, formatted) == 4


def test_a_cpu_file_and_the_whole_trace_share_the_kept_lines(t, formatted):
    hits(t, 20)
    read(t, formatted)
    assert read_checked(t, formatted, "per_cpu/cpu1/trace", cpu=1) == 0


def test_an_event_without_compiled_text_is_formatted_each_read(t, formatted):
    echo(t.root, "kprobe_events", "p:str vfs_read s=+0(%si):string")
    echo(t.root, "events/kprobes/str/enable", "1")
    hits(t, 6)
    first = read(t, formatted)
    assert read(t, formatted) == first == formatted_anew(t, formatted=formatted)
    assert "str: (vfs_read+0x0/0x1a0)" in first
    assert formatted == [18, 18]


def test_reading_the_trace_does_not_consume(t):
    hits(t, 10)
    cat(t.root, "trace")
    handle = t.root.children()["trace_pipe"].open(os.O_RDONLY | os.O_NONBLOCK, 1, "cat")
    try:
        assert handle.read(1 << 20, 0).count(b"\n") == 20
    finally:
        handle.release()


def test_only_the_pids_of_the_records_held_are_remembered(t):
    for pid in range(200, 260):
        t.kernel.run_as(pid, f"p{pid}", cpu=0)
        t.engine.hit(VFS_READ, di=pid, si=0)
        t.clock.advance(1_000)
    hits(t, 30)
    assert "p259-259" in cat(t.root, "trace")
    assert len(t.tracer.top.buffer.consume(None, limit=60)) == 60    # pids 200-259
    assert "p259-259" not in cat(t.root, "trace")
    kept = t.tracer.top._kept_lines[t.tracer.top.buffer]
    assert sorted({pid for k in kept.values() for pid in k.comms}) == [100, 101, 102]


def test_a_stopped_buffer_read_again_is_the_last_merged_text(t, formatted):
    hits(t, 40)
    tr = t.tracer.top
    options = tr.trace_options()
    formatted.append(0)
    first = tr.render_runs(tr.buffer.runs(None), options, tr.buffer)
    again = tr.render_runs(tr.buffer.runs(None), options, tr.buffer)
    assert again is first                   # neither formatted nor merged again
    hits(t, 1, start=40)
    third = tr.render_runs(tr.buffer.runs(None), options, tr.buffer)
    assert third is not first and third.startswith(first[:first.index("\n") + 1])
    assert third == tr.render(tr.buffer.snapshot(), options)


def test_a_cpu_emptied_since_leaves_the_text(t, formatted):
    hits(t, 20)
    assert "[001]" in read(t, formatted)
    echo(t.root, "per_cpu/cpu1/trace", "", append=False)
    text = read(t, formatted)
    assert "[001]" not in text and "[000]" in text
    assert text == formatted_anew(t, formatted=formatted)


def test_the_overlap_of_two_reads_is_where_the_same_records_start():
    from kprobefs.tracing.buffers.output import _overlap
    recs = [(i, 100, 0) for i in range(6)]
    assert _overlap(recs, list(recs)) == 0
    assert _overlap(recs, recs[2:] + [(6, 100, 0)]) == 2          # gone, and added
    assert _overlap(recs, recs[5:]) == 5
    assert _overlap(recs, recs[2:4]) is None                       # one gone from the back
    assert _overlap(recs, [(2, 100, 0)] + recs[3:]) is None        # equal, not the same
    assert _overlap(recs, recs[:3] + [(3, 100, 0)] + recs[4:]) is None
    assert _overlap(recs, []) is None and _overlap([], recs) is None
    assert _overlap(recs, [(9, 1, 1)]) is None
