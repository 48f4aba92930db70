"""trace_clock: each of Linux 6.1's clocks is the clock its name says
(tracing/buffers/clocks.py), ``trace`` prints the ones not in nanoseconds as plain
numbers, and the kernel's recorder stamps with the TSC clocks while the host records the
others."""

import re
import time

import pytest

from kprobefs import Kernel
from kprobefs.machine.clock import read_tsc
from kprobefs.tracing import Tracer
from kprobefs.tracing.buffers.clocks import TRACE_CLOCK_NAMES, trace_clocks

from test_tracer_e2e import read, write

SECOND = 10**9


class FakeHost:
    """Host clocks that each run their own way: the raw clock slower than the
    monotonic one, the boot clock past a suspend, TAI a date."""

    def __init__(self):
        self.ktime, self.local = 5 * SECOND, 2 * SECOND
        self.host = {time.CLOCK_MONOTONIC_RAW: 70 * SECOND,
                     time.CLOCK_BOOTTIME: 90 * SECOND,
                     time.CLOCK_TAI: 1_700_000_000 * SECOND}

    def advance(self, ns, raw, suspended):
        self.ktime += ns
        self.local += ns
        self.host[time.CLOCK_MONOTONIC_RAW] += raw
        self.host[time.CLOCK_BOOTTIME] += ns + suspended
        self.host[time.CLOCK_TAI] += ns + suspended


def test_each_clock_reads_what_linux_reads():
    h = FakeHost()
    clocks = trace_clocks(lambda: h.local, lambda: h.ktime, gettime=h.host.__getitem__)
    assert tuple(clocks) == TRACE_CLOCK_NAMES
    h.advance(1_000_000, raw=999_000, suspended=30 * SECOND)
    now = {name: clock.read() for name, clock in clocks.items()}
    assert now["local"] == 2 * SECOND + 1_000_000                   # sched_clock
    assert now["perf"] == now["global"] == 5 * SECOND + 1_000_000   # ... on ktime
    assert now["mono"] == 5 * SECOND + 1_000_000                    # ktime
    assert now["mono_raw"] == 5 * SECOND + 999_000                  # the raw clock's pace
    assert now["boot"] == 35 * SECOND + 1_000_000                   # mono + time suspended
    assert now["tai"] == 1_700_000_030 * SECOND + 1_000_000         # the host's TAI
    assert now["uptime"] == (5 * SECOND + 1_000_000) // 4_000_000 * 4 // 10   # clock_t
    assert [clocks["counter"].read() for _ in range(3)] == [now["counter"] + 1,
                                                           now["counter"] + 2,
                                                           now["counter"] + 3]
    assert {n for n, c in clocks.items() if not c.in_ns} == {"counter", "uptime", "x86-tsc"}
    # A fake kernel has no TSC: the host records every clock.
    assert all(c.tsc is None for c in clocks.values())


STAMP = re.compile(r" (\d+)(?:\.(\d{6}))?: (k|tracing_mark_write):")


def _stamps(text):
    """(event, value, printed in seconds.microseconds) of each record in trace."""
    out = []
    for m in STAMP.finditer(text):
        if m.group(2) is None:
            out.append((m.group(3), int(m.group(1)), False))
        else:
            out.append((m.group(3), int(m.group(1)) * 10**6 + int(m.group(2)), True))
    return out


@pytest.fixture(scope="module")
def machine():
    """A kernel that booted 400 s before its TSC clock started (ktime runs 400 s ahead
    of local), and a tracer recording one event in the kernel."""
    kernel = Kernel(cpus=1, seed=0)
    kernel.ktime = kernel.ktime.shifted(400 * SECOND)
    kernel.write(kernel.image.symbol_value("ktime_tsc"), kernel.ktime.kernel_layout())
    tracer = Tracer(kernel.kprobes, kernel)
    root = tracer.tracefs_root()
    write(root, "kprobe_events", "p:k kprobe_target_traced+5 a=%di\n")
    write(root, "events/kprobes/k/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    assert kernel.kprobes.get_kprobe(tracer.probes[0].address).is_optimized()
    return kernel, tracer, root


def _readings(kernel):
    return {"local": kernel.trace_clock.read(), "cycles": read_tsc(),
            "ktime": kernel.clock_ns(), "tai": time.clock_gettime_ns(time.CLOCK_TAI)}


def _clock_t(ns):
    return ns // 4_000_000 * 4 // 10


TOLERANCE = 2_000_000       # ns: the TSC's calibration against the host's clocks


# clock -> (the reading it falls between, tolerance, in ns, recorded by the kernel)
EXPECT = {
    "local": ("local", 0, True, True),
    "global": ("ktime", TOLERANCE, True, True),
    "perf": ("ktime", TOLERANCE, True, True),
    "mono": ("ktime", 0, True, False),
    "mono_raw": ("ktime", TOLERANCE, True, False),
    "boot": ("ktime", TOLERANCE, True, False),
    "tai": ("tai", 0, True, False),
    "x86-tsc": ("cycles", 0, False, True),
    "uptime": ("uptime", 0, False, False),
    "counter": (None, 0, False, False),
}


@pytest.mark.parametrize("name", list(EXPECT) + [pytest.param("local", id="local-again")])
def test_each_clock_stamps_kernel_and_host_records(machine, name):
    """Records the kernel stamps (the event) and the host stamps (trace_marker) fall
    between readings of the clock's source taken around them; the non-ns clocks print
    as numbers; a clock the kernel cannot read moves the event to the host."""
    kernel, tracer, root = machine
    source, slack, in_ns, by_kernel = EXPECT[name]
    (tp,) = tracer.probes
    write(root, "trace_clock", name)
    assert f"[{name}]" in read(root, "trace_clock")
    host_hits = tp.nhit
    before = _readings(kernel)
    kernel.upcall("kprobe_bench_loop", 2, 1)
    write(root, "trace_marker", "m")
    after = _readings(kernel)
    assert (tp.nhit - host_hits == 0) == by_kernel
    stamps = _stamps(read(root, "trace"))
    assert [(event, printed_ns) for event, _, printed_ns in stamps] == [
        ("k", in_ns), ("k", in_ns), ("tracing_mark_write", in_ns)]
    values = [value for _, value, _ in stamps]
    assert values == sorted(values)
    if source is None:                          # counter: one more per record
        assert values == [values[0], values[0] + 1, values[0] + 2]
        return
    if source == "uptime":
        low, high = _clock_t(before["ktime"]), _clock_t(after["ktime"])
    else:
        low, high = before[source] - slack, after[source] + slack
    if in_ns:                                   # printed in microseconds, rounded
        low, high = (low - 500) // 1000, (high + 500) // 1000
    assert all(low <= v <= high for v in values), (low, values, high)
    if name == "local":
        assert values[-1] < 100 * 10**6         # the TSC clock started at boot...
    elif in_ns and name != "tai":
        assert values[0] > 400 * 10**6          # ...and ktime 400 s before it
