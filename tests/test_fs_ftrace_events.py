"""events/ftrace through a real mount, driven by a shell: 6.1's TRACE_EVENT_FL_IGNORE_ENABLE
events (event_create_dir), each with format and hist, id where it registers, no enable,
filter or trigger but trace_marker's print; none can be enabled or named by a trigger."""

import errno
import os
import stat

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

#: every record type of 6.1's trace_entries.h
FTRACE_NAMES = {
    "function", "funcgraph_entry", "funcgraph_exit", "context_switch", "wakeup",
    "kernel_stack", "user_stack", "bprint", "print", "raw_data", "bputs", "mmiotrace_rw",
    "mmiotrace_map", "branch", "hwlat", "func_repeats", "osnoise", "timerlat"}


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    sh(f"echo > {t}/events/ftrace/print/trigger; rmdir {t}/instances/fte 2>/dev/null")


def _write_errno(path, data, flags=os.O_WRONLY | os.O_TRUNC):
    """0, or the errno of the open or the write."""
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return e.errno
    try:
        os.write(fd, data)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)


def test_ftrace_events_have_format_and_hist_only(t):
    r = sh(f"cd {t}/events/ftrace && ls; for e in *; do echo $e: $(ls $e); done")
    assert r.returncode == 0, r.stderr
    names = r.stdout.split(":", 1)[0].split("\n")[:-1]
    assert set(names) == FTRACE_NAMES           # no enable or filter in the system
    files = dict(line.split(": ") for line in r.stdout.splitlines() if ": " in line)
    assert files.pop("function") == "format hist id"
    assert files.pop("print") == "format hist id trigger"
    assert set(files.values()) == {"format hist"}
    modes = {name: stat.S_IMODE(os.stat(f"{t}/events/ftrace/{name}").st_mode)
             for name in ("function/format", "function/hist", "function/id", "print/trigger",
                          "func_repeats/format", "hwlat/hist")}
    assert modes == {"function/format": 0o440, "function/hist": 0o440, "function/id": 0o440,
                     "print/trigger": 0o640, "func_repeats/format": 0o440,
                     "hwlat/hist": 0o440}
    r = sh(f"""cat {t}/events/ftrace/function/id {t}/events/ftrace/print/id
               cat {t}/events/ftrace/function/hist {t}/events/ftrace/timerlat/hist
               mkdir {t}/instances/fte; ls {t}/instances/fte/events/ftrace/hwlat""")
    assert r.stdout == "1\n5\nformat\nhist\n", r.stderr


def test_ftrace_event_formats_are_6_1s(t):
    with open(f"{t}/events/ftrace/func_repeats/format") as f:
        text = f.read()
    assert text.startswith("name: func_repeats\nID: 19\nformat:\n")
    assert text.endswith(
        "\tfield:unsigned long ip;\toffset:8;\tsize:8;\tsigned:0;\n"
        "\tfield:unsigned long parent_ip;\toffset:16;\tsize:8;\tsigned:0;\n"
        "\tfield:u16 count;\toffset:24;\tsize:2;\tsigned:0;\n"
        "\tfield:u16 top_delta_ts;\toffset:26;\tsize:2;\tsigned:0;\n"
        "\tfield:u32 bottom_delta_ts;\toffset:28;\tsize:4;\tsigned:0;\n\n"
        r'print fmt: " %ps <-%ps\t(repeats:%u  delta: -%llu)", (void *)REC->ip, '
        "(void *)REC->parent_ip, REC->count, "
        "(((u64)(REC)->top_delta_ts << 32) | (REC)->bottom_delta_ts)\n")
    with open(f"{t}/events/ftrace/branch/format") as f:
        text = f.read()
    assert "\tfield:char func[31];\toffset:12;\tsize:31;\tsigned:1;\n" in text
    assert "\tfield:char constant;\toffset:65;\tsize:1;\tsigned:1;\n" in text
    with open(f"{t}/events/ftrace/wakeup/format") as f:
        text = f.read()
    assert "ID: 3\n" in text and "\tfield:unsigned char next_state;\toffset:23;" in text
    assert text.endswith(
        'print fmt: "%u:%u:%u  ==+ %u:%u:%u [%03u]", REC->prev_pid, REC->prev_prio, '
        "REC->prev_state, REC->next_pid, REC->next_prio, REC->next_state, REC->next_cpu\n")


def test_ftrace_events_take_no_enable_or_trigger(t):
    ev = f"{t}/events/ftrace"
    append = os.O_WRONLY | os.O_APPEND
    # read-only files have no write (vfs_write's EINVAL); no trigger file to create
    assert _write_errno(f"{ev}/function/hist", b"x") == errno.EINVAL
    assert _write_errno(f"{ev}/function/format", b"x") == errno.EINVAL
    assert _write_errno(f"{ev}/function/trigger", b"traceon",
                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC) == errno.EACCES
    assert _write_errno(f"{ev}/func_repeats/enable", b"1",
                        os.O_WRONLY | os.O_CREAT | os.O_TRUNC) == errno.EACCES
    # set_event and a trigger's event find none (find_event_file skips them)
    assert _write_errno(f"{t}/set_event", b"ftrace:function", append) == errno.EINVAL
    assert _write_errno(f"{t}/set_event", b"ftrace:*", append) == errno.EINVAL
    assert _write_errno(f"{ev}/print/trigger", b"enable_event:ftrace:function",
                        append) == errno.EINVAL
    r = sh(f"grep -c '^ftrace:' {t}/available_events; cat {ev}/print/trigger")
    assert r.stdout.startswith("0\n# Available triggers:"), r.stdout
    # print's trigger takes a histogram, whose hist file then shows it
    r = sh(f"""set -e
        echo 'hist:keys=common_pid' > {ev}/print/trigger
        echo hello > {t}/trace_marker
        cat {ev}/print/hist""")
    assert r.returncode == 0, r.stderr
    assert "# trigger info: hist:keys=common_pid:vals=hitcount:sort=hitcount" in r.stdout
    assert "    Hits: 1\n" in r.stdout
