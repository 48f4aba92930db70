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
import struct

from unicorn import Uc
from unicorn.unicorn_py3 import unicorn as _binding

__all__ = ["FastRegs", "RegSet", "REG_WRITES", "add_code_hook", "add_intr_hook"]

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
    """uc_reg_read / uc_reg_write on one Uc, for 64-bit registers."""

    __slots__ = ("_handle", "_read", "_write", "_val", "_ref")

    def __init__(self, uc: Uc):
        self._handle = uc._uch
        self._read = _raw("uc_reg_read")
        self._write = _raw("uc_reg_write")
        self._val = ctypes.c_uint64()
        self._ref = ctypes.byref(self._val)

    def get(self, reg_id: int) -> int:
        self._read(self._handle, reg_id, self._ref)
        return self._val.value

    def set(self, reg_id: int, value: int) -> None:
        REG_WRITES[0] += 1
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
    """Read or write a fixed set of 64-bit registers in one C call each way."""

    __slots__ = ("_handle", "_ids", "_vals", "_ptrs", "_n", "_read", "_write", "_layout")

    def __init__(self, uc: Uc, reg_ids):
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

    def read(self) -> tuple:
        self._read(self._handle, self._ids, self._ptrs, self._n)
        return self._layout.unpack_from(self._vals)

    def write(self, values) -> None:
        REG_WRITES[0] += 1
        self._layout.pack_into(self._vals, 0, *values)
        self._write(self._handle, self._ids, self._ptrs, self._n)
