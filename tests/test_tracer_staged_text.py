"""`trace` made from the kernel recorder's staged bytes (output.TraceFormatter over
NativeRecorder._rows, no record tuples) prints what the per-record path prints for the
same records: every numeric fetch type at its extremes, return probes, events of one
layout mixed in a chunk, the events that take the decoding path (strings, symbols,
arrays, comm, bitfields, symstr), filters, lost events, instances and the options
that change the context columns."""

import re

import pytest

from kprobefs.tracing.buffers.output import KeptTrace, TraceOptions, format_context
from kprobefs.tracing.buffers.ring_buffer import Chunk, decode_runs, merge_runs
from test_tracer_e2e import read, write
from test_tracer_native import make, workload

NUMERIC = ["u8", "u16", "u32", "u64", "s8", "s16", "s32", "s64", "x8", "x16", "x32", "x64"]
# Immediates at each type's edges (stored as the kernel's recorder stores them) and a
# register the loop changes.
EDGES = ["0", "1", "-1", "0x7f", "0x80", "0x7fff", "0x8000", "0x7fffffff", "0x80000000",
         "0x7fffffffffffffff", "0x8000000000000000"]
OPTIONS = [TraceOptions(), TraceOptions(irq_info=False), TraceOptions(context_info=False),
           TraceOptions(in_ns=False), TraceOptions(sym_offset=True, sym_addr=True)]


def per_record(tr, runs, options):
    """The text of the records as the general path writes each line."""
    return "".join(format_context(tr.comm_cache.find(rec[1]), rec[1], cpu, rec[2],
                                  rec[0], options) + rec[3].render(rec, tr, options)
                   for cpu, rec in merge_runs(decode_runs(runs)))


def staged_text(tr, runs, options):
    return tr._formatter(options).render_runs(
        runs, lambda rec: rec[3].render(rec, tr, options), KeptTrace(),
        (options, tr.symbols.modules_token()))


def fast_chunks(tr, runs, options):
    """How many chunks of ``runs`` the formatter reads as rows (and how many in all)."""
    formatter = tr._formatter(options)
    chunks = [item for _cpu, items in runs for item in items if type(item) is Chunk]
    fast = [c for c in chunks if c.rows(c.data, lambda ev: formatter._codes_of(
        ev, None), {}) is not None]
    return len(fast), len(chunks)


def traced(events, loops=40, setup=(), cpus=2, where=""):
    kernel, tracer, root = make(True, cpus=cpus)
    for path, data in setup:
        write(root, path, data)
    write(root, "kprobe_events", events)
    write(root, f"{where}events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", loops, 1)
    workload(kernel)
    write(root, f"{where}events/kprobes/enable", "0")
    return kernel, tracer, root


def check(tr, options_list=OPTIONS, want_fast=True, staged=True):
    """The staged text is the per-record text under each options; returns the runs.
    ``staged``: the kernel recorded the records (there are chunks; None: either)."""
    runs = tr.trace_buffer().runs(staged=True)
    fast, chunks = fast_chunks(tr, runs, TraceOptions())
    assert staged is None or bool(chunks) == staged
    if want_fast is not None:
        assert (fast > 0) == want_fast
    for options in options_list:
        text = staged_text(tr, runs, options)
        assert text == per_record(tr, runs, options)
        assert text.count("\n") >= 40
    return runs


@pytest.mark.parametrize("ty", NUMERIC)
def test_each_numeric_type_at_its_edges(ty):
    args = " ".join(f"i{i}=\\{v}:{ty}" for i, v in enumerate(EDGES))
    _kernel, tracer, _root = traced(f"p:num kprobe_target_traced+5 r=%di:{ty} {args}\n")
    check(tracer.top)


def test_a_return_probe():
    _kernel, tracer, _root = traced("r:ret kprobe_target_traced rv=$retval:s32 x=%si:x16\n")
    check(tracer.top)


def test_events_of_one_layout_share_chunks():
    events = ("p:a kprobe_target_traced+5 a=%di b=%si\n"
              "p:b vfs_read a=%di b=%si\n"
              "p:d ksys_read a=%di b=%si\n")
    _kernel, tracer, _root = traced(events)
    runs = check(tracer.top)
    names = {line.split(": ")[1] for line in staged_text(tracer.top, runs, TraceOptions())
             .splitlines()}
    assert {"a", "b", "d"} <= names


def test_a_chunk_of_two_layouts_decodes():
    events = ("p:a kprobe_target_traced+5 a=%di b=%si\n"
              "r:r vfs_read a=%di b=%si\n"
              "p:c vfs_write a=%di:u8\n")
    _kernel, tracer, _root = traced(events)
    runs = check(tracer.top, want_fast=None)
    names = {line.split(": ")[1] for line in staged_text(tracer.top, runs, TraceOptions())
             .splitlines()}
    assert {"a", "r", "c"} <= names


@pytest.mark.parametrize("args, fast", [
    ("s=+0(%sp):string", False), ("f=%di:symbol", False), ("c=$comm", False),
    ("arr=+0(%sp):u16[3]", False), ("bf=%di:b4@2/32 n=%si", True)])
def test_other_fetch_types_read_as_rows_or_decoded(args, fast):
    _kernel, tracer, _root = traced(f"p:other kprobe_target_traced+5 {args}\n")
    check(tracer.top, want_fast=fast)


def test_a_symstr_event_is_recorded_by_the_host():
    _kernel, tracer, _root = traced("p:other kprobe_target_traced+5 ss=%di:symstr\n")
    check(tracer.top, want_fast=None, staged=False)


def test_a_filtered_event():
    # the kernel evaluates the filter on each record before staging it
    kernel, tracer, root = make(True, cpus=2)
    write(root, "kprobe_events", "p:flt kprobe_target_traced+5 a=%di b=%si:u32\n")
    write(root, "events/kprobes/flt/filter", "a & 1")
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", 200, 1)
    write(root, "events/kprobes/enable", "0")
    check(tracer.top)


def test_lost_events_in_a_small_buffer_and_the_first_read_of_the_mount():
    kernel, tracer, root = traced("p:lost kprobe_target_traced+5 a=%di b=%si c=%dx\n",
                                  setup=(("buffer_size_kb", "8"),), loops=3000)
    assert any(re.search(r"^overrun: [1-9]", read(root, f"per_cpu/cpu{cpu}/stats"), re.M)
               for cpu in (0, 1))
    check(tracer.top)
    first = read(root, "trace")
    again = read(root, "trace")
    fresh = tracer.render(tracer.buffer.snapshot(), tracer.trace_options())
    assert first == again
    assert "".join(line + "\n" for line in first.splitlines()
                   if not line.startswith("#")) == fresh


def test_an_instance():
    kernel, tracer, root = make(True, cpus=2)
    write(root, "kprobe_events", "p:inst kprobe_target_traced+5 a=%di b=%si:s16\n")
    tracer.new_instance("foo")
    tr = tracer.instances["foo"]
    where = "instances/foo/"
    write(root, f"{where}events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", 60, 1)
    write(root, f"{where}events/kprobes/enable", "0")
    # an instance's records come by the host (trace_array.py): records, no chunk
    check(tr, want_fast=None, staged=False)
    first = read(root, f"{where}trace")
    assert first == read(root, f"{where}trace")


def lines_of(text):
    return "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))


def test_rereads_keep_the_lines_of_chunks_and_make_what_changed():
    kernel, tracer, root = traced("p:k kprobe_target_traced+5 a=%di b=%si\n",
                                  setup=(("buffer_size_kb", "16"),), loops=300)
    first = read(root, "trace")
    assert first == read(root, "trace")
    # more records: the oldest pages overwritten, the kept lines of the rest used
    write(root, "events/kprobes/enable", "1")
    kernel.upcall("kprobe_bench_loop", 200, 1)
    write(root, "events/kprobes/enable", "0")
    second = read(root, "trace")
    options = tracer.trace_options()
    tr = tracer.top
    assert second != first
    # (per_record decodes copies: the pages keep their chunks for the next read)
    assert lines_of(second) == per_record(tr, tr.buffer.runs(staged=True), options)
    # a comm saved since: the chunks' lines are made again
    tracer.comm_cache.save(0, "renamed")
    third = read(root, "trace")
    assert "renamed-0" in third and "<idle>-0" not in third
    assert lines_of(third) == per_record(tr, tr.buffer.runs(staged=True), options)
    assert any(type(item) is Chunk for _cpu, items in tr.buffer.runs(staged=True)
               for item in items)


def test_records_the_host_wrote_read_at_once():
    # the host's interpreter records every hit (another trace clock than the kernel's):
    # records, no chunk; the arguments of events that unpack alike read at once
    kernel, tracer, root = make(False, cpus=2)
    write(root, "kprobe_events", "p:one kprobe_target_traced+5 a=%di b=%si c=%dx d=%cx\n"
                                 "p:two kprobe_target_traced+5 a=%di b=%si c=%dx d=%cx\n"
                                 "p:three vfs_read a=%di:u8 b=%si:s32\n")
    write(root, "events/kprobes/enable", "1")
    kernel.upcall("kprobe_bench_loop", 40, 1)
    workload(kernel)
    write(root, "events/kprobes/enable", "0")
    runs = check(tracer.top, want_fast=None, staged=False)
    names = {line.split(": ")[1] for line in staged_text(tracer.top, runs, TraceOptions())
             .splitlines()}
    assert names == {"one", "two", "three"}
    first = read(root, "trace")
    assert first == read(root, "trace")
    assert lines_of(first) == per_record(tracer.top, tracer.top.buffer.runs(staged=True),
                                         tracer.trace_options())


def test_events_at_one_address_share_chunks():
    # the kernel records both (one address, two types: the types read, the address not)
    events = ("p:first kprobe_target_traced+5 a=%di b=%si:s32\n"
              "p:second kprobe_target_traced+5 x=%di y=%si:s32\n")
    _kernel, tracer, _root = traced(events)
    runs = check(tracer.top)
    names = {line.split(": ")[1] for line in staged_text(tracer.top, runs, TraceOptions())
             .splitlines()}
    assert names == {"first", "second"}
