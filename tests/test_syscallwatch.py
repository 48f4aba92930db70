"""Host system calls of ``kprobefs exec`` processes mirrored into their tasks
(kprobefs/seccomp.py, kprobefs/fs/syscallwatch.py, the gateway's mirror queue): the
filter program run by a small classic-BPF interpreter, notifications decoded, the
arguments read from a process's memory and fds, the gateway's ordering against the
fake kernel, and a real filter whose listener a watch takes (no FUSE; the mounted
scenarios are in test_exec.py)."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fs_fakes import FakeKernel, FakeTracer
from kprobefs import seccomp
from kprobefs.fs import Caller, Gateway, build_tree
from kprobefs.fs import callers as callers_module
from kprobefs.fs.syscallwatch import (
    MIRRORED, HostCall, HostProcess, SyscallWatch, host_call, socket_address,
)

ROOT = Path(__file__).resolve().parents[1]
I386 = 0x40000003
X32_BIT = 0x40000000


# ---- the filter ----------------------------------------------------------------------------
def run_filter(program: bytes, nr: int, arch: int = seccomp.AUDIT_ARCH_X86_64) -> int:
    """What the classic-BPF program returns for struct seccomp_data (nr, arch): the
    subset of opcodes a seccomp filter of ours may use."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[0] * 6)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:                                     # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code == 0x15:                                   # jeq #k, jt, jf
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x06:                                   # ret #k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


def test_the_filter_notifies_the_listed_x86_64_calls_and_allows_the_rest():
    program = seccomp.build_filter([81, 80])
    assert len(program) % 8 == 0
    assert run_filter(program, 80) == seccomp.SECCOMP_RET_USER_NOTIF
    assert run_filter(program, 81) == seccomp.SECCOMP_RET_USER_NOTIF
    for nr in (0, 2, 59, 79, 82, 257):
        assert run_filter(program, nr) == seccomp.SECCOMP_RET_ALLOW
    # another ABI: i386's chdir is 12, x32's carries bit 30
    assert run_filter(program, 80, arch=I386) == seccomp.SECCOMP_RET_ALLOW
    assert run_filter(program, 12, arch=I386) == seccomp.SECCOMP_RET_ALLOW
    assert run_filter(program, 80 | X32_BIT) == seccomp.SECCOMP_RET_ALLOW


def test_the_filter_of_the_mirror_table_and_its_limits():
    program = seccomp.build_filter(sorted(MIRRORED))
    assert all(run_filter(program, nr) == seccomp.SECCOMP_RET_USER_NOTIF for nr in MIRRORED)
    many = seccomp.build_filter(range(1000, 1250))
    assert run_filter(many, 1249) == seccomp.SECCOMP_RET_USER_NOTIF
    assert run_filter(many, 999) == seccomp.SECCOMP_RET_ALLOW
    with pytest.raises(ValueError):
        seccomp.build_filter([])
    with pytest.raises(ValueError):
        seccomp.build_filter(range(251))


def test_a_notification_decodes():
    raw = struct.pack("<QII" "iIQ6Q", 0x1122334455667788, 4242, 0, 80,
                      seccomp.AUDIT_ARCH_X86_64, 0x401000, 0x7ffd0000, 1, 2, 3, 4, 5)
    assert len(raw) == seccomp.NOTIF_SIZE == 80
    note = seccomp.decode_notification(raw)
    assert note == seccomp.Notification(0x1122334455667788, 4242, 0, 80,
                                        seccomp.AUDIT_ARCH_X86_64, 0x401000,
                                        (0x7ffd0000, 1, 2, 3, 4, 5))


# ---- the arguments -------------------------------------------------------------------------
def _note(nr: int, *args: int, arch: int = seccomp.AUDIT_ARCH_X86_64):
    args = args + (0,) * (6 - len(args))
    return seccomp.Notification(7, os.getpid(), 0, nr, arch, 0, args)


def _process(mapping=lambda pid, path, cwd: path):
    return HostProcess(os.getpid(), mapping)


def test_chdir_reads_its_path_from_the_process_memory():
    buf = ctypes.create_string_buffer(b"/sys/kernel/tracing")
    seen = []

    def mapping(pid, path, cwd):
        seen.append((pid, path, cwd))
        return "/emulated" + path

    call = host_call(_note(80, ctypes.addressof(buf)), _process(mapping))
    assert call == HostCall(os.getpid(), "chdir", ("/emulated/sys/kernel/tracing",),
                            os.getcwd())
    assert seen == [(os.getpid(), "/sys/kernel/tracing", os.getcwd())]


def test_fchdir_is_mirrored_as_the_chdir_of_its_directory(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        call = host_call(_note(81, fd), _process())
    finally:
        os.close(fd)
    assert call == HostCall(os.getpid(), "chdir", (str(tmp_path),), os.getcwd())


def test_directories_outside_the_mount_and_other_calls_are_not_mirrored():
    buf = ctypes.create_string_buffer(b"/home")
    outside = _process(lambda pid, path, cwd: None)
    assert host_call(_note(80, ctypes.addressof(buf)), outside) is None
    empty = ctypes.create_string_buffer(b"")
    assert host_call(_note(80, ctypes.addressof(empty)), _process()) is None
    assert host_call(_note(2, ctypes.addressof(buf)), _process()) is None
    assert host_call(_note(80, ctypes.addressof(buf), arch=I386), _process()) is None


def test_the_mirrored_calls_are_the_emulated_kernels():
    from kprobefs.machine import abi
    assert {m.name for m in MIRRORED.values()} <= set(abi.SYSCALLS)
    assert all(nr == m.nr for nr, m in MIRRORED.items())


def test_fchdir_of_a_socket_is_not_mirrored():
    import socket
    with socket.socket() as s:
        with pytest.raises(OSError):
            host_call(_note(81, s.fileno()), _process())


def test_unreadable_arguments_raise():
    with pytest.raises(OSError) as e:
        host_call(_note(80, 0), _process())
    assert e.value.errno == errno.EFAULT
    with pytest.raises(OSError):
        host_call(_note(81, 1 << 20), _process())        # no such fd
    long = ctypes.create_string_buffer(b"x" * 5000)
    with pytest.raises(OSError) as e:
        seccomp.read_string(os.getpid(), ctypes.addressof(long))
    assert e.value.errno == errno.ENAMETOOLONG


def test_a_string_ending_at_a_page_end_reads():
    page = 4096
    buf = ctypes.create_string_buffer(3 * page)
    start = (ctypes.addressof(buf) + page - 1) // page * page
    text = b"/sys/kernel/tracing"
    ctypes.memmove(start + page - len(text) - 1, text + b"\0", len(text) + 1)
    assert seccomp.read_string(os.getpid(), start + page - len(text) - 1) == text


def test_the_socket_is_named_after_the_mount_point():
    assert socket_address("/run/kprobefs") == b"\0kprobefs/syscalls/run/kprobefs"
    long = socket_address("/run/" + "x" * 200)
    assert len(long) <= 108 and long != socket_address("/run/" + "y" * 200)


# ---- the gateway ---------------------------------------------------------------------------
@pytest.fixture
def gateway():
    kernel = FakeKernel()
    hostfs = build_tree(kernel, engine=kernel.kprobes, tracer=FakeTracer())
    kernel.hostfs = hostfs
    gateway = Gateway(kernel, hostfs, timeout=5.0, wait_slice=0.05)
    yield gateway
    gateway.close()


def _calls_of(kernel, pid):
    return [name for p, _comm, name in kernel.syscalls if p == pid]


def test_a_mirrored_call_runs_before_the_processs_next_request(gateway, sleeper):
    gateway.mirror(HostCall(sleeper.pid, "chdir", ("/sys/kernel/tracing",), "/"))
    assert sleeper.pid not in gateway.tasks()      # queued only
    gateway.getattr("/proc", Caller(sleeper.pid))
    assert _calls_of(gateway.kernel, sleeper.pid)[-2:] == ["chdir", "newfstatat"]
    assert gateway.kernel.tasks[sleeper.pid].cwd == "/sys/kernel/tracing"
    assert gateway.stats["mirrored"] == 1


def test_the_status_counts_the_mirrored_calls(gateway, sleeper):
    from kprobefs.health import status_text
    assert "mirrored" not in status_text(gateway.kernel, gateway=gateway)
    gateway.mirror(HostCall(sleeper.pid, "chdir", ("/sys/kernel/tracing",), "/"))
    gateway.flush_mirrored(sleeper.pid)
    assert "\nmirrored: 1 system calls of `kprobefs exec` processes\n" in \
        status_text(gateway.kernel, gateway=gateway)


def test_flushing_makes_the_task_and_submits_in_order(gateway, sleeper):
    for path in ("/sys/kernel/tracing", "events", "/sys/kernel/debug"):
        gateway.mirror(HostCall(sleeper.pid, "chdir", (path,), "/"))
    gateway.flush_mirrored(sleeper.pid)
    kernel = gateway.kernel
    kernel.run_slice()
    assert _calls_of(kernel, sleeper.pid).count("chdir") == 3
    assert kernel.tasks[sleeper.pid].cwd == "/sys/kernel/debug"
    gateway.flush_mirrored(sleeper.pid)                # nothing left: nothing more
    kernel.run_slice()
    assert _calls_of(kernel, sleeper.pid).count("chdir") == 3


def test_calls_of_a_process_that_is_gone_are_dropped(gateway):
    p = subprocess.Popen(["true"])
    gateway.mirror(HostCall(p.pid, "chdir", ("/sys/kernel/tracing",), "/"))
    p.wait()
    gateway.flush_mirrored(p.pid)
    assert p.pid not in gateway.tasks()


def test_mirroring_never_waits_on_the_machine(gateway, sleeper):
    """While the task of a process is being made (the machine does not answer), its
    calls still queue at once."""
    release, spawning = threading.Event(), threading.Event()
    spawn = gateway.kernel.spawn

    def slow_spawn(*args, **kw):
        spawning.set()
        release.wait(30)
        return spawn(*args, **kw)

    gateway.kernel.spawn = slow_spawn
    gateway.mirror(HostCall(sleeper.pid, "chdir", ("/sys/kernel/tracing",), "/"))
    worker = threading.Thread(target=gateway.flush_mirrored, args=(sleeper.pid,))
    worker.start()
    assert spawning.wait(30)
    gateway.mirror(HostCall(sleeper.pid, "chdir", ("/sys/kernel/debug",), "/"))
    assert not release.is_set()                        # mirror() returned meanwhile
    release.set()
    worker.join(30)
    gateway.getattr("/proc", Caller(sleeper.pid))
    assert gateway.kernel.tasks[sleeper.pid].cwd == "/sys/kernel/debug"


def test_emulated_directory_names(gateway, monkeypatch):
    mount = {"/sys/kernel/tracing": "/tracing", "/sys/kernel/debug": "/"}

    def relative(_pid, path):
        for point, root in mount.items():
            if path == point or path.startswith(point + "/"):
                return root.rstrip("/") + path[len(point):] or "/"
        return None

    monkeypatch.setattr(callers_module, "mount_relative_of", relative)
    name = gateway.emulated_directory
    assert name(1, "/sys/kernel/tracing", "/") == "/sys/kernel/tracing"
    assert name(1, "/sys/kernel/tracing/", "/") == "/sys/kernel/tracing/"
    assert name(1, "/sys/kernel/debug/tracing", "/") == "/sys/kernel/tracing"
    assert name(1, "events", "/sys/kernel/tracing") == "events"
    assert name(1, "..", "/sys/kernel/tracing/events") == ".."
    assert name(1, "kernel/tracing", "/sys") == "/sys/kernel/tracing"
    assert name(1, "/home", "/sys/kernel/tracing") is None
    assert name(1, "..", "/sys/kernel/tracing") is None


# ---- a real filter -------------------------------------------------------------------------
class RecordingGateway:
    def __init__(self):
        self.calls, self.marked = [], []
        self.mirrored = threading.Condition()

    def mark_mirrored(self, pid):
        self.marked.append(pid)

    def mirror(self, call):
        with self.mirrored:
            self.calls.append(call)
            self.mirrored.notify_all()

    def flush_mirrored(self, pid):
        pass

    def emulated_directory(self, pid, path, cwd):
        return None if path.startswith("/proc") else path


CHILD = r"""
import os, sys
from kprobefs.fs.syscallwatch import hand_over
print(hand_over(sys.argv[1]), flush=True)
os.chdir("/usr")
os.chdir("lib")
os.chdir("/proc")
os.fchdir(os.open("/", os.O_RDONLY))
print(os.getcwd(), flush=True)
sys.stdin.readline()        # the watch is closed now
try:
    os.chdir("/usr")
    print("ok", flush=True)
except OSError as e:
    print(e.errno, flush=True)
"""


def _status(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        return "".join(line for line in f if line.startswith("Seccomp:"))


def test_a_real_filter_hands_the_tools_calls_over(tmp_path):
    watch_gateway = RecordingGateway()
    mountpoint = str(tmp_path)
    watch = SyscallWatch(watch_gateway, mountpoint)
    assert watch.start()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.Popen([sys.executable, "-c", CHILD, mountpoint], cwd="/",
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        try:
            first = child.stdout.readline().strip()
            if first.startswith("no seccomp"):
                pytest.skip(first)
            assert first == "None"
            assert child.stdout.readline().strip() == "/"    # every call went on
            assert watch_gateway.marked == [child.pid]
            assert [(c.pid, c.name, c.args, c.cwd) for c in watch_gateway.calls] == [
                (child.pid, "chdir", ("/usr",), "/"),
                (child.pid, "chdir", ("lib",), "/usr"),
                (child.pid, "chdir", ("/",), "/proc"),       # fchdir; /proc not mirrored
            ]
            assert watch.stats["notifications"] == 4 and watch.stats["skipped"] == 1
        finally:
            watch.close()
        # No listener is left: the host kernel fails the notified call (ENOSYS).
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == str(errno.ENOSYS)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_without_a_daemon_nothing_is_installed(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = ("import sys; from kprobefs.fs.syscallwatch import hand_over; "
              "print(hand_over(sys.argv[1])); "
              "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["None", "0"], done.stderr
