"""Running the machine: its slices and the CPUs' turns, and who drives them (a machine
thread of its own, or the caller that waits).

A slice takes the work posted, hands queued wake-ups to idle CPUs and gives each CPU
that has work one turn of the emulator (:meth:`MachineDriver.run_slice`); a turn ends at
a hypercall (idle, a yield, a call's end while someone waits, its time up).

In a daemon, :meth:`MachineDriver.serve` starts the one thread that ever runs emulated
code; everyone else posts work and waits on it with a bound, so a kernel that never returns
cannot hold a caller.  Without it (the Python API, tests) the waiting caller drives the
machine itself, a slice at a time, until what it waits for is done.  A mixin of
:class:`~kprobefs.machine.kernel.Kernel`, which owns the state used here (``lock``,
``_work``, ``_cond``, the watchdog).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
import weakref
from typing import Callable

from unicorn import UcError
from unicorn.x86_const import UC_X86_REG_RIP

from ..errors import KernelStuck, KernelWedged, MachineError
from .task import Cpu

__all__ = ["MachineDriver"]

log = logging.getLogger("kprobefs.machine")


class MachineDriver:
    """Running the machine: slices, turns and wake-ups; the machine thread, periodic
    work, bounded waits."""

    # ==== the run loop: slices and turns ==================================================
    def _switch_cpu(self, cpu: Cpu) -> None:
        if self._loaded_cpu is cpu:
            return
        if self._loaded_cpu is not None:
            self.fast.context_update(self._loaded_cpu.ctx)
        self.fast.context_restore(cpu.ctx)
        self._loaded_cpu = cpu

    def runnable(self) -> bool:
        """Whether any CPU has work (or could take some), or work is posted."""
        if self._inbox or any(c.state == "running" for c in self.cpus):
            return True
        return bool(self._wakeups or self._upcalls or self.irq.has_work()) and any(
            c.state == "idle" for c in self.cpus)

    def _post(self, work: Callable[[], None], wake: bool = True) -> None:
        """Hand work to whoever drives the machine next (it runs under the lock, at the
        start of a slice).  Never blocks.  wake False, where waiting callers drive
        (drive_waits): the machine thread is not woken for it, since its poster is
        about to run it (see _drive_while_idle, which wakes the thread when it cannot,
        or leaves work behind)."""
        self._inbox.append(work)
        if wake or not self.drive_waits:
            self._work.set()

    def _take_posted(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    def _queue_wakeup(self, word: int, cpu: int | None = None, only: bool = False) -> None:
        """Queue an idle-loop wake-up word; given ``cpu`` (an index), that CPU takes
        it, so the task wakes on its run queue (try_to_wake_up enqueues on the CPU that
        runs it): with ``only``, that CPU alone (a task whose affinity is that CPU),
        else another idle CPU while that one is busy (select_idle_sibling's choice);
        any CPU once that one is out of service."""
        self._wakeups.append(word)
        if cpu is not None and 0 <= cpu < len(self.cpus):
            self._wakeup_cpus[word] = (cpu, only)

    def _take_wakeup(self, cpu: Cpu, any_cpu: bool = True) -> int | None:
        """The first queued wake-up word ``cpu`` may take: one bound to it, or (with
        ``any_cpu``) one bound to no CPU in service.  None when there is none.  A bound
        one waits while another CPU's task has gone back to user mode and not yet
        switched out (Cpu.idling): woken meanwhile, that task would go on there
        (try_to_wake_up leaves a task still on a CPU where it is)."""
        bound = self._wakeup_cpus
        if not bound:
            return self._wakeups.popleft() if any_cpu and self._wakeups else None
        switching = None        # asked only of a wake-up bound to this CPU
        cpus, mine = self.cpus, cpu.index
        for i, word in enumerate(self._wakeups):
            want, only = bound.get(word, (None, False))
            if want is not None:
                state = cpus[want].state
                if state != "idle" and (state != "running" or not only):
                    want = None
            if want == mine:
                if switching is None:
                    switching = any(c.idling and c.state == "running" and c is not cpu
                                    for c in cpus)
                if switching:
                    continue
            if want == mine or (want is None and any_cpu):
                del self._wakeups[i]
                bound.pop(word, None)
                return word
        return None

    def _dispatch_wakeups(self) -> bool:
        """Hand queued work to idle CPUs.  A task's wake-up is left queued while a CPU
        whose task just went back to user mode runs: it takes the wake-up at its idle
        loop in the same turn, as Linux's sync wake-ups stay on the waker's CPU about
        to go idle; woken elsewhere, that CPU would take one more turn only to idle.
        A wake-up bound to a CPU (_queue_wakeup) waits for that one.  Returns whether
        it started a CPU; when not, it changed nothing."""
        syncing = False
        for cpu in self.cpus:
            if cpu.idling and cpu.state == "running":
                syncing = True
                break
        started = False
        for cpu in self.cpus:
            if not ((self._wakeups and (not syncing or self._wakeup_cpus))
                    or self._upcalls or self.irq.has_work()):
                break
            if cpu.state != "idle":
                continue
            if self.irq.wake_idle(cpu):
                cpu.resume_rax = 0      # HC_IDLE returns nothing: the interrupt is the work
            elif self._upcalls:         # before wake-ups, as _hc_idle takes them
                self._start_upcall(cpu, self._upcalls.popleft())
            elif self._wakeups and (word := self._take_wakeup(cpu, not syncing)) is not None:
                cpu.resume_rax = word
            else:
                continue
            cpu.state = "running"
            started = True
        return started

    def run_slice(self) -> bool:
        """Take the posted work, then give every CPU that has work one turn; work posted
        during a turn (which it ended), and wake-ups queued, are taken and handed to
        idle CPUs before the next CPU's turn.  Returns False when the machine is
        quiescent (every CPU idle and nothing queued).  Caller holds ``lock``."""
        if self._in_emulation:
            raise MachineError("the machine cannot be driven from inside a hook")
        if self.panicked:
            raise MachineError(f"kernel panic: {self.panicked}")
        ran = False
        irq = self.irq
        settled = False     # the last dispatch started no CPU, and nothing changed since
        for cpu in self.cpus:
            if self._inbox:
                self._take_posted()
                settled = False
            if not settled and (self._wakeups or self._upcalls or irq.has_work()):
                settled = not self._dispatch_wakeups()
            if cpu.state != "running":
                continue
            settled = False
            ran = True
            self._switch_cpu(cpu)
            if cpu.resume_rax is not None:
                self._set_rax(cpu.resume_rax)
                cpu.resume_rax = None
            irq.before_turn(cpu)
            self._emulate(cpu)
        self._update_jiffies()
        for tick in self.tick_listeners:
            tick()
        return ran

    def _emulate(self, cpu: Cpu) -> None:
        """Run cpu until it ends its turn at a hypercall (idle, yield, a return to user
        mode while another CPU waits, or TURN_SECONDS are up), or the watchdog stops it."""
        self.cpu = cpu
        cpu.idling = False
        self._in_emulation += 1
        self._emu_thread = threading.get_ident()
        self._turn_id += 1
        self._turn_started = self._progress = time.monotonic()
        try:
            self.uc.emu_start(self._rip(), 0)
        except UcError as e:
            self._cpu_error(cpu, e)
        finally:
            self._turn_started = None
            self._in_emulation -= 1
            self.cpu = None
            if self._finished:
                finished, self._finished = self._finished, []
                for req in finished:
                    req.done.set()
        if self.stuck is not None and any(c.state != "wedged" for c in self.cpus):
            log.error("the machine runs again (it was stuck: %s)", self.stuck)
            self.stuck = None
        if self._wedge is cpu:
            self._wedge = None
            self.watchdog.lockup(cpu, self.WEDGE_SECONDS,
                                 f"no hypercall for {self.WEDGE_SECONDS:g} s")

    def _others_running(self) -> bool:
        cur = self.cpu
        return any(c.state == "running" and c is not cur for c in self.cpus) or (
            bool(self._wakeups or self._upcalls or self.irq.has_work()) and any(
                c.state == "idle" for c in self.cpus))

    def _end_turn(self) -> None:
        """End this CPU's turn after the hypercall returns (round-robin) when work is
        posted, the turn has lasted TURN_SECONDS, or another CPU has work and a loaded
        call is awaited or this CPU has run a multiple of TURN_CALLS calls in a row."""
        if self._scratch_depth:
            return          # inside Kernel.call: the nested run must reach its return
        in_row = self.cpu.calls_in_row
        if self._inbox or time.monotonic() - self._turn_started > self.TURN_SECONDS or (
                (self._awaited or (in_row and not in_row % self.TURN_CALLS))
                and self._others_running()):
            self.fast.emu_stop()

    def _cpu_error(self, cpu: Cpu, err: UcError) -> None:
        rip = self.uc.reg_read(UC_X86_REG_RIP)
        log.error("cpu%d: emulator error %s at %s", cpu.index, err,
                  self.image.format_address(rip))
        self.panicked = f"cpu{cpu.index}: {err} at {self.image.format_address(rip)}"
        cpu.state = "halted"

    # ==== who drives ======================================================================
    def serve(self) -> None:
        """From now on a machine thread of its own drives the machine; callers only
        post work and wait for it (with a bound).  Idempotent."""
        if self._machine_thread is None:
            self._machine_thread = threading.Thread(target=self._machine_loop,
                                                    name="kprobefs-machine", daemon=True)
            self._machine_running = True
            self._machine_thread.start()
            # A process that exits while the thread is inside Unicorn crashes in the
            # interpreter's finalization: it is stopped first (unless close() ran).
            atexit.register(_close_at_exit, weakref.ref(self))

    def close(self) -> None:
        """Stop the machine thread and the watchdog (the machine is not used again)."""
        self._closing = True
        self._work.set()
        thread = self._machine_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _machine_loop(self) -> None:
        try:
            self._machine_loop_body()
        finally:
            self._machine_running = False

    def _machine_loop_body(self) -> None:
        next_periodic = 0.0
        while not self._closing:
            self._work.clear()
            try:
                with self.lock:
                    ran = self.run_slice()
                    now = time.monotonic()
                    if now >= next_periodic:
                        next_periodic = now + 0.02
                        self.background_due = 0.0
                        self._run_periodic()
                    elif self.background_due and now >= self.background_due:
                        self.background_due = 0.0
                        self._run_duties(self.background)
            except MachineError as e:
                self.watchdog.declare_stuck(str(e))
                log.exception("the machine stopped")
                return
            if self.lock.waiting:
                time.sleep(0.001)    # let the waiter in before the next slice
            elif not ran:
                due = self.background_due
                self._work.wait(0.02 if not due else min(0.02, max(0.0, due - now)))

    def _run_periodic(self) -> None:
        self._run_duties(self.periodic)

    @staticmethod
    def _run_duties(duties) -> None:
        for duty in duties:
            try:
                duty()
            except Exception:
                log.exception("periodic machine work failed")

    #: Whether the machine thread runs its loop (set as it starts, cleared as the loop
    #: ends however it ends): Thread.is_alive() costs a lock operation, and every
    #: system call asks.
    _machine_running = False

    def _await(self, done, timeout: float | None, what) -> None:
        """Wait for done (a Flag or threading.Event), driving the machine unless another
        thread drives it (the machine thread, when it runs and is not the caller: then
        the caller only waits).  Raises KernelStuck at once while the machine is stuck,
        KernelWedged after timeout; ``what`` names the awaited work in its message: a
        str, or a callable that makes one (formatted only then)."""
        if not self._machine_running or \
                self._machine_thread.ident == threading.get_ident():
            with self._locked(timeout):
                self._drive(done.is_set, timeout)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.drive_waits and not done.is_set():
            self._drive_while_idle(done)
        while not done.is_set():
            if self.stuck is not None:
                raise KernelStuck(f"the machine is stuck: {self.stuck}")
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise KernelWedged(f"{what() if callable(what) else what} has not "
                                   f"finished in {timeout:g} s")
            done.wait(left)

    #: Whether a caller that waits may drive the machine while its thread is idle (see
    #: _drive_while_idle); set where a driver stuck in a hook cannot hold its caller:
    #: the daemon's own FUSE loop answers such a request from another thread.
    drive_waits = False
    #: How long a waiting caller drives before it leaves the rest to the machine thread.
    DRIVE_SLICE = 0.05

    def _drive_while_idle(self, done) -> None:
        """Runs the machine in this thread until done is set, for at most DRIVE_SLICE,
        if nobody else drives it now: the call that was just posted then runs without a
        hand-off to the machine thread and back.  Whatever is left (an idle kernel that
        waits for something, the slice used up, a failure, work posted meanwhile) is
        the machine thread's, woken on the way out; so is the call when another thread
        drives now (its poster may not have woken the machine thread).  What the call
        posted as it ended (its completion's follow-up) gets one more slice here: it
        runs before the next call its caller is about to make."""
        if self.stuck is not None or not self.lock.try_acquire():
            self._work.set()
            return
        now = time.monotonic()
        end = now + self.DRIVE_SLICE
        self.driver = (threading.get_ident(), now)
        is_set = done.is_set
        try:
            while not is_set() and self.stuck is None and time.monotonic() < end:
                if not self.run_slice():
                    break
            if self._inbox and is_set() and self.stuck is None:
                self.run_slice()    # what the call posted as it ended
        except MachineError:
            pass        # the machine thread meets it too, and declares the machine stuck
        finally:
            self.driver = None
            self.lock.release()
            if self._inbox or not is_set():
                self._work.set()

    @contextlib.contextmanager
    def _locked(self, timeout: float | None):
        """Hold the machine lock, waiting at most timeout seconds for it: a thread stuck
        in the emulation (a handler that never returns) must not hang its callers."""
        if not self.lock.acquire(timeout=-1 if timeout is None else timeout):
            raise KernelWedged(f"the machine has been busy for {timeout:g} s")
        try:
            yield
        finally:
            self.lock.release()

    def _drive(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Run the machine until done() holds.  Raises KernelWedged when done() is still
        false after timeout seconds, busy or not; with timeout None, as soon as the
        kernel is idle with done() false."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            if self.stuck is not None:
                raise KernelStuck(f"the machine is stuck: {self.stuck}")
            ran = self.run_slice()
            if done():
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise KernelWedged("the awaited event has not happened in "
                                   f"{timeout:g} s ({'busy' if ran else 'idle'} kernel)")
            if ran:
                continue
            if deadline is None:
                raise KernelWedged("the kernel is idle but the awaited event has not happened")
            self._cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))

    def run_until_idle(self, max_slices: int = 1_000_000) -> None:
        """Run until every CPU is idle."""
        with self.lock:
            for _ in range(max_slices):
                if not self.run_slice():
                    return
            raise KernelWedged("the kernel did not go idle")


def _close_at_exit(ref: "weakref.ref[MachineDriver]") -> None:
    driver = ref()
    if driver is not None and not driver._closing:
        driver.close()
