"""Event filters: ``events/GROUP/EVENT/filter`` expressions (REFERENCE.md §5.5).

A filter is compiled once, when written, into a predicate over a record; the probe-hit
path calls :meth:`EventFilter.match` and never sees text or lark.

Two passes read the text.  :func:`_check` walks it the way Linux 6.1's
``trace_events_filter.c`` does (a bracket/quote pre-scan, then predicates left to right)
so that a rejected filter gets the kernel's message, caret column and errno — including
the kernel's quirks, such as ``EPERM``/``ENOENT``/``ESRCH`` for some syntax errors.  The
walk also resolves each predicate (field, operator, value).  The grammar in
``grammar/event_filter.lark`` then gives the expression its shape (``&&`` over ``||``,
``!``, brackets), and its predicates are paired with the resolved ones in order.
"""

from __future__ import annotations

import errno
import fnmatch
import struct
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable

from lark import Lark, Tree
from lark.exceptions import LarkError

from kprobefs.errors import KprobefsError

__all__ = [
    "FilterField",
    "EventFilter",
    "FilterParseError",
    "compile_filter",
    "filter_fields",
    "FILTER_ERRORS",
    "MAX_FILTER_STR_VAL",
    "as_field_type",
]

MAX_FILTER_STR_VAL = 256          # longest string operand, NUL included
_NUM_BUF = 24                      # longest numeric operand, NUL included

# The kernel's filter error texts, by its FILT_ERR_* order (index 0 = no error).
FILTER_ERRORS = (
    "No error",
    "Invalid operator",
    "Too many '('",
    "Too few '('",
    "Missing matching quote",
    "Operand too long",
    "Expecting string field",
    "Expecting numeric field",
    "Illegal operation for field type",
    "Field not found",
    "Illegal integer value",
    "Couldn't find or set field in one of a subsystem's events",
    "Too many terms in predicate expression",
    "Meaningless filter expression",
    "Only 'ip' field is supported for function trace",
    "Invalid value (did you forget quotes)?",
    "Error",
    "No filter found",
)
(_INVALID_OP, _TOO_MANY_OPEN, _TOO_MANY_CLOSE, _MISSING_QUOTE, _OPERAND_TOO_LONG,
 _EXPECT_STRING, _EXPECT_DIGIT, _ILLEGAL_FIELD_OP, _FIELD_NOT_FOUND, _ILLEGAL_INTVAL,
 _BAD_SUBSYS_FILTER, _TOO_MANY_PREDS, _INVALID_FILTER, _IP_FIELD_ONLY, _INVALID_VALUE,
 _ERRNO, _NO_FILTER) = range(1, 18)

# Operators in the order the kernel tries them ('<=' before '<', '>=' before '>').
_OPS = ("~", "!=", "==", "<=", "<", ">=", ">", "&")
_BLANK = " \t\n\v\f\r"


class FilterParseError(KprobefsError, OSError):
    """A filter was rejected.

    ``errno`` is what the write returns, ``code`` the index into :data:`FILTER_ERRORS`
    (0 when the kernel reports a bare error number instead of a message) and ``pos`` the
    kernel's error position in the filter text.
    """

    def __init__(self, err: int, code: int, pos: int):
        super().__init__(err, FILTER_ERRORS[code] if code else "Error")
        self.code = code
        self.pos = pos

    @property
    def message(self) -> str:
        """Return the error_log message text."""
        return FILTER_ERRORS[self.code] if self.code else FILTER_ERRORS[_ERRNO]

    def file_text(self, text: str) -> str:
        """Return what the filter file shows after this error (its read adds a newline)."""
        if not self.code:
            return f"{text}\nError: ({self.code})\n"
        pos = min(self.pos, len(text))
        if pos:
            pos += 1
        return f"{text}\n{'^'.rjust(pos)}\nparse_error: {FILTER_ERRORS[self.code]}\n"

    @property
    def log_pos(self) -> int:
        """Return the caret column error_log uses (0 for a bare error number)."""
        return self.pos if self.code else 0


# ---------------------------------------------------------------------------- fields

@dataclass(frozen=True, slots=True)
class FilterField:
    """A field a filter may name.

    ``kind`` is ``num`` (read ``size`` bytes at ``offset`` of the record), ``str`` (a
    ``__data_loc`` string at ``offset``), ``sstr`` (a char array of ``size`` bytes at
    ``offset``, 6.1's FILTER_STATIC_STRING), ``cpu`` or ``comm`` (the current CPU and
    task).
    """

    name: str
    kind: str
    offset: int = 0
    size: int = 0
    is_signed: bool = False

    @property
    def is_string(self) -> bool:
        return self.kind in ("str", "sstr", "comm")


_GENERIC_FIELDS = (FilterField("CPU", "cpu", size=4, is_signed=True),
                   FilterField("cpu", "cpu", size=4, is_signed=True),
                   FilterField("common_cpu", "cpu", size=4, is_signed=True),
                   FilterField("COMM", "comm"),
                   FilterField("comm", "comm"))
_COMMON_FIELDS = (FilterField("common_type", "num", 0, 2, False),
                  FilterField("common_flags", "num", 2, 1, False),
                  FilterField("common_preempt_count", "num", 3, 1, False),
                  FilterField("common_pid", "num", 4, 4, True))


def filter_fields(record_fields: Iterable) -> dict[str, FilterField]:
    """Return the fields a filter of an event may use, looked up as the kernel does:
    the event's own fields (``fetch.RecordField`` rows), then CPU/COMM, then common ones."""
    table: dict[str, FilterField] = {}
    for f in (*_COMMON_FIELDS, *_GENERIC_FIELDS):
        table[f.name] = f
    for rf in record_fields:
        kind = ("str" if rf.type.startswith("__data_loc")
                else "sstr" if rf.type.startswith("char[") else "num")
        table[rf.name] = FilterField(rf.name, kind, rf.offset, rf.size, rf.is_signed)
    return table


# ------------------------------------------------------------------------ predicates

_Pred = Callable[[bytes, int, Callable[[], str]], bool]


@dataclass(frozen=True, slots=True)
class _Resolved:
    """One predicate as the walk resolved it."""

    field: FilterField
    op: str
    value: int | bytes


def _kstrto(text: str, signed: bool) -> int | None:
    """kstrtoll/kstrtoull(base 0) of a filter operand; ``None`` on failure."""
    body = text
    negative = False
    if signed and body.startswith("-"):
        negative, body = True, body[1:]
    elif body.startswith("+"):
        body = body[1:]
    if body[:2] in ("0x", "0X") and len(body) > 2:
        digits, base = body[2:], 16
    elif body.startswith("0"):
        digits, base = body, 8
    else:
        digits, base = body, 10
    try:
        if not digits or digits[0] in "+-_" or "_" in digits:
            return None
        value = int(digits, base)
    except ValueError:
        return None
    if negative:
        return None if value > 1 << 63 else -value
    if value >= 1 << (63 if signed else 64):
        return None
    return value


def _make_pred(r: _Resolved) -> _Pred:
    field, op, value = r.field, r.op, r.value
    if field.is_string:
        pattern = value
        if op == "~":
            def test(s: bytes) -> bool:
                return fnmatch.fnmatchcase(s, pattern)
        else:
            def test(s: bytes) -> bool:
                return s == pattern
        negate = op == "!="
        if field.kind == "comm":
            def pred(rec, cpu, comm):
                return test(comm().encode("latin-1", "replace")) != negate
        elif field.kind == "sstr":
            # size 0: a char array to the record's end (ftrace/print's buf)
            offset = field.offset
            end = offset + field.size if field.size else None

            def pred(rec, cpu, comm):
                return test(rec[offset:end].split(b"\0", 1)[0]) != negate
        else:
            offset = field.offset

            def pred(rec, cpu, comm):
                loc = int.from_bytes(rec[offset:offset + 4], "little")
                start = loc & 0xFFFF
                data = rec[start:start + (loc >> 16)]
                end = data.find(b"\0")
                return test(data if end < 0 else data[:end]) != negate
        return pred

    bits = field.size * 8
    if field.kind == "cpu":
        # the kernel compares the CPU number as an int
        target = as_field_type(value, 32, True)

        def read(rec, cpu):
            return cpu
        signed = True
    else:
        if field.size not in (1, 2, 4, 8):
            return lambda rec, cpu, comm: False        # the kernel's no-op predicate
        code = {1: "B", 2: "H", 4: "I", 8: "Q"}[field.size]
        fmt = struct.Struct("<" + (code.lower() if field.is_signed else code))
        offset = field.offset
        signed = field.is_signed
        unpack = fmt.unpack_from

        def read(rec, cpu):
            return unpack(rec, offset)[0]
        target = as_field_type(value, bits, signed)
    if op in ("==", "!="):
        # equality compares the unsigned bit patterns
        mask = (1 << (32 if field.kind == "cpu" else bits)) - 1
        want = target & mask
        negate = op == "!="
        return lambda rec, cpu, comm: ((read(rec, cpu) & mask) == want) != negate
    if op == "<":
        return lambda rec, cpu, comm: read(rec, cpu) < target
    if op == "<=":
        return lambda rec, cpu, comm: read(rec, cpu) <= target
    if op == ">":
        return lambda rec, cpu, comm: read(rec, cpu) > target
    if op == ">=":
        return lambda rec, cpu, comm: read(rec, cpu) >= target
    # '&': any common bit
    return lambda rec, cpu, comm: bool(read(rec, cpu) & target)


def as_field_type(value: int, bits: int, signed: bool) -> int:
    """Return ``value`` as a field of ``bits`` bits holds it (negative if signed)."""
    value &= (1 << bits) - 1
    if signed and value >> (bits - 1):
        value -= 1 << bits
    return value


# ----------------------------------------------------------------- the kernel's walk

class _Fail(Exception):
    def __init__(self, err: int, code: int = 0, pos: int = 0):
        super().__init__(err, code, pos)
        self.err, self.code, self.pos = err, code, pos


def _count_terms(text: str) -> tuple[int, int]:
    """The kernel's pre-scan: return (bracket depth, number of terms), or raise for an
    unbalanced bracket or an unclosed quote (with the kernel's odd errnos)."""
    terms = 0
    in_term = False
    depth = 1
    quote = ""
    last_quote = 0
    i = 0
    for i, ch in enumerate(text):
        if ch in _BLANK:
            continue
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch in "'\"":
            quote, last_quote = ch, i
        elif ch in "|&" and text[i + 1:i + 2] == ch:
            in_term = False
            continue
        elif ch == "(":
            in_term = False
            depth += 1
            continue
        elif ch == ")":
            in_term = False
            if depth == 1:
                raise _Fail(errno.EPERM, _TOO_MANY_CLOSE, i)
            depth -= 1
            continue
        if not in_term:
            terms += 1
            in_term = True
    if quote:
        raise _Fail(errno.ESRCH, _MISSING_QUOTE, last_quote)
    if depth != 1:
        raise _Fail(errno.ENOENT, _TOO_MANY_OPEN, _unclosed_bracket(text, i, depth))
    return depth, terms


def _unclosed_bracket(text: str, last: int, depth: int) -> int:
    """Return where the kernel points for a missing ')': scanning back from the end."""
    level = depth
    quote = ""
    for i in range(last - 1, 0, -1):
        ch = text[i]
        if quote:
            if ch == quote:
                quote = ""
            continue
        if ch == "(":
            if level == depth:
                return i
            level -= 1
        elif ch == ")":
            level += 1
        elif ch in "'\"":
            quote = ch
    return 0


def _isalnum(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


def _resolve(text: str, start: int, pos: int,
             fields: dict[str, FilterField]) -> tuple[_Resolved, int]:
    """Resolve the predicate at ``text[start:]`` the kernel's way; ``pos`` is the
    position the kernel reports relative to (one past ``start``).  Return the
    predicate and its length."""
    s = text[start:] + "\0"
    i = 0
    while s[i] in _BLANK:
        i += 1
    name_at = i
    while _isalnum(s[i]) or s[i] == "_":
        i += 1
    if i == name_at:
        raise _Fail(errno.EPERM)
    field = fields.get(s[name_at:i])
    if field is None:
        raise _Fail(errno.EINVAL, _FIELD_NOT_FOUND, pos + i)
    if s.startswith(".ustring", i):
        i += len(".ustring")
    while s[i] in _BLANK:
        i += 1
    op = next((o for o in _OPS if s.startswith(o, i)), None)
    if op is None:
        raise _Fail(errno.EINVAL, _INVALID_OP, pos + i)
    i += len(op)
    while s[i] in _BLANK:
        i += 1
    value_at = i
    ch = s[i]
    if ch in "'\"":
        if op not in ("!=", "~", "=="):
            raise _Fail(errno.EINVAL, _ILLEGAL_FIELD_OP, pos + i)
        if not field.is_string:
            raise _Fail(errno.EINVAL, _EXPECT_DIGIT, pos + i)
        i += 1
        while s[i] != "\0" and s[i] != ch:
            i += 1
        if s[i] == "\0":
            raise _Fail(errno.EINVAL, _MISSING_QUOTE, pos + i)
        body = s[value_at + 1:i]
        if len(body) >= MAX_FILTER_STR_VAL:
            raise _Fail(errno.EINVAL, _OPERAND_TOO_LONG, pos + i)
        i += 1
        return _Resolved(field, op, body.encode("latin-1", "replace")), i
    if ch.isdigit() or ch == "-":
        if field.is_string:
            raise _Fail(errno.EINVAL, _EXPECT_STRING, pos + i)
        if op == "~":
            raise _Fail(errno.EINVAL, _ILLEGAL_FIELD_OP, pos + i)
        if ch == "-":
            i += 1
        while _isalnum(s[i]):
            i += 1
        word = s[value_at:i]
        if len(word) >= _NUM_BUF:
            raise _Fail(errno.EINVAL, _OPERAND_TOO_LONG, pos + i)
        value = _kstrto(word, field.is_signed)
        if value is None:
            raise _Fail(errno.EINVAL, _ILLEGAL_INTVAL, pos + value_at)
        return _Resolved(field, op, value), i
    raise _Fail(errno.EINVAL, _INVALID_VALUE, pos + i)


def _check(text: str, fields: dict[str, FilterField]) -> list[_Resolved]:
    """Walk ``text`` as the kernel does; return the predicates in order or raise _Fail."""
    _depth, terms = _count_terms(text)
    if not terms:
        raise _Fail(errno.EINVAL)
    max_preds = terms + 2
    s = text + "\0"
    ptr = 0
    stack = [0]                 # the kernel keeps the invert state per bracket level
    invert = 0
    preds: list[_Resolved] = []
    while s[ptr] != "\0":
        here = ptr
        ptr += 1
        ch = s[here]
        if ch in _BLANK:
            continue
        if ch == "(":
            stack.append(invert)
            continue
        if ch == "!" and s[here + 1] not in "=~":
            invert ^= 1
            continue
        if len(preds) >= max_preds:
            raise _Fail(errno.EPERM, _TOO_MANY_PREDS, here)
        pred, length = _resolve(text, here, ptr, fields)
        preds.append(pred)
        ptr = here + length
        while True:
            here = ptr
            ptr += 1
            ch = s[here]
            if ch in _BLANK:
                continue
            if ch in "&|":
                if s[here + 1] != ch:
                    raise _Fail(errno.EPERM, _TOO_MANY_PREDS, here)
                ptr += 1
            elif ch not in ")\0":
                raise _Fail(errno.EPERM, _TOO_MANY_PREDS, here)
            invert = stack[-1]
            if ch in "&|":
                break
            if ch == "\0":
                return preds
            if len(stack) == 1:
                raise _Fail(errno.EPERM, _TOO_MANY_CLOSE, ptr)
            stack.pop()
    if preds:
        raise _Fail(errno.EINVAL, _INVALID_FILTER, ptr)
    if len(stack) != 1:
        raise _Fail(errno.EPERM, _TOO_MANY_OPEN, ptr)
    raise _Fail(errno.EINVAL, _NO_FILTER, ptr)


# --------------------------------------------------------------------- the grammar

def _grammar_text() -> str:
    try:
        return (resources.files("kprobefs.grammar") / "event_filter.lark").read_text()
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        path = Path(__file__).resolve().parents[3] / "grammar" / "event_filter.lark"
        return path.read_text()


@lru_cache(maxsize=1)
def _lark() -> Lark:
    return Lark(_grammar_text(), parser="lalr", lexer="contextual", maybe_placeholders=True)


def warm_up() -> None:
    """Builds the grammar and its lexer now, for a long-running process whose first
    filter should not pay for them."""
    _lark().parse("!(a == 1 && b ~ \"x*\") || c < -1")


def _build(tree, preds: Iterable[_Pred]) -> _Pred:
    """Return the predicate of ``tree``, taking leaf predicates from ``preds`` in order."""
    if tree.data == "predicate":
        return next(preds)
    parts = [_build(child, preds) for child in tree.children if isinstance(child, Tree)]
    if tree.data == "not_expr":
        inner = parts[0]
        return lambda rec, cpu, comm: not inner(rec, cpu, comm)
    if tree.data == "and_expr":
        if len(parts) == 2:
            a, b = parts
            return lambda rec, cpu, comm: a(rec, cpu, comm) and b(rec, cpu, comm)
        return lambda rec, cpu, comm: all(p(rec, cpu, comm) for p in parts)
    if tree.data == "or_expr":
        if len(parts) == 2:
            a, b = parts
            return lambda rec, cpu, comm: a(rec, cpu, comm) or b(rec, cpu, comm)
        return lambda rec, cpu, comm: any(p(rec, cpu, comm) for p in parts)
    raise ValueError(f"unexpected filter node {tree.data}")   # pragma: no cover


# ------------------------------------------------------------------------ the result

def _postfix(tree, leaves) -> list:
    """Return ``tree`` in postfix order: its resolved predicates (taken from ``leaves``
    in order) and the operators ``"and"``, ``"or"`` (binary) and ``"not"``."""
    if tree.data == "predicate":
        return [next(leaves)]
    parts = [_postfix(child, leaves) for child in tree.children if isinstance(child, Tree)]
    if tree.data == "not_expr":
        return parts[0] + ["not"]
    op = "and" if tree.data == "and_expr" else "or"
    out = parts[0]
    for part in parts[1:]:
        out += part + [op]
    return out


@dataclass(frozen=True, slots=True)
class EventFilter:
    """A compiled filter.  ``text`` is the filter as the file shows it; ``program`` is
    the expression in postfix order (:func:`_postfix`), for recorders that evaluate
    filters themselves (tracing/buffers/native.py)."""

    text: str
    _pred: _Pred
    uses_comm: bool = False
    program: tuple = ()

    def match(self, record: bytes, cpu: int, comm: Callable[[], str]) -> bool:
        """Return True when ``record`` (common header included) passes.

        ``comm()`` is called only by predicates on ``comm``.
        """
        return self._pred(record, cpu, comm)


def compile_filter(text: str, fields: dict[str, FilterField]) -> EventFilter:
    """Return the compiled filter for ``text`` (trailing blanks already removed).

    Raises :class:`FilterParseError` with the kernel's errno, message and position.
    """
    try:
        resolved = _check(text, fields)
    except _Fail as fail:
        raise FilterParseError(fail.err, fail.code, fail.pos) from None
    try:
        tree = _lark().parse(text)
    except LarkError as exc:
        # The walk accepted what the grammar rejects: report it as the kernel's bare error.
        raise FilterParseError(errno.EINVAL, 0, 0) from exc
    leaves = [_make_pred(r) for r in resolved]
    if isinstance(tree, Tree) and tree.data == "predicate":
        pred = leaves[0]
        program = tuple(resolved)
    else:
        pred = _build(tree, iter(leaves))
        program = tuple(_postfix(tree, iter(resolved)))
    return EventFilter(text, pred, any(r.field.kind == "comm" for r in resolved), program)
