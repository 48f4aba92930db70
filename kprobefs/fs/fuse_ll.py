"""FUSE spoken on ``/dev/fuse`` itself: the kernel's request protocol, without libfuse.

The daemon's default loop.  Through fusepy and libfuse2 (``fuse_ops``,
``KPROBEFS_FUSE=libfuse``) each request takes a trip through libfuse's path table and
ctypes marshalling both ways, and is answered only by the thread that took it.  Here a
pool of threads reads requests off the device and answers them with one write each, the
structures packed by :mod:`struct` as ``<linux/fuse.h>`` lays them out (protocol 7.31),
and a request held in the machine can be answered from another thread (see
:meth:`FuseSession._watch_stuck`).  The behaviour is the fusepy
adapter's, point for point (see :mod:`.fuse_ops` for why each is so): sizes 0 but
``trace_pipe_raw``'s, ``direct_io`` opens, streams nonseekable, ``O_TRUNC`` in OPEN,
one write(2) one request, FLUSH closes the process's emulated fd, modes from the emulated
kernel, no xattrs.

What differs from libfuse2, on purpose: directory entries carry their type (as tracefs's
do), an unlinked open file is not renamed to ``.fuse_hidden*`` (tracefs never does),
``fcntl`` locks stay with the host's kernel (local locks, as on tracefs), the pool is
not capped at libfuse's 10 threads (blocked ``trace_pipe`` readers each hold one), and
poll(2) is answered (POLL, then a FUSE_NOTIFY_POLL once records come: an empty
``trace_pipe`` is not readable), where fusepy has no poll and every file is ready.

Node ids are the daemon's: a path gets one at its first LOOKUP and keeps it until the
kernel forgets it (FORGET counts down its lookups); ``st_ino`` is the node id, as
libfuse's.  A lookup of a name that stays while its directory does (tracefs's own
files, the mount's top-level names: :attr:`Attributes.stable`) may be cached by the
host, as its dcache keeps tracefs's dentries; an event's or an instance's name, or one
in the kernel's tmp or proc, is asked again at each walk.

Mounting is mount(2) as root, else the set-uid ``fusermount3`` (FUSE 3) or ``fusermount``
(FUSE 2), whichever is on PATH, mounts and hands the device back over a socket (their
common ``_FUSE_COMMFD`` protocol).  Files are owned by the user who mounted (root under
root), as FUSE's ``user_id`` says: with ``default_permissions`` the host's kernel checks
the modes against them, and without ``allow_other`` it shuts everyone else out.
"""

from __future__ import annotations

import array
import ctypes
import ctypes.util
import errno
import functools
import logging
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from typing import Callable

from .gateway import Attributes, Caller, Gateway
from .hostproc import own_mounts

__all__ = ["FuseSession", "attributes", "unmount", "find_fusermount", "FUSERMOUNTS",
           "STREAM_SIZE", "MAX_WRITE", "STREAMS"]

log = logging.getLogger("kprobefs.fs.fuse")

#: One write(2) is one request up to this size (32 pages: Linux's cap without max_pages).
MAX_WRITE = 128 * 1024
#: The size ``trace_pipe_raw`` reports so that the host's splice goes on reading.
STREAM_SIZE = 1 << 40
#: Files that are streams in Linux (nonseekable_open); the first is spliced by trace-cmd.
SPLICED = "trace_pipe_raw"
STREAMS = (SPLICED, "trace_pipe")
#: How long the host caches a node's attributes (s).
ATTR_TIMEOUT = 1.0
_ATTR_VALID = (int(ATTR_TIMEOUT), int(ATTR_TIMEOUT % 1 * 1_000_000_000))   # (s, ns)
#: How long the host caches a lookup of a name that stays while its directory does
#: (Attributes.stable: tracefs's own files, the mount's top-level names); every other
#: name (events, instances, proc, tmp) is looked up at each walk, so that one that went
#: away is gone at once.  The host revalidates each component of a walk on its own: a
#: stable name below one that went away goes with it.
ENTRY_TIMEOUT = 60

_IN = struct.Struct("<IIQQIIIHH")           # fuse_in_header
_OUT = struct.Struct("<IiQ")                # fuse_out_header
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_ENTRY = struct.Struct("<QQQQII")           # fuse_entry_out, less its attr
_ATTR_OUT = struct.Struct("<QII")           # fuse_attr_out, less its attr
_OPEN_OUT = struct.Struct("<QII")
_WRITE_IN = struct.Struct("<QQIIQII")
_READ_IN = _WRITE_IN
_SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
_CREATE_IN = struct.Struct("<IIII")
_DIRENT = struct.Struct("<QQII")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_PAIR = struct.Struct("<QQ")
_INVAL_ENTRY = struct.Struct("<QII")        # fuse_notify_inval_entry_out: parent, namelen, flags
_POLL_IN = struct.Struct("<QQII")           # fuse_poll_in: fh, kh, flags, events

# opcodes
(LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK, MKNOD, MKDIR, UNLINK, RMDIR,
 RENAME, LINK, OPEN, READ, WRITE, STATFS, RELEASE, FSYNC, SETXATTR, GETXATTR, LISTXATTR,
 REMOVEXATTR, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS, CREATE,
 INTERRUPT, DESTROY, IOCTL, POLL, BATCH_FORGET) = (
    1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25,
    26, 27, 28, 29, 30, 34, 35, 36, 38, 39, 40, 42)
_NO_REPLY = (FORGET, BATCH_FORGET)
#: A notification's code (sent with unique 0, the code in the error field).
FUSE_NOTIFY_POLL = 1
FUSE_NOTIFY_INVAL_ENTRY = 3
FUSE_POLL_SCHEDULE_NOTIFY = 1 << 0

FUSE_ASYNC_READ, FUSE_ATOMIC_O_TRUNC, FUSE_BIG_WRITES = 1 << 0, 1 << 3, 1 << 5
FOPEN_DIRECT_IO, FOPEN_NONSEEKABLE = 1 << 0, 1 << 2
FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ROOT_ID = 1
_MS_NOSUID, _MS_NODEV = 2, 4
#: Threads reading the device at most (each blocked reader holds one).
MAX_THREADS = 64


def attributes(gateway: Gateway, path: str, caller: Caller, mounted_at: int) -> dict:
    """A path's attributes as the mount shows them (fusepy's getattr dict)."""
    return _shown(path, gateway.getattr(path, caller), mounted_at, _mounting_user())


def _mounting_user() -> tuple[int, int]:
    """(uid, gid) the mount belongs to: this process's real ids, which mount(2)'s
    ``user_id`` and ``group_id`` are given, and which fusermount passes on."""
    return os.getuid(), os.getgid()


def _shown(path: str, a: Attributes, mounted_at: int, owner: tuple[int, int]) -> dict:
    """Attributes as the mount shows them: the emulated kernel's mode and link count; a
    regular file where the kernel has a device (this nodev mount could not open one,
    and the daemon serves them); size 0 but ``trace_pipe_raw``'s; owned by owner, the
    mounting user (root's mount: root's, as tracefs's files are); times of the mount
    (hostfs keeps no inodes)."""
    mode = _shown_kind(a.mode) | stat.S_IMODE(a.mode)
    spliced = stat.S_ISREG(mode) and os.path.basename(path) == SPLICED
    return {"st_mode": mode, "st_ino": a.ino, "st_nlink": a.nlink or 1,
            "st_uid": owner[0], "st_gid": owner[1],
            "st_size": STREAM_SIZE if spliced else 0, "st_blocks": 0,
            "st_atime": mounted_at, "st_mtime": mounted_at, "st_ctime": mounted_at}


def _shown_kind(mode: int) -> int:
    """The file type the mount gives a kernel mode: a regular file for none, and for the
    kernel's devices (/dev/null), served by its own drivers through the daemon: this
    nodev mount could not open a device node."""
    kind = stat.S_IFMT(mode)
    return stat.S_IFREG if kind in (0, stat.S_IFCHR, stat.S_IFBLK) else kind


def _pack_attr(nodeid: int, at: dict) -> bytes:
    t = at["st_mtime"]
    sec, nsec = divmod(t, 1_000_000_000)
    return _ATTR.pack(nodeid, at["st_size"], 0, sec, sec, sec, nsec, nsec, nsec,
                      at["st_mode"], at["st_nlink"], at["st_uid"], at["st_gid"], 0, 4096, 0)


def _names(body: bytes, count: int) -> list[str]:
    """The NUL-terminated names at the start of a request's body."""
    out, at = [], 0
    for _ in range(count):
        end = body.index(b"\0", at)
        out.append(os.fsdecode(body[at:end]))
        at = end + 1
    return out


class _Nodes:
    """Node id <-> mount-relative path, with each node's lookup count."""

    def __init__(self):
        self._lock = threading.Lock()
        self._path = {ROOT_ID: "/"}
        self._id = {"/": ROOT_ID}
        self._count = {ROOT_ID: 1}
        self._next = ROOT_ID + 1

    def path(self, nodeid: int) -> str:
        """The node's path; ENOENT once its name was removed (or never known)."""
        path = self._path.get(nodeid)
        if path is None:
            raise OSError(errno.ENOENT, "No such file or directory")
        return path

    def child(self, nodeid: int, name: str) -> str:
        parent = self.path(nodeid)
        return ("/" if parent == "/" else parent + "/") + name

    def looked_up(self, path: str) -> int:
        """The node id for path, its lookup count one up."""
        with self._lock:
            nodeid = self._id.get(path)
            if nodeid is None:
                nodeid, self._next = self._next, self._next + 1
                self._id[path], self._path[nodeid] = nodeid, path
                self._count[nodeid] = 0
            self._count[nodeid] += 1
            return nodeid

    def forget(self, nodeid: int, n: int) -> None:
        with self._lock:
            left = self._count.get(nodeid, 0) - n
            if left > 0 or nodeid == ROOT_ID:
                self._count[nodeid] = max(left, 1)
                return
            self._count.pop(nodeid, None)
            path = self._path.pop(nodeid, None)
            if path is not None and self._id.get(path) == nodeid:
                del self._id[path]

    def __len__(self) -> int:
        return len(self._count)

    def named(self) -> list[tuple[int, str]]:
        """(node id, path) of every node that has a path, the root's aside."""
        with self._lock:
            return [(nid, path) for nid, path in self._path.items()
                    if path is not None and nid != ROOT_ID]

    def id_of(self, path: str) -> int | None:
        return self._id.get(path)

    def removed(self, path: str) -> None:
        """path's name is gone: its node (still counted) has no path any more."""
        with self._lock:
            nodeid = self._id.pop(path, None)
            if nodeid is not None:
                self._path[nodeid] = None

    def renamed(self, old: str, new: str) -> None:
        """old (and everything under it) is new now; what new named before is gone."""
        with self._lock:
            gone = self._id.pop(new, None)
            if gone is not None:
                self._path[gone] = None
            prefix = old + "/"
            for path in [p for p in self._id if p == old or p.startswith(prefix)]:
                nodeid = self._id.pop(path)
                moved = new + path[len(old):]
                self._id[moved], self._path[nodeid] = nodeid, moved


class _Request:
    """A request being answered: replied to once, by its thread or the stuck watch."""

    __slots__ = ("unique", "op", "answered")

    def __init__(self, unique: int, op: int):
        self.unique, self.op, self.answered = unique, op, False


class FuseSession:
    """One mount of the gateway's files, served from ``/dev/fuse`` by a pool of threads.
    ``on_init`` runs as the kernel's INIT is answered (the daemon starts its threads
    there), ``on_destroy`` once the mount is gone."""

    def __init__(self, gateway: Gateway, mountpoint: str, allow_other: bool = False,
                 on_init: Callable[[], None] | None = None,
                 on_destroy: Callable[[], None] | None = None):
        self.gateway = gateway
        self.mountpoint = os.path.abspath(mountpoint)
        # as /proc/self/mountinfo names it (resolved now: once mounted, resolving the
        # mount point itself would stat it, a request to this very mount)
        self._where = os.path.join(os.path.realpath(os.path.dirname(self.mountpoint)),
                                   os.path.basename(self.mountpoint))
        self.allow_other = allow_other
        self._owner = _mounting_user()
        self._on_init, self._on_destroy = on_init, on_destroy
        self._mounted_at = 0
        self._fd = -1
        self._nodes = _Nodes()
        self._sweep_at = self.NODES_SWEEP_AT
        self._dirs: dict[int, list] = {}     # opendir fh -> its entries once read
        self._next_dir = 1
        self._pool = threading.Lock()
        self._workers = 0       # threads reading the device
        self._idle = 0
        self._gone = threading.Event()
        self._device: tuple[int, int] | None = None     # the mount's, once mounted
        self._destroyed = False
        self._inflight: dict[int, _Request] = {}    # thread ident -> its request
        eperm, no_xattr = _failing(errno.EPERM), _failing(errno.EOPNOTSUPP)
        self._ops = {
            LOOKUP: self._lookup, GETATTR: self._getattr, SETATTR: self._setattr,
            READLINK: self._readlink, SYMLINK: self._symlink, MKNOD: eperm,
            MKDIR: self._mkdir, UNLINK: self._unlink, RMDIR: self._rmdir,
            RENAME: self._rename, LINK: eperm, OPEN: self._open, READ: self._read,
            WRITE: self._write, STATFS: self._statfs, RELEASE: self._release,
            FSYNC: self._zero, SETXATTR: no_xattr, GETXATTR: no_xattr,
            LISTXATTR: self._listxattr, REMOVEXATTR: no_xattr, INIT: self._init,
            OPENDIR: self._opendir, READDIR: self._readdir,
            RELEASEDIR: self._releasedir, FSYNCDIR: self._zero, ACCESS: self._access,
            CREATE: self._create, DESTROY: self._zero, IOCTL: _failing(errno.ENOTTY),
            FORGET: self._forget, BATCH_FORGET: self._batch_forget,
            FLUSH: self._flush, POLL: self._poll,
        }
        # INTERRUPT has no handler: answered ENOSYS, the kernel sends no more (a request
        # blocked on a reader's data notices its caller's signal itself, gateway._block).

    # ==== mount, serve, unmount ==========================================================
    def mount(self) -> None:
        """Mounts (OSError when the kernel or fusermount refuses)."""
        self._mounted_at = time.time_ns()
        opts = "default_permissions" + (",allow_other" if self.allow_other else "")
        if os.geteuid() == 0:
            fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
            data = (f"fd={fd},rootmode=40000,user_id={os.getuid()},"
                    f"group_id={os.getgid()},{opts}")
            if _libc().mount(b"debugfs", os.fsencode(self.mountpoint), b"fuse.kprobefs",
                          _MS_NOSUID | _MS_NODEV, data.encode()) != 0:
                err = ctypes.get_errno()
                os.close(fd)
                raise OSError(err, f"mount: {os.strerror(err)}", self.mountpoint)
        else:
            fd = self._fusermount(f"fsname=debugfs,subtype=kprobefs,{opts}")
        self._fd = fd
        self._device = mount_device(self._where)

    def _fusermount(self, opts: str) -> int:
        """The device fd fusermount opens and mounts for a user, sent back over a
        socket named by _FUSE_COMMFD."""
        helper = find_fusermount()
        if helper is None:
            raise OSError(errno.ENOENT, f"no {' or '.join(FUSERMOUNTS)} on PATH")
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            env = dict(os.environ, _FUSE_COMMFD=str(theirs.fileno()))
            r = subprocess.run([helper, "-o", opts, "--", self.mountpoint], env=env,
                               pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                               capture_output=True, text=True)
            theirs.close()
            if r.returncode != 0:
                # its message names itself ("fusermount3: ...")
                raise OSError(errno.EPERM, r.stderr.strip() or
                              f"{helper} exited {r.returncode}")
            fds = array.array("i")
            _msg, anc, _flags, _addr = ours.recvmsg(1, socket.CMSG_LEN(fds.itemsize))
            for level, kind, data in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(data[:fds.itemsize])
            if not fds:
                raise OSError(errno.EIO, "fusermount sent no device")
            os.set_inheritable(fds[0], False)
            return fds[0]
        finally:
            theirs.close()
            ours.close()

    def serve(self) -> None:
        """Answers requests until the mount goes (unmounted, or, served from the main
        thread, SIGINT/SIGTERM/SIGHUP, which unmount).  Call after mount()."""
        stop = lambda *_: self.unmount()      # noqa: E731
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM,
                                                        signal.SIGHUP)}
        try:
            self._spawn()
            threading.Thread(target=self._watch_stuck, daemon=True,
                             name="kprobefs-fuse-watch").start()
            while not self._gone.wait(0.5):
                pass
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self._finish()

    def unmount(self) -> None:
        """Stops serving, from a thread of its own (a signal handler calls it): the
        mount is unmounted lazily, unless what is mounted at its path now is another
        one (ours was unmounted already, and the path reused); the threads see the
        device go and stop.  A mount that stays in use after that (a process holds a
        file or its directory there, a ``trace_pipe`` reader waits, another mount
        namespace has a copy) keeps the connection alive: after SHUTDOWN_GRACE seconds
        the connection is aborted, as ``umount -f`` would, and its users get ENOTCONN
        from then on."""
        threading.Thread(target=self._stop, daemon=True, name="kprobefs-unmount").start()

    #: How long a stop waits for the mount's users to let go before it aborts it (s).
    SHUTDOWN_GRACE = 2.0

    def _stop(self) -> None:
        if self._device is None or mount_device(self._where) == self._device:
            unmount(self.mountpoint, lazy=True)
        if self._gone.wait(self.SHUTDOWN_GRACE):
            return
        log.warning("%s is still in use after it was unmounted: its connection is "
                    "aborted", self.mountpoint)
        if self._device is not None:
            abort = f"/sys/fs/fuse/connections/{self._device[1]}/abort"
            try:
                with open(abort, "w") as f:
                    f.write("1")
            except OSError as e:
                log.debug("%s: %s", abort, e)
        self._gone.set()        # the threads still reading go with the process

    def _finish(self) -> None:
        if not self._destroyed:
            self._destroyed = True
            if self._on_destroy is not None:
                self._on_destroy()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ==== the threads ====================================================================
    def _spawn(self) -> None:
        """One more reading thread (caller holds no lock)."""
        t = threading.Thread(target=self._worker, daemon=True, name="kprobefs-fuse")
        with self._pool:
            self._workers += 1
            self._idle += 1
        t.start()

    def _worker(self) -> None:
        # One buffer a thread, read into: a new one a request (os.read's) is a block past
        # the heap's mapping threshold, mapped and unmapped each time, about 30 µs.
        into = bytearray(MAX_WRITE + 4096)
        view = memoryview(into)
        while not self._gone.is_set():
            try:
                buf = bytes(view[:os.readv(self._fd, (into,))])
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                    continue        # ENOENT: the request was interrupted before we read it
                if e.errno not in (errno.ENODEV, errno.EBADF):
                    log.error("reading /dev/fuse failed: %s", e)
                self._gone.set()
                return
            with self._pool:
                self._idle -= 1
                more = self._idle == 0 and self._workers < MAX_THREADS
            if more:
                self._spawn()
            request = err = data = None
            try:
                request, err, data = self._handle(buf)
            finally:
                # Counted idle before its reply is written: the caller that reply wakes
                # makes its next request at once, and another thread, idle already,
                # takes it (counted busy meanwhile, this one made the pool grow by a
                # thread at nearly every request).
                with self._pool:
                    self._idle += 1
                    send = request is not None and not request.answered
                    if send:
                        request.answered = True
            if send:
                self._reply(request.unique, err, data, keep_gil=request.op == READ)

    def _handle(self, buf: bytes) -> tuple["_Request | None", int, bytes]:
        """Runs one request; returns (the request, errno, data) to answer it with, the
        request None when it takes no answer."""
        _len, op, unique, nodeid, uid, gid, pid, _ext, _pad = _IN.unpack_from(buf)
        body = buf[_IN.size:]
        handler = self._ops.get(op)
        request = _Request(unique, op)
        me = threading.get_ident()
        self._inflight[me] = request
        try:
            if handler is None:
                raise OSError(errno.ENOSYS, "not implemented")
            out = handler(nodeid, body, Caller(pid, uid, gid))
        except OSError as e:
            err = e.errno
            if not (isinstance(err, int) and 0 < err < 4096):
                log.error("request %d on node %d failed: %r", op, nodeid, e)
                err = errno.EIO
            return request, err, b""
        except Exception:
            log.exception("request %d on node %d failed", op, nodeid)
            return request, errno.EIO, b""
        finally:
            self._inflight.pop(me, None)
        if op in _NO_REPLY:
            return None, 0, b""
        return request, 0, out or b""

    def _answer(self, request: "_Request", err: int, data: bytes = b"") -> None:
        """Replies to request unless it was answered already (once only)."""
        with self._pool:
            if request.answered:
                return
            request.answered = True
        self._reply(request.unique, err, data)

    def _watch_stuck(self) -> None:
        """Answers EIO to a request whose thread drives the machine and is held there
        past the gateway's timeout (a hook that does not return): its caller goes on,
        as it would from a request that waits for the machine thread.  The thread
        itself stays where it is, and the machine with it, until the hook returns."""
        kernel = self.gateway.kernel
        while not self._gone.wait(0.5):
            driver = getattr(kernel, "driver", None)
            if driver is None or time.monotonic() - driver[1] < self.gateway.timeout:
                continue
            request = self._inflight.get(driver[0])
            if request is None or request.answered:
                continue
            log.error("request %d (opcode %d) has driven the machine for %.0f s: "
                      "answered EIO", request.unique, request.op,
                      time.monotonic() - driver[1])
            self._answer(request, errno.EIO)

    def _reply(self, unique: int, err: int, data: bytes = b"", keep_gil: bool = False) -> None:
        """Writes the answer to request unique; with keep_gil, keeping the interpreter's
        lock (see _write_keeping_gil)."""
        reply = _OUT.pack(_OUT.size + len(data), -err, unique) + data
        try:
            if not keep_gil:
                os.write(self._fd, reply)
                return
            while _write_keeping_gil(self._fd, reply, len(reply)) < 0:
                e = ctypes.get_errno()
                if e != errno.EINTR:
                    raise OSError(e, os.strerror(e))
        except OSError as e:
            # ENOENT: the request was interrupted (its caller is gone); ENODEV: unmounted.
            if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                log.error("answering request %d failed: %s", unique, e)

    # ==== requests =======================================================================
    def _init(self, _nodeid, body, _caller) -> bytes:
        major, minor, _readahead, flags = struct.unpack_from("<IIII", body)
        if major != 7 or minor < 31:
            raise OSError(errno.EPROTO, f"FUSE protocol {major}.{minor} is too old")
        if self._on_init is not None:
            self._on_init()
        want = flags & (FUSE_ASYNC_READ | FUSE_ATOMIC_O_TRUNC | FUSE_BIG_WRITES)
        return struct.pack("<IIIIHHIIHHI7I", 7, 31, 0, want, 12, 9, MAX_WRITE, 1, 0, 0, 0,
                           *([0] * 7))

    def _entry(self, path: str, caller: Caller) -> bytes:
        """LOOKUP's answer for path (its node counted once more)."""
        a = self.gateway.getattr(path, caller)
        nodeid = self._nodes.looked_up(path)
        sec, nsec = _ATTR_VALID
        return _ENTRY.pack(nodeid, 0, ENTRY_TIMEOUT if a.stable else 0, sec, 0, nsec) + \
            _pack_attr(nodeid, _shown(path, a, self._mounted_at, self._owner))

    def _lookup(self, nodeid, body, caller) -> bytes:
        return self._entry(self._nodes.child(nodeid, _names(body, 1)[0]), caller)

    def _forget(self, nodeid, body, _caller) -> None:
        self._nodes.forget(nodeid, _U64.unpack_from(body)[0])

    def _batch_forget(self, _nodeid, body, _caller) -> None:
        count = _U32.unpack_from(body)[0]
        for i in range(count):
            nodeid, n = _PAIR.unpack_from(body, 8 + 16 * i)
            self._nodes.forget(nodeid, n)

    def _attr_out(self, nodeid: int, path: str, caller: Caller) -> bytes:
        at = _shown(path, self.gateway.getattr(path, caller), self._mounted_at, self._owner)
        return _ATTR_OUT.pack(*_ATTR_VALID, 0) + _pack_attr(nodeid, at)

    def _getattr(self, nodeid, _body, caller) -> bytes:
        return self._attr_out(nodeid, self._nodes.path(nodeid), caller)

    def _setattr(self, nodeid, body, caller) -> bytes:
        """chmod and chown are EPERM (tracefs keeps root's modes here); a size is the
        truncation (0: the "clear" action); times change nothing."""
        fields = _SETATTR_IN.unpack_from(body)
        valid, size = fields[0], fields[3]
        path = self._nodes.path(nodeid)
        if valid & (FATTR_MODE | FATTR_UID | FATTR_GID):
            raise OSError(errno.EPERM, "Operation not permitted")
        if valid & FATTR_SIZE:
            self.gateway.truncate(path, size, caller)
        return self._attr_out(nodeid, path, caller)

    def _readlink(self, nodeid, _body, caller) -> bytes:
        return os.fsencode(self.gateway.readlink(self._nodes.path(nodeid), caller))

    def _symlink(self, nodeid, body, caller) -> bytes:
        name, target = _names(body, 2)
        path = self._nodes.child(nodeid, name)
        self.gateway.symlink(path, target, caller)
        return self._entry(path, caller)

    def _mkdir(self, nodeid, body, caller) -> bytes:
        mode = _U32.unpack_from(body)[0]
        path = self._nodes.child(nodeid, _names(body[8:], 1)[0])
        self.gateway.mkdir(path, mode & 0o7777, caller)
        return self._entry(path, caller)

    def _unlink(self, nodeid, body, caller) -> None:
        path = self._nodes.child(nodeid, _names(body, 1)[0])
        self.gateway.unlink(path, caller)
        self._nodes.removed(path)

    def _rmdir(self, nodeid, body, caller) -> None:
        path = self._nodes.child(nodeid, _names(body, 1)[0])
        self.gateway.rmdir(path, caller)
        self._nodes.removed(path)

    def _rename(self, nodeid, body, caller) -> None:
        newdir = _U64.unpack_from(body)[0]
        old_name, new_name = _names(body[8:], 2)
        old = self._nodes.child(nodeid, old_name)
        new = self._nodes.child(newdir, new_name)
        self.gateway.rename(old, new, caller)
        self._nodes.renamed(old, new)

    def _open_flags(self, path: str) -> int:
        stream = os.path.basename(path) in STREAMS
        return FOPEN_DIRECT_IO | (FOPEN_NONSEEKABLE if stream else 0)

    def _open(self, nodeid, body, caller) -> bytes:
        flags = _U32.unpack_from(body)[0]
        path = self._nodes.path(nodeid)
        fh = self.gateway.open(path, flags, caller)
        return _OPEN_OUT.pack(fh, self._open_flags(path), 0)

    def _create(self, nodeid, body, caller) -> bytes:
        flags, mode, _umask, _open_flags = _CREATE_IN.unpack_from(body)
        path = self._nodes.child(nodeid, _names(body[_CREATE_IN.size:], 1)[0])
        fh = self.gateway.open(path, flags | os.O_CREAT, caller, mode & 0o7777)
        try:
            entry = self._entry(path, caller)
        except OSError:
            self.gateway.release(fh)
            raise
        return entry + _OPEN_OUT.pack(fh, self._open_flags(path), 0)

    def _read(self, _nodeid, body, caller) -> bytes:
        fh, offset, size, _rflags, _owner, flags, _pad = _READ_IN.unpack_from(body)
        return self.gateway.read(fh, size, offset, caller, flags)

    def _write(self, _nodeid, body, caller) -> bytes:
        fh, offset, size, _wflags, _owner, _flags, _pad = _WRITE_IN.unpack_from(body)
        data = bytes(body[_WRITE_IN.size:_WRITE_IN.size + size])
        return struct.pack("<II", self.gateway.write(fh, data, offset, caller), 0)

    def _poll(self, _nodeid, body, caller) -> bytes:
        """poll(2), select(2) and epoll: the events ready now (Gateway.poll).  When the
        host asks to be told (SCHEDULE_NOTIFY: someone waits) and nothing is ready, a
        FUSE_NOTIFY_POLL for the file's kernel handle ``kh`` wakes its waiters later."""
        fh, kh, flags, _events = _POLL_IN.unpack_from(body)
        wakeup = None
        if flags & FUSE_POLL_SCHEDULE_NOTIFY:
            wakeup = lambda: self._notify(FUSE_NOTIFY_POLL, _U64.pack(kh))  # noqa: E731
        return struct.pack("<II", self.gateway.poll(fh, caller, wakeup), 0)

    #: When the host holds this many nodes, the names that went away without its knowing
    #: are swept (see sweep_nodes), then again at twice the nodes the sweep found there.
    NODES_SWEEP_AT = 4096

    def sweep_nodes(self, exists: Callable[[str], bool]) -> int:
        """Once the host holds NODES_SWEEP_AT nodes or more, tells it to drop its entries
        of names that went away without a request of its own (an event removed through
        ``kprobe_events``, an instance's files once another process removed it): it keeps
        a lookup of a fixed name for ENTRY_TIMEOUT, and a directory entry with such a
        child stays in its dcache until its memory runs short, holding the nodes here
        for good.  FUSE_NOTIFY_INVAL_ENTRY of the topmost gone name of each makes the
        host drop it and what is below it and FORGET their nodes, as tracefs removes a
        removed event's dentries.  Returns how many names were told.  Runs on a thread
        that serves no request: the host takes the directory's lock to drop an entry."""
        if len(self._nodes) < self._sweep_at:
            return 0
        known: dict[str, bool] = {"/": True}

        def there(path: str) -> bool:
            if path not in known:
                known[path] = exists(path)
            return known[path]

        told = 0
        for _nodeid, path in self._nodes.named():
            parent, _, name = path.rpartition("/")
            parent = parent or "/"
            if there(path) or not there(parent):
                continue
            parent_id = self._nodes.id_of(parent)
            if parent_id is not None:
                encoded = os.fsencode(name)
                self._notify(FUSE_NOTIFY_INVAL_ENTRY,
                             _INVAL_ENTRY.pack(parent_id, len(encoded), 0) + encoded + b"\0")
                told += 1
        self._sweep_at = max(self.NODES_SWEEP_AT,
                             2 * sum(1 for path, here in known.items() if here))
        return told

    def _notify(self, code: int, data: bytes) -> None:
        """Writes a notification (unique 0, the code where a reply has its error)."""
        try:
            os.write(self._fd, _OUT.pack(_OUT.size + len(data), code, 0) + data)
        except OSError as e:
            # ENOENT: no one polls that file any more; ENODEV, EBADF: unmounted.
            if e.errno not in (errno.ENOENT, errno.ENODEV, errno.EBADF):
                log.error("notification %d failed: %s", code, e)

    def _release(self, _nodeid, body, _caller) -> None:
        self.gateway.release(_U64.unpack_from(body)[0])

    def _flush(self, _nodeid, body, caller) -> None:
        """close(2) of a descriptor, answered before close returns (see Gateway.flush:
        its look is made in this thread, and the FLUSH answered from the gateway's
        watch when the look is held up)."""
        request = self._inflight.get(threading.get_ident())
        answer = None if request is None else lambda: self._answer(request, 0)
        self.gateway.flush(_U64.unpack_from(body)[0], caller, answer)

    def _statfs(self, _nodeid, _body, _caller) -> bytes:
        return struct.pack("<QQQQQIIII6I", 0, 0, 0, 0, 0, 4096, 255, 4096, 0, *([0] * 6))

    def _access(self, nodeid, _body, caller) -> None:
        # default_permissions makes the kernel check modes; only existence is ours.
        self.gateway.getattr(self._nodes.path(nodeid), caller)

    def _opendir(self, nodeid, _body, _caller) -> bytes:
        self._nodes.path(nodeid)
        with self._pool:
            fh, self._next_dir = self._next_dir, self._next_dir + 1
            self._dirs[fh] = []
        return _OPEN_OUT.pack(fh, 0, 0)

    def _readdir(self, nodeid, body, caller) -> bytes:
        """The directory's entries from ``offset`` on, as many as fit in ``size``; the
        listing is read at offset 0 and kept for the open directory (libfuse does the
        same), so that a directory that changes meanwhile is listed once."""
        fh, offset, size = _READ_IN.unpack_from(body)[:3]
        entries = self._dirs.get(fh)
        if entries is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        if offset == 0:
            path = self._nodes.path(nodeid)
            names = self.gateway.readdir(path, caller)
            listed = {name for name, _mode in names}
            entries[:] = [(dot, stat.S_IFDIR) for dot in (".", "..") if dot not in listed]
            entries += names
        out = bytearray()
        for i in range(offset, len(entries)):
            name, mode = entries[i]
            raw = os.fsencode(name)
            rec = _DIRENT.pack(0xFFFFFFFF, i + 1, len(raw), _shown_kind(mode) >> 12) + raw
            rec += b"\0" * (-len(rec) % 8)
            if len(out) + len(rec) > size:
                break
            out += rec
        return bytes(out)

    def _releasedir(self, _nodeid, body, _caller) -> None:
        self._dirs.pop(_U64.unpack_from(body)[0], None)

    def _listxattr(self, _nodeid, body, _caller) -> bytes:
        # no attributes: the size asked first is 0, the list itself empty
        return struct.pack("<II", 0, 0) if _U32.unpack_from(body)[0] == 0 else b""

    @staticmethod
    def _zero(_nodeid, _body, _caller) -> None:
        return None


def _failing(err: int) -> Callable:
    """A request handler that answers err."""
    def handler(_nodeid, _body, _caller):
        raise OSError(err, os.strerror(err))
    return handler


#: libc's file, found once as the module loads: ctypes.util.find_library runs a helper
#: program, and the fork that starts it at unmount would hold the daemon's files on the
#: mount (and /dev/fuse) while the mount goes: a FLUSH of a file the child closes would
#: then wait forever for the threads that have stopped, the connection held by the child.
_LIBC_PATH = ctypes.util.find_library("c")


@functools.cache
def _libc():
    return ctypes.CDLL(_LIBC_PATH, use_errno=True)


def _gil_keeping_write():
    """write(2) called with the interpreter's lock kept (PyDLL).  A READ's reply is
    written so: its caller, reading on, makes its next request at once, which another
    thread of the pool takes; had the write let the lock go, this thread would take it
    back on its way to read the device again, in the middle of that request's
    emulation, whose next hook then waits for the lock to come back through a sleep and
    a wake-up.  The write does not block (it copies the reply and wakes the caller),
    but the caller it wakes may take this thread's CPU: other replies let the lock go,
    since after them a shell goes on with its own work meanwhile (the daemon's other
    threads, which mirror its forks and execs, would wait; an `echo >>` took a tenth
    longer)."""
    write = ctypes.PyDLL(_LIBC_PATH, use_errno=True).write
    write.restype = ctypes.c_ssize_t
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    return write


_write_keeping_gil = _gil_keeping_write()


#: The set-uid helpers that mount and unmount FUSE for a user, FUSE 3's first: Debian's
#: fuse3 installs fusermount3 (and fusermount as a link to it); its fuse, which Breaks
#: fuse3, installs FUSE 2's fusermount.
FUSERMOUNTS = ("fusermount3", "fusermount")


def find_fusermount() -> str | None:
    """The path of the first of FUSERMOUNTS on PATH, or None."""
    for name in FUSERMOUNTS:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def _run_quietly(argv: list[str]) -> bool:
    if argv[0] is None or shutil.which(argv[0]) is None:
        return False
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


_MNT_DETACH = 2


def mount_device(where: str) -> tuple[int, int] | None:
    """(major, minor) of the FUSE mount on top at where, a path without symlinks (the
    minor is its connection's number under /sys/fs/fuse/connections); None when none
    is there.  Read from /proc/self/mountinfo: a stat of the path would be a request
    to the mount itself."""
    on_top = [m for m in own_mounts() if m.point == where and m.fstype.startswith("fuse")]
    return on_top[-1].device if on_top else None


def unmount(path: str, lazy: bool = False) -> bool:
    """Unmounts a FUSE mount: umount(2) as root (so neither Debian's ``fuse`` package,
    which apt will not install beside ``fuse3``, nor util-linux's ``umount`` is needed),
    else fusermount3 or fusermount (the set-uid helper, find_fusermount), else
    umount(8); True on success."""
    if os.geteuid() == 0 and \
            _libc().umount2(os.fsencode(path), _MNT_DETACH if lazy else 0) == 0:
        return True
    helper = find_fusermount()
    if lazy:
        return _run_quietly([helper, "-u", "-z", path]) or \
            _run_quietly(["umount", "-l", path])
    return _run_quietly([helper, "-u", path]) or _run_quietly(["umount", path])
