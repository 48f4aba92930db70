"""The kprobe_events / dynamic_events command parser (Linux 6.1, REFERENCE.md §2–§4).

A write is cut into lines by :func:`split_commands`; each line becomes a frozen
:class:`ProbeSpec` (define a probe) or :class:`DeleteSpec` (remove probes) through
:func:`parse_command`.  The words of a line are parsed with the grammar in
``grammar/kprobe_events.lark``; this module adds what Linux checks beyond the shape of a
word (numbers, names, flags, limits) in Linux's order, so that the first error found is
the one Linux reports, with its error_log caret (:class:`ProbeParseError`).

Text convention: bytes written to the control file are decoded as latin-1, so one
character is one byte and caret columns are byte columns; immediate strings keep their
bytes.  Encode results back with latin-1 to recover the exact bytes.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources
from pathlib import Path
from typing import Iterator, Protocol, Sequence

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from kprobefs.errors import PROBE_ERROR_MESSAGES, ProbeParseError
from kprobefs.tracing.events import fetch as _fetch
from kprobefs.tracing.events.fetch import (
    Deref,
    FetchArg,
    FetchComm,
    FetchData,
    FetchEventField,
    FetchImm,
    FetchProgram,
    FetchReg,
    FetchRetIP,
    FetchRetval,
    FetchStack,
    FetchStackPointer,
    FetchSymbol,
    FetchType,
    compile_fetch_program,
    find_fetch_type,
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
MAX_ARGSTR_LEN = 63                  # longest argument body
MAX_ARG_NAME_LEN = 32
MAX_ARRAY_LEN = 64
MAX_PROBE_EVENT_SIZE = 3072          # fixed argument storage
KRETPROBE_MAXACTIVE_MAX = 4096
PARAM_MAX_STACK = 16 * 1024 // 8     # THREAD_SIZE / sizeof(unsigned long)
WRITE_BUFSIZE = 4096                 # the kernel consumes a write in chunks of this - 1
UINT_MAX = (1 << 32) - 1
_U64 = (1 << 64) - 1

# pt_regs names accepted after '%' on x86_64, in regoffset_table order.
X86_64_REGISTERS = ("r15", "r14", "r13", "r12", "r11", "r10", "r9", "r8", "bx", "cx", "dx",
                    "si", "di", "bp", "ax", "orig_ax", "ip", "cs", "flags", "sp", "ss")
_REGISTERS = frozenset(X86_64_REGISTERS)

_RESERVED_FIELD_NAMES = frozenset((
    "common_type", "common_flags", "common_preempt_count", "common_pid", "common_tgid",
    "__probe_ip", "__probe_ret_ip", "__probe_func"))

# The kernel's isspace(): the C locale blanks plus 0xa0 (Latin-1 NBSP).
_BLANKS = re.compile("[ \t\n\v\f\r\xa0]+")
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SYSTEM_IDENT = re.compile(r"[A-Za-z_\-][A-Za-z0-9_\-]*\Z")


class SymbolResolver(Protocol):
    """The symbol table the parser consults (kallsyms of the emulated kernel)."""

    def lookup(self, name: str) -> Sequence[int]:
        """Return every address whose symbol is exactly ``name`` (kernel and modules).

        ``name`` may be ``MOD:SYM`` (only that module).  The first address is the one
        ``kallsyms_lookup_name`` would return.
        """

    def find_symbol(self, addr: int) -> tuple[str, int, int] | None:
        """Return (name, offset into it, size) of the symbol containing ``addr``, or ``None``."""

    def hash_pointer(self, addr: int) -> int:
        """Return the per-boot ``%p`` hash of ``addr`` (the low 32 bits are used)."""


# --------------------------------------------------------------------------- specs

@dataclass(frozen=True)
class FetchArgSpec:
    """One fetch argument of a probe.

    ``source`` is the text after ``NAME=`` exactly as written (printed back and compared by
    SAME_PROBE), ``type`` the resolved fetch type name (a bitfield resolves to its
    ``u<C>`` container, ``$comm`` to ``string``), ``count`` the array length (0 = scalar).
    """

    name: str
    source: str
    type: str
    count: int
    program: FetchProgram

    @property
    def fetch_type(self) -> FetchType:
        """Return the :class:`FetchType` row of this argument."""
        return self.program.fetch_type


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


# ------------------------------------------------------------------------- numbers

_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = {8: frozenset("01234567"), 10: frozenset("0123456789"), 16: _HEX}


def _kstrtoull(text: str, base: int = 0) -> int | None:
    """Return ``text`` as Linux kstrtoull parses it (one leading '+'), or ``None``."""
    if text.startswith("+"):
        text = text[1:]
    return _parse_unsigned(text, base)


def _parse_unsigned(text: str, base: int) -> int | None:
    if base == 0:
        if text[:1] == "0":
            base = 16 if text[1:2] in ("x", "X") and text[2:3] in _HEX else 8
        else:
            base = 10
    if base == 16 and text[:2] in ("0x", "0X"):
        text = text[2:]
    if text.endswith("\n"):
        text = text[:-1]
    if not text or any(c not in _DIGITS[base] for c in text):
        return None
    value = int(text, base)
    return value if value <= _U64 else None


def _kstrtoll(text: str, base: int = 0) -> int | None:
    """Return ``text`` as Linux kstrtoll/kstrtol parses it, or ``None``."""
    if text.startswith("-"):
        value = _parse_unsigned(text[1:], base)
        if value is None or value > 1 << 63:
            return None
        return -value
    value = _kstrtoull(text, base)
    if value is None or value >= 1 << 63:
        return None
    return value


def _kstrtouint(text: str, base: int = 0) -> int | None:
    value = _kstrtoull(text, base)
    return value if value is not None and value <= UINT_MAX else None


# --------------------------------------------------------------------- the grammar

def _grammar_text() -> str:
    try:
        return (resources.files("kprobefs.grammar") / "kprobe_events.lark").read_text()
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        path = Path(__file__).resolve().parents[3] / "grammar" / "kprobe_events.lark"
        return path.read_text()


_START_RULES = ["word0", "probe_point", "symbol_point", "arg_word", "arg_body", "type_name",
                "fetcharg"]


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(_grammar_text(), parser="lalr", lexer="contextual", start=_START_RULES,
                maybe_placeholders=True)


#: One text per start rule that walks the lexer states a common command meets.
_WARM_TEXTS = (("word0", "r9:group/event"), ("probe_point", "vfs_read+4"),
               ("probe_point", "0xffffffff81000000"), ("arg_word", "a=+8(%di):u32"),
               ("arg_body", "+8(%di):u32[2]"), ("type_name", "b4@2/32"),
               ("fetcharg", "+8(%di)"), ("fetcharg", "$retval"), ("fetcharg", "%ax"))


def warm_up() -> None:
    """Builds the grammar and its lexers now (about 50 ms), for a long-running process
    whose first command should not pay for them: lark compiles each lexer state's
    patterns the first time a text reaches it."""
    for start, text in _WARM_TEXTS:
        _lark().parse(text, start=start)


def _parse(start: str, text: str, transformer: Transformer | None = None):
    """Return the tree of ``text`` for rule ``start``, transformed when asked.

    ProbeParseErrors raised inside a transformer arrive wrapped in lark's VisitError;
    they are unwrapped here, the one place lark's exceptions are seen.
    """
    tree = _lark().parse(text, start=start)
    if transformer is None:
        return tree
    try:
        return transformer.transform(tree)
    except VisitError as exc:
        raise exc.orig_exc from None


def _to_bytes(text: str) -> bytes:
    """Return the bytes of command text (latin-1; other characters as UTF-8)."""
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


def _text(token: Token | None) -> str:
    return str(token) if token is not None else ""


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


# --------------------------------------------------------------------- fetch args

# Fetch flags, as Linux's TPARG_FL_*: what the probe point allows.
_FL_RETURN = 1
_FL_FENTRY = 4


@dataclass
class _ArgState:
    """What parsing one command's args shares: the symbol table and deferred failures.
    ``fields`` is set for an event probe (Linux's TPARG_FL_TPOINT): the attached
    event's fields by name, what a ``$NAME`` loads; ``missing_field`` is set when the
    argument being parsed names one the event does not have."""

    symbols: SymbolResolver
    flags: int
    deferred: ProbeParseError | None = None
    fields: dict | None = None
    missing_field: bool = False


class _FetchArg(Transformer):
    """Turns a ``fetcharg`` tree into ``[(insn, overflow offset), ...]``, innermost first.

    ``base`` is where the fetcharg text starts in its word, so every error offset is a word
    column.
    """

    def __init__(self, base: int, state: _ArgState):
        super().__init__()
        self.base = base
        self.state = state

    def _error(self, error_id: str, offset: int) -> ProbeParseError:
        return ProbeParseError(error_id, errno.EINVAL, offset=self.base + offset)

    def var(self, children):
        name = _text(children[1])
        flags = self.state.flags
        fields = self.state.fields
        if fields is not None:
            # an event probe's $NAME is a field of the attached event, else its comm
            insn = fields.get(name)
            if insn is None and name in ("comm", "COMM"):
                insn = FetchComm()
            if insn is None:
                self.state.missing_field = True
                insn = FetchEventField(name, 0, 8)
            return [(insn, self.base)]
        if name == "retval":
            if not flags & _FL_RETURN:
                raise self._error("RETVAL_ON_PROBE", 0)
            return [(FetchRetval(), self.base)]
        if name.startswith("stack"):
            rest = name[5:]
            if not rest:
                return [(FetchStackPointer(), self.base)]
            if rest[0].isdigit():
                index = _kstrtoull(rest, 10)
                if index is None:
                    raise self._error("BAD_VAR", 0)
                if index > PARAM_MAX_STACK:
                    raise self._error("BAD_STACK_NUM", 0)
                return [(FetchStack(index), self.base)]
            raise self._error("BAD_VAR", 0)
        if name in ("comm", "COMM"):
            return [(FetchComm(), self.base)]
        if flags & (_FL_RETURN | _FL_FENTRY) == _FL_FENTRY and name.startswith("arg"):
            number = _kstrtoull(name[3:], 10)
            if number is None:
                raise self._error("BAD_VAR", 0)
            if not number or number > PARAM_MAX_STACK:
                raise self._error("BAD_ARG_NUM", 0)
            return [(FetchArg(number - 1), self.base)]
        raise self._error("BAD_VAR", 0)

    def reg(self, children):
        name = _text(children[1])
        if self.state.fields is not None:
            raise self._error("BAD_VAR", 0)         # event probes have no registers
        if name not in _REGISTERS:
            raise self._error("BAD_REG_NAME", 0)
        return [(FetchReg(name), self.base)]

    def mem(self, children):
        text = _text(children[1])
        if text[:1].isdigit():
            address = _kstrtoull(text)
            if address is None:
                raise self._error("BAD_MEM_ADDR", 0)
            return [(FetchImm(address), self.base), (Deref(0), self.base)]
        if text[:1] == "+":
            raise self._error("FILE_ON_KPROBE", 0)
        address = self._resolve_symbol(text)
        return [(FetchSymbol(text, address), self.base), (Deref(0), self.base)]

    def _resolve_symbol(self, text: str) -> int:
        """Return the address of ``SYM[+|-OFFS]``; a failure is reported after the args.

        Linux resolves these when it registers the probe: an unknown symbol fails with
        ENOENT logged as BAD_PROBE_ADDR, an unparsable offset with EINVAL logged as
        FAIL_REG_PROBE, both at word 1.
        """
        cut = min((i for i in (text.find("+"), text.find("-")) if i >= 0), default=-1)
        symbol, offset = text, 0
        if cut >= 0:
            symbol = text[:cut]
            parsed = _kstrtoll(text[cut:])
            if parsed is None:
                self._defer(ProbeParseError("FAIL_REG_PROBE", errno.EINVAL, index=1))
                return 0
            offset = parsed
        addresses = self.state.symbols.lookup(symbol) if symbol else ()
        if not addresses:
            self._defer(ProbeParseError("BAD_PROBE_ADDR", errno.ENOENT, index=1))
            return 0
        return (addresses[0] + offset) & _U64

    def _defer(self, error: ProbeParseError) -> None:
        if self.state.deferred is None:
            self.state.deferred = error

    def deref(self, children):
        sign, offset_token, operand = children
        user = sign.endswith("u")
        if operand is None:
            raise self._error("DEREF_NEED_BRACE", 0)
        offset_text = _text(offset_token)
        # Linux drops a leading '+' and keeps a '-' before calling kstrtol.
        number_text = ("-" + offset_text) if sign[0] == "-" else offset_text
        offset = _kstrtoll(number_text)
        if offset is None:
            raise self._error("BAD_DEREF_OFFS", 0)
        # Where Linux thinks the operand starts: it does not count the 'u' of +u/-u, nor
        # the '+' when the offset text itself starts with '-'.
        inner = self.base + len(number_text) + 1 + (0 if number_text.startswith("-") else 1)
        closed, text = operand
        if not closed:
            raise ProbeParseError("DEREF_OPEN_BRACE", errno.EINVAL, offset=inner + len(text))
        ops = _parse_fetcharg(text, inner, self.state)
        if isinstance(ops[-1][0], (FetchComm, FetchData)):
            raise ProbeParseError("COMM_CANT_DEREF", errno.EINVAL, offset=inner)
        return ops + [(Deref(offset, user), inner)]

    def closed_operand(self, children):
        return (True, str(children[0])[1:-1])

    def unclosed_operand(self, children):
        return (False, str(children[0])[1:])

    def immstr(self, children):
        text = _text(children[1])
        if not text.endswith('"'):
            raise self._error("IMMSTR_NO_CLOSE", 2 + len(text))
        return [(FetchData(_to_bytes(text[:-1])), self.base)]

    def imm(self, children):
        text = _text(children[1])
        if text[:1].isdigit():
            value = _kstrtoull(text)
        elif text[:1] == "-":
            value = _kstrtoll(text)
        elif text[:1] == "+":
            value = _kstrtoll(text[1:])
        else:
            value = None
        if value is None:
            raise self._error("BAD_IMM", 1)
        return [(FetchImm(value & _U64), self.base)]

    # Old (2.6-era) spellings, kept for compatibility with seed 004.
    def old_arg(self, children):
        number = _kstrtoull(str(children[0])[1:], 10)
        if number is None or number >= PARAM_MAX_STACK:
            raise self._error("BAD_ARG_NUM", 0)
        return [(FetchArg(number), self.base)]

    def old_stack(self, children):
        index = _kstrtoull(str(children[0])[1:], 10)
        if index is None:
            raise self._error("BAD_VAR", 0)
        if index > PARAM_MAX_STACK:
            raise self._error("BAD_STACK_NUM", 0)
        return [(FetchStack(index), self.base)]

    def old_stack_pointer(self, children):
        return [(FetchStackPointer(), self.base)]

    def old_retval(self, children):
        if not self.state.flags & _FL_RETURN:
            raise self._error("RETVAL_ON_PROBE", 0)
        return [(FetchRetval(), self.base)]

    def old_ret_ip(self, children):
        if not self.state.flags & _FL_RETURN:
            raise self._error("BAD_VAR", 0)
        return [(FetchRetIP(), self.base)]

    def fetcharg(self, children):          # pragma: no cover - every branch is aliased
        return children[0]


def _parse_fetcharg(text: str, base: int, state: _ArgState) -> list:
    """Return the (insn, offset) list for fetcharg ``text`` starting at word column ``base``."""
    try:
        return _parse("fetcharg", text, _FetchArg(base, state))
    except UnexpectedInput:
        raise ProbeParseError("BAD_FETCH_ARG", errno.EINVAL, offset=base) from None


@dataclass(frozen=True, slots=True)
class _Body:
    fetch_text: str
    type_text: str | None       # None when there is no ':'
    type_at: int                # offset of the type text in the body
    array_open: bool
    array_num: str | None
    array_num_at: int
    array_close: str | None     # ']' and what follows, None when unclosed
    array_close_at: int


class _ArgBody(Transformer):
    def arg_body(self, children):
        fetch_text, type_part = children
        if type_part is None:
            return _Body(_text(fetch_text), None, 0, False, None, 0, None, 0)
        return _Body(_text(fetch_text), *type_part)

    def type_part(self, children):
        sep, name, array = children
        type_at = sep.start_pos + 1
        if array is None:
            return (_text(name), type_at, False, None, 0, None, 0)
        return (_text(name), type_at, *array)

    def array_part(self, children):
        opening, number, closing = children
        return (True, None if number is None else str(number), opening.start_pos + 1,
                None if closing is None else str(closing),
                closing.start_pos if closing is not None else 0)


def _simple_strtoul(text: str) -> tuple[int, str]:
    """Return (value, unparsed rest) as Linux simple_strtoul(base 0) stops at a non-digit."""
    if text[:1] == "0":
        base = 16 if text[1:2] in ("x", "X") and text[2:3] in _HEX else 8
    else:
        base = 10
    body = text[2:] if base == 16 else text
    end = 0
    while end < len(body) and body[end] in _DIGITS[base]:
        end += 1
    return (int(body[:end], base) if end else 0), body[end:]


class _TypeName(Transformer):
    """Turns a bitfield type into (width, bit offset), or None when Linux rejects it."""

    def bitfield_type(self, children):
        width_token, offset_token, _container = children
        width, rest = _simple_strtoul(str(width_token)[1:])
        if not width or rest or offset_token is None:
            return None
        offset_text = str(offset_token)[1:]
        bit_offset, rest = _simple_strtoul(offset_text)
        if not offset_text or rest:
            return None
        return (width, bit_offset)

    def basic_type(self, children):         # pragma: no cover - only bitfields come here
        return None


def _parse_arg(word: str, position: int, names: list[str], size: int,
               state: _ArgState) -> tuple[FetchArgSpec, int]:
    """Return the spec of argument ``word`` (the ``position``-th, from 0) and the new
    fixed record size; raises ProbeParseError with the offset in the word."""
    def error(error_id: str, offset: int, err: int = errno.EINVAL) -> ProbeParseError:
        return ProbeParseError(error_id, err, offset=offset)

    tree = _parse("arg_word", word)
    if tree.data == "named_arg":
        name_token, _, body_token = tree.children
        name_len = len(_text(name_token))
        if name_len > MAX_ARG_NAME_LEN:
            raise error("ARG_NAME_TOO_LONG", 0)
        if not name_len:
            raise error("NO_ARG_NAME", 0)
        name = str(name_token)
        body = _text(body_token)
        body_at = name_len + 1
    else:
        name = f"arg{position + 1}"
        body = str(tree.children[0])
        body_at = 0
    if not _C_IDENT.match(name):
        raise error("BAD_ARG_NAME", 0)
    if name in _RESERVED_FIELD_NAMES or name in names:
        raise error("USED_ARG_NAME", 0)
    if len(body) > MAX_ARGSTR_LEN:
        raise error("ARG_TOO_LONG", body_at)
    if not body:
        raise error("NO_ARG_BODY", body_at)

    parts: _Body = _parse("arg_body", body, _ArgBody())
    count = 0
    if parts.array_open:
        if parts.array_close is None:
            raise error("ARRAY_NO_CLOSE", body_at + len(body))
        if len(parts.array_close) > 1:
            raise error("BAD_ARRAY_SUFFIX", body_at + parts.array_close_at + 1)
        count = _kstrtouint(parts.array_num or "")
        if not count:
            raise error("BAD_ARRAY_NUM", body_at + parts.array_num_at)
        if count > MAX_ARRAY_LEN:
            raise error("ARRAY_TOO_BIG", body_at + parts.array_num_at)

    type_text = parts.type_text
    fetch_text = parts.fetch_text
    if (fetch_text in ("$comm", "$COMM") and fetch_text[1:] not in (state.fields or ())) \
            or fetch_text.startswith('\\"'):
        # Linux refuses any other type for these without logging anything.
        if count or (type_text is not None and type_text != "string"):
            raise ProbeParseError(None, errno.EINVAL, log=False)
        fetch_type = _fetch.FETCH_TYPES["string"]
    else:
        fetch_type = find_fetch_type(type_text)
    type_at = body_at + (parts.type_at if type_text is not None else 0)
    if fetch_type is None:
        raise error("BAD_TYPE", type_at)
    size += fetch_type.size * (count or 1)
    if size > MAX_PROBE_EVENT_SIZE:
        raise error("EVENT_TOO_BIG", body_at, errno.E2BIG)

    operand = _parse_fetcharg(fetch_text, body_at, state)
    bitfield = None
    if type_text is not None and type_text.startswith("b"):
        bitfield = _parse("type_name", type_text, _TypeName())
        if bitfield is None:
            raise error("BAD_BITFIELD", type_at)
    program = compile_fetch_program(operand, fetch_type, count=count, bitfield=bitfield,
                                    type_offset=type_at, body_offset=body_at)
    return FetchArgSpec(name, body, fetch_type.name, count, program), size


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
