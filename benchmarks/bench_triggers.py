"""Hist trigger benchmark: the cost per hit of a hist trigger on an event the kernel
records, in µs per call of kprobe_target_traced above the unprobed call.

The event (bench_tracer.py's 4-argument kprobe on the jump-optimized site) is measured:

- enabled, no trigger: recorded by the kernel's own recorder (the baseline), and by the
  host (a tracer whose clock is not the kernel's), the path triggers take;
- with a hist trigger and not enabled (soft disabled: the trigger runs, nothing is
  written) — an event with triggers is recorded through the host path, which runs them;
- with the hist trigger and enabled (the trigger runs and the event is written);
- with a compound-key hist trigger with a value and a filter;
- enabled at the top level with the hist trigger in an instance (``foo:`` steps write
  under ``instances/foo/``): the host records the top level's record and runs the
  instance's trigger;
- as the end of a latency pair: a kprobe at the entry sets ``ts0``, this one computes
  ``common_timestamp.usecs-$ts0`` and generates a synthetic event into a log2 histogram.

    python3 benchmarks/bench_triggers.py [--calls N]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

from bench_tracer import ARGS, timed_loop, write  # noqa: E402
from kprobefs import Kernel  # noqa: E402
from kprobefs.tracing import Tracer  # noqa: E402

EVENT = "events/kprobes/bench/"
#: ``host:`` cases run a tracer whose clock is not the kernel's, so the host records.
CASES = {
    "recorded, no trigger": ["enable 1"],
    "host:recorded, no trigger": ["enable 1"],
    "hist, soft disabled": ["trigger hist:keys=common_pid"],
    "hist, recorded": ["trigger hist:keys=common_pid", "enable 1"],
    "hist 2 keys+val+filter": ["trigger hist:keys=common_pid,b.log2:vals=a if d >= 0"],
    "top + hist in instance": ["enable 1", "foo:trigger hist:keys=common_pid"],
    "latency pair (synth)": None,
}


def setup_latency(root) -> None:
    write(root, "kprobe_events", "p:start kprobe_target_traced\n")
    write(root, "synthetic_events", "lat u64 lat\n")
    write(root, "events/kprobes/start/trigger", "hist:keys=common_pid:ts0=common_timestamp")
    write(root, EVENT + "trigger",
          "hist:keys=common_pid:lat=common_timestamp-$ts0:onmatch(kprobes.start).lat($lat)")
    write(root, "events/synthetic/lat/trigger", "hist:keys=lat.log2")


def cost(steps, calls: int, host: bool) -> tuple[float, bool, int]:
    """(µs per hit above the unprobed call, whether the kernel recorded it, the hits
    the event's histograms counted, dropped included)."""
    kernel = Kernel(cpus=1, seed=0)
    timed_loop(kernel, 1000, 1)
    base = timed_loop(kernel, calls)
    tracer = Tracer(kernel.kprobes, kernel, **({"clock": kernel.clock_ns} if host else {}))
    root = tracer.tracefs_root()
    write(root, "buffer_size_kb", "16384")
    write(root, "kprobe_events", f"p:bench kprobe_target_traced+5 {ARGS}\n")
    if steps is None:
        setup_latency(root)
    else:
        for step in steps:
            name, data = step.split(" ", 1)
            place = EVENT
            if name.startswith("foo:"):
                if "foo" not in tracer.instances:
                    tracer.new_instance("foo")
                name, place = name[4:], "instances/foo/" + EVENT
            write(root, place + name, data)
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", calls, 1)          # warm
    per_hit = timed_loop(kernel, calls) - base
    tp = next(p for p in tracer.probes if p.event.name == "bench")
    native = tp.native is not None and tp.nhit == 0
    event = tracer.events[("kprobes", "bench")]
    hits = 0
    for tr in tracer.arrays():
        triggers = tr.triggers_of(event)
        if triggers is not None:
            hits += sum(t.data.hits + t.data.drops for t in triggers.items
                        if hasattr(t, "data"))
    return per_hit, native, hits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    print(f"event: p:bench kprobe_target_traced+5 {ARGS} (jump-optimized site)")
    print(f"{'case':26} {'recorder':8} {'us/hit':>8} {'hits/s':>10} {'hist hits':>10}")
    for name, steps in CASES.items():
        host = name.startswith("host:")
        name = name.removeprefix("host:")
        per_hit, native, hits = cost(steps, args.calls, host)
        print(f"{name:26} {'kernel' if native else 'host':8} {per_hit:8.3f} "
              f"{1e6 / per_hit:10,.0f} {hits:10}")


if __name__ == "__main__":
    main()
