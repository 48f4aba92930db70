"""Register access without the Unicorn binding's per-call overhead.

``Uc.reg_read``/``reg_write`` cost about 1.6 µs each from Python, four times a whole
UC_HOOK_CODE callback; probe handlers touch registers on every hit, so the machine calls
the C API directly through ctypes (about 0.4 µs).
"""

from __future__ import annotations

import ctypes

from unicorn import Uc
from unicorn.unicorn_py3 import unicorn as _binding

__all__ = ["FastRegs"]


class FastRegs:
    """uc_reg_read / uc_reg_write on one Uc, for 64-bit registers."""

    __slots__ = ("_handle", "_read", "_write", "_val", "_ref")

    def __init__(self, uc: Uc):
        self._handle = uc._uch
        self._read = _binding.uclib.uc_reg_read
        self._write = _binding.uclib.uc_reg_write
        self._val = ctypes.c_uint64()
        self._ref = ctypes.byref(self._val)

    def get(self, reg_id: int) -> int:
        self._read(self._handle, reg_id, self._ref)
        return self._val.value

    def set(self, reg_id: int, value: int) -> None:
        self._val.value = value & 0xFFFFFFFFFFFFFFFF
        self._write(self._handle, reg_id, self._ref)
