"""Interrupts and trace_printk through a real mount and a shell: the irq events of the
daemon's own kernel, and a module's trace_printk() lines and formats."""

import re
from pathlib import Path

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)


def test_irq_events_of_the_nics_interrupt_and_the_tick(real):
    """The daemon's workload is off: a shell's own system calls run while the tick
    comes, and `echo` to set_event enables the irq system."""
    t = f"{real}/tracing"
    assert sh(f"echo > {t}/trace; echo 'irq:*' > {t}/set_event").returncode == 0
    try:
        script = f"for i in $(seq 200); do cat {t}/events/irq/enable > /dev/null; done"
        for _ in range(20):
            assert sh(script).returncode == 0
            trace = Path(f"{t}/trace").read_text()
            if "irq=0 name=timer" in trace:
                break
    finally:
        sh(f"echo > {t}/set_event")
    ticks = [line for line in trace.splitlines() if "irq_handler_entry: irq=0 name=timer" in line]
    assert ticks and all(" d.h.. " in line for line in ticks), trace
    assert sh(f"cat {t}/events/irq/enable").stdout == "0\n"


def test_trace_printk_from_a_loaded_module(real):
    t = f"{real}/tracing"
    ctl = f"{real}/kprobefs/modules"
    assert sh(f"echo > {t}/trace; echo 'load trace-printk' > {ctl}").returncode == 0
    try:
        trace = sh(f"cat {t}/trace").stdout
        formats = sh(f"cat {t}/printk_formats").stdout
    finally:
        assert sh(f"echo 'unload trace_printk' > {ctl}").returncode == 0
    for kind in ("trace_bputs", "trace_puts", "trace_bprintk", "trace_printk"):
        assert re.search(rf"\.\.\.\.\. +[\d.]+: trace_printk_init: This .* {kind}", trace), trace
        assert re.search(rf"d\.h\.\. +[\d.]+: trace_printk_irq_work: \(irq\) .* {kind}",
                         trace), trace
    assert "This is a %s that will use trace_bprintk" in formats
    assert re.search(r'^0x[0-9a-f]+ : "\(irq\) This is a static string that will use '
                     r'trace_bputs\\n"$', formats, re.M), formats


def test_funcgraph_irqs_off_drops_the_functions_interrupts_run(real):
    """function_graph on irq_exit (set_graph_function), which interrupts call in
    hardirq context: with funcgraph-irqs on (the default) it is recorded; off, 6.1's
    trace_graph_entry ignores every function called in hardirq context, and the same
    load records none."""
    t = f"{real}/tracing"
    load = f"for i in $(seq 200); do cat {t}/tracing_on > /dev/null; done"

    def graph_under_load():
        assert sh(f"echo > {t}/trace").returncode == 0
        for _ in range(10):
            assert sh(load).returncode == 0
            trace = Path(f"{t}/trace").read_text()
            if "irq_exit" in trace:
                break
        return trace

    r = sh(f"echo irq_exit > {t}/set_graph_function && "
           f"echo function_graph > {t}/current_tracer")
    assert r.returncode == 0, r.stderr
    try:
        assert "irq_exit" in graph_under_load()
        assert sh(f"echo 0 > {t}/options/funcgraph-irqs").returncode == 0
        assert "irq_exit" not in graph_under_load()
    finally:
        sh(f"echo nop > {t}/current_tracer; echo > {t}/set_graph_function; "
           f"echo 1 > {t}/options/funcgraph-irqs")
