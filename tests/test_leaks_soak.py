"""The soak of issue 29, short (benchmarks/soak.py --rounds): a daemon with the workload,
four kprobe-event loops, an instance loop, a hist-trigger loop and a trace_pipe reader,
each loop a fixed number of rounds (counted, not timed).  No command may fail, nothing
may be left behind, and the emulated kernel's used memory after the cleanup must be
within 1 MiB of where it started."""

from __future__ import annotations

import importlib.util
import os

import pytest

from robust_mount import need_fuse

pytestmark = pytest.mark.fuse

ROUNDS = 25


def load_soak():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", "soak.py")
    spec = importlib.util.spec_from_file_location("soak", path)
    soak = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(soak)
    return soak


def test_short_soak_fails_nothing_leaves_nothing_and_gives_memory_back(capsys):
    need_fuse()
    status = load_soak().main(["--rounds", str(ROUNDS), "--interval", "5", "--check",
                               "--bound-kb", "1024"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "errors: 0" in out and "left behind: nothing" in out, out
    assert f"probes0 {ROUNDS}" in out and f"instances {ROUNDS}" in out, out
