"""Transparency: probes on a seeded sample of every instruction boundary of every
probe-able function change nothing the kernel does.  The background workload gives the
same results with and without them, in each execution mode (boosted, single-stepped,
optimized, return probes), and every probe's hit count equals an independent count of
executions of its address.

Each mode runs twice: "hooked", with the code-hook budget raised so that every breakpoint
is delivered by a code hook on its address (the fast path), and "trapped", at the default
budget (``Kernel.FAST_HOOK_BUDGET``), where the sample's breakpoints past the first few
dozen are real #BP traps and their probes are not optimized: the path every user with
more probes than the budget takes."""

import collections
import random

import pytest
from unicorn import UC_HOOK_INTR

from kprobefs import Kernel, Kprobe, Kretprobe
from kprobefs.arch.x86.insn import InsnDecodeError, iter_insns
from kprobefs.errors import ProbeError
from kprobefs.machine import UserBuffer
from kprobefs.machine.abi import AT_FDCWD, O_DIRECTORY
from kprobefs.machine.workload import Workload

OPS = 250
SAMPLE = 400
SEED = 20261121
HOOKS = ("hooked", "trapped")
X86_TRAP_BP = 3


def run_workload(setup=None):
    kernel = Kernel(cpus=1, seed=SEED)
    workload = Workload(kernel, seed=SEED)
    extra = setup(kernel) if setup else None
    workload.run(OPS)
    return kernel, workload.results[:OPS], state(kernel), extra


def state(kernel):
    """Kernel state a probe could corrupt: counters and the /tmp directory."""
    def read_int(name, fmt_size=4):
        addr = kernel.image.symbol_value(name)
        return int.from_bytes(kernel.read(addr, fmt_size), "little", signed=True)

    t = kernel.spawn("inspect")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp", O_DIRECTORY, 0)
    buf = UserBuffer(8192)
    n = kernel.syscall(t, "getdents64", fd, buf, 8192)
    names = sorted(_dirent_names(buf.data[:n]))
    return read_int("nr_threads"), read_int("total_forks", 8), names


def _dirent_names(data):
    out, off = [], 0
    while off + 19 <= len(data):
        reclen = int.from_bytes(data[off + 16:off + 18], "little")
        out.append(data[off + 19:off + reclen].split(b"\0")[0].decode())
        off += reclen
    return out


def _set_hook_budget(kernel, hooks):
    """hooked: a code hook for every breakpoint; trapped: the default budget, which the
    sample is far larger than."""
    if hooks == "hooked":
        kernel.FAST_HOOK_BUDGET = 10 * SAMPLE
    else:
        assert kernel.FAST_HOOK_BUDGET == 64 and SAMPLE > 4 * kernel.FAST_HOOK_BUDGET


def _count_executions(kernel, addrs, hooks) -> collections.Counter:
    """An independent count of executions of each of addrs.  Trapped, one code hook
    over the range they span, so that it takes nothing from the per-address budget the
    probes use; hooked (the budget raised), a hook on each address, which Unicorn
    serves faster than a range next to hundreds of per-address hooks."""
    watched, counts = frozenset(addrs), collections.Counter()

    def count(_kernel, address):
        if address in watched:
            counts[address] += 1

    if hooks == "hooked":
        for addr in watched:
            kernel.hook_code(addr, addr, count)
    elif watched:
        kernel.hook_code(min(watched), max(watched), count)
    return counts


def _count_breakpoint_traps(kernel) -> collections.Counter:
    """How many #BP exceptions the CPU raises (an observer beside the machine's own
    interrupt hook): what a breakpoint past the budget costs."""
    traps = collections.Counter()

    def on_interrupt(_uc, intno, _user_data):
        if intno == X86_TRAP_BP:
            traps["bp"] += 1

    kernel.uc.hook_add(UC_HOOK_INTR, on_interrupt)
    return traps


@pytest.fixture(scope="module")
def baseline():
    _, results, st, _ = run_workload()
    return results, st


@pytest.fixture(scope="module")
def boundaries():
    kernel = Kernel(cpus=1)
    out = []
    for sym in kernel.image.symbols:
        if not sym.is_text or not sym.size or kernel.kprobes.within_kprobe_blacklist(sym.addr):
            continue
        code = kernel.kprobes.arch.original_bytes(sym.addr, sym.size)
        try:
            out += [(i.address, sym.addr == i.address) for i in iter_insns(code, sym.addr)]
        except InsnDecodeError:
            continue        # padding after the last instruction
    return out


def _probe_all(kernel, addrs, mode, hooks):
    hits, registered = collections.Counter(), []
    _set_hook_budget(kernel, hooks)
    kernel.kprobes.set_optimization(mode == "optimized")
    kernel.kprobes.arch.boost = mode != "single-step"

    def count(p, regs):
        hits[p.addr] += 1
        return 0

    def count_ret(ri, regs):
        hits[ri.func] += 1
        return 0

    for addr in addrs:
        try:
            if mode == "return":
                p = Kretprobe(addr=addr, handler=count_ret, maxactive=64)
                kernel.register_kretprobe(p)
            else:
                p = Kprobe(addr=addr, pre_handler=count)
                kernel.register_kprobe(p)
        except ProbeError:
            continue                    # refused like Linux (e.g. indirect jumps)
        registered.append(addr)
    indep = _count_executions(kernel, registered, hooks)
    kernel.wait_for_kprobe_optimizer()
    return hits, indep, registered, _count_breakpoint_traps(kernel)


def _check_delivery(kernel, hooks, traps, indep, fair_share: bool = True) -> None:
    """hooked: not one breakpoint trapped.  trapped: every execution of a probed
    address whose breakpoint is past the budget raised a #BP, and (``fair_share``) so
    did a fair share of all the hits (not for return probes without an entry handler:
    their ftrace trampolines call the kernel's kretprobe entry and take no trap)."""
    if hooks == "hooked":
        assert traps["bp"] == 0
        return
    past_budget = sum(indep[a] for a in kernel._trap_breakpoints if a in indep)
    assert traps["bp"] >= past_budget
    if fair_share:
        assert traps["bp"] > sum(indep.values()) // 4, "breakpoints past the budget trap"


@pytest.mark.parametrize("hooks", HOOKS)
@pytest.mark.parametrize("mode", ["boosted", "single-step", "optimized", "return"])
def test_probes_change_nothing(baseline, boundaries, mode, hooks):
    rng = random.Random(f"{SEED}-{mode}")
    if mode == "return":
        pool = [a for a, entry in boundaries if entry]
    else:
        pool = [a for a, _ in boundaries]
    sample = rng.sample(pool, min(SAMPLE, len(pool)))
    kernel, results, st, (hits, indep, registered, traps) = run_workload(
        lambda k: _probe_all(k, sample, mode, hooks))
    assert kernel.panicked is None
    assert len(registered) > 0.9 * len(sample)
    optimized = sum(e.optimized for e in kernel.kprobes.list_entries())
    if mode != "optimized":
        assert optimized == 0
    elif hooks == "hooked":
        assert optimized > len(registered) // 4
    else:
        # Each optimized probe's detour holds a code hook: past the budget, none more.
        assert 0 < optimized <= kernel.FAST_HOOK_BUDGET
    assert results == baseline[0]
    assert st == baseline[1]
    hit = [a for a in registered if indep[a]]
    assert len(hit) > len(registered) // 4, "the workload should reach a fair share"
    _check_delivery(kernel, hooks, traps, indep, fair_share=mode != "return")
    if mode == "return":
        # A return probe counts returns: a function that exits (do_exit) never does.
        assert all(hits[a] <= indep[a] for a in registered)
        assert sum(hits[a] == indep[a] for a in hit) > 0.9 * len(hit)
    else:
        assert {a: hits[a] for a in registered} == {a: indep[a] for a in registered}


def _recorded_in_kernel_only(kernel, tp) -> bool:
    """Whether every hit of tp's event is recorded by the kernel alone: its probe is on
    an ftrace site or jump-optimized, or its int3 enters a stub (an instruction that is
    not emulated: the stub jumps to its boosted copy, or to the copy to single-step);
    an emulated instruction needs the host."""
    ap = kernel.kprobes.get_kprobe(tp.address)
    if ap.is_ftrace() or (ap.detour is not None and ap.detour.patched):
        return True
    return not ap.ainsn.emulate


@pytest.mark.parametrize("kind,hooks", [
    ("p", "hooked"), ("p-int3", "hooked"), ("r", "hooked"), ("pr", "hooked"),
    ("p", "trapped"), ("p-int3", "trapped")])
def test_events_recorded_in_the_kernel_change_nothing(baseline, boundaries, kind, hooks):
    """kprobe and return-probe events on the sample, recorded by the kernel's own
    recorder (native detours, ftrace trampolines and, without jump optimization, stubs
    an int3 enters, each saving and restoring every register and the flags; hijacked
    return addresses; fetches that fault and are fixed up): the workload sees no
    difference, and each event's hit count equals the independent count (a return
    probe's may be lower: a function that exits never returns).  "pr" puts an entry and a
    return event on each sampled function: the kernel's aggregate handler runs both.
    Trapped, the int3s past the budget enter their stubs from a #BP (native detours and
    ftrace trampolines take no code hook, so only kprobe events trap)."""
    int3, pair = kind == "p-int3", kind == "pr"
    kind = "r" if pair else kind[0]
    from kprobefs.tracing import Tracer

    rng = random.Random(f"{SEED}-native-{kind}")
    pool = [a for a, entry in boundaries if entry or kind == "p"]
    sample = rng.sample(pool, min(SAMPLE, len(pool)))
    args = "a=%di b=%si:u32 c=+8(%sp):x16 d=$stack2 e=+0(%di):u8 f=+u0(%si):x8 " \
           "g=+0(%di):string h=$comm"
    if kind == "r":
        args = "a=$retval b=ra:x32 c=+0($retval):u8 d=$stack1 g=+0($retval):string h=$comm"

    def define(kernel):
        _set_hook_budget(kernel, hooks)
        kernel.kprobes.set_optimization(not int3)
        tracer = Tracer(kernel.kprobes, kernel)
        root = tracer.tracefs_root()
        defined = []
        names = collections.Counter(sym.name for sym in kernel.image.symbols)
        where = {sym.addr: sym.name for sym in kernel.image.symbols
                 if sym.is_text and names[sym.name] == 1}
        for i, addr in enumerate(sample):
            if kind == "r" and addr not in where:
                continue                # a return probe names its function
            site = where[addr] if kind == "r" else f"{addr:#x}"
            try:
                if pair:
                    tracer.run_commands(f"p:e{i} {site} a=%di b=+0(%si):u8\n".encode())
                tracer.run_commands(f"{kind}:t{i} {site} {args}\n".encode())
            except OSError:
                continue                # refused like Linux (notrace, indirect jumps)
            defined.append(addr)
        indep = _count_executions(kernel, defined, hooks)
        tracer.set_events_enabled(True, group="kprobes", allow_none=True)   # not sched etc.
        kernel.wait_for_kprobe_optimizer()
        return tracer, root, indep, defined, _count_breakpoint_traps(kernel)

    kernel, results, st, (tracer, root, indep, defined, traps) = run_workload(define)
    assert kernel.panicked is None
    assert len(defined) > 0.9 * len(sample)
    assert results == baseline[0]
    assert st == baseline[1]
    if pair:
        entries = [tp for tp in tracer.probes if not tp.spec.is_return]
        assert {tp.address: tracer.hits(tp) for tp in entries} == {
            tp.address: indep[tp.address] for tp in entries}
    hits = {tp.address: tracer.hits(tp) for tp in tracer.probes
            if tp.spec.is_return == (kind == "r")}
    if kind == "p":
        assert hits == {a: indep[a] for a in defined}
    else:
        assert all(hits[a] <= indep[a] for a in defined)
        hit = [a for a in defined if indep[a]]
        assert sum(hits[a] == indep[a] for a in hit) > 0.9 * len(hit)
    hit_events = [tp for tp in tracer.probes if tracer.hits(tp)]
    assert len(hit_events) > len(defined) // 4, "the workload should reach a fair share"
    # Which recorder took each hit follows from how its probe is hit, exactly: the
    # kernel's alone, or (emulated and single-stepped instructions) the host's alone.
    assert {tp.event.name: tp.nhit == 0 for tp in hit_events} == {
        tp.event.name: _recorded_in_kernel_only(kernel, tp) for tp in hit_events}
    assert all(tp.nhit in (0, tracer.hits(tp)) for tp in hit_events)
    # most (the share depends on which instructions the seeded sample lands on)
    assert sum(tp.nhit == 0 for tp in hit_events) > 0.7 * len(hit_events)
    _check_delivery(kernel, hooks, traps, indep)
    in_buffer, written = tracer.buffer.counts()
    assert written == sum(tracer.hits(tp) for tp in tracer.probes)
