"""Static events through a real mount and a shell, the way perf-tools' execsnoop and
opensnoop use them: enable the events, run commands with `sh -c`, read `trace`."""

import re
from pathlib import Path

from test_fs_mount import (REAL_CLI, _need_fuse, mnt, mount, real, sh,  # noqa: F401
                           wait_for)


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
    # 6.1 prints a system call's events without their names
    enter = [l for l in opens if ": sys_openat(" in l]
    exits = [l for l in opens if ": sys_openat -> " in l]
    assert enter and re.search(r"\d: sys_openat\(dfd: ffffffffffffff9c, filename: "
                               r"[0-9a-f]+, flags: [0-9a-f]+, mode: [0-9a-f]+\)$",
                               enter[0]), opens
    assert exits and re.search(r"\d: sys_openat -> 0x[0-9a-f]+$", exits[0]), opens
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


def _enable(t, events):
    r = sh(f"echo > {t}/trace; echo '{events}' > {t}/set_event")
    assert r.returncode == 0, r.stderr


def _session(t, events, script, probe=""):
    """Enables events (after defining the kprobe event probe, if any), runs script with
    sh and returns its stdout's words and the trace; the events and probe go again."""
    if probe:
        assert sh(f"echo '{probe}' > {t}/kprobe_events").returncode == 0
    _enable(t, events)
    try:
        r = sh(script)
        assert r.returncode == 0, r.stderr
        return r.stdout.split(), _trace(t)
    finally:
        sh(f"echo > {t}/set_event; echo > {t}/kprobe_events")


def test_execsnoop_sees_the_shells_own_fork_and_exec(real):
    """execsnoop's events: the shell forks a child that execs cat (a host exec, from
    the process connector, mirrored as the task's execve): sched_process_fork,
    sys_enter_execve with the filename as a user string (a kprobe's ustring on the
    system call's pt_regs), sched_process_exec with the program's path and pid."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "sched:sched_process_fork sched:sched_process_exec syscalls:sys_enter_execve "
        "kprobes:execsnoop", f"echo $$ > {real}/tmp/execsnooped; "
        f"cat {real}/tmp/execsnooped > /dev/null & echo $! ; wait",
        "p:execsnoop __x64_sys_execve filename=+0(+112(%di)):ustring")
    child = int(words[0])
    mine = [l for l in trace.splitlines() if f"-{child} " in l or f"child_pid={child}" in l]
    assert any(re.search(rf"sched_process_fork: comm=sh pid=\d+ child_comm=sh "
                         rf"child_pid={child}$", l) for l in mine), trace
    assert any(re.search(r"\d: sys_execve\(filename: [0-9a-f]+, "
                         r"argv: [0-9a-f]+, envp: [0-9a-f]+\)$", l) for l in mine), mine
    names = [re.search(r'filename="([^"]*)"', l).group(1) for l in mine
             if "execsnoop:" in l]
    execs = [l for l in mine if "sched_process_exec:" in l]
    assert execs and re.search(rf"filename=(\S+) pid={child} old_pid={child}$", execs[0])
    path = re.search(r"filename=(\S+) ", execs[0]).group(1)
    assert Path(path).name == "cat" and names == [path], (names, execs)
    assert re.match(rf"\s*cat-{child} ", execs[0]), execs[0]


def test_exec_in_place_keeps_the_pid(real):
    """`sh -c '... ; exec cat ...'`: the shell itself becomes cat, pid unchanged."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "sched:sched_process_exec",
        f"sh -c 'echo $$ > {real}/tmp/inplace; exec cat {real}/tmp/inplace'")
    pid = int(words[0])
    assert re.search(rf"^\s*cat-{pid} .*sched_process_exec: filename=\S*/cat pid={pid} "
                     rf"old_pid={pid}$", trace, re.M), trace


def test_a_command_run_in_the_mount_is_seen_exec_d(real):
    """`cd MNT/tmp; sh -c 'ls'`: the shell that cd'd is known, so its child shell and the
    ls it runs are followed: sh's exec of sh, then of ls, in the pids the host gave."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "sched:sched_process_exec",
        f"cd {real}/tmp && sh -c 'echo $$; exec ls -a' > {real}/tmp/listing; "
        f"head -n 1 {real}/tmp/listing")
    pid = int(words[0])
    execs = [l for l in trace.splitlines() if f"-{pid} " in l]
    assert re.search(rf"sched_process_exec: filename=\S*/sh pid={pid} old_pid={pid}$",
                     execs[0]), trace
    assert re.search(rf"^\s*ls-{pid} .*sched_process_exec: filename=\S*/ls pid={pid} "
                     rf"old_pid={pid}$", execs[1]), trace


def test_opensnoop_reads_the_opened_name_through_the_user_string(real):
    """opensnoop's view: sys_enter_openat has the name as a user pointer; a kprobe on
    do_sys_openat2 reads it as a ustring: the shell's child's own file."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "syscalls:sys_enter_openat kprobes:opensnoop",
        f"echo x > {real}/tmp/opensnooped; "
        f"cat {real}/tmp/opensnooped > /dev/null & echo $! ; wait",
        "p:opensnoop do_sys_openat2 filename=+0(%si):ustring")
    child = int(words[0])
    mine = [l for l in trace.splitlines() if f"-{child} " in l]
    assert any(": sys_openat(" in l for l in mine), trace
    assert any(l.endswith('filename="/tmp/opensnooped"') and "opensnoop:" in l
               for l in mine), mine


def test_killsnoop_sees_a_childs_death_reported_to_its_parent(real):
    """killsnoop's events, as far as the host's processes show them: their kill(2)
    makes no process event, so no signal_generate for it; a child's exit is seen
    (mirrored as the task's exit) and its parent is sent SIGCHLD (sig=17, code=1:
    CLD_EXITED) by the kernel, with signal_generate."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "signal:signal_generate syscalls:sys_enter_kill",
        f"echo $$ > {real}/tmp/killsnooped; "
        f"(cat {real}/tmp/killsnooped > /dev/null; exit 3) & echo $! $$; wait; "
        f"cat {real}/tmp/killsnooped > /dev/null")
    child, parent = map(int, words[:2])
    assert re.search(rf"^\s*\S+-{child} .*signal_generate: sig=17 errno=0 code=1 "
                     rf"comm=sh pid={parent} grp=1 res=1$", trace, re.M), trace


def test_a_host_process_killed_by_a_signal_dies_of_it(real):
    """A host shell killed by SIGTERM: its kill(2) is invisible to the daemon (no
    signal_generate for it), but its death by the signal is: the task exits with it
    and its parent hears CLD_KILLED (code=2)."""
    t = f"{real}/tracing"
    words, trace = _session(
        t, "signal:signal_generate sched:sched_process_exit",
        f"echo $$ > {real}/tmp/killed; "
        f"sh -c 'cat {real}/tmp/killed > /dev/null; echo $$; kill -TERM $$'; "
        f"echo $? $$; cat {real}/tmp/killed > /dev/null")
    child, status, parent = map(int, words[:3])
    assert status == 128 + 15
    assert re.search(rf"^\s*\S+-{child} .*signal_generate: sig=17 errno=0 code=2 "
                     rf"comm=sh pid={parent} grp=1 res=1$", trace, re.M), trace
    assert "signal_generate: sig=15 " not in trace


def test_killsnoop_sees_the_workloads_kills(mnt):
    """The background workload's signals through a mount: sys_enter_kill and
    signal_generate in the sender, signal_deliver in the target."""
    mount(REAL_CLI, mnt, "--workload", "300", "--seed", "5")
    t = f"{mnt}/tracing"
    _enable(t, "syscalls:sys_enter_kill signal:signal_generate signal:signal_deliver")

    def killed():
        trace = _trace(t)
        return ": sys_kill(" in trace and "signal_deliver: sig=15 " in trace

    try:
        assert wait_for(killed, timeout=60.0), _trace(t)
        trace = _trace(t)
    finally:
        sh(f"echo > {t}/set_event")
    kill = re.search(r"^\s*(kworker-load\d)-(\d+) .*\d: "
                     r"sys_kill\(pid: ([0-9a-f]+), sig: f\)$", trace, re.M)
    assert kill, trace
    sender, target = kill.group(2), int(kill.group(3), 16)
    assert re.search(rf"^\s*\S+-{sender} .* signal_generate: sig=15 errno=0 code=0 "
                     rf"comm=\S+ pid={target} grp=1 res=0$", trace, re.M), trace
    assert re.search(rf"^\s*\S+-{target} .* signal_deliver: sig=15 errno=0 code=0 "
                     r"sa_handler=0 sa_flags=0$", trace, re.M), trace


def test_openat2_has_its_syscall_events_with_6_1s_format(real):
    """libtracefs's examples use sys_enter_openat2: its fields are those of 6.1's
    SYSCALL_DEFINE4(openat2, ...), laid out as every syscall event's are, and the exit
    event has the return value; both can be enabled."""
    e = f"{real}/tracing/events/syscalls"
    enter = Path(f"{e}/sys_enter_openat2/format").read_text()
    fields = [l.strip() for l in enter.splitlines() if "field:" in l][4:]
    assert fields == [
        "field:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;",
        "field:int dfd;\toffset:16;\tsize:8;\tsigned:0;",
        "field:const char * filename;\toffset:24;\tsize:8;\tsigned:0;",
        "field:struct open_how * how;\toffset:32;\tsize:8;\tsigned:0;",
        "field:size_t usize;\toffset:40;\tsize:8;\tsigned:0;",
    ], enter
    assert enter.splitlines()[-1] == (
        'print fmt: "dfd: 0x%08lx, filename: 0x%08lx, how: 0x%08lx, usize: 0x%08lx", '
        "((unsigned long)(REC->dfd)), ((unsigned long)(REC->filename)), "
        "((unsigned long)(REC->how)), ((unsigned long)(REC->usize))")
    leave = Path(f"{e}/sys_exit_openat2/format").read_text()
    assert "\tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n" in leave, leave
    r = sh(f"echo 1 > {e}/sys_enter_openat2/enable && cat {e}/sys_enter_openat2/enable"
           f" && echo 0 > {e}/sys_enter_openat2/enable")
    assert r.returncode == 0 and r.stdout == "1\n", r.stderr


def test_a_host_processs_open_has_the_fd_it_got_on_the_host(real):
    """A host process has 0, 1 and 2 open: its task has them too (inherited from init,
    which holds them on /dev/null), so opensnoop's FD is the one the process got, 3 for
    the first open of a shell's child, and not 0."""
    t = f"{real}/tracing"
    events = "syscalls:sys_exit_openat"
    assert sh(f"echo > {t}/trace; echo '{events}' > {t}/set_event").returncode == 0
    try:
        r = sh(f"echo hi > {real}/tmp/fds; (exec cat {real}/tmp/fds) & echo $! ; wait")
        assert r.returncode == 0, r.stderr
        child = int(r.stdout.split()[0])
        trace = _trace(t)
    finally:
        sh(f"echo > {t}/set_event")
    exits = [l for l in trace.splitlines() if f"-{child} " in l and "sys_openat -> " in l]
    assert exits and all(re.search(r": sys_openat -> 0x3$", l) for l in exits), trace
