"""The pytest plugin (entry point ``pytest11: kprobefs``): fixtures that give a test a
kprobefs mount with a clean tracefs.  It does nothing until a test asks for one of its
fixtures: no daemon, no file of the mount touched.

Fixtures:

- ``kprobefs``: the mount's root, a :class:`pathlib.Path` (``kprobefs / "tracing" /
  "kprobe_events"``), reset first (see :mod:`kprobefs.testing.reset`);
- ``kprobefs_exec``: runs a command under ``kprobefs exec`` and returns its
  :class:`subprocess.CompletedProcess`;
- ``kprobefs_reader``: a :class:`~kprobefs.testing.records.TraceReader` of
  ``kprobefs / "tracing"``;
- ``kprobefs_pipe``: a :class:`~kprobefs.testing.waiter.TracePipe` of it;
- ``kprobefs_mount``: the session's :class:`~kprobefs.testing.mount.KprobefsMount`.

One daemon serves the session: started when a test first asks, unmounted at the end.
A failing test's report gets the daemon's log lines written while it ran.

Options, on the command line or as ini keys (``kprobefs_cpus = 4``):
``--kprobefs-cpus N``, ``--kprobefs-workload RATE``, ``--kprobefs-seed N`` and
``--kprobefs-mount DIR`` (use the mount already at DIR; it is reset, never unmounted).
Where FUSE is missing the fixtures skip with the reason, except under ``CI=true``,
where they fail.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from .mount import KprobefsMount, MountError, fuse_missing
from .reset import ResetError
from .records import TraceReader
from .waiter import TracePipe

_OPTIONS = (
    # (name, type, default, help)
    ("cpus", int, 2, "virtual CPUs of the kprobefs daemon (1-8, default 2)"),
    ("workload", float, 0.0, "background operations per second (default 0: none, which "
                             "the same records run after run need)"),
    ("seed", int, 0, "seed of the emulated machine and its workload (default 0)"),
    ("mount", str, "", "an existing kprobefs mount to use instead of starting a daemon "
                       "(it is reset before each test and left mounted)"),
)

_LOG_START = pytest.StashKey[int]()
_SESSION = pytest.StashKey["_Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kprobefs", "kprobefs: tracefs for integration tests")
    for name, kind, default, text in _OPTIONS:
        group.addoption(f"--kprobefs-{name}", dest=f"kprobefs_{name}", default=None,
                        type=kind, metavar=name.upper(), help=text)
        parser.addini(f"kprobefs_{name}", text, default=str(default))


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SESSION] = _Session(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is not None:
        session.stop()


def _setting(config: pytest.Config, name: str, kind):
    value = config.getoption(f"kprobefs_{name}")
    if value is None:
        value = kind(config.getini(f"kprobefs_{name}"))
    return value


class _Session:
    """The session's daemon, started on first use; the reset times."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.mount: KprobefsMount | None = None
        self.failure: str | None = None
        self.reset_times: list[float] = []

    def get(self) -> KprobefsMount:
        if self.failure is not None:
            pytest.fail(self.failure, pytrace=False)
        if self.mount is None:
            self.mount = self._start()
        return self.mount

    def _start(self) -> KprobefsMount:
        existing = _setting(self.config, "mount", str)
        if existing:
            mount = KprobefsMount(existing, reuse=True)
        else:
            reason = fuse_missing()
            if reason:
                if os.environ.get("CI") == "true":
                    self.failure = f"kprobefs cannot mount under CI=true: {reason}"
                    pytest.fail(self.failure, pytrace=False)
                pytest.skip(f"kprobefs cannot mount here: {reason}")
            mount = KprobefsMount(cpus=_setting(self.config, "cpus", int),
                                  workload=_setting(self.config, "workload", float),
                                  seed=_setting(self.config, "seed", int))
        try:
            return mount.start()
        except MountError as e:
            self.failure = str(e)
            pytest.fail(self.failure, pytrace=False)

    def stop(self) -> None:
        mount, self.mount = self.mount, None
        if mount is None:
            return
        try:
            mount.stop()
        except MountError as e:
            # After the session, where a failure has no test to go to: say it.
            sys.stderr.write(f"kprobefs: {e}\n")


@pytest.fixture(scope="session")
def kprobefs_mount(request: pytest.FixtureRequest) -> KprobefsMount:
    """The session's KprobefsMount (started on first use)."""
    return request.config.stash[_SESSION].get()


@pytest.fixture
def kprobefs(kprobefs_mount: KprobefsMount, request: pytest.FixtureRequest) -> Path:
    """The mount's root, its tracefs reset to a clean state first."""
    request.node.stash[_LOG_START] = kprobefs_mount.log_size()
    start = time.perf_counter()
    try:
        kprobefs_mount.reset()
    except ResetError as e:
        pytest.fail(f"kprobefs: the tracefs cannot be reset for this test: {e}",
                    pytrace=False)
    request.config.stash[_SESSION].reset_times.append(time.perf_counter() - start)
    return kprobefs_mount.root


@pytest.fixture
def kprobefs_exec(kprobefs: Path, kprobefs_mount: KprobefsMount):
    """``kprobefs_exec(command, check=False, timeout=60, **subprocess_kwargs)``: runs
    the command (a shell line or an argv) under ``kprobefs exec`` and returns the
    CompletedProcess (stdout and stderr as text)."""
    return kprobefs_mount.exec


@pytest.fixture
def kprobefs_reader(kprobefs: Path) -> TraceReader:
    """A TraceReader of the mount's ``tracing`` directory."""
    return TraceReader(kprobefs / "tracing")


@pytest.fixture
def kprobefs_pipe(kprobefs: Path):
    """A TracePipe of the mount's ``tracing`` directory, closed after the test."""
    with TracePipe(kprobefs / "tracing") as pipe:
        yield pipe


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    start = item.stash.get(_LOG_START, None)
    if start is None or not report.failed:
        return
    mount = item.config.stash[_SESSION].mount
    if mount is None:
        return
    text = mount.log_text(start) or "(nothing logged while the test ran)\n"
    report.sections.append((f"kprobefs log ({mount.describe()})", text))


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    session = config.stash.get(_SESSION, None)
    if session is None or not session.reset_times:
        return
    times = sorted(session.reset_times)
    terminalreporter.write_line(
        f"kprobefs: {len(times)} resets, median {times[len(times) // 2] * 1e3:.1f} ms, "
        f"max {times[-1] * 1e3:.1f} ms")
