"""The first read of ``trace`` over records the kernel recorded: staged entries decoded
in bulk (native.NativeRecorder._decode_uniform) give the records the entry-by-entry
loop gives, for kprobe, kretprobe and static events, one event or many in a chunk, and
the first read of a buffer prints what a read that keeps no text prints, and a reread
the same again."""

import pytest

from test_tracer_e2e import read, write
from test_tracer_native import make, workload

ARGS = "a=%di b=%si c=%dx:u32 d=%cx:s64"


def staged_chunks(tracer):
    tracer.buffer.counts()          # the staged records taken into their pages
    return [item for buf in tracer.buffer.cpus for page in buf.pages for item in page]


@pytest.mark.parametrize("events,in_bulk", [
    (f"p:one kprobe_target_traced+5 {ARGS}\n", True),
    ("".join(f"p:e{i} kprobe_target_traced+5 {ARGS}\n" for i in range(5)), True),
    ("r:ret kprobe_target_traced rv=$retval:s32 x=%si\n", True),
    (f"r:ret kprobe_target_traced rv=$retval:s32\np:one kprobe_target_traced+5 {ARGS}\n",
     False),                                    # two layouts: the loop
    ("p:str kprobe_target_traced+5 s=+0(%si):string\n", True),    # one string: one size
    ("", True),                                 # a static event alone
    (f"p:one kprobe_target_traced+5 {ARGS}\n+", False),   # and a static event with it
])
def test_bulk_decoding_gives_the_loop_s_records(events, in_bulk):
    kernel, tracer, root = make(True, cpus=1)
    static = not events or events.endswith("+")
    if events.rstrip("+"):
        write(root, "kprobe_events", events.rstrip("+"))
        write(root, "events/kprobes/enable", "1")
        kernel.wait_for_kprobe_optimizer()
        kernel.upcall("kprobe_bench_loop", 50, 1)
    if static:
        write(root, "events/syscalls/sys_enter_getpid/enable", "1")
        t = kernel.spawn("getter")
        for _ in range(20):
            kernel.syscall(t, "getpid")
    chunks = staged_chunks(tracer)
    assert chunks
    native = tracer.native
    for chunk in chunks:
        bulk = native._decode_uniform(chunk.data)
        if bulk is not None:
            assert bulk == loop_decode(native, chunk.data)
    assert any(native._decode_uniform(c.data) is not None for c in chunks) == in_bulk


def loop_decode(native, data):
    """_decode without its bulk path."""
    bulk, native._decode_uniform = native._decode_uniform, lambda data: None
    try:
        return native._decode(data)
    finally:
        native._decode_uniform = bulk


def test_first_read_and_reread_print_what_a_fresh_formatter_prints():
    kernel, tracer, root = make(True, cpus=2)
    write(root, "kprobe_events", "".join(f"p:e{i} kprobe_target_traced+5 {ARGS}\n"
                                         for i in range(3)))
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", 300, 1)
    workload(kernel)
    write(root, "events/kprobes/enable", "0")
    first = read(root, "trace")
    again = read(root, "trace")
    options = tracer.trace_options()
    fresh = tracer.render(tracer.buffer.snapshot(), options)
    body = "".join(line + "\n" for line in first.splitlines() if not line.startswith("#"))
    assert first == again and body == fresh and body.count("\n") > 300
