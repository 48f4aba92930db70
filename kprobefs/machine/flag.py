"""A threading.Event on a bare lock: set() releases it, a waiter takes it.

threading.Event waits and wakes through a Condition written in Python (a lock made per
wait, a list of waiters, notify_all); every system call the daemon runs for a FUSE
request passes two of them, one each way between the request's thread and the
machine's.  Here set(), wait() and clear() are a lock operation each, done in C.
"""

from __future__ import annotations

import _thread

__all__ = ["Flag"]


class Flag:
    """set / clear / is_set / wait(timeout) as threading.Event's.  Any number of
    threads may wait: each that takes the lock hands it straight on."""

    __slots__ = ("_lock", "_set")

    def __init__(self):
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:
                pass        # released by a set() racing this one

    def clear(self) -> None:
        if self._set:
            self._set = False
            self._lock.acquire(False)

    def wait(self, timeout: float | None = None) -> bool:
        """True once set (at once if it is), False when timeout seconds pass first."""
        if self._set:
            return True
        if self._lock.acquire(True, -1 if timeout is None else max(timeout, 0)):
            self._lock.release()
            return True
        return self._set
