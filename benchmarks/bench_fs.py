"""Filesystem benchmark, through a real mount: one `echo … >> kprobe_events` round trip,
adding 10,000 probes in one write and enabling them all with events/kprobes/enable, and
`cat trace` throughput with a full buffer (64 KiB per CPU, then the default 1408 KiB per
CPU, filled by the background workload): the median of five reads (each after the first
takes the lines the last one made for the records still there) and of three that
format every line.

    python3 benchmarks/bench_fs.py [--mountpoint DIR] [--lines N] [--cpus N]   (root, /dev/fuse)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kprobefs(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "kprobefs", *args], check=True, env=env)


def sh(cmd: str) -> float:
    t = time.perf_counter()
    subprocess.run(["sh", "-c", cmd], check=True)
    return time.perf_counter() - t


def _cat(path: Path) -> tuple[float, bytes]:
    t = time.perf_counter()
    out = subprocess.run(["cat", str(path)], capture_output=True, check=True).stdout
    return time.perf_counter() - t, out


def cat_full(tr: Path, probe: str) -> tuple[float, int, float]:
    """Fills the buffer with probe's event (the background workload hits it), stops,
    and returns the median time of five `cat trace`, the bytes each printed, and the
    median time of three reads that format every line (a read keeps the lines it made
    for the next one: an option changed before the read makes them all anew)."""
    sh(f"echo '{probe}' > {tr}/kprobe_events")
    sh(f"echo 1 > {tr}/events/kprobes/enable")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(tr / "trace") as f:
            head = [f.readline() for _ in range(3)][2]
        in_buf, written = map(int, head.split(":")[1].split()[0].split("/"))
        if written > in_buf:
            break
        time.sleep(0.5)
    sh(f"echo 0 > {tr}/events/kprobes/enable")
    times, out = [], b""
    for _ in range(5):
        took, out = _cat(tr / "trace")
        times.append(took)
    cold = []
    for _ in range(3):
        sh(f"echo 1 > {tr}/options/sym-offset")
        _cat(tr / "trace")
        sh(f"echo 0 > {tr}/options/sym-offset")
        cold.append(_cat(tr / "trace")[0])
    sh(f"echo > {tr}/kprobe_events")
    return statistics.median(times), len(out), statistics.median(cold)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mountpoint")
    ap.add_argument("--lines", type=int, default=10_000)
    ap.add_argument("--cpus", type=int, default=2)
    args = ap.parse_args()
    mnt = Path(args.mountpoint or tempfile.mkdtemp(prefix="kprobefs-bench-"))
    kprobefs("mount", str(mnt), "--cpus", str(args.cpus), "--workload", "2000")
    tr = mnt / "tracing"
    try:
        # 1. One append round trip (the shell's own fork/exec included, as a user sees it).
        times = []
        for i in range(20):
            times.append(sh(f"echo 'p:rt{i} vfs_read' >> {tr}/kprobe_events"))
        sh(f"echo > {tr}/kprobe_events")
        baseline = statistics.median(sh("echo x > /dev/null") for _ in range(20))
        rt = statistics.median(times)
        # 2. N probes in one write, then all enabled: distinct events over the
        # traceable functions' entries and their second instruction.
        names = (tr / "available_filter_functions").read_text().split()
        black = {line.split()[-1] for line in (mnt / "kprobes/blacklist").read_text().splitlines()}
        # A duplicate name is EADDRNOTAVAIL, a blacklisted function EINVAL.
        seen = {}
        for n in names:
            seen[n] = seen.get(n, 0) + 1
        funcs = [n for n in names if seen[n] == 1 and n not in black]
        points = [f"{name}{suffix}" for name in funcs for suffix in ("", "+5")]
        cmds = "".join(f"p:b{i} {points[i % len(points)]}\n" for i in range(args.lines))
        fd = os.open(tr / "kprobe_events", os.O_WRONLY | os.O_APPEND)
        try:
            t = time.perf_counter()
            view = memoryview(cmds.encode())
            while view:
                view = view[os.write(fd, view):]
            elapsed_write = time.perf_counter() - t
        finally:
            os.close(fd)
        t = time.perf_counter()
        sh(f"echo 1 > {tr}/events/kprobes/enable")
        elapsed_enable = time.perf_counter() - t
        nprobes = (tr / "kprobe_events").read_text().count("\n")
        enabled = (tr / "events/kprobes/enable").read_text().strip()
        sh(f"echo 0 > {tr}/events/kprobes/enable")
        t = time.perf_counter()
        sh(f"echo > {tr}/kprobe_events")
        elapsed_clear = time.perf_counter() - t
        # 3. cat trace with a full buffer, filled by the background workload.
        sh(f"echo 64 > {tr}/buffer_size_kb")
        cat_s, out_len, _cold = cat_full(tr, "p:fill schedule a=%di b=%si c=%dx d=%cx")
        # What a new process pays before its first byte (fork/exec, its task, lookups).
        small_s = statistics.median(
            sh(f"cat {tr}/tracing_on > /dev/null") for _ in range(5))
        # 4. The same with the default buffer (1408 KiB per CPU, as Linux's), full.
        sh(f"echo 1408 > {tr}/buffer_size_kb")
        big_s, big, big_cold = cat_full(tr, "p:fill schedule a=%di b=%si c=%dx d=%cx")
        print(f"echo >> kprobe_events round trip: {rt * 1000:.1f} ms "
              f"(a bare `echo > /dev/null` in sh: {baseline * 1000:.1f} ms; "
              f"x{rt / baseline:.2f}, target <= 2)")
        print(f"{nprobes} probes added in one write: {elapsed_write:.2f} s "
              f"({elapsed_write / max(nprobes, 1) * 1000:.2f} ms per probe); all enabled "
              f"(events/kprobes/enable: {enabled}): {elapsed_enable:.2f} s; together "
              f"{elapsed_write + elapsed_enable:.2f} s; `echo >` clearing them: "
              f"{elapsed_clear:.2f} s")
        print(f"cat trace, full buffer: {out_len / 1024:.0f} KiB in {cat_s * 1000:.0f} ms = "
              f"{out_len / cat_s / 1e6:.2f} MB/s; `cat tracing_on` (the fixed cost of a "
              f"new process): {small_s * 1000:.1f} ms; beyond it "
              f"{out_len / max(cat_s - small_s, 1e-6) / 1e6:.1f} MB/s")
        print(f"cat trace, full default buffer (1408 KiB per CPU): {big / 1024:.0f} KiB in "
              f"{big_s * 1000:.0f} ms = {big / big_s / 1e6:.2f} MB/s; a read that formats "
              f"every line: {big_cold * 1000:.0f} ms = {big / big_cold / 1e6:.2f} MB/s")
    finally:
        subprocess.run(["sh", "-c", f"echo > {tr}/kprobe_events"], check=False)
        kprobefs("umount", str(mnt))


if __name__ == "__main__":
    main()
