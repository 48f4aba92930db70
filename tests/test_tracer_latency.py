"""The latency tracers (irqsoff, preemptoff, preemptirqsoff, wakeup, wakeup_rt,
wakeup_dl) on the fake tracer, driven through their hook handlers as the kernel's hook
points would call them: the maximum swapped into the snapshot, tracing_max_latency,
tracing_thresh, EBUSY for snapshot writes, and the latency-format text 6.1 prints."""

import errno
import struct
from types import SimpleNamespace

import pytest

from kprobefs.tracing.tracers.latency_format import (
    lat_flags, lat_flags_text, latency_header, render_latency, task_state_char,
)
from kprobefs.tracing.tracers.latency_tracers import IrqsoffTracer, WakeupTracer, _Machine
from kprobefs.tracing.buffers.output import TraceOptions
from kprobefs.tracing.buffers.snapshot import MaxData
from tracer_fakes import (
    KERNEL_CLONE, KSYS_READ, VFS_READ, cat, echo, make_tracer, write_errno,
)

STACK = 0xFFFFC90000010000
TASKS = 0xFFFF888000100000
KABI = {"task.pid": 0, "task.state": 4, "task.comm": 8}
IF = 0x200


class FakeOps:
    def __init__(self, func, want_parent_ip):
        self.func = func
        self.filter = set()
        self.registered = False


class FakeFtrace:
    def __init__(self):
        self.ops = []

    def register_ftrace_function(self, ops):
        ops.registered = True
        self.ops.append(ops)

    def unregister_ftrace_function(self, ops):
        ops.registered = False
        self.ops.remove(ops)


@pytest.fixture
def t():
    t = make_tracer()
    k = t.kernel
    k.kabi = KABI
    # a frame chain: sp -> ret VFS_READ+5; bp -> (next bp, KSYS_READ+9) -> (0, KERNEL_CLONE+3)
    stack = bytearray(0x100)
    struct.pack_into("<Q", stack, 0x00, VFS_READ + 5)
    struct.pack_into("<QQ", stack, 0x40, STACK + 0x80, KSYS_READ + 9)
    struct.pack_into("<QQ", stack, 0x80, 0, KERNEL_CLONE + 3)
    k.mem[STACK] = bytes(stack)
    tasks = bytearray(0x200)
    for i, (pid, state, comm) in enumerate(((42, 0, b"bash"), (77, 1, b"sleep"))):
        struct.pack_into("<iI16s", tasks, 0x100 * i, pid, state, comm)
    k.mem[TASKS] = bytes(tasks)
    t.ftrace = FakeFtrace()
    machine = _Machine(k, t.tracer.symbols)
    sites = {name: i for i, name in enumerate((
        "tracer_hardirqs_off", "tracer_hardirqs_on", "tracer_preempt_off",
        "tracer_preempt_on", "tracer_sched_wakeup", "tracer_sched_switch"))}
    args = t.args = (machine, t.ftrace, FakeOps, sites, lambda: t.tracer.tracing_thresh_ns)
    top = t.tracer.top
    for tracer in (IrqsoffTracer("irqsoff", 1, top, *args),
                   IrqsoffTracer("preemptoff", 2, top, *args),
                   WakeupTracer("wakeup", False, False, top, *args),
                   WakeupTracer("wakeup_rt", True, False, top, *args)):
        top.add_tracer(tracer)
    t.kernel.run_as(42, "bash")
    return t


def regs(**kw):
    base = dict(di=0, si=0, dx=0, cx=0, r8=0, flags=IF, sp=STACK, bp=STACK + 0x40,
                ip=0xFFFFFFFF81000123)
    base.update(kw)
    return SimpleNamespace(**base)


def hook(t, name):
    return next(ops.func for ops in t.ftrace.ops if ops.func.__name__ == name)


def lines(text):
    return [line for line in text.splitlines() if not line.startswith("#")]


# ---------------------------------------------------------------- the format

def test_lat_flags_as_trace_print_lat_fmt():
    assert lat_flags_text(lat_flags(True, 0)) == "d...."
    assert lat_flags_text(lat_flags(False, 1)) == "...1."
    assert lat_flags_text(lat_flags(True, 0x12)) == "d..21"
    assert [task_state_char(s) for s in (0, 1, 2, 4, 0x80)] == ["R", "S", "D", "T", "R"]


def test_latency_header_is_6_1s():
    md = MaxData(cpu=1, latency_ns=500_123_456, comm="sh", pid=12, critical_start=VFS_READ,
                 critical_end=KSYS_READ)
    text = latency_header("irqsoff", "6.1.0-kprobefs", 4, 5, 2, md,
                          lambda addr, off: {VFS_READ: "vfs_read", KSYS_READ: "ksys_read"}
                          [addr], TraceOptions())
    assert text == (
        "# tracer: irqsoff\n#\n"
        "# irqsoff latency trace v1.1.5 on 6.1.0-kprobefs\n"
        "# --------------------------------------------------------------------\n"
        "# latency: 500123 us, #4/5, CPU#1 | (M:desktop VP:0, KP:0, SP:0 HP:0 #P:2)\n"
        "#    -----------------\n"
        "#    | task: sh-12 (uid:0 nice:0 policy:0 rt_prio:0)\n"
        "#    -----------------\n"
        "#  => started at: vfs_read\n"
        "#  => ended at:   ksys_read\n"
        "#\n#\n"
        "#                    _------=> CPU#            \n"
        "#                   / _-----=> irqs-off/BH-disabled\n"
        "#                  | / _----=> need-resched    \n"
        "#                  || / _---=> hardirq/softirq \n"
        "#                  ||| / _--=> preempt-depth   \n"
        "#                  |||| / _-=> migrate-disable \n"
        "#                  ||||| /     delay           \n"
        "#  cmd     pid     |||||| time  |   caller     \n"
        "#     \\   /        ||||||  \\    |    /       \n")
    # an empty buffer: the tracer line only
    assert latency_header("irqsoff", "x", 0, 0, 2, md, None, TraceOptions()) == \
        "# tracer: irqsoff\n#\n"


def test_latency_lines_time_from_the_start_with_the_mark_of_the_gap():
    recs = [(0, (1000, 5, lat_flags(True, 0), None, "a")),
            (0, (1000 + 150_000, 5, lat_flags(True, 0), None, "b")),
            (1, (1000 + 150_400, 5, lat_flags(False, 1), None, "c"))]
    text = render_latency(recs, 1000, lambda pid: "longcommand", lambda rec: rec[4] + "\n",
                          TraceOptions())
    assert text == ("longcomm-5         0d....    0us!: a\n"
                    "longcomm-5         0d....  150us : b\n"
                    "longcomm-5         1...1.  150us : c\n")


# ---------------------------------------------------------------- irqsoff

def test_irqsoff_swaps_a_new_maximum_into_the_trace(t):
    echo(t.root, "current_tracer", "irqsoff")
    assert cat(t.root, "current_tracer") == "irqsoff\n"
    assert {ops.filter.pop() for ops in list(t.ftrace.ops)} == {0, 1}
    hook(t, "_hardirqs_off")(0, 0, None, regs(di=VFS_READ + 5, si=KSYS_READ + 9, flags=0))
    t.clock.advance(500_000_000)
    hook(t, "_hardirqs_on")(0, 0, None, regs(di=VFS_READ + 7, si=KSYS_READ + 9, flags=0))
    assert cat(t.root, "tracing_max_latency") == "500000\n"
    text = cat(t.root, "trace")
    assert "# latency: 500000 us, #4/4, CPU#0 |" in text
    assert "#    | task: bash-42 (uid:0 nice:0 policy:0 rt_prio:0)\n" in text
    assert "#  => started at: ksys_read\n#  => ended at:   ksys_read\n" in text
    body = lines(text)
    assert body[0] == "    bash-42        0d....    0us@: vfs_read <-ksys_read"
    assert body[1].startswith("    bash-42        0d.... 500000us")
    assert body[3] == "    bash-42        0d.... 500000us : <stack trace>"
    assert body[4:] == [" => ksys_read", " => kernel_clone"]
    # the main buffer goes on with the next section's start
    assert len(t.tracer.top.buffer.snapshot()) == 1
    assert write_errno(t.root, "snapshot", "1") == errno.EBUSY


def test_a_shorter_section_is_not_a_new_maximum_unless_past_the_threshold(t):
    echo(t.root, "current_tracer", "irqsoff")
    off, on = hook(t, "_hardirqs_off"), hook(t, "_hardirqs_on")

    def section(ns):
        off(0, 0, None, regs(di=VFS_READ + 5, si=KSYS_READ + 9, flags=0))
        t.clock.advance(ns)
        on(0, 0, None, regs(di=VFS_READ + 7, si=KSYS_READ + 9, flags=0))
    section(300_000)
    section(100_000)
    assert cat(t.root, "tracing_max_latency") == "300\n"
    echo(t.root, "tracing_thresh", "50")
    section(100_000)
    assert cat(t.root, "tracing_max_latency") == "100\n"


def test_irqsoff_ignores_a_section_inside_preemption_off_only_for_preempt_types(t):
    echo(t.root, "current_tracer", "preemptoff")
    off, on = hook(t, "_preempt_off"), hook(t, "_preempt_on")
    off(0, 0, None, regs(di=VFS_READ + 5, si=KSYS_READ + 9, dx=1))
    t.clock.advance(2_000)
    on(0, 0, None, regs(di=VFS_READ + 7, si=KSYS_READ + 9, dx=1))
    text = cat(t.root, "trace")
    assert "# preemptoff latency trace v1.1.5" in text and "...1." in text
    echo(t.root, "current_tracer", "nop")
    assert "# * Snapshot is freed *" in cat(t.root, "snapshot")
    echo(t.root, "snapshot", "1")                       # no longer EBUSY


def test_irqsoff_is_top_level_only_and_a_wakeup_tracer_serves_one_array(t):
    assert not IrqsoffTracer.allow_instances and WakeupTracer.allow_instances
    echo(t.root, "current_tracer", "wakeup")
    inst = t.tracer.new_instance("i")
    inst.add_tracer(WakeupTracer("wakeup", False, False, inst, *t.args))
    assert write_errno(t.root, "instances/i/current_tracer", "wakeup") == errno.EBUSY
    assert cat(t.root, "instances/i/current_tracer") == "nop\n"
    echo(t.root, "current_tracer", "nop")
    echo(t.root, "instances/i/current_tracer", "wakeup")


# ---------------------------------------------------------------- wakeup

def test_wakeup_traces_the_wakeup_and_the_switch(t):
    echo(t.root, "current_tracer", "wakeup")
    wake, switch = hook(t, "_probe_wakeup"), hook(t, "_probe_switch")
    t.kernel.run_as(42, "bash", cpu=1)
    wake(0, 0, None, regs(di=TASKS + 0x100, si=94, dx=1, cx=120))
    t.clock.advance(30_000)
    switch(0, 0, None, regs(di=TASKS, si=TASKS + 0x100, dx=120, cx=94, r8=1))
    text = cat(t.root, "trace")
    assert "#    | task: sleep-77 (uid:0 nice:0 policy:1 rt_prio:5)\n" in text
    assert "# latency: 30 us, #6/6, CPU#1 |" in text
    body = lines(text)
    assert body[0] == "    bash-42        1.....    0us : " \
                      "      42:120:R   + [001]      77: 94:S sleep"
    ctx = [line for line in body if "==>" in line]
    assert ctx == ["    bash-42        1.....   30us : "
                   "      42:120:R ==> [001]      77: 94:S sleep"]
    assert cat(t.root, "tracing_max_latency") == "30\n"


def test_wakeup_rt_ignores_a_fair_task_and_wakeup_a_worse_one(t):
    echo(t.root, "current_tracer", "wakeup_rt")
    wake = hook(t, "_probe_wakeup")
    wake(0, 0, None, regs(di=TASKS + 0x100, si=110, dx=0, cx=120))      # not rt
    assert lines(cat(t.root, "trace")) == []
    assert t.tracer.top.buffer.is_empty()
    echo(t.root, "current_tracer", "wakeup")
    wake = hook(t, "_probe_wakeup")
    wake(0, 0, None, regs(di=TASKS + 0x100, si=120, dx=0, cx=120))      # not better
    assert t.tracer.top.buffer.is_empty()
    wake(0, 0, None, regs(di=TASKS + 0x100, si=110, dx=0, cx=120))
    assert not t.tracer.top.buffer.is_empty()
