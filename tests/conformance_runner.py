"""Runs Linux 6.1's ftrace selftests (tools/testing/selftests/ftrace) against a kprobefs
mount, unmodified.

The selftests come from Debian's ``linux-source-6.1`` package, installed at test time when
missing; only ``tools/testing/selftests/ftrace`` is unpacked, into a cache directory
(``$KPROBEFS_CACHE`` or ``~/.cache/kprobefs``).  Nothing of the kernel is kept in this
repository.

Each case runs as the kernel's runner runs it (``tests/conformance_case.sh``): in the
tracing directory, with ``test.d/functions`` sourced, the ``# requires:`` line checked,
``initialize_ftrace``, then the case sourced under ``set -e``; results by the same codes
and real-time signals.  Each case runs in a private mount namespace (``unshare -m``) where
the mount's ``proc/kallsyms``, ``proc/version``, ``dev/null`` and ``tmp`` are bound over
the host's ``/proc/kallsyms``, ``/proc/version``, ``/dev/null`` and ``/tmp``.

Standalone: ``python3 tests/conformance_runner.py [CASE-GLOB...]`` prints one line per case
and exits 1 if any case failed.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASE_SCRIPT = HERE / "conformance_case.sh"

SOURCE_PACKAGE = "linux-source-6.1"
SOURCE_TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
SELFTEST_MEMBER = "linux-source-6.1/tools/testing/selftests/ftrace"

#: The test directories this project answers for: kprobe events and dynamic events.
CASE_DIRS = ("kprobe", "dynevent")

#: ftracetest's result codes.
RESULTS = {0: "PASS", 1: "FAIL", 2: "UNRESOLVED", 3: "UNTESTED", 4: "UNSUPPORTED",
           5: "XFAIL"}

CASE_TIMEOUT = 300


class RunnerError(Exception):
    """The selftests could not be prepared or the mount could not be made."""


# ---- the selftests -------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("KPROBEFS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kprobefs")
    return Path(base)


def _package_version() -> str | None:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", SOURCE_PACKAGE],
                         capture_output=True, text=True)
    words = out.stdout.split()
    if out.returncode == 0 and words[:3] == ["install", "ok", "installed"] and len(words) > 3:
        return words[3]
    return None


def _install_source() -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update", "-qq"],
                 ["apt-get", "install", "-y", "-qq", SOURCE_PACKAGE]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RunnerError(f"{' '.join(argv)} failed: {done.stderr.strip()[-500:]}")


def selftest_dir() -> Path:
    """The unpacked ``tools/testing/selftests/ftrace`` of the installed linux-source-6.1,
    installing the package and unpacking the directory first if needed."""
    version = _package_version()
    if version is None or not SOURCE_TARBALL.exists():
        _install_source()
        version = _package_version()
        if version is None or not SOURCE_TARBALL.exists():
            raise RunnerError(f"{SOURCE_PACKAGE} installed but {SOURCE_TARBALL} is missing")
    root = cache_dir() / f"linux-source-{version}"
    target = root / SELFTEST_MEMBER
    stamp = root / ".unpacked"
    if stamp.exists() and (target / "test.d" / "functions").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    prefix = SELFTEST_MEMBER + "/"
    with tarfile.open(SOURCE_TARBALL, "r:xz") as tar:
        members = [m for m in tar if m.name.startswith(prefix) or m.name == SELFTEST_MEMBER]
        if not members:
            raise RunnerError(f"{SOURCE_TARBALL} has no {SELFTEST_MEMBER}")
        tar.extractall(root, members=members, filter="tar")
    stamp.write_text(version + "\n")
    return target


def list_cases(selftests: Path, patterns: list[str] | None = None) -> list[str]:
    """Case names as ``DIR/NAME.tc`` relative to test.d, sorted as ftracetest sorts."""
    cases = []
    for sub in CASE_DIRS:
        for path in sorted((selftests / "test.d" / sub).glob("*.tc")):
            name = f"{sub}/{path.name}"
            if not patterns or any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path.name, p)
                                   for p in patterns):
                cases.append(name)
    return cases


# ---- the mount -----------------------------------------------------------------------------
def _cli_env() -> dict:
    import kprobefs
    parent = str(Path(kprobefs.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NOTIFY_SOCKET", None)
    return env


class Mount:
    """A kprobefs daemon mounted on a fresh directory, for a ``with`` block."""

    def __init__(self, log_file: Path | None = None):
        # Not under /tmp: the cases see the emulated kernel's /tmp there.
        self.path = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-", dir="/run"))
        self.log_file = log_file

    def __enter__(self) -> "Mount":
        argv = [sys.executable, "-m", "kprobefs", "mount", str(self.path)]
        if self.log_file is not None:
            argv += ["--log-file", str(self.log_file)]
        done = subprocess.run(argv, env=_cli_env(), cwd="/", capture_output=True,
                              text=True, timeout=120)
        if done.returncode != 0:
            raise RunnerError(f"kprobefs mount failed: {done.stderr.strip()}")
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run([sys.executable, "-m", "kprobefs", "umount", str(self.path)],
                       env=_cli_env(), cwd="/", capture_output=True, timeout=120)
        try:
            self.path.rmdir()
        except OSError:
            pass


# ---- running cases -------------------------------------------------------------------------
@dataclass(frozen=True)
class CaseResult:
    case: str
    code: int
    log: str

    @property
    def result(self) -> str:
        return RESULTS.get(self.code, "UNDEFINED")

    def line(self) -> str:
        return f"{self.case}: {self.result}"


@functools.lru_cache(maxsize=1)
def shim_dir() -> Path:
    """The modprobe/rmmod shims, copied out of the source tree: a case's namespace has the
    emulated kernel's /tmp over the host's, which would hide a checkout under /tmp."""
    target = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-bin-", dir="/run"))
    for shim in (HERE / "conformance_bin").iterdir():
        shutil.copy2(shim, target / shim.name)
    return target


def run_case(mount: Path, selftests: Path, case: str, log_dir: Path) -> CaseResult:
    """Runs one case (``DIR/NAME.tc``) in its own mount namespace."""
    log_file = log_dir / (case.replace("/", "-") + ".log")
    argv = ["unshare", "-m", "--propagation", "private", "sh", str(CASE_SCRIPT), str(mount),
            str(selftests), str(selftests / "test.d" / case), str(log_file)]
    # modprobe/rmmod shims that load the project's modules through the mount's control.
    env = dict(os.environ, KPROBEFS_MOUNT=str(mount),
               PATH=str(shim_dir()) + os.pathsep + os.environ.get("PATH", ""))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CASE_TIMEOUT,
                              cwd="/", env=env)
        lines = done.stdout.split()
        code = int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() \
            else -1
        extra = "" if code >= 0 else f"\n[runner exit {done.returncode}] {done.stderr}"
    except subprocess.TimeoutExpired:
        code, extra = 1, f"\n[timed out after {CASE_TIMEOUT}s]"
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    return CaseResult(case, code, log + extra)


def run_all(patterns: list[str] | None = None, out=sys.stdout) -> list[CaseResult]:
    selftests = selftest_dir()
    cases = list_cases(selftests, patterns)
    log_dir = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-logs-"))
    results = []
    with Mount(log_dir / "daemon.log") as mount:
        for case in cases:
            result = run_case(mount.path, selftests, case, log_dir)
            print(result.line(), file=out, flush=True)
            results.append(result)
    print(f"logs: {log_dir}", file=out)
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))    # the source tree's kprobefs, as pytest sees it
    outcome = run_all(sys.argv[1:] or None)
    sys.exit(1 if any(r.result in ("FAIL", "UNDEFINED") for r in outcome) else 0)
