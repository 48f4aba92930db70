"""When a probe's handler fails: kprobes.txt's fault_handler, the miss it counts, and
the log that says what failed.

A handler that raises is, to the engine, a fault in that handler, as a fault the CPU
takes while the handler runs is.  The probe's ``fault_handler(p, regs, trapnr)`` gets the
first chance; if it does not take the fault, the probe counts a miss and the failure is
logged (an exception with its traceback), rate-limited per probe so that a handler
failing on every hit cannot flood the log.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

__all__ = ["TRAP_BP", "TRAP_DB", "RATELIMIT_INTERVAL", "HandlerErrorLog"]

log = logging.getLogger("kprobefs.kprobes")

#: fault_handler's ``trapnr`` for an exception a handler raises: the trap the handler
#: runs in.  A hit's handlers run in the probe's breakpoint (x86's #BP; a detour, an
#: ftrace site or a return trampoline stands for the int3), a post-handler in the
#: single-step trap after the instruction (#DB).  A real fault while a handler runs
#: comes with its own vector from the arch (14, a page fault; 13, general protection).
TRAP_BP, TRAP_DB = 3, 1

#: After a probe's first error, at most one more is logged per this many seconds
#: (printk_ratelimited's default interval).
RATELIMIT_INTERVAL = 5.0


class HandlerErrorLog:
    """Logs the failures of probe handlers, rate-limited per probe and handler: the
    first failure at once, then at most one every ``interval`` seconds, which says how
    many were not logged since the last.  Probes are held weakly."""

    def __init__(self, interval: float = RATELIMIT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self._clock = clock
        # probe -> {handler: [when its last failure was logged, failures not logged since]}
        self._state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def report(self, probe, handler: str, what: str, exc: BaseException | None) -> None:
        """Log that ``what`` (e.g. "pre_handler of probe at vfs_read+0x5") raised
        ``exc``, with its traceback, or (``exc`` None) took a fault; unless ``probe``'s
        ``handler`` (its name) had a failure logged less than ``interval`` seconds ago."""
        now = self._clock()
        states = self._state.setdefault(probe, {})
        state = states.get(handler)
        if state is not None and now - state[0] < self.interval:
            state[1] += 1
            return
        more = f" ({state[1]} more not logged)" if state is not None and state[1] else ""
        states[handler] = [now, 0]
        if exc is None:
            log.warning("%s%s", what, more)
        else:
            log.warning("%s raised %r%s", what, exc, more,
                        exc_info=(type(exc), exc, exc.__traceback__))
