"""kprobefs.testing's record reader and waiter against the output of real runs: every
line format the tracer's ``trace`` prints (kprobe, kretprobe, a static event, system
calls, function, function_graph, print, a stack trace, a string with a newline) is
made on a real mount here and read back, and ``trace_pipe_raw`` pages decoded with the
events' format files give the same records as the text.  Skipped without FUSE, except
under CI=true."""

import os
import subprocess
import time
from pathlib import Path

import pytest

from kprobefs.testing import KprobefsMount, TraceReader, canonical, parse_trace
from kprobefs.testing.records import Record
from kprobefs.testing.waiter import RecordTimeout, TracePipe
from robust_mount import need_fuse

pytestmark = pytest.mark.fuse


@pytest.fixture(scope="module")
def mount(tmp_path_factory):
    need_fuse()
    m = KprobefsMount(tmp_path_factory.mktemp("records") / "mnt").start()
    yield m
    m.stop()


@pytest.fixture
def root(mount) -> Path:
    mount.reset()
    return mount.root


def write(path: Path, text: str, append: bool = False) -> None:
    with open(path, "a" if append else "w") as f:
        f.write(text)


def cat(path: Path) -> None:
    """A child process opens and reads path: its own comm and pid in the records."""
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)


def lines_of(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_kprobe_kretprobe_static_and_syscall_lines(root):
    t = root / "tracing"
    write(t / "kprobe_events", "p:open do_sys_openat2 dfd=%di:s32 path=+0(%si):ustring "
                               "flags=+0(%dx):x64\nr:openret do_sys_openat2 ret=$retval:s64\n")
    for event in ("kprobes", "sched/sched_process_exec", "syscalls/sys_enter_openat",
                  "syscalls/sys_exit_openat"):
        write(t / "events" / event / "enable", "1")
    proc = subprocess.Popen(["cat", str(root / "proc" / "version")],
                            stdout=subprocess.DEVNULL)
    proc.wait()
    write(t / "events" / "enable", "0")
    reader = TraceReader(t)
    text = (t / "trace").read_text()
    records = [r for r in reader.parse(text) if r.pid == proc.pid]

    exec_ = next(r for r in records if r.event == "sched_process_exec")
    assert exec_.comm == "cat" and exec_["pid"] == proc.pid
    assert exec_["filename"].endswith("/cat")
    opened = next(r for r in records if r.event == "open" and r["path"] == "/proc/version")
    assert opened["dfd"] == -100 and isinstance(opened["flags"], int)
    assert opened["__probe_ip"].startswith("do_sys_openat2+0x0/")
    ret = records[records.index(opened) + 1]
    assert ret.event == "openret" and ret["__probe_func"] == "do_sys_openat2"
    assert isinstance(ret["ret"], int) and ret["ret"] >= 0
    enter = [r for r in records if r.event == "sys_enter_openat"]
    leave = [r for r in records if r.event == "sys_exit_openat"]
    assert enter and leave and all(isinstance(r["filename"], int) for r in enter)
    assert ret["ret"] in {r["ret"] for r in leave}
    assert {r.cpu for r in records} <= {0, 1} and all(r.timestamp > 0 for r in records)
    # every line of the text is one record (none is dropped or split)
    assert len(reader.parse(text)) == len(lines_of(text))


def test_raw_pages_give_the_records_the_text_gives(root):
    t = root / "tracing"
    write(t / "kprobe_events", "p:open do_sys_openat2 path=+0(%si):ustring flags=%dx:u32\n")
    write(t / "events" / "kprobes" / "enable", "1")
    write(t / "events" / "sched" / "sched_process_exec" / "enable", "1")
    cat(root / "proc" / "version")
    write(t / "trace_marker", "from the marker")
    write(t / "events" / "enable", "0")
    reader = TraceReader(t)
    text = reader.trace()
    raw = reader.raw()
    assert [r.event for r in raw if r.event != "print"] == \
        [r.event for r in text if r.event != "print"]
    for a, b in zip([r for r in raw if r.event != "print"],
                    [r for r in text if r.event != "print"]):
        assert (a.pid, a.cpu, a["path"] if a.event == "open" else a["filename"]) == \
            (b.pid, b.cpu, b["path"] if b.event == "open" else b["filename"])
        assert abs(a.timestamp - b.timestamp) < 2e-6
    assert [r["buf"] for r in raw if r.event == "print"] == ["from the marker\n"]
    assert [r["buf"] for r in text if r.event == "print"] == ["from the marker"]
    assert reader.raw() == []          # consumed


def test_function_tracer_lines(root):
    t = root / "tracing"
    write(t / "set_ftrace_filter", "vfs_read")
    write(t / "current_tracer", "function")
    cat(root / "proc" / "version")
    records = TraceReader(t).trace()
    write(t / "current_tracer", "nop")
    hits = [r for r in records if r.comm == "cat"]
    assert hits and all(r.event == "function" for r in hits)
    assert {(r["ip"], r["parent_ip"]) for r in hits} == {("vfs_read", "ksys_read")}


def test_function_graph_lines(root):
    t = root / "tracing"
    write(t / "set_graph_function", "ksys_read")
    write(t / "current_tracer", "function_graph")
    write(t / "trace_marker", "marked")
    cat(root / "proc" / "version")
    plain = TraceReader(t).trace()
    write(t / "options" / "funcgraph-proc", "1")
    write(t / "options" / "funcgraph-abstime", "1")
    cat(root / "proc" / "version")
    text = (t / "trace").read_text()
    write(t / "current_tracer", "nop")

    entry = next(r for r in plain if r.event == "funcgraph_entry" and r["func"] == "ksys_read")
    assert entry["depth"] == 0 and entry["duration"] is None and entry.pid is None
    call = plain[plain.index(entry) + 1:]
    call = call[:next(i for i, r in enumerate(call) if r["depth"] == 0) + 1]
    assert call[0]["depth"] == 1 and call[0]["leaf"] and call[0]["duration"] > 0
    assert any(r["func"] == "vfs_read" and r["depth"] == 1 for r in call)
    assert call[-1].event == "funcgraph_exit" and call[-1]["duration"] > 0
    assert sum(r.event == "funcgraph_exit" for r in call) == \
        sum(r.event == "funcgraph_entry" and not r.get("leaf") for r in call) + 1
    assert any(r.event == "print" and r["buf"] == "marked" for r in plain)

    with_proc = [r for r in TraceReader(t).parse(text) if r.comm == "cat"]
    assert with_proc and all(r.timestamp and r.pid for r in with_proc)
    assert {r["func"] for r in with_proc if r.event == "funcgraph_entry"} >= {"ksys_read"}


def test_print_lines_from_trace_printk_and_the_marker(root):
    t = root / "tracing"
    write(root / "kprobefs" / "modules", "load trace-printk")
    write(t / "trace_marker", "hello from the test")
    records = TraceReader(t).trace()
    printed = [r for r in records if r.event == "print"]
    assert {"trace_printk_init", "trace_printk_irq_work", "tracing_mark_write"} <= \
        {r["ip"] for r in printed}
    assert any(r["buf"] == "(irq) This is a dynamic string that will use trace_printk"
               for r in printed)
    assert printed[-1].pid == os.getpid() and printed[-1]["buf"] == "hello from the test"


def test_stack_traces_and_strings_with_a_newline(root):
    t = root / "tracing"
    write(t / "kprobe_events", "p:open do_sys_openat2 path=+0(%si):ustring\n")
    write(t / "events" / "kprobes" / "open" / "trigger", "stacktrace")
    write(t / "events" / "kprobes" / "open" / "enable", "1")
    odd = root / "tmp" / "two\nlines"
    odd.write_text("x")
    write(t / "events" / "kprobes" / "open" / "enable", "0")
    text = (t / "trace").read_text()
    records = TraceReader(t).parse(text)
    opened = [r for r in records if r.event == "open" and r["path"] == "/tmp/two\nlines"]
    assert len(opened) == 1
    stack = records[records.index(opened[0]) + 1]
    assert stack.event == "kernel_stack" and stack["caller"][0] == "do_sys_openat2"
    assert stack.pid == opened[0].pid == os.getpid()


def test_without_formats_numbers_still_read_as_numbers(root):
    t = root / "tracing"
    write(t / "events" / "sched" / "sched_process_exec" / "enable", "1")
    cat(root / "proc" / "version")
    records = parse_trace((t / "trace").read_text())
    exec_ = next(r for r in records if r.event == "sched_process_exec")
    assert isinstance(exec_["pid"], int) and exec_["filename"].endswith("/cat")


def test_the_waiter_returns_the_first_match_and_bounds_the_wait(root):
    t = root / "tracing"
    write(t / "kprobe_events", "p:open do_sys_openat2 path=+0(%si):ustring\n")
    write(t / "events" / "kprobes" / "open" / "enable", "1")
    with TracePipe(t) as pipe:
        start = time.monotonic()
        with pytest.raises(RecordTimeout) as e:
            pipe.wait_for(path="/nowhere", timeout=0.5)
        assert 0.5 <= time.monotonic() - start < 10
        assert "no record with path='/nowhere'" in str(e.value)
        cat(root / "proc" / "version")
        hit = pipe.wait_for(lambda r: r.comm == "cat", event="open", path="/proc/version",
                            timeout=10)
        assert hit.comm == "cat" and isinstance(hit, Record)


def test_canonical_renumbers_pids_by_first_appearance():
    a = [Record("sh", 4100, 0, 1.0, "sched_process_fork", {"pid": 4100, "child_pid": 4200}),
         Record("sh", 4200, 0, 2.0, "x", {})]
    b = [Record("sh", 77, 0, 9.0, "sched_process_fork", {"pid": 77, "child_pid": 78}),
         Record("sh", 78, 0, 9.5, "x", {})]
    assert canonical(a) == canonical(b)
    c = [Record("sh", 77, 0, 9.0, "sched_process_fork", {"pid": 77, "child_pid": 78}),
         Record("sh", 77, 0, 9.5, "x", {})]
    assert canonical(a) != canonical(c)
    d = [Record("sh", 77, 1, 9.0, "sched_process_fork", {"pid": 77, "child_pid": 78}),
         Record("sh", 78, 0, 9.5, "x", {})]
    assert canonical(a) != canonical(d) and canonical(a, cpus=False) == canonical(d, cpus=False)


def test_syscall_lines_are_read_without_an_event_name():
    """6.1's print_syscall_enter/exit print ``sys_CALL(ARG: HEX, ...)`` and
    ``sys_CALL -> 0xRET`` with no ``NAME: `` before them: the event is named from
    the call."""
    enter, leave = parse_trace(
        "             cat-1234    [000] .....    12.345200: sys_openat(dfd: ffffffffffffff9c,"
        " filename: 139001000, flags: 0, mode: 0)\n"
        "             cat-1234    [000] .....    12.345300: sys_openat -> 0x3\n")
    assert (enter.event, enter.comm, enter.pid) == ("sys_enter_openat", "cat", 1234)
    assert enter.fields == {"dfd": 0xffffffffffffff9c, "filename": 0x139001000, "flags": 0,
                            "mode": 0}
    assert (leave.event, leave.fields) == ("sys_exit_openat", {"ret": 3})
