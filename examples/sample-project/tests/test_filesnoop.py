"""filesnoop.py tested against kprobefs: each test gets the mount's root from the
``kprobefs`` fixture with a clean tracefs, so the probe one test leaves behind cannot
reach the next."""

import os
import sys
from pathlib import Path

import pytest

import filesnoop

SCRIPT = Path(filesnoop.__file__)


def my_comm():
    return Path("/proc/self/comm").read_text().strip()


def test_the_probe_records_the_file_a_process_opens(kprobefs, kprobefs_pipe):
    filesnoop.setup(kprobefs / "tracing")
    (kprobefs / "proc" / "version").read_text()      # an open in the emulated kernel
    record = kprobefs_pipe.wait_for(event="open", path="/proc/version", timeout=10)
    assert (record.comm, record.pid) == (my_comm(), os.getpid())


def test_parse_line_reads_what_the_kernel_writes(kprobefs, kprobefs_reader):
    tracing = kprobefs / "tracing"
    filesnoop.setup(tracing)
    (kprobefs / "proc" / "version").read_text()
    text = (tracing / "trace").read_text()
    expected = [(r.comm, r.pid, r["path"]) for r in kprobefs_reader.parse(text)
                if r.event == "open"]
    assert ("/proc/version" in {path for _, _, path in expected})
    parsed = [filesnoop.parse_line(line) for line in text.splitlines() if ": open: " in line]
    assert parsed == expected


def test_snoop_prints_the_files_of_a_command(kprobefs, kprobefs_exec):
    # Under `kprobefs exec` the mount is /sys/kernel/tracing, the script's default.
    result = kprobefs_exec([sys.executable, str(SCRIPT), "--", "cat", "/proc/version"])
    assert result.returncode == 0, result.stderr
    lines = [line.split(" ", 2) for line in result.stdout.splitlines()]
    assert ["cat", "/proc/version"] in [[comm, path] for comm, _pid, path in lines]
    assert (kprobefs / "tracing" / "kprobe_events").read_text() == ""


def test_the_probe_is_removed_when_the_command_cannot_run(kprobefs):
    tracing = kprobefs / "tracing"
    with pytest.raises(FileNotFoundError):
        filesnoop.snoop(tracing, ["/nonexistent/command"], timeout=1)
    assert (tracing / "kprobe_events").read_text() == ""
