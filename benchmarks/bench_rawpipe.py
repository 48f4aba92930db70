"""trace_pipe_raw read throughput next to ``cat trace``'s, in MB/s of what each read
returns, on the tracefs file objects (no FUSE): a buffer filled with N records of a
2-argument kprobe event is read whole through per_cpu/cpu0/trace_pipe_raw (binary pages,
consumed) and, refilled the same way, through trace (text, not consumed).

    python3 benchmarks/bench_rawpipe.py [--records N]
"""

import argparse
import os
import sys
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=100_000)
    args = ap.parse_args()
    for name, path, chunk in (("trace_pipe_raw", "per_cpu/cpu0/trace_pipe_raw", 4096),
                              ("trace", "trace", 65536)):
        total, elapsed = _read_all(_fill(args.records), path, chunk)
        print(f"{name:15s} {args.records} records  {total / 1e6:8.2f} MB  "
              f"{elapsed:6.2f} s  {total / 1e6 / elapsed:8.2f} MB/s  "
              f"{args.records / elapsed:10.0f} records/s")


if __name__ == "__main__":
    main()
