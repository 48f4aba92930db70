"""Text of the ``trace`` and ``trace_pipe`` files (REFERENCE.md §6.1).

Records are tuples written by the probe-hit path (see :mod:`kprobefs.tracing.events`);
this module turns them into Linux 6.1's lines: the context columns
(``comm-pid [cpu] flags timestamp: ``) then the event text.  Nothing here runs on the
hit path.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

__all__ = [
    "TraceOptions",
    "format_header",
    "format_context",
    "format_timestamp",
    "format_ip_sym",
    "flags_text",
    "CommCache",
    "FLAGS_NONE",
    "FLAGS_INT3",
    "SAVED_CMDLINES",
]

SAVED_CMDLINES = 128               # the kernel's default saved_cmdlines_size

# Context flags of a record, as (irqs-off, need-resched, hard/soft irq, preempt depth,
# migrate-disable) characters.  An int3 hit runs with interrupts off in an NMI-like trap.
FLAGS_NONE = 0
FLAGS_INT3 = 1
_FLAG_TEXT = {FLAGS_NONE: ".....", FLAGS_INT3: "d.Z.."}


def flags_text(flags: int) -> str:
    return _FLAG_TEXT.get(flags, ".....")


class TraceOptions(NamedTuple):
    """The output-affecting options, read once per open file."""

    context_info: bool = True
    irq_info: bool = True
    sym_offset: bool = False
    sym_addr: bool = False
    in_ns: bool = True            # the clock counts nanoseconds


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

    def save(self, pid: int, comm: str) -> None:
        names = self.names
        if pid in names:
            del names[pid]
        elif len(names) > self.size:
            oldest = next(iter(k for k in names if k != 0))
            del names[oldest]
        names[pid] = comm
        self.stale.discard(pid)

    def needs(self, pid: int) -> bool:
        """Return True when ``pid``'s comm should be (re)read."""
        return pid not in self.names or pid in self.stale

    def find(self, pid: int) -> str:
        return self.names.get(pid, "<...>")

    def saved_cmdlines(self) -> str:
        """``saved_cmdlines``: ``<pid> <comm>`` per saved task, oldest first (the idle
        task is never saved)."""
        return "".join(f"{pid} {comm}\n" for pid, comm in self.names.items() if pid)

    def resize(self, size: int) -> None:
        """``saved_cmdlines_size``: a new table of ``size`` entries; as in 6.1 the new
        table starts empty (the names saved so far are gone).  The dict and set are
        emptied in place: recorders hold them."""
        self.size = size
        self.names.clear()
        self.names[0] = "<idle>"
        self.stale.clear()

    def forget(self, pid: int) -> None:
        """Mark ``pid`` for a re-read (its task exited; the pid may come back)."""
        if pid:
            self.stale.add(pid)
