"""Histogram triggers: ``hist:keys=…`` on an event's ``trigger`` file, read back through
its ``hist`` file (kernel/trace/trace_events_hist.c, Linux 6.1).

A hist command is parsed once into a :class:`HistData` — key, value and variable
fields compiled to small readers over the record's binary form, sort keys, the map
size, the actions (``onmatch``/``onmax``/``onchange`` with ``trace``/``save``/
``snapshot``) — and a :class:`HistTrigger` on the event's trigger list.  A hit reads
the keys, finds or inserts the table entry, adds the values, sets the variables and
runs the actions; inter-event variables (``$ts0`` set on one event, read on another)
are looked up by the same key, as in Linux, and are read once.  A synthetic event is
generated through the :class:`~kprobefs.tracing.trigger.TriggerHost`'s ``trace_synth``.

Errors follow Linux: the errno of the write and, where Linux logs one, an ``error_log``
entry at ``hist:SYS:EVENT`` with the command as ``hist:…`` and the caret at the first
occurrence of the offending text.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from kprobefs.tracing.fetch import COMMON_FIELDS
from kprobefs.tracing.trigger import (
    EventTrigger, EventTriggers, TriggerHit, _kstrtoul, compile_trigger_filter,
)

__all__ = ["HistData", "HistTrigger", "HistField", "parse_hist_command",
           "hist_file_text", "HIST_ERRORS"]

HIST_ERRORS = {
    "DUPLICATE_VAR": "Variable already defined",
    "TOO_MANY_VARS": "Too many variables defined",
    "NAMED_MISMATCH": "Named hist trigger doesn't match existing named trigger "
                      "(includes variables)",
    "TRIGGER_EEXIST": "Hist trigger already exists",
    "TRIGGER_ENOENT_CLEAR": "Can't clear or continue a nonexistent hist trigger",
    "SET_CLOCK_FAIL": "Couldn't set trace_clock",
    "BAD_FIELD_MODIFIER": "Invalid field modifier",
    "TOO_MANY_SUBEXPR": "Too many subexpressions (3 max)",
    "TIMESTAMP_MISMATCH": "Timestamp units in expression don't match",
    "EVENT_FILE_NOT_FOUND": "Event file not found",
    "HIST_NOT_FOUND": "Matching event histogram not found",
    "HIST_CREATE_FAIL": "Couldn't create histogram for field",
    "SYNTH_EVENT_NOT_FOUND": "Couldn't find synthetic event",
    "SYNTH_COUNT_MISMATCH": "Param count doesn't match synthetic event field count",
    "FIELD_VAR_CREATE_FAIL": "Couldn't create field variable",
    "ONX_NOT_VAR": "For onmax(x) or onchange(x), x must be a variable",
    "ONX_VAR_NOT_FOUND": "Couldn't find onmax or onchange variable",
    "TOO_MANY_PARAMS": "Too many action params",
    "PARAM_NOT_FOUND": "Couldn't find param",
    "ACTION_NOT_FOUND": "No action found",
    "NO_SAVE_PARAMS": "No params found for save()",
    "ACTION_MISMATCH": "Handler doesn't support action",
    "NO_CLOSING_PAREN": "No closing paren found",
    "SUBSYS_NOT_FOUND": "Missing subsystem",
    "INVALID_SUBSYS_EVENT": "Invalid subsystem or event name",
    "INVALID_REF_KEY": "Using variable references in keys not supported",
    "VAR_NOT_FOUND": "Couldn't find variable",
    "FIELD_NOT_FOUND": "Couldn't find field",
    "EMPTY_ASSIGNMENT": "Empty assignment",
    "INVALID_SORT_MODIFIER": "Invalid sort modifier",
    "EMPTY_SORT_FIELD": "Empty sort field",
    "TOO_MANY_SORT_FIELDS": "Too many sort fields (Max = 2)",
    "INVALID_SORT_FIELD": "Sort field must be a key or a val",
    "INVALID_STR_OPERAND": "String type can not be an operand in expression",
    "UNARY_MINUS_SUBEXPR": "Unary minus not supported in sub-expressions",
    "DIVISION_BY_ZERO": "Division by zero",
}

_BITS_DEFAULT, _BITS_MIN, _BITS_MAX = 11, 7, 17
_KEYS_MAX, _VALS_MAX, _VARS_MAX, _SORT_KEYS_MAX = 3, 3, 16, 2
_STACK_DEPTH = 16
_STR_VAR_LEN_MAX = 256
_MAX_FILTER_STR_VAL = 256
_U64 = (1 << 64) - 1
_ACTIONS_MAX = 8
_PARAMS_MAX = 64

# Field flags (the kernel's HIST_FIELD_FL_*), and the modifier each shows as.
HEX, SYM, SYM_OFFSET, EXECNAME, SYSCALL, LOG2, BUCKET, USECS, PERCENT, GRAPH = (
    1 << i for i in range(10))
TIMESTAMP, CPU, STRING, VAR, VAR_REF, EXPR, CONST, ALIAS, KEY, STACKTRACE = (
    1 << i for i in range(10, 20))
_MODIFIER_NAMES = ((HEX, "hex"), (SYM, "sym"), (SYM_OFFSET, "sym-offset"),
                   (EXECNAME, "execname"), (SYSCALL, "syscall"), (LOG2, "log2"),
                   (BUCKET, "buckets"), (USECS, "usecs"), (PERCENT, "percent"),
                   (GRAPH, "graph"))


class HistError(OSError):
    """A rejected hist command: errno, and the error_log message and the text whose
    first occurrence in the command gets the caret (``None``: column 0; ``log`` False
    when Linux logs nothing)."""

    def __init__(self, err: int, code: str | None = None, where: str | None = None):
        super().__init__(err, HIST_ERRORS.get(code, "hist error") if code else "hist error")
        self.code = code
        self.where = where


def _fail(code: str | None, where: str | None = None, err: int = errno.EINVAL):
    raise HistError(err, code, where)


# --------------------------------------------------------------------------- fields

@dataclass(eq=False)
class HistField:
    """A key, value, variable or operand: how to read it from a record and how it
    prints.  ``read(record, hit, refs)`` returns an int (u64) or bytes (strings)."""

    name: str
    flags: int = 0
    read: Callable[[bytes, TriggerHit, dict], Any] | None = None
    size: int = 8
    is_signed: bool = False
    var_name: str | None = None
    buckets: int = 0
    constant: int = 0
    operands: tuple = ()
    ref: Any = None                  # VAR_REF: (hist data, variable name)
    read_once: bool = False

    @property
    def is_string(self) -> bool:
        return bool(self.flags & STRING)

    def modifier(self) -> str | None:
        for flag, text in _MODIFIER_NAMES:
            if self.flags & flag:
                return text
        return None

    def spec(self) -> str:
        """hist_field_print: how the trigger file shows the field."""
        out = f"{self.var_name}=" if self.var_name else ""
        if self.flags & CPU:
            out += "common_cpu"
        elif self.flags & CONST:
            out += str(self.constant)
        elif self.name:
            if self.flags & (VAR_REF | ALIAS):
                out += "$"
            out += self.name
        elif self.flags & TIMESTAMP:
            out += "common_timestamp"
        if self.flags and not self.flags & (VAR_REF | EXPR):
            mod = self.modifier()
            if mod:
                out += "." + mod
        if self.buckets:
            out += f"={self.buckets}"
        return out

    def expr_text(self) -> str:
        """expr_field_str: how the field shows inside an expression's name."""
        if self.flags & VAR_REF:
            out = "$" + self.name
        elif self.flags & CONST:
            out = str(self.constant)
        else:
            out = self.name
        if self.flags and not self.flags & VAR_REF:
            mod = self.modifier()
            if mod:
                out += "." + mod
        return out


def _event_fields(triggers: EventTriggers) -> dict:
    table = {f.name: f for f in COMMON_FIELDS}
    for f in triggers.record_fields:
        table[f.name] = f
    return table


def _is_string_type(type_: str) -> bool:
    return "char[" in type_ or type_ == "string"


def _field_reader(rf) -> tuple[Callable, int, bool, bool]:
    """Return (read, size, is_signed, is_string) for a RecordField."""
    offset = rf.offset
    if rf.type.startswith("__data_loc"):
        if not _is_string_type(rf.type):
            _fail("FIELD_NOT_FOUND", rf.name)

        def read_dyn(rec, hit, refs):
            loc = int.from_bytes(rec[offset:offset + 4], "little")
            start = loc & 0xFFFF
            data = rec[start:start + (loc >> 16)]
            end = data.find(b"\0")
            return data if end < 0 else data[:end]
        return read_dyn, _MAX_FILTER_STR_VAL, False, True
    if _is_string_type(rf.type):
        size = rf.size

        def read_str(rec, hit, refs):
            data = rec[offset:offset + size]
            end = data.find(b"\0")
            return data if end < 0 else data[:end]
        return read_str, size, False, True
    if rf.size not in (1, 2, 4, 8):
        _fail("FIELD_NOT_FOUND", rf.name)
    code = {1: "b", 2: "h", 4: "i", 8: "q"}[rf.size]
    unpack = struct.Struct("<" + (code if rf.is_signed else code.upper())).unpack_from

    def read_num(rec, hit, refs):
        return unpack(rec, offset)[0] & _U64
    return read_num, rf.size, rf.is_signed, False


def _log2(value: int) -> int:
    """ilog2(roundup_pow_of_two(value)) of hist_field_log2 (0 stays 0)."""
    if value <= 1:
        return 0
    return (value - 1).bit_length()


# ------------------------------------------------------------------- the hist data

@dataclass(eq=False)
class _Elt:
    """One table entry: the sums, the variables, the execname and action state."""

    sums: list
    vars: dict = field(default_factory=dict)
    comm: str = ""
    track: dict = field(default_factory=dict)      # action index -> tracked value
    saved: dict = field(default_factory=dict)      # action index -> saved values


@dataclass(eq=False)
class _Action:
    handler: str                     # onmatch / onmax / onchange
    action: str                      # trace / save / snapshot
    action_name: str                 # what follows the handler's '.'
    params: list
    match_system: str = ""
    match_event: str = ""
    var_text: str = ""
    track_field: HistField | None = None
    synth: Any = None
    use_trace_keyword: bool = False
    param_fields: list = field(default_factory=list)

    def spec(self) -> str:
        if self.action == "trace":
            head = [self.synth_name] if self.use_trace_keyword else []
            inner = ",".join(head + self.params)
        elif self.action == "save":
            inner = ",".join(self.params)
        else:
            inner = ""
        if self.handler == "onmatch":
            return f":onmatch({self.match_system}.{self.match_event}).{self.action_name}({inner})"
        return f":{self.handler}({self.var_text}).{self.action_name}({inner})"

    synth_name: str = ""


class HistData:
    """A histogram: its fields, sort keys, map and actions (hist_trigger_data)."""

    def __init__(self, triggers: EventTriggers, attrs: "_Attrs"):
        self.triggers = triggers
        self.attrs = attrs
        self.keys: list[HistField] = []
        self.vals: list[HistField] = []          # hitcount first
        self.vars: list[HistField] = []
        self.sort_keys: list[tuple[int, bool]] = [(0, False)]   # (index into keys+vals)
        self.map_bits = attrs.map_bits or _BITS_DEFAULT
        self.actions: list[_Action] = []
        self.var_refs: list[HistField] = []
        self.field_var_hists: list[tuple[EventTriggers, str]] = []   # made for params
        self.snapshot_taken: tuple | None = None     # (action, value, key, entry)
        self.enable_timestamps = False
        self.table: dict[tuple, _Elt] = {}
        self.hits = 0
        self.drops = 0

    # ------------------------------------------------------------ the hit
    def key_of(self, record: bytes, hit: TriggerHit) -> tuple:
        return tuple(k.read(record, hit, None) for k in self.keys)

    def lookup_var(self, key: tuple, name: str, once: bool):
        """The value of variable ``name`` in the entry for ``key`` (None if unset).

        Like Linux, which compares the first key_size bytes of the referring key, a
        longer compound key matches on its leading fields."""
        elt = self.table.get(key[:len(self.keys)])
        if elt is None or name not in elt.vars:
            return None
        return elt.vars.pop(name) if once else elt.vars[name]

    def hit(self, record: bytes, hit: TriggerHit) -> None:
        key = self.key_of(record, hit)
        refs: dict = {}
        for ref in self.var_refs:
            data, name = ref.ref
            if data is self:
                continue
            value = data.lookup_var(key, name, ref.read_once)
            if value is None:
                return
            refs[id(ref)] = value
        elt = self.table.get(key)
        if elt is None:
            if len(self.table) >= 1 << self.map_bits:
                self.drops += 1
                return
            elt = _Elt([0] * len(self.vals), comm=hit.comm() if any(
                k.flags & EXECNAME for k in self.keys) else "")
            self.table[key] = elt
        self.hits += 1
        elt_refs = _EltRefs(self, key, refs)
        sums = elt.sums
        sums[0] += 1
        for i in range(1, len(self.vals)):
            value = self.vals[i].read(record, hit, elt_refs)
            sums[i] = (sums[i] + value) & _U64
        for var in self.vars:
            elt.vars[var.var_name] = var.read(record, hit, elt_refs)
        for ref in self.var_refs:
            data, name = ref.ref
            if data is self:
                value = elt.vars.get(name)
                if value is None:
                    return
                refs[id(ref)] = value
        for index, action in enumerate(self.actions):
            _run_action(self, index, action, elt, record, hit, elt_refs)

    def clear(self) -> None:
        self.table.clear()
        self.snapshot_taken = None
        self.hits = 0
        self.drops = 0

    # ------------------------------------------------------------ printing
    def spec(self) -> str:
        """event_hist_trigger_print without the filter and the [state]."""
        out = "hist:"
        if self.attrs.name:
            out += f"{self.attrs.name}:"
        out += "keys=" + ",".join("stacktrace" if k.flags & STACKTRACE else k.spec()
                                  for k in self.keys)
        out += ":vals=hitcount" + "".join("," + v.spec() for v in self.vals[1:])
        if self.vars:
            out += ":" + ",".join(v.spec() for v in self.vars)
        fields = self.vals + self.keys
        parts = []
        for idx, descending in self.sort_keys:
            parts.append(("hitcount" if idx == 0 else fields[idx].spec())
                         + (".descending" if descending else ""))
        out += ":sort=" + ",".join(parts)
        out += f":size={1 << self.map_bits}"
        if self.enable_timestamps:
            out += f":clock={self.attrs.clock}"
        out += "".join(a.spec() for a in self.actions)
        return out

    def entries_text(self, symbolize, syscall_name) -> tuple[str, int]:
        """Return the entries' lines, sorted, and how many there are."""
        n_vals = len(self.vals)
        items = list(self.table.items())

        def sort_value(item, idx):
            key, elt = item
            return elt.sums[idx] if idx < n_vals else key[idx - n_vals]
        for idx, descending in reversed(self.sort_keys):
            items.sort(key=lambda item: sort_value(item, idx), reverse=descending)
        stats = {}
        for i, v in enumerate(self.vals):
            if v.flags & (PERCENT | GRAPH):
                column = [elt.sums[i] for _k, elt in items]
                stats[i] = (max(column, default=0), sum(column))
        lines = []
        for key, elt in items:
            text = _key_text(self, key, elt, symbolize, syscall_name)
            text += _val_text(elt.sums[0], "hitcount", 0, None)
            for i in range(1, n_vals):
                v = self.vals[i]
                text += " " + _val_text(elt.sums[i], v.name, v.flags, stats.get(i))
            for index, action in enumerate(self.actions):
                if action.handler in ("onmax", "onchange") and action.action != "snapshot":
                    text += _track_text(action, elt, index)
                elif action.handler in ("onmax", "onchange"):
                    text += _track_head(action, elt, index)
            lines.append(text + "\n")
        return "".join(lines), len(items)


class _EltRefs:
    """Variable values a hit's expressions read: other events' (resolved before the
    update) and this histogram's own, from the entry being updated."""

    __slots__ = ("data", "key", "refs")

    def __init__(self, data: HistData, key: tuple, refs: dict):
        self.data, self.key, self.refs = data, key, refs

    def value(self, ref: HistField) -> int:
        got = self.refs.get(id(ref))
        if got is not None:
            return got
        data, name = ref.ref
        value = data.lookup_var(self.key, name, False)
        return 0 if value is None else value


def _key_text(data: HistData, key: tuple, elt: _Elt, symbolize, syscall_name) -> str:
    parts = []
    multiline = False
    for kf, value in zip(data.keys, key):
        name = kf.name
        flags = kf.flags
        if flags & STACKTRACE:
            lines = "".join(f"{' ' * 9}{_sym(symbolize, a, True)}\n" for a in value if a)
            parts.append("stacktrace:\n" + lines)
            multiline = True
        elif flags & HEX:
            parts.append(f"{name}: {value:x}")
        elif flags & SYM:
            parts.append(f"{name}: [{value:x}] {_sym(symbolize, value, False):<45}")
        elif flags & SYM_OFFSET:
            parts.append(f"{name}: [{value:x}] {_sym(symbolize, value, True):<55}")
        elif flags & EXECNAME:
            parts.append(f"{name}: {elt.comm:<16}[{value:10d}]")
        elif flags & SYSCALL:
            call = syscall_name(value) or "unknown_syscall"
            parts.append(f"{name}: {call:<30}[{value:3d}]")
        elif flags & LOG2:
            parts.append(f"{name}: ~ 2^{value:<2d}")
        elif flags & BUCKET:
            parts.append(f"{name}: ~ {value}-{value + kf.buckets - 1}")
        elif flags & STRING:
            parts.append(f"{name}: {value.decode('latin-1'):<50}")
        else:
            parts.append(f"{name}: {value:10d}")
    return "{ " + ", ".join(parts) + ("" if multiline else " ") + "}"


def _sym(symbolize, addr: int, offset: bool) -> str:
    text = symbolize(addr, offset)
    return text if text is not None else f"0x{addr:x}"


def _percentage(val: int, total: int) -> int | None:
    if not total:
        return None if val else 0
    return val * 10000 // total


def _val_text(val: int, name: str, flags: int, stat) -> str:
    if flags & PERCENT:
        pc = _percentage(val, stat[1])
        if pc is None:
            return f" {name} (%):[ERROR]"
        return f" {name} (%): {pc // 100:3d}.{pc % 100:02d}"
    if flags & GRAPH:
        pc = _percentage(val, stat[0])
        if pc is None:
            bar = "[ERROR]"
        else:
            n = min(pc * 20 // 10000, 20)
            bar = "#" * n + " " * (20 - n)
        return f" {name}: {bar:>20}"
    if flags & HEX:
        return f" {name}: {val:10x}"
    return f" {name}: {val:10d}"


def _track_head(action: _Action, elt: _Elt, index: int) -> str:
    label = "max" if action.handler == "onmax" else "changed"
    return f"\n\t{label}: {elt.track.get(index, 0):10d}"


def _track_text(action: _Action, elt: _Elt, index: int) -> str:
    text = _track_head(action, elt, index)
    saved = elt.saved.get(index, {})
    for name, pf in zip(action.params, action.param_fields):
        value = saved.get(name, b"" if pf.is_string else 0)
        if pf.is_string:
            text += f"  {name}: {value.decode('latin-1'):<32}"
        else:
            text += f"  {name}: {value:10d}"
    return text


# --------------------------------------------------------------------- actions

def _run_action(data: HistData, index: int, action: _Action, elt: _Elt, record: bytes,
                hit: TriggerHit, refs: _EltRefs) -> None:
    host = data.triggers.host
    if action.handler == "onmatch":
        values = [pf.read(record, hit, refs) for pf in action.param_fields]
        host.trace_synth(action.synth, values, hit)
        return
    value = action.track_field.read(record, hit, refs)
    old = elt.track.get(index, 0)          # both handlers start from 0, as in 6.1
    if value <= old if action.handler == "onmax" else value == old:
        return
    elt.track[index] = value
    if action.action == "save":
        elt.saved[index] = {name: pf.read(record, hit, refs)
                            for name, pf in zip(action.params, action.param_fields)}
    elif action.action == "snapshot":
        host.snapshot()
        data.snapshot_taken = (action, value, refs.key, elt)
    else:
        values = [pf.read(record, hit, refs) for pf in action.param_fields]
        host.trace_synth(action.synth, values, hit)


# ------------------------------------------------------------------- parsing

@dataclass
class _Attrs:
    keys: str | None = None
    vals: str | None = None
    sort: str | None = None
    name: str | None = None
    clock: str = "global"
    map_bits: int = 0
    assignments: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    pause: bool = False
    cont: bool = False
    clear: bool = False


def _parse_attrs(param: str) -> _Attrs:
    attrs = _Attrs()
    for part in param.split(":"):
        eq = part.find("=")
        if eq >= 0:
            if not part[eq + 1:]:
                _fail("EMPTY_ASSIGNMENT", part)
            for prefix in ("keys=", "key="):
                if part.startswith(prefix):
                    attrs.keys = part[len(prefix):]
                    break
            else:
                if part.startswith(("vals=", "val=", "values=")):
                    attrs.vals = part[eq + 1:]
                elif part.startswith("sort="):
                    attrs.sort = part[5:]
                elif part.startswith("name="):
                    attrs.name = part
                elif part.startswith("clock="):
                    attrs.clock = part[6:].strip(" \t\n")
                elif part.startswith("size="):
                    size = _kstrtoul(part[5:])
                    if size is None:
                        _fail(None)
                    bits = max(size - 1, 0).bit_length()
                    if not _BITS_MIN <= bits <= _BITS_MAX:
                        _fail(None)
                    attrs.map_bits = bits
                else:
                    if len(attrs.assignments) == _VARS_MAX:
                        _fail("TOO_MANY_VARS", part)
                    attrs.assignments.append(part)
        elif part == "pause":
            attrs.pause = True
        elif part in ("cont", "continue"):
            attrs.cont = True
        elif part == "clear":
            attrs.clear = True
        elif part.startswith(("onmatch(", "onmax(", "onchange(")) and \
                len(attrs.actions) < _ACTIONS_MAX:
            attrs.actions.append(part)
        else:
            _fail(None)
    if attrs.keys is None:
        _fail(None)
    return attrs


class _Builder:
    """Turns attrs into a HistData's fields (create_hist_data)."""

    def __init__(self, data: HistData, remove: bool):
        self.data = data
        self.triggers = data.triggers
        self.event_fields = _event_fields(data.triggers)
        self.remove = remove

    # ---------------------------------------------------------- atoms
    def parse_field(self, text: str, flags: int) -> HistField:
        name, dot, modifier = text.partition(".")
        buckets = 0
        if dot:
            if modifier == "hex":
                flags |= HEX
            elif modifier == "sym":
                flags |= SYM
            elif modifier == "symXoffset":
                flags |= SYM_OFFSET
            elif modifier == "execname" and name == "common_pid":
                flags |= EXECNAME
            elif modifier == "syscall":
                flags |= SYSCALL
            elif modifier == "log2":
                flags |= LOG2
            elif modifier == "usecs":
                flags |= USECS
            elif modifier.startswith("bucket"):
                rest = modifier[6:]
                if rest.startswith("s"):
                    rest = rest[1:]
                value = _kstrtoul(rest[1:]) if rest.startswith("=") else None
                if not value:
                    _fail("BAD_FIELD_MODIFIER", modifier)
                buckets = value
                flags |= BUCKET
            elif modifier.startswith("percent") and not flags & (VAR | KEY):
                flags |= PERCENT
            elif modifier.startswith("graph") and not flags & (VAR | KEY):
                flags |= GRAPH
            else:
                _fail("BAD_FIELD_MODIFIER", modifier)
        if name == "common_timestamp":
            flags |= TIMESTAMP
            self.data.enable_timestamps = True
            usecs = bool(flags & USECS)

            def read_ts(rec, hit, refs):
                return hit.ts // 1000 if usecs else hit.ts
            return HistField("common_timestamp", flags, read_ts)
        if name in ("common_cpu", "cpu", "CPU"):
            return HistField("common_cpu", flags | CPU, lambda rec, hit, refs: hit.cpu, 4,
                             True)
        rf = self.event_fields.get(name)
        if rf is None:
            _fail("FIELD_NOT_FOUND", name)
        read, size, signed, is_string = _field_reader(rf)
        if is_string:
            flags |= STRING
        hf = HistField(name, flags, read, size, signed, buckets=buckets)
        if flags & LOG2:
            hf.read = lambda rec, hit, refs, _r=read: _log2(_r(rec, hit, refs))
        elif flags & BUCKET:
            hf.read = lambda rec, hit, refs, _r=read, _b=buckets: _r(rec, hit, refs) // _b * _b
        return hf

    def parse_atom(self, text: str, flags: int, var_name: str | None) -> HistField:
        if text[:1].isdigit():
            value = _kstrtoul(text)
            if value is None:
                _fail(None)
            return HistField("", CONST, lambda rec, hit, refs, _v=value: _v,
                             constant=value, var_name=var_name)
        system = event = None
        ref_var = text
        if text.count(".") >= 2:
            system, event, ref_var = text.split(".", 2)
        if ref_var.startswith("$"):
            return self.parse_var_ref(system, event, ref_var[1:], var_name)
        hf = self.parse_field(ref_var if system is None else text, flags)
        hf.var_name = var_name
        return hf

    def parse_var_ref(self, system, event, name, var_name) -> HistField:
        data = self.find_var(system, event, name)
        if data is None:
            _fail("VAR_NOT_FOUND", name)
        var = next(v for v in data.vars if v.var_name == name)
        ref = HistField(name, VAR_REF | (var.flags & (USECS | TIMESTAMP | STRING)),
                        None, var.size, var.is_signed, ref=(data, name))
        ref.read = lambda rec, hit, refs, _f=ref: refs.value(_f)
        self.data.var_refs.append(ref)
        if var_name:
            alias = HistField(name, ALIAS | (ref.flags & ~VAR_REF), ref.read, ref.size,
                              ref.is_signed, var_name=var_name, operands=(ref,))
            return alias
        return ref

    def _var_on_event(self, name: str) -> bool:
        """Whether a hist trigger of this event already defines ``name``."""
        return any(isinstance(t, HistTrigger) and any(v.var_name == name for v in t.data.vars)
                   for t in self.triggers.items)

    def find_var(self, system, event, name) -> HistData | None:
        for v in self.data.vars:
            if v.var_name == name:
                return self.data
        host = self.triggers.host
        if system is not None:
            target = host.find_event(system, event)
            pools = [host.event_triggers(target)] if target is not None else []
        else:
            pools = [self.triggers] + [t for t in host.all_triggers()
                                       if t is not self.triggers]
        for pool in pools:
            for trig in pool.items:
                if isinstance(trig, HistTrigger):
                    if any(v.var_name == name for v in trig.data.vars):
                        return trig.data
        return None

    # ---------------------------------------------------------- expressions
    def parse_expr(self, text: str, flags: int, var_name: str | None,
                   depth: list) -> HistField:
        if depth[0] > 3:
            _fail("TOO_MANY_SUBEXPR", text)
        op, pos = _contains_operator(text)
        if op is None:
            return self.parse_atom(text, flags, var_name)
        if op == "neg":
            return self.parse_unary(text, flags, var_name, depth)
        depth[0] += 1
        left, right = text[:pos], text[pos + 1:]
        if not left or not right:
            _fail(None)
        op1 = self.parse_expr(left, 0, None, depth)
        if op1.is_string:
            _fail("INVALID_STR_OPERAND", left)
        op2 = self.parse_expr(right, 0, None, depth)
        if op2.is_string:
            _fail("INVALID_STR_OPERAND", right)
        if (op1.flags & USECS) != (op2.flags & USECS):
            _fail("TIMESTAMP_MISMATCH")
        if op == "/" and op2.flags & CONST and not op2.constant:
            _fail("DIVISION_BY_ZERO", right, errno.EDOM)
        for operand in (op1, op2):
            if operand.flags & VAR_REF:
                operand.read_once = True
        fn = _OPS[op]
        r1, r2 = op1.read, op2.read

        def read(rec, hit, refs):
            return fn(r1(rec, hit, refs), r2(rec, hit, refs))
        ts_flags = op1.flags & (TIMESTAMP | USECS)
        name = op1.expr_text() + op + op2.expr_text()
        if op1.flags & op2.flags & CONST:
            value = fn(op1.constant, op2.constant)
            return HistField("", CONST | ts_flags, lambda rec, hit, refs, _v=value: _v,
                             constant=value, var_name=var_name)
        return HistField(name, EXPR | ts_flags, read, 8, op1.is_signed,
                         var_name=var_name, operands=(op1, op2))

    def parse_unary(self, text: str, flags: int, var_name: str | None,
                    depth: list) -> HistField:
        depth[0] += 1
        if depth[0] > 3:
            _fail("TOO_MANY_SUBEXPR", text)
        body = text[1:]
        if "(" not in body:
            _fail(None)
        body = body[1:]
        close = body.rfind(")")
        if close < 0:
            _fail(None)
        if close != len(body) - 1:
            _fail("UNARY_MINUS_SUBEXPR", body)
        inner = body[:close]
        operand = self.parse_expr(inner, 0, None, depth)
        if operand.is_string:
            _fail("INVALID_STR_OPERAND", inner)
        r = operand.read
        return HistField(f"-({operand.expr_text()})", EXPR | (operand.flags & (TIMESTAMP | USECS)),
                         lambda rec, hit, refs: (-r(rec, hit, refs)) & _U64, 8, True,
                         var_name=var_name, operands=(operand,))

    # ---------------------------------------------------------- the fields
    def build(self) -> None:
        data, attrs = self.data, self.data.attrs
        data.vals.append(HistField("hitcount"))
        if attrs.vals:
            parts = attrs.vals.split(",")
            j = 1
            i = 0
            while i < len(parts) and i < _VALS_MAX and j < _VALS_MAX:
                part = parts[i]
                i += 1
                if part == "hitcount":
                    continue
                hf = self.parse_expr(part, 0, None, [0])
                if hf.is_string:
                    _fail(None)
                data.vals.append(hf)
                j += 1
            rest = parts[i:]
            if rest and rest != ["hitcount"]:
                _fail(None)
        names = set()
        for assignment in attrs.assignments:
            var_name, _, expr = assignment.partition("=")
            if not self.remove and (var_name in names or self._var_on_event(var_name)):
                _fail("DUPLICATE_VAR", var_name)
            names.add(var_name)
            hf = self.parse_expr(expr, VAR, var_name, [0])
            hf.var_name = var_name
            hf.flags |= VAR
            data.vars.append(hf)
        keys = attrs.keys.split(",")
        if len(keys) > _KEYS_MAX:
            _fail(None)
        for key in keys:
            if key == "stacktrace":
                data.keys.append(HistField("stacktrace", STACKTRACE | KEY,
                                           lambda rec, hit, refs: hit.stack()[:_STACK_DEPTH]))
                continue
            hf = self.parse_expr(key, KEY, None, [0])
            if hf.flags & (VAR_REF | ALIAS) or any(
                    o.flags & VAR_REF for o in hf.operands):
                _fail("INVALID_REF_KEY", key)
            hf.flags |= KEY
            if hf.flags & EXPR or hf.flags & CONST:
                _fail(None)
            data.keys.append(hf)
        self.sort_keys()
        for text in attrs.actions:
            self.parse_action(text)
        # own variables referenced by this histogram's expressions resolve per entry
        for ref in data.var_refs:
            if ref.ref[0] is data:
                ref.read = lambda rec, hit, refs, _f=ref: _own_var(refs, _f)

    def sort_keys(self) -> None:
        data = self.data
        text = data.attrs.sort
        if text is None:
            return
        parts = text.split(",")
        sort_keys = []
        fields = data.vals + data.keys
        for i in range(_SORT_KEYS_MAX):
            if i >= len(parts):
                break
            part = parts[i]
            if not part:
                _fail("EMPTY_SORT_FIELD", "sort=")
            if i == _SORT_KEYS_MAX - 1 and len(parts) > _SORT_KEYS_MAX:
                _fail("TOO_MANY_SORT_FIELDS", "sort=")
            name, dot, modifier = part.partition(".")
            if not name:
                _fail("EMPTY_SORT_FIELD", "sort=")
            if dot:
                if modifier == "descending":
                    descending = True
                elif modifier == "ascending":
                    descending = False
                else:
                    _fail("INVALID_SORT_MODIFIER", modifier)
            else:
                descending = False
            if name == "hitcount":
                sort_keys.append((0, descending))
                continue
            for idx, hf in enumerate(fields):
                if idx and hf.name == name:
                    sort_keys.append((idx, descending))
                    break
            else:
                _fail("INVALID_SORT_FIELD", name)
        data.sort_keys = sort_keys or [(0, False)]

    def parse_action(self, text: str) -> None:
        data = self.data
        handler, _, rest = text.partition("(")
        close = rest.find(")")
        if close < 0:
            _fail("NO_CLOSING_PAREN", rest)
        arg, after = rest[:close], rest[close + 1:]
        if not after.startswith("."):
            _fail("ACTION_NOT_FOUND", after)
        action_name, paren, params_text = after[1:].partition("(")
        if not paren or not params_text.endswith(")"):
            _fail("NO_CLOSING_PAREN", after[1:])
        params = [p.strip() for p in params_text[:-1].split(",")] if params_text[:-1] else []
        if len(params) > _PARAMS_MAX:
            _fail("TOO_MANY_PARAMS")
        act = _Action(handler, "", action_name, params)
        if handler == "onmatch":
            system, dot, event = arg.partition(".")
            if not dot:
                _fail("SUBSYS_NOT_FOUND", system)
            if data.triggers.host.find_event(system, event) is None:
                _fail("INVALID_SUBSYS_EVENT", event)
            act.match_system, act.match_event = system, event
            if action_name in ("save", "snapshot"):
                _fail("ACTION_MISMATCH", action_name)
        else:
            if not arg.startswith("$"):
                _fail("ONX_NOT_VAR", arg)
            act.var_text = arg
            if self.find_var(None, None, arg[1:]) is None:
                _fail("ONX_VAR_NOT_FOUND", arg[1:])
            act.track_field = self.parse_var_ref(None, None, arg[1:], None)
        if action_name == "save":
            if not params:
                _fail("NO_SAVE_PARAMS")
            act.action = "save"
            act.param_fields = [self.parse_param(p) for p in params]
        elif action_name == "snapshot":
            act.action = "snapshot"
        else:
            act.action = "trace"
            if action_name == "trace":
                if not params:
                    _fail("SYNTH_EVENT_NOT_FOUND")
                act.use_trace_keyword = True
                act.synth_name = params[0]
                act.params = params[1:]
            else:
                act.synth_name = action_name
            synth = data.triggers.host.find_synth(act.synth_name)
            if synth is None:
                _fail("SYNTH_EVENT_NOT_FOUND", act.synth_name)
            if len(synth.fields) != len(act.params):
                _fail("SYNTH_COUNT_MISMATCH", act.synth_name)
            act.synth = synth
            act.param_fields = [self.parse_param(p) for p in act.params]
        data.actions.append(act)

    def parse_param(self, text: str) -> HistField:
        if text.startswith("$"):
            return self.parse_var_ref(None, None, text[1:], None)
        if text.count(".") >= 2:
            system, event, rest = text.split(".", 2)
            if rest.startswith("$"):
                return self.parse_var_ref(system, event, rest[1:], None)
            return self.field_var(system, event, rest)
        try:
            return self.parse_field(text, 0)
        except HistError:
            _fail("PARAM_NOT_FOUND", text)

    def field_var(self, system: str, event: str, name: str) -> HistField:
        """``SYS.EVENT.FIELD``: a variable ``synthetic_FIELD`` set by a histogram made
        for it on that event, keyed as that event's first histogram with as many keys
        (create_field_var_hist); it goes when this histogram goes."""
        host = self.triggers.host
        target = host.find_event(system, event)
        if target is None:
            _fail("EVENT_FILE_NOT_FOUND", name)
        pool = host.event_triggers(target)
        var = f"synthetic_{name}"
        if self.find_var(system, event, var) is None:
            compatible = next((t for t in pool.items if isinstance(t, HistTrigger)
                               and len(t.data.keys) == len(self.data.keys)), None)
            if compatible is None:
                _fail("HIST_NOT_FOUND", name)
            cmd = ("keys=" + ",".join(k.name for k in compatible.data.keys)
                   + f":{var}={name}")
            if compatible.filter_text is not None:
                cmd += f" if {compatible.filter_text}"
            try:
                _parse(pool, "hist", cmd)
            except (HistError, OSError):
                _fail("HIST_CREATE_FAIL", name)
            self.data.field_var_hists.append((pool, cmd))
        return self.parse_var_ref(system, event, var, None)


def _own_var(refs: _EltRefs, ref: HistField) -> int:
    elt = refs.data.table.get(refs.key)
    value = None if elt is None else elt.vars.get(ref.ref[1])
    return 0 if value is None else value


_OPS = {
    "+": lambda a, b: (a + b) & _U64,
    "-": lambda a, b: (a - b) & _U64,
    "*": lambda a, b: (a * b) & _U64,
    "/": lambda a, b: a // b if b else _U64,
}


def _contains_operator(text: str) -> tuple[str | None, int]:
    """The root operator of an expression and its position (contains_operator)."""
    minus = text.rfind("-")
    if minus == 0:
        return "neg", 0
    plus = text.rfind("+")
    if plus >= 0 or minus >= 0:
        return ("+", plus) if plus > minus else ("-", minus)
    div = text.rfind("/")
    mult = text.rfind("*")
    if mult > div:
        return "*", mult
    if div >= 0:
        return "/", div
    return None, -1


# ----------------------------------------------------------------- the trigger

@dataclass(eq=False)
class HistTrigger(EventTrigger):
    """A ``hist`` trigger: its :class:`HistData` (shared by triggers with one name)."""

    data: HistData | None = None

    def same(self, other: EventTrigger) -> bool:
        return (isinstance(other, HistTrigger) and other.data.spec() == self.data.spec()
                and other.filter_text == self.filter_text)

    def text(self) -> str:
        out = self.data.spec()
        if self.filter_text is not None:
            out += f" if {self.filter_text}"
        return out + (" [paused]\n" if self.paused else " [active]\n")

    def fire(self, hit, host, record) -> None:
        if record is not None:
            self.data.hit(record, hit)

    def unregistered(self, triggers: EventTriggers) -> None:
        if not any(isinstance(t, HistTrigger) and t.data is self.data
                   for pool in triggers.host.all_triggers() for t in pool.items):
            _remove_field_var_hists(self.data)


def _remove_field_var_hists(data: HistData) -> None:
    """Take away the histograms made for ``data``'s field-variable params."""
    for pool, cmd in data.field_var_hists:
        try:
            _parse(pool, "!hist", cmd)
        except OSError:
            pass
    data.field_var_hists.clear()


def _split_filter(text: str) -> tuple[str, str | None]:
    """Separate ``k:v [if filter]``, allowing blanks in the trigger (Linux's scan)."""
    p = 0
    while True:
        p = text.find("if", p)
        if p < 0:
            return text, None
        if p == 0:
            _fail(None)
        if text[p - 1] not in " \t":
            p += 1
            continue
        if p >= len(text) - 2 - 1:
            _fail(None)
        if text[p + 2] not in " \t":
            p += 1
            continue
        return text[:p - 1].strip(" \t\n\v\f\r"), text[p:].strip(" \t\n\v\f\r")


def parse_hist_command(triggers: EventTriggers, glob: str, rest: str | None) -> None:
    """Apply one ``hist:…`` / ``!hist:…`` write to ``triggers`` (event_hist_trigger_parse)."""
    loc = f"hist:{triggers.loc}"
    last_cmd = f"hist:{rest}" if rest is not None else ""
    try:
        _parse(triggers, glob, rest)
    except HistError as exc:
        if exc.code and last_cmd:
            pos = last_cmd.find(exc.where) if exc.where else 0
            triggers.host.log_error(loc, last_cmd, HIST_ERRORS[exc.code], max(pos, 0))
        raise OSError(exc.errno, exc.strerror) from None


def _parse(triggers: EventTriggers, glob: str, rest: str | None) -> None:
    remove = glob.startswith("!")
    if rest is None:
        _fail(None)
    param, filter_text = _split_filter(rest)
    param = param.replace(".sym-offset", ".symXoffset")
    attrs = _parse_attrs(param)
    data = HistData(triggers, attrs)
    try:
        _Builder(data, remove).build()
        trig = HistTrigger("hist", "hist", data=data, post=False)
        trig.filter, trig.filter_text = compile_trigger_filter(
            None if filter_text is None else filter_text, triggers.fields)
        _apply(triggers, trig, remove)
    finally:
        if _unused(triggers, data):
            _remove_field_var_hists(data)


def _unused(triggers: EventTriggers, data: HistData) -> bool:
    """Whether no trigger of the event uses ``data`` (it was a removal, an update of
    an existing one, or it failed)."""
    return not any(isinstance(t, HistTrigger) and t.data is data for t in triggers.items)


def _apply(triggers: EventTriggers, trig: "HistTrigger", remove: bool) -> None:
    data, attrs = trig.data, trig.data.attrs
    existing = [t for t in triggers.items if isinstance(t, HistTrigger) and t.same(trig)]
    if remove:
        if existing:
            if _is_referenced(triggers, existing[0].data):
                raise HistError(errno.EBUSY)
            triggers.unregister(existing[0])
        return
    if existing and (attrs.pause or attrs.cont or attrs.clear):
        for old in _named_peers(triggers, existing[0]):
            if attrs.pause:
                old.paused = True
            elif attrs.cont:
                old.paused = False
        if attrs.clear:
            existing[0].data.clear()
        return
    named = _find_named(triggers, attrs.name) if attrs.name else None
    if named is not None:
        if named.data.spec().split(":", 2)[2:] != data.spec().split(":", 2)[2:]:
            _fail("NAMED_MISMATCH", attrs.name)
    if existing:
        _fail("TRIGGER_EEXIST", None, errno.EEXIST)
    if attrs.cont or attrs.clear:
        _fail("TRIGGER_ENOENT_CLEAR", None, errno.ENOENT)
    trig.paused = attrs.pause
    if named is not None:
        trig.data = named.data
    if data.enable_timestamps and not triggers.host.set_clock(attrs.clock):
        _fail("SET_CLOCK_FAIL", attrs.clock)
    triggers.register(trig, append=True)


def _find_named(triggers: EventTriggers, name: str) -> HistTrigger | None:
    for pool in triggers.host.all_triggers():
        for trig in pool.items:
            if isinstance(trig, HistTrigger) and trig.data.attrs.name == name:
                return trig
    return None


def _named_peers(triggers: EventTriggers, trig: HistTrigger) -> list[HistTrigger]:
    if not trig.data.attrs.name:
        return [trig]
    return [t for pool in triggers.host.all_triggers() for t in pool.items
            if isinstance(t, HistTrigger) and t.data is trig.data]


def _is_referenced(triggers: EventTriggers, data: HistData) -> bool:
    for pool in triggers.host.all_triggers():
        for trig in pool.items:
            if isinstance(trig, HistTrigger) and trig.data is not data and any(
                    ref.ref[0] is data for ref in trig.data.var_refs):
                return True
    return False


def hist_file_text(triggers: EventTriggers) -> str:
    """The ``hist`` file: each hist trigger's header, entries and totals."""
    host = triggers.host
    out = []
    for trig in triggers.items:
        if not isinstance(trig, HistTrigger):
            continue
        if out:
            out.append("\n\n")
        out.append("# event histogram\n#\n# trigger info: " + trig.text() + "#\n\n")
        data = trig.data
        entries, n = data.entries_text(host.symbolize, host.syscall_name)
        out.append(entries)
        if data.snapshot_taken is not None:
            action, value, key, elt = data.snapshot_taken
            out.append("\nSnapshot taken (see tracing/snapshot).  Details:\n"
                       f"\ttriggering value {{ {action.handler}({action.var_text}) }}: "
                       f"{value:10d}\ttriggered by event with key: "
                       + _key_text(data, key, elt, host.symbolize, host.syscall_name) + "\n")
        out.append(f"\nTotals:\n    Hits: {trig.data.hits}\n    Entries: {n}\n"
                   f"    Dropped: {trig.data.drops}\n")
    return "".join(out)
