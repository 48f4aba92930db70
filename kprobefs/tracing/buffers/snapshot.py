"""The snapshot buffer of a trace array (Linux's ``max_buffer``, ``max_tr``).

Each trace array has a second ring buffer, allocated on demand: ``echo 1 > snapshot``
(or a ``snapshot`` trigger, a hist ``snapshot()`` action, a latency tracer) sizes it
like the main buffer, and a snapshot then exchanges the two buffers' records
(update_max_tr, or ring_buffer_swap_cpu for one CPU).  The main buffer object never
changes: the kernel's recorder and the tracers keep writing to it, and the exchange
moves records between the two objects (:meth:`RingBuffer.swap`).

:class:`MaxTrace` holds the buffer and what Linux keeps beside it: whether it is
allocated, the conditional snapshot (a hist ``snapshot()`` action owns the snapshot
then), and the latency tracers' record of the task and times of the maximum
(``max_data``), which their trace header prints.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any, Callable

from kprobefs.tracing.buffers.ring_buffer import MIN_PAGES, RingBuffer

__all__ = ["MaxTrace", "MaxData", "snapshot_help"]


_MAIN_HELP = (
    "# echo 0 > snapshot : Clears and frees snapshot buffer\n"
    "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
    "#                      Takes a snapshot of the main buffer.\n"
    "# echo 2 > snapshot : Clears snapshot buffer (but does not allocate or free)\n"
    "#                      (Doesn't have to be '2' works with any number that\n"
    "#                       is not a '0' or '1')\n"
)
# The per-CPU file's, with CONFIG_RING_BUFFER_ALLOW_SWAP (the latency tracers select
# it): a CPU's buffer may be swapped alone.
_PERCPU_HELP = (
    "# echo 0 > snapshot : Invalid for per_cpu snapshot file.\n"
    "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
    "#                      Takes a snapshot of the main buffer for this cpu.\n"
    "# echo 2 > snapshot : Clears this cpu's snapshot buffer (but does not allocate)\n"
    "#                      (Doesn't have to be '2' works with any number that\n"
    "#                       is not a '0' or '1')\n"
)


def snapshot_help(allocated: bool, per_cpu: bool) -> str:
    """What ``snapshot`` shows under ``# tracer:`` when the snapshot buffer holds
    nothing (print_snapshot_help)."""
    state = "allocated" if allocated else "freed"
    return (f"#\n# * Snapshot is {state} *\n#\n# Snapshot commands:\n"
            + (_PERCPU_HELP if per_cpu else _MAIN_HELP))


@dataclass
class MaxData:
    """What update_max_tr saves of the maximum (the latency header's task line):
    the CPU it was on, the latency and its start and end (trace clock), the task."""

    cpu: int = 0
    latency_ns: int = 0
    time_start: int = 0
    critical_start: int = 0
    critical_end: int = 0
    comm: str = ""
    pid: int = 0
    uid: int = 0
    nice: int = 0
    policy: int = 0
    rt_priority: int = 0


class MaxTrace:
    """One array's snapshot buffer.  ``main`` is the array's ring buffer.  Callers
    hold the registry's lock for the control calls; :meth:`swap` runs on the hit path
    too (the buffers' own locks order it)."""

    def __init__(self, main: RingBuffer):
        self.main = main
        self.buffer = RingBuffer(main.nr_cpus)
        self.allocated = False
        #: The hist action that owns the snapshot (tracing_snapshot_cond_enable):
        #: ``update(cond) -> bool`` decides each swap; ``snapshot`` writes are EBUSY.
        self.cond_owner: Any = None
        self.cond_update: Callable[[Any], bool] | None = None
        self.max_data = MaxData()

    def total_kb(self) -> int:
        """KiB the buffer holds while allocated (0 when freed)."""
        if not self.allocated:
            return 0
        return sum(self.buffer.size_kb(cpu) for cpu in range(self.buffer.nr_cpus))

    def alloc(self) -> None:
        """tracing_alloc_snapshot_instance: size it as the main buffer (idempotent)."""
        if not self.allocated:
            self.buffer.copy_sizes(self.main)
            self.allocated = True

    def free(self) -> None:
        """free_snapshot: back to the smallest size, emptied."""
        self.buffer.resize_kb(MIN_PAGES)
        self.buffer.reset()
        self.allocated = False

    def clear(self, cpu: int | None = None) -> None:
        if cpu is None:
            self.buffer.reset()
        else:
            self.buffer.reset_cpu(cpu)

    def follow_resize(self, cpu: int | None) -> None:
        """The main buffer was resized: an allocated snapshot follows it."""
        if self.allocated:
            self.buffer.copy_sizes(self.main, cpu)

    def swap(self, cpu: int | None = None) -> bool:
        """Exchange the buffers (all CPUs, or ``cpu`` alone); False when not allocated."""
        if not self.allocated:
            return False
        self.main.swap(self.buffer, cpu)
        return True

    def cond_enable(self, owner: Any, update: Callable[[Any], bool],
                    busy: bool) -> None:
        """tracing_snapshot_cond_enable: allocate, then EBUSY when a latency tracer
        (``busy``) or another owner has the snapshot."""
        self.alloc()
        if busy or self.cond_owner is not None:
            raise OSError(errno.EBUSY, "snapshot in use")
        self.cond_owner, self.cond_update = owner, update

    def cond_disable(self, owner: Any) -> None:
        if self.cond_owner is owner:
            self.cond_owner = self.cond_update = None
