"""The FUSE round trip's shortcuts, on the real kernel and tree (no mount): a LOOKUP of a
debugfs or tracefs name is answered from the host tree, as the kernel's own newfstatat
would answer it; a new caller's task is made while its first request is answered; a
RELEASE returns once its close has run."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import threading
import time

import pytest

from conftest import blocking_kprobe
from kprobefs.daemon import Daemon
from kprobefs.fs import Caller
from kprobefs.fs.gateway import _STAT, AT_FDCWD, AT_SYMLINK_NOFOLLOW, STATUS_PATH
from kprobefs.fs.procwatch import EXEC, FORK, ProcessEvent, ProcessEvents
from kprobefs.machine.kernel import UserBuffer


@pytest.fixture
def daemon():
    d = Daemon("/nonexistent", cpus=2)
    d.boot()
    yield d
    d.kernel.close()


def _kernel_stat(kernel, task, path: str):
    buf = UserBuffer(_STAT.size)
    ret = kernel.syscall(task, "newfstatat", AT_FDCWD, path, buf, AT_SYMLINK_NOFOLLOW)
    if ret < 0:
        return -ret
    fields = _STAT.unpack(buf.data[:_STAT.size])
    return fields[3], fields[2]          # mode, nlink


def _every_path(daemon, limit: int = 400):
    """Mount-relative paths of the debugfs tree, breadth first (events/ cut short)."""
    gateway, out, todo = daemon.gateway, [], ["/"]
    me = Caller(os.getpid())
    while todo and len(out) < limit:
        path = todo.pop(0)
        for name, mode in gateway.readdir(path, me):
            if name in (".", "..") or (path == "/" and name in ("proc", "dev", "tmp")):
                continue
            child = path.rstrip("/") + "/" + name
            out.append(child)
            if stat.S_ISDIR(mode) and child.count("/") < 4:
                todo.append(child)
    return out


def test_host_answered_attributes_are_the_kernels(daemon):
    """For every name of debugfs and tracefs (and a few that are not there), the
    attributes a LOOKUP gets from the host tree are what the kernel's newfstatat of
    the same path reports: the same mode and link count, or the same errno."""
    gateway, kernel = daemon.gateway, daemon.kernel
    task = kernel.spawn("stat")
    paths = _every_path(daemon) + ["/", "/tracing", "/tracing/no_such_file",
                                   "/tracing/trace/x", "/kprobes/list/y"]
    assert len(paths) > 100
    me = Caller(os.getpid())
    for path in paths:
        if path == STATUS_PATH:
            continue                        # the daemon's own file, not the kernel's
        want = _kernel_stat(kernel, task, gateway.kernel_path(path))
        try:
            a = gateway.getattr(path, me)
        except OSError as e:
            assert want == e.errno, path
        else:
            assert want == (a.mode, a.nlink), path


def test_a_lookup_makes_no_system_call(daemon, sleeper):
    """Two LOOKUPs of a new process: its task is made (a clone3 that names it), and
    nothing else reaches the kernel."""
    kernel, gateway = daemon.kernel, daemon.gateway
    seen = []
    submit = kernel.submit

    def counting(task, name, *args, **kw):
        seen.append((task.pid, name))
        return submit(task, name, *args, **kw)

    kernel.submit = counting
    gateway.getattr("/tracing", Caller(sleeper.pid))
    gateway.getattr("/tracing/kprobe_events", Caller(sleeper.pid))
    assert gateway._callers[sleeper.pid].task.comm == "sleep"   # made once needed
    assert [name for _pid, name in seen] == ["clone3"]
    with pytest.raises(OSError) as e:
        gateway.getattr("/tracing/events/nosuchgroup", Caller(sleeper.pid))
    assert e.value.errno == errno.ENOENT


def test_a_release_returns_once_its_close_is_done(daemon):
    """The host's FUSE sends RELEASE without waiting for it, but on Linux the file is
    released before close(2) returns: the gateway's release() returns only once the
    close has run in the kernel, machine thread or not."""
    kernel, gateway = daemon.kernel, daemon.gateway
    me = Caller(os.getpid())
    kernel.serve()
    for _ in range(20):
        fh = gateway.open("/tracing/README", os.O_RDONLY, me)
        assert gateway.hostfs.open_handles == 1
        gateway.release(fh)
        assert gateway.hostfs.open_handles == 0


def test_a_request_after_a_release_waits_for_its_close(daemon, sleeper):
    """The host's FUSE does not wait for RELEASE: the process that closed the file goes
    on, and its next request (another process's too) must find the file closed, as
    on Linux.  Here the close is held up in the kernel by a probe: a LOOKUP that comes
    meanwhile is answered only once the close is done."""
    kernel, gateway = daemon.kernel, daemon.gateway
    me = Caller(os.getpid())
    fh = gateway.open("/tracing/README", os.O_RDONLY, me)
    kp, entered, go = blocking_kprobe("__x64_sys_close", 30)
    with kernel.lock:
        kernel.register_kprobe(kp)
    kernel.serve()
    releasing = threading.Thread(target=gateway.release, args=(fh,))
    looking = threading.Thread(target=gateway.getattr,
                               args=("/tracing", Caller(sleeper.pid)))
    try:
        releasing.start()
        assert entered.wait(30)
        looking.start()
        looking.join(0.3)
        assert looking.is_alive()           # held until the close is done
    finally:
        go.set()
    releasing.join(30)
    looking.join(30)
    assert not looking.is_alive() and gateway.hostfs.open_handles == 0


def _rmdir_waiting(gateway, path: str, me: Caller):
    """An rmdir of path on a thread of its own, checked to be waiting (for a release,
    not failing EBUSY) after 0.3 s: (its thread, the list its result goes to)."""
    done = []
    removing = threading.Thread(target=lambda: done.append(gateway.rmdir(path, me)))
    removing.start()
    removing.join(0.3)
    assert removing.is_alive()
    return removing, done


def test_an_rmdir_ahead_of_a_release_waits_for_it(daemon):
    """`read e < instances/foo/x && rmdir instances/foo`: the RELEASE is queued before
    the shell's close(2) returns, but another daemon thread may take the rmdir first.
    An rmdir the kernel finds busy, with only files no process holds any more, waits
    for their release and goes through."""
    gateway = daemon.gateway
    me = Caller(os.getpid())
    daemon.kernel.serve()
    gateway.mkdir("/tracing/instances/late", 0o755, me)
    fh = gateway.open("/tracing/instances/late/trace", os.O_RDONLY, me)
    removing, done = _rmdir_waiting(gateway, "/tracing/instances/late", me)
    gateway.release(fh)
    removing.join(30)
    assert done == [None]
    with pytest.raises(OSError) as e:
        gateway.getattr("/tracing/instances/late", me)
    assert e.value.errno == errno.ENOENT


def test_an_rmdir_during_a_release_waits_for_its_close(daemon, monkeypatch):
    """The rmdir came in before the RELEASE and finds the instance busy while that
    RELEASE's close runs (the file is no longer listed as open): it waits for the close
    and goes through, rather than fail EBUSY."""
    gateway = daemon.gateway
    me = Caller(os.getpid())
    daemon.kernel.serve()
    gateway.mkdir("/tracing/instances/closing", 0o755, me)
    fh = gateway.open("/tracing/instances/closing/trace", os.O_RDONLY, me)
    go_on, closing = threading.Event(), threading.Event()
    close_fd = gateway._close_fd

    def slow_close(caller, fd):
        closing.set()
        go_on.wait(10)
        close_fd(caller, fd)

    monkeypatch.setattr(gateway, "_close_fd", slow_close)
    releasing = threading.Thread(target=gateway.release, args=(fh,))
    releasing.start()
    assert closing.wait(10)
    # its request was taken before the RELEASE: no wait for releases before it
    monkeypatch.setattr(gateway, "_after_releases", lambda: None)
    removing, done = _rmdir_waiting(gateway, "/tracing/instances/closing", me)
    go_on.set()
    releasing.join(30)
    removing.join(30)
    assert done == [None]


def test_a_mirrored_exec_makes_its_program_once(daemon, sleeper):
    """A host exec is mirrored as the task's execve of the same program, which is made in
    the emulated rootfs first: once per program (one machine call per exec, not two),
    and again when it has gone from the rootfs since."""
    gateway, kernel = daemon.gateway, daemon.kernel
    caller = gateway._caller(Caller(sleeper.pid))
    made = []
    upcall = kernel.upcall
    kernel.upcall = lambda func, *a, **kw: (made.append((func, a)), upcall(func, *a, **kw))[1]
    try:
        for _ in range(2):
            caller.task.comm = "before"
            gateway._exec(caller)
            assert caller.task.comm == "sleep" and not caller.exec_seen
        assert [f for f, _ in made] == ["host_binary_create"]
        program = made[0][1][0]
        assert kernel.syscall(caller.task, "unlink", program) == 0
        caller.task.comm = "before"
        gateway._exec(caller)
        assert caller.task.comm == "sleep"
        assert [f for f, _ in made] == ["host_binary_create"] * 2
    finally:
        kernel.upcall = upcall


@pytest.fixture
def unread_events(daemon):
    """The host's process events, watched by the daemon's gateway through a reader
    that never reads: only the gateway's own requests take them off the socket."""
    events = ProcessEvents.open()
    if events is None:
        pytest.skip("no process connector here")
    events._reader = object()           # a reader that never reads
    daemon.gateway.watch_host_processes(events)
    yield events
    daemon.gateway.watch_host_processes(None)
    events._reader = None
    events.close()


@contextlib.contextmanager
def _submitted(kernel):
    """The names of the system calls submitted to kernel meanwhile, in order."""
    seen = []
    submit = kernel.submit
    kernel.submit = lambda task, name, *a, **kw: (seen.append(name),
                                                  submit(task, name, *a, **kw))[1]
    try:
        yield seen
    finally:
        kernel.submit = submit


def test_what_a_callers_child_did_before_its_request_is_mirrored_first(daemon,
                                                                        unread_events):
    """A known shell runs a child that exits, then makes a request: the child's fork
    and exit are mirrored before the request runs, even when the process events'
    reader thread has not taken them off the socket yet (here it never does)."""
    gateway, kernel = daemon.gateway, daemon.kernel
    shell = subprocess.Popen(["sh", "-c", "read go; /bin/true; read done"],
                             stdin=subprocess.PIPE, text=True)
    try:
        time.sleep(0.2)
        gateway.getattr("/tracing", Caller(shell.pid))          # the shell is known
        with _submitted(kernel) as seen:
            shell.stdin.write("go\n")
            shell.stdin.flush()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:      # until the child has come and gone
                time.sleep(0.1)
                kids = subprocess.run(["pgrep", "-P", str(shell.pid)],
                                      capture_output=True).stdout.split()
                with open(f"/proc/{shell.pid}/stat") as f:
                    if not kids and f.read().split()[2] == "S":
                        break
            gateway.getattr("/tracing", Caller(shell.pid))
        # (the shell's own prctl may come first; a child this short is gone before
        # its exec is read, so that is a rename, not an execve)
        assert "clone3" in seen and seen[-1] == "exit", seen
    finally:
        shell.communicate("done\n", timeout=10)


def test_a_spawners_children_get_their_tasks_as_they_fork(daemon, unread_events):
    """A shell no request came from runs a child that makes one: the shell becomes a
    spawner, and its next child's task is made from its fork event, before that child's
    first request (which then makes no clone3 of its own).  Three children in a row
    that exit without a request make the shell an ordinary process again."""
    gateway, kernel = daemon.gateway, daemon.kernel
    shell = subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!; read go; sleep 30 & echo $!; read more; "
                     "/bin/true; /bin/true; /bin/true; echo done; read end"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first = second = int(shell.stdout.readline())
        gateway.getattr("/tracing", Caller(first))              # the first caller child
        assert gateway._spawners.get(shell.pid) == 0
        shell.stdin.write("go\n")
        shell.stdin.flush()
        second = int(shell.stdout.readline())
        gateway._sync_host_processes()                          # its fork event
        made = gateway._callers[second]
        assert made.prespawned_by == shell.pid
        assert made.task.pid == second and kernel.tasks[second] is made.task
        with _submitted(kernel) as seen:
            gateway.getattr("/tracing", Caller(second))
            fh = gateway.open("/tracing/kprobe_events", os.O_RDONLY, Caller(second))
            gateway.release(fh)
        assert "clone3" not in seen and "openat" in seen, seen
        assert made.prespawned_by == 0 and gateway.stats["prespawn_hits"] == 1
        shell.stdin.write("more\n")
        shell.stdin.flush()
        assert shell.stdout.readline() == "done\n"
        deadline = time.monotonic() + 10
        while shell.pid in gateway._spawners and time.monotonic() < deadline:
            gateway._sync_host_processes()
            time.sleep(0.05)
        assert shell.pid not in gateway._spawners
    finally:
        for pid in {first, second}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        shell.communicate("end\n", timeout=10)


def test_a_known_callers_fork_has_its_task_made_as_the_fork_is_applied(daemon):
    """A fork of a known process makes its child's task (clone3) as the FORK event is
    applied, while the host child goes on to its exec, not at the EXEC or the child's
    first request; the child keeps its parent's name until its exec is mirrored (no
    rename from the comm it may already have on the host)."""
    gateway, kernel = daemon.gateway, daemon.kernel
    shell = subprocess.Popen(["sh", "-c", "read go"],
                             stdin=subprocess.PIPE, text=True)
    child = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.2)
        gateway.getattr("/tracing", Caller(shell.pid))          # the shell is known
        with _submitted(kernel) as seen:
            gateway._apply_process_event(
                ProcessEvent(FORK, shell.pid, shell.pid, child.pid, child.pid))
            made = gateway._callers[child.pid]
            assert made.has_task and seen == ["clone3"]
            assert kernel.tasks[child.pid] is made.task and made.task.comm == "sh"
            gateway.mirror_host_processes()
            assert seen == ["clone3"] and made.task.comm == "sh"
            gateway._apply_process_event(ProcessEvent(EXEC, child.pid, child.pid,
                                                      comm="sleep"))
        assert seen == ["clone3", "execve"] and made.task.comm == "sleep"
    finally:
        child.kill()
        child.wait()
        shell.communicate("go\n", timeout=10)
