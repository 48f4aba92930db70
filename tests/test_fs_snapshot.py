"""The snapshot buffer through a real mount, driven by a shell: ``echo 1 > snapshot``
swaps what the kernel recorded (kernel-recorded static events live in the top buffer's
staged pages), the snapshot trigger on a kernel-recorded event, and the help text."""

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    sh(f"""
        echo '!snapshot' >> {t}/events/sched/sched_process_fork/trigger
        echo 0 > {t}/events/sched/sched_process_fork/enable
        echo 0 > {t}/snapshot; echo > {t}/trace; echo 1 > {t}/tracing_on
    """)


def test_echo_1_swaps_kernel_recorded_events_into_the_snapshot(t):
    r = sh(f"""
        set -e
        cat {t}/snapshot | grep -c 'Snapshot is freed'
        echo > {t}/trace
        echo 1 > {t}/events/sched/sched_process_fork/enable
        ( echo forked > /dev/null )
        echo 0 > {t}/events/sched/sched_process_fork/enable
        echo 1 > {t}/snapshot
        echo ---; grep -c sched_process_fork {t}/snapshot
        echo ---; grep -c sched_process_fork {t}/trace || true
        echo 2 > {t}/snapshot
        grep -c 'Snapshot is allocated' {t}/snapshot
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("---\n") == ["1\n", "1\n", "0\n1\n"]


def test_snapshot_trigger_on_a_kernel_recorded_event(t):
    r = sh(f"""
        set -e
        echo 1 > {t}/events/sched/sched_process_fork/enable
        echo 'snapshot:1' > {t}/events/sched/sched_process_fork/trigger
        ( echo forked > /dev/null )
        grep -c sched_process_fork {t}/snapshot
        cat {t}/events/sched/sched_process_fork/trigger
        echo 0 > {t}/per_cpu/cpu0/snapshot || echo EINVAL
    """, shell="bash")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "1\nsnapshot:count=0\nEINVAL\n"
    assert "Invalid argument" in r.stderr
