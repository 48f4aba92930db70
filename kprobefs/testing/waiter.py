"""Waiting, with a bound, for a record: :class:`TracePipe` reads ``trace_pipe`` (which
consumes what it reads, as every ``trace_pipe`` reader does) without blocking, and
``wait_for`` returns the first record that matches or raises :class:`RecordTimeout`
with what it read meanwhile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from .errors import RecordTimeout
from .records import Record, TraceReader

__all__ = ["TracePipe", "RecordTimeout", "wait_for_record"]


class TracePipe:
    """``trace_pipe`` of a tracing directory (the mount's ``tracing``, or an instance's
    directory), opened non-blocking on first use; a context manager."""

    def __init__(self, tracing: str | os.PathLike, reader: TraceReader | None = None,
                 poll_interval: float = 0.02):
        self.tracing = Path(tracing)
        self.reader = reader or TraceReader(self.tracing)
        self.poll_interval = poll_interval
        self._fd: int | None = None
        self._partial = ""
        self.records: list[Record] = []     # every record read, in order

    def __enter__(self) -> "TracePipe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> list[Record]:
        """The records the pipe holds now (none when it is empty); never waits."""
        if self._fd is None:
            self._fd = os.open(self.tracing / "trace_pipe", os.O_RDONLY | os.O_NONBLOCK)
        chunks = []
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            chunks.append(data.decode("utf-8", "replace"))
        text = self._partial + "".join(chunks)
        complete, _, self._partial = text.rpartition("\n")
        records = self.reader.parse(complete) if complete else []
        self.records.extend(records)
        return records

    def wait_for(self, match: Callable[[Record], bool] | None = None, *,
                 timeout: float = 10.0, **criteria) -> Record:
        """The first record read from now on for which ``match(record)`` is true and
        that has ``criteria`` (``event=``, ``comm=``, ``pid=``, or a field's value, as
        :meth:`Record.matches`); raises RecordTimeout after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        seen_from = len(self.records)
        while True:
            for record in self.read():
                if record.matches(**criteria) and (match is None or match(record)):
                    return record
            if time.monotonic() >= deadline:
                seen = self.records[seen_from:]
                want = ", ".join(f"{k}={v!r}" for k, v in criteria.items())
                if match is not None:
                    want = (want + ", " if want else "") + getattr(match, "__name__", "match")
                shown = "\n".join(r.line or repr(r) for r in seen[-20:])
                raise RecordTimeout(
                    f"no record with {want or 'anything'} in {timeout:g} s; "
                    f"{len(seen)} read meanwhile" + (f", the last ones:\n{shown}" if seen
                                                     else ""), seen)
            time.sleep(self.poll_interval)


def wait_for_record(tracing: str | os.PathLike, match: Callable[[Record], bool] | None = None,
                    *, timeout: float = 10.0, **criteria) -> Record:
    """Opens ``trace_pipe`` of ``tracing``, waits as :meth:`TracePipe.wait_for` does and
    closes it again."""
    with TracePipe(tracing) as pipe:
        return pipe.wait_for(match, timeout=timeout, **criteria)
