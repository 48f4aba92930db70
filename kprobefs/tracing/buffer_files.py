"""The files that read a trace array's ring buffer: ``trace`` and ``snapshot`` (a
snapshot of the text per open file), ``trace_pipe`` (records consumed as text) and
``trace_pipe_raw`` / ``snapshot_raw`` (whole pages, consumed), at the top of an array's
directory and under ``per_cpu/cpuN/``.
"""

from __future__ import annotations

import errno
import os

from kprobefs.tracing.buffers.output import TraceOptions
from kprobefs.tracing.gcpause import gc_paused
from kprobefs.tracing.nodes import (
    MODE_READ, MODE_WRITE, FileHandle, _Handle, _has_write, _kstrtoul,
)
from kprobefs.tracing.trace_array import TraceArray


class _TraceFile:
    """``trace`` (or ``per_cpu/cpuN/trace``): a non-consuming snapshot per open file."""

    mode = MODE_WRITE

    def __init__(self, tracer: TraceArray, cpu: int | None):
        self.tracer = tracer
        self.cpu = cpu

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        t = self.tracer
        if _has_write(flags) and flags & os.O_TRUNC:
            if self.cpu is None:
                t.clear_trace()
            else:
                t.trace_buffer().reset_cpu(self.cpu)
        readable = (flags & os.O_ACCMODE) != os.O_WRONLY
        paused = readable and t.options["pause-on-trace"]
        if paused:
            t.pause()
        if not readable:
            return _Handle(None, lambda data: len(data))
        options = t.trace_options()
        buffer = t.trace_buffer()
        header = t.trace_header(options, self.cpu, buffer)
        with gc_paused():
            runs = t.trace_runs(buffer, self.cpu)
        return _Handle(lambda: (header, t.render_runs(runs, options, buffer)),
                       lambda data: len(data),
                       t.unpause if paused else None)


class _SnapshotFile(_TraceFile):
    """``snapshot`` (or ``per_cpu/cpuN/snapshot``): the snapshot buffer's trace, made
    at open; a write of a number frees, swaps or clears it (TraceArray.write_snapshot)."""

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        t = self.tracer
        cpu = self.cpu

        def write(data: bytes) -> int:
            t.write_snapshot(_kstrtoul(data, 10), cpu)
            return len(data)
        if (flags & os.O_ACCMODE) == os.O_WRONLY:
            return _Handle(None, write)
        text = t.snapshot_text(t.trace_options(), cpu)
        return _Handle(lambda: text, write)


class _TracePipeFile:
    """``trace_pipe``: each record is consumed by exactly one reader."""

    mode = MODE_READ

    def __init__(self, tracer: TraceArray, cpu: int | None):
        self.tracer = tracer
        self.cpu = cpu

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        return _TracePipeHandle(self.tracer, self.cpu)


class _TracePipeHandle:
    def __init__(self, tracer: TraceArray, cpu: int | None):
        self.tracer = tracer
        self.cpu = cpu
        self._pending = b""
        self._options: TraceOptions = tracer.trace_options()

    def read(self, size: int, offset: int) -> bytes:
        """Return up to ``size`` bytes of consumed records, ``b""`` when none is there.

        Text of a record that does not fit stays with this handle for the next read.
        """
        t = self.tracer
        while len(self._pending) < size:
            pairs = t.buffer.consume(self.cpu, limit=max(1, (size - len(self._pending)) // 80))
            if not pairs:
                break
            # bin's characters are bytes (raw_output.py)
            self._pending += t.render(pairs, self._options).encode(
                "latin-1" if self._options.line_mode == "bin" else "utf-8", "replace")
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def write(self, data: bytes, offset: int) -> int:
        raise OSError(errno.EINVAL, "trace_pipe is read-only")

    def wait(self, timeout: float) -> bool:
        """Block until a record can be read (True) or ``timeout`` seconds pass (False)."""
        if self._pending:
            return True
        return self.tracer.buffer.wait(timeout, self.cpu)

    def poll_wait(self, timeout: float) -> bool:
        """Whether poll(2) finds the file readable, waiting for it at most ``timeout``
        seconds (0: a look).  As 6.1's trace_poll: a per-CPU file waits for
        ``buffer_percent`` of its CPU's buffer, the top one for a record.  Text left
        over from a read counts as readable."""
        return bool(self._pending) or _poll_wait(self.tracer, self.tracer.buffer,
                                                 self.cpu, timeout)

    def release(self) -> None:
        self._pending = b""


def _poll_wait(tr: TraceArray, buffer, cpu: int | None, timeout: float) -> bool:
    """trace_poll's rule for a pipe of ``tr`` on ``buffer`` (see poll_wait)."""
    full = tr.buffer_percent if cpu is not None else 0
    if timeout <= 0:
        return buffer.ready(cpu, full)
    return buffer.wait(timeout, cpu, full)


class _TracePipeRawFile:
    """``per_cpu/cpuN/trace_pipe_raw``: whole ring-buffer pages in Linux's binary layout
    (:mod:`raw_page`), consumed.  As 6.1's tracing_buffers_read, a handle keeps the last
    page it took and hands it out across reads until all of its 4096 bytes are gone; only
    then does it take the next one, which removes that page's records from the buffer.
    With ``snapshot`` it is ``snapshot_raw``: the pages of the snapshot buffer, EBUSY
    to open while a latency tracer owns that buffer."""

    mode = MODE_READ

    def __init__(self, tracer: TraceArray, cpu: int, snapshot: bool = False):
        self.tracer = tracer
        self.cpu = cpu
        self.snapshot = snapshot

    def open(self, flags: int, pid: int, comm: str) -> FileHandle:
        t = self.tracer
        if not self.snapshot:
            return _TracePipeRawHandle(t, t.buffer, self.cpu)
        if t.current_tracer.use_max_tr:
            raise OSError(errno.EBUSY, "the latency tracer owns the snapshot")
        return _TracePipeRawHandle(t, t.max_tr.buffer, self.cpu)


class _TracePipeRawHandle:
    def __init__(self, tracer: TraceArray, buffer, cpu: int):
        self.tracer = tracer
        self.buffer = buffer
        self.cpu = cpu
        self._page = b""
        self._read = 0

    def read(self, size: int, offset: int) -> bytes:
        """Return up to ``size`` bytes of the current page, ``b""`` when the buffer has
        no record (the gateway then blocks, or fails with EAGAIN under O_NONBLOCK)."""
        if not size:
            return b""
        if self._read >= len(self._page):
            page = self.buffer.read_page(self.cpu, _raw_record)
            if page is None:
                return b""
            self._page, self._read = page, 0
        out = self._page[self._read:self._read + size]
        self._read += len(out)
        return out

    def write(self, data: bytes, offset: int) -> int:
        raise OSError(errno.EINVAL, "trace_pipe_raw is read-only")

    def wait(self, timeout: float) -> bool:
        """Block until a page can be read (True) or ``timeout`` seconds pass (False)."""
        if self._read < len(self._page):
            return True
        return self.buffer.wait(timeout, self.cpu)

    def poll_wait(self, timeout: float) -> bool:
        """Whether poll(2) finds the file readable, waiting at most ``timeout`` seconds
        (0: a look): the rest of a page taken, else trace_poll's rule
        (``buffer_percent`` of the CPU's buffer, snapshot_raw's too)."""
        return self._read < len(self._page) or _poll_wait(self.tracer, self.buffer,
                                                          self.cpu, timeout)

    def release(self) -> None:
        self._page = b""


def _raw_record(record: tuple) -> bytes | None:
    """A record's binary data; ``None`` for an event with no binary form."""
    raw = getattr(record[3], "raw", None)
    return None if raw is None else raw(record)
