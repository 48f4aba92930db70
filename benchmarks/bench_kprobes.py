"""Probe overhead, kprobes.txt section 6 style, for this engine.

The emulated kernel's kprobe_bench_loop(n) calls a small function n times; each row
probes that function a different way and reports the cost per hit above the unprobed
call, in microseconds, beside the floor (one bare Python code hook per hit, through
Unicorn's Python API, and through the raw C-callback hook the engine uses).  Numbers
drift with machine load: compare ratios within one run.  Time is the CPU time of the
thread that runs the emulation (``--clock cpu``, the default): on a shared machine, wall
time (``--clock wall``) also counts the time the thread waited for a core, which moved
single rows by 2x between runs.

    python3 benchmarks/bench_kprobes.py [--calls N] [--clock cpu|wall] [--rounds N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, not an install

import argparse
import statistics
import time

from unicorn import UC_HOOK_CODE

from kprobefs import Jprobe, Kernel, Kprobe, Kretprobe
from kprobefs.machine._fastuc import add_code_hook

ROWS = [
    ("k", "kprobe, int3 + single-step (boosting off)"),
    ("b", "kprobe, boosted (int3, copy, jump back)"),
    ("o", "kprobe, jump-optimized (detour)"),
    ("f", "kprobe on an ftrace site"),
    ("j", "jprobe"),
    ("r", "kretprobe, single-stepped entry"),
    ("rb", "kretprobe, boosted entry"),
    ("ro", "kretprobe, optimized entry"),
    ("kr", "kprobe + kretprobe on one function"),
    ("jr", "jprobe + kretprobe on one function"),
]


def pre(p, regs):
    return 0


def ret(ri, regs):
    return 0


def entry(*args):
    pass


class Bench:
    def __init__(self, calls: int, clock=time.thread_time):
        self.k = Kernel(cpus=1, seed=0)
        self.calls = calls
        self.clock = clock
        self.target = self.k.image.lookup_name("kprobe_target")[0].addr
        self.traced = self.k.image.lookup_name("kprobe_target_traced")[0].addr

    def per_call(self, traced: int = 0, repeat: int = 3) -> float:
        """µs per loop iteration (median of repeat runs)."""
        times = []
        for _ in range(repeat):
            t = self.clock()
            self.k.upcall("kprobe_bench_loop", self.calls, traced)
            times.append((self.clock() - t) / self.calls * 1e6)
        return statistics.median(times)

    def floor(self, raw: bool) -> float:
        k = self.k
        if raw:
            h = add_code_hook(k.uc, self.target, self.target, lambda *a: None)
        else:
            h = k.uc.hook_add(UC_HOOK_CODE, lambda *a: None, begin=self.target, end=self.target)
        k.uc.ctl_remove_cache(self.target, self.target + 1)
        try:
            return self.per_call()
        finally:
            k.uc.hook_del(h)
            k.uc.ctl_remove_cache(self.target, self.target + 1)

    def row(self, name: str) -> float:
        k, eng = self.k, self.k.kprobes
        eng.set_optimization(name in ("o", "ro"))
        eng.arch.boost = name not in ("k", "r")
        probes: list = []
        traced = 0
        if name in ("k", "b", "o", "kr"):
            p = Kprobe(addr=self.target, pre_handler=pre)
            k.register_kprobe(p)
            probes.append(("k", p))
        if name == "f":
            p = Kprobe(addr=self.traced, pre_handler=pre)
            k.register_kprobe(p)
            probes.append(("k", p))
            traced = 1
        if name in ("j", "jr"):
            jp = Jprobe(addr=self.target, entry=entry)
            k.register_jprobe(jp)
            probes.append(("j", jp))
        if name in ("r", "rb", "ro", "kr", "jr"):
            rp = Kretprobe(addr=self.target, handler=ret, maxactive=4)
            k.register_kretprobe(rp)
            probes.append(("r", rp))
        k.wait_for_kprobe_optimizer()
        try:
            return self.per_call(traced)
        finally:
            for kind, p in probes:
                {"k": k.unregister_kprobe, "j": k.unregister_jprobe,
                 "r": k.unregister_kretprobe}[kind](p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    b = Bench(args.calls, time.thread_time if args.clock == "cpu" else time.perf_counter)
    b.per_call()                                   # warm the translation cache
    # Rounds of every measurement, interleaved, each figure the median of its rounds:
    # the host's speed drifts during a run, and a floor measured once at the start
    # moved every ratio with it.
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        base, base_traced = b.per_call(), b.per_call(traced=1)
        for key, value in (("base", base), ("base_traced", base_traced),
                           ("floor", b.floor(raw=False) - base),
                           ("floor_raw", b.floor(raw=True) - base)):
            samples.setdefault(key, []).append(value)
        for name, _ in ROWS:
            samples.setdefault(name, []).append(
                b.row(name) - (base_traced if name == "f" else base))
    med = {key: statistics.median(values) for key, values in samples.items()}
    base, base_traced, floor, floor_raw = (med["base"], med["base_traced"], med["floor"],
                                           med["floor_raw"])
    results = {name: med[name] for name, _ in ROWS}
    print(f"unprobed call: {base:.3f} us (traced variant {base_traced:.3f} us)")
    print(f"floor, one Python code hook per hit: {floor:.3f} us (Unicorn API), "
          f"{floor_raw:.3f} us (raw C callback)")
    print(f"{'probe':5} {'us/hit':>8} {'x floor':>8} {'x raw floor':>12}  what")
    for name, what in ROWS:
        us = results[name]
        print(f"{name:5} {us:8.3f} {us / floor:8.2f} {us / floor_raw:12.2f}  {what}")
    targets = {"o": 1.5, "f": 1.5, "b": 4, "k": 15, "j": 6, "r": 6, "rb": 6, "ro": 6}
    print("targets (x floor):", ", ".join(
        f"{n} <= {t} ({'met' if results[n] / floor <= t else 'MISSED'})"
        for n, t in targets.items()))


if __name__ == "__main__":
    main()
