"""Histogram triggers: ``hist:keys=…`` on an event's ``trigger`` file, read back through
its ``hist`` file (kernel/trace/trace_events_hist.c, Linux 6.1).

A hist command is parsed once (:mod:`kprobefs.tracing.triggers.hist_command`) into a
:class:`HistData` — key, value and variable fields compiled to small readers over the
record's binary form, sort keys, the map size, the actions (``onmatch``/``onmax``/
``onchange`` with ``trace``/``save``/``snapshot``) — and a :class:`HistTrigger` on the
event's trigger list.  This module is the table, the hit and the ``hist`` text.  A hit reads
the keys, finds or inserts the table entry, adds the values, sets the variables and
runs the actions; inter-event variables (``$ts0`` set on one event, read on another)
are looked up by the same key, as in Linux, and are read once.  A synthetic event is
generated through the :class:`~kprobefs.tracing.triggers.trigger.TriggerHost`'s
``trace_synth``.

Errors follow Linux: the errno of the write and, where Linux logs one, an ``error_log``
entry at ``hist:SYS:EVENT`` with the command as ``hist:…`` and the caret at the first
occurrence of the offending text.
"""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass, field
from typing import Any, Callable

from kprobefs.tracing.events.fetch import COMMON_FIELDS
from kprobefs.tracing.triggers.trigger import EventTrigger, EventTriggers, TriggerHit

__all__ = ["HistData", "HistTrigger", "HistField", "HistError", "hist_file_text",
           "HIST_ERRORS"]

HIST_ERRORS = {
    "DUPLICATE_VAR": "Variable already defined",
    "VAR_NOT_UNIQUE": "Variable name not unique, need to use fully qualified name "
                      "(subsys.event.var) for variable",
    "TOO_MANY_VARS": "Too many variables defined",
    "MALFORMED_ASSIGNMENT": "Malformed assignment",
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

_BITS_DEFAULT = 11                  # 2048 entries
_MAX_FILTER_STR_VAL = 256           # the key size of a dynamic string field
_U64 = (1 << 64) - 1

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
        size = rf.size or _MAX_FILTER_STR_VAL     # 0: to the record's end
        stop = offset + rf.size if rf.size else None

        def read_str(rec, hit, refs):
            data = rec[offset:stop]
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
    """One ``handler.action`` of a histogram (action_data), as parsed."""

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
    synth_name: str = ""
    param_fields: list = field(default_factory=list)

    def spec(self) -> str:
        """print_actions_spec: the action as the trigger file shows it."""
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


class HistData:
    """A histogram: its fields, sort keys, map and actions (hist_trigger_data)."""

    def __init__(self, triggers: EventTriggers, attrs):
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
        self.snapshot_track: dict[int, int] = {}      # action index -> tracked value
        #: Called when no trigger uses this histogram any more (the parser's cleanup
        #: of what it made for it, such as field-variable histograms).
        self.on_release: list[Callable[[], None]] = []
        self.enable_timestamps = False
        self.table: dict[tuple, _Elt] = {}
        self.hits = 0
        self.drops = 0

    # ------------------------------------------------------------ the hit
    @property
    def wants_comm(self) -> bool:
        """Whether an entry keeps the comm of the task that made it (``.execname``)."""
        return any(k.flags & EXECNAME for k in self.keys)

    def lookup_var(self, key: tuple, name: str, once: bool):
        """The value of variable ``name`` in the entry for ``key`` (None if unset).

        Like Linux, which compares the first key_size bytes of the referring key, a
        longer compound key matches on its leading fields."""
        elt = self.table.get(key[:len(self.keys)])
        if elt is None or name not in elt.vars:
            return None
        return elt.vars.pop(name) if once else elt.vars[name]

    def hit(self, record: bytes, hit: TriggerHit) -> None:
        """Count one hit (event_hist_trigger): other histograms' variables first (no
        entry is touched unless all are set), then the entry's sums and variables,
        then the actions (once this histogram's own variables are set too)."""
        keys = self.keys
        key = ((keys[0].read(record, hit, None),) if len(keys) == 1
               else tuple(k.read(record, hit, None) for k in keys))
        var_refs = self.var_refs
        refs: dict = {}
        for ref in var_refs:
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
            elt = _Elt([0] * len(self.vals), comm=hit.comm() if self.wants_comm else "")
            self.table[key] = elt
        self.hits += 1
        elt_refs = _EltRefs(self, key, refs) if var_refs else None
        sums = elt.sums
        sums[0] += 1
        vals = self.vals
        for i in range(1, len(vals)):
            sums[i] = (sums[i] + vals[i].read(record, hit, elt_refs)) & _U64
        for var in self.vars:
            elt.vars[var.var_name] = var.read(record, hit, elt_refs)
        for ref in var_refs:
            data, name = ref.ref
            if data is self:
                value = elt.vars.get(name)
                if value is None:
                    return
                refs[id(ref)] = value
        for index, action in enumerate(self.actions):
            _run_action(self, index, action, elt, record, hit, elt_refs)

    def release(self) -> None:
        for release in self.on_release:
            release()
        self.on_release.clear()

    def clear(self) -> None:
        self.table.clear()
        self.snapshot_taken = None
        self.snapshot_track.clear()
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
    # Both handlers start from 0, as in 6.1; a snapshot() tracks one value for the
    # whole histogram (the snapshot's), the others one per entry.
    track = data.snapshot_track if action.action == "snapshot" else elt.track
    old = track.get(index, 0)
    if value <= old if action.handler == "onmax" else value == old:
        return
    track[index] = value
    if action.action == "save":
        elt.saved[index] = {name: pf.read(record, hit, refs)
                            for name, pf in zip(action.params, action.param_fields)}
    elif action.action == "snapshot":
        host.snapshot()
        data.snapshot_taken = (action, value, refs.key, elt)
    else:
        values = [pf.read(record, hit, refs) for pf in action.param_fields]
        host.trace_synth(action.synth, values, hit)


def _own_var(refs: _EltRefs, ref: HistField) -> int:
    elt = refs.data.table.get(refs.key)
    value = None if elt is None else elt.vars.get(ref.ref[1])
    return 0 if value is None else value



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

    def busy(self) -> bool:
        """Whether another histogram reads this one's variables (it may not go)."""
        data = self.data
        return any(isinstance(trig, HistTrigger) and trig.data is not data
                   and any(ref.ref[0] is data for ref in trig.data.var_refs)
                   for pool in data.triggers.host.all_triggers(everywhere=True)
                   for trig in pool.items)

    def unregistered(self, triggers: EventTriggers) -> None:
        if not any(isinstance(t, HistTrigger) and t.data is self.data
                   for pool in triggers.host.all_triggers(everywhere=True)
                   for t in pool.items):
            self.data.release()


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
