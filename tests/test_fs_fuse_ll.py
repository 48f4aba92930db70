"""FUSE on /dev/fuse without libfuse (fs/fuse_ll.py): its node table, the answer a
request held in a hook gets from another thread, and a waiting request that drives the
idle machine itself.  Every test through a mount (test_fs_mount and the others) runs on
this loop; the libfuse one is kept for KPROBEFS_FUSE=libfuse (its smoke test is here)."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fs_fakes import FakeEngine, FakeKernel
from kprobefs import Kprobe
from kprobefs.fs import Caller, Gateway, build_tree, fuse_ll
from kprobefs.fs.fuse_ll import ROOT_ID, FuseSession, _Nodes, _Request
from kprobefs.fs.tree import TextFile
from kprobefs.machine.flag import Flag
from kprobefs.tracing.files import Directory


def test_a_node_keeps_its_id_until_the_kernel_forgets_every_lookup():
    nodes = _Nodes()
    a = nodes.looked_up("/tracing")
    assert nodes.looked_up("/tracing") == a and nodes.path(a) == "/tracing"
    assert nodes.child(a, "trace") == "/tracing/trace"
    assert nodes.child(ROOT_ID, "tracing") == "/tracing"
    nodes.forget(a, 1)
    assert nodes.path(a) == "/tracing"          # one lookup left
    nodes.forget(a, 1)
    with pytest.raises(OSError) as e:
        nodes.path(a)
    assert e.value.errno == errno.ENOENT
    assert nodes.looked_up("/tracing") != a      # a new node for the name
    nodes.forget(ROOT_ID, 5)
    assert nodes.path(ROOT_ID) == "/"            # the root is never forgotten


def test_removed_and_renamed_names_move_their_nodes():
    nodes = _Nodes()
    inst = nodes.looked_up("/tracing/instances/foo")
    trace = nodes.looked_up("/tracing/instances/foo/trace")
    other = nodes.looked_up("/tracing/instances/bar")
    nodes.renamed("/tracing/instances/foo", "/tracing/instances/bar")
    assert nodes.path(inst) == "/tracing/instances/bar"
    assert nodes.path(trace) == "/tracing/instances/bar/trace"
    with pytest.raises(OSError):
        nodes.path(other)                        # the name it had went to foo's node
    nodes.removed("/tracing/instances/bar")
    with pytest.raises(OSError):
        nodes.path(inst)
    assert nodes.looked_up("/tracing/instances/bar") not in (inst, other)


def test_a_lookup_is_cached_only_for_a_name_that_stays_with_its_directory():
    """LOOKUP's entry timeout: tracefs's own files and the mount's top-level names may be
    cached by the host (a walk to them makes no request); a name of a computed
    directory (an event) or of the kernel's own (tmp, proc) is asked at each walk, so
    that one that went away is gone at once."""
    events = {"ev": TextFile(lambda: "")}
    tracefs = Directory({"kprobe_events": TextFile(lambda: ""),
                         "events": Directory(lambda: dict(events))})
    kernel = FakeKernel()
    hostfs = build_tree(kernel, engine=FakeEngine(), tracer=tracefs)
    kernel.hostfs = hostfs
    gateway = Gateway(kernel, hostfs, timeout=5.0, wait_slice=0.05)
    session = FuseSession(gateway, "/nonexistent")
    me = Caller(os.getpid())

    def entry_valid(parent: int, name: str) -> tuple[int, int]:
        reply = session._lookup(parent, name.encode() + b"\0", me)
        nodeid, _gen, valid = struct.unpack_from("<QQQ", reply)
        return nodeid, valid

    try:
        tracing, valid = entry_valid(ROOT_ID, "tracing")
        assert valid == fuse_ll.ENTRY_TIMEOUT > 0
        assert entry_valid(tracing, "kprobe_events")[1] == fuse_ll.ENTRY_TIMEOUT
        ev_dir, valid = entry_valid(tracing, "events")
        assert valid == fuse_ll.ENTRY_TIMEOUT
        assert entry_valid(ev_dir, "ev")[1] == 0
        assert entry_valid(ROOT_ID, "tmp")[1] == fuse_ll.ENTRY_TIMEOUT
    finally:
        gateway.close()


def test_a_reads_reply_is_one_write_made_keeping_the_interpreters_lock(caplog, monkeypatch):
    """A reply is written whole, in one write(2); a READ's through PyDLL (the
    interpreter's lock kept: the thread that took the next read is not held up by this
    one taking the lock back), any other's through os.write (the lock let go: the
    caller may take this thread's CPU meanwhile).  A reply to a request that went away
    (ENOENT) or to a device that is gone (EBADF) is dropped without a word."""
    import ctypes
    assert fuse_ll._write_keeping_gil._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    session = FuseSession(_FakeGateway(), "/nonexistent")
    kept = []
    real = fuse_ll._write_keeping_gil
    monkeypatch.setattr(fuse_ll, "_write_keeping_gil",
                        lambda fd, data, n: kept.append(n) or real(fd, data, n))
    r, w = os.pipe()
    try:
        session._fd = w
        for unique, op in ((7, fuse_ll.READ), (8, fuse_ll.WRITE)):
            request = _Request(unique, op)
            session._inflight.clear()
            session._reply(request.unique, errno.EACCES, b"data",
                           keep_gil=request.op == fuse_ll.READ)
            got = os.read(r, 100)
            assert got == struct.pack("<IiQ", 16 + 4, -errno.EACCES, unique) + b"data"
        assert kept == [20]
    finally:
        os.close(r)
        os.close(w)
    session._fd = -1        # EBADF
    with caplog.at_level("ERROR", logger="kprobefs.fs.fuse"):
        session._reply(9, 0, keep_gil=True)
        session._reply(10, 0)
    assert not caplog.records


def test_the_pool_answers_a_read_keeping_the_interpreters_lock_and_others_not(monkeypatch):
    """Through the pool's own loop: a READ's answer is written keeping the lock, a
    GETATTR's (any other) letting it go."""
    import socket
    session = FuseSession(_FakeGateway(), "/nonexistent")
    kept = []
    monkeypatch.setattr(session, "_reply",
                        lambda unique, err, data=b"", keep_gil=False: kept.append((unique, keep_gil)))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    session._fd = ours.fileno()
    worker = threading.Thread(target=session._worker, daemon=True)
    worker.start()
    try:
        for unique, op in ((5, fuse_ll.READ), (6, fuse_ll.GETATTR)):
            body = bytes(fuse_ll._READ_IN.size)
            theirs.send(fuse_ll._IN.pack(fuse_ll._IN.size + len(body), op, unique, 99,
                                         0, 0, os.getpid(), 0, 0) + body)
        deadline = time.monotonic() + 10
        while len(kept) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(kept) == [(5, True), (6, False)]
    finally:
        session._gone.set()
        theirs.send(fuse_ll._IN.pack(fuse_ll._IN.size, fuse_ll.STATFS, 7, 1, 0, 0, 0, 0, 0))
        worker.join(10)
        ours.close()
        theirs.close()


class _IdleKernel:
    driver = None


class _FakeGateway:
    timeout = 0.2
    kernel = _IdleKernel()


def test_a_request_held_while_it_drives_the_machine_is_answered_eio_once():
    """The thread of a request that drives the machine is held in a hook past the
    gateway's timeout: the watch answers EIO for it, and the thread's own answer, when
    it comes, is not sent."""
    session = FuseSession(_FakeGateway(), "/nonexistent")
    sent = []
    session._reply = lambda unique, err, data=b"": sent.append((unique, err))
    held = _Request(41, fuse_ll.MKDIR)
    me = threading.get_ident()
    session._inflight[me] = held
    _FakeGateway.kernel.driver = (me, time.monotonic())
    watch = threading.Thread(target=session._watch_stuck, daemon=True)
    watch.start()
    try:
        deadline = time.monotonic() + 10
        while not sent and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sent == [(41, errno.EIO)]
        session._answer(held, 0, b"late")
        time.sleep(0.6)
        assert sent == [(41, errno.EIO)]
    finally:
        _FakeGateway.kernel.driver = None
        session._gone.set()
        watch.join(5)


def test_a_waiting_caller_runs_its_call_while_the_machine_is_idle():
    """With drive_waits, the thread that waits for a system call runs it itself when
    nobody drives the machine (no hand-off to the machine thread and back); without,
    the machine thread runs every call."""
    from kprobefs import Kernel

    kernel = Kernel(cpus=2, seed=0)
    ran_in = []
    kp = Kprobe(symbol_name="__x64_sys_getppid",
                pre_handler=lambda p, regs: ran_in.append(threading.get_ident()) or 0)
    kernel.register_kprobe(kp)
    task = kernel.spawn("driven")
    kernel.serve()
    try:
        for drive in (False, True):
            kernel.drive_waits = drive
            ran_in.clear()
            for _ in range(20):
                assert kernel.syscall(task, "getppid") == 1
                time.sleep(0.005)
            mine = ran_in.count(threading.get_ident())
            assert len(ran_in) == 20
            assert (mine > 0) if drive else mine == 0, (drive, mine)
    finally:
        kernel.close()


class _CountedFlag(Flag):
    """The machine thread's wake-up flag, counting how often it is set."""

    __slots__ = ("sets",)

    def __init__(self):
        super().__init__()
        self.sets = 0

    def set(self) -> None:
        self.sets += 1
        super().set()


def test_a_call_its_poster_drives_does_not_wake_the_machine_thread():
    """A call posted with wake=False (the gateway's, which waits for it next) runs in its
    poster's thread without the machine thread being woken for it: one thread wakes for
    a system call, not two.  A plain post wakes the machine thread each time."""
    from kprobefs import Kernel

    kernel = Kernel(cpus=2, seed=0)
    task = kernel.spawn("driven")
    kernel._work = _CountedFlag()
    kernel.drive_waits = True
    kernel.serve()
    try:
        for wake in (True, False):
            before = kernel._work.sets
            for _ in range(20):
                assert kernel.wait(kernel.submit(task, "getppid", wake=wake)) == 1
                time.sleep(0.005)
            woken = kernel._work.sets - before
            # a poster that finds the machine busy (its thread's periodic turn) wakes it
            assert woken >= 20 if wake else woken <= 3, (wake, woken)
    finally:
        kernel.close()


def test_a_driven_spawn_runs_the_childs_rename_itself():
    """A new task's rename (the prctl its clone3's return queues) runs in the thread that
    drove the clone3, with no wake-up of the machine thread: each of ten renamed
    spawns leaves its task named."""
    from kprobefs import Kernel
    from kprobefs.machine.kernel import UserBuffer

    kernel = Kernel(cpus=2, seed=0)
    kernel._work = _CountedFlag()
    kernel.drive_waits = True
    kernel.serve()
    try:
        time.sleep(0.05)
        before = kernel._work.sets
        tasks = []
        for i in range(10):
            tasks.append(kernel.spawned(kernel.start_spawn(f"renamed{i}", wake=False)))
            time.sleep(0.005)
        woken = kernel._work.sets - before
        assert woken <= 3, woken
        for i, task in enumerate(tasks):
            buf = UserBuffer(16)
            assert kernel.syscall(task, "prctl", 16, buf) == 0      # PR_GET_NAME
            assert buf.data.split(b"\0")[0] == f"renamed{i}".encode()
    finally:
        kernel.close()


from test_fs_mount import _need_fuse, sh  # noqa: E402,F401  (fixtures)


def test_the_libfuse_loop_still_serves(tmp_path):
    """KPROBEFS_FUSE=libfuse serves through fusepy and libfuse2, as before."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, KPROBEFS_FUSE="libfuse",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cli = [sys.executable, "-m", "kprobefs"]
    subprocess.run(cli + ["mount", str(mnt)], check=True, env=env, timeout=120)
    try:
        t = mnt / "tracing"
        r = sh(f"echo 'p:ll vfs_read' >> {t}/kprobe_events && cat {t}/kprobe_events")
        assert r.returncode == 0 and r.stdout == "p:kprobes/ll vfs_read\n"
        assert sh(f"echo > {t}/kprobe_events").returncode == 0
    finally:
        subprocess.run(cli + ["umount", str(mnt)], env=env, timeout=60)


from test_fs_mount import real  # noqa: E402,F401  (fixture: a real mount, this loop)


def test_each_kind_of_request_through_a_shell(real):
    """The requests a shell makes of the loop, one of each: CREATE and a write in tmp,
    SETATTR (truncate -s 0; chmod is EPERM), SYMLINK and READLINK, RENAME, UNLINK,
    MKDIR and RMDIR, STATFS, a READDIR longer than one reply (300 event directories
    span several), and the type each entry carries."""
    t, tmp = real / "tracing", real / "tmp"
    (t / "kprobe_events").write_text("".join(f"p:rd{i} vfs_read\n" for i in range(300)))
    script = f"""
        set -e
        echo hello > {tmp}/f; cat {tmp}/f
        truncate -s 0 {tmp}/f; wc -c < {tmp}/f
        if chmod 600 {tmp}/f 2>/dev/null; then echo chmod-allowed; fi
        ln -s f {tmp}/l; readlink {tmp}/l
        mv {tmp}/f {tmp}/g; ls {tmp}/g; rm {tmp}/g {tmp}/l
        mkdir {tmp}/d; rmdir {tmp}/d
        stat -f -c %S {real}
        ls {t}/events/kprobes | wc -l
        find {t}/events/kprobes -mindepth 1 -maxdepth 1 -type d | wc -l
    """
    try:
        r = sh(script)
        assert r.returncode == 0, r.stderr
        events = t / "events" / "kprobes"
        names = os.listdir(events)
        is_dir = sum(os.path.isdir(events / n) for n in names)
        types = _dirent_types(events)
    finally:
        (t / "kprobe_events").write_text("")
    lines = r.stdout.split()
    assert lines[:5] == ["hello", "0", "f", f"{tmp}/g", "4096"], lines
    listed, dirs = int(lines[5]), int(lines[6])
    assert listed == len(names) == 302              # several READDIR replies
    assert dirs == is_dir == 300                    # and enable, filter
    assert types["rd7"] == 4 and types["enable"] == 8 and types["."] == 4  # DT_DIR, DT_REG


def _dirent_types(path) -> dict:
    """name -> d_type, as getdents64(2) gives them (no stat)."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    out, buf = {}, ctypes.create_string_buffer(32768)
    try:
        while True:
            n = libc.syscall(217, fd, buf, len(buf))        # getdents64
            assert n >= 0, ctypes.get_errno()
            if n == 0:
                return out
            at = 0
            while at < n:
                reclen, dtype = struct.unpack_from("<HB", buf.raw, at + 16)
                name = buf.raw[at + 19:at + reclen].split(b"\0", 1)[0].decode()
                out[name] = dtype
                at += reclen
    finally:
        os.close(fd)


def test_unmounting_starts_no_program(monkeypatch):
    """libc is found as the module loads: ctypes.util.find_library runs a helper program,
    and its fork at unmount held the daemon's files on the mount (a FLUSH that waited
    for the stopped threads, the connection held by the child)."""
    import ctypes.util

    def no_program(_name):
        raise AssertionError("find_library at unmount")

    monkeypatch.setattr(ctypes.util, "find_library", no_program)
    fuse_ll._libc.cache_clear()
    try:
        assert fuse_ll._libc().umount2 is not None
    finally:
        fuse_ll._libc.cache_clear()
