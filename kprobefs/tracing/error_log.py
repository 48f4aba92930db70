"""The tracing ``error_log``: the last eight parse errors of the control files (§4.1).

Entries are kept as the three lines Linux shows for them; :meth:`ErrorLog.text` is what a
read returns.  Probe commands are formatted by :func:`probe_parser.format_error_log_entry`;
other sources (event filters) give their message and caret column directly.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Sequence

from kprobefs.errors import ProbeParseError
from kprobefs.tracing.events.probe_parser import format_error_log_entry

__all__ = ["ErrorLog", "ERROR_LOG_MAX", "CMD_PREFIX"]

ERROR_LOG_MAX = 8                 # Linux keeps the most recent eight entries
CMD_PREFIX = "  Command: "


class ErrorLog:
    """A bounded log of formatted error entries, oldest first."""

    def __init__(self, clock):
        """``clock()`` returns nanoseconds since boot (the entry timestamps)."""
        self._clock = clock
        self._entries: deque[str] = deque(maxlen=ERROR_LOG_MAX)
        self._lock = threading.Lock()

    def add_probe_error(self, loc: str, words: Sequence[str], err: ProbeParseError) -> None:
        """Log a rejected probe command (only when Linux logs it: ``err.log``)."""
        if not err.log:
            return
        self._append(format_error_log_entry(self._clock(), loc, words, err))

    def add(self, loc: str, command: str, message: str, pos: int) -> None:
        """Log ``message`` for ``command`` with the caret at column ``pos`` of the command."""
        seconds, nanoseconds = divmod(self._clock(), 1_000_000_000)
        self._append(f"[{seconds:5d}.{nanoseconds // 1000:06d}] {loc}: error: {message}\n"
                     f"{CMD_PREFIX}{command}\n"
                     f"{' ' * (len(CMD_PREFIX) + pos)}^\n")

    def _append(self, entry: str) -> None:
        with self._lock:
            self._entries.append(entry)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def text(self) -> str:
        """Return the file content: every entry, oldest first."""
        with self._lock:
            return "".join(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
