"""Per-CPU trace ring buffers bounded by ``buffer_size_kb`` (REFERENCE.md §6.1, §6.2).

Records are kept as tuples, formatted only when ``trace`` or ``trace_pipe`` is read.  Space
is accounted the way Linux's ring buffer spends it: pages of 4080 data bytes, each event
taking a 4-byte header plus its payload rounded up to 4 bytes (plus a length word for
payloads over 112 bytes, plus an 8-byte time extend when the gap to the previous event on
that CPU does not fit 27 bits).  In overwrite mode a full buffer drops its oldest page and
counts the page's events as overrun; otherwise the new event is dropped.

Counters follow the ``trace`` header: *entries* are the records still in the buffer,
*written* adds the overrun ones; consuming reads (``trace_pipe``) remove records from both.
"""

from __future__ import annotations

import errno
import heapq
import threading
from collections import deque
from typing import Iterator, Sequence

__all__ = [
    "RingBuffer",
    "CpuBuffer",
    "PAGE_DATA_SIZE",
    "MIN_PAGES",
    "DEFAULT_BUFFER_BYTES",
    "pages_for_kb",
    "event_size",
    "MAX_TOTAL_BUFFER_KB",
]

PAGE_DATA_SIZE = 4080              # data bytes per 4 KiB ring-buffer page
MIN_PAGES = 2                      # the boot-time (unexpanded) size per CPU
DEFAULT_BUFFER_BYTES = 1441792     # trace_buf_size: 1408 KiB per CPU once expanded
#: Daemon-wide bound on buffer_size_kb summed over the CPUs (a record costs a Python
#: tuple, several times its accounted bytes): a resize past it fails with ENOMEM, as
#: Linux's does when the pages cannot be allocated.
MAX_TOTAL_BUFFER_KB = 32768
_EVENT_HEADER = 4
_MAX_SMALL_DATA = 112
_TIME_EXTEND = 8
_MAX_DELTA = 1 << 27


def pages_for_kb(kb: int) -> int:
    """Return the pages a ``buffer_size_kb`` of ``kb`` allocates per CPU."""
    return max(MIN_PAGES, -(-kb * 1024 // PAGE_DATA_SIZE))


def event_size(payload: int) -> int:
    """Return the ring-buffer bytes an event with ``payload`` data bytes takes."""
    size = (payload + 3) & ~3
    if size > _MAX_SMALL_DATA:
        size += 4
    return _EVENT_HEADER + size


class CpuBuffer:
    """The buffer of one CPU: a deque of pages, each a deque of records, oldest first.

    A record is any tuple whose first item is its timestamp.  The caller holds the
    :class:`RingBuffer` lock.
    """

    __slots__ = ("cpu", "nr_pages", "pages", "used", "entries", "overrun", "dropped",
                 "last_ts")

    def __init__(self, cpu: int, nr_pages: int):
        self.cpu = cpu
        self.nr_pages = nr_pages
        self.reset()

    def reset(self) -> None:
        self.pages: deque[deque] = deque([deque()])
        self.used = 0                  # bytes used in the write page
        self.entries = 0
        self.overrun = 0
        self.dropped = 0
        self.last_ts = None

    @property
    def size_bytes(self) -> int:
        return self.nr_pages * PAGE_DATA_SIZE

    def write(self, record: tuple, size: int, overwrite: bool) -> bool:
        """Store ``record`` taking ``size`` bytes; return False if it was dropped."""
        ts = record[0]
        last = self.last_ts
        if last is not None and ts - last >= _MAX_DELTA:
            size += _TIME_EXTEND
        if self.used + size > PAGE_DATA_SIZE:
            if len(self.pages) >= self.nr_pages:
                if not overwrite:
                    self.dropped += 1
                    return False
                lost = self.pages.popleft()
                self.overrun += len(lost)
                self.entries -= len(lost)
            self.pages.append(deque())
            self.used = 0
        self.pages[-1].append(record)
        self.used += size
        self.entries += 1
        self.last_ts = ts
        return True

    def resize(self, nr_pages: int) -> None:
        """Change the page count; pages dropped by shrinking count as overrun."""
        self.nr_pages = max(MIN_PAGES, nr_pages)
        while len(self.pages) > self.nr_pages:
            lost = self.pages.popleft()
            self.overrun += len(lost)
            self.entries -= len(lost)

    def peek(self):
        """Return the oldest record, or ``None``."""
        for page in self.pages:
            if page:
                return page[0]
        return None

    def pop(self):
        """Remove and return the oldest record, or ``None``."""
        pages = self.pages
        while pages:
            page = pages[0]
            if page:
                record = page.popleft()
                self.entries -= 1
                if not page and len(pages) > 1:
                    pages.popleft()
                return record
            if len(pages) == 1:
                return None
            pages.popleft()
        return None

    def records(self) -> list:
        """Return a copy of the records, oldest first."""
        out = []
        for page in self.pages:
            out.extend(page)
        return out


class RingBuffer:
    """The trace buffer of all CPUs.

    The probe-hit path calls :meth:`write`; readers take :meth:`snapshot` (``trace``)
    or :meth:`consume` (``trace_pipe``).  One lock guards every CPU buffer; a condition
    on it wakes blocked ``trace_pipe`` readers.
    """

    def __init__(self, nr_cpus: int):
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._waiters = 0
        self.overwrite = True
        self.expanded = False
        self.cpus = [CpuBuffer(cpu, MIN_PAGES) for cpu in range(nr_cpus)]
        self.generation = 0            # bumped by every reset

    @property
    def nr_cpus(self) -> int:
        return len(self.cpus)

    # ------------------------------------------------------------------- writing
    def write(self, cpu: int, record: tuple, size: int) -> bool:
        """Store ``record`` (payload ``size`` bytes) on ``cpu``; False if dropped."""
        size = (size + 3) & ~3
        size += 8 if size > _MAX_SMALL_DATA else 4
        with self.lock:
            stored = self.cpus[cpu].write(record, size, self.overwrite)
            if stored and self._waiters:
                self._cond.notify_all()
        return stored

    def write_many(self, cpu: int, items: Sequence[tuple[tuple, int]]) -> None:
        """Store several records at once (an event and its stack trace)."""
        with self.lock:
            buf = self.cpus[cpu]
            for record, size in items:
                buf.write(record, event_size(size), self.overwrite)
            if self._waiters:
                self._cond.notify_all()

    # ------------------------------------------------------------------ sizing
    def expand(self) -> None:
        """Grow every CPU to the default size if it was never sized (first use)."""
        with self.lock:
            if self.expanded:
                return
            self.expanded = True
            pages = pages_for_kb(DEFAULT_BUFFER_BYTES >> 10)
            for buf in self.cpus:
                buf.resize(pages)

    def resize_kb(self, kb: int, cpu: int | None = None) -> None:
        """Set ``buffer_size_kb`` for one CPU or (``None``) all of them; OSError(ENOMEM)
        and nothing changed when the total would pass MAX_TOTAL_BUFFER_KB."""
        with self.lock:
            total = sum(kb if cpu is None or b.cpu == cpu else b.size_bytes >> 10
                        for b in self.cpus)
            if total > MAX_TOTAL_BUFFER_KB:
                raise OSError(errno.ENOMEM, "Cannot allocate memory")
            self.expanded = True
            for buf in (self.cpus if cpu is None else [self.cpus[cpu]]):
                buf.resize(pages_for_kb(kb))

    def size_kb(self, cpu: int) -> int:
        return self.cpus[cpu].size_bytes >> 10

    # ----------------------------------------------------------------- counters
    def counts(self, cpu: int | None = None) -> tuple[int, int]:
        """Return (entries in buffer, entries written) for one CPU or all."""
        with self.lock:
            bufs = self.cpus if cpu is None else [self.cpus[cpu]]
            entries = sum(b.entries for b in bufs)
            return entries, entries + sum(b.overrun for b in bufs)

    def is_empty(self, cpu: int | None = None) -> bool:
        with self.lock:
            bufs = self.cpus if cpu is None else [self.cpus[cpu]]
            return all(b.entries == 0 for b in bufs)

    # ----------------------------------------------------------------- reading
    def reset(self) -> None:
        """Clear every CPU buffer and its counters (``echo > trace``)."""
        with self.lock:
            for buf in self.cpus:
                buf.reset()
            self.generation += 1

    def reset_cpu(self, cpu: int) -> None:
        """Clear one CPU's buffer (``echo > per_cpu/cpuN/trace``)."""
        with self.lock:
            self.cpus[cpu].reset()

    def snapshot(self, cpu: int | None = None) -> list[tuple[int, tuple]]:
        """Return (cpu, record) pairs in time order, without consuming them."""
        with self.lock:
            bufs = self.cpus if cpu is None else [self.cpus[cpu]]
            lists = [[(r[0], b.cpu, r) for r in b.records()] for b in bufs]
        return [(c, r) for _ts, c, r in heapq.merge(*lists, key=lambda item: item[:2])]

    def consume(self, cpu: int | None = None, limit: int = 1) -> list[tuple[int, tuple]]:
        """Remove and return up to ``limit`` oldest (cpu, record) pairs, in time order.

        Each record is handed to exactly one caller.
        """
        out = []
        with self.lock:
            bufs = self.cpus if cpu is None else [self.cpus[cpu]]
            while len(out) < limit:
                best = None
                best_ts = None
                for b in bufs:
                    head = b.peek()
                    if head is not None and (best is None or head[0] < best_ts):
                        best, best_ts = b, head[0]
                if best is None:
                    break
                out.append((best.cpu, best.pop()))
        return out

    def wait(self, timeout: float | None, cpu: int | None = None) -> bool:
        """Block until a record is available (True) or ``timeout`` passes (False)."""
        with self.lock:
            bufs = self.cpus if cpu is None else [self.cpus[cpu]]
            if any(b.entries for b in bufs):
                return True
            self._waiters += 1
            try:
                return self._cond.wait_for(lambda: any(b.entries for b in bufs), timeout)
            finally:
                self._waiters -= 1

    def wake_all(self) -> None:
        """Wake every blocked reader (they re-check and may return empty)."""
        with self.lock:
            self._cond.notify_all()

    def iter_cpus(self) -> Iterator[CpuBuffer]:
        return iter(self.cpus)
