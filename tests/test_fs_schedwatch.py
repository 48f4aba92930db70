"""The host's scheduling mirrored into the emulated kernel (kprobefs.fs.schedwatch): the
sampling logic with a fake /proc and a fake kernel, then the real thing through a mount
and a shell."""

import os
import re
import time
from pathlib import Path

import pytest

from kprobefs.fs.schedwatch import (
    SCHED_FIFO, SCHED_NORMAL, HostSched, HostSchedFiles, SchedWatch, read_host_sched,
)
from kprobefs.machine import abi
from kprobefs.machine.kernel import ProcessExited

S, D = abi.TASK_INTERRUPTIBLE, abi.TASK_UNINTERRUPTIBLE


class FakeTask:
    def __init__(self, pid):
        self.pid = pid


class FakeMirror:
    """Records what the watch asks of the kernel."""

    def __init__(self):
        self.calls = []
        self.exited = set()

    def _check(self, task):
        if task.pid in self.exited:
            raise ProcessExited(task.pid, 0)

    def ran(self, task, sleep_state):
        self._check(task)
        self.calls.append(("ran", task.pid, sleep_state))

    def set_nice(self, task, nice):
        self._check(task)
        self.calls.append(("nice", task.pid, nice))

    def set_scheduler(self, task, policy, rt_priority):
        self._check(task)
        self.calls.append(("sched", task.pid, policy, rt_priority))


class FakeProc:
    """/proc as the watch reads it: pid -> HostSched, None when gone."""

    def __init__(self):
        self.procs = {}

    def set(self, pid, state="S", nvcsw=0, nice=0, policy=SCHED_NORMAL, rtprio=0, ppid=1):
        self.procs[pid] = HostSched(state, ppid, nice, policy, rtprio, nvcsw)

    def read(self, pid):
        return self.procs.get(pid)


@pytest.fixture
def world():
    proc, mirror, tasks = FakeProc(), FakeMirror(), {}
    watch = SchedWatch(mirror, lambda: dict(tasks), read=proc.read)
    return proc, mirror, tasks, watch


def test_a_blocked_and_woken_process_runs_its_task_once_per_sample(world):
    proc, mirror, tasks, watch = world
    tasks[100] = FakeTask(100)
    proc.set(100, "S", nvcsw=3)
    watch.sample()                      # the baseline: nothing happened yet
    watch.sample()
    assert mirror.calls == []
    proc.set(100, "S", nvcsw=5)         # woke, ran and blocked again (twice) meanwhile
    watch.sample()
    assert mirror.calls == [("ran", 100, S)]
    proc.set(100, "R", nvcsw=5)         # woken and running now
    watch.sample()
    proc.set(100, "R", nvcsw=5)
    watch.sample()                      # still the same run
    assert mirror.calls == [("ran", 100, S)] * 2


def test_a_process_blocked_in_D_sleeps_in_D(world):
    proc, mirror, tasks, watch = world
    tasks[7] = FakeTask(7)
    proc.set(7, "R", nvcsw=0)
    watch.sample()
    proc.set(7, "D", nvcsw=1)
    watch.sample()
    assert mirror.calls == [("ran", 7, D)]


def test_zombies_and_gone_processes_are_left_to_the_exit_mirroring(world):
    proc, mirror, tasks, watch = world
    tasks[5] = FakeTask(5)
    proc.set(5, "S", nvcsw=1)
    watch.sample()
    proc.set(5, "Z", nvcsw=2)
    watch.sample()
    del proc.procs[5]
    watch.sample()
    assert mirror.calls == []


def test_a_process_inside_our_request_is_not_sampled_and_its_switches_are_not_a_run(world):
    proc, mirror, tasks, watch = world
    tasks[9] = FakeTask(9)
    proc.set(9, "S", nvcsw=1)
    watch.sample()
    watch.enter(9)
    proc.set(9, "S", nvcsw=4)           # blocked in our FUSE request
    watch.sample()
    assert mirror.calls == []
    watch.leave(9)
    watch.sample()                      # the new baseline
    assert mirror.calls == []
    proc.set(9, "S", nvcsw=5)
    watch.sample()
    assert mirror.calls == [("ran", 9, S)]


def test_nice_and_rt_policies_reach_the_task_once_and_before_the_run(world):
    proc, mirror, tasks, watch = world
    tasks[11] = FakeTask(11)
    proc.set(11, "S", nvcsw=1, nice=5)
    watch.sample()
    assert mirror.calls == [("nice", 11, 5)]
    proc.set(11, "S", nvcsw=2, nice=5)
    watch.sample()
    assert mirror.calls[1:] == [("ran", 11, S)]
    mirror.calls.clear()
    proc.set(11, "S", nvcsw=3, nice=5, policy=SCHED_FIFO, rtprio=5)
    watch.sample()
    assert mirror.calls == [("sched", 11, SCHED_FIFO, 5), ("ran", 11, S)]
    mirror.calls.clear()
    proc.set(11, "S", nvcsw=3, nice=0, policy=SCHED_NORMAL)
    watch.sample()
    assert mirror.calls == [("nice", 11, 0), ("sched", 11, SCHED_NORMAL, 0)]


def test_a_child_inherits_its_parents_priority_as_fork_gives_it(world):
    proc, mirror, tasks, watch = world
    tasks[20] = FakeTask(20)
    proc.set(20, "S", nice=3)
    watch.sample()
    assert mirror.calls == [("nice", 20, 3)]
    tasks[21] = FakeTask(21)
    proc.set(21, "S", nice=3, ppid=20)  # forked from 20's task: nice 3 already
    tasks[22] = FakeTask(22)
    proc.set(22, "S", nice=3, ppid=1)   # its task was forked from init's
    watch.sample()
    assert mirror.calls == [("nice", 20, 3), ("nice", 22, 3)]


def test_a_forked_process_that_blocked_before_its_first_sample_ran(world):
    """A task made at its host fork is compared with what fork left (no voluntary
    switch yet): a command that ran and went to sleep before the sampler looked at it
    has its run mirrored; an unforked process's first sample is only the baseline."""
    proc, mirror, tasks, watch = world
    watch.forked(30)
    tasks[30] = FakeTask(30)
    proc.set(30, "S", nvcsw=1)          # exec'd and sleeps
    tasks[31] = FakeTask(31)
    proc.set(31, "S", nvcsw=1)          # not forked: a process first seen now
    watch.sample()
    assert mirror.calls == [("ran", 30, S)]
    watch.sample()
    assert mirror.calls == [("ran", 30, S)]


def test_a_forked_process_still_running_its_first_run_is_left_to_the_next_sample(world):
    proc, mirror, tasks, watch = world
    watch.forked(32)
    tasks[32] = FakeTask(32)
    proc.set(32, "R", nvcsw=0)
    watch.sample()
    assert mirror.calls == []
    proc.set(32, "S", nvcsw=1)
    watch.sample()
    assert mirror.calls == [("ran", 32, S)]


def test_a_forked_process_whose_switches_were_our_requests_starts_from_a_baseline(world):
    proc, mirror, tasks, watch = world
    watch.forked(33)
    watch.enter(33)                     # its first request, before any sample
    watch.leave(33)
    tasks[33] = FakeTask(33)
    proc.set(33, "S", nvcsw=4)
    watch.sample()
    assert mirror.calls == []


def test_a_fork_never_watched_is_forgotten(world, monkeypatch):
    proc, mirror, tasks, watch = world
    watch.forked(34)
    monkeypatch.setattr(SchedWatch, "FORKED_KEPT", 0.0)
    time.sleep(0.01)
    watch.sample()                      # 34 exited before it was ever watched
    monkeypatch.undo()
    tasks[34] = FakeTask(34)            # a later process with the same pid
    proc.set(34, "S", nvcsw=7)
    watch.sample()
    assert mirror.calls == []


def test_tasks_that_go_are_forgotten_and_a_reused_pid_starts_afresh(world):
    proc, mirror, tasks, watch = world
    tasks[30] = FakeTask(30)
    proc.set(30, "S", nvcsw=1)
    watch.sample()
    tasks[30] = FakeTask(30)            # the pid now belongs to another process
    proc.set(30, "S", nvcsw=9)
    watch.sample()                      # a baseline, not a run
    assert mirror.calls == []
    mirror.exited.add(30)
    proc.set(30, "S", nvcsw=10)
    watch.sample()                      # its task exited meanwhile: dropped, no error
    watch.sample()
    assert mirror.calls == []


def test_the_daemons_own_pid_is_never_mirrored(world):
    proc, mirror, tasks, watch = world
    me = os.getpid()
    tasks[me] = FakeTask(me)
    proc.set(me, "S", nvcsw=1, nice=4)
    watch.sample()
    proc.set(me, "S", nvcsw=2, nice=4)
    watch.sample()
    assert mirror.calls == []


def test_a_failing_mirror_is_logged_once_and_its_process_left_alone(world, caplog):
    proc, mirror, tasks, watch = world
    tasks[50] = FakeTask(50)
    proc.set(50, "S", nvcsw=1)
    watch.sample()

    def broken(task, state):
        raise RuntimeError("a bug")
    mirror.ran = broken
    for n in range(2, 5):
        proc.set(50, "S", nvcsw=n)
        watch.sample()
    assert caplog.text.count("mirroring the scheduling of pid 50 failed") == 1


def test_before_sample_runs_first(world):
    proc, mirror, tasks, _ = world
    order = []

    def before():
        order.append("events")
        tasks[40] = FakeTask(40)        # a fork mirrored from the process events

    watch = SchedWatch(mirror, lambda: dict(tasks), read=lambda pid: order.append(pid),
                       before_sample=before)
    watch.sample()
    assert order == ["events", 40]


def test_read_host_sched_reads_this_process():
    me = read_host_sched(os.getpid())
    assert me.state == "R" and me.ppid == os.getppid()
    assert me.nice == os.getpriority(os.PRIO_PROCESS, 0)
    assert me.policy == os.sched_getscheduler(0) and me.nvcsw >= 0
    assert read_host_sched(2 ** 22 + 1) is None


def test_a_process_no_longer_mirrored_is_forgotten_by_the_reader():
    """The reader is told when a pid leaves the watch (its task gone or replaced, as
    when the pid went to a new process): HostSchedFiles closes its files then."""
    proc, mirror, tasks = FakeProc(), FakeMirror(), {}
    forgotten = []

    class Reader:
        def __call__(self, pid):
            return proc.read(pid)

        def forget(self, pid):
            forgotten.append(pid)

    watch = SchedWatch(mirror, lambda: dict(tasks), read=Reader())
    tasks[100], tasks[101] = FakeTask(100), FakeTask(101)
    proc.set(100)
    proc.set(101)
    watch.sample()
    tasks[101] = FakeTask(101)          # the pid went to another process
    del tasks[100]
    watch.sample()
    assert sorted(forgotten) == [100, 101]


def test_kept_open_files_read_what_a_fresh_open_reads():
    """HostSchedFiles keeps each process's two /proc files open and preads them: each
    sample is the process now (a sleeper that starts spinning is seen running), and a
    process that is gone reads None and has its files closed."""
    import subprocess
    import time

    files = HostSchedFiles()
    p = subprocess.Popen(["sh", "-c", "sleep 0.4; while :; do :; done"])
    try:
        time.sleep(0.2)
        first = files(p.pid)
        assert first == read_host_sched(p.pid) and first.state == "S"
        held = set(os.listdir("/proc/self/fd"))
        time.sleep(0.5)
        now = files(p.pid)
        assert now.state == "R" and now.nvcsw >= first.nvcsw
        assert set(os.listdir("/proc/self/fd")) == held     # nothing opened again
    finally:
        p.kill()
        p.wait()
    assert files(p.pid) is None and p.pid not in files._fds
    assert files(2 ** 22 + 1) is None
    me = files(os.getpid())
    assert me.ppid == os.getppid()
    files.close()
    assert not files._fds


# ---- through a mount -------------------------------------------------------------------
from test_fs_mount import _need_fuse, real, sh  # noqa: E402,F401  (fixtures)


def _sched_trace(t, script):
    assert sh(f"echo > {t}/trace").returncode == 0
    r = sh(f"echo 1 > {t}/events/sched/enable; {script}; "
           f"echo 0 > {t}/events/sched/enable")
    assert r.returncode == 0, r.stderr
    return Path(f"{t}/trace").read_text()


def test_a_sleeping_shell_child_sleeps_and_wakes_in_the_kernel(real):
    t = f"{real}/tracing"
    trace = _sched_trace(t, "sleep 0.3")
    sleeps = re.findall(r"sched_switch: prev_comm=sleep prev_pid=(\d+) prev_prio=120 "
                        r"prev_state=S ==> ", trace)
    assert sleeps, trace
    pid = sleeps[0]
    woken = [l for l in trace.splitlines()
             if re.search(rf"sched_wakeup: comm=sleep pid={pid} prio=120 ", l)]
    assert woken, trace
    assert re.search(rf"sched_switch: .* ==> next_comm=sleep next_pid={pid} "
                     r"next_prio=120$", trace, re.M), trace


def test_a_short_command_exits_under_its_execd_comm(real):
    # The exec's comm is read as its process event arrives.  (A command that exits
    # within a fraction of a millisecond of its exec may be gone before that.)
    t = f"{real}/tracing"
    trace = _sched_trace(t, "sleep 0.02; sleep 0.02")
    exits = re.findall(r"sched_process_exit: comm=(\S+) pid=\d+ ", trace)
    assert exits.count("sleep") == 2, trace


def test_nice_reaches_the_task_as_its_prio(real):
    t = f"{real}/tracing"
    trace = _sched_trace(t, "nice -n 5 sleep 0.2")
    assert re.search(r"sched_waking: comm=sleep pid=\d+ prio=125 ", trace), trace
    assert re.search(r"sched_switch: prev_comm=sleep prev_pid=\d+ prev_prio=125 "
                     r"prev_state=S ", trace), trace


def test_an_rt_task_has_6_1s_rt_prio_and_setscheduler_is_a_real_syscall(real):
    t = f"{real}/tracing"
    assert sh(f"echo 1 > {t}/events/syscalls/sys_enter_sched_setscheduler/enable"
              ).returncode == 0
    try:
        trace = _sched_trace(t, "chrt -f 5 sleep 0.2")
    finally:
        sh(f"echo 0 > {t}/events/syscalls/sys_enter_sched_setscheduler/enable")
    assert re.search(r"\d: sys_sched_setscheduler\(pid: 0, policy: 1, ", trace), trace
    assert re.search(r"sched_wakeup: comm=sleep pid=\d+ prio=94 ", trace), trace


# ---- the kernel's side -----------------------------------------------------------------
EINVAL, ESRCH = 22, 3


@pytest.fixture(scope="module")
def kernel():
    from kprobefs.machine.kernel import Kernel
    return Kernel(cpus=2, seed=0)


def test_run_user_wakes_the_task_without_a_system_call_and_it_sleeps_again(kernel):
    task = kernel.spawn("pinger")
    assert kernel.wait(kernel.run_user(task, D), 30) == 0
    assert kernel.wait(kernel.run_user(task), 30) == 0
    assert task.state == "user"
    assert kernel.syscall(task, "getpid") == task.pid  # system calls go on as before


def test_setpriority_and_sched_setscheduler_check_their_arguments_as_linux(kernel):
    task = kernel.spawn("prio")
    param = lambda prio: prio.to_bytes(4, "little")  # noqa: E731
    assert kernel.syscall(task, "setpriority", 0, 0, 5) == 0
    assert kernel.syscall(task, "setpriority", 0, 0, 100) == 0       # clamped to 19
    assert kernel.syscall(task, "setpriority", 3, 0, 0) == -EINVAL
    assert kernel.syscall(task, "setpriority", 0, 4000000, 0) == -ESRCH
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_FIFO, param(5)) == 0
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_FIFO, param(0)) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_FIFO, param(100)) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_NORMAL, param(1)) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", 0, 4, param(0)) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_NORMAL, 0) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", -1, SCHED_NORMAL, param(0)) == -EINVAL
    assert kernel.syscall(task, "sched_setscheduler", 4000000, SCHED_NORMAL,
                          param(0)) == -ESRCH
    assert kernel.syscall(task, "sched_setscheduler", 0, SCHED_NORMAL, param(0)) == 0
