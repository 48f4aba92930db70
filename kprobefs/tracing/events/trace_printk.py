"""trace_printk(): the records kernel code prints into the top trace array
(kernel/trace_printk.c) and the ``printk_formats`` file.

The kernel writes three of the ftrace system's record types through its recorder:
``print`` (ip, the text), ``bprint`` (ip, the format's address, the arguments in
vbin_printf's binary layout) and ``bputs`` (ip, the string's address).  Their text in
``trace`` is 6.1's ``trace_print_print``, ``trace_bprint_print`` and
``trace_bputs_print``: the caller's symbol, ``": "``, then the text.  A format or a
string is read from kernel memory by its address, as Linux reads it; the ones a module
holds were copied to kernel memory that outlives it when it loaded
(machine/module.py), so a record stays readable after an unload.

The kernel records them while the top array's tracing is on, its clock is the kernel's
and ``options/trace_printk`` is set (trace_printk() is never an instance's).
"""

from __future__ import annotations

import re
import struct
from typing import Callable

from ..buffers.output import format_ip_sym
from .print_fmt import c_printf
from ..buffers.raw_page import raw_common

__all__ = ["TracePrintk", "bstr_printf", "printk_formats_text"]

TRACE_PRINT, TRACE_BPRINT, TRACE_BPUTS = 5, 6, 14
_Q = struct.Struct("<Q")
_STRING_MAX = 1024          # TRACE_BUF_SIZE
_PAGE = 4096

# One conversion of the kernel's vsnprintf: flags, width, precision, length, type; %p
# with its alphanumeric extension.
_SPEC = re.compile(r"%(?P<flags>[-+ #0]*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?"
                   r"(?P<len>hh|h|ll|l|z|t|L)?(?P<conv>[cspdiuxXon%])"
                   r"(?P<ext>(?<=p)[A-Za-z0-9]*)?")
_INT_SIZE = {"hh": 1, "h": 2, None: 4, "l": 8, "ll": 8, "L": 8, "z": 8, "t": 8}


class _Args:
    """vbin_printf's binary buffer, read back as bstr_printf reads it."""

    def __init__(self, buf: bytes):
        self.buf, self.at = buf, 0

    def take(self, size: int, signed: bool = False) -> int:
        align = size if size < 8 else 4
        self.at = -(-self.at // align) * align
        chunk = self.buf[self.at:self.at + size]
        self.at += size
        return int.from_bytes(chunk.ljust(size, b"\0"), "little", signed=signed)

    def string(self) -> str:
        end = self.buf.find(b"\0", self.at)
        end = len(self.buf) if end < 0 else end
        text = self.buf[self.at:end]
        self.at = end + 1
        return text.decode("utf-8", "replace")


def bstr_printf(fmt: str, buf: bytes, symbolize: Callable[[int, bool], str | None],
                hash_pointer: Callable[[int], int] | None = None) -> str:
    """Format ``buf`` (vbin_printf's arguments) with ``fmt``, as 6.1's bstr_printf:
    ``%ps``/``%pS`` print the symbol (with ``+off/size`` for ``S``), ``%px`` the raw
    value, a plain ``%p`` the hashed pointer."""
    args, out, pos = _Args(buf), [], 0
    for m in _SPEC.finditer(fmt):
        out.append(fmt[pos:m.start()])
        pos = m.end()
        conv, width, prec = m["conv"], m["width"], m["prec"]
        if conv == "%":
            out.append("%")
            continue
        if width == "*":
            width = str(args.take(4, signed=True))
        if prec == "*":
            prec = str(args.take(4, signed=True))
        spec = "%" + m["flags"] + (width or "") + (f".{prec}" if prec is not None else "")
        if conv == "s":
            out.append(c_printf(spec + "s", [args.string()]))
        elif conv == "c":
            out.append(c_printf(spec + "c", [args.take(1)]))
        elif conv == "p":
            value, ext = args.take(8), m["ext"] or ""
            if ext[:1] in ("s", "S", "B"):
                name = symbolize(value, ext[:1] != "s")
                out.append(name if name else f"0x{value:x}")
            elif ext[:1] == "x":
                out.append(f"{value:016x}")
            else:
                out.append(c_printf("%p", [value], hash_pointer))
        elif conv == "n":
            continue
        else:
            size = _INT_SIZE[m["len"]]
            value = args.take(size, signed=conv in "di")
            length = {1: "hh", 2: "h", 4: "", 8: "l"}[size]
            out.append(c_printf(spec + length + conv, [value]))
    out.append(fmt[pos:])
    return "".join(out)


def printk_formats_text(formats) -> str:
    """printk_formats: each ``(address, format)`` as 6.1's t_show prints it (newlines,
    tabs and quotes escaped, a backslash written as it is)."""
    lines = []
    for addr, text in formats:
        body = (text.replace("\n", "\\n").replace("\t", "\\t").replace('"', '\\"'))
        lines.append(f'0x{addr:x} : "{body}"\n')
    return "".join(lines)


class _KernelPrintEvent:
    """One of the three record types trace_printk() writes, as a record decoder for
    the kernel's staged pages (native.py hands over ``(ts, pid, flags, event, 0, 0,
    data)``, data being the record after its common fields)."""

    static = True
    is_return = False

    def __init__(self, event_id: int, read_string: Callable[[int], str]):
        self.id = event_id
        self._read_string = read_string

    def raw(self, record: tuple) -> bytes:
        return raw_common(self.id, record[2], record[1]) + record[6]

    def render(self, record: tuple, tr, options) -> str:
        data = record[6]
        ip = _Q.unpack_from(data)[0]
        head = format_ip_sym(ip, tr.symbols.symbolize, options.sym_offset, options.sym_addr)
        if self.id == TRACE_PRINT:
            text = data[8:].split(b"\0", 1)[0].decode("utf-8", "replace")
        elif self.id == TRACE_BPUTS:
            text = self._read_string(_Q.unpack_from(data, 8)[0])
        else:
            fmt = self._read_string(_Q.unpack_from(data, 8)[0])
            text = bstr_printf(fmt, data[16:], tr.symbols.symbolize,
                               tr.symbols.hash_pointer)
        return f"{head}: {text}"


class TracePrintk:
    """The kernel's trace_printk() records: their decoders, by id, and whether the
    kernel records them.  ``kernel`` is the machine (``read``, ``image``, ``modules``);
    ``native`` the tracer's NativeRecorder.  Raises KeyError when the kernel has no
    trace_printk()."""

    def __init__(self, kernel, native):
        self.kernel = kernel
        self.native = native
        image = kernel.image
        self.events = {}
        self._probes = []
        for event_id, name in ((TRACE_PRINT, "trace_print_tp"),
                               (TRACE_BPRINT, "trace_bprint_tp"),
                               (TRACE_BPUTS, "trace_bputs_tp")):
            addr = image.symbol_value(name)
            if addr is None:
                raise KeyError(name)
            self._probes.append(native.adopt(addr, event_id))
            self.events[event_id] = _KernelPrintEvent(event_id, self._read_string)
        self.recording = False

    def _read_string(self, addr: int) -> str:
        """The string at addr now, as Linux reads a record's format when it prints it
        (up to TRACE_BUF_SIZE bytes; "(fault)" where nothing is mapped)."""
        out = b""
        while len(out) < _STRING_MAX and b"\0" not in out:
            at = addr + len(out)
            try:
                out += self.kernel.read(at, min(_PAGE - at % _PAGE, _STRING_MAX - len(out)))
            except Exception:           # an address no longer mapped
                return "(fault)" if not out else out.decode("utf-8", "replace")
        return out.split(b"\0", 1)[0].decode("utf-8", "replace")

    def sync(self, on: bool) -> None:
        """Make the kernel record trace_printk() (``on``) or not."""
        if on != self.recording:
            for np in self._probes:
                self.native.set_recording(np, on)
            self.recording = on

    def formats(self) -> list[tuple[int, str]]:
        """printk_formats' entries: the kernel's own __trace_printk_fmt section (its
        non-NULL pointers), then the formats modules brought, in load order."""
        out = []
        image = self.kernel.image
        start = image.symbol_value("__start___trace_printk_fmt")
        stop = image.symbol_value("__stop___trace_printk_fmt")
        if start is not None and stop is not None and stop > start:
            for (ptr,) in struct.iter_unpack("<Q", self.kernel.read(start, stop - start)):
                if ptr:
                    out.append((ptr, self._read_string(ptr)))
        modules = getattr(self.kernel, "modules", None)
        out.extend(getattr(modules, "trace_printk_formats", ()))
        return out
