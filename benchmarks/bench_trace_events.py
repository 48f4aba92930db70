"""Static-event benchmark: what a tracepoint costs the code it sits in.

The kernel's syscall_bench_loop calls getpid through the system call path
(do_syscall_64) n times; that path holds raw_syscalls' sys_enter and sys_exit
tracepoints and the syscalls events' static branch.  Each is a 5-byte NOP while its
event is disabled.  Measured, µs per iteration (one hit of each enabled event):

- every event disabled: the NOPs only (the unprobed call);
- raw_syscalls:sys_enter enabled, with tracing off: the jump, the probe, the
  recording flag checked;
- raw_syscalls:sys_enter enabled and recording: the kernel recorder fills and stages
  a 64-byte record;
- syscalls:sys_enter_getpid enabled and recording (the syscalls path: the call's
  metadata looked up, a 16-byte record).

Each hit is recorded by kernel code alone; the host takes full pages.

    python3 benchmarks/bench_trace_events.py [--calls N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

from kprobefs import Kernel  # noqa: E402
from kprobefs.machine.jump_label import NOP5  # noqa: E402
from kprobefs.tracing import Tracer  # noqa: E402

from bench_tracer import write  # noqa: E402  (tracefs writes, as that benchmark makes them)


def timed_loop(kernel: Kernel, calls: int, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        kernel.upcall("syscall_bench_loop", calls)
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    kernel = Kernel(cpus=1, seed=0)
    tracer = Tracer(kernel.kprobes, kernel)
    root = tracer.tracefs_root()
    write(root, "buffer_size_kb", "4096")
    enter = tracer.events[("raw_syscalls", "sys_enter")]
    sites = tracer.static_events.jump_labels.sites(enter.key)
    assert all(kernel.read(s, 5) == NOP5 for s in sites)
    timed_loop(kernel, 1000)                                    # warm the translations
    base = timed_loop(kernel, args.calls)
    rows = []
    write(root, "events/raw_syscalls/sys_enter/enable", "1")
    write(root, "tracing_on", "0")
    rows.append(("raw_syscalls:sys_enter, tracing off", timed_loop(kernel, args.calls)))
    write(root, "tracing_on", "1")
    rows.append(("raw_syscalls:sys_enter, recording", timed_loop(kernel, args.calls)))
    write(root, "events/raw_syscalls/sys_enter/enable", "0")
    write(root, "events/syscalls/sys_enter_getpid/enable", "1")
    rows.append(("syscalls:sys_enter_getpid, recording", timed_loop(kernel, args.calls)))
    write(root, "events/syscalls/sys_enter_getpid/enable", "0")
    # An instance's records: the kernel hands each to the host (HC_TRACE_EVENT).
    tracer.new_instance("bench")
    write(root, "instances/bench/buffer_size_kb", "4096")
    write(root, "instances/bench/events/raw_syscalls/sys_enter/enable", "1")
    rows.append(("raw_syscalls:sys_enter, recording in an instance",
                 timed_loop(kernel, args.calls)))
    tracer.remove_instance("bench")
    assert all(kernel.read(s, 5) == NOP5 for s in sites)
    after = timed_loop(kernel, args.calls)
    print(f"getpid through do_syscall_64, every tracepoint a NOP: {base:.3f} us "
          f"({after:.3f} us after the events were disabled again)")
    print(f"{'event':50} {'us/iter':>8} {'us/hit':>8} {'events/s':>10}")
    for name, us in rows:
        hit = us - base
        rate = f"{1e6 / us:10,.0f}" if "recording" in name else f"{'—':>10}"
        print(f"{name:50} {us:8.3f} {hit:8.3f} {rate}")


if __name__ == "__main__":
    main()
