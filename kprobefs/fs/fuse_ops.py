"""The libfuse2 loop (``KPROBEFS_FUSE=libfuse``; the default is :mod:`.fuse_ll`): the only
module that imports fusepy.  It turns fusepy's calls into
:class:`~kprobefs.fs.gateway.Gateway` requests and picks each errno on purpose; both
loops behave alike:

* files report size 0 (but ``trace_pipe_raw``, below), so each open sets ``direct_io``
  (reads go to the daemon, never to the page cache), and ``keep_cache`` 0;
* splice(2) from ``trace_pipe_raw`` (trace-cmd's recorders): the host's FUSE (6.18)
  splices even a ``direct_io`` file through the page cache (``filemap_splice_read``),
  reading each page at the file's position with a READ, and stops at the file's size.
  So ``trace_pipe_raw`` reports a size no reader reaches (``fuse_ll.STREAM_SIZE``) and the
  mount turns readahead off (``max_readahead=0``): each splice then READs exactly the
  pages it moves, each READ of ``trace_pipe_raw`` is one whole page (never the short
  read FUSE takes for end of file), and an empty buffer is EAGAIN or a blocked READ as
  for read(2).  ``keep_cache`` 0 drops those cached pages at the next open;
* ``trace_pipe`` and ``trace_pipe_raw`` open nonseekable (lseek is ESPIPE), as in Linux;
* ``O_TRUNC`` arrives in open() (``atomic_o_trunc``); a separate truncate to 0 is the same
  "clear" action;
* one write(2) is one request (``big_writes``, ``max_write``), so a command is never split;
* FLUSH, sent inside close(2), closes the emulated fd of a process that holds no other
  descriptor on the file (Gateway.flush): the file is released before close returns,
  as on Linux; RELEASE, which comes later, closes what other processes still hold;
* modes come from the emulated kernel (tracefs: files 0640/0440, dirs 0750), owned by the
  user who mounted (root under root); the source is ``debugfs`` (REFERENCE §10.1);
* errno: what the emulated kernel returned; ENOENT for unknown paths; EISDIR/EINVAL for
  writes to directories; EIO with the cause logged for anything unexpected.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import Callable

import fuse

from .fuse_ll import ATTR_TIMEOUT, MAX_WRITE, STREAMS, attributes
from .gateway import Caller, Gateway

__all__ = ["KprobeFS", "mount", "fuse_options"]

log = logging.getLogger("kprobefs.fs.fuse")

def fuse_options(allow_other: bool = False) -> dict:
    """The mount options (fusepy keyword arguments)."""
    opts = dict(fsname="debugfs", subtype="kprobefs", atomic_o_trunc=True, big_writes=True,
                max_write=MAX_WRITE, max_readahead=0, default_permissions=True,
                attr_timeout=ATTR_TIMEOUT, entry_timeout=0, negative_timeout=0)
    if allow_other:
        opts["allow_other"] = True
    return opts


def _caller() -> Caller:
    uid, gid, pid = fuse.fuse_get_context()
    return Caller(pid, uid, gid)


class KprobeFS(fuse.Operations):
    """fusepy operations over a gateway.  ``on_init`` runs in FUSE's init() (where the
    daemon starts its threads, after any fork), ``on_destroy`` in destroy()."""

    use_ns = True

    def __init__(self, gateway: Gateway, on_init: Callable[[], None] | None = None,
                 on_destroy: Callable[[], None] | None = None):
        self.gateway = gateway
        self._on_init = on_init
        self._on_destroy = on_destroy
        self._mounted_at = time.time_ns()

    def __call__(self, op, *args):
        """Dispatches one operation: OSError keeps its errno, anything else is EIO with
        the traceback logged (fusepy itself would answer EINVAL)."""
        try:
            return super().__call__(op, *args)
        except fuse.FuseOSError:
            raise
        except OSError as e:
            if isinstance(e.errno, int) and e.errno > 0:
                raise fuse.FuseOSError(e.errno) from e
            log.error("%s%r failed: %r", op, args[:1], e)
            raise fuse.FuseOSError(errno.EIO) from e
        except Exception as e:
            log.exception("%s%r failed", op, args[:1])
            raise fuse.FuseOSError(errno.EIO) from e

    # ---- lifecycle -------------------------------------------------------------------
    def init(self, path):
        if self._on_init is not None:
            self._on_init()

    def destroy(self, path):
        if self._on_destroy is not None:
            self._on_destroy()

    # ---- attributes and directories ----------------------------------------------------
    def getattr(self, path, fh=None):
        return attributes(self.gateway, path, _caller(), self._mounted_at)

    def readdir(self, path, fh):
        names = [name for name, _mode in self.gateway.readdir(path, _caller())]
        for dot in ("..", "."):
            if dot not in names:
                names.insert(0, dot)
        return names

    def statfs(self, path):
        return {"f_bsize": 4096, "f_frsize": 4096, "f_namemax": 255}

    def access(self, path, amode):
        # default_permissions makes the kernel check modes; only existence is ours.
        self.gateway.getattr(path, _caller())
        return 0

    # ---- files -------------------------------------------------------------------------
    def open(self, path, fi):
        fi.fh = self.gateway.open(path, fi.flags, _caller())
        fi.direct_io = 1
        fi.keep_cache = 0
        fi.nonseekable = int(os.path.basename(path) in STREAMS)
        return 0

    def create(self, path, mode, fi):
        fi.fh = self.gateway.open(path, fi.flags | os.O_CREAT, _caller(), mode & 0o7777)
        fi.direct_io = 1
        return 0

    def read(self, path, size, offset, fi):
        # fi.flags is the file's f_flags now (libfuse2 passes READ's flags): trace-cmd
        # sets O_NONBLOCK with fcntl before its last reads of trace_pipe_raw.
        return self.gateway.read(fi.fh, size, offset, _caller(), fi.flags)

    def write(self, path, data, offset, fi):
        return self.gateway.write(fi.fh, data, offset, _caller())

    def truncate(self, path, length, fh=None):
        if path is None:
            raise fuse.FuseOSError(errno.EBADF)
        self.gateway.truncate(path, length, _caller())
        return 0

    def release(self, path, fi):
        self.gateway.release(fi.fh)
        return 0

    def flush(self, path, fi):
        # Sent inside close(2): the process's last descriptor closes its emulated fd
        # before close returns (Gateway.flush); RELEASE comes later, in no order.
        self.gateway.flush(fi.fh, _caller())
        return 0

    def fsync(self, path, datasync, fi):
        return 0

    def utimens(self, path, times=None):
        return 0  # `touch` on a control file: nothing to record

    # ---- the namespace is the kernel's --------------------------------------------------
    def mkdir(self, path, mode):
        self.gateway.mkdir(path, mode & 0o7777, _caller())
        return 0

    def rmdir(self, path):
        self.gateway.rmdir(path, _caller())
        return 0

    def unlink(self, path):
        self.gateway.unlink(path, _caller())
        return 0

    def chmod(self, path, mode):
        raise fuse.FuseOSError(errno.EPERM)

    def chown(self, path, uid, gid):
        raise fuse.FuseOSError(errno.EPERM)

    def rename(self, old, new):
        self.gateway.rename(old, new, _caller())
        return 0

    def symlink(self, target, source):
        # fusepy's names: the link `target` is created, pointing to `source`.
        self.gateway.symlink(target, source, _caller())
        return 0

    def readlink(self, path):
        return self.gateway.readlink(path, _caller())

    def link(self, target, source):
        raise fuse.FuseOSError(errno.EPERM)

    def mknod(self, path, mode, dev):
        raise fuse.FuseOSError(errno.EPERM)


def mount(operations: KprobeFS, mountpoint: str, allow_other: bool = False,
          debug: bool = False) -> None:
    """Mounts and serves until unmounted or signalled (SIGTERM/SIGINT unmount), in the
    calling thread (multithreaded: trace_pipe readers block)."""
    fuse.FUSE(operations, mountpoint, raw_fi=True, foreground=True, nothreads=False,
              debug=debug, **fuse_options(allow_other))
