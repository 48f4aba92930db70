"""The tracer's side of event triggers: what a trigger may do outside its event.

:class:`TracerTriggerHost` implements :class:`kprobefs.tracing.trigger.TriggerHost` over
a :class:`~kprobefs.tracing.events.Tracer` (passed in, never imported): tracing on/off,
stack traces into the buffer, soft enable of events, synthetic event records, the
error log, symbols and syscall names.  Calls marked *hit path* run inside a probe hit
and do not take the tracer's lock (Linux's triggers do not take event_mutex either).
"""

from __future__ import annotations

import logging
import struct
from typing import Any

from kprobefs.tracing.filter import filter_fields
from kprobefs.tracing.raw_page import raw_common
from kprobefs.tracing.trigger import EventTriggers, TriggerHit

__all__ = ["TracerTriggerHost"]

_log = logging.getLogger("kprobefs.tracing")
_SYNTH_HEADER = 8
#: How deep synthetic events may generate synthetic events within one hit (Linux's
#: trace recursion protection drops deeper ones).
_SYNTH_NESTING = 4


class TracerTriggerHost:
    """Triggers' view of one tracer."""

    def __init__(self, tracer: Any):
        self.tracer = tracer
        self._syscalls: dict[int, str | None] = {}
        self._synth_depth = 0
        #: Called for the ``snapshot`` trigger and ``snapshot()`` actions; the buffer
        #: swap belongs to the instance (snapshot) work, which sets this.
        self.snapshot_hook = None

    def new_triggers(self, event: Any) -> EventTriggers:
        fields = event.record_fields()
        return EventTriggers(event, self, filter_fields(fields), fields,
                             f"{event.group}:{event.name}")

    # ------------------------------------------------------------ hit path
    def tracing_is_on(self) -> bool:
        return self.tracer.tracing_on

    def set_tracing_on(self, on: bool) -> None:
        tracer = self.tracer
        tracer.tracing_on = on
        tracer.recording = on and not tracer._stop_count
        tracer._native_sync(tracer.probes)

    def snapshot(self) -> None:
        if self.snapshot_hook is not None:
            self.snapshot_hook()
        else:
            _log.debug("snapshot trigger fired: no snapshot buffer here")

    def stack_trace(self, hit: TriggerHit) -> None:
        tracer = self.tracer
        if not tracer.recording:
            return
        from kprobefs.tracing.events import STACK_EVENT
        stack = hit.stack()
        tracer.buffer.write(hit.cpu, (hit.ts, hit.pid, 0, STACK_EVENT, stack),
                            16 + 8 * len(stack))

    def set_soft_disabled(self, event: Any, disabled: bool) -> None:
        self.tracer.set_soft_disabled(event, disabled)

    def is_soft_disabled(self, event: Any) -> bool:
        return event.soft_disabled

    def trace_synth(self, event: Any, values: list, hit: TriggerHit) -> None:
        """Generate synthetic ``event`` with ``values``: its triggers run, and it is
        written when enabled (trace_synth)."""
        if not event.enabled or self._synth_depth >= _SYNTH_NESTING:
            return          # a synthetic event generating itself stops here
        self._synth_depth += 1
        try:
            self._trace_synth(event, values, hit)
        finally:
            self._synth_depth -= 1

    def _trace_synth(self, event: Any, values: list, hit: TriggerHit) -> None:
        tracer = self.tracer
        args = event.encode(values)
        raw = raw_common(event.id, 0, hit.pid) + args
        triggers = event.triggers
        posts = triggers.call(raw, hit) if triggers is not None and triggers.items else None
        flt = event.filter
        if tracer.recording and not event.soft_disabled and (
                flt is None or flt.match(raw, hit.cpu, hit.comm)):
            cache = tracer.comm_cache
            if (hit.pid not in cache.names or hit.pid in cache.stale) \
                    and tracer.options["record-cmd"]:
                cache.save(hit.pid, hit.comm())
            tracer.buffer.write(hit.cpu, (hit.ts, hit.pid, 0, event, 0, 0, args),
                                _SYNTH_HEADER + len(args))
        if posts:
            triggers.post_call(posts, hit)

    def symbolize(self, addr: int, offset: bool) -> str | None:
        return self.tracer.symbols.symbolize(addr, offset)

    def syscall_name(self, nr: int) -> str | None:
        """``sys_NAME`` of syscall ``nr``, from the kernel's sys_call_table."""
        if nr not in self._syscalls:
            self._syscalls[nr] = self._lookup_syscall(nr)
        return self._syscalls[nr]

    def _lookup_syscall(self, nr: int) -> str | None:
        image = self.tracer.kernel.image
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
        name = self.tracer.symbols.symbolize(handler, False)
        if name is None:
            return None
        name = name[len("__x64_"):] if name.startswith("__x64_") else name
        return None if name == "sys_ni_syscall" else name     # no metadata: unknown

    # ------------------------------------------------------------ control path
    def find_event(self, system: str, name: str) -> Any:
        return self.tracer.events.get((system, name))

    def event_triggers(self, event: Any) -> EventTriggers:
        return self.tracer.event_triggers(event)

    def event_enable_disable(self, event: Any, on: bool, soft: bool) -> None:
        self.tracer.event_enable_disable(event, on, soft)

    def log_error(self, loc: str, command: str, message: str, pos: int) -> None:
        self.tracer.error_log.add(loc, command, message, pos)

    def all_triggers(self) -> list[EventTriggers]:
        return [ev.triggers for ev in self.tracer.events.values()
                if ev.triggers is not None and ev.triggers.items]

    def synth_in_use(self, event: Any) -> bool:
        """Whether a hist action generates ``event`` (it may not be deleted)."""
        for triggers in self.all_triggers():
            for trig in triggers.items:
                data = getattr(trig, "data", None)
                if data is not None and any(a.synth is event for a in data.actions):
                    return True
        return False

    def find_synth(self, name: str) -> Any:
        event = self.tracer.events.get(("synthetic", name))
        return event if hasattr(event, "encode") else None

    def set_clock(self, name: str) -> bool:
        tracer = self.tracer
        if tracer.trace_clock == name:
            return True
        try:
            tracer.set_trace_clock(name)
        except OSError:
            return False
        return True
