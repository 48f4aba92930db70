"""Runs Linux 6.1's ftrace selftests (tools/testing/selftests/ftrace) against a kprobefs
mount, unmodified.

The selftests come from Debian's ``linux-source-6.1`` package, installed at test time when
missing; only ``tools/testing/selftests/ftrace`` is unpacked, into a cache directory
(``$KPROBEFS_CACHE`` or ``~/.cache/kprobefs``).  Nothing of the kernel is kept in this
repository.

Each case runs as the kernel's runner runs it (``tests/conformance_case.sh``): in the
tracing directory, with ``test.d/functions`` sourced, the ``# requires:`` line checked,
``initialize_ftrace``, then the case sourced under ``set -e``; results by the same codes
and real-time signals.  Each case runs under ``kprobefs exec``, in a private mount
namespace where the mount is ``/sys/kernel/tracing`` (the case script finds it as
ftracetest does, by the ``tracefs`` line of ``/proc/mounts``) and the emulated kernel's
``kallsyms`` and ``version`` replace the host's ``/proc`` files; the case script binds
the emulated kernel's ``/dev/null`` and ``/tmp`` there too (see conformance_case.sh).

Torture mode (``--all``, tests/test_torture.py): every case of ``test.d`` but
``selftest/``, against one daemon, in ftracetest's order or shuffled by a seed.  Each case
has a time limit; one that overruns is killed with everything in its session and counted
as a hang (processes still there afterwards, typically in state D inside a FUSE request,
are recorded).  After each case the runner checks that the daemon answers at once
(``tracing/README`` within 5 s), runs the suite's own reset (ftracetest's
``finish_ftrace``: what the next case's ``initialize_ftrace`` does, and what ftracetest
runs at the end), then checks that ``tracing/kprobe_events`` and ``kprobes/list`` are
empty.  A daemon that stops answering is killed and replaced, so the rest of the suite
still runs; the restart is recorded.  As ftracetest does, a second pass then runs the
cases flagged ``# flags: instance`` again, each in a fresh ``tracing/instances``
directory (named ``CASE (instance)`` in the results).

Standalone: ``python3 tests/conformance_runner.py [--all] [--shuffle SEED] [--timeout S]
[CASE-GLOB...]`` prints one line per case and exits 1 if any case failed (with ``--all``:
if any case hung or left the daemon unresponsive or a probe behind).
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

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
    """(comm, state, session id) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    comm = data[data.index("(") + 1:data.rindex(")")]
    rest = data[data.rindex(")") + 2:].split()
    return comm, rest[0], int(rest[3])


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


@functools.lru_cache(maxsize=1)
def shim_dir() -> Path:
    """The modprobe/rmmod shims, copied out of the source tree: a case's namespace has the
    emulated kernel's /tmp over the host's, which would hide a checkout under /tmp."""
    target = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-bin-", dir="/run"))
    for shim in (HERE / "conformance_bin").iterdir():
        shutil.copy2(shim, target / shim.name)
    return target


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
    argv = [sys.executable, "-m", "kprobefs", "exec", str(mount), "--", "sh",
            str(CASE_SCRIPT), str(mount), str(selftests), str(selftests / "test.d" / case),
            str(log_file)] + (["instance"] if instance else [])
    # modprobe/rmmod shims that load the project's modules through the mount's control.
    env = _cli_env()
    env.update(KPROBEFS_MOUNT=str(mount),
               PATH=str(shim_dir()) + os.pathsep + env.get("PATH", ""))
    started = time.monotonic()
    status, stuck = _run_limited(argv, out_file, timeout, env)
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
    log_dir = Path(tempfile.mkdtemp(prefix="kprobefs-conformance-logs-"))
    with Mount(log_dir / "daemon.log", log_level) as mount:
        run = run_suite(mount, selftests, cases, log_dir, timeout, checks=checks,
                        report=lambda r: print(r.summary(), file=out, flush=True))
    for when, problem in run.problems():
        if when in ("(start)", "(end)"):
            print(f"{when}: {problem}", file=out)
    print(f"{len(run.results)} cases in {run.elapsed:.1f} s; logs: {log_dir}", file=out)
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run Linux 6.1's ftrace selftests "
                                                 "against a kprobefs mount.")
    parser.add_argument("patterns", nargs="*", metavar="CASE-GLOB")
    parser.add_argument("--all", action="store_true",
                        help="every directory of test.d but selftest/, with the daemon "
                             "checks after each case (torture mode)")
    parser.add_argument("--shuffle", type=int, metavar="SEED",
                        help="run the cases in an order drawn from SEED")
    parser.add_argument("--timeout", type=float, default=CASE_TIMEOUT, metavar="S",
                        help=f"seconds a case may run (default {CASE_TIMEOUT:g})")
    parser.add_argument("--log-level", default="INFO", help="the daemon's log level")
    args = parser.parse_args(argv)
    run = run_all(args.patterns or None, dirs=None if args.all else CASE_DIRS,
                  seed=args.shuffle, timeout=args.timeout, checks=args.all,
                  log_level=args.log_level.upper())
    failed = any(r.result in ("FAIL", "UNDEFINED") for r in run.results)
    if args.all:
        failed = bool(run.failures())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parent))    # the source tree's kprobefs, as pytest sees it
    sys.exit(main())
