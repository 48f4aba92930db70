"""What the machine keeps per CPU and per task, and the system calls in flight."""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass, field
from typing import Callable

from ..errors import KernelError
from .flag import Flag
from .memory import PAGE, USER_WINDOW_SIZE

__all__ = ["UserBuffer", "Task", "SyscallRequest", "Cpu", "ProcessExited", "marshal",
           "check_syscall_args"]

_U64 = 0xFFFFFFFFFFFFFFFF
_ARG_TYPES = (str, bytes, bytearray, memoryview, int)


class UserBuffer:
    """An output buffer for a system call: size bytes of user memory whose contents are
    copied back into ``data`` when the call returns.  Only ``initial`` (when given) is
    written there first: as for a process's own buffer, what the call does not write
    is what the memory held.  With ``upto_result``, only as many bytes as the call
    returned are copied back (none on an error): a read's buffer, whose bytes past
    those it read nobody wants."""

    __slots__ = ("size", "data", "addr", "upto_result")

    def __init__(self, size: int, initial: bytes = b"", upto_result: bool = False):
        self.size = size
        self.data = bytes(initial[:size]) if initial else b""
        self.addr: int | None = None
        self.upto_result = upto_result


_PASSED_TYPES = _ARG_TYPES + (UserBuffer,)


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
    #: Released at exit, no wait4 in the kernel: the task of a host process, which its
    #: parent waits for on the host (see SystemCalls.start_spawn).
    autoreap: bool = False
    #: The CPU its wake-ups go to (its host process's, mapped onto the machine's);
    #: None: the first idle CPU.
    wake_cpu: int | None = None
    #: Whether only wake_cpu may take them (the host thread is pinned there); else
    #: another idle CPU does while wake_cpu is busy.
    wake_cpu_only: bool = False
    #: Where its task_struct's __state is in guest RAM (0: not known).
    state_pa: int = 0


@dataclass(eq=False)
class SyscallRequest:
    """One system call in flight.  ``result`` is the raw return value (negative errno on
    failure); ``error`` is set when the task died (oops or exit) instead of returning."""

    task: Task
    nr: int
    name: str
    args: tuple
    done: Flag = field(default_factory=Flag)
    result: int | None = None
    error: Exception | None = None
    outputs: list = field(default_factory=list)
    on_done: Callable | None = None
    #: A spawn's clone3: the comm its child is given as fork makes it (16 bytes).
    child_comm: bytes = b""
    #: A spawn's clone3: its child is autoreaped (Task.autoreap).
    child_autoreap: bool = False


@dataclass(eq=False)
class Cpu:
    """One virtual CPU."""

    index: int
    ctx: object = None
    state: str = "offline"  # offline, running, idle, halted, wedged
    resume_rax: int | None = None
    #: System calls its tasks ended in a run: since it last went idle, or since it last
    #: switched tasks once they were MAX_TURN_CALLS (Kernel.TURN_CALLS, MAX_TURN_CALLS).
    calls_in_row: int = 0
    gs_base: int = 0
    current_pa: int = 0      # physical address of this CPU's pcpu.current_task
    switches_pa: int = 0     # physical address of this CPU's pcpu.nr_switches
    switches_seen: int = 0   # its pcpu.nr_switches as the run started
    runqueue: int = 0        # the address of its pcpu.runqueue (a list head)
    runqueue_pa: int = 0     # and its physical address
    killed: int = 0          # the task_struct the watchdog last killed here
    wedged_at: str = ""      # where it spun when it was taken out of service
    #: Its task went back to user mode as its turn ended: at its next turn it goes idle
    #: (or runs its next task) and takes a queued wake-up itself (WF_SYNC's affinity).
    idling: bool = False


@dataclass(eq=False)
class _Upcall:
    """A kernel function to run on an idle CPU (see Kernel.upcall)."""

    func: int
    args: tuple
    result: int | None = None
    done: Flag = field(default_factory=Flag)


class ProcessExited(KernelError):
    """The task exited (or was killed) while a system call of its was queued or running;
    ``exit_code`` is its wait status."""

    def __init__(self, pid: int, exit_code: int | None):
        super().__init__(3, f"task {pid} exited")  # ESRCH
        self.pid = pid
        self.exit_code = exit_code


def check_syscall_args(args) -> None:
    """TypeError for an argument a system call cannot take (checked before it is queued:
    marshalling happens later, on the machine's thread)."""
    for a in args:
        if type(a) is int:
            continue
        if isinstance(a, (list, tuple)):
            if not all(isinstance(s, (str, bytes)) for s in a):
                raise TypeError("a string array holds str or bytes only")
        elif not isinstance(a, _PASSED_TYPES):
            raise TypeError(f"cannot pass {type(a).__name__} to a system call")


def marshal(mem, task: Task, req: SyscallRequest) -> list[int]:
    """Copy req's arguments into the task's user window (str as NUL-terminated strings,
    bytes as buffers, UserBuffer as output buffers, a list or tuple of strings as a
    NULL-ended array of string pointers, as execve's argv); returns the register
    values.  KernelError(E2BIG) when they do not fit."""
    cursor = task.window + PAGE
    end = task.window + USER_WINDOW_SIZE
    out = []
    for a in req.args:
        kind = type(a)
        if kind is int:             # most arguments (fds, sizes, flags)
            out.append(a & _U64)
            continue
        if kind is not UserBuffer:  # the next most (a read's buffer) is none of these
            if isinstance(a, (list, tuple)):
                pointers = []
                for s in a:
                    data = (s.encode() if isinstance(s, str) else bytes(s)) + b"\0"
                    mem.ensure_user_pages(cursor, len(data))
                    mem.write(cursor, data)
                    pointers.append(cursor)
                    cursor += (len(data) + 15) & ~15
                a = struct.pack(f"<{len(pointers) + 1}Q", *pointers, 0)
            if isinstance(a, str):
                a = a.encode() + b"\0"
        if isinstance(a, UserBuffer):
            mem.ensure_user_pages(cursor, a.size)
            if a.data:
                mem.write(cursor, a.data)
            a.addr = cursor
            req.outputs.append(a)
            out.append(cursor)
            cursor += (a.size + 15) & ~15
        elif isinstance(a, (bytes, bytearray, memoryview)):
            data = bytes(a)
            mem.ensure_user_pages(cursor, len(data))
            mem.write(cursor, data)
            out.append(cursor)
            cursor += (len(data) + 15) & ~15
        else:
            out.append(a & _U64)
        if cursor > end:
            raise KernelError(7, "system call arguments exceed the user window")
    return out
