"""Recording kprobe events in the kernel itself: the host side of kernel/trace_native.c.

Linux records a kprobe event in kernel context: the optimized probe's detour saves the
registers, ``kprobe_trace_func`` interprets the event's fetch program and commits the
record to the ring buffer, and nothing else runs.  kprobefs does the same on the emulated
kernel.  An event's fetch programs are encoded here, once, into the kernel's
``struct trace_native_probe`` (include/trace_native.h); the probe's ``native`` handler
is ``trace_native_probe``, which the engine's native detours and ftrace trampolines
call.  The kernel stages records per CPU, accounted as ring-buffer pages;
:class:`NativeRecorder` is the ring buffer's
:class:`~kprobefs.tracing.buffers.ring_buffer.Stage` for them, and serves the three
hypercalls the recorder makes (save a comm, a page is full, wake a reader).

An event's filter is encoded too (:func:`encode_filter`), and the kernel evaluates it on
the record before staging it.

Return probes are recorded here too: the kernel's entry handler hijacks the return
address with one of the probe's instances (allocated with it) and its trampoline
records the event.

Not everything can be recorded this way: ``symstr``, string arrays and globs with a
``[...]`` class stay with the host's interpreter (fetch.py, filter.py), which also
handles every hit that comes another way (several probes at one address, a site other
ftrace users share, an int3 on an instruction that is emulated or single-stepped).  Both
paths write the same record.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from itertools import repeat
from operator import and_, rshift
from typing import Callable, NamedTuple, Sequence

from ...errors import ImageError
from ..events.fetch import (
    Deref, FetchArg, FetchComm, FetchData, FetchImm, FetchProgram, FetchReg, FetchRetIP,
    FetchRetval, FetchStack, FetchStackPointer, FetchSymbol, LoopArray, ModBitfield, StoreMem,
    StoreRaw, StoreString,
)
from ..triggers.filter import as_field_type
from .raw_page import TYPE_DATA_MAX, TYPE_TIME_EXTEND
from .ring_buffer import Chunk

__all__ = ["NativeRecorder", "NativeProbe", "StagedColumns", "split_heads", "encode_programs",
           "encode_filter"]

_ARG_REGS = ("di", "si", "dx", "cx", "r8", "r9")

# enum tn_op
(_END, _REG, _IMM, _STACK, _DEREF, _UDEREF, _ST_RAW, _ST_MEM, _ST_UMEM, _BITFIELD,
 _REG_RAW, _ST_STRING, _ST_USTRING, _COMM, _DATA, _RETIP) = range(16)
_TNP_RECORD = 1

_INSN = struct.Struct("<BBBBIq")            # struct tn_insn
_PROBE = struct.Struct("<QQQIH2xQIIQQ")     # struct trace_native_probe, before insns
_MISSED_AT, _FILTER_AT, _FLAGS_AT, _TYPE_AT, _PENDING_AT, _RET_FREE_AT = 8, 16, 24, 28, 44, 48
_U16 = struct.Struct("<H")
_TNP_RETURN = 2
_TNP_HOST = 4
_RET_INSTANCE = struct.Struct("<QQQQQ")     # struct tn_ret_instance
#: struct tn_entry: ts, size, len, the ring-buffer event header (rb, read in place by
#: _raw_whole), the common fields (type, flags, preempt_count, pid).
_ENTRY = struct.Struct("<QII8xHBxi")
_RAW_ENTRY = struct.Struct("<QIIIIHBxi")        # the same with the event header
_CPU = struct.Struct("<IIQII")              # struct tn_cpu: used .. count
_SYNC = struct.Struct("<IIQ")               # struct tn_cpu: used, has_last, last_ts
_STAGED = struct.Struct("<II")              # struct tn_cpu: staged, count
_STAGED_AT, _COUNT_AT, _WAITERS_AT, _COMM_TASK_AT = 16, 20, 24, 32
_ENTRY_SIZE = _ENTRY.size
_ENTRY_RB_AT = 16                           # struct tn_entry's rb
_ENTRY_TYPE_AT = 24                         # its common_type
_Q = struct.Struct("<Q")
_QQ = struct.Struct("<QQ")
#: How a staged entry's data is laid out (native._decode): a kprobe's (the probed
#: address first), a kretprobe's (the function and the return address), a static
#: event's (its fields only).
_KPROBE, _KRETPROBE, _FIELDS = 1, 2, 3
_U32 = struct.Struct("<I")
_ARENA_UNIT = 64
#: A trace_pipe_raw event's header word and the record's common fields (raw_page.py).
_RAW_HEAD = struct.Struct("<IHBBi")
_RAW_LONG_HEAD = struct.Struct("<IIHBBi")        # type_len 0: a length word follows
_RAW_WORDS = struct.Struct("<II")     # a time extend's two words; type_len 0's and its length
_DELTA_MASK = (1 << 27) - 1
_PADS = (b"", b"\0\0\0", b"\0\0", b"\0")         # by data length % 4
_RAW_SHORT_MAX = TYPE_DATA_MAX * 4              # a payload with its size in type_len
_LOW5 = bytes(b & 31 for b in range(256))       # a byte's type_len bits


def _signed(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def _encode_program(program: FetchProgram, reg_offset: dict[str, int],
                    whole_store: bool = True) -> list[tuple] | None:
    """The tn_insn tuples of one argument (ended by TN_END, unless it is a single
    TN_REG_RAW, TN_COMM or TN_DATA), or None if the kernel's recorder cannot run it.
    ``reg_offset`` maps a register to its offset in struct pt_regs.  TN_DATA's param
    is its bytes, which :func:`_pack_array` places.  ``whole_store``: the argument may
    be stored 8 bytes at a time (TN_REG_RAW), no earlier string's bytes lying within
    8 bytes of its offset."""
    insns = program.insns
    source = insns[0]
    kind = type(source)
    if program.count and program.is_dynamic:
        return None                 # string arrays
    if kind is FetchComm:
        return [(_COMM, 0, 0, 0, 0, 0)]
    if kind is FetchData:
        return [(_DATA, 0, 0, 0, len(source.data), bytes(source.data))]
    if kind is FetchReg and source.name in reg_offset:
        out = [(_REG, 0, 0, 0, 0, reg_offset[source.name])]
    elif kind is FetchArg:
        if source.index < len(_ARG_REGS):
            out = [(_REG, 0, 0, 0, 0, reg_offset[_ARG_REGS[source.index]])]
        else:       # past the return address: $arg7 is the first stack word above it
            out = [(_STACK, 0, 0, 0, 0, source.index - len(_ARG_REGS) + 1)]
    elif kind is FetchStack:
        out = [(_STACK, 0, 0, 0, 0, source.index)]
    elif kind is FetchStackPointer:
        out = [(_REG, 0, 0, 0, 0, reg_offset["sp"])]
    elif kind is FetchImm:
        out = [(_IMM, 0, 0, 0, 0, _signed(source.value))]
    elif kind is FetchSymbol:
        out = [(_IMM, 0, 0, 0, 0, _signed(source.address))]
    elif kind is FetchRetval:       # a return probe's regs hold the return value
        out = [(_REG, 0, 0, 0, 0, reg_offset["ax"])]
    elif kind is FetchRetIP:
        out = [(_RETIP, 0, 0, 0, 0, 0)]
    else:
        return None
    for insn in insns[1:]:
        kind = type(insn)
        if kind is Deref:
            out.append((_UDEREF if insn.user else _DEREF, 0, 0, 0, 0, _signed(insn.offset)))
        elif kind is StoreRaw:
            out.append((_ST_RAW, insn.size, 0, 0, 0, 0))
        elif kind is StoreMem:
            out.append((_ST_UMEM if insn.user else _ST_MEM, insn.size, 0, 0, program.count,
                        _signed(insn.offset)))
        elif kind is StoreString and insn.kind != "symstr":
            out.append((_ST_USTRING if insn.kind == "ustring" else _ST_STRING, 4, 0, 0, 0,
                        _signed(insn.offset)))
        elif kind is ModBitfield:
            out.append((_BITFIELD, insn.basesize, insn.lshift, insn.rshift, 0, 0))
        elif kind is LoopArray:
            continue                # the store carries the count
        else:
            return None             # symstr: symbol names are the host's
    if whole_store and len(out) == 2 and out[0][0] == _REG and out[1][0] == _ST_RAW:
        # The common %reg[:type]: one instruction the recorder runs without a loop.
        return [(_REG_RAW, out[1][1], 0, 0, 0, out[0][5])]
    out.append((_END, 0, 0, 0, 0, 0))
    return out


def encode_programs(programs: Sequence[FetchProgram], at: int,
                    reg_offset: dict[str, int]) -> bytes | None:
    """Return what follows the header of a struct trace_native_probe placed at ``at``
    for ``programs``: each argument's instructions, TN_END, then the bytes of immediate
    strings.  ``None`` when an argument needs the host's interpreter."""
    out = []
    fixed = sum(p.record_size for p in programs)
    offset, strings = 0, False
    for program in programs:
        # TN_REG_RAW stores 8 bytes: past the fixed part they would land on the bytes
        # of a string argument already stored there.
        code = _encode_program(program, reg_offset,
                               whole_store=not strings or offset + 8 <= fixed)
        if code is None:
            return None
        out.extend(code)
        offset += program.record_size
        strings = strings or program.fetch_type.is_string
    out.append((_END, 0, 0, 0, 0, 0))
    return _pack_array(_INSN, out, at + _PROBE.size)


def _pack_array(layout: struct.Struct, items: Sequence[tuple], at: int) -> bytes:
    """Pack ``items`` one after another from ``at``; an item whose last field is bytes
    gets there the address of those bytes, which follow the array."""
    data = at + layout.size * len(items)
    packed, blobs = [], []
    for item in items:
        if isinstance(item[-1], bytes):
            blobs.append(item[-1])
            item = item[:-1] + (_signed(data),)
            data += len(blobs[-1])
        packed.append(layout.pack(*item))
    return b"".join(packed) + b"".join(blobs)


# enum tf_op, enum tf_cmp
(_TF_END, _TF_NUM, _TF_CPU, _TF_STR, _TF_COMM, _TF_FALSE, _TF_AND, _TF_OR, _TF_NOT,
 _TF_SSTR) = range(10)
_TF_CMP = {"==": 0, "!=": 1, "<": 2, "<=": 3, ">": 4, ">=": 5, "&": 6, "~": 7}
_PRED = struct.Struct("<BBBBHHq")           # struct tn_pred
_TF_STACK_MAX = 64
_TF_LOGIC = {"and": _TF_AND, "or": _TF_OR, "not": _TF_NOT}


def _encode_pred(r) -> tuple | None:
    """The tn_pred of one resolved filter predicate (a string operand's bytes as its
    value, which :func:`_pack_array` places), or None for what the kernel does not evaluate (a glob with a ``[...]``
    class: fnmatch's rules for those stay in the host)."""
    if r.op == "~" and b"[" in bytes(r.value):
        return None
    field, cmp = r.field, _TF_CMP[r.op]
    if field.is_string:
        op = {"str": _TF_STR, "sstr": _TF_SSTR, "comm": _TF_COMM}[field.kind]
        size = field.size if field.kind == "sstr" else 0
        if size > 255:
            return None
        return (op, cmp, size, 0, field.offset, len(r.value), bytes(r.value))
    if field.kind == "cpu":
        return (_TF_CPU, cmp, 4, 1, 0, 0, as_field_type(r.value, 32, True))
    if field.size not in (1, 2, 4, 8):
        return (_TF_FALSE, 0, 0, 0, 0, 0, 0)
    value = as_field_type(r.value, 8 * field.size, field.is_signed)
    return (_TF_NUM, cmp, field.size, int(field.is_signed), field.offset, 0, value)


def encode_filter(program: Sequence, at: int) -> bytes | None:
    """Return the struct tn_pred array (TF_END-terminated, string operands after it)
    of a filter's postfix ``program`` placed at ``at``; None if the kernel cannot
    evaluate it."""
    preds, depth = [], 0
    for item in program:
        if isinstance(item, str):
            preds.append((_TF_LOGIC[item], 0, 0, 0, 0, 0, 0))
            depth -= 0 if item == "not" else 1
            continue
        pred = _encode_pred(item)
        if pred is None:
            return None
        preds.append(pred)
        depth += 1
        if depth > _TF_STACK_MAX:
            return None
    preds.append((_TF_END, 0, 0, 0, 0, 0, 0))
    return _pack_array(_PRED, preds, at)


def _varied(column: memoryview) -> list | None:
    """The values of a field (a strided view of the entries), or None when every entry
    has the first's (compared as bytes, no value made)."""
    if column.tobytes() == column[:1].tobytes() * len(column):
        return None
    return column.tolist()


def split_heads(heads: Sequence[int]) -> tuple[list[int], list[int]]:
    """(the flags, the pids) of staged entries' context words: struct tn_entry's type,
    flags, pad and pid read as one little-endian u64 (StagedColumns.heads)."""
    flags = list(map(and_, map(rshift, heads, repeat(16)), repeat(0xFF)))
    pids = list(map(rshift, heads, repeat(32)))
    if pids and max(pids) >> 31:
        pids = [pid - (1 << 32) if pid >> 31 else pid for pid in pids]
    return flags, pids


class StagedColumns(NamedTuple):
    """Staged entries of one layout read a field at a time (NativeRecorder._rows): one
    list a field, in the entries' order."""

    stamps: list
    #: each entry's type, flags and pid as one number (equal for equal contexts):
    #: ``split`` gives the flags and pids of a list of them
    heads: list
    #: the first entry's type, and each entry's (None: all are of that type)
    type: int
    types: list | None
    #: the first entry's probed address, and each entry's (None: all are that)
    ip: int
    ips: list | None
    #: a kretprobe's return addresses (the ips are then its function's), else None
    ret_ips: list | None
    #: each entry's argument bytes (equal for equal arguments of events alike)
    args: list
    #: type -> event, of every type the entries have
    events: dict
    #: each entry's bytes
    size: int
    split: Callable[[Sequence[int]], tuple[list, list]] = split_heads


@dataclass(eq=False)
class NativeProbe:
    """One struct trace_native_probe in the kernel's arena."""

    addr: int
    size: int
    ip: int
    is_return: bool = False
    filter: tuple | None = None     # (program, address, size) of its filter in the arena


def _arg_bytes(size: int, at: int, length: int, data: bytes) -> list[bytes]:
    """The ``length`` bytes ``at`` each entry of ``size`` bytes of ``data``: one
    bytes object an entry, read by one struct (a list of columns of numbers, then a
    tuple a line to look their text up by, costs twice as much)."""
    entry = struct.Struct(f"<{at}x{length}s{size - at - length}x")
    return [arg for (arg,) in entry.iter_unpack(data)]


@functools.lru_cache(maxsize=256)
def _gather(size: int, at: int, event_size: int, head: int, n: int) -> struct.Struct:
    """The struct that reads the events out of ``n`` entries of ``size`` bytes, each
    ``event_size`` bytes from ``at`` on, the first one without its ``head`` bytes of
    header (NativeRecorder._raw_whole): one C call, where a slice an entry is a loop."""
    skip = size - at - event_size
    return struct.Struct(f"<{at + head}x{event_size - head}s{skip}x"
                         + f"{at}x{event_size}s{skip}x" * (n - 1))


class NativeRecorder:
    """The kernel's recorder, seen from the host.

    ``kernel`` is the machine (``read``/``write``/``view``, ``image``, ``kabi``,
    ``nr_cpus``, ``add_hypercall``, ``exit_listeners``); ``pt_regs_fields`` is struct
    pt_regs field by field (the engine's, from the arch); ``save_comm()`` saves the
    running task's comm for the trace (the kernel asks when a CPU's task changed);
    ``event_of(id)`` returns the event an id names (records decode to its tuples).
    Raises :class:`~kprobefs.errors.ImageError` when the kernel's structures are not
    the ones this module knows.
    """

    def __init__(self, kernel, pt_regs_fields: Sequence[str], save_comm: Callable[[], object],
                 event_of: Callable):
        sym = kernel.image.symbol_value
        self._reg_offset = {name: 8 * i for i, name in enumerate(pt_regs_fields)}
        self.kernel = kernel
        self.handler = sym("trace_native_probe")
        self.ret_entry = sym("trace_native_ret_entry")
        self._arena = sym("trace_native_arena")
        self._arena_end = self._arena + kernel.image.lookup_name("trace_native_arena")[0].size
        cpus, cpu_size = sym("trace_native_cpu"), kernel.kabi["trace_native.cpu_size"]
        self._stage_at = kernel.kabi["trace_native.stage"]
        self._batch_at = kernel.kabi["trace_native.batch"]
        self._batch_max = kernel.kabi["trace_native.batch_max"]
        # batch, closed, page_end[], page_count[]
        self._pages = struct.Struct(f"<II{self._batch_max}I{self._batch_max}I")
        #: Each CPU's struct tn_cpu, as a live view (read on every page and every read).
        self._cpu = [kernel.view(cpus + cpu * cpu_size, cpu_size)
                     for cpu in range(kernel.nr_cpus)]
        if kernel.kabi["trace_native.probe_insns"] != _PROBE.size:
            raise ImageError("struct trace_native_probe does not match the host's layout")
        if kernel.kabi.get("trace_native.entry_size") != _ENTRY_SIZE:
            raise ImageError("struct tn_entry does not match the host's layout")
        self._next = self._arena
        self._free: dict[int, list[int]] = {}
        self._zombies: list[NativeProbe] = []     # freed with returns still pending
        self._save_comm = save_comm
        self._event_of = event_of
        self._clock_at = sym("trace_clock_tsc")
        self.buffer = None
        kernel.add_hypercall("TRACE_COMM", self._hc_comm)
        kernel.add_hypercall("TRACE_PAGE_FULL", self._hc_page_full)
        kernel.add_hypercall("TRACE_WAKE", self._hc_wake)
        kernel.exit_listeners.append(self._task_exit)

    @classmethod
    def available(cls, kernel) -> bool:
        """Whether ``kernel`` has the recorder (the real machine, not a test fake)."""
        image = getattr(kernel, "image", None)
        return (callable(getattr(kernel, "add_hypercall", None))
                and image is not None and image.symbol_value("trace_native_probe") is not None)

    def set_clock(self, tsc) -> None:
        """Stamp records with ``tsc`` (machine/clock.py's TscClock: the trace clock
        selected, when the TSC drives it)."""
        self.kernel.write(self._clock_at, tsc.kernel_layout())

    # ---------------------------------------------------------------- probes
    def new_probe(self, event_id: int, ip: int, programs: Sequence[FetchProgram],
                  args_size: int, maxactive: int = 0) -> NativeProbe | None:
        """Write a struct trace_native_probe for a kprobe at ``ip`` recording
        ``programs`` (``args_size`` bytes of fixed part); with ``maxactive``, for a
        return probe of the function at ``ip``, with that many instances.  ``None`` if an
        argument needs the host's interpreter or the arena is full."""
        body = encode_programs(programs, 0, self._reg_offset)
        if body is None:
            return None
        instances = -(-(_PROBE.size + len(body)) // 8) * 8
        size = instances + maxactive * _RET_INSTANCE.size
        size = -(-size // _ARENA_UNIT) * _ARENA_UNIT
        self._reap()
        addr = self._alloc(size)
        if addr is None:
            return None
        head = 16 if maxactive else 8           # __probe_ip, or __probe_func and ret_ip
        flags = _TNP_RETURN if maxactive else 0
        # The free instances: a circular list through the probe's ret_free.
        links = [addr + _RET_FREE_AT] + [addr + instances + i * _RET_INSTANCE.size
                                         for i in range(maxactive)]
        header = _PROBE.pack(0, 0, 0, flags, event_id & 0xFFFF, ip, head + args_size, 0,
                             links[1 % len(links)], links[-1])
        pool = b"".join(_RET_INSTANCE.pack(links[(i + 1) % len(links)], links[i - 1], addr,
                                           0, 0) for i in range(1, len(links)))
        code = encode_programs(programs, addr, self._reg_offset)
        self.kernel.write(addr, header + code + bytes(instances - _PROBE.size - len(code))
                          + pool)
        return NativeProbe(addr, size, ip, bool(maxactive))

    def adopt(self, addr: int, event_id: int) -> NativeProbe:
        """The struct trace_native_probe at ``addr`` that the kernel itself holds (a
        static event's, trace_events.c): give it the event's id; it records nothing
        until :meth:`set_recording`."""
        self.kernel.write(addr + _TYPE_AT, _U16.pack(event_id & 0xFFFF))
        return NativeProbe(addr, 0, 0)

    def free_probe(self, np: NativeProbe) -> None:
        """Release the probe's memory, once no task's stack holds a return through it."""
        self.set_filter(np, None)
        self.set_recording(np, False)
        if np.is_return and self._pending(np):
            self._zombies.append(np)
            return
        self.kernel.write(np.addr, bytes(_PROBE.size))
        self._free.setdefault(np.size, []).append(np.addr)

    def _pending(self, np: NativeProbe) -> int:
        return _U32.unpack(self.kernel.read(np.addr + _PENDING_AT, 4))[0]

    def _reap(self) -> None:
        """Free the probes whose last pending return has come back."""
        done = [np for np in self._zombies if not self._pending(np)]
        for np in done:
            self._zombies.remove(np)
            self.free_probe(np)

    def set_filter(self, np: NativeProbe, program: Sequence | None) -> bool:
        """Make the probe's event filter ``program`` (postfix, see filter.py), or none.
        False, and no filter set, when the kernel cannot evaluate it."""
        if np.filter is not None:
            if np.filter[0] == program:
                return True
            _, addr, size = np.filter
            self.kernel.write(np.addr + _FILTER_AT, bytes(8))
            self._free.setdefault(size, []).append(addr)
            np.filter = None
        if program is None:
            return True
        body = encode_filter(program, 0)
        if body is None:
            return False
        size = -(-len(body) // _ARENA_UNIT) * _ARENA_UNIT
        addr = self._alloc(size)
        if addr is None:
            return False
        self.kernel.write(addr, encode_filter(program, addr))
        self.kernel.write(np.addr + _FILTER_AT, _Q.pack(addr))
        np.filter = (tuple(program), addr, size)
        return True

    def set_recording(self, np: NativeProbe, on: bool, host: bool = False) -> None:
        """Whether the kernel records the probe's hits (``on``) and, for a static
        event's probe, hands each record to the host first (``host``: HC_TRACE_EVENT,
        for the trace instances it is enabled in)."""
        flags = ((_TNP_RECORD if on else 0) | (_TNP_RETURN if np.is_return else 0)
                 | (_TNP_HOST if host else 0))
        self.kernel.write(np.addr + _FLAGS_AT, _U32.pack(flags))

    def hits(self, np: NativeProbe) -> int:
        return _Q.unpack(self.kernel.read(np.addr, 8))[0]

    def misses(self, np: NativeProbe) -> int:
        return _Q.unpack(self.kernel.read(np.addr + _MISSED_AT, 8))[0]

    def arena_in_use(self) -> int:
        """Bytes of the arena held by probes and filters now (freed pieces not counted;
        probes freed with returns pending are)."""
        free = sum(size * len(addrs) for size, addrs in self._free.items())
        return self._next - self._arena - free

    def _alloc(self, size: int) -> int | None:
        free = self._free.get(size)
        if free:
            return free.pop()
        if self._next + size > self._arena_end:
            return None
        addr, self._next = self._next, self._next + size
        return addr

    # ----------------------------------------------------------- the stage
    def take(self, cpu: int):
        view = self._cpu[cpu]
        if not _U32.unpack_from(view, _COUNT_AT)[0]:
            return None
        used, has_last, last_ts, staged, count = _CPU.unpack_from(view)
        batch, closed, *marks = self._pages.unpack_from(view, self._batch_at)
        ends, counts = marks[:closed], marks[self._batch_max:self._batch_max + closed]
        start = self._stage_at
        data = bytes(view[start:start + staged])
        _STAGED.pack_into(view, _STAGED_AT, 0, 0)
        _U32.pack_into(view, self._batch_at + 4, 0)        # closed = 0
        pages, at, seen = [], 0, 0
        for end, upto in zip(ends + [staged], counts + [count]):
            pages.append(Chunk(data[at:end], upto - seen, self._decode, self._raw, self._rows)
                         if upto > seen else None)
            at, seen = end, upto
        return pages, used, last_ts if has_last else None

    def sync(self, cpu: int, used: int, last_ts: int | None, overwrite: bool) -> None:
        view = self._cpu[cpu]
        _SYNC.pack_into(view, 0, used, last_ts is not None, last_ts or 0)
        # Overwriting, opening a page always succeeds: the kernel may close pages itself.
        _U32.pack_into(view, self._batch_at, self._batch_max if overwrite else 1)

    def pending(self, cpu: int) -> bool:
        return _U32.unpack_from(self._cpu[cpu], _COUNT_AT)[0] != 0

    def set_waiters(self, waiting: bool) -> None:
        for view in self._cpu:
            _U32.pack_into(view, _WAITERS_AT, 1 if waiting else 0)

    def _decode(self, data: bytes) -> list[tuple]:
        """Record tuples of staged entries: (ts, pid, flags, event, ip, 0, args)."""
        out = []
        append = out.append
        offset, end = 0, len(data)
        unpack, q, qq = _ENTRY.unpack_from, _Q.unpack_from, _QQ.unpack_from
        kinds: dict = {}          # type -> (event, its layout), looked up once a chunk
        while offset < end:
            ts, size, length, type_, flags, pid = unpack(data, offset)
            kind = kinds.get(type_)
            if kind is None:
                kind = kinds[type_] = self._layout(type_)
            event, layout = kind
            start = offset + _ENTRY_SIZE
            if layout == _KPROBE:
                append((ts, pid, flags, event, q(data, start)[0], 0,
                        data[start + 8:start + length]))
            elif layout == _KRETPROBE:        # __probe_func, __probe_ret_ip
                func, ret_ip = qq(data, start)
                append((ts, pid, flags, event, func, ret_ip, data[start + 16:start + length]))
            elif layout == _FIELDS:           # trace_events.py: fields only
                append((ts, pid, flags, event, 0, 0, data[start:start + length]))
            offset += size
        return out

    def _rows(self, data: bytes, codes_of: Callable, types: dict) -> StagedColumns | None:
        """Staged entries read as columns, for ``trace`` text made without record tuples
        (output.TraceFormatter): each entry's timestamp, context (:func:`split_heads`),
        probed address (a kretprobe's function and return address) and arguments read
        with ``codes_of(event)`` (struct codes; ``None``: the event's text is not
        compiled).  ``None`` unless every entry is a kprobe's or every entry a
        kretprobe's, all of one size, of events that unpack alike and are not gone
        (then the caller decodes the entries).  ``types`` is the caller's, kept over the
        chunks of one read: type -> (event, layout, its codes)."""
        if not data:
            return StagedColumns([], [], 0, None, 0, None, None, [], {}, 8)
        _ts, size, length, type_, _flags, _pid = _ENTRY.unpack_from(data, 0)
        known = types.get(type_)
        if known is None:
            event, layout = self._layout(type_)
            known = types[type_] = (event, layout, None if event is None or layout == _FIELDS
                                    else codes_of(event))
        event, layout, codes = known
        if codes is None or size % 8 or len(data) % size:
            return None
        head = 8 if layout == _KPROBE else 16
        if head + struct.calcsize("<" + codes) != length or _ENTRY_SIZE + length > size:
            return None
        # Every entry's size (a u32 at 8) and type (a u16 at 24), read in place: an
        # entry of another size would be read at its own offset with the wrong size,
        # so every size checked is every entry read where it is.
        view = memoryview(data)
        sizes = view.cast("I")[2::size // 4]
        if sizes.tobytes() != _U32.pack(size) * len(sizes):
            return None
        events = {type_: event}
        column = _varied(view.cast("H")[_ENTRY_TYPE_AT // 2::size // 2])
        for other in set(column or ()) - {type_}:
            known = types.get(other)
            if known is None:
                ev, lay = self._layout(other)
                known = types[other] = (ev, lay, None if ev is None or lay == _FIELDS
                                        else codes_of(ev))
            if known[1] != layout or known[2] != codes:
                return None
            events[other] = known[0]
        words = view.cast("Q")
        step = size // 8
        at = _ENTRY_SIZE // 8               # the probed address (a kretprobe's function)
        ips = words[at::step]
        return StagedColumns(
            words[::step].tolist(), words[_ENTRY_TYPE_AT // 8::step].tolist(), type_, column,
            ips[0], _varied(ips), None if layout == _KPROBE else words[at + 1::step].tolist(),
            _arg_bytes(size, _ENTRY_SIZE + head, length - head, data), events, size)

    def _raw(self, data: bytes, last: int | None):
        """Staged entries as trace_pipe_raw events (raw_page.py's layout): the bytes,
        the first event's time and the last's, each event's delta taken from ``last``
        (``None``: the first starts the page, delta 0).  The record of each is the
        common fields then the staged data, as every layout's ``raw`` makes it (see
        :meth:`_decode`); entries of a gone type are left out, as there.  ``None``
        when no entry is left.  An entry whose header word the kernel made as the page
        has it (struct tn_entry's rb: the delta from the event before it here) is one
        slice; the first event, one after a gone entry and one that needs a time extend
        get their header made here."""
        whole = self._raw_whole(data, last)
        if whole is not None:
            return whole
        parts = []
        append = parts.append
        offset, end = 0, len(data)
        unpack = _RAW_ENTRY.unpack_from
        head, long_head = _RAW_HEAD.pack, _RAW_LONG_HEAD.pack
        ids: dict = {}            # type -> the event's common_type, None when gone
        first = None
        made = False              # the next entry's header word (the kernel's) follows
                                  # an event made here
        while offset < end:
            ts, size, length, rb0, rb1, type_, flags, pid = unpack(data, offset)
            common_type = ids.get(type_, -1)
            if common_type == -1:
                event = self._layout(type_)[0]
                common_type = ids[type_] = None if event is None else event.id & 0xFFFF
            if common_type is None:
                made = False
                offset += size
                continue
            padded = (length + 11) & ~3           # the common fields' 8 bytes, then data
            short = padded <= _RAW_SHORT_MAX
            if made and (rb1 if short else rb0) & 31 != TYPE_TIME_EXTEND \
                    and common_type == type_:
                append(data[offset + (_ENTRY_RB_AT + 4 if short else _ENTRY_RB_AT):
                            offset + _ENTRY_TYPE_AT + padded])
            else:
                if first is None:
                    first = ts
                    if last is None:
                        last = ts
                delta = ts - last if ts > last else 0
                if delta > _DELTA_MASK:
                    append(_RAW_WORDS.pack(TYPE_TIME_EXTEND | (delta & _DELTA_MASK) << 5,
                                           delta >> 27))
                    delta = 0
                start = offset + _ENTRY_SIZE
                if short:
                    append(head(padded >> 2 | delta << 5, common_type, flags, 0, pid))
                else:
                    append(long_head(delta << 5, padded + 4, common_type, flags, 0, pid))
                append(data[start:start + length])
                append(_PADS[length & 3])
                made = True
            last = ts
            offset += size
        if first is None:
            return None
        return b"".join(parts), first, last

    def _raw_whole(self, data: bytes, last: int | None):
        """:meth:`_raw` of entries all of one size and length and of one type, made
        without a loop over them: each entry holds its event as the page does (the
        kernel wrote its header word, struct tn_entry's rb), so the events are the
        entries' bytes from that word on, read out with one struct (_gather); only
        the first one's header, its delta from ``last``, is made here.  ``None`` when
        the entries are not alike, a type is gone, or a delta needs a time extend (then
        _raw goes entry by entry)."""
        if not data:
            return None
        ts, size, length, type_, _flags, _pid = _ENTRY.unpack_from(data, 0)
        n, rest = divmod(len(data), size)
        if rest or size % 8:
            return None
        view = memoryview(data)
        if (view.cast("Q")[1::size // 8].tobytes() != data[8:16] * n      # size, len
                or view.cast("H")[_ENTRY_TYPE_AT // 2::size // 2].tobytes()
                != _U16.pack(type_) * n):
            return None
        event = self._layout(type_)[0]
        if event is None or event.id & 0xFFFF != type_:
            return None
        payload = (length + 11) & ~3          # the common fields' 8 bytes, then data
        short = payload <= _RAW_SHORT_MAX
        at = _ENTRY_RB_AT + 4 if short else _ENTRY_RB_AT      # the event's first byte
        type_len = payload >> 2 if short else 0
        # every header word but the first (made below) is the kernel's: no time extend
        if data[at + size::size].translate(_LOW5) != bytes((type_len,)) * (n - 1):
            return None
        delta = ts - last if last is not None and ts > last else 0
        if delta > _DELTA_MASK:
            return None
        head = (_U32.pack(type_len | delta << 5) if short
                else _RAW_WORDS.pack(delta << 5, payload + 4))
        events = _gather(size, at, payload + _ENTRY_TYPE_AT - at, len(head), n).unpack(data)
        return b"".join((head,) + events), ts, _Q.unpack_from(data, len(data) - size)[0]

    def _layout(self, type_: int) -> tuple:
        """(event, how its entry is laid out) of an event type; (None, None) when the
        type is gone (its records are dropped)."""
        event = self._event_of(type_)
        if event is None:
            return None, None
        if getattr(event, "static", False):
            return event, _FIELDS
        return event, (_KRETPROBE if event.is_return else _KPROBE)

    # ------------------------------------------------------------ hypercalls
    def attach(self, buffer) -> None:
        """Become ``buffer``'s stage."""
        self.buffer = buffer
        buffer.attach_stage(self)

    def _hc_comm(self, *_args) -> int:
        self._save_comm()
        return 0

    def _hc_page_full(self, cpu: int, *_args) -> int:
        return 1 if self.buffer.page_full(cpu) else 0

    def _hc_wake(self, cpu: int, *_args) -> int:
        self.buffer.staged_wakeup(cpu)
        return 0

    def forget_comms(self) -> None:
        """Make every CPU ask for its task's comm again at its next record."""
        for view in self._cpu:
            _Q.pack_into(view, _COMM_TASK_AT, 0)

    def _task_exit(self, _pid: int) -> None:
        # A new task may reuse the task_struct: make every CPU ask for the comm again.
        self.forget_comms()
