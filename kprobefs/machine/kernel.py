"""The machine: Unicorn CPUs running the kernel image, hypercalls, traps, tasks and
system calls made on behalf of host code.

Every virtual CPU has its own saved Unicorn context; one thread at a time drives the
emulator (whoever holds ``Kernel.lock``), running the online CPUs round-robin on one
thread.  A CPU's turn ends at a hypercall: when it idles, spins on a lock, or returns a
task to user mode while another CPU has work.  The kernel is not preemptible
(CONFIG_PREEMPT=n), so the order of events is a function of the inputs alone and a run
is reproducible for a given seed; a watchdog stops a CPU that never makes a hypercall.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from unicorn import (
    UC_ARCH_X86, UC_HOOK_INSN_INVALID, UC_MODE_64, Uc, UcError,
)
from unicorn.x86_const import (
    UC_X86_REG_CR0, UC_X86_REG_CR3, UC_X86_REG_CR4, UC_X86_REG_GS_BASE, UC_X86_REG_RFLAGS,
    UC_X86_REG_R8, UC_X86_REG_R9, UC_X86_REG_R10, UC_X86_REG_RAX, UC_X86_REG_RCX,
    UC_X86_REG_RDI, UC_X86_REG_RDX, UC_X86_REG_RIP, UC_X86_REG_RSI, UC_X86_REG_RSP,
)

from ..errors import KernelError, KernelOops, KernelWedged, MachineError
from . import abi
from .abi import HC
from .clock import TscClock
from .cpu import (
    KERNEL_CS, KERNEL_DS, PT_REGS_SIZE, UC_REG, Registers, pack_pt_regs, unpack_pt_regs,
)
from ._fastuc import FastRegs, RegSet, add_code_hook, add_intr_hook
from ._quirks import clear_exception_state
from .image import FENTRY_NOP, KernelImage
from .module import ModuleLoader
from .memory import (
    EFER_NXE, PAGE, PAGE_OFFSET, USER_WINDOW_BASE, USER_WINDOW_SIZE, AddressSpace, FaultError,
    PhysicalLayout,
)

__all__ = ["Kernel", "Task", "UserBuffer", "SyscallRequest", "Cpu"]

log = logging.getLogger("kprobefs.machine")

MSR_EFER = 0xC0000080
_U64 = 0xFFFFFFFFFFFFFFFF
_VECTOR_STUB = {0: "asm_exc_divide_error", 1: "asm_exc_debug", 3: "asm_exc_int3",
                6: "asm_exc_invalid_op", 13: "asm_exc_general_protection",
                14: "asm_exc_page_fault"}
_HAS_ERROR_CODE = {13, 14}
#: Vectors after which QEMU records an exception in progress (see _quirks).
_CONTRIBUTORY = {0, 8, 10, 11, 12, 13, 14}
HZ = 250


def _signed(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


class UserBuffer:
    """An output buffer for a system call: size bytes of user memory whose contents are
    copied back into ``data`` when the call returns."""

    def __init__(self, size: int, initial: bytes = b""):
        self.size = size
        self.data = bytes(initial[:size]).ljust(size, b"\0")
        self.addr: int | None = None


@dataclass(eq=False)
class Task:
    """The host's record of a user task (one with a user window)."""

    pid: int
    comm: str = ""
    window: int = 0
    regs_ptr: int = 0
    state: str = "kernel"  # kernel: running in the kernel; user: waiting; dead
    pending: collections.deque = field(default_factory=collections.deque)
    active: SyscallRequest | None = None
    exit_code: int | None = None
    scratch: int = 0


@dataclass(eq=False)
class SyscallRequest:
    """One system call in flight.  ``result`` is the raw return value (negative errno on
    failure); ``error`` is set when the task died (oops or exit) instead of returning."""

    task: Task
    nr: int
    name: str
    args: tuple
    done: threading.Event = field(default_factory=threading.Event)
    result: int | None = None
    error: Exception | None = None
    outputs: list = field(default_factory=list)
    on_done: Callable | None = None


@dataclass(eq=False)
class Cpu:
    """One virtual CPU."""

    index: int
    ctx: object = None
    state: str = "offline"  # offline, running, idle, halted, wedged
    resume_rax: int | None = None
    gs_base: int = 0
    current_pa: int = 0      # physical address of this CPU's pcpu.current_task


class Kernel:
    """The emulated kernel, booted and ready for system calls.

    ``Kernel(cpus=2, seed=0)`` boots the bundled image.  ``spawn(comm)`` creates a user
    task through kernel_clone(); ``syscall(task, name, *args)`` runs a real system call,
    with str arguments copied in as NUL-terminated user strings, bytes as user buffers and
    :class:`UserBuffer` as output buffers.
    """

    #: Unicorn checks every code hook's range on each hooked instruction, so hooks cost
    #: O(hooks) per hit; past this many, breakpoints are delivered as real #BP traps.
    FAST_HOOK_BUDGET = 64
    #: A CPU that runs this long without a hypercall is stopped and taken out of service.
    WEDGE_SECONDS = 5.0
    #: How long submit() waits for the machine lock.
    LOCK_TIMEOUT = 30.0
    #: Bound on live user tasks (each has a user window).
    MAX_TASKS = 4096

    def __init__(self, cpus: int = 2, seed: int = 0, image: str | None = None,
                 ram_mb: int = 256, pid_auto_base: int = 300):
        if not 1 <= cpus <= 8:
            raise ValueError("cpus must be between 1 and 8")
        self.seed = seed
        self.nr_cpus = cpus
        self.image = KernelImage(image)
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self.uc = Uc(UC_ARCH_X86, UC_MODE_64)
        self.layout = PhysicalLayout(ram_mb=ram_mb)
        self.mem = AddressSpace(self.uc, self.layout)
        self.regs = Registers(self.uc)
        self.fast = FastRegs(self.uc)
        self._breakpoints: dict[int, int] = {}          # addr -> code hook
        self._trap_breakpoints: dict[int, Callable] = {}  # addr -> handler, via #BP
        self._raw_hooks: set[int] = set()
        self._bp_declined: int | None = None
        self.cpus = [Cpu(i) for i in range(cpus)]
        self.cpu: Cpu | None = None  # the CPU emulating now (inside emu_start)
        self._loaded_cpu: Cpu | None = None
        self.tasks: dict[int, Task] = {}
        self._free_windows: list[int] = []
        self._next_window = 0
        self._wakeups: collections.deque = collections.deque()  # idle-loop words
        self._trap_handlers: dict[int, list] = collections.defaultdict(list)
        self.exit_listeners: list[Callable[[int], None]] = []
        #: Called after every slice (the engine's delayed optimizer lives here).
        self.tick_listeners: list[Callable[[], None]] = []
        self.console: list[str] = []
        self.hostfs = None  # set by the layer that serves debugfs/tracefs/proc
        self.panicked: str | None = None
        self.booted = False
        self._boot_ns = time.monotonic_ns()
        #: The trace clock (trace_clock "local"): the TSC, read alike by the host and by
        #: the kernel's own recorder (machine/clock.py).
        self.trace_clock = TscClock()
        self.trace_clock_ns = self.trace_clock.ns
        self._in_emulation = 0
        self._hypercalls = {
            HC.IDLE: self._hc_idle, HC.SYSCALL_DONE: self._hc_syscall_done,
            HC.TASK_NEW: self._hc_task_new, HC.TASK_EXIT: self._hc_task_exit,
            HC.IRET: self._hc_iret, HC.CLOCK: self._hc_clock, HC.CONSOLE: self._hc_console,
            HC.PANIC: self._hc_panic, HC.BOOTED: self._hc_booted,
            HC.UPCALL_DONE: self._hc_upcall_done, HC.YIELD: self._hc_yield,
        }
        self._closing = False
        self._slice_started: float | None = None
        self._wedge: Cpu | None = None
        self._emu_thread: int | None = None
        #: (cpu, ip) of every stop the watchdog made.
        self.wedged: list[tuple[int, int]] = []
        self._load(pid_auto_base)
        self._boot()
        #: Loadable modules (load, unload, /proc/modules, the module notifier chain).
        self.modules = ModuleLoader(self)
        threading.Thread(target=self._watchdog, name="kprobefs-watchdog", daemon=True).start()

    # ==== loading and boot ==================================================================
    def _sym(self, name: str) -> int:
        addr = self.image.symbol_value(name)
        if addr is None:
            raise MachineError(f"kernel image lacks symbol {name}")
        return addr

    def _load(self, pid_auto_base: int) -> None:
        img = self.image
        end_pa = 0
        for seg in img.segments:
            self.mem.ram[seg.paddr:seg.paddr + seg.memsz] = seg.data + bytes(seg.memsz - len(seg.data))
            end_pa = max(end_pa, seg.paddr + seg.memsz)
        heap = self.layout.place_heap(end_pa)
        self.mem.set_user_pool(heap[1])
        self.mem.setup_kernel_mappings(img.segments)
        # Linux's ftrace_init: every `call __fentry__` becomes a 5-byte NOP.
        fentry = self._sym("__fentry__")
        for site in img.ftrace_sites:
            insn = self.mem.read(site, 5)
            target = (site + 5 + struct.unpack("<i", insn[1:])[0]) & _U64
            if insn[0] != 0xE8 or target != fentry:
                raise MachineError(f"ftrace site {site:#x} is not a call to __fentry__")
            self.mem.write(site, FENTRY_NOP)
        self.kabi = self._read_kabi()
        self.mem.write(self._sym("trace_clock_tsc"), self.trace_clock.kernel_layout())
        bp = self._sym("boot_params")
        self.mem.write(bp, struct.pack("<4Q", self.nr_cpus, heap[0], heap[1], pid_auto_base))
        # The host's own scratch page in kernel memory, for call_function() strings.
        self._host_scratch = PAGE_OFFSET + 0x900000
        # CPU state common to all: long mode with paging, write protection honoured.
        uc = self.uc
        uc.reg_write(UC_X86_REG_CR3, self.mem.pml4)
        uc.reg_write(UC_X86_REG_CR4, uc.reg_read(UC_X86_REG_CR4) | (1 << 5))
        uc.reg_write(UC_X86_REG_CR0, uc.reg_read(UC_X86_REG_CR0) | (1 << 31) | (1 << 16) | 1)
        uc.msr_write(MSR_EFER, uc.msr_read(MSR_EFER) | EFER_NXE)
        uc.reg_write(UC_X86_REG_RFLAGS, 0x2)
        add_intr_hook(uc, self._on_interrupt)
        uc.hook_add(UC_HOOK_INSN_INVALID, self._on_invalid_insn)
        self._pcpu_area = self._sym("pcpu_area")
        self._host_call_return = self._sym("host_call_return")
        self._scratch_depth = 0
        self._upcall_results: dict[int, int] = {}
        self._task_pid_off = self.kabi["task.pid"]
        # Writing ip makes Unicorn leave the current block: ip is not part of the set.
        self._gprs = RegSet(self.uc, [reg for name, reg in UC_REG.items()
                                      if name not in ("cs", "ss", "ip")])
        self._hc_args = RegSet(self.uc, [UC_X86_REG_RDI, UC_X86_REG_RSI, UC_X86_REG_RDX,
                                         UC_X86_REG_R10, UC_X86_REG_R8])

    def _read_kabi(self) -> dict[str, int]:
        out, p = {}, self._sym("kabi")
        while True:
            name_ptr, value = struct.unpack("<QQ", self.mem.read(p, 16))
            if not name_ptr:
                return out
            out[self.mem.read_cstring(name_ptr).decode()] = value
            p += 16

    def _start_cpu(self, cpu: Cpu, entry: int, stack_top: int) -> None:
        uc = self.uc
        cpu.gs_base = self._pcpu_area + cpu.index * self.kabi["pcpu.size"]
        cpu.current_pa = self.mem.translate(cpu.gs_base + self.kabi["pcpu.current_task"])
        uc.reg_write(UC_X86_REG_GS_BASE, cpu.gs_base)
        uc.reg_write(UC_X86_REG_RSP, stack_top - 8)
        uc.reg_write(UC_X86_REG_RIP, entry)
        uc.reg_write(UC_X86_REG_RFLAGS, 0x2)
        cpu.ctx = uc.context_save()
        self._loaded_cpu = cpu
        cpu.state = "running"

    def _boot(self) -> None:
        top = self._sym("idle_stack_top")
        init_stack = self._sym("init_thread_union") + self.kabi["thread_size"]
        self._start_cpu(self.cpus[0], self._sym("start_kernel"), init_stack)
        self._idle_stack_top = top
        with self.lock:
            self._drive(lambda: self.booted and 1 in self.tasks
                        and self.tasks[1].state == "user")
        self.init_task = self.tasks[1]
        self.init_task.comm = "init"

    # ==== the run loop ======================================================================
    def _switch_cpu(self, cpu: Cpu) -> None:
        if self._loaded_cpu is cpu:
            return
        if self._loaded_cpu is not None:
            self.uc.context_update(self._loaded_cpu.ctx)
        self.uc.context_restore(cpu.ctx)
        self._loaded_cpu = cpu

    def runnable(self) -> bool:
        """Whether any CPU has work (or could take some)."""
        if any(c.state == "running" for c in self.cpus):
            return True
        return bool(self._wakeups) and any(c.state == "idle" for c in self.cpus)

    def _dispatch_wakeups(self) -> None:
        for cpu in self.cpus:
            if not self._wakeups:
                return
            if cpu.state == "idle":
                cpu.resume_rax = self._wakeups.popleft()
                cpu.state = "running"

    def run_slice(self) -> bool:
        """Give every CPU that has work one turn.  Returns False when the machine
        is quiescent (every CPU idle and nothing queued).  Caller holds ``lock``."""
        if self._in_emulation:
            raise MachineError("the machine cannot be driven from inside a hook")
        if self.panicked:
            raise MachineError(f"kernel panic: {self.panicked}")
        self._dispatch_wakeups()
        ran = False
        for cpu in self.cpus:
            if cpu.state != "running":
                continue
            ran = True
            self._switch_cpu(cpu)
            if cpu.resume_rax is not None:
                self.fast.set(UC_X86_REG_RAX, cpu.resume_rax)
                cpu.resume_rax = None
            self._emulate(cpu)
        self._update_jiffies()
        for tick in self.tick_listeners:
            tick()
        return ran

    def _emulate(self, cpu: Cpu) -> None:
        """Run cpu until it ends its turn at a hypercall (idle, yield, a return to user
        mode while another CPU waits), or the watchdog stops it."""
        self.cpu = cpu
        self._in_emulation += 1
        self._emu_thread = threading.get_ident()
        self._slice_started = time.monotonic()
        try:
            rip = self.fast.get(UC_X86_REG_RIP)
            self.uc.emu_start(rip, 0)
        except UcError as e:
            self._cpu_error(cpu, e)
        finally:
            self._slice_started = None
            self._in_emulation -= 1
            self.cpu = None
        if self._wedge is cpu:
            # Spinning without a hypercall: take the CPU out of service (its task and any
            # request on it never finish; their callers time out) and keep the rest going.
            self._wedge = None
            rip = self.fast.get(UC_X86_REG_RIP)
            self.wedged.append((cpu.index, rip))
            cpu.state = "wedged"
            log.error("cpu%d: no hypercall for %.0f s, spinning at %s: taken out of service",
                      cpu.index, self.WEDGE_SECONDS, self.image.format_address(rip))

    def _others_running(self) -> bool:
        cur = self.cpu
        return any(c.state == "running" and c is not cur for c in self.cpus) or (
            bool(self._wakeups) and any(c.state == "idle" for c in self.cpus))

    def _end_turn(self) -> None:
        """Let the next CPU run (round-robin) after this hypercall returns."""
        if self._others_running():
            self.uc.emu_stop()

    def _watchdog(self) -> None:
        """Stop a CPU that has run WEDGE_SECONDS without a hypercall (a probe on a tight
        loop, a kernel bug): the machine stays responsive and says which CPU it was."""
        while not self._closing:
            time.sleep(0.25)
            started, cpu = self._slice_started, self.cpu
            if started is not None and cpu is not None and \
                    time.monotonic() - started > self.WEDGE_SECONDS:
                self._slice_started = None
                if not self._in_host_code():
                    self._wedge = cpu
                    self.uc.emu_stop()
                else:
                    log.error("cpu%d: a host handler has run for %.0f s and not returned",
                              cpu.index, self.WEDGE_SECONDS)

    def _in_host_code(self) -> bool:
        """Whether the emulating thread is running Python (a hook or handler) rather than
        emulated code, which it runs inside emu_start with the GIL released."""
        frame = sys._current_frames().get(self._emu_thread)
        return frame is not None and frame.f_code.co_name != "emu_start"

    def _hc_yield(self):
        self._end_turn()
        return 0

    def _cpu_error(self, cpu: Cpu, err: UcError) -> None:
        rip = self.uc.reg_read(UC_X86_REG_RIP)
        log.error("cpu%d: emulator error %s at %s", cpu.index, err,
                  self.image.format_address(rip))
        self.panicked = f"cpu{cpu.index}: {err} at {self.image.format_address(rip)}"
        cpu.state = "halted"

    def _update_jiffies(self) -> None:
        j = (time.monotonic_ns() - self._boot_ns) * HZ // 1_000_000_000
        # jiffies wraps (unsigned long) five minutes after boot, as Linux's does.
        self.mem.write(self._jiffies_addr, struct.pack("<Q", (j + self._jiffies_base) & _U64))

    @property
    def _jiffies_addr(self) -> int:
        return self._sym("jiffies")

    #: Linux starts jiffies 5 minutes before wrap-around so wrap bugs show early.
    _jiffies_base = (1 << 64) - 300 * HZ

    @contextlib.contextmanager
    def _locked(self, timeout: float | None):
        """Hold the machine lock, waiting at most timeout seconds for it: a thread stuck
        in the emulation (a handler that never returns) must not hang its callers."""
        if not self.lock.acquire(timeout=-1 if timeout is None else timeout):
            raise KernelWedged(f"the machine has been busy for {timeout:g} s")
        try:
            yield
        finally:
            self.lock.release()

    def _drive(self, done: Callable[[], bool], timeout: float | None = None) -> None:
        """Run the machine until done() holds.  Raises KernelWedged when done() is still
        false after timeout seconds, busy or not; with timeout None, as soon as the
        kernel is idle with done() false."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done():
            ran = self.run_slice()
            if deadline is not None and time.monotonic() >= deadline:
                raise KernelWedged("the awaited event has not happened in "
                                   f"{timeout:g} s ({'busy' if ran else 'idle'} kernel)")
            if ran:
                continue
            if deadline is None:
                raise KernelWedged("the kernel is idle but the awaited event has not happened")
            self._cond.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))

    def run_until_idle(self, max_slices: int = 1_000_000) -> None:
        """Run until every CPU is idle."""
        with self.lock:
            for _ in range(max_slices):
                if not self.run_slice():
                    return
            raise KernelWedged("the kernel did not go idle")

    # ==== interrupts and hypercalls =========================================================
    def _on_interrupt(self, _handle, intno, _user_data) -> None:
        uc = self.uc
        try:
            if intno == abi.HYPERCALL_VECTOR:
                nr = self.fast.get(UC_X86_REG_RAX)
                handler = self._hypercalls.get(nr)
                ret = handler() if handler else self._hostfs_hypercall(nr)
                if ret is not None:
                    self.fast.set(UC_X86_REG_RAX, ret)
                return
            if intno in _CONTRIBUTORY:
                clear_exception_state(uc)
                if intno == 8:  # only ever a page fault Unicorn mistook for a nested one
                    intno = 14
            ip = self.fast.get(UC_X86_REG_RIP)
            declined, self._bp_declined = self._bp_declined, None
            if intno == 3 and declined != ip - 1:
                handler = self._trap_breakpoints.get(ip - 1)
                if handler is not None and handler(self, self.cpu, ip):
                    return
            if not (intno == 3 and declined == ip - 1) and self._run_trap_handlers(intno, ip):
                return
            self._deliver_exception(intno)
        except Exception as e:  # a bug in a handler must not unwind through Unicorn
            log.exception("host handler failed on vector %#x", intno)
            self.panicked = f"host handler failed: {e!r}"
            uc.emu_stop()

    def _on_invalid_insn(self, uc, _user_data) -> bool:
        self._deliver_exception(6)
        return True

    def _deliver_exception(self, vector: int) -> None:
        """Enter the kernel's handler for vector: push a pt_regs frame on the current
        stack and jump to its asm stub (the hardware's job, done here)."""
        uc = self.uc
        stub = _VECTOR_STUB.get(vector)
        if stub is None:
            self.panicked = f"unexpected exception vector {vector}"
            uc.emu_stop()
            return
        regs = self.regs.snapshot()
        regs["orig_ax"] = 0 if vector in _HAS_ERROR_CODE else _U64
        regs["cs"], regs["ss"] = KERNEL_CS, KERNEL_DS
        frame = ((regs["sp"] - PT_REGS_SIZE - 64) & ~0xF)
        try:
            self.mem.write(frame, pack_pt_regs(regs))
        except FaultError:
            self.panicked = f"exception {vector} with a bad stack at {regs['ip']:#x}"
            uc.emu_stop()
            return
        uc.reg_write(UC_X86_REG_RSP, frame)
        uc.reg_write(UC_X86_REG_RIP, self._sym(stub))
        uc.reg_write(UC_X86_REG_RFLAGS, regs["flags"] & ~0x100)

    def _run_trap_handlers(self, vector: int, ip: int) -> bool:
        for handler in self._trap_handlers.get(vector, ()):
            if handler(self, self.cpu, ip):
                return True
        return False

    def add_trap_handler(self, vector: int, handler: Callable) -> None:
        """handler(kernel, cpu, ip) -> bool runs on a trap before the kernel sees it: a
        breakpoint (3; ip is the address after the int3), a single-step (1), or a fault
        (14, 13, ...; ip is the faulting instruction).  True means handled: the handler has
        set the CPU's ip (with set_ip) to where execution resumes.  False passes the trap
        on (a fault handler may first move ip, e.g. back to a probed address)."""
        self._trap_handlers[vector].append(handler)

    def remove_trap_handler(self, vector: int, handler: Callable) -> None:
        self._trap_handlers[vector].remove(handler)

    def _args(self):
        """The hypercall's five arguments (rdi, rsi, rdx, r10, r8), in one C call."""
        return self._hc_args.read()

    def add_hypercall(self, name: str, handler: Callable[..., int]) -> None:
        """Serve the hypercall ``HC_<name>`` of include/kernel.h (``abi.HC``) with
        ``handler(a1, a2, a3, a4, a5) -> int`` (the value the kernel gets back).  It runs
        on the emulation thread, in the CPU's turn.  MachineError if it is served."""
        nr = getattr(HC, name)
        if nr in self._hypercalls:
            raise MachineError(f"hypercall {name} is already served")
        self._hypercalls[nr] = lambda: handler(*self._args())

    def _hc_idle(self):
        if self._wakeups:
            return self._wakeups.popleft()
        self.cpu.state = "idle"
        self.uc.emu_stop()
        return 0

    def _hc_booted(self):
        self.booted = True
        for cpu in self.cpus[1:]:
            saved = self._loaded_cpu
            self.uc.context_update(saved.ctx)
            stack = self.mem.read_u64(self._idle_stack_top + 8 * cpu.index)
            self._start_cpu(cpu, self._sym("start_secondary"), stack)
            self.uc.context_restore(saved.ctx)
            self._loaded_cpu = saved
        return 0

    def _hc_clock(self):
        return self.clock_ns()

    def clock_ns(self) -> int:
        """Nanoseconds since boot: the kernel's clock (ktime_get_ns), also trace_clock's
        `local`."""
        return time.monotonic_ns() - self._boot_ns

    def _hc_console(self):
        buf, length, level, _, _ = self._args()
        text = self.mem.read(buf, min(length, 1024)).decode("utf-8", "replace").rstrip("\n")
        self.console.append(text)
        del self.console[:-1000]
        log.log(logging.WARNING if level <= 4 else logging.DEBUG, "kernel: %s", text)
        return 0

    def _hc_panic(self):
        msg = self.mem.read_cstring(self._args()[0], 256).decode("utf-8", "replace")
        self.panicked = msg
        log.critical("kernel panic: %s", msg)
        self.uc.emu_stop()
        return 0

    def _hc_iret(self):
        frame = unpack_pt_regs(self.mem.read(self._args()[0], PT_REGS_SIZE))
        self.regs.restore(frame)
        return None

    def _hc_upcall_done(self):
        self._upcall_results[self.cpu.index] = _signed(self._args()[0])
        return 0

    def upcall(self, func: int | str, *args: int, timeout: float | None = 30.0) -> int:
        """Run func(*args) (up to six integers) on an idle CPU, as a work item of its
        idle loop, and return its result.  Drives the machine; call from outside hooks."""
        if isinstance(func, str):
            func = self._sym(func)
        if len(args) > 6:
            raise ValueError("at most six arguments")
        with self._locked(timeout):
            self._drive(lambda: any(c.state == "idle" for c in self.cpus), timeout)
            cpu = next(c for c in self.cpus if c.state == "idle")
            slot = cpu.gs_base + self.kabi["pcpu.upcall"]
            values = self._kernel_args(args, self._host_scratch + 0x8000 * (1 + cpu.index))
            values += [0] * (6 - len(values))
            self.mem.write(slot, struct.pack("<7Q", func, *values))
            self._upcall_results.pop(cpu.index, None)
            cpu.resume_rax = abi.IDLE_UPCALL
            cpu.state = "running"
            self._drive(lambda: cpu.index in self._upcall_results, timeout)
            return self._upcall_results.pop(cpu.index)

    def _hostfs_hypercall(self, nr):
        if self.hostfs is None or not HC.HOSTFS_LOOKUP <= nr <= HC.HOSTFS_READDIR:
            return -38  # ENOSYS
        return self.hostfs.hypercall(self, nr, self._args())

    # ---- tasks ---------------------------------------------------------------------------
    def _hc_task_new(self):
        pid, _ppid = self._args()[:2]
        pid = _signed(pid)
        if self._free_windows:
            slot = self._free_windows.pop()
        elif self._next_window < self.MAX_TASKS:
            slot, self._next_window = self._next_window, self._next_window + 1
        else:
            return -11  # EAGAIN: the fork fails, as at RLIMIT_NPROC
        base = USER_WINDOW_BASE + slot * USER_WINDOW_SIZE
        self.tasks[pid] = Task(pid=pid, window=base)
        return base

    def _hc_task_exit(self):
        pid, code = self._args()[:2]
        pid = _signed(pid)
        task = self.tasks.pop(pid, None)
        if task is None:
            return 0
        task.state = "dead"
        task.exit_code = _signed(code)
        oops = self.mem.read(self._current_task_ptr() + self.kabi["task.oops"], 4) != bytes(4)
        reqs = ([task.active] if task.active else []) + list(task.pending)
        for req in reqs:
            if oops:
                req.error = KernelOops(f"task {pid} ({task.comm}) oopsed in {req.name}")
            else:
                req.error = ProcessExited(pid, task.exit_code)
            self._finish(req)
        task.active = None
        task.pending.clear()
        self.mem.release_user_window(task.window)
        self.mem.flush_tlb()
        self._free_windows.append((task.window - USER_WINDOW_BASE) // USER_WINDOW_SIZE)
        for listener in self.exit_listeners:
            listener(pid)
        return 0

    def _current_task_ptr(self) -> int:
        return struct.unpack_from("<Q", self.mem.ram, self.cpu.current_pa)[0]

    def current_pid(self) -> int:
        """Pid of the task running on the current CPU (inside a hook)."""
        task = struct.unpack_from("<Q", self.mem.ram, self.cpu.current_pa)[0]
        return struct.unpack_from("<i", self.mem.ram,
                                  self.mem.translate(task + self._task_pid_off))[0]

    def current_comm(self) -> str:
        t = self._current_task_ptr()
        return self.mem.read_cstring(t + self.kabi["task.comm"], 16).decode("utf-8", "replace")

    def _hc_syscall_done(self):
        ret, pid, regs_ptr = self._args()[:3]
        task = self.tasks.get(_signed(pid))
        if task is None:
            return 0
        task.regs_ptr = regs_ptr
        if task.active is not None:
            req, task.active = task.active, None
            req.result = _signed(ret)
            self._copy_out(req)
            self._finish(req)
        self._end_turn()
        if task.pending:
            self._load_request(task, task.pending.popleft())
            return 1
        task.state = "user"
        return 0

    def _finish(self, req: SyscallRequest) -> None:
        req.done.set()
        if req.on_done is not None:
            req.on_done(req)
        self._cond.notify_all()

    # ---- system calls --------------------------------------------------------------------
    def _marshal(self, task: Task, req: SyscallRequest) -> list[int]:
        """Copy arguments into the task's user window; returns the register values."""
        cursor = task.window + PAGE
        out = []
        for a in req.args:
            if isinstance(a, str):
                a = a.encode() + b"\0"
            if isinstance(a, (bytes, bytearray, memoryview)):
                data = bytes(a)
                self.mem.ensure_user_pages(cursor, len(data))
                self.mem.write(cursor, data)
                out.append(cursor)
                cursor += (len(data) + 15) & ~15
            elif isinstance(a, UserBuffer):
                self.mem.ensure_user_pages(cursor, a.size)
                self.mem.write(cursor, a.data)
                a.addr = cursor
                req.outputs.append(a)
                out.append(cursor)
                cursor += (a.size + 15) & ~15
            elif isinstance(a, int):
                out.append(a & _U64)
            else:
                raise TypeError(f"cannot pass {type(a).__name__} to a system call")
            if cursor > task.window + USER_WINDOW_SIZE:
                raise KernelError(7, "system call arguments exceed the user window")
        return out

    def _load_request(self, task: Task, req: SyscallRequest) -> None:
        values = self._marshal(task, req)
        values += [0] * (6 - len(values))
        regs = dict(zip(("di", "si", "dx", "r10", "r8", "r9"), values))
        regs["orig_ax"] = req.nr
        regs["ax"] = (-38) & _U64
        self.mem.write(task.regs_ptr, pack_pt_regs(regs))
        task.active = req
        task.state = "kernel"

    def _copy_out(self, req: SyscallRequest) -> None:
        for buf in req.outputs:
            buf.data = self.mem.read(buf.addr, buf.size)

    def submit(self, task: Task, name: str, *args, on_done: Callable | None = None
               ) -> SyscallRequest:
        """Queue a system call for task without waiting for it."""
        try:
            nr = abi.SYSCALLS[name] if isinstance(name, str) else int(name)
        except KeyError:
            raise ValueError(f"unknown system call {name!r}") from None
        req = SyscallRequest(task, nr, str(name), args, on_done=on_done)
        with self._locked(self.LOCK_TIMEOUT):
            if task.state == "dead":
                raise ProcessExited(task.pid, task.exit_code)
            if task.state == "user" and task.active is None and not task.pending:
                self._load_request(task, req)
                self._wakeups.append(abi.IDLE_WAKE_TASK | (task.pid << 8))
            else:
                task.pending.append(req)
            self._cond.notify_all()
        return req

    def wait(self, req: SyscallRequest, timeout: float | None = 30.0) -> int:
        """Drive the machine until req completes; returns its raw result.  Raises what
        the task died of, or KernelWedged if it cannot complete within timeout."""
        with self._locked(timeout):
            self._drive(req.done.is_set, timeout)
        if req.error is not None:
            raise req.error
        return req.result

    def syscall(self, task: Task, name: str, *args, timeout: float | None = 30.0) -> int:
        """Run one system call for task and return its raw result (negative errno on
        failure, as the syscall instruction returns it)."""
        return self.wait(self.submit(task, name, *args), timeout)

    def sys(self, task: Task, name: str, *args) -> int:
        """Like syscall(), but a negative result raises KernelError."""
        ret = self.syscall(task, name, *args)
        if -4095 <= ret < 0:
            raise KernelError(-ret, name)
        return ret

    def spawn(self, comm: str, pid: int | None = None, parent: Task | None = None,
              timeout: float | None = 30.0) -> Task:
        """A new user task forked (clone3) from parent (default: init) and named comm.
        With pid, the task gets exactly that pid (clone3's set_tid).  Raises
        KernelWedged if the kernel does not finish within timeout seconds."""
        parent = parent or self.init_task
        # Arguments are laid out from the start of the parent's scratch page, so the
        # set_tid array's user address is known before the call is marshalled.
        set_tid_addr = parent.window + PAGE + 88
        clone_args = struct.pack("<11Q", 0, 0, 0, 0, 17, 0, 0, 0,
                                 set_tid_addr if pid else 0, 1 if pid else 0, 0)
        child = self.syscall(parent, "clone3", clone_args + struct.pack("<q", pid or 0), 88,
                             timeout=timeout)
        if child < 0:
            raise KernelError(-child, "clone3")
        task = self.tasks[child]
        if self.syscall(task, "prctl", abi.PR_SET_NAME, comm.encode()[:15] + b"\0",
                        timeout=timeout) == 0:
            task.comm = comm[:15]
        return task

    # ==== helpers for the layers above ======================================================
    def text_poke(self, addr: int, data: bytes) -> None:
        """Write kernel text.  Every CPU is at an instruction boundary (the others are
        saved; the current one is in a hook), so the bytes are written and Unicorn's
        translations of the range dropped; the next execution sees the new code."""
        with self.lock:
            self.mem.write(addr, data)
            self.uc.ctl_remove_cache(addr, addr + len(data))

    # ---- breakpoints -----------------------------------------------------------------
    def insert_breakpoint(self, addr: int, handler: Callable | None = None) -> None:
        """Deliver the int3 at addr to handler(kernel, cpu, ip) (default: the trap
        handlers of vector 3).

        The caller writes the 0xcc byte itself (text_poke).  Delivery goes through a
        code hook on the address, a fraction of the cost of Unicorn's exception path and
        otherwise the same trap: handlers see ip = addr + 1.  An int3 no handler claims
        executes for real and reaches the kernel's exc_int3."""
        with self.lock:
            if addr in self._breakpoints or addr in self._trap_breakpoints:
                return
            run = handler or (lambda k, cpu, ip: self._run_trap_handlers(3, ip))
            if not self.fast_hooks_available():
                self._trap_breakpoints[addr] = run
                return
            pa = self.mem.translate(addr)   # text is mapped for good: translate once
            ram = self.mem.ram

            def hit(_h, address, _size, _ud):
                if ram[pa] != 0xCC:
                    return  # not armed any more: the hook outlived its int3
                try:
                    if run(self, self.cpu, address + 1):
                        return
                except Exception as e:  # never unwind through Unicorn
                    log.exception("breakpoint handler failed at %#x", address)
                    self.panicked = f"breakpoint handler failed: {e!r}"
                    self.uc.emu_stop()
                    return
                self._bp_declined = address

            self._breakpoints[addr] = self.hook_code_raw(addr, addr, hit)

    def remove_breakpoint(self, addr: int) -> None:
        with self.lock:
            self._trap_breakpoints.pop(addr, None)
            handle = self._breakpoints.pop(addr, None)
            if handle is not None:
                self.hook_del(handle)
                self.uc.ctl_remove_cache(addr, addr + 1)

    def fast_hooks_available(self) -> bool:
        """Whether another per-address code hook fits the budget (FAST_HOOK_BUDGET)."""
        return len(self._raw_hooks) < self.FAST_HOOK_BUDGET

    # ---- registers of the CPU in a hook ------------------------------------------------
    def save_cpu_state(self) -> tuple:
        """The general registers and flags of the current CPU (inside a hook), for
        restore_cpu_state().  (A Unicorn context would carry the whole CPU, at ten times
        the cost.)"""
        return self._gprs.read()

    def restore_cpu_state(self, state: tuple) -> None:
        self._gprs.write(state)

    def set_ip(self, ip: int) -> None:
        """Redirect the current CPU (inside a hook or trap handler)."""
        self.fast.set(UC_X86_REG_RIP, ip)

    def call(self, func: int | str, *args: int | str | bytes) -> int:
        """Call a kernel function with up to six arguments on the current CPU (from a
        hook) and return its result.  str/bytes arguments are copied into kernel memory.
        Must be called from inside the emulation (a hook or handler)."""
        if not self._in_emulation:
            raise MachineError("Kernel.call() runs kernel code on the current CPU: call it "
                               "from inside a hook")
        if isinstance(func, str):
            func = self._sym(func)
        uc, fast = self.uc, self.fast
        saved = uc.context_save()
        try:
            scratch = self._host_scratch + self._scratch_depth * 0x1000
            self._scratch_depth += 1
            values = self._kernel_args(args, scratch)
            for reg, v in zip((UC_X86_REG_RDI, UC_X86_REG_RSI, UC_X86_REG_RDX,
                               UC_X86_REG_RCX, UC_X86_REG_R8, UC_X86_REG_R9), values):
                fast.set(reg, v)
            sp = ((fast.get(UC_X86_REG_RSP) - 512) & ~0xF) - 8
            self.mem.write(sp, struct.pack("<Q", self._host_call_return))
            fast.set(UC_X86_REG_RSP, sp)
            uc.emu_start(func, self._host_call_return)
            return _signed(fast.get(UC_X86_REG_RAX))
        finally:
            self._scratch_depth -= 1
            uc.context_restore(saved)

    def _kernel_args(self, args, scratch: int) -> list[int]:
        """Register values for a kernel call: str/bytes copied to kernel scratch memory
        at scratch (NUL added to str), ints as they are."""
        values, cursor = [], scratch
        for a in args:
            if isinstance(a, str):
                a = a.encode() + b"\0"
            if isinstance(a, (bytes, bytearray)):
                self.mem.write(cursor, bytes(a))
                values.append(cursor)
                cursor += (len(a) + 15) & ~15
            else:
                values.append(a & _U64)
        return values

    def run_function(self, func: int | str, *args) -> int:
        """Call a kernel function wherever the caller is: on the current CPU from inside
        the emulation (call), else on an idle CPU (upcall)."""
        if self._in_emulation:
            return self.call(func, *args)
        return self.upcall(func, *args)

    def hook_code(self, begin: int, end: int, callback: Callable) -> int:
        """Run callback(kernel, address) before each instruction in [begin, end]."""
        def trampoline(_uc, address, _size, _ud):
            callback(self, address)
        return self.hook_code_raw(begin, end, trampoline)

    def hook_code_raw(self, begin: int, end: int, callback: Callable) -> int:
        """Like hook_code, for hot paths: callback(handle, address, size, user_data) is
        called from C directly, with no wrapper in between, and must not raise."""
        with self.lock:
            handle = add_code_hook(self.uc, begin, end, callback)
            if begin == end:
                self._raw_hooks.add(handle)
            if begin <= end:
                self.uc.ctl_remove_cache(begin, end + 1)
            else:  # begin > end: every address
                self.uc.ctl_flush_tb()
            return handle

    def hook_del(self, handle: int) -> None:
        with self.lock:
            self._raw_hooks.discard(handle)
            self.uc.hook_del(handle)

    def read(self, addr: int, size: int) -> bytes:
        """Kernel or user memory at a virtual address; raises FaultError if unmapped."""
        return self.mem.read(addr, size)

    def write(self, addr: int, data: bytes) -> None:
        self.mem.write(addr, data)

    def view(self, addr: int, size: int) -> memoryview:
        """A live, writable view of kernel memory that is physically contiguous (the
        image's own variables), for host code that touches it on every event."""
        return self.mem.view(addr, size)

    def dmesg(self) -> str:
        """The kernel log buffer (log_buf), oldest line first."""
        buf, size = self._sym("log_buf"), 64 * 1024
        total = self.mem.read_u64(self._sym("log_next"))
        data = self.mem.read(buf, size)
        if total <= size:
            text = data[:total]
        else:
            start = total % size
            text = data[start:] + data[:start]
        return text.decode("utf-8", "replace")

    def inject_packet(self, packet: bytes) -> None:
        """Put a frame in the NIC's receive ring and wake a CPU to process it."""
        ring = self._sym("nic_rx_ring")
        with self.lock:
            head, tail, nslots, slot_size = struct.unpack("<4I", self.mem.read(ring, 16))
            if not nslots or tail - head >= nslots:
                raise KernelError(105, "NIC ring full")  # ENOBUFS
            slot = ring + 16 + (tail % nslots) * slot_size
            data = packet[: slot_size - 4]
            self.mem.write(slot, struct.pack("<I", len(data)) + data)
            self.mem.write(ring + 4, struct.pack("<I", (tail + 1) & 0xFFFFFFFF))
            self._wakeups.append(abi.IDLE_NET_RX)
            self._cond.notify_all()

    def kallsyms(self) -> str:
        return self.image.kallsyms()

    def load_module(self, name: str) -> int:
        """Load a bundled module (``trace_printk``, ``trace-printk``) and return its base
        address; KernelError with Linux's errno on failure (see ModuleLoader.load)."""
        return self.modules.load(name).start

    def unload_module(self, name: str) -> None:
        """Unload a module (delete_module); KernelError(ENOENT/EBUSY) as Linux."""
        self.modules.unload(name)

    def proc_version(self) -> str:
        """/proc/version: linux_proc_banner applied to sysname, release and version."""
        banner = self.mem.read_cstring(self._sym("linux_proc_banner"), 512).decode()
        uts = self._sym("init_uts_ns")
        release = self.mem.read_cstring(uts + 65 * 2, 65).decode()
        version = self.mem.read_cstring(uts + 65 * 3, 65).decode()
        return banner.replace("%s", "Linux", 1).replace("%s", release, 1).replace(
            "%s", version, 1)


class ProcessExited(KernelError):
    """The task exited (or was killed) while a system call of its was queued or running;
    ``exit_code`` is its wait status."""

    def __init__(self, pid: int, exit_code: int | None):
        super().__init__(3, f"task {pid} exited")  # ESRCH
        self.pid = pid
        self.exit_code = exit_code
