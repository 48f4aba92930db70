"""The kprobefs exception hierarchy.

Every error a layer raises on purpose derives from :class:`KprobefsError`.  Errors that
correspond to a Linux errno derive from :class:`OSError` as well, so callers (and the FUSE
adapter) can read ``exc.errno`` and hand it on unchanged.
"""

import errno as _errno
import os as _os

__all__ = [
    "KprobefsError",
    "KernelError",
    "ImageError",
    "MachineError",
    "KernelOops",
    "KernelWedged",
    "KernelStuck",
    "ProbeError",
]


class KprobefsError(Exception):
    """Base of every error kprobefs raises on purpose."""


class KernelError(KprobefsError, OSError):
    """A system call or kernel operation failed with a Linux errno.

    Raised by the Python API when the emulated kernel (or the engine acting for it) returns
    a negative errno; ``errno`` holds the positive value, ``strerror`` the C library text.
    """

    def __init__(self, err: int, what: str = ""):
        text = _os.strerror(err)
        super().__init__(err, f"{what}: {text}" if what else text)


class ImageError(KprobefsError):
    """The kernel image is missing, malformed, or lacks a section the loader needs."""


class MachineError(KprobefsError):
    """The emulator itself failed (an unexpected Unicorn error, an unhandled trap)."""


class KernelOops(MachineError):
    """A fault in kernel mode that no exception-table entry covers.

    The offending task is killed; this is raised only to a caller that waited on that
    task's system call.
    """


class KernelWedged(MachineError, TimeoutError):
    """A system call, upcall or boot step did not finish within its caller's bound."""

    errno = _errno.EIO


class KernelStuck(KernelWedged):
    """The machine cannot run at all: a host handler has not returned for longer than
    the watchdog allows, or no CPU is left in service.  Raised at once, without waiting,
    until the machine runs again."""


class ProbeError(KprobefsError, OSError):
    """A probe could not be registered or changed; ``errno`` is what Linux returns."""

    def __init__(self, err: int, what: str = ""):
        text = _os.strerror(err)
        super().__init__(err, f"{what}: {text}" if what else text)


# The probe error-code table: one entry per id of the kernel's trace_probe ERRORS list, in
# that order, with the message error_log shows for it (REFERENCE.md §4.3).
PROBE_ERROR_MESSAGES: dict[str, str] = {
    "FILE_NOT_FOUND": "Failed to find the given file",
    "NO_REGULAR_FILE": "Not a regular file",
    "BAD_REFCNT": "Invalid reference counter offset",
    "REFCNT_OPEN_BRACE": "Reference counter brace is not closed",
    "BAD_REFCNT_SUFFIX": "Reference counter has wrong suffix",
    "BAD_UPROBE_OFFS": "Invalid uprobe offset",
    "MAXACT_NO_KPROBE": "Maxactive is not for kprobe",
    "BAD_MAXACT": "Invalid maxactive number",
    "MAXACT_TOO_BIG": "Maxactive is too big",
    "BAD_PROBE_ADDR": "Invalid probed address or symbol",
    "NON_UNIQ_SYMBOL": "The symbol is not unique",
    "BAD_RETPROBE": "Retprobe address must be an function entry",
    "BAD_ADDR_SUFFIX": "Invalid probed address suffix",
    "NO_GROUP_NAME": "Group name is not specified",
    "GROUP_TOO_LONG": "Group name is too long",
    "BAD_GROUP_NAME": "Group name must follow the same rules as C identifiers",
    "NO_EVENT_NAME": "Event name is not specified",
    "EVENT_TOO_LONG": "Event name is too long",
    "BAD_EVENT_NAME": "Event name must follow the same rules as C identifiers",
    "EVENT_EXIST": "Given group/event name is already used by another event",
    "RETVAL_ON_PROBE": "$retval is not available on probe",
    "BAD_STACK_NUM": "Invalid stack number",
    "BAD_ARG_NUM": "Invalid argument number",
    "BAD_VAR": "Invalid $-variable specified",
    "BAD_REG_NAME": "Invalid register name",
    "BAD_MEM_ADDR": "Invalid memory address",
    "BAD_IMM": "Invalid immediate value",
    "IMMSTR_NO_CLOSE": "String is not closed with '\"'",
    "FILE_ON_KPROBE": "File offset is not available with kprobe",
    "BAD_FILE_OFFS": "Invalid file offset value",
    "SYM_ON_UPROBE": "Symbol is not available with uprobe",
    "TOO_MANY_OPS": "Dereference is too much nested",
    "DEREF_NEED_BRACE": "Dereference needs a brace",
    "BAD_DEREF_OFFS": "Invalid dereference offset",
    "DEREF_OPEN_BRACE": "Dereference brace is not closed",
    "COMM_CANT_DEREF": "$comm can not be dereferenced",
    "BAD_FETCH_ARG": "Invalid fetch argument",
    "ARRAY_NO_CLOSE": "Array is not closed",
    "BAD_ARRAY_SUFFIX": "Array has wrong suffix",
    "BAD_ARRAY_NUM": "Invalid array size",
    "ARRAY_TOO_BIG": "Array number is too big",
    "BAD_TYPE": "Unknown type is specified",
    "BAD_STRING": "String accepts only memory argument",
    "BAD_SYMSTRING": "Symbol String doesn't accept data/userdata",
    "BAD_BITFIELD": "Invalid bitfield",
    "ARG_NAME_TOO_LONG": "Argument name is too long",
    "NO_ARG_NAME": "Argument name is not specified",
    "BAD_ARG_NAME": "Argument name must follow the same rules as C identifiers",
    "USED_ARG_NAME": "This argument name is already used",
    "ARG_TOO_LONG": "Argument expression is too long",
    "NO_ARG_BODY": "No argument expression",
    "BAD_INSN_BNDRY": "Probe point is not an instruction boundary",
    "FAIL_REG_PROBE": "Failed to register probe event",
    "DIFF_PROBE_TYPE": "Probe type is different from existing probe",
    "DIFF_ARG_TYPE": "Argument type or name is different from existing probe",
    "SAME_PROBE": "There is already the exact same probe event",
    "NO_EVENT_INFO": "This requires both group and event name to attach",
    "BAD_ATTACH_EVENT": "Attached event does not exist",
    "BAD_ATTACH_ARG": "Attached event does not have this field",
    "NO_EP_FILTER": "No filter rule after 'if'",
    "EVENT_TOO_BIG": "Event too big (too many fields?)",
}


class ProbeParseError(ProbeError):
    """A probe command (kprobe_events / dynamic_events line) was rejected.

    Raised by :func:`kprobefs.tracing.events.probe_parser.parse_command` and by the
    engine for the registration-time ids of the same table.  ``errno`` is what the
    write() returns.
    ``error_id`` is a key of :data:`PROBE_ERROR_MESSAGES`, or ``None`` when Linux rejects
    the command without an error_log entry.  ``index`` is the word the error_log caret
    points into and ``offset`` the column inside that word (REFERENCE.md §4.2).  ``log`` says
    whether Linux writes an error_log entry.  ``cancelled`` is set when the line is not a
    kprobe command at all (Linux's -ECANCELED: other dynamic-event parsers may claim it).
    """

    def __init__(self, error_id: str | None, err: int = _errno.EINVAL, index: int = 0,
                 offset: int = 0, *, log: bool = True, cancelled: bool = False):
        if error_id is not None and error_id not in PROBE_ERROR_MESSAGES:
            raise ValueError(f"unknown probe error id {error_id!r}")
        super().__init__(err, PROBE_ERROR_MESSAGES.get(error_id, "") if error_id else "")
        self.error_id = error_id
        self.index = index
        self.offset = offset
        self.log = log and error_id is not None
        self.cancelled = cancelled

    @property
    def message(self) -> str:
        """Return the error_log message text ("" when nothing is logged)."""
        return PROBE_ERROR_MESSAGES.get(self.error_id, "") if self.error_id else ""

    def __reduce__(self):
        return (_rebuild_probe_parse_error,
                (self.error_id, self.errno, self.index, self.offset, self.log, self.cancelled))


def _rebuild_probe_parse_error(error_id, err, index, offset, log, cancelled):
    return ProbeParseError(error_id, err, index, offset, log=log, cancelled=cancelled)


__all__ += ["PROBE_ERROR_MESSAGES", "ProbeParseError"]
