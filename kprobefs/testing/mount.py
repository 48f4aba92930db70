"""A kprobefs mount for tests: started with the ``kprobefs`` command (``python -m kprobefs``
of this interpreter), reset to a clean tracefs between tests, commands run under
``kprobefs exec``, and the daemon's log.  Nothing here imports the daemon: it is driven
through its command line and its files only, as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from .errors import MountError
from .reset import TracefsReset

__all__ = ["KprobefsMount", "MountError", "fuse_missing"]


def fuse_missing() -> str | None:
    """Why this machine cannot mount kprobefs, or None when it can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "mounting needs root, or fusermount3 or fusermount"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse cannot be opened by this user"
    return None


def _kprobefs_command() -> list[str]:
    """This interpreter's kprobefs: the installed package, or the source tree this
    module is in (found through PYTHONPATH, set in _env)."""
    return [sys.executable, "-m", "kprobefs"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    package_parent = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = package_parent + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("NOTIFY_SOCKET", None)
    return env


def _open_in(root: Path) -> list[str]:
    """This process's open files under root."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root) + "/"):
            out.append(target)
    return out


class KprobefsMount:
    """One kprobefs mount at ``root``.

    ``KprobefsMount(root, cpus=2, workload=0.0, seed=0).start()`` mounts a new daemon
    (``stop()`` unmounts it); ``KprobefsMount(root, reuse=True)`` uses a mount that is
    already there and never unmounts it.  Usable as a context manager."""

    def __init__(self, root: str | os.PathLike | None = None, *, cpus: int = 2,
                 workload: float = 0.0, seed: int = 0, reuse: bool = False,
                 log_file: str | os.PathLike | None = None, timeout: float = 120.0):
        self._scratch = None
        if root is None:
            self._scratch = tempfile.mkdtemp(prefix="kprobefs-")
            root = os.path.join(self._scratch, "mnt")
        self.root = Path(root).absolute()
        self.cpus, self.workload, self.seed = cpus, workload, seed
        self.reuse = reuse
        self.timeout = timeout
        if log_file is None and not reuse:
            log_file = (Path(self._scratch) if self._scratch else self.root.parent) / (
                self.root.name + ".log")
        self.log_file = Path(log_file) if log_file else None
        self.started = False
        self._reset: TracefsReset | None = None

    @property
    def tracing(self) -> Path:
        return self.root / "tracing"

    # -- life
    def start(self) -> "KprobefsMount":
        """Mounts (or, with reuse, checks that the mount answers); raises MountError."""
        if self.reuse:
            if not (self.tracing / "kprobe_events").exists():
                raise MountError(f"{self.root}: no kprobefs mount to reuse there")
            return self
        argv = _kprobefs_command() + [
            "mount", str(self.root), "--cpus", str(self.cpus), "--workload",
            str(self.workload), "--seed", str(self.seed), "--log-level", "INFO",
            "--log-file", str(self.log_file)]
        r = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd="/",
                           stdin=subprocess.DEVNULL, timeout=self.timeout)
        if r.returncode != 0:
            raise MountError(f"kprobefs mount failed: {r.stderr.strip() or r.returncode}")
        self.started = True
        return self

    def stop(self) -> None:
        """Closes what the reset keeps open and unmounts a mount this object started."""
        if self._reset is not None:
            self._reset.close()
            self._reset = None
        if not self.started:
            return
        self.started = False
        # The host drops an inotify watch's hold on its directory a moment after the
        # descriptor is closed: until then the mount is busy.
        deadline = time.monotonic() + 5.0
        while True:
            r = subprocess.run(_kprobefs_command() + ["umount", str(self.root)],
                               capture_output=True, text=True, env=_env(), cwd="/",
                               stdin=subprocess.DEVNULL, timeout=self.timeout)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        held = _open_in(self.root)
        subprocess.run(["umount", "-l", str(self.root)], capture_output=True)
        raise MountError(f"kprobefs umount failed: {r.stderr.strip()}; detached it lazily"
                         + (f"; this process still has open: {', '.join(held)}" if held
                            else ""))

    def __enter__(self) -> "KprobefsMount":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- tests
    def reset(self) -> list[str]:
        """Brings the tracefs back to the state ftracetest's ``initialize_ftrace``
        leaves (see :class:`~kprobefs.testing.reset.TracefsReset`); returns what it had
        to change.  Raises ResetError when something cannot be reset."""
        if self._reset is None:
            self._reset = TracefsReset(self.root)
        return self._reset.reset()

    def exec(self, command: str | Sequence[str], *, check: bool = False,
             timeout: float | None = 60.0, **kwargs) -> subprocess.CompletedProcess:
        """Runs ``command`` (a shell line, or an argv) under ``kprobefs exec``, where
        Linux tools find this mount as /sys/kernel/tracing and /sys/kernel/debug, and
        returns the CompletedProcess, output captured as text unless ``kwargs`` say
        otherwise."""
        argv = ["sh", "-c", command] if isinstance(command, str) else list(command)
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(_kprobefs_command() + ["exec", str(self.root), "--", *argv],
                              check=check, timeout=timeout, env=kwargs.pop("env", _env()),
                              **kwargs)

    def log_size(self) -> int:
        try:
            return self.log_file.stat().st_size if self.log_file else 0
        except OSError:
            return 0

    def log_text(self, start: int = 0) -> str:
        """The daemon's log from byte ``start`` on ("" when it has none)."""
        if self.log_file is None:
            return ""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(start)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def describe(self) -> str:
        how = "reused" if self.reuse else (
            f"--cpus {self.cpus} --workload {self.workload:g} --seed {self.seed}")
        return f"kprobefs at {self.root} ({how})"

