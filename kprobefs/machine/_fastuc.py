"""Register access without the Unicorn binding's per-call overhead.

``Uc.reg_read``/``reg_write`` cost about 1.5 µs each from Python, four times a whole
UC_HOOK_CODE callback; probe handlers touch registers on every hit, so the machine calls
the C API directly through ctypes, with prototypes that skip ctypes' argument conversion
(0.2 µs a call, against 0.4 µs through the binding's own prototypes), and through
PyDLL: these calls never call back into Python, so they keep the GIL rather than
release and take it again around each register access.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import random
import struct

from unicorn import Uc, UcError
from unicorn.unicorn_py3 import unicorn as _binding
from unicorn.x86_const import (
    UC_X86_REG_R8, UC_X86_REG_R9, UC_X86_REG_R10, UC_X86_REG_R11, UC_X86_REG_R12,
    UC_X86_REG_R13, UC_X86_REG_R14, UC_X86_REG_R15, UC_X86_REG_RAX, UC_X86_REG_RBP,
    UC_X86_REG_RBX, UC_X86_REG_RCX, UC_X86_REG_RDI, UC_X86_REG_RDX, UC_X86_REG_RFLAGS,
    UC_X86_REG_RIP, UC_X86_REG_RSI, UC_X86_REG_RSP,
)

__all__ = ["FastRegs", "RegSet", "RegisterFile", "REG_WRITES", "add_code_hook",
           "add_intr_hook", "register_file"]

#: How many register writes FastRegs and RegSet have made (a one-element list, so
#: that a hot path can keep it): a jprobe compares it around its entry, to put the
#: registers back only when something wrote them.
REG_WRITES = [0]


def _raw(name: str):
    """A prototype-free handle on a libunicorn function: arguments must already be
    C-compatible (ctypes objects, ints)."""
    fn = getattr(_LIB, name)
    fn.restype = ctypes.c_int
    return fn


_LIB = ctypes.PyDLL(_binding.uclib._name)


class FastRegs:
    """uc_reg_read / uc_reg_write on one Uc, for 64-bit registers: the general registers
    (and %rip, for reads) in the register file when the Uc has one (:func:`register_file`),
    the rest through the C API."""

    __slots__ = ("_handle", "_read", "_write", "_val", "_ref", "_words", "set_ip",
                 "_save", "_restore", "_stop")

    def __init__(self, uc: Uc):
        self._handle = uc._uch
        self._read = _raw("uc_reg_read")
        self._write = _raw("uc_reg_write")
        self._save = _raw("uc_context_save")
        self._restore = _raw("uc_context_restore")
        self._stop = _raw("uc_emu_stop")
        self._val = ctypes.c_uint64()
        self._ref = ctypes.byref(self._val)
        found = known_register_file(uc)
        self._words = found.words if found is not None else None
        self.set_ip = self._ip_setter()

    def _ip_setter(self):
        """set_ip(address): a write of %rip (which also leaves the translated block), for
        the probe paths that redirect every hit: set() less its lookups."""
        handle, write, writes = self._handle, self._write, REG_WRITES
        value = ctypes.c_uint64()
        ref = ctypes.byref(value)

        def set_ip(address: int) -> None:
            writes[0] += 1
            value.value = address
            write(handle, UC_X86_REG_RIP, ref)

        return set_ip

    def reader(self, reg_id: int):
        """read() -> int, the value of one register for a path that reads it every
        time (a hypercall's number): the register file's word read without a Python
        frame where get() would read it there, else get() itself."""
        index = _READ_INDEX.get(reg_id) if self._words is not None else None
        if index is None:
            return functools.partial(self.get, reg_id)
        return functools.partial(operator.getitem, self._words, index)

    def writer(self, reg_id: int):
        """write(value), set() of one register less its lookups (a hypercall's
        result)."""
        index = GPR_INDEX.get(reg_id) if self._words is not None else None
        if index is None:
            return functools.partial(self.set, reg_id)
        words, writes = self._words, REG_WRITES

        def write(value: int) -> None:
            writes[0] += 1
            words[index] = value & 0xFFFFFFFFFFFFFFFF

        return write

    def get(self, reg_id: int) -> int:
        words = self._words
        if words is not None:
            index = _READ_INDEX.get(reg_id)
            if index is not None:
                return words[index]
        self._read(self._handle, reg_id, self._ref)
        return self._val.value

    # A CPU's whole context, and the stop of a turn, also never call back into Python:
    # through the binding each released the GIL and, on a busy daemon, waited to take
    # it back (three times a CPU switch and once a hypercall that ends a turn).
    def context_update(self, context) -> None:
        """Uc.context_update: the loaded CPU's registers into ``context`` (a UcContext)."""
        status = self._save(self._handle, context.context)
        if status:
            raise UcError(status)

    def context_restore(self, context) -> None:
        """Uc.context_restore: load the registers of ``context`` (a UcContext)."""
        status = self._restore(self._handle, context.context)
        if status:
            raise UcError(status)

    def emu_stop(self) -> None:
        """Uc.emu_stop, from the emulating thread (a hook).  Another thread stops the
        emulation through the binding, which lets the GIL go while it waits."""
        status = self._stop(self._handle)
        if status:
            raise UcError(status)

    def set(self, reg_id: int, value: int) -> None:
        REG_WRITES[0] += 1
        words = self._words
        if words is not None:
            index = GPR_INDEX.get(reg_id)
            if index is not None:
                words[index] = value & 0xFFFFFFFFFFFFFFFF
                return
        self._val.value = value & 0xFFFFFFFFFFFFFFFF
        self._write(self._handle, reg_id, self._ref)


def _add_raw_hook(uc: Uc, kind: int, fptr, begin: int, end: int) -> int:
    """uc_hook_add of a C function pointer, without the binding's wrappers."""
    from unicorn.unicorn_const import UC_ERR_OK
    from unicorn.unicorn_py3.unicorn import UcError, uc_hook_h

    handle = uc_hook_h()
    status = _binding.uclib.uc_hook_add(uc._uch, ctypes.byref(handle), kind, fptr, None,
                                        ctypes.c_uint64(begin), ctypes.c_uint64(end))
    if status != UC_ERR_OK:
        raise UcError(status)
    # Kept where the binding keeps its own, so Uc.hook_del() removes it the usual way.
    uc._callbacks[handle.value] = fptr
    return handle.value


def add_code_hook(uc: Uc, begin: int, end: int, callback) -> int:
    """UC_HOOK_CODE on [begin, end] with callback(handle, address, size, user_data) called
    straight from C: no binding wrappers, so about a third cheaper per hit.  The callback
    must not raise (ctypes would print the exception and carry on)."""
    from unicorn.unicorn_const import UC_HOOK_CODE
    from unicorn.unicorn_py3.unicorn import HOOK_CODE_CFUNC

    return _add_raw_hook(uc, UC_HOOK_CODE, HOOK_CODE_CFUNC(callback), begin, end)


def add_intr_hook(uc: Uc, callback) -> int:
    """UC_HOOK_INTR with callback(handle, intno, user_data) called straight from C, as
    :func:`add_code_hook` does for code hooks (every hypercall and trap goes through
    it).  The callback must not raise."""
    from unicorn.unicorn_const import UC_HOOK_INTR
    from unicorn.unicorn_py3.unicorn import HOOK_INTR_CFUNC

    # begin > end: every address
    return _add_raw_hook(uc, UC_HOOK_INTR, HOOK_INTR_CFUNC(callback), 1, 0)


class RegSet:
    """Read or write a fixed set of 64-bit registers in one C call each way (one lookup
    in the register file, when every one of them is a general register there)."""

    __slots__ = ("_handle", "_ids", "_vals", "_ptrs", "_n", "_read", "_write", "_layout",
                 "read", "write")

    def __init__(self, uc: Uc, reg_ids):
        reg_ids = list(reg_ids)
        found = known_register_file(uc)
        if found is not None and all(r in GPR_INDEX for r in reg_ids):
            self.read, self.write = _file_access(found.words,
                                                 [GPR_INDEX[r] for r in reg_ids])
        else:
            self.read, self.write = self._api_read, self._api_write
        n = len(reg_ids)
        self._handle = uc._uch
        self._n = n
        self._ids = (ctypes.c_int * n)(*reg_ids)
        self._vals = (ctypes.c_uint64 * n)()
        base = ctypes.addressof(self._vals)
        self._ptrs = (ctypes.c_void_p * n)(*(base + 8 * i for i in range(n)))
        self._read = _raw("uc_reg_read_batch")
        self._write = _raw("uc_reg_write_batch")
        # The values move through the array's buffer in one struct call (converting
        # element by element costs as much as the C call itself).
        self._layout = struct.Struct(f"<{n}Q")

    def _api_read(self) -> tuple:
        self._read(self._handle, self._ids, self._ptrs, self._n)
        return self._layout.unpack_from(self._vals)

    def _api_write(self, values) -> None:
        REG_WRITES[0] += 1
        self._layout.pack_into(self._vals, 0, *values)
        self._write(self._handle, self._ids, self._ptrs, self._n)


# ==== the register file in Unicorn's own memory ===========================================
# Unicorn keeps the emulated CPU's state in QEMU's CPUX86State, whose first fields are the
# sixteen general registers, %rip, and the flags as QEMU computes them lazily (eflags'
# other bits, cc_dst, cc_src, cc_src2, cc_op, df).  uc_reg_read and uc_reg_write of a
# general register are a plain load or store there, and TCG hands its registers to that
# memory before it calls any hook and takes them back after: so a hook may read and write
# them as memory, for a tenth of a ctypes call.  %rip stays with the API for writes (a
# write must also leave the translated block), and the flags for single reads (they are
# computed).  Nothing of this layout is assumed without checking it through the API first.

#: Unicorn register id -> index of its 64-bit word in the register file.
GPR_INDEX = {
    UC_X86_REG_RAX: 0, UC_X86_REG_RCX: 1, UC_X86_REG_RDX: 2, UC_X86_REG_RBX: 3,
    UC_X86_REG_RSP: 4, UC_X86_REG_RBP: 5, UC_X86_REG_RSI: 6, UC_X86_REG_RDI: 7,
    UC_X86_REG_R8: 8, UC_X86_REG_R9: 9, UC_X86_REG_R10: 10, UC_X86_REG_R11: 11,
    UC_X86_REG_R12: 12, UC_X86_REG_R13: 13, UC_X86_REG_R14: 14, UC_X86_REG_R15: 15,
}
RIP_INDEX = 16
_READ_INDEX = {**GPR_INDEX, UC_X86_REG_RIP: RIP_INDEX}
_EFLAGS, _CC_SRC, _CC_OP, _DF = 136, 152, 168, 172     # byte offsets of the flags' state
SNAPSHOT_SIZE = 176                                     # through df
_ENV_HINT = (440, 0x8A50)   # Unicorn 2.1.4 on x86_64: uc_struct.cpu, offsetof(X86CPU, env)
_FLAG_BITS = 0x8D5          # CF PF AF ZF SF OF, which QEMU keeps in cc_src
_DF_BIT = 0x400


class RegisterFile:
    """The CPU's register file in Unicorn's memory (valid while its Uc lives).
    ``words[i]`` is general register i in QEMU's order (GPR_INDEX) or %rip (RIP_INDEX);
    :meth:`snapshot` and :meth:`restore` take every general register and the flags (with
    %rip) as bytes, to be put back at the same point of execution, in the same hook."""

    __slots__ = ("address", "words", "_raw")

    def __init__(self, address: int):
        self.address = address
        self._raw = memoryview((ctypes.c_char * SNAPSHOT_SIZE).from_address(address)).cast("B")
        self.words = self._raw[:8 * (RIP_INDEX + 1)].cast("Q")

    def snapshot(self) -> bytes:
        return self._raw.tobytes()

    def restore(self, snapshot: bytes) -> None:
        REG_WRITES[0] += 1
        self._raw[:] = snapshot

    def direction_flag(self) -> bool:
        """EFLAGS.DF (QEMU keeps it apart from the flags, as +1 or -1)."""
        return self._raw[_DF] != 1


def known_register_file(uc: Uc) -> RegisterFile | None:
    """uc's register file if :func:`register_file` found it, else None."""
    return getattr(uc, "_kprobefs_regfile", None)


def _file_access(words: memoryview, indices: list[int]):
    """read() -> tuple and write(values) of these words of a register file."""
    if len(indices) == 1:
        index = indices[0]

        def read() -> tuple:
            return (words[index],)
    else:
        read = functools.partial(operator.itemgetter(*indices), words)
    pairs = list(enumerate(indices))

    def write(values) -> None:
        REG_WRITES[0] += 1
        for i, index in pairs:
            words[index] = values[i] & 0xFFFFFFFFFFFFFFFF

    return read, write


def register_file(uc: Uc) -> RegisterFile | None:
    """The register file of uc, found and checked through the API (call it while uc does
    not run), or None where it cannot be shown to be one (another Unicorn, another
    host): then the API serves every access.  Found once per Uc."""
    found = getattr(uc, "_kprobefs_regfile", False)
    if found is False:
        try:
            found = _find_register_file(uc)
        except (OSError, ValueError, struct.error):
            found = None
        uc._kprobefs_regfile = found
    return found


def _find_register_file(uc: Uc) -> RegisterFile | None:
    gprs = list(GPR_INDEX)
    saved = [uc.reg_read(r) for r in gprs]
    rip, rflags = uc.reg_read(UC_X86_REG_RIP), uc.reg_read(UC_X86_REG_RFLAGS)
    marks = [random.getrandbits(64) | 1 for _ in gprs]
    for reg, value in zip(gprs, marks):
        uc.reg_write(reg, value)
    pattern = struct.pack("<16Q", *marks)
    try:
        with open("/proc/self/mem", "rb", buffering=0) as mem:
            address = _locate(uc, mem.fileno(), pattern)
        if address is None:
            return None
        found = RegisterFile(address)
        return found if _checks_out(uc, found, gprs) else None
    finally:
        for reg, value in zip(gprs, saved):
            uc.reg_write(reg, value)
        uc.reg_write(UC_X86_REG_RFLAGS, rflags)
        uc.reg_write(UC_X86_REG_RIP, rip)


def _read(fd: int, address: int, size: int) -> bytes:
    """Process memory through /proc/self/mem: an unmapped address is an OSError (or a
    short read), never a fault."""
    if not 0x10000 <= address < 1 << 47:
        return b""
    try:
        return os.pread(fd, size, address)
    except OSError:
        return b""


def _locate(uc: Uc, fd: int, pattern: bytes) -> int | None:
    """Where the 16 marked registers are: through the pinned Unicorn's layout first, else
    behind any pointer at the start of the uc_struct."""
    handle = uc._uch.value if hasattr(uc._uch, "value") else uc._uch
    head = _read(fd, handle, 0x1000)
    hint_at, hint_env = _ENV_HINT
    if len(head) >= hint_at + 8:
        cpu = struct.unpack_from("<Q", head, hint_at)[0]
        if _read(fd, cpu + hint_env, len(pattern)) == pattern:
            return cpu + hint_env
    for at in range(0, len(head) - 7, 8):
        target = struct.unpack_from("<Q", head, at)[0]
        if target & 7:
            continue
        blob = _read(fd, target, 0x40000)
        offset = blob.find(pattern)
        while offset >= 0 and offset & 7:
            offset = blob.find(pattern, offset + 1)
        if offset >= 0:
            return target + offset
    return None


def _checks_out(uc: Uc, rf: RegisterFile, gprs: list[int]) -> bool:
    """Whether rf is the register file: each general register and %rip as the API reads
    and writes it, and the flags' state as QEMU keeps it."""
    words, raw = rf.words, rf._raw
    if [words[GPR_INDEX[r]] for r in gprs] != [uc.reg_read(r) for r in gprs]:
        return False
    marks = [random.getrandbits(64) for _ in gprs]
    for reg, value in zip(gprs, marks):
        words[GPR_INDEX[reg]] = value
    if [uc.reg_read(r) for r in gprs] != marks:
        return False
    target = random.getrandbits(40) << 4
    uc.reg_write(UC_X86_REG_RIP, target)
    if words[RIP_INDEX] != target:
        return False
    # The flags: what an API write leaves there, then what an API read makes of a state
    # written here.
    uc.reg_write(UC_X86_REG_RFLAGS, 0x2 | 0x200 | _DF_BIT | 0x41)       # IF DF ZF CF
    eflags = struct.unpack_from("<Q", raw, _EFLAGS)[0]
    cc_src = struct.unpack_from("<Q", raw, _CC_SRC)[0]
    cc_op, df = struct.unpack_from("<Ii", raw, _CC_OP)
    if eflags & 0x200 == 0 or cc_src & _FLAG_BITS != 0x41 or df != -1:
        return False
    struct.pack_into("<Q", raw, _EFLAGS, 0x202)
    struct.pack_into("<Q", raw, _CC_SRC, 0x880)                          # SF OF
    struct.pack_into("<Ii", raw, _CC_OP, cc_op, 1)
    return uc.reg_read(UC_X86_REG_RFLAGS) & (_FLAG_BITS | _DF_BIT | 0x200) == 0xA80
