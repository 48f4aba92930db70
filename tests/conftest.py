"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pytest

import conformance_runner


# ---- the shared ftracetest run, in the background ----------------------------------------
#: The fixtures that wait for the session's ftracetest run (test_torture's and
#: test_conformance's).
_FTRACETEST_FIXTURES = {"whole_run", "run"}


def _needs_ftracetest(item: pytest.Item) -> bool:
    marked = item.get_closest_marker("torture") or item.get_closest_marker("conformance")
    return bool(marked) and bool(_FTRACETEST_FIXTURES & set(item.fixturenames))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that look at the ftracetest run go last, so that the run (started
    as the session starts, pytest_collection_finish) goes on beside the others."""
    items.sort(key=_needs_ftracetest)       # stable: each group keeps its order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Starts the session's ftracetest run on a thread, when a test will look at it:
    it takes minutes, most of them waiting on the emulated kernel, and has a mount and
    a namespace of its own.  KPROBEFS_FTRACETEST_EARLY=0 leaves it to its first test."""
    if session.config.option.collectonly \
            or os.environ.get("KPROBEFS_FTRACETEST_EARLY") == "0":
        return
    if any(_needs_ftracetest(item) for item in session.items):
        whole = any(item.get_closest_marker("torture") for item in session.items)
        conformance_runner.start_shared_ftracetest(
            *conformance_runner.session_ftracetest(whole))


def pytest_sessionstart(session: pytest.Session) -> None:
    """ftracetest sets the host's sched_rt_runtime_us to -1 while it runs and puts back
    what it found: one started while the shared run had it at -1 (test_exec's) puts
    back -1.  The value from before the session comes back at its end."""
    if os.geteuid() == 0:
        conformance_runner.KEEP_SCHED_RT_RUNTIME.__enter__()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A run nobody waited for (the session stopped early) is killed, its mount gone."""
    conformance_runner.stop_shared_ftracetest()
    if os.geteuid() == 0:
        conformance_runner.KEEP_SCHED_RT_RUNTIME.__exit__(None, None, None)


# ---- helpers --------------------------------------------------------------------------------

def start_sleep() -> subprocess.Popen:
    """A live host process other than the test's, once it is "sleep" (exec done)."""
    p = subprocess.Popen(["sleep", "60"])
    for _ in range(200):
        with open(f"/proc/{p.pid}/comm") as f:
            if f.read().strip() == "sleep":
                break
        time.sleep(0.01)
    return p


@pytest.fixture
def sleeper():
    p = start_sleep()
    yield p
    p.kill()
    p.wait()


def blocking_kprobe(symbol: str, wait: float = 60.0):
    """(kprobe, entered, go): a probe on symbol whose handler sets ``entered`` and then
    holds the CPU until ``go`` is set (at most wait seconds); not registered yet."""
    from kprobefs import Kprobe

    entered, go = threading.Event(), threading.Event()

    def pre(p, regs):
        entered.set()
        go.wait(wait)

    return Kprobe(symbol_name=symbol, pre_handler=pre), entered, go
