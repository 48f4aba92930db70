"""The interrupt controller: the timer, the NIC's line and self-IPIs, delivered to the
kernel as x86 delivers an interrupt through an interrupt gate.

Interrupts are delivered between emulation slices, at the hypercall where a CPU's turn
ended (so never inside a probe's single-step, a detour or a trampoline, none of which
makes a hypercall), and only to a CPU whose RFLAGS.IF is set: the kernel's
``local_irq_disable``/``local_irq_save`` (cli, pushf/popf) hold them off exactly as on
hardware.  Delivery pushes ss, rsp, rflags, cs and rip on the current kernel stack
(aligned to 16 bytes), then the vector in pt_regs->orig_ax's place, clears IF and TF
and enters ``asm_common_interrupt`` (arch/entry.S), which saves the registers, calls
``common_interrupt`` and returns with ``iretq``; the kernel's GDT holds the two
descriptors iretq checks.

Sources:

- the timer (IRQ 0): HZ times a second of the host's clock, per CPU, delivered where
  the CPU's turn ends.  A turn ends where it always did (idle, a spin's yield, a return
  to user mode, a self-IPI; the tick does not end one itself, which would make the
  CPUs' interleaving depend on the host's timing, and the machine's order of events
  is a function of its inputs).  So the ticks due during a turn, or while the CPU
  idled or had interrupts off, come as one, when it next runs;
- the NIC (IRQ 11): raised when the host fills the receive ring, and routed to an idle
  CPU, which it wakes (sti; hlt).  The net code's locks are not bottom-half safe (it has
  no spin_lock_bh), so the NET_RX softirq this interrupt raises must not run on top of
  a task that may hold them: the line waits for an idle CPU;
- self-IPIs (``HC_SELF_IPI``: irq_work's IRQ_WORK_VECTOR), on the CPU that sent them.
"""

from __future__ import annotations

import struct
import time

from unicorn.x86_const import (
    UC_X86_REG_CS, UC_X86_REG_GDTR, UC_X86_REG_RFLAGS, UC_X86_REG_RIP, UC_X86_REG_RSP,
    UC_X86_REG_SS,
)

from .cpu import KERNEL_CS, KERNEL_DS
from .memory import FaultError

__all__ = ["InterruptController", "ISA_IRQ_VECTOR", "TIMER_IRQ", "NIC_IRQ",
           "IRQ_WORK_VECTOR", "X86_EFLAGS_IF"]

X86_EFLAGS_IF = 0x200
_X86_EFLAGS_TF = 0x100
TIMER_IRQ, NIC_IRQ = 0, 11
IRQ_WORK_VECTOR = 0xF6
_FRAME = struct.Struct("<6Q")       # vector, rip, cs, rflags, rsp, ss


def ISA_IRQ_VECTOR(irq: int) -> int:   # noqa: N802 (the kernel's name)
    return 0x30 + irq


class InterruptController:
    """Pending interrupts per CPU, and their delivery at a slice boundary.  ``kernel``
    is the machine (its Unicorn, memory, symbols and CPUs); every method runs on the
    thread that drives it, under its lock."""

    def __init__(self, kernel, hz: int):
        self.kernel = kernel
        #: Timer interrupts a second per CPU (``Kernel(hz=0)``: no timer).
        self.hz = hz
        self._entry = kernel.image.symbol_value("asm_common_interrupt")
        self._pending: list[set[int]] = [set() for _ in kernel.cpus]
        self._next_tick = [0.0] * len(kernel.cpus)
        #: Interrupts delivered, by vector (for tests and status).
        self.delivered: dict[int, int] = {}
        self._nic_waiting = 0

    def load_descriptors(self) -> None:
        """Point GDTR at the kernel's gdt_table and load the kernel's code and stack
        segments (the state every CPU starts from)."""
        uc = self.kernel.uc
        gdt = self.kernel.image.symbol_value("gdt_table")
        uc.reg_write(UC_X86_REG_GDTR, (0, gdt, 4 * 8 - 1, 0))
        uc.reg_write(UC_X86_REG_CS, KERNEL_CS)
        uc.reg_write(UC_X86_REG_SS, KERNEL_DS)

    # ---- sources ------------------------------------------------------------------------
    def self_ipi(self, vector: int) -> None:
        """HC_SELF_IPI on the CPU running now: the vector is pending on it."""
        self._pending[self.kernel.cpu.index].add(vector & 0xFF)

    def raise_nic(self) -> None:
        """The NIC's line: delivered to the next CPU found idle."""
        self._nic_waiting += 1

    def pending(self, cpu) -> bool:
        """Whether an interrupt is pending on cpu."""
        return bool(self._pending[cpu.index])

    def has_work(self) -> bool:
        """Whether an interrupt waits for an idle CPU."""
        return bool(self._nic_waiting)

    def wake_idle(self, cpu) -> bool:
        """cpu is idle: give it the NIC's interrupt if one waits (it then runs).
        Returns whether it did."""
        if not self._nic_waiting:
            return False
        self._nic_waiting = 0        # one interrupt drains the whole ring
        self._pending[cpu.index].add(ISA_IRQ_VECTOR(NIC_IRQ))
        return True

    def context_flags(self, cpu) -> int:
        """The trace context flags of the code cpu runs now (inside a hook): irqs off
        (0x01), hardirq (0x08), serving a softirq (0x10), as 6.1's tracing_gen_ctx."""
        k = self.kernel
        count = int.from_bytes(k.mem.read(cpu.gs_base + k.kabi["pcpu.preempt_count"], 4),
                               "little")
        flags = 0 if k.fast.get(UC_X86_REG_RFLAGS) & X86_EFLAGS_IF else 0x01
        if count & 0xF0000:
            flags |= 0x08
        if count & 0x100:
            flags |= 0x10
        return flags

    # ---- delivery -----------------------------------------------------------------------
    def before_turn(self, cpu) -> None:
        """cpu is about to run (its registers loaded): count its tick and deliver the
        highest pending vector if its interrupt flag is set."""
        pending = self._pending[cpu.index]
        if self.hz:
            now = time.monotonic()
            if now >= self._next_tick[cpu.index]:
                if self._next_tick[cpu.index]:
                    pending.add(ISA_IRQ_VECTOR(TIMER_IRQ))
                self._next_tick[cpu.index] = now + 1.0 / self.hz
        if not pending:
            return
        fast = self.kernel.fast
        flags = fast.get(UC_X86_REG_RFLAGS)
        if not flags & X86_EFLAGS_IF:
            return
        vector = max(pending)
        sp = fast.get(UC_X86_REG_RSP)
        frame = (sp & ~0xF) - _FRAME.size
        try:
            self.kernel.mem.write(frame, _FRAME.pack(vector, fast.get(UC_X86_REG_RIP),
                                                     KERNEL_CS, flags, sp, KERNEL_DS))
        except FaultError:
            return                  # no stack to take it on: it stays pending
        pending.discard(vector)
        self.delivered[vector] = self.delivered.get(vector, 0) + 1
        fast.set(UC_X86_REG_RSP, frame)
        fast.set(UC_X86_REG_RFLAGS, flags & ~(X86_EFLAGS_IF | _X86_EFLAGS_TF))
        fast.set(UC_X86_REG_RIP, self._entry)
