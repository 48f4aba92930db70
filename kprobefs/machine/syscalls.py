"""System calls made on behalf of host code, and the tasks that make them.

A request is loaded into its task (arguments in the user window, registers in the task's
pt_regs) and run when the kernel next returns the task to user mode; its outputs are copied
back when the kernel reports the call done.  A mixin of
:class:`~kprobefs.machine.kernel.Kernel`, driven by :class:`~.driver.MachineDriver`.
"""

from __future__ import annotations

import functools
import logging
import struct
import time
from typing import Callable

from ..errors import KernelError, KernelOops, KernelStuck
from . import abi
from .abi import signed64
from .cpu import pack_syscall_regs
from .memory import PAGE, USER_WINDOW_BASE, USER_WINDOW_SIZE
from .printk import oops_report
from .task import ProcessExited, SyscallRequest, Task, check_syscall_args, marshal

__all__ = ["SystemCalls"]

log = logging.getLogger("kprobefs.machine")
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_SYSCALLS = abi.SYSCALLS


class SystemCalls:
    """Submitting, running and finishing system calls; spawning tasks."""

    #: Every how many system calls in a row (since it last went idle) a CPU's turn
    #: ends for other CPUs that run, while nobody waits for a call (background work,
    #: such as the workload's: a turn of the emulator, each way, is dearer than a few
    #: calls).  Posted work ends the turn at the next call, and a loaded call someone
    #: waits for turns this off (_awaited).  Counted, not timed, and not reset where a
    #: turn ends: the same work interleaves the same way however fast the host runs
    #: it, and whatever else (a probe) stops the emulation.
    TURN_CALLS = 64
    #: How many calls in a row background work may go on to while other work waits
    #: for the CPU it runs on (no CPU is idle to take it; see _may_go_on).
    MIN_TURN_CALLS = 16
    #: How many calls in a row a CPU's task may go on to, issued as its last ones ended
    #: (_may_go_on), while other tasks wait on its CPU and none ran; the next is queued,
    #: and the task sleeps in between, so that they run.
    MAX_TURN_CALLS = 64

    #: Seconds background work waits after the last call somebody waited for has ended
    #: (background_may_run): about ten times the gap between two reads of a `cat`.
    FOREGROUND_QUIET = 0.001

    #: Window slots made before a freed one is taken again: the TLB is flushed (a CR3
    #: reload, which costs the requests after it some 20 µs of refills) once the free
    #: slots not flushed yet are used up, not at every exit.
    WINDOW_POOL = 64

    def _take_window(self) -> int | None:
        """A user window slot for a new task (None: MAX_TASKS live).  A slot freed since
        the last TLB flush is taken only after a flush, since the TLB may still map its
        dead task's pages."""
        free = self._free_windows
        if free and free[0] not in self._stale_windows:
            return free.popleft()
        if self._next_window < min(self.WINDOW_POOL, self.MAX_TASKS) or (
                not free and self._next_window < self.MAX_TASKS):
            slot, self._next_window = self._next_window, self._next_window + 1
            return slot
        if not free:
            return None
        self.mem.flush_tlb()
        self._stale_windows.clear()
        return free.popleft()

    # ---- tasks come and go ----------------------------------------------------------
    def _hc_task_new(self):
        pid, ppid, task_struct = self._args()[:3]
        pid, ppid = signed64(pid), signed64(ppid)
        slot = self._take_window()
        if slot is None:
            return -11  # EAGAIN: the fork fails, as at RLIMIT_NPROC
        base = USER_WINDOW_BASE + slot * USER_WINDOW_SIZE
        task = self.tasks[pid] = Task(pid=pid, window=base,
                                      state_pa=self.mem.translate(task_struct
                                                                  + self._task_state_off))
        # A spawn's child has its name from its fork on, as a host process forked by
        # its parent has (see SystemCalls.start_spawn): no rename follows.
        parent = self.tasks.get(ppid)
        spawn = parent.active if parent is not None else None
        if spawn is not None and spawn.child_comm:
            self.mem.write(task_struct + self.kabi["task.comm"], spawn.child_comm)
            task.comm = spawn.child_comm.rstrip(b"\0").decode("utf-8", "replace")
            task.autoreap = spawn.child_autoreap
        for listener in self.fork_listeners:
            listener(ppid, pid)
        return base

    def _hc_task_exit(self):
        pid, code = self._args()[:2]
        pid = signed64(pid)
        task = self.tasks.pop(pid, None)
        if task is None:
            return 0
        task.state = "dead"
        task.exit_code = signed64(code)
        oops = self.mem.read(self.current_task() + self.kabi["task.oops"], 4) != bytes(4)
        if oops:
            report = oops_report(self.console, self.image.format_address)
            log.error("oops: task %d (%s) killed%s\n%s", pid, task.comm,
                      f" in {task.active.name}" if task.active else "", report)
            self.incidents.append((time.monotonic(), f"oops: task {pid} ({task.comm}): "
                                   + report.split("\n", 1)[0]))
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
        slot = (task.window - USER_WINDOW_BASE) // USER_WINDOW_SIZE
        self._free_windows.append(slot)
        self._stale_windows.add(slot)   # flushed from the TLB before it is used again
        for listener in self.exit_listeners:
            listener(pid)
        return 1 if task.autoreap else 0     # do_exit: 1 autoreaps

    def _hc_task_free(self):
        pid = signed64(self._args()[0])
        for listener in self.free_listeners:
            listener(pid)
        return 0

    def _hc_syscall_done(self):
        ret, pid, regs_ptr, no_call, _ = self._args()
        task = self.tasks.get(signed64(pid))
        if task is None:
            return 0
        task.regs_ptr = regs_ptr
        if no_call and task.active is not None:
            return 1    # a signal woke the task, and its next call is loaded meanwhile
        cpu = self.cpu
        if task.active is not None and not no_call:
            req, task.active = task.active, None
            req.result = result = signed64(ret)
            cpu.calls_in_row += 1
            if cpu.calls_in_row == 1:   # a run starts: did other tasks run during it?
                cpu.switches_seen = _U64.unpack_from(self.mem.ram, cpu.switches_pa)[0]
            for buf in req.outputs:     # copied out
                size = buf.size if not buf.upto_result else min(max(result, 0), buf.size)
                buf.data = self.mem.read(buf.addr, size) if size else b""
            if not self._finish(req):
                self._end_turn()
        else:
            self._end_turn()
        while task.pending:
            if self._load_request(task, task.pending.popleft()):
                return 1
        task.state = "user"
        cpu.idling = True
        cpu.calls_in_row = 0
        return 0

    def _finish(self, req: SyscallRequest) -> bool:
        """req is done (its result or error set): its waiter is woken, now or (in the
        emulation) as the turn ends.  Returns whether it ended the turn in progress."""
        self._awaited.discard(req)
        if req in self._foreground:
            self._foreground.discard(req)
            self._foreground_ended = now = time.monotonic()
            if not self._foreground and self.background:
                # Not woken for it: a waiter that drove the request itself wakes the
                # machine thread when it leaves work behind (a read that blocks),
                # and a stream of requests should not pay a wake-up each.
                self.background_due = now + self.FOREGROUND_QUIET
        if req.on_done is not None:
            req.on_done(req)
        if self._machine_thread is None:
            req.done.set()
            self._cond.notify_all()     # a caller driving the machine may wait on it
        elif self._in_emulation:
            # The waiter is another thread: woken now, it would take the GIL from every
            # hook that ends this turn, one by one.  The turn ends at once and the
            # waiter is woken then (MachineDriver._emulate).
            self._finished.append(req)
            if not self._scratch_depth:
                self.fast.emu_stop()
                return True
        else:
            req.done.set()
        return False

    # ---- requests --------------------------------------------------------------------
    def _load_request(self, task: Task, req: SyscallRequest) -> bool:
        """Make req the task's system call (its arguments in the user window, its
        registers in the task's pt_regs).  False, with req failed, when its arguments
        do not fit."""
        try:
            values = marshal(self.mem, task, req)
        except KernelError as e:
            req.error = e
            self._finish(req)
            return False
        self.mem.write(task.regs_ptr, pack_syscall_regs(req.nr, values))
        task.active = req
        task.state = "kernel"
        if req.on_done is None:
            self._awaited.add(req)
        return True

    def submit(self, task: Task, name: str, *args, on_done: Callable | None = None,
               wake: bool = True, child_comm: bytes = b"",
               child_autoreap: bool = False) -> SyscallRequest:
        """Queue a system call for task without waiting for it.  wake False: the
        caller waits for it next, and drives it (see MachineDriver._post).  child_comm and
        child_autoreap: a clone3's, the name its child gets and whether it is
        autoreaped (see start_spawn)."""
        try:
            nr = _SYSCALLS[name] if isinstance(name, str) else int(name)
        except KeyError:
            raise ValueError(f"unknown system call {name!r}") from None
        check_syscall_args(args)
        if task.state == "dead":
            raise ProcessExited(task.pid, task.exit_code)
        if self.stuck is not None:
            raise KernelStuck(f"the machine is stuck: {self.stuck}")
        req = SyscallRequest(task, nr, str(name), args)
        if on_done is None:
            self._foreground.add(req)
        else:
            req.on_done = on_done
        if child_comm or child_autoreap:
            req.child_comm, req.child_autoreap = child_comm, child_autoreap
        if self.in_emulation() and self._may_go_on():
            # From a hook (a call's on_done that issues the task's next call): taken
            # now, in order, so that a task whose call just ended goes on to this one
            # in the same turn, without sleeping and being woken again.
            self._accept(req)
        else:
            self._post(functools.partial(self._accept, req), wake)
        return req

    def _may_go_on(self) -> bool:
        """Whether the task whose call just ended may go on to a call issued now: yes
        unless other work waits for an idle CPU (a woken task, an upcall, an
        interrupt) and none is idle, so that this task's CPU must go idle for it;
        background work (nobody waits for a loaded call) may still go on until its CPU
        has run MIN_TURN_CALLS calls in a row.  Never past MAX_TURN_CALLS in a row while
        tasks wait on its CPU's run queue and none ran meanwhile; else the count starts
        again.  All counted: the same work interleaves the same way however fast the
        host runs it."""
        cpu = self.cpu
        in_row = cpu.calls_in_row
        if in_row >= self.MAX_TURN_CALLS:
            ram = self.mem.ram
            if (_U64.unpack_from(ram, cpu.switches_pa)[0] == cpu.switches_seen
                    and _U64.unpack_from(ram, cpu.runqueue_pa)[0] != cpu.runqueue):
                return False                # tasks wait on its CPU, and none ran
            cpu.calls_in_row = in_row = 0   # the next call starts a run
        if not (self._wakeups or self._upcalls or self.irq.has_work()):
            return True
        if any(c.state == "idle" for c in self.cpus):
            return True     # an idle CPU takes that work before the next CPU's turn
        return not self._awaited and in_row < self.MIN_TURN_CALLS

    def background_may_run(self) -> bool:
        """Whether background work (the workload's) may start a call now: the machine
        is one host thread, and the time it spends on background work is time a mount
        request waits.  Not while a call somebody waits for (a mount request's, a host
        process's: one submitted without on_done) is on its way to a CPU or on one:
        posted, queued behind its task's earlier calls, loaded with its task's wake-up
        still queued, or its task TASK_RUNNING (one whose task sleeps in the kernel, a
        read that waits for data, does not count); nor within FOREGROUND_QUIET of the
        end of the last one, the gap in which its caller makes its next request (a
        `cat` its next read)."""
        if time.monotonic() - self._foreground_ended < self.FOREGROUND_QUIET:
            return False
        ram = self.mem.ram
        wakeups = self._wakeups
        for req in list(self._foreground):
            task = req.task
            if task.state == "dead" or req.result is not None or req.error is not None:
                self._foreground.discard(req)   # ended on a path that did not finish it
                continue
            if task.active is not req or not task.state_pa:
                return False
            if _U32.unpack_from(ram, task.state_pa)[0] == abi.TASK_RUNNING:
                return False
            if wakeups and abi.IDLE_WAKE_TASK | (task.pid << 8) in wakeups:
                return False
        return True

    def run_user(self, task: Task, sleep_state: int = abi.TASK_INTERRUPTIBLE
                 ) -> SyscallRequest:
        """Mirror one run of task's host process: the task, asleep between system calls,
        is woken (try_to_wake_up), runs, and sleeps again in sleep_state
        (TASK_INTERRUPTIBLE or TASK_UNINTERRUPTIBLE), all through the kernel's own
        scheduler and without a system call (user_mode_loop).  Queued like a system
        call, after the task's pending ones; wait() on the request returns 0."""
        if task.state == "dead":
            raise ProcessExited(task.pid, task.exit_code)
        if self.stuck is not None:
            raise KernelStuck(f"the machine is stuck: {self.stuck}")
        req = SyscallRequest(task, abi.NO_SYSCALL, "user", (sleep_state,))
        self._foreground.add(req)
        self._post(lambda: self._accept(req))
        return req

    def _accept(self, req: SyscallRequest) -> None:
        task = req.task
        if task.state == "dead":
            req.error = ProcessExited(task.pid, task.exit_code)
            self._finish(req)
        elif task.state == "user" and task.active is None and not task.pending:
            if self._load_request(task, req):
                self._queue_wakeup(abi.IDLE_WAKE_TASK | (task.pid << 8), task.wake_cpu,
                                   task.wake_cpu_only)
        else:
            task.pending.append(req)

    def wait(self, req: SyscallRequest, timeout: float | None = 30.0) -> int:
        """Wait until req completes (driving the machine unless its own thread does);
        returns its raw result.  Raises what the task died of, KernelStuck at once while
        the machine is stuck, or KernelWedged if req does not complete within timeout."""
        self._await(req.done, timeout, lambda: f"{req.name} of pid {req.task.pid}")
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
              timeout: float | None = 30.0, autoreap: bool = False) -> Task:
        """A new user task forked (clone3) from parent (default: init) and named comm as
        fork makes it (the kernel's TASK_NEW: no rename follows, and sched_process_fork
        already shows the name).  With pid, the task gets exactly that pid (clone3's
        set_tid).  With autoreap, the task is released as it exits, no parent waits for
        it (Task.autoreap: a host process's, whose parent waits on the host).  Raises KernelError when clone3 fails, KernelWedged if the kernel does
        not finish within timeout seconds."""
        return self.spawned(self.start_spawn(comm, pid, parent, autoreap=autoreap), timeout)

    def start_spawn(self, comm: str, pid: int | None = None, parent: Task | None = None,
                    wake: bool = True, autoreap: bool = False) -> SyscallRequest:
        """Queues :meth:`spawn`'s clone3 without waiting for it; :meth:`spawned` gives
        the task (wake: as :meth:`submit`'s)."""
        parent = parent or self.init_task
        # Arguments are laid out from the start of the parent's scratch page, so the
        # set_tid array's user address is known before the call is marshalled.
        set_tid_addr = parent.window + PAGE + 88
        clone_args = struct.pack("<11Q", 0, 0, 0, 0, 17, 0, 0, 0,
                                 set_tid_addr if pid else 0, 1 if pid else 0, 0)
        return self.submit(parent, "clone3", clone_args + struct.pack("<q", pid or 0), 88,
                           wake=wake, child_comm=comm.encode()[:15].ljust(16, b"\0"),
                           child_autoreap=autoreap)

    def spawned(self, req: SyscallRequest, timeout: float | None = 30.0) -> Task:
        """The task a :meth:`start_spawn` made, once its clone3 is done."""
        child = self.wait(req, timeout)
        if child < 0:
            raise KernelError(-child, "clone3")
        return self.tasks[child]

