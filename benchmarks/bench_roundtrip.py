"""What one `echo 'p:…' >> kprobe_events` costs, layer by layer: the emulated system
calls and the gateway in one thread; the same with the machine thread (a hand-off each
way per call); through a real mount, beside a bare `echo > /dev/null` and the same
`echo` into a filesystem that answers at once (fusepy with the mount's own options: the
floor of FUSE through fusepy).  Each through-the-mount figure is the median of rounds
that take turns, so the host's drift hits all alike.

    python3 benchmarks/bench_roundtrip.py [--echos N] [--rounds N]   (root, /dev/fuse)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the source tree, not an install

import argparse
import errno
import os
import stat
import statistics
import subprocess
import tempfile
import time

from kprobefs.daemon import Daemon
from kprobefs.fs import Caller

ECHO = "echo 'p:rt{i} vfs_read' >> {tr}/kprobe_events"
BARE = "echo x > /dev/null"


def in_process(echos: int, served: bool) -> tuple[float, dict[str, float]]:
    """µs per echo's worth of gateway requests (two LOOKUPs, open, write, release, the
    exit), each made by a new host process, and the median µs of each step."""
    d = Daemon("/nonexistent", cpus=2)
    d.boot()
    gw, kernel = d.gateway, d.kernel
    if served:
        kernel.serve()
    procs = [subprocess.Popen(["sleep", "60"]) for _ in range(echos + 20)]
    steps: dict[str, list[float]] = {}

    def timed(name, fn):
        t = time.perf_counter()
        result = fn()
        steps.setdefault(name, []).append((time.perf_counter() - t) * 1e6)
        return result

    try:
        start = 0.0
        for i, proc in enumerate(procs):
            if i == 20:
                steps.clear()
                start = time.perf_counter()
            c = Caller(proc.pid)
            timed("lookup (new process)", lambda: gw.getattr("/tracing", c))
            timed("lookup", lambda: gw.getattr("/tracing/kprobe_events", c))
            fh = timed("open", lambda: gw.open("/tracing/kprobe_events",
                                               os.O_WRONLY | os.O_APPEND, c))
            timed("write", lambda: gw.write(fh, f"p:rt{i} vfs_read\n".encode(), 0, c))
            timed("release", lambda: gw.release(fh))
            timed("exit", lambda: gw._end(gw._callers[proc.pid]))
        per_echo = (time.perf_counter() - start) / echos * 1e6
    finally:
        for p in procs:
            p.kill()
            p.wait()
        kernel.close()
    return per_echo, {name: statistics.median(v) for name, v in steps.items()}


def _null_fs(mountpoint: str) -> None:
    """A filesystem with the mount's options that answers every request at once (run in
    a child process): /tracing, its kprobe_events, and tracing_on, which reads 1."""
    import fuse

    from kprobefs.fs.fuse_ops import fuse_options

    class Null(fuse.Operations):
        use_ns = True

        def getattr(self, path, fh=None):
            if path in ("/", "/tracing"):
                return {"st_mode": stat.S_IFDIR | 0o750, "st_nlink": 1}
            if path in ("/tracing/kprobe_events", "/tracing/tracing_on"):
                return {"st_mode": stat.S_IFREG | 0o640, "st_nlink": 1}
            raise fuse.FuseOSError(errno.ENOENT)

        def open(self, path, fi):
            fi.direct_io, fi.fh = 1, 1
            return 0

        def read(self, path, size, offset, fi):
            return b"1\n"[offset:offset + size]

        def write(self, path, data, offset, fi):
            return len(data)

        def flush(self, path, fi):
            raise fuse.FuseOSError(errno.ENOSYS)

    fuse.FUSE(Null(), mountpoint, raw_fi=True, foreground=True, nothreads=False,
              **fuse_options())


def _sh_loop(cmd: str, n: int) -> float:
    """µs per `sh -c cmd` over n runs, from a shell loop (one process per command)."""
    script = f'i=0; while [ $i -lt {n} ]; do sh -c "{cmd}"; i=$((i+1)); done'
    t = time.perf_counter()
    subprocess.run(["sh", "-c", script], check=True)
    return (time.perf_counter() - t) / n * 1e6


def through_the_mount(echos: int, rounds: int) -> dict[str, float]:
    base = Path(tempfile.mkdtemp(prefix="kprobefs-rt-"))
    mnt, pinned, null = base / "mnt", base / "pinned", base / "null"
    for d in (mnt, pinned, null):
        d.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    kprobefs = [sys.executable, "-m", "kprobefs"]
    cpu = max(os.sched_getaffinity(0))
    subprocess.run(kprobefs + ["mount", str(mnt)], check=True, env=env)
    subprocess.run(kprobefs + ["mount", str(pinned), "--host-cpu", str(cpu)], check=True,
                   env=env)
    nullfs = subprocess.Popen([sys.executable, "-c",
                               "import sys; sys.path.insert(0, sys.argv[2]);"
                               "from bench_roundtrip import _null_fs; _null_fs(sys.argv[1])",
                               str(null), str(Path(__file__).parent)], env=env)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(null / "tracing") and time.monotonic() < deadline:
            time.sleep(0.05)
        samples: dict[str, list[float]] = {}
        tr, ptr, ntr = mnt / "tracing", pinned / "tracing", null / "tracing"
        for r in range(rounds):
            for name, cmd in (("bare", BARE), ("null FUSE", ECHO.format(i="$i", tr=ntr)),
                              ("kprobefs", ECHO.format(i=f"{r}_$i", tr=tr)),
                              (f"kprobefs --host-cpu {cpu}",
                               ECHO.format(i=f"{r}_$i", tr=ptr))):
                samples.setdefault(name, []).append(_sh_loop(cmd, echos))
        return {name: statistics.median(v) for name, v in samples.items()}
    finally:
        for m in (mnt, pinned):
            subprocess.run(["sh", "-c", f"echo > {m}/tracing/kprobe_events"], check=False)
            subprocess.run(kprobefs + ["umount", str(m)], check=False, env=env)
        subprocess.run(["umount", str(null)], check=False)
        nullfs.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--echos", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    alone, steps = in_process(args.echos, served=False)
    served, served_steps = in_process(args.echos, served=True)
    mount = through_the_mount(max(20, args.echos // 2), args.rounds)
    print(f"{'one echo >> kprobe_events':44} {'µs':>8}")
    print(f"{'  gateway + emulated calls, one thread':44} {alone:8.0f}")
    print(f"{'  the same, with the machine thread':44} {served:8.0f}")
    for name, us in mount.items():
        print(f"{'  sh -c, ' + name:44} {us:8.0f}")
    for name, us in mount.items():
        if name.startswith("kprobefs"):
            print(f"echo >> kprobe_events x bare echo, {name}: {us / mount['bare']:.2f}; "
                  "target <= 2")
    print(f"the null FUSE filesystem x bare echo: {mount['null FUSE'] / mount['bare']:.2f}")
    print("steps, median µs (one thread / machine thread): " + ", ".join(
        f"{name} {steps[name]:.0f}/{served_steps[name]:.0f}" for name in steps))


if __name__ == "__main__":
    main()
