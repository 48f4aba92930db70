"""Loadable modules: the loader (layout, relocations, ftrace sites, kallsyms, init/exit,
load/unload/reload and its errors), probes on module text (firing, [GONE] after unload,
enable/disable/unregister on a gone probe), the tracer's pending ``MOD:SYM`` probes
registered when their module comes, the control file, and the modprobe/rmmod shims on a
real mount (kprobe_module.tc's scenario, through a shell)."""

import errno
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import conformance_runner

from kprobefs import Kernel, Kprobe, Kretprobe
from kprobefs.errors import KernelError, ProbeError
from kprobefs.machine.image import FENTRY_NOP
from kprobefs.machine.module import MODULES_VADDR, ModuleLoader
from kprobefs.tracing import Tracer

ROOT = Path(__file__).resolve().parents[1]
MOD = "trace_printk"


@pytest.fixture
def kernel():
    return Kernel(cpus=2, seed=0)


def msym(kernel, name):
    (s,) = kernel.image.lookup_name(f"{MOD}:{name}")
    return s


def checksum(kernel, x):
    return kernel.upcall(msym(kernel, "trace_printk_checksum").addr, x)


# ==== the loader ==========================================================================
def test_load_relocates_and_runs_init(kernel):
    mod = kernel.modules.load("trace-printk")        # - and _ are the same character
    assert mod.name == MOD and mod.state == "live"
    assert mod.start == MODULES_VADDR and mod.start % 4096 == 0
    work = msym(kernel, "trace_printk_work")
    irq_work = msym(kernel, "trace_printk_irq_work")
    # R_X86_64_64 in .data: the work's function pointer
    assert kernel.mem.read_u64(work.addr) == irq_work.addr
    # init ran (printk through R_X86_64_PLT32; its argument through R_X86_64_32S), and
    # ran the work once (an indirect call through the pointer)
    log = kernel.dmesg()
    assert f"trace_printk: loaded at {work.addr:x}" in log
    assert "trace_printk: a static string from the deferred work (run 1)" in log
    # x + strlen(rodata string) + 1000 * runs + 100 * earlier calls (.bss)
    assert checksum(kernel, 5) == 5 + 15 + 1000
    assert checksum(kernel, 5) == 5 + 15 + 1000 + 100
    # every __mcount_loc site became the 5-byte NOP; the image still reads as built
    assert len(mod.ftrace_sites) == 5
    for site in mod.ftrace_sites:
        assert kernel.read(site, 5) == FENTRY_NOP
        assert kernel.image.read(site, 1) == b"\xe8"
    # text is mapped read-only, data writable
    assert not _writable(kernel, mod.text_start) and _writable(kernel, work.addr)


def _writable(kernel, va):
    mem = kernel.mem
    entry = mem._entry_addr(va, 3)
    return bool(struct.unpack_from("<Q", mem.ram, entry)[0] & 2)


def test_kallsyms_and_symbol_lookups_see_the_module(kernel):
    assert "[trace_printk]" not in kernel.kallsyms()
    mod = kernel.modules.load(MOD)
    lines = [line for line in kernel.kallsyms().splitlines() if line.endswith("\t[trace_printk]")]
    irq = msym(kernel, "trace_printk_irq_work")
    assert lines[0] == f"{irq.addr:016x} t trace_printk_irq_work\t[trace_printk]"
    kinds = {line.split()[2]: line.split()[1] for line in lines}
    assert kinds["trace_printk_work"] == "d"          # not exported: lower case
    assert kinds["trace_printk_calls"] == "b"
    assert kinds["trace_printk_string"] == "r"
    assert kinds["trace_printk_checksum"] == "t"
    assert kinds["init_module"] == kinds["cleanup_module"] == "t"
    assert "__modinfo_license" not in kinds and "trace_printk.c" not in kinds
    # kernel symbols stay first in kallsyms; lookups by name, MOD:SYM and address
    assert kernel.kallsyms().index("\t[trace_printk]") > kernel.kallsyms().index(" T vfs_read")
    assert [s.addr for s in kernel.image.lookup_name("trace_printk_irq_work")] == [irq.addr]
    assert kernel.image.lookup_name("vfs_read:trace_printk_irq_work") == []
    assert kernel.image.symbol_at(irq.addr + 3) == irq
    # the static function wins over its global alias, as in Linux's module lookup
    assert kernel.image.symbol_at(mod.init).name == "trace_printk_init"
    assert kernel.image.format_address(irq.addr + 3) == \
        f"trace_printk_irq_work+0x3/{irq.size:#x} [trace_printk]"
    assert set(mod.ftrace_sites) <= set(kernel.image.ftrace_sites)
    assert kernel.image.is_kernel_text(irq.addr)
    assert kernel.modules.proc_modules() == \
        f"trace_printk {mod.size} 0 - Live 0x{mod.start:016x}\n"


def test_unload_and_reload(kernel):
    first = kernel.modules.load(MOD)
    with pytest.raises(KernelError) as e:
        kernel.modules.load("trace-printk")
    assert e.value.errno == errno.EEXIST
    irq = msym(kernel, "trace_printk_irq_work").addr
    kernel.modules.unload("trace-printk")
    assert "trace_printk: unloaded after 1 runs" in kernel.dmesg()
    assert "[trace_printk]" not in kernel.kallsyms()
    assert kernel.image.lookup_name("trace_printk:trace_printk_irq_work") == []
    assert kernel.image.symbol_at(irq) is None
    assert not set(first.ftrace_sites) & set(kernel.image.ftrace_sites)
    assert not kernel.mem.is_mapped(first.start) and not kernel.mem.is_mapped(first.end - 1)
    assert kernel.modules.proc_modules() == ""
    with pytest.raises(KernelError) as e:
        kernel.modules.unload(MOD)
    assert e.value.errno == errno.ENOENT
    # reloaded: a fresh copy at a new address, its data initialised again
    second = kernel.modules.load(MOD)
    assert second.start >= first.end
    assert checksum(kernel, 0) == 15 + 1000
    kernel.modules.unload(MOD)


def _exception_in_progress(kernel) -> int:
    """QEMU's record of the exception being delivered (old_exception; -1: none)."""
    from kprobefs.machine._quirks import old_exception_offset
    return struct.unpack_from("<i", bytes(kernel.uc.context_save()), old_exception_offset())[0]


def test_unload_leaves_no_exception_in_progress(kernel):
    # Unicorn drops a module's translations by translating its addresses; asked after the
    # pages were unmapped, it faulted, and QEMU kept each swallowed fault as an exception
    # in progress: a page fault, then a double fault, then a triple-fault reset.
    for _ in range(3):
        kernel.modules.load(MOD)
        probe = Kprobe(symbol_name=f"{MOD}:trace_printk_checksum", offset=5,
                       pre_handler=lambda p, regs: 0)
        kernel.register_kprobe(probe)
        kernel.modules.unload(MOD)
        kernel.unregister_kprobe(probe)                  # a [GONE] probe on freed text
        assert _exception_in_progress(kernel) == -1


_CONTROL_WRITES = """
import sys
from kprobefs import Kernel
from kprobefs.fs import build_tree
from kprobefs.machine import abi
kernel = Kernel(cpus=2, seed=0)
kernel.hostfs = build_tree(kernel, engine=kernel.kprobes)
task = kernel.spawn("modprobe")
for i in range(4):
    for command in (b"load trace-printk", b"unload trace-printk"):
        fd = kernel.sys(task, "openat", abi.AT_FDCWD, "/sys/kernel/debug/kprobefs/modules",
                        abi.O_WRONLY, 0)
        assert kernel.sys(task, "write", fd, command, len(command)) == len(command)
        kernel.sys(task, "close", fd)
    print("cycle", i, flush=True)
"""


def test_repeated_unloads_from_a_control_file_write_return():
    # The daemon's path: init and exit run inside the write's hypercall.  The third
    # unload used to stop the vCPU from inside the hook, and the write never returned
    # (Unicorn spins in its CPU loop): run it in a child that is killed if it hangs.
    import kprobefs
    env = dict(os.environ, PYTHONPATH=str(Path(kprobefs.__file__).resolve().parents[1]))
    try:
        done = subprocess.run([sys.executable, "-c", _CONTROL_WRITES], env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"a module unload from a control-file write hung after {e.stdout!r}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "cycle 3"


def test_unknown_module(kernel):
    with pytest.raises(KernelError) as e:
        kernel.modules.load("no-such-module")
    assert e.value.errno == errno.ENOENT
    assert MOD in kernel.modules.available() and "no_such_module" not in kernel.modules.available()


# Small modules built on the spot, for the loader's refusals.
_CFLAGS = ["-O2", "-mfentry", "-pg", "-mrecord-mcount", "-fno-pic", "-mcmodel=kernel",
           "-mno-red-zone", "-ffreestanding", "-nostdlib", "-fno-asynchronous-unwind-tables",
           "-fcf-protection=none", "-c"]


@pytest.fixture
def build(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")

    def build(name, source):
        src = tmp_path / f"{name}.c"
        src.write_text(source)
        subprocess.run(["gcc", *_CFLAGS, "-o", str(tmp_path / f"{name}.ko"), str(src)],
                       check=True, capture_output=True)
        return tmp_path
    return build


def test_loader_refusals(kernel, build):
    directory = build("permanent", "int init_module(void) { return 0; }\n")
    build("failing", "int init_module(void) { return -19; }\n"
                     "void cleanup_module(void) {}\n")
    build("unresolved", "int no_such_kernel_function(void);\n"
                        "int init_module(void) { return no_such_kernel_function(); }\n")
    loader = ModuleLoader(kernel, directory)
    # init but no exit: loaded for good ([permanent]), rmmod is EBUSY
    mod = loader.load("permanent")
    assert " 0 [permanent], Live " in loader.proc_modules()
    with pytest.raises(KernelError) as e:
        loader.unload("permanent")
    assert e.value.errno == errno.EBUSY and loader.get("permanent") is mod
    # init fails: its errno, and nothing of the module stays
    with pytest.raises(KernelError) as e:
        loader.load("failing")
    assert e.value.errno == errno.ENODEV
    assert loader.get("failing") is None and "failing" not in kernel.image.modules
    # an undefined symbol the kernel does not have: ENOENT, nothing mapped
    with pytest.raises(KernelError) as e:
        loader.load("unresolved")
    assert e.value.errno == errno.ENOENT and loader.get("unresolved") is None


# ==== probes on module text ===============================================================
def test_probes_on_module_functions_fire(kernel):
    kernel.modules.load(MOD)
    fn = msym(kernel, "trace_printk_checksum")
    hits = []
    entry = Kprobe(symbol_name=f"{MOD}:trace_printk_checksum",
                   pre_handler=lambda p, regs: hits.append(("entry", regs.di)) or 0)
    body = Kprobe(symbol_name="trace_printk_checksum", offset=5,     # after the NOP
                  pre_handler=lambda p, regs: hits.append(("body", regs.di)) or 0)
    ret = Kretprobe(symbol_name=f"{MOD}:trace_printk_checksum",
                    handler=lambda ri, regs: hits.append(("ret", regs.ax)) or 0)
    kernel.register_kprobe(entry)
    kernel.register_kprobe(body)
    kernel.register_kretprobe(ret)
    assert entry.addr == fn.addr and body.addr == fn.addr + 5
    listing = kernel.kprobes.list_text()
    assert f"{fn.addr:016x}  k  trace_printk_checksum+0x0  trace_printk [FTRACE]\n" in listing
    assert f"{fn.addr + 5:016x}  k  trace_printk_checksum+0x5  trace_printk " in listing
    assert checksum(kernel, 7) == 7 + 15 + 1000
    assert hits == [("entry", 7), ("body", 7), ("ret", 1022)]
    kernel.wait_for_kprobe_optimizer()             # the body probe may be a jump now
    assert checksum(kernel, 7) == 7 + 15 + 1000 + 100
    assert len(hits) == 6


def test_unload_leaves_probes_gone(kernel):
    mod = kernel.modules.load(MOD)
    fn = msym(kernel, "trace_printk_checksum")
    hits = []
    probes = [Kprobe(symbol_name=f"{MOD}:trace_printk_checksum", offset=off,
                     pre_handler=lambda p, regs: hits.append(p.offset) or 0)
              for off in (0, 5)]
    off_probe = Kprobe(symbol_name=f"{MOD}:trace_printk_irq_work", flags=2)   # disabled
    for p in probes + [off_probe]:
        kernel.register_kprobe(p)
    kernel.wait_for_kprobe_optimizer()
    free_slots = {size: len(pool) for size, pool in kernel.kprobes.arch.slots._free.items()}
    kernel.modules.unload(MOD)
    # kept registered, marked gone, listed with %pS of an address nothing covers
    assert all(p.registered and p.is_gone() for p in probes + [off_probe])
    lines = kernel.kprobes.list_text().splitlines()
    assert f"{fn.addr:016x}  k  0x{fn.addr:x} [GONE][FTRACE]" in lines
    assert f"{fn.addr + 5:016x}  k  0x{fn.addr + 5:x} [GONE]" in lines
    assert not any("OPTIMIZED" in line or "DISABLED" in line for line in lines)
    # nothing hooks the freed text, and the slots and detours came back
    assert fn.addr + 5 not in kernel._breakpoints
    after = {size: len(pool) for size, pool in kernel.kprobes.arch.slots._free.items()}
    assert all(after[size] >= free_slots[size] for size in after)
    assert sum(after.values()) > sum(free_slots.values())
    assert not kernel.kprobes.ftrace.enabled_sites().keys() & set(mod.ftrace_sites)
    # enable on a gone probe is EINVAL; disable and unregister are fine
    with pytest.raises(ProbeError) as e:
        kernel.enable_kprobe(probes[0])
    assert e.value.errno == errno.EINVAL
    kernel.disable_kprobe(probes[1])
    # a reloaded module does not bring raw probes back (only trace probes re-register)
    kernel.modules.load(MOD)
    assert checksum(kernel, 1) == 16 + 1000 and hits == []
    for p in probes + [off_probe]:
        kernel.unregister_kprobe(p)
    assert kernel.kprobes.list_text() == ""


def test_probe_on_unloaded_module_is_enoent(kernel):
    with pytest.raises(ProbeError) as e:
        kernel.register_kprobe(Kprobe(symbol_name=f"{MOD}:trace_printk_irq_work"))
    assert e.value.errno == errno.ENOENT


# ==== the tracer: MOD:SYM probes wait for their module ====================================
@pytest.fixture
def traced(kernel):
    return kernel, Tracer(kernel.kprobes, kernel, clock=kernel.clock_ns)


def event_lines(tracer, name):
    from kprobefs.tracing.files import tracing_root
    root = tracing_root(tracer)
    handle = root.children()["trace"].open(os.O_RDONLY, 1, "cat")
    text, off = b"", 0
    while chunk := handle.read(65536, off):
        text += chunk
        off += len(chunk)
    handle.release()
    return [line for line in text.decode().splitlines() if f" {name}: " in line]


def test_pending_mod_sym_probe_registers_on_load(traced):
    kernel, tracer = traced
    tracer.run_commands(b"p:kprobes1/event1 trace_printk:trace_printk_irq_work\n")
    tracer.run_commands(b"r:retev trace_printk:trace_printk_checksum $retval\n")
    tp = tracer.probes[0]
    assert not tp.registered and kernel.kprobes.list_text() == ""
    assert tracer.probe_lines() == (
        "p:kprobes1/event1 trace_printk:trace_printk_irq_work\n"
        "r:kprobes/retev trace_printk:trace_printk_checksum arg1=$retval\n")
    # a MOD:SYM on a loaded module that lacks SYM is an error as usual
    kernel.modules.load(MOD)
    with pytest.raises(OSError) as e:
        tracer.run_commands(b"p:bad trace_printk:no_such_function\n")
    assert e.value.errno == errno.ENOENT
    kernel.modules.unload(MOD)
    # enabled while pending: succeeds; the module's init then hits it
    tracer.set_events_enabled(True, group="kprobes1")
    tracer.set_events_enabled(True, event="retev")
    kernel.modules.load(MOD)
    irq = msym(kernel, "trace_printk_irq_work")
    assert tp.registered and tp.address == irq.addr
    (line,) = event_lines(tracer, "event1")
    assert line.endswith(f"event1: (trace_printk_irq_work+0x0/{irq.size:#x} [trace_printk])")
    assert checksum(kernel, 2) == 2 + 15 + 1000
    (line,) = event_lines(tracer, "retev")
    assert "<- trace_printk_checksum) arg1=0x3f9" in line


def test_trace_events_survive_unload_and_come_back(traced):
    kernel, tracer = traced
    kernel.modules.load(MOD)
    tracer.run_commands(b"p trace_printk:trace_printk_irq_work\n")
    tracer.run_commands(b"p:event1 trace_printk:trace_printk_irq_work\n")
    tracer.run_commands(b"p:kprobes1/event1 trace_printk:trace_printk_irq_work\n")
    assert kernel.kprobes.list_text().count("trace_printk_irq_work+0x0  trace_printk "
                                            "[DISABLED][FTRACE]") == 3
    kernel.modules.unload("trace-printk")
    assert kernel.kprobes.list_text().count("[GONE][FTRACE]") == 3
    assert set(tracer.events) == {("kprobes", "p_trace_printk_trace_printk_irq_work_0"),
                                  ("kprobes", "event1"), ("kprobes1", "event1")}
    tracer.run_commands(b"p:event2 trace_printk:trace_printk_irq_work\n")    # pending
    event1 = tracer.events[("kprobes1", "event1")]
    tracer.set_enabled(event1, True)                # on a gone probe: silently fine
    kernel.modules.load("trace-printk")
    assert all(tp.registered for tp in tracer.probes)
    listing = kernel.kprobes.list_text()
    assert listing.count("[GONE]") == 0 and listing.count("[DISABLED][FTRACE]") == 3
    assert len(event_lines(tracer, "event1")) == 1
    kernel.modules.unload("trace-printk")
    tracer.set_enabled(event1, False)
    tracer.run_commands(b"-:kprobes1/event1\n")
    assert ("kprobes1", "event1") not in tracer.events
    assert kernel.kprobes.list_text().count("[GONE][FTRACE]") == 3


# ==== the control file ====================================================================
def test_control_file_and_proc_modules(kernel):
    from kprobefs.fs.tree import build_tree, walk, DEBUGFS_ROOT, PROC_ROOT
    hostfs = build_tree(kernel, engine=kernel.kprobes)
    _, control = walk(hostfs, DEBUGFS_ROOT, ["kprobefs", "modules"])
    _, proc_modules = walk(hostfs, PROC_ROOT, ["modules"])
    assert control.mode & 0o777 == 0o600 and proc_modules.mode & 0o777 == 0o444

    def write(text):
        handle = control.open(os.O_WRONLY, 1, "modprobe")
        try:
            return handle.write(text.encode(), 0)
        finally:
            handle.release()

    def read(node):
        handle = node.open(os.O_RDONLY, 1, "cat")
        try:
            return handle.read(4096, 0).decode()
        finally:
            handle.release()

    # the writes run outside the emulation here; init and exit then go by upcall
    assert write("load trace-printk\n") == len("load trace-printk\n")
    assert re.fullmatch(r"trace_printk \d+ 0 - Live 0x(ffffffffc[0-9a-f]{7})\n",
                        read(proc_modules))
    assert read(control) == read(proc_modules)
    for text, err in (("load trace_printk", errno.EEXIST), ("insmod x", errno.EINVAL),
                      ("load", errno.EINVAL), ("load nothing", errno.ENOENT)):
        with pytest.raises(OSError) as e:
            write(text)
        assert e.value.errno == err
    write("unload trace_printk\n")
    assert read(proc_modules) == ""
    with pytest.raises(OSError) as e:
        write("unload trace_printk\n")
    assert e.value.errno == errno.ENOENT


# ==== kprobe_module.tc's scenario on a real mount, through the shims =======================
def _fuse_missing():
    import ctypes.util
    if not os.path.exists("/dev/fuse") or not ctypes.util.find_library("fuse"):
        return "no FUSE here"
    if os.geteuid() != 0:
        return "mounting needs root"
    return None


@pytest.fixture
def mount(tmp_path):
    reason = _fuse_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"FUSE tests cannot run under CI=true: {reason}")
        pytest.skip(reason)
    import kprobefs
    env = dict(os.environ, PYTHONPATH=str(Path(kprobefs.__file__).resolve().parents[1]))
    env.pop("NOTIFY_SOCKET", None)
    path = tmp_path / "mnt"
    cli = [sys.executable, "-m", "kprobefs"]
    done = subprocess.run(cli + ["mount", str(path)], env=env, cwd="/", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    yield path
    subprocess.run(cli + ["umount", str(path)], env=env, cwd="/", capture_output=True,
                   timeout=120)


@pytest.mark.fuse
def test_module_scenario_through_kprobefs_exec(mount):
    """The module tools kprobefs exec gives its command (kprobefs/kmod.py)."""
    def sh(script):
        return subprocess.run([sys.executable, "-m", "kprobefs", "exec", str(mount), "--",
                               "sh", "-c", script], cwd=mount / "tracing",
                              capture_output=True, text=True, timeout=120,
                              env=conformance_runner._cli_env())

    r = sh("rmmod trace-printk")
    assert r.returncode == 1
    # kmod names the module as it normalizes it, - as _
    assert r.stderr == "rmmod: ERROR: Module trace_printk is not currently loaded\n"
    r = sh("modprobe no-such-thing")
    assert r.returncode == 1 and r.stderr.startswith(
        "modprobe: FATAL: Module no-such-thing not found in directory ")
    r = sh("""set -e
        modprobe trace-printk
        modprobe trace_printk
        grep -q '^trace_printk [0-9]* 0 - Live 0x' ../proc/modules
        grep -q 't trace_printk_irq_work\t\\[trace_printk\\]$' ../proc/kallsyms
        echo 'p trace_printk:trace_printk_irq_work' > kprobe_events
        test -d events/kprobes/p_trace_printk_trace_printk_irq_work_0
        echo 'p:kprobes1/event1 trace_printk:trace_printk_irq_work' >> kprobe_events
        grep -q 'trace_printk_irq_work+0x0  trace_printk \\[DISABLED\\]\\[FTRACE\\]' ../kprobes/list
        rmmod trace-printk
        test -d events/kprobes1/event1
        grep -q '\\[GONE\\]\\[FTRACE\\]' ../kprobes/list
        echo 'p:event2 trace_printk:trace_printk_irq_work' >> kprobe_events
        echo 1 > events/kprobes1/event1/enable
        modprobe trace-printk
        grep 'event1:' trace
        rmmod trace-printk
        echo 0 > events/kprobes1/event1/enable
        echo '-:kprobes1/event1' >> kprobe_events
        cat kprobe_events
    """)
    assert r.returncode == 0, r.stderr
    # the probe fires in the irq_work's interrupt, in hardirq context
    assert re.search(r" d\.h\.\. .* event1: \(trace_printk_irq_work\+0x0/0x[0-9a-f]+ "
                     r"\[trace_printk\]\)$", r.stdout, re.M), r.stdout
    assert r.stdout.endswith(
        "p:kprobes/p_trace_printk_trace_printk_irq_work_0 trace_printk:trace_printk_irq_work\n"
        "p:kprobes/event2 trace_printk:trace_printk_irq_work\n")


# ==== module parameters ===================================================================
DELAY_MOD = "preemptirq_delay_test"


def _param_values(kernel):
    mod = kernel.modules.get(DELAY_MOD)
    mode = kernel.read(mod.symbol_address("test_mode"), 12).split(b"\0")[0].decode()
    delay = struct.unpack("<Q", kernel.read(mod.symbol_address("delay"), 8))[0]
    burst = struct.unpack("<I", kernel.read(mod.symbol_address("burst_size"), 4))[0]
    return mode, delay, burst


def test_module_parameters_reach_the_variables_before_init(kernel):
    kernel.modules.load(DELAY_MOD, params=("test_mode=preempt", "delay=7",
                                           "burst-size=0x2", "bogus=1"))
    assert _param_values(kernel) == ("preempt", 7, 2)
    kernel.modules.unload(DELAY_MOD)
    kernel.modules.load(DELAY_MOD)
    assert _param_values(kernel) == ("irq", 100, 1)          # the defaults again
    kernel.modules.unload(DELAY_MOD)


@pytest.mark.parametrize("param, err", [("delay=x", errno.EINVAL), ("delay", errno.EINVAL),
                                        ("cpu_affinity=-5000000000", errno.EINVAL),
                                        ("test_mode=" + "a" * 12, errno.ENOSPC)])
def test_a_bad_module_parameter_fails_the_load(kernel, param, err):
    with pytest.raises(KernelError) as e:
        kernel.modules.load(DELAY_MOD, params=(param,))
    assert e.value.errno == err
    assert kernel.modules.get(DELAY_MOD) is None


def test_module_parameter_types_in_modinfo():
    from kprobefs.machine.module import ModuleObject
    obj = ModuleObject(Kernel(cpus=1, seed=0).modules.find(DELAY_MOD))
    assert obj.params == {"delay": ("ulong", "delay"), "test_mode": ("string", "test_mode"),
                          "burst_size": ("uint", "burst_size"),
                          "cpu_affinity": ("int", "cpu_affinity")}
