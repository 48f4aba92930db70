"""The generic trace options that change how records print, through a real mount driven
by a shell: print-parent, and raw, hex and bin (6.1's print_raw_fmt, print_hex_fmt,
print_bin_fmt with each event kind's functions, trace_nop_print where it has none)."""

import re
import struct

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    sh(f"""
        echo nop > {t}/current_tracer; echo > {t}/set_ftrace_filter
        echo > {t}/kprobe_events 2>/dev/null; echo 1 > {t}/tracing_on
        for o in print-parent context-info; do echo 1 > {t}/options/$o; done
        for o in raw hex bin; do echo 0 > {t}/options/$o; done
    """)


def _trace(t, *options: str) -> tuple[bytes, int]:
    """The records of a function trace of vfs_read (a cat of README), a marker and a
    kprobe event, read through trace with ``options`` written (``NAME=V``); and the
    kprobe event's id."""
    defaults = ("print-parent=1", "context-info=1", "raw=0", "hex=0", "bin=0")
    sets = "\n".join(f"echo {o.split('=')[1]} > {t}/options/{o.split('=')[0]}"
                     for o in (*defaults, *options))
    r = sh(f"""
        set -e
        echo 1 > {t}/tracing_on
        echo 'p:optev vfs_read' > {t}/kprobe_events
        echo vfs_read > {t}/set_ftrace_filter
        echo function > {t}/current_tracer
        echo 1 > {t}/events/kprobes/optev/enable
        echo > {t}/trace
        cat {t}/README > /dev/null
        echo hello > {t}/trace_marker
        echo 0 > {t}/tracing_on
        echo 0 > {t}/events/kprobes/optev/enable
        {sets}
        cat {t}/trace > {t}/../tmp/trace.out
    """)
    assert r.returncode == 0, r.stderr
    with open(f"{t}/../tmp/trace.out", "rb") as f, \
            open(f"{t}/events/kprobes/optev/id") as id_file:
        return f.read(), int(id_file.read())


def _records(data: bytes) -> bytes:
    """trace without its header's lines (with context-info off: the tracer's lines)."""
    while data.startswith(b"#"):
        data = data[data.index(b"\n") + 1:]
    return data


def _body(data: bytes) -> list[str]:
    return [line for line in data.decode("latin-1").splitlines()
            if line and not line.startswith("#")]


def test_trace_options_lists_6_1s_output_options_in_its_order(t):
    r = sh(f"cat {t}/trace_options; cat {t}/options/print-parent {t}/options/raw")
    lines = r.stdout.splitlines()
    assert lines[:7] == ["print-parent", "nosym-offset", "nosym-addr", "noraw", "nohex",
                         "nobin", "trace_printk"]
    assert lines[-2:] == ["1", "0"]
    r = sh(f"echo noprint-parent > {t}/trace_options; cat {t}/options/print-parent")
    assert r.stdout == "0\n", r.stderr


def test_print_parent_off_drops_the_caller(t):
    on = [line for line in _body(_trace(t)[0]) if ": vfs_read" in line]
    off = [line for line in _body(_trace(t, "print-parent=0")[0]) if ": vfs_read" in line]
    assert on and all(line.endswith(": vfs_read <-ksys_read") for line in on), on
    assert off and all(line.endswith(": vfs_read") for line in off), off


def test_raw_prints_pid_cpu_ts_and_each_kinds_raw_text(t):
    data, kid = _trace(t, "raw=1")
    lines = _body(data)
    fn = [line for line in lines if re.fullmatch(r"\d+ \d+ \d+ [0-9a-f]{16} [0-9a-f]{16}",
                                                 line)]
    assert fn, lines
    pid, cpu, ts, ip, parent = fn[0].split()
    with open(f"{t}/../proc/kallsyms") as f:
        syms = {line.split()[2]: line.split()[0] for line in f}
    assert ip == syms["vfs_read"]
    # the kprobe event has no raw function: trace_nop_print; the marker's is "# ip buf"
    assert any(re.fullmatch(rf"\d+ \d+ \d+ type: {kid}", line) for line in lines), lines
    assert any(re.fullmatch(r"\d+ \d+ \d+ # 0 hello", line) for line in lines), lines
    # no context with context-info off
    data, kid = _trace(t, "raw=1", "context-info=0")
    lines = _body(data)
    assert f"{ip} {parent}" in lines and f"type: {kid}" in lines, lines


def test_hex_prints_each_field_as_hex_digits(t):
    data, kid = _trace(t, "hex=1")
    lines = _body(data)
    fn = [line for line in lines
          if re.fullmatch(r"[0-9a-f]{8} [0-9a-f]{8} [0-9a-f]{16} ffff[0-9a-f]{12} "
                          r"ffff[0-9a-f]{12} ", line)]
    assert fn, lines
    # trace_nop_print's line, then print_hex_fmt's newline: an empty line follows
    text = data.decode("latin-1")
    assert re.search(rf"\n[0-9a-f]{{8}} [0-9a-f]{{8}} [0-9a-f]{{16}} type: {kid}\n\n", text)


def test_bin_prints_the_fields_bytes(t):
    data, kid = _trace(t, "bin=1", "context-info=0")
    # each function record is its ip and parent ip, 16 bytes
    body = _records(data)
    with open(f"{t}/../proc/kallsyms") as f:
        syms = {line.split()[2]: int(line.split()[0], 16) for line in f}
    fn = struct.pack("<Q", syms["vfs_read"])
    assert body.startswith(fn) and body[8:16] != b"", body[:32]
    assert f"type: {kid}\n".encode() in body and b"type: 5\n" in body
    # with the context: pid, cpu (int) and ts (u64) before each
    data = _trace(t, "bin=1")[0]
    # the header's last line; the records' bytes may hold a "#" or a newline anywhere
    tail = b"#              | |         |   |||||     |         |\n"
    body = data[data.index(tail) + len(tail):]
    pid, cpu, ts = struct.unpack_from("<iiQ", body)
    assert pid > 0 and 0 <= cpu < 64 and ts > 0
    assert body[16:24] == fn
