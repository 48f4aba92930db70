"""The syscall gateway: each filesystem request of a host process runs as a system call of
the emulated kernel, made by a task with that process's pid and comm.  No FUSE here.

A pid seen for the first time becomes a task through ``kernel.spawn(comm, pid=hostpid)``
(kernel_clone via clone3's set_tid; an automatic pid when that one is taken), forked from
the task of its host parent when that one is known.  With the host's process events
(:mod:`.procwatch`), the forks, execs and exits of known processes are mirrored as they
happen: a fork becomes the emulated parent's ``kernel_clone`` even when the child never
makes a request, an exec is the task's ``execve`` of the same program (which the
emulated rootfs then holds, as an empty file), an exit runs ``do_exit`` with the
process's exit status.  open is
``openat``, read is ``lseek`` + ``read``, write is ``lseek`` + ``write``, release is
``close``, readdir is ``getdents64``, getattr is ``newfstatat``.  Tasks whose host process
has gone exit through the ``exit`` system call (do_exit) when :meth:`Gateway.reap` runs.

One file is the daemon's own and never reaches the kernel: ``kprobefs/status``, the
daemon's health (``status``, a callable the daemon passes), answered even when the
machine is stuck.

Paths are mount-relative (``/tracing/trace``) and mapped onto the emulated kernel's own
mounts: the mount root is debugfs (``/sys/kernel/debug``), ``tracing/`` is tracefs
(``/sys/kernel/tracing``) and ``proc/`` is procfs (``/proc``); ``dev/`` and ``tmp/`` are
the kernel's ``/dev`` (``null``, ``zero``) and its ramfs ``/tmp``, where a host process
makes the kernel's own file operations (a test's ``echo > MNT/dev/null`` is an
``openat`` of ``"/dev/null"`` through ``do_sys_open``; ``ln -s`` in ``MNT/tmp`` is a
``symlinkat`` through ``vfs_symlink``).

Threads: every public method may run on any thread at once.  Machine access goes through
``kernel.submit`` and a bounded ``kernel.wait`` (in the daemon the machine thread runs
the call; the request thread only waits); nothing here holds the gateway's own lock
while the machine runs.  Blocking reads (``trace_pipe``) wait on
the host handle in the calling thread, never in the emulation.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..errors import KernelError, KernelOops, KernelStuck, KernelWedged, MachineError
from ..machine.kernel import ProcessExited, UserBuffer
from .hostproc import (HostProcess, host_comm, host_process, host_signal_pending,
                       host_start_time, mount_relative_of)
from .procwatch import COMM, EXEC, EXIT, FORK, ProcessEvent, ProcessEvents, host_exec_image
from .tree import DEBUGFS_ROOT, HostFS

__all__ = ["Gateway", "Caller", "Attributes"]

log = logging.getLogger("kprobefs.fs.gateway")

AT_FDCWD = -100
SEEK_SET = 0
O_ACCMODE = 0o3
O_CREAT, O_EXCL, O_TRUNC, O_APPEND = 0o100, 0o200, 0o1000, 0o2000
O_NONBLOCK, O_DIRECTORY = 0o4000, 0o200000
PR_SET_NAME = 15
#: Open flags passed on to the emulated kernel; the rest (O_LARGEFILE, O_NOATIME, …)
#: mean nothing to a pseudo-file.
_PASSED_FLAGS = O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_APPEND | O_NONBLOCK | O_DIRECTORY

_STAT = struct.Struct("<QQQIIIiQqqqqqqqqq24x")  # struct stat, x86_64 (144 bytes)
_DIRENT = struct.Struct("<QqHB")  # linux_dirent64 header: d_ino, d_off, d_reclen, d_type
_DT_TO_MODE = {4: stat.S_IFDIR, 8: stat.S_IFREG, 10: stat.S_IFLNK}

#: Largest read or write handed to the kernel at once (the task's user window is 16 MiB).
MAX_IO = 1 << 20
DIR_BUFFER = 32 * 1024

#: Where each mount-relative prefix lives in the emulated kernel.
DEBUGFS_PATH = "/sys/kernel/debug"
TRACEFS_PATH = "/sys/kernel/tracing"
PROC_PATH = "/proc"
#: Kernel directories where no host program is made for a mirrored exec.
_NO_PROGRAMS = ("/proc", "/sys", "/dev")
#: Top-level names the mount root shows beside debugfs' own entries, and the kernel
#: directories they are.
ROOT_DIRS = {"proc": PROC_PATH, "dev": "/dev", "tmp": "/tmp"}
#: Mirrored calls kept for one process whose task is not there yet (syscallwatch).
MAX_MIRRORED = 256
#: The daemon's own file (see the module docstring).
STATUS_PATH = "/kprobefs/status"
AT_SYMLINK_NOFOLLOW = 0x100
NAME_MAX = 255
#: Mount-relative places that are the roots of the kernel's debugfs and tracefs mounts.
_MOUNT_ROOTS = ((), ("tracing",))


class Caller(NamedTuple):
    """The host process behind a request (fuse_get_context())."""

    pid: int
    uid: int = 0
    gid: int = 0


class Attributes(NamedTuple):
    """What getattr reports (from the emulated kernel's newfstatat)."""

    mode: int
    ino: int
    nlink: int
    atime: float
    mtime: float
    ctime: float


class _Spawning:
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
class _Caller:
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

    @property
    def task(self):
        """The emulated task, once made; OSError when it could not be."""
        made = self.made
        if isinstance(made, _Spawning):
            made = self.made = made.get()
        return made

    @property
    def has_task(self) -> bool:
        """Whether the task is made (reading :attr:`task` would not wait)."""
        made = self.made
        return not isinstance(made, _Spawning) or made.done


@dataclass(eq=False)
class _Fd:
    """An emulated file descriptor of one task for one FUSE open."""

    caller: _Caller
    fd: int
    pos: int = 0
    handle: object = None  # the host handle behind it, for wait()
    lock: threading.Lock = field(default_factory=threading.Lock)


class _MirroredCall(NamedTuple):
    """A host call of a process to run on its task (syscallwatch), with the process's
    working directory when it made it."""

    name: str
    args: tuple
    cwd: str


@dataclass(eq=False)
class _OpenFile:
    """One FUSE open (one fh): the kernel path, the flags, and an emulated fd per pid
    that used it (a host process inherits open files across fork)."""

    path: str
    flags: int
    fds: dict = field(default_factory=dict)  # host pid -> _Fd
    opener: int = 0
    text: bytes | None = None                # the daemon's own file: its contents


class Gateway:
    """Runs filesystem requests as system calls of the emulated kernel.

    ``timeout`` bounds each machine call (then EIO, logged); ``wait_slice`` is how long a
    blocking reader sleeps on its handle before checking that its process still lives.
    Errors are raised as OSError with the errno the emulated kernel returned.
    """

    def __init__(self, kernel, hostfs: HostFS, timeout: float = 30.0,
                 wait_slice: float = 0.5, status: Callable[[], str] | None = None):
        self.kernel = kernel
        self.hostfs = hostfs
        self.timeout = timeout
        self.wait_slice = wait_slice
        self.status = status
        #: calls, failed (EIO: the machine failed, was stuck or timed out), timed_out
        self.stats: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        self._spawn_lock = threading.Lock()
        self._callers: dict[int, _Caller] = {}
        self._files: dict[int, _OpenFile] = {}
        self._next_fh = 1
        self._closing = threading.Event()
        self._events: ProcessEvents | None = None
        self._events_lock = threading.Lock()
        #: The scheduling mirror (schedwatch.SchedWatch), told when a process is inside
        #: one of our requests; None: none.
        self.sched = None
        # Mirrored host calls not submitted yet (pid -> deque) and the processes whose
        # calls are mirrored (pid -> start time); never held while the machine runs.
        self._mirror_lock = threading.Lock()
        self._mirror_pending: dict[int, collections.deque] = {}
        self._mirror_marks: dict[int, int | None] = {}

    def watch_host_processes(self, events: ProcessEvents | None) -> None:
        """Mirror the host's process events from now on (None: stop)."""
        with self._events_lock:
            self._events = events

    # ==== paths ==============================================================================
    @staticmethod
    def kernel_path(path: str) -> str:
        """The emulated kernel's path for a mount-relative path."""
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] in ROOT_DIRS:
            return "/".join([ROOT_DIRS[parts[0]]] + parts[1:])
        if parts and parts[0] == "tracing":
            return "/".join([TRACEFS_PATH] + parts[1:])
        return "/".join([DEBUGFS_PATH] + parts)

    # ==== machine calls ======================================================================
    def _call(self, task, name: str, *args, on_done=None) -> int:
        """Runs one system call for task and returns its raw result; OSError(EIO) when the
        machine fails, is stuck, or does not finish it within the timeout (then the
        machine is told to kill the task, see Kernel.abandon).  ProcessExited and
        KernelOops pass through."""
        kernel = self.kernel
        try:
            req = kernel.submit(task, name, *args, on_done=on_done)
        except ProcessExited:
            raise
        except (MachineError, KernelError) as e:
            log.error("%s for pid %d could not be queued: %s", name, task.pid, e)
            raise OSError(errno.EIO, str(e)) from e
        self.stats["calls"] += 1
        try:
            return kernel.wait(req, self.timeout)
        except KernelStuck as e:
            self.stats["failed"] += 1
            log.error("%s for pid %d failed at once: %s", name, task.pid, e)
            raise OSError(errno.EIO, str(e)) from e
        except KernelWedged as e:
            self.stats["failed"] += 1
            self.stats["timed_out"] += 1
            log.error("%s for pid %d (%s) did not finish within %.1f s: %s", name,
                      task.pid, getattr(task, "comm", ""), self.timeout, e)
            abandon = getattr(kernel, "abandon", None)
            if abandon is not None:
                abandon(req, self.timeout)
            raise OSError(errno.EIO, f"{name} timed out") from e
        except KernelOops as e:
            log.error("%s oopsed for pid %d: %s", name, task.pid, e)
            raise
        except MachineError as e:
            self.stats["failed"] += 1
            log.error("the machine failed during %s: %s", name, e)
            raise OSError(errno.EIO, str(e)) from e

    def _sys(self, caller: _Caller, name: str, *args, on_done=None) -> int:
        """Like _call, for a caller's task; a task that died meanwhile (oops) is forgotten
        and the request fails with EIO.  Negative results raise OSError."""
        try:
            with self._serving(caller.pid):
                ret = self._call(caller.task, name, *args, on_done=on_done)
        except (ProcessExited, KernelOops) as e:
            self._forget(caller)
            how = "exited during" if isinstance(e, ProcessExited) else "oopsed in"
            raise OSError(errno.EIO, f"the task {how} {name}") from e
        if -4095 <= ret < 0:
            raise OSError(-ret, os.strerror(-ret))
        return ret

    @contextlib.contextmanager
    def _serving(self, pid: int):
        """pid is inside one of our requests meanwhile: the scheduling mirror leaves it
        alone (its task runs the request; its host process waits for us)."""
        sched = self.sched
        if sched is None:
            yield
            return
        sched.enter(pid)
        try:
            yield
        finally:
            sched.leave(pid)

    # ==== tasks ==============================================================================
    def _caller(self, ctx: Caller) -> _Caller:
        """The caller's task, made on first sight (or when its pid was reused), after the
        host's process events queued so far are applied."""
        pid = ctx.pid if ctx.pid > 0 else os.getpid()
        with self._lock:
            known = self._callers.get(pid)
        # A new process's parent may have forked it an instant ago: its FORK event is
        # read off the socket now.  A known one's own events are the reader's.
        self._sync_host_processes(read_socket=known is None)
        with self._lock:
            known = self._callers.get(pid)
        if known is not None and self._live(known):
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

    def _live(self, caller: _Caller) -> bool:
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

    def _new_caller(self, pid: int) -> _Caller:
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
            task = self._start_spawn(comm, pid, parent.task if parent is not None else None)
            # a forked task has its parent's working directory already
            start = proc.start
            caller = _Caller(pid, start, comm, task,
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

    def _follow_cwd(self, caller: _Caller, cwd: str | None = None) -> None:
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

    def _submit_mirrored(self, caller: _Caller) -> None:
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

    def _known_parent(self, ppid: int | None) -> _Caller | None:
        """The caller of host pid ppid (a process's parent), if that one is known and its
        task lives."""
        with self._lock:
            parent = self._callers.get(ppid) if ppid else None
        try:
            return parent if parent is not None and self._live(parent) else None
        except OSError:
            return None

    def _rename(self, caller: _Caller) -> None:
        """Copies the host process's comm to its task after an exec (prctl PR_SET_NAME,
        the kernel's own rename)."""
        caller.exec_seen = False
        # A process gone already (it exec'd and exited between two drains) has the comm
        # of its COMM event.
        comm = host_comm(caller.pid) or caller.comm_seen
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
        their new comm now, not at their next request (the scheduling mirror calls it
        before each sample: what the reader thread has queued, without a read of the
        socket of its own)."""
        self._sync_host_processes(read_socket=False)
        with self._lock:
            execd = [c for c in self._callers.values() if c.exec_seen]
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
            if parent is None or parent.task.state == "dead":
                return
            if child is not None:
                if child.task.state != "dead":
                    return
                self._forget(child)
            with self._spawn_lock:
                task = self._start_spawn(parent.comm, event.child, parent.task)
                caller = _Caller(event.child, host_start_time(event.child), parent.comm,
                                 task, exec_seen=True, cwd=parent.cwd,
                                 mirrored=parent.mirrored)
                with self._lock:
                    self._callers[event.child] = caller
        elif event.what in (EXEC, COMM):
            with self._lock:
                caller = self._callers.get(event.pid)
            if caller is not None:
                caller.comm_seen = event.comm or caller.comm_seen
                if caller.task.state != "dead":
                    self._exec(caller)
        elif event.what == EXIT:
            with self._lock:
                caller = self._callers.get(event.pid)
            if caller is not None and caller.pid != os.getpid():
                if caller.exec_seen:    # exec'd and gone within one batch of events
                    self._rename(caller)
                self._end(caller, event.exit_code)

    def _exec(self, caller: _Caller) -> None:
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
            if upcall("host_binary_create", filename, timeout=self.timeout) < 0:
                return
            ret = self._call(caller.task, "execve", filename, argv, [])
        except (ProcessExited, KernelOops, KernelError, MachineError, OSError) as e:
            log.debug("mirroring the exec of pid %d failed: %s", caller.pid, e)
            return
        if ret < 0:
            log.debug("execve of %s for pid %d failed: %d", filename, caller.pid, ret)
            return
        caller.exec_seen = False
        caller.comm = caller.task.comm = os.path.basename(filename)[:15]

    def _start_spawn(self, comm: str, pid: int, parent=None):
        """The task for host pid (or its spawn under way, a :class:`_Spawning`): its
        clone3 is queued now and waited for when the task is first needed, so that it
        runs while the request that asked for it is answered."""
        start = getattr(self.kernel, "start_spawn", None)
        if start is None:
            return self._spawn(comm, pid, parent)
        forked_from = {} if parent is None else {"parent": parent}
        try:
            req = start(comm, pid=pid, **forked_from)
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

        return _Spawning(resolve)

    def _spawn(self, comm: str, pid: int, parent=None, with_pid: bool = True):
        """The task for host pid, made now: with that pid when the kernel has it free
        (and with_pid), else an automatic one; from parent's task, else (or when it
        cannot fork) init's."""
        # the parent only when there is one: kernel.spawn forks from init by default
        forked_from = {} if parent is None else {"parent": parent}
        try:
            if with_pid:
                return self.kernel.spawn(comm, pid=pid, timeout=self.timeout,
                                         **forked_from)
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
                return self.kernel.spawn(comm, pid=pid, timeout=self.timeout)
            except KernelError as e2:
                log.debug("pid %d is not available in the emulated kernel (%s)", pid, e2)
            except MachineError as e2:
                raise OSError(errno.EIO, f"cannot create a task: {e2}") from e2
        try:
            task = self.kernel.spawn(comm, timeout=self.timeout, **forked_from)
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

    def _forget(self, caller: _Caller) -> None:
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

    def _end(self, caller: _Caller, status: int = 0) -> None:
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

    # ==== requests ===========================================================================
    def _is_status(self, path: str) -> bool:
        return self.status is not None and path == STATUS_PATH

    def getattr(self, path: str, ctx: Caller) -> Attributes:
        """What the kernel's newfstatat gives for path.  Most of these are the host's
        path walk (a LOOKUP per component) rather than a stat(2) of the caller's: the
        debugfs and tracefs names are answered from the host tree the kernel's hostfs
        serves (the same mode and link count, without a system call); proc, dev and
        tmp are the kernel's own and are asked of it."""
        if self._is_status(path):
            now = time.time()
            return Attributes(stat.S_IFREG | 0o444, 0x6b70, 1, now, now, now)
        buf = UserBuffer(_STAT.size)
        try:
            caller = self._caller(ctx)
            parts = [p for p in path.split("/") if p]
            if not parts or parts[0] not in ROOT_DIRS:
                return self._host_attributes(parts)
            self._sys(caller, "newfstatat", AT_FDCWD, self.kernel_path(path), buf,
                      AT_SYMLINK_NOFOLLOW)
        except OSError as e:
            # The way to the status file stays open when the machine does not answer.
            if e.errno != errno.EIO or self.status is None or \
                    path.rstrip("/") not in ("", os.path.dirname(STATUS_PATH)):
                raise
            now = time.time()
            return Attributes(stat.S_IFDIR | 0o755, 1, 2, now, now, now)
        (_dev, ino, nlink, mode, _uid, _gid, _pad, _rdev, _size, _blksize, _blocks,
         at, atn, mt, mtn, ct, ctn) = _STAT.unpack(buf.data[:_STAT.size])
        return Attributes(mode, ino, nlink, at + atn / 1e9, mt + mtn / 1e9, ct + ctn / 1e9)

    def _host_attributes(self, parts: list[str]) -> Attributes:
        """Attributes of the debugfs name at parts, from the host tree, as the kernel's
        hostfs makes its inode (hostfs_lookup_host, new_inode: one link, a node that
        is neither a directory nor a file shown as a file)."""
        for part in parts:
            if len(part.encode("utf-8", "surrogateescape")) > NAME_MAX:
                raise OSError(errno.ENAMETOOLONG, "File name too long")
        stuck = getattr(self.kernel, "stuck", None)
        if stuck is not None:
            self.stats["failed"] += 1
            raise OSError(errno.EIO, f"the machine is stuck: {stuck}")
        node_id, mode = self.hostfs.stat_path(DEBUGFS_ROOT, parts, self.timeout)
        if tuple(parts) in _MOUNT_ROOTS:
            mode = stat.S_IFDIR | 0o700     # the mount's root (hostfs_fill_super)
        elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            mode = stat.S_IFREG | stat.S_IMODE(mode)
        return Attributes(mode, node_id, 1, 0.0, 0.0, 0.0)

    def readdir(self, path: str, ctx: Caller) -> list[tuple[str, int]]:
        """[(name, st_mode type bits)] including ``.`` and ``..``; the mount root also
        lists ``proc``, ``dev`` and ``tmp``."""
        caller = self._caller(ctx)
        fd = self._sys(caller, "openat", AT_FDCWD, self.kernel_path(path),
                       O_DIRECTORY, 0)
        entries = []
        try:
            while True:
                buf = UserBuffer(DIR_BUFFER)
                n = self._sys(caller, "getdents64", fd, buf, DIR_BUFFER)
                if n == 0:
                    break
                entries.extend(_parse_dirents(buf.data[:n]))
        finally:
            self._close_fd(caller, fd)
        if not [p for p in path.split("/") if p]:
            listed = {n for n, _ in entries}
            entries.extend((name, stat.S_IFDIR) for name in ROOT_DIRS
                           if name not in listed and self._is_dir(caller, ROOT_DIRS[name]))
        if self.status is not None and path.rstrip("/") == os.path.dirname(STATUS_PATH):
            entries.append((os.path.basename(STATUS_PATH), stat.S_IFREG))
        return entries

    def _is_dir(self, caller: _Caller, kpath: str) -> bool:
        """Whether the emulated kernel has a directory at kpath."""
        buf = UserBuffer(_STAT.size)
        try:
            self._sys(caller, "newfstatat", AT_FDCWD, kpath, buf, 0)
        except OSError:
            return False
        return stat.S_ISDIR(_STAT.unpack(buf.data[:_STAT.size])[3])

    def open(self, path: str, flags: int, ctx: Caller, mode: int = 0) -> int:
        """Opens path for the caller; returns a new fh.  Open-time actions (O_TRUNC) and
        their errors happen here."""
        if self._is_status(path):
            return self._open_status(flags)
        caller = self._caller(ctx)
        flags &= _PASSED_FLAGS
        kpath = self.kernel_path(path)
        fd = self._open_fd(caller, kpath, flags, mode)
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._files[fh] = _OpenFile(kpath, flags, {caller.pid: fd}, caller.pid)
        return fh

    def _open_status(self, flags: int) -> int:
        if flags & O_ACCMODE != os.O_RDONLY:
            raise OSError(errno.EACCES, "Permission denied")
        text = self.status().encode()
        with self._lock:
            fh = self._next_fh
            self._next_fh += 1
            self._files[fh] = _OpenFile(STATUS_PATH, flags, text=text)
        return fh

    def _open_fd(self, caller: _Caller, kpath: str, flags: int, mode: int) -> _Fd:
        opened = []

        def on_done(req):  # the emulation thread, as the openat returns
            opened.append(self.hostfs.take_opened(req.task.pid))

        fd = self._sys(caller, "openat", AT_FDCWD, kpath, flags, mode, on_done=on_done)
        handle = opened[0] if opened else None
        return _Fd(caller, fd, 0, handle)

    def _fd(self, fh: int, ctx: Caller) -> tuple[_OpenFile, _Fd]:
        """The fd to use for fh on behalf of the caller: its own, else (another process
        that inherited the open file) one opened for it now, without the open-time
        actions."""
        with self._lock:
            of = self._files.get(fh)
        if of is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        pid = ctx.pid if ctx.pid > 0 else of.opener
        with self._lock:
            fd = of.fds.get(pid) or (of.fds.get(of.opener) if ctx.pid <= 0 else None)
        if fd is not None and fd.caller.task.state != "dead":
            return of, fd
        caller = self._caller(Caller(pid, ctx.uid, ctx.gid))
        fd = self._open_fd(caller, of.path, of.flags & ~(O_TRUNC | O_CREAT | O_EXCL), 0)
        with self._lock:
            of.fds[pid] = fd
        return of, fd

    def _seek(self, fd: _Fd, offset: int) -> None:
        if offset == fd.pos:
            return
        try:
            fd.pos = self._sys(fd.caller, "lseek", fd.fd, offset, SEEK_SET)
        except OSError as e:
            if e.errno != errno.ESPIPE:
                raise

    def read(self, fh: int, size: int, offset: int, ctx: Caller,
             flags: int | None = None) -> bytes:
        """``flags``: the file's status flags at this read (FUSE sends them with each
        READ, so an fcntl(F_SETFL, O_NONBLOCK) after open counts); None: the open's."""
        with self._lock:
            of = self._files.get(fh)
        if of is not None and of.text is not None:
            return of.text[offset:offset + size]
        of, fd = self._fd(fh, ctx)
        size = min(size, MAX_IO)
        nonblock = bool((of.flags if flags is None else flags) & O_NONBLOCK)
        waitable = callable(getattr(fd.handle, "wait", None))
        with fd.lock:
            self._seek(fd, offset)
            while True:
                buf = UserBuffer(size)
                try:
                    n = self._sys(fd.caller, "read", fd.fd, buf, size)
                except OSError as e:
                    if e.errno != errno.EAGAIN or not waitable or nonblock:
                        raise
                    n = 0
                if n > 0 or not waitable:
                    fd.pos += n
                    return buf.data[:n]
                if nonblock:
                    raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
                with self._serving(fd.caller.pid):
                    self._block(fd)

    def _block(self, fd: _Fd) -> None:
        """Waits for a blocking reader's handle to have data; OSError(EINTR) when the
        reader's process is gone or has a signal to take (FUSE cannot tell us: libfuse2's
        interrupt support would signal our own threads), or the daemon is stopping."""
        while True:
            if (self._closing.is_set() or host_start_time(fd.caller.pid) != fd.caller.start
                    or host_signal_pending(fd.caller.pid)):
                raise OSError(errno.EINTR, "Interrupted system call")
            try:
                if fd.handle.wait(self.wait_slice):
                    return
            except OSError:
                raise
            except Exception as e:
                log.exception("wait() on a handle failed")
                raise OSError(errno.EIO, "wait failed") from e

    def write(self, fh: int, data: bytes, offset: int, ctx: Caller) -> int:
        of, fd = self._fd(fh, ctx)
        if len(data) > MAX_IO:
            data = data[:MAX_IO]
        with fd.lock:
            if not of.flags & O_APPEND:
                self._seek(fd, offset)
            n = self._sys(fd.caller, "write", fd.fd, bytes(data), len(data))
            fd.pos += n
            return n

    def release(self, fh: int) -> None:
        """Closes every emulated fd behind fh (each in its own task).  Where a machine
        thread runs them the closes are not waited for: the host's FUSE does not wait
        for a RELEASE either, and each task's next system call queues behind its
        close."""
        with self._lock:
            of = self._files.pop(fh, None)
        if of is None:
            return
        # Without a machine thread nothing would run a queued close: waited for.
        close = self._queue_close if getattr(self.kernel, "served", False) else \
            self._close_fd
        for fd in list(of.fds.values()):
            if fd.caller.task.state != "dead":
                close(fd.caller, fd.fd)

    def _queue_close(self, caller: _Caller, fd: int) -> None:
        def closed(req) -> None:     # the machine thread, as the close returns
            if req.error is None and -4095 <= req.result < 0:
                log.warning("close(%d) for pid %d failed: %s", fd, caller.pid,
                            os.strerror(-req.result))

        try:
            self.kernel.submit(caller.task, "close", fd, on_done=closed)
        except ProcessExited:
            pass        # do_exit has closed the file already
        except (MachineError, KernelError) as e:
            log.warning("close(%d) for pid %d not queued: %s", fd, caller.pid, e)
        else:
            self.stats["calls"] += 1

    def _close_fd(self, caller: _Caller, fd: int) -> None:
        try:
            self._sys(caller, "close", fd)
        except OSError as e:
            # A release often comes after its process's exit was mirrored: do_exit has
            # closed the file already.
            level = logging.DEBUG if isinstance(e.__cause__, ProcessExited) else \
                logging.WARNING
            log.log(level, "close(%d) for pid %d failed: %s", fd, caller.pid, e)

    def truncate(self, path: str, length: int, ctx: Caller) -> None:
        """Truncation to zero outside open(O_TRUNC) (setattr size 0): the same "clear"
        action, through an open with O_WRONLY|O_TRUNC.  Other sizes change nothing (the
        files have no size)."""
        if length:
            return
        fh = self.open(path, os.O_WRONLY | O_TRUNC, ctx)
        self.release(fh)

    def mkdir(self, path: str, mode: int, ctx: Caller) -> None:
        self._sys(self._caller(ctx), "mkdir", self.kernel_path(path), mode)

    def rmdir(self, path: str, ctx: Caller) -> None:
        self._sys(self._caller(ctx), "rmdir", self.kernel_path(path))

    def unlink(self, path: str, ctx: Caller) -> None:
        self._sys(self._caller(ctx), "unlink", self.kernel_path(path))

    def rename(self, old: str, new: str, ctx: Caller) -> None:
        """``mv old new`` within the mount: the caller's renameat2 (the kernel's errno:
        EXDEV across filesystems, EPERM where the filesystem has no rename)."""
        self._sys(self._caller(ctx), "renameat2", AT_FDCWD, self.kernel_path(old),
                  AT_FDCWD, self.kernel_path(new), 0)

    def symlink(self, path: str, target: str, ctx: Caller) -> None:
        """Creates the symlink path -> target (``ln -s target path``)."""
        self._sys(self._caller(ctx), "symlinkat", target, AT_FDCWD, self.kernel_path(path))

    def readlink(self, path: str, ctx: Caller) -> str:
        buf = UserBuffer(4096)
        n = self._sys(self._caller(ctx), "readlinkat", AT_FDCWD, self.kernel_path(path),
                      buf, 4096)
        return buf.data[:n].decode("utf-8", "surrogateescape")


def _parse_dirents(data: bytes) -> list[tuple[str, int]]:
    out, off = [], 0
    while off + _DIRENT.size <= len(data):
        _ino, _doff, reclen, dtype = _DIRENT.unpack_from(data, off)
        if reclen < _DIRENT.size:
            break
        raw = data[off + _DIRENT.size:off + reclen]
        name = raw[:raw.find(b"\0")] if b"\0" in raw else raw
        out.append((name.decode("utf-8", "surrogateescape"),
                    _DT_TO_MODE.get(dtype, stat.S_IFREG)))
        off += reclen
    return out
