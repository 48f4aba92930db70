"""Event triggers (events/G/E/trigger): every command, counts, filters, ``!`` removal,
soft mode, and the text Linux 6.1 reads back — on kprobe events of the fake tracer; and
triggers in a trace instance, which act on that instance only."""

import errno

import pytest

from tracer_fakes import KSYS_READ, VFS_READ, cat, echo, make_tracer, node, write_errno

EV = "events/kprobes/p1/"
OTHER = "events/kprobes/p2/"


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:p1 vfs_read arg1=%di:u32")
    echo(t.root, "kprobe_events", "p:p2 ksys_read arg1=%di:u32")
    t.kernel.run_as(42, "bash")
    return t


def trace_lines(t, prefix=""):
    """The record lines of ``trace`` (``prefix``: an instance's directory)."""
    return [line for line in cat(t.root, prefix + "trace").splitlines()
            if not line.startswith("#")]


def test_empty_trigger_file_lists_the_commands(t):
    assert cat(t.root, EV + "trigger") == (
        "# Available triggers:\n# traceon traceoff snapshot stacktrace enable_event "
        "disable_event enable_hist disable_hist hist\n")


def test_traceoff_with_count_and_filter(t):
    echo(t.root, EV + "trigger", "traceoff:1 if arg1 > 3")
    assert cat(t.root, EV + "trigger") == "traceoff:count=1 if arg1 > 3\n"
    t.engine.hit(VFS_READ, di=2)
    assert cat(t.root, "tracing_on") == "1\n"
    t.engine.hit(VFS_READ, di=4)
    assert cat(t.root, "tracing_on") == "0\n"
    assert cat(t.root, EV + "trigger") == "traceoff:count=0 if arg1 > 3\n"
    echo(t.root, "tracing_on", "1")
    t.engine.hit(VFS_READ, di=5)             # spent
    assert cat(t.root, "tracing_on") == "1\n"


def test_traceon_turns_tracing_back_on_and_counts_only_changes(t):
    echo(t.root, EV + "trigger", "traceon:2")
    echo(t.root, "tracing_on", "0")
    t.engine.hit(VFS_READ)
    assert cat(t.root, "tracing_on") == "1\n"
    t.engine.hit(VFS_READ)                   # already on: the count stays
    assert cat(t.root, EV + "trigger") == "traceon:count=1\n"


def test_traceon_and_traceoff_share_one_slot(t):
    echo(t.root, EV + "trigger", "traceon")
    assert write_errno(t.root, EV + "trigger", "traceoff") == errno.EEXIST
    assert write_errno(t.root, EV + "trigger", "traceon") == errno.EEXIST
    echo(t.root, EV + "trigger", "!traceon")
    echo(t.root, EV + "trigger", "traceoff")
    assert cat(t.root, EV + "trigger") == "traceoff:unlimited\n"


def test_removing_an_absent_trigger_is_quiet(t):
    echo(t.root, EV + "trigger", "!snapshot")
    assert cat(t.root, EV + "trigger").startswith("# Available triggers:")


@pytest.mark.parametrize("text, err", [
    ("bogus", errno.EINVAL),
    ("traceon:x", errno.EINVAL),
    ("traceon:unlimited", errno.EINVAL),          # not "if": no filter
    ("traceon if nosuchfield == 1", errno.EINVAL),
    ("traceon if arg1 =", errno.EINVAL),
    ("enable_event:kprobes", errno.EINVAL),
    ("enable_event:nogroup:noevent", errno.EINVAL),
    ("disable_event+1", errno.EINVAL),
])
def test_bad_commands_fail_and_change_nothing(t, text, err):
    assert write_errno(t.root, EV + "trigger", text) == err
    assert cat(t.root, EV + "trigger").startswith("# Available triggers:")
    assert cat(t.root, EV + "enable") == "0\n"
    assert cat(t.root, "error_log") == ""          # Linux logs no generic trigger errors


def test_triggers_list_newest_first_and_hist_last(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1")
    echo(t.root, EV + "trigger", "snapshot:3")
    echo(t.root, EV + "trigger", "stacktrace if arg1 == 1")
    assert cat(t.root, EV + "trigger") == (
        "stacktrace:unlimited if arg1 == 1\n"
        "snapshot:count=3\n"
        "hist:keys=arg1:vals=hitcount:sort=hitcount:size=2048 [active]\n")


def test_snapshot_trigger_counts_down(t):
    taken = []
    t.tracer.top.take_snapshot = lambda cond=None: taken.append(1)
    echo(t.root, EV + "trigger", "snapshot:2")
    for _ in range(3):
        t.engine.hit(VFS_READ)
    assert taken == [1, 1]
    assert cat(t.root, EV + "trigger") == "snapshot:count=0\n"


def test_stacktrace_trigger_writes_a_stack_after_the_event(t):
    echo(t.root, EV + "trigger", "stacktrace")
    echo(t.root, EV + "enable", "1")
    t.engine.hit(VFS_READ, di=7)
    lines = trace_lines(t)
    assert "p1: (vfs_read+0x0/0x1a0) arg1=7" in lines[0]
    assert lines[1].endswith("<stack trace>") and lines[2] == " => vfs_read"


def test_soft_mode_runs_triggers_without_recording(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1")
    assert cat(t.root, EV + "enable") == "0*\n"
    t.engine.hit(VFS_READ, di=1)
    assert trace_lines(t) == []
    assert "Hits: 1" in cat(t.root, EV + "hist")
    echo(t.root, EV + "enable", "1")
    assert cat(t.root, EV + "enable") == "1*\n"
    t.engine.hit(VFS_READ, di=2)
    assert len(trace_lines(t)) == 1
    echo(t.root, EV + "enable", "0")
    assert cat(t.root, EV + "enable") == "0*\n"
    echo(t.root, EV + "trigger", "!hist:keys=arg1")
    assert cat(t.root, EV + "enable") == "0\n"
    assert not t.engine.armed(VFS_READ)


def test_an_event_with_triggers_cannot_be_deleted(t):
    echo(t.root, EV + "trigger", "traceon")
    assert write_errno(t.root, "kprobe_events", "-:p1") == errno.EBUSY
    echo(t.root, EV + "trigger", "!traceon")
    echo(t.root, "kprobe_events", "-:p1")


def test_enable_event_and_disable_event(t):
    echo(t.root, EV + "trigger", "enable_event:kprobes:p2")
    assert cat(t.root, EV + "trigger") == "enable_event:kprobes:p2:unlimited\n"
    assert cat(t.root, OTHER + "enable") == "0*\n"
    t.engine.hit(KSYS_READ)
    assert trace_lines(t) == []
    t.engine.hit(VFS_READ)
    assert cat(t.root, OTHER + "enable") == "1*\n"
    t.engine.hit(KSYS_READ, di=3)
    assert len(trace_lines(t)) == 1 and "p2:" in trace_lines(t)[0]
    assert write_errno(t.root, EV + "trigger", "enable_event:kprobes:p2") == errno.EEXIST
    assert write_errno(t.root, EV + "trigger", "disable_event:kprobes:p2") == errno.EEXIST
    echo(t.root, EV + "trigger", "!enable_event:kprobes:p2")
    assert cat(t.root, OTHER + "enable") == "1\n"     # as in Linux: it stays enabled


def test_removing_an_enable_event_that_never_fired_disarms_the_target(t):
    echo(t.root, EV + "trigger", "enable_event:kprobes:p2")
    echo(t.root, EV + "trigger", "!enable_event:kprobes:p2")
    assert cat(t.root, OTHER + "enable") == "0\n"
    assert not t.engine.armed(KSYS_READ)


def test_disable_event_with_count(t):
    echo(t.root, OTHER + "enable", "1")
    echo(t.root, EV + "trigger", "disable_event:kprobes:p2:1")
    assert cat(t.root, EV + "trigger") == "disable_event:kprobes:p2:count=1\n"
    assert cat(t.root, OTHER + "enable") == "1*\n"
    t.engine.hit(VFS_READ)
    assert cat(t.root, OTHER + "enable") == "0*\n"
    assert cat(t.root, EV + "trigger") == "disable_event:kprobes:p2:count=0\n"


def test_enable_hist_and_disable_hist_pause_the_targets_histograms(t):
    echo(t.root, OTHER + "trigger", "hist:keys=arg1")
    echo(t.root, EV + "trigger", "disable_hist:kprobes:p2")
    assert cat(t.root, EV + "trigger") == "disable_hist:kprobes:p2:unlimited\n"
    t.engine.hit(VFS_READ)
    assert cat(t.root, OTHER + "trigger").endswith("[paused]\n")
    t.engine.hit(KSYS_READ)
    assert "Hits: 0" in cat(t.root, OTHER + "hist")
    assert write_errno(t.root, EV + "trigger", "enable_hist:kprobes:p2") == errno.EEXIST
    echo(t.root, EV + "trigger", "!disable_hist:kprobes:p2")
    echo(t.root, EV + "trigger", "enable_hist:kprobes:p2 if arg1 == 9")
    t.engine.hit(VFS_READ, di=8)
    assert cat(t.root, OTHER + "trigger").endswith("[paused]\n")
    t.engine.hit(VFS_READ, di=9)
    assert cat(t.root, OTHER + "trigger").endswith("[active]\n")


def test_truncating_the_file_drops_only_hist_triggers(t):
    echo(t.root, EV + "trigger", "traceon")
    echo(t.root, EV + "trigger", "hist:keys=arg1")
    echo(t.root, EV + "trigger", "hist:keys=common_pid", append=False)
    assert cat(t.root, EV + "trigger") == (
        "traceon:unlimited\n"
        "hist:keys=common_pid:vals=hitcount:sort=hitcount:size=2048 [active]\n")


def test_trigger_on_a_return_probe_and_on_a_tracing_off_buffer(t):
    echo(t.root, "kprobe_events", "r:r1 vfs_read ret=$retval:s32")
    echo(t.root, "events/kprobes/r1/trigger", "hist:keys=ret")
    echo(t.root, "tracing_on", "0")              # triggers run with tracing off
    t.engine.hit(VFS_READ)
    t.engine.ret(VFS_READ, KSYS_READ + 0x10, ax=(-5) & (2**64 - 1))
    assert "{ ret: 18446744073709551611 } hitcount:          1\n" in cat(
        t.root, "events/kprobes/r1/hist")


def test_teardown_removes_triggers_and_their_events(t):
    echo(t.root, "synthetic_events", "lat u64 d")
    echo(t.root, EV + "trigger", "enable_event:kprobes:p2")
    echo(t.root, EV + "trigger", "hist:keys=arg1:onmatch(kprobes.p1).lat(arg1)")
    echo(t.root, OTHER + "trigger", "hist:keys=arg1:x=arg1")
    t.tracer.teardown()
    assert t.tracer.events == {}
    assert not t.engine.armed(VFS_READ) and not t.engine.armed(KSYS_READ)


def test_an_empty_write_names_no_command(t):
    echo(t.root, EV + "trigger", "traceon")
    assert write_errno(t.root, EV + "trigger", "\n") == errno.EINVAL
    assert write_errno(t.root, EV + "trigger", "  ") == errno.EINVAL
    assert cat(t.root, EV + "trigger") == "traceon:unlimited\n"


# ---- in a trace instance: as in 6.1, triggers belong to the event file, so
# instances/foo/events/G/E/trigger is not the top level's, and a trigger acts on its own
# instance (tracing_on, soft enable, stack traces, hist tables, error_log, variables);
# named histograms are shared by every instance, and a synthetic event records into
# every instance it is enabled in.

FOO = "instances/foo/"


@pytest.fixture
def foo(t):
    node(t.root, "instances").mkdir("foo", 0o755)
    return t


def test_trigger_files_are_per_instance(foo):
    echo(foo.root, FOO + EV + "trigger", "traceoff")
    assert cat(foo.root, FOO + EV + "trigger") == "traceoff:unlimited\n"
    assert cat(foo.root, EV + "trigger").startswith("# Available triggers:")
    assert cat(foo.root, FOO + EV + "enable") == "0*\n"
    assert cat(foo.root, EV + "enable") == "0\n"
    # the same command is no EEXIST in the other array
    echo(foo.root, EV + "trigger", "traceoff")
    assert cat(foo.root, EV + "trigger") == "traceoff:unlimited\n"
    echo(foo.root, FOO + EV + "trigger", "!traceoff")
    assert cat(foo.root, FOO + EV + "trigger").startswith("# Available triggers:")
    assert cat(foo.root, FOO + EV + "enable") == "0\n"
    assert cat(foo.root, EV + "trigger") == "traceoff:unlimited\n"


def test_traceoff_in_an_instance_stops_that_instance_only(foo):
    echo(foo.root, EV + "enable", "1")
    echo(foo.root, FOO + EV + "enable", "1")
    echo(foo.root, FOO + EV + "trigger", "traceoff if arg1 == 7")
    foo.engine.hit(VFS_READ, di=1)
    assert cat(foo.root, FOO + "tracing_on") == "1\n"
    foo.engine.hit(VFS_READ, di=7)
    assert cat(foo.root, FOO + "tracing_on") == "0\n"
    assert cat(foo.root, "tracing_on") == "1\n"
    foo.engine.hit(VFS_READ, di=2)
    # traceoff is a post trigger: the hit that fired it is still written
    assert len(trace_lines(foo, FOO)) == 2
    assert len(trace_lines(foo)) == 3


def test_enable_event_soft_enables_the_target_in_the_same_instance(foo):
    echo(foo.root, FOO + EV + "trigger", "enable_event:kprobes:p2")
    assert cat(foo.root, FOO + OTHER + "enable") == "0*\n"
    assert cat(foo.root, OTHER + "enable") == "0\n"
    foo.engine.hit(KSYS_READ, di=1)           # soft disabled still: nothing written
    foo.engine.hit(VFS_READ)                  # fires: p2 records in foo from now on
    assert cat(foo.root, FOO + OTHER + "enable") == "1*\n"
    assert cat(foo.root, OTHER + "enable") == "0\n"
    foo.engine.hit(KSYS_READ, di=2)
    assert [line.split()[-3::2] for line in trace_lines(foo, FOO)] == [["p2:", "arg1=2"]]
    assert trace_lines(foo) == []
    echo(foo.root, FOO + EV + "trigger", "!enable_event:kprobes:p2")
    # as in 6.1: dropping the last soft reference of a file that was soft enabled
    # leaves it enabled
    assert cat(foo.root, FOO + OTHER + "enable") == "1\n"
    assert cat(foo.root, OTHER + "enable") == "0\n"


def test_stacktrace_writes_into_the_instance_buffer(foo):
    echo(foo.root, FOO + EV + "trigger", "stacktrace")
    echo(foo.root, EV + "enable", "1")
    foo.engine.hit(VFS_READ)
    assert "<stack trace>" in cat(foo.root, FOO + "trace")
    assert "<stack trace>" not in cat(foo.root, "trace")
    assert len(trace_lines(foo)) == 1


def test_hist_tables_are_per_instance(foo):
    echo(foo.root, FOO + EV + "trigger", "hist:keys=arg1")
    echo(foo.root, EV + "trigger", "hist:keys=arg1:vals=hitcount")
    for value in (1, 1, 2):
        foo.engine.hit(VFS_READ, di=value)
    echo(foo.root, EV + "trigger", "hist:keys=arg1:vals=hitcount:clear")
    assert "Hits: 3" in cat(foo.root, FOO + EV + "hist")
    assert "Hits: 0" in cat(foo.root, EV + "hist")
    assert cat(foo.root, FOO + OTHER + "hist") == ""


def test_named_histograms_are_shared_across_instances(foo):
    echo(foo.root, EV + "trigger", "hist:name=reads:keys=arg1")
    echo(foo.root, FOO + OTHER + "trigger", "hist:name=reads:keys=arg1")
    foo.engine.hit(VFS_READ, di=3)
    foo.engine.hit(KSYS_READ, di=3)
    for path in (EV, FOO + OTHER):
        text = cat(foo.root, path + "hist")
        assert "{ arg1:          3 } hitcount:          2" in text
    # a mismatched definition of the name fails in any instance, and is logged there
    assert write_errno(foo.root, FOO + EV + "trigger",
                       "hist:name=reads:keys=common_pid") == errno.EINVAL
    assert "Named hist trigger doesn't match existing named trigger" in cat(
        foo.root, FOO + "error_log")
    assert cat(foo.root, "error_log") == ""


def test_variables_are_looked_up_in_the_instance(foo):
    echo(foo.root, EV + "trigger", "hist:keys=common_pid:v0=arg1")
    # foo has no histogram defining v0
    assert write_errno(foo.root, FOO + OTHER + "trigger",
                       "hist:keys=common_pid:x=$v0") == errno.EINVAL
    assert "Couldn't find variable" in cat(foo.root, FOO + "error_log")
    echo(foo.root, FOO + EV + "trigger", "hist:keys=common_pid:v0=arg1")
    echo(foo.root, FOO + OTHER + "trigger", "hist:keys=common_pid:x=$v0")


def test_a_synthetic_event_records_into_each_instance_it_is_enabled_in(foo):
    echo(foo.root, "synthetic_events", "seen u64 v")
    echo(foo.root, FOO + EV + "trigger",
         "hist:keys=common_pid:v=arg1:onmatch(kprobes.p1).seen($v)")
    echo(foo.root, FOO + "events/synthetic/seen/enable", "1")
    foo.engine.hit(VFS_READ, di=9)
    assert [line.split()[-2:] for line in trace_lines(foo, FOO)] == [["seen:", "v=9"]]
    assert trace_lines(foo) == []
    echo(foo.root, "events/synthetic/seen/enable", "1")
    foo.engine.hit(VFS_READ, di=10)
    assert [line.split()[-2:] for line in trace_lines(foo)] == [["seen:", "v=10"]]
    assert write_errno(foo.root, "synthetic_events", "!seen") == errno.EBUSY


def test_rmdir_removes_the_instance_triggers_and_releases_their_events(foo):
    echo(foo.root, FOO + EV + "trigger", "enable_event:kprobes:p2")
    echo(foo.root, FOO + EV + "trigger", "hist:keys=arg1")
    assert foo.tracer.events[("kprobes", "p2")].enabled
    node(foo.root, "instances").rmdir("foo")
    assert not foo.tracer.events[("kprobes", "p1")].enabled
    assert not foo.tracer.events[("kprobes", "p2")].enabled
    echo(foo.root, "kprobe_events", "-:p1")
    echo(foo.root, "kprobe_events", "-:p2")
    assert cat(foo.root, "kprobe_events") == ""


def test_an_event_with_triggers_in_an_instance_cannot_be_deleted(foo):
    echo(foo.root, FOO + EV + "trigger", "traceon")
    assert write_errno(foo.root, "kprobe_events", "-:p1") == errno.EBUSY
    echo(foo.root, FOO + EV + "trigger", "!traceon")
    echo(foo.root, "kprobe_events", "-:p1")
