"""Issue 31's table from one run: the first `cat trace` of a full default buffer (one
4-argument kprobe event, then 10,000 different ones), `trace_pipe_raw` page reads and
splices of every CPU, a `pread` of `tracing_on` beside a null fusepy filesystem's, and
`echo 'p:…' >> kprobe_events` beside a bare `echo`.

A first read is `cat trace > FILE` of a buffer nobody has read before (the fill is
watched through per_cpu/cpuN/stats, never through `trace`); the reread beside it takes
the text the first read kept.  The buffer rows run on a daemon with a background workload (which
fills the buffers); the request rows on a second daemon without one, each figure the
median of rounds that take turns with its baseline.

    python3 benchmarks/bench_round3.py [--workload RATE] [--rounds N]   (root, /dev/fuse)
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
sys.path.insert(0, str(ROOT))  # the source tree, not an install

from bench_memory import write  # noqa: E402
from bench_rawpipe import _timed_raw_reads  # noqa: E402
from bench_roundtrip import _sh_loop  # noqa: E402

EVENT_ARGS = "a=%di b=%si c=%dx d=%cx"
ECHO = "echo 'p:rt{i} vfs_read' >> {tr}/kprobe_events"
BARE = "echo x > /dev/null"


def _kprobefs(*args: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "kprobefs", *args], check=True, env=env)


def _cpus(tr: Path) -> list[str]:
    return sorted(os.listdir(tr / "per_cpu"))


def _stats(tr: Path) -> tuple[int, int]:
    """(entries, overrun) summed over the CPUs, from per_cpu/cpuN/stats."""
    entries = overrun = 0
    for cpu in _cpus(tr):
        for line in (tr / "per_cpu" / cpu / "stats").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "entries":
                entries += int(value)
            elif key == "overrun":
                overrun += int(value)
    return entries, overrun


def _fill(tr: Path, limit: float = 150) -> tuple[int, float]:
    """Clears the buffer, records until every CPU overwrote (the buffer is full), stops
    tracing; returns the records in the buffer and the seconds it took."""
    write(tr / "trace", "", trunc=True)
    write(tr / "tracing_on", "1", trunc=True)
    start = time.monotonic()
    while time.monotonic() - start < limit:
        time.sleep(0.5)
        if all(_cpu_overrun(tr, cpu) for cpu in _cpus(tr)):
            break
    write(tr / "tracing_on", "0", trunc=True)
    return _stats(tr)[0], time.monotonic() - start


def _cpu_overrun(tr: Path, cpu: str) -> int:
    for line in (tr / "per_cpu" / cpu / "stats").read_text().splitlines():
        if line.startswith("overrun:"):
            return int(line.split(":")[1])
    return 0


def _cat(path: Path) -> tuple[float, bytes]:
    """(seconds, text) of `cat path > FILE`, a file in the temporary directory: what a
    user who saves a trace waits for.  (Into a pipe this process reads, the reading
    competes with cat and the daemon for the CPUs, and the figure is the pipe's.)"""
    with tempfile.TemporaryFile() as out:
        t = time.perf_counter()
        subprocess.run(["cat", str(path)], stdout=out, check=True)
        took = time.perf_counter() - t
        out.seek(0)
        return took, out.read()


def _first_and_reread(tr: Path) -> tuple[float, float, bytes]:
    """The first `cat trace` and a second one, the events disabled first: an enabled
    probe still traps with tracing off, and the workload's hits then take the machine
    thread the reads wait for."""
    write(tr / "events/kprobes/enable", "0", trunc=True)
    first, text = _cat(tr / "trace")
    again, text2 = _cat(tr / "trace")
    if text2 != text:
        print("  (the reread's text differs from the first read's: records came in)")
    return first, again, text


def _raw_reads(tr: Path, splice: bool) -> tuple[int, float]:
    """(bytes, seconds) of reading every CPU's trace_pipe_raw page by page (4096-byte
    reads, or splices into a pipe as trace-cmd's recorders make) until EAGAIN."""
    return _timed_raw_reads([tr / "per_cpu" / cpu / "trace_pipe_raw" for cpu in _cpus(tr)],
                            splice)


def _probe_points(mnt: Path, n: int) -> list[str]:
    tr = mnt / "tracing"
    names = (tr / "available_filter_functions").read_text().split()
    black = {line.split()[-1] for line in (mnt / "kprobes/blacklist").read_text().splitlines()}
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    funcs = [name for name in names if seen[name] == 1 and name not in black]
    points = [f"{name}{suffix}" for name in funcs for suffix in ("", "+5")]
    return [points[i % len(points)] for i in range(n)]


def buffer_rows(workload: float, cpus: int) -> list[tuple[str, str]]:
    mnt = Path(tempfile.mkdtemp(prefix="kprobefs-r3-"))
    _kprobefs("mount", str(mnt), "--cpus", str(cpus), "--workload", str(workload))
    tr = mnt / "tracing"
    rows = []
    try:
        write(tr / "tracing_on", "0", trunc=True)
        write(tr / "buffer_size_kb", "1408", trunc=True)
        # 1. one 4-argument event
        try:        # hit at every system call: fills the buffer soonest
            write(tr / "kprobe_events", f"p:fill do_syscall_64 {EVENT_ARGS}\n", trunc=True)
        except OSError:
            write(tr / "kprobe_events", f"p:fill schedule {EVENT_ARGS}\n", trunc=True)
        write(tr / "events/kprobes/enable", "1", trunc=True)
        records, took = _fill(tr)
        first, again, text = _first_and_reread(tr)
        write(tr / "events/kprobes/enable", "1", trunc=True)
        rows.append(("first `cat trace`, default buffer full of one 4-argument kprobe "
                     f"event ({records} records, {len(text) / 1e6:.1f} MB, filled in "
                     f"{took:.0f} s), MB/s",
                     f"{len(text) / first / 1e6:.1f} (reread {len(text) / again / 1e6:.1f})"))
        # 3. trace_pipe_raw, every CPU, read and splice, of the same event
        for splice in (False, True):
            records, _took = _fill(tr)
            total, elapsed = _raw_reads(tr, splice)
            rows.append((f"`trace_pipe_raw`, all CPUs, page {'splices' if splice else 'reads'}"
                         f" ({records} records, {total / 1e6:.1f} MB), MB/s",
                         f"{total / elapsed / 1e6:.1f}"))
        write(tr / "events/kprobes/enable", "0", trunc=True)
        write(tr / "kprobe_events", "", trunc=True)
        # 2. 10,000 different events
        points = _probe_points(mnt, 10_000)
        write(tr / "kprobe_events", "".join(f"p:b{i} {p} {EVENT_ARGS}\n"
                                             for i, p in enumerate(points)))
        write(tr / "events/kprobes/enable", "1", trunc=True)
        records, took = _fill(tr)
        first, again, text = _first_and_reread(tr)
        events = len({line.split(b": ")[1] for line in text.splitlines()
                      if not line.startswith(b"#") and b": " in line})
        rows.insert(1, ("the same with 10,000 different kprobe events enabled "
                        f"({events} of them in the buffer, {records} records, "
                        f"{len(text) / 1e6:.1f} MB), MB/s",
                        f"{len(text) / first / 1e6:.1f} "
                        f"(reread {len(text) / again / 1e6:.1f})"))
        write(tr / "events/kprobes/enable", "0", trunc=True)
    finally:
        subprocess.run(["sh", "-c", f"echo > {tr}/kprobe_events"], check=False)
        _kprobefs("umount", str(mnt))
        os.rmdir(mnt)
    return rows


def _preads(path: Path, n: int) -> float:
    """µs per pread(2) of 4 KiB at offset 0 of an open file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        t = time.perf_counter()
        for _ in range(n):
            os.pread(fd, 4096, 0)
        return (time.perf_counter() - t) / n * 1e6
    finally:
        os.close(fd)


def _daemon_pid(mnt: Path) -> int:
    """The pid of the daemon serving mnt (the one whose command line names it)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"mount" in argv and str(mnt).encode() in argv and int(entry) != os.getpid():
                return int(entry)
    raise RuntimeError(f"no daemon serves {mnt}")


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of pid may run on ``cpus`` only (threads it starts later inherit
    their starter's)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:
            pass            # a thread that has ended


def request_rows(rounds: int, cpus: int) -> list[tuple[str, str]]:
    base = Path(tempfile.mkdtemp(prefix="kprobefs-r3-"))
    mnt, null = base / "mnt", base / "null"
    mnt.mkdir()
    null.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    _kprobefs("mount", str(mnt), "--cpus", str(cpus))
    nullfs = subprocess.Popen([sys.executable, "-c",
                               "import sys; sys.path.insert(0, sys.argv[2]);"
                               "from bench_roundtrip import _null_fs; _null_fs(sys.argv[1])",
                               str(null), str(Path(__file__).parent)], env=env)
    tr, ntr = mnt / "tracing", null / "tracing"
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(ntr / "tracing_on") and time.monotonic() < deadline:
            time.sleep(0.05)
        samples: dict[str, list[float]] = {}
        for r in range(rounds):
            for name, fn in (("pread null", lambda: _preads(ntr / "tracing_on", 2000)),
                             ("pread", lambda: _preads(tr / "tracing_on", 2000)),
                             ("bare", lambda: _sh_loop(BARE, 40)),
                             ("echo null", lambda: _sh_loop(ECHO.format(i="$i", tr=ntr), 40)),
                             ("echo", lambda: _sh_loop(ECHO.format(i=f"{r}_$i", tr=tr), 40))):
                samples.setdefault(name, []).append(fn())
            write(tr / "kprobe_events", "", trunc=True)
        # The same preads with the caller and both filesystems on one CPU: no wake-up
        # crosses CPUs, so each figure is the work a request costs.
        every = os.sched_getaffinity(0)
        servers = (_daemon_pid(mnt), nullfs.pid)
        try:
            for pid in (*servers, os.getpid()):
                _pin(pid, {min(every)})
            for r in range(rounds):
                for name, path in (("pread null one CPU", ntr), ("pread one CPU", tr)):
                    samples.setdefault(name, []).append(_preads(path / "tracing_on", 2000))
        finally:
            for pid in (*servers, os.getpid()):
                _pin(pid, every)
        m = {name: statistics.median(v) for name, v in samples.items()}
        return [
            ("`pread(tracing_on)` on an open file, × the same on a null fusepy filesystem",
             f"{m['pread'] / m['pread null']:.2f} ({m['pread']:.0f} µs / "
             f"{m['pread null']:.0f} µs)"),
            ("the same, the caller and both filesystems on one CPU (no wake-up crosses CPUs)",
             f"{m['pread one CPU'] / m['pread null one CPU']:.2f} ({m['pread one CPU']:.0f} µs"
             f" / {m['pread null one CPU']:.0f} µs)"),
            ("`echo 'p:…' >> kprobe_events` in `sh -c`, × bare `echo > /dev/null`",
             f"{m['echo'] / m['bare']:.2f} ({m['echo']:.0f} µs / {m['bare']:.0f} µs; "
             f"into the null filesystem {m['echo null'] / m['bare']:.2f})"),
        ]
    finally:
        subprocess.run(["sh", "-c", f"echo > {tr}/kprobe_events"], check=False)
        _kprobefs("umount", str(mnt))
        subprocess.run(["umount", str(null)], check=False)
        nullfs.wait(timeout=30)
        for d in (mnt, null, base):
            os.rmdir(d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=float, default=20000,
                    help="the buffer daemon's background operations a second")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--only", choices=("buffers", "requests"))
    args = ap.parse_args()
    rows = []
    if args.only != "requests":
        rows += buffer_rows(args.workload, args.cpus)
    if args.only != "buffers":
        rows += request_rows(args.rounds, args.cpus)
    print("| what | this run |")
    print("|---|---:|")
    for what, value in rows:
        print(f"| {what} | {value} |")


if __name__ == "__main__":
    main()
