"""``set_event_pid`` and ``set_event_notrace_pid`` (which tasks' events are recorded),
and ``set_ftrace_pid`` and ``set_ftrace_notrace_pid`` (the same for the function tracer).

As in 6.1 (kernel/trace/trace.c trace_pid_write, trace_events.c): each file holds a set
of pids.  A ``write()`` holds pids separated by blanks (``kstrtoul`` base 0 each) and adds
them to the set; a write with no pid at all empties it; opening with ``O_TRUNC`` empties
it first.  A token that is not a number fails the write with ``EINVAL``, a pid of
``PID_MAX_LIMIT`` or more with ``EPERM`` (trace_pid_write returns -1), and nothing of that
write is applied.  A read lists the pids in increasing order, one a line.

An event is recorded for a task when ``set_event_pid`` lists no pid (has never been
given one since it was last emptied) or has its pid, and ``set_event_notrace_pid`` does
not; a function the same way.  With ``options/event-fork`` (``function-fork``) set, a
task forked by a listed task is listed too, and a task that exits leaves both sets
(:meth:`PidFilter.fork`, :meth:`PidFilter.exit`); as in 6.1, a ``set_event_pid`` whose
last task has exited still lists no one, so it records nothing until it is written.
The ``set_ftrace_*`` files read ``no pid`` when empty, the ``set_event_*`` ones nothing.
"""

from __future__ import annotations

import errno
from typing import Callable

__all__ = ["PidFilter", "PID_MAX_LIMIT"]

PID_MAX_LIMIT = 4 * 1024 * 1024         # 64-bit kernels' PID_MAX_LIMIT


class PidFilter:
    """The two pid sets; ``changed()`` runs after every change."""

    def __init__(self, changed: Callable[[], None] | None = None):
        self.pids: frozenset[int] = frozenset()
        self.notrace_pids: frozenset[int] = frozenset()
        #: Whether the trace list exists (Linux's tr->filtered_pids is not NULL): a
        #: write gave it pids, even if their tasks have all exited since.
        self.listing = False
        self._changed = changed

    @property
    def active(self) -> bool:
        """True when some task's events are not recorded."""
        return bool(self.listing or self.notrace_pids)

    def ignores(self, pid: int) -> bool:
        """True when the events of ``pid`` are not recorded."""
        if self.listing and pid not in self.pids:
            return True
        return pid in self.notrace_pids

    def fork(self, parent: int, child: int) -> None:
        """``parent`` forked ``child`` (event-fork / function-fork on): a set that lists
        the parent lists the child too.  Runs in the emulation, without the event lock:
        each set is replaced whole, as Linux's readers see one list or the other."""
        if parent in self.pids:
            self.pids = self.pids | {child}
        if parent in self.notrace_pids:
            self.notrace_pids = self.notrace_pids | {child}

    def exit(self, pid: int) -> None:
        """The task ``pid`` is gone: it leaves both sets (which stay as they are
        otherwise, an emptied trace list included)."""
        if pid in self.pids:
            self.pids = self.pids - {pid}
        if pid in self.notrace_pids:
            self.notrace_pids = self.notrace_pids - {pid}

    @staticmethod
    def text(pids: frozenset[int]) -> str:
        return "".join(f"{pid}\n" for pid in sorted(pids))

    def write(self, notrace: bool, data: bytes) -> int:
        """Apply one write to ``set_event_pid`` (``set_event_notrace_pid`` when
        ``notrace``); return the bytes taken."""
        added = set()
        for token in bytes(data).split(b"\0", 1)[0].decode("latin-1").split():
            pid = _kstrtoul_base0(token)
            if pid is None:
                raise OSError(errno.EINVAL, f"invalid pid {token!r}")
            if pid >= PID_MAX_LIMIT:
                raise OSError(errno.EPERM, f"pid {pid} out of range")
            added.add(pid)
        old = self.notrace_pids if notrace else self.pids
        new = frozenset(old | added) if added else frozenset()
        self._set(notrace, new)
        return len(data)

    def clear(self, notrace: bool) -> None:
        self._set(notrace, frozenset())

    def _set(self, notrace: bool, pids: frozenset[int]) -> None:
        if notrace:
            self.notrace_pids = pids
        else:
            self.pids = pids
            self.listing = bool(pids)
        if self._changed is not None:
            self._changed()


def _kstrtoul_base0(text: str) -> int | None:
    """kstrtoul(text, 0): an optional '+', then 0x hex, 0 octal or decimal; else None."""
    if text.startswith("+"):
        text = text[1:]
    base = 10
    if text[:2].lower() == "0x" and len(text) > 2:
        text, base = text[2:], 16
    elif text.startswith("0"):
        base = 8
    digits = "0123456789abcdef"[:base]
    if not text or any(c not in digits for c in text.lower()):
        return None
    return int(text, base)
