"""System calls of the processes ``kprobefs exec`` runs, mirrored into their tasks in
the emulated kernel, so that tracing users see their own processes' calls in the
kernel's syscall events (ftracetest's eprobe case runs ``cd /sys/kernel/tracing`` and
looks for ``sys_enter_chdir``'s filename; a host chdir never reaches the mount, FUSE sees
at most a getattr).  No FUSE here.

How.  ``kprobefs exec``, before its execvp, asks the daemon (an abstract unix socket
named after the mount point, :func:`socket_address`) whether it takes system calls;
only when it does, it installs a seccomp filter that notifies a listener of the
:data:`MIRRORED` calls (:mod:`kprobefs.seccomp`) and hands the listener fd over
(SCM_RIGHTS); the daemon answers once it polls it (:func:`hand_over`).  The filter is
inherited by every process the tool starts.  For each notification the daemon's
poller (:class:`SyscallWatch`) reads the call's arguments (strings from /proc/PID/mem,
then checks that the notification is still valid, as seccomp_unotify(2) requires),
queues the matching call on the process's task through the gateway
(:meth:`~kprobefs.fs.gateway.Gateway.mirror`: the call is queued, never waited for,
and the process's later requests queue after it) and answers CONTINUE at once: the
host kernel then runs the call as if there were no filter.  A worker thread makes the
task of a process seen for the first time and submits its queued calls; a stuck or
dead machine delays only that worker, never an answer.

What a dead daemon means.  The host kernel fails a notified call with ENOSYS when no
listener fd is left open.  The daemon closes its listener fds only when it stops,
which is at umount: a tool still running then has lost its mount anyway.  Hence the
mirrored set is kept to calls whose failure a tool survives (a ``cd`` that fails is a
shell error message, not a crash); the daemon dying uncleanly (SIGKILL) has the same
effect.

Why ``kill`` is not mirrored.  A notified call waits for the listener's answer, and
until the listener has received the notification a signal interrupts that wait: the
call then fails with EINTR when the process's handler lacks SA_RESTART, unrun (the
filter asks for SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV where the host has it, so only
that short window is open).  dash catches SIGCHLD without SA_RESTART, so a script's
``kill -1 $p1; kill -1 $p2`` had its second kill fail as the first child died, and its
``wait`` never ended (ftracetest's ``instance.tc``).  A ``cd`` that fails so is an
error message; a kill that does not happen is a hang, so kills stay unmirrored.

What is mirrored, and what not.  A directory inside the mount becomes the emulated
kernel's path for it (``/sys/kernel/tracing`` in the exec view is tracefs's
``/sys/kernel/tracing``); the filename the task passes is the one the process passed
whenever it names the same place in the emulated kernel (an absolute path that maps
to itself, or a relative one from a working directory inside the mount, which the
task's mirrors), else the translated absolute path.  A directory outside the mount is
not mirrored: the emulated kernel cannot see the host's directories (its ``/tmp`` is
not the host's), and a chdir into another directory would be a lie.  fchdir's
directory is read from /proc/PID/fd/N; the emulated kernel has no fchdir and the
task has no counterpart of the host fd, so it is mirrored as the chdir of that
directory (a ``sys_enter_chdir`` record).  Calls through another ABI (i386, x32) pass
unnoticed (see :mod:`kprobefs.seccomp`).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import select
import socket
import struct
import threading
from typing import Callable, NamedTuple

from .. import seccomp

__all__ = ["Mirror", "MIRRORED", "HostCall", "SyscallWatch", "hand_over",
           "socket_address", "host_call"]

log = logging.getLogger("kprobefs.fs.syscallwatch")

#: How long ``kprobefs exec`` waits for the daemon's answers (it is answered by the
#: daemon's accept thread, which never waits on the machine).
HAND_OVER_TIMEOUT = 5.0
_HELLO, _READY, _TAKEN = b"mirror?", b"yes", b"taken"
_SUN_PATH_MAX = 107


class HostProcess:
    """What a mirror entry may read of the notified process: its memory, its fds and
    its working directory (as it was when the call was made, before it ran)."""

    def __init__(self, pid: int, emulated_path: Callable[[int, str, str], str | None]):
        self.pid = pid
        self._emulated_path = emulated_path
        self.cwd = os.readlink(f"/proc/{pid}/cwd")

    def string(self, addr: int) -> str:
        return os.fsdecode(seccomp.read_string(self.pid, addr))

    def fd_path(self, fd: int) -> str:
        """The path of the process's fd (an int argument: its low 32 bits); OSError
        when it is no open fd or names no path (a socket, a pipe)."""
        path = os.readlink(f"/proc/{self.pid}/fd/{fd & 0xFFFFFFFF}")
        if not path.startswith("/"):
            raise OSError(errno.ENOTDIR, f"fd {fd} is {path}")
        return path

    def directory(self, path: str) -> str | None:
        """The emulated kernel's name for directory path (as the process names it),
        None when it is outside the mount (see the module docstring)."""
        if not path:
            return None
        return self._emulated_path(self.pid, path, self.cwd)


class Mirror(NamedTuple):
    """One mirrored system call: the host's x86_64 number, the emulated kernel's call
    made for it, and how its arguments are made from the host call's (``args(process,
    raw_args)``; None: this call is not mirrored, OSError: its arguments cannot be
    read)."""

    nr: int
    name: str
    args: Callable[[HostProcess, tuple], tuple | None]


def _directory(path: str | None) -> tuple | None:
    return None if path is None else (path,)


#: The mirrored calls (kept to calls a tool survives failing: module docstring).
MIRRORED = {m.nr: m for m in (
    Mirror(80, "chdir", lambda p, a: _directory(p.directory(p.string(a[0])))),
    Mirror(81, "chdir", lambda p, a: _directory(p.directory(p.fd_path(a[0])))),
)}


class HostCall(NamedTuple):
    """A host call to mirror: the emulated kernel's call for the thread pid, and the
    thread's working directory when it made it."""

    pid: int
    name: str
    args: tuple
    cwd: str


def host_call(note: seccomp.Notification, process: HostProcess) -> HostCall | None:
    """The call to mirror for a notification, None when it is not mirrored.  Raises
    OSError when its arguments cannot be read (the process is gone, a bad pointer)."""
    mirror = MIRRORED.get(note.nr)
    if mirror is None or note.arch != seccomp.AUDIT_ARCH_X86_64:
        return None
    args = mirror.args(process, note.args)
    return None if args is None else HostCall(note.pid, mirror.name, args, process.cwd)


def socket_address(mountpoint: str) -> bytes:
    """The abstract unix socket where the daemon of mountpoint (an absolute path without
    symlinks) takes listener fds: named after it, or after its hash when it is too long
    for a socket's name."""
    name = b"\0kprobefs/syscalls" + os.fsencode(mountpoint)
    if len(name) > _SUN_PATH_MAX:
        name = b"\0kprobefs/syscalls#" + hashlib.sha256(os.fsencode(mountpoint)).digest()
    return name


# ==== the exec side =========================================================================
def hand_over(mountpoint: str) -> str | None:
    """Installs the filter on this process and hands its listener to the daemon of
    mountpoint.  Returns a warning for the user when something failed, None when the
    calls are mirrored or the daemon does not offer it (an older one: nothing is
    installed then); nothing is handed to a socket held by another user than root or
    this one.  Precondition: single-threaded, before execvp."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    except OSError as e:
        return f"no unix socket: {e.strerror}"
    with sock:
        sock.settimeout(HAND_OVER_TIMEOUT)
        try:
            sock.connect(socket_address(mountpoint))
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        except OSError as e:
            return f"the daemon does not take system calls ({e.strerror or e})"
        # Anyone may bind an abstract name: a listener handed to another user's
        # process would let it answer this process's calls.  In the user namespace of
        # an ordinary user's exec, that user is 0 and any other user the overflow uid.
        _pid, uid, _gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid not in (0, os.getuid()):
            return (f"the socket of {mountpoint}'s daemon is held by uid {uid}, neither "
                    f"root nor this user: none of its system calls are handed to it")
        try:
            sock.sendall(_HELLO)
            if sock.recv(64) != _READY:
                return "the daemon does not mirror system calls"
        except OSError as e:
            return f"the daemon does not take system calls ({e.strerror or e})"
        try:
            listener = seccomp.install_listener(sorted(MIRRORED))
        except seccomp.SeccompError as e:
            return f"no seccomp user notification here ({e.strerror})"
        try:
            socket.send_fds(sock, [b"listener"], [listener])
            if sock.recv(64) != _TAKEN:
                raise OSError(errno.EPROTO, "no answer")
        except OSError as e:
            # The filter stays (it cannot be removed): its calls fail with ENOSYS
            # unless the daemon did take the fd.
            return (f"the daemon did not confirm the listener ({e.strerror or e}): "
                    f"{', '.join(sorted({m.name for m in MIRRORED.values()}))} may fail")
        finally:
            os.close(listener)
    return None


# ==== the daemon side =======================================================================
class SyscallWatch:
    """Takes the listener fds of ``kprobefs exec`` processes on socket_address(mount)
    and mirrors their notifications into ``gateway`` (see the module docstring).

    ``gateway`` offers ``mirror(call: HostCall)`` (queues, never waits on the machine),
    ``flush_mirrored(pid)`` (makes the task if needed and submits what is queued; may
    wait on the machine), ``mark_mirrored(pid)`` and ``emulated_directory(pid, path,
    cwd)``.  ``allow_other``: processes of other users may hand a listener over (else
    only the daemon's user and root)."""

    def __init__(self, gateway, mountpoint: str, allow_other: bool = False):
        self.gateway = gateway
        self.mountpoint = mountpoint
        self.allow_other = allow_other
        self.stats = {"notifications": 0, "mirrored": 0, "skipped": 0, "listeners": 0}
        self._server: socket.socket | None = None
        self._taken: list[int] = []      # listener fds the poller has not seen yet
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stop = threading.Event()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._queued: set[int] = set()   # pids in _work (each once)
        self._threads: list[threading.Thread] = []

    def start(self) -> bool:
        """Listens and starts the threads (accept, poller, worker); False (logged) when
        the socket cannot be made (another daemon has this mount point's name)."""
        try:
            server = socket.socket(socket.AF_UNIX,
                                   socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            server.bind(socket_address(self.mountpoint))
            server.listen(16)
        except OSError as e:
            log.warning("system calls are not mirrored: %s", e)
            return False
        server.settimeout(0.5)
        self._server = server
        for name, target in (("syscalls", self._poll_loop), ("mirror", self._work_loop),
                             ("handover", self._accept_loop)):
            t = threading.Thread(target=target, name=f"kprobefs-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return True

    def close(self) -> None:
        """Stops the threads and closes the listener fds (from then on the tools' mirrored
        calls fail with ENOSYS: module docstring)."""
        self._stop.set()
        self._work.put(None)
        self._wake()
        for t in self._threads:
            t.join(timeout=5)
        if self._server is not None:
            self._server.close()
        with self._lock:
            fds, self._taken = self._taken, []
        for fd in fds:
            os.close(fd)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except BlockingIOError:
            pass        # already woken

    # ---- hand-overs: a connection waits for its tool, never delaying an answer ----------
    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (socket.timeout, InterruptedError):
                continue
            except OSError as e:
                log.error("system call hand-overs stop: %s", e)
                return
            with conn:
                try:
                    self._take(conn)
                except Exception:
                    log.exception("a system call hand-over failed")

    def _take(self, conn: socket.socket) -> None:
        conn.settimeout(HAND_OVER_TIMEOUT)
        pid, uid, _gid = struct.unpack(
            "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if not self.allow_other and uid not in (0, os.getuid()):
            log.warning("pid %d (uid %d) may not hand a listener over", pid, uid)
            return
        try:
            if conn.recv(64) != _HELLO:
                return
            conn.sendall(_READY)
            _msg, fds, _flags, _addr = socket.recv_fds(conn, 64, 4)
        except OSError as e:
            log.warning("pid %d: no listener taken: %s", pid, e)
            return
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        self.gateway.mark_mirrored(pid)
        with self._lock:
            if self._stop.is_set():
                os.close(fds[0])
                return
            self._taken.append(fds[0])
        self._wake()
        self.stats["listeners"] += 1
        try:
            conn.sendall(_TAKEN)
        except OSError:
            pass        # the tool is gone: its filter goes with it
        log.info("mirroring the system calls of pid %d and its children", pid)

    # ---- the poller: never waits on the machine ------------------------------------------
    def _poll_loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        listeners: set[int] = set()
        try:
            while not self._stop.is_set():
                try:
                    events = poller.poll()
                except InterruptedError:
                    continue
                for fd, mask in events:
                    try:
                        self._poll_event(poller, listeners, fd, mask)
                    except Exception:
                        log.exception("system call mirroring failed on fd %d", fd)
        finally:
            # Whatever ended the loop, no listener stays open unanswered: a call whose
            # notification nobody reads would wait for ever (a closed one fails ENOSYS).
            for fd in listeners:
                os.close(fd)

    def _poll_event(self, poller, listeners: set[int], fd: int, mask: int) -> None:
        if fd == self._wake_r:
            self._adopt(poller, listeners)
        elif mask & select.POLLIN and self._notification(fd):
            pass
        elif mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            # no task is left under that filter
            poller.unregister(fd)
            listeners.discard(fd)
            os.close(fd)

    def _adopt(self, poller, listeners: set[int]) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            taken, self._taken = self._taken, []
        for fd in taken:
            poller.register(fd, select.POLLIN)
            listeners.add(fd)

    def _notification(self, fd: int) -> bool:
        """Mirrors and answers one notification; False when there was none."""
        note = seccomp.receive(fd)
        if note is None:
            return False
        self.stats["notifications"] += 1
        try:
            call = self._read(fd, note)
            if call is not None:
                self.gateway.mirror(call)
                with self._lock:
                    queued = call.pid in self._queued
                    self._queued.add(call.pid)
                if not queued:
                    self._work.put(call.pid)
                self.stats["mirrored"] += 1
            else:
                self.stats["skipped"] += 1
        finally:
            seccomp.answer_continue(fd, note.id)
        return True

    def _read(self, fd: int, note: seccomp.Notification) -> HostCall | None:
        try:
            call = host_call(note, HostProcess(note.pid, self.gateway.emulated_directory))
        except OSError as e:
            log.debug("pid %d: system call %d not mirrored: %s", note.pid, note.nr, e)
            return None
        # What was read is that thread's only if it still waits for this answer.
        return call if seccomp.id_valid(fd, note.id) else None

    # ---- the worker: may wait on the machine ---------------------------------------------
    def _work_loop(self) -> None:
        while not self._stop.is_set():
            pid = self._work.get()
            if pid is None:
                return
            with self._lock:
                self._queued.discard(pid)
            try:
                self.gateway.flush_mirrored(pid)
            except OSError as e:
                # its task cannot be made now: the calls wait for its next request
                log.debug("pid %d: mirrored calls not submitted: %s", pid, e)
            except Exception:
                log.exception("pid %d: mirrored calls not submitted", pid)
