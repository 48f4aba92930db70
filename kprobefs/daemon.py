"""Wiring and lifecycle: boot the kernel, build the tree, mount, serve, unmount.

Order matters (STYLE habit 9): the process forks (when it daemonizes) before anything
starts a thread; the kernel boots in the serving process; the daemon's threads (the
machine thread, reaper, readiness probe, the system call mirror's) start in FUSE's init(), which runs in a
libfuse worker thread with signals blocked, so SIGTERM/SIGINT reach libfuse's handler in
the main thread and end the loop, which unmounts.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import pwd
import socket
import stat
import threading
import time
from typing import Callable

from .fs.fuse_ll import FUSERMOUNTS, find_fusermount, unmount
from .fs.gateway import Gateway
from .fs.procwatch import ProcessEvents
from .fs.schedwatch import KernelMirror, SchedWatch
from .fs.syscallwatch import SyscallWatch
from .fs.tree import build_tree
from .health import status_text

__all__ = ["Daemon", "StartupError", "NoFuseDevice", "NoFusermount", "FusermountNotSetuid",
           "AllowOtherRefused", "make_tracer", "sd_notify", "check_fuse",
           "check_fusermount", "prepare_mountpoint", "unmount", "is_stale_mount",
           "DEFAULT_MOUNTPOINT", "FUSE_DEVICE", "FUSE_CONF"]

log = logging.getLogger("kprobefs.daemon")

DEFAULT_MOUNTPOINT = "/run/kprobefs"
FUSE_DEVICE = "/dev/fuse"
#: fusermount's configuration: a line ``user_allow_other`` lets users mount with
#: allow_other.
FUSE_CONF = "/etc/fuse.conf"


class StartupError(Exception):
    """The daemon cannot start; the message is the one-line reason shown to the user,
    ``exit_status`` the command's.  The subclasses are the prerequisites of a mount,
    each with its own status (docs/without-root.md lists them)."""

    exit_status = 1


class NoFuseDevice(StartupError):
    """/dev/fuse is missing, or this user may not open it (its mode, or a container's
    device rules)."""

    exit_status = 3


class NoFusermount(StartupError):
    """A user's mount or umount: neither fusermount3 nor fusermount is on PATH."""

    exit_status = 4


class FusermountNotSetuid(StartupError):
    """A user's mount or umount: the fusermount found is not set-uid root, or lies on a
    filesystem mounted nosuid, so it cannot mount for the user."""

    exit_status = 5


class AllowOtherRefused(StartupError):
    """A user's ``--allow-other``: /etc/fuse.conf has no ``user_allow_other`` line."""

    exit_status = 6


# ==== sd_notify ===========================================================================
def sd_notify(state: str, environ=os.environ) -> bool:
    """Sends state (``READY=1``, ``STOPPING=1``, …) to the service manager over the
    AF_UNIX datagram socket in $NOTIFY_SOCKET (``@name`` is an abstract socket).  Returns
    False when there is no socket to tell or the send failed."""
    address = environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(state.encode())
        return True
    except OSError as e:
        log.warning("sd_notify(%s) failed: %s", state, e)
        return False


# ==== environment and mount point =========================================================
def check_fuse(allow_other: bool = False) -> None:
    """Raises StartupError when this process cannot mount here: a subclass for a
    missing prerequisite (the device; for a user, fusermount and, with allow_other,
    /etc/fuse.conf's consent), StartupError itself without fusepy or libfuse2."""
    _check_fuse_device()
    if os.geteuid() != 0:
        check_fusermount()
        if allow_other and not _users_may_allow_other():
            raise AllowOtherRefused(
                f"--allow-other is not allowed to users: {FUSE_CONF} has no "
                f"user_allow_other line; as root: echo user_allow_other >> {FUSE_CONF}")
    try:
        from .fs import fuse_ops  # importing fusepy loads libfuse.so.2
    except ImportError as e:
        raise StartupError("fusepy is missing: pip install fusepy") from e
    except OSError as e:
        raise StartupError("libfuse2 is missing: apt-get install libfuse2 (not fuse: it Breaks fuse3)") from e
    del fuse_ops


def _check_fuse_device() -> None:
    """NoFuseDevice unless this process can open FUSE_DEVICE for reading and writing
    (as fusermount does, with the user's rights)."""
    try:
        os.close(os.open(FUSE_DEVICE, os.O_RDWR | os.O_CLOEXEC))
    except FileNotFoundError:
        raise NoFuseDevice(f"{FUSE_DEVICE} is missing: as root, modprobe fuse (a "
                           f"container needs the device: --device {FUSE_DEVICE})") from None
    except OSError as e:
        try:
            st = os.stat(FUSE_DEVICE)
            mode = f"mode {stat.S_IMODE(st.st_mode):04o}, owner {_user_name(st.st_uid)}"
        except OSError:
            mode = "no mode"
        raise NoFuseDevice(
            f"{FUSE_DEVICE} cannot be opened by {_user_name(os.getuid())} ({e.strerror}; "
            f"{mode}): as root, chmod 0666 {FUSE_DEVICE} (Debian's default mode)") from None


def check_fusermount() -> str:
    """The set-uid fusermount3 or fusermount a user mounts and unmounts with (its path);
    NoFusermount when neither is on PATH, FusermountNotSetuid when the one found cannot
    act as root."""
    helper = find_fusermount()
    if helper is None:
        raise NoFusermount(f"no {' or '.join(FUSERMOUNTS)} on PATH, which mounts FUSE for "
                           "a user: as root, apt-get install fuse3")
    real = os.path.realpath(helper)
    st = os.stat(real)
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        raise FusermountNotSetuid(
            f"{helper} is not set-uid root, so it cannot mount for a user: as root, "
            f"chown root:root {real} && chmod 4755 {real}")
    if os.statvfs(real).f_flag & os.ST_NOSUID:
        where = os.path.dirname(real)
        while not os.path.ismount(where):
            where = os.path.dirname(where)
        raise FusermountNotSetuid(
            f"{helper} is set-uid root on {where}, mounted nosuid, so it cannot mount "
            f"for a user: as root, mount -o remount,suid {where}")
    return helper


def _users_may_allow_other() -> bool:
    """Whether FUSE_CONF has fusermount's ``user_allow_other`` line."""
    try:
        with open(FUSE_CONF) as f:
            return any(line.strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def is_stale_mount(path: str) -> bool:
    """Whether path is a FUSE mount whose daemon is gone (stat fails with ENOTCONN)."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def prepare_mountpoint(path: str) -> str:
    """Makes path ready to mount on: cleans a stale mount a killed daemon left, creates
    the directory if missing.  Returns the absolute path; StartupError when it is busy or
    unusable."""
    path = os.path.abspath(path)
    if is_stale_mount(path):
        log.warning("%s: cleaning a stale mount left by a daemon that died", path)
        if not unmount(path, lazy=True) or is_stale_mount(path):
            raise StartupError(f"{path}: a stale mount is there and cannot be unmounted")
    if os.path.ismount(path):
        raise StartupError(f"{path}: mount point busy (something is mounted there)")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise StartupError(f"{path}: not a directory")
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
    except OSError as e:
        raise StartupError(f"{path}: cannot create the mount point: {e.strerror}") from e
    return path


# ==== the daemon ==========================================================================
def trim_host_heap() -> bool:
    """Gives the free pages of the C heap's arenas back to the host (glibc's
    malloc_trim); whether any went.  Under probe churn the heaps' free space between
    live blocks grows (what they hold in use does not), and malloc keeps its pages
    until told.  Elsewhere than glibc there is nothing to do."""
    trim = getattr(_libc(), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


#: Blocks this big or bigger are mapped on their own and unmapped when freed (glibc's
#: M_MMAP_THRESHOLD; -3 is the parameter's number).  Above the largest block a request
#: makes and drops (a 128 KiB read: its data, the user buffer read back, the reply),
#: each of which, mapped, cost a mapping, 32 page faults and an unmapping with its TLB
#: shootdown; below Unicorn's tables (megabytes).
MMAP_THRESHOLD = 512 << 10
_M_MMAP_THRESHOLD = -3
#: Free memory at the heap's top kept rather than given back at once (M_TRIM_THRESHOLD,
#: -1): a request's blocks freed at the top would otherwise be trimmed and faulted in
#: again at the next one.  The reaper's trim_host_heap gives it back when idle.
TRIM_THRESHOLD = 4 << 20
_M_TRIM_THRESHOLD = -1


def fix_host_heap_threshold() -> bool:
    """Keeps glibc's threshold for mapping a block on its own at MMAP_THRESHOLD, and its
    heap-top trim threshold at TRIM_THRESHOLD; whether it took.  glibc raises the
    mapping threshold to the size of each mapped block freed, after which Unicorn's
    large tables (the translation hash table, resized at each flush of the code
    buffer) come from the heap and leave holes there: a soak's RSS jumped by megabytes
    at some of the flushes."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _libc():
    import ctypes
    return ctypes.CDLL(None)


def _boot_kernel(cpus: int, seed: int):
    """The bundled kernel with its kprobes engine (kprobefs.system)."""
    from .system import Kernel
    return Kernel(cpus=cpus, seed=seed)


def _kernel_engine(kernel):
    """The engine the booted kernel carries (``kernel.kprobes``), if any."""
    return getattr(kernel, "kprobes", None)


def make_tracer(kernel, engine):
    """The kprobe-event tracer over the engine, its event directories made in the
    emulated kernel by tracefs_create_dir()/tracefs_remove() in process context (in the
    system call of the control write that adds or removes the event, once its hypercall
    returns: Kernel.call_in_process), as Linux's trace_events code does.  None without
    an engine."""
    if engine is None:
        return None
    from .tracing import Tracer

    def create_dir(name: str, parent):
        """A handle on the directory to come (a KernelCall: its value is the dentry)."""
        def made(dentry: int) -> None:
            if dentry and made.removed:     # removed before it was made (another CPU)
                kernel.call_in_process("tracefs_remove", dentry)
        made.removed = False
        call = kernel.call_in_process("tracefs_create_dir", name, parent or 0, then=made)
        call.made = made
        return call

    def remove_dir(handle) -> None:
        if handle.done:
            if handle.value:
                kernel.call_in_process("tracefs_remove", handle.value)
        else:
            handle.made.removed = True

    return Tracer(engine, kernel, create_dir_hook=create_dir, remove_dir_hook=remove_dir)


class Daemon:
    """One mounted kprobefs.

    ``kernel_factory(cpus, seed)`` boots the kernel (default: the bundled image with its
    engine, kprobefs.system); ``engine_factory(kernel)`` (default: ``kernel.kprobes``)
    and ``tracer_factory(kernel, engine)`` (default: :func:`make_tracer`) are the hook
    points for the kprobes engine and the tracer: ``kprobes/``, ``tracing/`` files and
    ``proc/sys/debug`` are served only when they exist (see
    :func:`~kprobefs.fs.tree.build_tree`).
    ``on_ready`` runs once the mounted filesystem answers; ``on_failure(reason)`` when
    it never does: the daemon then stops, and serve() raises StartupError(reason).
    """

    REAP_INTERVAL = 2.0
    #: How often the host heap's free pages are given back (see trim_host_heap).
    TRIM_INTERVAL = 60.0
    READY_TIMEOUT = 60.0

    def __init__(self, mountpoint: str = DEFAULT_MOUNTPOINT, cpus: int = 2, seed: int = 0,
                 workload_rate: float = 0.0, allow_other: bool = False,
                 kernel_factory: Callable | None = None,
                 engine_factory: Callable | None = None,
                 tracer_factory: Callable | None = None,
                 request_timeout: float = 30.0):
        self.mountpoint = os.path.abspath(mountpoint)
        # the name `kprobefs exec` knows it by (resolved now: once mounted, resolving
        # it would be a request to this very daemon)
        self._real_mountpoint = os.path.realpath(mountpoint)
        self.cpus = cpus
        self.seed = seed
        self.workload_rate = workload_rate
        self.allow_other = allow_other
        self.request_timeout = request_timeout
        self._kernel_factory = kernel_factory or _boot_kernel
        self._engine_factory = engine_factory or _kernel_engine
        self._tracer_factory = tracer_factory or make_tracer
        self.kernel = None
        self.hostfs = None
        self.tracer = None
        self.gateway: Gateway | None = None
        self.syscalls: SyscallWatch | None = None
        self.workload = None
        self.schedwatch: SchedWatch | None = None
        self.on_ready: Callable[[], None] = lambda: None
        self.on_failure: Callable[[str], None] = lambda reason: None
        self.failure: str | None = None     # why the mount never answered
        self._session = None                # fuse_ll's, while it serves
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = time.monotonic()

    # ---- setup ----------------------------------------------------------------------
    def boot(self) -> None:
        """Boots the kernel and builds the layers.  No threads start here."""
        fix_host_heap_threshold()
        try:
            self.kernel = self._kernel_factory(self.cpus, self.seed)
        except Exception as e:
            log.exception("kernel boot failed")
            raise StartupError(f"cannot boot the emulated kernel: {e}") from e
        engine = self._engine_factory(self.kernel) if self._engine_factory else None
        tracer = (self._tracer_factory(self.kernel, engine)
                  if self._tracer_factory else None)
        self.tracer = tracer
        if tracer is not None:
            from .tracing import warm_up
            warm_up()
        self.hostfs = build_tree(self.kernel, engine=engine, tracer=tracer)
        self.kernel.hostfs = self.hostfs
        # A host handler that runs past a request's time holds every request behind it.
        if hasattr(self.kernel, "STUCK_SECONDS"):
            self.kernel.STUCK_SECONDS = self.request_timeout
        self.gateway = Gateway(self.kernel, self.hostfs, timeout=self.request_timeout,
                               status=lambda: status_text(self.kernel, engine, tracer,
                                                          self.gateway, self._started))
        self.gateway.open_init_stdio()     # before any request: none of them pays it

    @staticmethod
    def keep_boot_objects() -> None:
        """For a process that is the daemon and nothing else (the CLI), once booted:
        what boot made (the image's symbols, the tree, the tracer's tables) lives as
        long as the process, so the cyclic collector stops walking it at each full
        collection (tens of milliseconds in the middle of a request, one echo in a few
        hundred).  Not for a process that boots daemons and drops them (tests): what
        is kept is never freed."""
        gc.collect()
        gc.freeze()

    def serve(self) -> None:
        """Mounts and serves in the calling (main) thread until unmounted or signalled:
        on /dev/fuse itself (fs/fuse_ll.py), or through libfuse2 (fs/fuse_ops.py) when
        KPROBEFS_FUSE=libfuse.  On /dev/fuse a request's thread runs its own system
        calls while the machine is idle (Kernel.drive_waits): the loop answers one
        held up in a hook from another thread."""
        log.info("mounting on %s", self.mountpoint)
        try:
            if os.environ.get("KPROBEFS_FUSE", "dev") == "libfuse":
                from .fs import fuse_ops
                ops = fuse_ops.KprobeFS(self.gateway, on_init=self._start,
                                        on_destroy=self._shutdown)
                fuse_ops.mount(ops, self.mountpoint, allow_other=self.allow_other)
            else:
                from .fs import fuse_ll
                try:
                    session = fuse_ll.FuseSession(self.gateway, self.mountpoint,
                                                  self.allow_other, on_init=self._start,
                                                  on_destroy=self._shutdown)
                    session.mount()
                except OSError as e:
                    raise StartupError(f"{self.mountpoint}: mount failed ({e.strerror})") from e
                self.kernel.drive_waits = True
                self._session = session
                session.serve()
        except RuntimeError as e:
            if not self.ready.is_set():
                raise StartupError(f"{self.mountpoint}: mount failed (libfuse status {e})")
            raise
        finally:
            self._session = None
            self._shutdown()
        log.info("unmounted %s", self.mountpoint)
        if self.failure is not None:
            raise StartupError(self.failure)

    def stop(self) -> None:
        """Ends serve() as SIGTERM does: the mount is unmounted lazily and the loop
        returns.  Call from any thread but serve()'s own."""
        if self._session is not None:
            self._session.unmount()
        else:
            unmount(self.mountpoint, lazy=True)     # libfuse's loop ends with its mount

    # ---- threads (started from FUSE's init) -----------------------------------------
    def _spawn_thread(self, name: str, target: Callable) -> None:
        t = threading.Thread(target=target, name=f"kprobefs-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _start(self) -> None:
        events = ProcessEvents.open()
        self.gateway.watch_host_processes(events)
        if events is not None:
            # the reader applies what it reads (forks, execs and exits are mirrored as
            # they come, on its own thread)
            events.start_reader(on_events=self.gateway.mirror_host_processes)
        # From here on only the machine thread runs emulated code; request threads wait.
        self.kernel.serve()
        self._start_schedwatch()
        # `kprobefs exec` hands its processes' system calls over from now on.
        syscalls = SyscallWatch(self.gateway, self._real_mountpoint,
                                allow_other=self.allow_other)
        if syscalls.start():
            self.syscalls = syscalls
        self._spawn_thread("reaper", self._reap)
        if self.workload_rate > 0:
            self._spawn_thread("workload", self._start_workload)
        self._spawn_thread("ready", self._probe_ready)

    def _start_schedwatch(self) -> None:
        """Mirrors the host processes' sleeps, wake-ups and priorities into their tasks
        (fs/schedwatch.py); the host's process events are applied as it samples."""
        gateway = self.gateway
        self.schedwatch = SchedWatch(
            KernelMirror(self.kernel, timeout=min(5.0, self.request_timeout)),
            gateway.tasks, before_sample=gateway.mirror_host_processes)
        gateway.sched = self.schedwatch
        self.schedwatch.start()

    def _start_workload(self) -> None:
        """Starts the background workload; the machine then drives it."""
        from .machine.workload import Workload
        try:
            self.workload = Workload(self.kernel, seed=self.seed, rate=self.workload_rate)
        except Exception:
            log.exception("the workload could not start")
            return
        self.workload.drive()

    def _reap(self) -> None:
        """Every REAP_INTERVAL, the tasks of exited host processes go, and the host is
        told of names gone without its knowing once it holds many (sweep_nodes); every
        TRIM_INTERVAL, the host heap's free pages go back to the host."""
        trim_at = time.monotonic() + self.TRIM_INTERVAL
        while not self._stop.wait(self.REAP_INTERVAL):
            try:
                n = self.gateway.reap()
                if n:
                    log.debug("reaped %d task(s) of exited host processes", n)
            except Exception:
                log.exception("reaping failed")
            session = getattr(self, "_session", None)
            if session is not None:
                try:
                    session.sweep_nodes(self.gateway.name_exists)
                except Exception:
                    log.exception("sweeping the host's nodes failed")
            if time.monotonic() >= trim_at:
                trim_host_heap()
                trim_at = time.monotonic() + self.TRIM_INTERVAL

    def _probe_ready(self) -> None:
        """Announces readiness once the mount answers: its root and every top-level
        entry can be stat'ed (each is a request through the whole stack)."""
        deadline = time.monotonic() + self.READY_TIMEOUT
        while not self._stop.is_set():
            try:
                names = os.listdir(self.mountpoint)
                for name in names:
                    os.stat(os.path.join(self.mountpoint, name))
                break
            except OSError as e:
                if e.errno in (errno.EACCES, errno.EPERM):
                    # the mount is shut to its own user: waiting changes nothing
                    self._fail(f"{self.mountpoint}: the mount refuses the user who made "
                               f"it ({e.strerror})")
                    return
                if time.monotonic() > deadline:
                    self._fail(f"{self.mountpoint}: the filesystem does not answer ({e})")
                    return
                time.sleep(0.05)
        else:
            return
        self._warm_up()
        log.info("ready: %s serves %s", self.mountpoint, ", ".join(sorted(names)) or "-")
        self.ready.set()
        sd_notify("READY=1\nSTATUS=serving " + self.mountpoint)
        self.on_ready()

    def _fail(self, reason: str) -> None:
        """The mount never answered: says why, then stops (serve() raises)."""
        log.error("%s", reason)
        self.failure = reason
        self.on_failure(reason)
        self.stop()

    #: How many times readiness takes the common request path before it is announced.
    WARM_UP_ROUNDS = 10

    def _warm_up(self) -> None:
        """Takes the request path of an `echo >> kprobe_events` and a `cat` a few times
        (an empty line appended, the file read), through the mount: the emulator
        translates the kernel code they run and the interpreter specializes the host
        code, which made the first ten such commands after a mount up to twice as
        slow (the very first, 30 ms).  An empty line changes nothing."""
        path = os.path.join(self.mountpoint, "tracing", "kprobe_events")
        for _ in range(self.WARM_UP_ROUNDS):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
                try:
                    os.write(fd, b"\n")
                finally:
                    os.close(fd)
                with open(path, "rb") as f:
                    f.read()
            except OSError:
                return      # no tracer, or it answers otherwise: nothing to warm

    # ---- shutdown -------------------------------------------------------------------
    def _shutdown(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        sd_notify("STOPPING=1")
        log.info("stopping")
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self.schedwatch is not None:
            self.schedwatch.close()
        if self.syscalls is not None:
            self.syscalls.close()
        if self.gateway is not None:
            try:
                self.gateway.close()
            except Exception:
                log.exception("ending the tasks of host processes failed")
        if self.hostfs is not None:
            self.hostfs.release_all()
        self._restore_text()
        if self.kernel is not None:
            self.kernel.close()

    #: How long shutdown waits for the machine before leaving the probes in place.
    TEARDOWN_LOCK_TIMEOUT = 5.0

    def _restore_text(self) -> None:
        """Unregisters every probe and ftrace hook, so every patched byte of kernel text
        is the image's again.  A machine held by a handler that never returns is left
        as it is (the process is exiting)."""
        teardown = getattr(self.tracer, "teardown", None)
        if teardown is None or self.kernel is None:
            return
        lock = self.kernel.lock
        if not lock.acquire(timeout=self.TEARDOWN_LOCK_TIMEOUT):
            log.error("the machine is busy: probes left in the kernel text")
            return
        try:
            teardown()
        except Exception:
            log.exception("taking the probes out of the kernel text failed")
        finally:
            lock.release()
