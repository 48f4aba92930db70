"""The machine: boot, kallsyms, ftrace sites, the blacklist, traps, text_poke, CPUs,
tasks and system calls on the real kernel image."""

import errno
import re
import shutil
import struct
import subprocess
import sys
import time

import pytest

from kprobefs.arch.x86.insn import InsnDecodeError, iter_insns
from kprobefs.errors import KernelOops, KernelStuck, KernelWedged
from kprobefs.machine import Kernel, KernelImage, UserBuffer
from kprobefs.machine.image import FENTRY_NOP
from kprobefs.machine.workload import Workload


@pytest.fixture(scope="module")
def image():
    return KernelImage()


@pytest.fixture
def kernel():
    return Kernel(cpus=2, seed=0)


# ---- the image --------------------------------------------------------------------------
def _nm_symbols(path):
    out = subprocess.run(["nm", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TtDdRrBb":
            syms.add((int(parts[0], 16), parts[1], parts[2]))
    return syms


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils missing")
def test_kallsyms_agrees_with_nm(image):
    ours = {(s.addr, s.type, s.name) for s in image.symbols}
    theirs = _nm_symbols(image.path)
    assert ours == theirs
    lines = image.kallsyms().splitlines()
    assert len(lines) == len(ours) > 150
    addr, letter, name = lines[0].split()
    assert len(addr) == 16 and letter in "TtDdRrBb"
    assert [int(line.split()[0], 16) for line in lines] == sorted(
        int(line.split()[0], 16) for line in lines)


def test_kallsyms_letters_and_lookup(image):
    (vfs_read,) = image.lookup_name("vfs_read")
    assert vfs_read.type == "T" and vfs_read.size > 0
    (banner,) = image.lookup_name("linux_proc_banner")
    assert banner.type in "Rr"
    assert image.lookup_name("jiffies")[0].type in "Bb"
    assert image.lookup_name("init_task")[0].type in "Dd"
    for marker in ("_stext", "_etext", "_sdata", "_edata"):
        assert image.lookup_name(marker), marker
    statics = [s for s in image.symbols if s.type == "t"]
    assert statics, "static functions are listed with a lower-case t"
    assert image.lookup_name("no_such_function") == []


def test_non_unique_names_are_reported(image):
    name_show = image.lookup_name("name_show")
    assert len(name_show) == 2 and all(s.type == "t" for s in name_show)
    assert name_show[0].addr != name_show[1].addr


def test_clones_are_in_kallsyms(image):
    names = [s.name for s in image.symbols]
    assert any(".isra." in n for n in names)
    assert any(".constprop." in n for n in names)


def test_address_to_symbol(image):
    (sym,) = image.lookup_name("vfs_read")
    assert image.format_address(sym.addr) == f"vfs_read+0x0/{sym.size:#x}"
    assert image.format_address(sym.addr + 5) == f"vfs_read+0x5/{sym.size:#x}"
    assert image.symbol_at(sym.addr + sym.size - 1) == sym
    assert image.format_address(0x1000) == "0x1000"


def test_ftrace_sites_are_fentry_calls_in_the_image(image):
    (fentry,) = image.lookup_name("__fentry__")
    assert len(image.ftrace_sites) > 100
    for site in image.ftrace_sites:
        insn = image.read(site, 5)
        assert insn[0] == 0xE8
        assert site + 5 + struct.unpack("<i", insn[1:])[0] == fentry.addr
        assert image.symbol_at(site).addr == site  # -mfentry: the first instruction


def test_every_ftrace_site_is_a_nop_after_boot(kernel):
    for site in kernel.image.ftrace_sites:
        assert kernel.read(site, 5) == FENTRY_NOP


def test_nokprobe_table_loads(image):
    names = {s.name for s in image.blacklist}
    for must in ("exc_page_fault", "notifier_call_chain", "__switch_to",
                 "kretprobe_trampoline", "rethook_trampoline", "optprobe_template_entry",
                 "kprobe_insn_area", "fixup_exception", "exc_int3", "die"):
        assert must in names, must
    assert "vfs_read" not in names
    nokprobe = {s.name for s in image.nokprobe_functions}
    assert {"exc_page_fault", "notifier_call_chain", "__switch_to"} <= nokprobe


def test_exception_table_covers_user_copies(image):
    assert image.extable
    funcs = {image.symbol_at(a).name for a in image.extable}
    assert {"copy_user_generic", "__put_user_8"} <= funcs


# ---- system calls, tasks, faults ------------------------------------------------------------
def test_boot_and_init(kernel):
    assert kernel.init_task.pid == 1
    assert "Linux version 6.1.0" in kernel.dmesg()
    assert kernel.proc_version().startswith("Linux version 6.1.0-kprobefs (")


def test_spawn_gives_pid_and_comm(kernel):
    t = kernel.spawn("cat", pid=31337)
    assert t.pid == 31337
    assert kernel.syscall(t, "getpid") == 31337
    assert kernel.syscall(t, "getppid") == 1
    name = UserBuffer(16)
    assert kernel.syscall(t, "prctl", 16, name) == 0
    assert name.data.rstrip(b"\0") == b"cat"
    # A pid already in use cannot be taken again.
    with pytest.raises(OSError) as e:
        kernel.spawn("dup", pid=31337)
    assert e.value.errno == errno.EEXIST


def test_a_spawned_task_has_its_name_from_its_fork_and_no_prctl(kernel):
    """A spawn's child is named as fork makes it (the kernel's TASK_NEW), whatever its
    parent's name: no prctl is queued for it, as no host fork makes one."""
    sh = kernel.spawn("sh")
    calls = []
    submit = kernel.submit
    kernel.submit = lambda task, name, *a, **kw: (calls.append(name),
                                                  submit(task, name, *a, **kw))[1]
    try:
        same = kernel.spawn("sh", parent=sh)
        other = kernel.spawn("cat", parent=sh)
        long = kernel.spawn("a-name-longer-than-15")
        kernel.run_until_idle()
    finally:
        kernel.submit = submit
    assert calls == ["clone3", "clone3", "clone3"]
    for task, comm in ((same, b"sh"), (other, b"cat"), (long, b"a-name-longer-t")):
        name = UserBuffer(16)
        assert kernel.syscall(task, "prctl", 16, name) == 0
        assert name.data.rstrip(b"\0") == comm and task.comm == comm.decode()
    # a fork of the task itself copies its name, as Linux's does
    child = kernel.syscall(other, "fork")
    name = UserBuffer(16)
    assert kernel.syscall(kernel.tasks[child], "prctl", 16, name) == 0
    assert name.data.rstrip(b"\0") == b"cat"


def test_a_read_buffer_copies_back_what_the_call_read(kernel):
    """UserBuffer(upto_result=True) gets the bytes the call returned, none on an error;
    a plain one the whole buffer, what the call did not write as the memory held it."""
    from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR

    t = kernel.spawn("rd")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/upto", O_CREAT | O_RDWR, 0o644)
    assert kernel.syscall(t, "write", fd, b"abcdef", 6) == 6
    whole, upto = UserBuffer(16, b"x" * 16), UserBuffer(16, b"x" * 16, upto_result=True)
    assert kernel.syscall(t, "pread64", fd, whole, 16, 2) == 4
    assert kernel.syscall(t, "pread64", fd, upto, 16, 2) == 4
    assert whole.data == b"cdef" + b"x" * 12 and upto.data == b"cdef"
    failed = UserBuffer(16, upto_result=True)
    assert kernel.syscall(t, "pread64", 999, failed, 16, 0) == -errno.EBADF
    assert failed.data == b""


def test_syscall_registers_are_a_pt_regs():
    """pack_syscall_regs: the pt_regs entry code leaves for a system call (its number in
    orig_ax, -ENOSYS in ax, the arguments in di si dx r10 r8 r9, the rest zero)."""
    from kprobefs.machine.cpu import pack_pt_regs, pack_syscall_regs

    for n in range(8):
        args = [(i + 1) * 0x1111 - (i % 2 << 63) for i in range(n)]
        regs = dict(zip(("di", "si", "dx", "r10", "r8", "r9"), args), orig_ax=17, ax=-38)
        assert pack_syscall_regs(17, args) == pack_pt_regs(regs)


def _read_int(kernel, name, fmt="<i"):
    addr = kernel.image.symbol_value(name)
    return struct.unpack(fmt, kernel.read(addr, struct.calcsize(fmt)))[0]


def test_fork_exit_accounting(kernel):
    sh = kernel.spawn("sh")
    threads0 = _read_int(kernel, "nr_threads")
    forks0 = _read_int(kernel, "total_forks", "<Q")
    kids = [kernel.syscall(sh, "fork") for _ in range(5)]
    assert all(k > 0 for k in kids) and len(set(kids)) == 5
    assert _read_int(kernel, "nr_threads") == threads0 + 5
    assert _read_int(kernel, "total_forks", "<Q") == forks0 + 5
    for i, pid in enumerate(kids):
        assert kernel.syscall(kernel.tasks[pid], "getppid") == sh.pid
        kernel.submit(kernel.tasks[pid], "exit", i)
    statuses = {}
    for _ in kids:
        st = UserBuffer(4)
        pid = kernel.syscall(sh, "wait4", -1, st, 0, 0)
        statuses[pid] = struct.unpack("<i", st.data)[0]
    assert statuses == {pid: i << 8 for i, pid in enumerate(kids)}
    assert _read_int(kernel, "nr_threads") == threads0
    assert kernel.syscall(sh, "wait4", -1, 0, 0, 0) == -errno.ECHILD
    assert all(pid not in kernel.tasks for pid in kids)


def test_bad_user_pointer_gives_efault(kernel):
    t = kernel.spawn("bad")
    for addr in (0x10, 0x7FFF00000000, 0x800000000000, 0xFFFF888000000000):
        assert kernel.syscall(t, "prctl", 15, addr) == -errno.EFAULT
    # The task is unharmed and the kernel recorded no oops.
    assert kernel.syscall(t, "getpid") == t.pid
    assert "Oops" not in kernel.dmesg()


def test_oops_kills_one_task_only(kernel):
    """A kernel bug hit by one task's system call kills that task, not the kernel."""
    victim = kernel.spawn("victim")
    bystander = kernel.spawn("bystander")
    (fn,) = kernel.image.lookup_name("__x64_sys_getppid")
    site = fn.addr + 5
    original = kernel.read(site, 8)
    # movq 0xffffffffff600000, %rax -- a load from an address nothing maps
    kernel.text_poke(site, bytes.fromhex("488b04250000 60ff".replace(" ", "")))
    with pytest.raises(KernelOops):
        kernel.syscall(victim, "getppid")
    kernel.text_poke(site, original)
    assert victim.pid not in kernel.tasks
    log = kernel.dmesg()
    assert "BUG: unable to handle page fault for address: ffffffffff600000" in log
    assert "Oops: page fault: 0000 [#1] CPU: " in log and "Comm: victim" in log
    assert kernel.syscall(bystander, "getpid") == bystander.pid
    assert kernel.syscall(bystander, "getppid") == 1
    assert kernel.spawn("after").pid > 0


def _task_struct(kernel, pid):
    """Walk init_task.tasks to the task_struct of pid."""
    head = kernel.image.symbol_value("task_list_head")
    off_tasks, off_pid = kernel.kabi["task.tasks"], kernel.kabi["task.pid"]
    node = kernel.mem.read_u64(head)
    while node != head:
        task = node - off_tasks
        if struct.unpack("<i", kernel.read(task + off_pid, 4))[0] == pid:
            return task
        node = kernel.mem.read_u64(node)
    raise LookupError(pid)


def test_text_poke_takes_effect_on_code_that_already_ran(kernel):
    t = kernel.spawn("poke")
    (fn,) = kernel.image.lookup_name("__x64_sys_getpid")
    assert kernel.syscall(t, "getpid") == t.pid  # translated and cached by now
    site = fn.addr + 5  # just past the ftrace NOP
    original = kernel.read(site, 6)
    kernel.text_poke(site, bytes.fromhex("b892100000c3"))  # mov $4242,%eax; ret
    assert kernel.syscall(t, "getpid") == 4242
    kernel.text_poke(site, original)
    assert kernel.syscall(t, "getpid") == t.pid


def test_text_is_read_only_to_the_kernel(kernel):
    """A kernel write into its own text faults (and is reported as an oops)."""
    t = kernel.spawn("wp")
    (fn,) = kernel.image.lookup_name("vfs_read")
    # prctl(PR_GET_NAME) writes 16 bytes to the "user" pointer; a text address fails
    # access_ok, so aim the kernel at text through the fault path instead: it must
    # return -EFAULT, never modify the text.
    before = kernel.read(fn.addr, 16)
    assert kernel.syscall(t, "prctl", 16, fn.addr) == -errno.EFAULT
    assert kernel.read(fn.addr, 16) == before


def test_two_cpus_interleave_and_each_sees_its_own_task():
    kernel = Kernel(cpus=2)
    a, b = kernel.spawn("a"), kernel.spawn("b")
    (fn,) = kernel.image.lookup_name("__x64_sys_getpid")
    cpu_field = 16  # struct pcpu: self, current_task, cpu_number
    hits = []

    def on_getpid(k, _addr):
        cpu_number = struct.unpack("<i", k.read(k.cpu.gs_base + cpu_field, 4))[0]
        hits.append((k.cpu.index, cpu_number, k.current_pid()))

    kernel.hook_code(fn.addr, fn.addr, on_getpid)
    reqs = [kernel.submit(t, "getpid") for _ in range(40) for t in (a, b)]
    for r in reqs:
        kernel.wait(r)
    assert all(r.result == r.task.pid for r in reqs)
    by_cpu = {}
    for cpu, cpu_number, pid in hits:
        assert cpu == cpu_number  # smp_processor_id() is the CPU's own
        by_cpu.setdefault(cpu, set()).add(pid)
    assert set(by_cpu) == {0, 1}
    assert by_cpu[0] | by_cpu[1] == {a.pid, b.pid}
    switches = sum(1 for x, y in zip(hits, hits[1:]) if x[0] != y[0])
    assert switches >= 4, "the CPUs should interleave, not run one after the other"


def test_workload_is_deterministic_for_a_seed():
    def run(seed):
        k = Kernel(cpus=2, seed=seed)
        w = Workload(k, seed=seed)
        w.run(300)
        return w.completed, dict(w.errors), sorted(k.tasks)

    assert run(7) == run(7)


def test_the_workload_keeps_its_rate_between_pumps(monkeypatch):
    """What the rate gives between two pumps all starts, not one call a worker: 20 ms at
    2,000 operations a second is 40 calls from three workers, the ones whose calls
    return going on at once while budget is left, and no more until the next pump."""
    from kprobefs.machine import workload as workload_module
    now = [0.0]
    monkeypatch.setattr(workload_module.time, "monotonic", lambda: now[0])
    k = Kernel(cpus=2, seed=0)
    w = Workload(k, seed=0, rate=2000)
    started = []
    submit = w._submit
    monkeypatch.setattr(w, "_submit", lambda task, call: (
        started.append(call[0]), submit(task, call))[1])
    with k.lock:
        now[0] += 0.02
        w.pump()
        while k.run_slice():
            pass
        assert len(started) == 40
        now[0] += 0.005
        w.pump()
        while k.run_slice():
            pass
        assert len(started) == 50


def test_nobody_waits_for_the_workloads_calls():
    """The workload's calls, its children's included, are background work: none is
    awaited (which would end the CPUs' turns at each call while it is loaded)."""
    k = Kernel(cpus=2, seed=0)
    w = Workload(k, seed=0)
    loaded = []
    load = k._load_request

    def loading(task, req):
        loaded.append((req.name, req.on_done is not None))
        return load(task, req)
    k._load_request = loading
    w.run(600)
    assert {"execve", "exit", "tgkill"} <= {name for name, _ in loaded}
    assert all(background for _, background in loaded)


def test_a_spinning_task_is_killed_as_by_an_oops_and_its_cpu_stays():
    """A CPU spinning in kernel code without hypercalls is stopped by the watchdog, and
    its task is killed the way an oops kills it (the kernel's soft-lockup report, then
    die()): the system call fails with KernelOops (the FUSE layer's EIO), the CPU stays in
    service and the kernel runs on."""
    kernel = Kernel(cpus=2)
    kernel.WEDGE_SECONDS = 0.5
    spinner, other = kernel.spawn("spinner"), kernel.spawn("other")
    (fn,) = kernel.image.lookup_name("__x64_sys_getppid")
    original = kernel.read(fn.addr + 5, 2)
    kernel.text_poke(fn.addr + 5, bytes.fromhex("ebfe"))        # jmp . (a tight loop)
    try:
        with pytest.raises(KernelOops):
            kernel.syscall(spinner, "getppid", timeout=10)
    finally:
        kernel.text_poke(fn.addr + 5, original)
    assert "soft lockup - CPU#" in kernel.dmesg()
    assert f"stuck for 1s! [spinner:{spinner.pid}]" in kernel.dmesg()
    assert f"RIP: {fn.addr + 5:016x}" in kernel.dmesg()
    assert spinner.state == "dead" and not kernel.wedged
    assert all(c.state != "wedged" for c in kernel.cpus)
    assert kernel.syscall(other, "getpid") == other.pid
    assert kernel.syscall(kernel.spawn("later"), "getppid") == 1


def test_a_cpu_whose_idle_task_spins_is_taken_out_of_service():
    """The idle task cannot be killed: a spin there (here an upcall, which runs in the
    idle loop) takes its CPU out of service, the upcall fails, the other CPU serves."""
    kernel = Kernel(cpus=2)
    kernel.WEDGE_SECONDS = 0.5
    (fn,) = kernel.image.lookup_name("__x64_sys_getppid")
    original = kernel.read(fn.addr + 5, 2)
    kernel.text_poke(fn.addr + 5, bytes.fromhex("ebfe"))
    try:
        with pytest.raises(KernelWedged):
            kernel.upcall(fn.addr, 0, timeout=10)
    finally:
        kernel.text_poke(fn.addr + 5, original)
    assert [ip for _cpu, ip in kernel.wedged] == [fn.addr + 5]
    assert sum(c.state == "wedged" for c in kernel.cpus) == 1
    task = kernel.spawn("after")
    assert kernel.syscall(task, "getppid") == 1


def test_a_task_killed_for_spinning_that_spins_again_takes_its_cpu_out():
    """The kill runs do_exit; a task that spins there too (its exit path is broken) is
    not killed twice: its CPU is taken out of service, and with no CPU left the machine
    says it is stuck and fails calls at once."""
    kernel = Kernel(cpus=1)
    kernel.WEDGE_SECONDS = 0.3
    (fn,) = kernel.image.lookup_name("__x64_sys_getppid")
    (exit_files,) = kernel.image.lookup_name("exit_files")
    victim = kernel.spawn("victim")
    kernel.text_poke(fn.addr + 5, bytes.fromhex("ebfe"))
    kernel.text_poke(exit_files.addr, bytes.fromhex("ebfe"))
    with pytest.raises(KernelOops):
        kernel.syscall(victim, "getppid", timeout=10)
    with pytest.raises(KernelStuck):        # the exit spins: found by the next call
        kernel.spawn("late", timeout=10)
    assert kernel.cpus[0].state == "wedged" and kernel.stuck
    assert kernel.wedged == [(0, exit_files.addr)]
    started = time.monotonic()
    with pytest.raises(KernelStuck):
        kernel.spawn("later")
    assert time.monotonic() - started < 0.5


# A call, jmp or jcc with a rel32 operand; the lookahead finds overlapping candidates.
_REL32_BRANCH = re.compile(rb"(?=(?:[\xe8\xe9]|\x0f[\x80-\x8f])(?s:.{4}))")


def _branch_targets(image, sym):
    """The targets of the relative branches of sym's text, decoded from its start up to
    the first offset that does not decode."""
    targets = set()
    try:
        for insn in iter_insns(image.read(sym.addr, sym.size), sym.addr):
            if insn.branch_target is not None:
                targets.add(insn.branch_target)
    except InsnDecodeError:
        pass
    return targets


def _confirmed_call_targets(image, wanted):
    """Those of the addresses in wanted that a decoded instruction branches to.

    Decoding the whole kernel takes tens of seconds, so the text is first scanned for
    bytes that would be a rel32 call, jmp or jcc to one of them; only the functions
    holding such bytes are decoded, and an address counts only when an instruction
    decoded from its function's start branches there (the bytes may sit inside another
    instruction)."""
    text = image.read(image.text_start, image.text_end - image.text_start)
    suspects = set()
    for m in _REL32_BRANCH.finditer(text):
        at = m.start()
        size = 6 if text[at] == 0x0F else 5
        rel = int.from_bytes(text[at + size - 4:at + size], "little", signed=True)
        if image.text_start + at + size + rel in wanted:
            sym = image.symbol_at(image.text_start + at)
            if sym is not None and sym.is_text and sym.size:
                suspects.add(sym)
    found = set()
    for sym in suspects:
        found |= _branch_targets(image, sym) & wanted
    return found


def test_linux_functions_are_real_call_targets(image):
    """The functions the issue and the selftests probe exist in kallsyms and are called
    (gcc must not have inlined them away), so a probe on them sees real activity."""
    called = ["kernel_clone", "copy_process", "dup_task_struct", "wake_up_new_task",
              "do_exit", "release_task", "schedule", "do_sys_open", "do_sys_openat2",
              "getname", "strncpy_from_user", "do_filp_open", "path_openat", "ksys_read",
              "vfs_read", "ksys_write", "vfs_write", "vfs_mkdir", "vfs_symlink",
              "vfs_unlink", "close_fd", "copy_from_user", "copy_to_user", "printk",
              "netif_receive_skb"]
    # Reached through function pointers, as in Linux.
    indirect = ["ip_rcv", "tcp_v4_rcv", "inet_csk_accept", "tracefs_create_dir", "__switch_to"]
    for name in called + indirect:
        assert image.lookup_name(name), f"{name} is missing from kallsyms"
    wanted = {image.lookup_name(name)[0].addr for name in called}
    targets = _confirmed_call_targets(image, wanted)
    if targets != wanted:
        # A call the scan cannot see (a rel8 jump, say): decode every function, as the
        # scan's shortcut must agree with.
        for s in image.symbols:
            if s.is_text and s.size:
                targets |= _branch_targets(image, s)
    for name in called:
        assert image.lookup_name(name)[0].addr in targets, f"nothing calls {name}: inlined?"


def test_data_is_not_executable(kernel):
    """Pages are W^X, as Linux maps its kernel: a jump into data (here the direct map of
    RAM, then a .data page of the image) faults on the instruction fetch and oopses the
    task; text still runs.  (NX data is also what keeps Unicorn's stores on its fast
    path; benchmarks/bench_machine.py shows the difference.)"""
    (fn,) = kernel.image.lookup_name("__x64_sys_getppid")
    site = fn.addr + 5
    original = kernel.read(site, 12)
    for target in (kernel.image.symbol_value("init_task"), 0xFFFF888000900000):
        victim = kernel.spawn("nx")
        # movabs $target, %rax; jmp *%rax
        kernel.text_poke(site, b"\x48\xb8" + struct.pack("<Q", target) + b"\xff\xe0")
        try:
            with pytest.raises(KernelOops):
                kernel.syscall(victim, "getppid")
        finally:
            kernel.text_poke(site, original)
        assert f"BUG: unable to handle page fault for address: {target:016x}" in kernel.dmesg()
        # The fault is on the fetch itself: the oops reports RIP at the target.
        assert f"RIP: {target:016x}" in kernel.dmesg()
    assert kernel.syscall(kernel.spawn("after"), "getppid") == 1


def test_a_process_that_exits_while_the_machine_thread_runs_exits_cleanly(tmp_path):
    """A Python-API user's process that ends with the machine thread busy (a workload
    pumped by it) and no close(): the thread is stopped before the interpreter
    finalizes (exits like these crashed inside Unicorn now and then)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "exit_busy.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from kprobefs.machine import Kernel\n"
        "from kprobefs.machine.workload import Workload\n"
        "k = Kernel(cpus=2, seed=0)\n"
        "w = Workload(k, seed=0, rate=50000)\n"
        "k.periodic.append(w.pump)\n"
        "k.serve()\n"
        "time.sleep(0.3)\n")
    codes = [subprocess.run([sys.executable, str(script)], capture_output=True,
                            timeout=120).returncode for _ in range(6)]
    assert codes == [0] * 6


def test_host_reads_and_writes_span_pages_whatever_their_physical_order(kernel):
    """Memory.read/write take physically contiguous pages as one run (a user window
    mapped in one go, the direct map) and others page by page; an unmapped page raises
    FaultError at that page, after what came before it was written."""
    from kprobefs.machine.memory import PAGE, PAGE_OFFSET, FaultError
    mem = kernel.mem
    task = kernel.spawn("spans")
    base = task.window + 3 * PAGE
    mem.ensure_user_pages(base, 4 * PAGE)
    pas = [mem.translate(base + i * PAGE) for i in range(4)]
    assert pas == [pas[0] + i * PAGE for i in range(4)]      # one run, upwards
    # the middle two pages swapped: no longer one run
    mem.map_page(base + PAGE, pas[2], writable=True, user=True)
    mem.map_page(base + 2 * PAGE, pas[1], writable=True, user=True)
    data = bytes(range(256)) * (4 * PAGE // 256)
    mem.write(base + 5, data[:4 * PAGE - 10])
    assert mem.read(base + 5, 4 * PAGE - 10) == data[:4 * PAGE - 10]
    assert bytes(mem.ram[pas[2]:pas[2] + PAGE]) == data[PAGE - 5:2 * PAGE - 5]
    buf = PAGE_OFFSET + mem.translate(base)    # the same RAM through the direct map
    assert mem.read(buf + 5, PAGE - 5) == data[:PAGE - 5]
    mem.unmap_page(base + 3 * PAGE)
    with pytest.raises(FaultError) as e:
        mem.write(base, b"\xee" * 4 * PAGE)
    assert e.value.addr == base + 3 * PAGE
    assert mem.read(base, 3 * PAGE) == b"\xee" * 3 * PAGE
    with pytest.raises(FaultError):
        mem.read(base + PAGE, 3 * PAGE)


def _chain(kernel, task, n, done):
    """n getpids of task one after the other, each issued by the last one's on_done
    (inside the emulation, as the workload issues its calls)."""
    def next_call(req=None):
        if req is not None:
            done.append(req.result)
        if len(done) < n:
            kernel.submit(task, "getpid", on_done=next_call)
    return next_call


def _count_posts(kernel) -> list[int]:
    """A one-element list counting the work posted to kernel from now on (each post of
    a task's call means the task sleeps before it)."""
    posts = [0]
    post = kernel._post

    def counting(work, wake=True):
        posts[0] += 1
        post(work, wake)
    kernel._post = counting
    return posts


def _awaited_call_gets_in(kernel, task):
    """A getpid of task that someone waits for completes within a few slices, while
    background chains run (the caller holds the lock)."""
    waited = kernel.submit(task, "getpid")
    turns = 0
    while not waited.done.is_set() and turns < 50:
        kernel.run_slice()
        turns += 1
    assert waited.result == task.pid and turns < 10


def test_a_call_issued_as_the_last_one_ends_runs_in_the_same_turn(kernel):
    """A task's next call, submitted from the last one's on_done, is taken at once: the
    task goes on to it without sleeping, in the same turn of its CPU."""
    task = kernel.spawn("chain")
    done: list = []
    slices = 0
    with kernel.lock:
        _chain(kernel, task, 50, done)()
        while len(done) < 50 and slices < 1000:
            kernel.run_slice()
            slices += 1
    assert done == [task.pid] * 50
    assert slices <= 3          # one call a slice before


def test_background_calls_keep_their_cpu_for_a_turn_awaited_ones_round_robin(kernel):
    """Two chains of background calls on two CPUs switch the emulator's CPU about once a
    TURN_CALLS calls, not at each one; a call someone waits for makes turns end at each
    call again while it is loaded."""
    a, b = kernel.spawn("a"), kernel.spawn("b")
    switches = [0]
    switch = kernel._switch_cpu

    def counting(cpu):
        switches[0] += kernel._loaded_cpu is not cpu
        switch(cpu)
    kernel._switch_cpu = counting
    done_a: list = []
    done_b: list = []
    with kernel.lock:
        _chain(kernel, a, 300, done_a)()
        _chain(kernel, b, 300, done_b)()
        while len(done_a) + len(done_b) < 600:
            kernel.run_slice()
    assert switches[0] < 34     # 37 ending turns every 16 calls, 600 at every call
    kernel.TURN_CALLS = 10**9
    c = kernel.spawn("c")
    done_a.clear()
    done_b.clear()
    with kernel.lock:
        _chain(kernel, a, 10**6, done_a)()
        _chain(kernel, b, 10**6, done_b)()
        _awaited_call_gets_in(kernel, c)
    assert done_a and done_b    # both went on meanwhile


def test_work_posted_in_a_turn_is_taken_before_the_next_cpus_turn():
    """A chain past MAX_TURN_CALLS posts its next call, which ends its CPU's turn; the
    machine takes it before the next CPU's turn, whose turn then runs its TURN_CALLS
    calls (it was cut to one call while the post waited for the next slice).  Three
    chains of 640 calls: 3 x 640 / 64 = 30 turns at best."""
    kernel = Kernel(cpus=4, seed=0)
    tasks = [kernel.spawn(comm) for comm in "abc"]
    turns = [0]
    emulate = kernel._emulate

    def counting(cpu):
        turns[0] += 1
        emulate(cpu)
    kernel._emulate = counting
    dones: list = [[] for _ in tasks]
    with kernel.lock:
        for task, done in zip(tasks, dones):
            _chain(kernel, task, 640, done)()
        while sum(map(len, dones)) < 3 * 640:
            kernel.run_slice()
    assert all(done == [task.pid] * 640 for task, done in zip(tasks, dones))
    assert turns[0] <= 33       # 59 when posted work waited for the next slice


def test_a_task_goes_on_while_an_idle_cpu_can_take_the_work_that_waits():
    """A wake-up queued while a chain runs makes the chain's task go idle for it only
    where no CPU is idle; here three are, and one takes it before the next turn: the
    chain never sleeps (one post: its first call, from outside the machine)."""
    kernel = Kernel(cpus=4, seed=0)
    a, b = kernel.spawn("a"), kernel.spawn("b")
    posts = _count_posts(kernel)
    done_a: list = []
    done_b: list = []

    def next_a(req=None):
        if req is not None:
            done_a.append(req.result)
            kernel.submit(b, "getpid", on_done=lambda r: done_b.append(r.result))
        if len(done_a) < 60:
            kernel.submit(a, "getpid", on_done=next_a)
    with kernel.lock:
        next_a()
        while len(done_a) < 60 or len(done_b) < 60:
            kernel.run_slice()
    assert done_a == [a.pid] * 60 and done_b == [b.pid] * 60
    assert posts[0] == 1        # 7: it slept every MIN_TURN_CALLS calls


def test_a_task_alone_on_its_cpu_goes_on_past_max_turn_calls():
    """MAX_TURN_CALLS bounds a run only while its CPU runs no other task: a chain alone
    on its CPU never sleeps (one post: its first call, from outside the machine)."""
    kernel = Kernel(cpus=4, seed=0)
    a = kernel.spawn("a")
    posts = _count_posts(kernel)
    done: list = []
    with kernel.lock:
        _chain(kernel, a, 300, done)()
        while len(done) < 300:
            kernel.run_slice()
    assert done == [a.pid] * 300
    assert posts[0] == 1        # 5: it slept every MAX_TURN_CALLS calls


def test_a_task_queued_on_a_busy_cpu_runs_within_max_turn_calls():
    """A forked child waits on its parent's CPU's run queue while the parent goes on:
    after MAX_TURN_CALLS calls in which the CPU ran no other task, the parent sleeps
    and the child runs."""
    kernel = Kernel(cpus=1, seed=0)
    parent = kernel.spawn("parent")
    done: list = []
    child_done: list = []

    def forked(req):
        kernel.submit(kernel.tasks[req.result], "getpid",
                      on_done=lambda r: child_done.append(len(done)))
        _chain(kernel, parent, 300, done)()
    with kernel.lock:
        kernel.submit(parent, "fork", on_done=forked)
        while len(done) < 300 or not child_done:
            kernel.run_slice()
    assert child_done and child_done[0] <= kernel.MAX_TURN_CALLS + 1


def test_the_workloads_tasks_never_sleep_between_calls_with_a_cpu_each():
    """On 8 CPUs the workload's three workers each have a CPU; their children wait on
    it, and run whenever a worker waits for them: no worker is ever put to sleep between
    two calls (the posts are the three first calls, from outside the machine)."""
    k = Kernel(cpus=8, seed=0)
    w = Workload(k, seed=0)
    w.run(300)
    posts = _count_posts(k)
    w.run(3000)
    assert posts[0] <= 3        # 17 while a run ended at MAX_TURN_CALLS whoever ran


def test_on_one_cpu_background_chains_take_turns_and_an_awaited_call_gets_in():
    """A chain that goes on in its turn leaves the CPU to the other tasks woken meanwhile
    once the turn has run MIN_TURN_CALLS calls, and at once for a call someone waits
    for."""
    kernel = Kernel(cpus=1, seed=0)
    a, b, c = kernel.spawn("a"), kernel.spawn("b"), kernel.spawn("c")
    done_a: list = []
    done_b: list = []
    with kernel.lock:
        _chain(kernel, a, 10**6, done_a)()
        _chain(kernel, b, 10**6, done_b)()
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            kernel.run_slice()
        assert len(done_a) > 20 and len(done_b) > 20
        assert 0.3 < len(done_a) / len(done_b) < 3
        _awaited_call_gets_in(kernel, c)


def test_a_dead_tasks_window_is_flushed_from_the_tlb_before_it_is_used_again(kernel):
    """An exit no longer flushes the TLB: new tasks take windows not used since the last
    flush while there are (WINDOW_POOL of them), and a dead task's window is taken again
    only after a flush.  Each task's writes carry its own data, whichever window it has."""
    from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR
    flushes = []
    flush = kernel.mem.flush_tlb
    kernel.mem.flush_tlb = lambda: (flushes.append(len(seen)), flush())
    kernel.WINDOW_POOL = kernel._next_window + 2
    sh = kernel.spawn("sh")
    seen = []
    for i in range(8):
        pid = kernel.syscall(sh, "fork")
        task = kernel.tasks[pid]
        seen.append(task.window)
        path = f"/tmp/tlb{i}"
        fd = kernel.syscall(task, "openat", AT_FDCWD, path, O_CREAT | O_RDWR, 0o644)
        assert kernel.syscall(task, "write", fd, f"data{i}".encode(), 5) == 5
        assert kernel.syscall(task, "lseek", fd, 0, 0) == 0
        buf = UserBuffer(5)
        assert kernel.syscall(task, "read", fd, buf, 5) == 5 and buf.data == f"data{i}".encode()
        kernel.submit(task, "exit", 0)
        assert kernel.syscall(sh, "wait4", pid, 0, 0, 0) == pid
    # windows reused only once every one made was used, each reuse after a flush
    assert len(set(seen)) < len(seen)
    assert flushes and len(flushes) < len(seen)
    for at in flushes:
        assert seen[at] in seen[:at]        # the flush came for a window used before


_CALL_RANGE_CHECK = r"""
import sys
from kprobefs.machine import Kernel
machines = [Kernel(cpus=1, seed=0), Kernel(cpus=8, seed=0)]
lib, buffers = None, []
for line in open("/proc/self/maps"):
    fields = line.split()
    begin, end = (int(x, 16) for x in fields[0].split("-"))
    if fields[1] == "r-xp" and "libunicorn" in line:
        lib = (begin, end)
    elif fields[1] == "rwxp" and end - begin >= Kernel.TCG_BUFFER_SIZE // 2:
        buffers.append((begin, end))
print(len(buffers), max(max(abs(e - lib[0]), abs(lib[1] - b)) for b, e in buffers))
"""


def test_every_machines_translated_code_is_within_call_range_of_unicorn():
    """QEMU calls its helpers (memory access, TB lookup) with a direct call only from
    code within 2 GiB of them; a machine whose code buffer lay farther emulated about a
    tenth slower.  Two machines in one process both stay in range."""
    out = subprocess.run([sys.executable, "-c", _CALL_RANGE_CHECK], capture_output=True,
                         text=True, check=True, timeout=120).stdout.split()
    count, farthest = int(out[0]), int(out[1])
    assert count == 2
    assert farthest < 2 << 30


def test_the_translated_code_a_machine_keeps_is_bounded():
    """Under probe churn the code buffer fills with retranslations until it is flushed,
    so its size is what the daemon's RSS grows by (docs/architecture.md): at 128 MiB a
    soak's RSS was still growing after ten minutes."""
    assert Kernel.TCG_BUFFER_SIZE <= 16 << 20
    k = Kernel(cpus=1, seed=0)
    try:
        assert k.uc.ctl_get_tcg_buffer_size() == Kernel.TCG_BUFFER_SIZE
    finally:
        k.close()


def test_a_machine_whose_translations_overflow_their_buffer_runs_the_same(monkeypatch):
    """Unicorn's smallest code buffer (1 MiB) fills during boot and the workload: it is
    flushed and refilled, and each of the workload's tasks makes the same calls with the
    same outcomes as in a machine with room.  (How the tasks interleave follows the
    timer, which follows the host's clock: a busy host moves a call from one task's
    turn to another's, so what a directory listing finds and how the calls split
    between the tasks are not compared.)"""
    def run():
        k = Kernel(cpus=2, seed=3)
        w = Workload(k, seed=3)
        w.run(1500)
        calls = {}
        for comm, name, result in w.results:
            calls.setdefault(comm, []).append((name, result < 0))
        return calls, k.uc.ctl_get_tcg_buffer_size()

    roomy, size = run()
    assert size == Kernel.TCG_BUFFER_SIZE
    monkeypatch.setattr(Kernel, "TCG_BUFFER_SIZE", 1 << 20)
    tight, size = run()
    assert size == 1 << 20
    assert roomy.keys() == tight.keys()
    for comm, calls in roomy.items():
        n = min(len(calls), len(tight[comm]))
        assert calls[:n] == tight[comm][:n], comm
    assert sum(min(len(c), len(tight[k])) for k, c in roomy.items()) > 1000


def test_an_upcall_runs_while_a_workload_keeps_every_cpu_busy():
    """A workload past what the machine can do wakes a task at each idle loop, so no
    CPU ever idles; an upcall is taken there before the next wake-up, and does not
    wait for the workload to stop (it waited for ever: a daemon's mirror of a host
    exec, and with it the next request, stalled for seconds to minutes)."""
    k = Kernel(cpus=2, seed=0)
    w = Workload(k, seed=0, rate=1e6)
    k.periodic.append(w.pump)
    k.drive_waits = True
    k.serve()
    try:
        time.sleep(0.5)
        before = w.completed
        for _ in range(3):
            assert k.upcall("kprobe_bench_loop", 0, 1, timeout=5) == 0
        assert w.completed > before
    finally:
        k.close()
