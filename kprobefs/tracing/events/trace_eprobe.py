"""Event probes (Linux's trace_eprobe): an event of its own, ``events/GROUP/NAME``,
recorded each time another event fires, with fields fetched from that event's record.

``e[:[GROUP/][EVENT]] SYSTEM.EVENT [FETCHARGS] [if FILTER]`` (or ``SYSTEM/EVENT``) is
written to ``dynamic_events``; the group defaults to ``eprobes`` and the name to the
attached event's.  A fetch argument reads the attached record: ``$FIELD`` loads one of
its fields (a string field gives the address of its text, so ``+0($field)`` and
``$field:string`` work as in Linux), ``$comm`` the current task's comm.  As in 6.1 the
attached event is a static (tracepoint) or synthetic event: kprobe events and other
event probes cannot be attached to, and a synthetic event with an event probe on it
cannot be deleted (EBUSY).

As in 6.1, the probe is an internal trigger (:class:`EprobeTrigger`) on the attached
event's file in each trace array its own event is enabled in: the attached event is
then armed in soft mode and recorded by the host, which runs its triggers; the
trigger builds the event probe's record from the attached one and commits it to its
own event file there (filter, triggers and hist included).  The trigger is not listed
in the attached event's ``trigger`` file (which lists the commands while it has no
other), and no command removes it.

The registry that creates and deletes them is :class:`registry.Tracer`; this module
parses the command (:func:`parse_eprobe`) and holds the event (:class:`EprobeEvent`).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, ClassVar, Sequence

from kprobefs.errors import ProbeParseError
from kprobefs.tracing.events.fetch import (
    EPROBE_HEADER_SIZE, FetchEventField, FetchFault, build_print_fmt, build_record_fields,
    encode_args, format_fields_text, print_args,
)
from kprobefs.tracing.triggers.filter import FilterParseError, compile_filter, filter_fields
from kprobefs.tracing.events.probe_parser import (
    FetchArgSpec, SymbolResolver, is_good_name, is_good_system_name, parse_probe_args,
)
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.events.trace_kprobe import MAX_EVENT_PAYLOAD, HitContext
from kprobefs.tracing.triggers.trigger import EventTrigger, TriggerHit

__all__ = ["EPROBE_EVENT_SYSTEM", "EprobeSpec", "EprobeEvent", "EprobeTrigger",
           "parse_eprobe", "event_fetch_fields"]

EPROBE_EVENT_SYSTEM = "eprobes"
ERROR_LOC = "event_probe"
_MAX_EVENT_NAME_LEN = 64
#: Where the attached record's bytes appear to an event probe's fetch program: Linux
#: hands it the record's kernel address, from which ``$field`` of a string field
#: points into the record.  A kernel address nothing is mapped at.
_RECORD_BASE = 0xFFFF_FE00_0000_0000
_LOAD_SIZES = (1, 2, 4)


# ------------------------------------------------------------------------ parsing

@dataclass(frozen=True)
class EprobeSpec:
    """A parsed ``e:`` command: the event to make, the event it attaches to (the
    registry's object), its arguments and its filter on the attached event's fields
    (``filter_text`` None when there is no ``if``)."""

    group: str
    event: str
    attached: Any
    args: tuple[FetchArgSpec, ...]
    filter_text: str | None = None
    filter: Any = None

    @cached_property
    def programs(self) -> tuple:
        return tuple(arg.program for arg in self.args)


def event_fetch_fields(record_fields) -> dict[str, FetchEventField]:
    """The fields an event probe's ``$NAME`` may load, from the attached event's
    ``record_fields()`` (the common fields are not among them, as in 6.1); a string
    field is told by its type as Linux's filter_assign_type tells it."""
    out = {}
    for f in record_fields:
        kind = ""
        if "char" in f.type:
            if "__data_loc" in f.type:
                kind = "data_loc"
            elif "__rel_loc" in f.type:
                kind = "rel_loc"
            elif "[" in f.type:
                kind = "static"
        if f.type in ("char *", "const char *"):
            kind = "pointer"
        out[f.name] = FetchEventField(f.name, f.offset, f.size, bool(f.is_signed), kind)
    return out


def _name_error(error_id: str, index: int, offset: int) -> ProbeParseError:
    return ProbeParseError(error_id, errno.EINVAL, index=index, offset=offset)


def _split_event_name(text: str, index: int, offset: int) -> tuple[str | None, str | None]:
    """traceprobe_parse_event_name on ``text`` (starting at column ``offset`` of word
    ``index``): ``(group or None, event or None)``; an empty event after a separator
    is None, else an error."""
    group = None
    cut = text.find("/")
    if cut < 0:
        cut = text.find(".")
    if cut >= 0:
        if cut == 0:
            raise _name_error("NO_GROUP_NAME", index, offset)
        if cut + 1 > _MAX_EVENT_NAME_LEN:
            raise _name_error("GROUP_TOO_LONG", index, offset)
        group = text[:cut]
        if not is_good_system_name(group):
            raise _name_error("BAD_GROUP_NAME", index, offset)
        offset += cut + 1
        text = text[cut + 1:]
    if not text:
        if group is not None:
            return group, None
        raise _name_error("NO_EVENT_NAME", index, offset)
    if len(text) >= _MAX_EVENT_NAME_LEN:
        raise _name_error("EVENT_TOO_LONG", index, offset)
    if not is_good_name(text):
        raise _name_error("BAD_EVENT_NAME", index, offset)
    return group, text


def parse_eprobe(words: Sequence[str], symbols: SymbolResolver,
                 find_event: Callable[[str, str], Any],
                 log: Callable[[ProbeParseError], None],
                 log_filter: Callable[[str, FilterParseError], None]) -> EprobeSpec:
    """Parse an ``e`` command (__trace_eprobe_create) of two words or more.

    ``find_event(system, name)`` returns the event it may attach to, else None;
    ``log`` writes an error_log entry (at ``event_probe``) for an error Linux logs
    before the one it fails with; ``log_filter`` logs a bad filter as 6.1's filter
    parser does.  Raises ProbeParseError (logged by the caller) with Linux's errno.
    """
    group, event = EPROBE_EVENT_SYSTEM, None
    colon = words[0].find(":", 1)
    if colon >= 0:
        named_group, event = _split_event_name(words[0][colon + 1:], 0, colon + 1)
        group = named_group or group
    try:
        system, name = _split_event_name(words[1], 1, 0)
    except ProbeParseError as exc:
        log(exc)                                # Linux logs both
        system = name = None
    if system is None or name is None:
        raise _name_error("NO_EVENT_INFO", 1, 0)
    if event is None:
        event = name
    args = list(words[2:])
    filter_words = None
    if "if" in args:
        cut = args.index("if")
        args, filter_words = args[:cut], args[cut + 1:]
    attached = find_event(system, name)
    if attached is None:
        raise ProbeParseError("BAD_ATTACH_EVENT", errno.ENODEV, index=1)
    fields = attached.record_fields()
    filter_text = flt = None
    if filter_words is not None:
        if not filter_words:
            raise ProbeParseError("NO_EP_FILTER", errno.EINVAL, index=len(words))
        filter_text = " ".join(filter_words)
        try:
            flt = compile_filter(filter_text, filter_fields(fields))
        except FilterParseError as exc:
            log_filter(filter_text, exc)
            raise ProbeParseError(None, errno.EINVAL, log=False) from None
    parsed = parse_probe_args(args, symbols, event_fields=event_fetch_fields(fields))
    return EprobeSpec(group, event, attached, parsed, filter_text, flt)


# ------------------------------------------------------------------------ the hit path

class _RecordContext(HitContext):
    """What an event probe's fetch program reads: the attached event's record, at
    _RECORD_BASE, besides kernel and user memory."""

    __slots__ = ("record",)

    def __init__(self, kernel, symbols, record: bytes):
        super().__init__(kernel, None, None, symbols)
        self.record = record

    def event_field(self, insn: FetchEventField) -> int:
        rec, at = self.record, insn.offset
        kind = insn.string
        if kind in ("data_loc", "rel_loc"):
            loc = int.from_bytes(rec[at:at + 4], "little")
            return _RECORD_BASE + (loc & 0xFFFF) + (at if kind == "rel_loc" else 0)
        if kind == "static":
            return _RECORD_BASE + at
        size = insn.size if insn.size in _LOAD_SIZES and not kind else 8
        return int.from_bytes(rec[at:at + size], "little", signed=insn.is_signed)

    def _in_record(self, addr: int) -> int | None:
        at = addr - _RECORD_BASE
        return at if 0 <= at < len(self.record) else None

    def read_kernel(self, addr: int, size: int) -> bytes:
        at = self._in_record(addr)
        if at is None:
            return super().read_kernel(addr, size)
        if at + size > len(self.record):
            raise FetchFault(hex(addr))
        return self.record[at:at + size]

    def read_kernel_string(self, addr: int, max_len: int) -> bytes:
        at = self._in_record(addr)
        if at is None:
            return super().read_kernel_string(addr, max_len)
        return self.record[at:at + max_len - 1].split(b"\0", 1)[0]


@dataclass(eq=False)
class EprobeTrigger(EventTrigger):
    """The internal trigger an enabled event probe puts on its attached event's file
    (``eprobe``): on each hit it records the probe's event into ``file``, the probe's
    event file in the same trace array.  Its ``if`` filter is the command's."""

    probe: Any = None
    file: Any = None
    user: ClassVar[bool] = False

    def same(self, other: EventTrigger) -> bool:
        return False                # no trigger command names it

    def text(self) -> str:
        return ""                   # not shown in the trigger file

    def fire(self, hit: TriggerHit | None, host, record: bytes | None) -> None:
        if hit is None or record is None:
            return
        ef = self.file
        triggers = ef.triggers
        if ef.soft_disabled and (triggers is None or not triggers.items):
            return      # trace_trigger_soft_disabled: its triggers still see the hit
        probe = self.probe
        tr = ef.tr
        registry = tr.registry
        args = encode_args(probe.spec.programs,
                           _RecordContext(registry.kernel, registry.symbols, record),
                           event_probe=True)
        size = EPROBE_HEADER_SIZE + len(args)
        if size > MAX_EVENT_PAYLOAD:
            return
        raw = raw_common(probe.id, 0, hit.pid) + args
        tr.commit_event(ef, raw, (hit.ts, hit.pid, 0, probe, 0, 0, args), size, hit)


# ------------------------------------------------------------------------ the event

@dataclass(eq=False)
class EprobeEvent:
    """An event probe's event, ``events/GROUP/NAME`` (the same surface as a kprobe
    event: enable, filter, format, id, trigger, hist), fed by the attached event."""

    spec: EprobeSpec
    id: int
    enabled: bool = False                 # in some trace array (soft mode included)
    was_enabled: bool = False
    on: tuple = ()
    dir_handle: Any = None
    probes: tuple = ()                    # no kprobes behind it
    is_return = False
    #: Per trace array, the trigger it has on the attached event's file there.
    triggers: dict = field(default_factory=dict)

    @property
    def group(self) -> str:
        return self.spec.group

    @property
    def name(self) -> str:
        return self.spec.event

    @property
    def attached(self) -> Any:
        return self.spec.attached

    def definition(self) -> str:
        """The dynamic_events line (eprobe_dyn_event_show)."""
        attached = self.attached
        return (f"e:{self.group}/{self.name} {attached.group}.{attached.name}"
                + "".join(f" {arg.name}={arg.source}" for arg in self.spec.args))

    def matches(self, group: str | None, event: str, words: Sequence[str]) -> bool:
        """Whether ``-:[GROUP/]EVENT [SYSTEM/EVENT [ARGS]]`` names this probe
        (eprobe_dyn_event_match)."""
        if group is not None and group != self.group:
            return False
        if event and event != self.name:
            return False
        if not words:
            return True
        attached = self.attached
        cut = words[0].find("/")
        if cut < 0:
            cut = words[0].find(".")
        if cut < 0 or (words[0][:cut], words[0][cut + 1:]) != (attached.group,
                                                                 attached.name):
            return False
        wanted = words[1:]
        args = self.spec.args
        return len(wanted) <= len(args) and all(
            word == f"{arg.name}={arg.source}" for word, arg in zip(wanted, args))

    # ------------------------------------------------------------ format and text
    def record_fields(self):
        return build_record_fields(self.spec.args, False, event_probe=True)

    def format_text(self) -> str:
        return format_fields_text(self.name, self.id, self.record_fields(),
                                  build_print_fmt(self.spec.args, False, event_probe=True))

    def raw(self, record: tuple) -> bytes:
        return raw_common(self.id, record[2], record[1]) + record[6]

    def render(self, record: tuple, tracer, options) -> str:
        """``NAME: (SYSTEM.EVENT) arg=value …`` (print_eprobe_event)."""
        attached = self.attached
        head = f"{self.name}: ({attached.group}.{attached.name})"
        return head + print_args(self.spec.args, bytes(EPROBE_HEADER_SIZE) + record[6],
                                 tracer.symbols.symbolize, event_probe=True) + "\n"

    # ------------------------------------------------------------ arming
    def arm_file(self, ef, on: bool) -> None:
        """Its file ``ef`` is being armed (``on``) or was disarmed in its trace array:
        put the trigger on the attached event's file there, or take it off
        (enable_eprobe / disable_eprobe).  Caller holds the registry's lock."""
        tr = ef.tr
        if on:
            target = tr.file(self.attached)
            trig = EprobeTrigger("eprobe", "eprobe", filter=self.spec.filter,
                                 filter_text=self.spec.filter_text, probe=self, file=ef)
            tr.event_triggers(target).register(trig, append=True)
            self.triggers[tr] = (target, trig)
        else:
            target, trig = self.triggers.pop(tr, (None, None))
            if target is None:
                return
            triggers = target.triggers
            if triggers is not None and trig in triggers.items:
                triggers.unregister(trig)
        tr.registry.array_changed(tr, (self.attached,))
