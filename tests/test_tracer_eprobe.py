"""Event probes (``e:`` in dynamic_events, tracing/events/trace_eprobe.py) on the fake
machine: 6.1's error_log entries and carets (ftracetest's eprobes_syntax_errors.tc),
listing, format, removal, the busy and duplicate rules, and records built from a
synthetic event's record (the fakes have no static events)."""

import errno

import pytest

from tracer_fakes import UBASE, cat, echo, make_tracer, write_errno
from kprobefs.tracing.triggers.trigger import TriggerHit

SYNTH = "a u64 file; char s[16]; s32 n; char d[]"
PROBE = "e:ep synthetic/a f=+0($file):ustring s=$s:string n=$n d=$d:string c=$comm"


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "synthetic_events", SYNTH)
    return t


def fire(t, values, pid=100, comm="bash"):
    """The synthetic event happens (as a hist action generates it)."""
    event = t.tracer.events[("synthetic", "a")]
    t.kernel.run_as(pid, comm)
    t.tracer.top.trigger_host.trace_synth(event, values, TriggerHit(0, pid, 5, lambda: comm))


@pytest.mark.parametrize("command, message", [   # the caret goes where ^ is
    ("e ^a.", "This requires both group and event name to attach"),
    ("e ^.b", "This requires both group and event name to attach"),
    ("e ^a.b", "Attached event does not exist"),
    ("e synthetic/a ^foo", "Invalid fetch argument"),
    ("e:^/bar synthetic/a", "Group name is not specified"),
    ("e:^" + "1" * 65 + "/bar synthetic/a", "Group name is too long"),
    ("e:^foo.1/bar synthetic/a", "Group name must follow the same rules as C identifiers"),
    ("e:^ synthetic/a", "Event name is not specified"),
    ("e:foo/^" + "1" * 65 + " synthetic/a", "Event name is too long"),
    ("e:foo/^bar.1 synthetic/a", "Event name must follow the same rules as C identifiers"),
    ("e:foo/bar synthetic/a arg=^dfd", "Invalid fetch argument"),
    ("e:foo/bar synthetic/a ^arg=$foo", "Attached event does not have this field"),
    ("e:foo/bar synthetic/a x=^%di", "Invalid $-variable specified"),
    ("e:foo/bar synthetic/a if ^", "No filter rule after 'if'"),
])
def test_errors_are_logged_at_event_probe(t, command, message):
    caret = command.index("^")
    text = command.replace("^", "")
    err = write_errno(t.root, "dynamic_events", text + "\n")
    assert err in (errno.EINVAL, errno.ENOENT, errno.ENODEV)
    log = cat(t.root, "error_log").splitlines()
    assert log[-3:] == [f"[ 1234.567891] event_probe: error: {message}",
                        f"  Command: {text.rstrip()}",
                        " " * (len("  Command: ") + caret) + "^"]
    assert "e:" not in cat(t.root, "dynamic_events")


def test_errnos(t):
    assert write_errno(t.root, "dynamic_events", "e a.b") == errno.ENODEV
    assert write_errno(t.root, "dynamic_events", "e synthetic/a x=$nosuch") == errno.ENOENT
    assert write_errno(t.root, "dynamic_events", "e") == errno.EINVAL   # no parser's
    # an event probe is not written to kprobe_events
    assert write_errno(t.root, "kprobe_events", "e synthetic/a") == errno.EINVAL


def test_a_bad_group_in_the_attached_event_logs_twice(t):
    write_errno(t.root, "dynamic_events", "e .b")
    log = cat(t.root, "error_log").splitlines()
    assert [line.split(": error: ")[1] for line in log[::3]] == [
        "Group name is not specified", "This requires both group and event name to attach"]


def test_listing_format_and_directories(t):
    echo(t.root, "dynamic_events", PROBE)
    echo(t.root, "dynamic_events", "e:grp/ synthetic.a")
    assert cat(t.root, "dynamic_events").splitlines()[1:] == [
        "e:eprobes/ep synthetic.a f=+0($file):ustring s=$s:string n=$n d=$d:string "
        "c=$comm",
        "e:grp/a synthetic.a"]
    fmt = cat(t.root, "events/eprobes/ep/format")
    assert "\tfield:__data_loc char[] f;\toffset:8;\tsize:4;\tsigned:1;\n" in fmt
    assert "\tfield:u64 n;\toffset:16;\tsize:8;\tsigned:0;\n" in fmt
    assert fmt.endswith('print fmt: " f=\\"%s\\" s=\\"%s\\" n=0x%Lx d=\\"%s\\" c=\\"%s\\"", '
                        "__get_str(f), __get_str(s), REC->n, __get_str(d), __get_str(c)\n")
    assert cat(t.root, "events/grp/a/format").endswith('\n\nprint fmt: ""\n')
    assert "grp:a\neprobes:ep\n" in cat(t.root, "available_events")


def test_records_read_the_attached_record_and_memory(t):
    echo(t.root, "dynamic_events", PROBE + " x=$n:x8 sym=$file:u32")
    fire(t, [UBASE, b"stat", -3 & (2**64 - 1), b"dyn"])       # not enabled: nothing
    echo(t.root, "events/eprobes/ep/enable", "1")
    assert cat(t.root, "events/synthetic/a/enable") == "0*\n"   # soft mode: not recorded
    fire(t, [UBASE, b"stat", -3 & (2**64 - 1), b"dyn"])
    lines = [l for l in cat(t.root, "trace").splitlines() if not l.startswith("#")]
    assert len(lines) == 1
    assert lines[0].endswith(
        'ep: (synthetic.a) f="/dev/null" s="stat" n=0xfffffffffffffffd d="dyn" c="bash" '
        f"x=0xfd sym={UBASE & 0xFFFFFFFF}")
    echo(t.root, "events/eprobes/ep/enable", "0")
    assert cat(t.root, "events/synthetic/a/enable") == "0\n"


def test_a_fault_reads_as_fault(t):
    echo(t.root, "dynamic_events", "e:ep synthetic/a f=+0($file):ustring")
    echo(t.root, "events/eprobes/ep/enable", "1")
    fire(t, [0x10, b"", 0, b""])
    assert cat(t.root, "trace").rstrip().endswith("ep: (synthetic.a) f=(fault)")


def test_the_command_filter_and_the_events_own_filter(t):
    echo(t.root, "dynamic_events", "e:ep synthetic/a n=$n:s32 if n > 5")
    echo(t.root, "events/eprobes/ep/filter", "n < 9")
    echo(t.root, "events/eprobes/ep/enable", "1")
    for n in (3, 7, 11):
        fire(t, [0, b"", n, b""])
    text = cat(t.root, "trace")
    assert "n=7" in text and "n=3" not in text and "n=11" not in text


def test_a_bad_filter_is_logged_as_a_filter_error(t):
    assert write_errno(t.root, "dynamic_events", "e:ep synthetic/a if n >") == errno.EINVAL
    assert cat(t.root, "error_log").splitlines()[0].endswith(
        "event filter parse error: error: Invalid value (did you forget quotes)?")


def test_triggers_and_hist_on_an_event_probe(t):
    echo(t.root, "dynamic_events", "e:ep synthetic/a n=$n:u32")
    echo(t.root, "events/eprobes/ep/trigger", "hist:keys=n")
    fire(t, [0, b"", 4, b""])
    fire(t, [0, b"", 4, b""])
    assert "{ n:          4 } hitcount:          2" in cat(t.root, "events/eprobes/ep/hist")
    # the internal trigger is not listed on the attached event: it lists the commands,
    # and only the user's triggers when it has some
    assert cat(t.root, "events/synthetic/a/trigger").startswith("# Available triggers")
    echo(t.root, "events/synthetic/a/trigger", "traceoff if n == 100")
    assert cat(t.root, "events/synthetic/a/trigger") == "traceoff:unlimited if n == 100\n"
    echo(t.root, "events/synthetic/a/trigger", "!traceoff")
    echo(t.root, "events/eprobes/ep/trigger", "!hist:keys=n")
    assert cat(t.root, "events/synthetic/a/trigger").startswith("# Available triggers")


def test_removal_by_every_spelling(t):
    for delete in ("-:ep", "-:eprobes/ep", "-:eprobes/ep synthetic/a",
                   "-:ep synthetic.a", "-:ep synthetic/a f=+0($file):ustring",
                   "-:eprobes/"):
        echo(t.root, "dynamic_events", "e:ep synthetic/a f=+0($file):ustring")
        echo(t.root, "dynamic_events", delete)
        assert "e:" not in cat(t.root, "dynamic_events"), delete
        assert ("eprobes", "ep") not in t.tracer.events
    echo(t.root, "dynamic_events", "e:ep synthetic/a f=+0($file):ustring")
    for miss in ("-:ep synthetic/b", "-:ep synthetic/a g=$n", "-:other/ep"):
        assert write_errno(t.root, "dynamic_events", miss) == errno.ENOENT, miss


def test_busy_rules(t):
    echo(t.root, "dynamic_events", "e:ep synthetic/a")
    # the attached synthetic event is held
    assert write_errno(t.root, "synthetic_events", "!a") == errno.EBUSY
    assert write_errno(t.root, "dynamic_events", "-:synthetic/a") == errno.EBUSY
    echo(t.root, "events/eprobes/ep/enable", "1")
    assert write_errno(t.root, "dynamic_events", "-:ep") == errno.EBUSY
    assert write_errno(t.root, "dynamic_events", "", append=False) == errno.EBUSY
    echo(t.root, "events/eprobes/ep/enable", "0")
    echo(t.root, "dynamic_events", "-:ep")
    echo(t.root, "synthetic_events", "!a")
    assert cat(t.root, "dynamic_events") == ""


def test_duplicates(t):
    echo(t.root, "kprobe_events", "p:kgroup/kevent vfs_read")
    echo(t.root, "dynamic_events", "e:egroup/eevent synthetic/a")
    for command in ("e:egroup/eevent synthetic/a", "e:kgroup/kevent synthetic/a",
                    "e:synthetic/a synthetic/a", "p:egroup/eevent vfs_read"):
        assert write_errno(t.root, "dynamic_events", command) == errno.EEXIST, command
    log = cat(t.root, "error_log").splitlines()
    assert log[0] == ("[ 1234.567891] event_probe: error: Given group/event name is "
                      "already used by another event")
    assert log[-3].endswith("trace_kprobe: error: Given group/event name is already used "
                            "by another event")


def test_kprobe_events_and_event_probes_cannot_be_attached_to(t):
    echo(t.root, "kprobe_events", "p:kp vfs_read")
    echo(t.root, "dynamic_events", "e:ep synthetic/a")
    assert write_errno(t.root, "dynamic_events", "e kprobes/kp") == errno.ENODEV
    assert write_errno(t.root, "dynamic_events", "e:x eprobes/ep") == errno.ENODEV


def test_an_instance_records_its_own(t):
    echo(t.root, "dynamic_events", "e:ep synthetic/a n=$n:u8")
    t.tracer.new_instance("i")
    echo(t.root, "instances/i/events/eprobes/ep/enable", "1")
    fire(t, [0, b"", 9, b""])
    assert "ep: (synthetic.a) n=9" in cat(t.root, "instances/i/trace")
    assert "ep:" not in cat(t.root, "trace")
    assert cat(t.root, "events/synthetic/a/enable") == "0\n"
    assert cat(t.root, "instances/i/events/synthetic/a/enable") == "0*\n"
    echo(t.root, "instances/i/events/eprobes/ep/enable", "0")
    t.tracer.remove_instance("i")
    echo(t.root, "dynamic_events", "-:ep")


def test_readme_has_the_eprobe_lines(t):
    readme = cat(t.root, "README")
    assert ("\t           e[:[<group>/][<event>]] <attached-group>.<attached-event> [<args>]"
            " [if <filter>]\n\t           -:[<group>/][<event>]\n") in readme
    assert ("\t    efield: For event probes ('e' types), the field is on of the fields\n"
            "\t            of the <attached-group>/<attached-event>.\n") in readme
