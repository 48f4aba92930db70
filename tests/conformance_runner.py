"""Runs Linux 6.1's ftrace selftests (tools/testing/selftests/ftrace) against a kprobefs
mount, unmodified.

The selftests come from Debian's ``linux-source-6.1`` package, installed at test time when
missing; only ``tools/testing/selftests/ftrace`` is unpacked, into a cache directory
(``$KPROBEFS_CACHE`` or ``~/.cache/kprobefs``).  Nothing of the kernel is kept in this
repository.

Two ways to run them:

- ``ftracetest`` itself (:func:`run_ftracetest`, tests/test_torture.py and
  tests/test_conformance.py): ``cd SELFTESTS && kprobefs exec --kernel-scratch MOUNT --
  ./ftracetest -k -l LOGS``, the unmodified harness with nothing else prepared.  The
  runner reads its output as it comes: a case that has not ended TIMEOUT seconds after
  ftracetest printed its number is a hang, and ftracetest is killed with everything in
  its session (the later cases are then not run; ftracetest has no time limit of its
  own in 6.1).  The cases' names come from the logs ftracetest keeps with ``-k``.
  After the run: the daemon answers at once (``tracing/README`` within 5 s), and after
  the suite's own reset (ftracetest's ``finish_ftrace``), ``tracing/kprobe_events``
  and ``kprobes/list`` are empty.

- Case by case, by this project's runner (``tests/conformance_case.sh``): each case in
  the tracing directory, with ``test.d/functions`` sourced, the ``# requires:`` line
  checked, ``initialize_ftrace``, then the case sourced under ``set -e``; results by
  ftracetest's codes and real-time signals; each under ``kprobefs exec
  --kernel-scratch`` (the same namespace as above).  Torture mode (``--all``): every
  case of ``test.d`` but ``selftest/``, against one daemon, in ftracetest's order or
  shuffled by a seed, with a time limit per case (an overrun is killed with everything
  in its session and counted as a hang; processes still there afterwards, typically
  in state D inside a FUSE request, are recorded), and after each case the checks
  above; a daemon that stops answering is killed and replaced, so the rest of the
  suite still runs.  As ftracetest does, a second pass then runs the cases flagged
  ``# flags: instance`` again, each in a fresh ``tracing/instances`` directory (named
  ``CASE (instance)`` in the results).

In both, the namespace of ``kprobefs exec`` is what the cases need: the mount at
``/sys/kernel/tracing`` (found by the ``tracefs`` line of ``/proc/mounts``), the
emulated kernel's ``kallsyms`` and ``version`` in ``/proc``, its ``modprobe`` and
``rmmod`` (kprobefs.kmod), and with ``--kernel-scratch`` its ``/dev/null`` and ``/tmp``.
So the selftests and the logs are kept outside /tmp.

Standalone: ``python3 tests/conformance_runner.py [--all] [--shuffle SEED] [--timeout S]
[CASE-GLOB...]`` prints one line per case and exits 1 if any case failed (with ``--all``:
if any case hung or left the daemon unresponsive or a probe behind);
``python3 tests/conformance_runner.py --ftracetest [FTRACETEST-ARG...]`` runs
ftracetest itself and exits 1 if it failed or a check did.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
CASE_SCRIPT = HERE / "conformance_case.sh"

SOURCE_PACKAGE = "linux-source-6.1"
SOURCE_TARBALL = Path("/usr/src/linux-source-6.1.tar.xz")
SELFTEST_MEMBER = "linux-source-6.1/tools/testing/selftests/ftrace"

#: The test directories this project answers for: kprobe events, dynamic events and
#: trace instances.
CASE_DIRS = ("kprobe", "dynevent", "instances")
#: What a case's name gets in its instance pass (ftracetest prints " (instance) ").
INSTANCE_SUFFIX = " (instance)"
#: test.d's directory of ftracetest's own self-checks, left out of a whole-suite run.
SELFTEST_DIR = "selftest"

#: ftracetest's result codes.
RESULTS = {0: "PASS", 1: "FAIL", 2: "UNRESOLVED", 3: "UNTESTED", 4: "UNSUPPORTED",
           5: "XFAIL"}

#: Seconds a case may run before it is killed and counted as a hang.  Every case takes
#: under 2 s on a working daemon (trace_printk.tc's `sleep 1` is the longest).
CASE_TIMEOUT = 60.0
#: Seconds the daemon has to answer a read of tracing/README after a case.
ANSWER_TIMEOUT = 5.0
#: Where the logs of a run go (not under /tmp: see new_log_dir).
LOG_PARENT = "/var/tmp"


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


def list_cases(selftests: Path, patterns: list[str] | None = None,
               dirs: tuple[str, ...] | None = CASE_DIRS) -> list[str]:
    """Case names relative to test.d (``DIR/NAME.tc``, ``DIR/SUB/NAME.tc``) in
    ftracetest's order: it runs ``find test.d -name '*.tc' | sort``, which under the C
    locale (C.UTF-8 too) is the byte order of the paths.  ``dirs`` are the test.d
    directories to take (None: all but ``selftest/``); a pattern matches the name or
    its last component."""
    root = selftests / "test.d"
    subdirs = dirs if dirs is not None else sorted(
        p.name for p in root.iterdir() if p.is_dir() and p.name != SELFTEST_DIR)
    cases = []
    for sub in subdirs:
        for path in (root / sub).rglob("*.tc"):
            name = path.relative_to(root).as_posix()
            if not patterns or any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path.name, p)
                                   for p in patterns):
                cases.append(name)
    return sorted(cases, key=lambda name: name.encode())


def runs_in_instance(selftests: Path, case: str) -> bool:
    """Whether ftracetest runs case a second time inside an instance (its
    ``# flags:`` line names ``instance``)."""
    text = (selftests / "test.d" / case).read_text(errors="replace")
    return any(line.lstrip("#").strip().startswith("flags:") and "instance" in line
               for line in text.splitlines() if line.startswith("#"))


def with_instance_pass(selftests: Path, cases: list[str]) -> list[str]:
    """cases, then, as ftracetest's second pass, those flagged ``instance`` again (their
    names with INSTANCE_SUFFIX)."""
    return cases + [case + INSTANCE_SUFFIX for case in cases
                    if runs_in_instance(selftests, case)]


def shuffled(cases: list[str], seed: int) -> list[str]:
    """The cases in an order drawn from seed (the same seed, the same order)."""
    out = list(cases)
    random.Random(seed).shuffle(out)
    return out


def cannot_run() -> str | None:
    """Why the selftests cannot run on this machine, None when they can."""
    import ctypes.util
    if os.geteuid() != 0:
        return "the selftests need root"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if not ctypes.util.find_library("fuse"):
        return "libfuse2 is missing (apt-get install libfuse2)"
    for tool in ("mount", "sh", "cat", "dpkg-query"):
        if shutil.which(tool) is None:
            return f"{tool} is missing"
    return None


def prepare() -> tuple[Path | None, str | None]:
    """(the selftests directory, None), or (None, why they cannot run here): no FUSE,
    no root, a missing tool, or the selftests not to be had."""
    reason = cannot_run()
    if reason:
        return None, reason
    try:
        return selftest_dir(), None
    except RunnerError as e:
        return None, f"the selftests are not available: {e}"


# ---- processes ------------------------------------------------------------------------------
#: Children that could not be collected (stuck in a FUSE request); reaped later.
_LEFTOVERS: list = []


def _proc_stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, session id) of a process, None when it is gone.  From
    /proc/PID/status, not /proc/PID/stat: a read of stat waits for a process stuck in
    an exec (in state D in a FUSE request, say, anyone's), and so would the runner."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":\t", 1) for line in f.read().splitlines()
                          if b":\t" in line)
        return (fields[b"Name"].decode("utf-8", "replace"), fields[b"State"][:1].decode(),
                int(fields[b"NSsid"].split()[-1]))
    except (OSError, KeyError, ValueError):
        return None


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan") as f:
            return f.read().strip() or "-"
    except OSError:
        return "?"


def session_members(sid: int) -> list[int]:
    """Pids of the live (not zombie) processes of session sid."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None and st[2] == sid and st[1] != "Z":
                pids.append(int(entry))
    return pids


def kill_session(sid: int, grace: float = 3.0) -> list[str]:
    """SIGKILLs every process of session sid (a case started in its own session, and all
    it forked: its shells, its background jobs, its mount namespace's processes).
    Returns a description of those still alive after grace seconds: a process blocked
    in a FUSE request the daemon never answers stays in state D."""
    deadline = time.monotonic() + grace
    while True:
        pids = session_members(sid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    stuck = []
    for pid in session_members(sid):
        st = _proc_stat(pid)
        if st is not None:
            stuck.append(f"{pid} ({st[0]}) state {st[1]} in {_wchan(pid)}")
    return stuck


def _reap(procs: list) -> list:
    """Collects the exit of those of procs that ended; returns the others."""
    return [p for p in procs if p.poll() is None]


def bounded_read(path: Path, timeout: float = ANSWER_TIMEOUT) -> tuple[bool, str]:
    """(True, text) when `cat path` finishes within timeout, else (False, why).  The read
    runs in a child in its own session: a read the daemon never answers leaves that
    child stuck in the kernel, not the runner."""
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(["cat", str(path)], stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, cwd="/", start_new_session=True)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            stuck = kill_session(p.pid, grace=1.0)
            _LEFTOVERS.append(p)
            return False, (f"`cat {path}` did not finish in {timeout:g} s"
                           + (f" (stuck: {', '.join(stuck)})" if stuck else ""))
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
    if p.returncode != 0:
        return False, f"`cat {path}` failed ({p.returncode}): {text.strip()}"
    return True, text


def new_log_dir(prefix: str) -> Path:
    """A fresh directory for the logs of a run, outside /tmp: the cases run under
    ``kprobefs exec --kernel-scratch``, where /tmp is the emulated kernel's."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=LOG_PARENT))


def line_printer(config, prefix: str):
    """For a pytest run: a function that prints a line in pytest's terminal at once,
    past its output capture (the suite takes minutes; each case's line shows as it
    ends)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")

    def say(text: str) -> None:
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"{prefix} {text}")
    return say


# ---- the mount -----------------------------------------------------------------------------
def _cli_env() -> dict:
    import kprobefs
    parent = str(Path(kprobefs.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NOTIFY_SOCKET", None)
    return env


class Mount:
    """A kprobefs daemon mounted on a fresh directory, for a ``with`` block.

    The daemon runs in the foreground in a child of this process, so ``pid`` is the
    daemon's own: :meth:`restart` can kill a wedged one (SIGKILL, lazy unmount, which
    also frees the processes blocked in its requests) and mount a new one on the same
    directory.  ``log_file`` gets the daemon's log (at ``log_level``); restarted daemons
    log to ``NAME-2.log``, ``NAME-3.log``..."""

    READY_TIMEOUT = 120.0

    def __init__(self, log_file: Path | None = None, log_level: str = "INFO"):
        # Not under /tmp: the cases see the emulated kernel's /tmp there.
        self.path = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-", dir="/run"))
        self.log_file = log_file
        self.log_level = log_level
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def _log_path(self) -> Path | None:
        if self.log_file is None or self.starts <= 1:
            return self.log_file
        return self.log_file.with_name(
            f"{self.log_file.stem}-{self.starts}{self.log_file.suffix}")

    def start(self) -> None:
        self.starts += 1
        argv = [sys.executable, "-m", "kprobefs", "mount", "--foreground",
                "--log-level", self.log_level, str(self.path)]
        log_path = self._log_path()
        log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(argv, env=_cli_env(), cwd="/", stdout=log,
                                            stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        finally:
            if log is not subprocess.DEVNULL:
                log.close()
        deadline = time.monotonic() + self.READY_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RunnerError(f"kprobefs mount exited with {self.process.returncode}"
                                  f" (log: {log_path})")
            if os.path.ismount(self.path) and \
                    bounded_read(self.path / "tracing" / "README")[0]:
                return
            if time.monotonic() > deadline:
                self.stop(force=True)
                raise RunnerError(f"kprobefs mount did not answer in {self.READY_TIMEOUT:g} s")
            time.sleep(0.1)

    def stop(self, force: bool = False) -> None:
        """Unmounts (a clean `kprobefs umount`, else or when forced: SIGKILL and a lazy
        unmount) and collects the daemon."""
        if self.process is None:
            return
        if not force:
            done = subprocess.run([sys.executable, "-m", "kprobefs", "umount",
                                   str(self.path)], env=_cli_env(), cwd="/",
                                  capture_output=True, timeout=120)
            try:
                self.process.wait(30 if done.returncode == 0 else 0.1)
            except subprocess.TimeoutExpired:
                force = True
        if force:
            try:
                self.process.kill()
            except ProcessLookupError:
                pass
            from kprobefs.daemon import unmount     # the tree's, as pytest imports it
            unmount(str(self.path), lazy=True)
            self.process.wait(30)
        self.process = None

    def restart(self) -> None:
        """Replaces a wedged daemon with a fresh one on the same directory."""
        self.stop(force=True)
        self.start()

    def __enter__(self) -> "Mount":
        try:
            self.start()
        except BaseException:
            self._remove_dir()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self._remove_dir()

    def _remove_dir(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


# ---- running cases -------------------------------------------------------------------------
#: What the runner checks besides a case's own result, each a distinct failure.
HANG = "hang"                          # the case overran its time limit and was killed
CLEANUP_HANG = "cleanup-hang"          # the suite's reset after it overran
UNRESPONSIVE = "unresponsive"          # tracing/README did not answer within 5 s
KPROBE_EVENTS_LEFT = "kprobe_events-not-empty"    # after the case and the reset
KPROBES_LIST_LEFT = "kprobes/list-not-empty"      # a probe registered with no event
RESTARTED = "daemon-restarted"         # the daemon was replaced after this case
CANCELLED = "cancelled"                # ftracetest killed unfinished: the session ended
FAILURE_KINDS = (HANG, CLEANUP_HANG, UNRESPONSIVE, KPROBE_EVENTS_LEFT, KPROBES_LIST_LEFT)


@dataclass(frozen=True)
class Problem:
    """A failure the runner saw around a case (one of FAILURE_KINDS, or RESTARTED)."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


@dataclass(frozen=True)
class CaseResult:
    case: str
    code: int
    log: str
    elapsed: float = 0.0
    problems: tuple[Problem, ...] = ()

    @property
    def hung(self) -> bool:
        return any(p.kind == HANG for p in self.problems)

    @property
    def result(self) -> str:
        if self.hung:
            return "HANG"
        return RESULTS.get(self.code, "UNDEFINED")

    def line(self) -> str:
        return f"{self.case}: {self.result}"

    def summary(self) -> str:
        """line(), the time taken and every problem."""
        extra = "".join(f"; {p}" for p in self.problems)
        return f"{self.line()} ({self.elapsed:.1f} s){extra}"


def _run_limited(argv: list[str], out: Path, timeout: float, env: dict | None = None
                 ) -> tuple[int | None, list[str]]:
    """Runs argv in its own session with stdout and stderr into out, SIGHUP at its
    default action (the instance cases stop their loops with ``kill -1``, which a
    runner started under nohup would otherwise pass on ignored).  Returns (exit
    status, []) or, past timeout, (None, the processes the kill left behind)."""
    with open(out, "wb") as f:
        p = subprocess.Popen(["/usr/bin/env", "--default-signal=HUP", *argv], stdout=f,
                             stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, cwd="/", env=env,
                             start_new_session=True)
    try:
        return p.wait(timeout), []
    except subprocess.TimeoutExpired:
        stuck = kill_session(p.pid)
        try:
            p.wait(1.0)
        except subprocess.TimeoutExpired:
            _LEFTOVERS.append(p)
        return None, stuck


def run_case(mount: Path, selftests: Path, case: str, log_dir: Path,
             timeout: float = CASE_TIMEOUT) -> CaseResult:
    """Runs one case (``DIR/NAME.tc``, or ``DIR/NAME.tc (instance)`` for its run in a
    fresh instance) under ``kprobefs exec`` (its own mount namespace) in its own
    session, killed with all it started when it runs past timeout seconds (a HANG
    problem)."""
    name, instance = case, case.endswith(INSTANCE_SUFFIX)
    if instance:
        case = case[:-len(INSTANCE_SUFFIX)]
    stem = case.replace("/", "-") + ("-instance" if instance else "")
    log_file = log_dir / (stem + ".log")
    out_file = log_dir / (stem + ".out")
    argv = [sys.executable, "-m", "kprobefs", "exec", "--kernel-scratch", str(mount), "--",
            "sh", str(CASE_SCRIPT), str(selftests), str(selftests / "test.d" / case),
            str(log_file)] + (["instance"] if instance else [])
    started = time.monotonic()
    status, stuck = _run_limited(argv, out_file, timeout, _cli_env())
    elapsed = time.monotonic() - started
    out = out_file.read_text(errors="replace") if out_file.exists() else ""
    problems = ()
    if status is None:
        code = 1
        detail = f"killed after {timeout:g} s"
        if stuck:
            detail += "; left in the kernel: " + ", ".join(stuck)
        problems = (Problem(HANG, detail),)
        extra = f"\n[{detail}]"
    else:
        lines = out.split()
        code = int(lines[-1]) if status == 0 and lines and lines[-1].isdigit() else -1
        extra = "" if code >= 0 else f"\n[runner exit {status}] {out}"
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    return CaseResult(name, code, log + extra, elapsed, problems)


#: The suite's reset, as ftracetest runs it after its last case (and, as
#: initialize_ftrace, before each case): sourced from test.d/functions.
_RESET_SCRIPT = 'cd "$1" && . "$2/test.d/functions" && finish_ftrace'


def reset_tracing(mount: Path, selftests: Path, out: Path,
                  timeout: float = CASE_TIMEOUT) -> Problem | None:
    """Runs the suite's reset in the mount's tracing directory; a CLEANUP_HANG problem
    when it overruns timeout."""
    status, stuck = _run_limited(["sh", "-c", _RESET_SCRIPT, "reset",
                                  str(mount / "tracing"), str(selftests)], out, timeout)
    if status is not None:
        return None
    detail = f"finish_ftrace killed after {timeout:g} s"
    return Problem(CLEANUP_HANG, detail + ("; left in the kernel: " + ", ".join(stuck)
                                           if stuck else ""))


def check_daemon(mount: Path, selftests: Path, out: Path,
                 timeout: float = CASE_TIMEOUT) -> list[Problem]:
    """The checks after a case: the daemon answers at once, and once the suite's reset
    has run, kprobe_events and kprobes/list are empty."""
    ok, text = bounded_read(mount / "tracing" / "README")
    if not ok:
        return [Problem(UNRESPONSIVE, text)]
    problem = reset_tracing(mount, selftests, out, timeout)
    if problem is not None:
        return [problem]
    problems = []
    for kind, path in ((KPROBE_EVENTS_LEFT, mount / "tracing" / "kprobe_events"),
                       (KPROBES_LIST_LEFT, mount / "kprobes" / "list")):
        ok, text = bounded_read(path)
        if not ok:
            return problems + [Problem(UNRESPONSIVE, text)]
        if text.strip():
            problems.append(Problem(kind, " | ".join(text.strip().splitlines()[:5])))
    return problems


@dataclass
class SuiteRun:
    """One run of a list of cases against one mount: the results in run order, the
    problems of the checks before the first case and after the last, and the time."""

    order: list[str]
    results: list[CaseResult] = field(default_factory=list)
    before: list[Problem] = field(default_factory=list)
    after: list[Problem] = field(default_factory=list)
    elapsed: float = 0.0
    log_dir: Path | None = None

    def problems(self, kind: str | None = None) -> list[tuple[str, Problem]]:
        """(case, problem) of every problem, of one kind if given; "(start)" and
        "(end)" stand for the checks around the run."""
        out = [("(start)", p) for p in self.before]
        out += [(r.case, p) for r in self.results for p in r.problems]
        out += [("(end)", p) for p in self.after]
        return [(c, p) for c, p in out if kind is None or p.kind == kind]

    def failures(self) -> list[tuple[str, Problem]]:
        """The problems that are failures (every kind but RESTARTED)."""
        return [(c, p) for c, p in self.problems() if p.kind in FAILURE_KINDS]


#: Problems after which the daemon is replaced: it no longer answers.
_WEDGED = (UNRESPONSIVE, CLEANUP_HANG)


def run_suite(mount: Mount, selftests: Path, cases: list[str], log_dir: Path,
              timeout: float = CASE_TIMEOUT, checks: bool = True, restart: bool = True,
              report=None) -> SuiteRun:
    """Runs cases in the given order against mount.  With checks, the daemon is checked
    (:func:`check_daemon`) before the first case, after each case and once more at the
    end; with restart, a daemon that stopped answering is replaced (a RESTARTED
    problem) so that the later cases still run.  report(result) is called as each case
    finishes."""
    run = SuiteRun(list(cases), log_dir=log_dir)
    started = time.monotonic()

    def check(name: str) -> list[Problem]:
        problems = check_daemon(mount.path, selftests, log_dir / f"{name}.reset", timeout)
        if restart and any(p.kind in _WEDGED for p in problems):
            old = mount.pid
            mount.restart()
            problems.append(Problem(RESTARTED, f"daemon {old} killed, {mount.pid} started"))
        return problems

    if checks:
        run.before = check("start")
    for case in cases:
        result = run_case(mount.path, selftests, case, log_dir, timeout)
        problems = list(result.problems)
        if checks:
            problems += check(case.replace("/", "-").replace(INSTANCE_SUFFIX, "-instance"))
        _LEFTOVERS[:] = _reap(_LEFTOVERS)
        result = CaseResult(result.case, result.code, result.log, result.elapsed,
                            tuple(problems))
        run.results.append(result)
        if report is not None:
            report(result)
    if checks:
        run.after = check("end")
    run.elapsed = time.monotonic() - started
    return run


# ---- ftracetest itself ----------------------------------------------------------------------
#: Seconds a whole ftracetest run may take: 4 to 6 minutes on this project's machine.
SUITE_TIMEOUT = 1200.0
#: Seconds a case of an ftracetest run may take, from the moment ftracetest prints its
#: number: the slowest, direct/ftrace-direct.tc (dozens of modprobe and rmmod), takes
#: about 20 s on an idle machine and twice that on a loaded one.
FTRACETEST_CASE_TIMEOUT = 180.0
#: ftracetest's line for a case: "[N] DESCRIPTION<TAB>[RESULT]" (no colours: not a tty).
_CASE_LINE = re.compile(r"^\[(\d+)\].*\t\[(\w+)\]$", re.M)
#: ftracetest prints "[N] DESCRIPTION" as case N starts, its result when it ends.
_CASE_START = re.compile(r"^\[(\d+)\]", re.M)
#: The first line of a case's log: "execute: PATH", or "execute (instance) : PATH".
_LOG_HEAD = re.compile(r"^execute( \(instance\) )?: (.*)$")
#: The host's knob ftracetest sets to -1 while it runs and restores at its end.
SCHED_RT_RUNTIME = Path("/proc/sys/kernel/sched_rt_runtime_us")


class _HostKnob:
    """A host setting that runs going on at once may each change (ftracetest's -1 in
    sched_rt_runtime_us): the value before the first of them began is put back when
    the last ends.  Each run keeping its own value would not do: a run that began
    while another had the knob at -1 would put back -1."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._users = 0
        self._before: str | None = None

    def __enter__(self) -> "_HostKnob":
        with self._lock:
            if self._users == 0:
                self._before = self.path.read_text() if self.path.exists() else None
            self._users += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._before is not None \
                    and self.path.read_text() != self._before:
                self.path.write_text(self._before)


#: Held around every run of ftracetest in this process: run_ftracetest's, and for a
#: pytest session as a whole (tests/conftest.py), which covers the tests that run
#: ftracetest themselves.
KEEP_SCHED_RT_RUNTIME = _HostKnob(SCHED_RT_RUNTIME)


@dataclass
class FtracetestRun:
    """One run of Linux's ``ftracetest`` under ``kprobefs exec --kernel-scratch``: the
    result of each case as ftracetest printed it (named ``DIR/NAME.tc``, and ``DIR/
    NAME.tc (instance)`` in its instance pass), in run order, with the seconds each
    took; the problems the runner saw (a case that overran its limit, the checks
    after the run); ftracetest's exit status (None when it was killed); its output."""

    results: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    problems: list[tuple[str, Problem]] = field(default_factory=list)
    returncode: int | None = None
    output: str = ""
    elapsed: float = 0.0
    log_dir: Path | None = None
    logs: dict[str, Path] = field(default_factory=dict)

    def log(self, case: str) -> str:
        """The case's log as ftracetest kept it ("" when there is none)."""
        path = self.logs.get(case)
        return path.read_text(errors="replace") if path is not None else ""


def _case_logs(log_dir: Path, selftests: Path) -> dict[int, tuple[str, Path]]:
    """Case number -> (case name, its log) from the logs ftracetest keeps with -k
    (``N-NAME.tc-log.XXXXXX``, whose first line names the case's file)."""
    out = {}
    root = selftests / "test.d"
    for path in log_dir.glob("*-log.*"):
        number = path.name.split("-", 1)[0]
        with open(path, errors="replace") as f:
            m = _LOG_HEAD.match(f.readline().rstrip("\n"))
        if not number.isdigit() or m is None:
            continue
        name = Path(m[2]).resolve().relative_to(root.resolve()).as_posix()
        out[int(number)] = (name + (INSTANCE_SUFFIX if m[1] else ""), path)
    return out


class _Output:
    """The output of a child, read by a thread as it comes."""

    def __init__(self, pipe):
        self._chunks: list[bytes] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe) -> None:
        while chunk := pipe.read1(65536):
            self._chunks.append(chunk)
        pipe.close()

    def text(self) -> str:
        return b"".join(list(self._chunks)).decode("utf-8", "replace")

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def run_ftracetest(mount: Path, selftests: Path, log_dir: Path,
                   args: tuple[str, ...] = (), timeout: float = FTRACETEST_CASE_TIMEOUT,
                   suite_timeout: float = SUITE_TIMEOUT, report=None,
                   prefix: Sequence[str] = (), checks: bool = True,
                   cancel: threading.Event | None = None) -> FtracetestRun:
    """Runs ``./ftracetest -k -l LOG_DIR ARGS`` in the selftests directory under
    ``kprobefs exec --kernel-scratch MOUNT``, in a session of its own, and then the
    checks of :func:`check_daemon`.  ftracetest has no time limit of its own: a case
    that runs past timeout seconds (from the moment ftracetest prints its number),
    or a run past suite_timeout, is a HANG problem of that case, and ftracetest is
    killed with everything in its session (the later cases are then not run).
    report(line) is called as each case ends.  Once cancel is set, ftracetest is killed
    the same way (a CANCELLED problem).  The host's sched_rt_runtime_us, which
    ftracetest sets to -1 while it runs, is put back if a killed run left it (once the
    last of the runs going on at once has ended: see _HostKnob).  prefix
    runs ``kprobefs exec`` (as another user, in another namespace: it enters the
    selftests directory itself); without checks, the daemon is not checked after."""
    argv = ["/usr/bin/env", "--default-signal=HUP", *prefix, sys.executable, "-m",
            "kprobefs", "exec", "--kernel-scratch", str(mount), "--",
            "./ftracetest", "-k", "-l", str(log_dir), *args]
    with KEEP_SCHED_RT_RUNTIME:
        run = _run_ftracetest(argv, selftests, log_dir, timeout, suite_timeout, report,
                              cancel)
    if checks:
        run.problems += [("(end)", problem) for problem in
                         check_daemon(mount, selftests, log_dir / "end.reset", timeout)]
    return run


def _run_ftracetest(argv: list[str], selftests: Path, log_dir: Path, timeout: float,
                    suite_timeout: float, report, cancel: threading.Event | None
                    ) -> FtracetestRun:
    run = FtracetestRun(log_dir=log_dir)
    started = time.monotonic()
    p = subprocess.Popen(argv, cwd=selftests, env=_cli_env(), stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    output = _Output(p.stdout)
    case_started: dict[int, float] = {}
    reported: set[int] = set()
    names: dict[int, tuple[str, Path]] = {}

    def name(number: int) -> str:
        if number not in names:
            names.update(_case_logs(log_dir, selftests))
        return names.get(number, (f"[{number}]", None))[0]

    while True:
        try:
            p.wait(0.25)
            ended = True
        except subprocess.TimeoutExpired:
            ended = False
        now = time.monotonic()
        text = output.text() if not ended else (output.join(5) or output.text())
        for m in _CASE_START.finditer(text):
            case_started.setdefault(int(m[1]), now)
        for m in _CASE_LINE.finditer(text):
            number = int(m[1])
            if number in reported:
                continue
            reported.add(number)
            case = name(number)
            run.results[case] = m[2]
            run.seconds[case] = now - case_started.get(number, now)
            if report is not None:
                report(f"{case}: {m[2]} ({run.seconds[case]:.1f} s)")
        if ended:
            run.returncode = p.returncode
            break
        running = [n for n in case_started if n not in reported]
        overrun = [n for n in running if now - case_started[n] > timeout]
        cancelled = cancel is not None and cancel.is_set()
        if overrun or now - started > suite_timeout or cancelled:
            stuck = kill_session(p.pid)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                _LEFTOVERS.append(p)
            kind = HANG if overrun or not cancelled else CANCELLED
            limit = (f"{timeout:g} s" if overrun else "a cancel" if cancelled
                     else f"the run's {suite_timeout:g} s")
            detail = f"ftracetest killed after {limit}" + (
                "; left in the kernel: " + ", ".join(stuck) if stuck else "")
            case = name(running[0]) if running else "(run)"
            run.problems.append((case, Problem(kind, detail)))
            if running:
                run.results[case] = kind.upper()
            if report is not None:
                report(f"{case}: {kind.upper()} ({detail})")
            break
    run.elapsed = time.monotonic() - started
    run.output = output.text()
    run.logs = {case: path for case, path in _case_logs(log_dir, selftests).values()}
    return run


class _SharedRun:
    """A run of ftracetest on a thread of its own, so that the pytest session can go
    on with other tests while it runs (it is mostly waiting on the emulated kernel).
    The lines of its cases are kept for whoever waits for it to print."""

    def __init__(self, args: tuple[str, ...], log_dir: Path | None, timeout: float):
        self.args, self.log_dir, self.timeout = args, log_dir, timeout
        self.lines: list[str] = []
        self.cancel = threading.Event()
        self.outcome: tuple[FtracetestRun | None, Path | None, str | None] | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"ftracetest {' '.join(args) or '(all)'}")
        self.thread.start()

    def _run(self) -> None:
        try:
            selftests, reason = prepare()
            run = None
            if selftests is not None:
                log_dir = self.log_dir or new_log_dir("kprobefs-ftracetest-")
                log_dir.mkdir(parents=True, exist_ok=True)
                with Mount(log_dir / "daemon.log") as mount:
                    run = run_ftracetest(mount.path, selftests, log_dir, self.args,
                                         self.timeout, report=self.lines.append,
                                         cancel=self.cancel)
            self.outcome = (run, selftests, reason)
        except BaseException as e:      # raised again in the thread that waits
            self.error = e

    def wait(self, report=None) -> tuple[FtracetestRun | None, Path | None, str | None]:
        """The outcome, once the run has ended; report(line) gets each case's line
        (those of cases that ended before the call at once, the others as they end)."""
        shown = 0
        while True:
            self.thread.join(0.5)
            lines = self.lines[shown:]
            shown += len(lines)
            for line in lines:
                if report is not None:
                    report(line)
            if not self.thread.is_alive() and shown == len(self.lines):
                break
        if self.error is not None:
            raise self.error
        return self.outcome


#: The runs of shared_ftracetest, by ftracetest's arguments.
_SHARED: dict[tuple[str, ...], _SharedRun] = {}
_SHARED_LOCK = threading.Lock()


def session_ftracetest(whole: bool) -> tuple[tuple[str, ...], Path | None, float]:
    """(ftracetest's arguments, the log directory, a case's time limit) of a pytest
    session's shared run: the whole suite when whole (the torture tests are in the
    session), else CASE_DIRS alone; the logs under ``$KPROBEFS_TORTURE_LOGS/ftracetest``
    if set, the limit ``$KPROBEFS_TORTURE_TIMEOUT`` if set."""
    args = () if whole else tuple(f"test.d/{d}" for d in CASE_DIRS)
    base = os.environ.get("KPROBEFS_TORTURE_LOGS")
    log_dir = Path(base) / "ftracetest" if base else None
    timeout = float(os.environ.get("KPROBEFS_TORTURE_TIMEOUT") or FTRACETEST_CASE_TIMEOUT)
    return args, log_dir, timeout


def start_shared_ftracetest(args: tuple[str, ...] = (), log_dir: Path | None = None,
                            timeout: float = FTRACETEST_CASE_TIMEOUT) -> None:
    """Starts the run of shared_ftracetest(args) in the background, if not started
    yet (a pytest session does so as it starts, and waits for it at the end)."""
    with _SHARED_LOCK:
        if args not in _SHARED:
            _SHARED[args] = _SharedRun(args, log_dir, timeout)


def shared_ftracetest(args: tuple[str, ...] = (), log_dir: Path | None = None,
                      timeout: float = FTRACETEST_CASE_TIMEOUT, report=None
                      ) -> tuple[FtracetestRun | None, Path | None, str | None]:
    """(the run, the selftests directory, None) of ``ftracetest ARGS`` against a fresh
    mount (:func:`run_ftracetest`), made once per ARGS in this process, so that the
    test modules that check one run share it; or (None, None, why it cannot run
    here).  The logs (the daemon's too) go to log_dir, else a new directory; those
    arguments count only for the call that starts the run.  Waits for a run that
    start_shared_ftracetest began; report(line) gets each case's line."""
    start_shared_ftracetest(args, log_dir, timeout)
    return _SHARED[args].wait(report)


def stop_shared_ftracetest() -> None:
    """Kills the shared runs still going (a session that ends before it looks at
    them) and waits for their daemons to be unmounted."""
    with _SHARED_LOCK:
        runs = list(_SHARED.values())
    for shared in runs:
        shared.cancel.set()
    for shared in runs:
        shared.thread.join(120)


def run_all(patterns: list[str] | None = None, out=sys.stdout, dirs=CASE_DIRS,
            seed: int | None = None, timeout: float = CASE_TIMEOUT, checks: bool = False,
            log_level: str = "INFO") -> SuiteRun:
    """Runs the cases (of dirs, matching patterns) against one fresh mount, in
    ftracetest's order or shuffled with seed, printing a line per case."""
    selftests = selftest_dir()
    cases = list_cases(selftests, patterns, dirs)
    if seed is not None:
        cases = shuffled(cases, seed)
    cases = with_instance_pass(selftests, cases)
    log_dir = new_log_dir("kprobefs-conformance-logs-")
    with Mount(log_dir / "daemon.log", log_level) as mount:
        run = run_suite(mount, selftests, cases, log_dir, timeout, checks=checks,
                        report=lambda r: print(r.summary(), file=out, flush=True))
    for when, problem in run.problems():
        if when in ("(start)", "(end)"):
            print(f"{when}: {problem}", file=out)
    print(f"{len(run.results)} cases in {run.elapsed:.1f} s; logs: {log_dir}", file=out)
    return run


def ftracetest_all(args: list[str], out=sys.stdout,
                   timeout: float = FTRACETEST_CASE_TIMEOUT,
                   log_level: str = "INFO") -> FtracetestRun:
    """Runs ``ftracetest ARGS`` against one fresh mount, printing a line per case."""
    selftests = selftest_dir()
    log_dir = new_log_dir("kprobefs-ftracetest-")
    with Mount(log_dir / "daemon.log", log_level) as mount:
        run = run_ftracetest(mount.path, selftests, log_dir, tuple(args), timeout,
                             report=lambda line: print(line, file=out, flush=True))
    for when, problem in run.problems:
        print(f"{when}: {problem}", file=out)
    print(f"{len(run.results)} cases in {run.elapsed:.1f} s, ftracetest exit "
          f"{run.returncode}; logs: {log_dir}", file=out)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Linux 6.1's ftrace selftests "
                                                 "against a kprobefs mount.")
    parser.add_argument("patterns", nargs="*", metavar="CASE-GLOB",
                        help="cases to run (with --ftracetest: ftracetest's arguments, "
                             "e.g. test.d/kprobe)")
    parser.add_argument("--ftracetest", action="store_true",
                        help="run Linux's ./ftracetest itself (by default the whole "
                             "suite) under kprobefs exec --kernel-scratch, with a time "
                             "limit per case and the daemon checks at the end")
    parser.add_argument("--all", action="store_true",
                        help="every directory of test.d but selftest/, with the daemon "
                             "checks after each case (torture mode)")
    parser.add_argument("--shuffle", type=int, metavar="SEED",
                        help="run the cases in an order drawn from SEED")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help=f"seconds a case may run (default {CASE_TIMEOUT:g}, with "
                             f"--ftracetest {FTRACETEST_CASE_TIMEOUT:g})")
    parser.add_argument("--log-level", default="INFO", help="the daemon's log level")
    args = parser.parse_args(argv)
    if args.ftracetest:
        whole = ftracetest_all(args.patterns, log_level=args.log_level.upper(),
                               timeout=args.timeout or FTRACETEST_CASE_TIMEOUT)
        return 1 if whole.returncode != 0 or whole.problems else 0
    run = run_all(args.patterns or None, dirs=None if args.all else CASE_DIRS,
                  seed=args.shuffle, timeout=args.timeout or CASE_TIMEOUT, checks=args.all,
                  log_level=args.log_level.upper())
    failed = any(r.result in ("FAIL", "UNDEFINED") for r in run.results)
    if args.all:
        failed = bool(run.failures())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))    # the source tree's kprobefs, as pytest sees it
    sys.exit(main())
