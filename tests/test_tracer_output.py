"""trace / trace_pipe text: header, context columns, kprobe and kretprobe lines, markers,
stack traces, comm cache, clocks (golden text)."""

import errno
import os
import struct
import time

import pytest

from tracer_fakes import (
    KDATA, KERNEL_CLONE, KSYS_READ, STACK, UBASE, VFS_READ, cat, echo, make_regs,
    make_tracer, node, write_errno,
)

HEADER = (
    "# tracer: nop\n"
    "#\n"
    "# entries-in-buffer/entries-written: {0}/{1}   #P:2\n"
    "#\n"
    "#                                _-----=> irqs-off/BH-disabled\n"
    "#                               / _----=> need-resched\n"
    "#                              | / _---=> hardirq/softirq\n"
    "#                              || / _--=> preempt-depth\n"
    "#                              ||| / _-=> migrate-disable\n"
    "#                              |||| /     delay\n"
    "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
    "#              | |         |   |||||     |         |\n"
)


@pytest.fixture
def t():
    return make_tracer()


def enable(t, *events):
    for ev in events:
        echo(t.root, f"events/kprobes/{ev}/enable", "1")


def test_empty_trace_has_header(t):
    assert cat(t.root, "trace") == HEADER.format(0, 0)


def test_kprobe_and_kretprobe_lines_golden(t):
    echo(t.root, "kprobe_events",
         "p:myprobe vfs_read+4 file=%di count=%dx:u32 name=+0(%si):string cm=$comm\n"
         "r:myretprobe vfs_read ret=$retval:s64\n"
         "p:atentry vfs_read $arg1 sym=%ip:symbol\n")
    enable(t, "myprobe", "myretprobe", "atentry")
    t.kernel.run_as(1234, "bash", cpu=1)
    t.engine.hit(VFS_READ + 4, di=0x1, dx=0x80, si=KDATA + 0x80)
    t.clock.advance(112_345)
    t.kernel.run_as(1301, "cat", cpu=0)
    t.engine.ret(VFS_READ, KSYS_READ + 0x75, ax=(1 << 64) - 2)
    t.clock.advance(1_000_000_000)
    t.engine.hit(VFS_READ, di=0x42)
    assert cat(t.root, "trace") == HEADER.format(3, 3) + (
        "            bash-1234    [001] d.Z..  1234.567891: myprobe: (vfs_read+0x4/0x1a0) "
        "file=0x1 count=128 name=\"hello\" cm=\"bash\"\n"
        "             cat-1301    [000] .....  1234.568003: myretprobe: "
        "(ksys_read+0x75/0xf0 <- vfs_read) ret=-2\n"
        "             cat-1301    [000] .....  1235.568003: atentry: (vfs_read+0x0/0x1a0) "
        "arg1=0x42 sym=vfs_read+0x1/0x1a0\n")


def test_timestamp_rounds_to_microseconds(t):
    echo(t.root, "trace_marker", "x")
    t.clock.advance(500)
    echo(t.root, "trace_marker", "y")
    lines = cat(t.root, "trace").splitlines()[-2:]
    assert " 1234.567891: " in lines[0] and " 1234.567892: " in lines[1]


def test_trace_marker(t):
    assert echo(t.root, "trace_marker", "hello world", pid=77, comm="sh") == 11
    echo(t.root, "trace_marker", "two\n", pid=78, comm="a-very-long-command-name")
    assert cat(t.root, "trace").split("#              | |         |   |||||     |         |\n"
                                      )[1] == (
        "              sh-77      [000] .....  1234.567891: tracing_mark_write: hello world\n"
        " a-very-long-com-78      [000] .....  1234.567891: tracing_mark_write: two\n")
    assert echo(t.root, "trace_marker", "z" * 3000) == 1024
    echo(t.root, "options/markers", "0")
    assert write_errno(t.root, "trace_marker", "x") == errno.EINVAL
    echo(t.root, "options/markers", "1")
    echo(t.root, "tracing_on", "0")
    assert write_errno(t.root, "trace_marker", "x") == errno.EBADF


def test_unknown_comm_prints_placeholder(t):
    t.tracer.comm_cache.size = 1
    for pid in (10, 11, 12):
        echo(t.root, "trace_marker", "m", pid=pid, comm=f"p{pid}")
    lines = cat(t.root, "trace").splitlines()[-3:]
    assert lines[0].startswith("           <...>-10 ")
    assert lines[2].startswith("             p12-12 ")


def test_idle_task_name(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    enable(t, "ev")
    t.kernel.run_as(0, "swapper/0")
    t.engine.hit(VFS_READ)
    assert cat(t.root, "trace").splitlines()[-1].startswith("          <idle>-0 ")


def test_address_without_symbol_and_null(t):
    from kprobefs.tracing.buffers.output import format_ip_sym
    sym = t.tracer.symbols.symbolize
    assert format_ip_sym(0, sym, True) == "0"
    assert format_ip_sym(0x1234, sym, True) == "0x00001234"
    assert format_ip_sym(VFS_READ + 0x10, sym, False) == "vfs_read"
    assert format_ip_sym(VFS_READ, sym, True, sym_addr=True) == (
        f"vfs_read+0x0/0x1a0 <{VFS_READ:016x}>")


def test_context_info_and_irq_info_options(t):
    echo(t.root, "trace_marker", "m")
    echo(t.root, "options/irq-info", "0")
    text = cat(t.root, "trace")
    assert "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n" in text
    assert text.endswith("             sh-1       [000]   1234.567891: tracing_mark_write: m\n")
    echo(t.root, "options/context-info", "0")
    assert cat(t.root, "trace") == "tracing_mark_write: m\n"


def test_stacktrace_option(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read+4")
    enable(t, "ev")
    stack = bytearray(t.kernel.mem[STACK])
    struct.pack_into("<QQQ", stack, 0x3F00, KSYS_READ + 0x20, 0x1234, KERNEL_CLONE + 0x10)
    t.kernel.mem[STACK] = bytes(stack)
    t.kernel.image.text[KSYS_READ + 0x1B] = b"\xe8\0\0\0\0"
    t.kernel.image.text[KERNEL_CLONE + 0xB] = b"\xe8\0\0\0\0"
    echo(t.root, "options/stacktrace", "1")
    t.engine.hit(VFS_READ + 4)
    lines = cat(t.root, "trace").splitlines()
    assert "entries-in-buffer/entries-written: 2/2" in lines[2]
    assert lines[-5:] == [
        "            bash-100     [000] d.Z..  1234.567891: ev: (vfs_read+0x4/0x1a0)",
        "            bash-100     [000] d.Z..  1234.567891: <stack trace>",
        " => vfs_read",
        " => ksys_read",
        " => kernel_clone"]
    echo(t.root, "options/sym-offset", "1")
    assert cat(t.root, "trace").splitlines()[-1] == " => kernel_clone+0x10/0x300"


def test_tracing_off_counts_hits_but_records_nothing(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    enable(t, "ev")
    echo(t.root, "tracing_on", "0")
    t.engine.hit(VFS_READ)
    assert cat(t.root, "kprobe_profile").split() == ["ev", "1", "0"]
    assert "0/0" in cat(t.root, "trace")
    echo(t.root, "tracing_on", "1")
    t.engine.hit(VFS_READ)
    assert "1/1" in cat(t.root, "trace")


def test_disabled_event_records_nothing(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    t.engine.hit(VFS_READ)           # disarmed: the fake engine runs nothing
    assert "0/0" in cat(t.root, "trace")


def test_trace_clock_counter_and_uptime(t):
    assert cat(t.root, "trace_clock") == (
        "[local] global counter uptime perf mono mono_raw boot tai x86-tsc\n")
    echo(t.root, "trace_marker", "before")
    echo(t.root, "trace_clock", "counter\n")
    assert cat(t.root, "trace_clock").startswith("local global [counter]")
    assert "0/0" in cat(t.root, "trace")             # switching clocks clears
    echo(t.root, "trace_marker", "a")
    echo(t.root, "trace_marker", "b")
    lines = cat(t.root, "trace").splitlines()[-2:]
    assert lines[0] == "              sh-1       [000] .....            1: tracing_mark_write: a"
    assert lines[1].endswith("           2: tracing_mark_write: b")
    echo(t.root, "trace_clock", "uptime")
    echo(t.root, "trace_marker", "u")
    jiffies = 1_234_567_891_000 // 4_000_000                # HZ = 250
    assert cat(t.root, "trace").splitlines()[-1].endswith(  # as clock_t: USER_HZ = 100
        f" {jiffies * 100 // 250:12d}: tracing_mark_write: u")
    echo(t.root, "trace_clock", "counter")
    echo(t.root, "trace_marker", "c")                       # Linux never resets it
    assert cat(t.root, "trace").splitlines()[-1].endswith("           3: tracing_mark_write: c")
    assert write_errno(t.root, "trace_clock", "nosuch") == errno.EINVAL


def test_trace_write_is_ignored_and_truncate_clears(t):
    echo(t.root, "trace_marker", "m")
    assert echo(t.root, "trace", "anything") == 8
    assert "1/1" in cat(t.root, "trace")
    echo(t.root, "trace", "", append=False)
    assert cat(t.root, "trace") == HEADER.format(0, 0)


def test_trace_snapshot_is_consistent_within_one_open(t):
    echo(t.root, "trace_marker", "first")
    handle = node(t.root, "trace").open(os.O_RDONLY, 1, "cat")
    echo(t.root, "trace_marker", "second")
    part = handle.read(10, 0)
    rest = handle.read(100000, 10)
    assert "second" not in (part + rest).decode()
    assert (part + rest).decode().endswith("tracing_mark_write: first\n")
    handle.release()


def test_pause_on_trace(t):
    echo(t.root, "options/pause-on-trace", "1")
    handle = node(t.root, "trace").open(os.O_RDONLY, 1, "cat")
    assert write_errno(t.root, "trace_marker", "while open") == errno.EBADF
    handle.release()
    echo(t.root, "trace_marker", "after")
    assert "after" in cat(t.root, "trace")


def test_per_cpu_trace(t):
    t.kernel.cpu.index = 1
    echo(t.root, "trace_marker", "on one")
    t.kernel.cpu.index = 0
    echo(t.root, "trace_marker", "on zero")
    assert "on one" in cat(t.root, "per_cpu/cpu1/trace")
    assert "on one" not in cat(t.root, "per_cpu/cpu0/trace")
    echo(t.root, "per_cpu/cpu1/trace", "", append=False)
    assert "on one" not in cat(t.root, "trace") and "on zero" in cat(t.root, "trace")


def test_records_are_merged_in_time_order_across_cpus(t):
    for cpu, text in ((1, "a"), (0, "b"), (1, "c")):
        t.kernel.cpu.index = cpu
        echo(t.root, "trace_marker", text)
        t.clock.advance(1000)
    lines = cat(t.root, "trace").splitlines()[-3:]
    assert [line[-1] for line in lines] == ["a", "b", "c"]
    assert [line[25:30] for line in lines] == ["[001]", "[000]", "[001]"]


def test_user_string_and_fault(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read path=+0(%si):ustring bad=+0(%di):string "
         "k=+0(%si):string")
    enable(t, "ev")
    t.engine.hit(VFS_READ, si=UBASE, di=0xFFFF888000900000)
    # x86 (non-overlapping address spaces): a kernel string fetch below TASK_SIZE reads
    # user memory, as 6.1's kern_fetch_store_string does
    assert cat(t.root, "trace").splitlines()[-1].endswith(
        'ev: (vfs_read+0x0/0x1a0) path="/dev/null" bad=(fault) k="/dev/null"')


def test_hit_path_speed(t):
    echo(t.root, "kprobe_events", "p:e vfs_read a=%di b=%si c=%dx:u32 d=$arg4")
    enable(t, "e")
    kp = t.engine.probes[0]
    regs = make_regs(ip=VFS_READ + 1, di=1, si=2, dx=3, cx=4)
    handler = kp.pre_handler
    rounds = 20000
    start = time.perf_counter()
    for _ in range(rounds):
        handler(kp, regs)
    per_hit = (time.perf_counter() - start) / rounds
    assert per_hit < 20e-6            # generous for slow CI; about 1 µs on a desktop
