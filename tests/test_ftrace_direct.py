"""Direct calls from ftrace sites (6.1's register_ftrace_direct) in the engine's ftrace
core: a site with only a direct call calls the trampoline itself; with ftrace ops on it
too, the ops' trampoline runs them and goes on to the direct one; taking either away
leaves the other; errors are 6.1's (ENODEV, EBUSY); ftrace_enabled and module removal
treat direct calls like ops."""

import errno
import re

import pytest

from kprobefs.errors import ProbeError
from kprobefs.kprobes import FtraceOps
from kprobefs.kprobes.ftrace import Ftrace

SITE, OTHER, TRAMP = 0x1000, 0x2000, 0x9000


class _Arch:
    """What the core asks the arch for, per site: ('ops', direct) or ('direct', addr)
    or 'nop'."""

    def __init__(self):
        self.state = {}

    def ftrace_make_call(self, site, func, native=None, direct=None):
        self.state[site] = ("ops", direct)

    def ftrace_update_call(self, site, func, native=None, direct=None):
        assert site in self.state and self.state[site] != "nop"
        self.state[site] = ("ops", direct)

    def ftrace_make_direct(self, site, addr):
        self.state[site] = ("direct", addr)

    def ftrace_make_nop(self, site):
        self.state[site] = "nop"


@pytest.fixture
def ft():
    arch = _Arch()
    return Ftrace(arch, {SITE, OTHER}), arch


def test_a_direct_call_alone_patches_the_site_to_the_trampoline(ft):
    ftrace, arch = ft
    ftrace.register_ftrace_direct(SITE, TRAMP)
    assert arch.state == {SITE: ("direct", TRAMP)}
    assert ftrace.enabled_sites() == {SITE: 1}
    ftrace.unregister_ftrace_direct(SITE, TRAMP)
    assert arch.state == {SITE: "nop"} and ftrace.enabled_sites() == {}


@pytest.mark.parametrize("direct_first", [True, False])
@pytest.mark.parametrize("direct_goes_first", [True, False])
def test_ops_and_a_direct_call_share_a_site_in_any_order(ft, direct_first, direct_goes_first):
    ftrace, arch = ft
    ops = FtraceOps(func=lambda *a: None, filter={SITE})
    steps = [lambda: ftrace.register_ftrace_direct(SITE, TRAMP),
             lambda: ftrace.register_ftrace_function(ops)]
    for step in (steps if direct_first else steps[::-1]):
        step()
    assert arch.state[SITE] == ("ops", TRAMP)          # the ops, then on to the direct
    assert ftrace.enabled_sites() == {SITE: 2}
    if direct_goes_first:
        ftrace.unregister_ftrace_direct(SITE, TRAMP)
        assert arch.state[SITE] == ("ops", None)
        ftrace.unregister_ftrace_function(ops)
    else:
        ftrace.unregister_ftrace_function(ops)
        assert arch.state[SITE] == ("direct", TRAMP)
        ftrace.unregister_ftrace_direct(SITE, TRAMP)
    assert arch.state[SITE] == "nop"


def test_errors_are_linux_6_1s(ft):
    ftrace, arch = ft
    with pytest.raises(ProbeError) as e:
        ftrace.register_ftrace_direct(0x1234, TRAMP)
    assert e.value.errno == errno.ENODEV
    ftrace.register_ftrace_direct(SITE, TRAMP)
    with pytest.raises(ProbeError) as e:
        ftrace.register_ftrace_direct(SITE, TRAMP + 0x10)
    assert e.value.errno == errno.EBUSY
    with pytest.raises(ProbeError) as e:
        ftrace.unregister_ftrace_direct(SITE, TRAMP + 0x10)
    assert e.value.errno == errno.ENODEV
    with pytest.raises(ProbeError) as e:
        ftrace.unregister_ftrace_direct(OTHER, TRAMP)
    assert e.value.errno == errno.ENODEV
    assert arch.state == {SITE: ("direct", TRAMP)}     # nothing half-applied


def test_ftrace_enabled_and_module_removal_cover_direct_calls(ft):
    ftrace, arch = ft
    ftrace.register_ftrace_direct(SITE, TRAMP)
    ftrace.set_ftrace_enabled(0)
    assert arch.state[SITE] == "nop"
    ftrace.set_ftrace_enabled(1)
    assert arch.state[SITE] == ("direct", TRAMP)
    ftrace.remove_sites({SITE})
    assert arch.state[SITE] == "nop" and ftrace.direct == {}


# ---- on the machine -----------------------------------------------------------------------
def _counting_trampoline(kernel, counter):
    """A direct trampoline: ``movabs rax, counter; inc qword [rax]; ret`` (rax is no
    argument register at a function's entry)."""
    arch = kernel.kprobes.arch
    tramp = arch.slots.get(48)
    kernel.text_poke(tramp, b"\x48\xb8" + counter.to_bytes(8, "little") + b"\x48\xff\x00\xc3")
    return tramp


def test_a_direct_trampoline_runs_at_every_call_beside_a_kprobe():
    from kprobefs import Kernel, Kprobe
    from test_kprobes import expected_loop, loop, sym
    kernel = Kernel(cpus=2, seed=0)
    site = sym(kernel, "kprobe_target_traced").addr
    assert kernel.kprobes.ftrace.is_ftrace_location(site)
    counter = kernel.upcall("kzalloc", 8, 0xCC0) & (1 << 64) - 1
    tramp = _counting_trampoline(kernel, counter)
    count = lambda: int.from_bytes(kernel.read(counter, 8), "little")     # noqa: E731
    ftrace = kernel.kprobes.ftrace
    ftrace.register_ftrace_direct(site, tramp)
    assert loop(kernel, 50, traced=1) == expected_loop(50)
    assert count() == 50
    hits = []
    p = Kprobe(symbol_name="kprobe_target_traced", pre_handler=lambda p, r: hits.append(r.di))
    kernel.register_kprobe(p)                   # ops on the site: they run, then the direct
    assert loop(kernel, 20, traced=1) == expected_loop(20)
    assert count() == 70 and hits == list(range(20))
    ftrace.unregister_ftrace_direct(site, tramp)
    assert loop(kernel, 5, traced=1) == expected_loop(5)
    assert count() == 70 and len(hits) == 25
    ftrace.register_ftrace_direct(site, tramp)
    kernel.unregister_kprobe(p)                 # the direct call is alone again
    assert kernel.read(site, 5) == b"\xe8" + (tramp - site - 5).to_bytes(4, "little",
                                                                        signed=True)
    assert loop(kernel, 5, traced=1) == expected_loop(5) and count() == 75
    ftrace.unregister_ftrace_direct(site, tramp)
    assert kernel.read(site, 5) == bytes.fromhex("0f1f440000")


def test_the_kernel_asks_through_its_hypercall():
    from kprobefs import Kernel
    from test_kprobes import sym
    kernel = Kernel(cpus=2, seed=0)
    site = sym(kernel, "kprobe_target_traced").addr
    counter = kernel.upcall("kzalloc", 8, 0xCC0) & (1 << 64) - 1
    tramp = _counting_trampoline(kernel, counter)
    reg = sym(kernel, "register_ftrace_direct").addr
    unreg = sym(kernel, "unregister_ftrace_direct").addr
    assert kernel.upcall(reg, site, tramp) == 0
    assert kernel.upcall(reg, site, tramp) & 0xFFFFFFFF == (-errno.EBUSY) & 0xFFFFFFFF
    assert kernel.upcall(reg, site + 1, tramp) & 0xFFFFFFFF == (-errno.ENODEV) & 0xFFFFFFFF
    assert kernel.kprobes.ftrace.direct == {site: tramp}
    assert kernel.upcall(unreg, site, tramp) == 0
    assert kernel.kprobes.ftrace.direct == {}


def test_the_sample_modules_trampolines_print_beside_a_kprobe_and_the_function_tracer():
    """ftrace-direct.ko's trampoline on wake_up_process prints "waking up COMM-PID" with
    trace_printk; ftrace-direct-too.ko's on vfs_read beside it; a kprobe event and the
    function tracer on the same sites keep working; unloading takes the calls away."""
    from kprobefs import Kernel
    from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR
    from kprobefs.machine import UserBuffer
    from kprobefs.tracing import Tracer
    from test_kprobes import sym
    from test_tracer_e2e import read, write
    kernel = Kernel(cpus=2, seed=0)
    root = Tracer(kernel.kprobes, kernel).tracefs_root()
    task = kernel.spawn("reader")

    def read_file():
        fd = kernel.syscall(task, "openat", AT_FDCWD, "/tmp/direct", O_CREAT | O_RDWR, 0o644)
        kernel.syscall(task, "read", fd, UserBuffer(4), 4)
        kernel.syscall(task, "close", fd)

    def lines(what):
        return [l for l in read(root, "trace").splitlines() if what in l]

    kernel.modules.load("ftrace-direct")
    kernel.modules.load("ftrace-direct-too")
    site = sym(kernel, "wake_up_process").addr
    assert set(kernel.kprobes.ftrace.direct) == {site, sym(kernel, "vfs_read").addr}
    write(root, "kprobe_events", "p:kwake wake_up_process task=$arg1")
    write(root, "events/kprobes/kwake/enable", "1")
    write(root, "current_tracer", "function")
    write(root, "set_ftrace_filter", "vfs_read")
    read_file()
    assert any(re.search(r"my_direct_func: waking up reader-%d$" % task.pid, l)
               for l in lines("my_direct_func: waking up")), lines("my_direct_func")
    assert lines("my_direct_func: vfs read file=")
    assert lines("kwake:") and lines("vfs_read <-")
    write(root, "current_tracer", "nop")
    write(root, "events/kprobes/kwake/enable", "0")
    kernel.modules.unload("ftrace_direct")
    kernel.modules.unload("ftrace_direct_too")
    assert kernel.kprobes.ftrace.direct == {}
    write(root, "trace", "")
    read_file()
    assert not lines("my_direct_func")
    assert kernel.read(site, 5) == bytes.fromhex("0f1f440000")
