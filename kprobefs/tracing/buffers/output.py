"""Text of the ``trace`` and ``trace_pipe`` files (REFERENCE.md §6.1).

Records are tuples written by the probe-hit path (see :mod:`kprobefs.tracing.registry`);
this module turns them into Linux 6.1's lines: the context columns
(``comm-pid [cpu] flags timestamp: ``) then the event text.  Nothing here runs on the
hit path.
"""

from __future__ import annotations

import struct
from functools import partial
from itertools import chain, compress, groupby, islice, repeat
from operator import add, floordiv, getitem, is_, itemgetter, mod, sub
from typing import Callable, Iterable, NamedTuple, Sequence

from kprobefs.tracing.buffers.batch import merge_lines, second_ranges
from kprobefs.tracing.buffers.ring_buffer import Chunk
from kprobefs.tracing.buffers.text_caches import TextCaches, _Made, bytes_text

__all__ = [
    "TraceOptions",
    "format_header",
    "format_context",
    "format_timestamp",
    "format_ip_sym",
    "flags_text",
    "CommCache",
    "TraceFormatter",
    "new_text_caches",
    "compile_probe_text",
    "FLAGS_NONE",
    "FLAGS_INT3",
    "SAVED_CMDLINES",
]

SAVED_CMDLINES = 128               # the kernel's default saved_cmdlines_size
_US_PER_S = 1_000_000
_NS_PER_S = 1_000_000_000

# A record's context flags: struct trace_entry's flags byte, as 6.1's tracing_gen_ctx
# sets it.  An int3 hit runs with interrupts off in an NMI-like trap ("d.Z..").
FLAGS_NONE = 0
FLAG_IRQS_OFF = 0x01
FLAG_IRQS_NOSUPPORT = 0x02
FLAG_NEED_RESCHED = 0x04
FLAG_HARDIRQ = 0x08
FLAG_SOFTIRQ = 0x10
FLAG_PREEMPT_RESCHED = 0x20
FLAG_NMI = 0x40
FLAG_BH_OFF = 0x80
FLAGS_INT3 = FLAG_IRQS_OFF | FLAG_HARDIRQ | FLAG_NMI
_RESCHED = {FLAG_NEED_RESCHED | FLAG_PREEMPT_RESCHED: "N", FLAG_NEED_RESCHED: "n",
            FLAG_PREEMPT_RESCHED: "p"}


def flags_text(flags: int) -> str:
    """The irqs-off, need-resched, hardirq/softirq, preempt-depth and migrate-disable
    columns, as 6.1's trace_print_lat_fmt prints them (no preemption depth here)."""
    bh_off = flags & FLAG_BH_OFF
    if flags & FLAG_IRQS_OFF:
        irqs = "D" if bh_off else "d"
    else:
        irqs = "b" if bh_off else "X" if flags & FLAG_IRQS_NOSUPPORT else "."
    resched = _RESCHED.get(flags & (FLAG_NEED_RESCHED | FLAG_PREEMPT_RESCHED), ".")
    nmi, hard, soft = flags & FLAG_NMI, flags & FLAG_HARDIRQ, flags & FLAG_SOFTIRQ
    if nmi:
        ctx = "Z" if hard else "z"
    elif hard:
        ctx = "H" if soft else "h"
    else:
        ctx = "s" if soft else "."
    return irqs + resched + ctx + ".."


class TraceOptions(NamedTuple):
    """The output-affecting options, read once per open file."""

    context_info: bool = True
    irq_info: bool = True
    sym_offset: bool = False
    sym_addr: bool = False
    in_ns: bool = True            # the clock counts nanoseconds
    print_parent: bool = True
    #: "raw", "hex" or "bin" (raw_output.py): the option that prints records so, if any
    line_mode: str = ""


_HEADER_IRQ = (
    "#                                _-----=> irqs-off/BH-disabled\n"
    "#                               / _----=> need-resched\n"
    "#                              | / _---=> hardirq/softirq\n"
    "#                              || / _--=> preempt-depth\n"
    "#                              ||| / _-=> migrate-disable\n"
    "#                              |||| /     delay\n"
    "#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION\n"
    "#              | |         |   |||||     |         |\n"
)
_HEADER_PLAIN = (
    "#           TASK-PID     CPU#     TIMESTAMP  FUNCTION\n"
    "#              | |         |         |         |\n"
)


def format_header(tracer: str, entries: int, written: int, nr_cpus: int,
                  options: TraceOptions) -> str:
    """Return the ``trace`` header (printed even when the buffer is empty)."""
    if not options.context_info:
        return ""
    return (f"# tracer: {tracer}\n#\n"
            f"# entries-in-buffer/entries-written: {entries}/{written}   #P:{nr_cpus}\n#\n"
            + (_HEADER_IRQ if options.irq_info else _HEADER_PLAIN))


def format_timestamp(ts: int, in_ns: bool) -> str:
    """Return `` SSSSS.UUUUUU`` (microseconds rounded as the kernel does) or the raw count."""
    if not in_ns:
        return f" {ts:12d}"
    usecs = (ts + 500) // 1000
    seconds, rem = divmod(usecs, 1_000_000)
    return f" {seconds:5d}.{rem:06d}"


def format_context(comm: str, pid: int, cpu: int, flags: int, ts: int,
                   options: TraceOptions) -> str:
    """Return the columns in front of an event's text, up to and including ``": "``."""
    if not options.context_info:
        return ""
    text = f"{comm:>16s}-{pid:<7d} [{cpu:03d}] "
    if options.irq_info:
        text += flags_text(flags)
    return text + format_timestamp(ts, options.in_ns) + ": "


def format_ip_sym(addr: int, symbolize: Callable[[int, bool], str | None],
                  offset: bool, sym_addr: bool = False) -> str:
    """Return an address as ``seq_print_ip_sym`` prints it: ``0`` for NULL, the symbol
    (with ``+0xoff/0xsize`` when ``offset``), or ``0x%08lx`` when no symbol covers it."""
    if not addr:
        return "0"
    name = symbolize(addr, offset)
    text = name if name else f"0x{addr:08x}"
    if sym_addr:
        text += f" <{addr:016x}>"
    return text


class CommCache:
    """The saved pid → comm table ``trace`` prints names from (``<...>`` when unknown).

    Bounded like the kernel's saved_cmdlines: the oldest pid is forgotten first.
    """

    def __init__(self, size: int = SAVED_CMDLINES):
        self.size = size
        self.names: dict[int, str] = {0: "<idle>"}
        self.stale: set[int] = set()
        #: options/record-tgid (set in some trace array): each save also keeps the
        #: saved task's tgid, read by ``tgid_of(pid)`` (None: not the running task).
        self.record_tgid = False
        self.tgid_of: Callable[[int], int | None] | None = None
        self.tgids: dict[int, int] = {}

    def save(self, pid: int, comm: str) -> None:
        names = self.names
        if pid in names:
            del names[pid]
        elif len(names) > self.size:
            oldest = next(iter(k for k in names if k != 0))
            del names[oldest]
            self.stale.discard(oldest)
        names[pid] = comm
        self.stale.discard(pid)
        if self.record_tgid and self.tgid_of is not None:
            tgid = self.tgid_of(pid)
            if tgid:
                self.tgids[pid] = tgid

    def needs(self, pid: int) -> bool:
        """Return True when ``pid``'s comm should be (re)read."""
        return pid not in self.names or pid in self.stale

    def find(self, pid: int) -> str:
        return self.names.get(pid, "<...>")

    def saved_cmdlines(self) -> str:
        """``saved_cmdlines``: ``<pid> <comm>`` per saved task, oldest first (the idle
        task is never saved)."""
        return "".join(f"{pid} {comm}\n" for pid, comm in self.names.items() if pid)

    def set_record_tgid(self, on: bool) -> None:
        """Start (or stop) keeping tgids.  Started, every saved task is read again at
        its next record, so that the tasks already named get their tgid too."""
        if on and not self.record_tgid:
            self.stale.update(pid for pid in self.names if pid)
        self.record_tgid = on

    def saved_tgids(self) -> str:
        """``saved_tgids``: ``<pid> <tgid>`` per task recorded with record-tgid, by
        pid, as 6.1 walks its pid-indexed map."""
        return "".join(f"{pid} {tgid}\n" for pid, tgid in sorted(self.tgids.items()))

    def resize(self, size: int) -> None:
        """``saved_cmdlines_size``: a new table of ``size`` entries; as in 6.1 the new
        table starts empty (the names saved so far are gone).  The dict and set are
        emptied in place: recorders hold them."""
        self.size = size
        self.names.clear()
        self.names[0] = "<idle>"
        self.stale.clear()

    def forget(self, pid: int) -> None:
        """Mark ``pid``'s saved name for a re-read (its task exited; the pid may come
        back).  Only a saved pid is marked: one not saved is read anyway, so the marks
        stay within the table's size however many tasks come and go."""
        if pid and pid in self.names:
            self.stale.add(pid)


# ------------------------------------------------------------------ formatting in bulk

_UNSIGNED_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}
#: struct codes -> their unpack_from, shared by the compiled texts of every event
_UNPACKERS: dict = {}
_SIGNED_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}


class CompiledText(NamedTuple):
    """A kprobe event's text as a ``%`` format over its unpacked argument bytes, with
    the probed address(es) folded in: ``fold(key) % unpack(record[6])`` is the text of
    a record whose address key is ``key`` (``record[4]``, or ``(record[5], record[4])``
    for a return probe: ``is_return``).  The formatter takes the part before ``tail``
    per address and the arguments' text per distinct value."""

    is_return: bool
    unpack: Callable[[bytes], tuple]
    fold: Callable[[object], str]
    #: the text before ``tail`` of ``fold(key)`` (the name and the address(es)), made
    #: once per key as ``fold``'s format is
    head: Callable[[object], str]
    #: ``unpack``'s struct codes, without the byte order (the same for events whose
    #: arguments unpack alike: NativeRecorder._rows reads their records at once)
    codes: str = ""
    #: what every ``fold(key)`` ends with: the arguments' conversions and the newline
    #: (equal argument bytes print alike for events with equal codes and tails)
    tail: str = "\n"

    def key(self, rec: tuple):
        return (rec[5], rec[4]) if self.is_return else rec[4]

    def __call__(self, rec: tuple) -> str:
        return self.fold(self.key(rec)) % self.unpack(rec[6])


def compile_probe_text(name: str, is_return: bool, args: Sequence,
                       symbolize: Callable[[int, bool], str | None]
                       ) -> CompiledText | None:
    """The event text of a kprobe record, ``NAME: (ip) a=… b=…\\n``, as one ``%``
    format over the record's argument bytes unpacked at once, with the probed address
    symbolized once per address.  ``None`` when an argument needs more than a number
    (strings, symbols, arrays): those records take the general path
    (:func:`~kprobefs.tracing.events.fetch.print_args`), which this matches exactly."""
    codes, texts = [], []
    for arg in args:
        program = arg.program
        ftype = program.fetch_type
        if program.count or ftype.is_string or ftype.name == "symbol" \
                or ftype.size not in _UNSIGNED_CODES:
            return None
        signed = ftype.name[0] == "s"
        codes.append((_SIGNED_CODES if signed else _UNSIGNED_CODES)[ftype.size])
        texts.append(f" {arg.name}=".replace("%", "%%")
                     + ("0x%x" if ftype.name[0] == "x" else "%d"))
    codes = "".join(codes)
    unpack = _UNPACKERS.get(codes)
    if unpack is None:
        unpack = _UNPACKERS[codes] = struct.Struct("<" + codes).unpack_from
    name = name.replace("%", "%%")
    tail = "".join(texts) + "\n"
    folded: dict = {}

    def sym(ip: int, offset: bool) -> str:
        return format_ip_sym(ip, symbolize, offset).replace("%", "%%")

    def fold(key) -> str:
        fmt = folded.get(key)
        if fmt is None:
            if is_return:
                head = f"{sym(key[0], True)} <- {sym(key[1], False)}"
            else:
                head = sym(key, True)
            fmt = folded[key] = f"{name}: ({head}){tail}"
        return fmt
    heads: dict = {}

    def head(key) -> str:
        text = heads.get(key)
        if text is None:
            fmt = fold(key)
            text = heads[key] = fmt[:len(fmt) - len(tail)] % ()
        return text

    return CompiledText(is_return, unpack, fold, head, codes, tail)


def _prefix_text(contexts: dict, suffix: str, key: tuple) -> str:
    return contexts[key] + suffix


_TS = itemgetter(0)
_PID = itemgetter(1)
_FLAGS = itemgetter(2)
_EVENT = itemgetter(3)
_ARGS = itemgetter(6)
_LINE_KEY = slice(3, 6)                   # (event, ip, return ip): a line's event text
#: the fewest records whose events are told apart by a set (fewer, as the latency
#: format and function_graph render one at a time, by their ids: without the set's
#: fixed cost)
_SET_FROM = 64


def _by_id(events: Iterable) -> dict:
    """id -> event, each event once.  Events that hash by identity (kprobe events:
    eq=False dataclasses) are told apart by a set; others need not be hashable, or
    may be equal one to another: by their ids."""
    events = list(events)
    if len(events) < _SET_FROM:
        return dict(zip(map(id, events), events))
    try:
        once = set(events)
    except TypeError:
        once = None
    if once is not None and all(kind.__hash__ is object.__hash__
                                for kind in set(map(type, once))):
        return dict(zip(map(id, once), once))
    return dict(zip(map(id, events), events))


#: The texts a line is made of in the formatter's lists of lines, one after another:
#: the context columns with the timestamp's seconds, its microseconds, the event's
#: name and address(es), the arguments (a line made whole is its last, the rest
#: empty).  The lists are joined once, into the whole text: no string a line.
LINE_TEXTS = 4


def _line_texts(count: int, *columns: Iterable[str]) -> list[str]:
    """The texts of ``count`` lines, LINE_TEXTS a line: ``columns`` (each ``count``
    long) are each line's last texts, those before them empty."""
    texts = [""] * (LINE_TEXTS * count)
    for at, column in enumerate(columns, LINE_TEXTS - len(columns)):
        texts[at::LINE_TEXTS] = column
    return texts


class KeptLines(NamedTuple):
    """What one CPU's records printed as, kept for the next read of the same buffer
    (TraceFormatter.render_runs): the key the lines were made under, the records
    (and chunks: :class:`~kprobefs.tracing.buffers.ring_buffer.Chunk`), their lines
    (LINE_TEXTS texts a line) and the lines' timestamps, and the comm each pid of them
    printed with."""

    key: object
    records: list
    lines: list
    comms: dict
    #: how many of the lines' texts, from the first, were the last call's, unchanged
    reused: int = 0
    stamps: list | None = None
    #: the lines of each item of ``records``; ``None`` when each is one record's
    counts: list | None = None


class KeptTrace(dict):
    """What reading one buffer's ``trace`` keeps for the next read: cpu ->
    :class:`KeptLines`, and ``whole``, the last merged text with the CPUs it was made
    of (TraceFormatter.render_runs)."""

    whole: tuple | None = None


def _overlap(old: list, new: list) -> int | None:
    """The index in ``old`` where ``new`` starts, when ``new`` is ``old`` (the same
    record and chunk objects) with items gone from the front and added at the back, as
    a CPU's buffer changes between reads; ``None`` otherwise."""
    if not old or not new:
        return None
    first = new[0]
    try:
        # by value for records (the timestamp first); the identity is checked below
        at = old.index(first)
    except ValueError:
        return None
    while at < len(old) and old[at] is not first:
        at += 1
        try:
            at = old.index(first, at)
        except ValueError:
            return None
    both = len(old) - at
    # map stops at old's end: both items compared, none copied
    if both == 0 or both > len(new) or not all(map(is_, islice(old, at, None), new)):
        return None
    return at


def new_text_caches(key: object, find_comm: Callable[[int], str],
                    options: TraceOptions) -> TextCaches:
    """Empty caches for TraceFormatter's texts under ``options`` (kept under ``key``)."""
    return TextCaches(key, find_comm, options.irq_info, options.context_info, flags_text)


class TraceFormatter:
    """Many records to ``trace`` lines at once.  When every event compiles its text
    (``compile(ev)``: numeric kprobe events) a line is four texts (LINE_TEXTS), each
    looked up in a dict and made only for a value not seen yet: the context columns
    with the timestamp's seconds (per context and second), the timestamp's
    microseconds (the one text made for every line), the event's name and address
    (per event and address), and the arguments' text (per argument bytes, among the
    events that unpack and print them alike).  Each step is a ``map`` or ``zip`` over
    all the records, so that Python runs only for a text not made yet; the lines'
    texts are joined once, into the whole text.  Other events take a loop over the
    records, their text ``general(record)``.

    Records the kernel recorded may come as chunks of staged bytes (RingBuffer.runs
    with ``staged``): consecutive chunks whose entries are laid out alike
    (``chunk.rows``) are read as columns from their bytes together, without record
    tuples; another chunk is decoded and formatted as records are.

    The texts looked up by value are kept in ``caches`` (text_caches.TextCaches: a
    trace array's reads share them), else the formatter's own; they hold no reference
    back to it, so the formatter's own are freed as the read ends.
    """

    def __init__(self, find_comm: Callable[[int], str], options: TraceOptions,
                 compile: Callable[[object], Callable[[tuple], str] | None],
                 caches: TextCaches | None = None):
        self._find_comm = find_comm
        self._options = options
        self._compile = compile
        self._texts: dict = {}                  # id(event) -> its text at this read
        if caches is None:
            caches = new_text_caches(None, find_comm, options)
        caches.begin(find_comm, self._texts)
        self._caches = caches
        self._contexts = caches.contexts
        self._heads = caches.heads
        self._staged_heads = caches.staged_heads
        self._bytes_texts = caches.bytes_texts
        self._event_args: dict = {}             # id(event) -> its _bytes_text, or None
        #: (space, second) -> context key -> the context columns and the timestamp up
        #: to its microseconds (_context_columns): staged entries', and records'
        self._prefixes: dict = {}
        self._record_prefixes = caches.prefixes
        self._staged_pids: set = set()          # the pids of their lines
        self._types: dict = {}                  # chunk.rows' cache of the types seen

    def render(self, pairs: Sequence[tuple[int, tuple]],
               general: Callable[[tuple], str]) -> str:
        """The lines of (cpu, record) pairs, in their order."""
        return "".join(self._lines([cpu for cpu, _rec in pairs],
                                   [rec for _cpu, rec in pairs], general))

    def render_runs(self, runs: Sequence[tuple[int, list]], general: Callable[[tuple], str],
                    kept: KeptTrace | None = None, key: object = None) -> str:
        """The lines of each CPU's records (``(cpu, records)``, each in time order;
        records and chunks, see the class), merged by timestamp, a tie going to the
        earlier run (as :meth:`RingBuffer.snapshot` merges them).

        With ``kept`` (a :class:`KeptTrace`, updated here), the lines made for a
        CPU's records at the last call are used again for the same records when
        ``key`` (whatever else the lines depend on: the options, the symbols) is equal
        and each pid's comm is still the one printed; when that is every line of the
        same CPUs (the same records: none gone, none new), the text is the last call's
        (``kept.whole``): a stopped buffer read again is neither formatted nor merged."""
        lines: list[list[str]] = []
        stamps: list[list[int]] = []
        merge = len(runs) > 1
        whole = kept is not None
        for cpu, records in runs:
            if kept is None:
                made, made_stamps, _keep, _counts = self._run_lines(cpu, records, general,
                                                                    merge)
            else:
                made, made_stamps = self._kept_lines(cpu, records, general, kept, key)
                entry = kept.get(cpu)
                whole = whole and entry is not None and entry.reused == len(made)
            lines.append(made)
            stamps.append(made_stamps)
        cpus = tuple(cpu for cpu, _records in runs)
        if whole and kept.whole is not None and kept.whole[0] == cpus:
            return kept.whole[1]
        text = merge_lines(lines, stamps, LINE_TEXTS) if merge \
            else "".join(chain.from_iterable(lines))
        if kept is not None:
            kept.whole = (cpus, text)
        return text

    def _run_lines(self, cpu: int, items: list, general: Callable[[tuple], str],
                   with_stamps: bool = True) -> tuple[list, list | None, bool, list | None]:
        """The lines of one CPU's records and chunks, in their order: (the lines, their
        timestamps (``None`` unless ``with_stamps``), whether every line is of a
        compiled event (may be kept), the lines of each item (``None`` when there is
        no chunk: one line a record))."""
        if Chunk not in set(map(type, items)):
            args = self._arg_texts(items, general)
            stamps = list(map(_TS, items)) if with_stamps else None
            return (self._lines(repeat(cpu), items, general, args, stamps), stamps,
                    args is not None, None)
        lines: list[str] = []
        stamps: list[int] = []
        counts: list[int] = []
        keep = True
        for kind, group in groupby(items, type):
            if kind is not Chunk:
                records = list(group)
                args = self._arg_texts(records, general)
                keep = keep and args is not None
                lines += self._lines(repeat(cpu), records, general, args)
                stamps += map(_TS, records)
                counts += repeat(1, len(records))
                continue
            keep = self._chunk_lines(cpu, list(group), general, lines, stamps,
                                     counts) and keep
        return lines, stamps, keep, counts

    def _chunk_lines(self, cpu: int, chunks: list, general: Callable[[tuple], str],
                     lines: list, stamps: list, counts: list) -> bool:
        """Append the lines of consecutive chunks, their timestamps and each chunk's
        count of lines; return whether every line is of a compiled event.  The chunks
        are read as columns together when their entries are all laid out alike
        (``chunk.rows``), else each on its own, or decoded."""
        def codes_of(ev):
            return self._codes_of(ev, general)
        rows = chunks[0].rows
        if len(chunks) > 1 and rows is not None \
                and all(chunk.rows == rows for chunk in chunks):
            got = rows(b"".join([chunk.data for chunk in chunks]), codes_of, self._types)
            if got is not None:
                self._staged_lines(cpu, got, lines.extend)
                stamps += got.stamps
                counts += [len(chunk.data) // got.size for chunk in chunks]
                return True
        keep = True
        for chunk in chunks:
            got = None if chunk.rows is None else chunk.rows(chunk.data, codes_of,
                                                             self._types)
            if got is None:
                records = chunk.decode(chunk.data)
                args = self._arg_texts(records, general)
                keep = keep and args is not None
                lines += self._lines(repeat(cpu), records, general, args)
                stamps += map(_TS, records)
                counts.append(len(records))
            else:
                self._staged_lines(cpu, got, lines.extend)
                stamps += got.stamps
                counts.append(len(got.stamps))
        return keep

    def _codes_of(self, ev, general: Callable[[tuple], str]) -> str | None:
        """The struct codes of ``ev``'s compiled text's arguments, ``None`` when its
        text is not compiled."""
        text = self._texts.get(id(ev))
        if text is None:
            text = self._text_of(ev, general)
        return text.codes if type(text) is CompiledText else None

    def _texts_of(self, evs: list, general: Callable[[tuple], str]) -> None:
        """Make the texts of ``evs`` at this read, each compiled, else ``general``: at
        once when each is the compiled text the caches' texts were made from."""
        compiled = list(map(self._compile, evs))
        texts = self._texts
        if None not in compiled and all(map(is_, compiled,
                                            map(self._caches.events.get, evs))):
            texts.update(zip(map(id, evs), compiled))
            return
        saw = self._caches.saw
        for ev, text in zip(evs, compiled):
            if text is None:
                text = general
            elif type(text) is CompiledText:
                saw(ev, text)
            texts[id(ev)] = text

    def _text_of(self, ev, general: Callable[[tuple], str]):
        """``ev``'s text at this read (_texts_of)."""
        self._texts_of([ev], general)
        return self._texts[id(ev)]

    def _staged_lines(self, cpu: int, got, extend: Callable[[Iterable[str]], None]
                      ) -> None:
        """Extend with the lines of staged entries read as columns (NativeRecorder._rows'
        StagedColumns: compiled events, all unpacking alike): each line's event text
        looked up by (type, ip[, return ip]), its arguments' text by their bytes, its
        context by the entry's context word."""
        if not got.stamps:
            return
        self._caches.saw_types(got.events)
        heads = self._staged_heads
        count = len(got.stamps)
        types = repeat(got.type, count) if got.types is None else got.types
        ips = repeat(got.ip, count) if got.ips is None else got.ips
        if got.ret_ips is not None:
            texts = map(heads.__getitem__, zip(types, ips, got.ret_ips))
        elif got.types is None and got.ips is None:
            # one event at one address: every line's text the same
            texts = repeat(heads[got.type, got.ip], count)
        else:
            texts = map(heads.__getitem__, zip(types, ips))
        made = {type_: self._bytes_text(self._texts[id(ev)])
                for type_, ev in got.events.items()}
        if len(set(map(id, made.values()))) == 1:
            args = map(made.popitem()[1].__getitem__, got.args)
        else:
            args = map(getitem, map(made.__getitem__, got.types), got.args)
        if not self._options.context_info:
            extend(_line_texts(count, texts, args))
            return
        prefixes, micros = self._context_columns(
            cpu, got.heads, got.stamps, partial(self._staged_context, cpu, got.split))
        extend(_line_texts(count, prefixes, micros, texts, args))

    def _staged_context(self, cpu: int, split: Callable, heads: list) -> Iterable[str]:
        """The context columns of staged entries' context words ``heads`` on ``cpu``."""
        flags, pids = split(heads)
        self._staged_pids.update(pids)
        keys = list(zip(repeat(cpu), pids, flags))
        self._contexts.make(keys)
        return map(self._contexts.__getitem__, keys)

    def _bytes_text(self, text: CompiledText) -> _Made:
        """Argument bytes (a record's or a staged entry's) -> their text, for the
        events that unpack and print their arguments as ``text`` does (equal bytes of
        events whose types differ, s32 and u32, are told apart by the codes)."""
        return bytes_text(self._bytes_texts, text)

    def _context_columns(self, space: object, keys: list, stamps: list,
                         contexts: Callable[[list], Iterable[str]] | None = None
                         ) -> tuple[list, list]:
        """Two columns of the lines of ``keys`` and ``stamps`` (in time order, mostly):
        the context columns with the timestamp up to its microseconds, made once per
        key and second, and the rest of the timestamp (the raw count unless the clock
        counts nanoseconds).  ``contexts(keys)`` gives the context columns of a list
        of keys, made for a second's new keys at once (a CPU's staged entries, whose
        contexts are thousands); without it the keys are (cpu, pid, flags), each made
        at its first line (records, whose contexts are a few: no set of the keys).
        ``space`` tells apart keys whose context differs (a context word on each
        CPU)."""
        prefixes: list = []
        micros: list = []
        if self._options.in_ns:
            ranges = second_ranges(stamps)
        else:
            ranges = [(0, len(stamps), None)]
        whole = len(ranges) == 1
        for start, end, second in ranges:
            suffix = " " if second is None else " %5d." % second
            # a staged entry's context word's columns are made at once a read; a
            # record's key's kept over reads (the caches')
            kept = self._prefixes if contexts is not None else self._record_prefixes
            made = kept.get((space, second))
            if made is None:
                made = kept[space, second] = {} if contexts is not None \
                    else _Made(partial(_prefix_text, self._contexts, suffix))
            part = keys if whole else keys[start:end]
            if contexts is not None:
                new = list(set(part).difference(made))
                if new:
                    made.update(zip(new, map(add, contexts(new), repeat(suffix))))
            prefixes += map(made.__getitem__, part)
            times = stamps if whole else stamps[start:end]
            if second is None:
                micros += map("%12d".__mod__, times)
            else:
                micros += map("%06d".__mod__, map(floordiv, map(sub, times, repeat(
                    second * _NS_PER_S - 500)), repeat(1000)))
        return prefixes, micros

    def _kept_lines(self, cpu: int, records: list, general: Callable[[tuple], str],
                    kept: dict[int, KeptLines], key: object) -> tuple[list[str], list[int]]:
        """_run_lines' lines and timestamps, taking the lines of the records (and
        chunks) ``kept[cpu]`` has too from there (made again for a pid whose comm is
        not the one printed: a record's line, or every line when the kept lines came
        from chunks); only lines of compiled events are kept (another event's text may
        depend on more than the key)."""
        last = kept.pop(cpu, None)
        find_comm = self._find_comm
        lines: list[str] = []
        stamps: list[int] = []
        counts: list[int] | None = None
        renamed: set = set()
        reused = done = 0
        if last is not None and last.key == key and last.stamps is not None:
            start = _overlap(last.records, records)
            if start is not None:
                renamed = {pid for pid, comm in last.comms.items() if find_comm(pid) != comm}
                if not renamed or last.counts is None:
                    at = start if last.counts is None else sum(last.counts[:start])
                    # last's lists are this call's to change (it is no longer kept)
                    lines, stamps = ((last.lines, last.stamps) if not at else
                                     (last.lines[at * LINE_TEXTS:], last.stamps[at:]))
                    counts = None if last.counts is None else last.counts[start:]
                    done = len(last.records) - start
                    # from the first line: none gone from the front, none made again
                    reused = 0 if start or renamed else len(lines)
                else:
                    renamed = set()
        fresh = records[done:]
        if Chunk not in set(map(type, fresh)):
            args = self._arg_texts(fresh, general)
            if args is None:
                made, made_stamps, _keep, _counts = self._run_lines(cpu, records, general)
                return made, made_stamps
            new_stamps, new_counts = list(map(_TS, fresh)), None
            new_lines = self._lines(repeat(cpu), fresh, general, args, new_stamps)
        else:
            new_lines, new_stamps, keep, new_counts = self._run_lines(cpu, fresh, general)
            if not keep:
                made, made_stamps, _keep, _counts = self._run_lines(cpu, records, general)
                return made, made_stamps
        if renamed:
            # the records of a renamed pid (saved_cmdlines changed since), made again
            again = list(compress(range(len(stamps)), map(renamed.__contains__,
                                                          map(_PID, records))))
            made = self._lines(repeat(cpu), list(map(records.__getitem__, again)), general)
            for at, start in zip(again, range(0, len(made), LINE_TEXTS)):
                lines[at * LINE_TEXTS:(at + 1) * LINE_TEXTS] = \
                    made[start:start + LINE_TEXTS]
        if counts is not None or new_counts is not None:
            counts = (counts if counts is not None else [1] * done) + (
                new_counts if new_counts is not None else [1] * len(fresh))
        if lines:
            lines += new_lines
            stamps += new_stamps
        else:
            lines, stamps = new_lines, new_stamps
        if reused and not fresh:
            comms = last.comms      # the same records, each pid's comm as printed
        else:
            # the pids of these lines only (a live trace sees ever new pids)
            pids = set(map(_PID, (item for item in records if type(item) is not Chunk))) \
                if counts is not None else set(map(_PID, records))
            pids.update(self._staged_pids)
            if counts is not None and done:
                # the pids of the chunks' lines kept: not known line by line, those of
                # the last call (a pid gone from them stays until no line is kept)
                pids.update(last.comms)
            # as printed: the comm each context was made with, else the comm now
            printed = self._contexts.comms
            known = pids.intersection(printed)
            comms = dict(zip(known, map(printed.__getitem__, known)))
            if len(known) < len(pids):
                others = pids.difference(known)
                comms.update(zip(others, map(find_comm, others)))
        kept[cpu] = KeptLines(key, records, lines, comms, reused, stamps, counts)
        return lines, stamps

    def _arg_texts(self, records: list, general: Callable[[tuple], str]) -> dict | None:
        """event -> its argument bytes' texts (_bytes_text) when every event of
        records has a compiled text (numeric kprobe events: eq=False dataclasses, so
        hashable); ``None`` otherwise.  Each event is looked at once a read."""
        events = _by_id(map(_EVENT, records))
        made = self._event_args
        new = [key for key in events if key not in made]
        if new:
            texts = self._texts
            unseen = [events[key] for key in new if key not in texts]
            if unseen:
                self._texts_of(unseen, general)
            new_texts = list(map(texts.__getitem__, new))
            if all(map(is_, map(type, new_texts), repeat(CompiledText))):
                made.update(zip(new, map(self._caches.event_args.__getitem__,
                                         map(events.__getitem__, new))))
            else:
                made.update(zip(new, [self._bytes_text(text) if type(text) is CompiledText
                                      else None for text in new_texts]))
        args = list(map(made.__getitem__, events))
        if None in args:
            return None
        return dict(zip(events.values(), args))

    def _lines(self, cpus: Iterable[int], records: list, general: Callable[[tuple], str],
               arg_texts: dict | None = None, stamps: list | None = None) -> list[str]:
        """The line of each record (on the CPU cpus gives for it), LINE_TEXTS texts a
        line; ``arg_texts`` is _arg_texts' answer for records, and ``stamps`` their
        timestamps, when known."""
        made = arg_texts or self._arg_texts(records, general)
        if made is None:
            return self._lines_one_by_one(cpus, records)
        if not records:
            return []
        if len(set(map(id, made.values()))) == 1:
            args = map(next(iter(made.values())).__getitem__, map(_ARGS, records))
        else:
            args = map(getitem, map(made.__getitem__, map(_EVENT, records)),
                       map(_ARGS, records))
        heads = map(self._heads.__getitem__, map(getitem, records, repeat(_LINE_KEY)))
        if not self._options.context_info:
            return _line_texts(len(records), heads, args)
        keys = list(zip(cpus, map(_PID, records), map(_FLAGS, records)))
        if stamps is None:
            stamps = list(map(_TS, records))
        prefixes, micros = self._context_columns(None, keys, stamps)
        return _line_texts(len(records), prefixes, micros, heads, args)

    def _context(self, cpu: int, pid: int, flags: int) -> str:
        return f"{self._find_comm(pid):>16s}-{pid:<7d} [{cpu:03d}] " + (
            flags_text(flags) if self._options.irq_info else "")

    def _stamp_format(self) -> str:
        return " %5d.%06d: " if self._options.in_ns else " %12d: "

    def _lines_one_by_one(self, cpus: Iterable[int], records: list) -> list[str]:
        options = self._options
        texts = self._texts
        if not options.context_info:
            return _line_texts(len(records), [texts[id(rec[3])](rec) for rec in records])
        in_ns = options.in_ns
        stamp = self._stamp_format()
        # (pid, cpu, flags, event) -> (the line's format before the event text, the
        # event's compiled text or None, its formats by address key or the general text)
        lines: dict = {}
        out = []
        append = out.append
        for cpu, rec in zip(cpus, records):
            key = (rec[1], cpu, rec[2], id(rec[3]))
            line = lines.get(key)
            if line is None:
                head = self._context(cpu, rec[1], rec[2]).replace("%", "%%") + stamp
                text = texts[id(rec[3])]
                line = lines[key] = ((head, text, {}) if isinstance(text, CompiledText)
                                     else (head + "%s", None, text))
            head, text, more = line
            if text is not None:
                # a compiled kprobe text: one format per address, folded into the line
                at = (rec[5], rec[4]) if text.is_return else rec[4]
                fmt = more.get(at)
                if fmt is None:
                    fmt = more[at] = head + text.fold(at)
                args = text.unpack(rec[6])
            else:
                fmt, args = head, (more(rec),)
            if in_ns:
                usecs = (rec[0] + 500) // 1000
                append(fmt % (usecs // _US_PER_S, usecs % _US_PER_S, *args))
            else:
                append(fmt % (rec[0], *args))
        return _line_texts(len(out), out)
