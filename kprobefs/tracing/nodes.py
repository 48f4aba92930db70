"""The tracefs tree's building blocks: the node protocol the FUSE layer serves, generic
files and directories made of callables, and the kernel's way of reading a number
written to a control file.  :mod:`files` builds the tree from them, :mod:`buffer_files`
the files that read a ring buffer.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol, runtime_checkable


__all__ = [
    "TraceNode",
    "TraceDir",
    "TraceFile",
    "FileHandle",
    "Directory",
    "MODE_DIR",
    "MODE_WRITE",
    "MODE_READ",
    "MODE_WRITE_ONLY",
    "Mutexes",
]


@dataclass(frozen=True)
class Mutexes:
    """Which kernel mutexes a host-served node's operations hold, as 6.1's handlers of
    that file take them: ``open`` on every open, ``trunc`` besides on an open with write
    access and O_TRUNC (its clear action), ``read`` and ``write`` across each
    read and write (a directory's ``write``: mkdir and rmdir).  The kernel work an
    operation queues (a tracefs directory, a module's init) runs with them held, unless
    ``work_unlocked`` (6.1 runs a module's init and exit without module_mutex).  A
    node says what it takes as its ``mutexes`` attribute; the FUSE layer hands the
    kernel their word (machine.abi.mutexes_word)."""

    open: tuple[str, ...] = ()
    trunc: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    work_unlocked: bool = False

MODE_DIR = 0o750
MODE_WRITE = 0o640         # TRACE_MODE_WRITE
MODE_READ = 0o440          # TRACE_MODE_READ
MODE_WRITE_ONLY = 0o220    # trace_marker


# ------------------------------------------------------------------------ protocol

@runtime_checkable
class FileHandle(Protocol):
    def read(self, size: int, offset: int) -> bytes: ...
    def write(self, data: bytes, offset: int) -> int: ...
    def release(self) -> None: ...


@runtime_checkable
class TraceFile(Protocol):
    mode: int

    def open(self, flags: int, pid: int, comm: str) -> FileHandle: ...


@runtime_checkable
class TraceDir(Protocol):
    mode: int

    def children(self) -> dict[str, "TraceNode"]: ...


TraceNode = TraceFile | TraceDir


# ------------------------------------------------------------------- number parsing

def _kstrtoul(data: bytes, base: int = 10) -> int:
    """Parse a control-file number the kernel's way (kstrtoul): optional '+', at most
    one trailing newline, nothing else; EINVAL when malformed, ERANGE on overflow."""
    text = data.decode("latin-1")
    if text.endswith("\n"):
        text = text[:-1]
    if text.startswith("+"):
        text = text[1:]
    if base == 0:
        if text[:2] in ("0x", "0X") and len(text) > 2:
            text, base = text[2:], 16
        elif text.startswith("0"):
            base = 8
        else:
            base = 10
    digits = "0123456789abcdef"[:base]
    if not text or any(c.lower() not in digits for c in text):
        raise OSError(errno.EINVAL, "invalid number")
    value = int(text, base)
    if value >= 1 << 64:
        raise OSError(errno.ERANGE, "number out of range")
    return value


def _c_string(data: bytes) -> bytes:
    nul = data.find(b"\0")
    return data if nul < 0 else data[:nul]


def _has_write(flags: int) -> bool:
    return (flags & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)


# --------------------------------------------------------------------- generic nodes

def _encoded(content: str | bytes) -> bytes:
    return content.encode("latin-1", "replace") if isinstance(content, str) else content


class _Handle:
    """An open file: content made once (at first read), writes applied per call.  The
    content is text, bytes, or a tuple of them read as their join (``trace``'s header
    and lines: a full buffer's lines are megabytes, which a join would copy again).
    Text is encoded a read at a time (latin-1: a character a byte), so that the
    megabytes are not copied whole once more before the first read returns."""

    def __init__(self, produce: Callable[[], str | bytes | tuple] | None,
                 write: Callable[[bytes], int] | None,
                 release: Callable[[], None] | None = None):
        self._produce = produce
        self._write = write
        self._release = release
        self._data: tuple[str | bytes, ...] | None = None

    def read(self, size: int, offset: int) -> bytes:
        if self._data is None:
            if self._produce is None:
                raise OSError(errno.EINVAL, "not readable")
            content = self._produce()
            self._data = content if isinstance(content, tuple) else (content,)
        if len(self._data) == 1:
            return _encoded(self._data[0][offset:offset + size])
        out = []
        for part in self._data:
            if offset >= len(part):
                offset -= len(part)
                continue
            out.append(_encoded(part[offset:offset + size]))
            size -= len(out[-1])
            offset = 0
            if size <= 0:
                break
        return b"".join(out)

    def write(self, data: bytes, offset: int) -> int:
        if self._write is None:
            raise OSError(errno.EINVAL, "not writable")
        return self._write(bytes(data))

    def release(self) -> None:
        if self._release is not None:
            release, self._release = self._release, None
            release()


class _File:
    """A file made of callables: ``read()`` → text, ``write(data, pid, comm)`` → count,
    ``trunc()`` for open(O_TRUNC) with write access, ``opened()``/``closed()`` hooks;
    ``mutexes``: the kernel mutexes its operations hold."""

    def __init__(self, mode: int, read: Callable[[], str | bytes] | None = None,
                 write: Callable[[bytes, int, str], int] | None = None,
                 trunc: Callable[[], None] | None = None,
                 produce_at_open: bool = False, mutexes: Mutexes | None = None):
        self.mode = mode
        #: The kernel mutexes the file's operations hold (Mutexes); None: none.
        self.mutexes = mutexes
        self._read = read
        self._write = write
        self._trunc = trunc
        self._at_open = produce_at_open

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        if _has_write(flags) and flags & os.O_TRUNC and self._trunc is not None:
            self._trunc()
        write = self._write
        handle = _Handle(self._read,
                         None if write is None else (lambda data: write(data, pid, comm)))
        if self._at_open and self._read is not None:
            handle.read(0, 0)
        return handle


class Directory:
    """A directory whose entries come from ``entries()`` on every call."""

    mode = MODE_DIR

    def __init__(self, entries: Callable[[], dict[str, Any]] | dict[str, Any]):
        self._entries = entries

    def children(self) -> dict[str, Any]:
        entries = self._entries
        return dict(entries() if callable(entries) else entries)

    @property
    def fixed_names(self) -> Collection[str]:
        """Names that stay as long as the directory does: a fixed mapping's (a trace
        array's files), none of a computed one (events come and go)."""
        entries = self._entries
        return () if callable(entries) else entries.keys()


def _text_file(produce: Callable[[], str]) -> _File:
    return _File(MODE_READ, read=produce)
