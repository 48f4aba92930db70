"""The syscall gateway: each filesystem request of a host process runs as a system call of
the emulated kernel, made by a task with that process's pid and comm.  No FUSE here.

The processes and their tasks (made at a process's first request, forks, execs and
exits mirrored) are :mod:`.callers`'.  open is ``openat``; read is ``read`` where the
file's position is, else ``pread64`` (a host ``pread``), and write ``write`` or
``pwrite64`` alike; release is ``close``, readdir is ``getdents64``;
getattr of a debugfs or tracefs name is answered from the host tree the kernel's hostfs
serves, of a ``proc``, ``dev`` or ``tmp`` name by ``newfstatat``.  Tasks whose host
process has gone exit through the ``exit`` system call (do_exit) when
:meth:`Gateway.reap` runs.

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
import queue
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from ..errors import KernelError, KernelOops, KernelStuck, KernelWedged, MachineError
from ..machine.flag import Flag
from ..machine.kernel import ProcessExited, UserBuffer
from .callers import Caller, HostCaller, HostCallers
from .hostproc import host_cpu, host_signal_pending, host_start_time, open_mount_paths
from .procwatch import ProcessEvents
from .tree import DEBUGFS_ROOT, HostFS

__all__ = ["Gateway", "Caller", "Attributes"]

log = logging.getLogger("kprobefs.fs.gateway")

AT_FDCWD = -100
O_ACCMODE = 0o3
O_CREAT, O_EXCL, O_TRUNC, O_APPEND = 0o100, 0o200, 0o1000, 0o2000
O_NONBLOCK, O_DIRECTORY = 0o4000, 0o200000
#: Open flags passed on to the emulated kernel; the rest (O_LARGEFILE, O_NOATIME, …)
#: mean nothing to a pseudo-file.
_PASSED_FLAGS = O_ACCMODE | O_CREAT | O_EXCL | O_TRUNC | O_APPEND | O_NONBLOCK | O_DIRECTORY

_STAT = struct.Struct("<QQQIIIiQqqqqqqqqq24x")  # struct stat, x86_64 (144 bytes)
_DIRENT = struct.Struct("<QqHB")  # linux_dirent64 header: d_ino, d_off, d_reclen, d_type
_DT_TO_MODE = {4: stat.S_IFDIR, 8: stat.S_IFREG, 10: stat.S_IFLNK}

POLLIN, POLLOUT, POLLRDNORM, POLLWRNORM = 0x1, 0x4, 0x40, 0x100
#: poll(2)'s answer for a file that has no poll of its own (Linux's DEFAULT_POLLMASK).
DEFAULT_POLLMASK = POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM
READABLE = POLLIN | POLLRDNORM

#: Largest read or write handed to the kernel at once (the task's user window is 16 MiB).
MAX_IO = 1 << 20
DIR_BUFFER = 32 * 1024
#: The positioned call of each plain one (see Gateway._io).
_POSITIONED = {"read": "pread64", "write": "pwrite64"}

#: Where each mount-relative prefix lives in the emulated kernel.
DEBUGFS_PATH = "/sys/kernel/debug"
TRACEFS_PATH = "/sys/kernel/tracing"
PROC_PATH = "/proc"
#: Top-level names the mount root shows beside debugfs' own entries, and the kernel
#: directories they are.
ROOT_DIRS = {"proc": PROC_PATH, "dev": "/dev", "tmp": "/tmp"}
#: The daemon's own file (see the module docstring).
STATUS_PATH = "/kprobefs/status"
AT_SYMLINK_NOFOLLOW = 0x100
NAME_MAX = 255
#: Mount-relative places that are the roots of the kernel's debugfs and tracefs mounts.
_MOUNT_ROOTS = ((), ("tracing",))


class Attributes(NamedTuple):
    """What getattr reports (from the emulated kernel's newfstatat)."""

    mode: int
    ino: int
    nlink: int
    atime: float
    mtime: float
    ctime: float
    #: The name stays as long as its directory does (a host may cache the lookup): a
    #: fixed name of the debugfs or tracefs tree, or a top-level name of the mount.
    stable: bool = False


@dataclass(eq=False)
class _Fd:
    """An emulated file descriptor of one task for one FUSE open."""

    caller: HostCaller
    fd: int
    pos: int = 0
    handle: object = None  # the host handle behind it, for wait()
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: False once pread64 or pwrite64 said ESPIPE: the file has no positions.
    positioned: bool = True
    #: Whether the handle has a wait() (a blocking reader's: trace_pipe's).
    waitable: bool = field(init=False)

    def __post_init__(self):
        self.waitable = callable(getattr(self.handle, "wait", None))


@dataclass(eq=False)
class _OpenFile:
    """One FUSE open (one fh): the kernel path, the flags, and an emulated fd per pid
    that used it (a host process inherits open files across fork)."""

    path: str
    flags: int
    fds: dict = field(default_factory=dict)  # host pid -> _Fd
    opener: int = 0
    text: bytes | None = None                # the daemon's own file: its contents


@dataclass(eq=False)
class _FlushLook:
    """A look flush() asked for: whether pid still holds ``of`` (see _flush_close)."""

    of: _OpenFile
    pid: int
    fd: _Fd
    #: A bare lock's wait and set (threading.Event's go through a Condition in Python).
    done: Flag = field(default_factory=Flag)


class Gateway(HostCallers):
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
        self._callers: dict[int, HostCaller] = {}
        #: Spawners (callers.py): host pid -> its children in a row that made no request.
        self._spawners: dict[int, int] = {}
        self._files: dict[int, _OpenFile] = {}
        self._next_fh = 1
        #: RELEASEs whose closes are running (see release()), and its condition.
        self._releasing = 0
        self._released = threading.Condition()
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
        #: Programs made in the emulated rootfs for mirrored execs (callers._exec).
        self._programs: set[str] = set()
        #: Open files (fh) a poll watch waits on (see poll()).
        self._polled: set[int] = set()
        #: flush()'s looks for its threads, and how many of those wait for one.
        self._looks: queue.SimpleQueue = queue.SimpleQueue()
        self._lookers = self._lookers_free = 0
        #: Looks made in calling threads (flush's ``answer``): token -> (deadline, answer).
        self._looking: dict[object, tuple[float, Callable[[], None]]] = {}
        self._look_watch = False

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
    def _call(self, task, name: str, *args, on_done=None, host_pid: int = 0) -> int:
        """Runs one system call for task and returns its raw result; OSError(EIO) when the
        machine fails, is stuck, or does not finish it within the timeout (then the
        machine is told to kill the task, see Kernel.abandon).  ProcessExited and
        KernelOops pass through.  A call made for host thread ``host_pid`` runs on the
        emulated CPU of the host CPU that thread is on (modulo the machine's CPUs): only
        there when the thread is pinned to that CPU, else there when that CPU is free
        (as Linux wakes a task on its previous CPU when idle, else on an idle one).  The
        task's own pid may be one the kernel chose, when the host's was taken."""
        kernel = self.kernel
        nr_cpus = getattr(kernel, "nr_cpus", 1)
        if nr_cpus > 1 and host_pid > 0:
            placed = host_cpu(host_pid)
            if placed is not None:
                task.wake_cpu, task.wake_cpu_only = placed[0] % nr_cpus, placed[1]
        try:
            req = kernel.submit(task, name, *args, on_done=on_done, wake=False)
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

    def _sys(self, caller: HostCaller, name: str, *args, on_done=None) -> int:
        """Like _call, for a caller's task; a task that died meanwhile (oops) is forgotten
        and the request fails with EIO.  Negative results raise OSError."""
        # _serving's enter and leave, written out: this runs for every system call.
        sched = self.sched
        if sched is not None:
            sched.enter(caller.pid)
        try:
            try:
                ret = self._call(caller.task, name, *args, on_done=on_done,
                                 host_pid=caller.pid)
            finally:
                if sched is not None:
                    sched.leave(caller.pid)
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
        try:
            caller = self._caller(ctx)
            parts = [p for p in path.split("/") if p]
            if not parts or parts[0] not in ROOT_DIRS:
                return self._host_attributes(parts)
            top = len(parts) == 1   # proc, dev, tmp: fixed names of the mount's root
            buf = UserBuffer(_STAT.size)
            self._sys(caller, "newfstatat", AT_FDCWD, self.kernel_path(path), buf,
                      AT_SYMLINK_NOFOLLOW)
        except OSError as e:
            # The way to the status file stays open when the machine does not answer
            # or has no memory for the caller's task.
            if e.errno not in (errno.EIO, errno.ENOMEM, errno.EAGAIN) or \
                    self.status is None or \
                    path.rstrip("/") not in ("", os.path.dirname(STATUS_PATH)):
                raise
            now = time.time()
            return Attributes(stat.S_IFDIR | 0o755, 1, 2, now, now, now)
        (_dev, ino, nlink, mode, _uid, _gid, _pad, _rdev, _size, _blksize, _blocks,
         at, atn, mt, mtn, ct, ctn) = _STAT.unpack(buf.data[:_STAT.size])
        return Attributes(mode, ino, nlink, at + atn / 1e9, mt + mtn / 1e9, ct + ctn / 1e9,
                          top)

    def name_exists(self, path: str) -> bool:
        """Whether the debugfs or tracefs name at path is there now, from the host tree
        (no system call).  The kernel's own proc, dev and tmp names count as there: the
        host asks for those again at each walk."""
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] in ROOT_DIRS or self._is_status(path):
            return True
        try:
            self.hostfs.stat_path(DEBUGFS_ROOT, parts, self.timeout)
        except OSError as e:
            return e.errno not in (errno.ENOENT, errno.ENOTDIR)
        return True

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
        node_id, mode, fixed = self.hostfs.stat_path(DEBUGFS_ROOT, parts, self.timeout)
        if tuple(parts) in _MOUNT_ROOTS:
            mode = stat.S_IFDIR | 0o700     # the mount's root (hostfs_fill_super)
        elif not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            mode = stat.S_IFREG | stat.S_IMODE(mode)
        return Attributes(mode, node_id, 1, 0.0, 0.0, 0.0, fixed)

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

    def _is_dir(self, caller: HostCaller, kpath: str) -> bool:
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

    def _open_fd(self, caller: HostCaller, kpath: str, flags: int, mode: int) -> _Fd:
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
        of, fd = self._file_and_fd(fh, ctx)
        return of, fd if fd is not None else self._inherited(of, ctx)

    def _file_and_fd(self, fh: int, ctx: Caller) -> tuple[_OpenFile, _Fd | None]:
        """The open file fh and the caller's live fd on it (the opener's for a caller
        without a pid), None when it has none; OSError(EBADF) when fh is not open."""
        with self._lock:
            of = self._files.get(fh)
            if of is None:
                raise OSError(errno.EBADF, "Bad file descriptor")
            fd = of.fds.get(ctx.pid if ctx.pid > 0 else of.opener)
        if fd is not None and fd.caller.task.state == "dead":
            return of, None
        return of, fd

    def _inherited(self, of: _OpenFile, ctx: Caller) -> _Fd:
        """A new fd on ``of`` for the caller, which has none (it inherited the open
        file), opened without the open-time actions."""
        pid = ctx.pid if ctx.pid > 0 else of.opener
        caller = self._caller(Caller(pid, ctx.uid, ctx.gid))
        fd = self._open_fd(caller, of.path, of.flags & ~(O_TRUNC | O_CREAT | O_EXCL), 0)
        with self._lock:
            of.fds[pid] = fd
        return fd

    def _io(self, fd: _Fd, name: str, data, size: int, offset: int) -> int:
        """One ``read`` or ``write`` (name) of fd at offset: the plain call where the
        emulated file's position is offset (a host process's sequential reads, as it
        made them), else ``pread64`` or ``pwrite64``, which leave the position where it
        is (one call where lseek and the call were two); the plain call on a file
        without positions (ESPIPE: a stream reads on where it is).  Caller holds
        fd.lock."""
        if offset != fd.pos and fd.positioned:
            try:
                return self._sys(fd.caller, _POSITIONED[name], fd.fd, data, size, offset)
            except OSError as e:
                if e.errno != errno.ESPIPE:
                    raise
                fd.positioned = False
        n = self._sys(fd.caller, name, fd.fd, data, size)
        fd.pos += n
        return n

    def read(self, fh: int, size: int, offset: int, ctx: Caller,
             flags: int | None = None) -> bytes:
        """``flags``: the file's status flags at this read (FUSE sends them with each
        READ, so an fcntl(F_SETFL, O_NONBLOCK) after open counts); None: the open's."""
        of, fd = self._file_and_fd(fh, ctx)
        if of.text is not None:
            return of.text[offset:offset + size]
        if fd is None:
            fd = self._inherited(of, ctx)
        size = min(size, MAX_IO)
        nonblock = bool((of.flags if flags is None else flags) & O_NONBLOCK)
        waitable = fd.waitable
        with fd.lock:
            while True:
                buf = UserBuffer(size, upto_result=True)
                try:
                    n = self._io(fd, "read", buf, size, offset)
                except OSError as e:
                    if e.errno != errno.EAGAIN or not waitable or nonblock:
                        raise
                    n = 0
                if n > 0 or not waitable:
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

    def poll(self, fh: int, ctx: Caller, wakeup: Callable[[], None] | None) -> int:
        """poll(2) of fh by the caller: the events ready now, as the tracefs file's poll
        gives them (a pipe: readable or nothing, see the handles' poll_wait);
        DEFAULT_POLLMASK for a file without one.  When nothing is ready and ``wakeup``
        is given, a watch calls it once, from a thread of its own, as the file becomes
        readable (the host's FUSE then polls again); never when the file is released
        first or the daemon stops.  Answered here, beside the emulation: the emulated
        kernel runs no poll system call."""
        with self._lock:
            of = self._files.get(fh)
        if of is not None and of.text is not None:
            return DEFAULT_POLLMASK
        _of, fd = self._fd(fh, ctx)
        poll_wait = getattr(fd.handle, "poll_wait", None)
        if not callable(poll_wait):
            return DEFAULT_POLLMASK
        if poll_wait(0):
            return READABLE
        if wakeup is not None:
            self._watch_poll(fh, poll_wait, wakeup)
        return 0

    def _watch_poll(self, fh: int, poll_wait: Callable[[float], bool],
                    wakeup: Callable[[], None]) -> None:
        """Starts the watch of poll() for fh, unless one runs: the host's FUSE asks for
        one notification per open file, and a running watch wakes it.  The watch is
        let go before it wakes the poller: a poll that comes after the wakeup finds
        either the data or no watch, and starts its own."""
        with self._lock:
            if fh in self._polled:
                return
            self._polled.add(fh)

        def watch() -> None:
            woke = False
            try:
                while not self._closing.is_set():
                    with self._lock:
                        if fh not in self._files:
                            return
                    if poll_wait(self.wait_slice):
                        woke = True
                        return
            except Exception:
                log.exception("the poll watch of fh %d failed", fh)
            finally:
                with self._lock:
                    self._polled.discard(fh)
                if woke:
                    wakeup()

        threading.Thread(target=watch, daemon=True, name="kprobefs-poll").start()

    def write(self, fh: int, data: bytes, offset: int, ctx: Caller) -> int:
        of, fd = self._fd(fh, ctx)
        if len(data) > MAX_IO:
            data = data[:MAX_IO]
        with fd.lock:
            # An O_APPEND write goes to the end whatever the offset (as pwrite's does on
            # Linux, so the plain call says what the process did).
            return self._io(fd, "write", bytes(data), len(data),
                            fd.pos if of.flags & O_APPEND else offset)

    def release(self, fh: int) -> None:
        """Closes every emulated fd behind fh (each in its own task), waiting for each
        close: on Linux a file is released before the close(2) of its last descriptor
        returns, and the host's FUSE sends RELEASE without waiting for it, so the
        process may already go on (`echo … > instances/foo/set_ftrace_filter; rmdir
        instances/foo` must not find the file still open)."""
        # Counted before the fh goes: a request waiting for this file's release
        # (_await_releases) sees it either open or still closing.
        with self._released:
            self._releasing += 1
        try:
            with self._lock:
                of = self._files.pop(fh, None)
            for fd in list(of.fds.values()) if of is not None else ():
                if fd.caller.task.state != "dead":
                    self._close_fd(fd.caller, fd.fd)
        finally:
            with self._released:
                self._releasing -= 1
                self._released.notify_all()

    #: How long FLUSH waits for its look at the caller's descriptors (see flush()).
    FLUSH_WAIT = 0.2

    def flush(self, fh: int, ctx: Caller,
              answer: Callable[[], None] | None = None) -> None:
        """The caller closed one of its descriptors of fh (FUSE FLUSH, which the host
        sends inside close(2), before it returns; RELEASE comes later, in no order with
        what the process does next).  When the caller holds no other descriptor on the
        file's path, its emulated fd is closed now: on Linux the close of a process's
        last descriptor releases the file before close(2) returns, so a later `rmdir`
        of the instance, or a fork (whose mirror copies the task's fds), never finds it
        open.  A file another process still holds stays open until its RELEASE.

        Whether the caller holds another descriptor is read from /proc, on another
        thread (one of the gateway's, a new one when each has a look to make), waited
        for at most FLUSH_WAIT: the close may come from an execve's close-on-exec, and
        while the host holds that process's exec lock its /proc links do not answer
        until the FLUSH does.  Past the wait the FLUSH is answered and the look
        finishes afterwards (or RELEASE closes the fd).

        ``answer``, where the FUSE loop can answer the FLUSH from another thread (fuse_ll):
        the look is made in the calling thread, and a watch calls ``answer()`` once it
        has taken FLUSH_WAIT (see _watch_looks); flush() returns when the look is done.
        No hand-off to a thread and back (two wake-ups, each a scheduling delay on a
        busy host) for the look that answers at once."""
        with self._lock:
            of = self._files.get(fh)
            fd = of.fds.get(ctx.pid) if of is not None and ctx.pid > 0 else None
            if fd is None:
                return
            if answer is not None:
                token = object()
                self._looking[token] = (time.monotonic() + self.FLUSH_WAIT, answer)
                watch = not self._look_watch
                self._look_watch = True
        if answer is not None:
            if watch:
                threading.Thread(target=self._watch_looks, name="kprobefs-flush-watch",
                                 daemon=True).start()
            try:
                self._flush_close(of, ctx.pid, fd)
            except Exception:
                log.exception("the look of a FLUSH for pid %d failed", ctx.pid)
            finally:
                with self._lock:
                    self._looking.pop(token, None)
            return
        with self._lock:
            # A look waiting on a process in execve holds its thread: a new one starts
            # when every thread has a look to make.
            start = not self._lookers_free
            if start:
                self._lookers += 1
                self._lookers_free += 1
            self._lookers_free -= 1
        if start:
            threading.Thread(target=self._flush_looker, name="kprobefs-flush",
                             daemon=True).start()
        look = _FlushLook(of, ctx.pid, fd)
        self._looks.put(look)
        look.done.wait(self.FLUSH_WAIT)

    #: How often the watch of flush()'s looks in calling threads looks at them (s).
    LOOK_WATCH_EVERY = 0.05

    def _watch_looks(self) -> None:
        """Answers each FLUSH whose look, made in its calling thread, has taken
        FLUSH_WAIT (a process in execve: see flush()); ends at close().  It polls: a
        look that answers at once never wakes it."""
        while not self._closing.wait(self.LOOK_WATCH_EVERY):
            now = time.monotonic()
            with self._lock:
                late = [token for token, (deadline, _) in self._looking.items()
                        if deadline <= now]
                answers = [self._looking.pop(token)[1] for token in late]
            for answer in answers:
                try:
                    answer()
                except Exception:
                    log.exception("answering a FLUSH whose look is held up failed")

    def _flush_looker(self) -> None:
        """A thread of flush()'s looks: takes them one at a time, and stays for the next
        (a thread started for each close cost a FLUSH more than its look); ends at
        close()."""
        while True:
            look = self._looks.get()
            if look is None:
                return
            try:
                self._flush_close(look.of, look.pid, look.fd)
            except Exception:
                log.exception("the look of a FLUSH for pid %d failed", look.pid)
            finally:
                look.done.set()
                with self._lock:
                    self._lookers_free += 1

    def close(self) -> None:
        """Ends every task (HostCallers.close) and flush()'s threads, each once its
        look is made."""
        super().close()
        with self._lock:
            lookers, self._lookers = self._lookers, 0
        for _ in range(lookers):
            self._looks.put(None)

    def _flush_close(self, of: "_OpenFile", pid: int, fd) -> None:
        """flush()'s look: close pid's emulated fd of ``of`` unless pid holds another
        descriptor on its path."""
        if _holds(pid, of.path):
            return
        with self._lock:
            if of.fds.get(pid) is not fd:
                return
            del of.fds[pid]
        if fd.caller.task.state != "dead":
            self._close_fd(fd.caller, fd.fd)

    #: How long a request waits for RELEASEs in progress before it goes ahead anyway.
    RELEASE_WAIT = 2.0

    def _after_releases(self) -> None:
        """Waits for the closes of the RELEASEs that came before this request: the
        process that closed a file went on at once, and what it does next (an rmdir of
        the instance the file was in) must find the file closed, as on Linux.  Bounded:
        a machine that does not get to them holds no one for long."""
        if not self._releasing:
            return
        with self._released:
            self._released.wait_for(lambda: not self._releasing, self.RELEASE_WAIT)

    def _close_fd(self, caller: HostCaller, fd: int) -> None:
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
        """An instance with open files is busy; but a file its process has closed
        may still be on its way here: the host's FUSE queues RELEASE as close(2)
        returns, and another of our threads can take the rmdir first."""
        caller, kpath = self._caller(ctx), self.kernel_path(path)
        try:
            self._sys(caller, "rmdir", kpath)
        except OSError as e:
            if e.errno != errno.EBUSY or not self._await_releases(kpath + "/"):
                raise
            self._sys(caller, "rmdir", kpath)

    def _await_releases(self, prefix: str) -> bool:
        """Waits (bounded) for the release of the files open under ``prefix`` that no
        process that used them still holds, and for the RELEASEs in progress (a file
        whose close is running is no longer listed); whether there were any and all
        went."""
        with self._lock:
            under = {fh: of for fh, of in self._files.items() if of.path.startswith(prefix)}
        if not (under or self._releasing) or any(_held(of) for of in under.values()):
            return False
        with self._released:
            return self._released.wait_for(
                lambda: not self._releasing and under.keys().isdisjoint(self._files),
                self.RELEASE_WAIT)

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


def _held(of: _OpenFile) -> bool:
    """Whether a host process that used the open file still has a descriptor on its
    path (a child that inherited it unused is not seen: then the wait runs out).  The
    pids are taken first: another request's thread may add one meanwhile."""
    return any(_holds(pid, of.path) for pid in tuple(of.fds))


def _holds(pid: int, kpath: str) -> bool:
    """Whether host process pid has a descriptor open on the mount's file at kpath."""
    return any(Gateway.kernel_path(rel) == kpath for rel in open_mount_paths(pid))


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
