"""The kprobe event tracer: trace_kprobe events, their probes, and the probe-hit path.

:class:`Tracer` is Linux's trace_kprobe plus the bits of the trace array it needs: the
events registry (create/append/delete, §2.3–§2.6, in Linux's order and with its errno
map), enable/filter state per event, the ring buffer, the error log, the options and the
clock.  It talks to the kprobes engine only through ``register_kprobe`` and friends, to
the emulated kernel only through what a handler may read (memory, current task, CPU,
symbols), and creates event directories through an injected ``create_dir_hook``.

Control operations take :attr:`Tracer.lock` (Linux's event_mutex); the probe-hit path
takes only the ring buffer's lock.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import operator
import struct
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from kprobefs.errors import ImageError, MachineError, ProbeParseError
from kprobefs.tracing.clocks import trace_clocks
from kprobefs.tracing.error_log import ErrorLog
from kprobefs.tracing.fetch import (
    KPROBE_HEADER_SIZE, KRETPROBE_HEADER_SIZE, FetchArg, FetchFault, FetchImm, FetchReg,
    FetchRetval, FetchStackPointer, StoreRaw, build_record_fields, encode_args,
    format_event_format, print_args,
)
from kprobefs.tracing.function import FunctionTracer, StackTracer
from kprobefs.tracing.raw_page import raw_common
from kprobefs.tracing.filter import (
    EventFilter, FilterParseError, FILTER_ERRORS, compile_filter, filter_fields,
)
from kprobefs.tracing.output import (
    FLAGS_INT3, FLAGS_NONE, CommCache, TraceOptions, format_context, format_header,
    format_ip_sym,
)
from kprobefs.tracing.parser import (
    DeleteSpec, ProbeSpec, compare_arg_types, format_probe, is_same_probe, parse_command,
    split_commands, split_words,
)
from kprobefs.tracing.native import NativeRecorder
from kprobefs.tracing.ring_buffer import PAGE_DATA_SIZE, RingBuffer
from kprobefs.tracing.trace_events import StaticEvents
from kprobefs.tracing.synth import SYNTH_SYSTEM, SynthEvent, is_good_name, parse_synth_fields

__all__ = [
    "Tracer",
    "TraceEvent",
    "TraceProbe",
    "KernelSymbols",
    "OPTION_DEFAULTS",
    "FIRST_EVENT_ID",
    "MAX_DYNAMIC_EVENTS",
    "COMMAND_WRITE_CHUNK",
]

_log = logging.getLogger("kprobefs.tracing")

FIRST_EVENT_ID = 1800            # static events take the IDs below this on Debian's 6.1
_MAX_EVENT_ID = 0xFFFF
USER_ADDR_MAX = 0x00007FFFFFFFF000          # TASK_SIZE_MAX: user reads must stay below
_KERNEL_READ_MIN = 0x0000800000000000       # kernel reads below this fault
_THREAD_SIZE = 16 * 1024
_U64 = (1 << 64) - 1
_QWORD = struct.Struct("<Q")
_PAGE = 4096

# Engine flag bits (Linux's KPROBE_FLAG_*).
_KPROBE_FLAG_GONE = 1
_KPROBE_FLAG_DISABLED = 2


# The options this tracer implements (options/<name>), with their defaults.
OPTION_DEFAULTS = {
    "context-info": True,
    "event-fork": False,
    "irq-info": True,
    "markers": True,
    "overwrite": True,
    "pause-on-trace": False,
    "record-cmd": True,
    "stacktrace": False,
    "sym-addr": False,
    "sym-offset": False,
}

# Event names that are taken by the kernel's own (non-kprobe) events: a probe may not
# use them (EVENT_EXIST).  The ftrace internal events exist on every kernel.
_RESERVED_EVENTS = frozenset(("ftrace", name) for name in (
    "function", "funcgraph_entry", "funcgraph_exit", "context_switch", "wakeup",
    "kernel_stack", "user_stack", "bprint", "print", "raw_data", "bputs", "mmiotrace_rw",
    "mmiotrace_map", "branch", "hwlat", "func_repeats", "osnoise", "timerlat"))

_COMMON = struct.Struct("<HBBi")
_KPROBE_HEAD = struct.Struct("<Q")
_KRETPROBE_HEAD = struct.Struct("<QQ")
_TRACE_PRINT_ID = 5              # the record types of marker and stack records
_TRACE_STACK_ID = 4
_TRACE_BUF_SIZE = 1024           # longest trace_marker write
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


# ---------------------------------------------------------------------------- symbols

class KernelSymbols:
    """kallsyms of the emulated kernel for the parser (:class:`parser.SymbolResolver`),
    plus the notrace rule and symbolization for the output.

    ``image`` is the kernel image (``lookup_name``, ``symbol_at``, ``ftrace_sites``);
    ``pointer_key`` seeds the per-boot ``%p`` hash.
    """

    def __init__(self, image, pointer_key: bytes = b"kprobefs"):
        self.image = image
        self._key = hashlib.blake2b(pointer_key, digest_size=16).digest()
        self._sites_seen = None
        self._sites_sorted: tuple[int, ...] = ()

    @property
    def _sites(self) -> tuple[int, ...]:
        """The ftrace sites, sorted; re-read when the image's set changes (module
        sites come and go with their modules)."""
        sites = getattr(self.image, "ftrace_sites", ()) or ()
        if sites is not self._sites_seen:
            self._sites_seen, self._sites_sorted = sites, tuple(sorted(sites))
        return self._sites_sorted

    # parser.SymbolResolver
    def lookup(self, name: str) -> list[int]:
        # MOD:SYM looks in that module only; [] while it is not loaded (the image's rule).
        return [s.addr for s in self.image.lookup_name(name)]

    def module_loaded(self, name: str) -> bool:
        """Return True when module ``name`` is loaded (find_module)."""
        return name in (getattr(self.image, "modules", None) or {})

    def find_symbol(self, addr: int):
        sym = self.image.symbol_at(addr)
        if sym is None:
            return None
        return sym.name, addr - sym.addr, sym.size

    def hash_pointer(self, addr: int) -> int:
        digest = hashlib.blake2b((addr & _U64).to_bytes(8, "little"), key=self._key,
                                 digest_size=4).digest()
        return int.from_bytes(digest, "little")

    # the trace layer's own questions
    def address_of(self, spec: ProbeSpec) -> int | None:
        """Return the probed address of ``spec`` (``kallsyms_lookup_name + offset``), or
        ``None`` when the symbol does not resolve (yet)."""
        if spec.symbol is None:
            return spec.address
        found = self.lookup(spec.symbol_text)
        return (found[0] + spec.offset) & _U64 if found else None

    def has_ftrace_site(self, start: int, end: int) -> bool:
        """Return True when an ftrace site lies in ``[start, end)``."""
        i = bisect_left(self._sites, start)
        return i < len(self._sites) and self._sites[i] < end

    def within_notrace(self, addr: int | None) -> bool:
        """The notrace rule (§8.2 step 2): True when the function containing ``addr`` has
        no ftrace site (for ``foo.cold``-style pieces, nor has ``foo``)."""
        if not addr:
            return False
        sym = self.image.symbol_at(addr)
        if sym is None:
            return False
        if self.has_ftrace_site(sym.addr, sym.addr + max(sym.size, 1)):
            return False
        base, dot, _ = sym.name.partition(".")
        if not dot:
            return True
        found = self.lookup(base)
        if found:
            base_sym = self.image.symbol_at(found[0])
            if base_sym is not None:
                return not self.has_ftrace_site(base_sym.addr,
                                                base_sym.addr + max(base_sym.size, 1))
        return True

    def symbolize(self, addr: int, offset: bool = True) -> str | None:
        """Return ``sym+0xoff/0xsize`` (`` [mod]`` added inside a module), or ``sym``
        without ``offset``; ``None`` if no symbol covers ``addr``."""
        sym = self.image.symbol_at(addr)
        if sym is None:
            return None
        if not offset:
            return sym.name
        text = f"{sym.name}+0x{addr - sym.addr:x}/0x{sym.size:x}"
        module = getattr(sym, "module", None)
        return f"{text} [{module}]" if module else text     # sprint_symbol's " [mod]"

    def is_text(self, addr: int) -> bool:
        sym = self.image.symbol_at(addr)
        return sym is not None and sym.type in "Tt"

    def ftrace_site_names(self) -> list[tuple[int, str]]:
        """Return (site, function) for each ftrace site, in address order."""
        out = []
        for site in self._sites:
            sym = self.image.symbol_at(site)
            if sym is not None:
                out.append((site, sym.name))
        return out

    def ftrace_functions(self) -> list[str]:
        """Return the function of each ftrace site, in address order."""
        out = []
        for site in self._sites:
            sym = self.image.symbol_at(site)
            if sym is not None:
                out.append(sym.name)
        return out


# ---------------------------------------------------------------------- the hit context

class _HitContext:
    """What the fetch interpreter may read at one probe hit (fetch.FetchContext)."""

    __slots__ = ("kernel", "regs", "ri", "symbols")

    def __init__(self, kernel, regs, ri, symbols: KernelSymbols):
        self.kernel = kernel
        self.regs = regs
        self.ri = ri
        self.symbols = symbols

    def reg(self, name: str) -> int:
        return getattr(self.regs, name)

    def stack_pointer(self) -> int:
        return self.regs.sp

    def _read(self, addr: int, size: int) -> bytes:
        try:
            return self.kernel.read(addr, size)
        except Exception as exc:            # the machine's FaultError, or a bad address
            raise FetchFault(hex(addr)) from exc

    def read_kernel(self, addr: int, size: int) -> bytes:
        if addr < _KERNEL_READ_MIN or not _canonical(addr):
            raise FetchFault(hex(addr))
        return self._read(addr, size)

    def read_user(self, addr: int, size: int) -> bytes:
        if addr + size > USER_ADDR_MAX:
            raise FetchFault(hex(addr))
        return self._read(addr, size)

    def _read_string(self, addr: int, max_len: int) -> bytes:
        out = b""
        while len(out) < max_len - 1:
            chunk = min(_PAGE - (addr % _PAGE), max_len - 1 - len(out))
            data = self._read(addr, chunk)
            nul = data.find(b"\0")
            if nul >= 0:
                return out + data[:nul]
            out += data
            addr += chunk
        return out[:max_len - 1]

    def read_kernel_string(self, addr: int, max_len: int) -> bytes:
        if addr < _KERNEL_READ_MIN or not _canonical(addr):
            raise FetchFault(hex(addr))
        return self._read_string(addr, max_len)

    def read_user_string(self, addr: int, max_len: int) -> bytes:
        if addr >= USER_ADDR_MAX:
            raise FetchFault(hex(addr))
        return self._read_string(addr, max_len)

    def comm(self) -> str:
        return self.kernel.current_comm()

    def retval(self) -> int:
        return self.regs.ax

    def ret_ip(self) -> int:
        return self.ri.ret_addr if self.ri is not None else 0

    def symbolize(self, addr: int) -> str | None:
        return self.symbols.symbolize(addr, True)


#: The largest event payload (common fields included) a ring-buffer page holds, with
#: its 4-byte header and length word (BUF_MAX_DATA_SIZE); a larger event is dropped.
MAX_EVENT_PAYLOAD = PAGE_DATA_SIZE - 8
_FAST_REGS = {FetchReg: lambda insn: insn.name,
              FetchStackPointer: lambda insn: "sp",
              FetchRetval: lambda insn: "ax"}
_ARG_REGS = ("di", "si", "dx", "cx", "r8", "r9")
_PACK_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


def _compile_fast_fetch(programs: Sequence, is_return: bool):
    """Return ``f(regs) -> bytes`` equal to ``encode_args(programs, ...)`` when every
    program is a register/immediate/argument load stored raw (the common case), else
    ``None``.  Built once per probe from a fixed attribute getter (register names come
    from the parser's whitelist; nothing is evaluated)."""
    if not programs:
        return None
    names, masks, codes, immediates = [], [], [], {}
    for i, program in enumerate(programs):
        insns = program.insns
        if program.count or len(insns) != 2 or type(insns[1]) is not StoreRaw:
            return None
        source = insns[0]
        mask = (1 << (8 * insns[1].size)) - 1
        if type(source) is FetchArg and source.index < len(_ARG_REGS):
            names.append(_ARG_REGS[source.index])
        elif type(source) in _FAST_REGS:
            names.append(_FAST_REGS[type(source)](source))
        elif type(source) is FetchImm:
            immediates[i] = source.value & mask
            names.append(None)
        else:
            return None
        masks.append(mask)
        codes.append(_PACK_CODES[insns[1].size])
    pack = struct.Struct("<" + "".join(codes)).pack
    regs_needed = [n for n in names if n is not None]
    if not regs_needed:
        record = pack(*(immediates[i] for i in range(len(names))))
        return lambda regs: record
    getter = operator.attrgetter(*regs_needed)
    if immediates or len(regs_needed) == 1:
        def fetch(regs):
            values = getter(regs)
            if len(regs_needed) == 1:
                values = (values,)
            it = iter(values)
            return pack(*(immediates[i] if n is None else next(it) & masks[i]
                          for i, n in enumerate(names)))
        return fetch

    def fetch_regs(regs):
        return pack(*map(int.__and__, getter(regs), masks))
    return fetch_regs


def _canonical(addr: int) -> bool:
    top = addr >> 47
    return top == 0 or top == 0x1FFFF


# ------------------------------------------------------------------ events and probes

@dataclass(eq=False)
class TraceProbe:
    """One probe of a kprobe event (Linux's trace_kprobe): its spec, the engine object,
    its hit count, and whether it is registered (``False`` = pending on a module)."""

    spec: ProbeSpec
    event: "TraceEvent"
    engine_probe: Any = None
    registered: bool = False
    nhit: int = 0                 # hits the host's handler saw
    address: int = 0
    native: Any = None            # its struct trace_native_probe (NativeProbe), if any
    native_missed: int = 0        # misses of native probes it had before

    def definition(self) -> str:
        """The kprobe_events read-back line.  As in 6.1, a registered return probe shows
        the maxactive registration settled on (register_kretprobe writes the default
        back into the kretprobe the line is printed from)."""
        spec = self.spec
        maxactive = getattr(self.engine_probe, "maxactive", 0) if self.registered else 0
        if spec.is_return and not spec.maxactive and maxactive:
            spec = dataclasses.replace(spec, maxactive=maxactive)
        return format_probe(spec)

    @property
    def nmissed(self) -> int:
        """Return kprobe misses plus kretprobe instance shortages (and misses of the
        kernel recorder's probes this one had)."""
        obj = self.engine_probe
        if obj is None:
            return self.native_missed
        missed = int(getattr(obj, "nmissed", 0) or 0) + self.native_missed
        if self.spec.is_return:
            missed += int(getattr(getattr(obj, "kp", None), "nmissed", 0) or 0)
        return missed

    @property
    def entry_kprobe(self):
        obj = self.engine_probe
        return getattr(obj, "kp", obj) if self.spec.is_return else obj


@dataclass(eq=False)
class TraceEvent:
    """A kprobe trace event: ``events/<group>/<name>`` with one ID and one format,
    fed by one or more probes (the first is the primary: it defines the fields)."""

    group: str
    name: str
    id: int
    probes: list[TraceProbe] = field(default_factory=list)
    enabled: bool = False
    was_enabled: bool = False
    filter: EventFilter | None = None
    filter_text: str | None = None        # what the filter file shows (without "\n")
    dir_handle: Any = None

    @property
    def primary(self) -> ProbeSpec:
        return self.probes[0].spec

    @property
    def is_return(self) -> bool:
        return self.primary.is_return

    def record_fields(self):
        return build_record_fields(self.primary.args, self.primary.is_return)

    def format_text(self) -> str:
        return format_event_format(self.name, self.id, self.primary)

    def raw(self, record: tuple) -> bytes:
        """Return the record's binary form, laid out as the ``format`` file says."""
        _ts, pid, flags, _ev, ip, ret_ip, args = record
        head = raw_common(self.id, flags, pid) + _QWORD.pack(ip)
        if self.primary.is_return:
            head += _QWORD.pack(ret_ip)
        return head + args

    def render(self, record: tuple, tracer: "Tracer", options: TraceOptions) -> str:
        """Return the event text of a probe record (after the context columns)."""
        _ts, _pid, _flags, _ev, ip, ret_ip, args = record
        spec = self.primary
        sym = tracer.symbols.symbolize
        if spec.is_return:
            head = (f"{self.name}: ({format_ip_sym(ret_ip, sym, True)} <- "
                    f"{format_ip_sym(ip, sym, False)})")
            size = KRETPROBE_HEADER_SIZE
        else:
            head = f"{self.name}: ({format_ip_sym(ip, sym, True)})"
            size = KPROBE_HEADER_SIZE
        if not spec.args:
            return head + "\n"
        record_bytes = bytes(size) + args
        return head + print_args(spec.args, record_bytes, tracer.symbols.symbolize,
                                 is_return=spec.is_return) + "\n"


class _PrintEvent:
    """trace_marker records: ``(ts, pid, flags, PRINT_EVENT, text)``."""

    id = _TRACE_PRINT_ID

    def raw(self, record: tuple) -> bytes:
        """``ftrace/print``: the common fields, ``ip`` (0: not kept), ``buf``."""
        text = record[4]
        if not text.endswith(b"\0"):
            text += b"\0"
        return raw_common(self.id, record[2], record[1]) + _QWORD.pack(0) + text

    def render(self, record: tuple, tracer: "Tracer", options: TraceOptions) -> str:
        text = record[4]
        nul = text.find(b"\0")
        if nul >= 0:
            text = text[:nul]
        return "tracing_mark_write: " + text.decode("utf-8", "replace")


class _StackEvent:
    """Stack trace records (options/stacktrace): ``(ts, pid, flags, STACK_EVENT, addrs)``."""

    id = _TRACE_STACK_ID

    def raw(self, record: tuple) -> bytes:
        """``ftrace/kernel_stack``: the common fields, ``size``, then the callers."""
        addrs = record[4]
        return (raw_common(self.id, record[2], record[1])
                + struct.pack(f"<i4x{len(addrs)}Q", len(addrs), *addrs))

    def render(self, record: tuple, tracer: "Tracer", options: TraceOptions) -> str:
        sym = tracer.symbols.symbolize
        lines = ["<stack trace>\n"]
        for addr in record[4]:
            lines.append(f" => {format_ip_sym(addr, sym, options.sym_offset, options.sym_addr)}\n")
        return "".join(lines)


PRINT_EVENT = _PrintEvent()
STACK_EVENT = _StackEvent()


@dataclass(eq=False)
class _Group:
    name: str
    handle: Any = None
    events: int = 0


def _default_clock() -> Callable[[], int]:
    start = time.monotonic_ns()
    return lambda: time.monotonic_ns() - start


# ------------------------------------------------------------------------- the tracer

class Tracer:
    """The tracing instance behind ``tracing/``.

    ``engine`` has Linux's kprobe API (``register_kprobe`` … ``disable_kretprobe``);
    ``kernel`` offers ``read``, ``current_pid``, ``current_comm``, ``cpu.index``,
    ``nr_cpus`` and ``image``.  ``clock()`` returns nanoseconds since boot, the
    ``local`` trace clock (default: the kernel's TSC clock ``trace_clock``, which its
    recorder reads too, else ``time.monotonic_ns`` since construction); the others
    (tracing/clocks.py) follow the kernel's ``clock_ns`` (ktime), or this one.
    ``create_dir_hook(name, parent)`` makes a tracefs directory in the emulated kernel
    and returns a handle (``parent`` is ``None`` for a group directory under
    ``events/``, else the group's handle);
    ``remove_dir_hook(handle)`` undoes it.  ``kprobe_factory`` / ``kretprobe_factory``
    build engine probe objects (default: :mod:`kprobefs.kprobes`' classes).
    """

    def __init__(self, engine, kernel, *, clock: Callable[[], int] | None = None,
                 create_dir_hook: Callable[[str, Any], Any] | None = None,
                 remove_dir_hook: Callable[[Any], None] | None = None,
                 nr_cpus: int | None = None, pointer_key: bytes | None = None,
                 first_event_id: int = FIRST_EVENT_ID,
                 kprobe_factory: Callable[..., Any] | None = None,
                 kretprobe_factory: Callable[..., Any] | None = None,
                 reserved_events: Iterable[tuple[str, str]] = _RESERVED_EVENTS):
        self.engine = engine
        self.kernel = kernel
        tsc = getattr(kernel, "trace_clock", None)
        if not callable(getattr(tsc, "shifted", None)):
            tsc = None                            # not the machine's TSC clock
        self.clock = clock or (tsc.read if tsc is not None else _default_clock())
        self.clocks = trace_clocks(self.clock, getattr(kernel, "clock_ns", None) or self.clock,
                                   tsc)
        self.create_dir_hook = create_dir_hook
        self.remove_dir_hook = remove_dir_hook
        self.nr_cpus = nr_cpus or int(getattr(kernel, "nr_cpus", 1) or 1)
        key = pointer_key if pointer_key is not None else str(
            getattr(kernel, "seed", 0)).encode()
        self.symbols = KernelSymbols(kernel.image, key)
        self._kprobe_factory = kprobe_factory
        self._kretprobe_factory = kretprobe_factory
        self._reserved = frozenset(reserved_events)

        self.lock = threading.RLock()             # event_mutex
        self.events: dict[tuple[str, str], TraceEvent] = {}   # creation order
        self._events_by_id: dict[int, TraceEvent] = {}
        self.probes: list[TraceProbe] = []        # the kprobes, creation order
        self.dynamic: list[TraceProbe | SynthEvent] = []   # dyn_event list: every type
        self.groups: dict[str, _Group] = {}
        self.group_filter_text: dict[str, str] = {}
        self._next_id = first_event_id
        self._clear_trace = False

        self.buffer = RingBuffer(self.nr_cpus)
        self.error_log = ErrorLog(self.clock)
        self.comm_cache = CommCache()
        self.options = dict(OPTION_DEFAULTS)
        self.tracer_name = "nop"
        self.trace_clock = "local"
        self._now = self.clock
        self.tracing_on = True
        self._stop_count = 0
        self.recording = True                     # tracing_on and not paused
        self.stacktrace = False
        listeners = getattr(kernel, "exit_listeners", None)
        if isinstance(listeners, list):
            listeners.append(self.comm_cache.forget)
        modules = getattr(kernel, "modules", None)
        if modules is not None and hasattr(modules, "register_module_notifier"):
            modules.register_module_notifier(self._module_notify)
        # Events are recorded by the kernel itself where they can be (tracing/native.py):
        # on the real machine, when records share its clock.
        self.native: NativeRecorder | None = None
        regs = getattr(engine, "pt_regs_fields", None)
        if NativeRecorder.available(kernel) and regs and self.clocks["local"].tsc:
            try:
                self.native = NativeRecorder(kernel, regs, self._save_current_comm,
                                             self._events_by_id.get)
            except MachineError:
                _log.info("the kernel's recorder serves another tracer: recording here")
            else:
                self.native.attach(self.buffer)
        self.static_events = self._init_static_events()
        self.function_tracer: FunctionTracer | None = None
        self.stack_tracer: StackTracer | None = None
        ftrace = getattr(engine, "ftrace", None)
        if ftrace is not None:
            self._init_function_tracers(ftrace)

    def _init_static_events(self):
        """The kernel's TRACE_EVENTs (tracing/trace_events.py), in the event registry
        with the ids below FIRST_EVENT_ID; None without the kernel's recorder."""
        if self.native is None:
            return None
        try:
            static = StaticEvents(self.kernel, self.native)
        except ImageError as exc:
            _log.info("no static events: %s", exc)
            return None
        for ev in static.events:
            self.groups.setdefault(ev.group, _Group(ev.group)).events += 1
            self.events[(ev.group, ev.name)] = ev
            self._events_by_id[ev.id] = ev
        return static

    def _init_function_tracers(self, ftrace) -> None:
        """The function tracer and the stack tracer, on the engine's ftrace sites."""
        from kprobefs.kprobes import FtraceOps
        sites = self.symbols.ftrace_site_names
        self.function_tracer = FunctionTracer(
            ftrace, FtraceOps, sites, record=self.buffer.write, context=self._hit_context,
            recording=lambda: self.recording, now=lambda: self._now())
        self.stack_tracer = StackTracer(
            ftrace, FtraceOps, sites, read=self.kernel.read,
            is_call_return=self._is_call_return,
            symbolize=lambda addr: format_ip_sym(addr, self.symbols.symbolize, True))

    def tracefs_root(self):
        """Return the ``tracing/`` directory node (built once)."""
        root = getattr(self, "_root", None)
        if root is None:
            from kprobefs.tracing.files import tracing_root
            root = self._root = tracing_root(self)
        return root

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
            if event is not None:
                return self._append(event, spec, words)
            if (spec.group, spec.event) in self._reserved:
                raise self._log(words, "EVENT_EXIST", errno.EEXIST, 0)
            event = TraceEvent(spec.group, spec.event, self._allocate_id())
            tp = TraceProbe(spec, event)
            event.probes.append(tp)
            new_group = spec.group not in self.groups
            group = self.groups.get(spec.group) or _Group(spec.group)
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
        return tp

    def _registration_error(self, exc: OSError, words: list[str]) -> OSError:
        err = exc.errno or errno.EINVAL
        error_id = {errno.EILSEQ: "BAD_INSN_BNDRY", errno.ENOENT: "BAD_PROBE_ADDR",
                    errno.ENOMEM: None, errno.EEXIST: None}.get(err, "FAIL_REG_PROBE")
        if error_id is None:
            return OSError(err, exc.strerror or "")
        return self._log(words, error_id, err, 1)

    def _allocate_id(self) -> int:
        used = {ev.id for ev in self.events.values()}
        if self._next_id <= _MAX_EVENT_ID:
            new = self._next_id
            self._next_id += 1
            return new
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
                kp.flags = getattr(kp, "flags", 0) | _KPROBE_FLAG_DISABLED
            register = self.engine.register_kretprobe
        else:
            obj = self._new_kprobe(where, tp, _KPROBE_FLAG_DISABLED if disabled else 0)
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
        if state != "coming":
            return
        with self.lock:
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
                for item in list(self.dynamic if all_types else self.probes):
                    if isinstance(item, SynthEvent):
                        if item.name != spec.event or spec.group not in (None,
                                                                         SYNTH_SYSTEM):
                            continue
                        self._release_synth(item)
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

    def release_all(self, *, kprobes: bool = True, synthetic: bool = False) -> None:
        """Delete every kprobe event and/or synthetic event (O_TRUNC on kprobe_events,
        synthetic_events, dynamic_events); EBUSY and nothing deleted if one of them is
        enabled."""
        with self.lock:
            chosen = [item for item in self.dynamic
                      if (synthetic if isinstance(item, SynthEvent) else kprobes)]
            try:
                if any((item if isinstance(item, SynthEvent) else item.event).enabled
                       for item in chosen):
                    raise OSError(errno.EBUSY, "event is enabled")
                for item in chosen:
                    if isinstance(item, SynthEvent):
                        self._release_synth(item)
                    else:
                        self._release(item)
            finally:
                self._reset_if_needed()

    def release_all_dynamic(self) -> None:
        """O_TRUNC on dynamic_events: every dynamic event, of every type."""
        self.release_all(kprobes=True, synthetic=True)

    def teardown(self) -> None:
        """Take every probe and ftrace hook out of the kernel text (the daemon is going
        away): events disabled, the function and stack tracers stopped, every dynamic
        event deleted.  The event directories are left to the dying kernel."""
        with self.lock:
            self.remove_dir_hook = None
            self.set_events_enabled(False, allow_none=True)
            if self.function_tracer is not None:
                self.set_current_tracer("nop")
            if self.stack_tracer is not None:
                self.stack_tracer.set_enabled(0)
            self.release_all(kprobes=True, synthetic=True)

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
        """``s:[synthetic/]NAME FIELDS`` written to dynamic_events."""
        head, _, fields = line.partition(" ")
        if not fields.strip():
            head, _, fields = line.partition("\t")
        name = head[2:]
        if "/" in name:
            group, _, name = name.partition("/")
            if group != SYNTH_SYSTEM:
                raise OSError(errno.EINVAL, "synthetic events live in synthetic/")
        if not fields.strip():
            raise OSError(errno.EINVAL, "no fields")
        self.create_synth(name, fields)

    def run_synth_commands(self, data: bytes) -> int:
        """Apply one write() of synthetic_events: ``NAME FIELDS`` creates, ``!NAME``
        deletes; each line in order, stopping at the first failure."""
        data, count = _whole_lines(data)
        with self.lock:
            for line in split_commands(data):
                line = line.strip(" \t")
                if not line:
                    continue
                name, sep, fields = line.replace("\t", " ").partition(" ")
                if name.startswith("!"):
                    self.delete_synth(name[1:])
                elif not sep:
                    raise OSError(errno.EINVAL, "no fields")
                else:
                    self.create_synth(name, fields)
        return count

    def create_synth(self, name: str, raw_fields: str) -> SynthEvent:
        """Define synthetic event ``name``; EINVAL for a bad name or field, EEXIST when
        the name is taken."""
        with self.lock:
            if not name or not is_good_name(name):
                raise OSError(errno.EINVAL, f"bad event name {name!r}")
            if (SYNTH_SYSTEM, name) in self.events:
                raise OSError(errno.EEXIST, f"event {name} exists")
            self._check_room()
            fields = parse_synth_fields(raw_fields)
            event = SynthEvent(name, self._allocate_id(), fields)
            group = self.groups.get(SYNTH_SYSTEM)
            new_group = group is None
            if new_group:
                group = _Group(SYNTH_SYSTEM)
                group.handle = self._make_dir(SYNTH_SYSTEM, None)
                self.groups[SYNTH_SYSTEM] = group
            event.dir_handle = self._make_dir(name, group.handle)
            group.events += 1
            self.events[(SYNTH_SYSTEM, name)] = event
            self.dynamic.append(event)
            return event

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
        if event.enabled:
            raise OSError(errno.EBUSY, "event is enabled")
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
            self.buffer.materialize()       # staged records still name the event by id
        self._events_by_id.pop(event.id & 0xFFFF, None)
        del self.events[(event.group, event.name)]
        self._remove_dir(event.dir_handle)
        if event.was_enabled:
            self._clear_trace = True
        group = self.groups[event.group]
        group.events -= 1
        if not group.events:
            del self.groups[event.group]
            self.group_filter_text.pop(event.group, None)
            self._remove_dir(group.handle)

    def _reset_if_needed(self) -> None:
        if self._clear_trace:
            self._clear_trace = False
            self.buffer.reset()

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

    def events_newest_first(self) -> list[TraceEvent]:
        """Return the events in the kernel's list order (newest first)."""
        with self.lock:
            return list(reversed(self.events.values()))

    # ================================================================ enable
    def update_buffers(self) -> None:
        """Expand the ring buffer to its default size on first use (tracing_update_buffers)."""
        self.buffer.expand()

    def set_enabled(self, event: TraceEvent, on: bool) -> None:
        """Enable or disable every probe of ``event``; an enable failure rolls back."""
        with self.lock:
            if event.enabled == on:
                return
            if on:
                done = []
                try:
                    for tp in event.probes:
                        if tp.registered:
                            self._engine_enable(tp, True)
                            done.append(tp)
                except OSError:
                    for tp in done:
                        self._engine_enable(tp, False)
                    raise
                event.enabled = True
                event.was_enabled = True
            else:
                event.enabled = False
                for tp in event.probes:
                    if tp.registered:
                        self._engine_enable(tp, False)
            self._native_sync(event.probes)

    def _engine_enable(self, tp: TraceProbe, on: bool) -> None:
        engine = self.engine
        if on and getattr(tp.entry_kprobe, "flags", 0) & _KPROBE_FLAG_GONE:
            return      # its module went away: enabling succeeds, nothing to arm (§8.10)
        if tp.spec.is_return:
            (engine.enable_kretprobe if on else engine.disable_kretprobe)(tp.engine_probe)
        else:
            (engine.enable_kprobe if on else engine.disable_kprobe)(tp.engine_probe)

    def set_events_enabled(self, on: bool, *, match: str | None = None,
                           group: str | None = None, event: str | None = None,
                           allow_none: bool = False) -> None:
        """Enable/disable the events selected like ``set_event`` does (``match`` = an
        event or group name, ``group``/``event`` = exact parts, ``None`` = any).

        Every matching event is changed; the first error is raised afterwards.  No
        match is EINVAL unless ``allow_none``.
        """
        with self.lock:
            first_error = None
            matched = False
            for ev in self.events_newest_first():
                if match is not None and match != ev.name and match != ev.group:
                    continue
                if group is not None and group != ev.group:
                    continue
                if event is not None and event != ev.name:
                    continue
                matched = True
                try:
                    self.set_enabled(ev, on)
                except OSError as exc:
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error
            if not matched and not allow_none:
                raise OSError(errno.EINVAL, "no such event")

    def enable_state(self, group: str | None = None) -> str:
        """Return ``0``/``1``/``X``/``?`` for the events of ``group`` (or all)."""
        with self.lock:
            states = {ev.enabled for ev in self.events.values()
                      if group is None or ev.group == group}
        if not states:
            return "?"
        if len(states) == 2:
            return "X"
        return "1" if True in states else "0"

    # ================================================================ filters
    def set_filter(self, event: TraceEvent, text: str) -> None:
        """Apply a write to ``event``'s filter file (trailing blanks already removed)."""
        with self.lock:
            try:
                self._set_filter(event, text)
            finally:
                self._native_sync(event.probes)     # a filter runs in the host

    def _set_filter(self, event: TraceEvent, text: str) -> None:
        if text.strip(" \t\n\v\f\r") == "0":
            event.filter = None
            event.filter_text = None
            return
        try:
            event.filter = compile_filter(text, filter_fields(event.record_fields()))
            event.filter_text = text
        except FilterParseError as exc:
            event.filter = None
            event.filter_text = exc.file_text(text)
            self.error_log.add("event filter parse error", text, exc.message,
                               exc.log_pos)
            raise OSError(exc.errno, exc.message) from None

    def set_group_filter(self, group: str, text: str) -> None:
        """Apply a write to ``events/<group>/filter``: every event of the group gets the
        filter; an event it does not fit gets it disabled with an error shown."""
        with self.lock:
            try:
                self._set_group_filter(group, text)
            finally:
                self._native_sync(self.probes)

    def _set_group_filter(self, group: str, text: str) -> None:
        events = [ev for ev in self.events_newest_first() if ev.group == group]
        if not events:
            raise OSError(errno.ENODEV, "no events")
        if text.strip(" \t\n\v\f\r") == "0":
            for ev in events:
                ev.filter = None
                ev.filter_text = None
            self.group_filter_text.pop(group, None)
            return
        bad = FilterParseError(errno.EINVAL, FILTER_ERRORS.index(
            "Couldn't find or set field in one of a subsystem's events"), 0)
        for ev in events:
            try:
                ev.filter = compile_filter(text, filter_fields(ev.record_fields()))
                ev.filter_text = text
            except FilterParseError:
                ev.filter = None
                ev.filter_text = bad.file_text(text)
                self.error_log.add("event filter parse error", text, bad.message, 0)
        self.group_filter_text.pop(group, None)

    # ================================================================ buffer control
    def clear_trace(self) -> None:
        self.buffer.reset()

    def set_tracing_on(self, on: bool) -> None:
        with self.lock:
            self.tracing_on = on
            self._update_recording()

    def pause(self) -> None:
        """Stop recording while a ``trace`` reader is open (options/pause-on-trace)."""
        with self.lock:
            self._stop_count += 1
            self._update_recording()

    def unpause(self) -> None:
        with self.lock:
            self._stop_count = max(0, self._stop_count - 1)
            self._update_recording()

    def _update_recording(self) -> None:
        self.recording = self.tracing_on and not self._stop_count
        self._native_sync(self.probes)

    def set_option(self, name: str, on: bool) -> None:
        with self.lock:
            self.options[name] = on
            self.stacktrace = self.options["stacktrace"]
            self.buffer.overwrite = self.options["overwrite"]
            if name == "event-fork" and self.static_events is not None:
                self.static_events.set_event_fork(on)
            self._native_sync(self.probes)      # stack traces are taken by the host

    def set_trace_clock(self, name: str) -> None:
        """Select a trace clock (clears the buffer); EINVAL for an unknown name."""
        clock = self.clocks.get(name)
        if clock is None:
            raise OSError(errno.EINVAL, "unknown clock")
        with self.lock:
            self.trace_clock = name
            self._now = clock.read
            if self.native is not None and clock.tsc is not None:
                self.native.set_clock(clock.tsc)
            self.buffer.reset()                 # what the kernel staged goes too
            self._native_sync(self.probes)      # the kernel stamps with TSC clocks only

    def set_current_tracer(self, name: str) -> None:
        """Switch tracers; a switch to another tracer resets the buffer (tracer_init)."""
        if name not in self.available_tracers():
            raise OSError(errno.EINVAL, "unknown tracer")
        with self.lock:
            self.buffer.expand()
            if name == self.tracer_name:
                return
            functions = self.function_tracer
            if functions is not None:
                if name == "function":
                    functions.start()
                else:
                    functions.stop()
            self.tracer_name = name
            self.buffer.reset()

    def available_tracers(self) -> list[str]:
        """Newest registered first, as Linux lists them."""
        return ["function", "nop"] if self.function_tracer is not None else ["nop"]

    def trace_options(self) -> TraceOptions:
        return TraceOptions(self.options["context-info"], self.options["irq-info"],
                            self.options["sym-offset"], self.options["sym-addr"],
                            self.clocks[self.trace_clock].in_ns)

    # ================================================================ trace_marker
    def write_marker(self, data: bytes, pid: int, comm: str) -> int:
        """Record a ``tracing_mark_write`` line; return the bytes taken (at most 1024)."""
        if not self.options["markers"]:
            raise OSError(errno.EINVAL, "markers disabled")
        count = min(len(data), _TRACE_BUF_SIZE)
        if not self.recording:
            raise OSError(errno.EBADF, "tracing is off")
        text = bytes(data[:count])
        if not text.endswith(b"\n"):
            text += b"\n"
        if self.options["record-cmd"]:
            self.comm_cache.save(pid, comm[:15])
        self.buffer.write(self._current_cpu(), (self._now(), pid, FLAGS_NONE, PRINT_EVENT,
                                                text), 16 + count + 2)
        return count

    def _current_cpu(self) -> int:
        cpu = getattr(self.kernel, "cpu", None)
        return cpu.index if cpu is not None else 0

    # ================================================================ native recording
    def _native_prepare(self, tp: TraceProbe, address: int) -> None:
        """Give tp a struct trace_native_probe in the kernel if its arguments can be
        recorded there, and set its kprobe's native handler (before registration)."""
        if tp.native is not None and tp.native.ip != address:
            self._native_free(tp)           # a module came back elsewhere
        if self.native is not None and tp.native is None:
            spec = tp.spec
            maxactive = spec.maxactive or self.engine.default_maxactive() \
                if spec.is_return else 0
            tp.native = self.native.new_probe(tp.event.id, address, spec.programs,
                                              sum(p.record_size for p in spec.programs),
                                              maxactive)
        self._native_sync((tp,))

    def _native_free(self, tp: TraceProbe) -> None:
        if tp.native is not None:
            tp.nhit += self.native.hits(tp.native)
            tp.native_missed += self.native.misses(tp.native)
            self.native.free_probe(tp.native)
            tp.native = None
            kp = tp.entry_kprobe
            if kp is not None and kp.native is not None:
                kp.native = None
                if tp.registered:
                    self.engine.refresh_kprobe(kp)

    def _native_sync(self, probes: Iterable[TraceProbe]) -> None:
        """Point each probe's kprobe at the kernel's recorder when it can record the
        event as things stand (a filter it can evaluate, no stack traces, the kernel's
        clock), else at the host's handler; and tell the recorder whether the event
        records, and its filter."""
        native = self.native
        if native is None:
            return
        usable = not self.stacktrace and self.clocks[self.trace_clock].tsc is not None
        if self.static_events is not None:
            self.static_events.sync(self.recording, usable)
        for tp in probes:
            np, kp = tp.native, tp.entry_kprobe
            if np is None or kp is None:
                continue
            event = tp.event
            native.set_recording(np, event.enabled and self.recording)
            flt = event.filter
            here = usable and native.set_filter(np, flt.program if flt is not None else None)
            handler = native.ret_entry if np.is_return else native.handler
            want = (handler, np.addr) if here else None
            if kp.native != want:
                kp.native = want
                if tp.registered:
                    self.engine.refresh_kprobe(kp)

    # ================================================================ the hit path
    def _kprobe_handler(self, tp: TraceProbe):
        record = self._recorder(tp, False)

        def pre_handler(kp, regs):
            tp.nhit += 1
            if self.recording:
                record(kp, regs, None)
            return 0
        return pre_handler

    def _kretprobe_handler(self, tp: TraceProbe):
        record = self._recorder(tp, True)

        def handler(ri, regs):
            tp.nhit += 1
            if self.recording:
                record(None, regs, ri)
            return 0
        return handler

    def _recorder(self, tp: TraceProbe, is_return: bool):
        """Return the function that records one hit of ``tp`` (the hot path): fetch the
        args, filter, save the comm, and commit the record to the current CPU's buffer."""
        kernel = self.kernel
        event = tp.event
        symbols = self.symbols
        programs = tp.spec.programs
        fast = _compile_fast_fetch(programs, is_return)
        names = self.comm_cache.names
        stale = self.comm_cache.stale
        save_comm = self.comm_cache.save
        options = self.options
        buffer = self.buffer
        head_size = KRETPROBE_HEADER_SIZE if is_return else KPROBE_HEADER_SIZE
        int3_flags = FLAGS_INT3 if not is_return else FLAGS_NONE

        def record(kp, regs, ri) -> None:
            if not event.enabled:
                return
            if fast is not None:
                args = fast(regs)
            elif programs:
                args = encode_args(programs, _HitContext(kernel, regs, ri, symbols),
                                   is_return=is_return)
                if head_size + len(args) > MAX_EVENT_PAYLOAD:
                    return          # no ring-buffer page holds it: Linux drops it too
            else:
                args = b""
            pid = kernel.current_pid()
            cpu_obj = kernel.cpu
            cpu = cpu_obj.index if cpu_obj is not None else 0
            ip = tp.address
            if ri is not None:
                ret_ip = ri.ret_addr
                ip = ip or ri.func
                flags = FLAGS_NONE
            else:
                ret_ip = 0
                ip = ip or regs.ip - 1
                # A hit that trapped (an int3, not a detour or an ftrace trampoline)
                # runs with interrupts off in an NMI-like context.
                flags = int3_flags if getattr(regs, "trapped", True) else FLAGS_NONE
            flt = event.filter
            if flt is not None:
                head = (_KRETPROBE_HEAD.pack(ip, ret_ip) if ri is not None
                        else _KPROBE_HEAD.pack(ip))
                if not flt.match(_COMMON.pack(event.id & 0xFFFF, 0, 0, pid) + head + args,
                                 cpu, kernel.current_comm):
                    return
            if (pid not in names or pid in stale) and options["record-cmd"]:
                save_comm(pid, kernel.current_comm())
            ts = self._now()
            rec = (ts, pid, flags, event, ip, ret_ip, args)
            if self.stacktrace:
                stack = self._unwind(regs, ip if ri is None else 0)
                buffer.write_many(cpu, ((rec, head_size + len(args)),
                                        ((ts, pid, flags, STACK_EVENT, stack),
                                         16 + 8 * len(stack))))
            else:
                buffer.write(cpu, rec, head_size + len(args))
        return record

    def _hit_context(self) -> tuple[int, int]:
        """Return (pid, cpu) of the running task, saving its comm for the output (the
        function tracer's hit path)."""
        kernel = self.kernel
        pid = kernel.current_pid()
        cache = self.comm_cache
        if (pid not in cache.names or pid in cache.stale) and self.options["record-cmd"]:
            cache.save(pid, kernel.current_comm())
        cpu = kernel.cpu
        return pid, cpu.index if cpu is not None else 0

    def _save_current_comm(self) -> None:
        """Save the running task's comm: the kernel's recorder asks when a CPU's task
        changed or the task was renamed (saved_cmdlines keeps the latest name)."""
        pid = self.kernel.current_pid()
        if pid and self.options["record-cmd"]:      # pid 0 stays <idle>, as in Linux
            self.comm_cache.save(pid, self.kernel.current_comm())

    def _is_call_return(self, value: int) -> bool:
        """Whether a stack word is a return address: kernel text right after a call."""
        if value < _KERNEL_READ_MIN or not self.symbols.is_text(value):
            return False
        try:
            before = self.kernel.image.read(value - 5, 5)
        except Exception:
            return False
        return before[0] == 0xE8 or before[3] == 0xFF or before[2] == 0xFF

    def _unwind(self, regs, ip: int, limit: int = 32) -> tuple[int, ...]:
        """Return a best-effort kernel call chain: ``ip``, then the return addresses
        found on the stack (text addresses right after a call instruction)."""
        out = [ip] if ip else []
        sp = regs.sp & _U64
        top = (sp | (_THREAD_SIZE - 1)) + 1
        try:
            data = self.kernel.read(sp, top - sp)
        except Exception:
            return tuple(out)
        for (value,) in struct.iter_unpack("<Q", data[:len(data) & ~7]):
            if len(out) >= limit:
                break
            if self._is_call_return(value):
                out.append(value)
        return tuple(out)

    # ================================================================ trace text
    def render(self, pairs: Iterable[tuple[int, tuple]], options: TraceOptions) -> str:
        """Return the trace lines of (cpu, record) pairs."""
        cache = self.comm_cache
        out = []
        for cpu, rec in pairs:
            ts, pid, flags, ev = rec[0], rec[1], rec[2], rec[3]
            out.append(format_context(cache.find(pid), pid, cpu, flags, ts, options))
            out.append(ev.render(rec, self, options))
        return "".join(out)

    def trace_header(self, options: TraceOptions, cpu: int | None = None) -> str:
        entries, written = self.buffer.counts(None)
        return format_header(self.tracer_name, entries, written, self.nr_cpus, options)

    # ================================================================ misc
    def set_event_tokens(self, data: bytes) -> int:
        """Apply a write to ``set_event``: whitespace-separated ``[!][grp:]ev`` tokens."""
        self.update_buffers()
        for token in data.decode("latin-1").split():
            on = not token.startswith("!")
            if not on:
                token = token[1:]
            sub, sep, name = token.partition(":")
            if sep:
                group = None if sub in ("", "*") else sub
                event = None if name in ("", "*") else name
                self.set_events_enabled(on, group=group, event=event)
            else:
                self.set_events_enabled(on, match=token)
        return len(data)

    def enabled_event_lines(self) -> str:
        return "".join(f"{ev.group}:{ev.name}\n" for ev in self.events_newest_first()
                       if ev.enabled)

    def available_event_lines(self) -> str:
        return "".join(f"{ev.group}:{ev.name}\n" for ev in self.events_newest_first())
