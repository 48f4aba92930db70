"""Per-CPU trace ring buffers bounded by ``buffer_size_kb`` (REFERENCE.md §6.1, §6.2).

Records are kept as tuples, formatted only when ``trace`` or ``trace_pipe`` is read.  Space
is accounted the way Linux's ring buffer spends it: pages of 4080 data bytes, each event
taking a 4-byte header plus its payload rounded up to 4 bytes (plus a length word for
payloads over 112 bytes, plus an 8-byte time extend when the gap to the previous event on
that CPU does not fit 27 bits).  In overwrite mode a full buffer drops its oldest page and
counts the page's events as overrun; otherwise the new event is dropped.

Counters follow the ``trace`` header: *entries* are the records still in the buffer,
*written* adds the overrun ones; consuming reads (``trace_pipe``) remove records from both.

A *stage* (:class:`Stage`) may feed the buffer records written elsewhere: the kernel's own
recorder (kernel/trace_native.c) stages records per CPU in the page the buffer has open,
with the same accounting, and (overwriting) may close full pages and go on in new ones.
Before the buffer reads or writes a CPU it takes that CPU's staged records, a
:class:`Chunk` per page, decoded into records only when a reader reaches them; after
changing a CPU's open page it tells the stage where the page stands.  Stage calls run
with the buffer's lock held, and only where no CPU is inside the recorder: on the
emulation thread, or while the machine is stopped.
"""

from __future__ import annotations

import errno
import threading
from collections import deque
from typing import Callable, Iterator, Protocol, Sequence

from kprobefs.tracing.buffers.raw_page import (
    PAGE_SIZE, PAGE_HEADER_SIZE, PageWriter, make_page,
)

__all__ = [
    "RingBuffer",
    "CpuBuffer",
    "Chunk",
    "Stage",
    "PAGE_DATA_SIZE",
    "MIN_PAGES",
    "DEFAULT_BUFFER_BYTES",
    "pages_for_kb",
    "merge_runs",
    "decode_runs",
    "event_size",
    "MAX_TOTAL_BUFFER_KB",
]

PAGE_DATA_SIZE = 4080              # data bytes per 4 KiB ring-buffer page
MIN_PAGES = 2                      # the boot-time (unexpanded) size per CPU
DEFAULT_BUFFER_BYTES = 1441792     # trace_buf_size: 1408 KiB per CPU once expanded


def _total_buffer_bound_kb(meminfo: str = "/proc/meminfo") -> int:
    """An eighth of the host's memory, in KiB, and at least 32 MiB (see
    MAX_TOTAL_BUFFER_KB)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(32768, int(line.split()[1]) // 8)
    except (OSError, ValueError, IndexError):
        pass
    return 32768


#: Daemon-wide bound on buffer_size_kb summed over the CPUs and the trace arrays: a
#: resize past it fails with ENOMEM, as Linux's does when the pages cannot be had
#: (6.1 refuses pages past si_mem_available()).  Only pages that fill take memory
#: here, a record a Python tuple several times its accounted bytes, so the bound is
#: an eighth of the host's memory: 100 instances at the default size take 275 MiB of
#: it, and hold nothing until they record.
MAX_TOTAL_BUFFER_KB = _total_buffer_bound_kb()
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


def _pair_ts(pair: tuple[int, tuple]) -> int:
    return pair[1][0]


def merge_runs(runs: Sequence[tuple[int, list]]) -> list[tuple[int, tuple]]:
    """(cpu, record) pairs in time order from :meth:`RingBuffer.runs`' lists."""
    if len(runs) == 1:
        c, recs = runs[0]
        return [(c, r) for r in recs]
    # Each CPU's records are in time order: one stable sort on the timestamp merges
    # them (runs merge in linear time), a tie going to the lower CPU, as before.
    pairs = [(c, r) for c, recs in runs for r in recs]
    pairs.sort(key=_pair_ts)
    return pairs


def decode_runs(runs: Sequence[tuple[int, list]]) -> list[tuple[int, list]]:
    """:meth:`RingBuffer.runs` with ``staged``, every chunk decoded (the buffer's
    pages left as they are)."""
    out = []
    for cpu, items in runs:
        if any(type(item) is Chunk for item in items):
            records = []
            for item in items:
                if type(item) is Chunk:
                    records.extend(item.decode(item.data))
                else:
                    records.append(item)
            items = records
        if items:
            out.append((cpu, items))
    return out


class Chunk:
    """Records staged elsewhere, taken into a page as they were written: ``count``
    records in ``data``, which ``decode(data)`` turns into record tuples when a reader
    first needs them.  ``raw(data, last_ts)``, when given, turns them into
    ``trace_pipe_raw`` events without making the tuples: (the events' bytes, the first
    one's time, the last one's), each event's delta from ``last_ts`` (``None``: the
    first starts a page), or ``None`` when no record is left."""

    __slots__ = ("data", "count", "decode", "raw", "rows")

    def __init__(self, data: bytes, count: int, decode: Callable[[bytes], list],
                 raw: Callable[[bytes, int | None], tuple | None] | None = None,
                 rows: Callable[[bytes, Callable, dict], tuple | None] | None = None):
        self.data = data
        self.count = count
        self.decode = decode
        self.raw = raw
        #: ``rows(data, codes_of, types)``, when given: the records as flat rows for ``trace``
        #: text without their tuples (NativeRecorder._rows), or ``None``.
        self.rows = rows


class Stage(Protocol):
    """Where a :class:`RingBuffer` takes staged records from (see the module docstring)."""

    def take(self, cpu: int) -> tuple[list[Chunk | None], int, int | None] | None:
        """Remove the CPU's staged records: (the records of each page, the last one the
        open page's and the others' full pages the stage closed (``None``: no record),
        the bytes the open page now uses, the time of the last record or ``None``), or
        ``None`` if nothing is staged."""

    def sync(self, cpu: int, used: int, last_ts: int | None, overwrite: bool) -> None:
        """The CPU's open page now uses ``used`` bytes; its last record is at
        ``last_ts``.  Only when ``overwrite`` may the stage close pages itself."""

    def pending(self, cpu: int) -> bool:
        """Whether records are staged (a racy peek, for waiters)."""

    def set_waiters(self, waiting: bool) -> None:
        """Whether a reader waits for records (then each staged record wakes it)."""


class _Page(deque):
    """One ring-buffer page: records and chunks, oldest first, how many records, and
    how many chunks are still undecoded."""

    __slots__ = ("entries", "chunks")

    def __init__(self):
        super().__init__()
        self.entries = 0
        self.chunks = 0

    def expand_head(self) -> int:
        """Decode the chunks at the head into their records; return how many."""
        n = 0
        while self and type(self[0]) is Chunk:
            chunk = self.popleft()
            self.extendleft(reversed(chunk.decode(chunk.data)))
            n += 1
        self.chunks -= n
        return n

    def expand(self) -> int:
        """Decode every chunk of the page; return how many there were."""
        n = self.chunks
        if n:
            items = []
            for item in self:
                items.extend(item.decode(item.data) if type(item) is Chunk else (item,))
            self.clear()
            self.extend(items)
            self.chunks = 0
        return n


class CpuBuffer:
    """The buffer of one CPU: a deque of pages, each holding records (any tuple whose
    first item is its timestamp) and chunks, oldest first.  The caller holds the
    :class:`RingBuffer` lock.
    """

    __slots__ = ("cpu", "nr_pages", "pages", "used", "entries", "overrun", "dropped",
                 "last_ts", "read_overrun", "read_events", "undecoded")

    def __init__(self, cpu: int, nr_pages: int):
        self.cpu = cpu
        self.nr_pages = nr_pages
        self.reset()

    def reset(self) -> None:
        self.pages: deque[_Page] = deque([_Page()])
        self.used = 0                  # bytes used in the write page
        self.entries = 0
        self.overrun = 0
        self.dropped = 0
        self.last_ts = None
        self.read_overrun = 0          # overrun when trace_pipe_raw last read a page
        self.read_events = 0           # records consumed
        self.undecoded = 0             # chunks not decoded yet, over every page

    @property
    def size_bytes(self) -> int:
        return self.nr_pages * PAGE_DATA_SIZE

    def _drop_oldest(self) -> None:
        lost = self.pages.popleft()
        self.undecoded -= lost.chunks
        self.overrun += lost.entries
        self.entries -= lost.entries

    def next_page(self, overwrite: bool) -> bool:
        """Open a new write page: the oldest page goes when the buffer is full (its
        records count as overrun), or, not overwriting, nothing happens and the event
        that did not fit is dropped (False)."""
        if len(self.pages) >= self.nr_pages:
            if not overwrite:
                self.dropped += 1
                return False
            self._drop_oldest()
        self.pages.append(_Page())
        self.used = 0
        return True

    def write(self, record: tuple, size: int, overwrite: bool) -> bool:
        """Store ``record`` taking ``size`` bytes; return False if it was dropped."""
        ts = record[0]
        last = self.last_ts
        if last is not None and ts - last >= _MAX_DELTA:
            size += _TIME_EXTEND
        if self.used + size > PAGE_DATA_SIZE and not self.next_page(overwrite):
            return False
        page = self.pages[-1]
        page.append(record)
        page.entries += 1
        self.used += size
        self.entries += 1
        self.last_ts = ts
        return True

    def add_staged(self, pages: list, used: int, last_ts: int | None) -> None:
        """Append staged records, already accounted: full pages the stage closed (each
        then opens the next page, as only an overwriting buffer lets the stage close
        them), then the records of the open page, which now uses ``used`` bytes."""
        for i, chunk in enumerate(pages):
            if i:
                self.next_page(True)
            if chunk is not None:
                page = self.pages[-1]
                page.append(chunk)
                page.chunks += 1
                self.undecoded += 1
                page.entries += chunk.count
                self.entries += chunk.count
        self.used = used
        self.last_ts = last_ts

    def resize(self, nr_pages: int) -> None:
        """Change the page count; pages dropped by shrinking count as overrun."""
        self.nr_pages = max(MIN_PAGES, nr_pages)
        while len(self.pages) > self.nr_pages:
            self._drop_oldest()

    def peek(self):
        """Return the oldest record, or ``None``."""
        for page in self.pages:
            if page.chunks:
                self.undecoded -= page.expand_head()
            if page:
                return page[0]
        return None

    def pop(self):
        """Remove and return the oldest record, or ``None``."""
        pages = self.pages
        while pages:
            page = pages[0]
            if page.chunks:
                self.undecoded -= page.expand_head()
            if page:
                record = page.popleft()
                page.entries -= 1
                self.entries -= 1
                if not page and len(pages) > 1:
                    pages.popleft()
                return record
            if len(pages) == 1:
                return None
            pages.popleft()
        return None

    def items(self) -> list:
        """Return the records and the chunks not decoded yet, oldest first, decoding
        nothing (a reader that formats chunks itself: TraceFormatter)."""
        out = []
        for page in self.pages:
            out.extend(page)
        return out

    def records(self) -> list:
        """Return a copy of the records, oldest first (decoding every chunk, once)."""
        self.decode_all()
        out = []
        for page in self.pages:
            out.extend(page)
        return out

    def decode_all(self) -> None:
        """Decode every chunk now (nothing to do, and O(1), when none is left)."""
        if self.undecoded:
            for page in self.pages:
                if page.chunks:
                    self.undecoded -= page.expand()


def _raw_page(buf: CpuBuffer) -> bytes | None:
    """The oldest page of ``buf`` as trace_pipe_raw hands it out, taken whole and
    removed, when it holds staged records only, none read yet, that their ``raw``
    turns into events without decoding them: Linux's reader takes the ring buffer's
    page as it is.  ``None`` otherwise (RingBuffer.read_page then builds the page
    record by record).  The caller holds the lock."""
    pages = buf.pages
    page = pages[0]
    if not page or page.chunks != len(page):
        return None
    parts, first, last = [], None, None
    for chunk in page:
        if chunk.raw is None:
            return None
        made = chunk.raw(chunk.data, last)
        if made is not None:
            parts.append(made[0])
            if first is None:
                first = made[1]
            last = made[2]
    data = b"".join(parts)
    if len(data) > PAGE_SIZE - PAGE_HEADER_SIZE:
        return None             # a time extend the accounting did not have
    buf.undecoded -= page.chunks
    buf.entries -= page.entries
    buf.read_events += page.entries
    if len(pages) > 1:
        pages.popleft()
    else:
        page.clear()            # the page being written: the stage goes on in it
        page.entries = page.chunks = 0
    if first is None:
        return None             # every record's event was gone: read on
    missed, buf.read_overrun = buf.overrun - buf.read_overrun, buf.overrun
    return make_page(first, data, missed)


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
        self._overwrite = True
        self.expanded = False
        self.cpus = [CpuBuffer(cpu, MIN_PAGES) for cpu in range(nr_cpus)]
        self.generation = 0            # bumped by every reset
        self.stage: Stage | None = None
        #: CPUs whose buffers take no record (tracing_cpumask; Linux's
        #: ring_buffer_record_disable_cpu): writes there are refused, not counted.
        self.record_disabled: frozenset[int] = frozenset()

    @property
    def nr_cpus(self) -> int:
        return len(self.cpus)

    # ------------------------------------------------------------------- staging
    def attach_stage(self, stage: Stage | None) -> None:
        """Take staged records from ``stage`` from now on (``None``: stop)."""
        with self.lock:
            self._absorb(self.cpus)
            self.stage = stage
            self._sync(self.cpus)

    def _absorb(self, bufs) -> None:
        """Take every staged record of ``bufs`` into their open pages (lock held)."""
        stage = self.stage
        if stage is None:
            return
        for buf in bufs:
            taken = stage.take(buf.cpu)
            if taken is not None:
                buf.add_staged(*taken)

    def _sync(self, bufs) -> None:
        stage = self.stage
        if stage is not None:
            for buf in bufs:
                stage.sync(buf.cpu, buf.used, buf.last_ts, self._overwrite)

    @property
    def overwrite(self) -> bool:
        """Overwrite mode (``options/overwrite``): a full buffer drops its oldest page;
        otherwise new events are dropped."""
        return self._overwrite

    @overwrite.setter
    def overwrite(self, on: bool) -> None:
        with self.lock:
            self._absorb(self.cpus)         # pages the stage closed under the old mode
            self._overwrite = on
            self._sync(self.cpus)

    def page_full(self, cpu: int) -> bool:
        """The stage of ``cpu`` filled the open page: take it and open the next one.
        False when the buffer is full and does not overwrite (the event is dropped)."""
        with self.lock:
            buf = self.cpus[cpu]
            self._absorb((buf,))
            opened = buf.next_page(self.overwrite)
            self._sync((buf,))
            if self._waiters:
                self._cond.notify_all()
        return opened

    def staged_wakeup(self, cpu: int) -> None:
        """A record was staged while a reader waits: take it and wake the reader."""
        with self.lock:
            self._absorb((self.cpus[cpu],))
            self._cond.notify_all()

    def _bufs(self, cpu: int | None) -> list[CpuBuffer]:
        """The CPU buffers a call is about, their staged records taken (lock held)."""
        bufs = self.cpus if cpu is None else [self.cpus[cpu]]
        self._absorb(bufs)
        return bufs

    # ------------------------------------------------------------------- writing
    def write(self, cpu: int, record: tuple, size: int) -> bool:
        """Store ``record`` (payload ``size`` bytes) on ``cpu``; False if dropped."""
        if cpu in self.record_disabled:
            return False
        size = (size + 3) & ~3
        size += 8 if size > _MAX_SMALL_DATA else 4
        stage = self.stage
        with self.lock:
            buf = self.cpus[cpu]
            # _absorb and _sync for this one CPU, spelled out: this is the host's
            # recording path, and the helpers' loops cost a tenth of it.
            if stage is not None:
                taken = stage.take(cpu)
                if taken is not None:
                    buf.add_staged(*taken)
            stored = buf.write(record, size, self._overwrite)
            if stage is not None:
                stage.sync(cpu, buf.used, buf.last_ts, self._overwrite)
            if stored and self._waiters:
                self._cond.notify_all()
        return stored

    def write_many(self, cpu: int, items: Sequence[tuple[tuple, int]]) -> None:
        """Store several records at once (an event and its stack trace)."""
        if cpu in self.record_disabled:
            return
        with self.lock:
            buf = self.cpus[cpu]
            self._absorb((buf,))
            for record, size in items:
                buf.write(record, event_size(size), self.overwrite)
            self._sync((buf,))
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
            for buf in self._bufs(None):
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
            for buf in self._bufs(cpu):
                buf.resize(pages_for_kb(kb))

    def size_kb(self, cpu: int) -> int:
        return self.cpus[cpu].size_bytes >> 10

    def copy_sizes(self, other: "RingBuffer", cpu: int | None = None) -> None:
        """Give one CPU (``None``: every CPU) of this buffer the size ``other`` has
        there (resize_buffer_duplicate_size: the snapshot buffer follows the main)."""
        with self.lock:
            self.expanded = other.expanded
            for buf in self._bufs(cpu):
                buf.resize(other.cpus[buf.cpu].nr_pages)

    def swap(self, other: "RingBuffer", cpu: int | None = None) -> None:
        """Exchange the records of every CPU (``None``) or of one with ``other``
        (ring_buffer_swap_cpu; update_max_tr swaps the buffers themselves).  This
        buffer keeps its stage: what the kernel staged is taken in first, so it goes
        with the records it follows, and the stage then goes on in the page taken
        over.  The caller orders the locks: this buffer's, then ``other``'s."""
        with self.lock, other.lock:
            mine, theirs = self._bufs(cpu), other._bufs(cpu)
            for a, b in zip(mine, theirs):
                self.cpus[a.cpu], other.cpus[b.cpu] = b, a
            self._sync(self._bufs(cpu))
            other._sync(other._bufs(cpu))
            self.generation += 1
            other.generation += 1
            self._cond.notify_all()
            other._cond.notify_all()

    # ----------------------------------------------------------------- counters
    def counts(self, cpu: int | None = None) -> tuple[int, int]:
        """Return (entries in buffer, entries written) for one CPU or all."""
        with self.lock:
            bufs = self._bufs(cpu)
            entries = sum(b.entries for b in bufs)
            return entries, entries + sum(b.overrun for b in bufs)

    def is_empty(self, cpu: int | None = None) -> bool:
        with self.lock:
            return all(b.entries == 0 for b in self._bufs(cpu))

    # ----------------------------------------------------------------- reading
    def reset(self) -> None:
        """Clear every CPU buffer and its counters (``echo > trace``)."""
        with self.lock:
            for buf in self._bufs(None):
                buf.reset()
            self._sync(self.cpus)
            self.generation += 1

    def reset_cpu(self, cpu: int) -> None:
        """Clear one CPU's buffer (``echo > per_cpu/cpuN/trace``)."""
        with self.lock:
            (buf,) = self._bufs(cpu)
            buf.reset()
            self._sync((buf,))

    def materialize(self) -> None:
        """Decode every chunk now (before what their decoder needs goes away)."""
        with self.lock:
            for buf in self._bufs(None):
                buf.decode_all()

    def runs(self, cpu: int | None = None, staged: bool = False) -> list[tuple[int, list]]:
        """Return (cpu, its records oldest first) for each CPU that has records, in CPU
        order, without consuming them: what :meth:`snapshot` merges.  With ``staged``
        the chunks not decoded yet stay :class:`Chunk` objects among the records
        (:func:`decode_runs` decodes them)."""
        with self.lock:
            if staged:
                return [(b.cpu, items) for b in self._bufs(cpu) if (items := b.items())]
            return [(b.cpu, recs) for b in self._bufs(cpu) if (recs := b.records())]

    def snapshot(self, cpu: int | None = None) -> list[tuple[int, tuple]]:
        """Return (cpu, record) pairs in time order, without consuming them."""
        return merge_runs(self.runs(cpu))

    def consume(self, cpu: int | None = None, limit: int = 1) -> list[tuple[int, tuple]]:
        """Remove and return up to ``limit`` oldest (cpu, record) pairs, in time order.

        Each record is handed to exactly one caller.
        """
        out = []
        with self.lock:
            bufs = self._bufs(cpu)
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

    def read_page(self, cpu: int, encode: Callable[[tuple], bytes | None]) -> bytes | None:
        """Remove the oldest records of ``cpu`` that fit one page and return the page in
        Linux's binary layout (:mod:`raw_page`), ``None`` when there is none.

        ``encode`` gives a record's data, or ``None`` for one that has no binary form
        (consumed all the same).  The page flags the events overwritten since the last
        page was read.  As 6.1's ring_buffer_read_page, a page built record by record
        takes them from the oldest page only (what is left of the reader page): the
        next page is then still whole, for :func:`_raw_page`.  A page whose records
        all had no binary form is passed over.
        """
        with self.lock:
            buf, = self._bufs(cpu)
            page = _raw_page(buf)
            if page is not None:
                return page
            pages = buf.pages
            writer = None
            while pages:
                page = pages[0]
                taken = 0
                while page:
                    if page.chunks:
                        buf.undecoded -= page.expand_head()
                    head = page[0]
                    data = encode(head)
                    if data is not None:
                        if writer is None:
                            writer = PageWriter(head[0])
                        if not writer.add(data, head[0]):
                            break
                    page.popleft()
                    taken += 1
                page.entries -= taken
                buf.entries -= taken
                buf.read_events += taken
                if page or len(pages) == 1:
                    break
                pages.popleft()
                if writer is not None:
                    break
            if writer is None:
                return None
            missed, buf.read_overrun = buf.overrun - buf.read_overrun, buf.overrun
        return writer.page(missed)

    def stats(self, cpu: int) -> tuple[int, int, int, int, int | None, int]:
        """Return ``cpu``'s (entries, overrun, bytes, dropped, oldest timestamp or
        ``None``, read events) for ``per_cpu/cpuN/stats``.  Bytes count every page
        in use up to the open page's used bytes."""
        with self.lock:
            buf, = self._bufs(cpu)
            head = buf.peek()
            used = (len(buf.pages) - 1) * PAGE_DATA_SIZE + buf.used if buf.entries else 0
            return (buf.entries, buf.overrun, used, buf.dropped,
                    None if head is None else head[0], buf.read_events)

    def _ready(self, cpu: int | None, full: int) -> Callable[[], bool]:
        """The test a waiter makes (lock held): a record is there; with ``full`` (a
        percentage, one CPU only, as 6.1's ring_buffer_poll_wait), that many of the
        CPU's pages are filled, counting the page being written (6.1's full_hit).
        Staged records are only peeked at: a waiter may run beside the CPUs, and the
        next read takes them (while a reader waits, each staged record is taken and
        wakes it, see :meth:`staged_wakeup`)."""
        bufs = self.cpus if cpu is None else [self.cpus[cpu]]
        stage = self.stage
        if full and cpu is not None:
            buf = bufs[0]
            # the pages written and not read, and the one being written
            return lambda: len(buf.pages) * 100 >= full * buf.nr_pages
        return lambda: any(b.entries or (stage is not None and stage.pending(b.cpu))
                           for b in bufs)

    def ready(self, cpu: int | None = None, full: int = 0) -> bool:
        """Whether a reader waiting with ``full`` would go on now (see :meth:`wait`)."""
        with self.lock:
            return self._ready(cpu, full)()

    def wait(self, timeout: float | None, cpu: int | None = None, full: int = 0) -> bool:
        """Block until a record is available (True) or ``timeout`` passes (False); with
        ``full``, until ``full`` percent of the CPU's pages are (:meth:`_ready`)."""
        with self.lock:
            ready = self._ready(cpu, full)
            stage = self.stage
            if ready():
                return True
            self._waiters += 1
            if stage is not None:
                stage.set_waiters(True)
            try:
                return self._cond.wait_for(ready, timeout)
            finally:
                self._waiters -= 1
                if stage is not None and not self._waiters:
                    stage.set_waiters(False)

    def wake_all(self) -> None:
        """Wake every blocked reader (they re-check and may return empty)."""
        with self.lock:
            self._cond.notify_all()

    def iter_cpus(self) -> Iterator[CpuBuffer]:
        return iter(self.cpus)
