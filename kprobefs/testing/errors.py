"""The errors of kprobefs.testing, in kprobefs' hierarchy (:class:`KprobefsError`), each
also the built-in error a caller would expect of it."""

from __future__ import annotations

from ..errors import KprobefsError

__all__ = ["MountError", "ResetError", "FormatError", "RecordTimeout"]


class MountError(KprobefsError, RuntimeError):
    """Raised when the daemon cannot be started or stopped, or a mount to reuse is not
    there; the message carries the ``kprobefs`` command's own reason (its stderr)."""


class ResetError(KprobefsError, RuntimeError):
    """Raised when the tracefs cannot be brought back (an instance whose file a process
    still holds open, a dynamic event in use); the message says which file and why."""


class FormatError(KprobefsError, ValueError):
    """Raised when a ``format``, ``header_page`` or ``header_event`` text is not in the
    shape tracefs writes."""


class RecordTimeout(KprobefsError, AssertionError):
    """Raised by :meth:`~kprobefs.testing.waiter.TracePipe.wait_for` when no record
    matched within its timeout; ``seen`` holds every record read while waiting.  An
    AssertionError, so that pytest reports it as a failed expectation."""

    def __init__(self, message: str, seen: list):
        super().__init__(message)
        self.seen = seen
