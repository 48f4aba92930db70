"""Fetch programs: what a probe hit records for each fetch argument.

A fetch argument (``+8(%di):u32``, ``$comm``, ``@jiffies``, ...) is compiled once, when the
probe is defined, into a :class:`FetchProgram`: a short tuple of frozen fetch instructions
modelled on Linux 6.1's ``fetch_insn`` ops (kernel/trace/trace_probe.h).  A probe hit only
interprets programs (:func:`run`, :func:`encode_args`); it never sees argument text or lark.

The record layout follows REFERENCE.md §3.2 / §5.3: after the fixed header (kprobe 16 bytes,
kretprobe 24) the arguments are packed in definition order without alignment; strings are a
4-byte ``__data_loc`` (``len << 16 | offset``, offset from the start of the record, length
including the NUL) whose bytes follow the fixed part.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple, Protocol, Sequence

from kprobefs.errors import KprobefsError, ProbeParseError

__all__ = [
    "format_fields_text",
    "FetchFault",
    "FetchContext",
    "FetchType",
    "FETCH_TYPES",
    "DEFAULT_FETCH_TYPE",
    "find_fetch_type",
    "FetchInsn",
    "FetchReg",
    "FetchStack",
    "FetchStackPointer",
    "FetchRetval",
    "FetchArg",
    "FetchRetIP",
    "FetchComm",
    "FetchImm",
    "FetchSymbol",
    "FetchData",
    "FetchEventField",
    "Deref",
    "StoreRaw",
    "StoreMem",
    "StoreString",
    "ModBitfield",
    "LoopArray",
    "FetchProgram",
    "FETCH_INSN_MAX",
    "MAX_STRING_SIZE",
    "compile_fetch_program",
    "run",
    "RecordField",
    "KPROBE_HEADER_SIZE",
    "KRETPROBE_HEADER_SIZE",
    "EPROBE_HEADER_SIZE",
    "COMMON_FIELDS",
    "build_record_fields",
    "build_print_fmt",
    "format_event_format",
    "encode_args",
    "print_args",
]

FETCH_INSN_MAX = 16          # slots per argument, the final END included
MAX_STRING_SIZE = 4096       # PATH_MAX: longest string fetched, NUL included
KPROBE_HEADER_SIZE = 16      # common header (8) + __probe_ip
KRETPROBE_HEADER_SIZE = 24   # common header (8) + __probe_func + __probe_ret_ip
EPROBE_HEADER_SIZE = 8       # an event probe's record: the common header, then the args

TASK_SIZE = 0x00007FFFFFFFF000   # x86_64 TASK_SIZE_MAX: user addresses lie below
_THREAD_SIZE = 16 * 1024
_ARG_REGS = ("di", "si", "dx", "cx", "r8", "r9")
_U64 = (1 << 64) - 1


class FetchFault(KprobefsError):
    """A fetch read an address that cannot be read (raised by a :class:`FetchContext`).

    The interpreter catches it: numeric loads then record 0, strings record length 0.
    """


class FetchContext(Protocol):
    """What a probe hit offers the fetch interpreter (x86_64 register names, §3.1)."""

    def reg(self, name: str) -> int:
        """Return register ``name`` (``r15 … r8 bx cx dx si di bp ax orig_ax ip cs flags
        sp ss``)."""

    def stack_pointer(self) -> int:
        """Return the kernel stack pointer at the hit."""

    def read_kernel(self, addr: int, size: int) -> bytes:
        """Return ``size`` bytes of kernel memory; raise :class:`FetchFault` if unreadable."""

    def read_user(self, addr: int, size: int) -> bytes:
        """Return ``size`` bytes of user memory; raise :class:`FetchFault` if unreadable."""

    def read_kernel_string(self, addr: int, max_len: int) -> bytes:
        """Return the NUL-terminated kernel string at ``addr`` without its NUL, at most
        ``max_len - 1`` bytes; raise :class:`FetchFault` if unreadable."""

    def read_user_string(self, addr: int, max_len: int) -> bytes:
        """Like :meth:`read_kernel_string` for user memory."""

    def comm(self) -> bytes | str:
        """Return the current task's comm (at most 15 bytes)."""

    def retval(self) -> int:
        """Return the function's return value (``ax`` at return)."""

    def ret_ip(self) -> int:
        """Return the return address of the probed function (kretprobes)."""

    def symbolize(self, addr: int) -> str | None:
        """Return ``sym+0xoff/0xsize`` (plus `` [mod]``) for ``addr``, or ``None``."""

    def event_field(self, insn: "FetchEventField") -> int:
        """Return a field of the record an event probe is attached to (its value, or
        for a string field the address of its text); only event probes have one."""


# ------------------------------------------------------------------------------- types

@dataclass(frozen=True, slots=True)
class FetchType:
    """One row of Linux's probe_fetch_types table."""

    name: str          # as written after ':' (bitfields resolve to their container)
    size: int          # bytes in the fixed part of the record (strings: the data_loc)
    is_signed: bool
    is_string: bool
    fmt: str           # printf format used in "print fmt" (already escaped)
    fmttype: str       # the type shown by the format file


def _basic(name: str, size: int, signed: bool, fmt: str, fmttype: str) -> FetchType:
    return FetchType(name, size, signed, False, fmt, fmttype)


FETCH_TYPES: dict[str, FetchType] = {t.name: t for t in (
    FetchType("string", 4, True, True, '\\"%s\\"', "__data_loc char[]"),
    FetchType("ustring", 4, True, True, '\\"%s\\"', "__data_loc char[]"),
    FetchType("symstr", 4, True, True, '\\"%s\\"', "__data_loc char[]"),
    _basic("u8", 1, False, "%u", "u8"),
    _basic("u16", 2, False, "%u", "u16"),
    _basic("u32", 4, False, "%u", "u32"),
    _basic("u64", 8, False, "%Lu", "u64"),
    _basic("s8", 1, True, "%d", "s8"),
    _basic("s16", 2, True, "%d", "s16"),
    _basic("s32", 4, True, "%d", "s32"),
    _basic("s64", 8, True, "%Ld", "s64"),
    _basic("x8", 1, False, "0x%x", "u8"),
    _basic("x16", 2, False, "0x%x", "u16"),
    _basic("x32", 4, False, "0x%x", "u32"),
    _basic("x64", 8, False, "0x%Lx", "u64"),
    _basic("symbol", 8, False, "%pS", "u64"),
)}
DEFAULT_FETCH_TYPE = FETCH_TYPES["x64"]
_BITFIELD_CONTAINERS = {8: "u8", 16: "u16", 32: "u32", 64: "u64"}


def find_fetch_type(text: str | None) -> FetchType | None:
    """Return the fetch type named by ``text`` (``None`` = the default ``x64``).

    A name starting with ``b`` is a bitfield and resolves to ``u<C>`` for its ``/<C>`` tail.
    Returns ``None`` for an unknown type (Linux's BAD_TYPE).
    """
    if text is None:
        return DEFAULT_FETCH_TYPE
    if text.startswith("b"):
        slash = text.find("/")
        if slash < 0:
            return None
        bits = _kstrtoul(text[slash + 1:])
        name = _BITFIELD_CONTAINERS.get(bits) if bits is not None else None
        return FETCH_TYPES[name] if name else None
    return FETCH_TYPES.get(text)


def _kstrtoul(text: str) -> int | None:
    """Return ``text`` parsed as Linux kstrtoul(base 0) does, or ``None``."""
    if text.startswith("+"):
        text = text[1:]
    if text[:2] in ("0x", "0X") and len(text) > 2 and text[2] in _HEXDIGITS:
        digits, base = text[2:], 16
    elif text.startswith("0"):
        digits, base = text, 8
    else:
        digits, base = text, 10
    if not digits or any(c not in _DIGITS[base] for c in digits):
        return None
    value = int(digits, base)
    return value if value <= _U64 else None


_HEXDIGITS = frozenset("0123456789abcdefABCDEF")
_DIGITS = {8: frozenset("01234567"), 10: frozenset("0123456789"), 16: _HEXDIGITS}


# ------------------------------------------------------------------------ instructions

@dataclass(frozen=True, slots=True)
class FetchInsn:
    """Base of fetch instructions; ``slots`` is how many fetch_insn entries Linux uses."""

    slots: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class FetchReg(FetchInsn):
    """Load a register (``%REG``)."""

    name: str


@dataclass(frozen=True, slots=True)
class FetchStack(FetchInsn):
    """Load the ``index``-th unsigned long of the kernel stack (``$stackN``, ``sN``)."""

    index: int


@dataclass(frozen=True, slots=True)
class FetchStackPointer(FetchInsn):
    """Load the stack pointer (``$stack``, ``sa``)."""


@dataclass(frozen=True, slots=True)
class FetchRetval(FetchInsn):
    """Load the return value (``$retval``, ``rv``)."""


@dataclass(frozen=True, slots=True)
class FetchArg(FetchInsn):
    """Load function argument ``index`` counted from 0 (``$argN`` = index N-1, ``aN``)."""

    index: int


@dataclass(frozen=True, slots=True)
class FetchRetIP(FetchInsn):
    """Load the return address (old ``ra``)."""


@dataclass(frozen=True, slots=True)
class FetchComm(FetchInsn):
    """Point at the current task's comm (``$comm``); only a string store may follow."""


@dataclass(frozen=True, slots=True)
class FetchImm(FetchInsn):
    """Load an immediate (``\\IMM``, and the address of ``@ADDR``)."""

    value: int


@dataclass(frozen=True, slots=True)
class FetchSymbol(FetchInsn):
    """Load the address of ``@SYM[+|-OFFS]``, resolved when the probe was defined.

    Linux keeps a symbol placeholder in front of the immediate, hence two slots.
    """

    slots: ClassVar[int] = 2
    symbol: str
    address: int


@dataclass(frozen=True, slots=True)
class FetchData(FetchInsn):
    """Point at an immediate string (``\\"text"``); only a string store may follow."""

    data: bytes


@dataclass(frozen=True, slots=True)
class FetchEventField(FetchInsn):
    """Load field ``name`` of the attached event's record (an event probe's ``$FIELD``,
    Linux's FETCH_OP_TP_ARG): ``offset``/``size``/``is_signed`` where it lies in the
    record; ``string`` how a string field finds its text (``data_loc``, ``rel_loc``,
    ``static``: the text's address in the record; ``pointer``: the pointer stored
    there), ``""`` for a number."""

    name: str
    offset: int
    size: int
    is_signed: bool = False
    string: str = ""


@dataclass(frozen=True, slots=True)
class Deref(FetchInsn):
    """Replace the value by the unsigned long at ``value + offset``."""

    offset: int
    user: bool = False


@dataclass(frozen=True, slots=True)
class StoreRaw(FetchInsn):
    """Store the low ``size`` bytes of the value."""

    size: int


@dataclass(frozen=True, slots=True)
class StoreMem(FetchInsn):
    """Store ``size`` bytes read at ``value + offset``."""

    offset: int
    size: int
    user: bool = False


@dataclass(frozen=True, slots=True)
class StoreString(FetchInsn):
    """Store a string found at ``value + offset``.

    ``kind`` is ``string`` (kernel memory), ``ustring`` (user memory) or ``symstr`` (the
    symbol name of the address).
    """

    offset: int
    kind: str


@dataclass(frozen=True, slots=True)
class ModBitfield(FetchInsn):
    """Keep a bitfield of the stored value: ``(x << lshift) >> rshift`` in ``basesize`` bytes."""

    lshift: int
    rshift: int
    basesize: int


@dataclass(frozen=True, slots=True)
class LoopArray(FetchInsn):
    """Repeat the store for ``count`` consecutive elements."""

    count: int


@dataclass(frozen=True)
class FetchProgram:
    """A compiled fetch argument: instructions plus what the record needs to know.

    ``count`` is the array length (0 for a scalar).  Programs compare by value and are
    hashable; the probe-hit path only reads the precomputed fields.
    """

    insns: tuple[FetchInsn, ...]
    fetch_type: FetchType
    count: int = 0
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.insns, self.fetch_type, self.count)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def is_dynamic(self) -> bool:
        """Return True when the argument stores strings (data_loc + dynamic bytes)."""
        return self.fetch_type.is_string

    @property
    def record_size(self) -> int:
        """Return the bytes this argument takes in the fixed part of the record."""
        return self.fetch_type.size * (self.count or 1)


# --------------------------------------------------------------------------- compiling

def _too_many_ops(offset: int) -> ProbeParseError:
    return ProbeParseError("TOO_MANY_OPS", errno.EINVAL, offset=offset)


def compile_fetch_program(
    operand: Sequence[tuple[FetchInsn, int]],
    fetch_type: FetchType,
    *,
    count: int = 0,
    bitfield: tuple[int, int] | None = None,
    type_offset: int = 0,
    body_offset: int = 0,
) -> FetchProgram:
    """Return the fetch program for one argument, checking Linux's 16-slot limit (§3.3).

    ``operand`` lists the instructions of the fetcharg innermost first, each with the word
    offset Linux reports if that instruction does not fit (the inner operand of a
    dereference).  ``bitfield`` is (width, bit offset) of a ``b<W>@<O>/<C>`` type,
    ``type_offset`` the offset of the type text in the word, ``body_offset`` where the body
    (after ``NAME=``) starts.  Raises :class:`ProbeParseError` (``TOO_MANY_OPS``, ``BAD_STRING``,
    ``BAD_SYMSTRING``, ``BAD_BITFIELD``) with ``offset`` set; the caller fills ``index``.
    """
    code: list[FetchInsn] = []
    limit = FETCH_INSN_MAX - 1          # the last slot always holds END
    used = 0
    for insn, err_offset in operand:
        if used and used + insn.slots > limit:
            raise _too_many_ops(err_offset)
        code.append(insn)
        used += insn.slots
    last = code[-1]

    def push(insn: FetchInsn, err: ProbeParseError) -> None:
        nonlocal used
        if used + insn.slots > limit:
            raise err
        code.append(insn)
        used += insn.slots

    if fetch_type.is_string:
        kind = fetch_type.name
        if kind == "symstr":
            if not isinstance(last, (FetchReg, FetchStack, FetchRetval, FetchArg, FetchRetIP,
                                     FetchEventField, Deref)) or (
                    isinstance(last, Deref) and last.user):
                raise ProbeParseError("BAD_SYMSTRING", errno.EINVAL, offset=type_offset)
        elif not isinstance(last, (Deref, FetchImm, FetchComm, FetchData, FetchEventField)):
            raise ProbeParseError("BAD_STRING", errno.EINVAL, offset=type_offset)
        keep = kind == "symstr" or count or not isinstance(last, Deref)
        if not keep:
            code.pop()
            used -= 1
        offset = 0 if keep else last.offset
        if kind == "ustring" or (not keep and last.user):
            kind = "ustring"
        store: FetchInsn = StoreString(offset, kind)
        push(store, _too_many_ops(body_offset))
    else:
        if isinstance(last, Deref):
            code.pop()
            used -= 1
            store = StoreMem(last.offset, fetch_type.size, last.user)
        else:
            store = StoreRaw(fetch_type.size)
        push(store, _too_many_ops(body_offset))

    if bitfield is not None:
        width, bit_offset = bitfield
        bits = fetch_type.size * 8
        bad = ProbeParseError("BAD_BITFIELD", errno.EINVAL, offset=type_offset)
        if not width or width + bit_offset > bits:
            raise bad
        push(ModBitfield(bits - (width + bit_offset), bits - width, fetch_type.size), bad)

    if count:
        if not (isinstance(store, StoreMem) and not store.user) and not (
                isinstance(store, StoreString) and store.kind != "symstr"):
            raise ProbeParseError("BAD_STRING", errno.EINVAL, offset=type_offset)
        push(LoopArray(count), _too_many_ops(body_offset))
    return FetchProgram(tuple(code), fetch_type, count)


# ------------------------------------------------------------------------- interpreter

_MASKS = {1: 0xFF, 2: 0xFFFF, 4: 0xFFFFFFFF, 8: _U64}


def _load(ctx: FetchContext, addr: int, size: int, user: bool) -> int:
    addr &= _U64
    # x86's address spaces do not overlap: a kernel read below TASK_SIZE reads user
    # memory (6.1's probe_mem_read under CONFIG_ARCH_HAS_NON_OVERLAPPING_ADDRESS_SPACE).
    if user or addr < TASK_SIZE:
        data = ctx.read_user(addr, size)
    else:
        data = ctx.read_kernel(addr, size)
    return int.from_bytes(data[:size], "little")


def _source(insn: FetchInsn, ctx: FetchContext) -> int:
    kind = type(insn)
    if kind is FetchReg:
        return ctx.reg(insn.name) & _U64
    if kind is FetchImm:
        return insn.value & _U64
    if kind is FetchSymbol:
        return insn.address & _U64
    if kind is FetchArg:
        if insn.index < len(_ARG_REGS):
            return ctx.reg(_ARG_REGS[insn.index]) & _U64
        return _stack_nth(ctx, insn.index - len(_ARG_REGS) + 1)
    if kind is FetchStack:
        return _stack_nth(ctx, insn.index)
    if kind is FetchStackPointer:
        return ctx.stack_pointer() & _U64
    if kind is FetchRetval:
        return ctx.retval() & _U64
    if kind is FetchRetIP:
        return ctx.ret_ip() & _U64
    if kind is FetchEventField:
        return ctx.event_field(insn) & _U64
    raise TypeError(f"{insn!r} is not a fetch source")


def _stack_nth(ctx: FetchContext, n: int) -> int:
    """Return sp[n], or 0 outside the current THREAD_SIZE-aligned stack (Linux semantics)."""
    sp = ctx.stack_pointer() & _U64
    addr = sp + 8 * n
    if addr & ~(_THREAD_SIZE - 1) != sp & ~(_THREAD_SIZE - 1):
        return 0
    try:
        return _load(ctx, addr, 8, False)
    except FetchFault:
        return 0


def _fetch_string(ctx: FetchContext, kind: str, addr: int) -> bytes | None:
    addr &= _U64
    try:
        if kind == "symstr":
            name = ctx.symbolize(addr)
            text = name.encode("latin-1") if name is not None else b"0x%x" % addr
        elif kind == "ustring" or addr < TASK_SIZE:     # as _load's kernel reads
            text = ctx.read_user_string(addr, MAX_STRING_SIZE)
        else:
            text = ctx.read_kernel_string(addr, MAX_STRING_SIZE)
    except FetchFault:
        return None
    return bytes(text[:MAX_STRING_SIZE - 1])


def run(program: FetchProgram, ctx: FetchContext):
    """Interpret ``program`` at a probe hit.

    Returns an ``int`` (unsigned, truncated to the type, bitfield applied) for numeric
    arguments, ``bytes`` (without NUL) or ``None`` (fault) for strings, and a tuple of those
    for arrays.  A fault while following dereferences yields 0 / ``None`` for every element.
    """
    insns = program.insns
    first = insns[0]
    if type(first) is FetchComm:
        comm = ctx.comm()
        return comm.encode("latin-1")[:15] if isinstance(comm, str) else bytes(comm[:15])
    if type(first) is FetchData:
        return first.data
    count = program.count
    try:
        val = _source(first, ctx)
        lval = val
        i = 1
        last_deref = None
        while type(insns[i]) is Deref:
            last_deref = insns[i]
            lval = val
            val = _load(ctx, val + last_deref.offset, 8, last_deref.user)
            i += 1
    except FetchFault:
        if program.fetch_type.is_string:
            return (None,) * count if count else None
        return (0,) * count if count else 0
    store = insns[i]
    bitfield = insns[i + 1] if i + 1 < len(insns) and type(insns[i + 1]) is ModBitfield else None

    if type(store) is StoreString:
        if not count:
            return _fetch_string(ctx, store.kind, val + store.offset)
        values = [_fetch_string(ctx, store.kind, val + store.offset)]
        for k in range(1, count):
            if last_deref is None:
                # Linux cannot step a string array that has no pointer load to repeat.
                values.append(None)
                continue
            try:
                pointer = _load(ctx, lval + 8 * k + last_deref.offset, 8, last_deref.user)
            except FetchFault:
                values.extend([None] * (count - k))
                break
            values.append(_fetch_string(ctx, store.kind, pointer + store.offset))
        return tuple(values)

    if type(store) is StoreRaw:
        value = val & _MASKS[store.size]
        if bitfield is not None:
            value = _apply_bitfield(value, bitfield)
        return value

    size = store.size
    values = []
    for k in range(count or 1):
        try:
            value = _load(ctx, val + store.offset + k * size, size, store.user)
        except FetchFault:
            value = 0
        if bitfield is not None:
            value = _apply_bitfield(value, bitfield)
        values.append(value)
    return tuple(values) if count else values[0]


def _apply_bitfield(value: int, bf: ModBitfield) -> int:
    mask = _MASKS[bf.basesize]
    return ((value << bf.lshift) & mask) >> bf.rshift


# ---------------------------------------------------------------------- record layout

class RecordField(NamedTuple):
    """One field of an event record as the ``format`` file shows it."""

    type: str           # e.g. "u32", "u8[2]", "__data_loc char[]"
    name: str
    offset: int
    size: int
    is_signed: bool


COMMON_FIELDS: tuple[RecordField, ...] = (
    RecordField("unsigned short", "common_type", 0, 2, False),
    RecordField("unsigned char", "common_flags", 2, 1, False),
    RecordField("unsigned char", "common_preempt_count", 3, 1, False),
    RecordField("int", "common_pid", 4, 4, True),
)


class _ArgLike(Protocol):
    name: str
    program: FetchProgram


def _header_size(is_return: bool, event_probe: bool) -> int:
    if event_probe:
        return EPROBE_HEADER_SIZE
    return KRETPROBE_HEADER_SIZE if is_return else KPROBE_HEADER_SIZE


def _header_fields(is_return: bool, event_probe: bool) -> tuple[RecordField, ...]:
    if event_probe:
        return ()
    if is_return:
        return (RecordField("unsigned long", "__probe_func", 8, 8, False),
                RecordField("unsigned long", "__probe_ret_ip", 16, 8, False))
    return (RecordField("unsigned long", "__probe_ip", 8, 8, False),)


def build_record_fields(args: Sequence[_ArgLike], is_return: bool, *,
                        event_probe: bool = False) -> list[RecordField]:
    """Return the event fields after the common ones: the probe header (none for an
    event probe), then each arg."""
    fields = list(_header_fields(is_return, event_probe))
    offset = _header_size(is_return, event_probe)
    for arg in args:
        program = arg.program
        ftype = program.fetch_type
        type_name = f"{ftype.fmttype}[{program.count}]" if program.count else ftype.fmttype
        fields.append(RecordField(type_name, arg.name, offset, program.record_size,
                                  ftype.is_signed))
        offset += program.record_size
    return fields


def build_print_fmt(args: Sequence[_ArgLike], is_return: bool, *,
                    event_probe: bool = False) -> str:
    """Return the ``print fmt`` text of the event (without the ``print fmt: `` prefix);
    an event probe's has no probe address (PROBE_PRINT_EVENT)."""
    if event_probe:
        parts = ['"']
        refs = []
    elif is_return:
        parts = ['"(%lx <- %lx)']
        refs = [", REC->__probe_func, REC->__probe_ret_ip"]
    else:
        parts = ['"(%lx)']
        refs = [", REC->__probe_ip"]
    for arg in args:
        program = arg.program
        ftype = program.fetch_type
        if program.count:
            parts.append(f" {arg.name}={{{','.join([ftype.fmt] * program.count)}}}")
            for j in range(program.count):
                refs.append(f", __get_str({arg.name}[{j}])" if ftype.is_string
                            else f", REC->{arg.name}[{j}]")
        else:
            parts.append(f" {arg.name}={ftype.fmt}")
            refs.append(f", __get_str({arg.name})" if ftype.is_string else f", REC->{arg.name}")
    return "".join(parts) + '"' + "".join(refs)


def _format_field(f: RecordField) -> str:
    """One ``field:`` line (6.1's f_show): an array shows its length when the field
    keeps one (a static event's ``len``), else ``[]``."""
    bracket = f.type.find("[")
    if bracket < 0 or f.type.startswith("__data_loc"):
        decl = f"{f.type} {f.name}"
    else:
        decl = f"{f.type[:bracket]} {f.name}[{getattr(f, 'len', 0) or ''}]"
    return (f"\tfield:{decl};\toffset:{f.offset};\tsize:{f.size};"
            f"\tsigned:{int(f.is_signed)};\n")


def format_event_format(name: str, event_id: int, spec) -> str:
    """Return the full text of ``events/<GRP>/<EVENT>/format`` for a probe event.

    ``spec`` is the event's primary probe (anything with ``args`` and ``is_return``).
    """
    return format_fields_text(name, event_id, build_record_fields(spec.args, spec.is_return),
                              build_print_fmt(spec.args, spec.is_return))


def format_fields_text(name: str, event_id: int, fields: Sequence[RecordField],
                       print_fmt: str) -> str:
    """Return the text of an event's ``format`` file from its own fields (after the
    common ones) and its ``print fmt``."""
    lines = [f"name: {name}\n", f"ID: {event_id}\n", "format:\n"]
    lines.extend(_format_field(f) for f in COMMON_FIELDS)
    lines.append("\n")
    lines.extend(_format_field(f) for f in fields)
    lines.append("\n")
    lines.append(f"print fmt: {print_fmt}\n")
    return "".join(lines)


# ------------------------------------------------------------------ encode and print

_STRUCT_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


class _Layout:
    """The precomputed packing of one probe's arguments (cached per program tuple)."""

    __slots__ = ("programs", "fixed", "fixed_size", "kinds")

    def __init__(self, programs: tuple[FetchProgram, ...]):
        self.programs = programs
        codes = []
        kinds = []
        for program in programs:
            codes.append(_STRUCT_CODES[program.fetch_type.size] * (program.count or 1))
            # 0 scalar number, 1 number array, 2 string, 3 string array
            kinds.append((2 if program.is_dynamic else 0) + (1 if program.count else 0))
        self.fixed = struct.Struct("<" + "".join(codes))
        self.fixed_size = self.fixed.size
        self.kinds = tuple(kinds)


_LAYOUTS: dict[tuple[FetchProgram, ...], _Layout] = {}


def _layout(programs: tuple[FetchProgram, ...]) -> _Layout:
    layout = _LAYOUTS.get(programs)
    if layout is None:
        if len(_LAYOUTS) > 4096:
            _LAYOUTS.clear()
        layout = _LAYOUTS[programs] = _Layout(programs)
    return layout


def encode_args(programs: Sequence[FetchProgram], ctx: FetchContext, *,
                is_return: bool = False, event_probe: bool = False) -> bytes:
    """Return the argument bytes of a record: the fixed part, then the string data.

    The result goes right after the probe header (16 bytes, or 24 when ``is_return``);
    data_loc offsets count from the start of the record, so they include that header.
    """
    layout = _layout(programs if type(programs) is tuple else tuple(programs))
    values: list[int] = []
    dynamic: list[bytes] = []
    dyn_offset = _header_size(is_return, event_probe) + layout.fixed_size
    for program, kind in zip(layout.programs, layout.kinds):
        result = run(program, ctx)
        if kind == 0:
            values.append(result)
        elif kind == 1:
            values.extend(result)
        else:
            for text in (result if kind == 3 else (result,)):
                if text is None:
                    values.append(dyn_offset)
                else:
                    text += b"\0"
                    values.append(len(text) << 16 | dyn_offset)
                    dynamic.append(text)
                    dyn_offset += len(text)
    fixed = layout.fixed.pack(*values)
    return fixed + b"".join(dynamic) if dynamic else fixed


def _format_value(ftype: FetchType, value: int, record: bytes, symbolize) -> str:
    name = ftype.name
    if ftype.is_string:
        length = value >> 16
        if not length:
            return "(fault)"
        start = value & 0xFFFF
        data = record[start:start + length]
        end = data.find(b"\0")
        return '"' + (data if end < 0 else data[:end]).decode("latin-1") + '"'
    if name[0] == "x":
        return f"0x{value:x}"
    if name[0] == "s" and name != "symbol":
        bits = ftype.size * 8
        return str(value - (1 << bits) if value >> (bits - 1) else value)
    if name == "symbol":
        text = symbolize(value)
        return text if text is not None else f"0x{value:x}"
    return str(value)


def print_args(args: Sequence[_ArgLike], record: bytes, symbolize, *,
               is_return: bool = False, event_probe: bool = False) -> str:
    """Return the trace text of a record's arguments: `` name=value`` for each arg.

    ``record`` is the whole record (common header included); ``symbolize(addr)`` returns
    ``sym+0xoff/0xsize`` or ``None``.  Numbers print as Linux's ``%u %d 0x%x %pS``, strings
    quoted or ``(fault)``, arrays as ``{a,b}``.
    """
    layout = _layout(tuple(arg.program for arg in args))
    start = _header_size(is_return, event_probe)
    values = layout.fixed.unpack_from(record, start)
    out = []
    pos = 0
    for arg in args:
        program = arg.program
        ftype = program.fetch_type
        if program.count:
            items = values[pos:pos + program.count]
            pos += program.count
            text = "{" + ",".join(_format_value(ftype, v, record, symbolize)
                                  for v in items) + "}"
        else:
            text = _format_value(ftype, values[pos], record, symbolize)
            pos += 1
        out.append(f" {arg.name}={text}")
    return "".join(out)
