"""trace_pipe_raw read throughput next to ``cat trace``'s, in MB/s of what each read
returns.

In process (the default), on the tracefs file objects (no FUSE): a buffer filled with N
records of a 2-argument kprobe event is read whole through per_cpu/cpu0/trace_pipe_raw
(binary pages, consumed) and, refilled the same way, through trace (text, not consumed).
The records are the host's (a fake kernel's probe hits); with ``--kernel`` they are the
emulated kernel's own recorder's (a 4-argument event on an optimized probe, hit by a
kernel loop), whose trace_pipe_raw pages are read out of its staged entries (native.py).

With ``--mount``, through a real FUSE mount of a daemon this script starts (root and
/dev/fuse needed): the daemon's background workload runs under the function tracer for
``--fill`` seconds, tracing stops, then the same records are read with ``cat trace``
(text, not consumed, a real process) and by reading every per_cpu/cpuN/trace_pipe_raw
page by page with O_NONBLOCK until EAGAIN (consumed; this process, through the mount);
then the buffer is filled again for as long and emptied with splice(2) into a pipe, as
trace-cmd's recorders do (through the host's page cache, a READ per page).

    python3 benchmarks/bench_rawpipe.py [--records N] [--kernel]
    python3 benchmarks/bench_rawpipe.py --mount [--fill S] [--workload RATE]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

from tracer_fakes import VFS_READ, echo, make_tracer, node  # noqa: E402


def _fill(records):
    t = make_tracer(nr_cpus=1)
    echo(t.root, "buffer_size_kb", "32768", append=False)
    echo(t.root, "kprobe_events", "p:ev vfs_read a=%di:u64 b=%si:u32")
    echo(t.root, "events/kprobes/ev/enable", "1")
    for i in range(records):
        t.engine.hit(VFS_READ, di=i, si=i)
        t.clock.advance(1000)
    return t


def _fill_kernel(records):
    """The emulated kernel's recorder: ``records`` hits of a 4-argument event."""
    from types import SimpleNamespace

    from kprobefs import Kernel
    from kprobefs.tracing import Tracer
    kernel = Kernel(cpus=1, seed=0)
    root = Tracer(kernel.kprobes, kernel).tracefs_root()
    echo(root, "buffer_size_kb", "32768", append=False)
    echo(root, "kprobe_events", "p:ev kprobe_target_traced+5 a=%di b=%si c=%dx d=%cx")
    echo(root, "events/kprobes/ev/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", records, 1)
    echo(root, "events/kprobes/ev/enable", "0")
    return SimpleNamespace(root=root)


def _read_all(t, path, chunk):
    handle = node(t.root, path).open(os.O_RDONLY, 1, "bench")
    total = offset = 0
    start = time.perf_counter()
    while data := handle.read(chunk, offset):
        total += len(data)
        offset += len(data)
    elapsed = time.perf_counter() - start
    handle.release()
    return total, elapsed


def _timed_raw_reads(paths, splice=False):
    """(bytes, seconds) of reading each trace_pipe_raw page by page (4096-byte reads,
    as trace-cmd's recorders' last reads; with ``splice``, 4096-byte splices into a
    pipe, as their recording) with O_NONBLOCK until EAGAIN: a blocking reader would
    wait for more at the end."""
    total = 0
    r, w = os.pipe()
    start = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        try:
            while True:
                try:
                    n = os.splice(fd, w, 4096) if splice else len(os.read(fd, 4096))
                except BlockingIOError:
                    break
                if not n:
                    break
                if splice:
                    os.read(r, n)
                total += n
        finally:
            os.close(fd)
    elapsed = time.perf_counter() - start
    os.close(r)
    os.close(w)
    return total, elapsed


def _timed_cat(paths):
    """(bytes, seconds) of one ``cat`` of ``paths`` to a pipe."""
    start = time.perf_counter()
    out = subprocess.run(["cat", *paths], capture_output=True, check=True).stdout
    return len(out), time.perf_counter() - start


def _through_mount(args):
    mnt = tempfile.mkdtemp(prefix="kprobefs-bench-", dir="/run")
    cli = [sys.executable, "-m", "kprobefs"]
    env = dict(os.environ, PYTHONPATH=_ROOT)
    subprocess.run(cli + ["mount", mnt, "--workload", str(args.workload),
                          "--log-file", os.path.join(mnt + ".log")], check=True, env=env)
    tracing = os.path.join(mnt, "tracing")

    def echo(name, text):
        with open(os.path.join(tracing, name), "w") as f:
            f.write(text)
    try:
        echo("buffer_size_kb", str(args.buffer_kb))
        echo("current_tracer", "function")
        cpus = sorted(os.listdir(os.path.join(tracing, "per_cpu")))
        raws = [os.path.join(tracing, "per_cpu", cpu, "trace_pipe_raw") for cpu in cpus]

        def fill():
            echo("tracing_on", "1")
            time.sleep(args.fill)
            echo("tracing_on", "0")
            records = 0
            for cpu in cpus:
                with open(os.path.join(tracing, "per_cpu", cpu, "stats")) as f:
                    records += int(f.readline().split()[1])
            return records

        records = fill()
        results = [("trace", records, *_timed_cat([os.path.join(tracing, "trace")])),
                   ("trace_pipe_raw", records, *_timed_raw_reads(raws))]
        records = fill()
        results.append(("splice raw", records, *_timed_raw_reads(raws, splice=True)))
        for name, records, total, elapsed in results:
            print(f"{name:15s} {records} records  {total / 1e6:8.2f} MB  "
                  f"{elapsed:6.2f} s  {total / 1e6 / elapsed:8.2f} MB/s  "
                  f"{records / elapsed:10.0f} records/s  (through FUSE)")
    finally:
        echo("current_tracer", "nop")
        subprocess.run(cli + ["umount", mnt], env=env)
        os.rmdir(mnt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--mount", action="store_true", help="read through a real mount")
    ap.add_argument("--kernel", action="store_true",
                    help="in process, the records of the emulated kernel's recorder")
    ap.add_argument("--fill", type=float, default=5.0, help="seconds of workload (--mount)")
    ap.add_argument("--workload", type=float, default=2000.0,
                    help="the daemon's workload rate, operations/s (--mount)")
    ap.add_argument("--buffer-kb", type=int, default=4096,
                    help="per-CPU buffer size (--mount)")
    args = ap.parse_args()
    if args.mount:
        _through_mount(args)
        return
    for name, path, chunk in (("trace_pipe_raw", "per_cpu/cpu0/trace_pipe_raw", 4096),
                              ("trace", "trace", 65536)):
        fill = _fill_kernel if args.kernel else _fill
        total, elapsed = _read_all(fill(args.records), path, chunk)
        pages = f"  {elapsed / (total / 4096) * 1e6:6.1f} µs/page" if chunk == 4096 else ""
        print(f"{name:15s} {args.records} records  {total / 1e6:8.2f} MB  "
              f"{elapsed:6.2f} s  {total / 1e6 / elapsed:8.2f} MB/s  "
              f"{args.records / elapsed:10.0f} records/s{pages}")


if __name__ == "__main__":
    main()
