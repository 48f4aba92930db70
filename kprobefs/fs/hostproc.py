"""What the host's /proc says of its processes: comm, parent and start time, pending
signals, where a path lies in a process's mount namespace, and the files of the mount a
process has open.  No FUSE here.

A mount namespace's table is read once and kept open (:class:`MountTables`): reading
``/proc/PID/mountinfo`` costs the host tens of microseconds, and poll(2) on the open
file tells when a mount or unmount changed it (``EPOLLPRI``), as util-linux's
``findmnt --poll`` watches it.
"""

from __future__ import annotations

import collections
import os
import re
import select
import threading
import time
from typing import Iterable, NamedTuple

__all__ = ["HostProcess", "KPROBEFS_FSTYPE", "Mount", "MountTables", "host_comm",
           "host_cpu", "host_process", "host_start_time", "host_signal_pending", "mount_relative",
           "mount_relative_of", "own_mounts", "open_mount_paths", "parse_mountinfo",
           "read_proc"]

#: The type mountinfo gives a kprobefs mount.
KPROBEFS_FSTYPE = "fuse.kprobefs"


def read_proc(path: str) -> bytes:
    """A /proc file, a small one in one read(2) (an os.read costs a third of a file
    object's read; the sampler and every new caller read some), a larger one (a long
    cmdline) read on until its end.  OSError when it is gone."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, 16384)
        if len(data) < 16384:
            return data
        chunks = [data]
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def host_comm(pid: int) -> str:
    """The host process's comm, or "" when it cannot be read."""
    try:
        return read_proc(f"/proc/{pid}/comm").rstrip(b"\n").decode("utf-8", "replace")[:15]
    except OSError:
        return ""


class HostProcess(NamedTuple):
    """What one read of /proc/PID/stat tells of a host process."""

    comm: str
    ppid: int | None
    start: int | None    # clock ticks since boot


def host_process(pid: int) -> HostProcess | None:
    """The host process's comm, parent and start time in one read; None when it is
    gone.  The CPU the read gives is kept for :func:`host_cpu`, as its own read is."""
    try:
        data = read_proc(f"/proc/{pid}/stat")
    except OSError:
        return None
    try:
        close = data.rindex(b")")
        comm = data[data.index(b"(") + 1:close].decode("utf-8", "replace")[:15]
        fields = data[close + 2:].split()
        proc = HostProcess(comm, int(fields[1]), int(fields[19]))
        _keep_cpu(pid, int(fields[36]), time.monotonic())
    except (ValueError, IndexError):
        return None
    return proc


#: How long the CPU /proc/PID/stat gave an unpinned thread is taken again (seconds):
#: the read costs 6-7 µs, a request from that thread 60-100 µs; the scheduler moves
#: such a thread as it likes meanwhile, so a CPU this young is as true as a new one.
HOST_CPU_KEEP = 0.01

# host tid -> (the CPU its /proc/PID/stat gave, when), for unpinned threads.
_last_cpus: dict[int, tuple[int, float]] = {}


def host_cpu(pid: int) -> tuple[int, bool] | None:
    """The host CPU the thread ``pid`` is on, and whether it is pinned there: the one
    CPU it may run on when it has one (taskset; a sched_getaffinity, asked at every
    call, so a thread pinned elsewhere is followed at once), else the CPU it last ran
    on (``/proc/PID/stat`` field 39: for a thread waiting in a request of ours, the one
    it made it on), read again after HOST_CPU_KEEP seconds.  None when it is gone."""
    try:
        allowed = os.sched_getaffinity(pid)
    except OSError:
        _last_cpus.pop(pid, None)
        return None
    if len(allowed) == 1:
        return next(iter(allowed)), True
    now = time.monotonic()
    kept = _last_cpus.get(pid)
    if kept is not None and now - kept[1] < HOST_CPU_KEEP and kept[0] in allowed:
        return kept[0], False
    try:
        data = read_proc(f"/proc/{pid}/stat")
        cpu = int(data[data.rindex(b")") + 2:].split()[36])
    except (OSError, ValueError, IndexError):
        _last_cpus.pop(pid, None)
        return None
    _keep_cpu(pid, cpu, now)
    return cpu, False


def _keep_cpu(pid: int, cpu: int, now: float) -> None:
    if len(_last_cpus) >= 4096:     # threads that made one request and went
        _last_cpus.clear()
    _last_cpus[pid] = (cpu, now)


def host_start_time(pid: int) -> int | None:
    """The host process's start time (clock ticks since boot), None when it is gone; tells
    a live process from a later one that reuses its pid."""
    proc = host_process(pid)
    return None if proc is None else proc.start


def host_signal_pending(pid: int) -> bool:
    """Whether the host thread has a signal pending that it neither blocks nor ignores
    (a reader blocked in a FUSE read is killed or interrupted): its read must return."""
    try:
        text = read_proc(f"/proc/{pid}/status").decode("ascii", "replace")
    except OSError:
        return True
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn"):
            try:
                fields[key] = int(value.strip(), 16)
            except ValueError:
                return False
    pending = fields.get("SigPnd", 0) | fields.get("ShdPnd", 0)
    return bool(pending & ~fields.get("SigBlk", 0) & ~fields.get("SigIgn", 0))


class MountTables:
    """The mountinfo lines of each mount namespace seen, read again only when poll(2)
    says the namespace's mounts changed.  At most ``limit`` namespaces are kept (the
    oldest seen is closed first), and a namespace is let go once the process it was
    opened through has exited: the open file holds the namespace, and with it every
    mount it copied (a ``kprobefs exec`` namespace holds a copy of the mount, which
    would keep the daemon serving after its umount).  Thread-safe."""

    #: How often, at most, tables whose process has exited are looked for (seconds).
    PRUNE_EVERY = 1.0

    def __init__(self, limit: int = 32):
        self.limit = limit
        self._lock = threading.Lock()
        self._tables: collections.OrderedDict[str, _MountTable] = collections.OrderedDict()
        self._pruned = 0.0

    def lines(self, pid: int) -> list[str] | None:
        """pid's mount table as lines, or None when pid is gone."""
        try:
            ns = os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            return None
        with self._lock:
            self._prune()
            table = self._tables.get(ns)
            if table is None:
                # The daemon's own namespace (most callers'), through the daemon
                # itself: kept while it runs, not read again as each caller exits.
                opener = os.getpid() if ns == _own_namespace() else pid
                try:
                    table = _MountTable(open(f"/proc/{opener}/mountinfo", "rb"), opener)
                except OSError:
                    return None
                self._tables[ns] = table
                while len(self._tables) > self.limit:
                    self._tables.popitem(last=False)[1].close()
            try:
                return table.lines()
            except OSError:
                del self._tables[ns]
                table.close()
                return None

    def close(self) -> None:
        with self._lock:
            for table in self._tables.values():
                table.close()
            self._tables.clear()

    def forget(self, pid: int) -> None:
        """pid has exited: let go of the tables opened through it."""
        with self._lock:
            for ns, table in list(self._tables.items()):
                if table.pid == pid:
                    del self._tables[ns]
                    table.close()

    def _prune(self) -> None:
        """Close the tables whose process has exited (caller holds the lock)."""
        now = time.monotonic()
        if now - self._pruned < self.PRUNE_EVERY:
            return
        self._pruned = now
        for ns, table in list(self._tables.items()):
            if not os.path.exists(f"/proc/{table.pid}"):
                del self._tables[ns]
                table.close()


def _own_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/mnt")
    except OSError:
        return None


class _MountTable:
    """One namespace's open mountinfo (the open file holds the namespace), opened
    through process ``pid``."""

    def __init__(self, file, pid: int):
        self._file = file
        self.pid = pid
        self._poll = select.poll()
        self._poll.register(file, select.POLLPRI | select.POLLERR)
        self._lines: list[str] | None = None

    def lines(self) -> list[str]:
        # poll reports a change once (it takes the namespace's event count as seen)
        if self._lines is None or self._poll.poll(0):
            self._file.seek(0)
            self._lines = self._file.read().decode("utf-8", "surrogateescape").splitlines()
        return self._lines

    def close(self) -> None:
        self._file.close()


_MOUNT_TABLES = MountTables()


def forget_process(pid: int) -> None:
    """Host process pid has exited: what was kept of it goes (its mount namespace)."""
    _MOUNT_TABLES.forget(pid)


def mount_relative_of(pid: int, path: str) -> str | None:
    """``path`` (as the process ``pid`` sees it) relative to this filesystem's root,
    when the mount that holds it in ``pid``'s mount namespace is a kprobefs mount (a
    bind of a subdirectory counts from that directory); else None."""
    lines = _MOUNT_TABLES.lines(pid)
    return None if lines is None else mount_relative(lines, path)


def open_mount_paths(pid: int):
    """The paths, relative to a kprobefs mount, that the process's open descriptors
    name (nothing once it is gone).  The process's mount table is asked once for them
    all."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    lines = None
    for n in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if lines is None:
            lines = _MOUNT_TABLES.lines(pid)
            if lines is None:
                return
        rel = mount_relative(lines, link)
        if rel is not None:
            yield rel


class Mount(NamedTuple):
    """One line of a mountinfo file."""

    device: tuple[int, int]     # (major, minor); a FUSE mount's minor names its connection
    root: str                   # the directory of its filesystem mounted there
    point: str
    fstype: str


def parse_mountinfo(lines: Iterable[str]) -> list[Mount]:
    """The mounts of a mountinfo file's lines, in its order (a mount on top of another
    comes after it)."""
    out = []
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields = head.split(" ")
        if not sep or len(fields) < 5:
            continue
        major, _, minor = fields[2].partition(":")
        out.append(Mount((int(major), int(minor)), mountinfo_path(fields[3]),
                         mountinfo_path(fields[4]), tail.split(" ", 1)[0]))
    return out


def own_mounts() -> list[Mount]:
    """The mounts of this process's namespace ([] when /proc cannot say)."""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            text = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return []
    return parse_mountinfo(text.splitlines())


def mount_relative(mountinfo: list[str], path: str) -> str | None:
    """:func:`mount_relative_of` on the lines of a mountinfo file: the last of the
    deepest mounts holding ``path`` decides (a mount on top of another hides it)."""
    mounts, known = _parsed(mountinfo)
    if path in known:
        return known[path]
    if len(known) >= _KNOWN_MAX:
        known.clear()
    known[path] = relative = _relative(mounts, path)
    return relative


def _relative(mounts: list[Mount], path: str) -> str | None:
    # Most paths (a working directory anywhere) are under no kprobefs mount at all.
    if not any(m.fstype == KPROBEFS_FSTYPE and _inside(path, m.point) for m in mounts):
        return None
    best = None
    for m in mounts:
        if _inside(path, m.point) and (best is None or len(m.point) >= len(best.point)):
            best = m
    if best is None or best.fstype != KPROBEFS_FSTYPE:
        return None
    rest = path[len(best.point):].lstrip("/")
    return "/" + "/".join(p for p in (best.root.strip("/"), rest) if p)


#: The mounts of the table last asked about (a table's lines are one list until its
#: namespace's mounts change): (lines, mounts, path -> what mount_relative gave).
_PARSED: tuple[list, list[Mount], dict] = ([], [], {})
#: How many paths' answers one table keeps (each request's working directory asks).
_KNOWN_MAX = 256


def _parsed(mountinfo: list[str]) -> tuple[list[Mount], dict]:
    global _PARSED
    lines, mounts, known = _PARSED
    if lines is not mountinfo:
        # Another table, or the same one read again (through another process of the
        # namespace): parsed again only when its lines differ.
        if lines != mountinfo:
            mounts, known = parse_mountinfo(mountinfo), {}
        _PARSED = (mountinfo, mounts, known)
    return mounts, known


def _inside(path: str, point: str) -> bool:
    return path == point or path.startswith(point.rstrip("/") + "/")


def mountinfo_path(field: str) -> str:
    """A path field of a mountinfo line, whose blanks and backslashes are written as
    octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
