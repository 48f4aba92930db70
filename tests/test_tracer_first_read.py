"""The first read of ``trace`` over records the kernel recorded prints what a read that
keeps no text prints, and a reread the same again."""

from test_tracer_e2e import read, write
from test_tracer_native import make, workload

ARGS = "a=%di b=%si c=%dx:u32 d=%cx:s64"


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
