"""Event triggers: ``events/GROUP/EVENT/trigger`` (kernel/trace/trace_events_trigger.c).

An event's triggers are an :class:`EventTriggers`: the commands written to its
``trigger`` file, parsed once into trigger objects (``traceon``, ``traceoff``,
``snapshot``, ``stacktrace``, ``enable_event``/``disable_event``,
``enable_hist``/``disable_hist``, and ``hist``, whose parsing and text the host
supplies from :mod:`kprobefs.tracing.triggers.hist_command` and
:mod:`kprobefs.tracing.triggers.hist`, which build on this module), each with its ``:N``
count and its ``if FILTER`` compiled by :mod:`kprobefs.tracing.triggers.filter`.

The engine knows nothing of the tracer.  It gets the event's filter fields, and a
:class:`TriggerHost` — the few things a trigger does to the world (tracing on/off, a
snapshot, a stack trace, soft enable of an event, the error log, symbols, comms).  The
hit path calls :meth:`EventTriggers.call` with the record's binary form (the layout of
the event's ``format`` file) and a :class:`TriggerHit`, commits the record or not, then
calls :meth:`EventTriggers.post_call` with what it returned (Linux's post triggers,
``traceoff`` and ``stacktrace``, run after the event is written).

As in Linux, an event with triggers is armed in soft mode: its triggers run on every
hit, and it records into the buffer only if it is also enabled (``enable`` reads
``0*`` or ``1*``).

The tracer's side is small: triggers belong to an event file (trace_array.EventFile,
one per event per trace array), which carries ``triggers`` (its EventTriggers, made on
first use), ``soft_mode`` and ``soft_disabled``; ``TraceArray.set_triggers`` /
``truncate_triggers`` serve the ``trigger`` file, ``EventTriggers.hist_text`` the
``hist`` file; a recorder that meets a file with triggers builds the record's binary
form and a :class:`TriggerHit` and calls that array's ``record_triggered``
(tracing/triggers/trigger_actions.py is the :class:`TriggerHost` of each array).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol

from kprobefs.tracing.triggers.filter import EventFilter, FilterParseError, compile_filter

__all__ = [
    "EventTriggers",
    "EventTrigger",
    "TriggerHit",
    "TriggerHost",
    "TRIGGER_HELP",
    "TRIGGER_COMMANDS",
    "separate_filter",
    "compile_trigger_filter",
]

#: Command names, in the order Linux 6.1 lists them (newest registered first).
TRIGGER_COMMANDS = ("traceon", "traceoff", "snapshot", "stacktrace", "enable_event",
                    "disable_event", "enable_hist", "disable_hist", "hist")
TRIGGER_HELP = "# Available triggers:\n#" + "".join(" " + c for c in TRIGGER_COMMANDS) + "\n"
_BLANKS = " \t\n\v\f\r"


class TriggerHit:
    """One hit of an event as its triggers see it: CPU, pid, timestamp (ns, the
    buffer's clock), and lazily the current comm and the kernel stack."""

    __slots__ = ("cpu", "pid", "ts", "_comm", "_stack", "comm_value")

    def __init__(self, cpu: int, pid: int, ts: int, comm: Callable[[], str],
                 stack: Callable[[], tuple[int, ...]] = tuple):
        self.cpu = cpu
        self.pid = pid
        self.ts = ts
        self._comm = comm
        self._stack = stack
        self.comm_value: str | None = None

    def comm(self) -> str:
        if self.comm_value is None:
            self.comm_value = self._comm()
        return self.comm_value

    def stack(self) -> tuple[int, ...]:
        return self._stack()


class TriggerHost(Protocol):
    """What triggers may do outside their event (implemented by the tracer)."""

    def tracing_is_on(self) -> bool: ...
    def set_tracing_on(self, on: bool) -> None: ...
    def snapshot(self, cond: Any = None) -> None: ...
    def alloc_snapshot(self) -> None: ...
    def cond_snapshot_enable(self, owner: Any, update: Any) -> None: ...
    def cond_snapshot_disable(self, owner: Any) -> None: ...
    def stack_trace(self, hit: TriggerHit) -> None: ...
    def find_event(self, system: str, name: str) -> Any: ...
    def event_triggers(self, event: Any) -> "EventTriggers": ...
    def event_enable_disable(self, event: Any, on: bool, soft: bool) -> None: ...
    def set_soft_disabled(self, event: Any, disabled: bool) -> None: ...
    def is_soft_disabled(self, event: Any) -> bool: ...
    def log_error(self, loc: str, command: str, message: str, pos: int) -> None: ...
    def all_triggers(self, everywhere: bool = False) -> list["EventTriggers"]: ...
    def find_synth(self, name: str) -> Any: ...
    def trace_synth(self, event: Any, values: list, hit: TriggerHit) -> None: ...
    def set_clock(self, name: str) -> bool: ...
    def symbolize(self, addr: int, offset: bool) -> str | None: ...
    def syscall_name(self, nr: int) -> str | None: ...
    def parse_hist(self, triggers: "EventTriggers", command: str,
                   rest: str | None) -> None: ...
    def hist_text(self, triggers: "EventTriggers") -> str: ...


# ------------------------------------------------------------------------ parsing

def _kstrtoul(text: str) -> int | None:
    """kstrtoul(text, 0); ``None`` when it fails."""
    body = text[1:] if text.startswith("+") else text
    if body[:2] in ("0x", "0X") and len(body) > 2:
        digits, base = body[2:], 16
    elif body.startswith("0") and len(body) > 1:
        digits, base = body[1:], 8
    else:
        digits, base = body, 10
    if not digits or not digits.isalnum():
        return None
    try:
        value = int(digits, base)
    except ValueError:
        return None
    return value if value < 1 << 64 else None


def separate_filter(param_and_filter: str | None,
                    param_required: bool) -> tuple[str | None, str | None]:
    """Split ``[N] [if FILTER]`` (event_trigger_separate_filter): ``(param, filter)``.

    Without a required param, text that does not start with a digit is all filter.
    """
    if param_and_filter is None:
        if param_required:
            raise OSError(errno.EINVAL, "missing trigger parameter")
        return None, None
    if not param_required and not param_and_filter[0].isdigit():
        return None, param_and_filter
    for i, ch in enumerate(param_and_filter):
        if ch in " \t":
            rest = param_and_filter[i + 1:].lstrip(_BLANKS)
            return param_and_filter[:i], rest or None
    return param_and_filter, None


def _parse_count(param: str | None) -> int:
    """The ``:N`` count (-1: unlimited) of event_trigger_parse_num."""
    if param is None:
        return -1
    number = param.split(":", 1)[0]
    value = _kstrtoul(number) if number else None
    if value is None:
        raise OSError(errno.EINVAL, "bad trigger count")
    return value


def compile_trigger_filter(text: str | None, fields: dict) -> tuple[EventFilter | None,
                                                                 str | None]:
    """Return ``(filter, text shown)`` for ``if FILTER`` (set_trigger_filter).

    Anything but ``if`` followed by a filter is EINVAL; a bad filter fails with the
    filter's errno, and (as in Linux) logs nothing.
    """
    if text is None:
        return None, None
    for i, ch in enumerate(text):
        if ch in " \t":
            word, rest = text[:i], text[i + 1:]
            break
    else:
        word, rest = text, None
    if word != "if" or rest is None:
        raise OSError(errno.EINVAL, "trigger filter must start with 'if'")
    try:
        return compile_filter(rest.rstrip(_BLANKS), fields), rest
    except FilterParseError as exc:
        raise OSError(exc.errno, exc.message) from None


# ----------------------------------------------------------------------- triggers

@dataclass(eq=False)
class EventTrigger:
    """One trigger on an event (event_trigger_data).

    ``kind`` is the trigger type that two triggers of one event may not share
    (``traceon`` and ``traceoff`` share one, as in Linux); ``post`` marks triggers that
    run after the event is written; ``counted`` whether a count was given (the count
    variants skip hits that would change nothing).
    """

    command: str
    kind: str
    count: int = -1
    counted: bool = False
    filter: EventFilter | None = None
    filter_text: str | None = None
    paused: bool = False
    post: bool = False
    #: Whether the user wrote it (event probes put internal ones on events).
    user: ClassVar[bool] = True

    def same(self, other: "EventTrigger") -> bool:
        """Whether ``other`` is the trigger a new one collides with / a ``!`` removes."""
        return self.kind == other.kind

    def _tail(self) -> str:
        count = ":unlimited" if self.count == -1 else f":count={self.count}"
        return count + (f" if {self.filter_text}\n" if self.filter_text is not None else "\n")

    def text(self) -> str:
        """The line the ``trigger`` file shows."""
        return self.command + self._tail()

    def _take_count(self) -> bool:
        """Use up one of the count; False when it is spent."""
        if not self.count:
            return False
        if self.count != -1:
            self.count -= 1
        return True

    def fire(self, hit: TriggerHit | None, host: TriggerHost, record: bytes | None) -> None:
        command = self.command
        if command in ("traceon", "traceoff"):
            on = command == "traceon"
            if host.tracing_is_on() == on:
                return
            if self.counted and not self._take_count():
                return
            host.set_tracing_on(on)
        elif command == "snapshot":
            if self.counted and not self._take_count():
                return
            host.snapshot()
        elif command == "stacktrace":
            if self.counted and not self._take_count():
                return
            if hit is not None:
                host.stack_trace(hit)

    def busy(self) -> bool:
        """Whether something else depends on this trigger (it may not be removed)."""
        return False

    def registered(self, triggers: "EventTriggers") -> None:
        """Called once the trigger is on the event's list."""

    def unregistered(self, triggers: "EventTriggers") -> None:
        """Called once the trigger is off the event's list."""


@dataclass(eq=False)
class EnableTrigger(EventTrigger):
    """``enable_event``/``disable_event``/``enable_hist``/``disable_hist``:SYS:EVENT."""

    target: Any = None
    system: str = ""
    event: str = ""
    enable: bool = True
    hist: bool = False

    def same(self, other: EventTrigger) -> bool:
        return (self.kind == other.kind and isinstance(other, EnableTrigger)
                and other.target is self.target)

    def text(self) -> str:
        return f"{self.command}:{self.system}:{self.event}" + self._tail()

    def fire(self, hit, host, record) -> None:
        if self.hist:
            if self.counted and not self._take_count():
                return
            for trig in host.event_triggers(self.target).items:
                if trig.kind == "hist":
                    trig.paused = not self.enable
            return
        if self.counted:
            if not self.count:
                return
            if self.enable == (not host.is_soft_disabled(self.target)):
                return
            self._take_count()
        host.set_soft_disabled(self.target, not self.enable)


_SIMPLE = {"traceon": ("onoff", False), "traceoff": ("onoff", True),
           "snapshot": ("snapshot", False), "stacktrace": ("stacktrace", True)}
_ENABLE = {"enable_event": (True, False), "disable_event": (False, False),
           "enable_hist": (True, True), "disable_hist": (False, True)}


class EventTriggers:
    """The triggers of one event (its ``trigger_list``) and the hist tables they own.

    ``event`` is the tracer's event object; ``fields`` its filter fields
    (:func:`kprobefs.tracing.triggers.filter.filter_fields`); ``record_fields`` its
    ``fetch.RecordField`` rows (for hist keys and values); ``loc`` the ``SYS:EVENT``
    that error_log entries name.  Control calls hold the tracer's event lock.
    """

    def __init__(self, event: Any, host: TriggerHost, fields: dict, record_fields,
                 loc: str):
        self.event = event
        self.host = host
        self.fields = fields
        self.record_fields = list(record_fields)
        self.loc = loc
        self.items: list[EventTrigger] = []
        self._armed = False
        self.needs_record = False        # some trigger reads the record

    # ------------------------------------------------------------ the file
    def text(self) -> str:
        """What ``trigger`` reads: the triggers, or the list of commands when none
        but internal ones (check_user_trigger)."""
        if not any(t.user for t in self.items):
            return TRIGGER_HELP
        return "".join(t.text() for t in self.items)

    def write(self, text: str) -> None:
        """Apply one write (already stripped of blanks; empty writes never get here).

        Raises ``OSError`` with Linux's errno; nothing is half applied.
        """
        command, _, rest = _split_command(text)
        remove = command.startswith("!")
        name = command[1:] if remove else command
        rest = rest.lstrip(_BLANKS) or None
        if name in _SIMPLE:
            self._parse_simple(name, remove, rest)
        elif name in _ENABLE:
            self._parse_enable(name, remove, rest)
        elif name == "hist":
            self.host.parse_hist(self, command, rest)
        else:
            raise OSError(errno.EINVAL, "no such trigger command")

    def truncate(self) -> None:
        """open(O_TRUNC) for writing: every hist trigger goes (hist_unreg_all), unless
        one of them is busy: then none does."""
        hists = [t for t in self.items if t.kind == "hist"]
        if any(t.busy() for t in hists):
            return
        for trig in hists:
            self.unregister(trig)

    def remove_all(self) -> None:
        """Drop every trigger (the event is going away)."""
        for trig in list(self.items):
            self.unregister(trig)

    def hist_text(self) -> str:
        """What ``hist`` reads: every hist trigger's table, in list order."""
        return self.host.hist_text(self)

    # ------------------------------------------------------------ registration
    def _parse_simple(self, name: str, remove: bool, rest: str | None) -> None:
        kind, post = _SIMPLE[name]
        if remove:
            self._unregister_like(EventTrigger(name, kind, post=post))
            return
        param, filter_part = separate_filter(rest, False)
        count = _parse_count(param)
        flt, flt_text = compile_trigger_filter(filter_part, self.fields)
        trig = EventTrigger(name, kind, count, param is not None, flt, flt_text, post=post)
        if kind == "snapshot":
            self.host.alloc_snapshot()          # register_snapshot_trigger
        self.register(trig)

    def _parse_enable(self, name: str, remove: bool, rest: str | None) -> None:
        enable, hist = _ENABLE[name]
        if rest is None:
            raise OSError(errno.EINVAL, "enable_event needs SYSTEM:EVENT")
        param, filter_part = separate_filter(rest, True)
        system, sep, param_rest = param.partition(":")
        if not sep:
            raise OSError(errno.EINVAL, "enable_event needs SYSTEM:EVENT")
        event_name, sep, count_text = param_rest.partition(":")
        target = self.host.find_event(system, event_name)
        if target is None:
            raise OSError(errno.EINVAL, "no such event")
        trig = EnableTrigger(name, "hist_enable" if hist else "event_enable",
                             target=target, system=system, event=event_name,
                             enable=enable, hist=hist)
        if remove:
            self._unregister_like(trig)
            return
        trig.count = _parse_count(count_text if sep else None)
        trig.counted = bool(sep)
        trig.filter, trig.filter_text = compile_trigger_filter(filter_part, self.fields)
        self.host.event_enable_disable(target, True, True)
        try:
            self.register(trig)
        except OSError:
            self.host.event_enable_disable(target, False, True)
            raise

    def register(self, trig: EventTrigger, *, append: bool = False) -> None:
        """Put ``trig`` on the list (generic triggers first, hist triggers last, as
        Linux does); EEXIST if one of its kind is there."""
        if not append and any(t.same(trig) for t in self.items):
            raise OSError(errno.EEXIST, "trigger exists")
        if append:
            self.items.append(trig)
        else:
            self.items.insert(0, trig)
        try:
            self._update()
        except OSError:
            self.items.remove(trig)
            self._update()
            raise
        trig.registered(self)

    def unregister(self, trig: EventTrigger) -> None:
        self.items.remove(trig)
        if isinstance(trig, EnableTrigger):
            self.host.event_enable_disable(trig.target, False, True)
        trig.unregistered(self)
        self._update()

    def _unregister_like(self, test: EventTrigger) -> None:
        for trig in self.items:
            if trig.same(test):
                self.unregister(trig)
                return

    def _update(self) -> None:
        """Arm the event in soft mode while it has triggers (trigger mode)."""
        self.needs_record = any(t.filter is not None or t.post or t.kind == "hist"
                                for t in self.items)
        want = bool(self.items)
        if want != self._armed:
            self.host.event_enable_disable(self.event, want, True)
            self._armed = want

    # ------------------------------------------------------------ the hit path
    def call(self, record: bytes, hit: TriggerHit) -> list[EventTrigger] | None:
        """Run the triggers for one hit; return the post triggers to run after the
        event is written (``None`` when there are none)."""
        posts = None
        host = self.host
        for trig in self.items:
            if trig.paused:
                continue
            flt = trig.filter
            if flt is not None and not flt.match(record, hit.cpu, hit.comm):
                continue
            if trig.post:
                if posts is None:
                    posts = []
                posts.append(trig)
                continue
            trig.fire(hit, host, record)
        return posts

    def post_call(self, posts: list[EventTrigger], hit: TriggerHit) -> None:
        for trig in posts:
            if not trig.paused:
                trig.fire(hit, self.host, None)


def _split_command(text: str) -> tuple[str, str, str]:
    """strsep(text, ": \\t"): the command word, the separator, the rest."""
    for i, ch in enumerate(text):
        if ch in ": \t":
            return text[:i], ch, text[i + 1:]
    return text, "", ""
