"""The tracefs tree: modes, every small file's read/write/truncate semantics and errno,
README tokens the selftests grep, events/ files, set_event, options, per_cpu."""

import errno
import os
import re

import pytest

from kprobefs.tracing.files import FileHandle, TraceDir, TraceFile
from tracer_fakes import cat, echo, make_tracer, node, write_errno


@pytest.fixture
def t():
    return make_tracer()


ROOT_FILES = {
    "README": 0o440, "kprobe_events": 0o640, "dynamic_events": 0o640,
    "kprobe_profile": 0o440, "trace": 0o640, "trace_pipe": 0o440, "tracing_on": 0o640,
    "trace_marker": 0o220, "buffer_size_kb": 0o640, "buffer_total_size_kb": 0o440,
    "trace_clock": 0o640, "current_tracer": 0o640, "available_tracers": 0o440,
    "available_events": 0o440, "set_event": 0o640, "error_log": 0o640,
    "available_filter_functions": 0o440,
}


def test_tree_layout_and_modes(t):
    root = t.root
    assert isinstance(root, TraceDir) and root.mode == 0o750
    children = root.children()
    for name, mode in ROOT_FILES.items():
        assert isinstance(children[name], TraceFile), name
        assert children[name].mode == mode, name
    for name in ("options", "per_cpu", "events"):
        assert children[name].mode == 0o750
    assert set(node(root, "per_cpu").children()) == {"cpu0", "cpu1"}
    assert set(node(root, "per_cpu/cpu0").children()) == {
        "trace", "trace_pipe", "trace_pipe_raw", "stats", "buffer_size_kb", "snapshot",
        "snapshot_raw"}
    echo(root, "kprobe_events", "p:ev vfs_read")
    assert set(node(root, "events/kprobes").children()) == {"enable", "filter", "ev"}
    files = node(root, "events/kprobes/ev").children()
    assert {n: f.mode for n, f in files.items()} == {
        "enable": 0o640, "filter": 0o640, "format": 0o440, "id": 0o440, "trigger": 0o640,
        "hist": 0o440}
    handle = files["id"].open(os.O_RDONLY, 1, "cat")
    assert isinstance(handle, FileHandle)


def test_readme_tokens(t):
    readme = cat(t.root, "README")
    assert readme.startswith("tracing mini-HOWTO:")
    for token in ("x8/16/32/64", "r[maxactive]", "$arg<N>", "Create/append/",
                  "<symbol>[+<offset>]%return", "imm-value", "imm-string",
                  "place: [<module>:]<symbol>", "place (kretprobe): [<module>:]<symbol>",
                  "ustring", "[u]<offset>", "symstr"):
        assert token in readme, token
    assert re.search(r"place \(kretprobe\): .*%return.*", readme)
    assert re.search(r"p\[:\[<group>/]\[<event>]]", readme)
    assert " <type>\\[<array-size>\\]" in readme
    lines = readme.splitlines()
    at = next(i for i, line in enumerate(lines) if "fetcharg:" in line)
    assert "$comm" in lines[at] + lines[at + 1]
    assert any("ustring" in line for line in lines[at:at + 11])
    assert any("[u]<offset>" in line for line in lines[at:at + 11])
    # the trigger and hist features the trigger selftests require
    for token in ("<var1>=<field|var_ref|numeric_literal>", "onchange(var)", "snapshot()",
                  "trace(<synthetic_event>", "char name[]' >> synthetic_events"):
        assert token in readme, token
    # nothing this tracer lacks is advertised
    assert "uprobe" not in readme
    assert ("\t           r[maxactive][:[<group>/][<event>]] <place> [<args>]\n"
            "\t           s:[synthetic/]<event> <field> [<field>]\n"
            "\t           e[:[<group>/][<event>]] <attached-group>.<attached-event> [<args>]"
            " [if <filter>]\n"
            "\t           -:[<group>/][<event>]\n"
            "\t    place: [<module>:]<symbol>[+<offset>]|<memaddr>\n"
            "place (kretprobe): [<module>:]<symbol>[+<offset>]%return|<memaddr>\n") in readme


def test_read_only_files_refuse_writes(t):
    for name in ("README", "kprobe_profile", "available_tracers", "available_events",
                 "buffer_total_size_kb", "available_filter_functions", "trace_pipe"):
        assert write_errno(t.root, name, "x") == errno.EINVAL, name


def test_tracing_on(t):
    assert cat(t.root, "tracing_on") == "1\n"
    echo(t.root, "tracing_on", "0\n")
    assert cat(t.root, "tracing_on") == "0\n"
    echo(t.root, "tracing_on", "7")
    assert cat(t.root, "tracing_on") == "1\n"
    for bad in ("x", "1 ", "0x1", "", "1\n\n"):
        assert write_errno(t.root, "tracing_on", bad) == errno.EINVAL, bad
    assert cat(t.root, "tracing_on") == "1\n"


def test_current_and_available_tracers(t):
    assert cat(t.root, "available_tracers") == "nop\n"
    assert cat(t.root, "current_tracer") == "nop\n"
    assert echo(t.root, "current_tracer", "  nop \n") == 7
    assert write_errno(t.root, "current_tracer", "function") == errno.EINVAL


def test_options(t):
    options = node(t.root, "options").children()
    assert {"stacktrace", "pause-on-trace", "sym-offset", "overwrite"} <= set(options)
    assert cat(t.root, "options/stacktrace") == "0\n"
    assert cat(t.root, "options/overwrite") == "1\n"
    echo(t.root, "options/pause-on-trace", "1")
    assert cat(t.root, "options/pause-on-trace") == "1\n"
    assert write_errno(t.root, "options/stacktrace", "2") == errno.EINVAL
    assert write_errno(t.root, "options/stacktrace", "on") == errno.EINVAL


def test_available_filter_functions(t):
    assert cat(t.root, "available_filter_functions") == (
        "vfs_read\nksys_read\nkernel_clone\ndo_exit\ntracefs_create_dir\nname_show\n"
        "name_show\n")


def test_header_files(t):
    assert cat(t.root, "events/header_page").splitlines()[0] == (
        "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;")
    assert cat(t.root, "events/header_event").startswith("# compressed entry header\n")


# ------------------------------------------------------------------- enable files

def test_event_enable_file(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    assert cat(t.root, "events/kprobes/ev/enable") == "0\n"
    echo(t.root, "events/kprobes/ev/enable", "1")
    echo(t.root, "events/kprobes/ev/enable", "1")            # same value: no-op
    assert cat(t.root, "events/kprobes/ev/enable") == "1\n"
    for bad in ("2", "x", "0x1"):
        assert write_errno(t.root, "events/kprobes/ev/enable", bad) == errno.EINVAL
    assert cat(t.root, "events/kprobes/ev/enable") == "1\n"


def test_group_and_top_enable(t):
    assert cat(t.root, "events/enable") == "?\n"
    echo(t.root, "events/enable", "0")                  # must work with no event at all
    echo(t.root, "kprobe_events", "p:g/a vfs_read\np:g/b vfs_read+4\np:h/c kernel_clone\n")
    assert cat(t.root, "events/enable") == "0\n"
    echo(t.root, "events/g/a/enable", "1")
    assert cat(t.root, "events/g/enable") == "X\n"
    echo(t.root, "events/g/enable", "1")
    assert cat(t.root, "events/g/enable") == "1\n"
    assert cat(t.root, "events/enable") == "X\n"
    echo(t.root, "events/enable", "1")
    assert cat(t.root, "events/enable") == "1\n"
    assert write_errno(t.root, "events/enable", "2") == errno.EINVAL
    echo(t.root, "events/enable", "0")
    assert cat(t.root, "events/enable") == "0\n"


def test_enable_failure_rolls_back(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read\np:ev kernel_clone\n")

    def refuse(kp):
        raise OSError(errno.EINVAL, "no")
    second = t.engine.probes[1]
    original = t.engine.enable_kprobe
    t.engine.enable_kprobe = lambda kp: refuse(kp) if kp is second else original(kp)
    assert write_errno(t.root, "events/kprobes/ev/enable", "1") == errno.EINVAL
    assert cat(t.root, "events/kprobes/ev/enable") == "0\n"
    assert all(kp.flags & 2 for kp in t.engine.probes)


def test_set_event(t):
    echo(t.root, "kprobe_events", "p:g/a vfs_read\np:g/b vfs_read+4\np:h/c kernel_clone\n")
    assert cat(t.root, "available_events") == "h:c\ng:b\ng:a\n"   # newest first
    echo(t.root, "set_event", "g:a h:")
    assert cat(t.root, "set_event") == "h:c\ng:a\n"
    echo(t.root, "set_event", "!g:*")
    assert cat(t.root, "set_event") == "h:c\n"
    echo(t.root, "set_event", "b")                  # an event name ...
    echo(t.root, "set_event", "!h")                 # ... or a group name
    assert cat(t.root, "set_event") == "g:b\n"
    echo(t.root, "set_event", ":a")
    assert cat(t.root, "set_event") == "g:b\ng:a\n"
    assert write_errno(t.root, "set_event", "nosuch") == errno.EINVAL
    echo(t.root, "set_event", "", append=False)     # O_TRUNC disables all
    assert cat(t.root, "set_event") == ""


def test_set_event_stops_at_first_bad_token(t):
    echo(t.root, "kprobe_events", "p:a vfs_read\np:b kernel_clone\n")
    assert write_errno(t.root, "set_event", "kprobes:a nosuch kprobes:b") == errno.EINVAL
    assert cat(t.root, "set_event") == "kprobes:a\n"


def test_trigger_and_hist(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    assert cat(t.root, "events/kprobes/ev/trigger").startswith("# Available triggers:\n")
    assert echo(t.root, "events/kprobes/ev/trigger", "!traceoff") == 9
    assert cat(t.root, "events/kprobes/ev/hist") == ""
    assert write_errno(t.root, "events/kprobes/ev/trigger", "traceof") == errno.EINVAL
    echo(t.root, "events/kprobes/ev/trigger", "traceoff")
    assert cat(t.root, "events/kprobes/ev/trigger") == "traceoff:unlimited\n"


def test_format_and_id(t):
    echo(t.root, "kprobe_events", "r:myretprobe vfs_read ret=$retval:s64")
    text = cat(t.root, "events/kprobes/myretprobe/format")
    assert text.startswith("name: myretprobe\nID: 1800\nformat:\n")
    assert text.endswith('print fmt: "(%lx <- %lx) ret=%Ld", REC->__probe_func, '
                         "REC->__probe_ret_ip, REC->ret\n")


def test_handle_of_a_removed_event(t):
    echo(t.root, "kprobe_events", "p:ev vfs_read")
    enable = node(t.root, "events/kprobes/ev/enable")
    echo(t.root, "kprobe_events", "-:ev")
    handle = enable.open(os.O_WRONLY, 1, "sh")
    with pytest.raises(OSError) as info:
        handle.write(b"1", 0)
    assert info.value.errno == errno.ENODEV


def test_content_is_made_once_per_open(t):
    echo(t.root, "kprobe_events", "p:a vfs_read")
    handle = node(t.root, "kprobe_events").open(os.O_RDONLY, 1, "cat")
    first = handle.read(5, 0)
    echo(t.root, "kprobe_events", "p:b vfs_read+4")
    assert first + handle.read(100, 5) == b"p:kprobes/a vfs_read\n"


def test_rdwr_open_with_trunc_clears(t):
    echo(t.root, "kprobe_events", "p:a vfs_read")
    node(t.root, "kprobe_events").open(os.O_RDWR | os.O_TRUNC, 1, "sh").release()
    assert cat(t.root, "kprobe_events") == ""
    # read-only open with O_TRUNC does nothing
    echo(t.root, "kprobe_events", "p:a vfs_read")
    node(t.root, "kprobe_events").open(os.O_RDONLY | os.O_TRUNC, 1, "sh").release()
    assert cat(t.root, "kprobe_events") == "p:kprobes/a vfs_read\n"


def test_events_ftrace_describes_the_tracers_own_records(t):
    """events/ftrace: format (and id where Linux has one) of the records the tracer
    writes itself, with no enable or filter file, in Linux 6.1's text."""
    assert set(node(t.root, "events/ftrace").children()) == {
        "function", "funcgraph_entry", "funcgraph_exit", "context_switch", "wakeup",
        "kernel_stack", "user_stack", "bprint", "print", "raw_data", "bputs", "mmiotrace_rw",
        "mmiotrace_map", "branch", "hwlat", "func_repeats", "osnoise", "timerlat"}
    assert set(node(t.root, "events/ftrace/print").children()) == {"format", "id", "hist", "trigger"}
    assert set(node(t.root, "events/ftrace/kernel_stack").children()) == {"format", "hist"}
    assert cat(t.root, "events/ftrace/print/id") == "5\n"
    assert cat(t.root, "events/ftrace/function/format") == (
        "name: function\nID: 1\nformat:\n"
        "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
        "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
        "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
        "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n"
        "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
        "\tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n\n"
        'print fmt: " %ps <-- %ps", (void *)REC->ip, (void *)REC->parent_ip\n')
    assert "\tfield:unsigned long caller[8];\toffset:16;\tsize:64;\tsigned:0;\n" in cat(
        t.root, "events/ftrace/kernel_stack/format")
    assert "\tfield:char buf[];\toffset:16;\tsize:0;\tsigned:1;\n" in cat(
        t.root, "events/ftrace/print/format")
    assert cat(t.root, "available_events") == ""
