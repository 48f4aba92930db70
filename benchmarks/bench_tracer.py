"""Tracer benchmark: the cost of recording a 4-argument kprobe event, per hit, and events
recorded per second.

The event is recorded on a jump-optimized site (kprobe_target_traced+5), on the same
site unoptimized (an int3), on an ftrace site (the function's entry), and as a return
probe.  Each is measured three ways, in one run:

- recorded by the kernel itself (kernel/trace_native.c: the detour or trampoline calls
  the recorder, no host code runs; an int3 hit enters a stub that does, through one
  code hook; the default);
- the same probe hit with tracing off (the recorder counts the hit and returns): the
  bare native hit;
- recorded by the host's interpreter (a tracer whose clock is not the kernel's keeps
  every hit in the host).

Last, the optimized site's event enabled in the top level and in one instance
(instances/): the kernel records the top level's events only, so the host's handler
records each hit into both arrays.

The floor of the issue's target is the bare optimized probe hit of the engine: a kprobe
with an empty Python handler on the same site.  Every number is µs per call of
kprobe_target_traced above the unprobed call.

    python3 benchmarks/bench_tracer.py [--calls N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

from kprobefs import Kernel, Kprobe  # noqa: E402
from kprobefs.tracing import Tracer  # noqa: E402

ARGS = "a=%di b=%si:u32 c=%dx:x64 d=%cx:s64"
#: kind of site -> the probe definition without its name, and whether to jump-optimize
SITES = {"optimized": (f"p kprobe_target_traced+5 {ARGS}", True),
         "int3": (f"p kprobe_target_traced+5 {ARGS}", False),
         "ftrace": (f"p kprobe_target_traced {ARGS}", True),
         "return": ("r kprobe_target_traced a=$retval b=%si:u32 c=%dx:x64 d=%cx:s64", True)}


def timed_loop(kernel: Kernel, calls: int, repeat: int = 3) -> float:
    """µs per iteration of kprobe_bench_loop (median of repeat runs)."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        kernel.upcall("kprobe_bench_loop", calls, 1)
        times.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(times)


def write(root, path: str, data: str) -> None:
    node = root
    for part in path.split("/"):
        node = node.children()[part]
    h = node.open(os.O_WRONLY | os.O_APPEND, 1, "bench")
    try:
        h.write(data.encode(), 0)
    finally:
        h.release()


def bare_hit(calls: int) -> tuple[float, float]:
    """(unprobed call, bare optimized kprobe hit above it), µs."""
    kernel = Kernel(cpus=1, seed=0)
    timed_loop(kernel, 1000, 1)
    base = timed_loop(kernel, calls)
    bare = Kprobe(symbol_name="kprobe_target_traced", offset=5, pre_handler=lambda p, r: 0)
    kernel.register_kprobe(bare)
    kernel.wait_for_kprobe_optimizer()
    assert "[OPTIMIZED]" in kernel.kprobes.list_text()
    return base, timed_loop(kernel, calls) - base


def event_costs(probe: str, optimize: bool, native: bool, calls: int,
                instance: bool = False) -> dict[str, float]:
    """µs per hit above the unprobed call: recorded, and (native) with tracing off;
    events recorded per second.  With ``instance``, the event is enabled in an instance
    too (each hit is recorded twice, by the host)."""
    kernel = Kernel(cpus=1, seed=0)
    timed_loop(kernel, 1000, 1)
    base = timed_loop(kernel, calls)
    kernel.kprobes.set_optimization(optimize)
    tracer = Tracer(kernel.kprobes, kernel, **({} if native else {"clock": kernel.clock_ns}))
    root = tracer.tracefs_root()
    size = "16000" if instance else "16384"       # the bound is for all arrays together
    write(root, "buffer_size_kb", size)
    kind, definition = probe.split(" ", 1)
    write(root, "kprobe_events", f"{kind}:bench {definition}\n")
    write(root, "events/kprobes/bench/enable", "1")
    arrays = [tracer.top]
    if instance:
        root.children()["instances"].mkdir("bench", 0o755)
        write(root, "instances/bench/buffer_size_kb", size)
        write(root, "instances/bench/events/kprobes/bench/enable", "1")
        arrays.append(tracer.instances["bench"])
    kernel.wait_for_kprobe_optimizer()
    (tp,) = tracer.probes
    assert (tp.native is not None) == native
    out = {}
    kernel.upcall("kprobe_bench_loop", calls, 1)        # warm: the recorder is translated
    out["recorded"] = timed_loop(kernel, calls) - base
    # each call records one event in each array
    out["events/s"] = len(arrays) * 1e6 / (out["recorded"] + base)
    if instance:
        for tr in arrays:
            assert tr.buffer.counts() == (4 * calls, 4 * calls)
        return out
    if native:
        assert tp.nhit == 0                     # no hit reached the host
        write(root, "tracing_on", "0")
        out["not recording"] = timed_loop(kernel, calls) - base
    in_buffer, written = tracer.buffer.counts()
    assert in_buffer == written == 4 * calls
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40000)
    args = ap.parse_args()
    base, bare = bare_hit(args.calls)
    print(f"event: p:bench SITE {ARGS} (a return probe: a=$retval, then the same)")
    print(f"unprobed call {base:.3f} us; bare optimized kprobe hit (empty Python handler) "
          f"{bare:.3f} us")
    print(f"{'site':10} {'recorder':8} {'us/hit':>8} {'above bare':>10} "
          f"{'not recording':>13} {'events/s':>10}")
    for kind, (probe, optimize) in SITES.items():
        for native in (True, False):
            r = event_costs(probe, optimize, native, args.calls)
            off = f"{r['not recording']:.3f}" if native else "-"
            print(f"{kind:10} {'kernel' if native else 'host':8} {r['recorded']:8.3f} "
                  f"{r['recorded'] - bare:10.3f} {off:>13} {r['events/s']:10,.0f}")
    probe, optimize = SITES["optimized"]
    r = event_costs(probe, optimize, True, args.calls, instance=True)
    print(f"{'optimized':10} {'host x2':8} {r['recorded']:8.3f} "
          f"{r['recorded'] - bare:10.3f} {'-':>13} {r['events/s']:10,.0f}")
    print("host x2: enabled in the top level and an instance, recorded into both by the "
          "host")
    print("target: recording adds <= 1 us per event above the bare optimized hit")


if __name__ == "__main__":
    main()
