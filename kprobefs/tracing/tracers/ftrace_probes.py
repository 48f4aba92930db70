"""The commands of ``set_ftrace_filter``: function probes and ``:mod:``.

A token of a function filter file is ``[!]FUNC[:COMMAND[:PARAM]]`` (ftrace.c's
ftrace_process_regex).  Without a command it selects functions (function.FunctionFilter);
with one it goes to the command of that name:

* ``mod:MODULE`` (ftrace_mod_callback) selects ``FUNC`` among the module's functions,
  for ``set_ftrace_filter`` and ``set_ftrace_notrace`` alike.  A module that is not
  loaded gets the command cached, listed as ``FUNC:mod:MODULE``, and applied when the
  module comes (process_cached_mods); meanwhile ``set_ftrace_filter`` counts as not
  empty (FTRACE_HASH_FL_MOD), so the function tracer traces nothing else.
* the function probes (register_ftrace_function_probe), ``set_ftrace_filter`` only:
  ``traceon``/``traceoff``/``stacktrace``/``snapshot`` ``[:N]``, ``dump``,
  ``cpudump`` (trace_functions.c, trace.c), ``enable_event``/``disable_event``
  ``:SYS:EVENT[:N]`` (trace_events.c).  Each kind of probe (counted or not: two kinds)
  is one ``ftrace_probe_ops`` of the trace array, with an ftrace_ops of its own on the
  functions it was given, independent of ``current_tracer``; a count is kept per
  function.  ``!FUNC:COMMAND[:...]`` removes the functions matching FUNC from the kind
  the rest names (a count present: the counted kind).

Reading ``set_ftrace_filter`` lists the functions (or ``#### all functions enabled
####``), then the cached ``:mod:`` commands, then the probes, newest kind first, as
``func:traceoff:unlimited`` / ``func:traceoff:count=N``.  Bad commands fail the write
with 6.1's errno; as in 6.1 nothing goes to ``error_log``.

Probe handlers run on the hit path (an ftrace site's trampoline): they touch the trace
array's flags and buffer only, as Linux's do.
"""

from __future__ import annotations

import errno
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, NamedTuple

from kprobefs.tracing.buffers.output import flags_text
from kprobefs.tracing.triggers.trigger import _kstrtoul

__all__ = ["FilterToken", "parse_filter_token", "match_sites", "FunctionProbes",
           "NO_ARRAY_COMMANDS", "PROBE_COMMANDS", "lat_context"]

#: The commands a set_ftrace_filter token may name, besides ``mod``.
PROBE_COMMANDS = ("traceon", "traceoff", "snapshot", "stacktrace", "dump", "cpudump",
                  "enable_event", "disable_event")
_GLOB_CHARS = "[?\\"
#: trace_find_mark: the mark after a latency-format timestamp for the time to the next
#: record (ns), largest first.
_MARKS = ((1_000_000_000, "$"), (100_000_000, "@"), (10_000_000, "*"), (1_000_000, "#"),
          (100_000, "!"), (10_000, "+"))


class FilterToken(NamedTuple):
    """One token of a filter file: ``func`` keeps a leading ``!``; ``command`` and
    ``param`` are None when absent (``param`` is "" for ``func:cmd:``)."""

    func: str
    command: str | None
    param: str | None


def parse_filter_token(token: str) -> FilterToken:
    """Split ``FUNC[:COMMAND[:PARAM]]`` as strsep(":") twice does."""
    func, sep, rest = token.partition(":")
    if not sep:
        return FilterToken(func, None, None)
    command, sep, param = rest.partition(":")
    return FilterToken(func, command, param if sep else None)


def _count(text: str) -> int:
    """A probe's count, kstrtoul(text, 0); EINVAL when it is not a number."""
    value = _kstrtoul(text)
    if value is None:
        raise OSError(errno.EINVAL, f"bad count {text!r}")
    return value


def _simple_strtoul(text: str) -> int:
    """simple_strtoul(text, NULL, 0): the longest number at the start, base from its
    prefix (0x: 16, 0: 8, else 10), 0 when there is none."""
    base, body = 10, text
    if text[:2].lower() == "0x" and text[2:3] and text[2].lower() in "0123456789abcdef":
        base, body = 16, text[2:]
    elif text.startswith("0"):
        base = 8
    digits = "0123456789abcdef"[:base]
    end = 0
    while end < len(body) and body[end].lower() in digits:
        end += 1
    return int(body[:end], base) if end else 0


def _glob(pattern: str) -> Callable[[str], bool]:
    """A matcher with filter_parse_regex's types: ``abc`` whole, ``abc*`` front,
    ``*abc`` end, ``*abc*`` middle, anything else with ``*``, ``?``, ``[`` or ``\\``
    a full glob."""
    n = len(pattern)
    for i, ch in enumerate(pattern):
        if ch == "*" and 0 < i < n - 1:
            return lambda name: fnmatch.fnmatchcase(name, pattern)
        if ch in _GLOB_CHARS:
            return lambda name: fnmatch.fnmatchcase(name, pattern)
    if n > 1 and pattern[0] == "*" and pattern[-1] == "*":
        body = pattern[1:-1]
        return lambda name: body in name
    if pattern.startswith("*"):
        body = pattern[1:]
        return lambda name: name.endswith(body)
    if pattern.endswith("*"):
        body = pattern[:-1]
        return lambda name: name.startswith(body)
    return lambda name: name == pattern


def match_sites(pattern: str, sites: Iterable[tuple[int, str]],
                module: str | None = None,
                module_of: Callable[[int], str | None] | None = None) -> set[int]:
    """The sites whose function ``pattern`` matches (match_records; no ``!`` here).
    A pattern starting with a digit is an index into the sites, from 1 (MATCH_INDEX).
    With ``module`` (a ``:mod:`` command): only that module's functions, ``!MOD`` all
    but its, "" the kernel's own; an empty pattern then matches every function."""
    sites = list(sites)
    if pattern[:1].isdigit():
        index = _simple_strtoul(pattern) - 1
        return {sites[index][0]} if 0 <= index < len(sites) else set()
    func_match = _glob(pattern)
    if module is None:
        return {site for site, name in sites if func_match(name)}
    exclude = module.startswith("!")
    mod_pattern = module[1:] if exclude else module
    mod_match = _glob(mod_pattern)
    out = set()
    for site, name in sites:
        mod = module_of(site) if module_of is not None else None
        if not mod_pattern:
            if (not exclude) == (mod is not None):
                continue            # blank module: the kernel's (or, with !, modules')
        elif (mod is not None and mod_match(mod)) == exclude:
            continue
        if pattern in ("", "*") or func_match(name):
            out.add(site)
    return out


def lat_context(comm: str, pid: int, cpu: int, flags: int, abs_ns: int, rel_ns: int,
                in_ns: bool = True) -> str:
    """The context columns of a latency-format line, as ftrace_dump prints each record
    (lat_print_generic, lat_print_timestamp without ``verbose``): the comm cut to 8,
    pid, CPU, the flags, the time since the buffer's start and the mark for the time to
    the next record."""
    head = f"{comm[:8]:>8}-{pid:<7d} {cpu:3d}{flags_text(flags)}"
    if not in_ns:
        return f"{head} {abs_ns:4d}: "
    rel_us = (rel_ns + 500) // 1000
    mark = next((sym for val, sym in _MARKS if rel_us * 1000 > val), " ")
    return f"{head} {(abs_ns + 500) // 1000:4d}us{mark}: "


# ------------------------------------------------------------------------ probe ops

@dataclass(eq=False)
class _EventProbeData:
    """event_probe_data: one enable_event/disable_event registration, shared by the
    functions it was given (its count too)."""

    file: Any
    system: str
    event: str
    enable: bool
    count: int = -1
    ref: int = 0


@dataclass(eq=False)
class _ProbeOps:
    """One ftrace_probe_ops of a trace array: its command, whether it is the counted
    kind, its functions (site -> count, or -> _EventProbeData) and its ftrace_ops."""

    command: str
    counted: bool
    entries: dict = field(default_factory=dict)
    ops: Any = None

    def line(self, site: int, name: str) -> str:
        """The probe's line for one function, as its print callback writes it."""
        data = self.entries[site]
        if isinstance(data, _EventProbeData):
            head = f"{name}:{self.command}:{data.system}:{data.event}"
            return head + (":unlimited\n" if data.count == -1 else f":count={data.count}\n")
        return f"{name}:{self.command}" + (f":count={data}\n" if self.counted
                                           else ":unlimited\n")


class FunctionProbes:
    """One trace array's function probes and cached ``:mod:`` commands.

    ``tr`` is the trace array (``tracing_on``, ``set_tracing_on_hit``, ``write_stack``,
    ``file_enable_disable``, ``set_soft_disabled``, ``trigger_host``); ``ftrace`` the
    engine's ftrace core and ``ops_factory`` its FtraceOps; ``sites()`` every
    (site, function) in address order; ``module_of(site)`` the module of a site (None:
    the kernel's); ``make_hit(ip, regs)`` a TriggerHit for the running task;
    ``dump(cpu)`` prints the top array's buffer (one CPU's, or all for None) to the
    kernel log and turns tracing off (ftrace_dump).
    """

    def __init__(self, tr, ftrace, ops_factory, sites: Callable[[], Iterable[tuple[int, str]]],
                 module_of: Callable[[int], str | None],
                 make_hit: Callable[[int, Any], Any],
                 dump: Callable[[int | None], None],
                 module_loaded: Callable[[str], bool]):
        self.tr = tr
        self._ftrace = ftrace
        self._ops_factory = ops_factory
        self._sites = sites
        self._module_of = module_of
        self._make_hit = make_hit
        self._dump = dump
        self._module_loaded = module_loaded
        self._probes: list[_ProbeOps] = []          # newest first (list_add)
        #: Cached ``:mod:`` commands of set_ftrace_filter (True) and _notrace (False):
        #: (func or None for "*", module), oldest first.
        self.mod_cache: dict[bool, list[tuple[str | None, str]]] = {True: [], False: []}
        #: The two hashes (function.FunctionFilter) the :mod: command fills.
        self.hashes: dict[bool, Any] = {}

    # ------------------------------------------------------------ the files
    def command(self, hash_, enable: bool, token: FilterToken) -> None:
        """Run one command token written to ``hash_`` (set_ftrace_filter when
        ``enable``, else set_ftrace_notrace); OSError with Linux's errno."""
        if token.command == "mod":
            self._mod(hash_, enable, token.func, token.param)
            return
        if token.command not in PROBE_COMMANDS:
            raise OSError(errno.EINVAL, f"no ftrace command {token.command!r}")
        if not enable:
            raise OSError(errno.EINVAL, "function probes only go in set_ftrace_filter")
        if token.command in ("enable_event", "disable_event"):
            self._event_command(token)
        else:
            self._simple_command(token)

    def cleared(self, enable: bool) -> None:
        """open(O_TRUNC) of the file: its cached :mod: commands go too."""
        self.mod_cache[enable].clear()

    def holds_mods(self, enable: bool) -> bool:
        """Whether a :mod: command of the file waits for its module."""
        return bool(self.mod_cache[enable])

    def text(self, enable: bool) -> str:
        """The cached :mod: commands, then (set_ftrace_filter) the probes."""
        out = [f"{func or '*'}:mod:{module}\n" for func, module in self.mod_cache[enable]]
        if enable and any(p.entries for p in self._probes):
            names = dict(self._sites())
            for probe in self._probes:
                for site in sorted(probe.entries):
                    out.append(probe.line(site, self.label(
                        site, names.get(site, f"{site:#x}"))))
        return "".join(out)

    def label(self, site: int, name: str) -> str:
        """How the files name a site's function: ``name [module]`` in a module
        (print_rec, %ps)."""
        module = self._module_of(site)
        return f"{name} [{module}]" if module else name

    # ------------------------------------------------------------ :mod:
    def _mod(self, hash_, enable: bool, func: str, module: str | None) -> None:
        if module is None:
            module = ""
        remove = func.startswith("!")
        pattern = func[1:] if remove else func
        matched = match_sites(pattern, self._sites(), module, self._module_of)
        if matched:
            hash_.select(matched, remove)
            return
        cache = self.mod_cache[enable]
        if remove:
            kept = [(f, m) for f, m in cache
                    if m != module or not (pattern == "*" or f == pattern)]
            if len(kept) == len(cache):
                raise OSError(errno.EINVAL, "no such cached :mod: command")
            cache[:] = kept
            hash_.refresh()
            return
        if self._module_loaded(module):
            raise OSError(errno.EINVAL, f"no function {pattern!r} in module {module}")
        cache.append((None if pattern == "*" else pattern, module))
        hash_.refresh()

    def module_coming(self, module: str) -> None:
        """A module is loaded: its cached :mod: commands select its functions."""
        for enable, cache in self.mod_cache.items():
            mine = [(f, m) for f, m in cache if m == module]
            if not mine or enable not in self.hashes:
                continue
            cache[:] = [(f, m) for f, m in cache if m != module]
            sites = set()
            for func, _ in mine:
                sites |= match_sites(func or "*", self._sites(), module, self._module_of)
            if sites:
                self.hashes[enable].select(sites, False)
            self.hashes[enable].refresh()

    def sites_going(self, sites: set[int]) -> None:
        """A module is going: its functions leave every probe (their ops already let
        go of them: ftrace_release_mod)."""
        for probe in self._probes:
            for site in sites & probe.entries.keys():
                self._free(probe, site)
                probe.ops.filter.discard(site)
            if not probe.entries and probe.ops.registered:
                self._ftrace.unregister_ftrace_function(probe.ops)
        for probe in list(self._probes):
            self._release(probe)

    # ------------------------------------------------------------ registration
    def _ops(self, command: str, counted: bool, create: bool) -> _ProbeOps | None:
        for probe in self._probes:
            if probe.command == command and probe.counted == counted:
                return probe
        if not create:
            return None
        probe = _ProbeOps(command, counted)
        probe.ops = self._ops_factory(func=self._caller(probe))
        self._probes.insert(0, probe)
        return probe

    def _simple_command(self, token: FilterToken) -> None:
        command, param = token.command, token.param
        if command in ("dump", "cpudump"):
            param = "1"                 # only dump once
        counted = param is not None and command != "cpudump"
        if token.func.startswith("!"):
            self._unregister(token.func[1:], command, counted)
            return
        count = -1
        if param:
            number = param.split(":", 1)[0]
            if number:
                count = _count(number)
        if command == "snapshot":
            # tracing_alloc_snapshot_instance: the array's snapshot buffer is allocated
            # when the probe is registered (where the array has one to allocate)
            alloc = getattr(self.tr.trigger_host, "alloc_snapshot", None)
            if alloc is not None:
                alloc()
        self._register(token.func, command, counted, lambda: count)

    def _event_command(self, token: FilterToken) -> None:
        if token.param is None:
            raise OSError(errno.EINVAL, "enable_event needs SYSTEM:EVENT")
        system, sep, rest = token.param.partition(":")
        if not sep:
            raise OSError(errno.EINVAL, "enable_event needs SYSTEM:EVENT")
        event, sep, count_text = rest.partition(":")
        ef = self.tr.trigger_host.find_event(system, event)
        if ef is None:
            raise OSError(errno.EINVAL, f"no event {system}:{event}")
        counted = bool(sep)
        if token.func.startswith("!"):
            self._unregister(token.func[1:], token.command, counted)
            return
        data = _EventProbeData(ef, system, event, token.command == "enable_event")
        if counted:
            number = count_text.split(":", 1)[0]
            if not number:
                raise OSError(errno.EINVAL, "empty count")
            data.count = _count(number)
        self.tr.file_enable_disable(ef, True, True)
        try:
            self._register(token.func, token.command, counted, lambda: data)
        except OSError:
            self.tr.file_enable_disable(ef, False, True)
            raise

    def _register(self, glob: str, command: str, counted: bool,
                  init: Callable[[], Any]) -> None:
        """register_ftrace_function_probe: the functions ``glob`` matches that the
        kind does not have yet join it; EINVAL when none matches or none is new."""
        matched = match_sites(glob, self._sites()) if glob else set()
        if not matched:
            raise OSError(errno.EINVAL, f"no function matches {glob!r}")
        probe = self._ops(command, counted, create=True)
        new = sorted(matched - probe.entries.keys())
        if not new:
            raise OSError(errno.EINVAL, "the probe is on every such function already")
        for site in new:
            data = init()
            if isinstance(data, _EventProbeData):
                data.ref += 1
            probe.entries[site] = data
        ops = probe.ops
        try:
            if ops.registered:
                for site in new:
                    self._ftrace.ftrace_set_filter_ip(ops, site)
            else:
                ops.filter = set(probe.entries)
                self._ftrace.register_ftrace_function(ops)
        except OSError:
            # nothing half-applied: the new functions leave the kind again
            for site in new:
                del probe.entries[site]
                if ops.registered and site in ops.filter:
                    self._ftrace.ftrace_set_filter_ip(ops, site, remove=True)
            if not ops.registered:
                ops.filter = set()
            self._release(probe)
            raise

    def _unregister(self, glob: str, command: str, counted: bool) -> None:
        """unregister_ftrace_function_probe_func: ENODEV when the array never had this
        kind, EINVAL when none of its functions matches ``glob`` ("" and "*": all)."""
        probe = self._ops(command, counted, create=False)
        if probe is None:
            raise OSError(errno.ENODEV, f"no {command} probe")
        if glob in ("", "*"):
            gone = set(probe.entries)
        else:
            match = _glob(glob)
            gone = {site for site, name in self._sites()
                    if site in probe.entries and match(name)}
        if not gone:
            raise OSError(errno.EINVAL, f"no {command} probe matches {glob!r}")
        ops = probe.ops
        if len(gone) == len(probe.entries):
            if ops.registered:
                self._ftrace.unregister_ftrace_function(ops)
            ops.filter = set()
        else:
            for site in sorted(gone):
                self._ftrace.ftrace_set_filter_ip(ops, site, remove=True)
        for site in sorted(gone):
            self._free(probe, site)
        self._release(probe)

    def _release(self, probe: _ProbeOps) -> None:
        """release_probe: a kind without functions leaves the array's list."""
        if not probe.entries and probe in self._probes:
            self._probes.remove(probe)

    def _free(self, probe: _ProbeOps, site: int) -> None:
        data = probe.entries.pop(site, None)
        if isinstance(data, _EventProbeData):
            data.ref -= 1
            if not data.ref:
                self.tr.file_enable_disable(data.file, False, True)

    def remove_all(self) -> None:
        """Every probe goes (the array or the daemon is going away)."""
        for probe in self._probes:
            if probe.ops.registered:
                self._ftrace.unregister_ftrace_function(probe.ops)
            for site in list(probe.entries):
                self._free(probe, site)
        self._probes.clear()

    # ------------------------------------------------------------ the hit path
    def _caller(self, probe: _ProbeOps) -> Callable:
        run = getattr(self, "_run_" + probe.command.replace("_event", ""))

        def call(ip: int, _parent_ip: int, _ops, regs) -> None:
            try:
                run(probe, ip, regs)
            except KeyError:
                pass        # the function left the probe as it was hit
        return call

    def _run_onoff(self, probe: _ProbeOps, ip: int, on: bool) -> None:
        tr = self.tr
        if not probe.counted:
            if tr.tracing_on != on:
                tr.set_tracing_on_hit(on)
            return
        count = probe.entries[ip]
        if count <= 0 or tr.tracing_on == on:
            return
        tr.set_tracing_on_hit(on)
        probe.entries[ip] = count - 1

    def _run_traceon(self, probe, ip, regs) -> None:
        self._run_onoff(probe, ip, True)

    def _run_traceoff(self, probe, ip, regs) -> None:
        self._run_onoff(probe, ip, False)

    def _take(self, probe: _ProbeOps, ip: int) -> bool:
        """update_count: a counted probe fires while its count is above 0."""
        if not probe.counted:
            return True
        count = probe.entries[ip]
        if count <= 0:
            return False
        probe.entries[ip] = count - 1
        return True

    def _run_stacktrace(self, probe, ip, regs) -> None:
        if probe.counted:
            if not self.tr.registry.top.tracing_on:        # tracing_is_on(): global
                return
            count = probe.entries[ip]
            if not count:
                return
            probe.entries[ip] = count - 1
        self.tr.write_stack(self._make_hit(ip, regs))

    def _run_snapshot(self, probe, ip, regs) -> None:
        if self._take(probe, ip):
            self.tr.trigger_host.snapshot()

    def _run_dump(self, probe, ip, regs) -> None:
        if self._take(probe, ip):
            self._dump(None)

    def _run_cpudump(self, probe, ip, regs) -> None:
        self._dump(self._make_hit(ip, regs).cpu)

    def _run_enable(self, probe, ip, regs) -> None:
        data = probe.entries[ip]
        if probe.counted:
            if not data.count:
                return
            if data.enable == (not data.file.soft_disabled):
                return
            if data.count != -1:
                data.count -= 1
        self.tr.set_soft_disabled(data.file, not data.enable)

    _run_disable = _run_enable


class _NoArrayCommands:
    """The commands of a filter file with no trace array behind it (stack_trace_filter:
    its ftrace_ops has no ``private``): every registered command is ENODEV, as their
    callbacks answer a NULL trace array; an unknown one EINVAL."""

    @staticmethod
    def command(hash_, enable: bool, token: FilterToken) -> None:
        if token.command == "mod" or token.command in PROBE_COMMANDS:
            raise OSError(errno.ENODEV, "no trace array for commands")
        raise OSError(errno.EINVAL, f"no ftrace command {token.command!r}")

    @staticmethod
    def cleared(enable: bool) -> None:
        pass

    @staticmethod
    def text(enable: bool) -> str:
        return ""

    @staticmethod
    def holds_mods(enable: bool) -> bool:
        return False

    @staticmethod
    def label(site: int, name: str) -> str:
        return name


NO_ARRAY_COMMANDS = _NoArrayCommands()
