"""`trace` in bulk (output.TraceFormatter): every line as the per-record path
(format_context + the event's own render) writes it, for every numeric type, both
signs and extremes, return probes, events that take the general path, and the
options that change the context columns."""

import os

import pytest

from kprobefs.tracing.buffers import text_caches
from kprobefs.tracing.buffers.output import TraceOptions, format_context
from tracer_fakes import VFS_READ, echo, make_tracer, node

VALUES = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000,
          0xFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0x8000000000000000, 0xFFFFFFFFFFFFFFFF]
TYPES = ["u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64", "x8", "x16", "x32", "x64"]


def per_record(t, pairs, options):
    tracer = t.tracer
    return "".join(format_context(tracer.comm_cache.find(rec[1]), rec[1], cpu, rec[2],
                                  rec[0], options) + rec[3].render(rec, tracer, options)
                   for cpu, rec in pairs)


@pytest.fixture
def filled():
    t = make_tracer(nr_cpus=2)
    args = " ".join(f"a{i}=%di:{ty}" for i, ty in enumerate(TYPES))
    echo(t.root, "kprobe_events", f"p:num vfs_read {args}\n"
                                  "r:ret vfs_read rv=$retval:s32 x=%si:x16\n"
                                  "p:str vfs_read s=+0(%si):string n=%di\n"
                                  "p:sym vfs_read f=%di:symbol\n")
    echo(t.root, "events/enable", "1")
    hit_values(t)
    return t


def hit_values(t, cpus=1):
    """A hit and a return per value, by three tasks over ``cpus`` CPUs (two: each
    second pair at the time of the one before, on the other CPU)."""
    for i, v in enumerate(VALUES):
        t.kernel.run_as(100 + i % 3, f"t%{i % 3}", cpu=i % cpus)
        t.engine.hit(VFS_READ, di=v, si=0)
        t.engine.ret(VFS_READ, VFS_READ + 0x40 + i, ax=v, si=v)
        t.clock.advance(1_234_567 * (i + 1) * (i % cpus if cpus > 1 else 1))


@pytest.mark.parametrize("options", [
    TraceOptions(), TraceOptions(irq_info=False), TraceOptions(context_info=False),
    TraceOptions(in_ns=False)])
def test_bulk_lines_match_the_per_record_path(filled, options):
    pairs = filled.tracer.buffer.snapshot()
    assert len(pairs) == 4 * len(VALUES)
    assert filled.tracer.render(pairs, options) == per_record(filled, pairs, options)


def test_numeric_events_are_compiled_and_the_rest_are_not(filled):
    by_name = {ev.name: ev for ev in filled.tracer.events.values()}
    symbolize = filled.tracer.symbols.symbolize

    def compile_text(ev):
        return ev.compile_text(symbolize)
    assert compile_text(by_name["num"]) is not None
    assert compile_text(by_name["ret"]) is not None
    assert compile_text(by_name["str"]) is None
    assert compile_text(by_name["sym"]) is None


def test_trace_file_reads_the_bulk_text(filled):
    h = node(filled.root, "trace").open(os.O_RDONLY, 1, "cat")
    text = h.read(1 << 20, 0).decode()
    h.release()
    assert " a4=-128 " in text and " a11=0xffffffffffffffff" in text
    assert "ret: (vfs_read+0x" in text and " rv=-1 " in text


@pytest.fixture
def numeric():
    """Only events with a compiled text: the path that maps each step over all records."""
    t = make_tracer(nr_cpus=2)
    args = " ".join(f"a{i}=%di:{ty}" for i, ty in enumerate(TYPES))
    echo(t.root, "kprobe_events", f"p:num vfs_read {args}\n"
                                  "r:ret vfs_read rv=$retval:s32 x=%si:x16\n")
    echo(t.root, "events/enable", "1")
    hit_values(t, cpus=2)
    return t


@pytest.mark.parametrize("options", [
    TraceOptions(), TraceOptions(irq_info=False), TraceOptions(context_info=False),
    TraceOptions(in_ns=False)])
def test_compiled_lines_match_the_per_record_path(numeric, options):
    pairs = numeric.tracer.buffer.snapshot()
    assert {rec[3].name for _cpu, rec in pairs} == {"num", "ret"}
    assert numeric.tracer.render(pairs, options) == per_record(numeric, pairs, options)


@pytest.mark.parametrize("options", [TraceOptions(), TraceOptions(in_ns=False)])
def test_each_cpus_records_merged_by_time_as_the_pairs_are(numeric, filled, options):
    assert len(numeric.tracer.top.buffer.runs()) == 2
    for t in (numeric, filled):
        top = t.tracer.top
        runs = top.buffer.runs()
        assert top.render_runs(runs, options) == top.render(top.buffer.snapshot(), options)


@pytest.fixture
def alike():
    """Events whose arguments unpack alike: aligned to their sizes, not aligned, and no
    argument; pairs of them whose arguments print alike but for their names."""
    t = make_tracer(nr_cpus=2)
    echo(t.root, "kprobe_events",
         "p:wa vfs_read a=%di:x64 b=%si:s64 c=%di:u64\n"
         "p:wb vfs_read x=%si:x64 y=%di:s64 z=%si:u64\n"
         "p:ua vfs_read+1 a=%di:u8 b=%si:s64 c=%di:x16\n"
         "p:ub vfs_read+1 d=%si:u8 e=%di:s64 f=%si:x16\n"
         "p:none vfs_read+2\n"
         "r:rets vfs_read rv=$retval:s32 x=%si:x32\n")
    return t


@pytest.mark.parametrize("events", [("wa", "wb"), ("ua", "ub"), ("none",), ("rets",),
                                    ("wa", "ua")])
@pytest.mark.parametrize("options", [
    TraceOptions(), TraceOptions(irq_info=False), TraceOptions(context_info=False),
    TraceOptions(in_ns=False)])
def test_events_that_unpack_alike_match_the_per_record_path(alike, events, options,
                                                            monkeypatch):
    made = []
    args_text = text_caches._args_text
    monkeypatch.setattr(text_caches, "_args_text", lambda *args: made.append(
        args) or args_text(*args))
    for name in events:
        echo(alike.root, f"events/kprobes/{name}/enable", "1")
    for i, v in enumerate(VALUES * 6):      # enough records to read as columns
        alike.kernel.run_as(100 + i % 3, f"t%{i % 3}", cpu=i % 2)
        for at in (VFS_READ, VFS_READ + 1, VFS_READ + 2):
            alike.engine.hit(at, di=v, si=VALUES[-1 - i % len(VALUES)])
        alike.engine.ret(VFS_READ, VFS_READ + 0x40 + i, ax=v, si=v)
        alike.clock.advance(1_000 * (i + 1))
    top = alike.tracer.top
    pairs = top.buffer.snapshot()
    assert {rec[3].name for _cpu, rec in pairs} == set(events)
    text = per_record(alike, pairs, options)
    assert top.render(pairs, options) == text
    # the text of equal arguments made once per read and tail (the arguments' names)
    assert made and len(made) == len(set(made)) < len(pairs)
    made.clear()
    assert top.render_runs(top.buffer.runs(), options, top.buffer) == text
    assert top.render_runs(top.buffer.runs(), options, top.buffer) == text
    # and once over the reads of trace
    assert len(made) == len(set(made))


@pytest.mark.parametrize("options", [TraceOptions(), TraceOptions(context_info=False)])
def test_equal_bytes_of_other_types_print_each_its_own_way(options):
    # the argument texts are kept by the arguments' bytes: events whose arguments print
    # alike (" x=%d") but unpack as other types must not take each other's text
    t = make_tracer(nr_cpus=1)
    echo(t.root, "kprobe_events", "p:s vfs_read x=%di:s32\np:u vfs_read x=%di:u32\n"
                                  "p:w vfs_read x=%di:s64\n")
    echo(t.root, "events/enable", "1")
    for v in VALUES:
        t.engine.hit(VFS_READ, di=v)
        t.clock.advance(1_000)
    pairs = t.tracer.buffer.snapshot()
    assert len({rec[6] for _cpu, rec in pairs}) < len(pairs)
    text = t.tracer.render(pairs, options)
    assert text == per_record(t, pairs, options)
    assert " x=-1\n" in text and " x=4294967295\n" in text


@pytest.mark.parametrize("options", [TraceOptions(), TraceOptions(in_ns=False)])
@pytest.mark.parametrize("in_order", [True, False])
def test_timestamps_about_a_second_print_as_each_record_does(options, in_order):
    # the seconds part of the context is made once per second (batch.second_ranges):
    # stamps about where the rounded microseconds reach the next second
    t = make_tracer(nr_cpus=1)
    echo(t.root, "kprobe_events", "p:num vfs_read a=%di:u8\n")
    echo(t.root, "events/enable", "1")
    t.engine.hit(VFS_READ, di=1)
    (_cpu, rec), = t.tracer.buffer.snapshot()
    stamps = [s * 1_000_000_000 + d for s in (0, 1, 2, 99_999, 100_000, 123_456)
              for d in (-501, -500, -499, 0, 499, 500)]
    stamps = [s for s in stamps if s >= 0]
    if not in_order:
        stamps = stamps[1::2] + stamps[::2]
    pairs = [(0, (ts,) + rec[1:]) for ts in stamps * 20]
    assert t.tracer.render(pairs, options) == per_record(t, pairs, options)


def test_reads_across_the_header_and_the_lines_are_the_texts_slices(filled):
    # the handle keeps trace's header and lines apart (nodes._Handle's parts)
    h = node(filled.root, "trace").open(os.O_RDONLY, 1, "cat")
    whole = h.read(1 << 20, 0)
    header = whole[:whole.index(b"\n", whole.rindex(b"#")) + 1]
    for size in (1, 7, len(header) - 1, len(header), len(header) + 1, 4096):
        for offset in (0, 3, len(header) - 5, len(header), len(header) + 2, len(whole) - 3,
                       len(whole), len(whole) + 10):
            assert h.read(size, offset) == whole[offset:offset + size]
    h.release()
    assert whole.count(b"\n") > 4 * len(VALUES)
