"""Machine benchmark: boot time, system calls per second and emulated instructions per
second, for an unprobed kernel.  Prints a table; numbers vary with the host, so compare
ratios within one run.

    python3 benchmarks/bench_machine.py [--ops N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, not an install

import argparse
import gc
import statistics
import time

from kprobefs.machine import Kernel
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR
from kprobefs.machine.workload import Workload


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def count_instructions(kernel: Kernel, fn) -> int:
    """Instructions executed by fn(), counted one by one with a code hook (slow, exact)."""
    n = [0]

    def tick(_k, _addr):
        n[0] += 1

    handle = kernel.hook_code(1, 0, tick)
    try:
        fn()
    finally:
        kernel.hook_del(handle)
    return n[0]


def bench(name: str, make_work, ops: int, rows: list) -> None:
    """Run the same deterministic work twice: timed without hooks, then counted."""
    kernel, work = make_work()
    dt = timed(work)
    kernel2, work2 = make_work()
    insns = count_instructions(kernel2, work2)
    rows.append((name, ops / dt, insns / ops, insns / dt))


def getpid_work(ops):
    def make():
        k = Kernel(cpus=2, seed=0)
        t = k.spawn("bench")
        return k, lambda: [k.syscall(t, "getpid") for _ in range(ops)]
    return make


def file_work(ops):
    def make():
        k = Kernel(cpus=2, seed=0)
        t = k.spawn("bench")
        def work():
            for i in range(ops // 4):
                fd = k.syscall(t, "openat", AT_FDCWD, f"/tmp/f{i % 8}", O_CREAT | O_RDWR, 0o644)
                k.syscall(t, "write", fd, b"x" * 64, 64)
                k.syscall(t, "lseek", fd, 0, 0)
                k.syscall(t, "close", fd)
        return k, work
    return make


def workload_work(ops):
    def make():
        k = Kernel(cpus=2, seed=0)
        w = Workload(k, seed=0)
        return k, lambda: w.run(ops)
    return make


def cpu_scaling(ops: int, counts=(1, 2, 8), rounds: int = 9) -> list[tuple[int, float]]:
    """(CPUs, syscalls/s) of the mixed workload on machines of each size: more emulated
    CPUs must not collapse the rate (they take turns on one host thread).  The sizes
    take turns, round after round, and each gets its median: the host's load drifts.
    The machines before are collected first, so that these are mapped where the first
    ones were (see Kernel.TCG_BUFFER_SIZE)."""
    gc.collect()
    machines = []
    for cpus in counts:
        k = Kernel(cpus=cpus, seed=0)
        w = Workload(k, seed=0)
        w.run(ops // 10)                        # warm the translation cache
        machines.append((cpus, w, []))
    for _ in range(rounds):
        for cpus, w, rates in machines:
            rates.append(ops / timed(lambda: w.run(ops)))
    return [(cpus, statistics.median(rates)) for cpus, _w, rates in machines]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    args = ap.parse_args()
    boot = timed(lambda: Kernel(cpus=2, seed=0))
    rows: list = []
    bench("getpid (one task)", getpid_work(args.ops), args.ops, rows)
    bench("open/write/lseek/close", file_work(args.ops), args.ops, rows)
    bench("background workload (mixed)", workload_work(args.ops), args.ops, rows)
    print(f"boot: {boot * 1000:.0f} ms (2 CPUs)")
    print(f"{'work':32} {'syscalls/s':>12} {'insns/syscall':>14} {'emulated insns/s':>17}")
    for name, rate, per, ips in rows:
        print(f"{name:32} {rate:12,.0f} {per:14,.0f} {ips:17,.0f}")
    scaling = cpu_scaling(args.ops)
    one = scaling[0][1]
    print("mixed workload by emulated CPUs: " + ", ".join(
        f"{cpus} CPU{'s' if cpus > 1 else ''} {rate:,.0f}/s (x{rate / one:.2f})"
        for cpus, rate in scaling))


if __name__ == "__main__":
    main()
