"""A background workload: tasks that keep the kernel busy the way a real system is, with
file I/O, directories, links, forks, execs, signals and exits, and TCP connections
arriving from the NIC.

Each worker is a generator that yields system calls ``(name, *args)`` and receives their
results; a seeded random generator picks what they do, so a run is reproducible.
"""

from __future__ import annotations

import random
import struct
import time
from typing import Generator

from . import abi
from .kernel import Kernel, ProcessExited, SyscallRequest, Task, UserBuffer

__all__ = ["Workload", "tcp_syn_packet", "inet_checksum"]

Step = Generator[tuple, int, None]

#: Programs the workload's children exec (made in the emulated rootfs at start).
PROGRAMS = ("/usr/bin/true", "/usr/bin/sleep", "/bin/sh")
SIGUSR1, SIGTERM = 10, 15
#: Completed calls a workload records (Workload.results).
RESULTS_KEPT = 10_000
#: The most a workload's budget holds, in seconds of its rate: what came due between two
#: pumps (the machine thread pumps every 20 ms), and a short burst after a busy spell.
BURST_SECONDS = 0.1
#: How long the workload waits at most while calls somebody waits for want the machine
#: (Kernel.background_may_run) before one of its own calls starts all the same.
STARVE_SECONDS = 0.1
#: Names a worker's files take in /tmp, in turn: the files it keeps (three in ten) are
#: written over when their name comes round again, so a workload that runs for weeks
#: keeps at most this many files a worker.
NAMES_PER_WORKER = 32
#: A handler's address for rt_sigaction (no user code runs: delivering is all).
_HANDLER, _RESTORER, _SA_RESTORER = 0x401000, 0x401100, 0x04000000


def _background(_req: SyscallRequest) -> None:
    """The on_done of a child's calls: nobody waits for them (the machine may let the
    CPUs' turns run on meanwhile, see SystemCalls._awaited)."""


def inet_checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of data."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def tcp_syn_packet(src_ip: int, dst_ip: int, sport: int, dport: int, seq: int = 1,
                   payload: bytes = b"", flags: int = 0x02) -> bytes:
    """An IPv4 packet carrying a TCP segment (SYN by default), checksums filled in."""
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0) + payload
    pseudo = struct.pack("!IIBBH", src_ip, dst_ip, 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", inet_checksum(pseudo + tcp)) + tcp[18:]
    total = 20 + len(tcp)
    ip = struct.pack("!BBHHHBBHII", 0x45, 0, total, 0, 0x4000, 64, 6, 0, src_ip, dst_ip)
    ip = ip[:10] + struct.pack("!H", inet_checksum(ip)) + ip[12:]
    return ip + tcp


class Workload:
    """Workers issuing system calls, each with at most one call in flight.

    ``rate`` is the number of operations a second let through (0 stops the workload):
    :meth:`pump` adds what came due to a budget and starts the waiting workers, and a
    worker whose call returns goes on at once while budget is left, so the rate holds
    however seldom the pump runs (up to what the machine can do).  It is background
    work: its calls start only while Kernel.background_may_run (no mount request, no
    host process's call wants the machine), but for one every STARVE_SECONDS; the
    budget waits meanwhile (up to BURST_SECONDS of the rate).  :meth:`run` ignores all
    this and simply runs a number of operations.
    """

    def __init__(self, kernel: Kernel, seed: int = 0, workers: int = 3, rate: float = 50.0):
        self.kernel = kernel
        self.rng = random.Random(seed)
        self.rate = rate
        self.completed = 0
        self.errors: dict[str, int] = {}
        #: (worker comm, system call, result) of the first RESULTS_KEPT completed calls,
        #: in order (a workload that runs for weeks keeps no more).
        self.results: list[tuple[str, str, int]] = []
        self._budget = 0.0
        self._last = self._started = time.monotonic()
        self._unlimited = False
        self._budget_left: int | None = None
        self._listener_port = 8000 + self.rng.randrange(1000)
        for program in PROGRAMS:
            kernel.upcall("host_binary_create", program)
        self._tasks = [kernel.spawn(f"kworker-load{i}") for i in range(workers)]
        self._gens = {t.pid: self._worker(t, i) for i, t in enumerate(self._tasks)}
        #: The call each waiting worker makes next; and the result a worker held back
        #: as background work waits has yet to get (it then says what it does next:
        #: the calls a fork's child makes are queued as it goes on).
        self._ready: dict[int, tuple] = {t.pid: next(self._gens[t.pid]) for t in self._tasks}
        self._held: dict[int, int] = {}

    # ---- driving ---------------------------------------------------------------------
    def _submit(self, task: Task, call: tuple) -> None:
        if self._budget_left is not None:
            self._budget_left -= 1
        self._started = time.monotonic()
        self.kernel.submit(task, *call, on_done=lambda req: self._done(task, call[0], req))

    def _done(self, task: Task, name: str, req: SyscallRequest) -> None:
        """Runs in the emulation thread when a worker's call returns."""
        self.completed += 1
        result = req.result if req.error is None else -3
        if len(self.results) < RESULTS_KEPT:
            self.results.append((task.comm, name, result))
        if result < 0:
            self.errors[name] = self.errors.get(name, 0) + 1
        if not self._unlimited:
            if self._budget >= 1 and self.kernel.background_may_run():
                self._budget -= self._go_on(task, result)
            else:
                self._held[task.pid] = result
            return
        try:
            call = self._gens[task.pid].send(result)
        except StopIteration:
            return
        if self._budget_left is None or self._budget_left > 0:
            self._submit(task, call)
        else:
            self._ready[task.pid] = call

    def _go_on(self, task: Task, result: int) -> int:
        """Gives a worker its call's result and submits the call it makes next; 0 if
        it has none."""
        try:
            call = self._gens[task.pid].send(result)
        except StopIteration:
            return 0
        self._submit(task, call)
        return 1

    def _release(self, limit: float) -> int:
        n = 0
        for task in self._tasks:
            if n >= limit:
                break
            if task.pid in self._held:
                n += self._go_on(task, self._held.pop(task.pid))
            elif task.pid in self._ready:
                self._submit(task, self._ready.pop(task.pid))
                n += 1
        return n

    def run(self, ops: int, timeout: float = 60.0) -> None:
        """Run exactly `ops` more operations, as fast as the machine goes: workers stop
        issuing once that many have been issued, and the run ends when they are done."""
        deadline = time.monotonic() + timeout
        with self.kernel.lock:
            self._unlimited = True
            self._budget_left = ops
            try:
                self._release(min(len(self._ready) + len(self._held), ops))
                while self.kernel.run_slice():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the workload did not make progress")
            finally:
                self._unlimited = False
                self._budget_left = None

    def drive(self) -> None:
        """From now on the machine pumps the workload, as background work: at each of
        its periodic rounds, and as mount requests leave it time (Kernel.background)."""
        self.kernel.periodic.append(self.pump)
        self.kernel.background.append(self.pump)

    def pump(self) -> None:
        """Adds the operations the rate gave since the last call to the budget (which
        holds at most BURST_SECONDS of the rate, and at least one) and lets the waiting
        workers through while it lasts, if background work may run now (else one, once
        STARVE_SECONDS have passed without one).  Caller holds the kernel lock."""
        now = time.monotonic()
        burst = max(1.0, self.rate * BURST_SECONDS)
        self._budget = min(self._budget + (now - self._last) * self.rate, burst)
        self._last = now
        limit = int(self._budget)
        if limit and not self.kernel.background_may_run():
            limit = 1 if now - self._started >= STARVE_SECONDS else 0
        self._budget -= self._release(limit)

    # ---- what a worker does ----------------------------------------------------------
    def _worker(self, task: Task, index: int) -> Step:
        rng = random.Random(self.rng.random())
        if index == 0:
            yield from self._listener(task, rng)
        n = 0
        while True:
            n += 1
            kind = rng.choice(("file", "file", "dir", "link", "fork", "stat", "exec",
                               "signal"))
            # Only files stay; their names come round again (the others go at once).
            path = (f"/tmp/w{task.pid}-f{n % NAMES_PER_WORKER}" if kind == "file"
                    else f"/tmp/w{task.pid}-{n}")
            yield from getattr(self, f"_do_{kind}")(task, rng, path)

    def _do_file(self, task: Task, rng: random.Random, path: str) -> Step:
        fd = yield ("openat", abi.AT_FDCWD, path, abi.O_CREAT | abi.O_RDWR, 0o644)
        if fd < 0:
            return
        data = rng.randbytes(rng.randrange(1, 512))
        yield ("write", fd, data, len(data))
        yield ("lseek", fd, 0, 0)
        yield ("read", fd, UserBuffer(len(data)), len(data))
        yield ("close", fd)
        if rng.random() < 0.7:
            yield ("unlink", path)

    def _do_dir(self, task: Task, rng: random.Random, path: str) -> Step:
        if (yield ("mkdir", path, 0o755)) == 0:
            fd = yield ("openat", abi.AT_FDCWD, "/tmp", abi.O_RDONLY | abi.O_DIRECTORY, 0)
            if fd >= 0:
                yield ("getdents64", fd, UserBuffer(512), 512)
                yield ("close", fd)
            yield ("rmdir", path)

    def _do_link(self, task: Task, rng: random.Random, path: str) -> Step:
        if (yield ("symlink", "/tmp", path)) == 0:
            yield ("readlink", path, UserBuffer(64), 64)
            yield ("unlink", path)

    def _do_stat(self, task: Task, rng: random.Random, path: str) -> Step:
        yield ("newfstatat", abi.AT_FDCWD, "/tmp", UserBuffer(144), 0)
        yield ("getppid",)

    def _do_fork(self, task: Task, rng: random.Random, path: str) -> Step:
        child = yield ("fork",)
        if child > 0:
            kid = self.kernel.tasks.get(child)
            if kid is not None:
                try:
                    self.kernel.submit(kid, "exit", rng.randrange(4), on_done=_background)
                except ProcessExited:
                    pass
            yield ("wait4", child, UserBuffer(4), 0, 0)

    def _in_child(self, child: int, *calls: tuple) -> None:
        """Queues calls for the child task, in order (it may be gone already)."""
        kid = self.kernel.tasks.get(child)
        if kid is None:
            return
        try:
            for call in calls:
                self.kernel.submit(kid, *call, on_done=_background)
        except ProcessExited:
            pass

    def _do_exec(self, task: Task, rng: random.Random, path: str) -> Step:
        """A child execs a program, then exits."""
        child = yield ("fork",)
        if child > 0:
            program = rng.choice(PROGRAMS)
            self._in_child(child, ("execve", program, [program.rsplit("/", 1)[1]],
                                   ["PATH=/usr/bin:/bin"]),
                           ("exit", 0))
            yield ("wait4", child, UserBuffer(4), 0, 0)

    def _do_signal(self, task: Task, rng: random.Random, path: str) -> Step:
        """A child is sent SIGTERM (its default action ends it), or installs a SIGUSR1
        handler and raises it (delivered, then it exits)."""
        child = yield ("fork",)
        if child <= 0:
            return
        if rng.random() < 0.5:
            yield ("kill", child, SIGTERM)
        else:
            action = struct.pack("<4Q", _HANDLER, _SA_RESTORER, _RESTORER, 0)
            self._in_child(child, ("rt_sigaction", SIGUSR1, action, 0, 8),
                           ("tgkill", child, child, SIGUSR1), ("exit", 0))
        yield ("wait4", child, UserBuffer(4), 0, 0)

    def _listener(self, task: Task, rng: random.Random) -> Step:
        """Worker 0 listens on a port; packets for it arrive from the NIC."""
        fd = yield ("socket", abi.AF_INET, abi.SOCK_STREAM, 0)
        if fd < 0:
            return
        addr = struct.pack("<H", abi.AF_INET) + struct.pack("!H", self._listener_port) + bytes(12)
        if (yield ("bind", fd, addr, 16)) < 0 or (yield ("listen", fd, 16)) < 0:
            return
        for i in range(3):
            self.kernel.inject_packet(tcp_syn_packet(0x0A000002, 0x0A000001,
                                                     40000 + rng.randrange(20000),
                                                     self._listener_port))
            conn = yield ("accept4", fd, 0, 0, abi.O_NONBLOCK)
            if conn >= 0:
                yield ("close", conn)
