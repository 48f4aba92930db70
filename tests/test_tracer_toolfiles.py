"""The files trace-cmd and libtracefs read or write, below the mount: the
``kernel.ftrace_enabled`` sysctl in the ftrace core, the saved comms
(``saved_cmdlines``, ``saved_cmdlines_size``), ``trace_options`` and
``events/ftrace/*/format``.  Through a real mount and trace-cmd: tests/test_exec.py."""

from __future__ import annotations

import errno

import pytest

from kprobefs.kprobes.ftrace import Ftrace, FtraceOps
from kprobefs.tracing.events.ftrace_events import FTRACE_EVENTS
from kprobefs.tracing.buffers.output import CommCache


class _Arch:
    """Records what the core asks the arch to patch: site -> 'call' or 'nop'."""

    def __init__(self):
        self.state: dict[int, str] = {}

    def ftrace_make_call(self, site, func, native=None, direct=None):
        self.state[site] = "call"

    def ftrace_update_call(self, site, func, native=None, direct=None):
        assert self.state.get(site) == "call", "update of a site that is not calling"

    def ftrace_make_nop(self, site):
        self.state[site] = "nop"


def test_ftrace_enabled_off_puts_every_site_back_to_a_nop_and_on_restores_them():
    arch = _Arch()
    ftrace = Ftrace(arch, {0x10, 0x20, 0x30})
    ops = FtraceOps(func=lambda *a: None, filter={0x10, 0x20})
    ftrace.register_ftrace_function(ops)
    assert arch.state == {0x10: "call", 0x20: "call"}
    ftrace.set_ftrace_enabled(0)
    assert arch.state == {0x10: "nop", 0x20: "nop"} and ftrace.ftrace_enabled_value == 0
    # While off, ops come and go without patching anything...
    late = FtraceOps(func=lambda *a: None, filter={0x30})
    ftrace.register_ftrace_function(late)
    ftrace.unregister_ftrace_function(ops)
    assert arch.state == {0x10: "nop", 0x20: "nop"}
    # ...and turning it on patches what is registered then (proc_dointvec: any int).
    ftrace.set_ftrace_enabled(7)
    assert arch.state == {0x10: "nop", 0x20: "nop", 0x30: "call"}
    assert ftrace.ftrace_enabled_value == 7 and ftrace.ftrace_enabled


def test_saved_cmdlines_lists_saved_tasks_and_a_resize_empties_the_table():
    cache = CommCache(size=3)
    for pid, comm in ((10, "sh"), (11, "cat"), (12, "grep"), (13, "awk")):
        cache.save(pid, comm)
    assert cache.saved_cmdlines() == "11 cat\n12 grep\n13 awk\n"    # 10 was the oldest
    names = cache.names
    cache.resize(128)
    assert cache.size == 128 and cache.saved_cmdlines() == ""
    assert cache.names is names and cache.find(0) == "<idle>"   # recorders hold the dict


def test_the_comm_caches_marks_stay_within_its_size_however_many_tasks_exit():
    """An exited task's saved name is marked for a re-read; a pid never saved, or gone
    from the table, leaves no mark (a daemon forgets tens of thousands of tasks an hour)."""
    cache = CommCache(size=3)
    for pid in range(100, 10_100):
        cache.save(pid, "sh")
        cache.forget(pid)
        cache.forget(pid + 50_000)          # exited without being saved
    assert len(cache.stale) <= cache.size + 1
    assert all(pid in cache.names for pid in cache.stale)
    assert cache.needs(10_099) and cache.needs(60_000) and not cache.needs(0)


def test_ftrace_formats_trace_cmd_looks_for_are_6_1s():
    """The record types beside the tracer's own (function, kernel_stack and print are
    in test_tracer_files.py): 6.1's ids, fields and dynamic arrays."""
    bprint = FTRACE_EVENTS["bprint"].format
    assert bprint.startswith("name: bprint\nID: 6\nformat:\n")
    assert "\tfield:const char * fmt;\toffset:16;\tsize:8;\tsigned:0;\n" in bprint
    assert "\tfield:u32 buf[];\toffset:24;\tsize:0;\tsigned:0;\n" in bprint
    raw_data = FTRACE_EVENTS["raw_data"].format
    assert raw_data.startswith("name: raw_data\nID: 18\n")
    assert "\tfield:char buf[];\toffset:12;\tsize:0;\tsigned:1;\n" in raw_data
    assert "ID: 12\n" in FTRACE_EVENTS["user_stack"].format
    assert "ID: 14\n" in FTRACE_EVENTS["bputs"].format


# ---- the files, on a tracer (tests/tracer_fakes.py) ------------------------------------
from tracer_fakes import VFS_READ, cat, echo, make_tracer, node, write_errno  # noqa: E402


@pytest.fixture
def t():
    return make_tracer()


def test_trace_options_lists_and_sets_options_by_name(t):
    root = t.root
    assert cat(root, "trace_options").splitlines() == [
        "print-parent", "nosym-offset", "nosym-addr", "noraw", "nohex", "nobin",
        "trace_printk", "context-info", "nolatency-format",
        "record-cmd", "norecord-tgid", "overwrite",
        "irq-info", "markers", "noevent-fork", "nopause-on-trace",
        "nofunction-fork", "nostacktrace"]
    echo(root, "trace_options", "sym-offset\n")
    echo(root, "trace_options", "norecord-cmd")
    assert cat(root, "options/sym-offset") == "1\n"
    assert cat(root, "options/record-cmd") == "0\n"
    assert "sym-offset\n" in cat(root, "trace_options")
    assert write_errno(root, "trace_options", "no-such-option") == errno.EINVAL
    assert write_errno(root, "trace_options", "x" * 64) == errno.EINVAL


def test_saved_cmdlines_size_resizes_the_comm_table(t):
    root = t.root
    assert cat(root, "saved_cmdlines_size") == "128\n"
    t.tracer.comm_cache.save(42, "cat")
    assert cat(root, "saved_cmdlines") == "42 cat\n"
    echo(root, "saved_cmdlines_size", "2\n")
    assert (cat(root, "saved_cmdlines_size"), cat(root, "saved_cmdlines")) == ("2\n", "")
    for value in ("0", "32769", "x"):
        assert write_errno(root, "saved_cmdlines_size", value) == errno.EINVAL, value
    assert cat(root, "saved_cmdlines_size") == "2\n"


def test_events_ftrace_has_formats_and_no_enable(t):
    ftrace = node(t.root, "events/ftrace")
    assert {"function", "print", "kernel_stack", "bprint"} <= set(ftrace.children())
    # hist: Debian's 6.1 has CONFIG_HIST_TRIGGERS, which gives every event one
    assert set(node(t.root, "events/ftrace/function").children()) == {"format", "id", "hist"}
    assert set(node(t.root, "events/ftrace/bprint").children()) == {"format", "hist"}
    assert cat(t.root, "events/ftrace/print/id") == "5\n"


def test_set_event_pid_records_only_the_listed_tasks(t):
    root, kernel = t.root, t.kernel
    echo(root, "kprobe_events", "p:ev vfs_read")
    echo(root, "events/kprobes/ev/enable", "1")
    echo(root, "set_event_pid", "0x2a 7", append=False)     # kstrtoul base 0
    echo(root, "set_event_pid", "9")                         # a write adds
    assert cat(root, "set_event_pid") == "7\n9\n42\n"
    for pid in (42, 43, 7):
        kernel.pid = pid
        t.engine.hit(VFS_READ)
    pids = [line.split("-")[1].split()[0] for line in cat(root, "trace").splitlines()
            if not line.startswith("#")]
    assert pids == ["42", "7"]


def test_set_event_notrace_pid_drops_the_listed_tasks(t):
    root, kernel = t.root, t.kernel
    echo(root, "kprobe_events", "p:ev vfs_read")
    echo(root, "events/kprobes/ev/enable", "1")
    echo(root, "set_event_notrace_pid", "43", append=False)
    for pid in (42, 43):
        kernel.pid = pid
        t.engine.hit(VFS_READ)
    assert [line.split("-")[1].split()[0] for line in cat(root, "trace").splitlines()
            if not line.startswith("#")] == ["42"]
    echo(root, "set_event_notrace_pid", "\n")        # a write with no pid empties it
    assert cat(root, "set_event_notrace_pid") == ""


def test_set_event_pid_rejects_a_bad_write_whole(t):
    root = t.root
    echo(root, "set_event_pid", "5", append=False)
    assert write_errno(root, "set_event_pid", "6 x") == errno.EINVAL
    assert write_errno(root, "set_event_pid", "6 08") == errno.EINVAL     # octal
    assert write_errno(root, "set_event_pid", str(4 * 1024 * 1024)) == errno.EPERM
    assert cat(root, "set_event_pid") == "5\n"
    echo(root, "set_event_pid", "", append=False)      # O_TRUNC clears
    assert cat(root, "set_event_pid") == ""


def test_tracing_cpumask_stops_recording_on_masked_cpus(t):
    root, kernel = t.root, t.kernel
    assert cat(root, "tracing_cpumask") == "3\n"
    echo(root, "kprobe_events", "p:ev vfs_read")
    echo(root, "events/kprobes/ev/enable", "1")
    echo(root, "tracing_cpumask", "2\n", append=False)      # CPU 1 only
    assert cat(root, "tracing_cpumask") == "2\n"
    for cpu in (0, 1, 0):
        kernel.run_as(100 + cpu, "cat", cpu)
        t.engine.hit(VFS_READ)
    cpus = [line.split("[")[1][:3] for line in cat(root, "trace").splitlines()
            if not line.startswith("#")]
    assert cpus == ["001"]
    echo(root, "tracing_cpumask", "3", append=False)
    kernel.run_as(100, "cat", 0)
    t.engine.hit(VFS_READ)
    assert len([line for line in cat(root, "trace").splitlines()
                if not line.startswith("#")]) == 2


@pytest.mark.parametrize("text, err", [("4", errno.EOVERFLOW), ("x", errno.EINVAL),
                                       ("", errno.EINVAL), ("123456789", errno.EINVAL)])
def test_tracing_cpumask_rejects(t, text, err):
    assert write_errno(t.root, "tracing_cpumask", text) == err
    assert cat(t.root, "tracing_cpumask") == "3\n"


def test_cpumask_text_groups_32_cpus():
    from kprobefs.tracing.cpumask import format_cpumask, parse_cpumask
    assert format_cpumask((1 << 40) - 1, 40) == "ff,ffffffff\n"
    assert format_cpumask(5, 6) == "05\n"
    assert parse_cpumask(b"1,00000000\n", 40) == 1 << 32


def test_set_ftrace_pid_limits_the_function_tracer_to_its_tasks():
    from kprobefs.tracing.tracers.function import FunctionTracer
    from test_tracer_function import SITES, _FakeFtrace, _Ops
    ftrace, records, current = _FakeFtrace(), [], [42]
    ft = FunctionTracer(ftrace, _Ops, lambda: SITES,
                        record=lambda cpu, rec, size: records.append(rec[1]),
                        context=lambda: (current[0], 0), recording=lambda: True,
                        now=lambda: 1)
    ft.start()
    ft.pids.write(False, b"7")
    for pid in (42, 7):
        current[0] = pid
        ftrace.call(0x1000, 0x9999)
    ft.pids.clear(False)
    ft.pids.write(True, b"7")
    for pid in (42, 7):
        current[0] = pid
        ftrace.call(0x1000, 0x9999)
    assert records == [7, 42]



def test_latency_knobs_keep_microseconds(t):
    root = t.root
    for name in ("tracing_max_latency", "tracing_thresh"):
        assert cat(root, name) == "0\n"
        echo(root, name, "250\n", append=False)
        assert cat(root, name) == "250\n"
        assert write_errno(root, name, "-1") == errno.EINVAL
    assert cat(root, "timestamp_mode") == "[delta] absolute\n"
    assert cat(root, "printk_formats") == ""


def _fork(t, parent, child):
    for listener in t.kernel.fork_listeners:
        listener(parent, child)


def _exit(t, pid):
    for listener in t.kernel.exit_listeners:
        listener(pid)


def _recorded_pids(t, path="trace"):
    return [line.split("-")[1].split()[0] for line in cat(t.root, path).splitlines()
            if not line.startswith("#")]


def test_event_fork_lists_the_children_of_listed_tasks_and_exits_unlist(t):
    root, kernel = t.root, t.kernel
    echo(root, "kprobe_events", "p:ev vfs_read")
    echo(root, "events/kprobes/ev/enable", "1")
    echo(root, "set_event_pid", "42", append=False)
    echo(root, "set_event_notrace_pid", "50", append=False)
    _fork(t, 42, 43)                        # event-fork is off: not followed
    assert cat(root, "set_event_pid") == "42\n"
    echo(root, "options/event-fork", "1")
    assert "\nevent-fork\n" in cat(root, "trace_options")
    _fork(t, 42, 44)
    _fork(t, 50, 51)
    _fork(t, 7, 8)
    assert (cat(root, "set_event_pid"), cat(root, "set_event_notrace_pid")) == (
        "42\n44\n", "50\n51\n")
    _exit(t, 42)
    _exit(t, 44)
    assert cat(root, "set_event_pid") == ""
    # As in 6.1 the list is still there, empty: no task's events are recorded.
    for pid in (42, 44, 9):
        kernel.pid = pid
        t.engine.hit(VFS_READ)
    assert _recorded_pids(t) == []
    echo(root, "set_event_pid", "", append=False)     # emptied by a write: all again
    t.engine.hit(VFS_READ)
    assert _recorded_pids(t) == ["9"]


def test_forks_of_the_emulated_kernel_are_followed_per_array():
    """The real kernel's forks and exits: function-fork follows them for an instance's
    set_ftrace_pid, event-fork for the top level's set_event_pid; an array without the
    option keeps its set."""
    from test_tracer_native import make
    kernel, tracer, root = make(True)
    parent = kernel.spawn("parent")
    node(root, "instances").mkdir("foo", 0o755)
    echo(root, "instances/foo/options/function-fork", "1")
    echo(root, "instances/foo/set_ftrace_pid", str(parent.pid), append=False)
    echo(root, "instances/foo/set_event_pid", str(parent.pid), append=False)
    echo(root, "options/event-fork", "1")
    echo(root, "set_event_pid", str(parent.pid), append=False)
    child = kernel.spawn("child", parent=parent)
    both = f"{parent.pid}\n{child.pid}\n"
    assert cat(root, "instances/foo/set_ftrace_pid") == both
    assert cat(root, "instances/foo/set_event_pid") == f"{parent.pid}\n"
    assert cat(root, "set_event_pid") == both
    assert cat(root, "set_ftrace_pid") == "no pid\n"
    kernel.submit(child, "exit", 0)
    assert kernel.syscall(parent, "wait4", child.pid, 0, 0, 0) == child.pid
    assert cat(root, "set_event_pid") == f"{parent.pid}\n"
    assert cat(root, "instances/foo/set_ftrace_pid") == f"{parent.pid}\n"


def test_record_tgid_keeps_each_recorded_tasks_tgid():
    cache = CommCache()
    cache.tgid_of = lambda pid: pid + 1000
    cache.save(10, "sh")
    assert cache.saved_tgids() == ""                      # record-tgid off: none kept
    cache.set_record_tgid(True)
    assert cache.needs(10)                                # read again at its next record
    for pid, comm in ((12, "cat"), (10, "sh")):
        cache.save(pid, comm)
    assert cache.saved_tgids() == "10 1010\n12 1012\n"    # by pid, as 6.1 walks its map


def test_record_tgid_reads_the_tgid_of_the_emulated_kernels_tasks():
    """options/record-tgid on the real kernel: saved_tgids lists each task an event
    recorded, with the tgid its task_struct holds (one thread a process here: its pid);
    the option exists per array and is off by default, as in 6.1."""
    from test_tracer_native import make
    kernel, tracer, root = make(True)
    assert cat(root, "options/record-tgid") == "0\n"
    echo(root, "kprobe_events", "p:getpid __x64_sys_getpid\n")
    echo(root, "events/kprobes/getpid/enable", "1")
    first = kernel.spawn("first")
    kernel.syscall(first, "getpid")
    assert cat(root, "saved_tgids") == ""
    echo(root, "options/record-tgid", "1")
    second = kernel.spawn("second")
    for task in (first, second):
        kernel.syscall(task, "getpid")
    assert cat(root, "saved_tgids") == "".join(
        f"{pid} {pid}\n" for pid in sorted((first.pid, second.pid)))
    node(root, "instances").mkdir("foo", 0o755)
    assert cat(root, "instances/foo/options/record-tgid") == "0\n"
