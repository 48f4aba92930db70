"""Bad input through the mounted filesystem never takes the daemon down or leaves it
inconsistent: a seeded (derandomized), bounded hypothesis fuzz over the tracefs writes,
run against a real mount served in-process (tests/robust_mount.py), checking after every
input that

* the daemon answers (the root lists, kprobe_events reads);
* every kprobe_events line parses again (kprobefs.tracing.parse_command);
* kprobes/list holds exactly the tracer's registered probes;
* the kernel text of every function without a probe is the image's, byte for byte
  (ftrace sites as the NOP they boot to, unless a function tracer holds them);
* every name under events/ is a plain name (nothing escapes its directory).
"""

from __future__ import annotations

import errno
import os
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kprobefs.tracing import ProbeSpec, parse_command
from kprobefs.tracing.buffers.ring_buffer import MAX_TOTAL_BUFFER_KB

from robust_mount import InProcessMount, need_fuse, read, write

pytestmark = pytest.mark.fuse


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    need_fuse()
    m = InProcessMount(tmp_path_factory.mktemp("fuzz") / "mnt").start()
    yield m
    m.stop()


# ---- the invariants ---------------------------------------------------------------------
_GOOD_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _functions(kernel):
    cached = getattr(kernel, "_robust_functions", None)
    if cached is None:
        cached = [s for s in kernel.image.symbols if s.is_text and s.size]
        kernel._robust_functions = cached
    return cached


def check_invariants(m: InProcessMount) -> None:
    tracing = m.p("tracing")
    assert "tracing" in os.listdir(m.path)
    events_text = read(f"{tracing}/kprobe_events")
    for line in events_text.splitlines():
        spec = parse_command(line, m.tracer.symbols)
        assert isinstance(spec, ProbeSpec), line

    listed = []
    for line in read(m.p("kprobes/list")).splitlines():
        words = line.split()
        listed.append((int(words[0], 16), words[1]))
    with m.tracer.lock:
        expected = sorted((tp.address, "r" if tp.spec.is_return else "k")
                          for tp in m.tracer.probes if tp.registered)
    assert sorted(listed) == expected

    kernel = m.kernel
    arch = kernel.kprobes.arch
    probed = sorted(addr for addr, _kind in listed)
    hooks_sites = m.tracer.tracer_name != "nop" or (
        m.tracer.stack_tracer is not None and m.tracer.stack_tracer.enabled)
    sites = kernel.image.ftrace_sites
    with kernel.lock:
        for fn in _functions(kernel):
            if any(fn.addr <= a < fn.addr + fn.size for a in probed):
                continue
            now = bytearray(kernel.read(fn.addr, fn.size))
            want = bytearray(arch.original_bytes(fn.addr, fn.size))
            if hooks_sites:
                for site in sites:
                    if fn.addr <= site < fn.addr + fn.size:
                        end = min(site + 5, fn.addr + fn.size) - fn.addr
                        now[site - fn.addr:end] = want[site - fn.addr:end]
            assert now == want, f"{fn.name}: text differs from the image"

    for group in os.listdir(f"{tracing}/events"):
        assert _GOOD_NAME.match(group) and group not in (".", ".."), group
        path = f"{tracing}/events/{group}"
        if os.path.isdir(path):
            for name in os.listdir(path):
                assert _GOOD_NAME.match(name) and name not in (".", ".."), name


def reset(m: InProcessMount) -> None:
    t = m.p("tracing")
    write(f"{t}/events/enable", "0\n", append=False)
    write(f"{t}/current_tracer", "nop\n", append=False)
    write(m.p("proc/sys/kernel/stack_tracer_enabled"), "0\n", append=False)
    assert write(f"{t}/kprobe_events", "", trunc=True) == 0
    assert write(f"{t}/dynamic_events", "", trunc=True) == 0
    write(f"{t}/tracing_on", "1\n", append=False)
    write(f"{t}/options/markers", "1\n", append=False)
    write(m.p("kprobes/enabled"), "1\n", append=False)


# ---- the inputs -------------------------------------------------------------------------
NAMES = ["ev", "ev2", "x_y", "A9", "..", ".", "a/b", "../../etc", "g/../e", "x\0y", "é",
         "a" * 70, "grp/ev", "grp/ev2", "-x", "a b", "$x", "/", "kprobes/ev", "ftrace/print"]
PLACES = ["vfs_read", "vfs_write", "do_sys_open", "getname", "kernel_clone", "nosuch",
          "vfs_read+1", "vfs_read+4", "vfs_read+0x10000", "0xffffffff81000000", "0",
          "kprobe_target_traced", "trace_printk:trace_printk_irq_work", "schedule",
          "vfs_read%return", "__x64_sys_getpid"]
ARGS = ["", "x=%di", "c=%dx:u32", "s=+0(%si):string", "r=$retval", "j=@jiffies",
        "d=+0(+8(%di)):u64", "arr=%di:u8[4]", "bf=%di:b3@2/8", "bad=%zz", "$comm",
        "f=+0(0):string", "u=+0(%di):ustring", "k=+100000(%sp):x64", "$stack3", "$arg2",
        "x=%di:u8[999]", "y=\\\"imm\\\"", "n" * 40 + "=%ax", "sym=%ip:symbol"]
NUMBERS = ["0", "1", "2", "-1", "0x10", "7\n", "", "\n", "99999999999999999999999",
           "18446744073709551615", "1 2", "+1", "\0", "y", "on", "off", "abc", "1024",
           "64", "100000000"]
FILTERS = ["common_pid > 0", "x == 1", "(", "(((((((", ")", "s ~ \"a*\"", "0", "1",
           "common_pid == 1 && (x > 2 || c < 3)", "nosuch == 1", "\xff", "x & 3",
           "common_pid != " + "1" * 40]


@st.composite
def command(draw):
    kind = draw(st.sampled_from(["p", "r", "r5", "r9999", "-", "p:", "r:"]))
    name = draw(st.sampled_from(NAMES))
    if kind == "-":
        return f"-:{name}"
    head = kind if kind.endswith(":") else f"{kind}:{name}"
    args = " ".join(draw(st.lists(st.sampled_from(ARGS), max_size=4)))
    return f"{head} {draw(st.sampled_from(PLACES))} {args}".rstrip()


blob = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"\0" * 300, b"\xff\xfe" * 100, b"p:" + b"a" * 5000 + b" vfs_read",
                     b"x" * (1 << 20), b"p:e vfs_read\n" * 3 + b"\0tail",
                     ("p:ok vfs_read " + "a=%di " * 140).encode(), b"#comment only\n"]),
)
commands = st.lists(command(), min_size=1, max_size=4).map(
    lambda cs: "\n".join(cs).encode("utf-8", "surrogateescape"))


@st.composite
def operation(draw):
    target = draw(st.sampled_from([
        "kprobe_events", "kprobe_events", "kprobe_events", "dynamic_events",
        "EVENT/enable", "EVENT/enable", "EVENT/filter", "events/enable", "events/kprobes/filter",
        "set_event", "trace_marker", "buffer_size_kb", "per_cpu/cpu1/buffer_size_kb",
        "tracing_on", "trace_clock", "current_tracer", "options/markers", "error_log",
        "trace", "EVENT/trigger", "synthetic_events", "../kprobes/enabled",
        "../proc/sys/debug/kprobes-optimization", "set_ftrace_filter"]))
    if target in ("kprobe_events", "dynamic_events"):
        data = draw(st.one_of(commands, commands, blob))
    elif target.endswith("filter") and "ftrace" not in target:
        data = draw(st.one_of(st.sampled_from(FILTERS).map(str.encode), blob))
    elif target in ("set_event", "set_ftrace_filter", "synthetic_events"):
        data = draw(st.one_of(
            st.sampled_from(["kprobes:ev", "!kprobes:ev", "*:*", "ev", "vfs_read", "!*",
                             "nosuch", "myev u64 x", "!myev", "kprobes:*"]).map(str.encode),
            blob))
    elif target in ("trace_clock", "current_tracer"):
        data = draw(st.one_of(st.sampled_from(
            [b"local", b"global", b"nop", b"function", b"bogus", b"x86-tsc\n"]), blob))
    else:
        data = draw(st.one_of(st.sampled_from(NUMBERS).map(str.encode), blob))
    mode = draw(st.sampled_from(["append", "append", "trunc", "offset"]))
    offset = draw(st.integers(0, 1 << 20)) if mode == "offset" else None
    event = draw(st.sampled_from(["kprobes/ev", "kprobes/ev2", "grp/ev", "kprobes/x_y"]))
    return target.replace("EVENT", f"events/{event}"), data, mode, offset


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(ops=st.lists(operation(), min_size=1, max_size=6))
def test_fuzz_tracefs_writes_keep_the_daemon_consistent(mnt, ops):
    reset(mnt)
    for target, data, mode, offset in ops:
        err = write(mnt.p(f"tracing/{target}"), data, append=mode == "append",
                    trunc=mode == "trunc", offset=offset)
        assert err in (0, errno.EINVAL, errno.ENOENT, errno.EEXIST, errno.EBUSY,
                       errno.E2BIG, errno.ENOMEM, errno.ENODEV, errno.EPERM, errno.ERANGE,
                       errno.EBADF, errno.ESRCH, errno.EACCES, errno.EILSEQ,
                       errno.EOPNOTSUPP, errno.ENOSPC), (target, data[:80], err)
        check_invariants(mnt)


def test_a_failing_line_keeps_the_lines_before_it_and_nothing_of_itself(mnt):
    reset(mnt)
    t = mnt.p("tracing")
    err = write(f"{t}/kprobe_events",
                "p:good1 vfs_read\np:bad nosuch x=%di\np:after vfs_write\n")
    assert err == errno.ENOENT
    assert read(f"{t}/kprobe_events") == "p:kprobes/good1 vfs_read\n"
    assert sorted(os.listdir(f"{t}/events/kprobes")) == ["enable", "filter", "good1"]
    check_invariants(mnt)


def test_a_megabyte_of_commands_in_one_write_is_applied_whole(mnt):
    """FUSE hands a 1 MiB write(2) over in 128 KiB pieces, cutting lines: each piece's
    complete lines are applied and the writer (which retries short writes, as stdio
    and shells do) sends the rest, so no command is split."""
    reset(mnt)
    lines = "".join(f"p:k{i:05d} vfs_read x=%di\n" for i in range(600))
    pad = "#" + "-" * 1000 + "\n"
    data = (lines + pad * 1100).encode()
    assert len(data) > 1 << 20
    fd = os.open(mnt.p("tracing/kprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    got = read(mnt.p("tracing/kprobe_events")).splitlines()
    assert len(got) == 600 and got[0] == "p:kprobes/k00000 vfs_read x=%di"
    check_invariants(mnt)
    # One line of a megabyte is refused whole.
    assert write(mnt.p("tracing/kprobe_events"), b"p:huge vfs_read " + b"a" * (1 << 20)) \
        == errno.EINVAL
    reset(mnt)


def test_names_that_would_escape_their_directory_are_refused(mnt):
    reset(mnt)
    t = mnt.p("tracing")
    for name in ["..", "../x", "x/..", "a/b/c", ".", "x\0y", "/abs", "/e", ".e", "g/.",
                 "g/..", "x-y", "é", "g\\x", "g/e/"]:
        for kind in ("p", "r"):
            err = write(f"{t}/kprobe_events", f"{kind}:{name} vfs_read".encode())
            assert err == errno.EINVAL, (kind, name, err)
    assert write(f"{t}/synthetic_events", b"../x u64 a") == errno.EINVAL
    assert write(f"{t}/synthetic_events", b"a/b u64 a") == errno.EINVAL
    assert read(f"{t}/kprobe_events") == ""
    check_invariants(mnt)


def test_limits_as_linux_sets_them(mnt):
    reset(mnt)
    t = mnt.p("tracing")
    ev = f"{t}/kprobe_events"
    many = " ".join(f"a{i}=%di" for i in range(140))
    assert write(ev, f"p:args vfs_read {many}") == 0       # 6.1 ignores args past 128
    assert read(ev).count("=%di") == 128
    assert write(ev, "p:" + "e" * 64 + " vfs_read") == errno.EINVAL  # NAME_TOO_LONG
    assert write(ev, "p:" + "g" * 64 + "/e vfs_read") == errno.EINVAL
    deep = "+0(" * 15 + "%di" + ")" * 15                             # 63 characters
    assert write(ev, f"p:deep vfs_read x={deep}") == errno.EINVAL     # nesting
    assert "Dereference is too much nested" in read(f"{t}/error_log")
    assert write(ev, f"p:deep vfs_read x={deep[3:-1]}") == 0
    assert write(ev, "p:arr vfs_read x=%di:u8[65]") == errno.EINVAL   # array size
    assert write(ev, "r4097:ma vfs_read") == errno.EINVAL             # maxactive bound
    assert "Maxactive is too big" in read(f"{t}/error_log")
    assert write(ev, "r4096:ma vfs_read") == 0
    half = MAX_TOTAL_BUFFER_KB // 2            # with two CPUs: the bound, all in the top
    assert write(f"{t}/buffer_size_kb", b"%d" % (MAX_TOTAL_BUFFER_KB * 4)) == errno.ENOMEM
    assert write(f"{t}/buffer_size_kb", b"%d" % half) == 0
    assert write(f"{t}/per_cpu/cpu0/buffer_size_kb", b"%d" % (half + 16)) == errno.ENOMEM
    assert write(f"{t}/buffer_size_kb", b"1408") == 0
    log = read(f"{t}/error_log")
    assert log.count("trace_kprobe: error:") <= 8
    check_invariants(mnt)
    reset(mnt)
