"""Loadable kernel modules: Linux's kernel/module/ for the emulated kernel.

A module is a relocatable x86_64 ELF object (``kprobefs/kernel/modules/NAME.ko``, built
from the project's C with the kernel's flags).  :class:`ModuleLoader` loads one the way
load_module() does:

1. lay its allocated sections out in the module area (``MODULES_VADDR``, within +-2 GiB of
   kernel text, as ``-mcmodel=kernel`` code and kprobes' rel32 jumps need): text, then
   read-only data, then writable data, each part on its own pages, text and read-only
   pages mapped read-only;
2. resolve undefined symbols against the kernel's global symbols (ENOENT, "Unknown
   symbol", when one is missing) and apply the relocations;
3. turn each ``__mcount_loc`` site into the 5-byte NOP (ftrace_module_init);
4. add its symbols to kallsyms, ``name\\t[module]`` (the image answers for them from now on),
   and tell the notifiers MODULE_STATE_COMING (the kprobes engine learns the new ftrace
   sites; the tracer registers the ``MOD:SYM`` probes that were waiting for it);
5. call ``init_module()`` on a CPU (a failure unwinds as GOING and returns init's errno),
   then MODULE_STATE_LIVE.

:meth:`ModuleLoader.unload` is delete_module(): ``cleanup_module()``, MODULE_STATE_GOING
(the engine marks every probe in the module ``[GONE]``), then the symbols, sites and
pages go.  It refuses, as Linux does, only a module that is not loaded (ENOENT), one that
is still loading or already unloading, or one with an init but no exit function (EBUSY,
listed ``[permanent]``).  Probes never hold a module (Linux drops the reference it takes
while registering), so an armed probe does not block an unload.

Not modelled: ``__init`` sections freed after init (this kernel's modules keep init and
exit in .text), symbol exports between modules, module parameters and signatures.
"""

from __future__ import annotations

import errno
import io
import logging
import struct
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.relocation import RelocationSection

from ..errors import KernelError
from .image import FENTRY_NOP, Symbol
from .memory import PAGE
from .module_params import apply_module_params, module_params

__all__ = ["ModuleLoader", "Module", "ModuleObject", "MODULES_VADDR", "MODULES_END",
           "MODULE_STATE_LIVE", "MODULE_STATE_COMING", "MODULE_STATE_GOING",
           "default_module_dir", "normalize_module_name"]

log = logging.getLogger("kprobefs.machine.module")

#: Linux x86_64's module area: right after the 1 GiB kernel image mapping.
MODULES_VADDR = 0xFFFFFFFFC0000000
MODULES_END = 0xFFFFFFFFFF000000

MODULE_STATE_LIVE = "live"
MODULE_STATE_COMING = "coming"
MODULE_STATE_GOING = "going"

_SHF_WRITE, _SHF_ALLOC, _SHF_EXECINSTR = 0x1, 0x2, 0x4
_U64 = (1 << 64) - 1
# x86_64 relocation types the loader applies (apply_relocate_add).
_R_NONE, _R_64, _R_PC32, _R_PLT32, _R_32, _R_32S, _R_PC64 = 0, 1, 2, 4, 10, 11, 24
#: Sections a module carries for the loader only: read, never mapped.
_NOT_MAPPED = (".modinfo",)

#: The taint bits a module may set (include/linux/panic.h's TAINT_* numbers).
TAINT_PROPRIETARY_MODULE, TAINT_CRAP, TAINT_OOT_MODULE, TAINT_UNSIGNED_MODULE = 0, 10, 12, 13
#: The licenses 6.1's license_is_gpl_compatible() accepts.
_GPL_COMPATIBLE = frozenset({"GPL", "GPL v2", "GPL and additional rights", "Dual BSD/GPL",
                             "Dual MIT/GPL", "Dual MPL/GPL"})


def module_taints(info: dict) -> int:
    """struct module's taints for a module with these .modinfo strings, as a kernel
    with module signatures (not enforced, Debian's 6.1) sets them: proprietary without a
    GPL-compatible license, out-of-tree without intree=Y, staging with staging=Y, and
    unsigned always (this loader takes no signatures)."""
    taints = 1 << TAINT_UNSIGNED_MODULE
    if info.get("license") not in _GPL_COMPATIBLE:
        taints |= 1 << TAINT_PROPRIETARY_MODULE
    if info.get("intree") != "Y":
        taints |= 1 << TAINT_OOT_MODULE
    if info.get("staging") == "Y":
        taints |= 1 << TAINT_CRAP
    return taints


def default_module_dir() -> Path:
    """The modules bundled with the package (``kprobefs/kernel/modules``)."""
    return Path(str(resources.files("kprobefs.kernel").joinpath("modules")))


def normalize_module_name(name: str) -> str:
    """A module name as the kernel spells it: ``-`` and ``_`` are the same character
    (kmod's modname_normalize), and a ``.ko`` file name stands for its module."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith(".ko"):
        base = base[:-3]
    return base.replace("-", "_")


# ==== the object file ========================================================================
@dataclass(frozen=True)
class _Section:
    index: int
    name: str
    flags: int
    size: int
    align: int
    data: bytes          # empty for SHT_NOBITS

    @property
    def part(self) -> int:
        """0 text, 1 read-only data, 2 writable data: the layout order."""
        if self.flags & _SHF_EXECINSTR:
            return 0
        return 2 if self.flags & _SHF_WRITE else 1


@dataclass(frozen=True)
class _ElfSymbol:
    name: str
    value: int
    size: int
    kind: str            # STT_*
    bind: str            # STB_*
    shndx: int | str     # a section index, or SHN_UNDEF / SHN_ABS / ...


@dataclass(frozen=True)
class _Rela:
    section: int         # the section patched
    offset: int
    type: int
    symbol: int
    addend: int


class ModuleObject:
    """A parsed ``.ko``: its allocated sections, symbol table, relocations and
    ``.modinfo`` strings.  Raises KernelError(ENOEXEC) for anything else."""

    def __init__(self, path: str | Path, name: str | None = None):
        self.path = Path(path)
        self.name = name or normalize_module_name(self.path.name)
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise KernelError(e.errno or errno.ENOENT, f"module {self.path}") from e
        try:
            self._parse(ELFFile(io.BytesIO(raw)))
        except ELFError as e:
            raise KernelError(errno.ENOEXEC, f"module {self.path}: {e}") from e

    def _parse(self, elf: ELFFile) -> None:
        if elf["e_type"] != "ET_REL" or elf["e_machine"] != "EM_X86_64":
            raise KernelError(errno.ENOEXEC, f"{self.path}: not an x86_64 relocatable object")
        self.sections: dict[int, _Section] = {}
        self.info: dict[str, str] = {}
        modinfo: list[tuple[str, str]] = []
        self.symbols: list[_ElfSymbol] = []
        self.relocations: list[_Rela] = []
        rela_sections = []
        for index, sec in enumerate(elf.iter_sections()):
            if sec.name in _NOT_MAPPED:
                for item in sec.data().split(b"\0"):
                    key, sep, value = item.decode("utf-8", "replace").partition("=")
                    if sep:
                        self.info[key] = value
                        modinfo.append((key, value))
                continue
            if isinstance(sec, RelocationSection):
                rela_sections.append(sec)
            elif sec["sh_type"] == "SHT_SYMTAB":
                self.symbols = [
                    _ElfSymbol(s.name, s["st_value"], s["st_size"], s["st_info"]["type"],
                               s["st_info"]["bind"], s["st_shndx"])
                    for s in sec.iter_symbols()]
            elif sec["sh_flags"] & _SHF_ALLOC and sec["sh_size"]:
                nobits = sec["sh_type"] == "SHT_NOBITS"
                self.sections[index] = _Section(
                    index, sec.name, sec["sh_flags"], sec["sh_size"],
                    max(1, sec["sh_addralign"]), b"" if nobits else sec.data())
        #: NAME -> (TYPE, VARIABLE) of its parameters (module_param)
        self.params = module_params(modinfo)
        for sec in rela_sections:
            target = sec["sh_info"]
            if target not in self.sections:
                continue  # relocations of a section that is not loaded (debug info)
            if not sec.is_RELA():
                raise KernelError(errno.ENOEXEC, f"{self.path}: REL relocations")
            for r in sec.iter_relocations():
                self.relocations.append(_Rela(target, r["r_offset"], r["r_info_type"],
                                              r["r_info_sym"], r["r_addend"]))


# ==== a loaded module ========================================================================
@dataclass(eq=False)
class Module:
    """struct module: one loaded module.  ``start``/``end`` bound its core area (text,
    then read-only data, then writable data); ``symbols`` are its kallsyms entries in
    symtab order; ``state`` is coming, live or going."""

    name: str
    path: Path
    start: int
    end: int
    text_start: int
    text_end: int
    symbols: tuple[Symbol, ...] = ()
    ftrace_sites: tuple[int, ...] = ()
    init: int | None = None
    exit: int | None = None
    state: str = MODULE_STATE_COMING
    info: dict = field(default_factory=dict)
    refcount: int = 0
    pages: list = field(default_factory=list)        # (va, pa) of every mapped page
    sections: dict = field(default_factory=dict)     # name -> (address, size)
    image: bytearray = field(default_factory=bytearray, repr=False)  # as relocated

    @property
    def size(self) -> int:
        return self.end - self.start

    def read(self, addr: int, size: int) -> bytes:
        """The module's bytes as relocated (ftrace sites still `call __fentry__`)."""
        off = addr - self.start
        if off < 0 or off + size > len(self.image):
            raise KernelError(errno.EFAULT, f"{addr:#x} is not in module {self.name}")
        return bytes(self.image[off:off + size])

    def symbol_address(self, name: str) -> int | None:
        for s in self.symbols:
            if s.name == name:
                return s.addr
        return None

    def proc_modules_line(self) -> str:
        """This module's line of /proc/modules."""
        users = "[permanent]," if self.init is not None and self.exit is None else "-"
        state = {MODULE_STATE_GOING: "Unloading",
                 MODULE_STATE_COMING: "Loading"}.get(self.state, "Live")
        return f"{self.name} {self.size} {self.refcount} {users} {state} 0x{self.start:016x}\n"


#: notifier(state, module): called for MODULE_STATE_COMING, _LIVE and _GOING.
ModuleNotifier = Callable[[str, Module], None]


class ModuleLoader:
    """The kernel's modules: load, unload, the list, and the notifier chain.

    ``kernel`` is the machine (memory, lock, call_in_process, image); ``directory``
    holds the ``NAME.ko`` files (default: the bundled ones).  Loading and unloading run
    kernel code (init/exit) in process context: for a control-file write, in that
    write's own system call once its hypercall returns (the module is COMING, or GOING,
    until then); from the Python API, at once on an idle CPU."""

    def __init__(self, kernel, directory: str | Path | None = None):
        self.kernel = kernel
        self.directory = Path(directory) if directory else default_module_dir()
        self.modules: dict[str, Module] = {}         # load order
        self._notifiers: list[tuple[int, int, ModuleNotifier]] = []
        self._next_base = MODULES_VADDR
        #: (address, format) of each trace_printk format a module brought (held for
        #: good, as 6.1's trace_bprintk_fmt_list), in load order.
        self.trace_printk_formats: list[tuple[int, str]] = []
        self._fmt_next = 0

    # ---- the notifier chain ---------------------------------------------------------------
    def register_module_notifier(self, notifier: ModuleNotifier, priority: int = 0) -> None:
        """Call notifier(state, module) on every state change; higher priority first,
        then in registration order."""
        self._notifiers.append((-priority, len(self._notifiers), notifier))
        self._notifiers.sort(key=lambda t: (t[0], t[1]))

    def unregister_module_notifier(self, notifier: ModuleNotifier) -> None:
        self._notifiers = [t for t in self._notifiers if t[2] is not notifier]

    def _notify(self, state: str, mod: Module) -> None:
        for _, _, notifier in list(self._notifiers):
            try:
                notifier(state, mod)
            except Exception:
                log.exception("module notifier failed for %s (%s)", mod.name, state)

    # ---- what is there --------------------------------------------------------------------
    def available(self) -> list[str]:
        """Names of the modules that can be loaded."""
        if not self.directory.is_dir():
            return []
        return sorted(normalize_module_name(p.name) for p in self.directory.glob("*.ko"))

    def find(self, name: str) -> Path:
        """The .ko file of a module name (``-`` and ``_`` alike); KernelError(ENOENT) when
        there is none."""
        wanted = normalize_module_name(name)
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.ko")):
                if normalize_module_name(path.name) == wanted:
                    return path
        raise KernelError(errno.ENOENT, f"module {name} not found")

    def get(self, name: str) -> Module | None:
        return self.modules.get(normalize_module_name(name))

    def proc_modules(self) -> str:
        """/proc/modules: newest module first."""
        return "".join(m.proc_modules_line() for m in reversed(self.modules.values()))

    # ---- load -----------------------------------------------------------------------------
    def load(self, name: str, path: str | Path | None = None,
             params: tuple[str, ...] = ()) -> Module:
        """Load a module by name (from the module directory) or from path, with its
        ``params`` (``NAME=VALUE`` words, set before init); returns it, live (or
        COMING, its init queued for the system call being served, whose result is then
        init's errno on failure).  KernelError: ENOENT (no such module, or an unknown
        symbol), EEXIST (already loaded), ENOEXEC (not a module object), ENOMEM, EINVAL
        or ENOSPC (a bad parameter value), or init's errno."""
        kernel = self.kernel
        obj = ModuleObject(path if path is not None else self.find(name),
                           normalize_module_name(name))
        with kernel.lock:
            if obj.name in self.modules:
                raise KernelError(errno.EEXIST, f"module {obj.name} is already loaded")
            mod, where = self._layout(obj)
            try:
                self._relocate(obj, mod, where)
                self._set_params(obj, mod, where, params)
                self._map(mod, where)
                self._ftrace_init(obj, mod, where)
            except BaseException:
                self._free(mod)
                raise
            self.modules[mod.name] = mod
            kernel.image.add_module(mod)
            self._hold_trace_printk_formats(mod)
            self._notify(MODULE_STATE_COMING, mod)
            # module:module_load, before init runs (6.1's load_module)
            kernel.call_in_process("module_trace_load", mod.name, module_taints(mod.info))
            if mod.init is None:
                self._init_done(mod, 0)
                return mod
            call = kernel.call_in_process(mod.init,
                                          then=lambda ret: self._init_done(mod, ret))
            if call.done and call.outcome is not None:
                raise KernelError(-call.outcome, f"module {mod.name} init")
            return mod

    def _hold_trace_printk_formats(self, mod: Module) -> None:
        """6.1's module_trace_bprintk_format_notify at MODULE_STATE_COMING: each format
        pointer in the module's __trace_printk_fmt section is pointed at a kernel copy
        of its string (one per distinct string, kept for good in
        trace_bprintk_fmt_area), which printk_formats lists.  A pointer stays NULL when
        the area is full, as when kmalloc fails."""
        where = mod.sections.get("__trace_printk_fmt")
        area = self.kernel.image.symbol_value("trace_bprintk_fmt_area")
        if where is None or area is None:
            return
        kernel = self.kernel
        addr, size = where
        (sym,) = kernel.image.lookup_name("trace_bprintk_fmt_area") or (None,)
        area_end = area + (sym.size if sym is not None else 0)
        held = {text: at for at, text in self.trace_printk_formats}
        for slot in range(addr, addr + size - 7, 8):
            ptr = kernel.mem.read_u64(slot)
            if not ptr:
                continue
            text = kernel.mem.read_cstring(ptr, 1024).decode("utf-8", "replace")
            at = held.get(text)
            if at is None:
                data = text.encode() + b"\0"
                at = -(-self._fmt_next // 8) * 8 if self._fmt_next else area
                if at + len(data) > area_end:
                    at = 0
                else:
                    kernel.mem.write(at, data)
                    self._fmt_next = at + len(data)
                    held[text] = at
                    self.trace_printk_formats.append((at, text))
            kernel.mem.write(slot, struct.pack("<Q", at))

    def _init_done(self, mod: Module, ret: int) -> int | None:
        """init returned ret: the module goes live, or (ret < 0) away again.  Returns
        the errno to fail the load with (negative), else None."""
        ret = _c_int(ret)                   # init_module() returns an int (eax)
        if ret < 0:
            log.warning("%s: init failed with %d", mod.name, ret)
            self._going(mod)
            return ret
        mod.state = MODULE_STATE_LIVE
        self._notify(MODULE_STATE_LIVE, mod)
        log.info("module %s loaded at %#x", mod.name, mod.start)
        return None

    def _layout(self, obj: ModuleObject) -> tuple[Module, "_Placement"]:
        """Give every allocated section its address: text, read-only, writable parts,
        each starting on a page.  Returns the module (its image holding the section
        bytes, not yet relocated) and where things went."""
        offsets: dict[int, int] = {}
        cursor = 0
        bounds = []
        for part in (0, 1, 2):
            cursor = _align(cursor, PAGE)
            bounds.append(cursor)
            for sec in sorted((s for s in obj.sections.values() if s.part == part),
                              key=lambda s: s.index):
                cursor = _align(cursor, sec.align)
                offsets[sec.index] = cursor
                cursor += sec.size
        size = _align(max(cursor, 1), PAGE)
        base = self._next_base
        if base + size > MODULES_END:
            raise KernelError(errno.ENOMEM, "module area exhausted")
        # Addresses are not reused (and a guard page separates modules): a probe left
        # [GONE] on an unloaded module never meets another module's code at its address.
        self._next_base = base + size + PAGE
        image = bytearray(size)
        for sec in obj.sections.values():
            off = offsets[sec.index]
            image[off:off + len(sec.data)] = sec.data
        where = _Placement({idx: base + off for idx, off in offsets.items()},
                           rw_start=base + bounds[2])
        mod = Module(name=obj.name, path=obj.path, start=base, end=base + size,
                     text_start=base + bounds[0], text_end=base + bounds[1],
                     info=dict(obj.info), image=image)
        mod.sections = {sec.name: (base + offsets[sec.index], sec.size)
                        for sec in obj.sections.values()}
        mod.symbols = tuple(self._kallsyms(obj, mod, where))
        mod.init = where.function(obj, "init_module")
        mod.exit = where.function(obj, "cleanup_module")
        return mod, where

    @staticmethod
    def _kallsyms(obj: ModuleObject, mod: Module, where: "_Placement"):
        """The module's kallsyms entries (is_core_symbol + elf_type): named symbols of
        loaded sections, lower-case letters (nothing is exported), symtab order."""
        for s in obj.symbols:
            if not s.name or s.kind in ("STT_FILE", "STT_SECTION") or \
                    not isinstance(s.shndx, int) or s.shndx not in obj.sections:
                continue
            sec = obj.sections[s.shndx]
            if s.bind == "STB_WEAK":
                letter = "v" if s.kind == "STT_OBJECT" else "w"
            elif sec.flags & _SHF_EXECINSTR:
                letter = "t"
            elif not sec.data:
                letter = "b"
            else:
                letter = "d" if sec.flags & _SHF_WRITE else "r"
            yield Symbol(where.bases[s.shndx] + s.value, s.name, s.size, letter,
                         module=mod.name)

    def _symbol_value(self, obj: ModuleObject, mod: Module, where: "_Placement",
                      index: int) -> int:
        s = obj.symbols[index]
        if s.shndx == "SHN_UNDEF":
            value = self.kernel.image.global_symbol(s.name)
            if value is None:
                log.warning("%s: Unknown symbol %s", mod.name, s.name)
                raise KernelError(errno.ENOENT, f"{mod.name}: Unknown symbol {s.name}")
            return value
        if s.shndx == "SHN_ABS":
            return s.value
        if isinstance(s.shndx, int) and s.shndx in where.bases:
            return where.bases[s.shndx] + s.value
        raise KernelError(errno.ENOEXEC, f"{mod.name}: symbol {s.name or index} "
                                         "is in a section that is not loaded")

    def _relocate(self, obj: ModuleObject, mod: Module, where: "_Placement") -> None:
        """apply_relocate_add(): S + A (- P) into the module's image."""
        image = mod.image
        for r in obj.relocations:
            if r.type == _R_NONE:
                continue
            place = where.bases[r.section] + r.offset
            off = place - mod.start
            value = self._symbol_value(obj, mod, where, r.symbol) + r.addend
            if r.type in (_R_PC32, _R_PLT32, _R_PC64):
                value -= place
            if r.type in (_R_64, _R_PC64):
                size, packed = 8, struct.pack("<Q", value & _U64)
            elif r.type == _R_32:
                if not 0 <= value <= 0xFFFFFFFF:
                    raise _overflow(mod, r, value)
                size, packed = 4, struct.pack("<I", value)
            elif r.type in (_R_32S, _R_PC32, _R_PLT32):
                value = _signed64(value & _U64)
                if not -(1 << 31) <= value < (1 << 31):
                    raise _overflow(mod, r, value)
                size, packed = 4, struct.pack("<i", value)
            else:
                raise KernelError(errno.ENOEXEC,
                                  f"{mod.name}: Unknown rela relocation: {r.type}")
            if any(image[off:off + size]):
                raise KernelError(errno.ENOEXEC, f"{mod.name}: Invalid relocation target, "
                                                 f"existing value is nonzero for type {r.type}")
            image[off:off + size] = packed

    def _set_params(self, obj: ModuleObject, mod: Module, where: "_Placement",
                    params: tuple[str, ...]) -> None:
        """Write the parameters' values into their variables in the image."""
        def variable(name: str):
            for s in obj.symbols:
                if s.name == name and s.kind == "STT_OBJECT" and \
                        isinstance(s.shndx, int) and s.shndx in where.bases:
                    return where.bases[s.shndx] + s.value - mod.start, s.size
            return None

        def size_of(name: str) -> int | None:
            found = variable(name)
            return None if found is None else found[1]

        def store(name: str, data: bytes) -> None:
            off, _size = variable(name)
            mod.image[off:off + len(data)] = data
        apply_module_params(mod.name, params, obj.params, store, size_of)

    def _map(self, mod: Module, where: "_Placement") -> None:
        """Back the core area with fresh pages holding the image; text and read-only
        data mapped read-only, as with CONFIG_STRICT_MODULE_RWX."""
        mem = self.kernel.mem
        for va in range(mod.start, mod.end, PAGE):
            pa = mem.alloc_page()
            mod.pages.append((va, pa))
            mem.map_page(va, pa, writable=va >= where.rw_start)
        mem.write(mod.start, bytes(mod.image))
        self._drop_translations(mod)

    def _ftrace_init(self, obj: ModuleObject, mod: Module, where: "_Placement") -> None:
        """Check and NOP every `call __fentry__` site listed in __mcount_loc."""
        fentry = self.kernel.image.global_symbol("__fentry__")
        sites = []
        for sec in obj.sections.values():
            if sec.name == "__mcount_loc":
                raw = mod.read(where.bases[sec.index], sec.size)
                sites.extend(struct.unpack(f"<{sec.size // 8}Q", raw))
        for site in sites:
            insn = mod.read(site, 5) if mod.text_start <= site < mod.text_end else b""
            target = (site + 5 + struct.unpack("<i", insn[1:])[0]) & _U64 if insn else None
            if not insn or insn[0] != 0xE8 or target != fentry:
                raise KernelError(errno.ENOEXEC, f"{mod.name}: ftrace site {site:#x} "
                                                 "is not a call to __fentry__")
            self.kernel.mem.write(site, FENTRY_NOP)
        mod.ftrace_sites = tuple(sorted(sites))

    # ---- unload ---------------------------------------------------------------------------
    def unload(self, name: str) -> None:
        """Unload a live module: cleanup_module(), then GOING, then free it.
        KernelError: ENOENT (not loaded), EBUSY (loading, unloading, or no exit
        function)."""
        with self.kernel.lock:
            mod = self.get(name)
            if mod is None:
                raise KernelError(errno.ENOENT, f"module {name} is not loaded")
            if mod.state != MODULE_STATE_LIVE:
                raise KernelError(errno.EBUSY, f"module {mod.name} is {mod.state}")
            if mod.init is not None and mod.exit is None:
                raise KernelError(errno.EBUSY, f"module {mod.name} cannot be unloaded")
            if mod.refcount:
                raise KernelError(errno.EWOULDBLOCK, f"module {mod.name} is in use")
            mod.state = MODULE_STATE_GOING
            if mod.exit is not None:
                self.kernel.call_in_process(mod.exit, then=lambda _ret: self._going(mod))
            else:
                self._going(mod)

    def _going(self, mod: Module) -> None:
        """GOING, then freed (after exit has run, or a failed init)."""
        mod.state = MODULE_STATE_GOING
        self._notify(MODULE_STATE_GOING, mod)
        self.kernel.call_in_process("module_trace_free", mod.name)   # module:module_free
        self.kernel.image.remove_module(mod.name)
        self.modules.pop(mod.name, None)
        self._free(mod)
        log.info("module %s removed", mod.name)

    def _free(self, mod: Module) -> None:
        mem = self.kernel.mem
        self._drop_translations(mod)        # first: the pages must still translate
        for va, pa in mod.pages:
            mem.unmap_page(va)
            mem.free_page(pa)
        if mod.pages:
            mod.pages = []
            mem.flush_tlb()

    def _drop_translations(self, mod: Module) -> None:
        """Drops Unicorn's translated blocks of the module's text while it is mapped
        (Kernel.drop_translations: asked of an unmapped page, Unicorn would record a
        fault, and the third unload would stop the vCPU for good)."""
        self.kernel.drop_translations(mod.start, mod.end)


def _align(value: int, align: int) -> int:
    return (value + align - 1) // align * align


def _c_int(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & (1 << 31) else v


def _signed64(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


def _overflow(mod: Module, r: _Rela, value: int) -> KernelError:
    return KernelError(errno.ENOEXEC, f"{mod.name}: overflow in relocation type {r.type} "
                                      f"val {value & _U64:#x}")


@dataclass(frozen=True)
class _Placement:
    """Where a module's sections went: section index -> address, and the first address
    of its writable part."""

    bases: dict
    rw_start: int

    def function(self, obj: ModuleObject, name: str) -> int | None:
        """The address of a global function defined in the module, or None."""
        for s in obj.symbols:
            if s.name == name and s.bind == "STB_GLOBAL" and isinstance(s.shndx, int) \
                    and s.shndx in self.bases:
                return self.bases[s.shndx] + s.value
        return None
