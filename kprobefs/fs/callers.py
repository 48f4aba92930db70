"""The host processes behind the gateway's requests, and their tasks.  No FUSE here.

A pid seen for the first time becomes a task through ``kernel.start_spawn(comm,
pid=hostpid)`` (kernel_clone via clone3's set_tid; an automatic pid when that one is
taken), forked from the task of its host parent when that one is known; the clone3 is
queued at the process's first request and waited for when a request needs the task.
With the host's process events (:mod:`.procwatch`), the forks, execs and exits of known
processes are mirrored as they happen: a fork becomes the emulated parent's
``kernel_clone`` even when the child never makes a request, an exec is the task's
``execve`` of the same program (which the emulated rootfs then holds, as an empty file),
an exit runs ``do_exit`` with the process's exit status, and the task is released
then (autoreaped: the parent waits on the host, never in the kernel).  The calls ``kprobefs exec``
hands over (:mod:`.syscallwatch`) are queued here and run on the task before its next
request.

A process whose parent is not known, but one of whose children was a caller (a shell
loop of ``sh -c 'echo … >> kprobe_events'``), is a *spawner*: its next children get
their tasks as they are forked (from init, as any new caller's), while the host still
execs them, rather than at their first request.  Their execs are not mirrored before
that request (a new caller's never is); their comm is copied after each one.  A spawner
three of whose children in a row exited without a request is forgotten.

:class:`HostCallers` is a mixin of :class:`~.gateway.Gateway`, which owns the state
used here (``kernel``, ``_lock``, ``_callers``, ``_events``, the mirrored calls).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple

from ..errors import KernelError, KernelOops, MachineError
from ..machine.abi import AT_FDCWD, O_RDWR
from ..machine.kernel import ProcessExited
from .hostproc import (HostProcess, forget_process, host_comm, host_process,
                       host_start_time, mount_relative_of)
from .procwatch import COMM, EXEC, EXIT, FORK, ProcessEvent, host_exec_image

__all__ = ["Caller", "HostCaller", "HostCallers", "Spawning"]

log = logging.getLogger("kprobefs.fs.gateway")

PR_SET_NAME = 15
#: Kernel directories where no host program is made for a mirrored exec.
_NO_PROGRAMS = ("/proc", "/sys", "/dev")
#: Mirrored calls kept for one process whose task is not there yet (syscallwatch).
MAX_MIRRORED = 256
#: Spawners remembered at once, and the children in a row that made no request after
#: which a spawner is forgotten.
MAX_SPAWNERS = 16
SPAWNER_MISSES = 3


class Caller(NamedTuple):
    """The host process behind a request (fuse_get_context())."""

    pid: int
    uid: int = 0
    gid: int = 0


class Spawning:
    """A task being made: its clone3 is queued, not waited for.  :meth:`get` waits for
    it (once; every later call gives the same task or raises the same error)."""

    def __init__(self, resolve: Callable[[], object]):
        self._resolve = resolve
        self._lock = threading.Lock()
        self._outcome: tuple | None = None

    def get(self):
        with self._lock:
            if self._outcome is None:
                try:
                    self._outcome = (True, self._resolve())
                except OSError as e:
                    self._outcome = (False, e)
        ok, value = self._outcome
        if not ok:
            raise value
        return value

    @property
    def done(self) -> bool:
        return self._outcome is not None and self._outcome[0]


@dataclass(eq=False)
class HostCaller:
    """A host process and its emulated task (``made``: the task, or its spawn still
    under way; :attr:`task` waits for it)."""

    pid: int
    start: int | None
    comm: str
    made: object
    exec_seen: bool = False  # the host process exec'd since its comm was last copied
    cwd: str | None = None   # its host working directory, as last followed
    comm_seen: str = ""      # its comm as its last COMM event gave it
    mirrored: bool = False   # its chdirs are mirrored (syscallwatch), not followed
    #: the spawner whose fork made its task, until its first request (0: none)
    prespawned_by: int = 0

    @property
    def task(self):
        """The emulated task, once made; OSError when it could not be."""
        made = self.made
        if isinstance(made, Spawning):
            made = self.made = made.get()
        return made

    @property
    def has_task(self) -> bool:
        """Whether the task is made (reading :attr:`task` would not wait)."""
        made = self.made
        return not isinstance(made, Spawning) or made.done


class _MirroredCall(NamedTuple):
    """A host call of a process to run on its task (syscallwatch), with the process's
    working directory when it made it."""

    name: str
    args: tuple
    cwd: str


class HostCallers:
    """Callers and their tasks: made, followed, mirrored, ended."""

    #: init's descriptors 0, 1 and 2 are open (:meth:`open_init_stdio`).
    _stdio_ready = False

    def _caller(self, ctx: Caller) -> HostCaller:
        """The caller's task, made on first sight (or when its pid was reused), after the
        host's process events queued so far are applied."""
        pid = ctx.pid if ctx.pid > 0 else os.getpid()
        self._after_releases()
        # What happened before this request is mirrored before it runs: a new process's
        # parent may have forked it an instant ago, a known one's child may have just
        # exec'd and exited (ftracetest's event-no-pid.tc stops tracing right after);
        # the host sent those events before the caller could make its request, but the
        # reader thread may not have taken them off the socket yet.
        self._sync_host_processes(read_socket=True)
        with self._lock:
            known = self._callers.get(pid)
        if known is not None and self._live(known):
            if known.prespawned_by:
                self._spawner_hit(known)
            if known.exec_seen:
                self._rename(known)
            if not known.mirrored:
                known.mirrored = self._is_marked(known.pid, known.start)
            if not known.mirrored:
                self._follow_cwd(known)
            caller = known
        else:
            caller = self._new_caller(pid)
        self._submit_mirrored(caller)
        return caller

    def _live(self, caller: HostCaller) -> bool:
        """Whether the caller's task lives (a spawn under way counts, not waited for);
        a task that could not be made is forgotten, so that the next request tries
        again."""
        if not caller.has_task:
            return True
        try:
            return caller.task.state != "dead"
        except OSError:
            self._forget(caller)
            raise

    def _new_caller(self, pid: int) -> HostCaller:
        """The task of a pid not seen yet (or whose task died): spawned once (clone3
        queued, waited for when the task is first needed), in the host process's
        working directory (the one it had at its first mirrored call still queued, if
        any: that call may have changed it since)."""
        with self._spawn_lock:
            with self._lock:
                known = self._callers.get(pid)
            if known is not None and self._live(known):
                return known
            if known is not None:
                self._forget(known)
            proc = host_process(pid) or HostProcess("", None, None)
            comm = proc.comm or f"pid{pid}"
            parent = self._known_parent(proc.ppid)
            if parent is None:
                self._note_spawner(proc.ppid)
            task = self._start_spawn(comm, pid, parent.task if parent is not None else None)
            # a forked task has its parent's working directory already
            start = proc.start
            caller = HostCaller(pid, start, comm, task,
                                cwd=parent.cwd if parent is not None else None,
                                mirrored=(parent is not None and parent.mirrored)
                                or self._is_marked(pid, start))
            with self._lock:
                self._callers[pid] = caller
            events = self._events
            if events is not None:
                events.watch(pid)       # its forks, execs and exit from now on
            try:
                self._follow_cwd(caller, self._first_mirrored_cwd(pid))
            except OSError:
                self._forget(caller)
                raise
            return caller

    # ---- spawners -------------------------------------------------------------------------
    def _note_spawner(self, ppid: int | None) -> None:
        """The parent of a new caller, itself unknown, is a spawner from now on (see the
        module's docstring): its forks are watched."""
        if not ppid or ppid <= 1 or ppid == os.getpid():
            return
        with self._lock:
            spawners = self._spawners
            if ppid in spawners:
                spawners[ppid] = 0
                return
            if len(spawners) >= MAX_SPAWNERS:
                del spawners[next(iter(spawners))]
            spawners[ppid] = 0
        events = self._events
        if events is not None:
            events.watch(ppid)

    def _spawner_hit(self, caller: HostCaller) -> None:
        """A child a spawner's fork made a task for makes its first request."""
        with self._lock:
            if caller.prespawned_by in self._spawners:
                self._spawners[caller.prespawned_by] = 0
            caller.prespawned_by = 0
        self.stats["prespawn_hits"] += 1

    def _spawner_miss(self, spawner: int) -> None:
        """A child of spawner exited without a request."""
        with self._lock:
            misses = self._spawners.get(spawner)
            if misses is None:
                return
            if misses + 1 >= SPAWNER_MISSES:
                del self._spawners[spawner]
            else:
                self._spawners[spawner] = misses + 1

    def _prespawn(self, pid: int, spawner: int) -> None:
        """The spawner forked pid: its task is made now, before its first request (the
        calling thread, the process events' reader, runs the clone3 itself: handed to
        the machine thread, it cost as much as it saved)."""
        with self._spawn_lock:
            with self._lock:
                if pid in self._callers:
                    return
            proc = host_process(pid)
            if proc is None:
                self._spawner_miss(spawner)     # gone already, without a request
                return
            comm = proc.comm or f"pid{pid}"
            task = self._start_spawn(comm, pid, None)
            caller = HostCaller(pid, proc.start, comm, task,
                                mirrored=self._is_marked(pid, proc.start),
                                prespawned_by=spawner)
            with self._lock:
                self._callers[pid] = caller
        self._forked(pid)
        self.stats["prespawned"] += 1
        try:
            caller.task         # this thread runs the clone3, as a request's would
        except OSError as e:
            log.debug("pid %d: no task made at its fork: %s", pid, e)

    def _forked(self, pid: int) -> None:
        """pid's task was made at its fork: the scheduling mirror needs no sample of it
        there (see schedwatch)."""
        sched = self.sched
        if sched is not None:
            sched.forked(pid)

    def _follow_cwd(self, caller: HostCaller, cwd: str | None = None) -> None:
        """A host process that changed its working directory into the mount (``cd
        /sys/kernel/tracing``) has its task chdir(2) there too, as Linux's tracefs
        sees a ``cd`` into it (sys_enter_chdir); a directory outside the mount is not
        followed.  Requests use absolute paths, so nothing else depends on it.  The
        chdirs of a mirrored process are its own (syscallwatch): it is followed only
        when its task is made.  ``cwd``: the directory to follow (default: the host
        process's now)."""
        if caller.pid == os.getpid():
            return
        try:
            cwd = cwd or os.readlink(f"/proc/{caller.pid}/cwd")
        except OSError:
            return
        if cwd == caller.cwd:
            return
        caller.cwd = cwd
        path = mount_relative_of(caller.pid, cwd)
        if path is not None:
            try:
                self._sys(caller, "chdir", self.kernel_path(path))
            except OSError as e:
                log.debug("pid %d: chdir to %s: %s", caller.pid, path, e)

    # ---- mirrored host calls (syscallwatch) ---------------------------------------------
    def mark_mirrored(self, pid: int) -> None:
        """The calls of pid (and of the processes it starts) are mirrored from now on:
        its working directory is no longer followed.  Never waits on the machine."""
        start = host_start_time(pid)
        with self._mirror_lock:
            self._mirror_marks[pid] = start
        events = self._events
        if events is not None:
            events.watch(pid)

    def _is_marked(self, pid: int, start: int | None) -> bool:
        with self._mirror_lock:
            return pid in self._mirror_marks and self._mirror_marks[pid] == start

    def mirror(self, call) -> None:
        """Queues a host process's call (a syscallwatch.HostCall: pid, name, args, cwd)
        for its task: submitted, in order, before that process's next request, or by
        :meth:`flush_mirrored`.  Never waits on the machine."""
        self.mark_mirrored(call.pid)
        with self._mirror_lock:
            pending = self._mirror_pending.setdefault(call.pid, collections.deque())
            if len(pending) >= MAX_MIRRORED:
                log.warning("pid %d: mirrored %s dropped (%d calls wait for its task)",
                            call.pid, pending.popleft().name, len(pending))
            pending.append(_MirroredCall(call.name, tuple(call.args), call.cwd))

    def flush_mirrored(self, pid: int) -> None:
        """Submits pid's queued mirrored calls (its task made first when there is none;
        that may wait on the machine).  Calls of a process that is gone are dropped."""
        with self._mirror_lock:
            if not self._mirror_pending.get(pid):
                return
            start = self._mirror_marks.get(pid)
        if start is None or host_start_time(pid) != start:
            with self._mirror_lock:
                self._mirror_pending.pop(pid, None)
            return
        self._caller(Caller(pid))

    def _first_mirrored_cwd(self, pid: int) -> str | None:
        with self._mirror_lock:
            pending = self._mirror_pending.get(pid)
            return pending[0].cwd if pending else None

    def _submit_mirrored(self, caller: HostCaller) -> None:
        """Queues the caller's mirrored calls on its task (not waited for), before the
        request it is about to make."""
        with self._mirror_lock:
            if caller.pid not in self._mirror_pending:
                return
        task = caller.task          # made first: its spawn may still be under way
        with self._mirror_lock:
            pending = self._mirror_pending.pop(caller.pid, None)
            for call in pending or ():
                try:
                    self.kernel.submit(task, call.name, *call.args)
                except (ProcessExited, MachineError, KernelError, ValueError) as e:
                    log.warning("pid %d: mirrored %s%r not run: %s", caller.pid,
                                call.name, call.args, e)
                    return
                self.stats["mirrored"] += 1

    def emulated_directory(self, pid: int, path: str, cwd: str) -> str | None:
        """The filename a task passes for a directory ``path`` that the host process pid
        names from its working directory ``cwd``: the same string when it names the
        same place in the emulated kernel, else that place's absolute path; None when
        the directory is outside the mount."""
        target = os.path.normpath(os.path.join(cwd, path))
        rel = mount_relative_of(pid, target)
        if rel is None:
            return None
        kpath = self.kernel_path(rel)
        if os.path.isabs(path):
            return path if os.path.normpath(path) == kpath else kpath
        # the task's working directory mirrors the process's inside the mount
        return path if mount_relative_of(pid, cwd) is not None else kpath

    def _known_parent(self, ppid: int | None) -> HostCaller | None:
        """The caller of host pid ppid (a process's parent), if that one is known and its
        task lives."""
        with self._lock:
            parent = self._callers.get(ppid) if ppid else None
        try:
            return parent if parent is not None and self._live(parent) else None
        except OSError:
            return None

    def _rename(self, caller: HostCaller) -> None:
        """Copies the host process's comm to its task after an exec (prctl PR_SET_NAME,
        the kernel's own rename)."""
        caller.exec_seen = False
        # The comm its EXEC or COMM event brought (read as the event came, and every
        # later rename brings one of its own), else the one it has now.
        comm = caller.comm_seen or host_comm(caller.pid)
        if not comm or comm == caller.comm:
            return
        try:
            self._call(caller.task, "prctl", PR_SET_NAME, comm.encode()[:15] + b"\0")
        except (ProcessExited, KernelOops, OSError) as e:
            log.debug("renaming the task of pid %d failed: %s", caller.pid, e)
            return
        caller.comm = comm
        caller.task.comm = comm

    # ---- host process events ---------------------------------------------------------
    def mirror_host_processes(self) -> None:
        """Applies the host process events queued so far and gives exec'd processes
        their new comm now, not at their next request (the process events' reader calls
        it after each batch, the scheduling mirror before each sample: what the reader
        thread has queued, without a read of the socket of its own)."""
        self._sync_host_processes(read_socket=False)
        with self._lock:
            # Those an EXEC or COMM event renamed.  A child just forked is exec_seen too
            # (its first request reads its comm), but the comm it has now may be that
            # of an exec whose event is still to come: the mirrored execve names it.
            execd = [c for c in self._callers.values() if c.exec_seen and c.comm_seen]
        for caller in execd:
            if caller.has_task and caller.task.state != "dead":
                self._rename(caller)

    def _sync_host_processes(self, read_socket: bool = True) -> None:
        """Applies every host process event queued so far, in order (see procwatch);
        with read_socket False, those its reader thread has queued."""
        if self._events is None:
            return
        with self._events_lock:
            events = self._events
            if events is None:
                return
            for event in events.drain(read_socket):
                try:
                    self._apply_process_event(event)
                except OSError as e:
                    log.warning("host process event %s not mirrored: %s", event, e)

    def _apply_process_event(self, event: ProcessEvent) -> None:
        if event.what == FORK:
            if event.child != event.child_tgid:
                return  # a new thread: it becomes a task at its first request
            with self._lock:
                parent = self._callers.get(event.pid) or self._callers.get(event.tgid)
                child = self._callers.get(event.child)
                spawner = next((p for p in (event.tgid, event.pid) if p in self._spawners),
                               0) if parent is None else 0
            if spawner and child is None:
                self._prespawn(event.child, spawner)
                return
            if parent is None or parent.task.state == "dead":
                return
            if child is not None:
                if child.task.state != "dead":
                    return
                self._forget(child)
            with self._spawn_lock:
                task = self._start_spawn(parent.comm, event.child, parent.task)
                caller = HostCaller(event.child, host_start_time(event.child),
                                    parent.comm, task, exec_seen=True, cwd=parent.cwd,
                                    mirrored=parent.mirrored)
                with self._lock:
                    self._callers[event.child] = caller
            self._forked(event.child)
            # Its clone3 runs now, in this thread, while the host child goes on to its
            # exec: left queued, it ran when the EXEC was applied, and the child's
            # first request waited for both.
            try:
                caller.task
            except OSError as e:
                log.debug("pid %d: no task made at its fork: %s", event.child, e)
        elif event.what in (EXEC, COMM):
            with self._lock:
                caller = self._callers.get(event.pid)
            if caller is not None:
                caller.comm_seen = event.comm or caller.comm_seen
                if caller.prespawned_by:
                    caller.exec_seen = True     # renamed after this batch, not exec'd
                elif caller.task.state != "dead":
                    self._exec(caller)
        elif event.what == EXIT:
            with self._lock:
                caller = self._callers.get(event.pid)
                if event.pid == event.tgid:
                    self._spawners.pop(event.pid, None)
            if event.pid == event.tgid:
                forget_process(event.pid)
            if caller is not None and caller.prespawned_by:
                self._spawner_miss(caller.prespawned_by)
            if caller is not None and caller.pid != os.getpid():
                if caller.exec_seen:    # exec'd and gone within one batch of events
                    self._rename(caller)
                self._end(caller, event.exit_code)

    def _exec(self, caller: HostCaller) -> None:
        """Mirrors a host exec as the task's execve of the program the process runs now
        (made in the emulated rootfs first, so that the kernel's lookup finds it):
        sys_enter_execve and sched_process_exec show it, and the kernel takes the comm
        from its name.  When that cannot be done (the process is gone, the path is not
        one the rootfs can hold), the task is renamed at its next request instead."""
        caller.exec_seen = True
        comm = caller.comm_seen or host_comm(caller.pid)
        image = host_exec_image(caller.pid, comm) if comm else None
        upcall = getattr(self.kernel, "upcall", None)
        if image is None or upcall is None:
            return
        filename, argv = image
        if any(filename.startswith(d + "/") for d in _NO_PROGRAMS):
            return      # the kernel's own mounts: no file is made there
        try:
            known = filename in self._programs
            if not known and not self._make_program(filename):
                return
            ret = self._call(caller.task, "execve", filename, argv, [])
            if ret == -errno.ENOENT and known:      # removed since: made again
                self._programs.discard(filename)
                if self._make_program(filename):
                    ret = self._call(caller.task, "execve", filename, argv, [])
        except (ProcessExited, KernelOops, KernelError, MachineError, OSError) as e:
            log.debug("mirroring the exec of pid %d failed: %s", caller.pid, e)
            return
        if ret < 0:
            log.debug("execve of %s for pid %d failed: %d", filename, caller.pid, ret)
            return
        caller.exec_seen = False
        caller.comm = caller.task.comm = os.path.basename(filename)[:15]

    def _make_program(self, filename: str) -> bool:
        """Makes filename an (empty) program of the emulated rootfs; whether it is one.
        Remembered, so that the next exec of it is one machine call, not two; but not
        under /tmp, which the mount and the workload change (an execve that finds
        a remembered one gone makes it again)."""
        if self.kernel.upcall("host_binary_create", filename, timeout=self.timeout) < 0:
            return False
        if not filename.startswith("/tmp/"):
            self._programs.add(filename)
        return True

    def _start_spawn(self, comm: str, pid: int, parent=None):
        """The task for host pid (or its spawn under way, a :class:`Spawning`): its
        clone3 is queued now and runs when the task is first needed, in the thread
        that needs it (or on the machine thread's next turn, whichever comes first):
        a request that makes no system call (a lookup) does not wait for it."""
        start = getattr(self.kernel, "start_spawn", None)
        if start is None:
            return self._spawn(comm, pid, parent)
        if parent is None:
            self.open_init_stdio()
        forked_from = {} if parent is None else {"parent": parent}
        try:
            req = start(comm, pid=pid, wake=False, autoreap=True, **forked_from)
        except (ProcessExited, KernelError, MachineError):
            return self._spawn(comm, pid, parent)   # it sorts each case out

        def resolve():
            try:
                return self.kernel.spawned(req, timeout=self.timeout)
            except KernelError as e:
                log.debug("pid %d is not available in the emulated kernel (%s)", pid, e)
                return self._spawn(comm, pid, parent, with_pid=False)
            except MachineError as e:
                if parent is None:
                    raise OSError(errno.EIO, f"cannot create a task: {e}") from e
                log.warning("pid %d: its parent's task cannot fork (%s); forking from "
                            "init", pid, e)
                return self._spawn(comm, pid, None)

        return Spawning(resolve)

    def open_init_stdio(self) -> None:
        """Opens init's descriptors 0, 1 and 2 on /dev/null, once (6.1's init has the
        console on them): every task forked from init inherits them, as a host process
        has its standard ones, so the first file a process opens is fd 3 in the
        emulated kernel as it was on the host (opensnoop's FD), at no cost per task.
        The daemon calls it at boot; else the first task made from init does (under
        the spawn lock)."""
        if self._stdio_ready:
            return
        init = self.kernel.init_task
        while True:
            fd = self.kernel.syscall(init, "openat", AT_FDCWD, "/dev/null", O_RDWR, 0,
                                     timeout=self.timeout)
            if fd < 0:
                log.warning("init's standard descriptors: /dev/null: %s",
                            os.strerror(-fd))
                break
            if fd > 2:
                self.kernel.syscall(init, "close", fd, timeout=self.timeout)
            if fd >= 2:
                break
        self._stdio_ready = True

    def _spawn(self, comm: str, pid: int, parent=None, with_pid: bool = True):
        """The task for host pid, made now: with that pid when the kernel has it free
        (and with_pid), else an automatic one; from parent's task, else (or when it
        cannot fork) init's."""
        # the parent only when there is one: kernel.spawn forks from init by default
        forked_from = {} if parent is None else {"parent": parent}
        try:
            if with_pid:
                return self.kernel.spawn(comm, pid=pid, timeout=self.timeout,
                                         autoreap=True, **forked_from)
        except KernelError as e:
            log.debug("pid %d is not available in the emulated kernel (%s)", pid, e)
        except MachineError as e:
            if parent is None:
                raise OSError(errno.EIO, f"cannot create a task: {e}") from e
            # The parent's task cannot fork (stuck on a wedged CPU): fork from init.
            log.warning("pid %d: its parent's task cannot fork (%s); forking from init",
                        pid, e)
            forked_from = {}
            try:
                return self.kernel.spawn(comm, pid=pid, timeout=self.timeout,
                                         autoreap=True)
            except KernelError as e2:
                log.debug("pid %d is not available in the emulated kernel (%s)", pid, e2)
            except MachineError as e2:
                raise OSError(errno.EIO, f"cannot create a task: {e2}") from e2
        try:
            task = self.kernel.spawn(comm, timeout=self.timeout, autoreap=True,
                                     **forked_from)
        except KernelError as e:
            # EAGAIN when the kernel's task table is full (Kernel.MAX_TASKS), as a fork
            # at RLIMIT_NPROC: the request fails with it and the next one tries again.
            log.error("cannot create a task for pid %d (%s): %s", pid, comm, e)
            raise OSError(e.errno or errno.EIO, f"cannot create a task: {e}") from e
        except MachineError as e:
            log.error("cannot create a task for pid %d (%s): %s", pid, comm, e)
            raise OSError(errno.EIO, f"cannot create a task: {e}") from e
        log.info("host pid %d (%s) runs as emulated pid %d", pid, comm, task.pid)
        return task

    def _forget(self, caller: HostCaller) -> None:
        """Drops a caller and its fds (its task is dead or about to be)."""
        with self._lock:
            if self._callers.get(caller.pid) is caller:
                del self._callers[caller.pid]
            for of in self._files.values():
                fd = of.fds.get(caller.pid)
                if fd is not None and fd.caller is caller:
                    del of.fds[caller.pid]

    def reap(self) -> int:
        """Ends the task of every host process that is gone (or whose pid now belongs to
        another process); returns how many were ended."""
        with self._lock:
            callers = list(self._callers.values())
        gone = [c for c in callers
                if c.pid != os.getpid() and host_start_time(c.pid) != c.start]
        for caller in gone:
            self._end(caller)
        with self._mirror_lock:
            marks = list(self._mirror_marks.items())
        for pid, start in marks:
            if host_start_time(pid) != start:
                with self._mirror_lock:
                    if self._mirror_marks.get(pid) == start:
                        del self._mirror_marks[pid]
                        self._mirror_pending.pop(pid, None)
        return len(gone)

    def _end(self, caller: HostCaller, status: int = 0) -> None:
        """Ends the caller's task with the host process's wait status: an exit code
        through the exit system call; a death by a signal through host_task_killed, so
        that the task dies of the same signal (its parent hears CLD_KILLED) without a
        signal_generate: who sent it is not known here (the host's kill(2) makes no
        process event)."""
        self._forget(caller)
        try:
            if caller.task.state == "dead":
                return
        except OSError:
            return      # it was never made
        upcall = getattr(self.kernel, "upcall", None)
        try:
            if status & 0x7f and upcall is not None:
                upcall("host_task_killed", caller.task.pid, status, timeout=self.timeout)
            # After a kill this call never runs: it fails as the task exits.
            self._call(caller.task, "exit", (status >> 8) & 0xff)
        except (ProcessExited, KernelOops):
            pass  # the expected outcome: the task is gone
        except (OSError, KernelError, MachineError) as e:
            log.warning("task of pid %d did not exit: %s", caller.pid, e)
        else:
            log.warning("exit returned for pid %d", caller.pid)

    def tasks(self) -> dict[int, object]:
        """Host pid -> emulated task, for the callers known now whose task is made."""
        with self._lock:
            return {pid: c.task for pid, c in self._callers.items() if c.has_task}

    def close(self) -> None:
        """Ends every task (their files close in do_exit) and releases what is left."""
        self._closing.set()
        with self._events_lock:
            events, self._events = self._events, None
        if events is not None:
            events.close()
        with self._lock:
            callers = list(self._callers.values())
            self._files.clear()
        for caller in callers:
            self._end(caller)
