"""The syscall gateway: requests of host processes become system calls of tasks with
their pid and comm, against the fake kernel (a model of the emulated VFS speaking the
hostfs protocol) and, at the end, the real kernel."""

import errno
import logging
import os
import stat
import subprocess
import threading
import time

import pytest

from conftest import start_sleep
from fs_fakes import FakeKernel, FakeTracer
from kprobefs.errors import KernelOops, MachineError
from kprobefs.fs import Caller, Gateway, build_tree

O_RDONLY, O_WRONLY, O_RDWR = os.O_RDONLY, os.O_WRONLY, os.O_RDWR


@pytest.fixture
def setup():
    kernel = FakeKernel()
    tracer = FakeTracer()
    hostfs = build_tree(kernel, engine=kernel.kprobes, tracer=tracer)
    kernel.hostfs = hostfs
    gateway = Gateway(kernel, hostfs, timeout=5.0, wait_slice=0.05)
    yield kernel, tracer, gateway
    gateway.close()


ME = Caller(os.getpid())


def _read_all(gateway, path, ctx=ME):
    fh = gateway.open(path, O_RDONLY, ctx)
    try:
        out, pos = b"", 0
        while True:
            data = gateway.read(fh, 4096, pos, ctx)
            if not data:
                return out
            out += data
            pos += len(data)
    finally:
        gateway.release(fh)


def _write(gateway, path, data, flags=O_WRONLY, ctx=ME):
    fh = gateway.open(path, flags, ctx)
    try:
        return gateway.write(fh, data, 0, ctx)
    finally:
        gateway.release(fh)


def test_paths_map_onto_the_kernels_mounts():
    assert Gateway.kernel_path("/") == "/sys/kernel/debug"
    assert Gateway.kernel_path("/kprobes/list") == "/sys/kernel/debug/kprobes/list"
    assert Gateway.kernel_path("/tracing/trace") == "/sys/kernel/tracing/trace"
    assert Gateway.kernel_path("/tracing") == "/sys/kernel/tracing"
    assert Gateway.kernel_path("/proc/sys/debug/x") == "/proc/sys/debug/x"


def test_a_new_pid_becomes_a_task_with_its_pid_and_comm(setup, sleeper):
    kernel, _, gateway = setup
    gateway.getattr("/proc", Caller(sleeper.pid))
    task = kernel.tasks[sleeper.pid]
    assert task.comm == "sleep"
    assert gateway.tasks()[sleeper.pid] is task
    assert (sleeper.pid, "sleep", "newfstatat") in kernel.syscalls
    # the same process keeps its task
    gateway.getattr("/proc", Caller(sleeper.pid))
    assert gateway.tasks()[sleeper.pid] is task


def test_debugfs_and_tracefs_attributes_come_from_the_host_tree(setup, sleeper):
    """A LOOKUP of a debugfs or tracefs name is answered from the tree the kernel's
    hostfs serves, without a system call; the caller's task is made all the same."""
    kernel, _, gateway = setup
    attrs = gateway.getattr("/tracing/kprobe_events", Caller(sleeper.pid))
    assert stat.S_ISREG(attrs.mode) and attrs.nlink == 1
    assert stat.S_ISDIR(gateway.getattr("/tracing", Caller(sleeper.pid)).mode)
    assert sleeper.pid in gateway.tasks()
    assert not [c for c in kernel.syscalls if c[2] == "newfstatat"]
    with pytest.raises(OSError) as e:
        gateway.getattr("/tracing/nonexistent", Caller(sleeper.pid))
    assert e.value.errno == errno.ENOENT
    with pytest.raises(OSError) as e:
        gateway.getattr("/tracing/kprobe_events/x", Caller(sleeper.pid))
    assert e.value.errno == errno.ENOTDIR
    with pytest.raises(OSError) as e:
        gateway.getattr("/tracing/" + "x" * 256, Caller(sleeper.pid))
    assert e.value.errno == errno.ENAMETOOLONG


def test_a_pid_taken_in_the_kernel_gets_an_automatic_one(setup, sleeper):
    kernel, _, gateway = setup
    kernel.spawn("squatter", pid=sleeper.pid)
    gateway.getattr("/", Caller(sleeper.pid))
    task = gateway.tasks()[sleeper.pid]
    assert task.pid != sleeper.pid and task.comm == "sleep"


def test_read_and_write_through_system_calls(setup):
    kernel, tracer, gateway = setup
    assert _read_all(gateway, "/kprobes/list").startswith(b"ffffffff81001000  k  vfs_read")
    assert _write(gateway, "/tracing/kprobe_events", b"p:myprobe vfs_read\n") == 19
    assert _read_all(gateway, "/tracing/kprobe_events") == b"p:myprobe vfs_read\n"
    assert _read_all(gateway, "/proc/version").startswith(b"Linux version")
    names = [call[2] for call in kernel.syscalls[-6:]]
    assert "read" in names and "close" in names
    assert gateway.hostfs.open_handles == 0


def test_errno_of_a_write_is_the_kernels(setup):
    _, _, gateway = setup
    with pytest.raises(OSError) as e:
        _write(gateway, "/tracing/kprobe_events", b"zzz\n", O_WRONLY | os.O_APPEND)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(OSError) as e:
        _write(gateway, "/kprobes/enabled", b"2\n")
    assert e.value.errno == errno.EINVAL


def test_o_trunc_acts_in_open_and_fails_it(setup):
    _, tracer, gateway = setup
    _write(gateway, "/tracing/kprobe_events", b"p:a vfs_read\n")
    tracer.enabled = True
    with pytest.raises(OSError) as e:
        gateway.open("/tracing/kprobe_events", O_WRONLY | os.O_TRUNC, ME)
    assert e.value.errno == errno.EBUSY
    assert tracer.events == ["p:a vfs_read"]
    tracer.enabled = False
    fh = gateway.open("/tracing/kprobe_events", O_WRONLY | os.O_TRUNC, ME)
    gateway.release(fh)
    assert tracer.events == []
    # truncate(path, 0) outside open is the same action
    _write(gateway, "/tracing/kprobe_events", b"p:b vfs_read\n")
    gateway.truncate("/tracing/kprobe_events", 0, ME)
    assert tracer.events == []


def test_unknown_paths_and_wrong_types(setup):
    _, _, gateway = setup
    for path in ("/nope", "/tracing/nope", "/kprobes/list/x", "/proc/nope"):
        with pytest.raises(OSError) as e:
            gateway.getattr(path, ME)
        assert e.value.errno in (errno.ENOENT, errno.ENOTDIR), path
    with pytest.raises(OSError) as e:
        gateway.open("/tracing", O_WRONLY, ME)
    assert e.value.errno == errno.EISDIR
    with pytest.raises(OSError) as e:
        gateway.readdir("/kprobes/list", ME)
    assert e.value.errno == errno.ENOTDIR
    with pytest.raises(OSError) as e:
        gateway.open("/tracing/newfile", O_WRONLY | os.O_CREAT, ME, 0o644)
    assert e.value.errno == errno.EACCES
    with pytest.raises(OSError) as e:
        gateway.mkdir("/tracing/instances", 0o755, ME)
    assert e.value.errno == errno.EPERM


def test_getattr_and_readdir(setup):
    _, _, gateway = setup
    assert gateway.getattr("/kprobes/list", ME).mode == 0o100400
    assert gateway.getattr("/kprobes/enabled", ME).mode == 0o100600
    assert gateway.getattr("/tracing/kprobe_events", ME).mode == 0o100640
    assert gateway.getattr("/tracing/events", ME).mode == 0o040750
    assert gateway.getattr("/proc/kallsyms", ME).mode == 0o100444
    root = dict(gateway.readdir("/", ME))
    # the fake kernel's VFS has /tmp but no /dev: only what exists is listed
    assert set(root) == {".", "..", "kprobes", "tracing", "proc", "tmp"}
    assert root["proc"] == root["tmp"] == 0o040000
    names = [n for n, _ in gateway.readdir("/kprobes", ME)]
    assert names == [".", "..", "list", "enabled", "blacklist"]


def test_an_inherited_open_file_is_reopened_for_the_other_process(setup, sleeper):
    kernel, tracer, gateway = setup
    fh = gateway.open("/tracing/kprobe_events", O_WRONLY | os.O_TRUNC, ME)
    child = Caller(sleeper.pid)
    assert gateway.write(fh, b"p:x vfs_read\n", 0, child) == 13
    assert tracer.events == ["p:x vfs_read"]   # the child's open did not truncate again
    assert [pid for pid, _ in tracer.openers] == [os.getpid(), sleeper.pid]
    gateway.release(fh)
    assert not kernel.tasks[os.getpid()].fds and not kernel.tasks[sleeper.pid].fds


def test_blocking_read_waits_for_data(setup):
    _, tracer, gateway = setup
    fh = gateway.open("/tracing/trace_pipe", O_RDONLY, ME)
    got = []
    reader = threading.Thread(target=lambda: got.append(gateway.read(fh, 4096, 0, ME)))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and not got
    _write(gateway, "/tracing/trace_marker", b"hello\n")
    reader.join(5)
    assert got == [b"tracing_mark_write: hello\n"]
    gateway.release(fh)


class _Inside:
    """A scheduling mirror's view of who is inside our requests."""

    def __init__(self):
        self.inside = {}

    def enter(self, pid):
        self.inside[pid] = self.inside.get(pid, 0) + 1

    def leave(self, pid):
        self.inside[pid] -= 1


def test_a_reader_blocked_in_our_read_counts_as_inside_a_request(setup):
    _, _, gateway = setup
    gateway.sched = inside = _Inside()
    fh = gateway.open("/tracing/trace_pipe", O_RDONLY, ME)
    assert inside.inside == {ME.pid: 0}          # each system call entered and left
    reader = threading.Thread(target=lambda: gateway.read(fh, 4096, 0, ME))
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive() and inside.inside[ME.pid] == 1    # waiting for data
    _write(gateway, "/tracing/trace_marker", b"hello\n")
    reader.join(5)
    assert inside.inside[ME.pid] == 0
    gateway.release(fh)


def test_nonblocking_read_of_an_empty_pipe_is_eagain(setup):
    _, tracer, gateway = setup
    fh = gateway.open("/tracing/trace_pipe", O_RDONLY | os.O_NONBLOCK, ME)
    with pytest.raises(OSError) as e:
        gateway.read(fh, 4096, 0, ME)
    assert e.value.errno == errno.EAGAIN
    tracer.pipe.push(b"x\n")
    assert gateway.read(fh, 4096, 0, ME) == b"x\n"
    gateway.release(fh)


def test_a_blocked_reader_whose_process_died_is_interrupted(setup):
    _, _, gateway = setup
    p = start_sleep()
    ctx = Caller(p.pid)
    fh = gateway.open("/tracing/trace_pipe", O_RDONLY, ctx)
    errors = []

    def read():
        try:
            gateway.read(fh, 4096, 0, ctx)
        except OSError as e:
            errors.append(e.errno)
    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    p.kill()
    p.wait()
    reader.join(5)
    assert errors == [errno.EINTR]


def test_tasks_of_gone_processes_exit(setup):
    kernel, _, gateway = setup
    p = start_sleep()
    ctx = Caller(p.pid)
    fh = gateway.open("/tracing/kprobe_events", O_RDONLY, ctx)
    task = kernel.tasks[p.pid]
    assert gateway.reap() == 0
    p.kill()
    p.wait()
    assert gateway.reap() == 1
    assert task.state == "dead" and p.pid not in kernel.tasks
    assert (p.pid, "sleep", "exit") in kernel.syscalls
    assert gateway.hostfs.open_handles == 0   # do_exit closed its files
    gateway.release(fh)                          # a late release is harmless
    assert p.pid not in gateway.tasks()


class _WedgedKernel(FakeKernel):
    def run_slice(self):
        return False   # never gets to the request


class _BrokenKernel(FakeKernel):
    def run_slice(self):
        raise MachineError("kernel panic: test")


@pytest.mark.parametrize("kernel_class", [_WedgedKernel, _BrokenKernel])
def test_a_machine_call_that_cannot_finish_is_eio(kernel_class, caplog):
    kernel = kernel_class()
    kernel.hostfs = build_tree(kernel)
    gateway = Gateway(kernel, kernel.hostfs, timeout=0.3)
    with caplog.at_level(logging.ERROR, logger="kprobefs.fs.gateway"):
        start = time.monotonic()
        with pytest.raises(OSError) as e:
            gateway.getattr("/proc/version", ME)
        assert time.monotonic() - start < 3
    assert e.value.errno == errno.EIO
    assert "newfstatat" in caplog.text


def test_a_task_that_oopses_is_replaced(setup):
    kernel, _, gateway = setup
    gateway.getattr("/proc", ME)
    first = gateway.tasks()[os.getpid()]
    original = kernel._execute

    def oops_once(req):
        kernel._execute = original
        req.task.state = "dead"
        kernel.tasks.pop(req.task.pid, None)
        req.error = KernelOops("oops in test")
        req.done.set()
    kernel._execute = oops_once
    with pytest.raises(OSError) as e:
        gateway.getattr("/proc", ME)
    assert e.value.errno == errno.EIO
    gateway.getattr("/proc", ME)
    assert gateway.tasks()[os.getpid()] is not first


def test_close_ends_every_task(setup):
    kernel, _, gateway = setup
    gateway.open("/tracing/kprobe_events", O_RDONLY, ME)
    gateway.close()
    assert os.getpid() not in kernel.tasks
    assert gateway.hostfs.open_handles == 0


def test_concurrent_requests_from_many_threads(setup):
    _, _, gateway = setup
    errors = []

    def work():
        try:
            for _ in range(20):
                assert _read_all(gateway, "/proc/version").startswith(b"Linux")
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert gateway.hostfs.open_handles == 0


# ---- the real kernel -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def real():
    from kprobefs.machine import Kernel
    kernel = Kernel(cpus=2, seed=0)
    # Every file of the mount goes through hostfs: an image without it is a broken build.
    assert "hostfs_lookup" in kernel.kallsyms(), "the kernel image has no hostfs"
    hostfs = build_tree(kernel)
    kernel.hostfs = hostfs
    gateway = Gateway(kernel, hostfs, timeout=20.0)
    yield kernel, gateway
    gateway.close()


def test_real_kernel_serves_proc(real):
    kernel, gateway = real
    assert _read_all(gateway, "/proc/version").decode() == kernel.proc_version()
    assert _read_all(gateway, "/proc/kallsyms").decode() == kernel.kallsyms()
    assert set(dict(gateway.readdir("/proc", ME))) >= {".", "..", "kallsyms", "version"}
    assert gateway.getattr("/proc/version", ME).mode == 0o100444
    with pytest.raises(OSError) as e:
        gateway.getattr("/proc/nope", ME)
    assert e.value.errno == errno.ENOENT


def test_reads_at_offsets_are_one_system_call_each(real):
    """A read where the file's position is is a read(2); one anywhere else (a host
    pread, as the benchmark's of tracing_on at offset 0) is one pread64, which leaves
    the position alone: a later read at the position reads on from there."""
    kernel, gateway = real
    text = kernel.proc_version().encode()
    fh = gateway.open("/proc/version", O_RDONLY, ME)
    try:
        calls = gateway.stats["calls"]
        assert gateway.read(fh, 10, 0, ME) == text[:10]
        for _ in range(3):
            assert gateway.read(fh, 4096, 0, ME) == text
        assert gateway.read(fh, 7, 5, ME) == text[5:12]
        assert gateway.read(fh, 4096, len(text) + 10, ME) == b""
        assert gateway.stats["calls"] - calls == 6
        assert gateway.read(fh, 5, 10, ME) == text[10:15]     # where read(2) left it
        assert gateway.read(fh, 4096, 15, ME) == text[15:]
        assert gateway.read(fh, 4096, len(text), ME) == b""
    finally:
        gateway.release(fh)


def test_reads_and_writes_at_offsets_through_the_fake_kernel(setup):
    """The same against the fake kernel, by name: read, pread64 for another offset,
    write where the position is, pwrite64 elsewhere; no lseek."""
    kernel, _, gateway = setup
    fh = gateway.open("/tracing/kprobe_events", O_RDWR, ME)
    try:
        assert gateway.write(fh, b"p:a vfs_read\n", 0, ME) == 13
        assert gateway.write(fh, b"p:b vfs_read\n", 0, ME) == 13
        before = len(kernel.syscalls)
        assert gateway.read(fh, 4096, 0, ME).startswith(b"p:")
        assert gateway.read(fh, 4096, 0, ME).startswith(b"p:")
        names = [call[2] for call in kernel.syscalls[before:]]
    finally:
        gateway.release(fh)
    assert [call[2] for call in kernel.syscalls[before - 2:before]] == ["write", "pwrite64"]
    assert names == ["pread64", "pread64"]
    assert "lseek" not in {call[2] for call in kernel.syscalls}


def test_real_kernel_runs_requests_as_the_callers_task(real, sleeper):
    kernel, gateway = real
    gateway.getattr("/proc/version", Caller(sleeper.pid))
    task = kernel.tasks[sleeper.pid]
    assert task.comm == "sleep"
    assert kernel.syscall(task, "getpid") == sleeper.pid
    sleeper.kill()
    sleeper.wait()
    assert gateway.reap() >= 1
    assert sleeper.pid not in kernel.tasks


def test_mount_relative_follows_the_top_mount_and_its_root():
    from kprobefs.fs.hostproc import mount_relative
    info = [
        "22 1 0:21 / / rw - ext4 /dev/sda1 rw",
        "30 22 0:12 / /sys/kernel/tracing rw - tracefs tracefs rw",
        "41 30 0:55 /tracing /sys/kernel/tracing rw - fuse.kprobefs debugfs rw",
        "42 22 0:55 / /run/my\\040mnt rw - fuse.kprobefs debugfs rw",
        "43 22 0:56 / /other rw - fuse.sshfs host: rw",
    ]
    assert mount_relative(info, "/sys/kernel/tracing") == "/tracing"
    assert mount_relative(info, "/sys/kernel/tracing/events/sched") == "/tracing/events/sched"
    assert mount_relative(info, "/run/my mnt") == "/"
    assert mount_relative(info, "/run/my mnt/proc") == "/proc"
    assert mount_relative(info, "/sys/kernel") is None
    assert mount_relative(info, "/other/x") is None
    assert mount_relative(info, "/sys/kernel/tracingx") is None
    # answers are kept per table: the same path asked of a changed table (a new list,
    # as MountTables reads it again after a mount) is answered from the new one
    assert mount_relative(info, "/other/x") is None
    remounted = info[:4] + ["43 22 0:57 / /other rw - fuse.kprobefs debugfs rw"]
    assert mount_relative(remounted, "/other/x") == "/x"
    assert mount_relative(info, "/other/x") is None


def test_host_cpu_reads_an_unpinned_threads_cpu_again_only_after_a_while(monkeypatch):
    """host_cpu asks the thread's affinity at every call (a thread pinned elsewhere is
    followed at once) and keeps the CPU /proc/PID/stat gave an unpinned thread for
    HOST_CPU_KEEP seconds."""
    from kprobefs.fs import hostproc
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one host CPU")
    tid = threading.get_native_id()
    reads = []
    real_read = hostproc.read_proc
    monkeypatch.setattr(hostproc, "read_proc", lambda path: reads.append(path) or
                        real_read(path))
    now = [1000.0]
    monkeypatch.setattr(hostproc.time, "monotonic", lambda: now[0])
    hostproc._last_cpus.pop(tid, None)
    try:
        cpu, pinned = hostproc.host_cpu(tid)
        assert not pinned and cpu in allowed and len(reads) == 1
        assert hostproc.host_cpu(tid) == (cpu, False) and len(reads) == 1
        os.sched_setaffinity(0, {allowed[0]})
        assert hostproc.host_cpu(tid) == (allowed[0], True)
        os.sched_setaffinity(0, {allowed[1]})
        assert hostproc.host_cpu(tid) == (allowed[1], True) and len(reads) == 1
        os.sched_setaffinity(0, allowed)
        now[0] += 2 * hostproc.HOST_CPU_KEEP
        assert hostproc.host_cpu(tid)[1] is False and len(reads) == 2
    finally:
        os.sched_setaffinity(0, allowed)
    assert hostproc.host_cpu(2 ** 22 + 1) is None        # no such thread



def test_the_cpu_a_process_read_gives_is_kept_for_host_cpu(monkeypatch):
    """host_process's read of /proc/PID/stat (an EXEC's comm is read through it) keeps
    the CPU it gives, as host_cpu's own read does: a request within HOST_CPU_KEEP makes
    no read for it."""
    from kprobefs.fs import hostproc
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one host CPU")
    tid = threading.get_native_id()
    hostproc._last_cpus.pop(tid, None)
    assert hostproc.host_process(tid).comm
    reads = []
    real_read = hostproc.read_proc
    monkeypatch.setattr(hostproc, "read_proc", lambda path: reads.append(path) or
                        real_read(path))
    cpu, pinned = hostproc.host_cpu(tid)
    assert not pinned and cpu in os.sched_getaffinity(0) and reads == []

def test_a_namespaces_mount_table_is_read_again_only_after_a_mount(tmp_path):
    """MountTables keeps a namespace's mountinfo open and reads it again when poll(2)
    says its mounts changed: a tmpfs mounted meanwhile shows, and goes with its
    unmount."""
    from kprobefs.fs.hostproc import MountTables
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    tables = MountTables()
    point = str(tmp_path)
    try:
        before = tables.lines(os.getpid())
        assert before is tables.lines(os.getpid())            # unchanged: not re-read
        subprocess.run(["mount", "-t", "tmpfs", "none", point], check=True)
        try:
            assert any(f" {point} " in line for line in tables.lines(os.getpid()))
        finally:
            subprocess.run(["umount", point], check=True)
        assert not any(f" {point} " in line for line in tables.lines(os.getpid()))
        assert tables.lines(2 ** 22 + 12345) is None            # no such process
    finally:
        tables.close()


def test_the_daemons_own_namespace_is_read_through_itself_and_kept():
    """A process in the daemon's own mount namespace (most callers) has its table read
    through the daemon: once that process exits and is forgotten, the next caller's
    lookup takes the same lines, not a read of its own (each new `sh` read and parsed
    the table again)."""
    from kprobefs.fs.hostproc import MountTables
    tables = MountTables()
    child = subprocess.Popen(["sleep", "30"])
    try:
        first = tables.lines(child.pid)
    finally:
        child.kill()
        child.wait()
    tables.forget(child.pid)
    tables.PRUNE_EVERY = 0
    try:
        assert first is not None and tables.lines(os.getpid()) is first
    finally:
        tables.close()


def test_a_mount_table_read_again_unchanged_is_not_parsed_again(monkeypatch):
    """The same lines read again (through another process of the namespace) keep the
    parsed mounts and the answers already given."""
    from kprobefs.fs import hostproc
    lines = ["36 25 0:31 / /mnt/k rw - fuse.kprobefs debugfs rw",
             "22 1 8:1 / / rw - ext4 /dev/sda1 rw"]
    parsed = []
    real = hostproc.parse_mountinfo
    monkeypatch.setattr(hostproc, "parse_mountinfo",
                        lambda ls: parsed.append(1) or real(ls))
    assert hostproc.mount_relative(lines, "/mnt/k/tracing") == "/tracing"
    assert hostproc.mount_relative(list(lines), "/mnt/k/tracing") == "/tracing"
    assert len(parsed) == 1
    assert hostproc.mount_relative(lines[1:], "/mnt/k/tracing") is None
    assert len(parsed) == 2


def _flushed(kernel, gateway, held: dict, holding: bool, *answer) -> bool:
    """Whether a FLUSH closed the fd of an open file the caller holds or not (held:
    what the faked /proc look gives per pid)."""
    fh = gateway.open("/tracing/tracing_on", O_RDONLY, ME)
    held[ME.pid] = ["/tracing/tracing_on"] if holding else []
    before = len(kernel.syscalls)
    gateway.flush(fh, ME, *answer)
    closed = [c[2] for c in kernel.syscalls[before:]] == ["close"]
    gateway.release(fh)
    return closed


def _held_up_look():
    """A faked /proc look held up as a process in execve holds it: (the look, the
    event it sets once it is held up, the event that lets it go)."""
    stuck, go = threading.Event(), threading.Event()

    def in_execve(pid):
        stuck.set()
        go.wait(10)
        return iter(())
    return in_execve, stuck, go


def test_a_flush_the_fuse_loop_can_answer_looks_in_its_own_thread(setup, monkeypatch):
    """With ``answer`` (fuse_ll's FLUSH), the look at the caller's descriptors is made in
    the calling thread, no thread of looks started: the fd closed or kept as before,
    and ``answer`` not called.  A look held up (a process in execve) has its FLUSH
    answered from the watch once it has taken FLUSH_WAIT, while flush() itself returns
    when the look is done."""
    from kprobefs.fs import gateway as gw_module
    kernel, _, gateway = setup
    held: dict[int, list[str]] = {}
    looked_in = []

    def paths(pid):
        looked_in.append(threading.get_ident())
        return iter(held.get(pid, ()))
    monkeypatch.setattr(gw_module, "open_mount_paths", paths)
    answered = []
    assert _flushed(kernel, gateway, held, False, lambda: answered.append(1))
    assert not _flushed(kernel, gateway, held, True, lambda: answered.append(1))
    assert set(looked_in) == {threading.get_ident()} and not answered
    assert not [t for t in threading.enumerate() if t.name == "kprobefs-flush"]

    in_execve, stuck, go = _held_up_look()
    monkeypatch.setattr(gw_module, "open_mount_paths", in_execve)
    fh = gateway.open("/tracing/tracing_on", O_RDONLY, ME)
    answer = threading.Event()
    flushing = threading.Thread(target=gateway.flush, args=(fh, ME, answer.set))
    flushing.start()
    assert answer.wait(10) and stuck.is_set() and flushing.is_alive()
    go.set()
    flushing.join(10)
    assert not flushing.is_alive()
    gateway.release(fh)
    gateway.close()
    _gone_after_close("kprobefs-flush-watch")


def test_an_open_file_used_by_another_process_meanwhile_is_still_checked(monkeypatch):
    """rmdir's wait asks which processes that used a file still hold it while other
    requests add processes to it (it failed with "dictionary changed size")."""
    from kprobefs.fs import gateway as gw_module
    of = gw_module._OpenFile(path="/sys/kernel/tracing/instances/foo/trace", flags=0)
    of.fds[1] = 3

    def paths(pid):
        of.fds[pid + 1000] = 4      # another thread's open, as this one walks the pids
        return iter(())
    monkeypatch.setattr(gw_module, "open_mount_paths", paths)
    assert not gw_module._held(of)


def test_flush_closes_the_callers_last_descriptor_on_its_threads(setup, monkeypatch):
    """FLUSH closes the caller's emulated fd before it returns when the caller holds no
    other descriptor on the file, and leaves it open when it does; the looks are made
    by threads that stay (one for looks one after another, not one per close), and a
    look held up (a process in execve) holds up neither its FLUSH past FLUSH_WAIT nor
    the FLUSHes after it."""
    from kprobefs.fs import gateway as gw_module
    kernel, _, gateway = setup
    held: dict[int, list[str]] = {}
    monkeypatch.setattr(gw_module, "open_mount_paths", lambda pid: iter(held.get(pid, ())))

    for _ in range(5):
        assert _flushed(kernel, gateway, held, holding=False)
        assert not _flushed(kernel, gateway, held, holding=True)
    lookers = [t for t in threading.enumerate() if t.name == "kprobefs-flush"]
    assert len(lookers) == 1

    in_execve, stuck, go = _held_up_look()
    monkeypatch.setattr(gw_module, "open_mount_paths", in_execve)
    fh = gateway.open("/tracing/tracing_on", O_RDONLY, ME)
    t = time.monotonic()
    gateway.flush(fh, ME)
    assert stuck.is_set() and time.monotonic() - t >= gateway.FLUSH_WAIT * 0.9
    monkeypatch.setattr(gw_module, "open_mount_paths", lambda pid: iter(()))
    other = gateway.open("/tracing/tracing_on", O_RDONLY, ME)
    t = time.monotonic()
    before = len(kernel.syscalls)
    gateway.flush(other, ME)
    assert time.monotonic() - t < gateway.FLUSH_WAIT
    assert [c[2] for c in kernel.syscalls[before:]] == ["close"]
    go.set()
    gateway.release(other)
    gateway.release(fh)
    gateway.close()
    _gone_after_close("kprobefs-flush")


def _gone_after_close(name: str) -> None:
    """Waits (5 s at most) for the gateway's threads called name to end."""
    deadline = time.monotonic() + 5
    while any(t.name == name for t in threading.enumerate()):
        assert time.monotonic() < deadline, f"{name} threads left after close()"
        time.sleep(0.01)
