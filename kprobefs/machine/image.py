"""The kernel image: ELF segments, kallsyms, ftrace sites, the exception table and the
kprobe blacklist, read once with pyelftools.

Nothing here runs code; :class:`KernelImage` is what the machine loads and what the
engine asks about addresses.  While a module is loaded (machine/module.py adds and
removes it), its symbols, text and ftrace sites answer through the same lookups, as
Linux's kallsyms and ftrace cover loaded modules.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Protocol, Sequence

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..errors import ImageError

__all__ = ["Symbol", "KernelImage", "ModuleText", "default_image_path", "FENTRY_NOP"]

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


class ModuleText(Protocol):
    """What the image needs of a loaded module (machine/module.py's Module)."""

    name: str
    start: int                  # the module's core area, [start, end)
    end: int
    text_start: int             # its text, [text_start, text_end)
    text_end: int
    symbols: Sequence[Symbol]   # kallsyms entries, in the module's symtab order
    ftrace_sites: Sequence[int]

    def read(self, addr: int, size: int) -> bytes:
        """The module's bytes as relocated, before any patching."""


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
        self._global_symbols: dict[str, int] = {}
        for s in symtab.iter_symbols():
            kind = s["st_info"]["type"]
            bind = s["st_info"]["bind"]
            if not s.name or kind in ("STT_FILE", "STT_SECTION"):
                continue
            self._raw_symbols.setdefault(s.name, s["st_value"])
            if bind == "STB_GLOBAL" and s["st_shndx"] != "SHN_UNDEF":
                self._global_symbols.setdefault(s.name, s["st_value"])
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
        #: Loaded modules by name, oldest first; replaced (never mutated) on a change.
        self.modules: dict[str, ModuleText] = {}
        self._all_sites: tuple[int, ...] | None = None

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
        """Bytes of the image as loaded at addr (bss reads as zeros); inside a loaded
        module, its bytes as relocated."""
        for seg in self.segments:
            if seg.vaddr <= addr and addr + size <= seg.vaddr + seg.memsz:
                off = addr - seg.vaddr
                chunk = seg.data[off:off + size]
                return chunk + bytes(size - len(chunk))
        mod = self.module_at(addr)
        if mod is not None and addr + size <= mod.end:
            return mod.read(addr, size)
        raise ImageError(f"address {addr:#x} is not in the image")

    def _quads(self, section: str) -> list[int]:
        start, size = self.sections.get(section, (0, 0))
        if not size:
            return []
        data = self.read(start, size)
        return list(struct.unpack(f"<{size // 8}Q", data))

    @cached_property
    def kernel_ftrace_sites(self) -> tuple[int, ...]:
        """Addresses of the vmlinux `call __fentry__` sites, from __mcount_loc."""
        return tuple(sorted(self._quads("__mcount_loc")))

    @cached_property
    def bulk_string_sites(self) -> tuple[int, ...]:
        """Addresses of the long `rep movs`/`rep stos` the host carries out whole (see
        machine/strings.py), from __bulk_string."""
        return tuple(sorted(self._quads("__bulk_string")))

    @property
    def ftrace_sites(self) -> tuple[int, ...]:
        """Every ftrace site: the kernel's, then those of the loaded modules, sorted."""
        sites = self._all_sites
        if sites is None:
            sites = self.kernel_ftrace_sites
            if self.modules:
                sites = tuple(sorted(sites + tuple(
                    a for m in self.modules.values() for a in m.ftrace_sites)))
            self._all_sites = sites
        return sites

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

    # ---- loaded modules ----------------------------------------------------------------
    def add_module(self, mod: ModuleText) -> None:
        """Make a loaded module's symbols, text and ftrace sites visible.  Caller holds
        the machine lock."""
        if mod.name in self.modules:
            raise ImageError(f"module {mod.name} is already in the symbol table")
        self.modules = {**self.modules, mod.name: mod}
        self._all_sites = None

    def remove_module(self, name: str) -> None:
        """Forget an unloaded module (no-op if it is not there)."""
        if name in self.modules:
            self.modules = {k: m for k, m in self.modules.items() if k != name}
            self._all_sites = None

    def module_at(self, addr: int) -> ModuleText | None:
        """The loaded module whose core area contains addr, or None."""
        for mod in self.modules.values():
            if mod.start <= addr < mod.end:
                return mod
        return None

    def is_module_text(self, addr: int) -> bool:
        """Whether addr is in the text of a loaded module (__module_text_address)."""
        mod = self.module_at(addr)
        return mod is not None and mod.text_start <= addr < mod.text_end

    def is_kernel_text(self, addr: int) -> bool:
        """Whether addr is core kernel text or module text (kernel_text_address)."""
        return self.text_start <= addr < self.text_end or self.is_module_text(addr)

    def global_symbol(self, name: str) -> int | None:
        """Value of a global vmlinux symbol (what a module may link against), or None."""
        return self._global_symbols.get(name)

    # ---- symbol lookup -----------------------------------------------------------------
    def symbol_value(self, name: str) -> int | None:
        """Value of any ELF symbol, including linker-script markers; None if absent."""
        return self._raw_symbols.get(name)

    def lookup_name(self, name: str) -> list[Symbol]:
        """Every kallsyms symbol with exactly this name (several for static duplicates):
        the kernel's first, then each loaded module's (newest first).  ``MOD:SYM`` looks in module MOD
        only (kallsyms_lookup_name's form); an empty list when MOD is not loaded."""
        modname, sep, sym = name.partition(":")
        if sep:
            mod = self.modules.get(modname)
            return [] if mod is None else [s for s in mod.symbols if s.name == sym]
        found = list(self._by_name.get(name, ()))
        for mod in reversed(self.modules.values()):
            found.extend(s for s in mod.symbols if s.name == name)
        return found

    def symbol_at(self, addr: int) -> Symbol | None:
        """The sized symbol that contains addr (in the kernel or a loaded module), or
        None."""
        i = bisect.bisect_right(self._addrs, addr) - 1
        while i >= 0:
            s = self.symbols[i]
            if s.addr <= addr < s.addr + max(s.size, 1):
                return s
            if s.addr < addr and s.size:
                break
            i -= 1
        if not self.modules:
            return None
        mod = self.module_at(addr)
        if mod is None:
            return None
        # As Linux's module lookup: of the symbols covering addr, the first in the
        # module's symtab (a static function before the global alias of it).
        for s in mod.symbols:
            if s.addr <= addr < s.addr + max(s.size, 1):
                return s
        return None

    def format_address(self, addr: int) -> str:
        """`sym+0xoff/0xsize` as %pS prints it (with ` [mod]` inside a module), or `0x…`
        when no symbol covers addr."""
        s = self.symbol_at(addr)
        if s is None:
            return f"0x{addr:x}"
        text = f"{s.name}+{addr - s.addr:#x}/{s.size:#x}"
        return f"{text} [{s.module}]" if s.module else text

    def kallsyms(self) -> str:
        """The /proc/kallsyms text: the kernel's symbols, then each loaded module's
        (newest first, as Linux's module list)."""
        lines = [s.kallsyms_line() + "\n" for s in self.symbols]
        for mod in reversed(self.modules.values()):
            lines.extend(s.kallsyms_line() + "\n" for s in mod.symbols)
        return "".join(lines)

    def function_bytes(self, sym: Symbol) -> bytes:
        return self.read(sym.addr, sym.size)
