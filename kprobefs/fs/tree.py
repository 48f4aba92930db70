"""The tree of host-served files, and the hostfs hypercall protocol that exposes it to the
emulated kernel.  No FUSE here.

The FILE PROTOCOL every node follows (the tracer implements the same one):

* a directory has ``mode`` and ``children() -> dict[str, node]``, built fresh on each call
  (the names may change between calls: probe events come and go);
* a file has ``mode`` and ``open(flags, pid, comm) -> handle``; actions bound to the open
  itself (``O_TRUNC`` with write access: "clear") happen there and may raise ``OSError``;
* a handle has ``read(size, offset) -> bytes``, ``write(data, offset) -> int`` (raising
  ``OSError(errno)``), ``release()`` and, for files a reader may block on (``trace_pipe``),
  ``wait(timeout) -> bool`` (True when data may be there); such a handle's ``read``
  returns ``b""`` when it has nothing yet.

:class:`HostFS` answers the ``HC_HOSTFS_*`` hypercalls (include/kernel.h) from this tree.
The emulated kernel knows nodes only by the ids it hands out; ids 1, 2 and 3 are the roots
of debugfs, tracefs and proc.  An id names a place (a parent id and a name), not a Python
object: the node behind it is re-fetched whenever the kernel looks the name up again,
which its ``d_revalidate`` does on every path walk.
"""

from __future__ import annotations

import errno
import logging
import stat
import threading
from dataclasses import dataclass, field
from typing import Callable, Collection, Iterable, Protocol

from ..machine.abi import mutexes_word
from ..machine.memory import FaultError
from ..tracing.nodes import Mutexes

__all__ = [
    "DEBUGFS_ROOT", "TRACEFS_ROOT", "PROC_ROOT", "HostFS", "Directory", "TextFile",
    "BoolKnob", "IntKnob", "kstrtobool", "kstrtoul", "kstrtol", "node_mode", "is_dir",
    "build_tree", "modules_control_dir",
]

log = logging.getLogger("kprobefs.fs")

DEBUGFS_ROOT, TRACEFS_ROOT, PROC_ROOT = 1, 2, 3
#: A lookup's mode flag: the name stays while the kernel runs (fs/hostfs.c keeps it).
HOSTFS_PERMANENT = 0x80000000

# Hypercall numbers (enum hypercall_nr in kernel/include/kernel.h).
HC_HOSTFS_LOOKUP = 16
HC_HOSTFS_OPEN = 17
HC_HOSTFS_READ = 18
HC_HOSTFS_WRITE = 19
HC_HOSTFS_RELEASE = 20
HC_HOSTFS_READDIR = 21
HC_HOSTFS_MKDIR = 40
HC_HOSTFS_RMDIR = 41

#: Layout of the HC_HOSTFS_READDIR buffer: name[256] (NUL-terminated), then u32 mode.
DIRENT_NAME_MAX = 255
DIRENT_MODE_OFFSET = 256

O_ACCMODE = 0o3
O_WRONLY, O_RDWR = 0o1, 0o2
O_TRUNC = 0o1000
O_NONBLOCK = 0o4000

# tracefs' TRACE_MODE_WRITE / TRACE_MODE_READ and its directories.
MODE_WRITE = 0o640
MODE_READ = 0o440
MODE_DIR = 0o750


# ==== the node protocol ====================================================================
class Handle(Protocol):
    def read(self, size: int, offset: int) -> bytes: ...
    def write(self, data: bytes, offset: int) -> int: ...
    def release(self) -> None: ...


def is_dir(node) -> bool:
    """Whether node is a directory (it lists children)."""
    return callable(getattr(node, "children", None))


def fixed_names(directory) -> Collection[str]:
    """The names of a directory node that stay as long as the directory does (a host may
    cache them); none unless the node says (its ``fixed_names``)."""
    return getattr(directory, "fixed_names", ())


def node_mode(node) -> int:
    """The node's full st_mode: its ``mode``, with the file type added when a node gives
    permission bits only."""
    mode = int(getattr(node, "mode", 0))
    if not stat.S_IFMT(mode):
        mode |= stat.S_IFDIR if is_dir(node) else stat.S_IFREG
    return mode


def node_mutexes(node) -> int:
    """The word of kernel mutexes (abi.mutexes_word) the node's operations hold: its
    ``mutexes``, none when it names none."""
    mutexes = getattr(node, "mutexes", None)
    return 0 if mutexes is None else mutexes_word(mutexes)


def wants_write(flags: int) -> bool:
    return (flags & O_ACCMODE) in (O_WRONLY, O_RDWR)


def wants_read(flags: int) -> bool:
    return (flags & O_ACCMODE) != O_WRONLY


# ==== number parsing, as the kernel's kstrto* helpers ======================================
def _strip_one_newline(s: bytes) -> bytes:
    return s[:-1] if s.endswith(b"\n") else s


def kstrtoul(data: bytes | str, base: int = 0) -> int:
    """Linux kstrtoul(): optional ``+``, base 0 = ``0x`` hex / leading ``0`` octal /
    decimal, at most one trailing newline, nothing else.  Raises OSError(EINVAL) on
    malformed input and OSError(ERANGE) past 64 bits."""
    s = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    s = _strip_one_newline(s)
    if s.startswith(b"+"):
        s = s[1:]
    return _parse_unsigned(s, base, 64)


def kstrtol(data: bytes | str, base: int = 0) -> int:
    """Linux kstrtol(): like :func:`kstrtoul` with an optional ``-``; the result must fit
    a signed 64-bit value (else ERANGE)."""
    s = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    s = _strip_one_newline(s)
    if s.startswith(b"-"):
        value = _parse_unsigned(s[1:], base, 64)
        if value > 1 << 63:
            raise OSError(errno.ERANGE, "Numerical result out of range")
        return -value
    if s.startswith(b"+"):
        s = s[1:]
    value = _parse_unsigned(s, base, 64)
    if value >= 1 << 63:
        raise OSError(errno.ERANGE, "Numerical result out of range")
    return value


def _parse_unsigned(s: bytes, base: int, bits: int) -> int:
    if base == 0:
        if s[:2].lower() == b"0x" and len(s) > 2:
            base, s = 16, s[2:]
        elif s.startswith(b"0") and len(s) > 1:
            base, s = 8, s[1:]
        else:
            base = 10
    elif base == 16 and s[:2].lower() == b"0x":
        s = s[2:]
    digits = "0123456789abcdef"[:base]
    if not s or any(chr(c).lower() not in digits for c in s):
        raise OSError(errno.EINVAL, "Invalid argument")
    value = int(s.decode(), base)
    if value >> bits:
        raise OSError(errno.ERANGE, "Numerical result out of range")
    return value


def kstrtobool(data: bytes | str) -> bool:
    """Linux kstrtobool(): ``y Y t T 1`` true, ``n N f F 0`` false, ``on``/``of``
    (second letter any case) true/false; the rest is ignored.  OSError(EINVAL) else."""
    s = data.encode("latin-1") if isinstance(data, str) else bytes(data)
    first = s[:1]
    if first and first in b"yYtT1":
        return True
    if first and first in b"nNfF0":
        return False
    if first and first in b"oO":
        second = s[1:2]
        if second and second in b"nN":
            return True
        if second and second in b"fF":
            return False
    raise OSError(errno.EINVAL, "Invalid argument")


# ==== generic nodes ========================================================================
class Directory:
    """A directory whose entries are fixed nodes or callables returning a node (or None
    when the entry is absent right now)."""

    def __init__(self, entries: dict | None = None, mode: int = MODE_DIR):
        self.mode = stat.S_IFDIR | mode
        self._entries: dict = dict(entries or {})

    def add(self, name: str, node) -> None:
        if not name or "/" in name:
            raise ValueError(f"bad file name {name!r}")
        self._entries[name] = node

    @property
    def fixed_names(self) -> Collection[str]:
        """The entries that are nodes; an entry made by a callable may be absent."""
        return [name for name, entry in self._entries.items() if not _made(entry)]

    def children(self) -> dict:
        out = {}
        for name, entry in self._entries.items():
            node = entry() if _made(entry) else entry
            if node is not None:
                out[name] = node
        return out


def _made(entry) -> bool:
    """Whether a Directory entry is a callable that makes its node (or None) at each
    listing, rather than the node itself."""
    return callable(entry) and not hasattr(entry, "mode")


class _TextHandle:
    """Serves a text snapshot: taken at the first read from offset 0, so a reader that
    goes on from where it stopped sees one consistent text (seq_file does the same when a
    read starts over at 0)."""

    def __init__(self, produce: Callable[[], str | bytes], writer: Callable | None):
        self._produce = produce
        self._writer = writer
        self._text: bytes | None = None

    def read(self, size: int, offset: int) -> bytes:
        if self._text is None or offset == 0:
            text = self._produce()
            self._text = text.encode() if isinstance(text, str) else bytes(text)
        return self._text[offset:offset + size]

    def write(self, data: bytes, offset: int) -> int:
        if self._writer is None:
            raise OSError(errno.EINVAL, "Invalid argument")
        return self._writer(bytes(data), offset)

    def release(self) -> None:
        self._text = None


class TextFile:
    """A file whose content is computed by ``produce()`` (str or bytes) each time a reader
    starts at offset 0.  Read-only unless ``write(data, offset) -> int`` is given;
    ``mutexes``: the kernel mutexes its operations hold."""

    def __init__(self, produce: Callable[[], str | bytes], mode: int = MODE_READ,
                 write: Callable[[bytes, int], int] | None = None,
                 mutexes: Mutexes | None = None):
        self.mode = stat.S_IFREG | mode
        self._produce = produce
        self._write = write
        self.mutexes = mutexes

    def open(self, flags: int, pid: int, comm: str) -> _TextHandle:
        if wants_write(flags) and self._write is None:
            raise OSError(errno.EACCES, "Permission denied")
        return _TextHandle(self._produce, self._write)


class BoolKnob(TextFile):
    """A 0/1 knob (debugfs ``kprobes/enabled``): reads ``1\\n``/``0\\n``, a write is parsed
    with kstrtobool and handed to ``set(bool)``, which may raise OSError."""

    #: debugfs' write_file_bool copies at most this many bytes before parsing.
    MAX_WRITE = 31

    def __init__(self, get: Callable[[], bool], set: Callable[[bool], None],
                 mode: int = 0o600, mutexes: Mutexes | None = None):
        super().__init__(lambda: "1\n" if get() else "0\n", mode, self._store, mutexes)
        self._set = set

    def _store(self, data: bytes, offset: int) -> int:
        self._set(kstrtobool(data[:self.MAX_WRITE]))
        return len(data)


class IntKnob(TextFile):
    """An integer sysctl (``proc_dointvec_minmax``): reads ``<value>\\n``; a write holds
    one integer (leading blanks allowed, base 0, then blanks/newline) within
    [minimum, maximum], else EINVAL and the value is unchanged.  A write at a non-zero
    offset is ignored, as with sysctl_writes_strict."""

    def __init__(self, get: Callable[[], int], set: Callable[[int], None],
                 minimum: int | None = None, maximum: int | None = None,
                 mode: int = 0o644):
        super().__init__(lambda: f"{get()}\n", mode, self._store)
        self._set, self._min, self._max = set, minimum, maximum

    def _store(self, data: bytes, offset: int) -> int:
        if offset:
            return len(data)
        text = bytes(data).lstrip(b" \t\n\v\f\r")
        end = 0
        while end < len(text) and text[end:end + 1] not in b" \t\n\v\f\r\0":
            end += 1
        if not end:
            raise OSError(errno.EINVAL, "Invalid argument")
        value = kstrtol(text[:end])
        if (self._min is not None and value < self._min) or (
                self._max is not None and value > self._max):
            raise OSError(errno.EINVAL, "Invalid argument")
        self._set(value)
        return len(data)


# ==== the hypercall protocol ===============================================================
@dataclass
class _Place:
    """What a node id stands for: a name in a parent directory, and the node last found
    there (refreshed by every lookup)."""

    parent: int
    name: str
    node: object
    listing: list = field(default_factory=list)  # READDIR snapshot, taken at index 0


@dataclass
class _Open:
    handle: object
    node_id: int
    pid: int
    flags: int


class HostFS:
    """The host side of the hostfs filesystem: node ids, open handles, and the
    ``HC_HOSTFS_*`` hypercalls.  ``roots`` maps root ids (1 debugfs, 2 tracefs, 3 proc)
    to directory nodes.

    :meth:`hypercall` runs inside the emulation (a Unicorn hook): it never blocks and
    never drives the machine; a handler's exception becomes -errno (OSError) or -EIO
    (anything else, logged with its traceback).
    """

    #: The hypercalls whose handlers may add or remove names (a control file's open with
    #: O_TRUNC, write or release; mkdir, rmdir): they hold :attr:`names_lock`.
    _RENAMING = frozenset({HC_HOSTFS_OPEN, HC_HOSTFS_WRITE, HC_HOSTFS_RELEASE,
                           HC_HOSTFS_MKDIR, HC_HOSTFS_RMDIR})

    def __init__(self, roots: dict[int, object]):
        self._lock = threading.Lock()
        #: Held while names may change (:attr:`_RENAMING`), so that a walk from another
        #: thread (:meth:`stat_path`) sees the tree before or after, never during.
        self.names_lock = threading.RLock()
        self._places: dict[int, _Place] = {}
        self._ids: dict[tuple[int, str], int] = {}
        self._below: dict[int, set[int]] = {}  # parent id -> ids of remembered children
        self._sweep_at = self.SWEEP_AT
        for root_id, node in roots.items():
            if not is_dir(node):
                raise ValueError(f"root {root_id} is not a directory")
            self._places[root_id] = _Place(0, "", node)
        self._next_id = max(roots, default=0) + 1
        #: Ids of the names that stay while the kernel runs: the roots, and a fixed name
        #: (fixed_names) of one of these (see _hc_lookup).
        self._permanent: set[int] = set(roots)
        self._handles: dict[int, _Open] = {}
        self._next_handle = 1
        #: pid -> handle id of the last successful open by that pid (see take_opened()).
        self._opened_by: dict[int, int] = {}
        self._dispatch = {
            HC_HOSTFS_LOOKUP: self._hc_lookup, HC_HOSTFS_OPEN: self._hc_open,
            HC_HOSTFS_READ: self._hc_read, HC_HOSTFS_WRITE: self._hc_write,
            HC_HOSTFS_RELEASE: self._hc_release, HC_HOSTFS_READDIR: self._hc_readdir,
            HC_HOSTFS_MKDIR: self._hc_mkdir, HC_HOSTFS_RMDIR: self._hc_rmdir,
        }

    # ---- the Python-side API (also what the hypercalls use) ---------------------------
    def node(self, node_id: int):
        """The node last seen behind node_id, or None for an unknown id."""
        with self._lock:
            place = self._places.get(node_id)
        return None if place is None else place.node

    def refresh(self, node_id: int):
        """The node now at node_id's place, asked of its parent again (a directory node may
        be a snapshot its parent built); OSError(ENOENT) when the name is gone."""
        with self._lock:
            place = self._places.get(node_id)
            parent = self._places.get(place.parent) if place is not None else None
        if place is None:
            raise OSError(errno.ENOENT, "No such file or directory")
        if parent is None:
            if place.parent:
                raise OSError(errno.ENOENT, "No such file or directory")  # forgotten
            return place.node  # a root
        node = parent.node.children().get(place.name) if is_dir(parent.node) else None
        if node is None:
            self._forget(node_id)
            raise OSError(errno.ENOENT, "No such file or directory")
        place.node = node
        return node

    def lookup(self, dir_id: int, name: str) -> tuple[int, object]:
        """(child id, child node) for name in directory dir_id; OSError(ENOENT) when the
        name is absent, ENOTDIR when dir_id is not a directory."""
        directory = self.node(dir_id)
        if directory is None:
            raise OSError(errno.ENOENT, "No such file or directory")
        if not is_dir(directory):
            raise OSError(errno.ENOTDIR, "Not a directory")
        child = directory.children().get(name)
        if child is None:
            with self._lock:
                gone = self._ids.get((dir_id, name))
            if gone is not None:
                self._forget(gone)
            raise OSError(errno.ENOENT, "No such file or directory")
        return self._remember(dir_id, name, child), child

    def stat_path(self, root_id: int, parts: list[str],
                  timeout: float) -> tuple[int, int, bool]:
        """(id, mode, fixed) of the name at parts below root_id, for a thread that is not
        the machine's: taken between two name-changing hypercalls (waiting at most
        timeout seconds for one in progress, then OSError(EIO)); fixed: the name stays
        while its directory does (:func:`fixed_names`; the root is fixed).
        OSError(ENOENT/ENOTDIR) as :func:`walk`."""
        if not self.names_lock.acquire(timeout=timeout):
            raise OSError(errno.EIO, "the tree has been busy for %g s" % timeout)
        try:
            try:
                return self._stat_path(root_id, parts)
            except RuntimeError:
                # a directory changed under its listing (host code that changes the
                # tree outside a hypercall, as the Python API may): once more
                return self._stat_path(root_id, parts)
        finally:
            self.names_lock.release()

    def _stat_path(self, root_id: int, parts: list[str]) -> tuple[int, int, bool]:
        if not parts:
            return root_id, node_mode(self.node(root_id)), True
        dir_id, directory = walk(self, root_id, parts[:-1])
        node_id, node = walk(self, dir_id, parts[-1:])
        return node_id, node_mode(node), parts[-1] in fixed_names(directory)

    def list_dir(self, dir_id: int) -> list[tuple[str, int, int]]:
        """[(name, child id, mode)] of directory dir_id, in the directory's own order."""
        directory = self.node(dir_id)
        if directory is None:
            raise OSError(errno.ENOENT, "No such file or directory")
        if not is_dir(directory):
            raise OSError(errno.ENOTDIR, "Not a directory")
        children = directory.children()
        with self._lock:
            gone = [nid for nid in self._below.get(dir_id, ())
                    if self._places[nid].name not in children]
        for nid in gone:
            self._forget(nid)
        return [(name, self._remember(dir_id, name, child), node_mode(child))
                for name, child in children.items()]

    #: A sweep of places whose names are gone runs when this many are remembered (then
    #: at twice what the sweep left).
    SWEEP_AT = 4096

    def _sweep(self) -> None:
        """Forgets every remembered place whose name its directory no longer lists."""
        with self._lock:
            parents = [(pid, self._places[pid].node, list(kids))
                       for pid, kids in self._below.items()
                       if kids and pid in self._places]
        gone = []
        for _pid, node, kids in parents:
            try:
                names = node.children() if is_dir(node) else {}
            except Exception:
                continue
            with self._lock:
                gone += [nid for nid in kids
                         if nid in self._places and self._places[nid].name not in names]
        for nid in gone:
            self._forget(nid)
        with self._lock:
            self._sweep_at = max(self.SWEEP_AT, 2 * len(self._places))

    def open(self, node_id: int, flags: int, pid: int, comm: str) -> int:
        """Opens the node; returns a handle id (> 0).  Raises what the node raises."""
        node = self.refresh(node_id)
        if is_dir(node):
            raise OSError(errno.EISDIR, "Is a directory")
        handle = node.open(flags, pid, comm)
        if handle is None:
            raise OSError(errno.EIO, "open returned no handle")
        with self._lock:
            hid = self._next_handle
            self._next_handle += 1
            self._handles[hid] = _Open(handle, node_id, pid, flags)
            self._opened_by[pid] = hid
        return hid

    def handle(self, hid: int):
        """The handle object behind a handle id, or None once released."""
        with self._lock:
            entry = self._handles.get(hid)
        return None if entry is None else entry.handle

    def take_opened(self, pid: int):
        """The handle the last open by pid created (forgotten once taken), or None.  The
        gateway calls this when that pid's openat returns, to find a handle to wait on."""
        with self._lock:
            hid = self._opened_by.pop(pid, None)
            entry = self._handles.get(hid) if hid else None
        return None if entry is None else entry.handle

    def release(self, hid: int) -> None:
        with self._lock:
            entry = self._handles.pop(hid, None)
            if entry is not None and self._opened_by.get(entry.pid) == hid:
                del self._opened_by[entry.pid]    # an open no gateway took
        if entry is not None:
            entry.handle.release()

    def release_all(self) -> None:
        """Releases every open handle (the daemon is going away)."""
        with self._lock:
            entries, self._handles = list(self._handles.values()), {}
        for entry in entries:
            try:
                entry.handle.release()
            except Exception:
                log.exception("releasing a handle at shutdown")

    @property
    def open_handles(self) -> int:
        with self._lock:
            return len(self._handles)

    @property
    def untaken_opens(self) -> int:
        """Opens whose handle no gateway has taken (see take_opened()); bounded by the
        open handles."""
        with self._lock:
            return len(self._opened_by)

    @property
    def known_places(self) -> int:
        """How many node ids are remembered (bounded by the names that exist now and
        those looked up since they went)."""
        with self._lock:
            return len(self._places)

    def _forget(self, node_id: int) -> None:
        """Drops a place whose name is gone, and every place below it, so ids do not
        pile up as events come and go.  The kernel may still hold the id: it then gets
        ENOENT, as for a name that went away."""
        with self._lock:
            stack = [node_id]
            while stack:
                nid = stack.pop()
                place = self._places.get(nid)
                if place is None or not place.parent:
                    continue  # unknown, or a root
                del self._places[nid]
                self._ids.pop((place.parent, place.name), None)
                stack.extend(self._below.pop(nid, ()))
                siblings = self._below.get(place.parent)
                if siblings is not None:
                    siblings.discard(nid)

    def _remember(self, parent: int, name: str, node) -> int:
        with self._lock:
            key = (parent, name)
            node_id = self._ids.get(key)
            if node_id is None:
                node_id = self._next_id
                self._next_id += 1
                self._ids[key] = node_id
                self._places[node_id] = _Place(parent, name, node)
                self._below.setdefault(parent, set()).add(node_id)
                sweep = len(self._places) >= self._sweep_at
            else:
                self._places[node_id].node = node
                sweep = False
        if sweep:
            self._sweep_at = 1 << 62  # one sweep at a time
            self._sweep()
        return node_id

    # ---- hypercalls --------------------------------------------------------------------
    def hypercall(self, kernel, nr: int, args: tuple) -> int:
        """Answers one HC_HOSTFS_* hypercall; args are rdi, rsi, rdx, r10, r8 as unsigned
        ints.  Returns the value for rax (negative errno on failure)."""
        handler = self._dispatch.get(nr)
        if handler is None:
            return -errno.ENOSYS
        try:
            if nr in self._RENAMING:
                with self.names_lock:
                    return handler(kernel, *args)
            return handler(kernel, *args)
        except FaultError as e:
            log.warning("hostfs hypercall %d: bad kernel buffer: %s", nr, e)
            return -errno.EFAULT
        except OSError as e:
            if isinstance(e.errno, int) and 0 < e.errno < 4096:
                return -e.errno
            log.error("hostfs hypercall %d: %r carries no errno", nr, e)
            return -errno.EIO
        except Exception:
            log.exception("hostfs hypercall %d failed", nr)
            return -errno.EIO

    def _hc_lookup(self, kernel, dir_id, name_ptr, mode_ptr, mutexes_ptr=0, *_):
        """The child's id, and its mode written at mode_ptr, with HOSTFS_PERMANENT when
        the name stays while the kernel runs (a fixed name of a directory that stays):
        the kernel keeps that dentry and asks no more about it.  At mutexes_ptr (unless
        0), the u32 of the kernel mutexes its operations hold (:func:`node_mutexes`)."""
        name = _read_cstring(kernel, name_ptr, DIRENT_NAME_MAX + 1)
        try:
            child_id, child = self.lookup(dir_id, name)
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return -errno.ENOENT
            raise
        if mode_ptr:
            mode = node_mode(child) & 0xFFFF
            if dir_id in self._permanent and name in fixed_names(self.node(dir_id)):
                self._permanent.add(child_id)
                mode |= HOSTFS_PERMANENT
            kernel.write(mode_ptr, mode.to_bytes(4, "little"))
        if mutexes_ptr:
            kernel.write(mutexes_ptr, node_mutexes(child).to_bytes(4, "little"))
        return child_id

    def _hc_open(self, kernel, node_id, flags, pid, *_):
        pid = _signed32(pid)
        try:
            comm = kernel.current_comm()
        except Exception:
            comm = ""
        return self.open(node_id, flags & 0xFFFFFFFF, pid, comm)

    def _entry(self, hid: int) -> _Open:
        with self._lock:
            entry = self._handles.get(hid)
        if entry is None:
            raise OSError(errno.EBADF, "Bad file descriptor")
        return entry

    def _hc_read(self, kernel, hid, kbuf, count, pos, *_):
        # _entry() and wants_read(), written out: every read of a file comes here.
        with self._lock:
            entry = self._handles.get(hid)
        if entry is None or (entry.flags & O_ACCMODE) == O_WRONLY:
            raise OSError(errno.EBADF, "Bad file descriptor")
        data = entry.handle.read(int(count), _signed64(pos))
        if data is None:
            data = b""
        data = bytes(data)[:count]
        if data:
            kernel.write(kbuf, data)
        return len(data)

    def _hc_write(self, kernel, hid, kbuf, count, pos, *_):
        entry = self._entry(hid)
        if not wants_write(entry.flags):
            raise OSError(errno.EBADF, "Bad file descriptor")
        data = kernel.read(kbuf, count) if count else b""
        n = entry.handle.write(data, _signed64(pos))
        if n is None:
            n = len(data)
        if not 0 <= n <= count:
            raise OSError(errno.EIO, f"handle write returned {n} for {count} bytes")
        return n

    def _hc_release(self, kernel, hid, *_):
        self.release(hid)
        return 0

    def mkdir(self, dir_id: int, name: str, mode: int) -> tuple[int, object]:
        """Makes directory ``name`` in directory dir_id, through the directory node's
        ``mkdir(name, mode)``; returns (child id, child node), ``(0, None)`` when it is
        gone again already.  EPERM where the node makes no directories (as the VFS
        answers for an inode without ->mkdir)."""
        directory = self.refresh(dir_id)
        make = getattr(directory, "mkdir", None)
        if make is None:
            raise OSError(errno.EPERM, "Operation not permitted")
        make(name, mode)
        try:
            return self.lookup(dir_id, name)
        except OSError:
            return 0, None

    def rmdir(self, dir_id: int, name: str) -> None:
        """Removes directory ``name`` from directory dir_id through the node's
        ``rmdir(name)``; EPERM where the node removes none."""
        directory = self.refresh(dir_id)
        remove = getattr(directory, "rmdir", None)
        if remove is None:
            raise OSError(errno.EPERM, "Operation not permitted")
        remove(name)
        with self._lock:
            gone = self._ids.get((dir_id, name))
        if gone is not None:
            self._forget(gone)

    def _hc_mkdir(self, kernel, dir_id, name_ptr, mode, mode_ptr, *_):
        name = _read_cstring(kernel, name_ptr, DIRENT_NAME_MAX + 1)
        child_id, child = self.mkdir(dir_id, name, mode & 0o7777)
        if child_id and mode_ptr:
            kernel.write(mode_ptr, (node_mode(child) & 0xFFFFFFFF).to_bytes(4, "little"))
        return child_id

    def _hc_rmdir(self, kernel, dir_id, name_ptr, *_):
        self.rmdir(dir_id, _read_cstring(kernel, name_ptr, DIRENT_NAME_MAX + 1))
        return 0

    def _hc_readdir(self, kernel, dir_id, index, kbuf, *_):
        with self._lock:
            place = self._places.get(dir_id)
        if place is None:
            raise OSError(errno.ENOENT, "No such file or directory")
        # One listing per pass over the directory: taken at index 0, so a pass is one
        # children() call and sees a consistent set of names.
        if index == 0 or not place.listing:
            self.refresh(dir_id)
            place.listing = self.list_dir(dir_id)
        if index >= len(place.listing):
            return 0
        name, child_id, mode = place.listing[index]
        raw = name.encode("utf-8", "surrogateescape")[:DIRENT_NAME_MAX]
        kernel.write(kbuf, raw + b"\0")
        kernel.write(kbuf + DIRENT_MODE_OFFSET, (mode & 0xFFFFFFFF).to_bytes(4, "little"))
        return child_id


def _read_cstring(kernel, addr: int, limit: int) -> str:
    data = bytearray()
    while len(data) < limit:
        chunk = kernel.read(addr + len(data), min(64, limit - len(data)))
        nul = chunk.find(b"\0")
        if nul >= 0:
            data += chunk[:nul]
            break
        data += chunk
    return data.decode("utf-8", "surrogateescape")


def _signed32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & (1 << 31) else v


def _signed64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v & (1 << 63) else v


# ==== the whole tree =======================================================================
def _tracefs_root(tracer):
    """The tracer's tracefs root directory (the tracer itself when it is a directory
    node, else ``tracer.tracefs_root()``)."""
    if is_dir(tracer):
        return tracer
    return tracer.tracefs_root()


def kprobes_debugfs_dir(engine) -> Directory:
    """debugfs ``kprobes/`` over the engine (REFERENCE §7.1–7.3), through the engine's
    ``list_text()``, ``blacklist_text()``, ``kprobes_all_disarmed``, ``arm_all_kprobes()``
    and ``disarm_all_kprobes()``.  The knob runs inside a hypercall (a hook, under the
    machine lock), where the engine may patch text."""
    def set_enabled(value: bool) -> None:
        if value:
            engine.arm_all_kprobes()
        else:
            engine.disarm_all_kprobes()
            engine.wait_for_kprobe_optimizer()

    return Directory({
        "list": TextFile(engine.list_text, mode=0o400),
        # 6.1's arm_all_kprobes/disarm_all_kprobes hold kprobe_mutex, and text_mutex
        # while a probe is armed or disarmed (here across the whole write).
        "enabled": BoolKnob(lambda: not engine.kprobes_all_disarmed, set_enabled, 0o600,
                            Mutexes(write=("kprobe_mutex", "text_mutex"))),
        "blacklist": TextFile(engine.blacklist_text, mode=0o400,
                              mutexes=Mutexes(read=("kprobe_mutex",))),
    }, mode=0o755)


def proc_tree(kernel, engine=None, stack_tracer=None) -> Directory:
    """``/proc``: kallsyms, version, meminfo and slabinfo from the machine; ``sys/debug/
    kprobes-optimization`` over the engine's ``optimization_enabled`` and
    ``set_optimization()`` (the write returns once the optimizer has run, §7.4);
    ``sys/kernel/ftrace_enabled`` over the engine's ftrace core (an int sysctl: zero
    puts every ftrace site back to a NOP until it is non-zero again);
    ``sys/kernel/stack_tracer_enabled`` over the stack tracer's ``enabled_value`` and
    ``set_enabled()`` (an int sysctl: non-zero traces)."""
    def set_optimization(value: int) -> None:
        engine.set_optimization(bool(value))
        engine.wait_for_kprobe_optimizer()

    proc = Directory(mode=0o555)
    proc.add("kallsyms", TextFile(kernel.kallsyms, mode=0o444))
    proc.add("version", TextFile(kernel.proc_version, mode=0o444))
    if getattr(kernel, "modules", None) is not None:
        proc.add("modules", TextFile(kernel.modules.proc_modules, mode=0o444))
    memory = getattr(kernel, "memory", None)
    if memory is not None:
        proc.add("meminfo", TextFile(memory.meminfo_text, mode=0o444))
        proc.add("slabinfo", TextFile(memory.slabinfo_text, mode=0o400))
    sys_dirs = {}
    if engine is not None:
        knob = IntKnob(lambda: int(bool(engine.optimization_enabled)), set_optimization,
                       0, 1, 0o644)
        sys_dirs["debug"] = Directory({"kprobes-optimization": knob}, mode=0o555)
    sysctl_kernel = {}
    ftrace = getattr(engine, "ftrace", None)
    if ftrace is not None:
        sysctl_kernel["ftrace_enabled"] = IntKnob(
            lambda: ftrace.ftrace_enabled_value, ftrace.set_ftrace_enabled,
            -(1 << 31), (1 << 31) - 1, 0o644)
    if stack_tracer is not None:
        sysctl_kernel["stack_tracer_enabled"] = IntKnob(
            lambda: stack_tracer.enabled_value, stack_tracer.set_enabled,
            -(1 << 31), (1 << 31) - 1, 0o644)
    if sysctl_kernel:
        sys_dirs["kernel"] = Directory(sysctl_kernel, mode=0o555)
    if sys_dirs:
        proc.add("sys", Directory(sys_dirs, mode=0o555))
    return proc


def modules_control_dir(modules) -> Directory:
    """debugfs ``kprobefs/``: the daemon's own controls (Linux has no such directory).

    ``modules`` loads and unloads the kernel's modules, as the module tools of
    ``kprobefs exec`` do (kprobefs/kmod.py): each ``write()`` holds commands, one per line,
    ``load NAME [PARAM=VALUE...]`` or ``unload NAME`` (``-`` and ``_`` alike in NAME;
    the parameters are set before the module's init runs), applied in order;
    the first failing one fails the write with the errno Linux's init_module/
    delete_module give (ENOENT no such module or not loaded, EEXIST already loaded,
    EBUSY cannot unload now, init's own errno); a malformed command is EINVAL.  A read
    lists the loaded modules as /proc/modules does.  ``modules`` is the machine's
    ModuleLoader; commands run inside the write's hypercall, where init and exit run on
    the writing task's CPU."""
    def command(data: bytes, offset: int) -> int:
        for line in bytes(data).decode("utf-8", "replace").splitlines():
            words = line.split()
            if not words:
                continue
            if len(words) < 2 or words[0] not in ("load", "unload") or (
                    words[0] == "unload" and len(words) != 2):
                raise OSError(errno.EINVAL, "Invalid argument")
            if words[0] == "load":
                modules.load(words[1], params=tuple(words[2:]))
            else:
                modules.unload(words[1])
        return len(data)

    # load_module and delete_module hold module_mutex; init and exit run without it.
    return Directory({"modules": TextFile(
        modules.proc_modules, mode=0o600, write=command,
        mutexes=Mutexes(write=("module_mutex",), work_unlocked=True))}, mode=0o700)


def build_tree(kernel, engine=None, tracer=None) -> HostFS:
    """The daemon's whole tree as a :class:`HostFS`: debugfs (``kprobes/`` from the engine,
    ``tracing/`` from the tracer), tracefs (the tracer's root) and proc.  A part whose
    provider is None is absent, never stubbed (``tracing/`` is then an empty directory:
    the kernel's tracefs mount is there all the same).

    HOOK POINTS: ``engine`` is a :class:`kprobefs.kprobes.KprobeEngine` (or anything with
    its listing/arming/optimization names); ``tracer`` is the tracefs root directory node
    (FILE PROTOCOL above) or an object whose ``tracefs_root()`` returns it."""
    debugfs = Directory(mode=0o700)
    if engine is not None:
        debugfs.add("kprobes", kprobes_debugfs_dir(engine))
    # The kernel always has tracefs mounted at debug/tracing (Linux's automount): the
    # name is listed even before a tracer fills the directory.
    tracefs = _tracefs_root(tracer) if tracer is not None else Directory(mode=MODE_DIR)
    debugfs.add("tracing", tracefs)
    modules = getattr(kernel, "modules", None)      # loadable modules, when the kernel has them
    if modules is not None:
        debugfs.add("kprobefs", modules_control_dir(modules))
    stack_tracer = getattr(tracer, "stack_tracer", None)
    return HostFS({DEBUGFS_ROOT: debugfs, TRACEFS_ROOT: tracefs,
                   PROC_ROOT: proc_tree(kernel, engine, stack_tracer)})


def walk(hostfs: HostFS, root_id: int, parts: Iterable[str]) -> tuple[int, object]:
    """(id, node) at the path of parts below root_id; OSError(ENOENT/ENOTDIR) else."""
    node_id, node = root_id, hostfs.node(root_id)
    for part in parts:
        node_id, node = hostfs.lookup(node_id, part)
    return node_id, node
