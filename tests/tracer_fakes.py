"""Fakes for the tracer tests: a kernel image, a kernel and a kprobes engine.

They offer exactly the names the tracer uses, so the tests run without the emulator.
"""

import errno
import os
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

from kprobefs.errors import ProbeError
from kprobefs.tracing.registry import Tracer

TEXT = 0xFFFFFFFF81000000
VFS_READ = TEXT + 0x1000
KSYS_READ = TEXT + 0x2000
KERNEL_CLONE = TEXT + 0x3000
DO_EXIT = TEXT + 0x4000
NOTRACE_FN = TEXT + 0x5000
TRACEFS_CREATE_DIR = TEXT + 0x6000
FOO_COLD = TEXT + 0x7000
JIFFIES = 0xFFFFFFFF82000000
KDATA = 0xFFFF888000001000
STACK = 0xFFFFC90000004000
SP = STACK + 0x3F00
UBASE = 0x00007FFF00001000


@dataclass(frozen=True, order=True)
class Sym:
    addr: int
    name: str
    size: int
    type: str = "t"


class FakeImage:
    def __init__(self):
        self.symbols = sorted([
            Sym(VFS_READ, "vfs_read", 0x1A0, "T"),
            Sym(KSYS_READ, "ksys_read", 0xF0, "T"),
            Sym(KERNEL_CLONE, "kernel_clone", 0x300, "T"),
            Sym(DO_EXIT, "do_exit", 0x400, "T"),
            Sym(NOTRACE_FN, "notrace_fn", 0x40, "t"),
            Sym(TRACEFS_CREATE_DIR, "tracefs_create_dir", 0x80, "T"),
            Sym(FOO_COLD, "kernel_clone.cold", 0x20, "t"),
            Sym(TEXT + 0x8000, "name_show", 0x40, "t"),
            Sym(TEXT + 0x8100, "name_show", 0x40, "t"),
            Sym(JIFFIES, "jiffies", 8, "D"),
        ])
        self.ftrace_sites = (VFS_READ, KSYS_READ, KERNEL_CLONE, DO_EXIT,
                             TRACEFS_CREATE_DIR, TEXT + 0x8000, TEXT + 0x8100)
        self.text = {}           # addr -> bytes for the unwinder's call check

    def lookup_name(self, name):
        return [s for s in self.symbols if s.name == name]

    def symbol_at(self, addr):
        for s in self.symbols:
            if s.addr <= addr < s.addr + max(s.size, 1):
                return s
        return None

    def read(self, addr, size):
        for base, data in self.text.items():
            if base <= addr and addr + size <= base + len(data):
                return data[addr - base:addr - base + size]
        return bytes(size)


class FakeKernel:
    """Memory regions, a current task and a current CPU."""

    def __init__(self, nr_cpus=2):
        self.image = FakeImage()
        self.nr_cpus = nr_cpus
        self.seed = 7
        self.cpu = SimpleNamespace(index=0)
        self.pid = 100
        self.comm = "bash"
        self.mem = {}
        self.exit_listeners = []
        self.fork_listeners = []

    def read(self, addr, size):
        for base, data in self.mem.items():
            if base <= addr and addr + size <= base + len(data):
                return data[addr - base:addr - base + size]
        raise LookupError(f"unmapped {addr:#x}")

    def current_pid(self):
        return self.pid

    def current_comm(self):
        return self.comm

    def run_as(self, pid, comm, cpu=0):
        self.pid, self.comm, self.cpu.index = pid, comm, cpu


@dataclass(eq=False)
class FakeKprobe:
    symbol_name: str = None
    addr: int = None
    offset: int = 0
    pre_handler: Callable = None
    post_handler: Callable = None
    flags: int = 0
    nmissed: int = 0
    registered: bool = False


@dataclass(eq=False)
class FakeKretprobe:
    symbol_name: str = None
    addr: int = None
    offset: int = 0
    handler: Callable = None
    entry_handler: Callable = None
    maxactive: int = 0
    data_size: int = 0
    nmissed: int = 0
    kp: FakeKprobe = field(default_factory=FakeKprobe)


class FakeEngine:
    """Resolves symbols on the fake image; ``errors[addr] = errno`` makes a
    registration fail; :meth:`hit` and :meth:`ret` fire handlers."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.errors = {}
        self.probes = []
        self.calls = []

    def _resolve(self, p):
        if p.symbol_name is not None:
            if ":" in p.symbol_name:
                raise ProbeError(errno.ENOENT, "no module")
            syms = self.kernel.image.lookup_name(p.symbol_name)
            if not syms:
                raise ProbeError(errno.ENOENT, "no symbol")
            addr = syms[0].addr + p.offset
        else:
            addr = p.addr
        if self.kernel.image.symbol_at(addr) is None:
            raise ProbeError(errno.ENOENT, "no symbol")
        if addr in self.errors:
            raise ProbeError(self.errors[addr], "refused")
        return addr

    def register_kprobe(self, kp):
        kp.addr = self._resolve(kp)
        if kp.addr in self.kernel.image.ftrace_sites:
            kp.flags |= 8
        kp.registered = True
        self.probes.append(kp)
        self.calls.append(("register", kp))

    def unregister_kprobe(self, kp):
        self.probes.remove(kp)
        kp.registered = False
        self.calls.append(("unregister", kp))

    def enable_kprobe(self, kp):
        kp.flags &= ~2
        self.calls.append(("enable", kp))

    def disable_kprobe(self, kp):
        kp.flags |= 2
        self.calls.append(("disable", kp))

    def register_kretprobe(self, rp):
        kp = rp.kp
        kp.symbol_name, kp.addr, kp.offset = rp.symbol_name, rp.addr, rp.offset
        addr = self._resolve(kp)
        if self.kernel.image.symbol_at(addr).addr != addr:
            raise ProbeError(errno.EINVAL, "not an entry")
        if rp.maxactive <= 0:
            rp.maxactive = 10
        kp.owner = rp
        self.register_kprobe(kp)

    def unregister_kretprobe(self, rp):
        self.unregister_kprobe(rp.kp)

    def enable_kretprobe(self, rp):
        self.enable_kprobe(rp.kp)

    def disable_kretprobe(self, rp):
        self.disable_kprobe(rp.kp)

    def armed(self, addr):
        return [kp for kp in self.probes if kp.addr == addr and not kp.flags & 2]

    def hit(self, addr, regs=None, **reg_values):
        """Run every armed kprobe at addr as an int3 hit would (regs.ip = addr + 1), or
        at an ftrace site as its trampoline would (regs.trapped is False there)."""
        trapped = addr not in self.kernel.image.ftrace_sites
        regs = regs or make_regs(ip=addr + 1, trapped=trapped, **reg_values)
        for kp in self.armed(addr):
            if getattr(kp, "owner", None) is None:
                kp.pre_handler(kp, regs)
        return regs

    def ret(self, func, ret_addr, regs=None, **reg_values):
        """Run the return handlers of the kretprobes at func."""
        regs = regs or make_regs(ip=ret_addr, **reg_values)
        for kp in self.armed(func):
            rp = getattr(kp, "owner", None)
            if rp is not None:
                ri = SimpleNamespace(ret_addr=ret_addr, func=func, task=self.kernel.pid,
                                     data=bytearray())
                rp.handler(ri, regs)
        return regs


REGS = ("r15", "r14", "r13", "r12", "r11", "r10", "r9", "r8", "bx", "cx", "dx", "si", "di",
        "bp", "ax", "orig_ax", "ip", "cs", "flags", "sp", "ss")


def make_regs(**values):
    regs = dict.fromkeys(REGS, 0)
    regs["sp"] = SP
    regs.update(values)
    return SimpleNamespace(**regs)


class FakeFtrace:
    """ftrace ops per site; ``call(site, parent)`` runs them as a site's trampoline."""

    def __init__(self):
        self.attached = {}

    def register_ftrace_function(self, ops):
        for site in ops.filter:
            self.attached.setdefault(site, []).append(ops)
        ops.registered = True

    def unregister_ftrace_function(self, ops):
        for users in self.attached.values():
            if ops in users:
                users.remove(ops)
        ops.registered = False

    def ftrace_set_filter_ip(self, ops, ip, remove=False):
        if remove:
            ops.filter.discard(ip)
            self.attached[ip].remove(ops)
        else:
            ops.filter.add(ip)
            self.attached.setdefault(ip, []).append(ops)

    def call(self, site, parent, regs=None):
        for ops in list(self.attached.get(site, ())):
            ops.func(site, parent, ops, regs)


class Clock:
    def __init__(self, start=1_234_567_891_000):
        self.now = start

    def __call__(self):
        return self.now

    def advance(self, ns):
        self.now += ns


class DirHook:
    """Records tracefs_create_dir calls; handles are (name, parent) tuples."""

    def __init__(self):
        self.created = []
        self.removed = []

    def create(self, name, parent):
        handle = (name, parent)
        self.created.append(handle)
        return handle

    def remove(self, handle):
        self.removed.append(handle)


def make_tracer(nr_cpus=2, **kw):
    kernel = FakeKernel(nr_cpus)
    stack = bytearray(0x4000)
    for i in range(32):
        struct.pack_into("<Q", stack, 0x3F00 + 8 * i, 0x1000 + i)
    kernel.mem[STACK] = bytes(stack)
    kdata = bytearray(0x1000)
    kdata[0x80:0x86] = b"hello\0"
    kernel.mem[KDATA] = bytes(kdata)
    kernel.mem[UBASE] = b"/dev/null\0".ljust(0x1000, b"\0")
    kernel.mem[JIFFIES] = struct.pack("<Q", 0x100000123)
    engine = FakeEngine(kernel)
    clock = Clock()
    hooks = DirHook()
    tracer = Tracer(engine, kernel, clock=clock, create_dir_hook=hooks.create,
                    remove_dir_hook=hooks.remove, kprobe_factory=FakeKprobe,
                    kretprobe_factory=FakeKretprobe, pointer_key=b"test", **kw)
    return SimpleNamespace(tracer=tracer, kernel=kernel, engine=engine, clock=clock,
                           hooks=hooks, root=tracer.tracefs_root())


# ------------------------------------------------------------------- file helpers

def node(root, path):
    cur = root
    for part in path.strip("/").split("/"):
        cur = cur.children()[part]
    return cur


def cat(root, path, chunk=4096, pid=1, comm="cat"):
    handle = node(root, path).open(os.O_RDONLY, pid, comm)
    out = b""
    while True:
        data = handle.read(chunk, len(out))
        if not data:
            break
        out += data
    handle.release()
    return out.decode()


def echo(root, path, data, append=True, pid=1, comm="sh"):
    """``echo data >> path`` (or ``>`` when not append): open, one write, release."""
    flags = os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC)
    handle = node(root, path).open(flags, pid, comm)
    try:
        if isinstance(data, str):
            data = data.encode()
        return handle.write(data, 0)
    finally:
        handle.release()


def write_errno(root, path, data, append=True):
    try:
        echo(root, path, data, append)
    except OSError as exc:
        return exc.errno
    return 0
