"""Mounting for real: the files driven through a shell (output, exit status, the shell's
error text), getattr/readdir/ENOENT, and the daemon's life: mount, umount, SIGTERM,
kill -9 then mount again, READY=1/STOPPING=1 on a notify socket.

Most scenarios run the CLI with the fake kernel and a small fake tracer
(``tests/fs_fakes.py``): they are about the filesystem and the daemon, not the tracer,
and the fakes start at once and add files that show what reached the tracer
(``openers``, each opener's pid and comm; ``write_sizes``, how FUSE cut a write).
Those about the real kernel run ``python -m kprobefs``.  Skipped without /dev/fuse,
except under CI=true.
"""

import ctypes.util
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kprobefs
from kprobefs.daemon import unmount
from robust_mount import ready_then_stopping

pytestmark = pytest.mark.fuse

ROOT = Path(__file__).resolve().parents[1]
FAKES = str(ROOT / "tests" / "fs_fakes.py")
FAKE_CLI = [sys.executable, FAKES]
REAL_CLI = [sys.executable, "-m", "kprobefs"]


def _default_sigint():
    """In a child before exec: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _fuse_missing():
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not ctypes.util.find_library("fuse"):
        return "libfuse2 is missing (apt-get install fuse libfuse2)"
    if os.geteuid() != 0:
        return "mounting needs root here"
    return None


@pytest.fixture(autouse=True)
def _need_fuse():
    reason = _fuse_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"FUSE tests cannot run under CI=true: {reason}")
        pytest.skip(reason)


#: The daemons run the kprobefs these tests import (the installed wheel under
#: tests/run.sh, the source tree otherwise), from a neutral directory.
PACKAGE_PARENT = str(Path(kprobefs.__file__).resolve().parents[1])


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NOTIFY_SOCKET", None)
    return env


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(),
                          cwd="/", **kw)


def sh(script, shell="sh"):
    return subprocess.run([shell, "-c", script], capture_output=True, text=True, timeout=60)


def is_mounted(path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def daemon_pids(path):
    """Pids of processes whose command line mounts path (the daemons)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and str(path).encode() in argv:
            out.append(int(entry))
    return out


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def cleanup(path):
    for pid in daemon_pids(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if is_mounted(path):
        unmount(str(path), lazy=True)


@pytest.fixture
def mnt(tmp_path):
    path = tmp_path / "mnt"
    yield path
    cleanup(path)


def mount(cli, path, *extra):
    r = run(cli + ["mount", str(path), *extra])
    assert r.returncode == 0, r.stderr
    assert is_mounted(path)
    return r


@pytest.fixture
def fake(mnt):
    mount(FAKE_CLI, mnt)
    yield mnt
    r = run(FAKE_CLI + ["umount", str(mnt)])
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    path = tmp_path_factory.mktemp("real") / "mnt"
    reason = _fuse_missing()
    if reason:
        pytest.skip(reason)
    mount(REAL_CLI, path)
    yield path
    run(REAL_CLI + ["umount", str(path)])
    cleanup(path)


# ---- the real kernel, through a shell ------------------------------------------------------
def test_real_tree_and_modes(real):
    assert sorted(os.listdir(real)) == ["dev", "kprobefs", "kprobes", "proc", "tmp",
                                        "tracing"]
    assert sorted(os.listdir(real / "kprobes")) == ["blacklist", "enabled", "list"]
    assert sorted(os.listdir(real / "proc")) == ["kallsyms", "meminfo", "modules", "slabinfo",
                                                 "sys", "version"]
    assert sorted(os.listdir(real / "kprobefs")) == ["modules", "status"]
    modes = {p: stat.S_IMODE(os.stat(real / p).st_mode) for p in (
        "kprobes/list", "kprobes/enabled", "kprobes/blacklist", "proc/kallsyms",
        "proc/version", "proc/sys/debug/kprobes-optimization", "proc/modules",
        "kprobefs/modules", "kprobefs/status")}
    assert modes == {"kprobes/list": 0o400, "kprobes/enabled": 0o600,
                     "kprobes/blacklist": 0o400, "proc/kallsyms": 0o444,
                     "proc/version": 0o444, "proc/sys/debug/kprobes-optimization": 0o644,
                     "proc/modules": 0o444, "kprobefs/modules": 0o600,
                     "kprobefs/status": 0o444}
    st = os.stat(real / "kprobes/enabled")
    assert st.st_size == 0 and st.st_uid == 0 and st.st_gid == 0
    assert stat.S_ISDIR(os.stat(real / "kprobes").st_mode)


def test_real_mount_is_named_debugfs(real):
    lines = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    (entry,) = [line for line in lines if line[1] == str(real)]
    assert entry[0] == "debugfs" and entry[2] == "fuse.kprobefs"
    assert "tracefs" not in " ".join(entry)


def test_real_cat(real):
    r = sh(f"cat {real}/proc/version")
    assert r.returncode == 0 and r.stdout.startswith("Linux version 6.1.0")
    r = sh(f"cat {real}/kprobes/enabled")
    assert (r.returncode, r.stdout) == (0, "1\n")
    r = sh(f"head -n 2 {real}/kprobes/blacklist")
    assert r.returncode == 0
    for line in r.stdout.splitlines():
        rng, sym = line.split("\t")
        start, end = rng.split("-")
        assert len(start) == len(end) == 18 and int(end, 16) > int(start, 16) and sym
    r = sh(f"grep -w vfs_read {real}/proc/kallsyms")
    assert r.returncode == 0 and r.stdout.split()[1:] == ["T", "vfs_read"]


def test_real_knob_echo(real):
    knob = f"{real}/kprobes/enabled"
    assert sh(f"echo 0 > {knob}").returncode == 0
    assert sh(f"cat {knob}").stdout == "0\n"
    assert sh(f"echo 1 > {knob}").returncode == 0
    assert sh(f"cat {knob}").stdout == "1\n"
    r = sh(f"echo 2 > {knob}", shell="bash")
    assert r.returncode == 1 and "write error: Invalid argument" in r.stderr
    r = sh(f"echo 2 > {knob}")          # dash reports any failed echo as an I/O error
    assert r.returncode != 0 and "echo" in r.stderr
    opt = f"{real}/proc/sys/debug/kprobes-optimization"
    assert sh(f"cat {opt}").stdout == "1\n"
    r = sh(f"echo 5 > {opt}", shell="bash")
    assert r.returncode == 1 and "Invalid argument" in r.stderr
    assert sh(f"echo 0 > {opt} && cat {opt} && echo 1 > {opt}").stdout == "0\n"


def test_real_errors(real):
    r = sh(f"cat {real}/kprobes/nope")
    assert r.returncode == 1 and "No such file or directory" in r.stderr
    r = sh(f"echo x > {real}/proc/version")
    assert r.returncode == 2 and "Permission denied" in r.stderr
    r = sh(f"echo x > {real}/kprobes")
    assert r.returncode == 2 and "Is a directory" in r.stderr
    r = sh(f"ls {real}/proc/nope")
    assert r.returncode == 2 and "No such file or directory" in r.stderr


def test_real_probe_sees_the_shells_own_reads(real):
    t = f"{real}/tracing"
    assert sh(f"echo 'p:myprobe vfs_read' > {t}/kprobe_events").returncode == 0
    try:
        assert sh(f"cat {t}/kprobe_events").stdout == "p:kprobes/myprobe vfs_read\n"
        assert os.path.isdir(f"{t}/events/kprobes/myprobe")
        assert sh(f"echo 1 > {t}/events/kprobes/myprobe/enable").returncode == 0
        r = sh(f"echo $$; exec cat {t}/README > /dev/null")
        reader = int(r.stdout.split()[0])
        r = sh(f"echo > {t}/kprobe_events", shell="bash")
        assert r.returncode == 1 and "Device or resource busy" in r.stderr
        assert sh(f"echo 0 > {t}/events/kprobes/myprobe/enable").returncode == 0
        trace = Path(f"{t}/trace").read_text()
        hits = [line for line in trace.splitlines() if f"cat-{reader} " in line]
        assert hits and all("myprobe: (vfs_read+0x0/" in line for line in hits)
    finally:
        sh(f"echo 0 > {t}/events/kprobes/myprobe/enable; echo > {t}/kprobe_events")
    assert sh(f"cat {t}/kprobe_events").stdout == ""
    assert not os.path.exists(f"{t}/events/kprobes/myprobe")


def test_a_file_held_open_is_seen_on_the_host(real):
    """rmdir's wait for releases in flight (Gateway.rmdir) is skipped when a process
    that used a file of the instance still holds it: the EBUSY comes at once."""
    from kprobefs.fs.gateway import Gateway, _held, _OpenFile

    path = "/tracing/instances/held/trace"
    of = _OpenFile(Gateway.kernel_path(path), os.O_RDONLY, {os.getpid(): None})
    assert sh(f"mkdir {real}/tracing/instances/held").returncode == 0
    try:
        fd = os.open(f"{real}{path}", os.O_RDONLY)
        try:
            assert _held(of)
        finally:
            os.close(fd)
        assert not _held(of)
    finally:
        sh(f"rmdir {real}/tracing/instances/held")


def test_real_instance_mkdir_enable_rmdir(real):
    """mkdir/rmdir under tracing/instances go through the emulated kernel's VFS to the
    daemon; an event enabled in the instance records the shell's reads there only."""
    t = f"{real}/tracing"
    foo = f"{t}/instances/foo"
    assert sh(f"mkdir {foo}").returncode == 0
    try:
        assert sh(f"test -d {foo} && ls {t}/instances").stdout == "foo\n"
        r = sh(f"mkdir {foo}", shell="bash")
        assert r.returncode == 1 and "File exists" in r.stderr
        r = sh(f"mkdir {t}/events/new", shell="bash")
        assert r.returncode == 1 and "Operation not permitted" in r.stderr
        assert sh(f"echo 'p:myprobe vfs_read' > {t}/kprobe_events").returncode == 0
        r = sh(f"echo 1 > {foo}/events/kprobes/myprobe/enable && "
               f"echo $$; exec cat {t}/README > /dev/null")
        assert r.returncode == 0
        reader = int(r.stdout.split()[0])
        assert sh(f"cat {foo}/events/kprobes/myprobe/enable {t}/events/kprobes/myprobe/enable"
                  ).stdout == "1\n0\n"
        r = sh(f"echo > {t}/kprobe_events", shell="bash")
        assert r.returncode == 1 and "Device or resource busy" in r.stderr
        r = sh(f"exec 3< {foo}/trace; rmdir {foo}", shell="bash")
        assert r.returncode == 1 and "Device or resource busy" in r.stderr
        mine = [line for line in Path(f"{foo}/trace").read_text().splitlines()
                if f"cat-{reader} " in line]
        assert mine and all("myprobe: (vfs_read+0x0/" in line for line in mine)
        assert f"cat-{reader} " not in Path(f"{t}/trace").read_text()
        assert sh(f"rmdir {foo}").returncode == 0
        assert not os.path.exists(foo)
        r = sh(f"rmdir {foo}", shell="bash")
        assert r.returncode == 1 and "No such file or directory" in r.stderr
        assert sh(f"echo > {t}/kprobe_events").returncode == 0     # rmdir disabled it
    finally:
        sh(f"rmdir {foo}; echo > {t}/kprobe_events")


# ---- tracing files (fake tracer), through a shell -----------------------------------------
def test_fake_tracing_echo_cat(fake):
    ev = f"{fake}/tracing/kprobe_events"
    assert sh(f"echo 'p:myprobe vfs_read' > {ev}").returncode == 0
    assert sh(f"echo 'r:myret vfs_read' >> {ev}").returncode == 0
    assert sh(f"cat {ev}").stdout == "p:myprobe vfs_read\nr:myret vfs_read\n"
    assert sorted(os.listdir(f"{fake}/tracing/events")) == ["myprobe", "myret"]
    r = sh(f"echo zzz >> {ev}", shell="bash")
    assert r.returncode == 1 and "write error: Invalid argument" in r.stderr
    assert sh(f"echo > {ev}").returncode == 0          # O_TRUNC clears
    assert sh(f"cat {ev}").stdout == ""
    assert os.listdir(f"{fake}/tracing/events") == []


def test_real_names_that_go_away_are_gone_at_once(real):
    """The host caches lookups of tracefs's own files (they stay), not of events or
    instances: an event removed by a write to kprobe_events, which the host's dcache
    knows nothing of, is gone for the very next walk, and so is its group."""
    t = f"{real}/tracing"
    script = f"""
        cd /
        echo 'p:gone vfs_read' >> {t}/kprobe_events
        test -d {t}/events/kprobes/gone && echo made
        cat {t}/events/kprobes/gone/enable
        echo '-:gone' >> {t}/kprobe_events
        test -e {t}/events/kprobes/gone || echo event-gone
        test -e {t}/events/kprobes/gone/enable || echo file-gone
        test -e {t}/events/kprobes || echo group-gone
        echo 'p:gone vfs_write' >> {t}/kprobe_events
        cat {t}/events/kprobes/gone/format | grep -c 'print fmt'
        echo > {t}/kprobe_events
        test -e {t}/events/kprobes/gone || echo cleared
        mkdir {t}/instances/cached && test -f {t}/instances/cached/trace && echo inst
        rmdir {t}/instances/cached
        test -e {t}/instances/cached/trace || echo inst-gone
    """
    try:
        r = sh(script)
    finally:
        sh(f"echo > {t}/kprobe_events; rmdir {t}/instances/cached")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["made", "0", "event-gone", "file-gone", "group-gone", "1",
                                "cleared", "inst", "inst-gone"]


def test_real_a_caller_one_request_at_a_time_keeps_the_pool_small(real):
    """A thread counts as idle before it writes its reply: the caller that reply wakes
    makes its next request at once, and a thread idle already takes it.  Counted busy
    until its write returned, the thread made the pool grow by one at nearly every
    request (tens of threads for a loop of reads: the next request's thread holds
    the interpreter while it runs the system call, and the last one waits for it)."""
    pid, = daemon_pids(real)
    before = len(os.listdir(f"/proc/{pid}/task"))
    fd = os.open(f"{real}/tracing/tracing_on", os.O_RDONLY)
    try:
        for _ in range(3000):
            os.pread(fd, 4096, 0)
    finally:
        os.close(fd)
    assert len(os.listdir(f"/proc/{pid}/task")) <= before + 2


def test_fake_truncate_busy(fake):
    t = f"{fake}/tracing"
    assert sh(f"echo 'p:a vfs_read' > {t}/kprobe_events && echo 1 > {t}/tracing_on").returncode == 0
    r = sh(f"echo > {t}/kprobe_events")
    assert r.returncode == 2 and "Device or resource busy" in r.stderr
    assert sh(f"cat {t}/kprobe_events").stdout == "p:a vfs_read\n"
    assert sh(f"echo 0 > {t}/tracing_on && echo > {t}/kprobe_events").returncode == 0


def test_fake_requests_carry_the_callers_pid_and_comm(fake):
    r = sh(f"echo $$; echo 'p:a vfs_read' > {fake}/tracing/kprobe_events")
    pid = int(r.stdout.split()[0])
    openers = Path(f"{fake}/tracing/openers").read_text().splitlines()
    assert f"{pid} sh" in openers


def test_fake_one_write_is_one_request(fake):
    ev = f"{fake}/tracing/kprobe_events"
    lines = b"".join(b"p:e%05d vfs_read\n" % i for i in range(6000))
    assert 100_000 < len(lines) <= 128 * 1024
    fd = os.open(ev, os.O_WRONLY | os.O_APPEND)
    try:
        assert os.write(fd, lines) == len(lines)
    finally:
        os.close(fd)
    sizes = Path(f"{fake}/tracing/write_sizes").read_text().split()
    assert sizes[-1] == str(len(lines))


def test_fake_trace_pipe_blocks_until_data(fake):
    t = f"{fake}/tracing"
    reader = subprocess.Popen(["sh", "-c", f"head -n 1 {t}/trace_pipe"],
                              stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    assert reader.poll() is None              # blocked in read()
    assert sh(f"echo hello > {t}/trace_marker").returncode == 0
    out, _ = reader.communicate(timeout=10)
    assert out == "tracing_mark_write: hello\n"


def test_fake_trace_pipe_nonblocking(fake):
    fd = os.open(f"{fake}/tracing/trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(BlockingIOError):
            os.read(fd, 4096)
        assert sh(f"echo x > {fake}/tracing/trace_marker").returncode == 0
        assert os.read(fd, 4096) == b"tracing_mark_write: x\n"
    finally:
        os.close(fd)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_fake_trace_pipe_reader_can_be_killed(fake, sig):
    # SIGINT at its default in the child: a shell's background job inherits it ignored
    reader = subprocess.Popen(["cat", f"{fake}/tracing/trace_pipe"],
                              preexec_fn=_default_sigint)
    time.sleep(0.3)
    reader.send_signal(sig)
    assert reader.wait(timeout=10) == -sig
    # the daemon is still serving
    assert sh(f"cat {fake}/kprobes/enabled").stdout == "1\n"


def test_fake_readdir_and_getattr(fake):
    r = sh(f"ls -la {fake}/tracing")
    assert r.returncode == 0
    rows = {line.split()[-1]: line.split()[0] for line in r.stdout.splitlines()[1:]}
    assert rows["kprobe_events"] == "-rw-r-----"
    assert rows["trace_pipe"] == "-r--r-----"
    assert rows["events"] == "drwxr-x---"
    assert sorted(os.listdir(fake)) == ["kprobes", "proc", "tmp", "tracing"]
    r = sh(f"stat -c '%s %U %G' {fake}/tracing/kprobe_events")
    assert r.stdout == "0 root root\n"
    r = sh(f"touch {fake}/tracing/newfile")
    assert r.returncode == 1 and "Permission denied" in r.stderr
    r = sh(f"mkdir {fake}/tracing/instances")
    assert r.returncode == 1 and "Operation not permitted" in r.stderr


# ---- lifecycle ----------------------------------------------------------------------------
def test_help_everywhere():
    for args in ([], ["mount"], ["umount"]):
        r = run(REAL_CLI + args + ["--help"])
        assert r.returncode == 0 and "usage: kprobefs" in r.stdout
    assert "--workload" in run(REAL_CLI + ["mount", "--help"]).stdout


def test_mount_umount(mnt):
    mount(FAKE_CLI, mnt)
    (pid,) = daemon_pids(mnt)
    r = run(FAKE_CLI + ["mount", str(mnt)])
    assert r.returncode == 1 and "mount point busy" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = run(FAKE_CLI + ["umount", str(mnt)])
    assert r.returncode == 0 and not is_mounted(mnt)
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    r = run(FAKE_CLI + ["umount", str(mnt)])
    assert r.returncode == 1 and "not mounted" in r.stderr


def test_mount_creates_the_mount_point(tmp_path):
    path = tmp_path / "a" / "b"
    try:
        mount(FAKE_CLI, path)
        assert sh(f"cat {path}/kprobes/enabled").stdout == "1\n"
    finally:
        run(FAKE_CLI + ["umount", str(path)])
        cleanup(path)


def test_mount_point_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    r = run(FAKE_CLI + ["mount", str(f)])
    assert r.returncode == 1 and "not a directory" in r.stderr


def test_sigterm_unmounts(mnt):
    mount(FAKE_CLI, mnt)
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    assert not is_mounted(mnt)


def _holder(path):
    """A process whose working directory is in the mount: a lazy unmount leaves the
    mount alive for it (as a trace_pipe reader, or a copy in another namespace)."""
    proc = subprocess.Popen(["sh", "-c", f"cd {path}/kprobes && exec sleep 120"])
    assert wait_for(lambda: os.readlink(f"/proc/{proc.pid}/cwd").endswith("kprobes"))
    return proc


def test_sigterm_stops_a_daemon_whose_mount_stays_in_use(mnt):
    """After SIGTERM's lazy unmount a user still holds the mount: the daemon aborts the
    connection after a grace period and exits (its user gets ENOTCONN), rather than
    serve a mount nobody can reach by its path."""
    mount(FAKE_CLI, mnt)
    (pid,) = daemon_pids(mnt)
    holder = _holder(mnt)
    try:
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
        assert not is_mounted(mnt)
        with pytest.raises(OSError) as e:
            os.stat(f"/proc/{holder.pid}/cwd/")
        assert e.value.errno == 107     # ENOTCONN
    finally:
        holder.kill()
        holder.wait()


def test_a_stopping_daemon_leaves_a_newer_mount_at_its_path_alone(mnt):
    """A daemon whose mount was unmounted already (lazily, still held) is stopped while
    another daemon serves a new mount at the same path: the new mount stays."""
    mount(FAKE_CLI, mnt)
    (old,) = daemon_pids(mnt)
    holder = _holder(mnt)
    try:
        assert unmount(str(mnt), lazy=True) and not is_mounted(mnt)
        mount(FAKE_CLI, mnt)
        os.kill(old, signal.SIGTERM)
        assert wait_for(lambda: not os.path.exists(f"/proc/{old}"))
        assert is_mounted(mnt)
        assert sh(f"cat {mnt}/kprobes/enabled").stdout == "1\n"
    finally:
        holder.kill()
        holder.wait()
        run(FAKE_CLI + ["umount", str(mnt)])


def test_kill_9_then_mount_again(mnt):
    mount(FAKE_CLI, mnt)
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    with pytest.raises(OSError) as e:
        os.stat(mnt)
    assert e.value.errno == 107  # ENOTCONN: the stale mount a killed daemon leaves
    mount(FAKE_CLI, mnt)
    assert sh(f"cat {mnt}/kprobes/enabled").stdout == "1\n"
    assert run(FAKE_CLI + ["umount", str(mnt)]).returncode == 0
    assert not is_mounted(mnt)


def test_umount_cleans_a_stale_mount(mnt):
    mount(FAKE_CLI, mnt)
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    r = run(FAKE_CLI + ["umount", str(mnt)])
    assert r.returncode == 0 and not is_mounted(mnt)


@pytest.mark.parametrize("abstract", [False, True])
def test_foreground_notifies_ready_and_stopping(mnt, tmp_path, abstract):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"kprobefs-test-{os.getpid()}-{time.monotonic_ns()}"
        sock.bind("\0" + name)
        address = "@" + name
    else:
        address = str(tmp_path / "notify")
        sock.bind(address)
    sock.settimeout(60)
    env = _env()
    env["NOTIFY_SOCKET"] = address
    proc = subprocess.Popen(FAKE_CLI + ["mount", "--foreground", str(mnt)], env=env,
                            stderr=subprocess.DEVNULL, cwd="/")
    try:
        # ready means answering: the files are there
        ready_then_stopping(proc, sock, mnt,
                            lambda: sh(f"cat {mnt}/kprobes/enabled").stdout == "1\n")
    finally:
        sock.close()


def test_sigint_in_the_foreground_unmounts(mnt):
    proc = subprocess.Popen(FAKE_CLI + ["mount", "--foreground", str(mnt)], env=_env(),
                            stderr=subprocess.DEVNULL, cwd="/")
    try:
        assert wait_for(lambda: is_mounted(mnt) and os.path.exists(mnt / "kprobes"))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_real_daemon_with_workload_lifecycle(mnt):
    mount(REAL_CLI, mnt, "--workload", "100", "--seed", "3", "--cpus", "2")
    assert sh(f"cat {mnt}/proc/version").stdout.startswith("Linux version")
    time.sleep(1.0)     # the workload runs meanwhile
    assert sh(f"cat {mnt}/kprobes/enabled").stdout == "1\n"
    (pid,) = daemon_pids(mnt)
    os.kill(pid, signal.SIGTERM)
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"))
    assert not is_mounted(mnt)


def test_a_new_mount_has_warmed_its_request_path_and_left_no_trace(mnt):
    """Readiness takes the path of `echo >> kprobe_events` and `cat` some rounds
    (Daemon._warm_up) before it is announced; an empty line changes nothing."""
    from kprobefs.daemon import Daemon
    mount(REAL_CLI, mnt)
    try:
        status = (mnt / "kprobefs/status").read_text()
        (line,) = [s for s in status.splitlines() if s.startswith("requests:")]
        # open, write and close, then open, read (twice: the second sees the end) and
        # close, every round
        # without them, a dozen (the readiness probe's stats and this read)
        assert Daemon.WARM_UP_ROUNDS >= 5
        assert int(line.split()[1]) >= 6 * Daemon.WARM_UP_ROUNDS
        for name in ("kprobe_events", "dynamic_events", "error_log", "trace"):
            text = (mnt / "tracing" / name).read_text()
            assert all(s.startswith("#") for s in text.splitlines()), (name, text)
    finally:
        run(REAL_CLI + ["umount", str(mnt)])


def test_boot_builds_the_grammars():
    """The daemon's first command does not build lark's parsers (about 50 ms)."""
    script = ("from kprobefs.daemon import Daemon\n"
              "from kprobefs.tracing.triggers import filter\n"
              "from kprobefs.tracing.events import probe_parser as parser\n"
              "Daemon('/nonexistent').boot()\n"
              "print(parser._lark.cache_info().currsize, filter._lark.cache_info().currsize)")
    r = run([sys.executable, "-c", script])
    assert (r.returncode, r.stdout.split()) == (0, ["1", "1"]), r.stderr
