"""Host process events from the process connector (kprobefs.fs.procwatch)."""

import os
import subprocess
import time

import pytest

from kprobefs.fs.procwatch import EXEC, EXIT, FORK, ProcessEvents


@pytest.fixture
def events():
    ev = ProcessEvents.open()
    if ev is None:
        if os.environ.get("CI") == "true" and os.geteuid() == 0:
            pytest.fail("no process connector for root under CI=true")
        pytest.skip("the host offers no process connector here")
    yield ev
    ev.close()


def test_fork_exec_exit_of_a_child_arrive_in_order(events):
    events.drain()
    child = subprocess.run(["sh", "-c", "(true); exec true"], check=True)
    del child
    deadline = time.monotonic() + 5
    seen = []
    while time.monotonic() < deadline:
        seen += events.drain()
        sh = next((e.child for e in seen if e.what == FORK and e.tgid == os.getpid()
                   and e.child == e.child_tgid), None)
        if sh and any(e.what == EXIT and e.pid == sh for e in seen):
            break
        time.sleep(0.01)
    mine = [e for e in seen if sh in (e.pid, e.tgid)]
    kinds = [e.what for e in mine]
    # exec of sh, then it forks its subshell, execs `true`, and exits
    assert kinds[-3:] == [FORK, EXEC, EXIT]
