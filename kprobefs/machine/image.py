"""The kernel image: ELF segments, kallsyms, ftrace sites, the exception table and the
kprobe blacklist, read once with pyelftools.

Nothing here runs code; :class:`KernelImage` is what the machine loads and what the
engine asks about addresses.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import ImageError

__all__ = ["Symbol", "KernelImage", "default_image_path", "FENTRY_NOP"]

#: The 5-byte NOP Linux writes over every ftrace call site at boot.
FENTRY_NOP = bytes.fromhex("0f1f440000")


@dataclass(frozen=True, order=True)
class Symbol:
    """One kallsyms entry."""

    addr: int
    name: str
    size: int
    type: str  # kallsyms letter: T t D d R r B b (upper case = global)
    module: str | None = None

    @property
    def end(self) -> int:
        return self.addr + self.size

    @property
    def is_text(self) -> bool:
        return self.type in "Tt"

    def kallsyms_line(self) -> str:
        line = f"{self.addr:016x} {self.type} {self.name}"
        return f"{line}\t[{self.module}]" if self.module else line


def default_image_path() -> Path:
    """The vmlinux bundled with the package."""
    return Path(str(resources.files("kprobefs.kernel").joinpath("vmlinux")))


@dataclass(frozen=True)
class Segment:
    vaddr: int
    paddr: int
    data: bytes
    memsz: int
    writable: bool
    executable: bool


class KernelImage:
    """A parsed vmlinux.  Addresses are kernel virtual addresses."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_image_path()
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise ImageError(f"cannot read kernel image {self.path}: {e}") from e
        self.raw = raw
        try:
            import io

            self._elf = ELFFile(io.BytesIO(raw))
            self._load()
        except ELFError as e:
            raise ImageError(f"{self.path}: not a valid ELF image: {e}") from e

    # ---- parsing ---------------------------------------------------------------------
    def _load(self) -> None:
        elf = self._elf
        if elf["e_machine"] != "EM_X86_64":
            raise ImageError(f"{self.path}: not an x86_64 image")
        self.entry = elf["e_entry"]
        self.segments = tuple(
            Segment(
                vaddr=seg["p_vaddr"],
                paddr=seg["p_paddr"],
                data=seg.data(),
                memsz=seg["p_memsz"],
                writable=bool(seg["p_flags"] & 2),
                executable=bool(seg["p_flags"] & 1),
            )
            for seg in elf.iter_segments()
            if seg["p_type"] == "PT_LOAD"
        )
        self.sections = {
            s.name: (s["sh_addr"], s["sh_size"]) for s in elf.iter_sections() if s.name
        }
        symtab = elf.get_section_by_name(".symtab")
        if symtab is None:
            raise ImageError(f"{self.path}: no .symtab")
        text = self.sections[".text"]
        syms = []
        self._raw_symbols = {}
        for s in symtab.iter_symbols():
            kind = s["st_info"]["type"]
            bind = s["st_info"]["bind"]
            if not s.name or kind in ("STT_FILE", "STT_SECTION"):
                continue
            self._raw_symbols.setdefault(s.name, s["st_value"])
            if s["st_shndx"] == "SHN_ABS" or kind not in ("STT_FUNC", "STT_OBJECT", "STT_NOTYPE"):
                continue
            letter = self._type_letter(s["st_shndx"])
            if letter is None:
                continue
            if bind == "STB_LOCAL":
                letter = letter.lower()
            syms.append(Symbol(s["st_value"], s.name, s["st_size"], letter))
        syms.sort()
        self.symbols: tuple[Symbol, ...] = tuple(syms)
        self._addrs = [s.addr for s in syms]
        self._by_name: dict[str, list[Symbol]] = {}
        for s in syms:
            self._by_name.setdefault(s.name, []).append(s)
        self.text_start, self.text_end = text[0], text[0] + text[1]

    def _type_letter(self, shndx) -> str | None:
        """The kallsyms/nm letter of a symbol defined in section shndx (None: not listed)."""
        if not isinstance(shndx, int):
            return None
        sec = self._elf.get_section(shndx)
        flags = sec["sh_flags"]
        if not flags & 0x2:  # SHF_ALLOC
            return None
        if flags & 0x4:  # SHF_EXECINSTR
            return "T"
        if sec["sh_type"] == "SHT_NOBITS":
            return "B"
        return "D" if flags & 0x1 else "R"  # SHF_WRITE

    # ---- sections read as tables -------------------------------------------------------
    def read(self, addr: int, size: int) -> bytes:
        """Bytes of the image as loaded at addr (bss reads as zeros)."""
        for seg in self.segments:
            if seg.vaddr <= addr and addr + size <= seg.vaddr + seg.memsz:
                off = addr - seg.vaddr
                chunk = seg.data[off:off + size]
                return chunk + bytes(size - len(chunk))
        raise ImageError(f"address {addr:#x} is not in the image")

    def _quads(self, section: str) -> list[int]:
        start, size = self.sections.get(section, (0, 0))
        if not size:
            return []
        data = self.read(start, size)
        return list(struct.unpack(f"<{size // 8}Q", data))

    @cached_property
    def ftrace_sites(self) -> tuple[int, ...]:
        """Addresses of the `call __fentry__` sites, from __mcount_loc."""
        return tuple(sorted(self._quads("__mcount_loc")))

    @cached_property
    def extable(self) -> dict[int, int]:
        """Faulting instruction address -> fixup address."""
        q = self._quads("__ex_table")
        return dict(zip(q[0::2], q[1::2]))

    @cached_property
    def nokprobe_functions(self) -> tuple[Symbol, ...]:
        """Functions marked NOKPROBE_SYMBOL in the source."""
        out = []
        for addr in self._quads("_kprobe_blacklist"):
            sym = self.symbol_at(addr)
            if sym is not None and sym.addr == addr:
                out.append(sym)
        return tuple(out)

    @cached_property
    def blacklist(self) -> tuple[Symbol, ...]:
        """Every range kprobes must refuse, in address order: NOKPROBE functions, every
        symbol of the kprobes and noinstr text sections."""
        ranges = {s for s in self.nokprobe_functions}
        for lo_name, hi_name in (("__kprobes_text_start", "__kprobes_text_end"),
                                 ("__noinstr_text_start", "__noinstr_text_end")):
            lo, hi = self.symbol_value(lo_name), self.symbol_value(hi_name)
            if lo is None or hi is None:
                continue
            for s in self.symbols:
                if lo <= s.addr < hi and s.is_text and s.size:
                    ranges.add(s)
        return tuple(sorted(ranges))

    # ---- symbol lookup -----------------------------------------------------------------
    def symbol_value(self, name: str) -> int | None:
        """Value of any ELF symbol, including linker-script markers; None if absent."""
        return self._raw_symbols.get(name)

    def lookup_name(self, name: str) -> list[Symbol]:
        """Every kallsyms symbol with exactly this name (several for static duplicates)."""
        return list(self._by_name.get(name, ()))

    def symbol_at(self, addr: int) -> Symbol | None:
        """The sized symbol that contains addr, or None."""
        i = bisect.bisect_right(self._addrs, addr) - 1
        while i >= 0:
            s = self.symbols[i]
            if s.addr <= addr < s.addr + max(s.size, 1):
                return s
            if s.addr < addr and s.size:
                return None
            i -= 1
        return None

    def format_address(self, addr: int) -> str:
        """`sym+0xoff/0xsize` as %pS prints it, or `0x…` when no symbol covers addr."""
        s = self.symbol_at(addr)
        if s is None:
            return f"0x{addr:x}"
        return f"{s.name}+{addr - s.addr:#x}/{s.size:#x}"

    def kallsyms(self) -> str:
        """The /proc/kallsyms text."""
        return "".join(s.kallsyms_line() + "\n" for s in self.symbols)

    def function_bytes(self, sym: Symbol) -> bytes:
        return self.read(sym.addr, sym.size)
