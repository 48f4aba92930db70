"""Event ``format`` files and the ring-buffer page layout, parsed into data.

An :class:`EventFormat` says what tracefs says of an event: its id, its fields (type,
offset, size, signedness) and its print fmt.  It turns a field's text (as ``trace``
prints it) or its bytes (as ``trace_pipe_raw`` holds them) into a Python value typed as
the field is: integers for the integer and pointer types, ``str`` for ``char`` arrays,
``__data_loc char[]`` strings and kprobe ``string``s, lists for other arrays.

Nothing here reads a file; :mod:`kprobefs.testing.records` does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import FormatError

__all__ = ["FormatError", "FormatField", "EventFormat", "PageLayout", "parse_format",
           "parse_page_layout"]


_FIELD = re.compile(r"^\s*field:\s*(?P<decl>[^;]*);\s*offset:(?P<offset>\d+);"
                    r"\s*size:(?P<size>\d+);\s*signed:(?P<signed>\d+);", re.M)
_ARRAY = re.compile(r"^(?P<name>\w+)\[(?P<len>[^\]]*)\]$")
_CHAR_TYPES = ("char", "signed char", "unsigned char", "const char")


@dataclass(frozen=True)
class FormatField:
    """One ``field:`` line of a format file."""

    type: str           # the C type without the name: "unsigned long", "char[16]"
    name: str
    offset: int
    size: int
    signed: bool
    array_len: int | None = None    # N of "name[N]"; 0 for "name[]"
    data_loc: bool = False          # "__data_loc TYPE[] name": a u32 (len << 16 | offset)

    @property
    def is_string(self) -> bool:
        """Whether the field holds text (char arrays, data_loc strings, kprobe strings)."""
        base = self.type.split("[")[0].strip()
        return (self.array_len is not None or self.data_loc) and base in _CHAR_TYPES \
            or base == "string"

    @property
    def is_array(self) -> bool:
        return (self.array_len is not None or self.data_loc) and not self.is_string

    def value_from_text(self, text: str) -> Any:
        """The value ``trace`` printed as ``text``, typed as the field is; the text as
        it is when it does not read as that type (a symbol for an address, ``S`` for a
        task state printed by ``__print_flags``)."""
        if self.is_string:
            if len(text) >= 2 and text[0] == text[-1] == '"':
                return text[1:-1]
            return text
        if self.is_array and text.startswith("{") and text.endswith("}"):
            return [_int_or_text(item.strip()) for item in text[1:-1].split(",")
                    if item.strip()]
        return _int_or_text(text)

    def value_from_bytes(self, record: bytes) -> Any:
        """The field's value in a binary record (``trace_pipe_raw``)."""
        if self.data_loc:
            loc = int.from_bytes(record[self.offset:self.offset + 4], "little")
            start, length = loc & 0xFFFF, loc >> 16
            raw = record[start:start + length]
            if self.is_string:
                return _c_string(raw)
            return _ints(raw, self._element_size(), self.signed)
        if self.array_len is not None:
            end = len(record) if self.array_len == 0 else self.offset + self.size
            raw = record[self.offset:end]
            if self.is_string:
                return _c_string(raw)
            return _ints(raw, self._element_size(), self.signed)
        raw = record[self.offset:self.offset + self.size]
        return int.from_bytes(raw, "little", signed=self.signed)

    def _element_size(self) -> int:
        if self.array_len:
            return max(1, self.size // self.array_len)
        base = self.type.split("[")[0].replace("unsigned", "").replace("signed", "").strip()
        return _SIZES.get(base, 8)


#: Sizes of the element types a ``__data_loc`` array may have.
_SIZES = {"u8": 1, "s8": 1, "char": 1, "u16": 2, "s16": 2, "short": 2, "u32": 4, "s32": 4,
          "int": 4, "x32": 4, "u64": 8, "s64": 8, "long": 8, "x64": 8}


def _int_or_text(text: str) -> Any:
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return int(text, 10)                  # "0123": int(…, 0) refuses a leading 0
    except ValueError:
        return text


def _c_string(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _ints(raw: bytes, size: int, signed: bool) -> list[int]:
    return [int.from_bytes(raw[i:i + size], "little", signed=signed)
            for i in range(0, len(raw) - size + 1, size)]


@dataclass(frozen=True)
class EventFormat:
    """An event's ``format`` file: ``common`` holds the ``common_*`` fields, ``fields``
    the event's own, in the file's order."""

    name: str
    id: int
    common: tuple[FormatField, ...]
    fields: tuple[FormatField, ...]
    print_fmt: str
    system: str = ""

    def field(self, name: str) -> FormatField | None:
        """The event's own field called ``name``, or ``None``."""
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def decode(self, record: bytes) -> dict[str, Any]:
        """The event's own fields of a binary record, by name."""
        return {f.name: f.value_from_bytes(record) for f in self.fields}


def parse_format(text: str, system: str = "") -> EventFormat:
    """An event's ``format`` text as an :class:`EventFormat`; raises FormatError."""
    name = re.search(r"^name:\s*(\S+)", text, re.M)
    ident = re.search(r"^ID:\s*(\d+)", text, re.M)
    if not name or not ident:
        raise FormatError("a format file starts with name: and ID: lines")
    common, own = [], []
    for m in _FIELD.finditer(text):
        f = _parse_field(m)
        (common if f.name.startswith("common_") else own).append(f)
    fmt = re.search(r"^print fmt:\s*(.*)$", text, re.M)
    return EventFormat(name[1], int(ident[1]), tuple(common), tuple(own),
                       fmt[1] if fmt else "", system)


def _parse_field(m: re.Match) -> FormatField:
    decl = m["decl"].strip()
    data_loc = decl.startswith("__data_loc ")
    if data_loc:
        decl = decl[len("__data_loc "):]
    ctype, _, name = decl.rpartition(" ")
    if not ctype:
        raise FormatError(f"no type in field declaration {m['decl']!r}")
    array_len = None
    am = _ARRAY.match(name)
    if am:
        name = am["name"]
        array_len = int(am["len"], 0) if am["len"].strip() else 0
        ctype = f"{ctype}[{am['len']}]"
    elif ctype.endswith("[]"):                  # "__data_loc char[] s"
        pass
    return FormatField(ctype, name, int(m["offset"]), int(m["size"]),
                       m["signed"] == "1", array_len, data_loc)


@dataclass(frozen=True)
class PageLayout:
    """A ring-buffer page as ``events/header_page`` and ``events/header_event`` lay it
    out: where the page's timestamp, commit word and data are, and the event header's
    special ``type_len`` values."""

    timestamp: tuple[int, int]      # (offset, size)
    commit: tuple[int, int]
    data: tuple[int, int]
    padding: int = 29
    time_extend: int = 30
    time_stamp: int = 31
    data_max: int = 28


def parse_page_layout(header_page: str, header_event: str) -> PageLayout:
    """The page layout from the two header files' texts; raises FormatError."""
    where = {}
    for m in _FIELD.finditer(header_page):
        name = m["decl"].split()[-1]
        where.setdefault(name, (int(m["offset"]), int(m["size"])))
    types = {m[1]: int(m[2]) for m in re.finditer(r"(\w+)\s*:\s*type\s*==\s*(\d+)",
                                                   header_event)}
    data_max = re.search(r"data max type_len\s*==\s*(\d+)", header_event)
    try:
        return PageLayout(where["timestamp"], where["commit"], where["data"],
                          types["padding"], types["time_extend"], types["time_stamp"],
                          int(data_max[1]) if data_max else 28)
    except KeyError as e:
        raise FormatError(f"header_page/header_event lack {e.args[0]}") from None
