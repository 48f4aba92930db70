"""Triggers on static events through a real mount: the kernel hands a static event with
triggers to the host, which runs them (traceoff, stacktrace), in the top level and in
an instance; without triggers the kernel records it itself again."""

import re
from pathlib import Path

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)

FORK = "events/sched/sched_process_fork"


def test_traceoff_on_a_static_event_fires_without_enabling_it(real):
    t = f"{real}/tracing"
    try:
        r = sh(f"echo 1 > {t}/tracing_on && echo traceoff > {t}/{FORK}/trigger"
               f" && (true) && cat {t}/tracing_on")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "0\n"
        assert sh(f"cat {t}/{FORK}/trigger").stdout == "traceoff:unlimited\n"
    finally:
        sh(f"echo '!traceoff' > {t}/{FORK}/trigger; echo 1 > {t}/tracing_on")
    assert sh(f"cat {t}/{FORK}/enable").stdout == "0\n"


def test_a_stacktrace_trigger_follows_the_record_and_goes_with_its_removal(real):
    t = f"{real}/tracing"
    try:
        r = sh(f"echo > {t}/trace && echo stacktrace > {t}/{FORK}/trigger"
               f" && echo 1 > {t}/{FORK}/enable && (true & echo $!; wait)")
        assert r.returncode == 0, r.stderr
        child = int(r.stdout.split()[0])
        lines = Path(f"{t}/trace").read_text().splitlines()
        at = next(i for i, l in enumerate(lines) if f"child_pid={child}" in l)
        assert lines[at + 1].endswith("<stack trace>"), lines[at:at + 3]
        assert lines[at + 2].startswith(" => "), lines[at:at + 3]
        assert " => kernel_clone" in lines[at + 2:at + 12], lines[at:at + 12]
        # without the trigger the kernel records the event again: no stack follows
        r = sh(f"echo '!stacktrace' > {t}/{FORK}/trigger && echo > {t}/trace"
               f" && (true & echo $!; wait)")
        child = int(r.stdout.split()[0])
        text = Path(f"{t}/trace").read_text()
        assert re.search(rf"child_pid={child}\n", text) and "<stack trace>" not in text
    finally:
        sh(f"echo 0 > {t}/{FORK}/enable; echo '!stacktrace' > {t}/{FORK}/trigger")


def test_a_trigger_in_an_instance_acts_on_that_instance(real):
    t = f"{real}/tracing"
    i = f"{t}/instances/trig"
    assert sh(f"mkdir {i}").returncode == 0
    try:
        r = sh(f"echo traceoff > {i}/{FORK}/trigger && (true)"
               f" && cat {i}/tracing_on {t}/tracing_on")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "0\n1\n"
    finally:
        sh(f"echo '!traceoff' > {i}/{FORK}/trigger")
        assert sh(f"rmdir {i}").returncode == 0


def test_mv_in_the_mounts_tmp_is_the_callers_rename(real):
    """rename(2) through the mount: the caller's renameat2 in the emulated kernel (its
    syscall event shows the names), a file replaced, EXDEV across filesystems (mv then
    copies, and tracing/ refuses the new file)."""
    t, tmp = f"{real}/tracing", f"{real}/tmp"
    try:
        r = sh(f"echo 1 > {t}/events/syscalls/sys_enter_renameat2/enable && echo > {t}/trace"
               f" && echo a > {tmp}/x && echo b > {tmp}/y && mv {tmp}/x {tmp}/y"
               f" && cat {tmp}/y && ls {tmp}")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[0] == "a" and "x" not in r.stdout.split()[1:]
        trace = Path(f"{t}/trace").read_text()
        assert re.search(r"sys_renameat2\(olddfd: ffffffffffffff9c, oldname: [0-9a-f]+, "
                         r"newdfd: ffffffffffffff9c, newname: [0-9a-f]+, flags: 0\)", trace), trace
        r = sh(f"mv {tmp}/y {t}/y")
        assert r.returncode != 0 and sh(f"cat {tmp}/y").stdout == "a\n"
    finally:
        sh(f"echo 0 > {t}/events/syscalls/sys_enter_renameat2/enable; rm -f {tmp}/x {tmp}/y")
