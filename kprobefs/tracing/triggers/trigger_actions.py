"""A trace array's side of event triggers: what a trigger may do outside its event.

:class:`TracerTriggerHost` implements
:class:`kprobefs.tracing.triggers.trigger.TriggerHost` for one trace array
(:class:`~kprobefs.tracing.trace_array.TraceArray`, passed in, never imported), as
Linux's triggers act on their event file's ``trace_array``: the "events"
triggers see are the array's event files, so ``traceoff`` stops this array's buffer,
``enable_event`` soft-enables the target's file in this array, a stack trace goes to
this buffer, hist variables are looked up among this array's histograms and errors go
to its ``error_log``.  Named histograms (``name=``) are shared by every array, as
Linux's named_triggers list is global; so is a synthetic event, which records into
every array it is enabled in.  Calls marked *hit path* run inside a probe hit and do
not take the registry's lock (Linux's triggers do not take event_mutex either).
"""

from __future__ import annotations

import struct
from typing import Any

from kprobefs.tracing.triggers.filter import filter_fields
from kprobefs.tracing.triggers.hist import hist_file_text
from kprobefs.tracing.triggers.hist_command import parse_hist_command
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.triggers.trigger import EventTriggers, TriggerHit

__all__ = ["TracerTriggerHost"]

_SYNTH_HEADER = 8
#: How deep synthetic events may generate synthetic events within one hit (Linux's
#: trace recursion protection drops deeper ones).
_SYNTH_NESTING = 4


class _Shared:
    """What every array's host shares: the synthetic nesting depth of the hit under
    way and the syscall names read from the kernel."""

    def __init__(self):
        self.synth_depth = 0
        self.syscalls: dict[int, str | None] = {}


class TracerTriggerHost:
    """Triggers' view of one trace array (``tr``).  The registry behind it is
    ``tr.registry`` (events, symbols, the kernel, every array)."""

    def __init__(self, tr: Any):
        self.tr = tr
        registry = tr.registry
        top = getattr(registry, "top", None)
        self._shared = top.trigger_host._shared if top is not None else _Shared()

    def new_triggers(self, ef: Any) -> EventTriggers:
        event = ef.event
        fields = event.record_fields()
        return EventTriggers(ef, self, filter_fields(fields), fields,
                             f"{event.group}:{event.name}")

    # ------------------------------------------------------------ hit path
    def tracing_is_on(self) -> bool:
        return self.tr.tracing_on

    def set_tracing_on(self, on: bool) -> None:
        self.tr.set_tracing_on_hit(on)

    def snapshot(self, cond: Any = None) -> None:
        """The ``snapshot`` trigger or a ``snapshot()`` action (``cond``: the data
        a conditional snapshot's owner decides on)."""
        self.tr.take_snapshot(cond)

    def stack_trace(self, hit: TriggerHit) -> None:
        self.tr.write_stack(hit)

    def set_soft_disabled(self, ef: Any, disabled: bool) -> None:
        self.tr.set_soft_disabled(ef, disabled)

    def is_soft_disabled(self, ef: Any) -> bool:
        return ef.soft_disabled

    def trace_synth(self, event: Any, values: list, hit: TriggerHit) -> None:
        """Generate synthetic ``event`` with ``values`` (trace_synth): in every array
        it is armed in, its triggers run and it is written when enabled there."""
        shared = self._shared
        files = event.on
        if not files or shared.synth_depth >= _SYNTH_NESTING:
            return          # a synthetic event generating itself stops here
        shared.synth_depth += 1
        try:
            args = event.encode(values)
            raw = raw_common(event.id, 0, hit.pid) + args
            for ef in files:
                tr = ef.tr
                here = hit if tr is self.tr else TriggerHit(hit.cpu, hit.pid, tr.now(),
                                                           hit.comm, hit.stack)
                tr.commit_event(ef, raw, (here.ts, hit.pid, 0, event, 0, 0, args),
                                _SYNTH_HEADER + len(args), here)
        finally:
            shared.synth_depth -= 1

    def symbolize(self, addr: int, offset: bool) -> str | None:
        return self.tr.symbols.symbolize(addr, offset)

    def syscall_name(self, nr: int) -> str | None:
        """``sys_NAME`` of syscall ``nr``, from the kernel's sys_call_table."""
        syscalls = self._shared.syscalls
        if nr not in syscalls:
            syscalls[nr] = self._lookup_syscall(nr)
        return syscalls[nr]

    def _lookup_syscall(self, nr: int) -> str | None:
        image = self.tr.registry.kernel.image
        try:
            table = image.lookup_name("sys_call_table")
        except Exception:
            return None
        if not table or not 0 <= nr < table[0].size // 8:
            return None
        try:
            (handler,) = struct.unpack("<Q", image.read(table[0].addr + 8 * nr, 8))
        except Exception:
            return None
        name = self.tr.symbols.symbolize(handler, False)
        if name is None:
            return None
        name = name[len("__x64_"):] if name.startswith("__x64_") else name
        return None if name == "sys_ni_syscall" else name     # no metadata: unknown

    # ------------------------------------------------------------ control path
    def alloc_snapshot(self) -> None:
        """A ``snapshot`` trigger is registered: the snapshot buffer is allocated."""
        self.tr.alloc_snapshot()

    def cond_snapshot_enable(self, owner: Any, update: Any) -> None:
        """A hist ``snapshot()`` action owns the snapshot (EBUSY when taken)."""
        self.tr.cond_snapshot_enable(owner, update)

    def cond_snapshot_disable(self, owner: Any) -> None:
        self.tr.cond_snapshot_disable(owner)

    def parse_hist(self, triggers: EventTriggers, command: str, rest: str | None) -> None:
        """The ``hist`` command (registered here, as Linux registers it apart from the
        generic triggers): trigger.py knows no histograms."""
        parse_hist_command(triggers, command, rest)

    def hist_text(self, triggers: EventTriggers) -> str:
        return hist_file_text(triggers)

    def find_event(self, system: str, name: str) -> Any:
        """The event's file in this array, ``None`` when there is no such event."""
        event = self.tr.registry.events.get((system, name))
        marker = self.tr.marker_event
        if event is None and (system, name) == (marker.group, marker.name):
            event = marker                      # the array's trace_marker_file
        return self.tr.file(event) if event is not None else None

    def event_triggers(self, ef: Any) -> EventTriggers:
        return self.tr.event_triggers(ef)

    def event_enable_disable(self, ef: Any, on: bool, soft: bool) -> None:
        self.tr.file_enable_disable(ef, on, soft)

    def log_error(self, loc: str, command: str, message: str, pos: int) -> None:
        self.tr.error_log.add(loc, command, message, pos)

    def all_triggers(self, everywhere: bool = False) -> list[EventTriggers]:
        """The trigger lists of this array's event files (of every array's, for what
        is global: named histograms)."""
        registry = self.tr.registry
        arrays = registry.arrays() if everywhere else (self.tr,)
        out = []
        for tr in arrays:
            for event in registry.events.values():      # creation order
                triggers = tr.triggers_of(event)
                if triggers is not None and triggers.items:
                    out.append(triggers)
        return out

    def synth_in_use(self, event: Any) -> bool:
        """Whether a hist action in any array generates ``event`` (it may not be
        deleted)."""
        for triggers in self.all_triggers(everywhere=True):
            for trig in triggers.items:
                data = getattr(trig, "data", None)
                if data is not None and any(a.synth is event for a in data.actions):
                    return True
        return False

    def find_synth(self, name: str) -> Any:
        event = self.tr.registry.events.get(("synthetic", name))
        return event if hasattr(event, "encode") else None

    def set_clock(self, name: str) -> bool:
        tr = self.tr
        if tr.trace_clock == name:
            return True
        try:
            tr.set_trace_clock(name)
        except OSError:
            return False
        return True
