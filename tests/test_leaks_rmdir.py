"""`rmdir` of an instance right after its files were closed never finds them open (issue
29): the host's FUSE sends RELEASE after close(2) has returned, in no order with what the
process does next (the mirror of its next fork copies its task's fds; its `rmdir` may be
taken first); FLUSH, sent inside close(2), closes the process's emulated fd before close
returns, as Linux releases the file.  2,000 sequences from one shell, none EBUSY."""

from __future__ import annotations

import subprocess

import pytest

from robust_mount import InProcessMount, need_fuse

pytestmark = pytest.mark.fuse

SEQUENCES = 2000


@pytest.fixture
def mnt(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt").start()
    yield m
    m.stop()


def test_rmdir_after_the_closes_is_never_ebusy(mnt):
    t = mnt.p("tracing")
    enable = f"{t}/instances/a/events/sched/sched_switch/enable"
    script = f"""
    i=0; failed=0
    while [ $i -lt {SEQUENCES} ]; do
      mkdir {t}/instances/a || exit 3
      echo 1 > {enable} || exit 4
      echo 0 > {enable} || exit 5
      if ! rmdir {t}/instances/a; then
        failed=$((failed + 1)); sleep 0.2; rmdir {t}/instances/a || exit 6
      fi
      i=$((i + 1))
    done
    echo "failed=$failed"
    """
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out
    assert out.stdout.strip() == "failed=0", out.stderr[-2000:]
