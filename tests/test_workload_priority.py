"""The background workload takes only the machine time that mount requests leave: the
machine is one host thread, and a workload call that runs is time a request waits.  No
workload call starts while a call somebody waits for wants the machine, nor in the short
gap after it in which its caller makes the next one; a request asleep in the kernel (a
read that waits for data) leaves the machine to the workload."""

import struct
import time

import pytest

from kprobefs.machine import Kernel, abi
from kprobefs.machine import workload as workload_module
from kprobefs.machine.workload import STARVE_SECONDS, Workload


@pytest.fixture
def machine(monkeypatch):
    """(kernel, workload at 2,000 a second, the calls it started, a clock held still)."""
    k = Kernel(cpus=2, seed=0)
    w = Workload(k, seed=0, rate=2000)
    started: list[str] = []
    submit = w._submit
    monkeypatch.setattr(w, "_submit", lambda task, call: (
        started.append(call[0]), submit(task, call))[1])
    now = [time.monotonic()]
    monkeypatch.setattr(workload_module.time, "monotonic", lambda: now[0])
    return k, w, started, now


def _settle(k: Kernel) -> None:
    while k.run_slice():
        pass


def test_no_workload_call_starts_while_a_request_wants_the_machine(machine):
    k, w, started, now = machine
    task = k.spawn("cat")
    with k.lock:
        _settle(k)
        req = k.submit(task, "getppid")         # posted: on its way to a CPU
        now[0] += 0.02
        assert not k.background_may_run()
        w.pump()
        assert started == []
        _settle(k)
        assert req.done.is_set() and req.result == 1
        assert started == []
        # Just ended: its caller is about to make its next request.
        assert not k.background_may_run()
        # Just past the quiet time: at a clock of some hours, clock + 0.021 - (clock +
        # 0.02) falls a hair short of 0.001 as often as not.
        now[0] += k.FOREGROUND_QUIET * 1.01
        assert k.background_may_run()
        w.pump()
        assert len(started) == 3                # every waiting worker
        _settle(k)
        assert len(started) > 40                # they went on while budget lasted


def test_a_request_loaded_and_running_holds_the_workload_back(machine):
    """Between its posting and its end the request wants the machine at every stage:
    queued behind its task's earlier call, loaded with its wake-up queued, running
    (TASK_RUNNING) in the kernel; the workers' calls that end meanwhile do not go on,
    not even to queue the calls of a child a fork of theirs made."""
    k, w, started, now = machine
    task = k.spawn("cat")
    seen = []
    may_run = k.background_may_run

    def looking():
        seen.append(may_run())
        return seen[-1]
    k.background_may_run = looking
    submitted = []
    submit = k.submit
    k.submit = lambda task, name, *args, **kw: (submitted.append(name),
                                                submit(task, name, *args, **kw))[1]
    with k.lock:
        _settle(k)
        now[0] += 0.02
        w.pump()                                # the workers' calls are in flight
        assert started == ["socket", "fork", "newfstatat"]
        seen.clear()
        submitted.clear()
        first = k.submit(task, "getppid")
        second = k.submit(task, "getpid")      # queued behind the first
        _settle(k)
        assert first.done.is_set() and second.done.is_set()
    assert len(started) == 3 and seen and not any(seen)
    assert submitted == ["getppid", "getpid"]


def test_a_request_asleep_in_the_kernel_leaves_the_machine_to_the_workload(machine):
    k, w, started, now = machine
    task = k.spawn("server")
    fd = k.sys(task, "socket", abi.AF_INET, abi.SOCK_STREAM, 0)
    addr = struct.pack("<H", abi.AF_INET) + struct.pack("!H", 9123) + bytes(12)
    k.sys(task, "bind", fd, addr, 16)
    k.sys(task, "listen", fd, 4)
    with k.lock:
        req = k.submit(task, "accept4", fd, 0, 0, 0)    # no connection comes
        _settle(k)
        assert not req.done.is_set()
        now[0] += 0.02
        assert k.background_may_run()           # its task sleeps in accept
        w.pump()
        assert len(started) == 3


def test_a_starved_workload_still_starts_a_call_now_and_then(machine):
    k, w, started, now = machine
    task = k.spawn("cat")
    with k.lock:
        _settle(k)
        req = k.submit(task, "getppid")
        now[0] += STARVE_SECONDS / 2
        w.pump()
        assert started == []
        now[0] += STARVE_SECONDS
        w.pump()
        assert len(started) == 1                # one, not the budget
        w.pump()
        assert len(started) == 1
        _settle(k)
        assert req.done.is_set()


def test_the_machine_thread_pumps_the_workload_once_requests_leave_it_time():
    """In a daemon the workload is background work: pumped at the periodic rounds and
    FOREGROUND_QUIET after the last request somebody waited for ended."""
    k = Kernel(cpus=2, seed=0)
    w = Workload(k, seed=0, rate=2000)
    w.drive()
    assert w.pump in k.periodic and w.pump in k.background
    task = k.spawn("cat")
    k.syscall(task, "getppid")
    assert k.background_due > 0
