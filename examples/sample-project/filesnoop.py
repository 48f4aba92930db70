#!/usr/bin/env python3
"""filesnoop: print the files a command opens, as the kernel sees them.

    filesnoop.py [--tracing DIR] [--count N] [--timeout S] [-- COMMAND [ARG...]]

Sets up a kprobe event on do_sys_openat2 that records the file name, runs COMMAND (if
any), and prints "COMM PID PATH" for each open read from trace_pipe, until COUNT opens
(default: until COMMAND ends and the pipe is empty, or TIMEOUT seconds).  The probe is
removed on the way out, whatever happens.  DIR defaults to /sys/kernel/tracing.

This is the script the sample project tests; it knows nothing of kprobefs.
"""

import argparse
import os
import re
import subprocess
import sys
import time

PROBE = "filesnoop/open"
DEFINITION = f"p:{PROBE} do_sys_openat2 path=+0(%si):ustring"
LINE = re.compile(r'^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\[\d+\].*?: open: \(.*?\) '
                  r'path="(?P<path>.*)"$')


def setup(tracing):
    with open(os.path.join(tracing, "kprobe_events"), "a") as f:
        f.write(DEFINITION + "\n")
    with open(os.path.join(tracing, "events", PROBE, "enable"), "w") as f:
        f.write("1\n")


def teardown(tracing):
    enable = os.path.join(tracing, "events", PROBE, "enable")
    if os.path.exists(enable):
        with open(enable, "w") as f:
            f.write("0\n")
        with open(os.path.join(tracing, "kprobe_events"), "a") as f:
            f.write(f"-:{PROBE}\n")


def parse_line(line):
    """(comm, pid, path) of a trace_pipe line of the probe, or None."""
    m = LINE.match(line.rstrip("\n"))
    return (m["comm"], int(m["pid"]), m["path"]) if m else None


def snoop(tracing, command=None, count=None, timeout=10.0):
    """The (comm, pid, path) of each open seen while COMMAND runs."""
    seen = []
    setup(tracing)
    try:
        pipe = os.open(os.path.join(tracing, "trace_pipe"), os.O_RDONLY | os.O_NONBLOCK)
        child = None
        deadline, text = time.monotonic() + timeout, ""
        try:
            child = subprocess.Popen(command) if command else None
            while time.monotonic() < deadline and (count is None or len(seen) < count):
                # Whether the command had ended before this read: then an empty pipe
                # means that every open it made has been read.
                ended = child is not None and child.poll() is not None
                try:
                    text += os.read(pipe, 65536).decode(errors="replace")
                except BlockingIOError:
                    if ended and count is None:
                        break
                    time.sleep(0.02)
                    continue
                *lines, text = text.split("\n")
                seen += [hit for hit in map(parse_line, lines) if hit]
        finally:
            os.close(pipe)
            if child is not None:
                child.wait()
    finally:
        teardown(tracing)
    return seen[:count] if count else seen


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    command = []
    if "--" in argv:
        command, argv = argv[argv.index("--") + 1:], argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description="print the files a command opens")
    parser.add_argument("--tracing", default="/sys/kernel/tracing")
    parser.add_argument("--count", type=int)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    for comm, pid, path in snoop(args.tracing, command or None, args.count, args.timeout):
        print(f"{comm} {pid} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
