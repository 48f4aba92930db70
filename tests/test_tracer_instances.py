"""Trace arrays and instances: ``instances/NAME`` made and removed through the tree, its
own files, buffer, tracing_on, options, clock and per-event enable/filter state, and the
errno of mkdir/rmdir as in Linux 6.1 (EEXIST, ENODEV, EBUSY while a file is open)."""

import errno
import os

import pytest

from kprobefs.fs.tree import fixed_names
from tracer_fakes import VFS_READ, cat, echo, make_tracer, node, write_errno

# What instance_mkdir gives an instance here: the per-array files of the top level.
INSTANCE_FILES = {
    "trace", "trace_pipe", "tracing_on", "trace_marker", "trace_marker_raw",
    "buffer_size_kb", "buffer_total_size_kb", "trace_clock", "current_tracer",
    "available_tracers", "available_events", "set_event", "error_log", "options",
    "per_cpu", "events",
    # init_tracer_tracefs and create_event_toplevel_files give every instance these too
    "trace_options", "tracing_cpumask", "timestamp_mode", "tracing_max_latency",
    "set_event_pid", "set_event_notrace_pid", "snapshot", "buffer_percent",
}


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:ev vfs_read a=%di:u32")
    return t


def mkdir(t, name):
    node(t.root, "instances").mkdir(name, 0o755)


def rmdir(t, name):
    node(t.root, "instances").rmdir(name)


def lines(text):
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_mkdir_makes_an_instance_with_its_own_files(t):
    assert node(t.root, "instances").children() == {}
    mkdir(t, "foo")
    assert set(node(t.root, "instances").children()) == {"foo"}
    files = node(t.root, "instances/foo").children()
    assert set(files) == INSTANCE_FILES
    for top_only in ("kprobe_events", "dynamic_events", "README", "instances",
                     "kprobe_profile", "available_filter_functions", "saved_cmdlines",
                     "saved_cmdlines_size", "tracing_thresh", "printk_formats"):
        assert top_only not in files
    assert node(t.root, "instances/foo").mode == 0o750
    assert set(node(t.root, "instances/foo/per_cpu/cpu1").children()) == {
        "trace", "trace_pipe", "trace_pipe_raw", "stats", "buffer_size_kb", "snapshot",
        "snapshot_raw"}
    assert set(node(t.root, "instances/foo/events/kprobes/ev").children()) == {
        "enable", "filter", "format", "id", "trigger", "hist"}
    assert cat(t.root, "instances/foo/events/kprobes/ev/id") == \
        cat(t.root, "events/kprobes/ev/id")


def test_mkdir_and_rmdir_errnos(t):
    mkdir(t, "foo")
    with pytest.raises(OSError) as e:
        mkdir(t, "foo")
    assert e.value.errno == errno.EEXIST
    with pytest.raises(OSError) as e:
        rmdir(t, "bar")
    assert e.value.errno == errno.ENODEV
    rmdir(t, "foo")
    assert node(t.root, "instances").children() == {}


def test_rmdir_is_busy_while_a_file_of_the_instance_is_open(t):
    mkdir(t, "foo")
    for path in ("trace", "events/kprobes/ev/enable", "per_cpu/cpu0/trace_pipe"):
        handle = node(t.root, f"instances/foo/{path}").open(os.O_RDONLY, 1, "cat")
        with pytest.raises(OSError) as e:
            rmdir(t, "foo")
        assert e.value.errno == errno.EBUSY, path
        handle.release()
    rmdir(t, "foo")


def test_a_failed_open_holds_no_reference(t):
    mkdir(t, "foo")
    with pytest.raises(OSError):
        echo(t.root, "instances/foo/current_tracer", "nosuch")
    rmdir(t, "foo")


def test_an_event_records_into_each_array_it_is_enabled_in(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    assert cat(t.root, "instances/foo/events/kprobes/ev/enable") == "1\n"
    assert cat(t.root, "events/kprobes/ev/enable") == "0\n"
    assert cat(t.root, "instances/foo/set_event") == "kprobes:ev\n"
    assert cat(t.root, "set_event") == ""
    t.engine.hit(VFS_READ, di=7)
    assert len(lines(cat(t.root, "instances/foo/trace"))) == 1
    assert "ev: (vfs_read+0x0/0x" in cat(t.root, "instances/foo/trace")
    assert lines(cat(t.root, "trace")) == []
    echo(t.root, "events/kprobes/ev/enable", "1")
    t.engine.hit(VFS_READ, di=8)
    assert len(lines(cat(t.root, "instances/foo/trace"))) == 2
    assert len(lines(cat(t.root, "trace"))) == 1
    # off in one array: the probe stays armed for the other
    echo(t.root, "events/kprobes/ev/enable", "0")
    assert t.engine.armed(VFS_READ)
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "0")
    assert not t.engine.armed(VFS_READ)


def test_deleting_an_event_enabled_in_an_instance_is_busy(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    assert write_errno(t.root, "kprobe_events", "-:ev") == errno.EBUSY
    echo(t.root, "instances/foo/set_event", "!kprobes:ev")
    echo(t.root, "kprobe_events", "-:ev")
    assert node(t.root, "instances/foo/events").children().keys() == {
        "enable", "header_page", "header_event", "ftrace"}


def test_rmdir_disables_the_instances_events(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/enable", "1")
    assert t.engine.armed(VFS_READ)
    rmdir(t, "foo")
    assert not t.engine.armed(VFS_READ)
    echo(t.root, "kprobe_events", "-:ev")


def test_filters_are_per_instance(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/kprobes/ev/filter", "a == 1")
    assert cat(t.root, "instances/foo/events/kprobes/ev/filter") == "a == 1\n"
    assert cat(t.root, "events/kprobes/ev/filter") == "none\n"
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/enable", "1")
    t.engine.hit(VFS_READ, di=1)
    t.engine.hit(VFS_READ, di=2)
    assert len(lines(cat(t.root, "instances/foo/trace"))) == 1
    assert len(lines(cat(t.root, "trace"))) == 2
    # a bad filter goes to the instance's own error_log
    assert write_errno(t.root, "instances/foo/events/kprobes/ev/filter", "nofield == 1") \
        == errno.EINVAL
    assert "event filter parse error" in cat(t.root, "instances/foo/error_log")
    assert cat(t.root, "error_log") == ""
    echo(t.root, "instances/foo/events/kprobes/filter", "a == 2")
    assert cat(t.root, "instances/foo/events/kprobes/ev/filter") == "a == 2\n"
    assert cat(t.root, "events/kprobes/ev/filter") == "none\n"


def test_tracing_on_options_clock_and_size_are_per_instance(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "instances/foo/tracing_on", "0")
    assert cat(t.root, "instances/foo/tracing_on") == "0\n"
    assert cat(t.root, "tracing_on") == "1\n"
    t.engine.hit(VFS_READ, di=1)
    assert lines(cat(t.root, "instances/foo/trace")) == []
    assert len(lines(cat(t.root, "trace"))) == 1
    echo(t.root, "instances/foo/tracing_on", "1")
    echo(t.root, "instances/foo/options/context-info", "0")
    assert cat(t.root, "options/context-info") == "1\n"
    echo(t.root, "instances/foo/trace_clock", "counter")
    assert "[counter]" in cat(t.root, "instances/foo/trace_clock")
    assert "[local]" in cat(t.root, "trace_clock")
    top_size = cat(t.root, "buffer_size_kb")
    echo(t.root, "instances/foo/buffer_size_kb", "100")
    assert cat(t.root, "instances/foo/buffer_size_kb") not in (top_size, "X\n")
    assert cat(t.root, "buffer_size_kb") == top_size
    echo(t.root, "instances/foo/trace_marker", "hello")
    assert lines(cat(t.root, "instances/foo/trace")) == ["tracing_mark_write: hello"]
    assert "tracing_mark_write" not in cat(t.root, "trace")


def test_trace_pipe_of_an_instance_consumes_its_own_buffer(t):
    mkdir(t, "foo")
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/enable", "1")
    t.engine.hit(VFS_READ, di=3)
    handle = node(t.root, "instances/foo/trace_pipe").open(os.O_RDONLY, 1, "cat")
    assert b"a=3" in handle.read(4096, 0)
    assert handle.read(4096, 0) == b""
    handle.release()
    assert len(lines(cat(t.root, "trace"))) == 1


def test_without_ftrace_sites_an_instance_has_no_function_tracer(t):
    mkdir(t, "foo")
    assert cat(t.root, "instances/foo/available_tracers") == "nop\n"
    assert write_errno(t.root, "instances/foo/current_tracer", "function") == errno.EINVAL


def test_an_event_made_after_the_instance_appears_in_it(t):
    mkdir(t, "foo")
    echo(t.root, "kprobe_events", "r:myret vfs_read")
    assert "myret" in node(t.root, "instances/foo/events/kprobes").children()
    assert cat(t.root, "instances/foo/events/kprobes/enable") == "0\n"
    echo(t.root, "instances/foo/events/kprobes/myret/enable", "1")
    assert cat(t.root, "instances/foo/events/kprobes/enable") == "X\n"


def _native_top_event_and_an_instance():
    """The real kernel, an event enabled in the top array (the kernel's recorder has
    it) and an instance ``foo``: (kernel, root, the event's kprobe)."""
    from test_tracer_native import make
    kernel, tracer, root = make(True)
    echo(root, "kprobe_events", "p:rd vfs_read+5 count=%dx:u32")
    kp = tracer.probes[0].entry_kprobe
    echo(root, "events/kprobes/rd/enable", "1")
    assert kp.native is not None
    node(root, "instances").mkdir("foo", 0o755)
    return kernel, root, kp


def test_the_kernel_records_for_the_top_array_and_the_host_for_the_others():
    """On the real kernel an event enabled in the top array only is recorded by the
    kernel's recorder; enabled in an instance too, the host's handler records it into
    both, the same records."""
    from test_tracer_native import body, workload
    kernel, root, kp = _native_top_event_and_an_instance()
    echo(root, "instances/foo/events/kprobes/rd/enable", "1")
    assert kp.native is None
    workload(kernel)
    top = lines(cat(root, "trace"))
    assert top and body("\n".join(top)) == body("\n".join(lines(
        cat(root, "instances/foo/trace"))))
    echo(root, "instances/foo/events/kprobes/rd/enable", "0")
    assert kp.native is not None


def test_the_buffer_bound_holds_for_all_arrays_together(t):
    """MAX_TOTAL_BUFFER_KB bounds the buffers of every array together: an instance
    cannot take what the top level has, nor the top level what instances have."""
    from kprobefs.tracing.buffers.ring_buffer import MAX_TOTAL_BUFFER_KB
    mkdir(t, "foo")
    mkdir(t, "bar")                 # made before anything expanded: at its least size
    half = MAX_TOTAL_BUFFER_KB // 2 // t.tracer.nr_cpus
    echo(t.root, "buffer_size_kb", str(half))
    assert write_errno(t.root, "instances/foo/buffer_size_kb", str(half + 4)) == errno.ENOMEM
    echo(t.root, "instances/foo/buffer_size_kb", str(half // 2))
    assert write_errno(t.root, "buffer_size_kb", str(half * 2)) == errno.ENOMEM
    echo(t.root, "buffer_size_kb", "1")
    echo(t.root, "instances/foo/buffer_size_kb", str(half * 2 - 64))
    # enabling an event expands a buffer never sized: no room is ENOMEM, as Linux's
    # tracing_update_buffers failing fails the enable write
    assert write_errno(t.root, "instances/bar/events/kprobes/ev/enable", "1") == errno.ENOMEM
    assert cat(t.root, "instances/bar/events/kprobes/ev/enable") == "0\n"
    # a new instance is made at the full size now, which there is no room for
    with pytest.raises(OSError) as e:
        mkdir(t, "baz")
    assert e.value.errno == errno.ENOMEM
    assert set(node(t.root, "instances").children()) == {"foo", "bar"}


def test_a_new_instance_is_expanded_once_the_top_level_is(t):
    mkdir(t, "small")
    assert "(expanded: 1408)" in cat(t.root, "instances/small/buffer_size_kb")
    echo(t.root, "events/kprobes/ev/enable", "1")       # expands the top level's buffer
    echo(t.root, "events/kprobes/ev/enable", "0")
    mkdir(t, "big")
    assert cat(t.root, "instances/big/buffer_size_kb") == cat(t.root, "buffer_size_kb")
    assert "expanded" not in cat(t.root, "buffer_size_kb")


def test_an_instance_runs_the_function_tracer_on_its_own():
    """Each array has its own function tracer and filter files: one in an instance
    records there only, with the instance's set_ftrace_filter; rmdir stops it."""
    from test_tracer_native import make, workload
    kernel, tracer, root = make(True)
    node(root, "instances").mkdir("foo", 0o755)
    # the latency tracers that allow instances too (irqsoff and kin are the top's only)
    assert cat(root, "instances/foo/available_tracers") == \
        "wakeup_dl wakeup_rt wakeup function nop\n"
    assert cat(root, "available_tracers") == ("function_graph wakeup_dl wakeup_rt wakeup "
                                              "preemptirqsoff preemptoff irqsoff function "
                                              "nop\n")
    echo(root, "instances/foo/set_ftrace_filter", "vfs_read")
    assert cat(root, "instances/foo/set_ftrace_filter") == "vfs_read\n"
    assert cat(root, "set_ftrace_filter").startswith("#### all functions enabled")
    echo(root, "instances/foo/current_tracer", "function")
    assert cat(root, "current_tracer") == "nop\n"
    workload(kernel)
    calls = lines(cat(root, "instances/foo/trace"))
    assert calls and all(" vfs_read <-" in line for line in calls), calls
    assert lines(cat(root, "trace")) == []
    functions = tracer.instances["foo"].function_tracer
    assert functions.running
    node(root, "instances").rmdir("foo")
    assert not functions.running


def _pids(text):
    return [line.split("-")[1].split()[0] for line in lines(text)]


def test_pid_sets_cpumask_and_trace_options_are_per_instance(t):
    """set_event_pid, tracing_cpumask and trace_options of an instance decide what it
    records and nothing else's (6.1 keeps them on the trace_array)."""
    mkdir(t, "foo")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "instances/foo/events/kprobes/ev/enable", "1")
    echo(t.root, "instances/foo/set_event_pid", "42", append=False)
    echo(t.root, "instances/foo/trace_options", "nooverwrite")
    assert cat(t.root, "instances/foo/options/overwrite") == "0\n"
    assert cat(t.root, "options/overwrite") == "1\n"
    assert "\noverwrite\n" in cat(t.root, "trace_options")
    for pid in (42, 43):
        t.kernel.pid = pid
        t.engine.hit(VFS_READ, di=1)
    assert _pids(cat(t.root, "instances/foo/trace")) == ["42"]
    assert _pids(cat(t.root, "trace")) == ["42", "43"]
    assert cat(t.root, "set_event_pid") == ""

    echo(t.root, "instances/foo/set_event_pid", "", append=False)
    echo(t.root, "instances/foo/tracing_cpumask", "2", append=False)
    assert cat(t.root, "tracing_cpumask") == "3\n"
    t.kernel.run_as(50, "cat", 0)
    t.engine.hit(VFS_READ, di=1)
    assert len(lines(cat(t.root, "instances/foo/trace"))) == 1      # CPU 0 is masked
    assert len(lines(cat(t.root, "trace"))) == 3
    echo(t.root, "instances/foo/tracing_max_latency", "7")
    assert (cat(t.root, "instances/foo/tracing_max_latency"),
            cat(t.root, "tracing_max_latency")) == ("7\n", "0\n")


def test_a_pid_set_in_the_top_array_moves_its_events_to_the_host():
    """The kernel's recorder does not filter by pid or CPU: while the top array has a
    pid set or a masked CPU, its events are the host's to record; an instance's do not
    matter to it."""
    kernel, root, kp = _native_top_event_and_an_instance()
    echo(root, "instances/foo/set_event_pid", "1", append=False)
    assert kp.native is not None
    echo(root, "set_event_notrace_pid", "1", append=False)
    assert kp.native is None
    echo(root, "set_event_notrace_pid", "", append=False)
    assert kp.native is not None
    echo(root, "tracing_cpumask", "1", append=False)
    assert kp.native is None
    echo(root, "tracing_cpumask", "3", append=False)
    assert kp.native is not None


def test_an_instance_has_its_own_ftrace_pid_files():
    from test_tracer_native import make
    kernel, tracer, root = make(True)
    node(root, "instances").mkdir("foo", 0o755)
    echo(root, "instances/foo/set_ftrace_pid", "5", append=False)
    assert cat(root, "instances/foo/set_ftrace_pid") == "5\n"
    assert cat(root, "set_ftrace_pid") == "no pid\n"
    assert cat(root, "instances/foo/set_ftrace_notrace_pid") == "no pid\n"
    assert tracer.instances["foo"].function_tracer.pids.pids == {5}


def test_the_fixed_names_are_a_trace_arrays_files_not_its_events_or_instances(t):
    """The names the mount lets the host cache (fs: Attributes.stable): every file of a
    trace array stays while the array does; events and instances come and go."""
    assert {"kprobe_events", "trace", "events", "instances"} <= set(fixed_names(t.root))
    assert not fixed_names(node(t.root, "events"))
    assert not fixed_names(node(t.root, "events/kprobes"))
    assert not fixed_names(node(t.root, "instances"))
    mkdir(t, "foo")
    inst = node(t.root, "instances/foo")
    assert "trace" in fixed_names(inst) and "kprobe_events" not in fixed_names(inst)
    assert not fixed_names(node(t.root, "instances/foo/events"))
