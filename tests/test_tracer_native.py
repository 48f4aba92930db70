"""Events recorded by the kernel itself (kernel/trace_native.c, tracing/buffers/native.py).

The main check is differential: the machine is deterministic, so the same system calls
on two fresh kernels hit the same probes with the same registers and memory.  One tracer
records natively (its default clock is the kernel's TSC clock); the other is given
another clock, which keeps every hit on the host's interpreter.  Their ``trace`` output,
timestamps aside, must be identical -- every fetch kind the kernel's recorder runs,
faults, page accounting, overwrite and drop modes included.
"""

import errno
import os
import re
import threading
import time

import pytest

from kprobefs import Kernel, Kprobe
from kprobefs.errors import ImageError
from kprobefs.machine import UserBuffer
from kprobefs.machine.kernel import ProcessExited
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR
from kprobefs.tracing import Tracer
from kprobefs.tracing.buffers.native import NativeRecorder

from test_tracer_e2e import node, read, write

# Every argument kind the kernel's recorder interprets, on jump-optimized sites (+5: just
# past the ftrace NOP, where the arguments are still in their registers).
EVENTS = (
    "p:rd vfs_read+5 file=%di count=%dx:u32 cnt8=%dx:u8 cnts=%dx:s16 buf=%si "
    "pos=%cx:x64 s0=$stack0:symbol s3=$stack3 sp=$stack old=s1 "
    "fop=+16(%di):x64 nested=+8(+16(%di)):symbol first=+0(%di):u8 arr=+0(%di):x8[4] "
    "arrw=+0(%di):u16[3] bits=+0(%di):b3@2/8 ubuf=+u0(%si):x8 ubits=+u0(%si):b4@4/16 "
    "imm=\\123 neg=\\-5:s8 ncpu=@nr_cpu_ids:s32 ent=+0(@init_task):s64 bad=+0(%ax):x32 "
    "ubad=+u0(%ax):u64 badarr=+16(%ax):u8[2] ip=%ip:symbol\n"
    "p:op do_sys_openat2+5 dfd=%di:s32 upath=%si path0=+u0(%si):x8 how=+0(%dx):x64 "
    "mode=+8(%dx):u16 kbad=+0(%si):x8\n"
    "p:clone kernel_clone+5 args=%di flags=+0(%di):x64\n"
    # Function entries: ftrace sites, whose trampolines call the recorder too.
    "p:ent vfs_read file=%di a2=$arg2 a3=$arg3:u32 a4=+0($arg4):s64 a7=$arg7 "
    "s0=$stack0:symbol sp=$stack ip=%ip:symbol\n"
    "p:entopen do_sys_openat2 dfd=$arg1:s32 path0=+u0($arg2):x8 how=+0($arg3):x64\n"
    # Strings: user and kernel memory, faults, the comm, immediates.
    "p:strs getname+5 up=+0(%di):ustring kp=+0(%di):string c=$comm hi=\\\"hello_there\" "
    "ban=@linux_proc_banner:string n=%di:x32 u2=+u0(%di):ustring bad=+0(%ax):string\n"
    # Return probes: the entry hijacks the return address, the trampoline records.  (Not
    # on a caller of the functions above whose args read the stack: a native entry's
    # saved registers leave other garbage in the caller's uninitialized stack slots.)
    "r:rret vfs_write rv=$retval:s64 old=rv ra=ra\n"
    "r4:oret do_filp_open file=$retval f_flags=+32($retval):x32\n"
    "r:gret getname n=+0(+0($retval)):string\n"
)


def make(native: bool, cpus: int = 2):
    kernel = Kernel(cpus=cpus, seed=0)
    tracer = Tracer(kernel.kprobes, kernel,
                    **({} if native else {"clock": kernel.clock_ns}))
    assert (tracer.native is not None) == native
    return kernel, tracer, tracer.tracefs_root()


def workload(kernel, name="native"):
    """Opens, writes, reads and a fork: the same system calls on every kernel."""
    t = kernel.spawn(name)
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/hello", O_CREAT | O_RDWR, 0o644)
    kernel.syscall(t, "write", fd, b"Hi there, native recorder", 25)
    for n in (3, 8, 25):
        kernel.syscall(t, "lseek", fd, 0, 0)
        kernel.syscall(t, "read", fd, UserBuffer(n), n)
    kernel.syscall(t, "openat", AT_FDCWD, 0x10, 0, 0)            # a path that faults
    kernel.syscall(t, "close", fd)
    return t


def body(text):
    """Trace lines without their timestamps (and the header's counters kept)."""
    return [re.sub(r"\s\d+\.\d{6}:", " TS:", line) for line in text.splitlines()]


def traced(native: bool, events=EVENTS, setup=(), cpus=2, optimize=True):
    kernel, tracer, root = make(native, cpus)
    kernel.kprobes.set_optimization(optimize)
    for path, data in setup:
        write(root, path, data)
    write(root, "kprobe_events", events)
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    workload(kernel)
    return kernel, tracer, root


@pytest.mark.parametrize("optimize", [True, False])
def test_kernel_records_equal_host_records(optimize):
    """With jump optimization, the kernel's recorder runs from detours and ftrace
    trampolines; without, unoptimized probes on boostable instructions trap into a stub
    that calls it (their records show the int3 context, "d.Z..", on both paths)."""
    native, host = traced(True, optimize=optimize), traced(False, optimize=optimize)
    for kernel, tracer, _root in (native, host):
        listing = kernel.kprobes.list_text()
        assert listing.count("[OPTIMIZED]") == (4 if optimize else 0)
        assert listing.count("[FTRACE]") == 5
    # The native tracer's probes ran no host code: every hit was recorded in the kernel.
    assert all(tp.nhit == 0 and native[1].hits(tp) > 0 for tp in native[1].probes)
    assert all(tp.native is None and tp.nhit > 0 for tp in host[1].probes)
    assert [native[1].hits(tp) for tp in native[1].probes] == [
        tp.nhit for tp in host[1].probes]
    got, want = body(read(native[2], "trace")), body(read(host[2], "trace"))
    assert len(want) > 12 and got == want
    assert (" d.Z.. " in "\n".join(got)) == (not optimize)
    # The values are real: the user buffer, the faulting pointers, the comm.
    text = "\n".join(got)
    assert "native-" in text and " bad=0x0 ubad=0 badarr={0,0} " in text
    assert re.search(r"rd: \(vfs_read\+0x5/0x[0-9a-f]+\) file=0x[0-9a-f]+ count=25 "
                     r"cnt8=25 cnts=25 ", text), text
    assert re.search(r"s0=ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+ ", text)
    assert re.search(r"nested=\w+\+0x0/0x[0-9a-f]+ ", text)   # f_op -> a function
    assert re.search(r" imm=0x7b neg=-5 ncpu=2 ent=0 ", text)
    assert re.search(r"op: \(do_sys_openat2\+0x5/0x[0-9a-f]+\) dfd=-100 "
                     r"upath=0x[0-9a-f]+ path0=0x2f ", text), text    # '/'
    assert re.search(r"entopen: \(do_sys_openat2\+0x0/0x[0-9a-f]+\) dfd=-100 "
                     r"path0=0x2f ", text), text
    assert re.search(r'strs: \(getname\+0x5/0x[0-9a-f]+\) up="/tmp/hello" kp="/tmp/hello" '
                     r'c="native" hi="hello_there" ban="%s version %s \(kprobefs@emulator\) '
                     r'\(gcc .*?\n" n=0x[0-9a-f]+ u2="/tmp/hello" bad=\(fault\)$', text,
                     re.M | re.S), text
    assert 'up=(fault) kp=(fault) c="native"' in text            # openat(0x10)
    assert re.search(r"rret: \(ksys_write\+0x[0-9a-f]+/0x[0-9a-f]+ <- vfs_write\) "
                     r"rv=25 old=0x19 ra=0x[0-9a-f]+$", text, re.M), text
    assert re.search(r'gret: \(\w+\+0x[0-9a-f]+/0x[0-9a-f]+ <- getname\) n="/tmp/hello"$',
                     text, re.M), text
    assert re.search(r"ent: \(vfs_read\+0x0/0x[0-9a-f]+\) file=0x[0-9a-f]+ a2=0x[0-9a-f]+ "
                     r"a3=25 a4=0 a7=0x[0-9a-f]+ s0=ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+ "
                     r"sp=0x[0-9a-f]+ ip=vfs_read\+0x1/0x[0-9a-f]+$", text, re.M), text
    assert read(native[2], "kprobe_profile") == read(host[2], "kprobe_profile")


@pytest.mark.parametrize("overwrite", ["1", "0"])
def test_page_accounting_matches_the_host(overwrite):
    """A small buffer overflows: the kernel's staged pages are accounted as the host's
    pages are, so the same records survive (or are dropped) and the header counts agree."""
    setup = [("buffer_size_kb", "4"), ("options/overwrite", overwrite)]
    events = "p:many kprobe_target_traced+5 a=%di b=%si:u32 c=%dx\n"
    runs = []
    for native in (True, False):
        kernel, tracer, root = make(native, cpus=1)
        for path, data in setup:
            write(root, path, data)
        write(root, "kprobe_events", events)
        write(root, "events/kprobes/enable", "1")
        kernel.wait_for_kprobe_optimizer()
        kernel.upcall("kprobe_bench_loop", 700, 1)
        text = read(root, "trace")
        runs.append((body(text), tracer.buffer.counts(), tracer.buffer.cpus[0].dropped))
    assert runs[0] == runs[1]
    (lines, (entries, written), dropped) = runs[0]
    assert written == 700 - dropped and entries < 700
    assert (dropped > 0) == (overwrite == "0")
    header = [line for line in lines if "entries-in-buffer" in line]
    assert header == [f"# entries-in-buffer/entries-written: {entries}/{written}   #P:1"]


def _native_handler_of(kernel, tp):
    ap = kernel.kprobes.get_kprobe(tp.address)
    kernel.wait_for_kprobe_optimizer()
    return ap.detour.native if ap.detour is not None and ap.detour.patched else "int3"


def test_host_only_features_switch_the_probe_to_the_host_path():
    """A glob filter, stack traces or a host clock need the host: the probe's detour
    then calls it; removing them gives the probe back to the kernel's recorder."""
    kernel, tracer, root = make(True, cpus=1)
    write(root, "kprobe_events", "p:k kprobe_target_traced+5 a=%di\n")
    write(root, "events/kprobes/k/enable", "1")
    (tp,) = tracer.probes
    native = (tracer.native.handler, tp.native.addr)
    assert _native_handler_of(kernel, tp) == native
    cases = (("events/kprobes/k/filter", 'comm ~ "*[!~]*" && a >= 2', "0", ["0x2", "0x3"],
              "a=0x3"),
             ("options/stacktrace", "1", "0", ["0x0", "0x1", "0x2", "0x3"], "=> "),
             ("trace_clock", "counter", "local", ["0x0", "0x1", "0x2", "0x3"], " 4: k: "))
    for path, on, off, values, sign in cases:
        write(root, path, on)
        assert _native_handler_of(kernel, tp) is None
        write(root, "trace", "", flags=os.O_WRONLY | os.O_TRUNC)
        kernel.upcall("kprobe_bench_loop", 4, 1)
        text = read(root, "trace")
        assert [re.search(r"a=(0x\d+)", line).group(1)
                for line in text.splitlines() if " k: " in line] == values
        assert sign in text
        write(root, path, off)
        assert _native_handler_of(kernel, tp) == native
    hits = tracer.hits(tp)
    kernel.upcall("kprobe_bench_loop", 4, 1)
    assert tp.nhit == 12 and tracer.hits(tp) == hits + 4


FILTERS = (      # (event, filter, records that pass)
    ("rd", "count > 3 && count != 25", 1),
    ("rd", "cnts <= 8 || first == 16", 3),
    ("rd", "!(bits & 4) && common_pid > 1", 0),
    ("rd", "!(bits & 2) && common_pid > 1", 3),
    ("rd", "neg == -5 && cpu == 0 && count < 25", 2),
    ("rd", 'comm == "native" && ncpu >= 2', 3),
    ("rd", 'comm != "native" || count == 3', 1),
    ("strs", 'up == "/tmp/hello"', 1),
    ("strs", 'up != "/tmp/hello" && hi == "hello_there"', 1),
    ("strs", 'kp == "" && c == "native"', 1),   # the openat(0x10): a fault
    ("op", "dfd < 0 && how & 0x2", 1),
    ("ent", "a3 >= 8 && a4 == 0", 2),
    ("strs", 'up ~ "/tmp/*"', 1),
    ("strs", 'up ~ "*hel?o" || kp ~ "x*"', 1),
    ("strs", 'c ~ "*" && hi ~ "hello_*e"', 2),
    ("rd", 'comm ~ "n*t?ve" && count == 3', 1),
    ("rd", 'comm ~ "n*x"', 0),
)
# A glob with a [...] class: the host evaluates it.
HOST_FILTERS = (("strs", 'up ~ "/tm[p]/*"', 1), ("rd", 'comm ~ "[!x]*"', 3))


@pytest.mark.parametrize("event,text,passing,in_kernel",
                         [f + (True,) for f in FILTERS] + [f + (False,) for f in HOST_FILTERS])
def test_filters_run_in_the_kernel_as_in_the_host(event, text, passing, in_kernel):
    """Numeric, string, comm and cpu predicates, globs of `*` and `?`, with && || !, are
    evaluated by the kernel's recorder, with the host's results."""
    runs = []
    for native in (True, False):
        kernel, tracer, root = make(native)
        write(root, "kprobe_events", EVENTS)
        write(root, f"events/kprobes/{event}/filter", text)
        write(root, "events/kprobes/enable", "1")
        kernel.wait_for_kprobe_optimizer()
        workload(kernel)
        tp = next(tp for tp in tracer.probes if tp.event.name == event)
        assert (tp.nhit == 0) == (native and in_kernel)
        runs.append([line for line in body(read(root, "trace")) if f" {event}: " in line])
    assert runs[0] == runs[1]
    assert len(runs[0]) == passing


def test_tracing_off_disable_and_a_second_probe():
    kernel, tracer, root = make(True, cpus=1)
    write(root, "kprobe_events", "p:k kprobe_target_traced+5 a=%di\n")
    write(root, "events/kprobes/k/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    (tp,) = tracer.probes

    def records():
        return sum(" k: " in line for line in read(root, "trace").splitlines())

    write(root, "tracing_on", "0")
    kernel.upcall("kprobe_bench_loop", 5, 1)
    assert records() == 0 and tracer.hits(tp) == 5      # hit, counted, not recorded
    write(root, "tracing_on", "1")
    kernel.upcall("kprobe_bench_loop", 5, 1)
    assert records() == 5
    # Another probe at the same address: both run in the host; then native again.
    other = Kprobe(addr=tp.address, pre_handler=lambda p, regs: 0)
    kernel.register_kprobe(other)
    assert _native_handler_of(kernel, tp) is None
    kernel.upcall("kprobe_bench_loop", 5, 1)
    assert records() == 10 and tp.nhit == 5
    kernel.unregister_kprobe(other)
    assert _native_handler_of(kernel, tp) == (tracer.native.handler, tp.native.addr)
    kernel.upcall("kprobe_bench_loop", 5, 1)
    assert records() == 15 and tracer.hits(tp) == 20
    write(root, "events/kprobes/k/enable", "0")
    kernel.upcall("kprobe_bench_loop", 5, 1)
    assert records() == 15
    write(root, "kprobe_events", "-:k\n")
    assert tracer.probes == [] and read(root, "kprobe_profile") == ""


def test_a_waiting_reader_wakes_on_a_kernel_record():
    kernel, tracer, root = make(True, cpus=1)
    write(root, "kprobe_events", "p:k kprobe_target_traced+5 a=%di\n")
    write(root, "events/kprobes/k/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    pipe = node(root, "trace_pipe").open(os.O_RDONLY, 1, "cat")
    woke = []
    waiter = threading.Thread(target=lambda: woke.append(pipe.wait(20.0)))
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    kernel.upcall("kprobe_bench_loop", 1, 1)
    waiter.join(20.0)
    assert woke == [True] and time.monotonic() - started < 10
    assert b" k: " in pipe.read(4096, 0)
    pipe.release()


def test_comm_of_each_task_is_saved():
    kernel, tracer, root = make(True)
    write(root, "kprobe_events", "p:rd vfs_read+5 count=%dx:u32\n")
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    pids = []
    for name in ("first", "second"):
        t = kernel.spawn(name)
        fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/c", O_CREAT | O_RDWR, 0o644)
        kernel.syscall(t, "read", fd, UserBuffer(4), 4)
        pids.append(t.pid)
    lines = [line.split()[0] for line in read(root, "trace").splitlines() if " rd: " in line]
    assert lines == [f"first-{pids[0]}", f"second-{pids[1]}"]
    assert all(tp.nhit == 0 for tp in tracer.probes)


def test_an_event_larger_than_a_page_is_dropped():
    """As Linux drops an event no ring-buffer page can hold (the kernel's recorder
    and the host's alike)."""
    path = "/tmp/" + "p" * 2500
    for native in (True, False):
        kernel, tracer, root = make(native)
        write(root, "kprobe_events", "p:one getname+5 a=+0(%di):ustring\n"
              "p:two do_sys_openat2+5 a=+0(%si):ustring b=+0(%si):ustring\n")
        write(root, "events/kprobes/enable", "1")
        kernel.wait_for_kprobe_optimizer()
        t = kernel.spawn("long")
        kernel.syscall(t, "openat", AT_FDCWD, path, O_CREAT | O_RDWR, 0o644)
        text = read(root, "trace")
        assert 'one: (getname+0x5/' in text and f'a="{path}"' in text
        assert " two: " not in text
        one, two = tracer.probes
        assert tracer.hits(one) == tracer.hits(two) == 1
        assert (one.native is not None) == (two.native is not None) == native
        assert one.nhit == two.nhit == (0 if native else 1)     # native: no host code


def test_symbol_strings_stay_with_the_host():
    kernel, tracer, root = make(True)
    write(root, "kprobe_events", "p:s vfs_write+5 c=$stack0:symstr\nr:r vfs_read rv=$retval\n"
          "p:n vfs_read+5 n=%dx\n")
    s, r, n = tracer.probes
    assert s.native is None and r.native is not None and n.native is not None
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    workload(kernel)
    text = read(root, "trace")
    assert 's: (vfs_write+0x5/' in text and 'c="ksys_write+' in text and " r: (" in text
    assert s.nhit == 1 and r.nhit == n.nhit == 0 and tracer.hits(r) == tracer.hits(n) == 3


def test_kernel_and_host_records_share_one_clock():
    """Records stamped by the kernel (rdtsc) and by the host (the same TSC) interleave
    in the order they happened: ksys_read's entry (host: its glob has a class) before
    vfs_read+5 (kernel), read after read."""
    kernel, tracer, root = make(True, cpus=1)
    write(root, "kprobe_events", "p:outer ksys_read fd=%di:s32\np:inner vfs_read+5\n")
    write(root, "events/kprobes/outer/filter", 'comm ~ "or[d]*"')   # a class: the host
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    outer, inner = tracer.probes
    t = kernel.spawn("order")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/o", O_CREAT | O_RDWR, 0o644)
    for _ in range(20):
        kernel.syscall(t, "read", fd, UserBuffer(1), 1)
    lines = [line for line in read(root, "trace").splitlines() if " order-" in line]
    assert [line.split()[4] for line in lines] == ["outer:", "inner:"] * 20
    stamps = [float(line.split()[3].rstrip(":")) for line in lines]
    assert stamps == sorted(stamps)
    assert outer.nhit == 20 and inner.nhit == 0 and tracer.hits(inner) == 20


def test_a_second_tracer_on_one_kernel_records_in_the_host():
    kernel, first, _ = make(True, cpus=1)
    second = Tracer(kernel.kprobes, kernel)
    assert first.native is not None and second.native is None
    root = second.tracefs_root()
    write(root, "kprobe_events", "p:k kprobe_target_traced+5 a=%di\n")
    write(root, "events/kprobes/k/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", 3, 1)
    assert [line.split()[-1] for line in read(root, "trace").splitlines()
            if " k: " in line] == ["a=0x0", "a=0x1", "a=0x2"]


SHARED = (
    "p:e1 vfs_read a=%di\n"
    "p:e2 vfs_read b=%si:u32 c=$comm\n"
    "r:e3 vfs_read rv=$retval:s64\n"                 # entry and return at one address
    "p:e4 vfs_read+5 x=%dx\n"
    "p:e5 vfs_read+5 y=+0(%di):u8 z=+u0(%si):x8\n"
    "p:e6 getname+5 s=+0(%di):ustring\n"
    "r:e7 getname n=+0(+0($retval)):string\n"
)


@pytest.mark.parametrize("optimize", [True, False])
def test_several_events_at_one_address_are_recorded_in_the_kernel(optimize):
    """Probes sharing an address call the kernel's aggregate handler, which runs each
    recorder in registration order: the same trace as the host's."""
    native, host = (traced(n, events=SHARED, optimize=optimize) for n in (True, False))
    assert all(tp.nhit == 0 and native[1].hits(tp) > 0 for tp in native[1].probes)
    assert [native[1].hits(tp) for tp in native[1].probes] == [
        tp.nhit for tp in host[1].probes]
    got, want = body(read(native[2], "trace")), body(read(host[2], "trace"))
    assert len(want) > 20 and got == want
    # Disabling one of them leaves the others in the kernel; removing all but one too.
    kernel, tracer, root = native
    write(root, "events/kprobes/e2/enable", "0")
    write(root, "events/kprobes/e5/enable", "0")
    write(root, "events/kprobes/e1/filter", "a != 0")
    kernel.wait_for_kprobe_optimizer()
    write(root, "trace", "", flags=os.O_WRONLY | os.O_TRUNC)
    workload(kernel, "again")
    names = [line.split()[4] for line in read(root, "trace").splitlines() if "again-" in line]
    assert names.count("e2:") == names.count("e5:") == 0
    assert names.count("e1:") == names.count("e3:") == names.count("e4:") == 3
    assert all(tp.nhit == 0 for tp in tracer.probes)


def test_a_disabled_event_coming_and_going_leaves_the_others_in_the_kernel():
    """An event added (disabled) at an address whose events the kernel records, then
    removed, changes nothing of what runs there: the others stay in the kernel, in
    order; enabled, it joins them (the kernel's list for the address is rewritten)."""
    kernel, tracer, root = traced(True, events=SHARED)
    aggr = kernel.kprobes.get_kprobe(kernel.image.symbol_value("vfs_read"))
    native, children = aggr.native, len(aggr.children)
    assert native is not None
    for _ in range(2):
        write(root, "kprobe_events", "p:extra vfs_read w=%cx\n")
        assert aggr.native == native and len(aggr.children) == children + 1
        write(root, "kprobe_events", "-:extra\n")
        assert aggr.native == native and len(aggr.children) == children
    write(root, "kprobe_events", "p:extra vfs_read w=%cx\n")
    write(root, "events/kprobes/extra/enable", "1")
    write(root, "trace", "", flags=os.O_WRONLY | os.O_TRUNC)
    workload(kernel, "joined")
    names = [line.split()[4] for line in read(root, "trace").splitlines()
             if "joined-" in line]
    entry = [n for n in names if n in ("e1:", "e2:", "extra:")]
    assert entry == ["e1:", "e2:", "extra:"] * 3
    assert all(tp.nhit == 0 for tp in tracer.probes)


def test_a_removed_return_probe_waits_for_its_pending_returns():
    """Tasks sleep inside schedule() with its return hijacked; removing the event keeps
    its instances valid until they come back, then frees them."""
    kernel, tracer, root = make(True)
    write(root, "kprobe_events", "r:sch schedule\n")
    write(root, "events/kprobes/enable", "1")
    sleepers = [kernel.spawn(f"sleeper{i}") for i in range(3)]
    for t in sleepers:
        assert kernel.syscall(t, "getpid") == t.pid        # back asleep in schedule()
    (tp,) = tracer.probes
    np = tp.native
    native = tracer.native
    assert tracer.hits(tp) > 0 and tp.nhit == 0
    write(root, "events/enable", "0")
    write(root, "kprobe_events", "-:sch\n")
    pending = native._pending(np)
    assert pending >= len(sleepers) and native._zombies == [np]   # still on their stacks
    for t in sleepers:
        assert kernel.syscall(t, "getpid") == t.pid        # they return through it
    assert native._pending(np) == pending - len(sleepers)
    waker = kernel.spawn("waker")               # init forks it: its schedule() returns
    assert kernel.syscall(waker, "getpid") == waker.pid and native._pending(np) == 0
    write(root, "kprobe_events", "p:again vfs_read\n")      # the next probe reaps it
    assert native._zombies == [] and kernel.panicked is None


def test_a_reaped_task_gives_back_its_pending_returns():
    """A task that exits dies inside schedule(), whose return is hijacked: freeing it
    when it is reaped gives the instance back (as rethook_flush_task does), so a probe
    with maxactive 4 keeps recording through many exits."""
    kernel, tracer, root = make(True, cpus=1)
    write(root, "kprobe_events", "r4:sch schedule\n")
    write(root, "events/kprobes/enable", "1")
    (tp,) = tracer.probes
    native = tracer.native
    for i in range(12):
        t = kernel.spawn(f"gone{i}")
        kernel.syscall(t, "getpid")             # asleep in schedule(), returns hijacked
        with pytest.raises(ProcessExited):
            kernel.syscall(t, "exit", 0)
        assert kernel.syscall(kernel.init_task, "wait4", t.pid, 0, 0) == t.pid
    assert native._pending(tp.native) < 4 and native.misses(tp.native) == 0
    assert tracer.hits(tp) > 12 and kernel.panicked is None


@pytest.mark.parametrize("boost", [True, False])
def test_a_native_hit_on_a_faulting_user_copy_still_gets_efault(boost):
    """The kernel's recorder runs from the int3's stub, which then goes to the copy that
    jumps back, with no probe current.  The copied user access faults there; the fault
    goes back on the probed address, where __put_user_4's exception table applies."""
    from test_kprobes import _find_insn

    kernel, tracer, root = make(native=True, cpus=1)
    kernel.kprobes.arch.boost = boost
    func = kernel.image.lookup_name("__put_user_4")[0]
    insn = _find_insn(kernel, "__put_user_4", pred=lambda i: i.address in kernel.image.extable)
    write(root, "kprobe_events", f"p:put __put_user_4+{insn.address - func.addr} v=%ax\n")
    write(root, "events/kprobes/put/enable", "1")
    ap = kernel.kprobes.get_kprobe(insn.address)
    assert ap.native is not None and not ap.is_optimized()
    t = kernel.spawn("fault")
    child = kernel.syscall(t, "fork")
    kernel.submit(kernel.tasks[child], "exit", 0)
    assert kernel.syscall(t, "wait4", child, 0x10, 0, 0) == -errno.EFAULT
    assert "Oops" not in kernel.dmesg()
    assert re.search(r"fault-\d+ .* put: \(__put_user_4\+0x[0-9a-f]+/0x[0-9a-f]+\) v=0x",
                     read(root, "trace"))
    # Nothing is left current on the CPU: the next hit is not taken for a reentry.
    assert kernel.syscall(t, "wait4", child, 0x10, 0, 0) in (-errno.EFAULT, -errno.ECHILD)
    assert ap.nmissed == 0


def test_a_kernel_whose_staged_entries_differ_is_refused():
    """The host reads struct tn_entry in place (a page of trace_pipe_raw is its bytes):
    a kernel that lays it out otherwise is not recorded with."""
    kernel = Kernel(cpus=1, seed=0)
    kernel.kabi = dict(kernel.kabi, **{"trace_native.entry_size": 24})
    with pytest.raises(ImageError, match="tn_entry"):
        NativeRecorder(kernel, kernel.kprobes.pt_regs_fields, lambda: None, lambda _id: None)
