"""An in-process mount for the robustness tests: the real daemon (kprobefs.daemon.Daemon,
the bundled kernel, its engine and tracer) serving a real FUSE mount from a thread of
the test process, so a test drives the files with ordinary system calls and can also
look at the kernel object behind them.

libfuse installs its own SIGINT/SIGTERM/SIGHUP handlers while it serves; they are put
back to Python's once the mount ends.  Skipped without /dev/fuse, except under CI=true.

While a mount is served, subprocess forks rather than vforks: a vforked child shares
the test process's memory and holds it suspended, the GIL held by the thread that
started it, until the child execs; when another thread had a file of the mount open,
the child's close of it on the way (close_fds) is a FUSE FLUSH that only this process's
threads can answer, and they wait for the GIL: the whole test process hung.
"""

from __future__ import annotations

import ctypes.util
import errno
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kprobefs.daemon import Daemon, unmount


def fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not ctypes.util.find_library("fuse"):
        return "libfuse2 is missing (apt-get install fuse libfuse2)"
    if os.geteuid() != 0:
        return "mounting needs root here"
    return None


def need_fuse() -> None:
    need(fuse_missing())


def need(reason: str | None) -> None:
    """Skips the test for reason, what this machine lacks (None: nothing); under CI=true
    fails it instead."""
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"FUSE tests cannot run under CI=true: {reason}")
        pytest.skip(reason)


def is_mounted(path) -> bool:
    with open("/proc/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def ready_then_stopping(proc: subprocess.Popen, sock, mnt, answers) -> None:
    """A ``mount --foreground`` daemon proc, started with $NOTIFY_SOCKET bound by sock:
    it says READY=1 once answers() (a look at its files) holds, STOPPING=1 on SIGTERM,
    then exits 0 with nothing left mounted at mnt.  It is killed if it did not end."""
    try:
        assert "READY=1" in sock.recv(4096).decode().splitlines()
        assert answers()
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in sock.recv(4096).decode().splitlines()
        assert proc.wait(timeout=30) == 0
        assert not is_mounted(mnt)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def abort_connection(path) -> None:
    """Aborts the FUSE connection behind the mount at path (fusectl), if it is one."""
    conns = "/sys/fs/fuse/connections"
    if not os.listdir(conns) if os.path.isdir(conns) else True:
        subprocess.run(["mount", "-t", "fusectl", "none", conns], capture_output=True)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path) and " - fuse" in line:
                minor = fields[2].split(":")[1]
                try:
                    with open(f"{conns}/{minor}/abort", "w") as a:
                        a.write("1")
                except OSError:
                    pass


class InProcessMount:
    """A Daemon serving ``mountpoint`` from a thread; ``.kernel``, ``.tracer``,
    ``.engine`` are the live objects behind the files."""

    def __init__(self, mountpoint: Path, workload_rate: float = 0.0, seed: int = 0,
                 request_timeout: float = 30.0, cpus: int = 2):
        self.path = Path(mountpoint)
        self.path.mkdir(parents=True, exist_ok=True)
        self.daemon = Daemon(str(self.path), cpus=cpus, seed=seed,
                             workload_rate=workload_rate, request_timeout=request_timeout)
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self._saved = {}
        self._tracer = None
        self._vfork = None

    @property
    def kernel(self):
        return self.daemon.kernel

    @property
    def engine(self):
        return self.daemon.kernel.kprobes

    @property
    def tracer(self):
        return self._tracer

    def start(self, timeout: float = 60.0) -> "InProcessMount":
        captured = {}

        def tracer_factory(kernel, engine):
            from kprobefs.daemon import make_tracer
            captured["tracer"] = make_tracer(kernel, engine)
            return captured["tracer"]

        self.daemon._tracer_factory = tracer_factory
        self._vfork = getattr(subprocess, "_USE_VFORK", None)
        if self._vfork is not None:
            subprocess._USE_VFORK = False
        self.daemon.boot()
        self._tracer = captured["tracer"]
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._saved[sig] = signal.getsignal(sig)

        def serve():
            try:
                self.daemon.serve()
            except BaseException as e:  # noqa: BLE001 - reported by stop()
                self.error = e

        self._thread = threading.Thread(target=serve, name="inprocess-fuse", daemon=True)
        self._thread.start()
        if not self.daemon.ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the mount did not become ready: {self.error!r}")
        return self

    def p(self, rel: str) -> str:
        return str(self.path / rel)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        # As SIGTERM stops it: unmounted lazily, the connection aborted after a short
        # grace if the mount stays in use.  A copy of the mount in another mount
        # namespace (any made on the machine while it was up, as kprobefs exec makes
        # them) keeps it in use: a plain umount here left the thread waiting the whole
        # timeout (35 s of teardown).
        self.daemon.stop()
        self._thread.join(timeout)
        if self._thread.is_alive() or is_mounted(self.path):
            # Busy (a file left open): abort the connection, so no thread of this
            # process is left waiting on a server that is gone, then detach it.
            abort_connection(self.path)
            unmount(str(self.path), lazy=True)
            self._thread.join(5)
        self._thread = None
        if self._vfork is not None:
            subprocess._USE_VFORK = self._vfork
        for sig, handler in self._saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# ---- file helpers (one write(2) per call, errno kept) -----------------------------------
def write(path: str, data: bytes | str, append: bool = True, trunc: bool = False,
          offset: int | None = None) -> int:
    """One write(2) of data to path; returns 0 or the errno it failed with (open or
    write)."""
    if isinstance(data, str):
        data = data.encode()
    flags = os.O_WRONLY | (os.O_APPEND if append and offset is None else 0) | (
        os.O_TRUNC if trunc else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return e.errno
    try:
        if offset is None:
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
    return 0


def read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


__all__ = ["InProcessMount", "need_fuse", "fuse_missing", "is_mounted", "write", "read",
           "wait_for", "errno"]
