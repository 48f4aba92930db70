"""Static events through a real mount and a shell, the way perf-tools' execsnoop and
opensnoop use them: enable the events, run commands with `sh -c`, read `trace`."""

import re
from pathlib import Path

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)


def _trace(t):
    return Path(f"{t}/trace").read_text()


def test_forksnoop_and_opensnoop_see_the_shells_own_calls(real):
    t = f"{real}/tracing"
    events = ("sched:sched_process_fork syscalls:sys_enter_openat "
              "syscalls:sys_exit_openat")
    assert sh(f"echo > {t}/trace; echo '{events}' > {t}/set_event").returncode == 0
    try:
        assert set(sh(f"cat {t}/set_event").stdout.split()) == set(events.split())
        r = sh(f"echo $$ > {real}/tmp/snooped; cat {real}/tmp/snooped > /dev/null & "
               f"echo $! ; wait")
        assert r.returncode == 0, r.stderr
        child = int(r.stdout.split()[0])
        trace = _trace(t)
    finally:
        sh(f"echo > {t}/set_event")
    forks = [l for l in trace.splitlines() if "sched_process_fork:" in l
             and f"child_pid={child}" in l]
    assert forks, trace
    assert re.search(r"sched_process_fork: comm=sh pid=\d+ child_comm=sh "
                     rf"child_pid={child}$", forks[0]), forks[0]
    opens = [l for l in trace.splitlines() if f"-{child} " in l and "openat" in l]
    enter = [l for l in opens if "sys_enter_openat:" in l]
    exits = [l for l in opens if "sys_exit_openat:" in l]
    assert enter and re.search(r"sys_openat\(dfd: ffffffffffffff9c, filename: [0-9a-f]+, "
                               r"flags: [0-9a-f]+, mode: [0-9a-f]+\)$", enter[0]), opens
    assert exits and re.search(r"sys_openat -> 0x[0-9a-f]+$", exits[0]), opens
    assert sh(f"cat {t}/events/sched/enable").stdout == "0\n"


def test_an_instance_records_a_static_event_by_its_own_filter(real):
    """`mkdir instances/NAME`, a static event enabled there with a filter of the
    instance's own: the instance's trace has the shell's forks that pass it, the top
    level's has none (the event is not enabled there)."""
    t = f"{real}/tracing"
    i = f"{t}/instances/snoop"
    assert sh(f"echo > {t}/trace; mkdir {i}").returncode == 0
    try:
        r = sh(f"echo 'parent_comm == \"sh\"' > {i}/events/sched/sched_process_fork/filter"
               f" && echo 1 > {i}/events/sched/sched_process_fork/enable"
               f" && (true & echo $! ; wait)")
        assert r.returncode == 0, r.stderr
        child = int(r.stdout.split()[0])
        trace = Path(f"{i}/trace").read_text()
        assert sh(f"cat {t}/events/sched/sched_process_fork/enable").stdout == "0\n"
        assert sh(f"cat {i}/events/sched/sched_process_fork/enable").stdout == "1\n"
    finally:
        sh(f"echo 0 > {i}/events/sched/sched_process_fork/enable")
        assert sh(f"rmdir {i}").returncode == 0
    assert re.search(rf"sched_process_fork: comm=sh pid=\d+ child_comm=sh "
                     rf"child_pid={child}$", trace, re.M), trace
    assert all("sched_process_fork: comm=sh " in l for l in trace.splitlines()
               if "sched_process_fork:" in l), trace
    assert "sched_process_fork:" not in _trace(t)
