"""Test doubles for the filesystem layer: a fake kernel whose "emulated VFS" speaks the
hostfs hypercall protocol exactly as kernel/fs/hostfs.c does (lookup per path component,
16 KiB read chunks, one write call, READDIR by index into a 264-byte buffer), plus a
small engine and tracer following the engine's names and the FILE PROTOCOL.

Run as a script it is the ``kprobefs`` CLI with these fakes plugged in:
``python tests/fs_fakes.py mount [--foreground] MNT`` (kprobefs must be importable:
installed, or on PYTHONPATH as test_fs_mount.py arranges).
"""

from __future__ import annotations

import collections
import errno
import os
import stat
import struct
import sys
import threading
import time

from kprobefs.errors import KernelError, KernelWedged
from kprobefs.fs.tree import (
    HC_HOSTFS_LOOKUP, HC_HOSTFS_OPEN, HC_HOSTFS_READ, HC_HOSTFS_READDIR,
    HC_HOSTFS_RELEASE, HC_HOSTFS_WRITE, BoolKnob, Directory, TextFile, wants_write,
)
from kprobefs.machine.kernel import ProcessExited, SyscallRequest, UserBuffer
from kprobefs.machine.memory import FaultError

KBASE = 0xFFFF888000000000
MOUNTS = {"/sys/kernel/debug": 1, "/sys/kernel/tracing": 2, "/proc": 3}
RAM_DIRS = {"/", "/sys", "/sys/kernel", "/tmp"}
READ_CHUNK = 16 * 1024
O_ACCMODE, O_CREAT, O_TRUNC, O_DIRECTORY = 0o3, 0o100, 0o1000, 0o200000


class FakeTask:
    def __init__(self, pid: int, comm: str):
        self.pid = pid
        self.comm = comm
        self.state = "user"
        self.exit_code = None
        self.fds: dict[int, dict] = {}


class FakeKernel:
    """Enough of kprobefs.machine.Kernel for the gateway: tasks, submit/run_slice, kernel
    memory, kallsyms/version, and system calls served by a model of the emulated VFS."""

    def __init__(self, cpus: int = 2, seed: int = 0):
        self.nr_cpus = cpus
        self.lock = threading.RLock()
        self.hostfs = None
        self.tasks: dict[int, FakeTask] = {}
        self.exit_listeners: list = []
        self.kprobes = FakeEngine()
        self.syscalls: list[tuple[int, str, str]] = []  # (pid, comm, name) as they run
        self._mem = bytearray(1 << 21)
        self._brk = 0
        self._queue: collections.deque = collections.deque()
        self._current: FakeTask | None = None
        self._next_pid = 300
        self.init_task = self.spawn("init", pid=1)

    @classmethod
    def factory(cls, cpus: int, seed: int) -> "FakeKernel":
        return cls(cpus, seed)

    # ---- the machine thread: none; wait() runs each call in its caller's thread ------
    def serve(self) -> None:
        pass

    def close(self) -> None:
        pass

    # ---- what the tree serves ----------------------------------------------------------
    def kallsyms(self) -> str:
        return ("ffffffff81000000 T _stext\nffffffff81001000 T vfs_read\n"
                "ffffffff81002000 T kernel_clone\n")

    def proc_version(self) -> str:
        return "Linux version 6.1.0-kprobefs (fake@host) (gcc) #1 SMP\n"

    # ---- memory --------------------------------------------------------------------------
    def read(self, addr: int, size: int) -> bytes:
        off = addr - KBASE
        if off < 0 or off + size > len(self._mem):
            raise FaultError(addr)
        return bytes(self._mem[off:off + size])

    def write(self, addr: int, data: bytes) -> None:
        off = addr - KBASE
        if off < 0 or off + len(data) > len(self._mem):
            raise FaultError(addr)
        self._mem[off:off + len(data)] = data

    def _alloc(self, size: int) -> int:
        addr = KBASE + self._brk
        self._brk += (size + 15) & ~15
        if self._brk > len(self._mem):
            raise MemoryError("fake kernel memory exhausted")
        return addr

    def current_comm(self) -> str:
        return self._current.comm

    def current_pid(self) -> int:
        return self._current.pid

    # ---- tasks and system calls ---------------------------------------------------------
    def spawn(self, comm: str, pid: int | None = None, parent=None,
              timeout: float | None = None, autoreap: bool = False) -> FakeTask:
        with self.lock:
            if pid is not None:
                if pid in self.tasks or pid <= 0:
                    raise KernelError(errno.EEXIST, "clone3")
            else:
                while self._next_pid in self.tasks:
                    self._next_pid += 1
                pid = self._next_pid
                self._next_pid += 1
            task = FakeTask(pid, comm[:15])
            self.tasks[pid] = task
            return task

    def submit(self, task, name, *args, on_done=None, wake=True) -> SyscallRequest:
        req = SyscallRequest(task, -1, name, args, on_done=on_done)
        with self.lock:
            if task.state == "dead":
                raise ProcessExited(task.pid, task.exit_code)
            self._queue.append(req)
        return req

    def runnable(self) -> bool:
        return bool(self._queue)

    def run_slice(self) -> bool:
        with self.lock:
            ran = False
            while self._queue:
                ran = True
                self._execute(self._queue.popleft())
            return ran

    def wait(self, req, timeout=30.0):
        deadline = time.monotonic() + timeout
        while not req.done.is_set():
            if time.monotonic() >= deadline:
                raise KernelWedged(f"{req.name} has not finished in {timeout:g} s")
            if not self.run_slice():
                req.done.wait(0.01)
        if req.error is not None:
            raise req.error
        return req.result

    def syscall(self, task, name, *args, timeout=30.0):
        return self.wait(self.submit(task, name, *args), timeout)

    def _execute(self, req: SyscallRequest) -> None:
        task = req.task
        if task.state == "dead":
            req.error = ProcessExited(task.pid, task.exit_code)
        else:
            self._current, self._brk = task, 0
            self.syscalls.append((task.pid, task.comm, req.name))
            try:
                req.result = getattr(self, "sys_" + req.name)(task, *req.args)
            except _Exited:
                req.error = ProcessExited(task.pid, task.exit_code)
            except OSError as e:
                req.result = -e.errno
            finally:
                self._current = None
        req.done.set()
        if req.on_done is not None:
            req.on_done(req)

    # ---- the model of the emulated VFS --------------------------------------------------
    def _hc(self, nr, *args):
        args = tuple(a & ((1 << 64) - 1) for a in args) + (0,) * (5 - len(args))
        ret = self.hostfs.hypercall(self, nr, args)
        return ret

    def _cstr(self, s: str) -> int:
        raw = s.encode() + b"\0"
        addr = self._alloc(len(raw))
        self.write(addr, raw)
        return addr

    def _resolve(self, path: str):
        """('ram', path) or ('host', id, mode); OSError(ENOENT/ENOTDIR)."""
        path = "/" + "/".join(p for p in path.split("/") if p)
        if path in RAM_DIRS:
            return ("ram", path)
        for prefix, root in sorted(MOUNTS.items(), key=lambda kv: -len(kv[0])):
            if path == prefix or path.startswith(prefix + "/"):
                node, mode = root, stat.S_IFDIR | 0o700
                for part in [p for p in path[len(prefix):].split("/") if p]:
                    if not stat.S_ISDIR(mode):
                        raise OSError(errno.ENOTDIR, "")
                    mode_ptr = self._alloc(4)
                    child = self._hc(HC_HOSTFS_LOOKUP, node, self._cstr(part), mode_ptr)
                    if child < 0:
                        raise OSError(-child, "")
                    node = child
                    # as hostfs_lookup_host: the flag HOSTFS_PERMANENT is no mode bit
                    mode = struct.unpack("<I", self.read(mode_ptr, 4))[0] & 0xFFFF
                return ("host", node, mode)
        raise OSError(errno.ENOENT, "")

    def _new_fd(self, task, entry) -> int:
        fd = 3
        while fd in task.fds:
            fd += 1
        task.fds[fd] = entry
        return fd

    def _file(self, task, fd) -> dict:
        entry = task.fds.get(fd)
        if entry is None:
            raise OSError(errno.EBADF, "")
        return entry

    def sys_openat(self, task, dfd, path, flags, mode=0):
        try:
            where = self._resolve(path)
        except OSError as e:
            if e.errno == errno.ENOENT and flags & O_CREAT:
                raise OSError(errno.EACCES, "") from None  # no i_op->create
            raise
        if where[0] == "ram" or stat.S_ISDIR(where[2]):
            if wants_write(flags):
                raise OSError(errno.EISDIR, "")
            return self._new_fd(task, {"kind": "dir", "where": where, "pos": 0})
        if flags & O_DIRECTORY:
            raise OSError(errno.ENOTDIR, "")
        handle = self._hc(HC_HOSTFS_OPEN, where[1], flags, task.pid)
        if handle < 0:
            raise OSError(-handle, "")
        return self._new_fd(task, {"kind": "file", "handle": handle, "pos": 0,
                                   "flags": flags})

    def sys_prctl(self, task, option, arg):
        if option != 15:                      # PR_SET_NAME
            return -errno.EINVAL
        task.comm = bytes(arg).split(b"\0")[0].decode("utf-8", "replace")[:15]
        return 0

    # The scheduling mirror's calls (fs/schedwatch.py): priorities are not modelled.
    def run_user(self, task, sleep_state=1) -> SyscallRequest:
        return self.submit(task, "user", sleep_state)

    def sys_user(self, task, sleep_state):
        return 0

    def sys_setpriority(self, task, which, who, nice):
        return 0

    def sys_sched_setscheduler(self, task, pid, policy, param):
        return 0

    def sys_read(self, task, fd, buf: UserBuffer, count):
        f = self._file(task, fd)
        if f["kind"] == "dir":
            raise OSError(errno.EISDIR, "")
        if (f["flags"] & O_ACCMODE) == 1:
            raise OSError(errno.EBADF, "")
        out = b""
        kbuf = self._alloc(min(count, READ_CHUNK))
        while len(out) < count:
            chunk = min(count - len(out), READ_CHUNK)
            n = self._hc(HC_HOSTFS_READ, f["handle"], kbuf, chunk, f["pos"])
            if n < 0:
                if not out:
                    raise OSError(-n, "")
                break
            out += self.read(kbuf, n)
            f["pos"] += n
            if n < chunk:
                break
        buf.data = out.ljust(buf.size, b"\0")[:buf.size]
        return len(out)

    def sys_write(self, task, fd, data, count):
        f = self._file(task, fd)
        if f["kind"] == "dir":
            raise OSError(errno.EISDIR, "")
        if (f["flags"] & O_ACCMODE) == 0:
            raise OSError(errno.EBADF, "")
        kbuf = self._alloc(count)
        self.write(kbuf, bytes(data)[:count])
        n = self._hc(HC_HOSTFS_WRITE, f["handle"], kbuf, count, f["pos"])
        if n < 0:
            raise OSError(-n, "")
        f["pos"] += n
        return n

    def sys_pread64(self, task, fd, buf: UserBuffer, count, pos):
        return self._at(task, fd, pos, self.sys_read, buf, count)

    def sys_pwrite64(self, task, fd, data, count, pos):
        return self._at(task, fd, pos, self.sys_write, data, count)

    def _at(self, task, fd, pos, call, *args):
        """call at pos, the file's position left where it was."""
        f = self._file(task, fd)
        kept, f["pos"] = f["pos"], pos
        try:
            return call(task, fd, *args)
        finally:
            f["pos"] = kept

    def sys_lseek(self, task, fd, offset, whence):
        f = self._file(task, fd)
        f["pos"] = offset
        return offset

    def sys_close(self, task, fd):
        f = task.fds.pop(fd, None)
        if f is None:
            raise OSError(errno.EBADF, "")
        if f["kind"] == "file":
            self._hc(HC_HOSTFS_RELEASE, f["handle"])
        return 0

    def _dir_entries(self, where):
        if where[0] == "ram":
            path = where[1]
            names = sorted({p[len(path):].strip("/").split("/")[0]
                            for p in list(MOUNTS) + list(RAM_DIRS)
                            if p.startswith(path.rstrip("/") + "/") and p != path})
            return [(n, 0, stat.S_IFDIR) for n in names if n]
        out, index = [], 0
        kbuf = self._alloc(264)
        while True:
            self.write(kbuf, bytes(264))
            child = self._hc(HC_HOSTFS_READDIR, where[1], index, kbuf)
            if child < 0:
                raise OSError(-child, "")
            if child == 0:
                return out
            raw = self.read(kbuf, 256)
            name = raw[:raw.index(b"\0")].decode()
            mode = struct.unpack("<I", self.read(kbuf + 256, 4))[0]
            out.append((name, child, mode))
            index += 1

    def sys_getdents64(self, task, fd, buf: UserBuffer, count):
        f = self._file(task, fd)
        if f["kind"] != "dir":
            raise OSError(errno.ENOTDIR, "")
        entries = [(".", 1, stat.S_IFDIR), ("..", 1, stat.S_IFDIR)]
        entries += self._dir_entries(f["where"])
        out = b""
        while f["pos"] < len(entries):
            name, ino, mode = entries[f["pos"]]
            raw = name.encode() + b"\0"
            reclen = (19 + len(raw) + 7) & ~7
            if len(out) + reclen > count:
                break
            dtype = 4 if stat.S_ISDIR(mode) else 8
            out += struct.pack("<QqHB", ino, f["pos"] + 1, reclen, dtype) + raw.ljust(
                reclen - 19, b"\0")
            f["pos"] += 1
        buf.data = out.ljust(buf.size, b"\0")[:buf.size]
        return len(out)

    def sys_newfstatat(self, task, dfd, path, buf: UserBuffer, flags):
        where = self._resolve(path)
        if where[0] == "ram":
            mode, ino = stat.S_IFDIR | 0o755, 1
        else:
            mode, ino = where[2], where[1]
        nlink = 2 if stat.S_ISDIR(mode) else 1
        data = struct.pack("<QQQIIIiQqqqqqqqqq24x", 0, ino, nlink, mode, 0, 0, 0, 0, 0,
                           4096, 0, 0, 0, 0, 0, 0, 0)
        buf.data = data
        return 0

    def sys_chdir(self, task, path):
        where = self._resolve(path)
        if where[0] != "ram" and not stat.S_ISDIR(where[2]):
            raise OSError(errno.ENOTDIR, "")
        task.cwd = path
        return 0

    def sys_mkdir(self, task, path, mode):
        self._resolve(os.path.dirname(path.rstrip("/")) or "/")
        raise OSError(errno.EPERM, "")

    def sys_rmdir(self, task, path):
        self._resolve(path)
        raise OSError(errno.EPERM, "")

    def sys_unlink(self, task, path):
        self._resolve(path)
        raise OSError(errno.EPERM, "")

    def sys_exit(self, task, code):
        for fd in list(task.fds):
            self.sys_close(task, fd)
        task.state, task.exit_code = "dead", code
        self.tasks.pop(task.pid, None)
        for listener in self.exit_listeners:
            listener(task.pid)
        raise _Exited()


class _Exited(Exception):
    pass


# ==== an engine and a tracer with the real names ==========================================
class FakeEngine:
    def __init__(self):
        self.kprobes_all_disarmed = False
        self.optimization_enabled = True
        self.probes = ["ffffffff81001000  k  vfs_read+0x0    [FTRACE]"]
        self.calls: list[str] = []

    def list_text(self) -> str:
        return "".join(p + "\n" for p in self.probes)

    def blacklist_text(self) -> str:
        return "0xffffffff81000000-0xffffffff81000010\tint3_handler\n"

    def arm_all_kprobes(self):
        self.calls.append("arm")
        self.kprobes_all_disarmed = False

    def disarm_all_kprobes(self):
        self.calls.append("disarm")
        self.kprobes_all_disarmed = True

    def set_optimization(self, on: bool):
        self.calls.append(f"optimization={int(on)}")
        self.optimization_enabled = on

    def wait_for_kprobe_optimizer(self):
        self.calls.append("wait")


class _PipeHandle:
    def __init__(self, pipe: "TracePipe", nonblock: bool):
        self.pipe = pipe

    def read(self, size, offset):
        with self.pipe.cond:
            data, self.pipe.data = self.pipe.data[:size], self.pipe.data[size:]
            return bytes(data)

    def write(self, data, offset):
        raise OSError(errno.EINVAL, "")

    def wait(self, timeout):
        with self.pipe.cond:
            if not self.pipe.data:
                self.pipe.cond.wait(timeout)
            return bool(self.pipe.data)

    def release(self):
        pass


class TracePipe:
    """trace_pipe: a consuming read; read returns b"" when empty; wait() blocks."""

    mode = stat.S_IFREG | 0o440

    def __init__(self):
        self.cond = threading.Condition()
        self.data = bytearray()

    def push(self, data: bytes) -> None:
        with self.cond:
            self.data += data
            self.cond.notify_all()

    def open(self, flags, pid, comm):
        return _PipeHandle(self, bool(flags & 0o4000))


class _EventsHandle:
    def __init__(self, tracer, flags):
        self.tracer = tracer
        self.text = None

    def read(self, size, offset):
        if self.text is None or offset == 0:
            self.text = "".join(line + "\n" for line in self.tracer.events).encode()
        return self.text[offset:offset + size]

    def write(self, data, offset):
        self.tracer.write_sizes.append(len(data))
        for line in bytes(data).decode("latin-1").split("\n"):
            line = line.split("#")[0].strip()
            if not line:
                continue
            if line[0] not in "pr-" or len(line.split()) < 2 and line[0] != "-":
                raise OSError(errno.EINVAL, "Invalid argument")
            if line[0] == "-":
                name = line[2:]
                if not any(e.endswith("/" + name) or e.split()[0].endswith(":" + name)
                           for e in self.tracer.events):
                    raise OSError(errno.ENOENT, "")
                self.tracer.events = [e for e in self.tracer.events
                                      if e.split()[0].split("/")[-1] != name]
            else:
                self.tracer.events.append(line)
        return len(data)

    def release(self):
        pass


class KprobeEvents:
    mode = stat.S_IFREG | 0o640

    def __init__(self, tracer):
        self.tracer = tracer

    def open(self, flags, pid, comm):
        self.tracer.openers.append((pid, comm))
        if wants_write(flags) and flags & O_TRUNC:
            if self.tracer.enabled:
                raise OSError(errno.EBUSY, "Device or resource busy")
            self.tracer.events = []
        return _EventsHandle(self.tracer, flags)


class FakeTracer:
    """A tracefs root: kprobe_events (O_TRUNC clears, EBUSY while enabled, EINVAL on bad
    commands), trace_pipe (blocking), trace_marker (feeds trace_pipe), tracing_on."""

    def __init__(self, kernel=None, engine=None):
        self.events: list[str] = []
        self.enabled = False
        self.openers: list = []
        self.write_sizes: list[int] = []
        self.pipe = TracePipe()
        self.root = Directory({
            "kprobe_events": KprobeEvents(self),
            "trace_pipe": self.pipe,
            "trace_marker": TextFile(lambda: "", mode=0o220, write=self._mark),
            "tracing_on": BoolKnob(lambda: self.enabled, self._set_on, 0o640),
            # what a test wants to see of the requests that arrived
            "openers": TextFile(lambda: "".join(f"{p} {c}\n" for p, c in self.openers)),
            "write_sizes": TextFile(lambda: "".join(f"{n}\n" for n in self.write_sizes)),
            "events": lambda: Directory({
                name.split()[0].split(":")[1].split("/")[-1]: Directory({})
                for name in self.events if ":" in name.split()[0]}),
        })

    def _mark(self, data: bytes, offset: int) -> int:
        self.pipe.push(b"tracing_mark_write: " + bytes(data))
        return len(data)

    def _set_on(self, value: bool) -> None:
        self.enabled = value

    def tracefs_root(self):
        return self.root

    @classmethod
    def factory(cls, kernel, engine):
        return cls(kernel, engine)


if __name__ == "__main__":
    from kprobefs.cli import main
    sys.exit(main(kernel_factory=FakeKernel.factory, tracer_factory=FakeTracer.factory))
