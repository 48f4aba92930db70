"""Registration at scale, in-process (no FUSE): 10,000 probes through the Python API,
and 10,000 `p:` lines written to kprobe_events in one write, then all enabled with
events/kprobes/enable; and the same with 2,000 events on one function (one aggregated
probe whose children keep coming).  Not a timed test: it prints the seconds.

The Python-API probes sit on instruction boundaries spread over every probe-able
function (entries, ftrace sites and inner instructions alike), each with a Python
pre-handler, registered with register_kprobes() as one batch.  The kprobe_events lines
are one event per function entry and second instruction, as bench_fs writes them, through
the tracefs file objects (the same code a FUSE write reaches).

    python3 benchmarks/bench_scale.py [--probes N] [--lines N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, not an install

import argparse
import os
import time

from kprobefs import Kernel, Kprobe
from kprobefs.daemon import make_tracer


def probeable(kernel) -> list:
    """The functions a probe may go in: text, unique name, not blacklisted."""
    black = {line.split()[-1] for line in kernel.kprobes.blacklist_text().splitlines()}
    out = []
    for sym in kernel.image.symbols:
        if not (sym.is_text and sym.size) or sym.name.startswith("__") or sym.name in black:
            continue
        if sym.name == "kprobe_target_notrace" or len(kernel.image.lookup_name(sym.name)) != 1:
            continue
        out.append(sym)
    return out


def python_api(count: int) -> tuple[int, float, float]:
    """(registered, seconds to register, seconds to unregister) for count probes."""
    kernel = Kernel(cpus=2, seed=0)
    arch = kernel.kprobes.arch
    points = [(sym.name, addr - sym.addr) for sym in probeable(kernel)
              for addr in sorted(arch.function_text(sym).by_address)]
    arch._text_cache.clear()            # what registration decodes is part of its cost
    chosen = points[::max(1, len(points) // count)][:count]
    probes = [Kprobe(symbol_name=name, offset=off, pre_handler=lambda p, regs: 0)
              for name, off in chosen]
    started = time.perf_counter()
    ok = []
    for i in range(0, len(probes), 500):
        batch = probes[i:i + 500]
        try:
            kernel.register_kprobes(batch)
            ok += batch
        except OSError:         # a point the engine refuses: that batch one by one
            for p in batch:
                p = Kprobe(symbol_name=p.symbol_name, offset=p.offset,
                           pre_handler=p.pre_handler)   # a failed batch left p resolved
                try:
                    kernel.register_kprobe(p)
                    ok.append(p)
                except OSError:
                    pass
    kernel.wait_for_kprobe_optimizer()
    took = time.perf_counter() - started
    started = time.perf_counter()
    kernel.unregister_kprobes(ok)
    return len(ok), took, time.perf_counter() - started


def kprobe_events(count: int, one_function: str | None = None
                  ) -> tuple[int, float, float, float]:
    """(events, seconds for the one write, seconds to enable all, seconds to remove all);
    with one_function, every event is on that function's entry."""
    kernel = Kernel(cpus=2, seed=0)
    tracer = make_tracer(kernel, kernel.kprobes)     # the daemon's own wiring
    root = tracer.tracefs_root()

    def write(path: str, data: str, flags: int = os.O_WRONLY | os.O_APPEND) -> None:
        n = root
        for part in path.split("/"):
            n = n.children()[part]
        h = n.open(flags, 1, "sh")
        try:
            h.write(data.encode(), 0)
        finally:
            h.release()

    # As bench_fs: the traceable functions (ftrace sites), their entry and the
    # instruction after the 5-byte NOP.
    names = tracer.symbols.ftrace_functions()
    ok = {sym.name for sym in probeable(kernel)}
    points = [f"{name}{suffix}" for name in names if name in ok and names.count(name) == 1
              for suffix in ("", "+5")]
    if one_function is not None:
        points = [one_function]
    lines = "".join(f"p:b{i} {points[i % len(points)]}\n" for i in range(count))
    started = time.perf_counter()
    write("kprobe_events", lines)
    wrote = time.perf_counter() - started
    started = time.perf_counter()
    write("events/kprobes/enable", "1\n")
    kernel.kprobes.wait_for_kprobe_optimizer()
    enabled = time.perf_counter() - started
    events = len(tracer.events)
    started = time.perf_counter()
    write("events/kprobes/enable", "0\n")
    write("kprobe_events", "", flags=os.O_WRONLY | os.O_TRUNC)
    return events, wrote, enabled, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=10_000)
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--same", type=int, default=2_000,
                    help="events on one function (vfs_read)")
    args = ap.parse_args()
    n, took, gone = python_api(args.probes)
    print(f"Python API: {n:,} probes registered in {took:.2f} s "
          f"({took / max(n, 1) * 1e6:.0f} µs each), unregistered in {gone:.2f} s")
    n, wrote, enabled, gone = kprobe_events(args.lines)
    print(f"kprobe_events: {n:,} events in one write {wrote:.2f} s, all enabled in "
          f"{enabled:.2f} s, together {wrote + enabled:.2f} s; disabled and removed in "
          f"{gone:.2f} s")
    n, wrote, enabled, gone = kprobe_events(args.same, "vfs_read")
    print(f"kprobe_events, all on vfs_read: {n:,} events in one write {wrote:.2f} s, "
          f"all enabled in {enabled:.2f} s; disabled and removed in {gone:.2f} s")


if __name__ == "__main__":
    main()
