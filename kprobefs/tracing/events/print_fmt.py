"""An event's ``print fmt``: parsed once, then evaluated for each record.

A static event's print format is the TP_printk of its definition, as its ``format``
file shows it: a C format string, then C expressions over the record (``REC->field``,
arithmetic, ``?:``, ``__print_flags``, ``__print_symbolic``, ``__get_str``).  This is
what trace-cmd's libtraceevent does with the same text; the tracer prints ``trace``
lines this way, so the format file and the output cannot disagree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ...errors import KprobefsError

__all__ = ["PrintFmt", "PrintFmtError", "parse_print_fmt", "fields_print_fmt", "c_printf"]


class PrintFmtError(KprobefsError):
    """A print fmt this parser cannot read (raised when an event is set up)."""


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<num>0[xX][0-9a-fA-F]+[uUlL]*|\d+[uUlL]*)
  | (?P<id>[A-Za-z_]\w*)
  | (?P<op>->|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^~!<>?:(),{}\[\]])
""", re.X)

# Binary operators by C precedence (higher binds tighter).
_BINARY = {
    "||": 1, "&&": 2, "|": 3, "^": 4, "&": 5, "==": 6, "!=": 6,
    "<": 7, ">": 7, "<=": 7, ">=": 7, "<<": 8, ">>": 8, "+": 9, "-": 9,
    "*": 10, "/": 10, "%": 10,
}
_U64 = (1 << 64) - 1
#: The words a cast in a print fmt may name, and the widths of those with one.
_TYPE_BITS = {"char": 8, "short": 16, "int": 32, "long": 64, "bool": 8, "u8": 8, "s8": 8,
              "u16": 16, "s16": 16, "u32": 32, "s32": 32, "u64": 64, "s64": 64,
              "gfp_t": 32, "size_t": 64, "pid_t": 32, "void": 64}
_TYPE_WORDS = {*_TYPE_BITS, "unsigned", "signed", "const"}


def _unescape(text: str) -> str:
    return (text[1:-1].encode("latin-1").decode("unicode_escape"))


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise PrintFmtError(f"print fmt: cannot read {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group()))
    return out


class _Parser:
    """Recursive descent over the tokens; expressions become nested tuples."""

    def __init__(self, tokens):
        self.toks, self.i = tokens, 0

    def peek(self, value: str | None = None):
        tok = self.toks[self.i] if self.i < len(self.toks) else ("end", "")
        return tok if value is None or tok[1] == value else None

    def take(self, value: str | None = None):
        tok = self.peek()
        if value is not None and tok[1] != value:
            raise PrintFmtError(f"print fmt: expected {value!r}, found {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self):
        cond = self.binary(1)
        if self.peek("?"):
            self.take("?")
            yes = self.expr()
            self.take(":")
            return ("?:", cond, yes, self.expr())
        return cond

    def binary(self, level: int):
        left = self.unary()
        while True:
            op = self.peek()[1]
            prec = _BINARY.get(op)
            if self.peek()[0] != "op" or prec is None or prec < level:
                return left
            self.take()
            left = (op, left, self.binary(prec + 1))

    def unary(self):
        kind, value = self.peek()
        if kind == "op" and value in ("-", "!", "~"):
            self.take()
            return ("u" + value, self.unary())
        return self.primary()

    def primary(self):
        kind, value = self.take()
        if kind == "num":
            return ("num", int(value.rstrip("uUlL"), 0))
        if kind == "str":
            text = _unescape(value)
            while self.peek() and self.peek()[0] == "str":     # "a" "b"
                text += _unescape(self.take()[1])
            return ("str", text)
        if value == "(":
            cast = self._cast()
            if cast is not None:                # (unsigned long)x, ( gfp_t)0x40u
                return ("cast", cast, self.unary())
            inner = self.expr()
            self.take(")")
            return inner
        if value == "REC":
            self.take("->")
            node = ("field", self.take()[1])
            if self.peek("["):              # an array field's element
                self.take("[")
                node = ("index", node, self.expr())
                self.take("]")
            return node
        if kind == "id" and self.peek("("):
            return self.call(value)
        raise PrintFmtError(f"print fmt: unexpected {value!r}")

    def _cast(self) -> tuple[int, bool] | None:
        """After ``(``: a type name and ``)`` make a cast (taken, returned as (bits,
        signed); pointers and longs 64 bits); anything else is a parenthesised
        expression (None, nothing taken)."""
        j, words = self.i, []
        while j < len(self.toks) and (self.toks[j][0] == "id" or self.toks[j][1] == "*"):
            words.append(self.toks[j][1])
            j += 1
        if not words or j >= len(self.toks) or self.toks[j][1] != ")" \
                or not all(w in _TYPE_WORDS or w == "*" for w in words):
            return None
        self.i = j + 1
        if "*" in words or "long" in words or words[-1] in _TYPE_BITS and \
                _TYPE_BITS[words[-1]] == 64:
            bits = 64
        else:
            bits = next((_TYPE_BITS[w] for w in reversed(words) if w in _TYPE_BITS), 32)
        signed = "unsigned" not in words and not any(w.startswith("u") or w == "gfp_t"
                                                       or w == "bool" for w in words)
        return bits, signed

    def call(self, name: str):
        self.take("(")
        if name in ("__get_str", "__get_dynamic_array"):
            field = self.take()[1]
            self.take(")")
            return ("str_field", field)
        if name not in ("__print_flags", "__print_symbolic"):
            raise PrintFmtError(f"print fmt: unknown function {name}")
        value = self.expr()
        delim = None
        if name == "__print_flags":
            self.take(",")
            delim = self.expr()
        table = []
        while self.peek(","):
            self.take(",")
            self.take("{")
            key = self.expr()
            self.take(",")
            label = self.expr()
            self.take("}")
            table.append((key, label))
        self.take(")")
        return (name, value, delim, tuple(table))


@dataclass(frozen=True)
class PrintFmt:
    """A parsed print fmt: the C format and its argument expressions."""

    fmt: str
    args: tuple

    def render(self, field: Callable[[str], Any], str_field: Callable[[str], str],
               hash_pointer: Callable[[int], int] | None = None,
               symbolize: Callable[[int, bool], str | None] | None = None) -> str:
        """Return the text for a record: ``field(name)`` gives a field's value (an
        int, or a str for char arrays), ``str_field(name)`` a ``__data_loc`` string;
        ``%p`` prints ``hash_pointer(value)``, as the kernel hashes pointers."""
        values = [_eval(a, field, str_field) for a in self.args]
        return c_printf(self.fmt, values, hash_pointer, symbolize)


def fields_print_fmt(names: Sequence[str]) -> PrintFmt:
    """What an event whose print fmt cannot be read prints instead: each field as
    ``name=0xVALUE`` (the daemon logs the reason; the event still records)."""
    return PrintFmt(" ".join(f"{n}=0x%lx" for n in names),
                    tuple(("field", n) for n in names))


def parse_print_fmt(text: str) -> PrintFmt:
    """Parse ``"FORMAT", ARG, ...`` (the text after ``print fmt: ``)."""
    parser = _Parser(_tokens(text))
    kind, value = parser.take()
    if kind != "str":
        raise PrintFmtError("print fmt: no format string")
    fmt = _unescape(value)
    while parser.peek() and parser.peek()[0] == "str":
        fmt += _unescape(parser.take()[1])
    args = []
    while parser.peek(","):
        parser.take(",")
        args.append(parser.expr())
    if parser.peek()[0] != "end":
        raise PrintFmtError(f"print fmt: trailing {parser.peek()[1]!r}")
    return PrintFmt(fmt, tuple(args))


def _num(v) -> int:
    return v if isinstance(v, int) else 0


def _eval(node, field, str_field):
    op = node[0]
    if op == "num" or op == "str":
        return node[1]
    if op == "field":
        return field(node[1])
    if op == "str_field":
        return str_field(node[1])
    if op == "index":
        array, i = _eval(node[1], field, str_field), _num(_eval(node[2], field, str_field))
        return array[i] if isinstance(array, (list, tuple)) and 0 <= i < len(array) else 0
    if op == "?:":
        return _eval(node[2] if _eval(node[1], field, str_field) else node[3],
                     field, str_field)
    if op == "__print_flags":
        value = _num(_eval(node[1], field, str_field))
        delim = _eval(node[2], field, str_field)
        names = []
        for key, label in node[3]:
            bit = _num(_eval(key, field, str_field))
            if bit and value & bit == bit:
                names.append(_eval(label, field, str_field))
                value &= ~bit
        if value:
            names.append(f"0x{value:x}")
        return delim.join(names)
    if op == "__print_symbolic":
        value = _num(_eval(node[1], field, str_field))
        for key, label in node[3]:
            if _num(_eval(key, field, str_field)) == value:
                return _eval(label, field, str_field)
        return f"0x{value:x}"
    if op == "cast":
        (bits, signed), v = node[1], _eval(node[2], field, str_field)
        if not isinstance(v, int):
            return v                            # a string stays one
        v &= (1 << bits) - 1
        return v - (1 << bits) if signed and v >> (bits - 1) else v
    if op[0] == "u":
        v = _num(_eval(node[1], field, str_field))
        return {"u-": -v, "u!": int(not v), "u~": ~v}[op]
    a = _num(_eval(node[1], field, str_field))
    if op == "&&":
        return int(bool(a) and bool(_num(_eval(node[2], field, str_field))))
    if op == "||":
        return int(bool(a) or bool(_num(_eval(node[2], field, str_field))))
    b = _num(_eval(node[2], field, str_field))
    return _BINOPS[op](a, b)


_BINOPS: Mapping[str, Callable[[int, int], int]] = {
    "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "&": lambda a, b: a & b,
    "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
    "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b),
    "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
    "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: int(a / b) if b else 0, "%": lambda a, b: a % b if b else 0,
}

_CONV = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\d+|\*)?(?:\.(?P<prec>\d+))?"
                   r"(?P<len>hh|h|ll|l|z)?(?P<conv>[diouxXscp%])")
_BITS = {"hh": 8, "h": 16, None: 32, "l": 64, "ll": 64, "z": 64}


def c_printf(fmt: str, values: Sequence,
             hash_pointer: Callable[[int], int] | None = None,
             symbolize: Callable[[int, bool], str | None] | None = None) -> str:
    """The kernel's vsnprintf for the conversions print formats use; ``%p`` is the
    pointer hashed (``hash_pointer``), 16 hex digits, as 6.1 prints it; ``%pS`` and
    ``%ps`` the symbol with and without its offset (``symbolize(addr, offset)``)."""
    out, pos, it = [], 0, iter(values)
    for m in _CONV.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        conv = m["conv"]
        if conv == "%":
            out.append("%")
            continue
        value = next(it, 0)
        flags, width, prec = m["flags"], m["width"] or "", m["prec"]
        if conv == "s":
            text = value if isinstance(value, str) else str(value)
            if prec is not None:
                text = text[:int(prec)]
            spec = "%" + flags.replace("0", "") + width + "s"
            out.append(spec % text)
            continue
        if conv == "c":
            out.append(chr(_num(value) & 0xFF))
            continue
        if conv == "p":
            pointer = _num(value) & _U64
            ext = fmt[pos:pos + 1]
            if ext in ("S", "s", "B") and symbolize is not None:
                pos += 1                        # %pS: sym+0xoff/0xsize, %ps: sym
                out.append(symbolize(pointer, ext != "s") or f"0x{pointer:x}")
                continue
            out.append(f"{hash_pointer(pointer) if hash_pointer else pointer:016x}")
            continue
        bits = _BITS[m["len"]]
        v = _num(value) & ((1 << bits) - 1)
        if conv in "di" and v >> (bits - 1):
            v -= 1 << bits
        pyconv = "d" if conv in "diu" else conv
        out.append(("%" + flags + width + ("." + prec if prec else "") + pyconv) % v)
    out.append(fmt[pos:])
    return "".join(out)
