"""The first read of a big buffer through a real mount: how long until its first
bytes, how long the whole text takes, and the daemon's memory while the text is kept.

A daemon with a background workload fills every CPU's buffer (``--buffer-kb`` each, 16
MiB by default) with one 4-argument kprobe event until each CPU overwrote.  Then this
process opens `trace` and times its first 4 KiB `read` (what `cat trace | head` waits
for) and the reads of the rest (128 KiB each, as `cat`'s), and a reread; the daemon's
RSS (from /proc) is printed after the fill, after the reads, and once the buffer is
cleared (`echo > trace`).

    python3 benchmarks/bench_big_read.py [--buffer-kb K] [--workload RATE]   (root, /dev/fuse)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an install

from bench_memory import write  # noqa: E402
from bench_round3 import EVENT_ARGS, _daemon_pid, _fill, _kprobefs  # noqa: E402


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _read(path: Path) -> tuple[float, float, int]:
    """(seconds to the first 4 KiB, seconds to the end, bytes) of reading path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        start = time.perf_counter()
        total = len(os.read(fd, 4096))
        first = time.perf_counter() - start
        while chunk := os.read(fd, 131072):
            total += len(chunk)
        return first, time.perf_counter() - start, total
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--buffer-kb", type=int, default=16384)
    ap.add_argument("--workload", type=float, default=20000)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    mnt = Path(tempfile.mkdtemp(prefix="kprobefs-big-"))
    _kprobefs("mount", str(mnt), "--cpus", str(args.cpus), "--workload", str(args.workload))
    tr = mnt / "tracing"
    try:
        pid = _daemon_pid(mnt)
        write(tr / "tracing_on", "0", trunc=True)
        write(tr / "buffer_size_kb", str(args.buffer_kb), trunc=True)
        write(tr / "kprobe_events", f"p:fill do_syscall_64 {EVENT_ARGS}\n", trunc=True)
        write(tr / "events/kprobes/enable", "1", trunc=True)
        records, took = _fill(tr, limit=600)
        write(tr / "events/kprobes/enable", "0", trunc=True)
        filled = _rss_mb(pid)
        first, whole, size = _read(tr / "trace")
        kept = _rss_mb(pid)
        _first2, again, _size2 = _read(tr / "trace")
        write(tr / "trace", "", trunc=True)
        time.sleep(1)
        cleared = _rss_mb(pid)
        print(f"| {args.cpus} × {args.buffer_kb} KiB full: {records} records, "
              f"{size / 1e6:.1f} MB of text (filled in {took:.0f} s) | |")
        print("|---|---:|")
        print(f"| first 4 KiB of the first read | {first * 1e3:.0f} ms |")
        print(f"| the whole first read | {whole:.2f} s ({size / whole / 1e6:.0f} MB/s) |")
        print(f"| a reread | {again:.2f} s ({size / again / 1e6:.0f} MB/s) |")
        print(f"| daemon RSS: filled / text kept / buffer cleared | {filled:.0f} / {kept:.0f}"
              f" / {cleared:.0f} MB |")
    finally:
        subprocess.run(["sh", "-c", f"echo > {tr}/kprobe_events"], check=False)
        _kprobefs("umount", str(mnt))
        os.rmdir(mnt)


if __name__ == "__main__":
    main()
