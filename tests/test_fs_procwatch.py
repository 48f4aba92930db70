"""Host process events from the process connector (kprobefs.fs.procwatch)."""

import os
import subprocess
import time

import pytest

from kprobefs.fs.procwatch import COMM, EXEC, EXIT, FORK, ProcessEvents, host_exec_image


@pytest.fixture
def events():
    ev = ProcessEvents.open()
    if ev is None:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            pytest.fail("no process connector for root under CI=true")
        pytest.skip("the host offers no process connector here")
    yield ev
    ev.close()


def _drain_until(events, wanted, timeout: float = 5.0) -> list:
    """Every event drained until one is wanted (or timeout seconds have passed)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline and not any(wanted(e) for e in seen):
        seen += events.drain()
        time.sleep(0.01)
    return seen


def test_fork_exec_exit_of_a_child_arrive_in_order(events):
    events.drain()
    child = subprocess.run(["sh", "-c", "(true); exec sh -c 'exit 7'"])
    assert child.returncode == 7
    del child
    deadline = time.monotonic() + 5
    seen = []
    while time.monotonic() < deadline:
        seen += events.drain()
        sh = next((e.child for e in seen if e.what == FORK and e.tgid == os.getpid()
                   and e.child == e.child_tgid), None)
        if sh and any(e.what == EXIT and e.pid == sh for e in seen):
            break
        time.sleep(0.01)
    mine = [e for e in seen if sh in (e.pid, e.tgid)]
    kinds = [e.what for e in mine]
    # exec of sh, then it forks its subshell, execs `true`, and exits
    assert kinds[-3:] == [FORK, EXEC, EXIT]
    # the exit carries the wait status
    assert mine[-1].exit_code == 7 << 8


def test_once_a_process_is_watched_only_its_family_is_kept(events):
    """watch(): the events of the watched process, of what it forks (a grandchild
    too), and nothing of the rest of the host."""
    events.drain()
    watched = subprocess.Popen(["sh", "-c", "read x; (sleep 0.01); exit 3"],
                               stdin=subprocess.PIPE)
    events.watch(watched.pid)
    other = subprocess.run(["sh", "-c", "(true); exit 5"])
    assert other.returncode == 5
    watched.communicate(b"go\n")
    assert watched.returncode == 3
    seen = _drain_until(events, lambda e: e.what == EXIT and e.pid == watched.pid)
    pids = {e.pid for e in seen} | {e.tgid for e in seen}
    forks = [e for e in seen if e.what == FORK]
    assert forks and all(e.pid == watched.pid or e.tgid == watched.pid or
                         e.pid in {f.child for f in forks} for e in forks)
    kids = {e.child for e in forks}
    assert pids <= {watched.pid} | kids
    # the subshell's exec of sleep and its exit are there
    assert any(e.what == EXEC and e.pid in kids for e in seen)
    assert any(e.what == EXIT and e.pid in kids for e in seen)
    assert [e.exit_code for e in seen if e.what == EXIT and e.pid == watched.pid] == [3 << 8]


def test_the_reader_thread_queues_events_with_the_execd_comm(events):
    events.drain()
    events.start_reader()
    child = subprocess.Popen(["sleep", "0.3"])
    try:
        seen = _drain_until(events, lambda e: e.what == EXEC and e.pid == child.pid)
    finally:
        child.wait()
    execs = [e for e in seen if e.what == EXEC and e.pid == child.pid]
    assert execs and execs[0].comm == "sleep"


def test_the_reader_applies_what_it_read_itself(events):
    """With on_events, the reader thread hands each batch it queued over itself (no
    other thread is woken to apply it)."""
    import threading

    child = subprocess.Popen(["sleep", "60"])
    applied, seen = [], []

    def on_events():
        applied.append(threading.get_ident())
        seen.extend(events.drain(read_socket=False))

    try:
        time.sleep(0.2)                 # the child's own fork and exec are read already
        events.drain()
        events.watch(child.pid)
        events.start_reader(on_events=on_events)
        child.kill()
        child.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                e.what == EXIT and e.pid == child.pid for e in seen):
            time.sleep(0.01)
    finally:
        if child.poll() is None:
            child.kill()
    assert any(e.what == EXIT and e.pid == child.pid for e in seen)
    assert applied and threading.get_ident() not in applied


def test_comm_events_carry_the_new_name():
    import struct
    from kprobefs.fs import procwatch as pw
    body = struct.pack("<IIQ", COMM, 0, 0) + struct.pack("<ii16s", 42, 42, b"renamed\0")
    cn = pw._CN_MSG.pack(pw.CN_IDX_PROC, pw.CN_VAL_PROC, 0, 0, len(body), 0) + body
    msg = pw._NLMSGHDR.pack(pw._NLMSGHDR.size + len(cn), pw.NLMSG_DONE, 0, 0, 0) + cn
    assert pw._parse(msg) == [pw.ProcessEvent(COMM, 42, 42, comm="renamed")]


def test_an_exec_image_is_named_as_the_process_named_it():
    """/bin/sh runs dash on Debian: /proc/PID/exe says /usr/bin/dash, but the comm is
    "sh", so the name the process was exec'd by (argv[0], or the PATH's) is kept."""
    proc = _running(["/bin/sh", "-c", "echo running; read x"])
    try:
        with open(f"/proc/{proc.pid}/comm") as f:
            comm = f.read().strip()
        filename, argv = host_exec_image(proc.pid, comm)
    finally:
        proc.communicate(b"\n")
    assert os.path.basename(filename) == comm == "sh"
    assert os.path.realpath(filename) == os.path.realpath("/bin/sh")
    assert argv == ["/bin/sh", "-c", "echo running; read x"]
    assert host_exec_image(proc.pid, comm) is None      # gone


def test_a_long_command_line_is_read_whole():
    """An argv past one read of /proc/PID/cmdline (16 KiB) comes whole."""
    argv = ["/bin/sh", "-c", "echo running; read x", "sh", "a" * 20_000, "b" * 30_000]
    proc = _running(argv)
    try:
        assert host_exec_image(proc.pid, "sh")[1] == argv
    finally:
        proc.communicate(b"\n")


def _running(argv: list[str]) -> subprocess.Popen:
    """A child started with argv that has printed its first line: its exec is done,
    its arguments in place.  (Its comm changes earlier in the exec, and Popen returns
    earlier too, as the exec closes the descriptors marked close-on-exec: /proc's
    cmdline may be empty then.)"""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdout.readline()
    return proc


def test_the_path_search_of_a_comm_is_remembered(monkeypatch):
    """Each mirrored exec asks which program on PATH has the comm's name: asked once
    per name, and again when what was remembered is not the process's program."""
    from kprobefs.fs import procwatch

    searched = []
    which = procwatch.shutil.which
    monkeypatch.setattr(procwatch.shutil, "which",
                        lambda name: (searched.append(name), which(name))[1])
    monkeypatch.setattr(procwatch, "_WHICH", {})
    proc = _running(["sh", "-c", "echo running; read x"])
    try:
        first = host_exec_image(proc.pid, "sh")
        assert host_exec_image(proc.pid, "sh") == first and searched == ["sh"]
        assert os.path.basename(first[0]) == "sh"
        procwatch._WHICH["sh"] = "/nonexistent/sh"      # stale: PATH changed since
        assert host_exec_image(proc.pid, "sh") == first and searched == ["sh", "sh"]
    finally:
        proc.communicate(b"\n")


def test_what_a_name_resolves_to_is_remembered(monkeypatch):
    """The program a name resolves to (a stat of each of its components) is asked once
    while it is the process's program, and again when it is not."""
    from kprobefs.fs import procwatch

    resolved = []
    realpath = os.path.realpath
    monkeypatch.setattr(procwatch.os.path, "realpath",
                        lambda path: (resolved.append(path), realpath(path))[1])
    monkeypatch.setattr(procwatch, "_RESOLVED", {})
    sh = realpath("/bin/sh")
    assert procwatch._resolves_to("/bin/sh", sh) and resolved == ["/bin/sh"]
    assert procwatch._resolves_to("/bin/sh", sh) and resolved == ["/bin/sh"]
    assert not procwatch._resolves_to("/bin/sh", "/usr/bin/other")
    assert resolved == ["/bin/sh"] * 2
    assert procwatch._resolves_to("/bin/sh", sh) and resolved == ["/bin/sh"] * 2
