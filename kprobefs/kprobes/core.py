"""The generic kprobes engine: Linux's kernel/kprobes.c in Python.

It keeps the table of probed addresses (one aggregate per address holding every probe
registered there), arms and disarms them through the arch implementation it is given,
runs the handlers, counts misses, owns the global arm switch and the optimization sysctl
with the delayed optimizer queue, runs kretprobe instances and jprobes, and produces the
data behind ``kprobes/list`` and ``kprobes/blacklist``.  It never looks at instruction
bytes: that is the arch's business.
"""

from __future__ import annotations

import bisect
import errno
import struct
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from ..errors import ProbeError
from .faults import TRAP_BP, TRAP_DB, HandlerErrorLog
from .ftrace import Ftrace, FtraceOps
from .kretprobe_native import KretprobeNatives
from .probes import (
    KPROBE_FLAG_DISABLED, KPROBE_FLAG_FTRACE, KPROBE_FLAG_GONE, KPROBE_FLAG_OPTIMIZED,
    KRETPROBE_MAX_DATA_SIZE, MAX_STACK_SIZE, Jprobe, Kprobe, Kretprobe, KretprobeInstance,
)

__all__ = ["KprobeEngine", "KprobeCtlblk", "ListEntry", "OPTIMIZE_DELAY"]

#: The optimizer runs this long after a probe is queued (5 jiffies at HZ=250).
OPTIMIZE_DELAY = 0.020
#: The most bytes an optimized probe's jump can cover: the 5-byte jump's region, ending
#: on an instruction boundary (at most 4 bytes and one whole 15-byte instruction).
OPTIMIZED_REGION = 5 + 15
#: Functions a return probe must not hook (Linux's kretprobe_blacklist on x86).
KRETPROBE_BLACKLIST = ("__switch_to",)
#: A child that must not run.
_SKIP = KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE
#: Module states, as the machine's module notifier chain names them.
_MODULE_COMING, _MODULE_GOING = "coming", "going"


class KprobeCtlblk:
    """Per-CPU kprobe state: the probe whose handler runs and what stage it is in."""

    __slots__ = ("current", "status", "_saved")

    def __init__(self):
        self.current = None
        self.status = None
        self._saved: list = []

    def reset(self) -> None:
        self.current = None
        self.status = None

    def push(self) -> None:
        """Save the state of the probe being handled before handling a nested hit."""
        self._saved.append((self.current, self.status))

    def pop(self) -> None:
        self.current, self.status = self._saved.pop()


class AggrKprobe(Kprobe):
    """The probe that stands in the table for every probe at one address.

    Its ``native`` is what its detour, ftrace trampoline or int3 stub calls in the
    kernel: the enabled child's own native handler when that is the only one, the
    kernel's aggregate handler over a list of them when every enabled child has one, or
    ``None`` (the host runs the handlers).  The engine keeps it current.

    A child's handler that raises is reported to ``fault(child, regs, trapnr, exc)``
    and the other children still run.  ``running`` is the child whose handler runs
    (Linux's kprobe_instance), for a fault the CPU takes meanwhile.
    """

    def __init__(self, addr: int, symbol, flags: int, fault: Callable):
        super().__init__(addr=addr, flags=flags)
        self.symbol = symbol
        self._fault = fault
        self.children: list[Kprobe] = []
        self.detour = None            # the arch's Detour once optimized (or queued)
        self.native_slot = None       # its struct kprobe_native_aggr, if it uses one
        self.armed = False
        self.active: tuple = ()
        self.running: Kprobe | None = None
        self.pre_handler = self._aggr_pre_handler
        self.fault_handler = None

    def update_post_handler(self) -> None:
        """Recompute the handlers after a child is added, removed, enabled or disabled."""
        has_post = any(c.post_handler is not None for c in self.children)
        self.post_handler = self._aggr_post_handler if has_post else None
        self.active = tuple(c for c in self.children if c.pre_handler is not None)

    def add_child(self, p: Kprobe) -> None:
        """update_post_handler after p joined, without a pass over the others (one
        probe more at an address that has thousands costs the same as the first)."""
        self.children.append(p)
        if p.post_handler is not None:
            self.post_handler = self._aggr_post_handler
        if p.pre_handler is not None:
            self.active += (p,)

    def drop_child(self, p: Kprobe) -> None:
        """update_post_handler after p, which had no post-handler, left."""
        if p in self.active:
            active = list(self.active)
            active.remove(p)
            self.active = tuple(active)

    def all_disabled(self) -> bool:
        return all(c.is_disabled() for c in self.children)

    def _aggr_pre_handler(self, _p, regs) -> int:
        for child in self.active:
            if child.flags & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE):
                continue
            self.running = child
            try:
                if child.pre_handler(child, regs):
                    return 1
            except Exception as e:
                self._fault(child, regs, TRAP_BP, e)
            finally:
                self.running = None
        return 0

    def _aggr_post_handler(self, _p, regs, flags) -> None:
        for child in self.children:
            if child.is_disabled() or child.post_handler is None:
                continue
            self.running = child
            try:
                child.post_handler(child, regs, flags)
            except Exception as e:
                self._fault(child, regs, TRAP_DB, e)
            finally:
                self.running = None


class _NativeAggrs:
    """The kernel's struct kprobe_native_aggr slots (kernel/kprobes_native.c): the list
    of native handlers an address with several probes calls."""

    def __init__(self, kernel):
        img = kernel.image
        self.handler = img.symbol_value("kprobe_native_aggr_handler")
        base = img.symbol_value("kprobe_native_aggrs")
        layout = img.symbol_value("kprobe_native_aggr_layout")
        self._kernel = kernel
        self._free: list[int] = []
        self.max = 0
        if self.handler is not None and base is not None and layout is not None:
            size, self.max, count = struct.unpack("<3Q", kernel.read(layout, 24))
            self._free = [base + i * size for i in range(count - 1, -1, -1)]

    def get(self) -> int | None:
        """A free slot, or ``None``."""
        return self._free.pop() if self._free else None

    def put(self, slot: int | None) -> None:
        if slot is not None:
            self._free.append(slot)

    def write(self, slot: int, natives: list) -> tuple[int, int]:
        """Fill ``slot`` with ``natives`` and return the (handler, argument) calling it."""
        self._kernel.write(slot, struct.pack(f"<Q{2 * len(natives)}Q", len(natives),
                                             *(v for pair in natives for v in pair)))
        return self.handler, slot


def _where(p: Kprobe) -> str:
    sym = p.symbol
    if sym is None or p.addr is None:
        return f"{p.addr or 0:#x}"
    return f"{sym.name}+{p.addr - sym.addr:#x}"


@dataclass(frozen=True)
class ListEntry:
    """One line of kprobes/list.  ``symbol`` is None when no symbol covers the address
    any more (a probe on an unloaded module): the line then shows the address as %pS."""

    addr: int
    kind: str
    symbol: str | None
    offset: int
    module: str | None
    gone: bool
    disabled: bool
    optimized: bool
    ftrace: bool

    def format(self) -> str:
        flags = ("[GONE]" if self.gone else "") + ("[DISABLED]" if self.disabled else "") \
            + ("[OPTIMIZED]" if self.optimized else "") + ("[FTRACE]" if self.ftrace else "")
        if self.symbol is None:
            return f"{self.addr:016x}  {self.kind}  0x{self.addr:x} {flags}"
        return (f"{self.addr:016x}  {self.kind}  {self.symbol}+{self.offset:#x}  "
                f"{self.module or ' '} {flags}")


class KprobeEngine:
    """The kprobes registry and runtime for one kernel, with its arch implementation
    made by ``arch_factory(kernel, engine)`` (the daemon passes the x86 one)."""

    def __init__(self, kernel, arch_factory: Callable):
        self.kernel = kernel
        self.image = kernel.image
        self.kprobe_ctlblks = [KprobeCtlblk() for _ in range(kernel.nr_cpus)]
        self._kret_natives = KretprobeNatives(kernel)
        # The arch's hook at the kernel's native return trampoline calls this.
        self.kretprobe_native_return = self._native_return_handler()
        self.arch = arch_factory(kernel, self)
        self.ftrace = Ftrace(self.arch, self.image.ftrace_sites)
        self._table: dict[int, AggrKprobe] = {}
        self._order: dict[Kprobe, None] = {}    # registration order, for listings
        self.kprobes_all_disarmed = False
        self.optimization_enabled = True
        # Queued for the optimizer, in queueing order (so by due time): ap -> due time.
        self._optimizing: dict[AggrKprobe, float] = {}
        # Pending returns by the stack slot whose return address was replaced: a live
        # slot belongs to one task's stack and one call, so the trampoline finds its
        # instance without asking which task is current.
        self._instances: dict[int, KretprobeInstance] = {}
        self._native_aggrs = _NativeAggrs(kernel)
        # Called on every kretprobe or jprobe hit: bound once.
        self._current_task = kernel.current_task
        self._prepare_kretprobe = self.arch.prepare_kretprobe
        # (A jprobe's stack copy is one slice of RAM when it lies in one page.)
        self._jprobe_machine = (kernel.save_cpu_state, kernel.restore_cpu_state,
                                kernel.entry_arguments, kernel.mem.ram, kernel.mem.translate,
                                kernel.mem.direct_map, kernel.reg_writes)
        self.handler_errors = HandlerErrorLog()
        self._kprobe_ftrace_ops = FtraceOps(func=self._kprobe_ftrace_handler,
                                            site_func=self._kprobe_ftrace_site_handler,
                                            site_native=self._kprobe_ftrace_native)
        self._blacklist = sorted((s.addr, s.end, s.name) for s in self.image.blacklist)
        self._blacklist_starts = [b[0] for b in self._blacklist]
        self.fprobes = None  # set by FprobeManager
        add_hypercall = getattr(kernel, "add_hypercall", None)
        if add_hypercall is not None:
            add_hypercall("FTRACE_DIRECT", self._hc_ftrace_direct)
        kernel.exit_listeners.append(self._flush_task_instances)
        kernel.tick_listeners.append(self.run_optimizer)
        modules = getattr(kernel, "modules", None)
        if modules is not None:
            # Before other notifiers: a tracer registering probes on a coming module
            # needs its ftrace sites known here first.
            modules.register_module_notifier(self._module_notify, priority=100)

    def _hc_ftrace_direct(self, register: int, ip: int, addr: int, *_args) -> int:
        """HC_FTRACE_DIRECT: the kernel's register_ftrace_direct (``register`` = 1) or
        unregister_ftrace_direct; 0 or -errno."""
        try:
            if register:
                self.ftrace.register_ftrace_direct(ip, addr)
            else:
                self.ftrace.unregister_ftrace_direct(ip, addr)
        except ProbeError as e:
            return -e.errno
        return 0

    # ==== the interface the arch calls =======================================================
    def get_kprobe(self, addr: int) -> AggrKprobe | None:
        return self._table.get(addr)

    def kprobe_ctlblk(self, cpu: int) -> KprobeCtlblk:
        return self.kprobe_ctlblks[cpu]

    def kprobe_running(self, cpu: int) -> bool:
        return self.kprobe_ctlblks[cpu].current is not None

    def kprobes_inc_nmissed_count(self, p: Kprobe) -> None:
        if isinstance(p, AggrKprobe):
            for child in p.children:
                child.nmissed += 1
        else:
            p.nmissed += 1

    def handle_fault(self, p: Kprobe, regs, trapnr: int, exc: Exception | None = None
                     ) -> None:
        """p's handler raised ``exc`` in trap ``trapnr``, or (``exc`` None) the CPU took
        fault ``trapnr`` while it ran: p's fault_handler gets its chance (kprobes.txt),
        and unless it takes the fault, p counts a miss and the failure is logged
        (rate-limited per probe).  The kernel goes on either way.  An aggregate stands
        for the child whose handler runs (its only active child, on the fast paths)."""
        if isinstance(p, AggrKprobe):
            p = p.running or (p.active[0] if len(p.active) == 1 else p)
        if p.fault_handler is not None:
            try:
                if p.fault_handler(p, regs, trapnr):
                    return
            except Exception as e:
                self.handler_errors.report(p, "fault_handler",
                                           f"fault_handler of probe at {_where(p)}", e)
        p.nmissed += 1
        what = f"handler of probe at {_where(p)}"
        self.handler_errors.report(
            p, "handler", f"{what} (trap {trapnr})" if exc is not None
            else f"{what} took fault {trapnr}", exc)

    # ==== address resolution and safety checks ==============================================
    def _resolve(self, symbol_name: str | None, addr: int | None, offset: int):
        """(address, containing Symbol) for a probe spec, as _kprobe_addr() does."""
        if (symbol_name is None) == (addr is None):
            raise ProbeError(errno.EINVAL, "give exactly one of symbol_name and addr")
        if symbol_name is not None:
            syms = self.image.lookup_name(symbol_name)
            if not syms:
                raise ProbeError(errno.ENOENT, f"unknown symbol {symbol_name}")
            addr = syms[0].addr
        addr = (addr + (offset or 0)) & 0xFFFFFFFFFFFFFFFF
        sym = self.image.symbol_at(addr)
        if sym is None:
            raise ProbeError(errno.ENOENT, f"no symbol contains {addr:#x}")
        return addr, sym

    def within_kprobe_blacklist(self, addr: int) -> bool:
        i = bisect.bisect_right(self._blacklist_starts, addr) - 1
        return i >= 0 and addr < self._blacklist[i][1]

    def _check_address_safe(self, addr: int, sym) -> None:
        img = self.image
        if not img.is_kernel_text(addr) or not sym.is_text:
            raise ProbeError(errno.EINVAL, f"{addr:#x} is not kernel text")
        mod = img.module_at(addr) if sym.module else None
        if mod is not None and getattr(mod, "state", None) == _MODULE_GOING:
            raise ProbeError(errno.ENOENT, f"module {mod.name} is being unloaded")
        if self.within_kprobe_blacklist(addr):
            raise ProbeError(errno.EINVAL, f"{sym.name} is blacklisted for kprobes")
        labels = getattr(self.kernel, "jump_labels", None)
        if labels is not None and labels.is_site(addr, addr + 1):
            # jump_label_text_reserved: text_poke rewrites the site when its key flips.
            raise ProbeError(errno.EINVAL, f"{addr:#x} is a static branch (jump label)")
        base = sym.name.split(".")[0]
        if base != sym.name and any(self.within_kprobe_blacklist(s.addr)
                                    for s in img.lookup_name(base)):
            raise ProbeError(errno.EINVAL, f"{sym.name} belongs to blacklisted {base}")

    # ==== register / unregister ===============================================================
    def register_kprobe(self, p: Kprobe) -> None:
        """Register p (kprobes.txt 4.1).  Raises ProbeError with Linux's errno."""
        if p.registered:
            raise ProbeError(errno.EINVAL, "kprobe already registered")
        addr, sym = self._resolve(p.symbol_name, p.addr, p.offset)
        self._check_address_safe(addr, sym)
        p.addr, p.symbol = addr, sym
        p.flags &= KPROBE_FLAG_DISABLED
        ftrace = self.ftrace.is_ftrace_location(addr)
        if ftrace:
            p.flags |= KPROBE_FLAG_FTRACE
        ap = self._table.get(addr)
        if ap is not None:
            self._register_aggr(ap, p)
        else:
            ap = AggrKprobe(addr, sym, KPROBE_FLAG_FTRACE if ftrace else 0,
                            self.handle_fault)
            if not ftrace:
                # Arming a probe inside an optimized probe's jump needs its bytes back.
                self._unoptimize_covering(addr)
                ap.ainsn = self.arch.prepare(ap, sym)
            ap.children.append(p)
            ap.update_post_handler()
            ap.native = self._native_of(ap)
            self._table[addr] = ap
            if not p.is_disabled() and not self.kprobes_all_disarmed:
                self._arm(ap)
        p.registered = True
        self._order[p] = None
        self._try_to_optimize(ap)

    def _register_aggr(self, ap: AggrKprobe, p: Kprobe) -> None:
        if p.kind == "j" and any(c.kind == "j" for c in ap.children):
            raise ProbeError(errno.EEXIST, "a jprobe is already registered at this address")
        if p.post_handler is not None or p.kind == "j":
            self._unoptimize(ap)
        ap.add_child(p)
        if not p.is_disabled():
            if not ap.armed and not self.kprobes_all_disarmed:
                self._arm(ap)
        elif p.post_handler is None:
            return      # what the kernel calls here is what it was (see _native_of)
        self._sync_native(ap)

    def unregister_kprobe(self, p: Kprobe) -> None:
        ap = self._table.get(p.addr) if p.registered else None
        if ap is None or p not in ap.children:
            return
        ap.children.remove(p)
        p.registered = False
        del self._order[p]
        if ap.children:
            if p.post_handler is None and p.is_disabled() and p.kind != "j":
                # A disabled probe's going changes neither the handlers, nor what the
                # kernel calls (see _register_aggr), nor whether the jump can be used.
                ap.drop_child(p)
                return
            ap.update_post_handler()
            if ap.armed and ap.all_disabled():
                self._disarm(ap)
            self._sync_native(ap)
            self._try_to_optimize(ap)
            return
        self._disarm(ap)
        self._native_aggrs.put(ap.native_slot)
        ap.native_slot = ap.native = None
        if ap.detour is not None:
            self.arch.free_optimized(ap.detour)
            ap.detour = None
        if not ap.is_ftrace():
            self.arch.remove(ap)
        del self._table[ap.addr]

    @staticmethod
    def _register_batch(register, unregister, probes: Iterable) -> None:
        """register_*probes(): all or nothing; on the first failure the ones already
        registered are unregistered and the error is raised."""
        done = []
        try:
            for p in probes:
                register(p)
                done.append(p)
        except ProbeError:
            for p in done:
                unregister(p)
            raise

    def register_kprobes(self, probes: Iterable[Kprobe]) -> None:
        self._register_batch(self.register_kprobe, self.unregister_kprobe, probes)

    def unregister_kprobes(self, probes: Iterable[Kprobe]) -> None:
        for p in list(probes):
            self.unregister_kprobe(p)

    # ==== enable / disable, arm / disarm ======================================================
    def disable_kprobe(self, p: Kprobe) -> None:
        ap = self._table.get(p.addr) if p.registered else None
        if ap is None:
            raise ProbeError(errno.EINVAL, "kprobe not registered")
        if p.is_disabled():
            return
        p.flags |= KPROBE_FLAG_DISABLED
        if ap.all_disabled():
            self._disarm(ap)
        self._sync_native(ap)

    def enable_kprobe(self, p: Kprobe) -> None:
        ap = self._table.get(p.addr) if p.registered else None
        if ap is None or p.is_gone():
            raise ProbeError(errno.EINVAL, "kprobe not registered or gone")
        if not p.flags & KPROBE_FLAG_DISABLED:
            return
        p.flags &= ~KPROBE_FLAG_DISABLED
        self._sync_native(ap)
        if not ap.armed and not self.kprobes_all_disarmed:
            self._arm(ap)
            self._try_to_optimize(ap)

    def _arm(self, ap: AggrKprobe) -> None:
        if ap.armed:
            return
        if ap.is_ftrace():
            self.ftrace.ftrace_set_filter_ip(self._kprobe_ftrace_ops, ap.addr)
            if not self._kprobe_ftrace_ops.registered:
                self.ftrace.register_ftrace_function(self._kprobe_ftrace_ops)
        else:
            self._unoptimize_covering(ap.addr)
            self.arch.arm(ap)
        ap.armed = True

    def _disarm(self, ap: AggrKprobe) -> None:
        if not ap.armed:
            return
        self._unoptimize(ap)
        if ap.is_ftrace():
            self.ftrace.ftrace_set_filter_ip(self._kprobe_ftrace_ops, ap.addr, remove=True)
        else:
            self.arch.disarm(ap)
        ap.armed = False

    def arm_all_kprobes(self) -> None:
        """`echo 1 > kprobes/enabled`."""
        if not self.kprobes_all_disarmed:
            return
        self.kprobes_all_disarmed = False
        for ap in list(self._table.values()):
            if not ap.all_disabled():
                self._arm(ap)
                self._try_to_optimize(ap)

    def disarm_all_kprobes(self) -> None:
        """`echo 0 > kprobes/enabled`: no probe fires; each keeps its own state."""
        if self.kprobes_all_disarmed:
            return
        self.kprobes_all_disarmed = True
        for ap in list(self._table.values()):
            self._disarm(ap)

    # ==== jump optimization ===================================================================
    def _optimizable(self, ap: AggrKprobe) -> bool:
        # kprobes.txt 5: a probepoint with a jprobe or a post_handler is not optimized.
        return (self.optimization_enabled and not self.kprobes_all_disarmed and ap.armed
                and not ap.is_ftrace() and ap.post_handler is None
                and not any(c.kind == "j" for c in ap.children) and not ap.all_disabled())

    def _armed_in_region(self, addr: int, size: int = OPTIMIZED_REGION) -> list[int]:
        table = self._table
        return [a for a in range(addr + 1, addr + size)
                if (ap := table.get(a)) is not None and ap.armed]

    def _try_to_optimize(self, ap: AggrKprobe) -> None:
        if ap.detour is not None or not self._optimizable(ap):
            return
        op = self.arch.prepare_optimized(ap, ap.symbol, self._armed_in_region(ap.addr))
        if op is None:
            return
        ap.detour = op
        ap.flags |= KPROBE_FLAG_OPTIMIZED
        self._optimizing[ap] = time.monotonic() + OPTIMIZE_DELAY

    def _unoptimize(self, ap: AggrKprobe) -> None:
        if ap.detour is None:
            return
        self._optimizing.pop(ap, None)
        self.arch.free_optimized(ap.detour)
        ap.detour = None
        ap.flags &= ~KPROBE_FLAG_OPTIMIZED

    def _sync_native(self, ap: AggrKprobe) -> None:
        """Recompute ap's native handler after its probes changed, and make its detour
        or ftrace trampoline call that."""
        ap.native = self._native_of(ap)
        if ap.is_ftrace():
            if ap.armed:
                self.ftrace.refresh_site(ap.addr)
        elif ap.detour is not None and ap.detour.native != ap.native:
            self._unoptimize(ap)
            self._try_to_optimize(ap)

    def _native_handler(self, p: Kprobe) -> tuple[int, int] | None:
        """p's own native handler, else, for a return probe's kprobe, the kernel's
        kretprobe entry when it has one (kretprobe_native.py)."""
        if p.native is not None or p.kind != "r":
            return p.native
        rp = p.owner
        return (self._kret_natives.entry, rp.native_at) if rp.native_at else None

    def _native_of(self, ap: AggrKprobe) -> tuple[int, int] | None:
        """ap's native handler (see AggrKprobe), taking or giving back its slot."""
        aggrs = self._native_aggrs
        natives = []
        if ap.post_handler is None and not ap.is_gone():
            for c in ap.children:       # up to the first that rules the kernel out
                if c.is_disabled():
                    continue
                native = self._native_handler(c)
                natives.append(native)
                if native is None or len(natives) > aggrs.max:
                    break
        usable = bool(natives) and None not in natives
        if not usable or len(natives) == 1 or len(natives) > aggrs.max:
            aggrs.put(ap.native_slot)
            ap.native_slot = None
            return natives[0] if usable and len(natives) == 1 else None
        if ap.native_slot is None:
            ap.native_slot = aggrs.get()
            if ap.native_slot is None:
                return None             # every slot is taken: the host runs them
        return aggrs.write(ap.native_slot, natives)

    def _kprobe_ftrace_native(self, site: int) -> tuple[int, int] | None:
        ap = self._table.get(site)
        return ap.native if ap is not None else None

    @property
    def pt_regs_fields(self) -> tuple[str, ...]:
        """The arch's struct pt_regs, field by field: what a native handler reads."""
        return self.arch.pt_regs_fields

    def refresh_kprobe(self, p: Kprobe) -> None:
        """p's ``native`` handler changed: make its detour (if any) call the new one."""
        ap = self._table.get(p.addr) if p.registered else None
        if ap is not None and p in ap.children:
            self._sync_native(ap)

    def _unoptimize_covering(self, addr: int) -> None:
        """Force-unoptimize any optimized probe whose jump covers addr (only probes
        less than OPTIMIZED_REGION bytes before it can)."""
        table = self._table
        for a in range(addr - OPTIMIZED_REGION + 1, addr):
            ap = table.get(a)
            if ap is not None and ap.detour is not None and addr < a + ap.detour.plan.size:
                self._unoptimize(ap)

    def run_optimizer(self, force: bool = False) -> None:
        """The delayed optimizer: patch every queued probe whose delay has passed."""
        queue = self._optimizing
        if not queue:
            return
        now = time.monotonic()
        due = []
        for ap, t in queue.items():         # in due order: stop at the first not due
            if not force and t > now:
                break
            due.append(ap)
        if not due:
            return
        for ap in due:
            del queue[ap]
        for ap in due:
            if ap.detour is not None and self._table.get(ap.addr) is ap and ap.armed:
                self.arch.optimize(ap.detour)

    def wait_for_kprobe_optimizer(self) -> None:
        self.run_optimizer(force=True)

    def set_optimization(self, enabled: bool) -> None:
        """/proc/sys/debug/kprobes-optimization (Appendix B)."""
        if enabled == self.optimization_enabled:
            return
        self.optimization_enabled = enabled
        for ap in list(self._table.values()):
            if enabled:
                self._try_to_optimize(ap)
            else:
                self._unoptimize(ap)

    # ==== ftrace-based probes =================================================================
    def _kprobe_ftrace_handler(self, site: int, _parent_ip: int, _ops, regs) -> None:
        ap = self._table.get(site)
        if ap is None or not ap.armed:
            return
        kcb = self.kprobe_ctlblks[self.kernel.cpu.index]
        if kcb.current is not None:
            self.kprobes_inc_nmissed_count(ap)
            return
        kcb.current = ap
        regs.ip = site + 1                      # as if an int3 at the site had trapped
        failed = ap                             # whose handler runs (the aggregate's
        try:                                    # report its children's own failures)
            active = ap.active
            if len(active) == 1 and ap.post_handler is None:
                failed = active[0]
                redirected = not failed.is_disabled() and failed.pre_handler(failed, regs)
            else:
                redirected = ap.pre_handler(ap, regs)
            if not redirected:
                regs.ip = site + 5              # emulate the 5-byte NOP
                if ap.post_handler is not None:
                    kcb.status = "hit_ssdone"
                    ap.post_handler(ap, regs, 0)
        except Exception as e:
            self.handle_fault(failed, regs, TRAP_DB if kcb.status == "hit_ssdone" else TRAP_BP,
                              e)
            regs.ip = site + 5
        finally:
            kcb.current = None
            kcb.status = None

    def _kprobe_ftrace_site_handler(self, site: int):
        """kprobe_ftrace_handler specialized for one site: the common case (one active
        probe, no post-handler) in a few lookups, the rest through the general one."""
        ctl, kernel, general = self.kprobe_ctlblks, self.kernel, self._kprobe_ftrace_handler
        ip1, ip5 = site + 1, site + 5
        skip = KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE

        def handler(regs):
            ap = self._table.get(site)
            if ap is None:
                return
            kcb = ctl[kernel.cpu.index]
            active = ap.active
            if kcb.current is not None or len(active) != 1 or ap.post_handler is not None:
                general(site, 0, None, regs)
                return
            child = active[0]
            if child.flags & skip:
                return
            kcb.current = ap
            regs.ip = ip1
            try:
                if not child.pre_handler(child, regs):
                    regs.ip = ip5
            except Exception as e:
                self.handle_fault(child, regs, TRAP_BP, e)
                regs.ip = ip5
            kcb.current = None

        return handler

    def ftrace_dispatch(self, site: int, regs) -> None:
        self.ftrace.dispatch(site, regs)

    # ==== jprobes =============================================================================
    def register_jprobe(self, jp: Jprobe) -> None:
        kp = jp.kp
        kp.symbol_name, kp.addr, kp.offset = jp.symbol_name, jp.addr, 0
        addr, _ = self._resolve(jp.symbol_name, jp.addr, 0)
        if not self._on_func_entry(addr):
            raise ProbeError(errno.EINVAL, "a jprobe must be at a function entry")
        kp.kind, kp.owner = "j", jp
        kp.pre_handler = self._setjmp_pre_handler
        self.register_kprobe(kp)

    def unregister_jprobe(self, jp: Jprobe) -> None:
        self.unregister_kprobe(jp.kp)

    def register_jprobes(self, jps: Iterable[Jprobe]) -> None:
        self._register_batch(self.register_jprobe, self.unregister_jprobe, jps)

    def unregister_jprobes(self, jps: Iterable[Jprobe]) -> None:
        for jp in list(jps):
            self.unregister_jprobe(jp)

    def enable_jprobe(self, jp: Jprobe) -> None:
        self.enable_kprobe(jp.kp)

    def disable_jprobe(self, jp: Jprobe) -> None:
        self.disable_kprobe(jp.kp)

    def _setjmp_pre_handler(self, p: Kprobe, regs) -> int:
        """Run the jprobe's entry with the function's arguments on a copy of the
        registers and stack, then put both back (the longjmp of jprobe_return)."""
        save, restore, arguments, ram, translate, direct_map, writes = self._jprobe_machine
        state = save()
        di, si, dx, cx, r8, r9, sp = arguments()
        sp += regs.sp_offset
        if (sp & 0xFFF) + MAX_STACK_SIZE > 0x1000:     # across two pages
            return self._setjmp_slow(p, state, (di, si, dx, cx, r8, r9), sp)
        pa = sp - direct_map[0]                 # a task's stack: in the direct map
        if not 0 <= pa < direct_map[1]:
            pa = translate(sp)
        saved_stack = ram[pa:pa + MAX_STACK_SIZE]
        mark = writes[0]
        try:
            p.owner.entry(di, si, dx, cx, r8, r9)
        finally:
            ram[pa:pa + MAX_STACK_SIZE] = saved_stack
            if writes[0] != mark:               # the entry wrote registers
                restore(state)
        return 0

    def _setjmp_slow(self, p: Kprobe, state, args: tuple, sp: int) -> int:
        """_setjmp_pre_handler for a stack copy that spans two pages."""
        kernel = self.kernel
        saved_stack = kernel.read(sp, MAX_STACK_SIZE)
        try:
            p.owner.entry(*args)
        finally:
            kernel.write(sp, saved_stack)
            kernel.restore_cpu_state(state)
        return 0

    # ==== kretprobes ==========================================================================
    def _on_func_entry(self, addr: int) -> bool:
        sym = self.image.symbol_at(addr)
        return sym is not None and sym.addr == addr

    def default_maxactive(self) -> int:
        return max(10, 2 * self.kernel.nr_cpus)

    def register_kretprobe(self, rp: Kretprobe) -> None:
        addr, sym = self._resolve(rp.symbol_name, rp.addr, rp.offset)
        if sym.addr != addr:
            raise ProbeError(errno.EINVAL, "a return probe must be at a function entry")
        if sym.name in KRETPROBE_BLACKLIST:
            raise ProbeError(errno.EINVAL, f"{sym.name} cannot have a return probe")
        if rp.data_size > KRETPROBE_MAX_DATA_SIZE:
            raise ProbeError(errno.E2BIG, "kretprobe data_size too big")
        if rp.maxactive <= 0:
            rp.maxactive = self.default_maxactive()
        pid_of = self.kernel.task_pid
        rp.free_instances = [KretprobeInstance(rp, data=bytearray(rp.data_size),
                                               pid_of=pid_of)
                             for _ in range(rp.maxactive)]
        kp = rp.kp
        kp.symbol_name, kp.addr, kp.offset = rp.symbol_name, rp.addr, rp.offset
        kp.pre_handler, kp.post_handler = self._pre_handler_kretprobe, None
        kp.kind, kp.owner = "r", rp
        # Without an entry handler the entry can be kernel code (kretprobe_native.py).
        if rp.entry_handler is None:
            self._kret_natives.attach(rp)
        try:
            self.register_kprobe(kp)
        except ProbeError:
            self._kret_natives.detach(rp)
            raise
        for ri in rp.free_instances:
            ri.func = kp.addr

    def unregister_kretprobe(self, rp: Kretprobe) -> None:
        self.unregister_kprobe(rp.kp)
        self._kret_natives.detach(rp)
        # Instances still on tasks' stacks return through the trampoline without a handler.
        rp.free_instances = []

    def register_kretprobes(self, rps: Iterable[Kretprobe]) -> None:
        self._register_batch(self.register_kretprobe, self.unregister_kretprobe, rps)

    def unregister_kretprobes(self, rps: Iterable[Kretprobe]) -> None:
        for rp in list(rps):
            self.unregister_kretprobe(rp)

    def enable_kretprobe(self, rp: Kretprobe) -> None:
        self.enable_kprobe(rp.kp)

    def disable_kretprobe(self, rp: Kretprobe) -> None:
        self.disable_kprobe(rp.kp)

    def _pre_handler_kretprobe(self, p: Kprobe, regs) -> int:
        rp: Kretprobe = p.owner
        free = rp.free_instances
        if not free or (rp.native_at and not self._kret_natives.take(rp)):
            rp.nmissed += 1
            return 0
        ri = free.pop()
        ri.task_struct = self._current_task()
        if rp.entry_handler is not None:
            try:
                skip = rp.entry_handler(ri, regs)
            except Exception as e:
                self.handle_fault(p, regs, TRAP_BP, e)
                skip = True
            if skip:
                free.append(ri)
                return 0
        ret_addr, slot = self._prepare_kretprobe(regs)
        self._pend(ri, slot, ret_addr)
        return 0

    def _pend(self, ri: KretprobeInstance, slot: int, ret_addr: int) -> None:
        """ri's return is pending at slot, whose real return address was ret_addr."""
        ri.ret_addr = ret_addr
        ri.fp = slot
        instances = self._instances
        below = instances.get(slot)
        if below is not None and ret_addr != self.arch.kretprobe_trampoline:
            self._recycle(below)    # its return was never taken (cannot happen normally)
            below = None
        ri.below = below
        instances[slot] = ri

    def kretprobe_trampoline_handler(self, regs, slot: int) -> int | None:
        """A function with a hijacked return address returned: run its kretprobe's
        handler and give back the real return address; ``None`` when no return is
        pending at ``slot`` (the arch then looks again, or gives up)."""
        instances = self._instances
        ri = instances.pop(slot, None)
        if ri is None:
            return None
        below = ri.below
        if below is not None:       # it returns into the trampoline again, for this one
            instances[slot] = below
            ri.below = None
        ret = regs.ip = ri.ret_addr
        rp = ri.rp
        if rp is None:
            return ret
        kp = rp.kp
        if kp.registered:
            self._run_return_handler(rp, ri, regs, self.kernel.cpu.index)
            rp.free_instances.append(ri)
            if rp.native_at:
                self._kret_natives.give(rp)
        return ret

    def _run_return_handler(self, rp: Kretprobe, ri: KretprobeInstance, regs,
                            cpu: int) -> None:
        """rp's handler on ri, on CPU cpu."""
        kp = rp.kp
        handler = rp.handler
        if handler is not None and not kp.flags & _SKIP:
            kcb = self.kprobe_ctlblks[cpu]
            if kcb.current is None:
                kcb.current, kcb.status = kp, "hit_active"
                try:
                    handler(ri, regs)
                except Exception as e:
                    self.handle_fault(kp, regs, TRAP_BP, e)
                finally:
                    kcb.current = kcb.status = None

    def _native_return_handler(self) -> Callable[[int, object], None]:
        """kretprobe_native_return(cpu, regs): a return hijacked by the kernel's
        kretprobe entry was taken on CPU cpu (the kernel put the real return address
        back and gave its instance back already): run the probe's handler, with the
        registers as the function returned them.  The hot path of every natively
        entered return probe, so _run_return_handler's steps are written out here.  A
        return taken inside a handler (kprobe_running) counts the miss its entry would
        have been on Linux and touches nothing else, not even regs, which the arch's
        hook reuses."""
        natives, ctl = self._kret_natives, self.kprobe_ctlblks
        words, rets, by_id = natives.words, natives.rets, natives.by_id
        pid_of = self.kernel.task_pid

        def kretprobe_native_return(cpu: int, regs) -> None:
            at = rets[cpu]
            rp = by_id.get(words[at])
            if rp is None:
                return
            kp, handler = rp.kp, rp.handler
            if handler is None or not kp.registered or kp.flags & _SKIP:
                return
            kcb = ctl[cpu]
            if kcb.current is not None:
                # Its entry ran inside a handler, in the kernel, which cannot see
                # kprobe_running(): Linux's int3 or detour would have missed that entry.
                kp.nmissed += 1
                return
            free = rp.free_instances
            ri = free.pop() if free else KretprobeInstance(
                rp, data=bytearray(rp.data_size), pid_of=pid_of, func=kp.addr)
            ri.ret_addr = regs.ip = words[at + 1]
            ri.fp = words[at + 2]
            ri.task_struct = words[at + 3]
            kcb.current, kcb.status = kp, "hit_active"
            try:
                handler(ri, regs)
            except Exception as e:
                self.handle_fault(kp, regs, TRAP_BP, e)
            finally:
                kcb.current = kcb.status = None
            free.append(ri)

        return kretprobe_native_return

    def rethook_trampoline_handler(self, regs, slot: int) -> int:
        return self.fprobes.on_return(regs, slot)

    def _flush_task_instances(self, pid: int) -> None:
        """The task exited: recycle the instances it will never return through."""
        instances = self._instances
        for slot in [slot for slot, ri in instances.items() if ri.task == pid]:
            self._recycle(instances.pop(slot))

    def _recycle(self, ri: KretprobeInstance | None) -> None:
        """Back to their free lists: ri and the instances below it on its slot."""
        while ri is not None:
            below, ri.below = ri.below, None
            rp = ri.rp
            if rp is not None and getattr(rp, "kp", None) is not None and rp.kp.registered:
                rp.free_instances.append(ri)
                if rp.native_at:
                    self._kret_natives.give(rp)
            ri = below

    # ==== modules =============================================================================
    def _module_notify(self, state: str, mod) -> None:
        """The module notifier (kprobes_module_callback, plus ftrace's module hooks)."""
        if state == _MODULE_COMING:
            self.module_coming(mod)
        elif state == _MODULE_GOING:
            self.module_going(mod)

    def module_coming(self, mod) -> None:
        """A module's text is in place: its ftrace sites become probe-able locations."""
        self.ftrace.add_sites(mod.ftrace_sites)
        self.arch.update_text_tables()

    def module_going(self, mod) -> None:
        """A module is unloading (its text still mapped): every probe inside it becomes
        [GONE] but stays registered; then its ftrace sites are released."""
        for ap in list(self._table.values()):
            if mod.start <= ap.addr < mod.end and not ap.is_gone():
                self._kill_kprobe(ap)
        self.ftrace.remove_sites(mod.ftrace_sites)
        self.arch.update_text_tables()

    def _kill_kprobe(self, ap: AggrKprobe) -> None:
        """kill_kprobe(): mark the aggregate and every child gone, drop what was hooked
        or allocated for them; an ftrace-based probe is disarmed through ftrace, which
        still owns the site; int3 and jump sites are not written back (the text goes)."""
        ap.flags |= KPROBE_FLAG_GONE
        for child in ap.children:
            child.flags |= KPROBE_FLAG_GONE
        self._optimizing.pop(ap, None)
        if ap.is_ftrace():
            if ap.armed:
                self.ftrace.ftrace_set_filter_ip(self._kprobe_ftrace_ops, ap.addr,
                                                 remove=True)
        else:
            self.arch.kill(ap)
        ap.detour = None
        ap.flags &= ~KPROBE_FLAG_OPTIMIZED
        ap.armed = False
        ap.active = ()
        ap.post_handler = None
        self._native_aggrs.put(ap.native_slot)
        ap.native_slot = ap.native = None

    # ==== listings ============================================================================
    def list_entries(self) -> list[ListEntry]:
        """kprobes/list, in Linux's order: the 64-bucket address hash, newest first
        within a bucket and among the probes of one address."""
        buckets: dict[int, list[AggrKprobe]] = {}
        for ap in self._table.values():
            buckets.setdefault(_hash_ptr(ap.addr), []).append(ap)
        out = []
        for b in sorted(buckets):
            for ap in reversed(buckets[b]):
                # Looked up now, as Linux does: a gone module's address has no symbol.
                sym = self.image.symbol_at(ap.addr) if ap.is_gone() else ap.symbol
                for p in reversed(ap.children):
                    out.append(ListEntry(
                        addr=ap.addr, kind=p.kind, symbol=sym.name if sym else None,
                        offset=ap.addr - sym.addr if sym else 0,
                        module=sym.module if sym else None,
                        gone=p.is_gone(),
                        disabled=bool(p.flags & KPROBE_FLAG_DISABLED) and not p.is_gone(),
                        optimized=ap.is_optimized(), ftrace=ap.is_ftrace()))
        return out

    def list_text(self) -> str:
        return "".join(e.format() + "\n" for e in self.list_entries())

    def blacklist_text(self) -> str:
        return "".join(f"0x{s:016x}-0x{e:016x}\t{name}\n" for s, e, name in self._blacklist)

    def registered(self) -> list[Kprobe]:
        return list(self._order)


def _hash_ptr(addr: int) -> int:
    """hash_ptr(addr, KPROBE_HASH_BITS=6): the golden-ratio multiplicative hash."""
    return ((addr * 0x61C8864680B583EB) & 0xFFFFFFFFFFFFFFFF) >> 58
