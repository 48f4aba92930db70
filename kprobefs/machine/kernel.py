"""The machine: Unicorn CPUs running the kernel image, hypercalls, traps, tasks and
system calls made on behalf of host code.

Every virtual CPU has its own saved Unicorn context; one thread at a time drives the
emulator (whoever holds ``Kernel.lock``), running the online CPUs round-robin on one
thread.  A CPU's turn ends at a hypercall: when it idles, spins on a lock, or returns a
task to user mode while another CPU has work (background calls, which nobody waits for,
every TURN_CALLS of them in a row); the run loop is :mod:`.driver`'s.  The kernel is
not preemptible (CONFIG_PREEMPT=n), so the order of events is a function of the inputs
alone and a run is reproducible for a given seed.

Who drives: in a daemon, one machine thread (:meth:`Kernel.serve`) is the only thread that
ever runs emulated code; everyone else posts work (system calls, upcalls) and waits on it
with a bound, so a kernel that never returns cannot hold a caller.  Without it (the
Python API, tests) the waiting caller drives the machine itself.  The watchdog
(:mod:`.watchdog`) stops spinning CPUs, kills their tasks as an oops would, and declares
the machine stuck when host code in it does not return.
"""

from __future__ import annotations

import collections
import logging
import struct
import threading
import time
from typing import Callable

from unicorn import UC_ARCH_X86, UC_HOOK_INSN_INVALID, UC_MODE_64, Uc
from unicorn.x86_const import (
    UC_X86_REG_CR0, UC_X86_REG_CR3, UC_X86_REG_CR4, UC_X86_REG_GS_BASE, UC_X86_REG_RFLAGS,
    UC_X86_REG_R8, UC_X86_REG_R9, UC_X86_REG_R10, UC_X86_REG_RAX, UC_X86_REG_RCX,
    UC_X86_REG_RDI, UC_X86_REG_RDX, UC_X86_REG_RIP, UC_X86_REG_RSI, UC_X86_REG_RSP,
)

from ..errors import KernelError, KernelStuck, KernelWedged, MachineError
from . import abi
from .abi import HC, U64, signed64
from .clock import TscClock
from .cpu import (
    KERNEL_CS, KERNEL_DS, PT_REGS_SIZE, UC_REG, Registers, pack_pt_regs, unpack_pt_regs,
)
from ._fastuc import (REG_WRITES, FastRegs, RegSet, add_code_hook, add_intr_hook,
                      register_file)
from ._quirks import clear_exception_state
from .image import FENTRY_NOP, KernelImage
from .irq import InterruptController
from .jump_label import JumpLabels
from .module import ModuleLoader
from .driver import MachineDriver
from .flag import Flag
from .syscalls import SystemCalls
from .hostwork import WORK_POINTS, HostWork, KernelCall
from .printk import read_log_buf
from .task import (
    Cpu, ProcessExited, SyscallRequest, Task, UserBuffer, _Upcall,
)
from .watchdog import MachineLock, Watchdog
from .meminfo import KernelMemory
from .strings import BulkStrings
from .memory import EFER_NXE, PAGE, PAGE_OFFSET, AddressSpace, FaultError, PhysicalLayout

__all__ = ["Kernel", "Task", "UserBuffer", "SyscallRequest", "Cpu", "ProcessExited"]

log = logging.getLogger("kprobefs.machine")

MSR_EFER = 0xC0000080
_HYPERCALL_VECTOR = abi.HYPERCALL_VECTOR
_QWORD, _PID = struct.Struct("<Q"), struct.Struct("<i")
_VECTOR_STUB = {0: "asm_exc_divide_error", 1: "asm_exc_debug", 2: "asm_exc_nmi",
                3: "asm_exc_int3", 6: "asm_exc_invalid_op",
                13: "asm_exc_general_protection", 14: "asm_exc_page_fault"}
_HAS_ERROR_CODE = {2, 13, 14}
#: The watchdog's NMI: the kernel reports a lockup and kills the current task.
NMI_VECTOR = 2
#: Vectors after which QEMU records an exception in progress (see _quirks).
_CONTRIBUTORY = {0, 8, 10, 11, 12, 13, 14}
HZ = 250


class Kernel(MachineDriver, SystemCalls):
    """The emulated kernel, booted and ready for system calls.

    ``Kernel(cpus=2, seed=0)`` boots the bundled image.  ``spawn(comm)`` creates a user
    task through kernel_clone(); ``syscall(task, name, *args)`` runs a real system call,
    with str arguments copied in as NUL-terminated user strings, bytes as user buffers and
    :class:`UserBuffer` as output buffers.
    """

    #: Unicorn checks every code hook's range on each hooked instruction, so hooks cost
    #: O(hooks) per hit; past this many, breakpoints are delivered as real #BP traps.
    FAST_HOOK_BUDGET = 64
    #: A CPU that runs this long without a hypercall is stopped and its task killed.
    WEDGE_SECONDS = 5.0
    #: Host code (a hypercall or probe handler) that has not returned after this long
    #: holds the machine: it is declared stuck and requests fail at once until then.
    STUCK_SECONDS = 30.0
    #: A CPU's turn ends at its first hypercall after this long, whoever else waits.
    TURN_SECONDS = 0.02
    #: The vector of the watchdog's NMI (the kernel reports a lockup, kills the task).
    NMI_VECTOR = NMI_VECTOR
    #: Bound on live user tasks (each has a user window).
    MAX_TASKS = 4096
    #: Host bytes for translated code.  QEMU calls its helpers directly only from code
    #: within 2 GiB of libunicorn; Unicorn's 1 GiB default put a process's second
    #: machine out of reach (a tenth slower).  The kernel's hot code needs a few MiB,
    #: but the buffer fills all the same: code whose page is written (a probe armed or
    #: disarmed, a module loaded) is translated anew further on, and the old space is
    #: reused only when the buffer is full and flushed.  So its size is what a daemon's
    #: RSS grows by under probe churn before it levels off.
    TCG_BUFFER_SIZE = 16 << 20

    def __init__(self, cpus: int = 2, seed: int = 0, image: str | None = None,
                 ram_mb: int = 512, pid_auto_base: int = 300, hz: int = HZ,
                 heap_mb: int = 192):
        if not 1 <= cpus <= 8:
            raise ValueError("cpus must be between 1 and 8")
        self.seed = seed
        self.nr_cpus = cpus
        self.image = KernelImage(image)
        self.lock = MachineLock()
        self._cond = threading.Condition(self.lock)
        #: Work posted by other threads (system calls, upcalls, kills), taken by whoever
        #: drives the machine at the start of its next slice.
        self._inbox: collections.deque = collections.deque()
        self._work = Flag()
        self._upcalls: collections.deque = collections.deque()   # waiting for a CPU
        self._upcalls_running: dict[int, _Upcall] = {}          # cpu index -> upcall
        self._machine_thread: threading.Thread | None = None
        #: (thread ident, since) of a waiting caller that drives the machine now
        #: (MachineDriver._drive_while_idle), else None.
        self.driver: tuple[int, float] | None = None
        #: Run by the machine thread about every 20 ms, under the lock (the daemon's
        #: workload pump).
        self.periodic: list[Callable[[], None]] = []
        #: Why the machine cannot run (None: it can); see KernelStuck.
        self.stuck: str | None = None
        self.uc = Uc(UC_ARCH_X86, UC_MODE_64)
        self.uc.ctl_set_tcg_buffer_size(self.TCG_BUFFER_SIZE)
        self.layout = PhysicalLayout(ram_mb=ram_mb, kernel_heap_mb=heap_mb)
        self.mem = AddressSpace(self.uc, self.layout)
        #: read(addr, size) -> bytes, kernel or user memory at a virtual address
        #: (FaultError if unmapped), and write(addr, data), ignoring page protections:
        #: the address space's own (hooks call them at every hit).
        self.read, self.write = self.mem.read, self.mem.write
        # Hooks reach the general registers as memory where that is shown to work.
        self.register_file = register_file(self.uc)
        self.regs = Registers(self.uc)
        self.fast = FastRegs(self.uc)
        # %rax as every hypercall reads its number and writes its result, %rip as a
        # turn starts.
        self._rax = self.fast.reader(UC_X86_REG_RAX)
        self._set_rax = self.fast.writer(UC_X86_REG_RAX)
        self._rip = self.fast.reader(UC_X86_REG_RIP)
        self._breakpoints: dict[int, int] = {}          # addr -> code hook
        self._trap_breakpoints: dict[int, Callable] = {}  # addr -> handler, via #BP
        self._raw_hooks: set[int] = set()
        self._bp_declined: int | None = None
        self.cpus = [Cpu(i) for i in range(cpus)]
        self.cpu: Cpu | None = None  # the CPU emulating now (inside emu_start)
        self._loaded_cpu: Cpu | None = None
        self.tasks: dict[int, Task] = {}
        #: Window slots of dead tasks, the longest free first (_take_window).
        self._free_windows: collections.deque[int] = collections.deque()
        #: Those freed since the TLB was last flushed: it may still map their pages.
        self._stale_windows: set[int] = set()
        self._next_window = 0
        self._wakeups: collections.deque = collections.deque()  # idle-loop words
        #: Wake-up word -> (the index of the CPU to take it, whether only that one may);
        #: see _queue_wakeup.
        self._wakeup_cpus: dict[int, tuple[int, bool]] = {}
        self._trap_handlers: dict[int, list] = collections.defaultdict(list)
        self.exit_listeners: list[Callable[[int], None]] = []
        #: Called with the pid of a task as it is reaped (release_task: after its
        #: parent heard of its exit), in the emulation.
        self.free_listeners: list[Callable[[int], None]] = []
        #: Called with (parent pid, child pid) when a task is forked, in the
        #: emulation (the kernel's fork asks the host for the child's window).
        self.fork_listeners: list[Callable[[int, int], None]] = []
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
        #: ktime (ktime_get_ns): the same TSC clock, kept as it was at boot (the kernel
        #: reads it from ktime_tsc without a hypercall; the trace clock may change).
        self.ktime = self.trace_clock.shifted(0)
        self._in_emulation = 0
        self._hz = hz
        self._hypercalls = {
            HC.IDLE: self._hc_idle, HC.SYSCALL_DONE: self._hc_syscall_done,
            HC.TASK_NEW: self._hc_task_new, HC.TASK_EXIT: self._hc_task_exit,
            HC.TASK_FREE: self._hc_task_free,
            HC.IRET: self._hc_iret, HC.CONSOLE: self._hc_console,
            HC.PANIC: self._hc_panic, HC.BOOTED: self._hc_booted,
            HC.UPCALL_DONE: self._hc_upcall_done, HC.YIELD: self._hc_yield,
            HC.SELF_IPI: self._hc_self_ipi,
        }
        self._closing = False
        # The turn in progress, for the watchdog: its number, when it started, when the
        # CPU last made progress (a hypercall returned), when the hypercall being
        # served began (None: none is).
        self._turn_id = 0
        self._turn_started: float | None = None
        self._progress = 0.0
        self._hc_started: float | None = None
        self._wedge: Cpu | None = None
        self._emu_thread: int | None = None
        #: (cpu, ip) of every stop the watchdog made.
        self.wedged: list[tuple[int, int]] = []
        #: Every lockup, oops and stuck machine, newest last: (monotonic time, text).
        self.incidents: collections.deque = collections.deque(maxlen=32)
        self._load(pid_auto_base)
        #: The kernel's long string instructions, carried out by the host.
        self.bulk_strings = BulkStrings(self, self.image.bulk_string_sites)
        self.host_work = HostWork(self)
        self._boot()
        #: Loadable modules (load, unload, /proc/modules, the module notifier chain).
        self.modules = ModuleLoader(self)
        self.watchdog = Watchdog(self)
        #: The allocators' counters (/proc/meminfo, /proc/slabinfo).
        self.memory = KernelMemory(self)

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
            target = (site + 5 + struct.unpack("<i", insn[1:])[0]) & U64
            if insn[0] != 0xE8 or target != fentry:
                raise MachineError(f"ftrace site {site:#x} is not a call to __fentry__")
            self.mem.write(site, FENTRY_NOP)
        self.kabi = self._read_kabi()
        self.mem.write(self._sym("trace_clock_tsc"), self.trace_clock.kernel_layout())
        self.mem.write(self._sym("ktime_tsc"), self.ktime.kernel_layout())
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
        #: The interrupt controller (machine/irq.py): timer, NIC, self-IPIs.
        self.irq = InterruptController(self, self._hz)
        self.irq.load_descriptors()
        add_intr_hook(uc, self._on_interrupt)
        uc.hook_add(UC_HOOK_INSN_INVALID, self._on_invalid_insn)
        self._pcpu_area = self._sym("pcpu_area")
        self._host_call_return = self._sym("host_call_return")
        self._scratch_depth = 0
        #: Requests finished during the CPU turn in progress, whose waiters are woken
        #: when it ends (SystemCalls._finish).
        self._finished: list = []
        #: Loaded requests someone waits for (no on_done): while there are any, a CPU's
        #: turn ends at each call of its tasks when another CPU waits (_end_turn).
        self._awaited: set = set()
        #: Requests someone waits for, from their submission to their end, and when the
        #: last of them ended (see SystemCalls.background_may_run).
        self._foreground: set = set()
        self._foreground_ended = 0.0
        #: Background duties (the workload's pump): run with the periodic ones, and
        #: once FOREGROUND_QUIET has passed since the last request someone waits for
        #: ended (background_due), when the machine thread next wakes: at once if that
        #: request left it work (a read that blocks), else at its next round.
        self.background: list[Callable[[], None]] = []
        self.background_due = 0.0
        self._task_state_off = self.kabi["task.state"]
        self._task_pid_off = self.kabi["task.pid"]
        # init_task lives in the image's data, mapped for good: its pid's place, once.
        self._init_pid_at = self._sym("init_task") + self._task_pid_off
        self._init_pid_pa = self.mem.translate(self._init_pid_at)
        self.current_task, self.task_pid = self._make_current_task()
        if self.register_file is not None:
            self.save_cpu_state = self.register_file.snapshot
            self.restore_cpu_state = self.register_file.restore
        else:
            # Writing ip makes Unicorn leave the current block: ip is not in the set.
            gprs = RegSet(self.uc, [UC_REG[name] for name in UC_REG
                                    if name not in ("cs", "ss", "ip")])
            self.save_cpu_state, self.restore_cpu_state = gprs.read, gprs.write
        self.entry_arguments = RegSet(self.uc, [UC_REG[name] for name in (
            "di", "si", "dx", "cx", "r8", "r9", "sp")]).read
        #: _args() -> the hypercall's five arguments (rdi, rsi, rdx, r10, r8), in one
        #: C call.
        self._args = RegSet(self.uc, [UC_X86_REG_RDI, UC_X86_REG_RSI, UC_X86_REG_RDX,
                                      UC_X86_REG_R10, UC_X86_REG_R8]).read

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
        cpu.switches_pa = self.mem.translate(cpu.gs_base + self.kabi["pcpu.nr_switches"])
        cpu.runqueue = cpu.gs_base + self.kabi["pcpu.runqueue"]
        cpu.runqueue_pa = self.mem.translate(cpu.runqueue)
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

    # ==== yields, requests given up, jiffies =============================================
    def _hc_self_ipi(self):
        # The turn ends so that the interrupt comes at once (when IF allows it).
        self.irq.self_ipi(self._args()[0])
        if not self._scratch_depth:
            self.fast.emu_stop()
        return 0

    def _hc_yield(self):
        # A spin-wait: whatever it waits for happens on another CPU or in posted work.
        if not self._scratch_depth:
            self.fast.emu_stop()
        return 0

    def abandon(self, req: SyscallRequest, waited: float) -> None:
        """The caller gave up on req after waited seconds.  Unless it finishes first,
        its task is killed at the machine's next slice (Watchdog.give_up).  Never
        blocks."""
        self._post(lambda: self.watchdog.give_up(req, waited))

    def _update_jiffies(self) -> None:
        j = (time.monotonic_ns() - self._boot_ns) * HZ // 1_000_000_000
        if j == self._jiffies_seen:
            return          # a tick has not passed since the last slice
        self._jiffies_seen = j
        # jiffies wraps (unsigned long) five minutes after boot, as Linux's does.
        self.mem.write(self._jiffies_addr, struct.pack("<Q", (j + self._jiffies_base) & U64))

    #: The jiffies value last written (the kernel never writes jiffies itself).
    _jiffies_seen = -1

    @property
    def _jiffies_addr(self) -> int:
        return self._sym("jiffies")

    #: Linux starts jiffies 5 minutes before wrap-around so wrap bugs show early.
    _jiffies_base = (1 << 64) - 300 * HZ

    # ==== interrupts and hypercalls =========================================================
    def _on_interrupt(self, _handle, intno, _user_data) -> None:
        uc = self.uc
        try:
            if intno == _HYPERCALL_VECTOR:
                nr = self._rax()
                handler = self._hypercalls.get(nr)
                self._hc_started = time.monotonic()
                try:
                    ret = handler() if handler else self._hostfs_hypercall(nr)
                finally:
                    self._progress = time.monotonic()
                    self._hc_started = None
                if ret is not None:
                    self._set_rax(ret)
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

    def _deliver_exception(self, vector: int, error_code: int = 0) -> None:
        """Enter the kernel's handler for vector: push a pt_regs frame on the current
        stack and jump to its asm stub (the hardware's job, done here)."""
        uc = self.uc
        stub = _VECTOR_STUB.get(vector)
        if stub is None:
            self.panicked = f"unexpected exception vector {vector}"
            uc.emu_stop()
            return
        regs = self.regs.snapshot()
        regs["orig_ax"] = error_code if vector in _HAS_ERROR_CODE else U64
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
        # an interrupt gate: IF and TF clear (HC_IRET restores the flags)
        uc.reg_write(UC_X86_REG_RFLAGS, regs["flags"] & ~0x300)

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

    def add_hypercall(self, name: str, handler: Callable[..., int]) -> None:
        """Serve the hypercall ``HC_<name>`` of include/kernel.h (``abi.HC``) with
        ``handler(a1, a2, a3, a4, a5) -> int`` (the value the kernel gets back).  It runs
        on the emulation thread, in the CPU's turn.  MachineError if it is served."""
        nr = getattr(HC, name)
        if nr in self._hypercalls:
            raise MachineError(f"hypercall {name} is already served")
        self._hypercalls[nr] = lambda: handler(*self._args())

    def _hc_idle(self):
        # An upcall first: a machine whose tasks keep waking one another (a workload)
        # reaches its idle loop only to take the next wake-up, never idles, and would
        # leave an upcall waiting for as long as that goes on.
        if self._upcalls:
            self._start_upcall(self.cpu, self._upcalls.popleft())
            self.cpu.resume_rax = None
            return abi.IDLE_UPCALL
        if self._wakeups:
            word = self._take_wakeup(self.cpu)
            if word is not None:
                return word
        if self.irq.pending(self.cpu) or self.irq.wake_idle(self.cpu):
            self.fast.emu_stop()      # sti; hlt: the interrupt comes at the next turn
            return 0
        self.cpu.state = "idle"
        self.fast.emu_stop()
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

    def clock_ns(self) -> int:
        """Nanoseconds since boot: the kernel's clock (ktime_get_ns)."""
        return self.ktime.read()

    def _hc_console(self):
        buf, length, level, _, _ = self._args()
        text = self.mem.read(buf, min(length, 1024)).decode("utf-8", "replace").rstrip("\n")
        self.console.append(text)
        del self.console[:-1000]
        log.log(logging.WARNING if level <= 4 else logging.DEBUG, "kernel: %s", text)
        if "page allocation failure" in text:     # mm/page_alloc.c's warn_alloc
            self.incidents.append((time.monotonic(), text))
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
        call = self._upcalls_running.pop(self.cpu.index, None)
        if call is not None:
            call.result = signed64(self._args()[0])
            call.done.set()
            self._cond.notify_all()
        return 0

    def upcall(self, func: int | str, *args: int | str | bytes,
               timeout: float | None = 30.0) -> int:
        """Run func(*args) (up to six arguments, str/bytes copied into kernel memory) on
        an idle CPU, as a work item of its idle loop, and return its result.  Call from
        outside hooks.  KernelWedged when it does not finish within timeout, or when its
        CPU is taken out of service."""
        if isinstance(func, str):
            func = self._sym(func)
        if len(args) > 6:
            raise ValueError("at most six arguments")
        if self.stuck is not None:
            raise KernelStuck(f"the machine is stuck: {self.stuck}")
        call = _Upcall(func, args)
        self._post(lambda: self._upcalls.append(call))
        self._await(call.done, timeout, "an upcall")
        if call.result is None:
            raise KernelWedged("the upcall's CPU was taken out of service")
        return call.result

    def _start_upcall(self, cpu: Cpu, call: _Upcall) -> None:
        values = self._kernel_args(call.args, self._host_scratch + 0x8000 * (1 + cpu.index))
        values += [0] * (6 - len(values))
        self.mem.write(cpu.gs_base + self.kabi["pcpu.upcall"],
                       struct.pack("<7Q", call.func, *values))
        self._upcalls_running[cpu.index] = call
        cpu.resume_rax = abi.IDLE_UPCALL

    def _hostfs_hypercall(self, nr):
        if self.hostfs is None or not (HC.HOSTFS_LOOKUP <= nr <= HC.HOSTFS_READDIR
                                       or nr in (HC.HOSTFS_MKDIR, HC.HOSTFS_RMDIR)):
            return -38  # ENOSYS
        work = self.host_work
        work.at_work_point = nr in WORK_POINTS
        args = self._args()
        try:
            return self.hostfs.hypercall(self, nr, args)
        finally:
            work.at_work_point = False
            # The kernel holds mutexes across the operation (its last argument): the
            # other CPUs get their turn now, as on Linux they run while the work is
            # done, and one of them may find a mutex held (fs/hostfs.c).
            if args[4] and nr != HC.HOSTFS_LOOKUP:
                self._end_turn()

    def upcall_later(self, func: int, *args: int) -> None:
        """Queue func(*args) for an idle CPU without waiting for it (its result is
        dropped).  Caller holds the lock or runs in the emulation."""
        self._upcalls.append(_Upcall(func, args))

    @property
    def serving_hypercall(self) -> bool:
        """Whether the emulating thread is inside a hypercall handler now."""
        return self._hc_started is not None

    def in_emulation(self) -> bool:
        """Whether the calling thread runs inside the emulation (a hook or handler)."""
        return bool(self._in_emulation) and threading.get_ident() == self._emu_thread

    def call_in_process(self, func: int | str, *args, then=None) -> KernelCall:
        """Run a kernel function in process context (see :mod:`.hostwork`): from inside
        a hypercall, queued for the file operation being served; else at once."""
        return self.host_work.call(func, *args, then=then)

    # ---- tasks ---------------------------------------------------------------------------
    def _make_current_task(self) -> tuple[Callable[[], int], Callable[[int], int]]:
        """``current_task()``, the task_struct address of the task running on the
        current CPU (inside a hook), and ``task_pid(task_struct)``, its pid.  They run
        on every kretprobe hit, so they are closures over what they read (instance
        attributes: no method lookup), and a task in the direct map (all but init_task)
        and init_task are read without a page-table walk."""
        mem, ram = self.mem, self.mem.ram
        translate, unpack_q, unpack_pid = mem.translate, _QWORD.unpack_from, _PID.unpack_from
        pid_off, init_at, init_pa = self._task_pid_off, self._init_pid_at, self._init_pid_pa
        direct_end = len(ram) - 4
        words, ints = mem.words, memoryview(ram).cast("i")

        def current_task() -> int:
            current_pa = self.cpu.current_pa
            return unpack_q(ram, current_pa)[0] if current_pa & 7 else words[current_pa >> 3]

        def task_pid(task: int) -> int:
            pid_at = task + pid_off
            pa = pid_at - PAGE_OFFSET
            if not 0 <= pa <= direct_end:
                pa = init_pa if pid_at == init_at else translate(pid_at)
            return unpack_pid(ram, pa)[0] if pa & 3 else ints[pa >> 2]

        return current_task, task_pid

    def current_pid(self) -> int:
        """Pid of the task running on the current CPU (inside a hook)."""
        return self.task_pid(self.current_task())

    def current_tgid(self) -> int:
        """Thread-group id of the task running on the current CPU (inside a hook)."""
        t = self.current_task()
        return _PID.unpack(self.mem.read(t + self.kabi["task.tgid"], 4))[0]

    def current_comm(self) -> str:
        t = self.current_task()
        return self.mem.read_cstring(t + self.kabi["task.comm"], 16).decode("utf-8", "replace")

    # ==== helpers for the layers above ======================================================
    def text_poke(self, addr: int, data: bytes) -> None:
        """Write kernel text.  Every CPU is at an instruction boundary (the others are
        saved; the current one is in a hook), so the bytes are written and Unicorn's
        translations of the range dropped; the next execution sees the new code."""
        with self.lock:
            self.mem.write(addr, data)
            self.drop_translations(addr, addr + len(data))

    def drop_translations(self, begin: int, end: int) -> None:
        """Make Unicorn translate [begin, end) afresh, page by page and only where text
        is mapped.  Unicorn finds the blocks by translating the address as an
        instruction fetch; a fetch that faults (unmapped or no-execute) is swallowed,
        but QEMU records it as an exception in progress, and the third such record is a
        triple fault that stops the vCPU for good: emu_start then spins for ever."""
        page = begin & ~(PAGE - 1)
        while page < end:
            if self.mem.is_executable(page):
                self.uc.ctl_remove_cache(max(begin, page), min(end, page + PAGE))
            page += PAGE

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
                self.drop_translations(addr, addr + 1)

    def fast_hooks_available(self) -> bool:
        """Whether another per-address code hook fits the budget (FAST_HOOK_BUDGET)."""
        return len(self._raw_hooks) < self.FAST_HOOK_BUDGET

    # ---- registers of the CPU in a hook ------------------------------------------------
    # save_cpu_state() -> state: the general registers and flags of the current CPU
    # (inside a hook), for restore_cpu_state(state) in the same hook: a copy of the
    # register file where there is one, else one C call for them all.  (A Unicorn
    # context would carry the whole CPU, at ten times the cost.)  entry_arguments() ->
    # (di, si, dx, cx, r8, r9, sp): a function's six arguments and %rsp at its entry.
    # All three are bound in __init__: jprobes call them on every hit.

    #: A count of the register writes made through the machine (its register views,
    #: save/restore, the probe handlers' regs; not Unicorn's own reg_write): unchanged
    #: around some host code means that code wrote no register.
    reg_writes = REG_WRITES

    def ip(self) -> int:
        """The loaded CPU's instruction pointer."""
        return self.fast.get(UC_X86_REG_RIP)

    def set_ip(self, ip: int) -> None:
        """Redirect the current CPU (inside a hook or trap handler)."""
        self.fast.set(UC_X86_REG_RIP, ip)

    def call(self, func: int | str, *args: int | str | bytes) -> int:
        """Call a kernel function with up to six arguments on the current CPU (from a
        hook) and return its result.  str/bytes arguments are copied into kernel memory.
        Must be called from inside the emulation (a hook or handler), for code that
        takes no lock and never waits: nested in the hook, it cannot let another CPU
        run (kernel work a hypercall needs goes through call_in_process).  MachineError
        when the function does not return (the watchdog stopped it)."""
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
            if fast.get(UC_X86_REG_RIP) != self._host_call_return:
                raise MachineError(f"the kernel call of {self.image.format_address(func)}"
                                   " was stopped before it returned")
            return signed64(fast.get(UC_X86_REG_RAX))
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
                values.append(a & U64)
        return values

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
                self.drop_translations(begin, end + 1)
            else:  # begin > end: every address
                self.uc.ctl_flush_tb()
            return handle

    def hook_del(self, handle: int) -> None:
        with self.lock:
            self._raw_hooks.discard(handle)
            self.uc.hook_del(handle)

    def view(self, addr: int, size: int) -> memoryview:
        """A live, writable view of kernel memory that is physically contiguous (the
        image's own variables), for host code that touches it on every event."""
        return self.mem.view(addr, size)

    def dmesg(self) -> str:
        """The kernel log buffer (log_buf) as dmesg prints it, oldest line first."""
        return read_log_buf(self.mem, self._sym)

    @property
    def jump_labels(self) -> JumpLabels:
        """The kernel's static keys and their sites (machine/jump_label.py), read from
        __jump_table on first use."""
        labels = self.__dict__.get("_jump_labels")
        if labels is None:
            labels = self._jump_labels = JumpLabels(self)
        return labels

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
            self.irq.raise_nic()
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
