"""The host's scheduling of the processes the gateway mirrors, mirrored into the emulated
kernel.  No FUSE here.

A host process that uses the mount has a task in the emulated kernel (see
:mod:`.gateway`); between its requests that task sleeps in the kernel's user-mode loop.
This module makes that task sleep and wake when its host process does, and gives it the
host process's priority, so that the kernel's own scheduler records what happened:
``sched_waking`` and ``sched_wakeup`` (in the waker's context), ``sched_switch`` to the
task, and ``sched_switch`` away from it with ``prev_state`` S or D.

A thread samples each mirrored process every few milliseconds (5 ms while one of them
runs, backing off to 40 ms while none does) from ``/proc/PID/stat`` (state, nice,
policy, rt_priority) and ``/proc/PID/status`` (``voluntary_ctxt_switches``).  When the
process ran since the last sample (its voluntary switch count moved: it blocked and was
woken, or it went from S/D to running), its task is woken and put back to sleep
(``Kernel.run_user``), in D when the host process is in D now, else S.  A process whose
task was made as it forked (:meth:`SchedWatch.forked`) needs no sample at its fork: it
had run and blocked by its first sample when it has any voluntary switch at all, as
fork starts the count at 0.  So a short command's sleep is seen without a pass at each
fork and exec (a pass per process event cost two /proc reads a process).  A nice or
policy change becomes the ``setpriority`` or ``sched_setscheduler`` system call in the
task, as ``nice`` and ``chrt`` make them.
Processes inside one of our own FUSE requests are left alone (:meth:`SchedWatch.enter`):
the request wakes their task itself, and the switches the request costs them are no run
of theirs.  Zombies and gone processes are left to the exit mirroring.

Threads: the sampler thread alone calls the mirror and the reader; enter/leave and the
task list may change from any thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..errors import KernelError, MachineError
from ..machine import abi
from ..machine.kernel import ProcessExited
from .hostproc import read_proc

__all__ = ["SchedWatch", "HostSched", "HostSchedFiles", "KernelMirror",
           "read_host_sched", "SCHED_NORMAL", "SCHED_FIFO", "SCHED_RR"]

log = logging.getLogger("kprobefs.fs.schedwatch")

SCHED_NORMAL, SCHED_FIFO, SCHED_RR = 0, 1, 2
_RT_POLICIES = (SCHED_FIFO, SCHED_RR)
PRIO_PROCESS = 0
#: /proc/PID/stat fields after the comm's ")" (field 3, the state, is index 0).
_STAT_STATE, _STAT_PPID, _STAT_NICE, _STAT_RTPRIO, _STAT_POLICY = 0, 1, 16, 37, 38
_SLEEPING = ("S", "D")
_GONE = ("Z", "X", "x")


class HostSched(NamedTuple):
    """What a host process's scheduling looks like now."""

    state: str          # R, S, D, Z, ... as /proc/PID/stat shows it
    ppid: int
    nice: int
    policy: int
    rt_priority: int
    nvcsw: int          # voluntary context switches so far


class _Prio(NamedTuple):
    policy: int = SCHED_NORMAL
    nice: int = 0
    rt_priority: int = 0


def read_host_sched(pid: int) -> HostSched | None:
    """The host process's scheduling state, None when it is gone or unreadable."""
    try:
        stat = read_proc(f"/proc/{pid}/stat")
        status = read_proc(f"/proc/{pid}/status")
    except OSError:
        return None
    return _parse_sched(stat, status)


class HostSchedFiles:
    """:func:`read_host_sched` over the two /proc files of each process kept open: a
    sample is two preads from offset 0 (the kernel makes the text anew for each), not
    an open, a read and a close of each.  ``forget(pid)`` closes them (the process is
    no longer sampled, or its pid went to another process).  One thread uses it."""

    def __init__(self):
        self._fds: dict[int, tuple[int, int]] = {}

    def __call__(self, pid: int) -> HostSched | None:
        fds = self._fds.get(pid)
        if fds is None:
            try:
                stat_fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                status_fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                os.close(stat_fd)
                return None
            fds = self._fds[pid] = (stat_fd, status_fd)
        try:
            stat, status = os.pread(fds[0], 16384, 0), os.pread(fds[1], 16384, 0)
        except OSError:         # ESRCH: the process is gone
            self.forget(pid)
            return None
        return _parse_sched(stat, status)

    def forget(self, pid: int) -> None:
        for fd in self._fds.pop(pid, ()):
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._fds):
            self.forget(pid)


def _parse_sched(stat: bytes, status: bytes) -> HostSched | None:
    try:
        fields = stat[stat.rindex(b")") + 2:].split()
        at = status.index(b"\nvoluntary_ctxt_switches:")
        nvcsw = int(status[at:].split(b"\n", 2)[1].split(b":")[1])
        return HostSched(fields[_STAT_STATE].decode(), int(fields[_STAT_PPID]),
                         int(fields[_STAT_NICE]),
                         int(fields[_STAT_POLICY]), int(fields[_STAT_RTPRIO]), nvcsw)
    except (ValueError, IndexError):
        return None


class KernelMirror:
    """Applies what the sampler decides to the emulated kernel, each call bounded by
    timeout; ProcessExited when the task is gone, MachineError/KernelError when the
    machine does not serve it."""

    def __init__(self, kernel, timeout: float = 5.0):
        self.kernel = kernel
        self.timeout = timeout

    def ran(self, task, sleep_state: int) -> None:
        self.kernel.wait(self.kernel.run_user(task, sleep_state), self.timeout)

    def set_nice(self, task, nice: int) -> None:
        self._sys(task, "setpriority", PRIO_PROCESS, 0, nice)

    def set_scheduler(self, task, policy: int, rt_priority: int) -> None:
        # struct sched_param: one int
        self._sys(task, "sched_setscheduler", 0, policy, rt_priority.to_bytes(4, "little"))

    def _sys(self, task, name: str, *args) -> None:
        ret = self.kernel.wait(self.kernel.submit(task, name, *args), self.timeout)
        if -4095 <= ret < 0:
            raise KernelError(-ret, name)


@dataclass(eq=False)
class _Watched:
    task: object
    prio: _Prio | None = None       # what the task has now (None: not known yet)
    last: HostSched | None = None   # the previous sample (None: none yet)
    busy: int = 0                   # our FUSE requests in progress
    resync: bool = False            # take the next sample as the baseline
    forked: bool = False            # its first sample is against its fork (forked())
    broken: bool = False            # mirroring it failed unexpectedly: left alone


class SchedWatch:
    """Mirrors the scheduling of the processes ``tasks()`` names (host pid -> task).

    ``mirror``: what acts on the kernel (:class:`KernelMirror`); ``read``: the /proc
    reader (default: a :class:`HostSchedFiles`); ``before_sample``: run first in each
    pass (the gateway applies the host's queued process events there, so forks, execs
    and exits are mirrored while the processes run, not at the next request).
    """

    def __init__(self, mirror, tasks: Callable[[], dict],
                 read: Callable[[int], HostSched | None] | None = None,
                 before_sample: Callable[[], None] | None = None,
                 interval: float = 0.005):
        self.mirror = mirror
        self.tasks = tasks
        self.read = read if read is not None else HostSchedFiles()
        self.before_sample = before_sample
        self.interval = interval
        self._lock = threading.Lock()
        self._watched: dict[int, _Watched] = {}
        self._busy: dict[int, int] = {}
        #: pid -> when forked() named it, until it is watched (or FORKED_KEPT passes)
        self._forked: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._own_pid = os.getpid()
        #: A watched process ran during the last pass (the next comes after interval;
        #: else the wait doubles, up to IDLE_FACTOR times interval).
        self._active = True
        self._idle_wait = interval

    # ---- requests in progress -----------------------------------------------------------
    def enter(self, pid: int) -> None:
        """pid is inside one of our FUSE requests: not sampled until leave()."""
        with self._lock:
            self._busy[pid] = self._busy.get(pid, 0) + 1

    def leave(self, pid: int) -> None:
        with self._lock:
            n = self._busy.get(pid, 0) - 1
            if n > 0:
                self._busy[pid] = n
            else:
                self._busy.pop(pid, None)
            watched = self._watched.get(pid)
            if watched is not None:
                watched.resync = True
            else:   # its switches since its fork include the request's
                self._forked.pop(pid, None)

    #: How long (s) a fork named by forked() waits to be watched before it is dropped.
    FORKED_KEPT = 1.0

    def forked(self, pid: int) -> None:
        """pid's task was made as the host process forked: its voluntary switches count
        from 0 there, so its first sample is compared with that (a run of its own since
        its fork), not taken as the baseline."""
        with self._lock:
            if pid not in self._watched:
                self._forked[pid] = time.monotonic()

    # ---- sampling ------------------------------------------------------------------------
    def sample(self) -> None:
        """One pass over every mirrored process."""
        if self.before_sample is not None:
            self.before_sample()
        current = self.tasks()
        forget = getattr(self.read, "forget", None)
        with self._lock:
            for pid in [p for p, w in self._watched.items()
                        if current.get(p) is not w.task]:
                del self._watched[pid]
                if forget is not None:
                    forget(pid)
            forked = self._forked
            for pid, task in current.items():
                if pid not in self._watched and pid != self._own_pid:
                    self._watched[pid] = _Watched(
                        task, forked=forked.pop(pid, None) is not None)
            if forked:
                too_old = time.monotonic() - self.FORKED_KEPT
                for pid in [p for p, t in forked.items() if t < too_old]:
                    del forked[pid]
            todo = [(pid, w) for pid, w in self._watched.items()
                    if not self._busy.get(pid) and not w.broken
                    and getattr(w.task, "state", "") != "dead"]
        for pid, watched in todo:
            self._sample_one(pid, watched)

    def _inherited_prio(self, ppid: int) -> _Prio:
        """A new task's priority: its host parent's task's, when that one is mirrored
        (the gateway forks a task from its parent's, and fork keeps the priority), else
        init's."""
        with self._lock:
            parent = self._watched.get(ppid)
        return parent.prio if parent is not None and parent.prio is not None else _Prio()

    def _sample_one(self, pid: int, watched: _Watched) -> None:
        now = self.read(pid)
        if now is None or now.state in _GONE:
            return              # its exit is mirrored from the process events
        last, watched.last = watched.last, now
        if last is None and watched.forked:
            last = now._replace(state="R", nvcsw=0)     # as its fork left it
        if watched.prio is None:
            watched.prio = self._inherited_prio(now.ppid)
        try:
            self._apply_prio(watched, now)
            if last is None or watched.resync:
                watched.resync = False
                return
            woke = last.state in _SLEEPING and now.state not in _SLEEPING
            if now.nvcsw != last.nvcsw or woke:
                state = abi.TASK_UNINTERRUPTIBLE if now.state == "D" else \
                    abi.TASK_INTERRUPTIBLE
                self.mirror.ran(watched.task, state)
                self._active = True
        except ProcessExited:
            with self._lock:
                if self._watched.get(pid) is watched:
                    del self._watched[pid]
        except (KernelError, MachineError, OSError) as e:
            log.debug("scheduling of pid %d not mirrored: %s", pid, e)
        except Exception:
            # A bug, not the machine: said once, and this process is left alone.
            log.exception("mirroring the scheduling of pid %d failed", pid)
            watched.broken = True

    def _apply_prio(self, watched: _Watched, now: HostSched) -> None:
        have = watched.prio
        rt = now.policy in _RT_POLICIES
        want = _Prio(now.policy, now.nice, now.rt_priority if rt else 0)
        if want == have:
            return
        # nice first: a fair policy set afterwards takes the task's nice as it is.
        if want.nice != have.nice:
            self.mirror.set_nice(watched.task, want.nice)
            watched.prio = have = have._replace(nice=want.nice)
        if (want.policy, want.rt_priority) != (have.policy, have.rt_priority):
            self.mirror.set_scheduler(watched.task, want.policy, want.rt_priority)
        watched.prio = want

    # ---- the thread ----------------------------------------------------------------------
    def start(self) -> None:
        """Sample from now on, on a thread of its own.  Idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kprobefs-schedwatch",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        close = getattr(self.read, "close", None)
        if close is not None and (thread is None or not thread.is_alive()):
            close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wait()
            if self._stop.is_set():
                return
            try:
                self.sample()
            except Exception:
                log.exception("sampling the host's scheduling failed")

    #: How many times interval the wait grows to while no watched process runs.
    IDLE_FACTOR = 8

    def _wait(self) -> None:
        """Until the next pass is due.  While no watched process runs, the passes come
        less often (each a host round of /proc reads under the GIL): a process that
        wakes is seen within IDLE_FACTOR times interval, and runs are sampled every
        interval again from then on."""
        if self._active:
            self._idle_wait = self.interval
        else:
            self._idle_wait = min(2 * self._idle_wait, self.IDLE_FACTOR * self.interval)
        self._active = False
        self._stop.wait(self._idle_wait)
