"""The function tracer and the stack tracer, on the engine's ftrace core.

* :class:`FunctionFilter` is an ftrace filter hash with the ``set_ftrace_filter`` language:
  whitespace-separated function globs, ``!`` to remove; no match is ``EINVAL``; an empty
  filter means every function.  ``set_ftrace_notrace`` and ``stack_trace_filter`` are the
  same kind of file.
* :class:`FunctionTracer` is ``current_tracer`` = ``function``: one ``ftrace_ops`` on the
  sites of the filter minus the notrace set, wanting the parent ip; each call records a
  ``TRACE_FN`` entry printed as ``func <-parent``, unless ``set_ftrace_pid`` /
  ``set_ftrace_notrace_pid`` exclude the task; with its option ``func_stack_trace``, each
  entry is followed by a kernel stack record; with ``func-no-repeats``, a CPU's repeated
  calls are counted into one ``func_repeats`` record.
* :class:`StackTracer` is kernel/trace/trace_stack.c: while enabled
  (``/proc/sys/kernel/stack_tracer_enabled``), every call of a function in
  ``stack_trace_filter`` measures the kernel stack in use; a new maximum saves the call
  chain with the depth of each frame (``stack_trace``, ``stack_max_size``).

Handlers run on the hit path (an ftrace site's trampoline): they read the kernel through
the machine and write the ring buffer, nothing else.
"""

from __future__ import annotations

import errno
import struct
import threading
from typing import Callable, Iterable

from kprobefs.tracing.tracers.ftrace_probes import match_sites, parse_filter_token
from kprobefs.tracing.buffers.output import (FLAGS_NONE, TraceOptions, format_ip_sym,
                                     format_timestamp)
from kprobefs.tracing.pid_filter import PidFilter
from kprobefs.tracing.buffers.raw_output import bin_fields, hex_field
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.tracers.plugin import TracerPlugin

__all__ = ["FunctionFilter", "FunctionTracer", "StackTracer", "FUNCTION_EVENT",
           "FUNC_REPEATS_EVENT", "STACK_TRACER_DISABLED"]

_THREAD_SIZE = 16 * 1024
_U64 = (1 << 64) - 1
_KERNEL_MIN = 0xFFFF800000000000
_STACK_TRACE_ENTRIES = 64
_TRACE_FN_ID = 1
_FTRACE_ENTRY_SIZE = 16           # ip and parent_ip after the common header
_TRACE_FUNC_REPEATS_ID = 19
_REPEATS_BODY = struct.Struct("<QQHHI")   # struct func_repeats_entry after the header
_U16_MAX = 0xFFFF

STACK_TRACER_DISABLED = (
    "#\n"
    "#  Stack tracer disabled\n"
    "#\n"
    "# To enable the stack tracer, either add 'stacktrace' to the\n"
    "# kernel command line\n"
    "# or 'echo 1 > /proc/sys/kernel/stack_tracer_enabled'\n"
    "#\n"
)


_SiteNames = Callable[[], Iterable[tuple[int, str]]]


class FunctionFilter:
    """A set of ftrace sites chosen by function name.  ``sites()`` returns every
    (site, name) of the kernel now, in address order (module sites come and go);
    ``changed(added, removed)`` runs after each change with the sites that came and
    went.  ``commands`` (set by the owner) serves ``FUNC:COMMAND[:PARAM]`` tokens
    (ftrace_probes.FunctionProbes, with ``enable``: set_ftrace_filter, not notrace);
    without it a command is EINVAL."""

    def __init__(self, sites: _SiteNames, empty_text: str,
                 changed: Callable[[set, set], None] | None = None):
        self._sites = sites
        self._empty_text = empty_text
        self._changed = changed
        self._listeners: list[Callable[[], None]] = []
        self.selected: set[int] = set()
        self.commands = None
        self.enable = True

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Also call ``listener()`` after each change (another user of the same hash:
        the function graph follows the top level's set_ftrace_filter)."""
        self._listeners.append(listener)

    def text(self) -> str:
        """The file's content: one function per selected site, or the empty marker;
        then what the commands list (cached :mod: commands, probes)."""
        commands = self.commands
        if not self.restricts():
            head = self._empty_text
        else:
            label = commands.label if commands is not None else (lambda site, name: name)
            head = "".join(f"{label(site, name)}\n" for site, name in self._sites()
                           if site in self.selected)
        return head if commands is None else head + commands.text(self.enable)

    def restricts(self) -> bool:
        """Whether the filter limits the functions: some are selected, or (a
        set_ftrace_filter) a ``:mod:`` command waits for its module (6.1's
        FTRACE_HASH_FL_MOD: the hash is not empty, so nothing else is traced)."""
        return bool(self.selected) or (self.enable and self.commands is not None
                                       and self.commands.holds_mods(self.enable))

    def clear(self) -> None:
        """open(O_TRUNC): no function selected, no cached command (probes stay)."""
        if self.commands is not None:
            self.commands.cleared(self.enable)
        self._update(set())
        self.refresh()

    def refresh(self) -> None:
        """What the filter restricts changed without a site coming or going."""
        if self._changed is not None:
            self._changed(set(), set())

    def write(self, data: bytes) -> int:
        """Applies one write(): each token selects (``!``: drops) the functions whose
        name it matches, or runs its command.  A token matching nothing fails the write
        with EINVAL (the tokens before it stay applied)."""
        for token in data.decode("latin-1").split():
            parsed = parse_filter_token(token)
            if parsed.command is not None:
                if self.commands is None:
                    raise OSError(errno.EINVAL, "filter commands are not supported")
                self.commands.command(self, self.enable, parsed)
                continue
            remove = token.startswith("!")
            pattern = token[1:] if remove else token
            matched = self._match(pattern)
            if not matched:
                raise OSError(errno.EINVAL, f"no function matches {pattern!r}")
            self.select(matched, remove)
        return len(data)

    def _match(self, pattern: str) -> set[int]:
        """The sites of the functions ``pattern`` (a glob or an index) names."""
        return match_sites(pattern, self._sites()) if pattern else set()

    def select(self, sites: set[int], remove: bool = False) -> None:
        """Add (``remove``: drop) ``sites``."""
        self._update(self.selected - sites if remove else self.selected | sites)

    def _update(self, new: set[int]) -> None:
        old, self.selected = self.selected, new
        if new == old:
            return
        if self._changed is not None:
            self._changed(new - old, old - new)
        for listener in self._listeners:
            listener()


def _fn_text(ip: int, parent_ip: int, tr, options: TraceOptions) -> str:
    """6.1's print_fn_trace: ``func <-parent`` (the parent with options/print-parent)."""
    sym = tr.symbols.symbolize
    text = format_ip_sym(ip, sym, options.sym_offset, options.sym_addr)
    if parent_ip and options.print_parent:
        text += " <-" + format_ip_sym(parent_ip, sym, options.sym_offset, options.sym_addr)
    return text


class _FunctionEvent:
    """TRACE_FN records: ``(ts, pid, flags, FUNCTION_EVENT, ip, parent_ip)``."""

    id = _TRACE_FN_ID

    def raw(self, record: tuple) -> bytes:
        """``ftrace/function``: the common fields, ``ip``, ``parent_ip``."""
        return raw_common(self.id, record[2], record[1]) + struct.pack("<QQ", record[4],
                                                                         record[5] or 0)

    def render(self, record: tuple, tracer, options: TraceOptions) -> str:
        return _fn_text(record[4], record[5], tracer, options) + "\n"

    # options/raw, hex, bin (raw_output.py): 6.1's trace_fn_raw, _hex, _bin
    @staticmethod
    def raw_text(record: tuple) -> str:
        return f"{record[4]:x} {record[5] or 0:x}\n"

    @staticmethod
    def hex_text(record: tuple) -> str:
        return hex_field(record[4], 8) + hex_field(record[5] or 0, 8)

    @staticmethod
    def bin_text(record: tuple) -> str:
        return bin_fields("QQ", record[4], record[5] or 0)


class _FuncRepeatsEvent:
    """TRACE_FUNC_REPEATS records (options/func-no-repeats): ``(ts, pid, flags,
    FUNC_REPEATS_EVENT, ip, parent_ip, count, delta)``, ``delta`` the ns from the last
    repeated call to the record."""

    id = _TRACE_FUNC_REPEATS_ID

    def raw(self, record: tuple) -> bytes:
        """``ftrace/func_repeats``: ``ip``, ``parent_ip``, ``count``, the delta's top 16
        and bottom 32 bits."""
        delta = record[7]
        return raw_common(self.id, record[2], record[1]) + _REPEATS_BODY.pack(
            record[4], record[5] or 0, record[6], (delta >> 32) & 0xFFFF,
            delta & 0xFFFFFFFF)

    def render(self, record: tuple, tracer, options: TraceOptions) -> str:
        """6.1's trace_func_repeats_print: the call, its count and the last one's time."""
        return (_fn_text(record[4], record[5], tracer, options)
                + f" (repeats: {record[6]}, last_ts:"
                + format_timestamp(record[0] - record[7], options.in_ns) + ")\n")

    @staticmethod
    def raw_text(record: tuple) -> str:
        """options/raw: 6.1's trace_func_repeats_raw (no hex or bin of its own)."""
        return f"{record[4]} {record[5] or 0} {record[6]} {record[7]}\n"


FUNC_REPEATS_EVENT = _FuncRepeatsEvent()
FUNCTION_EVENT = _FunctionEvent()


class _SiteOps:
    """One ftrace_ops whose sites follow a filter (all sites when the filter is empty,
    less an optional notrace set) while it is started."""

    def __init__(self, ftrace, ops_factory, func: Callable, sites: _SiteNames,
                 want_parent_ip: bool):
        self._ftrace = ftrace
        self._sites = sites
        self.ops = ops_factory(func=func, want_parent_ip=want_parent_ip)
        self.running = False

    def wanted(self, selected: set[int], excluded: set[int],
               restricted: bool | None = None) -> set[int]:
        """The sites to trace: ``selected`` (all when it is empty, unless
        ``restricted``) less ``excluded``."""
        sites = {site for site, _ in self._sites()}
        # a filter keeps the sites of a module that went, as 6.1's hash keeps their
        # entries (ip 0): they select nothing, nor make the filter empty
        if restricted is None:
            restricted = bool(selected)
        chosen = set(selected) & sites if restricted else sites
        return chosen - excluded

    def start(self, sites: set[int]) -> None:
        if self.running:
            return
        self.ops.filter = set(sites)
        self._ftrace.register_ftrace_function(self.ops)
        self.running = True

    def stop(self) -> None:
        if not self.running:
            return
        self._ftrace.unregister_ftrace_function(self.ops)
        self.running = False

    def retarget(self, sites: set[int]) -> None:
        """Moves a running ops onto exactly ``sites``."""
        if not self.running:
            return
        current = set(self.ops.filter)
        for site in sorted(current - sites):
            self._ftrace.ftrace_set_filter_ip(self.ops, site, remove=True)
        for site in sorted(sites - current):
            self._ftrace.ftrace_set_filter_ip(self.ops, site)


class FunctionTracer(TracerPlugin):
    """``current_tracer`` = ``function`` for one trace array: ``record`` is
    ``record(cpu, record_tuple, size)`` into its ring buffer, ``context()`` gives the
    ``(pid, cpu)`` of the current task and caches its comm, ``recording()`` says whether
    tracing is on.

    ``flags`` is 6.1's func_flags, one dict that every array's function tracer shares
    (``func_stack_trace``, ``func-no-repeats``); ``record_stack(cpu, record_tuple, size,
    regs)`` records the entry followed by the kernel stack at the hit.  As 6.1's func_set_flag, a change
    takes effect in the array whose option was written if the tracer is current there,
    elsewhere when the tracer next starts."""

    def __init__(self, ftrace, ops_factory, sites: _SiteNames,
                 record: Callable, context: Callable, recording: Callable[[], bool],
                 now: Callable[[], int], flags: dict[str, bool] | None = None,
                 record_stack: Callable | None = None):
        self._record = record
        self._record_stack = record_stack
        self.flags = flags if flags is not None and record_stack is not None else {}
        #: the ops' handler records stacks (6.1's function_stack_trace_call)
        self._stack = False
        #: the ops' handler counts repeated calls (function_no_repeats_trace_call)
        self._no_repeats = False
        #: per CPU, the last call recorded and its repeats: 6.1's last_func_repeats,
        #: kept for the tracer's life as 6.1 keeps it for the array's
        self._last_calls: dict[int, list[int]] = {}
        self._context = context
        self._recording = recording
        self._now = now
        self._ops = _SiteOps(ftrace, ops_factory, self._hit, sites, True)
        self.filter = FunctionFilter(sites, "#### all functions enabled ####\n",
                                     lambda *_: self._retarget())
        self.notrace = FunctionFilter(sites, "#### no functions disabled ####\n",
                                      lambda *_: self._retarget())
        #: set_ftrace_pid and set_ftrace_notrace_pid.
        self.pids = PidFilter()

    @property
    def running(self) -> bool:
        return self._ops.running

    name = "function"

    def init(self, tr) -> None:
        self._stack = self.flags.get("func_stack_trace", False)
        self._no_repeats = self.flags.get("func-no-repeats", False)
        self.start()

    def reset(self, tr) -> None:
        self.stop()

    def set_flag(self, tr, name: str, on: bool) -> None:
        self.flags[name] = on
        if tr.current_tracer is self:
            self._stack = self.flags["func_stack_trace"]
            self._no_repeats = self.flags["func-no-repeats"]

    def start(self) -> None:
        self._ops.start(self._wanted())

    def stop(self) -> None:
        self._ops.stop()

    def _wanted(self) -> set[int]:
        return self._ops.wanted(self.filter.selected, self.notrace.selected,
                                self.filter.restricts())

    def _retarget(self) -> None:
        self._ops.retarget(self._wanted())

    def _hit(self, ip: int, parent_ip: int, _ops, regs) -> None:
        if self._no_repeats:
            self._hit_no_repeats(ip, parent_ip, regs)
            return
        if not self._recording():
            return
        pid, cpu = self._context()
        if self.pids.active and self.pids.ignores(pid):
            return
        self._record_entry(cpu, (self._now(), pid, FLAGS_NONE, FUNCTION_EVENT, ip,
                                 parent_ip), regs)

    def _record_entry(self, cpu: int, rec: tuple, regs) -> None:
        if self._stack:
            self._record_stack(cpu, rec, _FTRACE_ENTRY_SIZE, regs)
        else:
            self._record(cpu, rec, _FTRACE_ENTRY_SIZE)

    def _hit_no_repeats(self, ip: int, parent_ip: int, regs) -> None:
        """6.1's function_no_repeats_trace_call: a call of the function (and parent)
        the CPU's last recorded call was of is only counted (up to U16_MAX) with its
        time; the next other call first records the count as a func_repeats record.
        The counting goes on while tracing is off, as there the ring buffer refuses
        the records, not the tracer its calls."""
        pid, cpu = self._context()
        if self.pids.active and self.pids.ignores(pid):
            return
        now = self._now()
        last = self._last_calls.get(cpu)
        if last is None:
            last = self._last_calls[cpu] = [0, 0, 0, 0]    # ip, parent_ip, count, ts
        if last[0] == ip and last[1] == parent_ip and last[2] < _U16_MAX:
            last[2] += 1
            last[3] = now
            return
        recording = self._recording()
        if last[2]:
            if recording:
                self._record(cpu, (now, pid, FLAGS_NONE, FUNC_REPEATS_EVENT, last[0],
                                   last[1], last[2], now - last[3]),
                             _REPEATS_BODY.size)
            last[2] = 0
        last[0], last[1] = ip, parent_ip
        if recording:
            self._record_entry(cpu, (now, pid, FLAGS_NONE, FUNCTION_EVENT, ip, parent_ip),
                               regs)


class StackTracer:
    """The maximum kernel stack depth seen at the entry of the filtered functions, and
    the call chain that reached it.  ``read(addr, size)`` reads kernel memory;
    ``is_call_return(addr)`` says whether a stack word is a return address (a text
    address right after a call); ``symbolize(addr)`` gives ``%pS`` text."""

    def __init__(self, ftrace, ops_factory, sites: _SiteNames,
                 read: Callable[[int, int], bytes], is_call_return: Callable[[int], bool],
                 symbolize: Callable[[int], str]):
        self._read = read
        self._is_call_return = is_call_return
        self._symbolize = symbolize
        self._lock = threading.Lock()
        self._ops = _SiteOps(ftrace, ops_factory, self._hit, sites, False)
        self.filter = FunctionFilter(sites, "#### all functions enabled ####\n",
                                     lambda *_: self._ops.retarget(
                                         self._ops.wanted(self.filter.selected, set())))
        self.enabled_value = 0
        self.max_size = 0
        self.entries: list[tuple[int, int]] = []     # (depth, address), deepest first

    @property
    def enabled(self) -> bool:
        return bool(self.enabled_value)

    def set_enabled(self, value: int) -> None:
        """The ``stack_tracer_enabled`` sysctl: any integer, non-zero traces."""
        was = self.enabled
        self.enabled_value = value
        if self.enabled == was:
            return
        if self.enabled:
            self._ops.start(self._ops.wanted(self.filter.selected, set()))
        else:
            self._ops.stop()

    def set_max_size(self, value: int) -> None:
        with self._lock:
            self.max_size = value

    def max_size_text(self) -> str:
        return f"{self.max_size}\n"

    def trace_text(self) -> str:
        with self._lock:
            entries = list(self.entries)
            max_size = self.max_size
        out = ["        Depth    Size   Location    (%d entries)\n"
               "        -----    ----   --------\n" % len(entries)]
        if not self.enabled and not max_size:
            out.append(STACK_TRACER_DISABLED)
        for i, (depth, addr) in enumerate(entries):
            size = depth - entries[i + 1][0] if i + 1 < len(entries) else depth
            out.append("%3d) %8d   %5d   %s\n" % (i, depth, size, self._symbolize(addr)))
        return "".join(out)

    def _hit(self, ip: int, _parent_ip: int, _ops, regs) -> None:
        sp = regs.sp & _U64
        if sp < _KERNEL_MIN:
            return
        top = (sp | (_THREAD_SIZE - 1)) + 1
        this_size = top - sp
        if this_size <= self.max_size:
            return
        try:
            stack = self._read(sp, this_size)
        except Exception:
            return
        with self._lock:
            if this_size > self.max_size:
                self.max_size = this_size
                self.entries = self._walk(ip, sp, regs.bp & _U64, stack)

    def _walk(self, ip: int, sp: int, bp: int, stack: bytes) -> list[tuple[int, int]]:
        """The call chain at a function's entry, by frame pointers (the kernel keeps
        them): the function, its return address at ``sp``, then each saved frame's
        return address; each with its depth (bytes from its stack slot to the top)."""
        top = sp + len(stack)

        def word(addr: int) -> int:
            return int.from_bytes(stack[addr - sp:addr - sp + 8], "little")

        chain = [(top - sp, ip)]
        ret = word(sp)
        if self._is_call_return(ret):
            chain.append((top - sp, ret))
        while sp <= bp and bp + 16 <= top and len(chain) < _STACK_TRACE_ENTRIES:
            ret = word(bp + 8)
            if not self._is_call_return(ret):
                break
            chain.append((top - (bp + 8), ret))
            next_bp = word(bp)
            if next_bp <= bp:
                break
            bp = next_bp
        return chain
