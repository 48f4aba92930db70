"""Kernel work the host asks for in process context (kernel/host_work.c): a control
write's calls run in its own system call, one HC_WORK_NEXT per call and none to find
the queue empty."""

import collections
import os

import pytest

from kprobefs.daemon import Daemon
from kprobefs.fs import Caller
from kprobefs.machine.abi import AT_FDCWD, HC, O_DIRECTORY


@pytest.fixture(scope="module")
def daemon():
    d = Daemon("/nonexistent", cpus=2)
    d.boot()
    yield d
    d.gateway.close()
    d.kernel.close()


@pytest.fixture
def hypercalls(daemon):
    """Counts of the WORK_NEXT and WORK_DONE hypercalls served meanwhile."""
    counts = collections.Counter()
    served = daemon.kernel._hypercalls
    saved = {nr: served[nr] for nr in (HC.WORK_NEXT, HC.WORK_DONE)}

    def counting(nr):
        handler = saved[nr]
        return lambda: (counts.update([nr]), handler())[1]
    served.update({nr: counting(nr) for nr in saved})
    yield counts
    served.update(saved)


def _write(gateway, line: str) -> None:
    me = Caller(os.getpid())
    fh = gateway.open("/tracing/kprobe_events", os.O_WRONLY | os.O_APPEND, me)
    try:
        assert gateway.write(fh, line.encode(), 0, me) == len(line)
    finally:
        gateway.release(fh)


def _is_kernel_dir(kernel, path: str) -> bool:
    fd = kernel.syscall(kernel.init_task, "openat", AT_FDCWD, path, O_DIRECTORY, 0)
    if fd >= 0:
        kernel.syscall(kernel.init_task, "close", fd)
    return fd >= 0


def test_a_new_group_and_its_event_are_two_calls_in_order(daemon, hypercalls):
    _write(daemon.gateway, "p:hw_group/hw_one vfs_read\n")
    assert (hypercalls[HC.WORK_NEXT], hypercalls[HC.WORK_DONE]) == (2, 2)
    assert _is_kernel_dir(daemon.kernel, "/sys/kernel/tracing/events/hw_group/hw_one")


def test_an_event_in_a_group_there_is_one_call(daemon, hypercalls):
    _write(daemon.gateway, "p:hw_group/hw_two vfs_read\n")
    assert (hypercalls[HC.WORK_NEXT], hypercalls[HC.WORK_DONE]) == (1, 1)
    assert _is_kernel_dir(daemon.kernel, "/sys/kernel/tracing/events/hw_group/hw_two")
