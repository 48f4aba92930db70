"""The machine's watchdog, and the lock the machine thread hands over.

Nothing that waits on the emulation may wait without a bound: a FUSE request that never
answers leaves its caller in uninterruptible sleep.  The emulation can stop answering in
three ways, and each has its answer:

- A CPU runs kernel code without a hypercall for ``Kernel.WEDGE_SECONDS`` (a spin, a
  probe with a host handler on a tight loop): the watchdog stops the emulation
  (``uc.emu_stop`` is safe from another thread; Unicorn's own timeouts use it) and the
  machine kills the task on that CPU the way Linux's lockup detector reports it and an
  oops ends it (:meth:`Watchdog.lockup`).
- Host code in the emulating thread does not return (a hypercall handler, a probe
  handler): nothing can interrupt Python code there, so after ``Kernel.STUCK_SECONDS``
  the machine is declared stuck and every request fails at once (``KernelStuck``) until
  the handler returns.
- A livelock that keeps making hypercalls (a spin lock whose holder cannot run): turns
  are bounded, so the other CPUs keep running; the request that cannot finish times out
  and its task is killed (``Kernel.abandon``, then :meth:`Watchdog.give_up`).

The watchdog samples the machine's turn state (``Kernel._turn_id``, ``_progress``,
``_hc_started``) from its own thread; the emulating thread only stores timestamps.
"""

from __future__ import annotations

import functools
import logging
import math
import struct
import sys
import threading
import time
import traceback
import weakref

from ..errors import KernelOops

__all__ = ["MachineLock", "Watchdog"]

log = logging.getLogger("kprobefs.machine")


class MachineLock:
    """A reentrant lock that the machine thread hands over between slices.

    The machine thread releases the lock after every slice and would take it straight
    back, starving a thread that waits for it (a test registering a probe, the daemon's
    teardown); ``waiting`` tells it someone does.  Usable with ``threading.Condition``.
    """

    def __init__(self):
        self._lock = threading.RLock()
        self._count_lock = threading.Lock()
        self.waiting = 0
        # The RLock's own methods, called with no frame of ours in between (a waiting
        # caller takes and releases the lock at every system call it drives):
        #: release(); try_acquire() -> bool, acquire(False).
        self.release = self._lock.release
        self.try_acquire = functools.partial(self._lock.acquire, False)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        with self._count_lock:
            self.waiting += 1
        try:
            return self._lock.acquire(True, timeout)
        finally:
            with self._count_lock:
                self.waiting -= 1

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self._lock.release()

    # threading.Condition uses these when the lock has them (RLock's own protocol).
    def _is_owned(self) -> bool:
        return self._lock._is_owned()

    def _release_save(self):
        return self._lock._release_save()

    def _acquire_restore(self, state) -> None:
        self._lock._acquire_restore(state)


class Watchdog:
    """Samples the machine every ``interval`` seconds from a thread of its own."""

    def __init__(self, kernel, interval: float = 0.1):
        self._kernel = weakref.ref(kernel)
        self.interval = interval
        self._stop_asked: tuple[int, float] | None = None   # (turn id, when)
        # The thread holds the watchdog, which holds the kernel weakly: a kernel nobody
        # uses any more is collected, and its watchdog ends.
        threading.Thread(target=Watchdog._run, args=(weakref.ref(self),),
                         name="kprobefs-watchdog", daemon=True).start()

    @property
    def kernel(self):
        return self._kernel()

    @staticmethod
    def _run(watchdog_ref) -> None:
        while True:
            watchdog = watchdog_ref()
            kernel = watchdog.kernel if watchdog is not None else None
            if kernel is None or kernel._closing:
                return
            interval = watchdog.interval
            try:
                watchdog.check(time.monotonic())
            except Exception:   # the watchdog itself must outlive anything it sees
                log.exception("watchdog check failed")
            del watchdog, kernel
            time.sleep(interval)

    def check(self, now: float) -> None:
        """One look at the turn in progress (if any)."""
        k = self.kernel
        turn, cpu, hc_started = k._turn_id, k.cpu, k._hc_started
        if k._turn_started is None or cpu is None:
            return
        if hc_started is not None:
            # A hypercall handler is running: host work, not a spin.  Past the bound
            # it holds the machine, and requests stop queueing behind it.
            if now - hc_started > k.STUCK_SECONDS:
                self.declare_stuck(f"a hypercall handler on cpu{cpu.index} has run for "
                                 f"{now - hc_started:.0f} s", self.where())
            return
        quiet = now - k._progress
        asked = self._stop_asked
        if asked is None or asked[0] != turn:
            if quiet > k.WEDGE_SECONDS:
                self._stop_asked = (turn, now)
                k._wedge = cpu
                k.uc.emu_stop()
        elif now - asked[1] > k.STUCK_SECONDS:
            self.declare_stuck(f"cpu{cpu.index} was stopped {now - asked[1]:.0f} s ago but "
                             "host code in a probe handler has not returned", self.where())

    def where(self) -> str:
        """The emulating thread's Python stack, innermost call last ("" if unknown)."""
        ident = self.kernel._emu_thread
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return ""
        return "".join(traceback.format_stack(frame, limit=8)).rstrip()

    # ---- what the machine does about it (caller holds the lock, outside emulation) -----
    def cpu_task(self, cpu) -> tuple[int, int, str]:
        """(task_struct address, pid, comm) of the task current on cpu."""
        k = self.kernel
        t = struct.unpack_from("<Q", k.mem.ram, cpu.current_pa)[0]
        pid = struct.unpack("<i", k.mem.read(t + k.kabi["task.pid"], 4))[0]
        comm = k.mem.read_cstring(t + k.kabi["task.comm"], 16).decode("utf-8", "replace")
        return t, pid, comm

    def lockup(self, cpu, seconds: float, why: str) -> None:
        """The task current on cpu has been in the kernel too long (why): kill it as an
        oops does, through the kernel's NMI handler (exc_nmi: Linux's soft-lockup
        report, then die()).  A CPU whose idle task is stuck, or whose task is stuck
        again after being killed, is taken out of service."""
        k = self.kernel
        k._switch_cpu(cpu)
        rip = k.ip()
        task, pid, comm = self.cpu_task(cpu)
        report = f"cpu{cpu.index}: {why}, at {k.image.format_address(rip)} [{comm}:{pid}]"
        if pid == 0 or task == cpu.killed:
            self.out_of_service(cpu, rip, report)
            return
        log.error("%s: killing the task", report)
        k.incidents.append((time.monotonic(), f"lockup: {report}"))
        cpu.killed = task
        k._deliver_exception(k.NMI_VECTOR, error_code=math.ceil(seconds))

    def out_of_service(self, cpu, rip: int, report: str) -> None:
        """Take cpu out of service for good; the host's task on it (if any) is gone."""
        k = self.kernel
        cpu.state = "wedged"
        cpu.wedged_at = k.image.format_address(rip)
        k.wedged.append((cpu.index, rip))
        log.error("%s: cpu%d taken out of service\n%s", report, cpu.index,
                  _format_regs(k.regs.snapshot()))
        k.incidents.append((time.monotonic(), f"cpu out of service: {report}"))
        call = k._upcalls_running.pop(cpu.index, None)
        if call is not None:
            call.done.set()     # with no result: the upcall failed
        _, pid, comm = self.cpu_task(cpu)
        task = k.tasks.get(pid) if pid else None
        if task is not None:
            self.forget_task(task, KernelOops(
                f"task {pid} ({comm}) is stuck on cpu{cpu.index}, out of service"))
        if all(c.state == "wedged" for c in k.cpus):
            self.declare_stuck("every CPU is out of service")

    def forget_task(self, task, error: Exception) -> None:
        """The host gives up on task: its requests fail with error, and it is dead to
        the host (the kernel's side of it never runs again, or sleeps for good)."""
        k = self.kernel
        k.tasks.pop(task.pid, None)
        task.state = "dead"
        for req in ([task.active] if task.active else []) + list(task.pending):
            req.error = error
            k._finish(req)
        task.active = None
        task.pending.clear()

    def give_up(self, req, waited: float) -> None:
        """A caller gave up on req after waited seconds: unless it has finished, kill
        its task, on a CPU through lockup(), asleep in the kernel by forgetting it."""
        k = self.kernel
        task = req.task
        if req.done.is_set() or task.state == "dead":
            return
        why = f"{req.name} of pid {task.pid} ({task.comm}) unfinished after {waited:.0f} s"
        for cpu in k.cpus:
            if cpu.state == "running" and self.cpu_task(cpu)[1] == task.pid:
                self.lockup(cpu, waited, why)
                return
        log.error("%s, not on a CPU: the task is given up", why)
        k.incidents.append((time.monotonic(), f"task given up: {why}"))
        self.forget_task(task, KernelOops(why))

    def declare_stuck(self, why: str, where: str = "") -> None:
        """The machine cannot run (why): requests fail at once until it runs again."""
        k = self.kernel
        if k.stuck is not None:
            return
        k.stuck = why
        log.error("the machine is stuck: %s; requests fail at once until it runs again%s",
                  why, f"\n{where}" if where else "")
        k.incidents.append((time.monotonic(), f"stuck: {why}"))
        k._work.set()


def _format_regs(regs: dict) -> str:
    """The registers as the kernel's oops report shows them, three a line."""
    names = ("ip", "sp", "flags", "ax", "bx", "cx", "dx", "si", "di", "bp", "r8", "r9",
             "r10", "r11", "r12", "r13", "r14", "r15")
    cells = [f"{('R' + n.upper()) if n[0] != 'r' else n.upper()}: {regs[n]:016x}"
             for n in names if n in regs]
    return "\n".join(" ".join(cells[i:i + 3]) for i in range(0, len(cells), 3))
