"""The latency tracers through a real mount, driven by a shell: irqsoff and preemptoff
over preemptirq_delay_test loaded with parameters through the modprobe shim, their
latency trace, tracing_max_latency, and snapshot writes refused meanwhile."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import conformance_runner

from test_fs_mount import _need_fuse, real  # noqa: F401 (fixtures)

def sh(mnt, script):
    """Run script under ``kprobefs exec`` (its modprobe and rmmod act on the emulated
    kernel), in the mount's tracing directory."""
    return subprocess.run([sys.executable, "-m", "kprobefs", "exec", str(mnt), "--",
                           "bash", "-c", script], cwd=Path(mnt) / "tracing",
                          capture_output=True, text=True, timeout=120,
                          env=conformance_runner._cli_env())


@pytest.fixture
def mnt(real):
    yield real
    sh(real, "rmmod preemptirq_delay_test; echo nop > current_tracer")


@pytest.mark.parametrize("tracer, mode", [("irqsoff", "irq"), ("preemptoff", "preempt")])
def test_a_latency_tracer_catches_the_delay_test(mnt, tracer, mode):
    r = sh(mnt, f"""set -e
        echo {tracer} > current_tracer
        echo 0 > tracing_max_latency
        modprobe preemptirq_delay_test test_mode={mode} delay=30000
        cat trace
        rmmod preemptirq_delay_test
        echo @@@; cat tracing_max_latency
        echo 1 > snapshot || echo EBUSY
    """)
    assert r.returncode == 0, r.stderr
    trace, rest = r.stdout.split("@@@\n")
    assert trace.startswith(f"# tracer: {tracer}\n#\n# {tracer} latency trace v1.1.5 on ")
    latency = int(re.search(r"# latency: (\d+) us, #\d+/\d+, CPU#\d+ \| \(M:desktop VP:0, "
                            r"KP:0, SP:0 HP:0 #P:2\)", trace).group(1))
    assert 30000 <= latency < 60000
    assert re.search(r"#  => started at: preemptirq_delay_run", trace), trace
    assert re.search(rf"\s{latency}us : <stack trace>|\s3\d\d\d\dus : <stack trace>", trace)
    assert rest.split("\n")[:2] == [str(latency), "EBUSY"]
    assert "Device or resource busy" in r.stderr


def test_bad_module_parameters_fail_modprobe(mnt):
    r = sh(mnt, "modprobe preemptirq_delay_test delay=soon")
    assert r.returncode == 1
    assert r.stderr == ("modprobe: ERROR: could not insert 'preemptirq_delay_test': "
                        "Invalid argument\n")
