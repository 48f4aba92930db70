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

As an ordinary user (no root), the namespace is made inside a user namespace of its own
(``CLONE_NEWUSER | CLONE_NEWNS``; the user is root in it, as ``unshare -Ur`` makes
them), which gives the binds above and nothing on the host: its capabilities reach
only mounts of that namespace, and the host's mounts copied into it are locked (they
cannot be unmounted, so a host tracefs or debugfs elsewhere is covered with the mount
rather than detached; a host file it could not read before stays unreadable).  What
it cannot do is make a new tracefs or debugfs: where the host has none mounted at
``/sys/kernel/tracing`` (systemd mounts one there at boot), /proc/mounts has no
``tracefs`` line: ftracetest still finds the mount (its ``grep debugfs`` matches the
mount's ``debugfs`` source), libtracefs (trace-cmd) finds it through a ``debugfs`` line
if the host has debugfs at /sys/kernel/debug, and perf is given ``TRACEFS_PATH``; the
warning says which.  A host that forbids ordinary users a user namespace is named with
the setting to change (:data:`PREREQUISITES`), and exec exits with that setting's
status.

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
import errno
import os
import signal
import sys
import tempfile
from typing import NamedTuple, NoReturn, Sequence

from . import kmod
from .errors import KprobefsError
from .fs.hostproc import KPROBEFS_FSTYPE, own_mounts
from .fs.syscallwatch import hand_over

__all__ = ["ExecError", "PrerequisiteError", "PREREQUISITES", "View", "exec_in_view",
           "prepare_view"]

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
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE = 4
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class ExecError(KprobefsError):
    """The view cannot be made: MNT is not a kprobefs mount, or a namespace or bind
    operation failed.  The message is the one-line reason shown to the user, and
    ``status`` exec's exit status."""

    status = 1


class PrerequisiteError(ExecError):
    """An ordinary user's namespace cannot be made because the host forbids user
    namespaces: the message names the setting and how to change it; ``status`` is
    that setting's (:data:`PREREQUISITES`)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class Prerequisite(NamedTuple):
    """A host setting without which an ordinary user gets no user namespace: the file
    that holds it, the value that forbids them, the call it makes fail (``unshare``,
    or ``mount``: the namespace is made but holds no capability), the exit status of
    exec then, and the one-line message (how to enable them)."""

    path: str
    forbids: str
    fails: str
    status: int
    message: str


_AS_ROOT = "or run kprobefs exec as root"
#: The settings that forbid ordinary users a user namespace, each with its own exit
#: status (7 to 10: kprobefs mount's prerequisites have 3 to 6), in the order they are
#: looked at once the call they make fail has failed.
PREREQUISITES = (
    # Debian's and Ubuntu's patch before Debian 11 enabled it by default.
    Prerequisite("/proc/sys/kernel/unprivileged_userns_clone", "0", "unshare", 7,
                 "user namespaces are disabled for ordinary users "
                 "(kernel.unprivileged_userns_clone = 0): enable them as root with "
                 "`sysctl -w kernel.unprivileged_userns_clone=1` (and a line in "
                 "/etc/sysctl.d/ to keep it), " + _AS_ROOT),
    Prerequisite("/proc/sys/user/max_user_namespaces", "0", "unshare", 8,
                 "user namespaces are disabled (user.max_user_namespaces = 0): enable "
                 "them as root with `sysctl -w user.max_user_namespaces=15000` (and a "
                 "line in /etc/sysctl.d/ to keep it), " + _AS_ROOT),
    # Ubuntu 23.10 and later: the namespace is made, but holds no capability.
    Prerequisite("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1", "mount", 9,
                 "AppArmor gives unconfined programs no capability in a user namespace "
                 "(kernel.apparmor_restrict_unprivileged_userns = 1): allow them as root "
                 "with `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or "
                 "give the Python interpreter an AppArmor profile with `userns,`, "
                 + _AS_ROOT),
)
#: A kernel built without CONFIG_USER_NS has no such file.
USERNS_FILE = "/proc/self/ns/user"
NO_USERNS = Prerequisite(USERNS_FILE, "", "unshare", 10,
                         "the host kernel has no user namespaces (CONFIG_USER_NS is off), "
                         + _AS_ROOT)
#: The limit reached: the user has user.max_user_namespaces of them already.
USERNS_LIMIT = "/proc/sys/user/max_user_namespaces"


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


def _detach_elsewhere(fstype: str, keep: str) -> list[str]:
    """Detaches every mount of fstype but the one at keep, the latest first (a mount
    comes after its parent); returns where those are that cannot be detached: in a
    user namespace, the host's mounts are locked."""
    for where, kind in reversed(_mounts()):
        if kind == fstype and where != keep:
            try:
                _detach(where)
            except ExecError:
                pass    # locked, or already gone with its parent
    return [where for where, kind in _mounts() if kind == fstype and where != keep]


class View(NamedTuple):
    """What :func:`prepare_view` made: warnings for the user, and variables to add to
    the command's environment."""

    warnings: list[str]
    environ: dict[str, str]


def prepare_view(mount: str, kernel_scratch: bool = False) -> View:
    """Enters a private mount namespace (as an ordinary user, inside a user namespace
    of its own) and binds the mount where Linux tools look (the module docstring says
    what goes where), and the emulated kernel's module tools over the host's
    (:func:`_replace_kmod`); with kernel_scratch, the emulated kernel's /dev/null and
    /tmp over the host's too.  The warnings returned name host filesystems that could
    not be placed under the binds, which leaves the tools that look for them in
    /proc/mounts blind, and host module tools left in place; the environment names
    the view for perf where its filesystem is missing.  Raises PrerequisiteError when
    the host forbids the user namespace, ExecError when mount is not a kprobefs mount
    or a bind fails, or with kernel_scratch when the working directory is under /tmp
    (the command would lose its path).  Precondition: this process has one thread
    (unshare)."""
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
    in_userns = _enter_namespace()
    # First: it makes a scratch directory in the host's /tmp, which may be replaced.
    warnings = _replace_kmod()
    # Bound through descriptors opened now, in the new namespace (a bind's source must
    # be there): the mount may be where a host filesystem is about to be placed
    # (kprobefs mount /sys/kernel/debug).
    sources = [_open_path(source) for source, _target in binds + scratch]
    views = {part: _open_path(os.path.join(mount, part)) for _fstype, _target, part in VIEWS}
    additions: dict[str, dict[str, int]] = {}
    for rel in grown:
        target = os.path.join("/proc", rel)
        additions.setdefault(os.path.dirname(target), {})[os.path.basename(target)] = \
            _open_path(os.path.join(mount, PROC_DIR, rel))
    missing = {fstype: why for fstype, target, _part in VIEWS
               if (why := _place_host_fs(fstype, target)) is not None}
    warnings += _missing_fs(missing, in_userns)
    environ = {"TRACEFS_PATH": VIEWS[0][1]} if "tracefs" in missing else {}
    for fstype, target, part in VIEWS:
        for where in _detach_elsewhere(fstype, target):
            warnings += _cover(views[part], os.path.join(mount, part), where, fstype)
    for fd in views.values():
        os.close(fd)
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
    return View(warnings, environ)


def _missing_fs(missing: dict[str, str], in_userns: bool) -> list[str]:
    """The warnings for the host filesystems (fstype -> why) that could not be placed
    under the view.  Without a tracefs line in /proc/mounts, libtracefs (trace-cmd)
    takes the first debugfs line and its tracing/; perf takes $TRACEFS_PATH, which
    the command is given; ftracetest greps for either word, which the mount's
    ``debugfs`` source matches.  So only a missing tracefs is worth a warning, and
    only with debugfs missing too does a tool miss the mount."""
    if "tracefs" not in missing:
        return []
    why = "; ".join(f"{fstype}: {reason}" for fstype, reason in missing.items())
    if "debugfs" in missing:
        text = (f"no tracefs or debugfs line in /proc/mounts ({why}): trace-cmd and other "
                f"libtracefs tools will not find the mount (perf is given TRACEFS_PATH)")
    else:
        text = (f"no tracefs line in /proc/mounts ({why}): tools that look for one will "
                f"not find the mount (libtracefs takes debugfs's tracing/, perf is given "
                f"TRACEFS_PATH)")
    if in_userns:
        text += ("; the host has none mounted to bind over, and a user namespace cannot "
                 "mount one: as root, `mount -t tracefs nodev /sys/kernel/tracing` once, "
                 "as systemd does at boot")
    return [text]


def _cover(fd: int, source: str, where: str, fstype: str) -> list[str]:
    """Binds the view source (its O_PATH descriptor fd, left open) over a host mount
    of fstype that cannot be detached, so that a tool that takes it from /proc/mounts
    reaches the mount; returns a warning when it cannot be.  One under a view's place
    is hidden by the view's bind."""
    if any(where.startswith(target + "/") for _fstype, target, _part in VIEWS):
        return []
    try:
        _mount(f"/proc/self/fd/{fd}", where, None, _MS_BIND,
               what=f"mount --bind {source} {where}")
    except ExecError as e:
        return [f"the host's {fstype} at {where} is left in view ({e}): a tool that "
                f"takes it from /proc/mounts does not reach the mount"]
    return []


def _enter_namespace() -> bool:
    """Enters a private mount namespace in which every mount is private: as root, by
    unshare(CLONE_NEWNS); else in a user namespace of its own (:func:`_enter_userns`).
    Returns whether it is in a user namespace.  Raises PrerequisiteError when the host
    forbids the user namespace, ExecError on another failure."""
    if os.geteuid() == 0:
        _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        return False
    _enter_userns()
    if _libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise _no_userns(ctypes.get_errno(), "mount", "mount --make-rprivate /")
    return True


def _enter_userns() -> None:
    """unshare(CLONE_NEWUSER | CLONE_NEWNS), mapping this user and group to root in the
    new user namespace, as ``unshare -Ur`` does (setgroups is denied first: an
    unprivileged process may only map its own group then).  The capabilities this
    gives reach only what the namespace owns: its mounts, not the host's files."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNS) != 0:
        raise _no_userns(ctypes.get_errno(), "unshare", "unshare(CLONE_NEWUSER)")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                       ("gid_map", f"0 {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError as e:
            raise ExecError(f"/proc/self/{name}: {e.strerror}") from e


def _read_setting(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _no_userns(err: int, call: str, what: str) -> ExecError:
    """The error for a user namespace that could not be made (call ``unshare``) or
    holds no capability (``mount``), what having failed with errno err: the first of
    the host's settings that makes that call fail, else what failed and why."""
    if call == NO_USERNS.fails and not os.path.exists(USERNS_FILE):
        return PrerequisiteError(NO_USERNS.message, NO_USERNS.status)
    for setting in PREREQUISITES:
        if setting.fails == call and _read_setting(setting.path) == setting.forbids:
            return PrerequisiteError(setting.message, setting.status)
    if err == errno.ENOSPC:
        return PrerequisiteError(
            f"this user has as many user namespaces as user.max_user_namespaces allows "
            f"({_read_setting(USERNS_LIMIT)}): raise it as root with `sysctl -w "
            f"user.max_user_namespaces=15000`, " + _AS_ROOT, PREREQUISITES[1].status)
    return ExecError(f"{what}: {os.strerror(err)} (the host does not let this user make a "
                     f"user namespace here; {_AS_ROOT})")


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
    a failure before the command runs, prints the reason and exits with its status:
    1 (ExecError), a prerequisite's (:data:`PREREQUISITES`), 127 (no such command) or
    126 (not executable), as shells do."""
    mount = os.path.realpath(mount)
    try:
        view = prepare_view(mount, kernel_scratch)
    except ExecError as e:
        print(f"kprobefs: {e}", file=sys.stderr)
        sys.exit(e.status)
    for warning in view.warnings:
        print(f"kprobefs: warning: {warning}", file=sys.stderr)
    os.environ.update(view.environ)
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
