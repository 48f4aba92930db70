"""ftrace's core, as far as kprobes, fprobes, the tracers and direct trampolines need it:
ftrace_ops with per-site filters, the site refcounts that decide when a call site is
patched to call the trampoline and when it goes back to a NOP, and direct calls
(register_ftrace_direct: a site that calls a trampoline of the kernel's own, alone or
after the ops' trampoline has run them).  Site patching is the arch's job."""

from __future__ import annotations

import errno
import functools
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ProbeError

__all__ = ["FtraceOps", "Ftrace"]


@dataclass(eq=False)
class FtraceOps:
    """struct ftrace_ops: ``func(ip, parent_ip, ops, regs)`` runs at every call of a
    function whose ftrace site is in ``filter``.  parent_ip (the traced function's return
    address) costs a register and a memory read, so it is passed only to ops that set
    ``want_parent_ip``; the others get 0."""

    func: Callable
    filter: set = field(default_factory=set)
    private: object = None
    registered: bool = False
    want_parent_ip: bool = False
    #: Optional site_func(site) -> f(regs): a callback specialized for one site, used
    #: when this ops is the site's only user (the hot path of ftrace-based kprobes).
    site_func: Callable | None = None
    #: Optional site_native(site) -> (handler, argument) | None: kernel code the site's
    #: trampoline may call instead (``handler(argument, struct pt_regs *)``), when this
    #: ops is the site's only user.
    site_native: Callable | None = None


class Ftrace:
    """The registered ops and the state of every site."""

    def __init__(self, arch, sites):
        self.arch = arch
        self.sites = frozenset(sites)
        self._site_ops: dict[int, list[FtraceOps]] = {}
        #: Direct calls: site -> the kernel trampoline it calls (register_ftrace_direct).
        self.direct: dict[int, int] = {}
        #: The ``kernel.ftrace_enabled`` sysctl (proc_dointvec: any int, non-zero is on).
        self.ftrace_enabled_value = 1

    @property
    def ftrace_enabled(self) -> bool:
        return bool(self.ftrace_enabled_value)

    def set_ftrace_enabled(self, value: int) -> None:
        """Write ``kernel.ftrace_enabled``.  Turning it off puts every site back to a NOP
        (ftrace_shutdown_sysctl: ops stay registered, kprobes on ftrace sites included,
        and nothing they filter is called); turning it on patches the sites of every
        registered ops again.  Caller holds the text lock (runs inside a hypercall)."""
        was = self.ftrace_enabled
        self.ftrace_enabled_value = value
        if self.ftrace_enabled == was:
            return
        for site in sorted(self._site_ops.keys() | self.direct.keys()):
            if self.ftrace_enabled:
                self._patch(site)
            else:
                self.arch.ftrace_make_nop(site)

    def is_ftrace_location(self, addr: int) -> bool:
        return addr in self.sites

    def add_sites(self, sites) -> None:
        """A module came (ftrace_module_init): its sites are ftrace locations now."""
        self.sites = self.sites | frozenset(sites)

    def remove_sites(self, sites) -> None:
        """A module is going (ftrace_release_mod): every ops lets go of its sites, which
        are then forgotten.  Caller runs this while the module's text is still mapped."""
        gone = frozenset(sites) & self.sites
        for site in sorted(gone):
            for ops in list(self._site_ops.get(site, ())):
                self._detach(ops, site)
                ops.filter.discard(site)
            if site in self.direct:
                self.unregister_ftrace_direct(site, self.direct[site])
        self.sites = self.sites - gone

    def _site_func(self, site: int):
        """What the site's trampoline calls with regs: the one ops' func directly when
        it is alone (the common case, kept cheap), else the list walk."""
        users = self._site_ops[site]
        if len(users) == 1 and not users[0].want_parent_ip:
            if users[0].site_func is not None:
                return users[0].site_func(site)
            return functools.partial(users[0].func, site, 0, users[0])
        return functools.partial(self.dispatch, site)

    def _site_native(self, site: int):
        """The kernel handler the site's trampoline calls, or None (the host's func)."""
        users = self._site_ops[site]
        if len(users) == 1 and users[0].site_native is not None:
            return users[0].site_native(site)
        return None

    def _patch(self, site: int, was_patched: bool = False) -> None:
        """Make ``site`` call what its users want: the ops' trampoline (which goes on to
        the direct trampoline, if any, instead of returning), the direct trampoline
        alone, or nothing.  ``was_patched``: the site calls something now."""
        direct = self.direct.get(site)
        if site in self._site_ops:
            func, native = self._site_func(site), self._site_native(site)
            if was_patched:
                self.arch.ftrace_update_call(site, func, native, direct)
            else:
                self.arch.ftrace_make_call(site, func, native, direct)
        elif direct is not None:
            self.arch.ftrace_make_direct(site, direct)
        elif was_patched:
            self.arch.ftrace_make_nop(site)

    def _attach(self, ops: FtraceOps, site: int) -> None:
        users = self._site_ops.setdefault(site, [])
        users.append(ops)
        if not self.ftrace_enabled:
            return
        self._patch(site, was_patched=len(users) > 1 or site in self.direct)

    def refresh_site(self, site: int) -> None:
        """The users of ``site``, or what they want it to call, changed."""
        if site in self._site_ops and self.ftrace_enabled:
            self._patch(site, was_patched=True)

    def _detach(self, ops: FtraceOps, site: int) -> None:
        users = self._site_ops.get(site)
        if not users or ops not in users:
            return
        users.remove(ops)
        if not users:
            del self._site_ops[site]
        if self.ftrace_enabled:
            self._patch(site, was_patched=True)

    def register_ftrace_direct(self, ip: int, addr: int) -> None:
        """Make the ftrace site ``ip`` call the kernel trampoline ``addr`` (6.1's
        register_ftrace_direct): ENODEV when ``ip`` is no ftrace location, EBUSY when
        the site has a direct call already."""
        if ip not in self.sites:
            raise ProbeError(errno.ENODEV, f"{ip:#x} is not an ftrace location")
        if ip in self.direct:
            raise ProbeError(errno.EBUSY, f"{ip:#x} has a direct call")
        was_patched = ip in self._site_ops
        self.direct[ip] = addr
        if self.ftrace_enabled:
            self._patch(ip, was_patched)

    def unregister_ftrace_direct(self, ip: int, addr: int) -> None:
        """Undo register_ftrace_direct (ENODEV: no such direct call)."""
        if self.direct.get(ip) != addr:
            raise ProbeError(errno.ENODEV, f"{ip:#x} has no direct call to {addr:#x}")
        del self.direct[ip]
        if self.ftrace_enabled:
            self._patch(ip, was_patched=True)

    def register_ftrace_function(self, ops: FtraceOps) -> None:
        if ops.registered:
            raise ProbeError(errno.EBUSY, "ftrace_ops already registered")
        for site in ops.filter:
            if site not in self.sites:
                raise ProbeError(errno.EINVAL, f"{site:#x} is not an ftrace location")
        for site in sorted(ops.filter):
            self._attach(ops, site)
        ops.registered = True

    def unregister_ftrace_function(self, ops: FtraceOps) -> None:
        if not ops.registered:
            raise ProbeError(errno.EINVAL, "ftrace_ops not registered")
        for site in sorted(ops.filter):
            self._detach(ops, site)
        ops.registered = False

    def ftrace_set_filter_ip(self, ops: FtraceOps, ip: int, remove: bool = False) -> None:
        """Add (or remove) one site to ops' filter, patching it now if ops is live."""
        if ip not in self.sites:
            raise ProbeError(errno.ENOENT, f"{ip:#x} is not an ftrace location")
        if remove:
            if ip in ops.filter:
                ops.filter.discard(ip)
                if ops.registered:
                    self._detach(ops, ip)
        elif ip not in ops.filter:
            ops.filter.add(ip)
            if ops.registered:
                self._attach(ops, ip)

    def dispatch(self, site: int, regs) -> None:
        """Called from the site's trampoline: run every ops that filters this site."""
        users = self._site_ops.get(site)
        if not users:
            return
        parent = 0
        if any(ops.want_parent_ip for ops in users):
            parent = int.from_bytes(regs.read_memory(regs.sp, 8), "little")
        for ops in tuple(users):
            ops.func(site, parent if ops.want_parent_ip else 0, ops, regs)

    def enabled_sites(self) -> dict[int, int]:
        """Site -> number of ops attached (enabled_functions); a direct call counts
        as one, as its ops does in Linux."""
        out = {site: len(ops) for site, ops in self._site_ops.items()}
        for site in self.direct:
            out[site] = out.get(site, 0) + 1
        return out
