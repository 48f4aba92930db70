"""``kprobefs exec``: runs an unmodified tracing tool (trace-cmd, perf, ftracetest, the
perf-tools scripts) against a kprobefs mount, in a private mount namespace in which the
mount is where Linux tools look for the kernel's tracing files.

In that namespace only (the host's mounts are left alone):

- ``MNT/tracing`` is bound over ``/sys/kernel/tracing``, tracefs's place since 4.1;
- ``MNT``, the debugfs view (``kprobes/``, ``tracing/``), over ``/sys/kernel/debug``,
  where older tools (the perf-tools scripts) find ``/sys/kernel/debug/tracing``;
- every file the daemon serves under ``MNT/proc`` (``kallsyms``, ``version``,
  ``modules``, the ``sys/`` knobs) over the host's file of that name, so that perf and
  ftracetest read the emulated kernel's symbols and banner.  procfs cannot grow a file,
  so one the host kernel lacks (``/proc/modules`` without CONFIG_MODULES) stays absent,
  except a ``sys/`` knob: its directory is shadowed by a tmpfs of binds of its entries
  and of the knob (``/proc/sys/kernel/stack_tracer_enabled`` on a host without it);
- ``/dev/null`` over the host kernel's ``/sys/kernel/notes`` and ``/proc/kcore``
  (MASKED), which the emulated kernel has no counterpart of;
- the emulated kernel's ``modprobe``, ``insmod``, ``rmmod`` and ``lsmod``
  (:mod:`kprobefs.kmod`) over the file the host's resolve to (Debian's /bin/kmod), so
  that a tool's ``modprobe`` loads the emulated kernel's module and no way is left to
  load one of the host's;
- with ``kernel_scratch`` (``--kernel-scratch``), ``MNT/dev/null`` and ``MNT/tmp``
  over ``/dev/null`` and ``/tmp``.

How the tools find it.  libtracefs (trace-cmd) takes the first line of ``/proc/mounts``
whose type is ``tracefs`` and has no other override; perf takes ``$TRACEFS_PATH``, else a
known path whose statfs() says TRACEFS_MAGIC, else that same line; ftracetest greps
``/proc/mounts`` for ``tracefs``.  A bind of a FUSE mount is listed as ``fuse.kprobefs``
and statfs() says FUSE_SUPER_MAGIC, whatever the daemon passes, so none of them would
find it, and libtracefs and perf would then mount the host's tracefs themselves.  So
the host kernel's own tracefs (and debugfs) is placed first, and the mount is bound on
top of it: ``/proc/mounts`` has the ``tracefs`` line at ``/sys/kernel/tracing``, and
every lookup under that path reaches the mount, which hides the host's files
completely.  Mounts of either type elsewhere are detached, so that line is the first.
An existing mount is bound rather than a new one made: a new mount may reset the one
superblock's mode, uid and gid (kernels before 6.7 did).

Before that, the daemon is asked to mirror the command's system calls (``chdir``…) into
its task in the emulated kernel, through a seccomp filter whose listener it takes
(:mod:`kprobefs.fs.syscallwatch`); where it does not (an older daemon, a host kernel
without seccomp user notification), the command runs without, after a warning.
The command then replaces this process (execvp), so its exit status, its signals and
its place in the terminal's foreground are its own.  By default /dev/null and /tmp stay
the host's: a tool's scratch files and redirections are no business of the emulated
kernel, and through it every ``2>/dev/null`` costs a FUSE round trip and hangs with a
stuck daemon.  Tests written to run on the kernel they trace (ftracetest's
kprobe_args_user.tc traces its own ``echo > /dev/null``) ask for them with
``--kernel-scratch``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
import tempfile
from typing import NoReturn, Sequence

from . import kmod
from .errors import KprobefsError
from .fs.hostproc import KPROBEFS_FSTYPE, own_mounts
from .fs.syscallwatch import hand_over

__all__ = ["ExecError", "exec_in_view", "prepare_view"]

#: Where Linux mounts its tracing filesystems, and which part of the mount goes on top.
VIEWS = (("tracefs", "/sys/kernel/tracing", "tracing"),
         ("debugfs", "/sys/kernel/debug", ""))
#: The mount's directory of emulated /proc files.
PROC_DIR = "proc"
#: Host files about the running kernel that the emulated one has no counterpart of,
#: masked with an empty file: /sys/kernel/notes holds the build id under which perf
#: files what it learns of the kernel (its kallsyms, its probes) in ~/.debug; perf
#: reads the kernel's text from /proc/kcore, the host kernel's memory.
MASKED = ("/sys/kernel/notes", "/proc/kcore")
#: The type /proc/mounts gives a kprobefs mount (fuse.SUBTYPE; fs/fuse_ops.py).
FSTYPE = KPROBEFS_FSTYPE
#: With --kernel-scratch: the emulated kernel's files (in the mount) over the host's.
SCRATCH = (("dev/null", "/dev/null"), ("tmp", "/tmp"))
#: Where the host's kmod tools are looked for, besides $PATH.
TOOL_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
#: Where a kmod tool the host lacks is added (first in root's default PATH).
ADDED_TOOLS_DIR = "/usr/local/sbin"

_CLONE_NEWNS = 0x00020000
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class ExecError(KprobefsError):
    """The view cannot be made: MNT is not a kprobefs mount, or a namespace or bind
    operation failed.  The message is the one-line reason shown to the user."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise ExecError(f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           what: str | None = None) -> None:
    _check(_libc.mount(source and os.fsencode(source), os.fsencode(target),
                       fstype and fstype.encode(), flags, None),
           what or f"mount {source or fstype} on {target}")


def _detach(target: str) -> None:
    _check(_libc.umount2(os.fsencode(target), _MNT_DETACH), f"umount -l {target}")


def _mounts() -> list[tuple[str, str]]:
    """(mount point, type) of this namespace's mounts, in /proc/mounts order."""
    return [(m.point, m.fstype) for m in own_mounts()]


def _kprobefs_mounts() -> list[str]:
    """The mount points of the kprobefs mounts this process sees."""
    return [where for where, fstype in _mounts() if fstype == FSTYPE]


def _raise(error: OSError) -> NoReturn:
    raise error


def _proc_files(mount: str) -> list[str]:
    """The files under MNT/proc, as paths relative to it.  Raises OSError when the
    daemon does not answer (ENOTCONN: it is gone)."""
    root = os.path.join(mount, PROC_DIR)
    found = []
    for parent, _dirs, files in os.walk(root, onerror=_raise):
        found += [os.path.relpath(os.path.join(parent, name), root) for name in files]
    return sorted(found)


def _place_host_fs(fstype: str, target: str) -> str | None:
    """Makes target a mount of the host kernel's fstype (bound from an existing one, or
    a new mount); returns why it could not, None when it is there."""
    mounts = _mounts()
    if (target, fstype) in mounts:
        return None
    existing = [where for where, kind in mounts if kind == fstype]
    try:
        if existing:
            _mount(existing[0], target, None, _MS_BIND)
        else:
            _mount("nodev", target, fstype, 0)
    except ExecError as e:
        return str(e)
    return None


def _detach_elsewhere(fstype: str, keep: str) -> None:
    """Detaches every mount of fstype but the one at keep, the latest first (a mount
    comes after its parent)."""
    for where, kind in reversed(_mounts()):
        if kind == fstype and where != keep:
            try:
                _detach(where)
            except ExecError:
                pass    # already gone with its parent


def prepare_view(mount: str, kernel_scratch: bool = False) -> list[str]:
    """Enters a private mount namespace and binds the mount where Linux tools look (the
    module docstring says what goes where), and the emulated kernel's module tools
    over the host's (:func:`_replace_kmod`); with kernel_scratch, the emulated kernel's
    /dev/null and /tmp over the host's too.  Returns warnings: host filesystems that
    could not be placed under the binds, which leaves the tools that look for them in
    /proc/mounts blind, and host module tools left in place.  Raises ExecError when
    mount is not a kprobefs mount or a bind fails, or with kernel_scratch when the
    working directory is under /tmp (the command would lose its path).  Precondition:
    this process has one thread (unshare(CLONE_NEWNS))."""
    mount = os.path.realpath(mount)
    if mount not in _kprobefs_mounts():
        raise ExecError(f"{mount}: not a kprobefs mount")
    if kernel_scratch:
        _check_cwd_outside("/tmp")
    try:
        proc_files = _proc_files(mount)
    except OSError as e:
        raise ExecError(f"{e.filename}: {e.strerror}") from e
    binds = [(os.path.join(mount, part), target) for _fstype, target, part in VIEWS]
    binds += [(os.path.join(mount, PROC_DIR, rel), os.path.join("/proc", rel))
              for rel in proc_files if os.path.isfile(os.path.join("/proc", rel))]
    scratch = [(os.path.join(mount, part), target) for part, target in SCRATCH
               if kernel_scratch]
    # A sysctl the host kernel lacks (stack_tracer_enabled without its STACK_TRACER)
    # is added by shadowing its directory (below).
    grown = [rel for rel in proc_files if rel.startswith("sys/")
             and not os.path.exists(os.path.join("/proc", rel))
             and os.path.isdir(os.path.dirname(os.path.join("/proc", rel)))]
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # First: it makes a scratch directory in the host's /tmp, which may be replaced.
    warnings = _replace_kmod()
    # Bound through descriptors opened now, in the new namespace (a bind's source must
    # be there): the mount may be where a host filesystem is about to be placed
    # (kprobefs mount /sys/kernel/debug).
    sources = [_open_path(source) for source, _target in binds + scratch]
    additions: dict[str, dict[str, int]] = {}
    for rel in grown:
        target = os.path.join("/proc", rel)
        additions.setdefault(os.path.dirname(target), {})[os.path.basename(target)] = \
            _open_path(os.path.join(mount, PROC_DIR, rel))
    for fstype, target, _part in VIEWS:
        why = _place_host_fs(fstype, target)
        if why is not None:
            warnings.append(f"no {fstype} under {target} ({why}): tools that look for "
                            f"it in /proc/mounts will not find the mount")
    for fstype, target, _part in VIEWS:
        _detach_elsewhere(fstype, target)
    fds = dict(zip(binds + scratch, sources))
    for source, target in binds:
        _bind_fd(fds[source, target], source, target)
    for directory, added in additions.items():
        _shadow_dir(directory, added)
    for target in MASKED:
        if os.path.exists(target):
            _mount(os.devnull, target, None, _MS_BIND)
    for source, target in scratch:      # last: the host's /dev/null is bound above
        _bind_fd(fds[source, target], source, target)
    return warnings


def _bind_fd(fd: int, source: str, target: str) -> None:
    """Binds what the O_PATH descriptor fd (closed here) names, source, over target."""
    _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND,
           what=f"mount --bind {source} {target}")
    os.close(fd)


def _check_cwd_outside(directory: str) -> None:
    """Raises ExecError when the working directory is directory or below it."""
    cwd = os.getcwd()
    if cwd == directory or cwd.startswith(directory + "/"):
        raise ExecError(f"--kernel-scratch: the working directory {cwd} is under "
                        f"{directory}, which the emulated kernel's {directory} replaces; "
                        f"run from a directory outside it")


def _host_kmod() -> tuple[list[str], list[str], list[str]]:
    """The host's module tools: (the files to replace, the names found nowhere, the
    tools that cannot be replaced and why).  A tool is looked for in TOOL_DIRS and
    $PATH; what is replaced is the file it resolves to, which on Debian is the one
    /bin/kmod behind every name, so every way in (``kmod`` itself, any path) is
    covered.  A tool that resolves to another multi-call program (busybox's applets)
    is left: binding over that program would replace all its other commands."""
    dirs = list(TOOL_DIRS) + [d for d in os.environ.get("PATH", "").split(":") if d]
    files, missing, kept = set(), [], []
    for name in kmod.TOOLS + (kmod.KMOD,):
        found = {os.path.realpath(os.path.join(d, name)) for d in dirs
                 if os.path.isfile(os.path.join(d, name))}
        if not found and name != kmod.KMOD:
            missing.append(name)
        for path in found:
            if os.path.basename(path) in kmod.TOOLS + (kmod.KMOD,):
                files.add(path)
            else:
                kept.append(f"the host's {name} ({path}) is left in place: it acts on "
                            f"the host kernel's modules")
    return sorted(files), missing, kept


def _replace_kmod() -> list[str]:
    """Binds the emulated kernel's module tools (kprobefs.kmod, run by this process's
    interpreter) over the host's (:func:`_host_kmod`), and adds those the host lacks
    to ADDED_TOOLS_DIR.  The program is written to a tmpfs of its own, mounted on a
    scratch directory only while the binds are made: so it can run even where the
    host's temporary directories are noexec, and nothing is left on the host.
    Returns warnings (tools left in place or not added)."""
    if not sys.executable:
        raise ExecError("the Python interpreter running kprobefs is unknown "
                        "(sys.executable): the module tools cannot be made")
    files, missing, warnings = _host_kmod()
    scratch = tempfile.mkdtemp(prefix="kprobefs-exec-")
    try:
        _mount("tmpfs", scratch, "tmpfs", 0)
        try:
            program = os.path.join(scratch, kmod.KMOD)
            with open(program, "w") as f:
                f.write(kmod.shim_script(sys.executable))
            os.chmod(program, 0o755)
            for target in files:
                _mount(program, target, None, _MS_BIND,
                       what=f"mount --bind {kmod.__name__} {target}")
            if missing and os.path.isdir(ADDED_TOOLS_DIR):
                _shadow_dir(ADDED_TOOLS_DIR, {name: _open_path(program) for name in missing})
            elif missing:
                warnings.append(f"no {', '.join(missing)} in the namespace: the host has "
                                f"none and {ADDED_TOOLS_DIR} is missing")
        finally:
            _detach(scratch)
    finally:
        os.rmdir(scratch)
    return warnings


def _shadow_dir(directory: str, added: dict[str, int]) -> None:
    """Grows ``directory`` (of procfs, which cannot grow; or any other) by the files
    ``added`` (name -> an O_PATH descriptor of what to bind there, closed here): a
    tmpfs over it holds a bind of each of its entries and of each added file.  A
    dangling symbolic link is left out."""
    entries = {}
    for name in os.listdir(directory):
        if name not in added and os.path.exists(os.path.join(directory, name)):
            entries[name] = _open_path(os.path.join(directory, name))
    _mount("tmpfs", directory, "tmpfs", 0)
    for name, fd in {**entries, **added}.items():
        path = os.path.join(directory, name)
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.mkdir(path)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        _bind_fd(fd, name, path)


def _open_path(path: str) -> int:
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise ExecError(f"{path}: {e.strerror}") from e


def exec_in_view(mount: str, argv: Sequence[str], kernel_scratch: bool = False
                 ) -> NoReturn:
    """Runs argv in the view of mount: prepare_view, the hand-over of its system calls
    (:func:`~kprobefs.fs.syscallwatch.hand_over`), then execvp.  Does not return: on
    a failure before the command runs, prints the reason and exits 1 (ExecError), 127
    (no such command) or 126 (not executable), as shells do."""
    mount = os.path.realpath(mount)
    try:
        for warning in prepare_view(mount, kernel_scratch):
            print(f"kprobefs: warning: {warning}", file=sys.stderr)
    except ExecError as e:
        print(f"kprobefs: {e}", file=sys.stderr)
        sys.exit(1)
    # Last, so that nothing of the view's making is notified.
    why = hand_over(mount)
    if why is not None:
        print(f"kprobefs: warning: system calls are not mirrored: {why}", file=sys.stderr)
    # Python ignores SIGPIPE and SIGXFSZ, and ignored signals stay ignored across exec.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(argv[0], list(argv))
    except OSError as e:
        print(f"kprobefs: {argv[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127 if isinstance(e, FileNotFoundError) else 126)
