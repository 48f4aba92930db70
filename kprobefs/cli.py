"""The command line: ``kprobefs mount [MOUNTPOINT]``, ``kprobefs umount [MOUNTPOINT]``,
``kprobefs status [MOUNTPOINT]`` and ``kprobefs exec [MOUNTPOINT] [-- COMMAND [ARG...]]``.

``mount`` returns once every file is ready: it forks, the child boots the kernel and
serves, and the parent waits on a readiness pipe, then exits 0 (or non-zero with a
one-line reason, once the child is gone: a mount that fails leaves no process).  The
child keeps none of its caller's descriptors and logs to ``--log-file``, else to the
journal or syslog through ``/dev/log``, else to ``/var/log/kprobefs.log`` (a user's
``~/.local/state/kprobefs.log``).  ``--foreground`` serves
in the calling process and logs to stderr (for systemd, which hears READY=1 on
$NOTIFY_SOCKET and keeps stderr in the journal).  ``status`` prints the daemon's health
(``MNT/kprobefs/status``) and exits 0 when it is ok, 1 when degraded, 2 when it does not
answer.  ``exec`` runs COMMAND (default: $SHELL) with the mount where Linux tools look
for tracefs, debugfs and the kernel's /proc files (kprobefs.execns); its exit status is
the command's.
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, NoReturn, Sequence

from .daemon import (
    DEFAULT_MOUNTPOINT, Daemon, StartupError, check_fuse, check_fusermount, is_stale_mount,
    prepare_mountpoint, unmount,
)

__all__ = ["main", "build_parser"]

log = logging.getLogger("kprobefs")

LOG_FORMAT = "%(asctime)s kprobefs[%(process)d] %(levelname)s %(name)s: %(message)s"
SYSLOG_FORMAT = "kprobefs[%(process)d]: %(levelname)s %(name)s: %(message)s"
#: Where a backgrounded daemon logs without --log-file: syslog's socket (the journal
#: listens there too), else this file.
SYSLOG_SOCKET = "/dev/log"
DEFAULT_LOG_FILE = "/var/log/kprobefs.log"
#: A user's, under $XDG_STATE_HOME (default ~/.local/state).
USER_LOG_FILE = "kprobefs.log"
#: Exit statuses of `kprobefs status`.
STATUS_OK, STATUS_DEGRADED, STATUS_NO_ANSWER = 0, 1, 2
LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


def _positive_rate(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("the rate cannot be negative")
    return value


def _cpus(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 8:
        raise argparse.ArgumentTypeError("between 1 and 8 CPUs")
    return value


def _host_cpu(text: str) -> int | None:
    """A host CPU the process may run on, or None for "any"."""
    if text == "any":
        return None
    try:
        cpu = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("a CPU number or 'any'") from None
    if cpu not in os.sched_getaffinity(0):
        raise argparse.ArgumentTypeError(f"CPU {cpu} is not one this process may use")
    return cpu


#: The examples of each command's --help (kprobefs(8), docs/kprobefs.8, has them too).
EXAMPLES = {
    None: """\
examples:
  kprobefs mount                          boot the kernel, mount it at /run/kprobefs
  echo 'p:myprobe vfs_read count=%dx:u32' > /run/kprobefs/tracing/kprobe_events
  echo 1 > /run/kprobefs/tracing/events/kprobes/myprobe/enable
  cat /run/kprobefs/tracing/trace         the cat's own vfs_read calls
  kprobefs exec -- trace-cmd show         the same through trace-cmd
  kprobefs status                         the daemon's health
  kprobefs umount                         unmount; the daemon exits

Run `kprobefs COMMAND --help` for a command's options; see kprobefs(8).""",
    "mount": """\
examples:
  kprobefs mount                          at /run/kprobefs, in the background
  kprobefs mount --cpus 4 /mnt/kprobefs   four virtual CPUs, at /mnt/kprobefs
  kprobefs mount --workload 100           with 100 background operations a second
  kprobefs mount --foreground             serve in this process, log to stderr""",
    "umount": """\
examples:
  kprobefs umount                         unmount /run/kprobefs
  kprobefs umount /mnt/kprobefs""",
    "status": """\
examples:
  kprobefs status                         prints "state: ok" and more; exit 0
  kprobefs status --timeout 1 /mnt/kprobefs || echo "exit status $?"
                                          1 degraded, 2 no answer""",
    "exec": """\
Inside the namespace modprobe, insmod, rmmod and lsmod (and kmod list) act on the
emulated kernel's modules, with kmod's messages and exit statuses, in place of the
host's kmod.

examples:
  kprobefs exec                           a shell ($SHELL) in the namespace
  kprobefs exec -- trace-cmd list -e      the emulated kernel's events
  kprobefs exec -- perf probe -a vfs_read
  kprobefs exec -- sh -c 'modprobe trace_printk && lsmod && rmmod trace_printk'
  cd tools/testing/selftests/ftrace && kprobefs exec --kernel-scratch -- ./ftracetest""",
}


def _command_parser(sub, name: str, help: str, description: str, **kw):
    """A subcommand whose --help keeps the description's lines and ends with its
    examples (EXAMPLES)."""
    return sub.add_parser(name, help=help, description=description, epilog=EXAMPLES[name],
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kprobefs", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve the debugfs/tracefs/proc files of an emulated kernel (with its "
                    "kprobes\nengine and tracer) as a FUSE filesystem.",
        epilog=EXAMPLES[None])
    parser.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                        type=str.upper,
                        help="log threshold (logs go to stderr; default INFO with "
                             "--foreground, else WARNING)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = _command_parser(sub, "mount", help="boot the kernel and mount its files",
                        description="""\
Boot the emulated kernel and mount its files at MOUNTPOINT: tracing/ (tracefs),
kprobes/ (debugfs's kprobes files), proc/ (its kallsyms, modules, version and
sysctl knobs), dev/ and tmp/ (its /dev and /tmp), kprobefs/ (the daemon's status
and module control).  Returns once every file is ready, unless --foreground.""")
    _mountpoint_argument(m, "where to mount", ", created if missing")
    m.add_argument("-f", "--foreground", action="store_true",
                   help="serve in this process (systemd: Type=notify)")
    m.add_argument("--cpus", type=_cpus, default=2, metavar="N",
                   help="virtual CPUs (1-8, default 2)")
    m.add_argument("--workload", type=_positive_rate, default=0.0, metavar="RATE",
                   help="background operations per second (default 0: none)")
    m.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for the machine and the workload (default 0)")
    m.add_argument("--host-cpu", type=_host_cpu, default=None, metavar="CPU",
                   help="run every thread of the daemon on this one host CPU, or 'any' "
                        "(the default): the GIL lets one run at a time, and on one CPU "
                        "handing it over is a context switch, not a wake-up of another "
                        "CPU")
    m.add_argument("--allow-other", action="store_true",
                   help="let other users use the mount (modes still apply; a user's "
                        "mount needs user_allow_other in /etc/fuse.conf)")
    m.add_argument("--log-file", metavar="PATH",
                   help="where a daemonized server logs (default: syslog through "
                        f"{SYSLOG_SOCKET}, else {DEFAULT_LOG_FILE}, a user's "
                        f"~/.local/state/{USER_LOG_FILE}; with --foreground logs stay "
                        "on stderr)")
    _log_level_option(m)

    u = _command_parser(sub, "umount", help="unmount a kprobefs mount",
                        description="""\
Unmount MOUNTPOINT; the daemon then exits.  A stale mount left by a killed daemon
is cleaned too.""")
    _mountpoint_argument(u, "the mount point")
    _log_level_option(u)

    st = _command_parser(sub, "status", help="print the daemon's health",
                         description="""\
Print the health of the daemon serving MOUNTPOINT (its kprobefs/status file).
Exit status: 0 ok, 1 degraded, 2 no answer.""")
    _mountpoint_argument(st, "the mount point")
    st.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                    help="how long to wait for an answer (default 5)")
    _log_level_option(st)

    ex = _command_parser(sub, "exec", help="run a tracing tool against the mount",
                         usage="%(prog)s [-h] [--kernel-scratch] [--log-level L] "
                               "[MOUNTPOINT] [-- COMMAND [ARG...]]",
                         description="""\
Run COMMAND (default: $SHELL) in a private mount namespace where MOUNTPOINT/tracing
is /sys/kernel/tracing (a tracefs line in /proc/mounts), MOUNTPOINT is
/sys/kernel/debug, and the emulated kernel's kallsyms, version, modules and sysctl
knobs replace the host's /proc files.  As an ordinary user, the namespace is made
inside a user namespace of its own, in which the user is root (as unshare -Ur).
Exit status: the command's; before it runs, 1 when the namespace cannot be made, 7 to
10 when the host forbids an ordinary user a user namespace (the message says which
setting, and how to enable it).""")
    _mountpoint_argument(ex, "the mount point")
    ex.add_argument("--kernel-scratch", action="store_true",
                    help="make /dev/null and /tmp the emulated kernel's too (its dev/null "
                         "and tmp/), so that a command's redirections and scratch files "
                         "are the traced kernel's (ftracetest's kprobe_args_user.tc needs "
                         "it); the working directory must not be under /tmp")
    ex.set_defaults(program=[])     # what follows --, see _parse
    _log_level_option(ex)
    return parser


def _mountpoint_argument(command, what: str, more: str = "") -> None:
    """The optional MOUNTPOINT argument, DEFAULT_MOUNTPOINT when left out."""
    command.add_argument("mountpoint", nargs="?", default=DEFAULT_MOUNTPOINT,
                         help=f"{what} (default {DEFAULT_MOUNTPOINT}{more})")


def _log_level_option(command) -> None:
    """--log-level after the command, the same as before it."""
    command.add_argument("--log-level", dest="sub_log_level", default=None,
                         choices=LOG_LEVELS, type=str.upper,
                         help="log threshold (same as before the command)")


def _setup_logging(level: str, handler: logging.Handler | None = None) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.addHandler(handler)
    if level:
        root.setLevel(level)


def daemon_log_handler(log_file: str | None) -> tuple[logging.Handler, str]:
    """Where a backgrounded daemon logs, and a name for it: log_file when given (stderr,
    which then points there), else syslog through SYSLOG_SOCKET when something listens
    there, else default_log_file()."""
    if log_file:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        return handler, log_file
    if not _listens(SYSLOG_SOCKET):
        path = default_log_file()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        return handler, path
    handler = logging.handlers.SysLogHandler(
        address=SYSLOG_SOCKET, facility=logging.handlers.SysLogHandler.LOG_DAEMON)
    handler.setFormatter(logging.Formatter(SYSLOG_FORMAT))
    return handler, f"syslog ({SYSLOG_SOCKET})"


def default_log_file() -> str:
    """The log file of a backgrounded daemon without syslog: DEFAULT_LOG_FILE as root,
    a user's USER_LOG_FILE under $XDG_STATE_HOME (~/.local/state), which is theirs."""
    if os.geteuid() == 0:
        return DEFAULT_LOG_FILE
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return os.path.join(state, USER_LOG_FILE)


def _listens(path: str) -> bool:
    """Whether something accepts log messages on the unix socket at path (SysLogHandler
    itself says nothing when nobody does)."""
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_UNIX, kind) as s:
            try:
                s.connect(path)
            except OSError:
                continue
            return True
    return False


def _fail(reason: str, status: int = 1) -> int:
    print(f"kprobefs: {reason}", file=sys.stderr)
    return status


# ==== mount ===============================================================================
def _make_daemon(args, factories) -> Daemon:
    if args.host_cpu is not None:
        # Before any thread starts: every thread of the daemon inherits it.
        os.sched_setaffinity(0, {args.host_cpu})
    return Daemon(args.mountpoint, cpus=args.cpus, seed=args.seed,
                  workload_rate=args.workload, allow_other=args.allow_other, **factories)


def _mount_foreground(args, factories) -> int:
    try:
        check_fuse(args.allow_other)
        args.mountpoint = prepare_mountpoint(args.mountpoint)
        daemon = _make_daemon(args, factories)
        daemon.boot()
        daemon.keep_boot_objects()
        daemon.serve()
    except StartupError as e:
        return _fail(str(e), e.exit_status)
    return 0


def _detach(log_file: str | None) -> None:
    """Lets go of everything the caller gave this process (a pipe the daemon held open
    would keep that caller waiting: ``out=$(kprobefs mount DIR)``): stdin reads
    /dev/null, stdout and stderr go to log_file or /dev/null, the descriptors above
    them are closed; the log goes where a backgrounded daemon logs
    (daemon_log_handler).  StartupError when log_file cannot be opened."""
    _close_inherited()
    try:
        target = os.open(log_file or os.devnull,
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    except OSError as e:
        raise StartupError(f"{log_file}: cannot log there ({e.strerror})") from e
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(target, 1)
    os.dup2(target, 2)
    os.close(devnull)
    os.close(target)
    try:
        handler, where = daemon_log_handler(log_file)
    except OSError:
        return      # nowhere to log: the stderr handler writes to /dev/null
    _setup_logging("", handler)
    log.info("logging to %s", where)


def _close_inherited() -> None:
    """Closes the descriptors above stderr that the caller passed down: the inheritable
    ones (Python opens its own close-on-exec, PEP 446)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if fd > 2 and os.get_inheritable(fd):
                os.close(fd)
        except OSError:
            pass        # the listing's own descriptor, closed since


def _mount_daemon(args, factories) -> int:
    try:
        check_fuse(args.allow_other)
        args.mountpoint = prepare_mountpoint(args.mountpoint)
    except StartupError as e:
        return _fail(str(e), e.exit_status)
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return _wait_for_child(pid, read_end, args.mountpoint)

    # The child: a new session, none of the caller's descriptors, then boot and serve.
    os.close(read_end)
    os.setsid()
    status = 1
    report = _Reporter(write_end)
    try:
        _detach(args.log_file)
        daemon = _make_daemon(args, factories)
        daemon.on_ready = lambda: report.send("OK\n")
        daemon.on_failure = lambda reason: report.send(f"ERR {reason}\n")
        daemon.boot()
        daemon.keep_boot_objects()
        daemon.serve()
        status = 0
    except StartupError as e:
        status = e.exit_status
        report.send(f"ERR {e}\n")
    except BaseException as e:  # noqa: BLE001 - the parent must hear why
        log.exception("the daemon failed")
        report.send(f"ERR {type(e).__name__}: {e}\n")
    finally:
        report.send("ERR the daemon stopped before the filesystem was ready\n")
        os._exit(status)


class _Reporter:
    """The child's end of the readiness pipe: the first message wins."""

    def __init__(self, fd: int):
        self.fd = fd

    def send(self, message: str) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            os.write(fd, message.encode())
        except OSError:
            pass
        os.close(fd)


#: How long a mount that failed waits for its daemon to exit (it unmounts and stops at
#: once) before it kills it: the command returns with no process left behind (s).
FAILED_DAEMON_GRACE = 10.0


def _wait_for_child(pid: int, read_end: int, mountpoint: str) -> int:
    data = b""
    while True:
        chunk = os.read(read_end, 4096)
        if not chunk:
            break
        data += chunk
    os.close(read_end)
    message = data.decode(errors="replace").strip()
    if message == "OK":
        return 0
    status = _end_child(pid, mountpoint)
    reason = message[4:] if message.startswith("ERR ") else (
        message or "the daemon exited during startup")
    return _fail(reason, status)


def _end_child(pid: int, mountpoint: str) -> int:
    """Waits for a daemon that failed to start to exit, at most FAILED_DAEMON_GRACE s,
    then kills it and lets go of a mount it left.  Returns the exit status to give: the
    daemon's own, else 1."""
    deadline = time.monotonic() + FAILED_DAEMON_GRACE
    while time.monotonic() < deadline:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            return max(os.waitstatus_to_exitcode(wait_status), 1)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if is_stale_mount(mountpoint):
        unmount(mountpoint, lazy=True)
    return 1


# ==== status ==============================================================================
def _status(args) -> int:
    """Prints MOUNTPOINT/kprobefs/status.  A reader is a child process: should the
    daemon not answer, the child may sleep uninterruptibly in the mount, and this
    command must still return."""
    path = os.path.join(os.path.abspath(args.mountpoint), "kprobefs", "status")
    child = subprocess.Popen(["cat", path], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = child.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        print(f"state: no answer\n{path}: no answer within {args.timeout:g} s")
        return STATUS_NO_ANSWER
    if child.returncode != 0:
        reason = err.decode(errors="replace").strip() or f"cat exited {child.returncode}"
        print(f"state: no answer\n{reason}")
        return STATUS_NO_ANSWER
    text = out.decode(errors="replace")
    sys.stdout.write(text)
    return STATUS_OK if text.startswith("state: ok") else STATUS_DEGRADED


# ==== umount ==============================================================================
def _umount(args) -> int:
    path = os.path.abspath(args.mountpoint)
    if os.geteuid() != 0:
        try:
            check_fusermount()      # a user unmounts through it
        except StartupError as e:
            return _fail(str(e), e.exit_status)
    if is_stale_mount(path):
        if unmount(path, lazy=True):
            print(f"{path}: cleaned a stale mount", file=sys.stderr)
            return 0
        return _fail(f"{path}: cannot clean the stale mount")
    if not os.path.ismount(path):
        return _fail(f"{path}: not mounted")
    if not unmount(path):
        return _fail(f"{path}: cannot unmount (busy?); try: umount -l {path}")
    return 0


# ==== exec ================================================================================
def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, except that everything after the first ``--`` is exec's command
    (argparse would give its first word to MOUNTPOINT)."""
    if "--" not in argv:
        return parser.parse_args(argv)
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    if args.command != "exec":
        parser.error("-- is for exec's command: kprobefs exec [MOUNTPOINT] -- COMMAND")
    args.program = argv[cut + 1:]
    return args


def _exec(args) -> NoReturn:
    from .execns import exec_in_view
    exec_in_view(args.mountpoint, args.program or [os.environ.get("SHELL") or "/bin/sh"],
                 kernel_scratch=args.kernel_scratch)


def main(argv: Sequence[str] | None = None, kernel_factory: Callable | None = None,
         tracer_factory: Callable | None = None) -> int:
    """The CLI; returns the exit status (``exec`` does not return: it becomes the
    command).  The factories replace the bundled kernel and plug in a tracer (see
    :class:`~kprobefs.daemon.Daemon`)."""
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    factories = dict(kernel_factory=kernel_factory, tracer_factory=tracer_factory)
    default = "INFO" if getattr(args, "foreground", False) else "WARNING"
    _setup_logging(args.sub_log_level or args.log_level or default)
    if args.command == "umount":
        return _umount(args)
    if args.command == "status":
        return _status(args)
    if args.command == "exec":
        return _exec(args)
    if args.foreground:
        return _mount_foreground(args, factories)
    return _mount_daemon(args, factories)


if __name__ == "__main__":
    sys.exit(main())
