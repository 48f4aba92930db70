"""kprobe events (Linux's trace_kprobe): the event and its probes, and the probe-hit path
that fetches a hit's arguments and records it into every trace array the event is
enabled in.  The registry that creates and deletes them is :class:`registry.Tracer`."""

from __future__ import annotations

import dataclasses
import operator
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kprobefs.tracing.events.fetch import (
    KPROBE_HEADER_SIZE, KRETPROBE_HEADER_SIZE, FetchArg, FetchFault, FetchImm, FetchReg,
    FetchRetval, FetchStackPointer, StoreRaw, build_record_fields, encode_args,
    format_event_format, print_args,
)
from kprobefs.tracing.buffers.output import (
    FLAGS_INT3, FLAGS_NONE, TraceOptions, compile_probe_text, format_ip_sym,
)
from kprobefs.tracing.events.probe_parser import ProbeSpec, format_probe
from kprobefs.tracing.buffers.raw_page import raw_common
from kprobefs.tracing.buffers.ring_buffer import PAGE_DATA_SIZE
from kprobefs.tracing.symbols import KernelSymbols
from kprobefs.tracing.trace_array import STACK_EVENT
from kprobefs.tracing.triggers.trigger import TriggerHit

__all__ = ["TraceProbe", "TraceEvent", "HitContext", "make_recorder", "unwind",
           "is_call_return", "USER_ADDR_MAX", "MAX_EVENT_PAYLOAD"]

USER_ADDR_MAX = 0x00007FFFFFFFF000          # TASK_SIZE_MAX: user reads must stay below
_KERNEL_READ_MIN = 0x0000800000000000       # kernel reads below this fault
_THREAD_SIZE = 16 * 1024
_U64 = (1 << 64) - 1
_QWORD = struct.Struct("<Q")
_PAGE = 4096
_COMMON = struct.Struct("<HBBi")
_KPROBE_HEAD = struct.Struct("<Q")
_KRETPROBE_HEAD = struct.Struct("<QQ")


# ---------------------------------------------------------------------- the hit context

class HitContext:
    """What the fetch interpreter may read at one probe hit (fetch.FetchContext);
    ``regs`` and ``ri`` are ``None`` for an event probe, which reads no registers."""

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
    enabled: bool = False                 # in some trace array (soft mode included)
    was_enabled: bool = False
    #: The event files (trace_array.EventFile) it is armed in, one per trace array:
    #: what the hit path records into, or runs the triggers of.
    on: tuple = ()
    dir_handle: Any = None
    #: (primary spec, symbolize, modules token, compile_text's answer) last made
    _text: tuple | None = field(default=None, repr=False)

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

    def compile_text(self, symbolize, token: object = None) -> Callable[[tuple], str] | None:
        """The event text as one compiled format (output.compile_probe_text), or
        ``None`` when an argument needs :meth:`render`.  Made once for the primary
        probe and the symbols (``symbolize``, and ``token``: KernelSymbols.modules_token,
        what the names of addresses depend on) and kept, with the names of the
        addresses it printed: as Linux sets an event's print format when the event is
        created (Tracer.create makes it then), not when ``trace`` is read."""
        if not self.probes:
            return None
        spec = self.primary
        kept = self._text
        if kept is not None and kept[0] is spec and kept[1] == symbolize \
                and (kept[2] is token or kept[2] == token):
            return kept[3]
        text = compile_probe_text(self.name, spec.is_return, spec.args, symbolize)
        self._text = (spec, symbolize, token, text)
        return text

    def render(self, record: tuple, tracer, options: TraceOptions) -> str:
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


# ------------------------------------------------------------------ the hit path

def make_recorder(tp: TraceProbe, is_return: bool, kernel, symbols: KernelSymbols,
                  comm_cache) -> Callable[[Any, Any, Any], None]:
    """Return ``record(kp, regs, ri)``, which records one hit of ``tp`` (the hot path):
    fetch the args once, then for each trace array the event is enabled in (and that
    records), filter, save the comm, and commit the record to the current CPU's buffer
    there; an event file with triggers goes through its array's ``record_triggered``
    (triggers run whether or not the file records)."""
    event = tp.event
    programs = tp.spec.programs
    fast = _compile_fast_fetch(programs, is_return)
    names = comm_cache.names
    stale = comm_cache.stale
    save_comm = comm_cache.save
    head_size = KRETPROBE_HEADER_SIZE if is_return else KPROBE_HEADER_SIZE
    int3_flags = FLAGS_INT3 if not is_return else FLAGS_NONE
    irq = getattr(kernel, "irq", None)      # the context of a hit that did not trap
    context_flags = irq.context_flags if irq is not None else (lambda _cpu: FLAGS_NONE)

    def record(kp, regs, ri) -> None:
        files = event.on
        if not files:
            return
        if fast is not None:
            args = fast(regs)
        elif programs:
            args = encode_args(programs, HitContext(kernel, regs, ri, symbols),
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
            flags = context_flags(cpu_obj) if cpu_obj is not None else FLAGS_NONE
        else:
            ret_ip = 0
            ip = ip or regs.ip - 1
            # A hit that trapped (an int3, not a detour or an ftrace trampoline)
            # runs with interrupts off in an NMI-like context.
            if getattr(regs, "trapped", True):
                flags = int3_flags
            else:
                flags = context_flags(cpu_obj) if cpu_obj is not None else FLAGS_NONE
        raw = None
        for ef in files:
            tr = ef.tr
            triggers = ef.triggers
            if triggers is not None and triggers.items:
                head = (_KRETPROBE_HEAD.pack(ip, ret_ip) if ri is not None
                        else _KPROBE_HEAD.pack(ip))
                unwind_ip = ip if ri is None else 0
                hit = TriggerHit(cpu, pid, tr.now(), kernel.current_comm,
                                 lambda: unwind(kernel, symbols, regs, unwind_ip))
                tr.record_triggered(ef, raw_common(event.id, flags, pid) + head + args,
                                    (hit.ts, pid, flags, event, ip, ret_ip, args),
                                    head_size + len(args), hit)
                continue
            if not tr.recording or ef.soft_disabled:
                continue
            pids = tr.event_pids
            if pids.active and pids.ignores(pid):
                continue
            flt = ef.filter
            if flt is not None:
                if raw is None:
                    head = (_KRETPROBE_HEAD.pack(ip, ret_ip) if ri is not None
                            else _KPROBE_HEAD.pack(ip))
                    raw = _COMMON.pack(event.id & 0xFFFF, 0, 0, pid) + head + args
                if not flt.match(raw, cpu, kernel.current_comm):
                    continue
            if (pid not in names or pid in stale) and tr.options["record-cmd"]:
                save_comm(pid, kernel.current_comm())
            ts = tr.now()
            rec = (ts, pid, flags, event, ip, ret_ip, args)
            if tr.stacktrace:
                stack = unwind(kernel, symbols, regs, ip if ri is None else 0)
                tr.buffer.write_many(cpu, ((rec, head_size + len(args)),
                                           ((ts, pid, flags, STACK_EVENT, stack),
                                            16 + 8 * len(stack))))
            else:
                tr.buffer.write(cpu, rec, head_size + len(args))
    return record


def is_call_return(kernel, symbols: KernelSymbols, value: int) -> bool:
    """Whether a stack word is a return address: kernel text right after a call."""
    if value < _KERNEL_READ_MIN or not symbols.is_text(value):
        return False
    try:
        before = kernel.image.read(value - 5, 5)
    except Exception:
        return False
    return before[0] == 0xE8 or before[3] == 0xFF or before[2] == 0xFF


def unwind(kernel, symbols: KernelSymbols, regs, ip: int,
           limit: int = 32) -> tuple[int, ...]:
    """Return a best-effort kernel call chain: ``ip``, then the return addresses found
    on the stack (text addresses right after a call instruction)."""
    out = [ip] if ip else []
    sp = regs.sp & _U64
    top = (sp | (_THREAD_SIZE - 1)) + 1
    try:
        data = kernel.read(sp, top - sp)
    except Exception:
        return tuple(out)
    for (value,) in struct.iter_unpack("<Q", data[:len(data) & ~7]):
        if len(out) >= limit:
            break
        if is_call_return(kernel, symbols, value):
            out.append(value)
    return tuple(out)
