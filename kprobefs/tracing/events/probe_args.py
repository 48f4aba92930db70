"""A probe's fetch arguments (Linux 6.1's traceprobe_parse_probe_arg, trace_probe.c):
``[NAME=]FETCHARG[:TYPE]`` words parsed into frozen :class:`FetchArgSpec` objects with a
compiled fetch program, checked in Linux's order with its error_log offsets.

Also here, as the lowest part of the command parser (:mod:`probe_parser` builds on it):
the ``grammar/kprobe_events.lark`` grammar that every word of a command is parsed with,
the kernel's number parsers (kstrtoull and friends), the limits and the registers of
fetch arguments, and :class:`SymbolResolver`, the symbol table the parser consults.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Protocol, Sequence

from lark import Lark, Token, Transformer
from lark.exceptions import UnexpectedInput, VisitError

from kprobefs.errors import ProbeParseError
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
    "X86_64_REGISTERS",
    "warm_up",
]

MAX_ARGSTR_LEN = 63                  # longest argument body
MAX_ARG_NAME_LEN = 32
MAX_ARRAY_LEN = 64
MAX_PROBE_EVENT_SIZE = 3072          # fixed argument storage
PARAM_MAX_STACK = 16 * 1024 // 8     # THREAD_SIZE / sizeof(unsigned long)
UINT_MAX = (1 << 32) - 1
_U64 = (1 << 64) - 1

# pt_regs names accepted after '%' on x86_64, in regoffset_table order.
X86_64_REGISTERS = ("r15", "r14", "r13", "r12", "r11", "r10", "r9", "r8", "bx", "cx", "dx",
                    "si", "di", "bp", "ax", "orig_ax", "ip", "cs", "flags", "sp", "ss")
_REGISTERS = frozenset(X86_64_REGISTERS)

_RESERVED_FIELD_NAMES = frozenset((
    "common_type", "common_flags", "common_preempt_count", "common_pid", "common_tgid",
    "__probe_ip", "__probe_ret_ip", "__probe_func"))

_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


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
