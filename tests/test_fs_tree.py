"""The tree of host-served files and the hostfs hypercall protocol, against a fake
kernel's memory (no machine, no FUSE)."""

import errno
import logging
import stat
import struct

import pytest

from fs_fakes import KBASE, FakeEngine, FakeKernel, FakeTracer
from kprobefs.fs.tree import (
    HC_HOSTFS_LOOKUP, HC_HOSTFS_OPEN, HC_HOSTFS_READ, HC_HOSTFS_READDIR, HC_HOSTFS_RELEASE,
    HC_HOSTFS_WRITE, HOSTFS_PERMANENT, BoolKnob, Directory, HostFS, IntKnob, TextFile,
    build_tree, fixed_names, kstrtobool, kstrtol, kstrtoul, node_mode,
)
from kprobefs.tracing.files import Directory as TracingDirectory


# ---- number parsing (REFERENCE §1) ---------------------------------------------------------
@pytest.mark.parametrize("text,value", [
    ("0", 0), ("10", 10), ("+10", 10), ("0x10", 16), ("0X1f", 31), ("010", 8),
    ("10\n", 10), ("18446744073709551615", 2**64 - 1),
])
def test_kstrtoul_accepts(text, value):
    assert kstrtoul(text) == value


@pytest.mark.parametrize("text,err", [
    ("", errno.EINVAL), (" 1", errno.EINVAL), ("1 ", errno.EINVAL), ("1\n\n", errno.EINVAL),
    ("-1", errno.EINVAL), ("0x", errno.EINVAL), ("09", errno.EINVAL), ("1a", errno.EINVAL),
    ("18446744073709551616", errno.ERANGE),
])
def test_kstrtoul_rejects(text, err):
    with pytest.raises(OSError) as e:
        kstrtoul(text)
    assert e.value.errno == err


def test_kstrtol_signs_and_range():
    assert kstrtol("-0x10\n") == -16
    assert kstrtol("+7") == 7
    assert kstrtol(str(-2**63)) == -2**63
    with pytest.raises(OSError) as e:
        kstrtol(str(2**63))
    assert e.value.errno == errno.ERANGE


@pytest.mark.parametrize("text,value", [
    ("1", True), ("y", True), ("Yes", True), ("t", True), ("T\n", True), ("on", True),
    ("ON", True), ("oN", True), ("0", False), ("n", False), ("F", False), ("off", False),
    ("oFF", False), ("1junk", True), ("0\n", False),
])
def test_kstrtobool_accepts(text, value):
    assert kstrtobool(text) is value


@pytest.mark.parametrize("text", ["", "2", "x", "o", "ox", " 1", "\n"])
def test_kstrtobool_rejects(text):
    with pytest.raises(OSError) as e:
        kstrtobool(text)
    assert e.value.errno == errno.EINVAL


# ---- generic nodes -------------------------------------------------------------------------
def test_text_file_snapshot_restarts_at_offset_zero():
    counter = iter(range(100))
    f = TextFile(lambda: f"gen{next(counter)}\n" * 3)
    h = f.open(0, 1, "cat")
    first = h.read(5, 0)
    assert first == b"gen0\n"
    assert h.read(100, 5) == b"gen0\ngen0\n"   # same snapshot while reading on
    assert h.read(4, 0) == b"gen1"             # reading from 0 regenerates (seq_file)
    with pytest.raises(OSError) as e:
        f.open(1, 1, "sh")                      # read-only: no write access
    assert e.value.errno == errno.EACCES
    assert stat.S_ISREG(f.mode) and stat.S_IMODE(f.mode) == 0o440


def test_bool_knob():
    state = {"v": True}
    knob = BoolKnob(lambda: state["v"], lambda v: state.update(v=v))
    h = knob.open(2, 1, "sh")
    assert h.read(10, 0) == b"1\n"
    assert h.write(b"0\n", 0) == 2 and state["v"] is False
    assert h.write(b"off", 0) == 3 and state["v"] is False
    assert h.write(b"on\n", 0) == 3 and state["v"] is True
    with pytest.raises(OSError) as e:
        h.write(b"2\n", 0)
    assert e.value.errno == errno.EINVAL and state["v"] is True
    assert stat.S_IMODE(knob.mode) == 0o600


def test_int_knob_range_and_format():
    state = {"v": 1}
    knob = IntKnob(lambda: state["v"], lambda v: state.update(v=v), 0, 1)
    h = knob.open(2, 1, "sh")
    assert h.read(10, 0) == b"1\n"
    assert h.write(b"0\n", 0) == 2 and state["v"] == 0
    assert h.write(b"  1 \n", 0) == 5 and state["v"] == 1
    for bad in (b"2\n", b"-1", b"x", b"", b"\n", b"1x"):
        with pytest.raises(OSError) as e:
            h.write(bad, 0)
        assert e.value.errno == errno.EINVAL, bad
    assert state["v"] == 1
    assert h.write(b"0", 5) == 1 and state["v"] == 1   # strict sysctl: offset != 0 ignored


def test_directory_entries_may_come_and_go():
    present = {"on": False}
    d = Directory({"fixed": TextFile(lambda: ""),
                   "maybe": lambda: TextFile(lambda: "x") if present["on"] else None})
    assert list(d.children()) == ["fixed"]
    present["on"] = True
    assert list(d.children()) == ["fixed", "maybe"]
    assert stat.S_ISDIR(node_mode(d)) and stat.S_IMODE(d.mode) == 0o750


def test_a_directorys_fixed_names_are_its_nodes_not_its_optional_entries():
    d = Directory({"fixed": TextFile(lambda: ""), "maybe": lambda: None})
    d.add("added", Directory())
    assert sorted(d.fixed_names) == ["added", "fixed"]
    assert fixed_names(TextFile(lambda: "")) == ()      # a node that says nothing


def test_stat_path_says_whether_a_name_stays_with_its_directory():
    """What a host may cache: a fixed name of its directory (and the root); a name a
    directory computes (an event, an instance) is asked again at each walk."""
    events = {"ev": TextFile(lambda: "")}
    tracefs = TracingDirectory({"kprobe_events": TextFile(lambda: ""),
                                "events": TracingDirectory(lambda: dict(events))})
    hostfs = build_tree(FakeKernel(), engine=FakeEngine(), tracer=tracefs)
    stable = {path: hostfs.stat_path(1, path.split("/") if path else [], 1.0)[2]
              for path in ("", "tracing", "kprobes", "kprobes/list",
                           "tracing/kprobe_events", "tracing/events", "tracing/events/ev")}
    assert stable == {"": True, "tracing": True, "kprobes": True, "kprobes/list": True,
                      "tracing/kprobe_events": True, "tracing/events": True,
                      "tracing/events/ev": False}
    node_id, mode, _ = hostfs.stat_path(1, ["tracing", "events", "ev"], 1.0)
    assert node_id > 3 and stat.S_ISREG(mode)
    del events["ev"]
    with pytest.raises(OSError) as e:
        hostfs.stat_path(1, ["tracing", "events", "ev"], 1.0)
    assert e.value.errno == errno.ENOENT


def test_node_mode_adds_the_file_type():
    class Bare:
        mode = 0o640

        def open(self, flags, pid, comm):
            return None
    assert node_mode(Bare()) == stat.S_IFREG | 0o640


# ---- the hypercall protocol ----------------------------------------------------------------
class Memory:
    """Kernel memory with a bump allocator (the fake kernel's)."""

    def __init__(self):
        self.kernel = FakeKernel()
        self.kernel._current = self.kernel.init_task

    def cstr(self, s):
        return self.kernel._cstr(s)

    def alloc(self, n):
        return self.kernel._alloc(n)


@pytest.fixture
def mem():
    return Memory()


def _hc(hostfs, mem, nr, *args):
    args = tuple(a & (2**64 - 1) for a in args) + (0,) * (5 - len(args))
    return hostfs.hypercall(mem.kernel, nr, args)


def _lookup(hostfs, mem, dir_id, name, kept=None):
    """(child id, mode); with kept (a list), whether the host keeps the name (its
    HOSTFS_PERMANENT flag) is appended to it."""
    mode_ptr = mem.alloc(4)
    child = _hc(hostfs, mem, HC_HOSTFS_LOOKUP, dir_id, mem.cstr(name), mode_ptr)
    mode = struct.unpack("<I", mem.kernel.read(mode_ptr, 4))[0]
    if kept is not None:
        kept.append(bool(mode & HOSTFS_PERMANENT))
    return child, mode & ~HOSTFS_PERMANENT


@pytest.fixture
def tree():
    engine = FakeEngine()
    tracer = FakeTracer()
    kernel = FakeKernel()
    return build_tree(kernel, engine=engine, tracer=tracer), engine, tracer


def test_lookup_gives_ids_and_modes(tree, mem):
    hostfs, _, _ = tree
    kprobes, mode = _lookup(hostfs, mem, 1, "kprobes")
    assert kprobes > 3 and mode == stat.S_IFDIR | 0o755
    listing, mode = _lookup(hostfs, mem, kprobes, "list")
    assert listing > 3 and mode == stat.S_IFREG | 0o400
    enabled, mode = _lookup(hostfs, mem, kprobes, "enabled")
    assert mode == stat.S_IFREG | 0o600
    # the same place keeps its id; tracefs (2) and debugfs/tracing are one tree
    assert _lookup(hostfs, mem, kprobes, "list")[0] == listing
    events, mode = _lookup(hostfs, mem, 2, "kprobe_events")
    assert mode == stat.S_IFREG | 0o640
    tracing, _ = _lookup(hostfs, mem, 1, "tracing")
    assert hostfs.node(_lookup(hostfs, mem, tracing, "kprobe_events")[0]) is hostfs.node(events)
    opt_dir = _lookup(hostfs, mem, _lookup(hostfs, mem, 3, "sys")[0], "debug")[0]
    assert _lookup(hostfs, mem, opt_dir, "kprobes-optimization")[1] == stat.S_IFREG | 0o644


def test_a_fixed_name_below_names_that_stay_is_kept_by_the_kernel(mem):
    """HOSTFS_PERMANENT: the name stays while the kernel runs (a fixed name of a
    directory that stays, from the roots down), so the kernel keeps its dentry and asks
    no more; a name that comes and goes (an event, an instance), or a fixed one below
    it, is asked again at each walk."""
    leaf = TextFile(lambda: "x")
    hostfs = HostFS({1: Directory({
        "sub": Directory({"file": leaf}),
        "dyn": lambda: Directory({"file": leaf}),
    })})
    kept = []
    sub = _lookup(hostfs, mem, 1, "sub", kept)[0]
    _lookup(hostfs, mem, sub, "file", kept)
    dyn, mode = _lookup(hostfs, mem, 1, "dyn", kept)
    _lookup(hostfs, mem, dyn, "file", kept)
    assert kept == [True, True, False, False]
    assert mode == node_mode(Directory({})) and not mode & HOSTFS_PERMANENT
    assert _lookup(hostfs, mem, 1, "nope", kept)[0] == -errno.ENOENT and len(kept) == 5


def test_an_open_no_gateway_takes_is_forgotten_at_its_release(tree, mem):
    """An open by a task with no FUSE request behind it (nobody calls take_opened) is
    remembered only until its release: before, one entry stayed per pid."""
    hostfs, _, _ = tree
    kprobes = _lookup(hostfs, mem, 1, "kprobes")[0]
    listing = _lookup(hostfs, mem, kprobes, "list")[0]
    for pid in range(2000, 2050):
        h = _hc(hostfs, mem, HC_HOSTFS_OPEN, listing, 0, pid)
        assert h > 0 and hostfs.untaken_opens == 1
        assert _hc(hostfs, mem, HC_HOSTFS_RELEASE, h) == 0
    assert hostfs.untaken_opens == 0 and hostfs.open_handles == 0


def test_lookup_misses(tree, mem):
    hostfs, _, _ = tree
    assert _lookup(hostfs, mem, 1, "nope")[0] == -errno.ENOENT
    listing = _lookup(hostfs, mem, _lookup(hostfs, mem, 1, "kprobes")[0], "list")[0]
    assert _lookup(hostfs, mem, listing, "x")[0] == -errno.ENOENT   # below a file
    assert _lookup(hostfs, mem, 9999, "x")[0] == -errno.ENOENT       # unknown id


def test_open_read_write_release(tree, mem):
    hostfs, engine, _ = tree
    kprobes = _lookup(hostfs, mem, 1, "kprobes")[0]
    enabled = _lookup(hostfs, mem, kprobes, "enabled")[0]
    h = _hc(hostfs, mem, HC_HOSTFS_OPEN, enabled, 0o2, 1234)
    assert h > 0 and hostfs.open_handles == 1
    buf = mem.alloc(64)
    assert _hc(hostfs, mem, HC_HOSTFS_READ, h, buf, 64, 0) == 2
    assert mem.kernel.read(buf, 2) == b"1\n"
    mem.kernel.write(buf, b"0\n")
    assert _hc(hostfs, mem, HC_HOSTFS_WRITE, h, buf, 2, 0) == 2
    assert engine.kprobes_all_disarmed and engine.calls == ["disarm", "wait"]
    mem.kernel.write(buf, b"x\n")
    assert _hc(hostfs, mem, HC_HOSTFS_WRITE, h, buf, 2, 0) == -errno.EINVAL
    assert _hc(hostfs, mem, HC_HOSTFS_RELEASE, h) == 0
    assert hostfs.open_handles == 0
    assert _hc(hostfs, mem, HC_HOSTFS_READ, h, buf, 64, 0) == -errno.EBADF


def test_access_mode_is_checked_per_handle(tree, mem):
    hostfs, _, _ = tree
    events = _lookup(hostfs, mem, 2, "kprobe_events")[0]
    ro = _hc(hostfs, mem, HC_HOSTFS_OPEN, events, 0, 1)
    wo = _hc(hostfs, mem, HC_HOSTFS_OPEN, events, 1, 1)
    buf = mem.alloc(16)
    assert _hc(hostfs, mem, HC_HOSTFS_WRITE, ro, buf, 4, 0) == -errno.EBADF
    assert _hc(hostfs, mem, HC_HOSTFS_READ, wo, buf, 4, 0) == -errno.EBADF


def test_open_errors_come_back_as_errno(tree, mem):
    hostfs, _, tracer = tree
    events = _lookup(hostfs, mem, 2, "kprobe_events")[0]
    tracer.enabled = True
    assert _hc(hostfs, mem, HC_HOSTFS_OPEN, events, 0o1 | 0o1000, 1) == -errno.EBUSY
    kallsyms = _lookup(hostfs, mem, 3, "kallsyms")[0]
    assert _hc(hostfs, mem, HC_HOSTFS_OPEN, kallsyms, 0o1, 1) == -errno.EACCES
    assert _hc(hostfs, mem, HC_HOSTFS_OPEN, 1, 0, 1) == -errno.EISDIR
    assert _hc(hostfs, mem, HC_HOSTFS_OPEN, 4242, 0, 1) == -errno.ENOENT


def test_open_passes_pid_and_comm(tree, mem):
    hostfs, _, tracer = tree
    events = _lookup(hostfs, mem, 2, "kprobe_events")[0]
    mem.kernel._current.comm = "bash"
    h = _hc(hostfs, mem, HC_HOSTFS_OPEN, events, 0, 4321)
    assert tracer.openers == [(4321, "bash")]
    assert hostfs.take_opened(4321) is hostfs.handle(h)
    assert hostfs.take_opened(4321) is None


def test_readdir_buffer_layout(tree, mem):
    hostfs, _, _ = tree
    kbuf = mem.alloc(264)
    names = []
    for index in range(10):
        child = _hc(hostfs, mem, HC_HOSTFS_READDIR, 1, index, kbuf)
        if child == 0:
            break
        raw = mem.kernel.read(kbuf, 264)
        name = raw[:raw.index(b"\0")].decode()
        mode = struct.unpack("<I", raw[256:260])[0]
        names.append((name, child, mode))
    assert [(n, m) for n, _, m in names] == [("kprobes", stat.S_IFDIR | 0o755),
                                             ("tracing", stat.S_IFDIR | 0o750)]
    # the ids READDIR gives are the ids LOOKUP gives
    assert names[0][1] == _lookup(hostfs, mem, 1, "kprobes")[0]


def test_readdir_of_a_changing_directory(tree, mem):
    hostfs, _, tracer = tree
    events = _lookup(hostfs, mem, 2, "events")[0]
    kbuf = mem.alloc(264)
    assert _hc(hostfs, mem, HC_HOSTFS_READDIR, events, 0, kbuf) == 0
    tracer.events.append("p:kprobes/myprobe vfs_read")
    assert _hc(hostfs, mem, HC_HOSTFS_READDIR, events, 0, kbuf) > 0
    assert mem.kernel.read(kbuf, 8) == b"myprobe\0"
    child, mode = _lookup(hostfs, mem, events, "myprobe")
    assert child > 0 and stat.S_ISDIR(mode)
    tracer.events.clear()
    # a path walk revalidates every component from the root, as d_revalidate does
    events = _lookup(hostfs, mem, 2, "events")[0]
    assert _lookup(hostfs, mem, events, "myprobe")[0] == -errno.ENOENT


def test_handler_failures_never_escape(mem, caplog):
    class Broken:
        mode = stat.S_IFREG | 0o440

        def open(self, flags, pid, comm):
            raise RuntimeError("tracer bug")

    class Refusing:
        mode = stat.S_IFREG | 0o440

        def open(self, flags, pid, comm):
            raise OSError(errno.ENODEV, "no device")

    hostfs = HostFS({1: Directory({"broken": Broken(), "refusing": Refusing()}),
                     2: Directory(), 3: Directory()})
    broken = _lookup(hostfs, mem, 1, "broken")[0]
    refusing = _lookup(hostfs, mem, 1, "refusing")[0]
    with caplog.at_level(logging.ERROR, logger="kprobefs.fs"):
        assert _hc(hostfs, mem, HC_HOSTFS_OPEN, broken, 0, 1) == -errno.EIO
    assert "tracer bug" in caplog.text
    assert _hc(hostfs, mem, HC_HOSTFS_OPEN, refusing, 0, 1) == -errno.ENODEV
    # a bad kernel pointer is EFAULT, not a crash
    assert _hc(hostfs, mem, HC_HOSTFS_LOOKUP, 1, 0x1000, 0) == -errno.EFAULT
    assert _hc(hostfs, mem, 99, 0, 0, 0) == -errno.ENOSYS


def test_large_reads_are_chunked_by_offset(mem):
    text = "".join(f"ffffffff{i:08x} T sym{i}\n" for i in range(3000))
    hostfs = HostFS({1: Directory(), 2: Directory(),
                     3: Directory({"kallsyms": TextFile(lambda: text, 0o444)})})
    node = _lookup(hostfs, mem, 3, "kallsyms")[0]
    h = _hc(hostfs, mem, HC_HOSTFS_OPEN, node, 0, 1)
    buf = mem.alloc(16384)
    out, pos = b"", 0
    while True:
        n = _hc(hostfs, mem, HC_HOSTFS_READ, h, buf, 16384, pos)
        assert n >= 0
        if n == 0:
            break
        out += mem.kernel.read(buf, n)
        pos += n
    assert out == text.encode()


def test_build_tree_serves_only_what_exists():
    kernel = FakeKernel()
    hostfs = build_tree(kernel)
    assert [n for n, _, _ in hostfs.list_dir(1)] == ["tracing"]
    assert [n for n, _, _ in hostfs.list_dir(3)] == ["kallsyms", "version"]
    assert hostfs.list_dir(2) == []
    full = build_tree(kernel, engine=FakeEngine(), tracer=FakeTracer())
    assert [n for n, _, _ in full.list_dir(1)] == ["kprobes", "tracing"]
    assert [n for n, _, _ in full.list_dir(3)] == ["kallsyms", "version", "sys"]


def test_optimization_knob_waits_for_the_optimizer(mem):
    engine = FakeEngine()
    hostfs = build_tree(FakeKernel(), engine=engine)
    sys_id = _lookup(hostfs, mem, 3, "sys")[0]
    debug = _lookup(hostfs, mem, sys_id, "debug")[0]
    knob = _lookup(hostfs, mem, debug, "kprobes-optimization")[0]
    h = _hc(hostfs, mem, HC_HOSTFS_OPEN, knob, 2, 1)
    buf = mem.alloc(8)
    mem.kernel.write(buf, b"0\n")
    assert _hc(hostfs, mem, HC_HOSTFS_WRITE, h, buf, 2, 0) == 2
    assert engine.calls == ["optimization=0", "wait"] and not engine.optimization_enabled
    assert _hc(hostfs, mem, HC_HOSTFS_READ, h, buf, 8, 0) == 2
    assert mem.kernel.read(buf, 2) == b"0\n"


def test_kernel_addresses_are_unsigned(mem):
    # the machine hands rdi.. as unsigned: a kernel pointer is above 2**63
    assert KBASE > 2**63
    hostfs = build_tree(FakeKernel())
    assert _lookup(hostfs, mem, 3, "version")[0] > 0
