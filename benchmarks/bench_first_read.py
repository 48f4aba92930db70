"""The first read of `trace`, in-process: the CPU (thread time) that formatting a full
default buffer takes, issue 31's two buffer rows without FUSE and the machine thread.

The machine runs the workload until every CPU's buffer (1408 KiB each) overwrote, with
one 4-argument kprobe event on do_syscall_64 (recorded by the kernel), or with 10,000
events on function entries and just past them, two at many addresses (recorded by the
host's interpreter).  Then `trace` is read through its node: each first read with the
text kept from the last one dropped first (a buffer nobody has read): with every text
the formatter keeps from one read to the next dropped too (events, contexts and values
nobody has printed), then with those kept, and a reread.
Each figure is the median of --rounds reads (and the fastest first read: on a busy
machine the least disturbed).

    python3 benchmarks/bench_first_read.py [--many] [--rounds N] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

from kprobefs import Kernel  # noqa: E402
from kprobefs.machine.workload import Workload  # noqa: E402
from kprobefs.tracing import Tracer  # noqa: E402

from bench_tracer import write  # noqa: E402

EVENT_ARGS = "a=%di b=%si c=%dx d=%cx"


def read(root, path: str) -> bytes:
    node = root
    for part in path.split("/"):
        node = node.children()[part]
    handle = node.open(os.O_RDONLY, 1, "bench")
    try:
        out, offset = [], 0
        while data := handle.read(1 << 17, offset):
            out.append(data)
            offset += len(data)
        return b"".join(out)
    finally:
        handle.release()


def probe_points(root, n: int) -> list[str]:
    """n probe points: each traceable function once by name, and its entry and +5 (as
    bench_round3 picks them, taken round again when there are fewer)."""
    names = read(root, "available_filter_functions").decode().split()
    seen = Counter(names)
    once = [name for name in names if seen[name] == 1]
    points = [f"{name}{suffix}" for name in once for suffix in ("", "+5")]
    return [points[i % len(points)] for i in range(n)]


def filled(many: bool) -> tuple[Tracer, object]:
    kernel = Kernel(cpus=2, seed=0)
    tracer = Tracer(kernel.kprobes, kernel)
    root = tracer.tracefs_root()
    write(root, "tracing_on", "0")
    write(root, "buffer_size_kb", "1408")
    points = probe_points(root, 10_000) if many else ["do_syscall_64"]
    for i, point in enumerate(points):
        try:
            write(root, "kprobe_events", f"p:{'b%d' % i if many else 'fill'} {point} "
                                         f"{EVENT_ARGS}\n")
        except OSError:
            pass                    # not probeable (as Linux refuses it)
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    write(root, "tracing_on", "1")
    workload = Workload(kernel, seed=0)
    while not all(tracer.buffer.stats(cpu)[1] for cpu in range(kernel.nr_cpus)):
        workload.run(500, timeout=600)
    write(root, "tracing_on", "0")
    write(root, "events/kprobes/enable", "0")
    return tracer, root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--many", action="store_true", help="10,000 events (row 2)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="cProfile one first read")
    args = ap.parse_args()
    tracer, root = filled(args.many)
    kept = tracer.top._kept_lines
    colds, firsts = [], []
    for _ in range(args.rounds):
        kept.clear()
        tracer.top._text_caches.drop()
        start = time.thread_time()
        text = read(root, "trace")
        colds.append(time.thread_time() - start)
    for _ in range(args.rounds):
        kept.clear()
        start = time.thread_time()
        read(root, "trace")
        firsts.append(time.thread_time() - start)
    rereads = []
    for _ in range(args.rounds):
        start = time.thread_time()
        again = read(root, "trace")
        rereads.append(time.thread_time() - start)
    assert again == text
    lines = text.count(b"\n")
    cold, first = statistics.median(colds), statistics.median(firsts)
    reread = statistics.median(rereads)
    print(f"{'10,000 events' if args.many else 'one event'}: {lines} lines, "
          f"{len(text) / 1e6:.1f} MB; first read {cold * 1e3:.1f} ms "
          f"({cold / lines * 1e9:.0f} ns a line, {len(text) / cold / 1e6:.0f} MB/s; "
          f"the fastest {min(colds) * 1e3:.1f} ms); with the texts of earlier reads "
          f"kept {first * 1e3:.1f} ms ({len(text) / first / 1e6:.0f} MB/s); "
          f"reread {reread * 1e3:.1f} ms")
    if args.profile:
        kept.clear()
        profile = cProfile.Profile()
        profile.runcall(read, root, "trace")
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
