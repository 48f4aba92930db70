"""Kernel work the host asks for in process context (kernel/kernel/host_work.c).

A hypercall handler must not run kernel code itself: nested inside the hypercall, that
code could spin on a lock held by another CPU, which cannot run until the hypercall
returns, and the machine would livelock.  So host code that needs the kernel to act
while it serves a file operation (make a tracefs directory, run a module's init) queues
a :class:`KernelCall`; the hostfs operation that made the hypercall runs the queue as
soon as the hypercall returns, in the same system call (``host_work_run``), the way
Linux's own write handlers call into the kernel.  Each call's ``then`` sees the return
value and may replace the operation's result (a failed init fails the write).

Outside the emulation (the Python API), a call runs at once on an idle CPU (an upcall).
Inside it but not in a hostfs operation (a probe handler), the queue is run by an
upcall as soon as a CPU is idle.
"""

from __future__ import annotations

import collections
import struct
from dataclasses import dataclass
from typing import Callable

from .abi import HC, signed64

__all__ = ["KernelCall", "HostWork"]

_U64 = 0xFFFFFFFFFFFFFFFF
#: struct host_work: fn, args[6], data[512].
_HEADER = struct.Struct("<7Q")
_DATA_SIZE = 512
_COUNT = struct.Struct("<Q")         # unsigned long host_work_queued
#: The hostfs operations after which the kernel runs the queue (kernel/fs/hostfs.c).
WORK_POINTS = frozenset({HC.HOSTFS_OPEN, HC.HOSTFS_READ, HC.HOSTFS_WRITE,
                         HC.HOSTFS_RELEASE})


@dataclass(eq=False)
class KernelCall:
    """One kernel function call, run in process context.

    ``args`` are ints, str/bytes (copied into kernel memory, NUL added to str) or other
    KernelCalls (their return value, once they have run: a call made after another in
    the same queue sees it).  ``then(value)`` runs when the call has returned; what it
    returns, if not None, becomes the result of the file operation being served.
    ``done`` and ``value`` say whether and with what it returned.
    """

    func: int
    args: tuple
    then: Callable[[int], int | None] | None = None
    origin: int | None = None     # the CPU whose hostfs operation runs it (None: any)
    done: bool = False
    value: int | None = None
    outcome: int | None = None


class HostWork:
    """The queue of KernelCalls and the two hypercalls that run it."""

    def __init__(self, kernel):
        self.kernel = kernel
        self._queue: collections.deque[KernelCall] = collections.deque()
        self._running: dict[int, KernelCall] = {}      # cpu index -> call
        #: Whether the hypercall being served is a hostfs operation that runs the
        #: queue when it returns (set by the machine around hostfs hypercalls).
        self.at_work_point = False
        self._drain_queued = False
        self._entry = kernel.image.symbol_value("host_work_run")
        #: host_work_queued: the kernel makes no HC_WORK_NEXT while it reads 0.
        self._count_at = kernel.image.symbol_value("host_work_queued")
        kernel.add_hypercall("WORK_NEXT", self._next)
        kernel.add_hypercall("WORK_DONE", self._done)

    def call(self, func: int | str, *args, then=None) -> KernelCall:
        """Run func(*args) in process context: queued when the emulation is serving a
        hypercall or hook (see the module docstring), else at once.  Returns the call
        (done, with its value and then's outcome, when it ran at once)."""
        k = self.kernel
        if isinstance(func, str):
            func = k.image.symbol_value(func)
        if len(args) > 6:
            raise ValueError("at most six arguments")
        call = KernelCall(func, args, then)
        if k.in_emulation():
            if self.at_work_point:
                call.origin = k.cpu.index
            elif not self._drain_queued:
                self._drain_queued = True
                k.upcall_later(self._entry, 0)
            self._queue.append(call)
            self._count_queued()
            return call
        values = [self._resolve(a) for a in args]
        self._complete(call, k.upcall(func, *values))
        return call

    @staticmethod
    def _resolve(arg):
        if isinstance(arg, KernelCall):
            return arg.value or 0
        return arg

    def _complete(self, call: KernelCall, value: int) -> int | None:
        call.value, call.done = value, True
        if call.then is not None:
            call.outcome = call.then(value)
        return call.outcome

    # ---- the hypercalls ---------------------------------------------------------------
    def _next(self, work_ptr, *_):
        """The next call for this CPU: its own operation's, in the order they were
        queued, or one any CPU may run; 0 when there is none."""
        k = self.kernel
        here = k.cpu.index
        call = next((c for c in self._queue if c.origin in (here, None)), None)
        if call is None:
            if not any(c.origin is None for c in self._queue):
                self._drain_queued = False
            return 0
        self._queue.remove(call)
        self._count_queued()
        data, values = bytearray(), []
        for arg in call.args:
            arg = self._resolve(arg)
            if isinstance(arg, str):
                arg = arg.encode() + b"\0"
            if isinstance(arg, (bytes, bytearray)):
                values.append(work_ptr + _HEADER.size + len(data))
                data += arg
                data += bytes(-len(data) % 8)
            else:
                values.append(int(arg) & _U64)
        if len(data) > _DATA_SIZE:
            raise ValueError("kernel call arguments exceed struct host_work's data")
        values += [0] * (6 - len(values))
        k.write(work_ptr, _HEADER.pack(call.func, *values) + bytes(data))
        self._running[k.cpu.index] = call
        return 1

    def _count_queued(self) -> None:
        self.kernel.write(self._count_at, _COUNT.pack(len(self._queue)))

    def _done(self, ret, result, *_):
        call = self._running.pop(self.kernel.cpu.index, None)
        if call is None:
            return result
        outcome = self._complete(call, signed64(ret))
        return result if outcome is None else outcome & _U64
