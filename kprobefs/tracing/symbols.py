"""kallsyms of the emulated kernel, as the tracer asks about it: resolution for the
parser, the notrace rule, symbolization for the output, the ftrace sites."""

from __future__ import annotations

import hashlib
from bisect import bisect_left

from kprobefs.tracing.events.probe_parser import ProbeSpec

__all__ = ["KernelSymbols"]

_U64 = (1 << 64) - 1


class KernelSymbols:
    """kallsyms of the emulated kernel for the parser
    (:class:`probe_parser.SymbolResolver`), plus the notrace rule and symbolization for
    the output.

    ``image`` is the kernel image (``lookup_name``, ``symbol_at``, ``ftrace_sites``);
    ``pointer_key`` seeds the per-boot ``%p`` hash.
    """

    def __init__(self, image, pointer_key: bytes = b"kprobefs"):
        self.image = image
        self._key = hashlib.blake2b(pointer_key, digest_size=16).digest()
        self._sites_seen = None
        self._sites_sorted: tuple[int, ...] = ()

    @property
    def _sites(self) -> tuple[int, ...]:
        """The ftrace sites, sorted; re-read when the image's set changes (module
        sites come and go with their modules)."""
        sites = getattr(self.image, "ftrace_sites", ()) or ()
        if sites is not self._sites_seen:
            self._sites_seen, self._sites_sorted = sites, tuple(sorted(sites))
        return self._sites_sorted

    # probe_parser.SymbolResolver
    def lookup(self, name: str) -> list[int]:
        # MOD:SYM looks in that module only; [] while it is not loaded (the image's rule).
        return [s.addr for s in self.image.lookup_name(name)]

    def module_loaded(self, name: str) -> bool:
        """Return True when module ``name`` is loaded (find_module)."""
        return name in (getattr(self.image, "modules", None) or {})

    def find_symbol(self, addr: int):
        sym = self.image.symbol_at(addr)
        if sym is None:
            return None
        return sym.name, addr - sym.addr, sym.size

    def hash_pointer(self, addr: int) -> int:
        digest = hashlib.blake2b((addr & _U64).to_bytes(8, "little"), key=self._key,
                                 digest_size=4).digest()
        return int.from_bytes(digest, "little")

    # the trace layer's own questions
    def address_of(self, spec: ProbeSpec) -> int | None:
        """Return the probed address of ``spec`` (``kallsyms_lookup_name + offset``), or
        ``None`` when the symbol does not resolve (yet)."""
        if spec.symbol is None:
            return spec.address
        found = self.lookup(spec.symbol_text)
        return (found[0] + spec.offset) & _U64 if found else None

    def has_ftrace_site(self, start: int, end: int) -> bool:
        """Return True when an ftrace site lies in ``[start, end)``."""
        i = bisect_left(self._sites, start)
        return i < len(self._sites) and self._sites[i] < end

    def within_notrace(self, addr: int | None) -> bool:
        """The notrace rule (§8.2 step 2): True when the function containing ``addr`` has
        no ftrace site (for ``foo.cold``-style pieces, nor has ``foo``)."""
        if not addr:
            return False
        sym = self.image.symbol_at(addr)
        if sym is None:
            return False
        if self.has_ftrace_site(sym.addr, sym.addr + max(sym.size, 1)):
            return False
        base, dot, _ = sym.name.partition(".")
        if not dot:
            return True
        found = self.lookup(base)
        if found:
            base_sym = self.image.symbol_at(found[0])
            if base_sym is not None:
                return not self.has_ftrace_site(base_sym.addr,
                                                base_sym.addr + max(base_sym.size, 1))
        return True

    def modules_token(self) -> object:
        """What symbolize's answers depend on beyond the kernel's own symbols: the
        image's loaded modules (a new dict at each load and unload), compared with
        ``==``."""
        return getattr(self.image, "modules", None)

    def symbolize(self, addr: int, offset: bool = True) -> str | None:
        """Return ``sym+0xoff/0xsize`` (`` [mod]`` added inside a module), or ``sym``
        without ``offset``; ``None`` if no symbol covers ``addr``."""
        sym = self.image.symbol_at(addr)
        if sym is None:
            return None
        if not offset:
            return sym.name
        text = f"{sym.name}+0x{addr - sym.addr:x}/0x{sym.size:x}"
        module = getattr(sym, "module", None)
        return f"{text} [{module}]" if module else text     # sprint_symbol's " [mod]"

    def is_text(self, addr: int) -> bool:
        sym = self.image.symbol_at(addr)
        return sym is not None and sym.type in "Tt"

    def ftrace_site_names(self) -> list[tuple[int, str]]:
        """Return (site, function) for each ftrace site, in address order."""
        out = []
        for site in self._sites:
            sym = self.image.symbol_at(site)
            if sym is not None:
                out.append((site, sym.name))
        return out

    def ftrace_functions(self) -> list[str]:
        """Return the function of each ftrace site, in address order, as
        available_filter_functions names it (``name [module]`` in a module)."""
        out = []
        for site in self._sites:
            sym = self.image.symbol_at(site)
            if sym is not None:
                module = getattr(sym, "module", None)
                out.append(f"{sym.name} [{module}]" if module else sym.name)
        return out
