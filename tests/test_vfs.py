"""The emulated kernel's VFS, end to end through real system calls: ramfs (the root),
the path walk (symlinks, mounts, ".."), the descriptor table, hostfs (debugfs, tracefs
and proc served by the host), tracefs_create_dir() and sysfs."""

import errno
import struct

import pytest

from kprobefs.fs.tree import Directory, HostFS, TextFile
from kprobefs.machine import Kernel, UserBuffer
from kprobefs.machine.abi import (
    AT_FDCWD, AT_REMOVEDIR, O_APPEND, O_CREAT, O_DIRECTORY, O_EXCL, O_RDONLY, O_RDWR,
    O_TRUNC, O_WRONLY, S_IFDIR, S_IFLNK, S_IFREG,
)

O_NOFOLLOW = 0o400000
AT_SYMLINK_NOFOLLOW = 0x100
BAD = 0xDEAD0000  # a user address nothing maps
S_IFCHR = 0o020000
DT_DIR, DT_REG, DT_LNK = 4, 8, 10


@pytest.fixture
def kernel():
    return Kernel(cpus=2, seed=0)


@pytest.fixture
def task(kernel):
    return kernel.spawn("cat")


@pytest.fixture
def sc(kernel, task):
    """sc(name, *args): one system call of `task`, raw result."""
    return lambda name, *args: kernel.syscall(task, name, *args)


def read_all(sc, fd, size=4096):
    buf = UserBuffer(size)
    n = sc("read", fd, buf, size)
    assert n >= 0, n
    return buf.data[:n]


def open_read(sc, path, size=4096):
    fd = sc("openat", AT_FDCWD, path, O_RDONLY, 0)
    assert fd >= 0, (path, fd)
    try:
        return read_all(sc, fd, size)
    finally:
        sc("close", fd)


def getdents(sc, path):
    """[(name, d_type, d_ino)] of a directory, via getdents64."""
    fd = sc("openat", AT_FDCWD, path, O_RDONLY | O_DIRECTORY, 0)
    assert fd >= 0, (path, fd)
    out = []
    while True:
        buf = UserBuffer(256)
        n = sc("getdents64", fd, buf, 256)
        assert n >= 0, n
        if n == 0:
            break
        off = 0
        while off < n:
            ino, _off, reclen, dtype = struct.unpack_from("<QqHB", buf.data, off)
            name = buf.data[off + 19:off + reclen].split(b"\0")[0].decode()
            out.append((name, dtype, ino))
            off += reclen
    sc("close", fd)
    return out


def stat(sc, path, flags=0):
    buf = UserBuffer(144)
    ret = sc("newfstatat", AT_FDCWD, path, buf, flags)
    if ret < 0:
        return ret
    _dev, ino, nlink, mode = struct.unpack_from("<QQQI", buf.data)
    size = struct.unpack_from("<q", buf.data, 48)[0]
    return {"ino": ino, "nlink": nlink, "mode": mode, "size": size}


# ---- regular files ------------------------------------------------------------------
def test_write_then_read_back(sc):
    fd = sc("openat", AT_FDCWD, "/tmp/f", O_CREAT | O_RDWR, 0o644)
    assert fd >= 0
    assert sc("write", fd, b"hello, world", 12) == 12
    assert sc("lseek", fd, 0, 0) == 0
    assert read_all(sc, fd) == b"hello, world"
    assert read_all(sc, fd) == b""  # at EOF
    assert sc("close", fd) == 0
    assert sc("close", fd) == -errno.EBADF
    assert open_read(sc, "/tmp/f") == b"hello, world"


def test_large_file_grows_across_pages(sc):
    data = bytes(range(256)) * 400  # 100 KiB
    fd = sc("open", "/tmp/big", O_CREAT | O_WRONLY, 0o600)
    assert sc("write", fd, data, len(data)) == len(data)
    sc("close", fd)
    assert stat(sc, "/tmp/big")["size"] == len(data)
    assert open_read(sc, "/tmp/big", len(data) + 10) == data


def test_append_trunc_and_sparse_write(sc):
    fd = sc("open", "/tmp/a", O_CREAT | O_WRONLY, 0o644)
    sc("write", fd, b"abc", 3)
    sc("close", fd)
    fd = sc("open", "/tmp/a", O_WRONLY | O_APPEND, 0)
    sc("write", fd, b"def", 3)
    sc("close", fd)
    assert open_read(sc, "/tmp/a") == b"abcdef"
    fd = sc("open", "/tmp/a", O_WRONLY | O_TRUNC, 0)
    assert stat(sc, "/tmp/a")["size"] == 0
    assert sc("lseek", fd, 4, 0) == 4
    sc("write", fd, b"x", 1)
    sc("close", fd)
    assert open_read(sc, "/tmp/a") == b"\0\0\0\0x"
    fd = sc("open", "/tmp/a", O_RDONLY, 0)
    assert sc("lseek", fd, -1, 2) == 4  # SEEK_END
    assert sc("lseek", fd, -10, 0) == -errno.EINVAL
    assert sc("write", fd, b"no", 2) == -errno.EBADF  # read-only descriptor
    sc("close", fd)


def test_pread64_and_pwrite64_leave_the_position(sc):
    fd = sc("open", "/tmp/p", O_CREAT | O_RDWR, 0o644)
    sc("write", fd, b"abcdef", 6)
    assert sc("lseek", fd, 1, 0) == 1
    buf = UserBuffer(3)
    assert sc("pread64", fd, buf, 3, 2) == 3 and buf.data == b"cde"
    assert sc("pwrite64", fd, b"XY", 2, 4) == 2
    assert sc("pread64", fd, buf, 3, 5) == 1 and buf.data[:1] == b"Y"
    assert sc("lseek", fd, 0, 1) == 1           # SEEK_CUR: where it was
    buf = UserBuffer(8)
    assert sc("read", fd, buf, 8) == 5 and buf.data[:5] == b"bcdXY"
    assert sc("pread64", fd, buf, 8, -1) == -errno.EINVAL
    assert sc("pwrite64", fd, b"x", 1, -1) == -errno.EINVAL
    assert sc("pread64", 99, buf, 8, 0) == -errno.EBADF
    sc("close", fd)
    fd = sc("open", "/tmp/p", O_RDONLY, 0)
    assert sc("pwrite64", fd, b"no", 2, 0) == -errno.EBADF
    sc("close", fd)
    assert open_read(sc, "/tmp/p") == b"abcdXY"


def test_open_flag_errors(sc):
    assert sc("open", "/tmp/nope", O_RDONLY, 0) == -errno.ENOENT
    fd = sc("open", "/tmp/e", O_CREAT | O_EXCL | O_WRONLY, 0o600)
    assert fd >= 0
    assert sc("open", "/tmp/e", O_CREAT | O_EXCL | O_WRONLY, 0o600) == -errno.EEXIST
    assert sc("open", "/tmp/e", O_RDONLY | O_DIRECTORY, 0) == -errno.ENOTDIR
    assert sc("open", "/tmp/e/x", O_RDONLY, 0) == -errno.ENOTDIR
    assert sc("open", "/tmp", O_WRONLY, 0) == -errno.EISDIR
    assert sc("open", "/tmp", O_CREAT | O_RDONLY, 0o600) == -errno.EISDIR
    assert sc("open", "/tmp/newdir/", O_CREAT | O_WRONLY, 0o600) == -errno.EISDIR
    assert sc("open", "/tmp/" + "n" * 256, O_RDONLY, 0) == -errno.ENAMETOOLONG
    assert sc("open", "", O_RDONLY, 0) == -errno.ENOENT
    assert sc("read", 63, BAD, 1) == -errno.EBADF
    fd2 = sc("open", "/tmp", O_RDONLY, 0)
    assert sc("read", fd2, UserBuffer(8), 8) == -errno.EISDIR


def test_openat2_checks_open_how_as_6_1_does(sc):
    """openat2(dfd, name, &how, size): a struct open_how {flags, mode, resolve} of at
    least 24 bytes, a longer one zero past them (copy_struct_from_user), every flag
    known and a mode only with O_CREAT or O_TMPFILE (build_open_flags)."""
    O_TMPFILE = 0o20000000 | O_DIRECTORY

    def how(flags, mode=0, resolve=0, tail=b""):
        return struct.pack("<3Q", flags, mode, resolve) + tail

    def openat2(path, h, size=None):
        return sc("openat2", AT_FDCWD, path, h, len(h) if size is None else size)

    fd = openat2("/tmp/o2", how(O_CREAT | O_WRONLY, 0o600))
    assert fd >= 0
    assert sc("write", fd, b"hi", 2) == 2 and sc("close", fd) == 0
    fd = openat2("/tmp/o2", how(O_RDONLY, tail=bytes(16)))   # a longer struct, zeros
    assert fd >= 0 and read_all(sc, fd) == b"hi"
    sc("close", fd)
    assert openat2("/tmp/o2", how(O_RDONLY), size=16) == -errno.EINVAL
    assert openat2("/tmp/o2", how(O_RDONLY, tail=b"\0\0\1")) == -errno.E2BIG
    assert openat2("/tmp/o2", how(O_RDONLY), size=4097) == -errno.E2BIG
    assert openat2("/tmp/o2", how(O_RDONLY | 0o40000000000)) == -errno.EINVAL
    assert openat2("/tmp/o2", how(O_RDONLY, 0o600)) == -errno.EINVAL
    assert openat2("/tmp/o2", how(O_CREAT | O_RDWR, 0o10000)) == -errno.EINVAL
    assert openat2("/tmp/o2", how(O_RDONLY, resolve=0x40)) == -errno.EINVAL
    assert openat2("/tmp/o2", how(O_RDONLY, resolve=0x18)) == -errno.EINVAL
    assert openat2("/tmp", how(O_TMPFILE | O_RDONLY)) == -errno.EINVAL
    assert openat2("/tmp", how(O_TMPFILE | O_RDWR, 0o600)) == -errno.EOPNOTSUPP
    assert openat2("/tmp/o2", how(O_RDONLY), size=BAD) == -errno.E2BIG
    assert sc("openat2", AT_FDCWD, "/tmp/o2", BAD, 24) == -errno.EFAULT
    # The same mode open() would mask off.
    assert sc("open", "/tmp/o2", O_RDONLY, 0o600) >= 0


def test_descriptor_table_fills_up(sc):
    fds = [sc("open", "/dev/null", O_RDONLY, 0) for _ in range(64)]
    assert fds[:3] == [0, 1, 2] and all(f >= 0 for f in fds[:64])
    assert sc("open", "/dev/null", O_RDONLY, 0) == -errno.EMFILE
    assert sc("close", 7) == 0
    assert sc("open", "/dev/null", O_RDONLY, 0) == 7  # lowest free slot


def test_bad_user_pointers_give_efault(sc):
    assert sc("open", BAD, O_RDONLY, 0) == -errno.EFAULT
    assert sc("mkdir", BAD, 0o755) == -errno.EFAULT
    assert sc("newfstatat", AT_FDCWD, "/tmp", BAD, 0) == -errno.EFAULT
    fd = sc("open", "/tmp/p", O_CREAT | O_RDWR, 0o600)
    assert sc("write", fd, BAD, 16) == -errno.EFAULT
    sc("write", fd, b"data", 4)
    sc("lseek", fd, 0, 0)
    assert sc("read", fd, BAD, 4) == -errno.EFAULT
    assert sc("getcwd", BAD, 64) == -errno.EFAULT
    dfd = sc("open", "/tmp", O_RDONLY | O_DIRECTORY, 0)
    assert sc("getdents64", dfd, BAD, 256) == -errno.EFAULT
    assert sc("readlink", BAD, UserBuffer(8), 8) == -errno.EFAULT


def test_dev_null_and_zero(sc):
    fd = sc("open", "/dev/null", O_RDWR, 0)
    assert sc("write", fd, b"discarded", 9) == 9
    assert read_all(sc, fd) == b""
    assert stat(sc, "/dev/null")["mode"] == S_IFCHR | 0o666
    assert open_read(sc, "/dev/zero", 16) == bytes(16)


def test_fork_inherits_descriptors_and_exit_closes_them(kernel, task, sc):
    fd = sc("open", "/tmp/shared", O_CREAT | O_RDWR, 0o600)
    sc("write", fd, b"inherited", 9)
    sc("lseek", fd, 0, 0)
    child = kernel.spawn("child", parent=task)
    buf = UserBuffer(16)
    assert kernel.syscall(child, "read", fd, buf, 16) == 9
    assert buf.data[:9] == b"inherited"
    assert sc("read", fd, UserBuffer(4), 4) == 0  # one shared file position


# ---- directories, links, the walk --------------------------------------------------------
def test_mkdir_rmdir_unlink(sc):
    assert sc("mkdir", "/tmp/d", 0o755) == 0
    assert sc("mkdir", "/tmp/d", 0o755) == -errno.EEXIST
    assert sc("mkdirat", AT_FDCWD, "/tmp/d/sub/", 0o700) == 0  # trailing slash is fine
    assert stat(sc, "/tmp/d/sub")["mode"] == S_IFDIR | 0o700
    assert sc("mkdir", "/tmp/nope/x", 0o755) == -errno.ENOENT
    assert sc("mkdir", "/", 0o755) == -errno.EEXIST
    fd = sc("open", "/tmp/d/file", O_CREAT | O_WRONLY, 0o644)
    sc("close", fd)
    assert sc("rmdir", "/tmp/d") == -errno.ENOTEMPTY
    assert sc("rmdir", "/tmp/d/file") == -errno.ENOTDIR
    assert sc("unlink", "/tmp/d/sub") == -errno.EISDIR
    assert sc("unlink", "/tmp/d/file/") == -errno.ENOTDIR
    assert sc("unlink", "/tmp/d/file") == 0
    assert sc("unlink", "/tmp/d/file") == -errno.ENOENT
    assert sc("unlinkat", AT_FDCWD, "/tmp/d/sub", AT_REMOVEDIR) == 0
    assert sc("rmdir", "/tmp/d/.") == -errno.EINVAL
    assert sc("rmdir", "/tmp/d") == 0
    assert stat(sc, "/tmp/d") == -errno.ENOENT
    assert sc("rmdir", "/sys/kernel/debug") == -errno.EBUSY  # a mount point


def test_unlinked_file_lives_while_open(sc):
    fd = sc("open", "/tmp/ghost", O_CREAT | O_RDWR, 0o600)
    sc("write", fd, b"boo", 3)
    assert sc("unlink", "/tmp/ghost") == 0
    assert sc("open", "/tmp/ghost", O_RDONLY, 0) == -errno.ENOENT
    sc("lseek", fd, 0, 0)
    assert read_all(sc, fd) == b"boo"
    # a new file of that name is a different inode
    fd2 = sc("open", "/tmp/ghost", O_CREAT | O_RDWR, 0o600)
    assert read_all(sc, fd2) == b""


def test_symlinks(sc):
    fd = sc("open", "/tmp/target", O_CREAT | O_WRONLY, 0o644)
    sc("write", fd, b"via link", 8)
    sc("close", fd)
    assert sc("symlink", "/tmp/target", "/tmp/abs") == 0
    assert sc("symlinkat", "target", AT_FDCWD, "/tmp/rel") == 0
    assert sc("symlink", "x", "/tmp/abs") == -errno.EEXIST
    buf = UserBuffer(64)
    assert sc("readlink", "/tmp/abs", buf, 64) == 11
    assert buf.data[:11] == b"/tmp/target"
    buf = UserBuffer(3)
    assert sc("readlinkat", AT_FDCWD, "/tmp/rel", buf, 3) == 3  # truncated, no NUL
    assert buf.data == b"tar"
    assert sc("readlink", "/tmp/target", UserBuffer(8), 8) == -errno.EINVAL
    assert sc("readlink", "/tmp/abs", UserBuffer(8), 0) == -errno.EINVAL
    assert open_read(sc, "/tmp/abs") == b"via link"
    assert open_read(sc, "/tmp/rel") == b"via link"
    assert stat(sc, "/tmp/rel", AT_SYMLINK_NOFOLLOW)["mode"] == S_IFLNK | 0o777
    assert stat(sc, "/tmp/rel")["mode"] == S_IFREG | 0o644
    assert sc("open", "/tmp/abs", O_RDONLY | O_NOFOLLOW, 0) == -errno.ELOOP
    # a link in the middle of a path, and one to a directory
    assert sc("symlink", "/sys/kernel", "/tmp/k") == 0
    assert stat(sc, "/tmp/k/debug")["mode"] & S_IFDIR
    assert sc("symlink", "../tmp", "/tmp/up") == 0
    assert open_read(sc, "/tmp/up/up/up/target") == b"via link"
    # a dangling link with O_CREAT creates its target
    assert sc("symlink", "/tmp/created", "/tmp/dangling") == 0
    fd = sc("open", "/tmp/dangling", O_CREAT | O_WRONLY, 0o600)
    assert fd >= 0
    assert stat(sc, "/tmp/created")["mode"] == S_IFREG | 0o600
    assert sc("open", "/tmp/dangling", O_CREAT | O_EXCL | O_WRONLY, 0o600) == -errno.EEXIST


def test_symlink_loops_give_eloop(sc):
    assert sc("symlink", "/tmp/loop2", "/tmp/loop1") == 0
    assert sc("symlink", "/tmp/loop1", "/tmp/loop2") == 0
    assert sc("open", "/tmp/loop1", O_RDONLY, 0) == -errno.ELOOP
    assert sc("open", "/tmp/loop1/x", O_RDONLY, 0) == -errno.ELOOP
    assert sc("symlink", "self/x", "/tmp/self") == 0
    assert sc("open", "/tmp/self", O_RDONLY, 0) == -errno.ELOOP


def test_getdents64_lists_a_directory(sc):
    sc("mkdir", "/tmp/ls", 0o755)
    sc("mkdir", "/tmp/ls/sub", 0o755)
    sc("close", sc("open", "/tmp/ls/file", O_CREAT | O_WRONLY, 0o644))
    sc("symlink", "file", "/tmp/ls/link")
    entries = getdents(sc, "/tmp/ls")
    assert [(n, t) for n, t, _ in entries] == [
        (".", DT_DIR), ("..", DT_DIR), ("sub", DT_DIR), ("file", DT_REG), ("link", DT_LNK)]
    assert entries[3][2] == stat(sc, "/tmp/ls/file")["ino"]
    assert {n for n, _, _ in getdents(sc, "/")} >= {"tmp", "dev", "proc", "sys"}
    fd = sc("open", "/tmp/ls", O_RDONLY, 0)
    assert sc("getdents64", fd, UserBuffer(16), 16) == -errno.EINVAL  # too small
    fd = sc("open", "/tmp/ls/file", O_RDONLY, 0)
    assert sc("getdents64", fd, UserBuffer(256), 256) == -errno.ENOTDIR


def test_chdir_getcwd_and_dotdot(sc):
    buf = UserBuffer(64)
    assert sc("getcwd", buf, 64) == 2 and buf.data[:2] == b"/\0"
    sc("mkdir", "/tmp/w", 0o755)
    sc("mkdir", "/tmp/w/x", 0o755)
    assert sc("chdir", "/tmp/w/x") == 0
    buf = UserBuffer(64)
    assert sc("getcwd", buf, 64) == 9 and buf.data[:9] == b"/tmp/w/x\0"
    assert sc("getcwd", UserBuffer(4), 4) == -errno.ERANGE
    assert sc("chdir", "../..") == 0
    buf = UserBuffer(64)
    sc("getcwd", buf, 64)
    assert buf.data.split(b"\0")[0] == b"/tmp"
    assert sc("chdir", "/tmp/nope") == -errno.ENOENT
    sc("close", sc("open", "/tmp/plain", O_CREAT | O_WRONLY, 0o600))
    assert sc("chdir", "/tmp/plain") == -errno.ENOTDIR
    assert sc("chdir", "/../../..") == 0  # ".." stops at the root
    buf = UserBuffer(8)
    sc("getcwd", buf, 8)
    assert buf.data[:2] == b"/\0"
    # relative names resolve against the cwd; a removed cwd has no name
    sc("chdir", "/tmp/w/x")
    assert sc("mkdir", "rel", 0o755) == 0
    assert stat(sc, "/tmp/w/x/rel")["mode"] & S_IFDIR
    sc("rmdir", "rel")
    assert sc("rmdir", "/tmp/w/x") == 0
    assert sc("getcwd", UserBuffer(64), 64) == -errno.ENOENT
    assert sc("open", "new", O_CREAT | O_WRONLY, 0o600) == -errno.ENOENT


def test_getcwd_through_mounts(sc):
    assert sc("chdir", "/sys/kernel/debug/tracing") == 0
    buf = UserBuffer(64)
    n = sc("getcwd", buf, 64)
    assert buf.data[:n] == b"/sys/kernel/debug/tracing\0"
    assert sc("chdir", "..") == 0
    buf = UserBuffer(64)
    n = sc("getcwd", buf, 64)
    assert buf.data[:n] == b"/sys/kernel/debug\0"


def test_stat_reports_type_size_and_links(sc):
    fd = sc("open", "/tmp/s", O_CREAT | O_WRONLY, 0o640)
    sc("write", fd, b"12345", 5)
    st = stat(sc, "/tmp/s")
    assert st["mode"] == S_IFREG | 0o640 and st["size"] == 5 and st["nlink"] == 1
    buf = UserBuffer(144)
    assert sc("stat", "/tmp", buf) == 0
    assert struct.unpack_from("<I", buf.data, 24)[0] & S_IFDIR
    assert stat(sc, "/tmp/none") == -errno.ENOENT


# ---- sysfs ---------------------------------------------------------------------------
def test_sysfs_name_attributes(sc):
    assert open_read(sc, "/sys/fs/ramfs/name") == b"ramfs\n"
    assert open_read(sc, "/sys/fs/tracefs/name") == b"tracefs\n"
    assert open_read(sc, "/sys/class/net/eth0/name") == b"eth0\n"
    assert open_read(sc, "/sys/class/net/lo/mtu") == b"65536\n"
    assert open_read(sc, "/sys/class/net/eth0/address") == b"52:54:00:12:34:56\n"
    assert {n for n, _, _ in getdents(sc, "/sys/class/net")} >= {"lo", "eth0"}


# ---- hostfs: debugfs, tracefs, proc ----------------------------------------------------
class _Recorder(TextFile):
    """A host file that records every write it gets (one entry per host call)."""

    def __init__(self, content=b"", busy_on_trunc=False):
        self.writes = []
        self.content = content
        self.busy_on_trunc = busy_on_trunc
        super().__init__(lambda: self.content, 0o640, self._store)

    def _store(self, data, offset):
        self.writes.append((bytes(data), offset))
        return len(data)

    def open(self, flags, pid, comm):
        if flags & O_TRUNC and self.busy_on_trunc:
            raise OSError(errno.EBUSY, "Device or resource busy")
        self.opened_by = (pid, comm)
        return super().open(flags, pid, comm)


@pytest.fixture
def host(kernel):
    tracing = Directory({
        "README": TextFile(lambda: "tracing mini-HOWTO\n" * 2000),
        "kprobe_events": _Recorder(b"p:myprobe vfs_read\n", busy_on_trunc=True),
        "events": Directory({}),
    })
    debug = Directory({"kprobes": Directory({"list": TextFile(lambda: "")}),
                       "tracing": tracing})
    proc = Directory({"version": TextFile(lambda: "Linux version 6.1\n")})
    fs = HostFS({1: debug, 2: tracing, 3: proc})
    kernel.hostfs = fs
    return fs, tracing


def test_hostfs_read_and_lookup(host, sc, task):
    fs, tracing = host
    assert open_read(sc, "/proc/version") == b"Linux version 6.1\n"
    readme = "tracing mini-HOWTO\n".encode() * 2000  # 38 KB: several 16 KiB host reads
    assert open_read(sc, "/sys/kernel/tracing/README", 64 * 1024) == readme
    assert open_read(sc, "/sys/kernel/debug/tracing/README", 64 * 1024) == readme
    assert sc("open", "/sys/kernel/tracing/nope", O_RDONLY, 0) == -errno.ENOENT
    st = stat(sc, "/sys/kernel/tracing/kprobe_events")
    assert st["mode"] == S_IFREG | 0o640 and st["size"] == 0
    names = {n for n, _, _ in getdents(sc, "/sys/kernel/tracing")}
    assert names == {".", "..", "README", "kprobe_events", "events"}
    assert fs.open_handles == 0  # every open was released by its last close


def test_hostfs_write_is_one_host_call(host, sc):
    _, tracing = host
    rec = tracing.children()["kprobe_events"]
    fd = sc("open", "/sys/kernel/tracing/kprobe_events", O_WRONLY | O_APPEND, 0)
    assert fd >= 0
    big = b"p:x vfs_read\n" * 20000  # 260 KB in one write()
    assert sc("write", fd, big, len(big)) == len(big)
    assert sc("write", fd, b"-:x\n", 4) == 4
    assert [len(d) for d, _ in rec.writes] == [len(big), 4]
    assert rec.writes[0][0] == big
    sc("close", fd)


def test_hostfs_open_errors_pass_through(host, sc):
    assert sc("open", "/sys/kernel/tracing/kprobe_events", O_WRONLY | O_TRUNC, 0) == \
        -errno.EBUSY
    assert sc("open", "/sys/kernel/tracing/README", O_WRONLY, 0) == -errno.EACCES
    assert sc("mkdir", "/sys/kernel/tracing/events/new", 0o755) == -errno.EPERM
    assert sc("unlink", "/sys/kernel/tracing/README") == -errno.EPERM
    assert sc("symlink", "x", "/sys/kernel/tracing/l") == -errno.EPERM
    assert sc("open", "/sys/kernel/tracing/new", O_CREAT | O_WRONLY, 0o600) == -errno.EACCES


class _Instances(Directory):
    """A host directory that makes and removes subdirectories, as tracefs's instances/."""

    def __init__(self):
        super().__init__({})
        self.calls = []

    def mkdir(self, name, mode):
        self.calls.append(("mkdir", name, mode))
        if name in self._entries:
            raise OSError(errno.EEXIST, "File exists")
        self.add(name, Directory({"trace": TextFile(lambda: "")}))

    def rmdir(self, name):
        self.calls.append(("rmdir", name))
        if name == "busy":
            raise OSError(errno.EBUSY, "Device or resource busy")
        del self._entries[name]


def test_hostfs_mkdir_and_rmdir_ask_the_host(host, sc):
    fs, tracing = host
    instances = _Instances()
    tracing.add("instances", instances)
    assert sc("mkdir", "/sys/kernel/tracing/instances/foo", 0o755) == 0
    assert instances.calls == [("mkdir", "foo", 0o755)]
    st = stat(sc, "/sys/kernel/tracing/instances/foo")
    assert st["mode"] & 0o170000 == 0o040000
    assert open_read(sc, "/sys/kernel/tracing/instances/foo/trace") == b""
    assert sc("mkdir", "/sys/kernel/tracing/instances/foo", 0o755) == -errno.EEXIST
    assert sc("mkdir", "/sys/kernel/tracing/instances/busy", 0o700) == 0
    assert sc("rmdir", "/sys/kernel/tracing/instances/busy") == -errno.EBUSY
    assert sc("rmdir", "/sys/kernel/tracing/instances/foo") == 0
    assert stat(sc, "/sys/kernel/tracing/instances/foo") == -errno.ENOENT
    assert sc("rmdir", "/sys/kernel/tracing/instances/foo") == -errno.ENOENT
    assert sc("rmdir", "/sys/kernel/tracing/events") == -errno.EPERM
    assert sc("rmdir", "/sys/kernel/tracing/README") == -errno.ENOTDIR
    assert instances.calls[-1] == ("rmdir", "foo")      # the VFS answered the rest


def test_hostfs_names_follow_the_host_tree(host, sc):
    _, tracing = host
    events = tracing.children()["events"]
    group = {}                          # a group that comes and goes, as events' do
    events.add("kprobes", lambda: group.get("kprobes"))
    assert stat(sc, "/sys/kernel/tracing/events/kprobes") == -errno.ENOENT
    group["kprobes"] = Directory({"enable": TextFile(lambda: "0\n")})
    assert open_read(sc, "/sys/kernel/tracing/events/kprobes/enable") == b"0\n"
    assert sc("chdir", "/sys/kernel/tracing/events/kprobes") == 0  # pins the dentry
    group.clear()
    assert stat(sc, "/sys/kernel/tracing/events/kprobes") == -errno.ENOENT
    assert sc("chdir", "/") == 0


def test_a_name_the_host_keeps_is_looked_up_once(kernel, host, sc):
    """A fixed name below names that stay (tracefs's own files) is kept by the kernel:
    walks after the first make no lookup hypercall for it."""
    lookups = []
    hypercall = kernel.hostfs.hypercall
    kernel.hostfs.hypercall = lambda k, nr, args: (lookups.append(nr == 16),
                                                   hypercall(k, nr, args))[1]
    try:
        for _ in range(3):
            assert stat(sc, "/sys/kernel/tracing/kprobe_events")["mode"] == S_IFREG | 0o640
    finally:
        del kernel.hostfs.hypercall
    assert lookups.count(True) == 1


def test_tracefs_create_dir_and_remove(kernel, host, sc):
    _, tracing = host
    name = struct.unpack("<Q", kernel.read(kernel.image.symbol_value("tcp_prot"), 8))[0]
    assert kernel.read(name, 4) == b"TCP\0"
    dentry = kernel.upcall("tracefs_create_dir", name, 0)
    assert dentry >> 63  # a kernel pointer
    assert kernel.upcall("tracefs_create_dir", name, 0) == 0  # exists: NULL
    child = kernel.upcall("tracefs_create_dir", name, dentry)
    assert child >> 63
    # The host does not know "TCP": the walk asks it, and the name is not there.
    assert stat(sc, "/sys/kernel/tracing/TCP") == -errno.ENOENT
    tracing.add("TCP", Directory({}))
    assert stat(sc, "/sys/kernel/tracing/TCP")["mode"] & S_IFDIR
    kernel.upcall("tracefs_remove", dentry)
    again = kernel.upcall("tracefs_create_dir", name, 0)
    assert again >> 63
    kernel.upcall("tracefs_remove", again)


def test_task_exit_releases_host_handles(kernel, host):
    fs, _ = host
    t = kernel.spawn("holder")
    assert kernel.syscall(t, "open", "/proc/version", O_RDONLY, 0) >= 0
    assert fs.open_handles == 1
    with pytest.raises(Exception):
        kernel.syscall(t, "exit", 0)
    assert fs.open_handles == 0


# ---- rename -------------------------------------------------------------------------------
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


def write_file(sc, path, data):
    fd = sc("openat", AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, 0o644)
    assert fd >= 0, (path, fd)
    assert sc("write", fd, data, len(data)) == len(data)
    sc("close", fd)


def test_rename_replaces_a_file_and_moves_across_directories(sc):
    write_file(sc, "/tmp/x", b"first")
    write_file(sc, "/tmp/y", b"second")
    assert sc("renameat2", AT_FDCWD, "/tmp/x", AT_FDCWD, "/tmp/y", 0) == 0
    assert open_read(sc, "/tmp/y") == b"first"
    assert sc("openat", AT_FDCWD, "/tmp/x", O_RDONLY, 0) == -errno.ENOENT
    assert sc("mkdir", "/tmp/d", 0o755) == 0
    assert sc("rename", "/tmp/y", "/tmp/d/z") == 0           # into another directory
    assert open_read(sc, "/tmp/d/z") == b"first"
    assert sc("renameat", AT_FDCWD, "/tmp/d", AT_FDCWD, "/tmp/e") == 0   # a directory
    assert open_read(sc, "/tmp/e/z") == b"first"
    names = {name for name, _, _ in getdents(sc, "/tmp")}
    assert "e" in names and not names & {"d", "x", "y"}
    # a long name (past the dentry's inline buffer) and back
    long = "/tmp/" + "n" * 60
    assert sc("rename", "/tmp/e/z", long) == 0 and open_read(sc, long) == b"first"
    assert sc("rename", long, "/tmp/short") == 0 and open_read(sc, "/tmp/short") == b"first"


def test_rename_errors_are_linux_6_1s(sc):
    write_file(sc, "/tmp/f", b"f")
    write_file(sc, "/tmp/g", b"g")
    assert sc("mkdir", "/tmp/dir", 0o755) == 0
    assert sc("mkdir", "/tmp/full", 0o755) == 0
    write_file(sc, "/tmp/full/inside", b"i")
    assert sc("rename", "/tmp/none", "/tmp/h") == -errno.ENOENT
    assert sc("renameat2", AT_FDCWD, "/tmp/f", AT_FDCWD, "/tmp/g",
              RENAME_NOREPLACE) == -errno.EEXIST
    assert sc("renameat2", AT_FDCWD, "/tmp/f", AT_FDCWD, "/tmp/g",
              RENAME_NOREPLACE | RENAME_EXCHANGE) == -errno.EINVAL
    assert sc("rename", "/tmp/dir", "/tmp/f") == -errno.ENOTDIR        # dir over file
    assert sc("rename", "/tmp/f", "/tmp/dir") == -errno.EISDIR         # file over dir
    assert sc("rename", "/tmp/dir", "/tmp/full") == -errno.ENOTEMPTY
    assert sc("rename", "/tmp/dir", "/tmp/dir/sub") == -errno.EINVAL   # into itself
    assert sc("rename", "/tmp/f/", "/tmp/h") == -errno.ENOTDIR
    assert sc("rename", "/tmp/f", "/proc/f") in (-errno.EXDEV, -errno.ENOENT)
    assert sc("rename", "/tmp/f", "/tmp/f") == 0                       # the same: nothing
    assert open_read(sc, "/tmp/f") == b"f" and open_read(sc, "/tmp/g") == b"g"
