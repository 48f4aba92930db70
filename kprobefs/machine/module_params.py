"""Module parameters (Linux's kernel/params.c for a module's ``NAME=VALUE`` arguments).

A module declares its parameters in ``.modinfo`` (include/module.h): ``parmtype=NAME:TYPE``
as Linux's modinfo shows them, and ``parmvar=NAME:VARIABLE``, the variable the value is
written to.  :func:`apply_module_params` parses the arguments as parse_args() does and
stores each value into the module's image before init runs.
"""

from __future__ import annotations

import errno
import logging
import struct
from typing import Callable, Iterable

from ..errors import KernelError

__all__ = ["module_params", "apply_module_params"]

log = logging.getLogger("kprobefs.machine")

# TYPE -> (struct format, signed, bits) of the numeric kinds (param_ops_*).
_NUMERIC = {"int": ("<i", True, 32), "uint": ("<I", False, 32),
            "long": ("<q", True, 64), "ulong": ("<Q", False, 64),
            "short": ("<h", True, 16), "ushort": ("<H", False, 16),
            "byte": ("<B", False, 8)}
_BOOL_TRUE = ("y", "Y", "1")
_BOOL_FALSE = ("n", "N", "0")


def module_params(modinfo: Iterable[tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """NAME -> (TYPE, VARIABLE) from a module's ``.modinfo`` (key, value) pairs."""
    types, variables = {}, {}
    for key, value in modinfo:
        name, sep, rest = value.partition(":")
        if not sep:
            continue
        if key == "parmtype":
            types[name] = rest
        elif key == "parmvar":
            variables[name] = rest
    return {name: (kind, variables.get(name, name)) for name, kind in types.items()}


def _kstrto(text: str, signed: bool, bits: int) -> int | None:
    """kstrtoint and kin (base 0): the value, or None when malformed or out of range."""
    body = text[:-1] if text.endswith("\n") else text
    negative = signed and body.startswith("-")
    if negative or body.startswith("+"):
        body = body[1:]
    if body[:2] in ("0x", "0X") and len(body) > 2:
        digits, base = body[2:], 16
    elif body.startswith("0") and len(body) > 1:
        digits, base = body[1:], 8
    else:
        digits, base = body, 10
    try:
        value = int(digits, base) if digits.isalnum() else None
    except ValueError:
        return None
    if value is None:
        return None
    value = -value if negative else value
    low, high = (-(1 << bits - 1), (1 << bits - 1) - 1) if signed else (0, (1 << bits) - 1)
    return value if low <= value <= high else None


def _encode(kind: str, value: str | None, size: int) -> bytes:
    """The bytes ``value`` stores for a parameter of ``kind`` (``size``: the variable's);
    KernelError(EINVAL) when it is not one, ENOSPC when a string does not fit."""
    if kind == "bool":
        if value is None or value in _BOOL_TRUE or value.lower() == "on":
            return b"\1"
        if value in _BOOL_FALSE or value.lower() == "off":
            return b"\0"
        raise KernelError(errno.EINVAL, "invalid bool")
    if value is None:
        raise KernelError(errno.EINVAL, "missing value")
    if kind == "string":
        data = value.encode()
        if len(data) + 1 > size:
            raise KernelError(errno.ENOSPC, f"string doesn't fit in {size - 1} chars.")
        return data + b"\0"
    fmt, signed, bits = _NUMERIC.get(kind, (None, False, 0))
    if fmt is None:
        raise KernelError(errno.EINVAL, f"parameter type {kind} is not supported")
    number = _kstrto(value, signed, bits)
    if number is None:
        raise KernelError(errno.EINVAL, "invalid number")
    return struct.pack(fmt, number)


def apply_module_params(mod_name: str, args: Iterable[str],
                        params: dict[str, tuple[str, str]],
                        store: Callable[[str, bytes], None],
                        size_of: Callable[[str], int | None]) -> None:
    """Parse ``args`` (``NAME=VALUE`` or ``NAME``) for module ``mod_name`` and write each
    value with ``store(variable, data)``; ``size_of(variable)`` is the
    variable's size (None: no such variable).  An unknown parameter is ignored with a
    warning, as 6.1 does; a bad value fails the load (KernelError EINVAL / ENOSPC)
    before anything is written."""
    writes = []
    for arg in args:
        name, sep, value = arg.partition("=")
        name = name.replace("-", "_")
        found = params.get(name)
        if found is None:
            log.warning("%s: unknown parameter '%s' ignored", mod_name, name)
            continue
        kind, variable = found
        size = size_of(variable)
        if size is None:
            raise KernelError(errno.ENOEXEC, f"{mod_name}: no variable {variable}")
        try:
            data = _encode(kind, value if sep else None, size)
        except KernelError as e:
            log.warning("%s: '%s' invalid for parameter `%s'", mod_name, value, name)
            raise KernelError(e.errno, f"{mod_name}: {name}: {e}") from None
        writes.append((variable, data))
    for variable, data in writes:
        store(variable, data)
