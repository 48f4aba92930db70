"""kprobe_events / dynamic_events: create, append, delete, errno map, error_log, dirs."""

import errno
import os

import pytest

from tracer_fakes import (
    KERNEL_CLONE, DO_EXIT, VFS_READ, cat, echo, make_tracer, node, write_errno,
)


@pytest.fixture
def t():
    return make_tracer()


def last_error(t):
    return cat(t.root, "error_log").splitlines()[-3:]


def test_create_lists_and_makes_dirs(t):
    echo(t.root, "kprobe_events", "p:myevent kernel_clone\n")
    assert cat(t.root, "kprobe_events") == "p:kprobes/myevent kernel_clone\n"
    assert "myevent" in node(t.root, "events/kprobes").children()
    # group dir first, then the event dir inside it, through the injected hook
    assert t.hooks.created == [("kprobes", None), ("myevent", ("kprobes", None))]
    assert cat(t.root, "events/kprobes/myevent/id") == "1800\n"
    assert cat(t.root, "available_events") == "kprobes:myevent\n"


def test_readback_forms(t):
    echo(t.root, "kprobe_events", "p vfs_read\nr10 vfs_read\np:grp/ev vfs_read+0x10 "
         "$stack0:u32 x=+8(%di)\np:myprobeaccept kernel_clone%return\n")
    assert cat(t.root, "kprobe_events") == (
        "p:kprobes/p_vfs_read_0 vfs_read\n"
        "r10:kprobes/r_vfs_read_0 vfs_read\n"
        "p:grp/ev vfs_read+16 arg1=$stack0:u32 x=+8(%di)\n"
        # 6.1's register_kretprobe writes the default maxactive back into the probe
        # the line is printed from.
        "r10:kprobes/myprobeaccept kernel_clone\n")
    assert cat(t.root, "dynamic_events") == cat(t.root, "kprobe_events")


def test_truncate_deletes_all_and_dirs(t):
    echo(t.root, "kprobe_events", "p:a vfs_read\np:g2/b kernel_clone\n")
    echo(t.root, "kprobe_events", "", append=False)
    assert cat(t.root, "kprobe_events") == ""
    assert set(node(t.root, "events").children()) == {"enable", "header_page",
                                                      "header_event", "ftrace"}
    assert len(t.hooks.removed) == 4
    assert t.engine.probes == []


def test_truncate_busy_while_enabled(t):
    echo(t.root, "kprobe_events", "p:a vfs_read\np:b kernel_clone\n")
    echo(t.root, "events/kprobes/a/enable", "1")
    with pytest.raises(OSError) as info:
        node(t.root, "kprobe_events").open(os.O_WRONLY | os.O_TRUNC, 1, "sh")
    assert info.value.errno == errno.EBUSY
    assert cat(t.root, "kprobe_events").count("\n") == 2      # nothing deleted
    with pytest.raises(OSError) as info:
        node(t.root, "dynamic_events").open(os.O_WRONLY | os.O_TRUNC, 1, "sh")
    assert info.value.errno == errno.EBUSY
    echo(t.root, "events/kprobes/a/enable", "0")
    echo(t.root, "kprobe_events", "", append=False)
    assert cat(t.root, "kprobe_events") == ""


def test_write_stops_at_failing_line_earlier_lines_stay(t):
    assert write_errno(t.root, "kprobe_events",
                       "p:one vfs_read\np:two nosuchsym\np:three vfs_read\n") == errno.ENOENT
    assert cat(t.root, "kprobe_events") == "p:kprobes/one vfs_read\n"
    assert last_error(t) == [
        "[ 1234.567891] trace_kprobe: error: Invalid probed address or symbol",
        "  Command: p:two nosuchsym",
        "                 ^"]


def test_each_write_is_parsed_on_its_own(t):
    handle = node(t.root, "kprobe_events").open(os.O_WRONLY | os.O_APPEND, 1, "sh")
    with pytest.raises(OSError):                 # no carry-over of a partial line
        handle.write(b"p:a vfs_", 0)
    with pytest.raises(OSError):
        handle.write(b"read\n", 0)
    assert handle.write(b"p:c vfs_read", 0) == 12
    handle.release()
    assert cat(t.root, "kprobe_events") == "p:kprobes/c vfs_read\n"


@pytest.mark.parametrize("command, err", [
    ("x vfs_read", errno.EINVAL),
    ("p", errno.EINVAL),
    ("p:foo", errno.EINVAL),
    ("p nosuch", errno.ENOENT),
    ("p:test name_show", errno.EADDRNOTAVAIL),
    ("p notrace_fn", errno.EINVAL),
    ("r vfs_read+8", errno.EINVAL),
    ("p vfs_read " + " ".join(f"a{i}=+0(%di):u64[64]" for i in range(7)), errno.E2BIG),
    ("-:nosuch", errno.ENOENT),
    ("-nocolon", errno.EINVAL),
    ("-:", errno.EINVAL),
    (" -:x", errno.EINVAL),
])
def test_errno_map(t, command, err):
    assert write_errno(t.root, "kprobe_events", command + "\n") == err


def test_notrace_rule_uses_the_base_of_a_suffixed_piece(t):
    # kernel_clone.cold has no ftrace site, but kernel_clone has one
    echo(t.root, "kprobe_events", "p:c kernel_clone.cold")
    assert cat(t.root, "kprobe_events") == "p:kprobes/c kernel_clone.cold\n"


def test_silent_rejections_log_nothing(t):
    for command in ("x vfs_read", "p", "p vfs_read $comm:u32"):
        assert write_errno(t.root, "kprobe_events", command) == errno.EINVAL
    assert cat(t.root, "error_log") == ""


def test_registration_errors_are_logged_at_word_one(t):
    t.engine.errors[VFS_READ + 3] = errno.EILSEQ
    t.engine.errors[VFS_READ + 5] = errno.EOPNOTSUPP
    t.engine.errors[VFS_READ + 7] = errno.EEXIST
    assert write_errno(t.root, "kprobe_events", "p vfs_read+3") == errno.EILSEQ
    assert last_error(t)[0].endswith("Probe point is not an instruction boundary")
    assert last_error(t)[2] == " " * 13 + "^"
    assert write_errno(t.root, "kprobe_events", "p vfs_read+5") == errno.EOPNOTSUPP
    assert last_error(t)[0].endswith("Failed to register probe event")
    assert write_errno(t.root, "kprobe_events", "p notrace_fn") == errno.EINVAL
    assert last_error(t)[0].endswith("Failed to register probe event")
    before = cat(t.root, "error_log")
    assert write_errno(t.root, "kprobe_events", "p vfs_read+7") == errno.EEXIST
    assert cat(t.root, "error_log") == before          # EEXIST: no extra entry


def test_failed_registration_removes_the_new_dirs(t):
    t.engine.errors[VFS_READ + 3] = errno.EILSEQ
    assert write_errno(t.root, "kprobe_events", "p:newgrp/ev vfs_read+3") == errno.EILSEQ
    assert t.hooks.created == [("newgrp", None), ("ev", ("newgrp", None))]
    assert t.hooks.removed == [("ev", ("newgrp", None)), ("newgrp", None)]
    assert "newgrp" not in node(t.root, "events").children()
    # the ID is used up anyway: IDs are not reused
    echo(t.root, "kprobe_events", "p:ok vfs_read")
    assert cat(t.root, "events/kprobes/ok/id") == "1801\n"


def test_event_exist_for_kernel_events(t):
    assert write_errno(t.root, "kprobe_events", "p:ftrace/print vfs_read") == errno.EEXIST
    assert last_error(t) == [
        "[ 1234.567891] trace_kprobe: error: Given group/event name is already used by "
        "another event",
        "  Command: p:ftrace/print vfs_read",
        "           ^"]


def test_pending_module_probe_is_accepted(t):
    echo(t.root, "kprobe_events", "p:m nosuchmod:func")
    assert cat(t.root, "kprobe_events") == "p:kprobes/m nosuchmod:func\n"
    assert t.engine.probes == []
    echo(t.root, "events/kprobes/m/enable", "1")            # enabling a pending probe works
    assert cat(t.root, "events/kprobes/m/enable") == "1\n"


def test_registered_disabled_until_enabled(t):
    echo(t.root, "kprobe_events", "p:a vfs_read\nr:b kernel_clone\n")
    assert all(kp.flags & 2 for kp in t.engine.probes)
    echo(t.root, "events/kprobes/a/enable", "1")
    echo(t.root, "events/kprobes/b/enable", "1")
    assert not any(kp.flags & 2 for kp in t.engine.probes)
    echo(t.root, "events/kprobes/a/enable", "0")
    assert t.engine.probes[0].flags & 2


# ------------------------------------------------------------------- multiprobe

def test_multiprobe_append_and_delete(t):
    echo(t.root, "kprobe_events", "p:kprobes/testevent kernel_clone abcd=\\1\n")
    echo(t.root, "kprobe_events", "p:kprobes/testevent do_exit abcd=\\2\n")
    echo(t.root, "kprobe_events", "p:kprobes/other vfs_read\n")
    assert cat(t.root, "kprobe_events") == (
        "p:kprobes/testevent kernel_clone abcd=\\1\n"
        "p:kprobes/testevent do_exit abcd=\\2\n"
        "p:kprobes/other vfs_read\n")
    assert len(t.hooks.created) == 3               # one dir for the multi-probe event
    echo(t.root, "kprobe_events", "-:testevent kernel_clone\n")
    assert cat(t.root, "kprobe_events") == ("p:kprobes/testevent do_exit abcd=\\2\n"
                                            "p:kprobes/other vfs_read\n")
    echo(t.root, "kprobe_events", "-:kprobes/testevent\n")
    assert cat(t.root, "kprobe_events") == "p:kprobes/other vfs_read\n"


def test_appended_probe_inherits_enabled_state(t):
    echo(t.root, "kprobe_events", "p:ev kernel_clone")
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "kprobe_events", "p:ev do_exit")
    assert not t.engine.probes[1].flags & 2
    # removing a sibling of an enabled event is fine, the last one is busy
    echo(t.root, "kprobe_events", "-:ev kernel_clone")
    assert write_errno(t.root, "kprobe_events", "-:ev") == errno.EBUSY
    assert cat(t.root, "kprobe_events") == "p:kprobes/ev do_exit\n"


@pytest.mark.parametrize("second, error_id, caret", [
    ("r:kprobes/testevent do_exit", "Probe type is different from existing probe", 0),
    ("p:kprobes/testevent do_exit bcd=\\1",
     "Argument type or name is different from existing probe", 28),
    ("p:kprobes/testevent do_exit abcd=\\1:u8",
     "Argument type or name is different from existing probe", 28),
    ("p:kprobes/testevent do_exit", "Argument type or name is different from existing probe",
     28),
    ("p:kprobes/testevent kernel_clone abcd=\\1",
     "There is already the exact same probe event", 0),
])
def test_multiprobe_errors(t, second, error_id, caret):
    echo(t.root, "kprobe_events", "p:kprobes/testevent kernel_clone abcd=\\1")
    assert write_errno(t.root, "kprobe_events", second) == errno.EEXIST
    lines = last_error(t)
    assert lines[0].endswith(error_id)
    assert len(lines[2]) + 1 == 13 + caret


# --------------------------------------------------------------------- deleting

def test_delete_group_and_any_group(t):
    echo(t.root, "kprobe_events", "p:mygroup/a vfs_read\np:mygroup/b kernel_clone\n"
         "p:other/a do_exit\n")
    echo(t.root, "kprobe_events", "-:mygroup/")
    assert cat(t.root, "kprobe_events") == "p:other/a do_exit\n"
    assert "mygroup" not in node(t.root, "events").children()
    echo(t.root, "kprobe_events", "p:mygroup/a vfs_read")
    echo(t.root, "kprobe_events", "-:a")                     # any group
    assert cat(t.root, "kprobe_events") == ""


def test_delete_stops_at_busy_but_earlier_matches_stay_removed(t):
    echo(t.root, "kprobe_events", "p:g1/ev vfs_read\np:g2/ev kernel_clone\np:g3/ev do_exit\n")
    echo(t.root, "events/g2/ev/enable", "1")
    assert write_errno(t.root, "kprobe_events", "-:ev") == errno.EBUSY
    assert cat(t.root, "kprobe_events") == "p:g2/ev kernel_clone\np:g3/ev do_exit\n"


def test_dynamic_events_bang_delete(t):
    echo(t.root, "dynamic_events", "p:myevent1 kernel_clone\nr:myevent2 kernel_clone\n")
    echo(t.root, "dynamic_events", "!p:myevent1 kernel_clone")
    assert cat(t.root, "dynamic_events") == "r10:kprobes/myevent2 kernel_clone\n"
    assert write_errno(t.root, "kprobe_events", "!r:myevent2 kernel_clone") == errno.EINVAL
    assert write_errno(t.root, "dynamic_events", "s:foo u64 x; pid_t") == errno.EINVAL
    echo(t.root, "dynamic_events", "s:foo u64 x")
    assert cat(t.root, "dynamic_events") == ("r10:kprobes/myevent2 kernel_clone\n"
                                             "s:synthetic/foo\tu64 x\n")


def test_removing_ever_enabled_event_clears_trace(t):
    echo(t.root, "kprobe_events", "p:a vfs_read\np:b kernel_clone\n")
    echo(t.root, "events/kprobes/a/enable", "1")
    t.engine.hit(VFS_READ)
    echo(t.root, "trace_marker", "hello")
    echo(t.root, "kprobe_events", "-:b")              # never enabled: buffer kept
    assert "hello" in cat(t.root, "trace")
    echo(t.root, "events/kprobes/a/enable", "0")
    echo(t.root, "kprobe_events", "-:a")
    assert "entries-in-buffer/entries-written: 0/0" in cat(t.root, "trace")


def test_event_ids_are_not_reused(t):
    echo(t.root, "kprobe_events", "p:a vfs_read")
    echo(t.root, "kprobe_events", "-:a")
    echo(t.root, "kprobe_events", "p:a vfs_read")
    assert cat(t.root, "events/kprobes/a/id") == "1801\n"


# ---------------------------------------------------------------------- profile

def test_kprobe_profile(t):
    echo(t.root, "kprobe_events", "p:myevent kernel_clone\nr:ret kernel_clone\n")
    assert cat(t.root, "kprobe_profile") == (
        "  myevent                                                    0               0\n"
        "  ret                                                        0               0\n")
    echo(t.root, "events/kprobes/myevent/enable", "1")
    echo(t.root, "events/kprobes/ret/enable", "1")
    t.engine.hit(KERNEL_CLONE)
    t.engine.hit(KERNEL_CLONE)
    t.engine.ret(KERNEL_CLONE, DO_EXIT + 4)
    t.engine.probes[1].nmissed = 2
    t.engine.probes[1].owner.nmissed = 1
    lines = cat(t.root, "kprobe_profile").splitlines()
    assert lines[0].split() == ["myevent", "2", "0"]
    assert lines[1].split() == ["ret", "1", "3"]
    echo(t.root, "events/kprobes/myevent/enable", "0")
    echo(t.root, "events/kprobes/ret/enable", "0")
    echo(t.root, "kprobe_events", "", append=False)
    assert cat(t.root, "kprobe_profile") == ""


def test_error_log_keeps_eight_and_truncate_clears(t):
    for i in range(10):
        write_errno(t.root, "kprobe_events", f"p:e{i} vfs_read $retval")
    text = cat(t.root, "error_log")
    assert text.count("trace_kprobe: error:") == 8
    assert "Command: p:e2 vfs_read $retval" in text and "p:e1 " not in text
    echo(t.root, "error_log", "ignored", append=True)
    assert cat(t.root, "error_log") == text
    echo(t.root, "error_log", "", append=False)
    assert cat(t.root, "error_log") == ""


def test_a_delete_by_name_meets_only_the_probes_so_named_in_creation_order(t, monkeypatch):
    """`-:ev` finds the events named ev by name (not by a walk of every probe, which
    made a delete linear in the number of events), and still takes them in creation
    order where their groups were made in another one."""
    from kprobefs.tracing.events.probe_parser import DeleteSpec
    echo(t.root, "kprobe_events", "p:g2/first do_exit\n" + "".join(
        f"p:many/e{i} vfs_read\n" for i in range(300)))
    echo(t.root, "kprobe_events", "p:g1/ev vfs_read\np:g2/ev kernel_clone\np:g3/ev do_exit\n")
    echo(t.root, "events/g2/ev/enable", "1")
    calls = []
    matches = DeleteSpec.matches
    monkeypatch.setattr(DeleteSpec, "matches",
                        lambda self, spec: calls.append(spec) or matches(self, spec))
    assert write_errno(t.root, "kprobe_events", "-:ev") == errno.EBUSY
    assert len(calls) == 2          # g1/ev, then g2/ev (busy): g3/ev is not reached
    lines = cat(t.root, "kprobe_events").splitlines()
    assert "p:g1/ev vfs_read" not in lines
    assert lines[-2:] == ["p:g2/ev kernel_clone", "p:g3/ev do_exit"]
    echo(t.root, "events/g2/ev/enable", "0")
    echo(t.root, "kprobe_events", "-:g3/ev")
    assert len(calls) == 3
