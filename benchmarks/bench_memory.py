"""Memory benchmark: the daemon's resident set size (RSS) at idle, with 10,000 probes, and
after a day's worth of events through a small buffer.  Not a timed test.

The daemon runs in this process (kprobefs.daemon.Daemon serving a real FUSE mount from
a thread), so the RSS printed is the daemon's, and the "day" can be pushed through the
tracer's own recording path (Tracer.write_marker: timestamp, comm, ring buffer) far
faster than FUSE round trips allow.  A day at 100 events/s is 8.64 M events.

    python3 benchmarks/bench_memory.py [--probes N] [--events N] [--buffer-kb K]

Needs root and /dev/fuse.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree, not an install

import argparse
import gc
import os
import signal
import subprocess
import tempfile
import threading
import time

from kprobefs.daemon import Daemon


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def write(path: str, data: str, trunc: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | (os.O_TRUNC if trunc else os.O_APPEND))
    try:
        view = memoryview(data.encode())
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def probe_lines(daemon: Daemon, count: int) -> list[str]:
    """count probe definitions spread over the probe-able functions (entry points)."""
    engine = daemon.kernel.kprobes
    names = []
    for sym in daemon.kernel.image.symbols:
        if not (sym.is_text and sym.size) or sym.name.startswith("__"):
            continue
        if sym.name in names or len(daemon.kernel.image.lookup_name(sym.name)) != 1:
            continue
        names.append(sym.name)
    blacklisted = {line.split()[-1] for line in engine.blacklist_text().splitlines()}
    names = [n for n in names if n not in blacklisted and n not in _BUSY]
    return [f"p:m{i} {names[i % len(names)]}\n" for i in range(count)], names


#: Not probed here: refused by the engine anyway, or on every path the bench itself uses.
_BUSY = {"kprobe_target_notrace"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probes", type=int, default=10_000)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--buffer-kb", type=int, default=64)
    args = ap.parse_args()

    mnt = tempfile.mkdtemp(prefix="kprobefs-bench-")
    daemon = Daemon(mnt, cpus=2, seed=0)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    daemon.boot()
    server = threading.Thread(target=daemon.serve, daemon=True)
    server.start()
    if not daemon.ready.wait(60):
        sys.exit("the mount did not become ready")
    tracing = os.path.join(mnt, "tracing")
    rows = []
    try:
        os.listdir(tracing)
        gc.collect()
        rows.append(("idle (booted, mounted)", rss_mb(), ""))

        lines, functions = probe_lines(daemon, args.probes)
        # Through the Python API: the tracer's own kprobe_events command runner (what a
        # write reaches, without a FUSE round trip per retried line), 500 lines a call.
        run = daemon.tracer.run_commands
        started = time.perf_counter()
        # The first probe on each function alone: the functions the engine refuses are
        # learnt there; the rest go 500 lines a call, without those.
        refused = set()
        for line in lines[:len(functions)]:
            try:
                run(line.encode())
            except OSError:
                refused.add(line.split()[1])
        rest = [line for line in lines[len(functions):] if line.split()[1] not in refused]
        for i in range(0, len(rest), 500):
            run("".join(rest[i:i + 500]).encode())
        took = time.perf_counter() - started
        gc.collect()
        listed = len(open(os.path.join(mnt, "kprobes", "list")).read().splitlines())
        accepted = len(open(f"{tracing}/kprobe_events").read().splitlines())
        rows.append((f"{accepted:,} probes ({listed:,} in kprobes/list, "
                     f"{len(functions)} functions)", rss_mb(),
                     f"registered in {took:.1f} s"))
        write(f"{tracing}/kprobe_events", "", trunc=True)
        gc.collect()
        rows.append(("probes removed again", rss_mb(), ""))

        write(f"{tracing}/buffer_size_kb", f"{args.buffer_kb}\n", trunc=True)
        tracer = daemon.tracer
        base = rss_mb()
        started = time.perf_counter()
        marker = tracer.write_marker
        samples = []
        step = max(1, args.events // 10)
        for n in range(args.events):
            marker(b"event %d\n" % n, 4242, "bench")
            if n % step == step - 1:
                samples.append(rss_mb())
        took = time.perf_counter() - started
        gc.collect()
        head = open(f"{tracing}/trace").read().split("\n", 3)[2]
        rows.append((f"{args.events:,} events through a {args.buffer_kb} KiB/CPU buffer",
                     rss_mb(), f"{args.events / took:,.0f} events/s; RSS over the run "
                               f"{min(samples):.1f}..{max(samples):.1f} MB "
                               f"(start {base:.1f}); {head.strip('# ')}"))
    finally:
        subprocess.run(["fusermount", "-u", mnt], capture_output=True)
        server.join(30)
        for s, h in saved.items():
            signal.signal(s, h)
        try:
            os.rmdir(mnt)
        except OSError:
            pass

    print(f"{'state':<62} {'RSS MB':>7}  notes")
    for what, mb, notes in rows:
        print(f"{what:<62} {mb:7.1f}  {notes}")
    print(f"peak RSS (VmHWM): {hwm_mb():.1f} MB")


if __name__ == "__main__":
    main()
