"""Interrupts (machine/irq.py, arch/entry.S, kernel/irq.c, kernel/softirq.c) and the irq
events: the timer and the NIC's line arrive for real, through an interrupt gate, only
where the kernel's interrupt flag allows; their events have Linux 6.1's formats and
their records show hardirq and softirq context; kprobes work on code that runs there."""

import re
import struct
from types import SimpleNamespace

import pytest
from unicorn.x86_const import UC_X86_REG_RFLAGS, UC_X86_REG_RIP, UC_X86_REG_RSP

from kprobefs import Kernel, Kprobe, Kretprobe
from kprobefs.machine.irq import (
    ISA_IRQ_VECTOR, IRQ_WORK_VECTOR, NIC_IRQ, TIMER_IRQ, X86_EFLAGS_IF, InterruptController,
)
from kprobefs.tracing import Tracer

from test_net import SYN, packet
from test_trace_events import COMMON
from test_tracer_e2e import read, write

_SOFTIRQ = """\
\tfield:unsigned int vec;\toffset:8;\tsize:4;\tsigned:0;

print fmt: "vec=%u [action=%s]", REC->vec, __print_symbolic(REC->vec, { 0, "HI" }, \
{ 1, "TIMER" }, { 2, "NET_TX" }, { 3, "NET_RX" }, { 4, "BLOCK" }, { 5, "IRQ_POLL" }, \
{ 6, "TASKLET" }, { 7, "SCHED" }, { 8, "HRTIMER" }, { 9, "RCU" })
"""
# Linux 6.1's layouts (include/trace/events/irq.h), after the ID.
SIX_ONE = {
    "irq_handler_entry": """\
\tfield:int irq;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] name;\toffset:12;\tsize:4;\tsigned:1;

print fmt: "irq=%d name=%s", REC->irq, __get_str(name)
""",
    "irq_handler_exit": """\
\tfield:int irq;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int ret;\toffset:12;\tsize:4;\tsigned:1;

print fmt: "irq=%d ret=%s", REC->irq, REC->ret ? "handled" : "unhandled"
""",
    "softirq_entry": _SOFTIRQ,
    "softirq_exit": _SOFTIRQ,
    "softirq_raise": _SOFTIRQ,
}
# comm-pid [cpu] flags timestamp: event: text
_LINE = re.compile(r"^\s*(?P<comm>.+)-(?P<pid>\d+)\s+\[(?P<cpu>\d{3})\] (?P<flags>\S{5})\s+"
                   r"\d+\.\d{6}: (?P<event>\w+): (?P<text>.*)$")


@pytest.fixture
def traced():
    kernel = Kernel(cpus=2, seed=0)
    tracer = Tracer(kernel.kprobes, kernel)
    return kernel, tracer, tracer.tracefs_root()


def records(root):
    return [m.groupdict() for m in map(_LINE.match, read(root, "trace").splitlines()) if m]


def run_until(kernel, done, limit=200):
    """Rounds of system calls until done() holds (the timer needs the host's time to
    pass); a bound on the calls, not on time."""
    task = kernel.spawn("busy")
    for _ in range(limit):
        if done():
            return
        for _ in range(100):
            kernel.syscall(task, "getppid")
    raise AssertionError("not seen after %d system calls" % (100 * limit))


@pytest.mark.parametrize("event", sorted(SIX_ONE))
def test_format_is_linux_6_1s(traced, event):
    _kernel, _tracer, root = traced
    event_id = int(read(root, f"events/irq/{event}/id"))
    assert read(root, f"events/irq/{event}/format") == (
        f"name: {event}\nID: {event_id}\nformat:\n" + COMMON + SIX_ONE[event])


def test_the_nics_interrupt_raises_net_rx_which_runs_on_irq_exit(traced):
    """A frame in the NIC's ring: IRQ 11 on an idle CPU, in hardirq context with
    interrupts off; its handler raises NET_RX, which runs as the interrupt leaves, in
    softirq context with interrupts on, and receives the frame there."""
    kernel, _tracer, root = traced
    write(root, "set_event", "irq:irq_handler_entry irq:irq_handler_exit irq:softirq_raise "
          "irq:softirq_entry irq:softirq_exit net:netif_receive_skb")
    write(root, "events/irq/irq_handler_entry/filter", "irq == 11")
    write(root, "events/irq/irq_handler_exit/filter", "irq == 11")
    kernel.inject_packet(packet(40002, 8084, SYN))
    kernel.run_until_idle()
    got = [(r["comm"].strip(), r["flags"], r["event"], r["text"]) for r in records(root)]
    got = [g for g in got if g[2] != "softirq_raise" or "NET_RX" in g[3]]
    assert [g[:3] for g in got] == [
        ("<idle>", "d.h..", "irq_handler_entry"),
        ("<idle>", "d.h..", "softirq_raise"),
        ("<idle>", "d.h..", "irq_handler_exit"),
        ("<idle>", "..s..", "softirq_entry"),
        ("<idle>", "..s..", "netif_receive_skb"),
        ("<idle>", "..s..", "softirq_exit")], got
    assert [g[3] for g in got if g[2] != "netif_receive_skb"] == [
        "irq=11 name=eth0", "vec=3 [action=NET_RX]", "irq=11 ret=handled",
        "vec=3 [action=NET_RX]", "vec=3 [action=NET_RX]"]


def test_timer_interrupts_arrive_while_tasks_run(traced):
    """The tick: irq 0, "timer", HZ times a second while the CPUs run (between system
    calls a CPU idles: its due tick comes when it next runs)."""
    kernel, _tracer, root = traced
    write(root, "events/irq/irq_handler_entry/enable", "1")
    write(root, "events/irq/irq_handler_exit/enable", "1")
    run_until(kernel, lambda: len(records(root)) >= 6)
    ticks = [r for r in records(root) if r["event"] == "irq_handler_entry"]
    assert all(r["text"] == "irq=0 name=timer" and r["flags"] == "d.h.." for r in ticks)
    exits = [r for r in records(root) if r["event"] == "irq_handler_exit"]
    assert exits and all(r["text"] == "irq=0 ret=handled" for r in exits)
    assert kernel.irq.delivered[ISA_IRQ_VECTOR(TIMER_IRQ)] >= len(ticks)


def test_kprobes_on_interrupt_handlers(traced):
    """A kprobe event on the timer's handler records in hardirq context (or the int3's
    NMI-like one while not optimized), one on the NET_RX action in softirq context; a
    Python kprobe and kretprobe on the tick's handler see every call."""
    kernel, _tracer, root = traced
    write(root, "kprobe_events", "p:tick timer_interrupt irq=%di:s32\np:rx net_rx_action\n")
    write(root, "events/kprobes/enable", "1")
    hits, returns = [], []
    kp = Kprobe(symbol_name="timer_interrupt",
                pre_handler=lambda p, regs: hits.append(regs.di) or 0)
    rp = Kretprobe(symbol_name="timer_interrupt",
                   handler=lambda ri, regs: returns.append(regs.ax) or 0)
    kernel.register_kprobe(kp)
    kernel.register_kretprobe(rp)
    try:
        kernel.inject_packet(packet(40003, 8084, SYN))
        run_until(kernel, lambda: len(returns) >= 3)
    finally:
        kernel.unregister_kretprobe(rp)
        kernel.unregister_kprobe(kp)
    assert set(hits) == {TIMER_IRQ} and len(hits) >= len(returns) >= 3
    assert set(returns) == {1}                  # IRQ_HANDLED
    got = records(root)
    ticks = [r for r in got if r["event"] == "tick"]
    assert ticks and all(r["flags"] in ("d.h..", "d.Z..") for r in ticks)
    assert all(r["text"].endswith("irq=0") for r in ticks)
    rx = [r for r in got if r["event"] == "rx"]
    assert rx and all(r["flags"] in ("..s..", "d.Z..") for r in rx), rx


def test_trace_printk_from_a_module_and_its_irq_work(traced):
    """trace_printk.ko prints from its init (process context) and from its irq_work,
    which a self-IPI runs in hardirq context; printk_formats lists the module's
    constant formats at the kernel copies the records point to, which outlive it."""
    kernel, _tracer, root = traced
    kernel.modules.load("trace-printk")
    lines = [(r["flags"], r["event"], r["text"]) for r in records(root)]
    assert lines == [
        (".....", "trace_printk_init", "This is a static string that will use trace_bputs"),
        (".....", "trace_printk_init", "This is a dynamic string that will use trace_puts"),
        ("d.h..", "trace_printk_irq_work",
         "(irq) This is a static string that will use trace_bputs"),
        ("d.h..", "trace_printk_irq_work",
         "(irq) This is a dynamic string that will use trace_puts"),
        ("d.h..", "trace_printk_irq_work",
         "(irq) This is a static string that will use trace_bprintk()"),
        ("d.h..", "trace_printk_irq_work",
         "(irq) This is a dynamic string that will use trace_printk"),
        (".....", "trace_printk_init", "This is a static string that will use trace_bprintk()"),
        (".....", "trace_printk_init", "This is a dynamic string that will use trace_printk"),
    ]
    assert kernel.irq.delivered[IRQ_WORK_VECTOR] == 1
    formats = read(root, "printk_formats").splitlines()
    assert [line.split(" : ", 1)[1] for line in formats] == [
        '"This is a %s that will use trace_bprintk()\\n"',
        '"This is a static string that will use trace_bputs\\n"',
        '"(irq) This is a %s that will use trace_bprintk()\\n"',
        '"(irq) This is a static string that will use trace_bputs\\n"']
    area = kernel.image.symbol_value("trace_bprintk_fmt_area")
    for line in formats:
        addr = int(line.split(" : ")[0], 16)
        assert area <= addr < area + 16384
    kernel.modules.unload("trace_printk")
    after = [r["text"] for r in records(root)]
    assert after == [text for _flags, _event, text in lines]     # still readable
    kernel.modules.load("trace-printk")           # the same formats, held once
    assert read(root, "printk_formats").splitlines() == formats


def test_trace_printk_follows_tracing_on_and_its_option(traced):
    kernel, _tracer, root = traced
    write(root, "options/trace_printk", "0")
    kernel.modules.load("trace-printk")
    assert records(root) == []
    kernel.modules.unload("trace_printk")
    write(root, "options/trace_printk", "1")
    write(root, "tracing_on", "0")
    kernel.modules.load("trace-printk")
    assert records(root) == []
    kernel.modules.unload("trace_printk")
    write(root, "tracing_on", "1")
    kernel.modules.load("trace-printk")
    assert len(records(root)) == 8


# ---- the controller on its own: delivery only where IF is set --------------------------
class _Cpu:
    index = 0


class _FakeMachine:
    """Just what InterruptController touches: registers, memory, symbols."""

    def __init__(self, flags):
        self.regs = {UC_X86_REG_RFLAGS: flags, UC_X86_REG_RSP: 0x1008,
                     UC_X86_REG_RIP: 0xFFFFFFFF81001234}
        self.memory = {}
        self.cpus = [_Cpu()]
        fast = self

        class _Mem:
            def write(self, addr, data):
                fast.memory[addr] = data

        self.mem = _Mem()
        self.fast = self

    def get(self, reg):
        return self.regs[reg]

    def set(self, reg, value):
        self.regs[reg] = value

    image = SimpleNamespace(symbol_value=lambda name: 0xFFFFFFFF81E00000)


def test_an_interrupt_waits_for_the_interrupt_flag():
    machine = _FakeMachine(flags=0x2)
    ctl = InterruptController(machine, hz=0)
    ctl._pending[0].add(ISA_IRQ_VECTOR(NIC_IRQ))
    ctl.before_turn(machine.cpus[0])
    assert machine.memory == {} and ctl.pending(machine.cpus[0])
    assert machine.regs[UC_X86_REG_RIP] == 0xFFFFFFFF81001234

    machine.regs[UC_X86_REG_RFLAGS] = 0x2 | X86_EFLAGS_IF | 0x100
    ctl.before_turn(machine.cpus[0])
    (frame, data), = machine.memory.items()
    assert frame == 0x1000 - 48                 # aligned down to 16, then six words
    assert struct.unpack("<6Q", data) == (
        ISA_IRQ_VECTOR(NIC_IRQ), 0xFFFFFFFF81001234, 0x10, 0x2 | X86_EFLAGS_IF | 0x100,
        0x1008, 0x18)
    assert machine.regs[UC_X86_REG_RSP] == frame
    assert machine.regs[UC_X86_REG_RIP] == 0xFFFFFFFF81E00000
    assert machine.regs[UC_X86_REG_RFLAGS] == 0x2              # IF and TF cleared
    assert not ctl.pending(machine.cpus[0])


def test_the_highest_vector_goes_first():
    machine = _FakeMachine(flags=0x2 | X86_EFLAGS_IF)
    ctl = InterruptController(machine, hz=0)
    ctl._pending[0].update({ISA_IRQ_VECTOR(TIMER_IRQ), IRQ_WORK_VECTOR})
    ctl.before_turn(machine.cpus[0])
    (data,) = machine.memory.values()
    assert struct.unpack_from("<Q", data)[0] == IRQ_WORK_VECTOR
    assert ctl._pending[0] == {ISA_IRQ_VECTOR(TIMER_IRQ)}


def test_bprintk_packs_and_the_trace_prints_its_arguments(traced):
    """__trace_bprintk's binary arguments (the kernel's vbin_printf), printed back by
    bstr_printf: integer sizes and alignment, strings inline, `*` widths, %ps/%pS."""
    kernel, _tracer, root = traced
    vfs_read = kernel.image.symbol_value("vfs_read")
    ip = kernel.image.symbol_value("do_sys_openat2")
    got = []
    for fmt, *args in (("%d %s %hhx %lld\n", -5, "str", 0x1FF, 1 << 40),
                       ("[%5d|%-4s|%*d]\n", 42, "ab", 6, 7),
                       ("%ps %pS %c%%\n", vfs_read, vfs_read + 5, ord("x"))):
        # the format is in the host's scratch memory, which the next call reuses
        kernel.upcall("__trace_bprintk", ip, fmt, *args)
        last = records(root)[-1]
        got.append(last["event"] + ": " + last["text"])
    assert got[:2] == ["do_sys_openat2: -5 str ff 1099511627776",
                       "do_sys_openat2: [   42|ab  |     7]"]
    assert re.fullmatch(r"do_sys_openat2: vfs_read vfs_read\+0x5/0x[0-9a-f]+ x%", got[2])


def test_bstr_printf_reads_vbin_printfs_layout():
    from kprobefs.tracing.events.trace_printk import bstr_printf, printk_formats_text
    buf = (struct.pack("<b", -1) + b"\0" + struct.pack("<h", -2)     # char, pad, short
           + struct.pack("<II", 1, 2)                                # a u64 as two u32s
           + b"hi\0" + b"\0" + struct.pack("<i", 3))                 # string, pad, int
    assert bstr_printf("%hhd %hd %llx %s %d", buf, lambda a, o: None) == "-1 -2 200000001 hi 3"
    assert printk_formats_text([(0x10, 'a\tb"c\\d\n')]) == '0x10 : "a\\tb\\"c\\d\\n"\n'


def test_a_due_timer_runs_in_the_timer_softirq():
    """A timer whose expiry has come: the next tick on its CPU raises TIMER_SOFTIRQ,
    which runs the timer's function on irq_exit (here kfree of the timer itself, which
    the softirq no longer touches once it has called it)."""
    kernel = Kernel(cpus=1, seed=0)
    tracer = Tracer(kernel.kprobes, kernel)
    root = tracer.tracefs_root()
    write(root, "set_event", "irq:softirq_raise irq:softirq_entry irq:softirq_exit")
    write(root, "events/irq/filter", "vec == 1")
    kfree_hits = []
    probe = Kprobe(symbol_name="kfree",
                   pre_handler=lambda p, regs: kfree_hits.append(regs.di) or 0)
    kernel.register_kprobe(probe)
    timer = kernel.upcall("kzalloc", 64, 0) & (1 << 64) - 1     # upcall's value is signed
    kernel.upcall("timer_setup", timer, kernel.image.symbol_value("kfree"))
    jiffies = struct.unpack("<Q", kernel.read(kernel.image.symbol_value("jiffies"), 8))[0]
    assert kernel.upcall("mod_timer", timer, jiffies) == 0       # not pending before
    run_until(kernel, lambda: timer in kfree_hits)
    kernel.unregister_kprobe(probe)
    got = [(r["flags"], r["event"], r["text"]) for r in records(root)]
    assert got[:3] == [("d.h..", "softirq_raise", "vec=1 [action=TIMER]"),
                       ("..s..", "softirq_entry", "vec=1 [action=TIMER]"),
                       ("..s..", "softirq_exit", "vec=1 [action=TIMER]")], got


@pytest.mark.parametrize("flags,text", [
    (0, "....."), (0x01, "d...."), (0x49, "d.Z.."), (0x40, "..z.."), (0x09, "d.h.."),
    (0x18, "..H.."), (0x10, "..s.."), (0x81, "D...."), (0x80, "b...."), (0x02, "X...."),
    (0x04, ".n..."), (0x20, ".p..."), (0x24, ".N...")])
def test_flags_columns_are_6_1s(flags, text):
    from kprobefs.tracing.buffers.output import flags_text
    assert flags_text(flags) == text
