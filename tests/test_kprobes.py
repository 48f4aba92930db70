"""The kprobes engine on the emulated kernel's real code: kprobes, boosting, emulation,
aggregates, misses, jprobes, kretprobes, jump optimization, ftrace-site probes, fprobes,
the global switches and the listings."""

import errno
import logging
import struct
import traceback

import pytest

from kprobefs import Fprobe, Jprobe, Kernel, Kprobe, Kretprobe
from kprobefs.arch.x86.insn import can_boost, iter_insns
from kprobefs.errors import ProbeError
from kprobefs.kprobes import (
    FPROBE_FL_KPROBE_SHARED, KPROBE_FLAG_DISABLED, MAX_STACK_SIZE,
)
from kprobefs.kprobes.faults import RATELIMIT_INTERVAL, HandlerErrorLog
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR

INT3 = 0xCC


@pytest.fixture
def kernel():
    return Kernel(cpus=2, seed=0)


def sym(kernel, name):
    (s,) = kernel.image.lookup_name(name)
    return s


def loop(kernel, n, traced=0):
    """kprobe_bench_loop(n, traced): calls kprobe_target[_traced](i, s) n times."""
    return kernel.upcall("kprobe_bench_loop", n, traced)


def _i32(v):
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & (1 << 31) else v


def expected_loop(n):
    """What kprobe_bench_loop(n, …) returns, computed with C's int/long arithmetic."""
    s = 0
    for i in range(n):
        s += _i32(_i32(i + _i32(s)) * 2 + 7)
    return s


class Counter:
    def __init__(self):
        self.n = 0
        self.regs = []

    def pre(self, p, regs):
        self.n += 1
        self.regs.append((regs.ip, regs.di, regs.si))
        return 0


def text(kernel, addr, size=5):
    return kernel.read(addr, size)


# ---- kprobes: the int3 path ------------------------------------------------------------------
def test_kprobe_pre_and_post_handlers_see_registers(kernel):
    target = sym(kernel, "kprobe_target")
    seen = []

    def pre(p, regs):
        seen.append(("pre", regs.ip, regs.di, regs.si))
        return 0

    def post(p, regs, flags):
        seen.append(("post", regs.ip))

    p = Kprobe(symbol_name="kprobe_target", pre_handler=pre, post_handler=post)
    kernel.register_kprobe(p)
    assert p.addr == target.addr and text(kernel, p.addr, 1)[0] == INT3
    assert loop(kernel, 3) == expected_loop(3)
    first = next(iter_insns(kernel.kprobes.arch.original_bytes(target.addr, 16), target.addr))
    assert seen[0] == ("pre", target.addr + 1, 0, 0)          # ip = probe address + 1
    assert seen[1] == ("post", target.addr + first.length)    # after the instruction
    assert [s[2] for s in seen if s[0] == "pre"] == [0, 1, 2]  # first argument: i
    kernel.unregister_kprobe(p)
    assert text(kernel, target.addr, 1) == kernel.image.read(target.addr, 1)


def test_pre_handler_can_redirect_execution(kernel):
    """A pre_handler that sets regs.ip and returns 1 skips the function body."""
    target = sym(kernel, "kprobe_target")
    code = kernel.kprobes.arch.original_bytes(target.addr, target.size)
    ret = next(i.address for i in iter_insns(code, target.addr) if i.mnemonic == "ret")

    def pre(p, regs):
        regs.ax = 100
        # Skip to `ret` with the frame untouched: the function returns 100.
        regs.ip = ret
        return 1

    kernel.register_kprobe(Kprobe(symbol_name="kprobe_target", pre_handler=pre))
    assert loop(kernel, 5) == 500


def test_symbol_offset_and_registration_errors(kernel):
    target = sym(kernel, "vfs_read")
    p = Kprobe(symbol_name="vfs_read", offset=5, pre_handler=lambda p, r: 0)
    kernel.register_kprobe(p)
    assert p.addr == target.addr + 5
    with pytest.raises(ProbeError) as e:
        kernel.register_kprobe(p)                              # already registered
    assert e.value.errno == errno.EINVAL
    cases = [
        (Kprobe(symbol_name="vfs_read", addr=target.addr), errno.EINVAL),   # both
        (Kprobe(), errno.EINVAL),                                            # neither
        (Kprobe(symbol_name="vfs_read", offset=3), errno.EILSEQ),            # mid-insn
        (Kprobe(symbol_name="no_such_function"), errno.ENOENT),
        (Kprobe(symbol_name="exc_page_fault"), errno.EINVAL),                # NOKPROBE
        (Kprobe(symbol_name="notifier_call_chain"), errno.EINVAL),
        (Kprobe(symbol_name="kretprobe_trampoline"), errno.EINVAL),          # kprobes' own
        (Kprobe(symbol_name="linux_proc_banner"), errno.EINVAL),             # not text
    ]
    for probe, err in cases:
        with pytest.raises(ProbeError) as e:
            kernel.register_kprobe(probe)
        assert e.value.errno == err, probe


def _slot_executions(kernel, p):
    """Count executions of the int3 that ends p's single-step slot."""
    ap = kernel.kprobes.get_kprobe(p.addr)
    slot_int3 = ap.ainsn.ss_addr + ap.ainsn.insn.length
    count = [0]
    kernel.hook_code(slot_int3, slot_int3, lambda k, a: count.__setitem__(0, count[0] + 1))
    return count


def test_boosted_probe_skips_the_single_step(kernel):
    kernel.kprobes.set_optimization(False)
    c = Counter()
    p = Kprobe(symbol_name="kprobe_target", pre_handler=c.pre)
    kernel.register_kprobe(p)
    assert kernel.kprobes.get_kprobe(p.addr).ainsn.boostable
    steps = _slot_executions(kernel, p)
    assert loop(kernel, 20) == expected_loop(20)
    assert c.n == 20 and steps[0] == 0
    # The same probe with a post_handler must single-step (and trap after the copy).
    kernel.unregister_kprobe(p)
    q = Kprobe(symbol_name="kprobe_target", pre_handler=c.pre,
               post_handler=lambda p, r, f: None)
    kernel.register_kprobe(q)
    steps = _slot_executions(kernel, q)
    assert loop(kernel, 20) == expected_loop(20)
    assert c.n == 40 and steps[0] == 20


def _find_insn(kernel, func, kind=None, pred=None):
    s = sym(kernel, func)
    for insn in iter_insns(kernel.kprobes.arch.original_bytes(s.addr, s.size), s.addr):
        if (kind is None or insn.kind == kind) and (pred is None or pred(insn)):
            return insn
    raise LookupError(f"no such instruction in {func}")


@pytest.mark.parametrize("func,what", [
    ("kprobe_recurse", "call"),        # call rel32: emulated
    ("kprobe_recurse", "jcc"),         # conditional jump: emulated
    ("kprobe_recurse", "ret"),         # ret: emulated
    ("alloc_pid", "rip"),              # RIP-relative operand: copied and fixed up
])
def test_instruction_kinds_run_correctly_under_a_probe(kernel, func, what):
    preds = {
        "call": lambda i: i.mnemonic == "call",
        "jcc": lambda i: i.mnemonic.startswith("j") and i.mnemonic != "jmp",
        "ret": lambda i: i.mnemonic == "ret",
        "rip": lambda i: i.is_rip_relative,
    }
    insn = _find_insn(kernel, func, pred=preds[what])
    c = Counter()
    for post in (None, lambda p, r, f: None):       # boosted/emulated, then single-stepped
        p = Kprobe(addr=insn.address, pre_handler=c.pre, post_handler=post)
        kernel.register_kprobe(p)
        before = c.n
        assert kernel.upcall("kprobe_recurse", 12) == 78
        t = kernel.spawn("kinds")
        assert kernel.syscall(t, "getpid") == t.pid
        assert kernel.syscall(t, "getppid") == 1
        kernel.unregister_kprobe(p)
        assert c.n > before, f"{what} probe at {insn.address:#x} never hit"
    assert kernel.read(insn.address, insn.length) == insn.bytes


def test_probe_on_a_faulting_user_copy_still_gets_efault(kernel):
    """The copied instruction faults in its slot; the fault is replayed at the probed
    address so the exception table applies there."""
    insn = _find_insn(kernel, "__put_user_4", pred=lambda i: i.address in kernel.image.extable)
    c = Counter()
    kernel.register_kprobe(Kprobe(addr=insn.address, pre_handler=c.pre,
                                  post_handler=lambda p, r, f: None))
    t = kernel.spawn("fault")
    st = 0x10   # a bad user pointer for wait4's status
    child = kernel.syscall(t, "fork")
    kernel.submit(kernel.tasks[child], "exit", 0)
    assert kernel.syscall(t, "wait4", child, st, 0, 0) == -errno.EFAULT
    assert c.n == 1
    assert "Oops" not in kernel.dmesg()


def test_fault_handler_runs_when_a_handler_raises(kernel):
    faults = []

    def pre(p, regs):
        raise RuntimeError("buggy handler")

    p = Kprobe(symbol_name="kprobe_target", pre_handler=pre,
               fault_handler=lambda p, regs, trapnr: faults.append(trapnr) or 1)
    kernel.register_kprobe(p)
    assert loop(kernel, 4) == expected_loop(4)
    assert len(faults) == 4 and p.nmissed == 0
    q = Kprobe(symbol_name="kprobe_target_traced", pre_handler=pre)  # no fault_handler
    kernel.register_kprobe(q)
    assert loop(kernel, 3, traced=1) == expected_loop(3)
    assert q.nmissed == 3                        # counted, logged, kernel unharmed


def _logged(caplog, text):
    """The engine's log records whose message contains text."""
    return [r for r in caplog.records
            if r.name == "kprobefs.kprobes" and text in r.getMessage()]


def _traceback(record) -> str:
    return "".join(traceback.format_exception(*record.exc_info))


def test_a_raising_handler_is_logged_with_its_exception_once_per_probe(kernel, caplog):
    """The exception itself (type, message, traceback) is logged, once per probe, and
    then at most once per RATELIMIT_INTERVAL with the count of those not logged."""
    now = [100.0]
    kernel.kprobes.handler_errors = HandlerErrorLog(clock=lambda: now[0])

    def buggy_pre(p, regs):
        raise ValueError(f"bad value {regs.di}")

    p = Kprobe(symbol_name="kprobe_target", pre_handler=buggy_pre)
    q = Kprobe(symbol_name="kprobe_target_traced", pre_handler=buggy_pre)
    kernel.register_kprobe(p)
    kernel.register_kprobe(q)
    with caplog.at_level(logging.WARNING, logger="kprobefs.kprobes"):
        assert loop(kernel, 4) == expected_loop(4)
        assert loop(kernel, 3, traced=1) == expected_loop(3)
        (first,) = _logged(caplog, "probe at kprobe_target+0x0")
        assert first.getMessage() == (
            "handler of probe at kprobe_target+0x0 (trap 3) raised ValueError('bad value 0')")
        assert first.exc_info[0] is ValueError
        assert "in buggy_pre" in _traceback(first)
        assert 'raise ValueError(f"bad value {regs.di}")' in _traceback(first)
        (other,) = _logged(caplog, "probe at kprobe_target_traced+0x0")
        assert other.getMessage().endswith("raised ValueError('bad value 0')")
        now[0] += RATELIMIT_INTERVAL - 0.5
        loop(kernel, 2)
        assert len(_logged(caplog, "probe at kprobe_target+0x0")) == 1
        now[0] += 0.5
        loop(kernel, 1)
        _, later = _logged(caplog, "probe at kprobe_target+0x0")
    assert later.getMessage() == ("handler of probe at kprobe_target+0x0 (trap 3) raised "
                                  "ValueError('bad value 0') (5 more not logged)")
    assert "in buggy_pre" in _traceback(later)
    assert (p.nmissed, q.nmissed) == (7, 3)


def test_fprobe_handler_errors_are_missed_and_logged(kernel, caplog):
    def entry(fp, ip, regs, data):
        raise KeyError("no entry")

    def exit_handler(fp, ip, regs, data):
        raise LookupError("no exit")

    entries = Fprobe(entry_handler=entry)
    exits = Fprobe(entry_handler=lambda *a: 0, exit_handler=exit_handler)
    kernel.register_fprobe(entries, "kprobe_target_traced")
    kernel.register_fprobe(exits, "kprobe_target_traced")
    with caplog.at_level(logging.WARNING, logger="kprobefs.kprobes"):
        assert loop(kernel, 3, traced=1) == expected_loop(3)
    assert (entries.nmissed, exits.nmissed) == (3, 3)
    (e,) = _logged(caplog, "entry handler of fprobe")
    assert e.getMessage() == ("entry handler of fprobe on kprobe_target_traced raised "
                              "KeyError('no entry')")
    assert "in entry" in _traceback(e)
    (x,) = _logged(caplog, "exit handler of fprobe")
    assert x.getMessage() == ("exit handler of fprobe on kprobe_target_traced raised "
                              "LookupError('no exit')")
    assert "in exit_handler" in _traceback(x)


UNMAPPED, NON_CANONICAL = 0xFFFFC90000000000, 0x8000000000000000


@pytest.mark.parametrize("where", [
    "kprobe_target",              # an int3, boosted
    "kprobe_target_traced",       # an ftrace site
    "kprobe_target_traced+5",     # jump-optimized
])
def test_fault_handler_gets_the_trap_number(kernel, where):
    """A pre-handler runs in the probe's breakpoint (3), a post-handler in the
    single-step trap (1); a page fault (14) or general protection fault (13) the CPU
    takes while a handler runs comes with its own number.  Each reaches the probe whose
    handler failed, also when probes share the address."""
    name, _, offset = where.partition("+")
    traps = {"raises": [], "faults": [], "post": []}

    def recorder(key):
        return lambda p, regs, trapnr: traps[key].append(trapnr) or 1

    def raises(p, regs):
        raise RuntimeError("pre")

    def faults(p, regs):
        # copy_from_kernel_nofault's exception table fixes both faults up.
        assert kernel.call("copy_from_kernel_nofault", bytes(8), UNMAPPED, 8) == -errno.EFAULT
        assert kernel.call("copy_from_kernel_nofault", bytes(8), NON_CANONICAL, 8) \
            == -errno.EFAULT
        return 0

    probes = [Kprobe(symbol_name=name, offset=int(offset or "0"), pre_handler=raises,
                     fault_handler=recorder("raises"))]
    if not offset:
        probes.append(Kprobe(symbol_name=name, pre_handler=faults,
                             fault_handler=recorder("faults")))
    for p in probes:
        kernel.register_kprobe(p)
    kernel.wait_for_kprobe_optimizer()
    if offset:
        assert kernel.kprobes.get_kprobe(probes[0].addr).is_optimized()
    loop(kernel, 2, traced=name != "kprobe_target")
    assert traps["raises"] == [3, 3]
    assert traps["faults"] == ([14, 13] * 2 if not offset else [])
    if name == "kprobe_target":
        # Alone at the address (the fast path), then beside a post-handler.
        kernel.unregister_kprobe(probes[0])
        loop(kernel, 1)
        assert traps["faults"][-2:] == [14, 13]
        post = Kprobe(symbol_name=name, post_handler=lambda p, regs, flags: 1 / 0,
                      fault_handler=recorder("post"))
        kernel.register_kprobe(post)
        loop(kernel, 2)
        assert traps["post"] == [1, 1] and traps["faults"][-4:] == [14, 13] * 2
    assert all(p.nmissed == 0 for p in probes)


def test_disabled_flag_and_enable_disable(kernel):
    c = Counter()
    p = Kprobe(symbol_name="kprobe_target", pre_handler=c.pre, flags=KPROBE_FLAG_DISABLED)
    kernel.register_kprobe(p)
    assert text(kernel, p.addr, 1) == kernel.image.read(p.addr, 1)
    loop(kernel, 5)
    assert c.n == 0
    assert "[DISABLED]" in kernel.kprobes.list_text()
    kernel.enable_kprobe(p)
    loop(kernel, 5)
    assert c.n == 5
    kernel.disable_kprobe(p)
    assert text(kernel, p.addr, 5) == kernel.image.read(p.addr, 5)
    loop(kernel, 5)
    assert c.n == 5


# ---- aggregates and misses ---------------------------------------------------------------------
def test_several_probes_on_one_address(kernel):
    a, b = Counter(), Counter()
    pa = Kprobe(symbol_name="kprobe_target", pre_handler=a.pre)
    pb = Kprobe(symbol_name="kprobe_target", pre_handler=b.pre,
                post_handler=lambda p, r, f: None)
    kernel.register_kprobe(pa)
    kernel.register_kprobe(pb)
    loop(kernel, 7)
    assert a.n == b.n == 7
    lines = kernel.kprobes.list_text().splitlines()
    assert len([line for line in lines if "kprobe_target+0x0" in line]) == 2
    kernel.disable_kprobe(pa)
    loop(kernel, 3)
    assert (a.n, b.n) == (7, 10)
    kernel.unregister_kprobe(pb)
    kernel.enable_kprobe(pa)
    loop(kernel, 2)
    assert a.n == 9


def test_probe_hit_inside_a_handler_is_missed(kernel):
    inner = Counter()
    pin = Kprobe(symbol_name="kprobe_recurse", pre_handler=inner.pre)
    kernel.register_kprobe(pin)

    def outer_pre(p, regs):
        # A handler that runs kernel code which hits another probe on this CPU.
        kernel.call("kprobe_recurse", 2)
        return 0

    pout = Kprobe(symbol_name="kprobe_target", pre_handler=outer_pre)
    kernel.register_kprobe(pout)
    loop(kernel, 4)
    assert inner.n == 0
    assert pin.nmissed == 4 * 3                  # kprobe_recurse(2) enters 3 times per call
    assert kernel.upcall("kprobe_recurse", 2) == 3
    assert inner.n == 3


# ---- jprobes -------------------------------------------------------------------------------------
def test_jprobe_gets_arguments_and_the_function_sees_them_unchanged(kernel):
    calls = []

    def entry(a, b, *rest):
        calls.append((a, b))
        # A sloppy handler scribbling on the stack and registers: all restored.
        sp = kernel.regs.sp
        kernel.write(sp, b"\xee" * MAX_STACK_SIZE)
        kernel.regs.di = 0xBAD

    jp = Jprobe(symbol_name="kprobe_target", entry=entry)
    kernel.register_jprobe(jp)
    assert loop(kernel, 4) == expected_loop(4)
    assert [a for a, _ in calls] == [0, 1, 2, 3]
    assert "  j  kprobe_target+0x0" in kernel.kprobes.list_text()
    with pytest.raises(ProbeError) as e:
        kernel.register_jprobe(Jprobe(symbol_name="kprobe_target", entry=entry))
    assert e.value.errno == errno.EEXIST
    with pytest.raises(ProbeError) as e:
        kernel.register_jprobe(Jprobe(addr=sym(kernel, "vfs_read").addr + 5, entry=entry))
    assert e.value.errno == errno.EINVAL                 # not a function entry


# ---- kretprobes -------------------------------------------------------------------------------------
def test_kretprobe_sees_return_value_and_return_address(kernel):
    rets = []
    rp = Kretprobe(symbol_name="kprobe_target",
                   handler=lambda ri, regs: rets.append((regs.ax & 0xFFFFFFFF, ri.ret_addr,
                                                         regs.ip, ri.task)))
    kernel.register_kretprobe(rp)
    assert rp.maxactive == max(10, 2 * kernel.nr_cpus)
    assert loop(kernel, 3) == expected_loop(3)
    loop_fn = sym(kernel, "kprobe_bench_loop")
    assert [r[0] for r in rets] == [7, 23, 71]         # (i + s) * 2 + 7
    for _, ret_addr, ip, task in rets:
        assert ret_addr == ip and loop_fn.addr < ret_addr < loop_fn.end
        assert task == 0                  # upcalls run on an idle CPU: the swapper
    assert "  r  kprobe_target+0x0" in kernel.kprobes.list_text()
    with pytest.raises(ProbeError) as e:
        kernel.register_kretprobe(Kretprobe(symbol_name="vfs_read", offset=5))
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ProbeError) as e:
        kernel.register_kretprobe(Kretprobe(symbol_name="kprobe_target", data_size=8192))
    assert e.value.errno == errno.E2BIG


def test_kretprobe_maxactive_and_recursion(kernel):
    depths = []
    rp = Kretprobe(symbol_name="kprobe_recurse", maxactive=3,
                   handler=lambda ri, regs: depths.append(regs.ax))
    kernel.register_kretprobe(rp)
    # kprobe_recurse(5) is 6 nested calls: the 3 outermost (d = 5, 4, 3) get instances
    # and return, innermost first, 6, 10 and 15.
    assert kernel.upcall("kprobe_recurse", 5) == 15
    assert rp.nmissed == 3
    assert depths == [6, 10, 15]
    assert len(rp.free_instances) == 3


def test_a_return_probe_without_entry_handler_enters_in_the_kernel(kernel):
    """No entry handler: the entry is the kernel's kretprobe_native_entry (no host code
    on it), the return the kernel's trampoline, then the host's handler.  What the
    handler sees is what the host's own entry path gives (an entry handler keeps the
    entry on the host)."""
    eng = kernel.kprobes

    def run(**kw):
        seen = []
        rp = Kretprobe(symbol_name="kprobe_target", handler=lambda ri, regs: seen.append(
            (regs.ax & 0xFFFFFFFF, ri.ret_addr, regs.ip, regs.sp - ri.fp, ri.task)), **kw)
        kernel.register_kretprobe(rp)
        native = eng.get_kprobe(rp.kp.addr).native
        assert loop(kernel, 3) == expected_loop(3)
        assert not eng._instances
        kernel.unregister_kretprobe(rp)
        return seen, native

    in_kernel, native = run()
    assert native[0] == sym(kernel, "kretprobe_native_entry").addr
    on_host, none = run(entry_handler=lambda ri, regs: 0)
    assert none is None
    assert in_kernel == on_host and [s[0] for s in in_kernel] == [7, 23, 71]
    for _ax, ret_addr, ip, above, _task in in_kernel:
        assert ret_addr == ip and above == 8      # regs.sp is the caller's, over the slot


def test_a_native_return_inside_a_handler_leaves_the_handlers_regs_alone(kernel):
    """The return handler calls the probed function: that call's entry runs in the
    kernel (which cannot see that a handler runs) and its return comes through the same
    code hook, while the handler runs.  It counts the miss Linux counts for an entry
    inside a handler, nothing runs for it, and the outer handler's regs (the arch
    reuses them) still say what they said."""
    seen = []

    def handler(ri, regs):
        before = (regs.ip, ri.ret_addr, regs.ax & 0xFFFFFFFF)
        kernel.call("kprobe_target", 20, 22)
        seen.append((before, (regs.ip, ri.ret_addr, regs.ax & 0xFFFFFFFF)))

    rp = Kretprobe(symbol_name="kprobe_target", handler=handler)
    kernel.register_kretprobe(rp)
    kernel.wait_for_kprobe_optimizer()
    assert kernel.kprobes.get_kprobe(rp.kp.addr).native is not None
    assert loop(kernel, 3) == expected_loop(3)
    assert len(seen) == 3                       # the nested returns ran no handler
    assert rp.kp.nmissed == 3 and rp.nmissed == 0
    for before, after in seen:
        assert before[0] == before[1] and before[:2] == after[:2]
    assert len(rp.free_instances) == rp.maxactive


def test_both_entry_paths_take_instances_from_one_count(kernel):
    """maxactive bounds the kernel's entry and the host's together: with a kprobe at the
    same address the host runs the kretprobe's entry (an aggregate), without it the
    kernel does, and the instances each took are free again for the other."""
    depths = []
    rp = Kretprobe(symbol_name="kprobe_recurse", maxactive=3,
                   handler=lambda ri, regs: depths.append(regs.ax))
    kernel.register_kretprobe(rp)
    other = Kprobe(symbol_name="kprobe_recurse", pre_handler=lambda p, regs: 0)
    kernel.register_kprobe(other)
    assert kernel.kprobes.get_kprobe(rp.kp.addr).native is None     # the host's path
    assert kernel.upcall("kprobe_recurse", 5) == 15
    kernel.unregister_kprobe(other)
    assert kernel.kprobes.get_kprobe(rp.kp.addr).native is not None  # the kernel's
    assert kernel.upcall("kprobe_recurse", 5) == 15
    assert depths == [6, 10, 15, 6, 10, 15]
    assert rp.nmissed == 6


def test_kretprobe_entry_handler_and_instance_data(kernel):
    seen = []

    def entry(ri, regs):
        ri.data[:8] = struct.pack("<q", regs.di)
        return 1 if regs.di == 2 else 0          # skip the instance for i == 2

    def ret(ri, regs):
        seen.append((struct.unpack("<q", bytes(ri.data[:8]))[0], regs.ax & 0xFFFFFFFF))

    rp = Kretprobe(symbol_name="kprobe_target", entry_handler=entry, handler=ret,
                   data_size=16)
    kernel.register_kretprobe(rp)
    loop(kernel, 4)
    assert [i for i, _ in seen] == [0, 1, 3]
    assert rp.nmissed == 0


def test_two_kretprobes_on_one_function_share_its_return_slot(kernel):
    """The second replaces the return address the first already replaced: the function
    returns into the trampoline twice, the second probe's instance first."""
    seen = []
    rps = [Kretprobe(symbol_name="kprobe_target", maxactive=2,
                     handler=lambda ri, regs, n=n: seen.append((n, regs.ax & 0xFFFFFFFF)))
           for n in (1, 2)]
    for rp in rps:
        kernel.register_kretprobe(rp)
    assert loop(kernel, 3) == expected_loop(3)
    assert seen == [(2, 7), (1, 7), (2, 23), (1, 23), (2, 71), (1, 71)]
    assert [len(rp.free_instances) for rp in rps] == [2, 2]
    assert [rp.nmissed for rp in rps] == [0, 0]


def test_kretprobe_instances_flushed_when_a_task_exits(kernel):
    rp = Kretprobe(symbol_name="do_exit", handler=lambda ri, regs: None, maxactive=2)
    kernel.register_kretprobe(rp)
    sh = kernel.spawn("sh")
    for _ in range(4):                    # do_exit never returns: more exits than instances
        kid = kernel.syscall(sh, "fork")
        kernel.submit(kernel.tasks[kid], "exit", 0)
        assert kernel.syscall(sh, "wait4", kid, 0, 0, 0) == kid
    assert rp.nmissed == 0
    assert len(rp.free_instances) == 2


def test_a_return_with_nothing_pending_is_told_apart(kernel):
    """The host's return trampoline's slot word is checked against the pending returns:
    an unknown slot is None (the arch then takes %rsp), a known one gives its address.
    (An entry handler keeps the entry on the host, and the return on its trampoline.)"""
    eng = kernel.kprobes
    regs = type("Regs", (), {"ip": 0})()
    assert eng.kretprobe_trampoline_handler(regs, 0xFFFF888000123458) is None
    seen = []
    rp = Kretprobe(symbol_name="kprobe_target", handler=lambda ri, r: seen.append(ri.fp),
                   entry_handler=lambda ri, r: 0)
    kernel.register_kretprobe(rp)
    assert loop(kernel, 3) == expected_loop(3)
    assert len(seen) == 3 and not eng._instances
    word = sym(kernel, "kretprobe_tramp_sp").addr
    assert kernel.image.read(word, 8) == bytes(8)
    assert struct.unpack("<Q", kernel.read(word, 8))[0] == seen[-1] + 8   # %rsp after ret


# ---- jump optimization -----------------------------------------------------------------------------
def test_optimized_probe_sees_the_live_stack_pointer(kernel):
    """A detour hands its handler the %rsp it stored in optprobe_sp, not a register
    read: it must be the live one, here and after a handler's kernel call."""
    sps = []

    def pre(p, r):
        sps.append((r.sp, kernel.regs.sp))
        kernel.call("kprobe_target", 1, 2)      # its own detour hit is a miss
        sps.append((r.sp, kernel.regs.sp))
        return 0

    p = Kprobe(symbol_name="kprobe_target", pre_handler=pre)
    kernel.register_kprobe(p)
    kernel.wait_for_kprobe_optimizer()
    assert kernel.kprobes.get_kprobe(p.addr).is_optimized()
    loop(kernel, 3)
    assert len(sps) == 6 and all(saved == live for saved, live in sps)
    assert p.nmissed == 3


def test_optimized_probe_jumps_to_a_detour(kernel):
    c = Counter()
    p = Kprobe(symbol_name="kprobe_target", pre_handler=c.pre)
    kernel.register_kprobe(p)
    assert "[OPTIMIZED]" in kernel.kprobes.list_text()        # tagged at once …
    assert text(kernel, p.addr, 1)[0] == INT3                  # … patched later
    loop(kernel, 3)                 # hits before the optimizer ran take the detour copy
    assert c.n == 3
    kernel.wait_for_kprobe_optimizer()
    assert text(kernel, p.addr, 1)[0] == 0xE9
    assert loop(kernel, 10) == expected_loop(10)
    assert c.n == 13
    assert all(ip == p.addr + 1 for ip, _, _ in c.regs)


@pytest.mark.parametrize("func,why", [
    ("vsnprintf", "indirect jump (jump table)"),
    ("copy_user_generic", "instruction with an exception-table entry"),
])
def test_unsafe_code_is_not_optimized(kernel, func, why):
    s = sym(kernel, func)
    code = kernel.kprobes.arch.original_bytes(s.addr, s.size)
    insns = list(iter_insns(code, s.addr))
    addr = insns[1].address if len(insns) > 2 else insns[0].address
    p = Kprobe(addr=addr, pre_handler=lambda p, r: 0)
    kernel.register_kprobe(p)
    kernel.wait_for_kprobe_optimizer()
    assert "[OPTIMIZED]" not in kernel.kprobes.list_text(), why
    assert text(kernel, addr, 1)[0] == INT3


def test_call_in_region_and_short_tail_are_not_optimized(kernel):
    insn = _find_insn(kernel, "kprobe_recurse", pred=lambda i: i.mnemonic == "call")
    kernel.register_kprobe(Kprobe(addr=insn.address, pre_handler=lambda p, r: 0))
    s = sym(kernel, "kprobe_target")
    last = list(iter_insns(kernel.kprobes.arch.original_bytes(s.addr, s.size), s.addr))
    ret = next(i for i in last if i.mnemonic == "ret")
    kernel.register_kprobe(Kprobe(addr=ret.address, pre_handler=lambda p, r: 0))
    kernel.wait_for_kprobe_optimizer()
    assert "[OPTIMIZED]" not in kernel.kprobes.list_text()


def test_jump_into_the_region_forbids_optimization(kernel):
    """A relative jump landing in (addr, addr + 5] would land inside the jmp: refused."""
    arch = kernel.kprobes.arch
    for s in kernel.image.symbols:
        if not s.is_text or not s.size or kernel.kprobes.within_kprobe_blacklist(s.addr):
            continue
        insns = list(iter_insns(arch.original_bytes(s.addr, s.size), s.addr))
        if any(i.is_indirect_jump for i in insns) or any(
                i.address in kernel.image.extable for i in insns):
            continue
        targets = {i.branch_target for i in insns
                   if i.mnemonic.startswith("j") and i.branch_target is not None}
        for n, i in enumerate(insns):
            region, size = [], 0
            for r in insns[n:]:
                region.append(r)
                size += r.length
                if size >= 5:
                    break
            # Everything else about the region is optimizable: only the jump forbids it.
            if size < 5 or not all(can_boost(r, False) for r in region) or any(
                    s_ in range(i.address - 4, i.address + size)
                    for s_ in kernel.image.ftrace_sites):
                continue
            if any(i.address < t <= i.address + 5 for t in targets):
                p = Kprobe(addr=i.address, pre_handler=lambda p, r: 0)
                kernel.register_kprobe(p)
                kernel.wait_for_kprobe_optimizer()
                assert "[OPTIMIZED]" not in kernel.kprobes.list_text(), s.name
                assert kernel.read(i.address, 1)[0] == INT3
                return
    pytest.fail("no function with a jump into a 5-byte region")


def test_unoptimization_cases(kernel):
    orig = kernel.image.read(sym(kernel, "kprobe_target").addr, 5)

    def optimized(p):
        kernel.wait_for_kprobe_optimizer()
        return text(kernel, p.addr, 1)[0] == 0xE9

    p = Kprobe(symbol_name="kprobe_target", pre_handler=lambda p, r: 0)
    kernel.register_kprobe(p)
    assert optimized(p)
    kernel.disable_kprobe(p)                         # disabled: original bytes
    assert text(kernel, p.addr) == orig
    kernel.enable_kprobe(p)
    assert optimized(p)
    # Blocked by another probe inside the jump's 5 bytes.
    inside = Kprobe(addr=p.addr + 1, pre_handler=lambda p, r: 0)
    kernel.register_kprobe(inside)
    assert text(kernel, p.addr, 1)[0] == INT3 and not optimized(p)
    kernel.unregister_kprobe(inside)
    kernel.kprobes._try_to_optimize(kernel.kprobes.get_kprobe(p.addr))
    assert optimized(p)
    # A post_handler on the same address.
    post = Kprobe(symbol_name="kprobe_target", pre_handler=lambda p, r: 0,
                  post_handler=lambda p, r, f: None)
    kernel.register_kprobe(post)
    assert text(kernel, p.addr, 1)[0] == INT3 and "[OPTIMIZED]" not in \
        kernel.kprobes.list_text()
    kernel.unregister_kprobe(post)
    assert optimized(p)
    # The sysctl: off keeps the int3 (original bytes behind it), on optimizes again.
    kernel.kprobes_optimization = False
    assert text(kernel, p.addr) == bytes([INT3]) + orig[1:]
    assert "[OPTIMIZED]" not in kernel.kprobes.list_text()
    kernel.kprobes_optimization = True
    assert optimized(p)
    kernel.unregister_kprobe(p)                      # unregistered: original bytes
    assert text(kernel, p.addr) == orig


# ---- ftrace-site probes -------------------------------------------------------------------------------
def test_probe_on_an_ftrace_site(kernel):
    c = Counter()
    p = Kprobe(symbol_name="vfs_read", pre_handler=c.pre,
               post_handler=lambda p, regs, f: c.regs.append(("post", regs.ip)))
    kernel.register_kprobe(p)
    assert "vfs_read+0x0    [FTRACE]" in kernel.kprobes.list_text()
    assert text(kernel, p.addr, 1)[0] == 0xE8          # the site calls its trampoline
    t = kernel.spawn("cat")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/f", O_CREAT | O_RDWR, 0o644)
    kernel.syscall(t, "write", fd, b"hello", 5)
    kernel.syscall(t, "lseek", fd, 0, 0)
    from kprobefs.machine import UserBuffer
    buf = UserBuffer(5)
    assert kernel.syscall(t, "read", fd, buf, 5) == 5 and buf.data == b"hello"
    assert c.n == 1
    assert c.regs[0][0] == p.addr + 1 and c.regs[1] == ("post", p.addr + 5)
    with pytest.raises(ProbeError) as e:
        kernel.register_kprobe(Kprobe(symbol_name="vfs_read", offset=3))
    assert e.value.errno == errno.EILSEQ
    kernel.unregister_kprobe(p)
    assert text(kernel, p.addr) == bytes.fromhex("0f1f440000")


# ---- fprobes --------------------------------------------------------------------------------------
def test_fprobe_entry_and_exit_by_glob(kernel):
    seen = []

    def entry(fp, ip, regs, data):
        data[:8] = struct.pack("<Q", regs.di)
        seen.append(("entry", ip))
        return 0

    def exit_(fp, ip, regs, data):
        seen.append(("exit", ip, struct.unpack("<Q", bytes(data[:8]))[0], regs.ax & 0xFFFFFFFF))

    fp = Fprobe(entry_handler=entry, exit_handler=exit_, entry_data_size=8)
    kernel.register_fprobe(fp, "kprobe_target*", "kprobe_target_nothing")
    target = sym(kernel, "kprobe_target_traced")
    assert loop(kernel, 2, traced=1) == expected_loop(2)
    assert seen == [("entry", target.addr), ("exit", target.addr, 0, 7),
                    ("entry", target.addr), ("exit", target.addr, 1, 23)]
    kernel.unregister_fprobe(fp)
    loop(kernel, 2, traced=1)
    assert len(seen) == 4
    with pytest.raises(ProbeError):
        kernel.unregister_fprobe(fp)
    with pytest.raises(ProbeError) as e:
        kernel.register_fprobe(Fprobe(entry_handler=entry), None)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(ProbeError) as e:
        kernel.register_fprobe_syms(Fprobe(entry_handler=entry), ["kprobe_target"])  # notrace
    assert e.value.errno == errno.ENOENT


def test_fprobe_entry_return_cancels_exit_and_soft_disable(kernel):
    exits = []
    fp = Fprobe(entry_handler=lambda fp, ip, regs, d: regs.di % 2,      # odd i: cancel
                exit_handler=lambda fp, ip, regs, d: exits.append(regs.ip))
    kernel.register_fprobe_syms(fp, ["kprobe_target_traced"])
    loop(kernel, 4, traced=1)
    assert len(exits) == 2
    kernel.disable_fprobe(fp)
    loop(kernel, 4, traced=1)
    assert len(exits) == 2
    kernel.enable_fprobe(fp)
    loop(kernel, 2, traced=1)
    assert len(exits) == 3


def test_fprobe_nmissed_for_recursion_and_rethook_shortage(kernel):
    calls = []

    def entry(fp, ip, regs, data):
        calls.append(ip)
        if len(calls) == 1:
            kernel.call("kprobe_target_traced", 1, 2)    # recursion into a traced function
        return 0

    fp = Fprobe(entry_handler=entry)
    kernel.register_fprobe_ips(fp, [sym(kernel, "kprobe_target_traced").addr])
    loop(kernel, 1, traced=1)
    assert len(calls) == 1 and fp.nmissed == 1
    # One return hook for a recursive function: inner exits are missed, entries run.
    ent, ex = [], []
    fr = Fprobe(entry_handler=lambda *a: ent.append(1) and 0,
                exit_handler=lambda *a: ex.append(1), nr_maxactive=1)
    kernel.register_fprobe(fr, "kprobe_recurse")
    assert kernel.upcall("kprobe_recurse", 3) == 6
    assert (len(ent), len(ex), fr.nmissed) == (4, 1, 3)


def test_fprobe_kprobe_shared_flag(kernel):
    shared = Fprobe(entry_handler=lambda *a: 0, flags=FPROBE_FL_KPROBE_SHARED)
    kernel.register_fprobe(shared, "kprobe_target_traced")

    def pre(p, regs):
        kernel.call("kprobe_target_traced", 3, 4)   # fprobe hit while a kprobe runs
        return 0

    kernel.register_kprobe(Kprobe(symbol_name="kprobe_target", pre_handler=pre))
    loop(kernel, 2)
    assert shared.nmissed == 2


def test_fprobe_exit_never_runs_after_unregister(kernel):
    exits = []
    fp = Fprobe(entry_handler=lambda *a: 0, exit_handler=lambda *a: exits.append(1))
    kernel.register_fprobe(fp, "kprobe_recurse")
    # Unregister from inside the recursion, with exits pending on the stack.
    bottom = _find_insn(kernel, "kprobe_recurse", pred=lambda i: i.mnemonic == "xor")

    def pre(p, regs):
        if fp.ops is not None:
            kernel.unregister_fprobe(fp)
        return 0

    kernel.register_kprobe(Kprobe(addr=bottom.address, pre_handler=pre))
    assert kernel.upcall("kprobe_recurse", 3) == 6
    assert exits == []


# ---- global switches and listings -------------------------------------------------------------------
def test_global_disarm_keeps_each_probes_state(kernel):
    c, d = Counter(), Counter()
    p = Kprobe(symbol_name="kprobe_target", pre_handler=c.pre)
    q = Kprobe(symbol_name="kprobe_target_traced", pre_handler=d.pre,
               flags=KPROBE_FLAG_DISABLED)
    kernel.register_kprobe(p)
    kernel.register_kprobe(q)
    kernel.disarm_all_kprobes()
    assert not kernel.kprobes_enabled
    assert text(kernel, p.addr) == kernel.image.read(p.addr, 5)
    loop(kernel, 3)
    assert c.n == 0
    assert p.flags & KPROBE_FLAG_DISABLED == 0 and q.flags & KPROBE_FLAG_DISABLED
    kernel.arm_all_kprobes()
    loop(kernel, 3)
    loop(kernel, 3, traced=1)
    assert c.n == 3 and d.n == 0


def test_list_and_blacklist_formats(kernel):
    kernel.register_kprobe(Kprobe(symbol_name="vfs_read", pre_handler=lambda p, r: 0))
    kernel.register_kprobe(Kprobe(symbol_name="vfs_read", offset=5,
                                  pre_handler=lambda p, r: 0,
                                  post_handler=lambda p, r, f: None))
    kernel.register_kretprobe(Kretprobe(symbol_name="kprobe_target",
                                        handler=lambda ri, r: 0))
    kernel.wait_for_kprobe_optimizer()
    lines = set(kernel.kprobes.list_text().splitlines())
    a = sym(kernel, "vfs_read").addr
    t = sym(kernel, "kprobe_target").addr
    assert lines == {f"{a:016x}  k  vfs_read+0x0    [FTRACE]",
                     f"{a + 5:016x}  k  vfs_read+0x5    ",
                     f"{t:016x}  r  kprobe_target+0x0    [OPTIMIZED]"}
    black = kernel.kprobes.blacklist_text().splitlines()
    epf = sym(kernel, "exc_page_fault")
    assert f"0x{epf.addr:016x}-0x{epf.end:016x}\texc_page_fault" in black


def test_batch_registration_is_all_or_nothing(kernel):
    good = [Kprobe(symbol_name="kprobe_target", pre_handler=lambda p, r: 0),
            Kprobe(symbol_name="vfs_read", pre_handler=lambda p, r: 0)]
    bad = Kprobe(symbol_name="vfs_read", offset=3)                 # EILSEQ
    with pytest.raises(ProbeError) as e:
        kernel.register_kprobes(good + [bad])
    assert e.value.errno == errno.EILSEQ
    assert kernel.kprobes.list_text() == ""
    assert not any(p.registered for p in good)
    kernel.register_kprobes([Kprobe(symbol_name=n, pre_handler=lambda p, r: 0)
                             for n in ("kprobe_target", "vfs_read")])
    assert len(kernel.kprobes.list_text().splitlines()) == 2
    kernel.unregister_kprobes(kernel.kprobes.registered())
    assert kernel.kprobes.list_text() == ""
    rps = [Kretprobe(symbol_name="kprobe_target", handler=lambda ri, r: 0),
           Kretprobe(symbol_name="vfs_read", offset=5)]            # not an entry: EINVAL
    with pytest.raises(ProbeError):
        kernel.register_kretprobes(rps)
    assert kernel.kprobes.list_text() == ""
    jps = [Jprobe(symbol_name="kprobe_target", entry=lambda *a: None),
           Jprobe(symbol_name="kprobe_target", entry=lambda *a: None)]   # second: EEXIST
    with pytest.raises(ProbeError) as e:
        kernel.register_jprobes(jps)
    assert e.value.errno == errno.EEXIST and kernel.kprobes.list_text() == ""


def test_the_hypercall_instruction_is_refused_like_vmcall(kernel):
    """``int $0x81``, the kernel's hypercall, is refused (EOPNOTSUPP) as 6.1 refuses
    VMX instructions: stepped, it would end the CPU's turn, where interrupts arrive,
    inside the probe's single-step."""
    from kprobefs.arch.x86.insn import iter_insns
    s = sym(kernel, "cpu_idle_loop")
    code = kernel.kprobes.arch.original_bytes(s.addr, s.size)
    (addr,) = [i.address for i in iter_insns(code, s.addr)
               if i.bytes == b"\xcd\x81"][:1]
    with pytest.raises(ProbeError) as e:
        kernel.register_kprobe(Kprobe(addr=addr, pre_handler=lambda p, r: 0))
    assert e.value.errno == errno.EOPNOTSUPP
    assert kernel.read(addr, 2) == b"\xcd\x81"
