"""The host's process events (fork, exec, exit), read from the kernel's process
connector (netlink ``NETLINK_CONNECTOR``, ``CN_IDX_PROC``).  No FUSE here.

The gateway mirrors the life of the host processes that use the mount: when one of them
forks, the emulated kernel forks its task too (``kernel_clone`` in the parent's context,
as Linux runs it), even if the child never makes a request of its own (a shell's
``( echo forked )``).  The host kernel queues an event on the listening socket inside
``fork()``/``exec()``/``exit()`` themselves, so a request that a process makes after
another process forked (the shell waited for the subshell, then ran ``grep … trace``)
always finds that fork's event already queued: draining the socket before serving a
request applies every earlier fork, in order.

Listening needs CAP_NET_ADMIN and a host kernel with CONFIG_PROC_EVENTS;
:meth:`ProcessEvents.open` returns None where it cannot listen, and the gateway then
knows a process only from its first request.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import select
import shutil
import socket
import struct
import threading
from typing import Callable, NamedTuple

from .hostproc import host_process, read_proc

__all__ = ["ProcessEvents", "ProcessEvent", "FORK", "EXEC", "COMM", "EXIT", "host_exec_image"]

log = logging.getLogger("kprobefs.fs.procwatch")

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3

#: enum proc_cn_event (include/uapi/linux/cn_proc.h)
FORK = 0x00000001
EXEC = 0x00000002
COMM = 0x00000200     # a new comm: after an exec, or prctl(PR_SET_NAME)
EXIT = 0x80000000

_NLMSGHDR = struct.Struct("<IHHII")          # len, type, flags, seq, pid
_CN_MSG = struct.Struct("<IIIIHH")           # idx, val, seq, ack, len, flags
_EVENT_HEADER = struct.Struct("<IIQ")        # what, cpu, timestamp_ns
_FORK = struct.Struct("<iiii")               # parent pid, tgid, child pid, tgid
_EXEC = struct.Struct("<ii")                 # process pid, tgid
_EXIT = struct.Struct("<iiI")                # process pid, tgid, exit code (then signal)
_COMM = struct.Struct("<ii16s")              # process pid, tgid, comm
_EVENT_DATA = _NLMSGHDR.size + _CN_MSG.size + _EVENT_HEADER.size


class ProcessEvent(NamedTuple):
    """One host process event.  ``pid`` is the thread that forked, exec'd, was renamed
    or exited (``tgid`` its process); for FORK, ``child``/``child_tgid`` are the new
    thread; for COMM, ``comm`` is the new name, for EXEC the comm read as the event was
    received ("" when the process was gone already: the host sends no COMM event for
    an exec)."""

    what: int
    pid: int
    tgid: int
    child: int = 0
    child_tgid: int = 0
    comm: str = ""
    exit_code: int = 0      #: EXIT: the wait status (a signal's number in the low bits)


class ProcessEvents:
    """A listening process-connector socket.  :meth:`drain` never blocks.

    With :meth:`start_reader`, a thread takes the events off the socket as they come
    (an EXEC's comm is read then, while a short command still lives); :meth:`drain`
    hands over what it queued, in order.  The reader then calls its ``on_events``
    (which drains and applies them, on that thread: no hand-off to another).

    The socket hears every process of the host.  Once :meth:`watch` has named a
    process, only the events of watched processes are kept: theirs, and the forks they
    make, whose children are watched from then on (until their exit).  Nothing is read
    of the others (no comm, no call of ``on_events``).
    """

    RECV_SIZE = 1 << 16

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.lost = 0       # times the socket overflowed (events were dropped)
        #: Held while the socket is read and what was read is queued: events leave the
        #: socket and join the queue in order.  The queue itself has a lock of its
        #: own, so that taking what is queued never waits on a read.
        self._read_lock = threading.Lock()
        self._lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._reader: threading.Thread | None = None
        self._on_events: Callable[[], None] | None = None
        self._closed = False
        self._watched: set[int] | None = None     # None: every process

    @classmethod
    def open(cls) -> "ProcessEvents | None":
        """A socket subscribed to process events, or None (with the reason logged) where
        the host does not allow it."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                 NETLINK_CONNECTOR)
        except (OSError, AttributeError) as e:
            log.info("no process connector (%s): processes are known from their requests", e)
            return None
        try:
            sock.bind((0, CN_IDX_PROC))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.send(_control(PROC_CN_MCAST_LISTEN))
            sock.setblocking(False)
        except OSError as e:
            sock.close()
            log.info("cannot listen to process events (%s): processes are known from "
                     "their requests", e)
            return None
        return cls(sock)

    def watch(self, pid: int) -> None:
        """Keep the events of process pid (and of the children it forks from now on);
        from the first call on, the events of processes never watched are dropped.
        (An event the reader is filtering at this instant may go either way: it
        happened before the call.)"""
        watched = self._watched
        if watched is None:
            with self._read_lock:
                if self._watched is None:
                    self._watched = set()
                watched = self._watched
        watched.add(pid)

    def _kept(self, event: ProcessEvent) -> ProcessEvent | None:
        """event as queued (an EXEC with its comm), or None when it is dropped (caller
        holds _read_lock)."""
        watched = self._watched
        if watched is not None:
            if event.what == FORK:
                if event.pid not in watched and event.tgid not in watched:
                    return None
                watched.add(event.child)
            elif event.pid not in watched and event.tgid not in watched:
                return None
            elif event.what == EXIT and event.pid == event.tgid:
                watched.discard(event.pid)
        return _with_exec_comm(event)

    def drain(self, read_socket: bool = True) -> list[ProcessEvent]:
        """Every FORK/EXEC/COMM/EXIT event queued now, oldest first; with read_socket
        False (and a reader thread), only what the reader has queued: no system call,
        but an event that has just happened may still be in the socket."""
        if not read_socket and self._reader is not None:
            with self._lock:
                events = list(self._queue)
                self._queue.clear()
            return events
        with self._read_lock:
            with self._lock:
                events = list(self._queue)
                self._queue.clear()
            events.extend(self._read())
        return events

    def start_reader(self, on_events: Callable[[], None] | None = None) -> None:
        """Read the socket on a thread of its own from now on, calling on_events after
        each batch it queued.  Idempotent."""
        self._on_events = on_events
        if self._reader is None:
            self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                            name="kprobefs-procwatch")
            self._reader.start()

    def _read_loop(self) -> None:
        while not self._closed:
            try:
                ready, _, _ = select.select([self._sock], [], [], 0.2)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            with self._read_lock:
                got = self._read()
                with self._lock:
                    self._queue.extend(got)
            if not got:
                continue
            if self._on_events is not None:
                try:
                    self._on_events()
                except Exception:
                    log.exception("applying host process events failed")

    def _read(self) -> list[ProcessEvent]:
        """What the socket holds now (caller holds _read_lock)."""
        events: list[ProcessEvent] = []
        while True:
            try:
                data = self._sock.recv(self.RECV_SIZE)
            except BlockingIOError:
                return events
            except OSError as e:
                if e.errno == errno.ENOBUFS:     # overflowed: some events are lost
                    self.lost += 1
                    log.warning("host process events were lost (socket overflow)")
                    continue
                if e.errno == errno.EINTR:
                    continue
                log.error("reading host process events failed: %s", e)
                return events
            for event in _parse(data):
                kept = self._kept(event)
                if kept is not None:
                    events.append(kept)

    def close(self) -> None:
        self._closed = True
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout=2)
        try:
            self._sock.send(_control(PROC_CN_MCAST_IGNORE))
        except OSError:
            pass
        self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()


def _with_exec_comm(event: ProcessEvent) -> ProcessEvent:
    """An EXEC event with the new comm, read now: a short command (``/bin/true``) may be
    gone by the time the event is applied.  Read from /proc/PID/stat, which gives the
    CPU the process runs on after its exec too: its first request, a moment later, then
    makes no read of its own for it (hostproc.host_cpu)."""
    if event.what != EXEC:
        return event
    proc = host_process(event.pid)
    return event._replace(comm=proc.comm) if proc is not None and proc.comm else event


def _control(op: int) -> bytes:
    payload = struct.pack("<I", op)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn


def _parse(data: bytes) -> list[ProcessEvent]:
    """The events of one datagram (one or more netlink messages)."""
    out = []
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length = _NLMSGHDR.unpack_from(data, off)[0]
        if length < _NLMSGHDR.size:
            break
        msg = data[off:off + length]
        off += (length + 3) & ~3
        if len(msg) < _EVENT_DATA:
            continue
        idx, val = _CN_MSG.unpack_from(msg, _NLMSGHDR.size)[:2]
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC):
            continue
        what = _EVENT_HEADER.unpack_from(msg, _NLMSGHDR.size + _CN_MSG.size)[0]
        body = _EVENT_DATA
        if what == FORK and len(msg) >= body + _FORK.size:
            out.append(ProcessEvent(FORK, *_FORK.unpack_from(msg, body)))
        elif what == EXEC and len(msg) >= body + _EXEC.size:
            out.append(ProcessEvent(EXEC, *_EXEC.unpack_from(msg, body)))
        elif what == COMM and len(msg) >= body + _COMM.size:
            pid, tgid, comm = _COMM.unpack_from(msg, body)
            comm = comm.split(b"\0", 1)[0].decode("utf-8", "replace")
            out.append(ProcessEvent(COMM, pid, tgid, comm=comm))
        elif what == EXIT and len(msg) >= body + _EXIT.size:
            pid, tgid, code = _EXIT.unpack_from(msg, body)
            out.append(ProcessEvent(EXIT, pid, tgid, exit_code=code))
    return out


def host_exec_image(pid: int, comm: str) -> tuple[str, list[str]] | None:
    """What the host process exec'd: the program's path as it was most likely named
    (Linux takes the comm from that name, so a name whose basename is the comm is
    preferred to /proc/PID/exe, where symlinks are resolved: /bin/sh, not
    /usr/bin/dash) and its argv; None when the process is gone."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        argv = [a.decode("utf-8", "replace") for a in read_proc(f"/proc/{pid}/cmdline")
                .split(b"\0")[:-1]]
    except OSError:
        return None
    exe = exe.removesuffix(" (deleted)")
    if argv and argv[0].startswith("/") and os.path.basename(argv[0])[:15] == comm \
            and _resolves_to(argv[0], exe):
        return argv[0], argv
    return (comm and _on_path(comm, exe)) or exe, argv


_WHICH: dict[str, str | None] = {}
_WHICH_MAX = 512
#: path -> the program it resolved to last (os.path.realpath: a stat of each component).
_RESOLVED: dict[str, str] = {}


def _resolves_to(path: str, exe: str) -> bool:
    """Whether path names the program exe.  What it resolved to is remembered, and
    resolved again when that is not exe: a mirrored exec of the same program by the
    same name (every `sh` of a shell loop) makes no stat."""
    if _RESOLVED.get(path) == exe:
        return True
    if len(_RESOLVED) >= _WHICH_MAX:
        _RESOLVED.clear()
    _RESOLVED[path] = resolved = os.path.realpath(path)
    return resolved == exe


def _on_path(comm: str, exe: str) -> str | None:
    """The program named comm on PATH when it is exe.  shutil.which is remembered: a
    search of PATH is a stat per directory, and every mirrored exec of a program asks
    it again; PATH is searched anew when what was remembered is not exe."""
    found = _WHICH.get(comm)
    if found is not None and _resolves_to(found, exe):
        return found
    if len(_WHICH) >= _WHICH_MAX:
        _WHICH.clear()
    found = _WHICH[comm] = shutil.which(comm)
    return found if found is not None and _resolves_to(found, exe) else None
