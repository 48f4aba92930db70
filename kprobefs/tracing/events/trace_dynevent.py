"""The dynamic-event commands: Linux's trace_dynevent.c with the command side of
trace_kprobe.c, synthetic events' and event probes'.

:class:`DynamicEvents` is the part of the event registry (:class:`~kprobefs.tracing.
registry.Tracer`, which inherits it) that runs ``kprobe_events``, ``dynamic_events`` and
``synthetic_events`` writes: each line parsed (:mod:`probe_parser`, :mod:`synth`,
:mod:`trace_eprobe`) and applied in Linux's order with its errnos and ``error_log``
entries; a kprobe event created, or a probe appended to one (§2.3–§2.5), its probe
registered with the kprobes engine and its directories made; deletes and truncations
(§2.6); the module notifier that registers ``MOD:SYM`` probes again; and the listings
(``kprobe_events``, ``dynamic_events``, ``synthetic_events``, ``kprobe_profile``).

The registry's state (``events``, ``probes``, ``dynamic``, ``groups``, ``lock``, the
arrays, the kernel's recorder) is the Tracer's; the recorder glue it calls
(``_native_prepare``, ``_native_free``, the hit handlers) is there too.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import Any, Sequence

from kprobefs.errors import ProbeParseError
from kprobefs.tracing.events.probe_parser import (
    DeleteSpec, ProbeSpec, compare_arg_types, format_probe, is_same_probe, parse_command,
    split_commands, split_words,
)
from kprobefs.tracing.events.synth import (
    SYNTH_SYSTEM, SynthError, SynthEvent, check_synth_command, is_good_name, parse_synth_fields,
)
from kprobefs.tracing.events.trace_eprobe import (
    ERROR_LOC as _EPROBE_LOC, EprobeEvent, parse_eprobe,
)
from kprobefs.tracing.events.trace_kprobe import TraceEvent, TraceProbe

__all__ = ["DynamicEvents", "Group", "FIRST_EVENT_ID", "MAX_DYNAMIC_EVENTS",
           "COMMAND_WRITE_CHUNK", "KPROBE_FLAG_GONE", "KPROBE_FLAG_DISABLED"]

_log = logging.getLogger("kprobefs.tracing")

FIRST_EVENT_ID = 1800            # static events take the IDs below this on Debian's 6.1
_MAX_EVENT_ID = 0xFFFF

# Engine flag bits (Linux's KPROBE_FLAG_*).
KPROBE_FLAG_GONE = 1
KPROBE_FLAG_DISABLED = 2

#: Daemon-wide bound on dynamic events (kprobe probes, counted per probe, plus synthetic
#: events): a create past it fails with ENOMEM, as Linux does when memory runs out.
MAX_DYNAMIC_EVENTS = 16384
#: The smallest piece a transport cuts one write(2) into: FUSE hands a large write over
#: in requests of max_write (128 KiB), fewer bytes when the writer's buffer does not
#: start on a page (32 pages per request).  A command write this large that stops
#: mid-line may have been cut there: its complete lines are applied and the count
#: returned stops after the last of them, so the writer's next write(2) (stdio and
#: shells retry short writes) carries the rest and no command is split.
COMMAND_WRITE_CHUNK = 124 * 1024


def _whole_lines(data: bytes) -> tuple[bytes, int]:
    """(the part of a command write to apply, the count to return): a write of
    COMMAND_WRITE_CHUNK bytes or more that stops mid-line gives up its unfinished last
    line (see COMMAND_WRITE_CHUNK); any other write is applied whole."""
    data = bytes(data)
    if len(data) < COMMAND_WRITE_CHUNK or data.endswith(b"\n"):
        return data, len(data)
    cut = data.rfind(b"\n") + 1
    if not cut:
        return data, len(data)          # one overlong line: EINVAL, as Linux gives
    return data[:cut], cut


@dataclass(eq=False)
class Group:
    """An ``events/`` directory of dynamic (or static) events: its tracefs handle and
    how many events it holds."""

    name: str
    handle: Any = None
    events: int = 0


class DynamicEvents:
    """The command side of the event registry (see the module docstring); a base of
    :class:`~kprobefs.tracing.registry.Tracer`, whose state it works on."""

    # ================================================================ kprobe_events
    def run_commands(self, data: bytes, *, dynamic_events: bool = False) -> int:
        """Apply one write() of kprobe_events (or dynamic_events): each line in order,
        stopping at the first failure (raised as OSError); return ``len(data)``."""
        data, count = _whole_lines(data)
        with self.lock:
            for line in split_commands(data):
                self._run_command(line, dynamic_events)
        return count

    def _run_command(self, line: str, dynamic_events: bool) -> None:
        words = split_words(line)
        if dynamic_events and words and words[0].startswith("s:"):
            self._create_synth_command(line.strip(" \t"))
            return
        if dynamic_events and len(words) >= 2 and words[0][0] == "e":
            self.create_eprobe(words)
            return
        try:
            spec = parse_command(line, self.symbols, dynamic_events=dynamic_events)
        except ProbeParseError as exc:
            self.error_log.add_probe_error("trace_kprobe", words, exc)
            raise OSError(exc.errno, exc.message or "invalid command") from None
        if spec is None:
            return
        if isinstance(spec, DeleteSpec):
            self.delete(spec, all_types=dynamic_events)
        else:
            self.create(spec, words)

    def _log(self, words: Sequence[str], error_id: str, err: int, index: int,
             offset: int = 0) -> OSError:
        exc = ProbeParseError(error_id, err, index, offset)
        self.error_log.add_probe_error("trace_kprobe", words, exc)
        return OSError(err, exc.message)

    def create(self, spec: ProbeSpec, words: Sequence[str] = ()) -> TraceProbe:
        """Create a probe event, or append the probe to its existing event (§2.4, §2.5).

        Raises OSError with Linux's errno (and logs what Linux logs).
        """
        with self.lock:
            words = list(words) or split_words(format_probe(spec))
            self._check_room()
            event = self.events.get((spec.group, spec.event))
            if isinstance(event, TraceEvent):
                return self._append(event, spec, words)
            if event is not None or (spec.group, spec.event) in self._reserved:
                # another kind of event has the name (a static or synthetic event)
                raise self._log(words, "EVENT_EXIST", errno.EEXIST, 0)
            event = TraceEvent(spec.group, spec.event, self._allocate_id())
            tp = TraceProbe(spec, event)
            event.probes.append(tp)
            new_group = spec.group not in self.groups
            group = self.groups.get(spec.group) or Group(spec.group)
            if new_group:
                group.handle = self._make_dir(spec.group, None)
            event.dir_handle = self._make_dir(spec.event, group.handle)
            try:
                self._register(tp)
            except OSError as exc:
                self._remove_dir(event.dir_handle)
                if new_group:
                    self._remove_dir(group.handle)
                raise self._registration_error(exc, words) from None
            if new_group:
                self.groups[spec.group] = group
            group.events += 1
            self.events[(spec.group, spec.event)] = event
            self._events_by_id[event.id & 0xFFFF] = event
            self.probes.append(tp)
            self.dynamic.append(tp)
            self._compile_text(tp)
            return tp

    def _check_room(self) -> None:
        """OSError(ENOMEM) when MAX_DYNAMIC_EVENTS dynamic events exist already."""
        if len(self.dynamic) >= MAX_DYNAMIC_EVENTS:
            raise OSError(errno.ENOMEM, f"at most {MAX_DYNAMIC_EVENTS} dynamic events")

    def _append(self, event: TraceEvent, spec: ProbeSpec, words: list[str]) -> TraceProbe:
        primary = event.primary
        if primary.is_return != spec.is_return:
            raise self._log(words, "DIFF_PROBE_TYPE", errno.EEXIST, 0)
        index = compare_arg_types(primary, spec)
        if index:
            raise self._log(words, "DIFF_ARG_TYPE", errno.EEXIST, index + 1)
        if any(is_same_probe(tp.spec, spec) for tp in event.probes):
            raise self._log(words, "SAME_PROBE", errno.EEXIST, 0)
        tp = TraceProbe(spec, event)
        try:
            self._register(tp)
        except OSError as exc:
            raise self._registration_error(exc, words) from None
        event.probes.append(tp)
        self.probes.append(tp)
        self.dynamic.append(tp)
        self._compile_text(tp)
        return tp

    def _compile_text(self, tp: TraceProbe) -> None:
        """Make the event's text for ``trace`` now, with the name of the probe's address
        (TraceEvent.compile_text), as Linux sets an event's print format when the
        probe is created: a read of ``trace`` then formats only."""
        text = tp.event.compile_text(self.symbols.symbolize, self.symbols.modules_token())
        if text is not None and not tp.spec.is_return:
            text.fold(tp.address)

    def _registration_error(self, exc: OSError, words: list[str]) -> OSError:
        err = exc.errno or errno.EINVAL
        error_id = {errno.EILSEQ: "BAD_INSN_BNDRY", errno.ENOENT: "BAD_PROBE_ADDR",
                    errno.ENOMEM: None, errno.EEXIST: None}.get(err, "FAIL_REG_PROBE")
        if error_id is None:
            return OSError(err, exc.strerror or "")
        return self._log(words, error_id, err, 1)

    def _allocate_id(self) -> int:
        if self._next_id <= _MAX_EVENT_ID:
            new = self._next_id
            self._next_id += 1
            return new
        used = {ev.id for ev in self.events.values()}   # only once the ids wrapped
        for candidate in range(FIRST_EVENT_ID, _MAX_EVENT_ID + 1):
            if candidate not in used:
                return candidate
        raise OSError(errno.ENOMEM, "no free event id")

    def _make_dir(self, name: str, parent: Any) -> Any:
        return self.create_dir_hook(name, parent) if self.create_dir_hook else None

    def _remove_dir(self, handle: Any) -> None:
        if self.remove_dir_hook is not None and handle is not None:
            self.remove_dir_hook(handle)

    # -------------------------------------------------------------- registration
    def _register(self, tp: TraceProbe) -> None:
        """Register ``tp`` with the engine, disabled unless its event is enabled.

        A ``MOD:SYM`` probe whose module is absent stays pending (no error).
        """
        spec = tp.spec
        address = self.symbols.address_of(spec)
        if self.symbols.within_notrace(address):
            raise OSError(errno.EINVAL, "notrace function")
        disabled = not tp.event.enabled
        if spec.symbol is not None:
            where = dict(symbol_name=spec.symbol_text, offset=spec.offset)
        else:
            where = dict(addr=spec.address)
        if spec.is_return:
            obj = self._new_kretprobe(where, tp, spec.maxactive or 0)
            kp = getattr(obj, "kp", None)
            late_disable = disabled and kp is None
            if disabled and kp is not None:
                kp.flags = getattr(kp, "flags", 0) | KPROBE_FLAG_DISABLED
            register = self.engine.register_kretprobe
        else:
            obj = self._new_kprobe(where, tp, KPROBE_FLAG_DISABLED if disabled else 0)
            late_disable = False
            register = self.engine.register_kprobe
        tp.engine_probe = obj
        if address:
            self._native_prepare(tp, address)
        try:
            register(obj)
        except OSError as exc:
            if exc.errno == errno.ENOENT and spec.module is not None \
                    and not self.symbols.module_loaded(spec.module):
                tp.engine_probe = obj       # pending: the module is not loaded
                tp.registered = False
                return
            self._native_free(tp)
            raise
        if late_disable:
            self.engine.disable_kretprobe(obj)
        tp.engine_probe = obj
        tp.registered = True
        kp = getattr(obj, "kp", obj)
        tp.address = int(getattr(kp, "addr", 0) or address or 0)
        if tp.native is not None and tp.address != tp.native.ip:
            self._native_free(tp)       # resolved elsewhere than expected: host path

    def _new_kprobe(self, where: dict, tp: TraceProbe, flags: int):
        factory = self._kprobe_factory
        if factory is None:
            from kprobefs.kprobes import Kprobe as factory
        return factory(pre_handler=self._kprobe_handler(tp), flags=flags, **where)

    def _new_kretprobe(self, where: dict, tp: TraceProbe, maxactive: int):
        factory = self._kretprobe_factory
        if factory is None:
            from kprobefs.kprobes import Kretprobe as factory
        return factory(handler=self._kretprobe_handler(tp), maxactive=maxactive, **where)

    def _unregister(self, tp: TraceProbe) -> None:
        if not tp.registered:
            return
        if tp.spec.is_return:
            self.engine.unregister_kretprobe(tp.engine_probe)
        else:
            self.engine.unregister_kprobe(tp.engine_probe)
        tp.registered = False

    # ------------------------------------------------------------------ modules
    def _module_notify(self, state: str, mod) -> None:
        """The module notifier (trace_kprobe_module_callback): when a module comes, every
        ``MOD:SYM`` probe on it, pending or left [GONE] by an earlier unload, is
        registered afresh.  A failure is logged, as Linux warns, and leaves it pending."""
        if state == "going":
            with self.lock:
                for tr in self.arrays():
                    if getattr(tr, "func_probes", None) is not None:
                        tr.func_probes.sites_going(set(mod.ftrace_sites))
            return
        if state != "coming":
            return
        with self.lock:
            for tr in self.arrays():
                if getattr(tr, "func_probes", None) is not None:
                    tr.func_probes.module_coming(mod.name)
            for tp in self.probes:
                if tp.spec.module != mod.name:
                    continue
                self._unregister(tp)
                try:
                    self._register(tp)
                except OSError as exc:
                    tp.registered = False
                    _log.warning("%s/%s: cannot register the probe on module %s: %s",
                                 tp.event.group, tp.event.name, mod.name, exc)

    # ------------------------------------------------------------------ deletion
    def delete(self, spec: DeleteSpec, *, all_types: bool = False) -> None:
        """Remove the probes ``spec`` matches (§2.6), and with ``all_types`` (a
        dynamic_events command) the synthetic events it names; ENOENT if none, EBUSY for
        the last probe of an enabled event (earlier matches stay removed)."""
        with self.lock:
            result = errno.ENOENT
            try:
                for item in (list(self.dynamic) if all_types
                             else self._probes_named(spec.group, spec.event)):
                    if isinstance(item, SynthEvent):
                        if item.name != spec.event or spec.group not in (None,
                                                                         SYNTH_SYSTEM):
                            continue
                        self._release_synth(item)
                    elif isinstance(item, EprobeEvent):
                        if not item.matches(spec.group, spec.event, spec.words):
                            continue
                        self._release_eprobe(item)
                    elif spec.matches(item.spec):
                        self._release(item)
                    else:
                        continue
                    result = 0
            except OSError as exc:
                result = exc.errno
            self._reset_if_needed()
            if result:
                raise OSError(result, "")

    def _probes_named(self, group: str | None, name: str) -> list[TraceProbe]:
        """The probes a delete of [group/]name may match, in creation order: those of
        the events so named (found by name, not by a walk of every probe), or every
        probe for a delete of a whole group."""
        if not name:
            return list(self.probes)
        events = self.events
        found = [events.get((g, name)) for g in ((group,) if group is not None
                                                 else self.groups)]
        probes = [tp for ev in found if ev is not None for tp in getattr(ev, "probes", ())
                  if isinstance(tp, TraceProbe)]
        if len({tp.event for tp in probes}) > 1:
            order = {tp: i for i, tp in enumerate(self.probes)}
            probes.sort(key=order.__getitem__)
        return probes

    def release_all(self, *, kprobes: bool = True, synthetic: bool = False,
                    eprobes: bool = False) -> None:
        """Delete every kprobe event, synthetic event and/or event probe (O_TRUNC on
        kprobe_events, synthetic_events, dynamic_events); EBUSY and nothing deleted if
        one of them is enabled; else they go in creation order, up to one that cannot
        (EBUSY: a synthetic event an event probe is attached to)."""
        with self.lock:
            chosen = [item for item in self.dynamic
                      if (synthetic if isinstance(item, SynthEvent) else
                          eprobes if isinstance(item, EprobeEvent) else kprobes)]
            try:
                if any((item.event if isinstance(item, TraceProbe) else item).enabled
                       for item in chosen):
                    raise OSError(errno.EBUSY, "event is enabled")
                for item in chosen:
                    if isinstance(item, SynthEvent):
                        self._release_synth(item)
                    elif isinstance(item, EprobeEvent):
                        self._release_eprobe(item)
                    else:
                        self._release(item)
            finally:
                self._reset_if_needed()

    def release_all_dynamic(self) -> None:
        """O_TRUNC on dynamic_events: every dynamic event, of every type."""
        self.release_all(kprobes=True, synthetic=True, eprobes=True)

    def release_all_synthetic(self) -> None:
        """O_TRUNC on synthetic_events."""
        self.release_all(kprobes=False, synthetic=True)

    def _release(self, tp: TraceProbe) -> None:
        event = tp.event
        if len(event.probes) == 1:
            if event.enabled:
                raise OSError(errno.EBUSY, "event is enabled")
            self._remove_event(event)
        self._unregister(tp)
        self._native_free(tp)
        self.probes.remove(tp)
        self.dynamic.remove(tp)
        event.probes.remove(tp)

    # ------------------------------------------------------------ synthetic events
    def _create_synth_command(self, line: str) -> None:
        """``s:[synthetic/]NAME FIELDS`` written to dynamic_events (create_synth_event);
        errors are logged at ``synthetic_events``."""
        try:
            cut = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=-1)
            if cut < 0:
                raise SynthError("INVALID_CMD")
            start = 2
            name = line[start:cut]
            if "/" in line[start:]:
                group, _, name = name.partition("/")
                if group != SYNTH_SYSTEM:
                    raise SynthError("INVALID_DYN_CMD")
                start += len(group) + 1
            check_synth_command(line[start:])
            self.create_synth(name, line[cut:])
        except SynthError as exc:
            self.error_log.add("synthetic_events", line, exc.message, exc.pos(line))
            raise

    def run_synth_commands(self, data: bytes) -> int:
        """Apply one write() of synthetic_events: ``NAME FIELDS`` creates, ``!NAME``
        deletes; each line in order, stopping at the first failure (logged at
        ``synthetic_events``, as create_or_delete_synth_event logs it)."""
        data, count = _whole_lines(data)
        with self.lock:
            for line in split_commands(data):
                line = line.strip(" \t")
                if not line:
                    continue
                try:
                    check_synth_command(line)
                    name, sep, fields = line.replace("\t", " ").partition(" ")
                    if name.startswith("!"):
                        self.delete_synth(name[1:])
                    elif not sep:
                        raise SynthError("INVALID_CMD")
                    else:
                        self.create_synth(name, fields)
                except SynthError as exc:
                    self.error_log.add("synthetic_events", line, exc.message, exc.pos(line))
                    raise
        return count

    def create_synth(self, name: str, raw_fields: str) -> SynthEvent:
        """Define synthetic event ``name``; SynthError (EINVAL) for a bad name or field,
        EEXIST when the name is taken."""
        with self.lock:
            if not name:
                raise SynthError("INVALID_CMD")
            if not is_good_name(name):
                raise SynthError("BAD_NAME", name)
            if (SYNTH_SYSTEM, name) in self.events:
                raise SynthError("EVENT_EXISTS", name, errno.EEXIST)
            self._check_room()
            fields = parse_synth_fields(raw_fields)
            event = SynthEvent(name, self._allocate_id(), fields)
            self._add_event(event)
            return event

    def _add_event(self, event) -> None:
        """Enter a new dynamic event that has no probes (synthetic, event probe): its
        directory (and its group's), the registry's lists."""
        group = self.groups.get(event.group)
        if group is None:
            group = Group(event.group)
            group.handle = self._make_dir(event.group, None)
            self.groups[event.group] = group
        event.dir_handle = self._make_dir(event.name, group.handle)
        group.events += 1
        self.events[(event.group, event.name)] = event
        self._events_by_id[event.id & 0xFFFF] = event
        self.dynamic.append(event)

    # ------------------------------------------------------------ event probes
    def create_eprobe(self, words: Sequence[str]) -> EprobeEvent:
        """``e[:[GROUP/][EVENT]] SYSTEM.EVENT [ARGS] [if FILTER]`` written to
        dynamic_events (trace_eprobe.parse_eprobe); errors are logged at
        ``event_probe``, a taken name is EEXIST (EVENT_EXIST)."""
        def log(exc: ProbeParseError) -> None:
            self.error_log.add_probe_error(_EPROBE_LOC, words, exc)

        def log_filter(text: str, exc) -> None:
            self.error_log.add("event filter parse error", text, exc.message, exc.log_pos)

        with self.lock:
            try:
                spec = parse_eprobe(words, self.symbols, self._attachable, log, log_filter)
                if (spec.group, spec.event) in self.events \
                        or (spec.group, spec.event) in self._reserved:
                    raise ProbeParseError("EVENT_EXIST", errno.EEXIST)
            except ProbeParseError as exc:
                log(exc)
                raise OSError(exc.errno, exc.message or "invalid command") from None
            self._check_room()
            event = EprobeEvent(spec, self._allocate_id())
            self._add_event(event)
            return event

    def _attachable(self, system: str, name: str):
        """The event an event probe may attach to (find_and_get_event): a static or
        synthetic event, not a kprobe event or another event probe."""
        event = self.events.get((system, name))
        return None if isinstance(event, (TraceEvent, EprobeEvent)) else event

    def _eprobe_on(self, event) -> bool:
        """Whether an event probe is attached to ``event`` (it holds a reference)."""
        return any(isinstance(item, EprobeEvent) and item.attached is event
                   for item in self.dynamic)

    def _release_eprobe(self, event: EprobeEvent) -> None:
        if event.enabled:
            raise OSError(errno.EBUSY, "event is enabled")
        self._remove_event(event)
        self.dynamic.remove(event)

    def delete_synth(self, name: str) -> None:
        """``!NAME`` in synthetic_events: ENOENT when there is no such event, EBUSY when
        it is enabled."""
        with self.lock:
            event = self.events.get((SYNTH_SYSTEM, name))
            if not isinstance(event, SynthEvent):
                raise OSError(errno.ENOENT, f"no synthetic event {name}")
            try:
                self._release_synth(event)
            finally:
                self._reset_if_needed()

    def _release_synth(self, event: SynthEvent) -> None:
        if event.enabled or self.top.trigger_host.synth_in_use(event) \
                or self._eprobe_on(event):
            raise OSError(errno.EBUSY, "event is enabled, generated by a hist trigger, "
                                       "or attached to by an event probe")
        self._remove_event(event)
        self.dynamic.remove(event)

    def synth_lines(self) -> str:
        """Return the synthetic_events text."""
        with self.lock:
            return "".join(item.definition() + "\n" for item in self.dynamic
                           if isinstance(item, SynthEvent))

    def dynamic_lines(self) -> str:
        """Return the dynamic_events text: every dynamic event, creation order."""
        with self.lock:
            return "".join(
                (f"s:{item.group}/{item.definition()}" if isinstance(item, SynthEvent)
                 else item.definition()) + "\n" for item in self.dynamic)

    def _remove_event(self, event: TraceEvent) -> None:
        if self.native is not None:
            self.top.buffer.materialize()   # staged records still name the event by id
        self._events_by_id.pop(event.id & 0xFFFF, None)
        del self.events[(event.group, event.name)]
        self._remove_dir(event.dir_handle)
        if event.was_enabled:
            self._clear_trace = True
        arrays = self.arrays()
        for tr in arrays:
            tr.forget_event(event)
        group = self.groups[event.group]
        group.events -= 1
        if not group.events:
            del self.groups[event.group]
            for tr in arrays:
                tr.forget_group(event.group)
            self._remove_dir(group.handle)

    def _reset_if_needed(self) -> None:
        """An event that was ever enabled went: every array's buffer is emptied (its
        records would name it)."""
        if self._clear_trace:
            self._clear_trace = False
            for tr in self.arrays():
                tr.buffer.reset()

    # ------------------------------------------------------------------ read-back
    def probe_lines(self) -> str:
        """Return the kprobe_events text (one line per probe, creation order)."""
        with self.lock:
            return "".join(tp.definition() + "\n" for tp in self.probes)

    def profile_text(self) -> str:
        """Return kprobe_profile: event name, hits and misses per probe."""
        with self.lock:
            return "".join(f"  {tp.event.name:<44s} {self.hits(tp):15d} "
                           f"{self.misses(tp):15d}\n" for tp in self.probes)

    def hits(self, tp: TraceProbe) -> int:
        """Return tp's hits: the host's handler's and the kernel recorder's."""
        if tp.native is None:
            return tp.nhit
        return tp.nhit + self.native.hits(tp.native)

    def misses(self, tp: TraceProbe) -> int:
        """Return tp's misses: the engine's, and nested hits the recorder skipped."""
        if tp.native is None:
            return tp.nmissed
        return tp.nmissed + self.native.misses(tp.native)
