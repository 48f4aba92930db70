"""The probe structures users fill in, named as in <linux/kprobes.h> and <linux/fprobe.h>.

They are plain mutable objects like their C counterparts: a caller sets the fields,
registers the probe, and reads ``nmissed`` (and, for kretprobes, the effective
``maxactive``) back.  Fields after the first block belong to the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = [
    "Kprobe", "Jprobe", "Kretprobe", "KretprobeInstance", "Fprobe",
    "KPROBE_FLAG_GONE", "KPROBE_FLAG_DISABLED", "KPROBE_FLAG_OPTIMIZED",
    "KPROBE_FLAG_FTRACE", "FPROBE_FL_DISABLED", "FPROBE_FL_KPROBE_SHARED",
    "MAX_STACK_SIZE", "KRETPROBE_MAX_DATA_SIZE", "KRETPROBE_MAXACTIVE_MAX",
]

KPROBE_FLAG_GONE = 1
KPROBE_FLAG_DISABLED = 2
KPROBE_FLAG_OPTIMIZED = 4
KPROBE_FLAG_FTRACE = 8

FPROBE_FL_DISABLED = 1
FPROBE_FL_KPROBE_SHARED = 2

MAX_STACK_SIZE = 64            # bytes of stack a jprobe copies (x86_64, kprobes.txt 1.2)
KRETPROBE_MAX_DATA_SIZE = 4096
KRETPROBE_MAXACTIVE_MAX = 4096


@dataclass(eq=False)
class Kprobe:
    """struct kprobe.  Give exactly one of symbol_name and addr; offset is added.

    ``pre_handler(p, regs) -> int``: non-zero means the handler changed ``regs.ip`` and
    execution continues there.  ``post_handler(p, regs, flags)`` runs after the probed
    instruction.  ``fault_handler(p, regs, trapnr) -> int`` runs when a handler raises.

    ``native`` = (handler, argument) names a pre-handler in the emulated kernel's own
    code, ``void handler(void *argument, struct pt_regs *regs)``, with an even
    ``argument``.  When p is alone at its address, its detour, its ftrace site's
    trampoline, or its int3 (then the copy of the instruction runs boosted, or
    single-stepped without a post-handler) calls that in the kernel, as Linux calls
    kernel handlers.  A hit that trapped passes ``argument + 1``: Linux's handlers
    find interrupts off and an NMI-like context there.  ``pre_handler`` still runs on
    every other path (several probes at one address, instructions that are emulated,
    a reentered hit), so the two must do the same thing.  After changing ``native`` on a
    registered probe, call the engine's ``refresh_kprobe(p)``.
    """

    symbol_name: str | None = None
    addr: int | None = None
    offset: int = 0
    pre_handler: Callable | None = None
    post_handler: Callable | None = None
    fault_handler: Callable | None = None
    flags: int = 0
    nmissed: int = 0
    native: tuple[int, int] | None = None
    # ---- engine-private --------------------------------------------------------------
    ainsn: object = None
    symbol: object = None          # the kallsyms Symbol containing addr
    registered: bool = False
    kind: str = "k"                # k, r, j, f: how kprobes/list shows it
    owner: object = None           # the Kretprobe/Jprobe this kprobe serves

    def is_disabled(self) -> bool:
        return bool(self.flags & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE))

    def is_gone(self) -> bool:
        return bool(self.flags & KPROBE_FLAG_GONE)

    def is_ftrace(self) -> bool:
        return bool(self.flags & KPROBE_FLAG_FTRACE)

    def is_optimized(self) -> bool:
        return bool(self.flags & KPROBE_FLAG_OPTIMIZED)


@dataclass(eq=False)
class Jprobe:
    """struct jprobe (kprobes.txt 1.2): ``entry(*args)`` runs at function entry with the
    probed function's first six arguments; registers and MAX_STACK_SIZE bytes of stack
    are copied before and restored after, so the function sees them unchanged."""

    symbol_name: str | None = None
    addr: int | None = None
    entry: Callable | None = None
    kp: Kprobe = field(default_factory=Kprobe)

    @property
    def nmissed(self) -> int:
        return self.kp.nmissed


@dataclass(eq=False)
class KretprobeInstance:
    """struct kretprobe_instance: one pending return of one task (``task``: its pid)."""

    rp: "Kretprobe | None"
    ret_addr: int = 0
    func: int = 0
    fp: int = 0              # the stack slot whose return address was replaced
    data: bytearray = field(default_factory=bytearray)
    # ---- engine-private --------------------------------------------------------------
    # the instance that replaced the same slot's return address before this one (two
    # return probes on one function), which returns next
    below: "KretprobeInstance | None" = None
    # the task's task_struct, taken at entry, and how its pid is read from it (the pid
    # is read only when asked: on the hit path it would cost more than the rest)
    task_struct: int = 0
    pid_of: Callable[[int], int] | None = None

    @property
    def task(self) -> int:
        return self.pid_of(self.task_struct) if self.pid_of is not None else 0


@dataclass(eq=False)
class Kretprobe:
    """struct kretprobe.  ``handler(ri, regs)`` runs at return (``regs.ax`` is the
    return value, ``regs.ip`` the real return address); ``entry_handler(ri, regs)`` at
    entry, where non-zero skips this instance.  ``maxactive`` 0 means the default,
    max(10, 2 * possible CPUs), written back at registration as Linux does."""

    symbol_name: str | None = None
    addr: int | None = None
    offset: int = 0
    handler: Callable | None = None
    entry_handler: Callable | None = None
    maxactive: int = 0
    data_size: int = 0
    nmissed: int = 0
    kp: Kprobe = field(default_factory=Kprobe)
    # ---- engine-private --------------------------------------------------------------
    free_instances: list = field(default_factory=list)
    # its struct kretprobe_native when its entry runs as kernel code (kretprobe_native.py):
    # the address, the physical word where it starts, and its id; 0 when it has none
    native_at: int = 0
    native_word: int = 0
    native_id: int = 0


@dataclass(eq=False)
class Fprobe:
    """struct fprobe (fprobe.rst).  ``entry_handler(fp, entry_ip, regs, entry_data)``
    runs at function entry; a non-zero return cancels this call's exit handler.
    ``exit_handler(fp, entry_ip, regs, entry_data)`` runs at return with ``regs.ip`` the
    return address."""

    entry_handler: Callable | None = None
    exit_handler: Callable | None = None
    entry_data_size: int = 0
    nr_maxactive: int = 0
    flags: int = 0
    nmissed: int = 0
    # ---- engine-private --------------------------------------------------------------
    ops: object = None
    free_instances: list = field(default_factory=list)

    def disabled(self) -> bool:
        return bool(self.flags & FPROBE_FL_DISABLED)
