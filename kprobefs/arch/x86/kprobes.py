"""The x86_64 side of kprobes: what Linux keeps in arch/x86/kernel/kprobes/.

:class:`X86Kprobes` implements the arch contract the generic engine calls (prepare, arm,
disarm, remove, optimize, unoptimize, ftrace-site patching, return-address hijacking) and
owns the trap paths: the int3 handler, the single-step completion, the fault fixup, the
optimized-probe detour callback and the trampolines' callbacks.  It calls up into the
engine only through the small interface the engine hands it (``core``), so it imports
nothing above the machine.

Execution model (Linux 6.1 on a non-preemptible kernel, as kprobes.txt describes):
an armed probe's first byte is int3; on the hit the pre-handler runs, then the original
instruction is emulated (branches, calls, returns, pushf/popf, cli/sti), or run from a
copy in an instruction slot: followed by a jump back (boosted: no second trap) or by an
int3 whose trap completes the single-step and runs the post-handler.  A hit whose
handler is kernel code runs it from a stub, then the copy that jumps back, whether the
instruction is boostable or not: it has no post-handler, and a fault in that copy is
put back on the probed address without a probe being current (``_fault_in_copy``).
"""

from __future__ import annotations

import bisect
import errno
import logging
import struct
from dataclasses import dataclass
from typing import Protocol

from ...errors import ProbeError
from ...machine.cpu import UC_REG
from .insn import (
    GPR_NAMES, FunctionText, Insn, OptimizePlan, can_boost, can_optimize, emulate,
    prepare_copy, relocate, synthesize_relcall, synthesize_reljump,
)
from .regs import REGS_FIELDS, ProbeRegs, SavedSpRegs

UC_X86_REG_RIP, UC_X86_REG_RSP = UC_REG["ip"], UC_REG["sp"]
UC_X86_REG_EFLAGS, UC_X86_REG_RCX = UC_REG["flags"], UC_REG["cx"]

__all__ = ["X86Kprobes", "ArchKprobe", "Detour", "KprobeCore", "InsnSlots"]

log = logging.getLogger("kprobefs.arch")

INT3 = 0xCC
X86_TRAP_DB, X86_TRAP_BP, X86_TRAP_GP, X86_TRAP_PF = 1, 3, 13, 14
FENTRY_NOP = bytes.fromhex("0f1f440000")
_Q = struct.Struct("<Q")
_SKIP = 1 | 2       # KPROBE_FLAG_GONE | KPROBE_FLAG_DISABLED: a child that must not run
_SLOT = 48          # an instruction slot: [copy][jmp back or int3] at 0, [copy][jmp back]
_BOOST = 24         # at 24 (a copy is at most 15 bytes, a jump 5)
_DETOUR = 256       # a detour buffer: template, copied instructions, jmp back
_PAGE = 4096


class KprobeCore(Protocol):
    """What the arch code calls in the generic engine."""

    def get_kprobe(self, addr: int): ...
    def kprobe_ctlblk(self, cpu: int): ...
    def kprobes_inc_nmissed_count(self, p) -> None: ...
    def handle_fault(self, p, regs, trapnr: int, exc: Exception | None = None) -> None: ...
    def ftrace_dispatch(self, site: int, regs: ProbeRegs) -> None: ...
    def kretprobe_trampoline_handler(self, regs: ProbeRegs, slot: int) -> int | None: ...
    def rethook_trampoline_handler(self, regs: ProbeRegs, slot: int) -> int | None: ...


@dataclass(eq=False)
class ArchKprobe:
    """Per-probe arch data: the copied instruction and where it lives."""

    insn: Insn
    opcode: bytes               # the original first byte(s) the int3 replaced
    emulate: bool               # branch/call/ret/flags instructions are emulated
    boostable: bool
    slot: int | None = None     # see _SLOT
    #: (native handler, where it resumes, the stub): the native template, then a jump to
    #: the copy that jumps back (see X86Kprobes._int3_callback)
    native_stub: tuple | None = None
    #: the code hook that ends a single-step when the copy ends in a jump back
    ss_hook: int | None = None

    @property
    def ss_addr(self) -> int:
        return self.slot

    @property
    def boost_addr(self) -> int:
        return self.slot + _BOOST


@dataclass(eq=False)
class Detour:
    """An optimized probe's detour buffer."""

    addr: int
    plan: OptimizePlan
    buffer: int
    call_site: int              # the hooked copy of optprobe_template_call
    copied: int                 # where the relocated instructions start
    saved: bytes = b""          # original bytes 1..4 under the jump, while patched
    patched: bool = False
    hook: int | None = None
    native: tuple[int, int] | None = None   # (handler, argument) a native detour calls


@dataclass(eq=False)
class _FtraceTramp:
    """An ftrace site's trampoline: where, its slot size, its code hook (or trap), the
    host function it runs (``state[0]``), or the kernel handler it calls."""

    addr: int
    size: int
    hook: int | None
    state: list
    native: tuple[int, int] | None = None
    trapped: bool = False
    direct: int | None = None       # the kernel trampoline it jumps to instead of ret


def _signed32(value: int) -> int:
    """``value`` as the sign-extended imm32 that encodes it (top or bottom 2 GiB)."""
    value &= 0xFFFFFFFFFFFFFFFF
    if value >= 1 << 63:
        value -= 1 << 64
    if not -(1 << 31) <= value < 1 << 31:
        raise ProbeError(errno.EINVAL, f"{value:#x} is not a sign-extended imm32")
    return value


class InsnSlots:
    """Executable memory for instruction slots and detour buffers, from the kernel's
    kprobe_insn_area (within +-2 GiB of all text), in fixed-size pieces."""

    def __init__(self, start: int, end: int):
        split = (start + (end - start) * 3 // 4) & ~(_PAGE - 1)
        self._free = {_SLOT: list(range(split - _SLOT, start - 1, -_SLOT)),
                      _DETOUR: list(range(end - _DETOUR, split - 1, -_DETOUR))}
        self._capacity = {size: len(free) for size, free in self._free.items()}

    def get(self, size: int) -> int:
        try:
            return self._free[size].pop()
        except IndexError:
            raise ProbeError(errno.ENOMEM, "out of kprobe instruction slots") from None

    def free(self, size: int, addr: int) -> None:
        self._free[size].append(addr)

    def in_use(self) -> tuple[int, int]:
        """(instruction slots, detour buffers) handed out now."""
        return tuple(self._capacity[size] - len(self._free[size]) for size in (_SLOT, _DETOUR))


class X86Kprobes:
    """The arch implementation, bound to one kernel and one engine."""

    #: Jump back from the copy instead of trapping after it.  Linux boosts only on a
    #: non-preemptible kernel (CONFIG_PREEMPTION=n), which this one is.
    boost = True
    #: struct pt_regs, field by field (what a native handler's regs point at)
    pt_regs_fields = REGS_FIELDS

    def __init__(self, kernel, core: KprobeCore):
        self.kernel = kernel
        self.core = core
        img = kernel.image
        self._sym = kernel.image.symbol_value
        self.slots = InsnSlots(self._sym("kprobe_insn_area"), self._sym("kprobe_insn_area_end"))
        self._ss_slots: dict[int, object] = {}    # int3 after a slot copy -> probe
        self._slot_probes: dict[int, object] = {}  # a slot's address -> its probe
        self._slot_area = self._sym("kprobe_insn_area")
        self._boost_slots: dict[int, object] = {}
        self._set_text_tables(img)
        self._template = kernel.read(self._sym("optprobe_template_entry"),
                                     self._sym("optprobe_template_end")
                                     - self._sym("optprobe_template_entry"))
        self._template_call = self._sym("optprobe_template_call") - self._sym(
            "optprobe_template_entry")
        native = self._sym("optprobe_native_template_entry")
        self._native_template = kernel.read(native,
                                            self._sym("optprobe_native_template_end") - native)
        self._native_patch = {name: self._sym(f"optprobe_native_template_{name}") - native
                              for name in ("ip", "sp", "arg", "call")}
        self.kretprobe_trampoline = self._sym("kretprobe_trampoline")
        self.rethook_trampoline = self._sym("rethook_trampoline")
        self._ftrace_tramps: dict[int, _FtraceTramp] = {}
        self._text_cache: dict[tuple[int, int], FunctionText] = {}
        self._fast = kernel.fast
        self._mem = kernel.mem
        self._words = kernel.mem.words
        self._translate = kernel.mem.translate
        # One pt_regs view per CPU and path, reused: a handler's regs are valid only
        # during it.
        self._regs = [ProbeRegs(self._fast, self._mem, 0) for _ in range(kernel.nr_cpus)]
        # A detour leaves %rsp in optprobe_sp.
        self._detour_regs = [SavedSpRegs(self._fast, self._mem, 0, trapped=False)
                             for _ in range(kernel.nr_cpus)]
        self._detour_sp = kernel.mem.translate(self._sym("optprobe_sp")) >> 3
        # At a return trampoline %rsp is the caller's, above the return address's slot.
        self._tramp_regs = [ProbeRegs(self._fast, self._mem, 0)
                            for _ in range(kernel.nr_cpus)]
        # In an ftrace callback the trampoline's return address sits on the stack.
        self._ftrace_regs = [ProbeRegs(self._fast, self._mem, 0, sp_offset=8, trapped=False)
                             for _ in range(kernel.nr_cpus)]
        kernel.add_trap_handler(X86_TRAP_BP, self._int3)
        for trapnr in (X86_TRAP_PF, X86_TRAP_GP):
            kernel.add_trap_handler(
                trapnr, lambda k, cpu, ip, trapnr=trapnr: self._fault(cpu, ip, trapnr))
        self._hooks = [
            kernel.hook_code_raw(self._sym(name), self._sym(name), callback)
            for name, callback in (
                ("kretprobe_trampoline_call",
                 self._tramp(core.kretprobe_trampoline_handler, "kretprobe_tramp")),
                ("rethook_trampoline_call",
                 self._tramp(core.rethook_trampoline_handler, "rethook_tramp")))
        ]
        native_call = kernel.image.symbol_value("kretprobe_native_call")
        if native_call is not None:
            self._hooks.append(kernel.hook_code_raw(
                native_call, native_call,
                self._native_return(core.kretprobe_native_return)))

    # ==== the original bytes of text, as if no probe were there ===========================
    def _set_text_tables(self, img) -> None:
        self._ftrace_sites = frozenset(img.ftrace_sites)
        self._ftrace_sorted = sorted(self._ftrace_sites)
        self._extable = frozenset(img.extable)

    def original_bytes(self, addr: int, size: int) -> bytes:
        """Text as built (ftrace sites as the NOP they boot to), not as probes patched it."""
        data = bytearray(self.kernel.image.read(addr, size))
        sites = self._ftrace_sorted
        for k in range(bisect.bisect_right(sites, addr - 5), len(sites)):
            site = sites[k]
            if site >= addr + size:
                break
            for i in range(5):
                if 0 <= site + i - addr < size:
                    data[site + i - addr] = FENTRY_NOP[i]
        return bytes(data)

    def _ftrace_region(self, addr: int, size: int = 5 + 15) -> list[int]:
        """The ftrace sites whose 5 bytes can overlap [addr, addr + size)."""
        sites = self._ftrace_sorted
        start = bisect.bisect_right(sites, addr - 5)
        return sites[start:bisect.bisect_left(sites, addr + size, start)]

    def function_text(self, func) -> FunctionText:
        """func's original text decoded from its start, once (cached: text as built never
        changes; a module's is dropped when module text comes or goes)."""
        key = (func.addr, func.size)
        found = self._text_cache.get(key)
        if found is None:
            found = self._text_cache[key] = FunctionText.decode(
                self.original_bytes(func.addr, func.size), func.addr)
        return found

    # ==== arch_prepare_kprobe / arch_arm / arch_disarm / arch_remove =========================
    def prepare(self, p, func) -> ArchKprobe:
        """Decode and copy the instruction at p.addr.  func is the containing Symbol.
        Raises ProbeError(EILSEQ) off an instruction boundary, or the copy rules' errno."""
        insn = self.function_text(func).by_address.get(p.addr)
        if insn is None:
            raise ProbeError(errno.EILSEQ, f"{p.addr:#x} is not an instruction boundary")
        plan = prepare_copy(insn)
        ainsn = ArchKprobe(insn=insn, opcode=insn.bytes[:1],
                           emulate=plan.emulate_op is not None,
                           boostable=can_boost(insn, p.addr in self._extable))
        if not ainsn.emulate:
            slot = self.slots.get(_SLOT)
            end = slot + insn.length        # where the single-stepped copy ends
            # With a code hook to spare, the copy to single-step ends in a jump back and
            # the hook on it is the trap that ends the step (so nothing moves %rip);
            # else in an int3 that traps.
            jump = self.kernel.fast_hooks_available()
            try:
                ss_copy = relocate(insn, slot)
                ss_copy += (synthesize_reljump(end, insn.next_address) if jump
                            else bytes([INT3]))
                boost_copy = relocate(insn, slot + _BOOST)
                boost_copy += synthesize_reljump(slot + _BOOST + len(boost_copy),
                                                 insn.next_address)
            except ProbeError:
                self.slots.free(_SLOT, slot)
                raise
            self.kernel.text_poke(slot, ss_copy)
            self.kernel.text_poke(slot + _BOOST, boost_copy)
            ainsn.slot = slot
            self._ss_slots[end] = p
            self._slot_probes[slot] = p
            if jump:
                ainsn.ss_hook = self.kernel.hook_code_raw(
                    end, end, self._singlestep_trap(p, insn.next_address))
            else:
                self.kernel.insert_breakpoint(
                    end, self._singlestep_callback(p, insn.next_address, moves_ip=True))
        return ainsn

    def arm(self, p) -> None:
        self.kernel.text_poke(p.addr, bytes([INT3]))
        self.kernel.insert_breakpoint(p.addr, self._int3_callback(p))

    def disarm(self, p) -> None:
        self.kernel.remove_breakpoint(p.addr)
        self.kernel.text_poke(p.addr, p.ainsn.opcode)

    def kill(self, p) -> None:
        """The text under p is going away (its module unloads): drop the hooks on it and
        free p's slot and detour without writing to that text."""
        self.kernel.remove_breakpoint(p.addr)
        op = getattr(p, "detour", None)
        if op is not None:
            op.patched = False          # the jump is in text about to be freed
            self.free_optimized(op)
        self.remove(p)

    def update_text_tables(self) -> None:
        """Module text came or went: take the image's ftrace sites and exception table
        again."""
        img = self.kernel.image
        self._set_text_tables(img)
        # Module text is built anew at each load: keep only vmlinux functions' text.
        self._text_cache = {k: v for k, v in self._text_cache.items()
                            if img.text_start <= k[0] < img.text_end}

    def remove(self, p) -> None:
        a = p.ainsn
        if a is not None and a.native_stub is not None:
            self._free_stub(a)
        if a is not None and a.slot is not None:
            if a.ss_hook is not None:
                self.kernel.hook_del(a.ss_hook)
                a.ss_hook = None
            self.kernel.remove_breakpoint(a.slot + a.insn.length)
            self._ss_slots.pop(a.slot + a.insn.length, None)
            self._slot_probes.pop(a.slot, None)
            self.kernel.text_poke(a.slot, bytes([INT3]) * _SLOT)
            self.slots.free(_SLOT, a.slot)
            a.slot = None

    # ==== the int3 path ===================================================================
    def _int3_callback(self, p):
        """The int3 handler of one armed probe.  The common case (no reentry, one active
        probe, a copied instruction, no post-handler) is kept to a few lookups; the
        rest goes through the general path.

        A hit whose handler is kernel code (``p.native``) goes on from the kernel's stub
        to the copy that jumps back, boostable or not: it has no post-handler, and its
        handler ran before the copy, so no trap after the instruction is needed and no
        probe is current while the copy runs.  A fault in that copy of an instruction
        that is not boosted goes back on the probed address as during a single-step
        (:meth:`_fault_in_copy`), so the kernel's fixups still apply."""
        set_ip, ctl, regs_of = self._fast.set_ip, self.core.kprobe_ctlblks, self._regs
        a = p.ainsn
        ip = p.addr + 1
        general = self._int3
        # The copies' addresses, fixed while p is armed (emulated instructions have none).
        ss_addr, boost_addr = (a.ss_addr, a.boost_addr) if a.slot is not None else (0, 0)

        def kprobe_int3_handler(kernel, cpu, _ip):
            kcb = ctl[cpu.index]
            if a.emulate or kcb.current is not None:
                return general(kernel, cpu, ip)
            native = p.native
            if native is not None:
                # The kernel handlers run from a stub that then jumps to the copy that
                # jumps back: no host code but this hook.
                stub = a.native_stub
                if stub is None or stub[0] != native:
                    self._native_stub(p, native, boost_addr)
                    stub = a.native_stub
                set_ip(stub[2])
                return True
            boosted = a.boostable and self.boost
            active = p.active
            if len(active) != 1 or p.post_handler is not None or p.detour is not None:
                return general(kernel, cpu, ip)
            child = active[0]
            kcb.current = p
            regs = regs_of[cpu.index]
            regs.ip = ip
            try:
                redirected = not child.flags & _SKIP and child.pre_handler(child, regs)
            except Exception as e:
                self.core.handle_fault(child, regs, X86_TRAP_BP, e)
                redirected = False
            if redirected:
                kcb.current = None
                set_ip(regs.ip)
            elif boosted:
                kcb.current = None
                set_ip(boost_addr)
            else:               # single-step the copy: its int3 ends the hit
                kcb.status = "hit_ss"
                set_ip(ss_addr)
            return True

        return kprobe_int3_handler

    def _native_stub(self, p, native: tuple[int, int], resume: int) -> int:
        """The stub an int3 hit of p enters to call its kernel handler: the native
        template with ``argument + 1`` (the hit trapped), then `jmp` to ``resume``, the
        copy of the probed instruction that jumps back."""
        a = p.ainsn
        if a.native_stub is not None:
            if a.native_stub[:2] == (native, resume):
                return a.native_stub[2]
            self._free_stub(a)
        buf = self.slots.get(_DETOUR)
        handler, arg = native
        code = self._native_template_for(buf, p.addr, (handler, arg + 1))
        code += synthesize_reljump(buf + len(code), resume)
        self.kernel.text_poke(buf, code)
        a.native_stub = (native, resume, buf)
        return buf

    def _free_stub(self, a: ArchKprobe) -> None:
        buf = a.native_stub[2]
        self.kernel.text_poke(buf, bytes([INT3]) * _DETOUR)
        self.slots.free(_DETOUR, buf)
        a.native_stub = None

    def _int3(self, kernel, cpu, ip: int) -> bool:
        addr = ip - 1
        p = self.core.get_kprobe(addr)
        if p is None:
            ss = self._ss_slots.get(addr)
            if ss is not None:
                return self._singlestep_done(cpu, ss)
            return False
        kcb = self.core.kprobe_ctlblk(cpu.index)
        regs = ProbeRegs(self._fast, self._mem, ip)
        if kcb.current is not None:
            # Reentered from inside a handler: count the miss and run the instruction only.
            self.core.kprobes_inc_nmissed_count(p)
            self._setup_singlestep(p, regs, kcb, reenter=True)
            return True
        kcb.current = p
        kcb.status = "hit_active"
        try:
            redirected = p.pre_handler is not None and p.pre_handler(p, regs)
        except Exception as e:
            self.core.handle_fault(p, regs, X86_TRAP_BP, e)
            redirected = False
        if redirected:
            kcb.reset()
            self._fast.set_ip(regs.ip)
            return True
        self._setup_singlestep(p, regs, kcb, reenter=False)
        return True

    def _setup_singlestep(self, p, regs: ProbeRegs, kcb, reenter: bool) -> None:
        a = p.ainsn
        op = getattr(p, "detour", None)
        if op is not None and not reenter and not self._has_post_handler(p):
            # Queued for optimization but not patched yet: run the detour's copy.
            self._fast.set_ip(op.copied)
            kcb.reset()
            return
        if a.emulate:
            self._emulate(a.insn)
            if not reenter:
                self._post(p, kcb)
            return
        if a.boostable and self.boost and (reenter or not self._has_post_handler(p)):
            self._fast.set_ip(a.boost_addr)
            if not reenter:
                kcb.reset()
            return
        if reenter:
            kcb.push()
            kcb.current = p
        kcb.status = "hit_ss" if not reenter else "reenter"
        self._fast.set_ip(a.ss_addr)

    @staticmethod
    def _has_post_handler(p) -> bool:
        return p.post_handler is not None

    def _singlestep_trap(self, p, next_ip: int):
        """The raw code hook on the jump that ends p's single-stepped copy (the jump goes
        on by itself): :meth:`_singlestep_callback`'s, without moving %rip, written out
        for the common case."""
        ctl, kernel = self.core.kprobe_ctlblks, self.kernel
        general = self._singlestep_callback(p, next_ip, moves_ip=False)

        def singlestep_trap(_uc, address, _size, _ud):
            try:
                kcb = ctl[kernel.cpu.index]
                if kcb.current is not p:
                    return
                if kcb.status == "hit_ss" and p.post_handler is None:
                    kcb.current = kcb.status = None
                else:
                    general(kernel, kernel.cpu, address)
            except Exception as e:
                log.exception("single-step handler failed at %#x", address)
                kernel.panicked = f"single-step handler failed: {e!r}"
                kernel.uc.emu_stop()

        return singlestep_trap

    def _singlestep_callback(self, p, next_ip: int, moves_ip: bool):
        """The trap after p's copy: the single-step is over, go on at next_ip (the jump
        that ends the copy goes there itself unless ``moves_ip``: an int3 ends it).  The
        common case (not a reentered hit, no post-handler) is kept to a few lookups."""
        ctl, set_ip = self.core.kprobe_ctlblks, self._fast.set_ip

        def singlestep_done(kernel, cpu, _ip):
            kcb = ctl[cpu.index]
            if kcb.current is not p:
                return False
            if moves_ip:
                set_ip(next_ip)
            if kcb.status == "hit_ss" and p.post_handler is None:
                kcb.current = kcb.status = None
            elif kcb.status == "reenter":
                kcb.pop()
            else:
                self._post(p, kcb, next_ip)
            return True

        return singlestep_done

    def _singlestep_done(self, cpu, p) -> bool:
        kcb = self.core.kprobe_ctlblk(cpu.index)
        if kcb.current is not p:
            return False
        a = p.ainsn
        if a.ss_hook is None:
            self._fast.set_ip(a.insn.next_address)
        if kcb.status == "reenter":
            kcb.pop()
            return True
        self._post(p, kcb, a.insn.next_address)
        return True

    def _post(self, p, kcb, ip: int | None = None) -> None:
        """The post-handler, with regs.ip where execution goes on (default: %rip)."""
        if p.post_handler is not None:
            regs = ProbeRegs(self._fast, self._mem,
                             self._fast.get(UC_X86_REG_RIP) if ip is None else ip)
            kcb.status = "hit_ssdone"
            try:
                p.post_handler(p, regs, 0)
            except Exception as e:
                self.core.handle_fault(p, regs, X86_TRAP_DB, e)
        kcb.reset()

    def _emulate(self, insn: Insn) -> None:
        fast = self._fast
        r = _EmulRegs(fast, self._mem, insn)
        sp, flags, cx = r.sp, r.flags, r.cx
        ip = emulate(insn, r)
        if r.sp != sp:
            fast.set(UC_X86_REG_RSP, r.sp)
        if r.flags != flags:
            fast.set(UC_X86_REG_EFLAGS, r.flags)
        if r.cx != cx:
            fast.set(UC_X86_REG_RCX, r.cx)
        fast.set_ip(ip)

    def _fault(self, cpu, ip: int, trapnr: int) -> bool:
        """Fault ``trapnr`` (a page fault or #GP) at ip.  While a copied instruction
        runs: put ip back on the probed address so the kernel's own fixup (exception
        table) applies there, then let it handle it.  While a handler runs: tell the
        engine (the probe's fault_handler), then let the kernel handle it."""
        kcb = self.core.kprobe_ctlblk(cpu.index)
        p = kcb.current
        if p is None:
            return self._fault_in_copy(ip)
        if kcb.status not in ("hit_ss", "reenter"):
            # None: a fast path runs its handler (int3, detour, ftrace site)
            if kcb.status in (None, "hit_active", "hit_ssdone"):
                self.core.handle_fault(p, ProbeRegs(self._fast, self._mem, ip), trapnr)
            return False
        if p.ainsn.slot is None or not p.ainsn.slot <= ip < p.ainsn.slot + _SLOT:
            return False
        self._fast.set_ip(p.addr)
        if kcb.status == "reenter":
            kcb.pop()
        else:
            kcb.reset()
        return False

    def _fault_in_copy(self, ip: int) -> bool:
        """A fault with no probe current: if ip is in the copy a native hit of a probe
        went on to (:meth:`_int3_callback`), and that copy stands for a single-step (the
        instruction is not boosted), put ip back on the probed address."""
        base = self._slot_area + (ip - self._slot_area) // _SLOT * _SLOT
        p = self._slot_probes.get(base)
        if p is None:
            return False
        a = p.ainsn
        if a.slot != base or not 0 <= ip - a.boost_addr < a.insn.length:
            return False
        if not (a.boostable and self.boost):
            self._fast.set_ip(p.addr)
        return False

    # ==== jump optimization ===============================================================
    def prepare_optimized(self, p, func, armed_in_region) -> Detour | None:
        """Build a detour buffer for p if the code allows (kprobes.txt 1.4.2 safety
        checks).  None, with the reason logged, if it cannot be optimized.

        When ``p.native`` is a (handler, argument) pair, the detour has
        Linux's own shape: it saves a struct pt_regs on the stack and calls
        handler(argument, regs) in the kernel, with no host code on the way.  Otherwise
        its hooked call runs p's handlers in the host."""
        native = p.native
        if native is None and not self.kernel.fast_hooks_available():
            log.debug("not optimized: no code hook left for a detour")
            return None
        text = self.function_text(func)
        plan, reason = can_optimize(b"", func.addr, p.addr, self._extable,
                                    self._ftrace_region(p.addr), armed_in_region,
                                    decoded=text)
        labels = getattr(self.kernel, "jump_labels", None)
        if plan is not None and labels is not None and labels.is_site(p.addr,
                                                                      p.addr + plan.size):
            # The copied instructions would keep a static branch's old bytes.
            plan, reason = None, "a jump label site in the region"
        if plan is None:
            log.debug("%s+%#x not optimized: %s", func.name, p.addr - func.addr, reason)
            return None
        try:
            buf = self.slots.get(_DETOUR)
        except ProbeError:
            log.debug("not optimized: no detour buffer left")
            return None
        try:
            template = self._template if native is None else self._native_template_for(
                buf, p.addr, native)
            copied = buf + len(template)
            body = plan.detour_copy(copied)
        except ProbeError as e:
            self.slots.free(_DETOUR, buf)
            log.debug("not optimized: %s", e)
            return None
        self.kernel.text_poke(buf, template + body)
        op = Detour(addr=p.addr, plan=plan, buffer=buf, call_site=buf + self._template_call,
                    copied=copied, native=native)
        if native is None:
            op.hook = self.kernel.hook_code_raw(op.call_site, op.call_site,
                                                self._detour_callback(p))
        return op

    def _native_template_for(self, buf: int, addr: int, native: tuple[int, int],
                             sp_above: int = 0) -> bytes:
        """The native detour template at ``buf`` for the probe at ``addr``, calling
        ``native[0](native[1], regs)``; regs.ip is addr + 1, as after an int3, and
        regs.sp is ``sp_above`` bytes above %rsp at the template's entry."""
        handler, arg = native
        code = bytearray(self._native_template)
        ip_at, sp_at, arg_at, call_at = (self._native_patch[k]
                                         for k in ("ip", "sp", "arg", "call"))
        code[ip_at + 1:ip_at + 5] = struct.pack("<i", _signed32(addr + 1))
        saved = struct.unpack_from("<i", code, sp_at + 4)[0]
        struct.pack_into("<i", code, sp_at + 4, saved + sp_above)
        code[arg_at + 2:arg_at + 10] = _Q.pack(arg)
        code[call_at:call_at + 5] = synthesize_relcall(buf + call_at, handler)
        return bytes(code)

    def optimize(self, op: Detour) -> None:
        """Replace the int3 and the next 4 bytes with `jmp detour` (the int3 stays first
        while the tail is written, as text_poke_bp does)."""
        jmp = synthesize_reljump(op.addr, op.buffer)
        op.saved = self.kernel.read(op.addr + 1, 4)
        self.kernel.text_poke(op.addr + 1, jmp[1:])
        self.kernel.text_poke(op.addr, jmp[:1])
        self.kernel.remove_breakpoint(op.addr)
        op.patched = True

    def unoptimize(self, op: Detour) -> None:
        """Back to a plain int3 probe: int3 first, then the saved tail."""
        if not op.patched:
            return
        self.kernel.insert_breakpoint(op.addr, self._int3_callback(self.core.get_kprobe(op.addr)))
        self.kernel.text_poke(op.addr, bytes([INT3]))
        self.kernel.text_poke(op.addr + 1, op.saved)
        op.patched = False

    def free_optimized(self, op: Detour) -> None:
        self.unoptimize(op)
        if op.hook is not None:
            self.kernel.hook_del(op.hook)
            op.hook = None
        self.kernel.text_poke(op.buffer, bytes([INT3]) * _DETOUR)
        self.slots.free(_DETOUR, op.buffer)

    def _detour_callback(self, p):
        """The optimized_callback of one probe: the hot path, kept to a few lookups."""
        kernel, core = self.kernel, self.core
        ctl, regs_of = core.kprobe_ctlblks, self._detour_regs
        ip = p.addr + 1
        inc_nmissed = core.kprobes_inc_nmissed_count
        words, sp_word = self._words, self._detour_sp

        def optimized_callback(_uc, _address, _size, _ud):
            cpu = kernel.cpu.index
            kcb = ctl[cpu]
            if kcb.current is not None:
                inc_nmissed(p)
                return
            kcb.current = p
            regs = regs_of[cpu]
            regs.ip = ip
            regs.saved_sp = words[sp_word]
            failed = p      # whose handler runs (the aggregate reports its children's)
            try:
                # An optimized probe cannot redirect: a changed regs.ip is dropped.
                active = p.active
                if len(active) == 1:
                    failed = active[0]
                    if not failed.flags & _SKIP:
                        failed.pre_handler(failed, regs)
                else:
                    p.pre_handler(p, regs)
            except Exception as e:
                core.handle_fault(failed, regs, X86_TRAP_BP, e)
            kcb.current = None

        return optimized_callback

    # ==== ftrace sites ====================================================================
    def ftrace_make_call(self, site: int, func, native: tuple[int, int] | None = None,
                         direct: int | None = None) -> None:
        """Point the site at a trampoline of its own (as Linux does for ops with a
        dynamically allocated trampoline).  func(regs) runs the ftrace ops of the site
        in the host, from [watched 5-byte NOP][ret]; with ``native`` = (handler,
        argument) the trampoline instead saves a struct pt_regs and calls
        handler(argument, regs) in the kernel, then returns.  With ``direct`` the
        trampoline ends in a jump to that kernel trampoline instead of a return (the
        stack then is as if the site had called it: ftrace_regs_caller's direct
        path)."""
        tramp = self._ftrace_trampoline(site, func, native, direct)
        self._ftrace_tramps[site] = tramp
        self.kernel.text_poke(site, synthesize_relcall(site, tramp.addr))

    def ftrace_update_call(self, site: int, func, native: tuple[int, int] | None = None,
                           direct: int | None = None) -> None:
        old = self._ftrace_tramps.get(site)
        if old is None:                     # the site called a direct trampoline alone
            self.ftrace_make_call(site, func, native, direct)
            return
        if native is None and old.native is None and direct == old.direct:
            old.state[0] = func
            return
        if native == old.native and direct == old.direct:
            return
        tramp = self._ftrace_trampoline(site, func, native, direct)
        self._ftrace_tramps[site] = tramp
        self.kernel.text_poke(site, synthesize_relcall(site, tramp.addr))
        self._free_trampoline(old)

    def ftrace_make_direct(self, site: int, addr: int) -> None:
        """The site calls the kernel trampoline ``addr`` itself (no ops on it)."""
        self.kernel.text_poke(site, synthesize_relcall(site, addr))
        old = self._ftrace_tramps.pop(site, None)
        if old is not None:
            self._free_trampoline(old)

    def ftrace_make_nop(self, site: int) -> None:
        self.kernel.text_poke(site, FENTRY_NOP)
        old = self._ftrace_tramps.pop(site, None)
        if old is not None:
            self._free_trampoline(old)

    def _ftrace_trampoline(self, site: int, func, native, direct: int | None = None
                           ) -> "_FtraceTramp":
        if native is not None:
            addr = self.slots.get(_DETOUR)
            # regs->sp is the traced function's %rsp: one slot above the return address.
            code = self._native_template_for(addr, site, native, sp_above=8)
            code += self._ftrace_tail(addr + len(code), direct)
            self.kernel.text_poke(addr, code)
            return _FtraceTramp(addr, _DETOUR, None, [func], native, direct=direct)
        tramp = self.slots.get(_SLOT)
        state = [func]
        callback = self._ftrace_callback(site, state)
        if self.kernel.fast_hooks_available():
            self.kernel.text_poke(tramp, FENTRY_NOP + self._ftrace_tail(tramp + 5, direct))
            return _FtraceTramp(tramp, _SLOT, self.kernel.hook_code_raw(tramp, tramp, callback),
                                state, direct=direct)
        # Out of code hooks: the trampoline traps instead, and resumes after the int3.
        self.kernel.text_poke(tramp, b"\xcc" + self._ftrace_tail(tramp + 1, direct))

        def trapped(kernel, cpu, ip):
            callback(None, tramp, 1, None)
            self._fast.set_ip(tramp + 1)
            return True

        self.kernel.insert_breakpoint(tramp, trapped)
        return _FtraceTramp(tramp, _SLOT, None, state, trapped=True, direct=direct)

    @staticmethod
    def _ftrace_tail(at: int, direct: int | None) -> bytes:
        """How an ops trampoline ends: ``ret``, or ``jmp direct``."""
        return b"\xc3" if direct is None else synthesize_reljump(at, direct)

    def _free_trampoline(self, tramp: "_FtraceTramp") -> None:
        if tramp.hook is not None:
            self.kernel.hook_del(tramp.hook)
        elif tramp.trapped:
            self.kernel.remove_breakpoint(tramp.addr)
        self.kernel.text_poke(tramp.addr, bytes([INT3]) * tramp.size)
        self.slots.free(tramp.size, tramp.addr)

    def _ftrace_callback(self, site: int, state: list):
        """The ftrace_regs_call of one site: regs.ip is the return address (site + 5) and
        regs.sp the traced function's stack pointer; a changed regs.ip diverts the return."""
        kernel, regs_of = self.kernel, self._ftrace_regs
        fast, mem = self._fast, self._mem
        ret = site + 5

        def ftrace_callback(_uc, _address, _size, _ud):
            regs = regs_of[kernel.cpu.index]
            regs.ip = ret
            state[0](regs)
            if regs.ip != ret:
                mem.write_u64(fast.get(UC_X86_REG_RSP), regs.ip)

        return ftrace_callback

    # ==== return hooks ====================================================================
    def prepare_kretprobe(self, regs) -> tuple[int, int]:
        """Hijack the return address at the function entry: returns (return address,
        the stack slot that held it) after pointing that slot at the trampoline."""
        slot = regs.sp
        pa = self._translate(slot)
        if pa & 7:                                  # (never, in a sane kernel)
            return self._hijack(slot, self.kretprobe_trampoline)
        words = self._words                         # an aligned slot is in one page
        ret = words[pa >> 3]
        words[pa >> 3] = self.kretprobe_trampoline
        return ret, slot

    def prepare_rethook(self, regs) -> tuple[int, int]:
        return self._hijack(regs.sp, self.rethook_trampoline)

    def _hijack(self, slot: int, trampoline: int) -> tuple[int, int]:
        mem = self._mem
        if slot & (_PAGE - 1) > _PAGE - 8:          # the slot straddles two pages
            ret = mem.read_u64(slot)
            mem.write_u64(slot, trampoline)
            return ret, slot
        pa = mem.translate(slot)
        ret = _Q.unpack_from(mem.ram, pa)[0]
        _Q.pack_into(mem.ram, pa, trampoline)
        return ret, slot

    def _tramp(self, handler, words_of: str):
        """The code hook of a return trampoline: the function returned into it, with
        %rsp just above the slot the return address was taken from, and it left %rsp in
        the word ``<words_of>_sp``, so no register is read here.  ``handler(regs,
        slot)`` gives the real return address for that slot, left in ``<words_of>_ret``
        for the trampoline to push, or ``None`` when no return is pending there: then
        the word was stale and the slot is taken from %rsp.  In the handler regs.sp is
        the caller's, above the slot."""
        fast, mem, kernel = self._fast, self._mem, self.kernel
        words = self._words
        sp_word = mem.translate(self._sym(words_of + "_sp")) >> 3     # aligned .data quads
        ret_word = mem.translate(self._sym(words_of + "_ret")) >> 3
        regs_of = self._tramp_regs

        def trampoline(_uc, _address, _size, _ud) -> None:
            slot = words[sp_word] - 8
            cpu = kernel.cpu.index
            regs = regs_of[cpu]
            if regs is None:    # nested (a handler's kernel call returned through one)
                regs = ProbeRegs(fast, mem, 0)
            else:
                regs_of[cpu] = None
            try:
                ret = handler(regs, slot)
                if ret is None:
                    slot = fast.get(UC_X86_REG_RSP) - 8
                    ret = handler(regs, slot)
            finally:
                regs_of[cpu] = regs
            if ret is None:     # cannot happen unless the stack was corrupted
                kernel.panicked = f"return trampoline: nothing pending at {slot:#x}"
                ret = self._sym("host_call_return")
            words[ret_word] = ret

        return trampoline


    def _native_return(self, handler):
        """The code hook at kretprobe_native_call: the kernel's return trampoline put
        the real return address back in its slot, where %rsp points, and restored every
        register; ``handler(cpu, regs)`` runs the probe's handler (regs.sp is the
        caller's, above the slot).  Each CPU's regs are reused: the handler leaves them
        alone for a return taken inside another handler (a nested kernel call)."""
        kernel = self.kernel
        regs_of = [ProbeRegs(self._fast, self._mem, 0, sp_offset=8)
                   for _ in range(kernel.nr_cpus)]

        def native_return(_uc, _address, _size, _ud) -> None:
            cpu = kernel.cpu.index
            handler(cpu, regs_of[cpu])

        return native_return


class _EmulRegs:
    """The EmulateRegs protocol over the live CPU; the caller writes sp, flags and cx back."""

    __slots__ = ("_fast", "_mem", "ip", "sp", "flags", "cx")

    def __init__(self, fast, mem, insn: Insn):
        self._fast, self._mem = fast, mem
        self.ip = insn.address + insn.length
        self.sp = fast.get(UC_X86_REG_RSP)
        self.flags = fast.get(UC_X86_REG_EFLAGS)
        self.cx = fast.get(UC_X86_REG_RCX)

    def get_reg(self, index: int) -> int:
        name = GPR_NAMES[index]
        if name == "sp":
            return self.sp
        return self._fast.get(UC_REG[name])

    def push(self, value: int) -> None:
        self.sp -= 8
        self._mem.write(self.sp, _Q.pack(value & 0xFFFFFFFFFFFFFFFF))

    def pop(self) -> int:
        value = _Q.unpack(self._mem.read(self.sp, 8))[0]
        self.sp += 8
        return value
