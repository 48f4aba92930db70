"""Soak: the churn of issue 29 against a real mount, with the daemon's and the emulated
kernel's memory printed as it goes.

    python3 benchmarks/soak.py --seconds 600 --interval 30     # a 10-minute soak
    python3 benchmarks/soak.py --rounds 20 --check              # bounded (CI), counted

A daemon is started in the foreground (``kprobefs mount -f --workload 2000``) on a
fresh mount point, then, until the time is up (or each loop has done ``--rounds``):
four shell loops that each add a kprobe event on a function from
``available_filter_functions``, enable it, read ``kprobes/list``, disable and delete
it; a loop that makes an instance, enables ``sched_switch`` in it, reads its ``trace``,
disables it and removes it; a loop that sets and removes a ``hist`` trigger on
``sched_switch``; a ``cat trace_pipe`` reader.  Every command that fails is counted
(with its message).  Every interval a line gives the daemon's RSS and its parts
(Unicorn's translated code, the emulated RAM, the rest), where the C heap has its
memory (MB in use, free in its arenas, mapped on their own) and the interpreter's
blocks in thousands (the host line of ``kprobefs/status``), the kernel's free and used
memory and slab (``MNT/proc/meminfo``), the latency of a small request (20 reads of
``tracing/tracing_on``: mean and max), the loops' rounds and the errors so far.

At the end the loops stop, anything left (events, instances, triggers) is counted and
removed, and the kernel's used memory is compared with the start.  ``--check`` makes the
exit status 1 when a command failed, something was left behind, or the used memory
after the cleanup is more than ``--bound-kb`` above the start.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Functions tried for the probe loops (the first that the engine takes, from
#: available_filter_functions).
FUNCTIONS_WANTED = 40


def meminfo(mnt: str) -> dict[str, int]:
    """MNT/proc/meminfo, kB by name."""
    with open(f"{mnt}/proc/meminfo") as f:
        return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)}


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def rss_parts_kb(pid: int) -> tuple[int, int, int]:
    """The daemon's resident kB in three parts: Unicorn's translated code (the one
    ``rwxp`` anonymous mapping, sized by the TCG buffer), the emulated RAM (the shared
    ``/dev/zero`` mapping) and the rest (Python's heap, libraries, stacks)."""
    code = ram = rest = 0
    kind = None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):
                fields = line.split()
                perms, name = fields[1], fields[5] if len(fields) > 5 else ""
                kind = ("code" if perms == "rwxp" and not name else
                        "ram" if name == "/dev/zero" else "rest")
            elif line.startswith("Rss:"):
                kb = int(line.split()[1])
                if kind == "code":
                    code += kb
                elif kind == "ram":
                    ram += kb
                else:
                    rest += kb
    return code, ram, rest


def host_heap_mb(mnt: str) -> tuple[float, float, float, int]:
    """The daemon's C heap (MB in use, free in its arenas, mapped on their own) and its
    Python blocks (thousands), from the host line of MNT/kprobefs/status."""
    with open(f"{mnt}/kprobefs/status") as f:
        host = next((line for line in f if line.startswith("host: ")), "")
    kb = {name.strip(" ,;:"): int(v) for name, v in re.findall(r"([a-z ,:]+) (\d+) kB", host)}
    blocks = re.search(r"Python blocks (\d+)", host)
    return (kb.get("heap in use", 0) / 1024, kb.get("heap free", 0) / 1024,
            kb.get("heap mapped", 0) / 1024, int(blocks[1]) // 1000 if blocks else 0)


def latency_ms(mnt: str, n: int = 20) -> tuple[float, float]:
    """(mean, max) milliseconds of an open/read/close of tracing/tracing_on."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        with open(f"{mnt}/tracing/tracing_on", "rb") as f:
            f.read()
        times.append((time.perf_counter() - t) * 1000)
    return sum(times) / n, max(times)


def write(path: str, text: str) -> str | None:
    """The error of writing text to path (None: it worked)."""
    try:
        with open(path, "a") as f:
            f.write(text)
        return None
    except OSError as e:
        return e.strerror


def usable_functions(mnt: str, wanted: int) -> list[str]:
    """Functions from available_filter_functions the engine takes a probe on."""
    t = f"{mnt}/tracing"
    out = []
    with open(f"{t}/available_filter_functions") as f:
        names = [line.split()[0] for line in f if line.strip()]
    for name in names:
        if len(out) >= wanted:
            break
        if write(f"{t}/kprobe_events", f"p:soak_try {name}\n") is None:
            write(f"{t}/kprobe_events", "-:soak_try\n")
            out.append(name)
    return out


#: The kinds of churn --loops chooses from (the loops' names less their number).
LOOP_KINDS = {"probes", "instances", "hist", "reader"}


def loop_scripts(mnt: str, functions: list[str], rounds: int, stop: str) -> dict[str, str]:
    """name -> sh script: each prints "ok" after a round and "ERR what" for a failed
    command; it ends when the file stop exists, or after rounds rounds (0: no bound)."""
    t = f"{mnt}/tracing"
    head = f"""
i=0
while [ ! -e {stop} ] && {{ [ {rounds} -eq 0 ] || [ $i -lt {rounds} ]; }}; do
"""
    tail = """
  echo ok; i=$((i+1))
done
"""
    scripts = {}
    fns = " ".join(functions)
    for w in range(4):
        scripts[f"probes{w}"] = head + f"""
  set -- {fns}; n=$(( (i * 4 + {w}) % $# + 1 )); eval f=\\${{$n}}
  e=soak{w}_$i
  echo "p:$e $f a=%di" >> {t}/kprobe_events || echo "ERR add $e $f"
  echo 1 > {t}/events/kprobes/$e/enable || echo "ERR enable $e"
  cat {mnt}/kprobes/list > /dev/null || echo "ERR list"
  echo 0 > {t}/events/kprobes/$e/enable || echo "ERR disable $e"
  echo "-:$e" >> {t}/kprobe_events || echo "ERR delete $e"
""" + tail
    scripts["instances"] = head + f"""
  mkdir {t}/instances/soak || echo "ERR mkdir"
  echo 1 > {t}/instances/soak/events/sched/sched_switch/enable || echo "ERR ienable"
  cat {t}/instances/soak/trace > /dev/null || echo "ERR itrace"
  echo 0 > {t}/instances/soak/events/sched/sched_switch/enable || echo "ERR idisable"
  rmdir {t}/instances/soak || echo "ERR rmdir"
""" + tail
    scripts["hist"] = head + f"""
  echo 'hist:keys=next_pid:vals=prev_pid' > {t}/events/sched/sched_switch/trigger \\
    || echo "ERR hist"
  cat {t}/events/sched/sched_switch/hist > /dev/null || echo "ERR hist read"
  echo '!hist:keys=next_pid:vals=prev_pid' > {t}/events/sched/sched_switch/trigger \\
    || echo "ERR unhist"
""" + tail
    return scripts


class Loop:
    """One shell loop and what it reported."""

    def __init__(self, name: str, script: str):
        self.name = name
        self.rounds = 0
        self.errors: list[str] = []
        self.proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line == "ok":
                self.rounds += 1
            elif line:
                self.errors.append(line)


def cleanup(mnt: str) -> list[str]:
    """Removes what the loops may have left; returns what there was."""
    t = f"{mnt}/tracing"
    left = []
    with open(f"{t}/kprobe_events") as f:
        events = [line.split()[0].split(":", 1)[1] for line in f if line.startswith("p:")]
    for name in events:
        left.append(f"event {name}")
        write(f"{t}/events/{name}/enable", "0\n")
        write(f"{t}/kprobe_events", f"-:{name.split('/')[-1]}\n")
    if os.path.isdir(f"{t}/instances/soak"):
        left.append("instance soak")
        os.rmdir(f"{t}/instances/soak")
    with open(f"{t}/events/sched/sched_switch/trigger") as f:
        for line in f:
            if line.startswith("hist:"):
                left.append(f"trigger {line.split()[0]}")
                write(f"{t}/events/sched/sched_switch/trigger", "!" + line.split()[0] + "\n")
    return left


def wait_ready(mnt: str, daemon: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited with {daemon.returncode}")
        try:
            with open(f"{mnt}/kprobefs/status") as f:
                if f.read().startswith("state:"):
                    os.stat(f"{mnt}/tracing/kprobe_events")
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the mount did not become ready")


def settle(mnt: str, seconds: float = 3.0) -> int:
    """The kernel's used kB once the loops' exited processes are reaped (the reaper
    runs every 2 s): the lowest of a few readings over ``seconds``."""
    best = None
    deadline = time.monotonic() + seconds
    while True:
        m = meminfo(mnt)
        used = m["MemTotal"] - m["MemFree"]
        best = used if best is None else min(best, used)
        if time.monotonic() >= deadline:
            return best
        time.sleep(0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--rounds", type=int, default=0,
                    help="each loop stops after this many rounds (0: run --seconds)")
    ap.add_argument("--interval", type=float, default=30.0)
    ap.add_argument("--workload", type=float, default=2000.0)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 on a failed command, a leftover, or used memory past "
                         "--bound-kb after the cleanup")
    ap.add_argument("--bound-kb", type=int, default=1024)
    ap.add_argument("--loops", default="probes,instances,hist,reader",
                    help="which churn runs, by kind (comma-separated): probes (the four "
                         "probe loops), instances, hist, reader (default: all)")
    args = ap.parse_args(argv)
    kinds = set(args.loops.split(","))
    if not kinds <= LOOP_KINDS:
        ap.error(f"--loops: unknown {', '.join(sorted(kinds - LOOP_KINDS))}")

    work = tempfile.mkdtemp(prefix="kprobefs-soak-")
    mnt, stop = os.path.join(work, "mnt"), os.path.join(work, "stop")
    os.mkdir(mnt)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    daemon = subprocess.Popen([sys.executable, "-m", "kprobefs", "mount", "-f",
                               "--workload", f"{args.workload:g}", mnt],
                              env=env, stderr=open(os.path.join(work, "daemon.log"), "w"))
    status = 0
    try:
        wait_ready(mnt, daemon)
        functions = usable_functions(mnt, FUNCTIONS_WANTED)
        start_used = settle(mnt, 1.0)
        start_rss = rss_kb(daemon.pid)
        print(f"mount {mnt}, daemon pid {daemon.pid}, workload {args.workload:g}/s, "
              f"{len(functions)} functions; kernel used {start_used} kB, "
              f"daemon RSS {start_rss // 1024} MB", flush=True)
        reader = (subprocess.Popen(["cat", f"{mnt}/tracing/trace_pipe"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                  if "reader" in kinds else None)
        loops = [Loop(name, script) for name, script in
                 loop_scripts(mnt, functions, args.rounds, stop).items()
                 if name.rstrip("0123456789") in kinds]
        print(f"{'time s':>7} {'RSS MB':>7} {'code':>5} {'RAM':>5} {'rest':>5} "
              f"{'heap':>5} {'hfree':>5} {'hmap':>5} {'pyblk':>6} "
              f"{'free kB':>9} {'used kB':>8} {'slab kB':>8} "
              f"{'lat ms':>7} {'max ms':>7} {'rounds':>7} {'errors':>6}", flush=True)
        t0 = time.monotonic()
        next_line = t0 + args.interval
        while True:
            done = all(loop.proc.poll() is not None for loop in loops)
            if done or (not args.rounds and time.monotonic() - t0 >= args.seconds):
                break
            if time.monotonic() >= next_line:
                m = meminfo(mnt)
                mean, worst = latency_ms(mnt)
                code, ram, rest = (kb // 1024 for kb in rss_parts_kb(daemon.pid))
                heap, hfree, hmap, pyblk = host_heap_mb(mnt)
                print(f"{time.monotonic() - t0:7.0f} {rss_kb(daemon.pid) / 1024:7.1f} "
                      f"{code:5} {ram:5} {rest:5} "
                      f"{heap:5.0f} {hfree:5.0f} {hmap:5.0f} {pyblk:5}k "
                      f"{m['MemFree']:9} {m['MemTotal'] - m['MemFree']:8} {m['Slab']:8} "
                      f"{mean:7.2f} {worst:7.2f} {sum(lp.rounds for lp in loops):7} "
                      f"{sum(len(lp.errors) for lp in loops):6}", flush=True)
                next_line += args.interval
            time.sleep(0.2)
        open(stop, "w").close()
        for loop in loops:
            loop.proc.wait(timeout=120)
            loop.thread.join(timeout=10)
        if reader is not None:
            reader.terminate()  # SIGTERM: a background job may hold SIGINT ignored
            reader.wait(timeout=30)
        left = cleanup(mnt)
        end_used = settle(mnt)
        errors = [f"{lp.name}: {e}" for lp in loops for e in lp.errors]
        print(f"rounds: " + ", ".join(f"{lp.name} {lp.rounds}" for lp in loops))
        print(f"errors: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:20]))
        print(f"left behind: {', '.join(left) or 'nothing'}")
        print(f"kernel used: {start_used} kB at the start, {end_used} kB after the cleanup "
              f"({end_used - start_used:+} kB); daemon RSS {start_rss // 1024} -> "
              f"{rss_kb(daemon.pid) // 1024} MB")
        if args.check and (errors or left or end_used - start_used > args.bound_kb):
            status = 1
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=60)
        except subprocess.TimeoutExpired:
            daemon.kill()
    return status


if __name__ == "__main__":
    sys.exit(main())
