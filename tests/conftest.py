"""Fixtures shared by the test modules."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest


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
