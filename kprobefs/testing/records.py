"""Trace records to assert on: ``trace``/``trace_pipe`` text and ``trace_pipe_raw`` pages
turned into :class:`Record` objects.

The text forms read are those Linux 6.1's default options print (and kprobefs prints):

- an event line, ``COMM-PID [CPU] FLAGS TIMESTAMP: NAME: BODY`` (also without the flags
  column, ``options/irq-info`` off, and with a ``(TGID)`` column, ``record-tgid`` on),
  where BODY is a kprobe's ``(SYM+OFF/SIZE) ARGS``, a return probe's ``(RET <- FUNC)
  ARGS``, or an event's print fmt output of ``name=value`` pairs;
- a system call event's line, which has no ``NAME: ``: ``sys_NAME(ARG: HEX, ...)``
  (the event ``sys_enter_NAME``) or ``sys_NAME -> 0xRET`` (``sys_exit_NAME``);
- the ``function`` tracer's ``FUNC <-PARENT``;
- a ``print`` record (``trace_marker``, ``trace_printk``): ``SYM: TEXT``;
- a ``<stack trace>`` and its ``=> FUNC`` lines;
- the ``function_graph`` tracer's columns (``CPU)``, and with its options the absolute
  time and ``COMM-PID``), its ``func() {``, ``func();`` and ``}`` lines, and other
  records shown in it as ``/* ... */``.

A field's value is typed as the event's ``format`` file says (see
:class:`~kprobefs.testing.formats.FormatField`) when the reader knows the formats, which a
:class:`TraceReader` over a tracing directory does; :func:`parse_trace` without formats
gives integers where the text is one and strings elsewhere.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Iterator, Mapping

from .formats import EventFormat, PageLayout, parse_format, parse_page_layout

__all__ = ["Record", "TraceReader", "parse_trace", "parse_line", "decode_page",
           "canonical"]

FormatLookup = Callable[[str], "EventFormat | None"]

_HEAD = re.compile(
    r"^\s*(?P<comm>.*?)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>[-\d]+)\)\s+)?"
    r"\[(?P<cpu>\d+)\]\s+(?:(?P<flags>\S{4,6})\s+)?(?P<ts>\d+(?:\.\d+)?):\s(?P<body>.*)$")
_GRAPH = re.compile(
    r"^\s*(?:(?P<ts>\d+\.\d+)\s+\|\s+)?(?P<cpu>\d+)\)\s+"
    r"(?:(?P<comm>\S.*?)-(?P<pid>\d+)\s+\|\s+)?"
    r"(?P<duration>[+!#*@$]?\s*\d+\.\d+ us)?\s*\|(?P<body>.*)$")
#: function_graph's task-switch block: a dashed line around " CPU) comm-pid => comm-pid".
_GRAPH_SWITCH = re.compile(r"^\s*(?:-{20,}|\d+\)\s+\S.*?\s=>\s+\S.*?)\s*$")
_NAMED = re.compile(r"^(?P<name>[\w.]+): (?P<rest>.*)$", re.S)
_FUNCTION = re.compile(r"^(?P<ip>\S+) <-(?P<parent>\S+)$")
_KEY = re.compile(r"(?:^|(?<=\s))(?P<key>\w+)=")
_SYS_ENTER = re.compile(r"^sys_(?P<call>\w+)\((?P<args>.*)\)$", re.S)
_SYS_EXIT = re.compile(r"^sys_(?P<call>\w+) -> (?P<ret>\S+)$")
_PROBE_AT = re.compile(r"^\((?P<at>[^)]*)\)\s?(?P<args>.*)$", re.S)


@dataclass(frozen=True)
class Record:
    """One trace record.  ``timestamp`` is in seconds as ``trace`` prints it (for the
    counting clocks, the count), None where the text has none (``function_graph``
    without ``funcgraph-abstime``); ``comm`` and ``pid`` are None where the line shows
    no task (``function_graph`` without ``funcgraph-proc``), and a raw record's ``comm``
    is the one ``saved_cmdlines`` gives.  ``fields`` are the event's own fields by name,
    typed as its format says; ``line`` is the text the record was read from (None for a
    raw record)."""

    comm: str | None
    pid: int | None
    cpu: int | None
    timestamp: float | None
    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    flags: str | None = None
    line: str | None = field(default=None, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))

    def __hash__(self) -> int:
        return hash((self.timestamp,) + self.as_tuple())

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.fields.get(name, default)

    def matches(self, event: str | None = None, comm: str | None = None,
                pid: int | None = None, **fields: Any) -> bool:
        """Whether the record is of ``event`` (when given), by ``comm``/``pid`` (when
        given), and has each of ``fields`` with that value."""
        if event is not None and self.event != event:
            return False
        if comm is not None and self.comm != comm:
            return False
        if pid is not None and self.pid != pid:
            return False
        return all(self.fields.get(k, _MISSING) == v for k, v in fields.items())

    def as_tuple(self) -> tuple:
        """The record without its timestamp and line, as plain data (what
        :func:`canonical` compares)."""
        return (self.comm, self.pid, self.cpu, self.event, self.flags,
                tuple(sorted((k, _plain(v)) for k, v in self.fields.items())))


_MISSING = object()


def _plain(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def canonical(records: Iterable[Record], cpus: bool = True) -> list[tuple]:
    """The records as plain tuples without timestamps, with every pid (the records'
    own and those in fields named ``pid``/``*_pid``) renumbered in order of first
    appearance, 0 (the idle task) kept: host processes get their pids from the host, so
    two runs of one test compare equal this way when they did the same things in the
    same order (see docs/testing-your-code.md, "What is deterministic").  With
    ``cpus=False`` the CPU is left out too (None): with more than one CPU, which one
    serves a task depends on timing."""
    numbers: dict[int, int] = {0: 0}

    def number(pid: Any) -> Any:
        if not isinstance(pid, int) or pid < 0:
            return pid
        if pid not in numbers:
            numbers[pid] = len(numbers)
        return numbers[pid]

    out = []
    for r in records:
        fields = {k: (number(v) if k == "pid" or k.endswith("_pid") else v)
                  for k, v in r.fields.items()}
        out.append(replace(r, pid=number(r.pid), timestamp=None, fields=fields,
                           cpu=r.cpu if cpus else None).as_tuple())
    return out


# ==== text =================================================================================
def parse_trace(text: str, formats: FormatLookup | None = None) -> list[Record]:
    """The records of a ``trace`` or ``trace_pipe`` text (``#`` lines skipped; a line
    that starts no record continues the previous one, as a string with a newline
    does).  ``formats(name)`` gives an event's format (or None) to type its fields."""
    return list(_iter_records(text.split("\n"), formats))


def parse_line(line: str, formats: FormatLookup | None = None) -> Record | None:
    """The record of one line, or None when the line is not one (a header, a
    continuation, a blank)."""
    if line.startswith("#"):
        return None
    return _start_record(line, formats)


def _iter_records(lines: Iterable[str], formats: FormatLookup | None) -> Iterator[Record]:
    pending: list[str] = []
    for line in lines:
        if line.startswith("#") and not pending:
            continue
        switch = _GRAPH_SWITCH.match(line)
        if switch or _HEAD.match(line) or _GRAPH.match(line):
            if pending:
                record = _start_record("\n".join(pending).rstrip("\n"), formats)
                if record is not None:
                    yield record
            pending = [] if switch else [line]
        elif pending:
            pending.append(line)
    if pending:
        record = _start_record("\n".join(pending).rstrip("\n"), formats)
        if record is not None:
            yield record


def _start_record(text: str, formats: FormatLookup | None) -> Record | None:
    first, newline, more = text.partition("\n")
    m = _HEAD.match(first)
    if m:
        event, fields = _parse_body(m["body"] + newline + more, formats)
        return Record(m["comm"].strip(), int(m["pid"]), int(m["cpu"]), float(m["ts"]),
                      event, fields, m["flags"], text)
    g = _GRAPH.match(first)
    if g:
        return _graph_record(g, newline + more, formats, text)
    return None


def _parse_body(body: str, formats: FormatLookup | None) -> tuple[str, dict]:
    """The event's name and fields of a record's text after the timestamp."""
    if body.startswith("<stack trace>") or body.startswith("<user stack trace>"):
        frames = [ln.strip()[3:] for ln in body.split("\n")[1:] if ln.strip().startswith("=>")]
        kind = "user_stack" if body.startswith("<user") else "kernel_stack"
        return kind, {"caller": frames}
    syscall = _syscall_event(body, formats)
    if syscall is not None:
        return syscall
    named = _NAMED.match(body)
    fmt = formats(named["name"]) if named and formats is not None else None
    if named and (fmt is not None or formats is None):
        return named["name"], _event_fields(named["rest"], fmt)
    fm = _FUNCTION.match(body)
    if fm:
        return "function", {"ip": fm["ip"], "parent_ip": fm["parent"]}
    if named:                       # not an event: trace_marker's or trace_printk's text
        return "print", {"ip": named["name"], "buf": named["rest"]}
    return "print", {"ip": None, "buf": body}


def _syscall_event(body: str, formats: FormatLookup | None) -> tuple[str, dict] | None:
    """A system call event's name and fields from its line (6.1's print_syscall_enter
    and print_syscall_exit print no event name), or None when the body is not one
    (with formats: there is no such event)."""
    enter, leave = _SYS_ENTER.match(body), _SYS_EXIT.match(body)
    if not (enter or leave):
        return None
    name = f"sys_enter_{enter['call']}" if enter else f"sys_exit_{leave['call']}"
    fmt = formats(name) if formats is not None else None
    if formats is not None and _has(fmt, "__syscall_nr") is not True:
        return None
    if leave:
        return name, {"ret": _typed(fmt, "ret", leave["ret"])}
    fields: dict[str, Any] = {}
    for arg in _split_args(enter["args"]):
        key, _, value = arg.partition(": ")
        fields[key.strip()] = _typed(fmt, key.strip(), value, hex_ints=True)
    return name, fields


def _has(fmt: EventFormat | None, field: str) -> bool | None:
    """Whether the event's format has the field; None when there is no format."""
    return None if fmt is None else fmt.field(field) is not None


def _event_fields(rest: str, fmt: EventFormat | None) -> dict[str, Any]:
    """An event's fields from its text after ``NAME: ``: by the format's fields when
    there is one (a kprobe has ``__probe_ip``, a return probe ``__probe_func``), by
    the text's shape otherwise."""
    fields: dict[str, Any] = {}
    at = _PROBE_AT.match(rest)
    location = at["at"] if at else ""
    if at and _has(fmt, "__probe_func") in (True, None) and " <- " in location:
        ret_ip, _, func = location.partition(" <- ")
        fields["__probe_ret_ip"], fields["__probe_func"] = ret_ip, func
        rest = at["args"]
    elif at and _has(fmt, "__probe_ip") in (True, None):
        fields["__probe_ip"] = location
        rest = at["args"]
    names = [f.name for f in fmt.fields] if fmt is not None else None
    for key, value in _pairs(rest, names):
        fields[key] = _typed(fmt, key, value)
    return fields


def _split_args(args: str) -> list[str]:
    return [a for a in re.split(r",\s(?=\w+: )", args) if a]


def _pairs(text: str, names: list[str] | None) -> list[tuple[str, str]]:
    """``name=value`` pairs in order; with the format's field names only those count as
    keys, so a string value with ``=`` or spaces in it stays whole when quoted."""
    starts = []
    for m in _KEY.finditer(text):
        if names is None or m["key"] in names:
            starts.append(m)
    out = []
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        raw = text[m.end():end].rstrip()
        if raw.startswith('"') and '"' in raw[1:]:
            raw = raw[:raw.rindex('"') + 1]
        elif raw:
            raw = raw.split()[0]
        out.append((m["key"], raw))
    return out


def _typed(fmt: EventFormat | None, name: str, text: str, hex_ints: bool = False) -> Any:
    text = text.strip()
    f = fmt.field(name) if fmt is not None else None
    if hex_ints and (f is None or not f.is_string):
        try:
            return int(text, 16)
        except ValueError:
            return text
    if f is not None:
        return f.value_from_text(text)
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    try:
        return int(text, 0)
    except ValueError:
        return text


def _graph_record(g: re.Match, more: str, formats: FormatLookup | None,
                  text: str) -> Record | None:
    body = g["body"] + more
    code = body.lstrip(" ")
    depth = max(0, (len(body) - len(code) - 2) // 2)
    duration = _duration(g["duration"])
    ts = float(g["ts"]) if g["ts"] else None
    comm = g["comm"].strip() if g["comm"] else None
    pid = int(g["pid"]) if g["pid"] else None
    cpu = int(g["cpu"])
    if code.startswith("/*") and code.rstrip().endswith("*/"):
        event, fields = _parse_body(code.strip()[2:-2].strip(), formats)
        return Record(comm, pid, cpu, ts, event, fields, None, text)
    if code.endswith(") {"):
        return Record(comm, pid, cpu, ts, "funcgraph_entry",
                      {"func": code[:-4], "depth": depth, "duration": None,
                       "leaf": False}, None, text)
    if code.endswith(");"):
        return Record(comm, pid, cpu, ts, "funcgraph_entry",
                      {"func": code[:-3], "depth": depth, "duration": duration,
                       "leaf": True}, None, text)
    if code.startswith("}"):
        tail = re.search(r"/\*\s*(\S+)\s*\*/", code)
        return Record(comm, pid, cpu, ts, "funcgraph_exit",
                      {"func": tail[1] if tail else None, "depth": depth,
                       "duration": duration}, None, text)
    return None


def _duration(text: str | None) -> float | None:
    if not text:
        return None
    return float(text.strip("+!#*@$ ").split()[0])


# ==== binary ===============================================================================
_COMMIT_MASK = (1 << 30) - 1


def decode_page(page: bytes, layout: PageLayout, cpu: int,
                formats_by_id: Callable[[int], EventFormat | None],
                comms: Mapping[int, str] | None = None) -> list[Record]:
    """The records of one ``trace_pipe_raw`` page of ``cpu``.  ``formats_by_id(id)``
    gives the format of the event whose ``common_type`` is id; a record of an unknown
    id becomes event ``"<id N>"`` with no fields.  Timestamps are the clock's
    nanoseconds over 1e9, as ``trace`` prints them."""
    ts_off, ts_size = layout.timestamp
    c_off, c_size = layout.commit
    now = int.from_bytes(page[ts_off:ts_off + ts_size], "little")
    commit = int.from_bytes(page[c_off:c_off + c_size], "little")
    size = commit & _COMMIT_MASK        # bits 31 and 30 flag lost events
    data = page[layout.data[0]:layout.data[0] + size]
    records, pos = [], 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        type_len, delta = word & 31, word >> 5
        pos += 4
        if type_len == layout.padding:
            if delta == 0:
                break                                   # the rest of the page is unused
            (length,) = struct.unpack_from("<I", data, pos)
            pos += length
            now += delta
            continue
        if type_len == layout.time_extend:
            (high,) = struct.unpack_from("<I", data, pos)
            now += (high << 27) + delta
            pos += 4
            continue
        if type_len == layout.time_stamp:
            (high,) = struct.unpack_from("<I", data, pos)
            now = (high << 27) | delta
            pos += 4
            continue
        if type_len == 0:
            (length,) = struct.unpack_from("<I", data, pos)
            length -= 4
            pos += 4
        else:
            length = type_len * 4
        now += delta
        body = data[pos:pos + length]
        pos += length
        ident = int.from_bytes(body[:2], "little")
        fmt = formats_by_id(ident)
        pid = int.from_bytes(body[4:8], "little", signed=True)
        comm = (comms or {}).get(pid, "<idle>" if pid == 0 else None)
        if fmt is None:
            records.append(Record(comm, pid, cpu, now / 1e9, f"<id {ident}>", {}))
        else:
            records.append(Record(comm, pid, cpu, now / 1e9, fmt.name, fmt.decode(body)))
    return records


# ==== files ================================================================================
class TraceReader:
    """Reads records from a tracing directory (``MNT/tracing``, or an instance's
    directory): ``trace`` and ``trace_pipe`` text typed by the events' ``format`` files,
    and ``per_cpu/cpuN/trace_pipe_raw`` pages.  Formats are read once per event and
    read again when an event is not known yet (a probe defined since)."""

    PAGE_SIZE = 4096

    def __init__(self, tracing: str | os.PathLike):
        self.tracing = Path(tracing)
        self._top = self._top_level(self.tracing)
        self._by_name: dict[str, EventFormat] = {}
        self._by_id: dict[int, EventFormat] = {}
        self._listed: set[str] = set()
        self._not_events: set[str] = set()

    @staticmethod
    def _top_level(path: Path) -> Path:
        """The top-level tracing directory: an instance's events are the top level's."""
        return path.parent.parent if path.parent.name == "instances" else path

    # -- formats
    def format(self, name: str) -> EventFormat | None:
        """The format of the event called ``name`` (``SYSTEM:NAME`` also), or None.  A
        name found to be no event is not looked up again until the next ``parse``."""
        key = name.split(":")[-1]
        if key not in self._by_name and key not in self._not_events:
            self._load(name)
            if key not in self._by_name:
                self._not_events.add(key)
        return self._by_name.get(key)

    def format_by_id(self, ident: int) -> EventFormat | None:
        if ident not in self._by_id:
            self._load_all()
        return self._by_id.get(ident)

    def _load(self, name: str) -> None:
        system, _, event = name.rpartition(":")
        candidates = [f"{system}/{event}"] if system else [
            entry.replace(":", "/") for entry in self._available()
            if entry.split(":")[-1] == event]
        if not system and event in ("print", "function", "funcgraph_entry",
                                    "funcgraph_exit", "kernel_stack", "bprint", "bputs"):
            candidates.append(f"ftrace/{event}")
        for rel in candidates:
            self._read_format(rel)

    def _available(self) -> list[str]:
        text = _read_text(self._top / "available_events")
        return text.split()

    def _load_all(self) -> None:
        for entry in self._available():
            if entry not in self._listed:
                self._read_format(entry.replace(":", "/"))
                self._listed.add(entry)
        for event in ("print", "function", "funcgraph_entry", "funcgraph_exit",
                      "kernel_stack", "bprint", "bputs", "user_stack", "raw_data"):
            if event not in self._by_name:
                self._read_format(f"ftrace/{event}")

    def _read_format(self, rel: str) -> None:
        try:
            text = _read_text(self._top / "events" / rel / "format")
        except OSError:
            return
        fmt = parse_format(text, rel.split("/")[0])
        self._by_name[fmt.name] = fmt
        self._by_id[fmt.id] = fmt

    def _text_format(self, name: str) -> EventFormat | None:
        # ftrace's own print record is shown as "SYM: TEXT", which is not an event name.
        return None if name in ("print", "bprint", "bputs") else self.format(name)

    # -- text
    def parse(self, text: str) -> list[Record]:
        """The records of a ``trace``/``trace_pipe`` text, typed by this directory's
        formats."""
        self._not_events.clear()        # an event defined since may have that name
        return parse_trace(text, self._text_format)

    def trace(self) -> list[Record]:
        """The records in ``trace`` now (the buffer is not consumed)."""
        return self.parse(_read_text(self.tracing / "trace"))

    # -- binary
    def page_layout(self) -> PageLayout:
        events = self._top / "events"
        return parse_page_layout(_read_text(events / "header_page"),
                                 _read_text(events / "header_event"))

    def comms(self) -> dict[int, str]:
        """pid -> comm from ``saved_cmdlines``."""
        out = {}
        for line in _read_text(self._top / "saved_cmdlines").splitlines():
            pid, _, comm = line.partition(" ")
            if pid.isdigit():
                out[int(pid)] = comm
        return out

    def raw(self, cpus: Iterable[int] | None = None) -> list[Record]:
        """Every record ``per_cpu/cpuN/trace_pipe_raw`` holds now, for each CPU (all by
        default), consumed as a reader of that file consumes them, in timestamp order."""
        layout = self.page_layout()
        if cpus is None:
            cpus = sorted(int(p.name[3:]) for p in (self.tracing / "per_cpu").iterdir()
                          if p.name[3:].isdigit())
        pages = [(cpu, page) for cpu in cpus for page in self._raw_pages(cpu)]
        comms = self.comms() if pages else {}
        records = [r for cpu, page in pages
                   for r in decode_page(page, layout, cpu, self.format_by_id, comms)]
        records.sort(key=lambda r: r.timestamp)
        return records

    def _raw_pages(self, cpu: int) -> list[bytes]:
        path = self.tracing / "per_cpu" / f"cpu{cpu}" / "trace_pipe_raw"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        pages = []
        try:
            while True:
                try:
                    page = os.read(fd, self.PAGE_SIZE)
                except BlockingIOError:
                    break
                if not page:
                    break
                pages.append(page)
        finally:
            os.close(fd)
        return pages


def _read_text(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")

