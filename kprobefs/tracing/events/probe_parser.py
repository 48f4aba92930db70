"""The kprobe_events / dynamic_events command parser (Linux 6.1, REFERENCE.md §2–§4).

A write is cut into lines by :func:`split_commands`; each line becomes a frozen
:class:`ProbeSpec` (define a probe) or :class:`DeleteSpec` (remove probes) through
:func:`parse_command`.  The words of a line are parsed with the grammar in
``grammar/kprobe_events.lark``; this module adds what Linux checks beyond the shape of a
word (numbers, names, flags, limits) in Linux's order, so that the first error found is
the one Linux reports, with its error_log caret (:class:`ProbeParseError`).  The fetch
arguments, the grammar and the number parsers are :mod:`probe_args`'.

Text convention: bytes written to the control file are decoded as latin-1, so one
character is one byte and caret columns are byte columns; immediate strings keep their
bytes.  Encode results back with latin-1 to recover the exact bytes.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Iterator, Sequence

from lark import Transformer

from kprobefs.errors import PROBE_ERROR_MESSAGES, ProbeParseError
from kprobefs.tracing.events.fetch import FetchProgram
# warm_up and _lark are the grammar's: the package's warm_up and tests find them here.
from kprobefs.tracing.events.probe_args import (
    _C_IDENT, _FL_FENTRY, _FL_RETURN, _U64, MAX_ARGSTR_LEN, UINT_MAX, X86_64_REGISTERS,
    FetchArgSpec, SymbolResolver, _ArgState, _kstrtoll, _kstrtouint, _kstrtoull, _lark,
    _parse, _parse_arg, _text, warm_up,
)

__all__ = [
    "SymbolResolver",
    "FetchArgSpec",
    "ProbeSpec",
    "DeleteSpec",
    "ProbeParseError",
    "split_commands",
    "split_words",
    "parse_command",
    "format_probe",
    "caret_position",
    "format_error_log_entry",
    "compare_arg_types",
    "is_same_probe",
    "parse_probe_args",
    "is_good_name",
    "is_good_system_name",
    "KPROBE_EVENT_SYSTEM",
    "MAX_TRACE_ARGS",
    "X86_64_REGISTERS",
]

KPROBE_EVENT_SYSTEM = "kprobes"      # default group
MAX_TRACE_ARGS = 128                 # args beyond this are ignored
MAX_EVENT_NAME_LEN = 64              # group/event names are at most 63 chars
KRETPROBE_MAXACTIVE_MAX = 4096
WRITE_BUFSIZE = 4096                 # the kernel consumes a write in chunks of this - 1

# The kernel's isspace(): the C locale blanks plus 0xa0 (Latin-1 NBSP).
_BLANKS = re.compile("[ \t\n\v\f\r\xa0]+")
_SYSTEM_IDENT = re.compile(r"[A-Za-z_\-][A-Za-z0-9_\-]*\Z")


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class ProbeSpec:
    """A parsed probe definition (one line of kprobe_events).

    ``symbol`` is the bare symbol (``None`` for an address probe), ``module`` the ``MOD:``
    part or ``None``; ``address`` is set only for address probes, with ``hashed_address``
    its ``%p`` rendering.  ``on_func_entry`` records whether the probe point resolved to a
    function entry when parsed (which is what makes ``$argN`` available).
    """

    kind: str                       # "kprobe" or "kretprobe"
    maxactive: int | None
    group: str
    event: str
    module: str | None
    symbol: str | None
    offset: int
    address: int | None
    is_return: bool
    args: tuple[FetchArgSpec, ...]
    hashed_address: int | None = None
    on_func_entry: bool = False

    @property
    def symbol_text(self) -> str | None:
        """Return the symbol as written (``MOD:SYM`` or ``SYM``), ``None`` for an address."""
        if self.symbol is None:
            return None
        return f"{self.module}:{self.symbol}" if self.module is not None else self.symbol

    @property
    def point(self) -> str:
        """Return the probe point as kprobe_events shows it (``SYM``, ``SYM+16``, ``0x…``)."""
        if self.symbol is None:
            return f"0x{self.hashed_address or 0:016x}"
        if self.offset:
            return f"{self.symbol_text}+{self.offset}"
        return self.symbol_text

    @cached_property
    def programs(self) -> tuple[FetchProgram, ...]:
        """Return the fetch programs of the arguments, for :func:`fetch.encode_args`."""
        return tuple(arg.program for arg in self.args)


@dataclass(frozen=True)
class DeleteSpec:
    """A delete command: ``-:[GRP/][EVENT] [POINT [NAME=ARG ...]]`` (or ``!…`` in
    dynamic_events).

    ``group`` is ``None`` to match any group; ``event`` is ``""`` to match every event of
    ``group``; ``words`` are the filter words after word 0.
    """

    group: str | None
    event: str
    words: tuple[str, ...] = ()

    def matches(self, spec: ProbeSpec) -> bool:
        """Return True when this command removes the probe ``spec`` (§2.6)."""
        if self.event and spec.event != self.event:
            return False
        if self.group is not None and spec.group != self.group:
            return False
        if not self.words:
            return True
        # Linux formats the point into a 64-byte buffer before comparing.
        if spec.point[:MAX_ARGSTR_LEN] != self.words[0]:
            return False
        wanted = self.words[1:]
        if len(wanted) > len(spec.args):
            return False
        return all(word == f"{arg.name}={arg.source}" for word, arg in zip(wanted, spec.args))


# ---------------------------------------------------------------------- line handling

def split_commands(data: bytes | str) -> Iterator[str]:
    """Yield the commands of one write(), in order, as Linux's trace_parse_run_command does.

    Lines end at ``\\n``; everything from the first ``#`` is dropped; blank lines are
    skipped.  The caller runs each command before asking for the next one and stops at the
    first failure.  Raises :class:`ProbeParseError` (EINVAL, not logged) when a line is
    longer than 4094 bytes (unless it is the last piece of the write) or contains a NUL.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    count = len(data)
    done = 0
    while done < count:
        size = min(count - done, WRITE_BUFSIZE - 1)
        chunk = data[done:done + size]
        nul = chunk.find(b"\0")
        if nul >= 0:
            chunk = chunk[:nul]        # the kernel's string functions stop at a NUL
        pos = 0
        while done < count:
            newline = chunk.find(b"\n", pos)
            if newline >= 0:
                line = chunk[pos:newline]
                consumed = newline - pos + 1
            else:
                line = chunk[pos:]
                consumed = len(line)
                if done + consumed < count:
                    if pos:
                        break          # re-read the rest of the line in a fresh chunk
                    raise ProbeParseError(None, errno.EINVAL, log=False)
            done += consumed
            pos += consumed
            hash_at = line.find(b"#")
            if hash_at >= 0:
                line = line[:hash_at]
            text = line.decode("latin-1")
            if text.strip(" \t\n\v\f\r\xa0"):
                yield text


def split_words(line: str) -> list[str]:
    """Return the words of a command as Linux's argv_split() makes them (no quoting)."""
    return [word for word in _BLANKS.split(line) if word]


# ------------------------------------------------------------------ word 0 and point

@dataclass(frozen=True, slots=True)
class _Head:
    is_return: bool
    extra: str                  # text between the letter and ':' (MAXACTIVE)
    has_name: bool              # a ':' is present
    group: str | None
    group_sep: bool
    event: str
    event_offset: int           # offset of the event text inside word 0


class _Word0(Transformer):
    def word0(self, children):
        kind, extra, name = children
        group, sep, event, event_offset = name if name is not None else (None, False, "", 0)
        return _Head(str(kind) == "r", _text(extra), name is not None, group, sep, event,
                     event_offset)

    def name_part(self, children):
        colon, spec = children
        return spec if spec is not None else (None, False, "", colon.start_pos + 1)

    def grouped_event(self, children):
        group, sep, event = children
        start = event.start_pos if event is not None else sep.start_pos + 1
        return (_text(group), True, _text(event), start)

    def plain_event(self, children):
        (event,) = children
        return (None, False, str(event), event.start_pos)


@dataclass(frozen=True, slots=True)
class _Point:
    kind: str                   # "address", "uprobe" or "symbol"
    text: str
    offset_text: str | None = None
    suffix: str | None = None
    suffix_at: int = 0


class _ProbePoint(Transformer):
    def address_point(self, children):
        return _Point("address", str(children[0]))

    def uprobe_point(self, children):
        return _Point("uprobe", str(children[0]))

    def symbol_point(self, children):
        symbol, offset, suffix = children
        return _Point("symbol", _text(symbol), None if offset is None else str(offset),
                      None if suffix is None else str(suffix),
                      suffix.start_pos if suffix is not None else 0)


# ------------------------------------------------------------------------- commands

def parse_command(line: str, symbols: SymbolResolver, *,
                  dynamic_events: bool = False) -> ProbeSpec | DeleteSpec | None:
    """Return the spec of one kprobe_events command line (comment already removed).

    Returns ``None`` for a blank line, a :class:`DeleteSpec` for ``-:…`` (and ``!…`` when
    ``dynamic_events``), else a :class:`ProbeSpec`.  Raises :class:`ProbeParseError`
    with Linux's error id, errno, word index and offset; ``cancelled`` is set when the line
    is not a kprobe command at all.
    """
    words = split_words(line)
    if not words:
        return None
    if line[:1] == "-" or (dynamic_events and line[:1] == "!"):
        return _parse_delete(words)
    return _parse_probe(words, symbols)


def _parse_delete(words: list[str]) -> DeleteSpec:
    head = words[0]
    if head[0] == "-":
        if head[1:2] != ":":
            raise ProbeParseError(None, errno.EINVAL, log=False)
        name = head[2:]
    else:
        colon = head.find(":")
        if colon < 0:
            raise ProbeParseError(None, errno.EINVAL, log=False)
        name = head[colon + 1:]
    group = None
    slash = name.find("/")
    if slash >= 0:
        group, name = name[:slash], name[slash + 1:]
    if group is None and not name:
        raise ProbeParseError(None, errno.EINVAL, log=False)
    return DeleteSpec(group, name, tuple(words[1:]))


def _word_error(error_id: str, index: int, offset: int = 0,
                err: int = errno.EINVAL) -> ProbeParseError:
    return ProbeParseError(error_id, err, index=index, offset=offset)


#: The common shape of word 0, ``p:EVENT``, ``r:GROUP/EVENT`` (plain identifiers): the
#: head is built without the grammar (a bulk write of thousands of lines spends half its
#: parsing here); anything else goes through it.  tests/test_tracer_parser_fast.py checks
#: both give the same head.
_SIMPLE_WORD0 = re.compile(r"([pr])(?::(?:([A-Za-z_][A-Za-z0-9_]*)/)?([A-Za-z_][A-Za-z0-9_]*))?")


def _parse_word0(word: str) -> _Head:
    m = _SIMPLE_WORD0.fullmatch(word)
    if m is None:
        return _parse("word0", word, _Word0())
    kind, group, event = m.groups()
    if event is None:
        return _Head(kind == "r", "", False, None, False, "", 0)
    return _Head(kind == "r", "", True, group, group is not None, event, m.start(3))


@lru_cache(maxsize=4096)
def _parse_point(start: str, word: str) -> _Point:
    """A probe point (frozen): the same point in many lines is parsed once."""
    return _parse(start, word, _ProbePoint())


def _parse_probe(words: list[str], symbols: SymbolResolver) -> ProbeSpec:
    if words[0][0] not in "pr" or len(words) < 2:
        raise ProbeParseError(None, errno.EINVAL, log=False, cancelled=True)
    head: _Head = _parse_word0(words[0])
    is_return = head.is_return

    maxactive = None
    if head.extra[:1].isdigit():
        if not is_return:
            raise _word_error("MAXACT_NO_KPROBE", 0, 1)
        if len(head.extra) > MAX_EVENT_NAME_LEN - 1:
            raise _word_error("BAD_MAXACT", 0, 1)
        maxactive = _kstrtouint(head.extra)
        if not maxactive:
            raise _word_error("BAD_MAXACT", 0, 1)
        if maxactive > KRETPROBE_MAXACTIVE_MAX:
            raise _word_error("MAXACT_TOO_BIG", 0, 1)

    point: _Point = _parse_point("probe_point", words[1])
    address = None
    if point.kind == "address":
        address = _kstrtoull(point.text)
        if address is None:         # overflow: Linux falls back to a symbol
            point = _parse_point("symbol_point", words[1])
    if point.kind == "uprobe":
        raise ProbeParseError(None, errno.EINVAL, log=False, cancelled=True)

    flags = 0
    symbol_text = None
    offset = 0
    on_func_entry = False
    if address is None:
        if point.suffix is not None:
            if point.suffix != "%return":
                raise _word_error("BAD_ADDR_SUFFIX", 1, point.suffix_at)
            is_return = True
        symbol_text = point.text
        if point.offset_text is not None:
            parsed = _kstrtoll(point.offset_text)
            if parsed is None or parsed < 0 or parsed > UINT_MAX:
                raise _word_error("BAD_PROBE_ADDR", 1)
            offset = parsed
        if is_return:
            flags |= _FL_RETURN
        entry = _on_func_entry(symbols, symbol_text, offset)
        if entry:
            flags |= _FL_FENTRY
        elif entry is False and is_return:
            raise _word_error("BAD_RETPROBE", 1)     # an unresolved symbol waits instead
        on_func_entry = bool(entry)
        if ":" not in symbol_text:
            matches = len(symbols.lookup(symbol_text))
            if matches > 1:
                raise _word_error("NON_UNIQ_SYMBOL", 1, err=errno.EADDRNOTAVAIL)
            if matches == 0:
                raise _word_error("BAD_PROBE_ADDR", 1, err=errno.ENOENT)

    group = KPROBE_EVENT_SYSTEM
    event = None
    if head.has_name:
        group, event = _parse_event_name(head, words[0])
    hashed = None
    if address is not None:
        hashed = _pointer_id(address, symbols)
    if event is None:
        letter = "r" if is_return else "p"
        if symbol_text is not None:
            event = f"{letter}_{symbol_text}_{offset}"
        else:
            event = f"{letter}_0x{hashed:016x}"
        event = (event[0] + event[1:].replace(":", "_").replace(".", "_"))
        event = event[:MAX_EVENT_NAME_LEN - 1]

    args = parse_probe_args(words[2:], symbols, flags=flags)

    module = symbol = None
    if symbol_text is not None:
        module, sep, symbol = symbol_text.partition(":")
        if not sep:
            module, symbol = None, symbol_text
    return ProbeSpec(
        kind="kretprobe" if is_return else "kprobe",
        maxactive=maxactive,
        group=group,
        event=event,
        module=module,
        symbol=symbol,
        offset=offset,
        address=address,
        is_return=is_return,
        args=args,
        hashed_address=hashed,
        on_func_entry=on_func_entry,
    )


def parse_probe_args(words: Sequence[str], symbols: SymbolResolver, *, flags: int = 0,
                     event_fields: dict | None = None) -> tuple[FetchArgSpec, ...]:
    """Return the specs of a probe's argument words (the words after its probe point,
    word index 2 on), as traceprobe_parse_probe_arg parses each.  ``event_fields``
    makes them an event probe's (TPARG_FL_TPOINT): ``$NAME`` loads that field of the
    attached event (a ``FetchEventField`` by name), ``$comm`` the comm when the event
    has no such field, no registers; a field it does not have is BAD_ATTACH_ARG at the
    start of the word.  Raises ProbeParseError with the word index set."""
    state = _ArgState(symbols, flags, fields=event_fields)
    args: list[FetchArgSpec] = []
    names: list[str] = []
    size = 0
    for position, word in enumerate(words[:MAX_TRACE_ARGS]):
        state.missing_field = False
        try:
            arg, size = _parse_arg(word, position, names, size, state)
            if state.missing_field:
                raise ProbeParseError("BAD_ATTACH_ARG", errno.ENOENT)
        except ProbeParseError as exc:
            if exc.log:
                exc.index = position + 2
            raise
        args.append(arg)
        names.append(arg.name)
    if state.deferred is not None:
        raise state.deferred
    return tuple(args)


def is_good_name(name: str) -> bool:
    """An event or argument name: a C identifier (is_good_name)."""
    return bool(_C_IDENT.match(name))


def is_good_system_name(name: str) -> bool:
    """A group name: a C identifier that may also hold '-' (is_good_system_name)."""
    return bool(_SYSTEM_IDENT.match(name))


def _on_func_entry(symbols: SymbolResolver, symbol: str, offset: int) -> bool | None:
    """Return whether SYM+OFFS is a function entry, or ``None`` if it does not resolve yet.

    Like Linux, the address is first re-based on the symbol that contains it, so
    ``SYM+size`` is the entry of the next function.
    """
    addresses = symbols.lookup(symbol) if symbol else ()
    if not addresses:
        return None
    found = symbols.find_symbol((addresses[0] + offset) & _U64)
    if found is None:
        return None
    return found[1] == 0


def _pointer_id(address: int, symbols: SymbolResolver) -> int:
    """Return what ``%p`` prints for ``address``: NULL and error pointers unhashed."""
    if address == 0 or address > _U64 - 4095:
        return address
    return symbols.hash_pointer(address) & 0xFFFFFFFF


def _parse_event_name(head: _Head, word0: str) -> tuple[str, str | None]:
    """Return (group, event or None for a generated name) from word 0's name part."""
    name_at = word0.find(":", 1) + 1
    group = KPROBE_EVENT_SYSTEM
    if head.group_sep:
        text = head.group or ""
        if not text:
            raise _word_error("NO_GROUP_NAME", 0, name_at)
        if len(text) + 1 > MAX_EVENT_NAME_LEN:
            raise _word_error("GROUP_TOO_LONG", 0, name_at)
        if not _SYSTEM_IDENT.match(text):
            raise _word_error("BAD_GROUP_NAME", 0, name_at)
        group = text
        if not head.event:
            return group, None
    event_at = head.event_offset
    if not head.event:
        raise _word_error("NO_EVENT_NAME", 0, event_at)
    if len(head.event) >= MAX_EVENT_NAME_LEN:
        raise _word_error("EVENT_TOO_LONG", 0, event_at)
    if not _C_IDENT.match(head.event):
        raise _word_error("BAD_EVENT_NAME", 0, event_at)
    return group, head.event


# -------------------------------------------------------- appending to an event (§2.5)

def compare_arg_types(existing: ProbeSpec, new: ProbeSpec) -> int:
    """Return 0 when ``new`` may join ``existing``'s event, else the 1-based index of the
    first argument whose count, name, type or array length differs (DIFF_ARG_TYPE is then
    logged at word index ``result + 1``, offset 0)."""
    if len(existing.args) != len(new.args):
        return min(len(existing.args), len(new.args)) + 1
    for index, (a, b) in enumerate(zip(existing.args, new.args), 1):
        if (a.type, a.count, a.name) != (b.type, b.count, b.name):
            return index
    return 0


def is_same_probe(existing: ProbeSpec, new: ProbeSpec) -> bool:
    """Return True when ``new`` repeats ``existing`` (SAME_PROBE): same symbol text and
    offset (address probes all count as symbol ``unknown``) and the same argument sources.
    Only meaningful once :func:`compare_arg_types` returned 0."""
    return ((existing.symbol_text or "unknown", existing.offset)
            == (new.symbol_text or "unknown", new.offset)
            and all(a.source == b.source for a, b in zip(existing.args, new.args)))


# ----------------------------------------------------------------- printing back

def format_probe(spec: ProbeSpec) -> str:
    """Return the kprobe_events read-back line of ``spec`` (§2.7), without the newline."""
    parts = ["r" if spec.is_return else "p"]
    if spec.is_return and spec.maxactive:
        parts.append(str(spec.maxactive))
    parts.append(f":{spec.group}/{spec.event} {spec.point}")
    parts.extend(f" {arg.name}={arg.source}" for arg in spec.args)
    return "".join(parts)


def caret_position(words: Sequence[str], index: int, offset: int) -> int:
    """Return the caret column of an error at ``offset`` in word ``index`` (§4.2).

    An index past the last word puts the caret one blank after the command.
    """
    if index >= len(words):
        return sum(len(word) + 1 for word in words) & 0xFFFF
    return (sum(len(word) + 1 for word in words[:index]) + offset) & 0xFFFF


def format_error_log_entry(timestamp_ns: int, loc: str, command_words: Sequence[str],
                           err: ProbeParseError) -> str:
    """Return the three error_log lines (newline-terminated) of a logged error (§4.1)."""
    seconds, nanoseconds = divmod(timestamp_ns, 1_000_000_000)
    message = PROBE_ERROR_MESSAGES.get(err.error_id, "") if err.error_id else ""
    pos = caret_position(command_words, err.index, err.offset)
    return (f"[{seconds:5d}.{nanoseconds // 1000:06d}] {loc}: error: {message}\n"
            f"  Command: {' '.join(command_words)}\n"
            f"{' ' * (11 + pos)}^\n")
