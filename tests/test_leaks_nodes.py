"""The host's FUSE nodes of names that went away without its knowing are given back
(issue 29): a lookup of an event's fixed files (``enable``...) is cached by the host,
and a cached child keeps its directory's entry, so after the event is removed through
``kprobe_events`` the host would hold both until its memory runs short, and the daemon
their node ids with them.  Once the host holds NODES_SWEEP_AT nodes, the daemon tells
it of the gone names (FUSE_NOTIFY_INVAL_ENTRY) and the host forgets their nodes."""

from __future__ import annotations

import subprocess
import time

import pytest

from kprobefs.fs import fuse_ll
from robust_mount import InProcessMount, need_fuse

pytestmark = pytest.mark.fuse

EVENTS = 600
SWEEP_AT = 256


@pytest.fixture
def mnt(tmp_path, monkeypatch):
    need_fuse()
    monkeypatch.setattr(fuse_ll.FuseSession, "NODES_SWEEP_AT", SWEEP_AT)
    m = InProcessMount(tmp_path / "mnt").start()
    yield m
    m.stop()


def _churn(t: str, first: int, n: int) -> None:
    script = f"""
    cd {t} || exit 2
    i={first}
    while [ $i -lt {first + n} ]; do
      echo "p:nodes$i vfs_read" >> kprobe_events || exit 3
      echo 1 > events/kprobes/nodes$i/enable || exit 4
      echo 0 > events/kprobes/nodes$i/enable || exit 5
      echo "-:nodes$i" >> kprobe_events || exit 6
      i=$((i + 1))
    done
    """
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out


def _nodes(m) -> int:
    return len(m.daemon._session._nodes)


def test_the_nodes_of_removed_events_are_forgotten(mnt):
    _churn(mnt.p("tracing"), 0, EVENTS)
    # the reaper sweeps every REAP_INTERVAL once SWEEP_AT nodes are held; the host's
    # FORGETs follow its invalidations
    deadline = time.monotonic() + 30
    while _nodes(mnt) > SWEEP_AT and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _nodes(mnt) <= SWEEP_AT, "two nodes an event, all held"
    # and the names still work: a new event with a name used before
    _churn(mnt.p("tracing"), 0, 3)


def test_a_sweep_tells_only_names_that_are_gone(mnt):
    """Only the topmost gone name of each (its group stays: another event is in it)."""
    t = mnt.p("tracing")
    subprocess.run(["sh", "-c", f"echo 'p:kept vfs_read' >> {t}/kprobe_events && "
                    f"echo 'p:stays vfs_write' >> {t}/kprobe_events && "
                    f"cat {t}/events/kprobes/kept/enable"], check=True, capture_output=True)
    session = mnt.daemon._session
    session._sweep_at = 0
    told = []
    notify = session._notify
    session._notify = lambda code, data: (told.append(data), notify(code, data))[1]
    assert session.sweep_nodes(mnt.daemon.gateway.name_exists) == 0
    assert told == []
    subprocess.run(["sh", "-c", f"echo '-:kept' >> {t}/kprobe_events"], check=True)
    session._sweep_at = 0
    assert session.sweep_nodes(mnt.daemon.gateway.name_exists) == 1
    assert told[0].endswith(b"\0kept\0")       # the event's directory, not its files
