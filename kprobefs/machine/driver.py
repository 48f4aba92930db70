"""Who drives the machine: a machine thread of its own, or the caller that waits.

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

from ..errors import KernelStuck, KernelWedged, MachineError

__all__ = ["MachineDriver"]

log = logging.getLogger("kprobefs.machine")


class MachineDriver:
    """Running the machine: the machine thread, periodic work, bounded waits."""

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

    def _serving_elsewhere(self) -> bool:
        """Whether another thread drives the machine (the caller must only wait)."""
        return self._machine_running and \
            self._machine_thread.ident != threading.get_ident()

    def _await(self, done, timeout: float | None, what: str) -> None:
        """Wait for done (a Flag or threading.Event), driving the machine unless the
        machine thread does.  Raises KernelStuck at once while the machine is stuck,
        KernelWedged after timeout."""
        if not self._serving_elsewhere():
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
                raise KernelWedged(f"{what} has not finished in {timeout:g} s")
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
        if self.stuck is not None or not self.lock.acquire(False):
            self._work.set()
            return
        now = time.monotonic()
        end = now + self.DRIVE_SLICE
        self.driver = (threading.get_ident(), now)
        try:
            while not done.is_set() and self.stuck is None and time.monotonic() < end:
                if not self.run_slice():
                    break
            if done.is_set() and self._inbox and self.stuck is None:
                self.run_slice()    # what the call posted as it ended
        except MachineError:
            pass        # the machine thread meets it too, and declares the machine stuck
        finally:
            self.driver = None
            self.lock.release()
            if not done.is_set() or self._inbox:
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
