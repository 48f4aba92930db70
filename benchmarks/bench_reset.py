"""The reset between tests (kprobefs.testing.reset, what the ``kprobefs`` pytest fixture
runs before each test): its cost per test, in ms, on a real mount, after tests that
did:

- nothing to the mount;
- what a typical test does: a kprobe event defined and enabled, a process traced, the
  trace read;
- a lot: probes, a trigger and a filter, an instance with an event enabled, the
  function_graph tracer with an option, a clock and a buffer size changed;

and the first reset of a session (which looks at everything), beside ftracetest's own
way for comparison: ``initialize_ftrace`` of Linux 6.1's test.d/functions run by a shell
under ``kprobefs exec`` (each of its reads a FUSE round trip).

    python3 benchmarks/bench_reset.py [--rounds N] [--cpus N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the source tree

from kprobefs.testing import KprobefsMount, TracefsReset  # noqa: E402


def write(path: Path, text: str, append: bool = False) -> None:
    with open(path, "a" if append else "w") as f:
        f.write(text)


def nothing(root: Path) -> None:
    pass


def typical(root: Path) -> None:
    t = root / "tracing"
    write(t / "kprobe_events", "p:open do_sys_openat2 path=+0(%si):ustring\n")
    write(t / "events/kprobes/open/enable", "1")
    subprocess.run(["cat", str(root / "proc/version")], stdout=subprocess.DEVNULL)
    (t / "trace").read_text()


def a_lot(root: Path) -> None:
    t = root / "tracing"
    typical(root)
    write(t / "kprobe_events", "r:ret do_sys_openat2 ret=$retval\n", append=True)
    write(t / "events/kprobes/ret/trigger", "hist:keys=common_pid")
    write(t / "events/sched/sched_switch/filter", "prev_pid == 1")
    os.mkdir(t / "instances/bench")
    write(t / "instances/bench/events/sched/sched_process_exec/enable", "1")
    write(t / "set_graph_function", "ksys_read")
    write(t / "current_tracer", "function_graph")
    write(t / "options/funcgraph-proc", "1")
    write(t / "trace_clock", "mono")
    write(t / "buffer_size_kb", "256")


#: ftracetest's initialize_ftrace, as test.d/functions defines it, sourced from the
#: kernel's selftests when they are unpacked (tests/conformance_runner.py does).
FUNCTIONS = sorted(Path(os.environ.get("KPROBEFS_CACHE", Path.home() / ".cache/kprobefs"))
                   .glob("*/linux-source-6.1/tools/testing/selftests/ftrace/test.d/functions"))


def ftracetest_reset(mount: KprobefsMount) -> float | None:
    if not FUNCTIONS:
        return None
    script = f". {FUNCTIONS[-1]}; cd /sys/kernel/tracing && initialize_ftrace"
    start = time.perf_counter()
    r = mount.exec(["sh", "-c", script], timeout=300)
    elapsed = time.perf_counter() - start
    return elapsed if r.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    with KprobefsMount(cpus=args.cpus) as mount:
        start = time.perf_counter()
        reset = TracefsReset(mount.root)
        reset.reset()
        first = time.perf_counter() - start
        rows = []
        for name, test in (("nothing", nothing), ("typical", typical), ("a lot", a_lot)):
            times = []
            for _ in range(args.rounds):
                test(mount.root)
                start = time.perf_counter()
                reset.reset()
                times.append(time.perf_counter() - start)
            rows.append((f"after a test that did {name}", times))
        start = time.perf_counter()
        reset.reset(full=True)
        full = time.perf_counter() - start
        reset.close()
        shell = ftracetest_reset(mount)
    print(f"kprobefs reset, {args.cpus} CPUs, {args.rounds} rounds each (ms per test)")
    print(f"| {'case':<36} | median | max |")
    print(f"|{'-' * 38}|-------:|----:|")
    for name, times in rows:
        print(f"| {name:<36} | {statistics.median(times) * 1e3:6.1f} | "
              f"{max(times) * 1e3:5.1f} |")
    print(f"| {'first reset of a session (all)':<36} | {first * 1e3:6.1f} |   — |")
    print(f"| {'reset(full=True)':<36} | {full * 1e3:6.1f} |   — |")
    if shell is not None:
        print(f"| {'ftracetest initialize_ftrace (sh)':<36} | {shell * 1e3:6.1f} |   — |")
    else:
        print("(ftracetest's test.d/functions not found: run tests/conformance_runner.py "
              "once to unpack it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
