"""The kernel's mutexes (kernel/locking.c) and where hostfs takes them (fs/hostfs.c),
through a real mount and a shell: a kprobe on mutex_lock sees event_mutex, module_mutex
or kprobe_mutex, by their kallsyms addresses, when a shell writes the files whose 6.1
handlers take them; two writers racing for event_mutex meet in __mutex_lock_slowpath
and both finish, one alone never enters it.  Last, mutex_trylock on a booted kernel
without a mount."""

import re
from pathlib import Path

import pytest

from kprobefs.machine import Kernel
from kprobefs.machine.abi import KERNEL_MUTEXES, mutexes_word
from kprobefs.tracing.nodes import Mutexes
from test_fs_mount import _need_fuse, real, sh  # noqa: F401

_LOCK = re.compile(r"^\s*(\S+)-(\d+)\s.*: (\w+): \(.*\) lock=0x([0-9a-f]+)$")


def _kallsyms(real) -> dict[str, tuple[int, str]]:
    out = {}
    for line in Path(f"{real}/proc/kallsyms").read_text().splitlines():
        addr, kind, name = line.split()[:3]
        out[name] = (int(addr, 16), kind)
    return out


def _locks(t, probe: str, comm: str = "sh") -> list[int]:
    """The lock= values of probe's records made by comm."""
    found = []
    for line in Path(f"{t}/trace").read_text().splitlines():
        m = _LOCK.match(line)
        if m and m.group(3) == probe and m.group(1) == comm:
            found.append(int(m.group(4), 16))
    return found


@pytest.fixture
def probed(real):
    """The mount, with kprobe events on mutex_lock (mtx) and __mutex_lock_slowpath
    (slow) defined; each test enables what it needs.  Removed afterwards."""
    t = f"{real}/tracing"
    r = sh(f"echo 0 > {t}/tracing_on; echo > {t}/trace; "
           f"echo 'p:mtx mutex_lock lock=$arg1:x64' >> {t}/kprobe_events && "
           f"echo 'p:slow __mutex_lock_slowpath lock=$arg1:x64' >> {t}/kprobe_events")
    assert r.returncode == 0, r.stderr
    yield real
    sh(f"echo 0 > {t}/tracing_on; echo 0 > {t}/events/kprobes/enable; "
       f"echo '-:mtx' >> {t}/kprobe_events; echo '-:slow' >> {t}/kprobe_events; "
       f"echo 1 > {t}/tracing_on; echo > {t}/trace")


def test_the_mutexes_are_data_symbols_as_on_linux(real):
    syms = _kallsyms(real)
    for name in ("event_mutex", "trace_types_lock", "module_mutex", "text_mutex",
                 "ftrace_lock"):
        assert syms[name][1] == "D", name
    assert syms["kprobe_mutex"][1] == "d"      # static in 6.1's kprobes.c
    for name in ("mutex_lock", "mutex_unlock", "mutex_trylock", "mutex_is_locked",
                 "mutex_lock_interruptible", "mutex_lock_killable"):
        assert syms[name][1] == "T", name
    for name in ("__mutex_lock_slowpath", "__mutex_lock_interruptible_slowpath",
                 "__mutex_lock_killable_slowpath", "__mutex_unlock_slowpath.constprop.0"):
        assert syms[name][1] == "t", name


@pytest.mark.parametrize("write, mutexes", [
    ("echo 1 > {t}/events/sched/sched_switch/enable; "
     "echo 0 > {t}/events/sched/sched_switch/enable", ("event_mutex",)),
    ("echo 'p:mtx_other vfs_read' >> {t}/kprobe_events; "
     "echo '-:mtx_other' >> {t}/kprobe_events", ("event_mutex", "kprobe_mutex", "text_mutex")),
    ("echo nop > {t}/current_tracer", ("trace_types_lock",)),
    ("echo load trace_printk > {real}/kprobefs/modules; "
     "echo unload trace_printk > {real}/kprobefs/modules", ("module_mutex",)),
    ("echo 1 > {real}/kprobes/enabled", ("kprobe_mutex", "text_mutex")),
    ("echo 1 > {t}/set_ftrace_pid; echo > {t}/set_ftrace_pid", ("ftrace_lock",)),
    ("echo vfs_read > {t}/set_ftrace_filter; echo > {t}/set_ftrace_filter",
     ("ftrace_lock",)),
])
def test_a_write_takes_the_mutexes_6_1_takes(probed, write, mutexes):
    """mutex_lock's first argument is each mutex's kallsyms address while the write is
    served, in 6.1's nesting order; the mutexes are free again afterwards (the next
    writer is not held)."""
    real = probed
    t = f"{real}/tracing"
    r = sh(f"echo 1 > {t}/events/kprobes/mtx/enable && echo 1 > {t}/tracing_on && "
           + write.format(t=t, real=real) + f"; echo 0 > {t}/tracing_on")
    assert r.returncode == 0, r.stderr
    _assert_taken_in_order(real, _locks(t, "mtx"), mutexes)


def _assert_taken_in_order(real, locks: list[int], mutexes: tuple[str, ...]) -> None:
    syms = _kallsyms(real)
    firsts = []
    for name in mutexes:
        assert syms[name][0] in locks, (name, [hex(a) for a in locks])
        firsts.append(locks.index(syms[name][0]))
    assert firsts == sorted(firsts), (mutexes, [hex(a) for a in locks])


@pytest.mark.parametrize("where, arms_with", [("vfs_read", "ftrace_lock"),
                                              ("vfs_read+5", "text_mutex")])
def test_a_kprobe_events_enable_arms_under_the_kprobe_mutexes(probed, where, arms_with):
    """enable_kprobe's kprobe_mutex, inside event_mutex, then ftrace_lock for a kprobe on
    the function's ftrace site or text_mutex for one patched with int3; a tracepoint's
    enable takes neither (the first case of the test above)."""
    real = probed
    t = f"{real}/tracing"
    r = sh(f"echo 'p:mtx_arm {where}' >> {t}/kprobe_events && "
           f"echo 1 > {t}/events/kprobes/mtx/enable && echo 1 > {t}/tracing_on && "
           f"echo 1 > {t}/events/kprobes/mtx_arm/enable; "
           f"echo 0 > {t}/events/kprobes/mtx_arm/enable; echo 0 > {t}/tracing_on")
    assert r.returncode == 0, r.stderr
    locks = _locks(t, "mtx")     # before the removal, which clears the buffers
    assert sh(f"echo '-:mtx_arm' >> {t}/kprobe_events").returncode == 0
    _assert_taken_in_order(real, locks, ("event_mutex", "kprobe_mutex", arms_with))
    other = {"ftrace_lock": "text_mutex", "text_mutex": "ftrace_lock"}[arms_with]
    assert _kallsyms(real)[other][0] not in locks


def test_racing_writers_wait_in_the_slowpath_and_both_finish(probed):
    """Two shells write an event's enable at once, 60 times each: one of them finds
    event_mutex held by the other and sleeps in __mutex_lock_slowpath until it is
    handed the mutex; every write succeeds.  (The shells overlap only while both loop,
    which a loaded host may make short: up to five rounds.)"""
    real = probed
    t = f"{real}/tracing"
    enable = f"{t}/events/sched/sched_wakeup/enable"
    loop = (f"i=0; while [ $i -lt 60 ]; do echo 1 > {enable} && echo 0 > {enable} "
            f"|| exit 1; i=$((i+1)); done")
    event_mutex = _kallsyms(real)["event_mutex"][0]
    assert sh(f"echo 1 > {t}/events/kprobes/slow/enable").returncode == 0
    for _ in range(5):
        r = sh(f"echo 1 > {t}/tracing_on && "
               f"(sh -c '{loop}' & a=$!; sh -c '{loop}' & b=$!; wait $a && wait $b); "
               f"s=$?; echo 0 > {t}/tracing_on; exit $s")
        assert r.returncode == 0, r.stderr
        assert sh(f"cat {enable}").stdout == "0\n"
        if event_mutex in _locks(t, "slow"):
            return
    pytest.fail("no writer waited for event_mutex in five rounds")


def test_one_writer_alone_never_takes_the_slowpath(probed):
    real = probed
    t = f"{real}/tracing"
    enable = f"{t}/events/sched/sched_wakeup/enable"
    r = sh(f"echo 1 > {t}/events/kprobes/slow/enable && echo 1 > {t}/events/kprobes/mtx/"
           f"enable && echo 1 > {t}/tracing_on && i=0; while [ $i -lt 20 ]; do "
           f"echo 1 > {enable}; echo 0 > {enable}; i=$((i+1)); done; "
           f"echo 0 > {t}/tracing_on")
    assert r.returncode == 0, r.stderr
    assert len(_locks(t, "mtx")) >= 40
    assert _locks(t, "slow") == []


def test_the_lookup_word_names_each_operations_mutexes():
    word = mutexes_word(Mutexes(open=("event_mutex",), trunc=("event_mutex",),
                                read=("kprobe_mutex",),
                                write=("event_mutex", "trace_types_lock"),
                                work_unlocked=True))
    bit = {name: 1 << i for i, name in enumerate(KERNEL_MUTEXES)}
    assert word & 0xff == bit["event_mutex"] | bit["trace_types_lock"]
    assert word >> 8 & 0xff == bit["kprobe_mutex"]
    assert word >> 16 & 0xff == bit["event_mutex"]
    assert word >> 24 & 0x7f == bit["event_mutex"]
    assert word >> 31 == 1
    with pytest.raises(ValueError):
        mutexes_word(Mutexes(write=("big_kernel_lock",)))


def test_trylock_fails_on_a_mutex_its_caller_holds():
    """As 6.1's __mutex_trylock: a held mutex is not taken again, by its owner either
    (the idle task of the one CPU runs each upcall here)."""
    kernel = Kernel(cpus=1, seed=0)
    lock = kernel.image.symbol_value("text_mutex")

    def is_locked() -> bool:
        return bool(kernel.upcall("mutex_is_locked", lock) & 0xff)     # a bool in %al

    assert kernel.upcall("mutex_trylock", lock) == 1
    assert kernel.upcall("mutex_trylock", lock) == 0
    assert is_locked()
    kernel.upcall("mutex_unlock", lock)
    assert not is_locked()
    assert kernel.upcall("mutex_trylock", lock) == 1
    kernel.upcall("mutex_unlock", lock)
