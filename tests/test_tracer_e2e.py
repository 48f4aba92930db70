"""The tracer on the real engine and kernel, without FUSE: kprobe_events written through
the tracefs file objects, probes hit by real system calls, values read back from
`trace` for every kind of fetch argument."""

import os
import re

import pytest

from kprobefs import Kernel
from kprobefs.machine import UserBuffer
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR
from kprobefs.tracing import Tracer


@pytest.fixture
def sysfs():
    kernel = Kernel(cpus=2, seed=0)
    made = []

    def create_dir(name, parent):
        handle = kernel.call_in_process("tracefs_create_dir", name, parent or 0)
        made.append(name)
        return handle

    tracer = Tracer(kernel.kprobes, kernel, clock=kernel.clock_ns, create_dir_hook=create_dir)
    return kernel, tracer, tracer.tracefs_root(), made


def node(root, path):
    n = root
    for part in path.split("/"):
        n = n.children()[part]
    return n


def write(root, path, data, flags=os.O_WRONLY | os.O_APPEND):
    h = node(root, path).open(flags, 1, "sh")
    try:
        return h.write(data.encode() if isinstance(data, str) else data, 0)
    finally:
        h.release()


def read(root, path):
    h = node(root, path).open(os.O_RDONLY, 1, "cat")
    try:
        out, off = b"", 0
        while chunk := h.read(4096, off):
            out += chunk
            off += len(chunk)
        return out.decode("latin-1")
    finally:
        h.release()


def trace_lines(root, event):
    return [line for line in read(root, "trace").splitlines()
            if not line.startswith("#") and f" {event}: " in line]


def test_event_creation_calls_tracefs_create_dir(sysfs):
    kernel, tracer, root, made = sysfs
    write(root, "kprobe_events", "p:mygrp/myevent vfs_read\n")
    assert made == ["mygrp", "myevent"]
    assert "myevent" in node(root, "events/mygrp").children()
    assert read(root, "kprobe_events") == "p:mygrp/myevent vfs_read\n"
    assert "vfs_read+0x0    [DISABLED][FTRACE]" in kernel.kprobes.list_text()


def test_fetch_args_on_real_kernel_data(sysfs):
    kernel, tracer, root, _ = sysfs
    write(root, "kprobe_events",
          "p:rd vfs_read file=%di count=%dx:u32 buf=$arg2 first=+0(%si):u8 "
          "ret=$stack0:symbol comm=$comm\n"
          "r:rdret vfs_read rv=$retval:s64\n"
          "p:op do_sys_openat2 path=+0(%si):ustring upath=+u0(%si):string "
          "dfd=%di:s32 nib=+u0(%si):b4@4/8 kbytes=+0(%si):x8\n"
          "p:ban vfs_read banner=@linux_proc_banner:string\n"
          "p:jif vfs_read j=@jiffies:x64 ent=+0(@init_task):s64\n")
    write(root, "events/enable", "1")
    t = kernel.spawn("readme")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/hello", O_CREAT | O_RDWR, 0o644)
    kernel.syscall(t, "write", fd, b"Hi there", 8)
    kernel.syscall(t, "lseek", fd, 0, 0)
    buf = UserBuffer(8, b"*" * 8)                 # what the buffer holds at entry
    assert kernel.syscall(t, "read", fd, buf, 8) == 8
    (rd,) = trace_lines(root, "rd")
    assert rd.lstrip().startswith(f"readme-{t.pid} ")
    m = re.search(r"rd: \(vfs_read\+0x0/0x[0-9a-f]+\) file=0x([0-9a-f]+) count=8 "
                  r"buf=0x([0-9a-f]+) first=42 ret=(ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+) "
                  r'comm="readme"$', rd)
    assert m, rd
    assert int(m.group(2), 16) == buf.addr        # the user buffer read() was given
    (rdret,) = trace_lines(root, "rdret")
    assert re.search(r"rdret: \(ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+ <- vfs_read\) rv=8$",
                     rdret), rdret
    (op,) = trace_lines(root, "op")
    assert op.endswith('path="/tmp/hello" upath="/tmp/hello" dfd=-100 '
                       "nib=2 kbytes=0x2f"), op  # below TASK_SIZE, a kernel read is the user's
    (ban,) = trace_lines(root, "ban")
    version = kernel.proc_version()
    assert 'banner="%s version %s (kprobefs@emulator) (' in ban
    (jif,) = trace_lines(root, "jif")
    assert re.search(r"j=0x[0-9a-f]{8,} ent=0$", jif), jif      # init_task.__state == 0
    assert version.startswith("Linux version 6.1.0-kprobefs (kprobefs@emulator) (")


def test_fault_while_fetching_records_fault(sysfs):
    kernel, tracer, root, _ = sysfs
    write(root, "kprobe_events", "p:bad do_sys_openat2 path=+0(%si):ustring "
          "kbad=+0(%di):string\n")
    write(root, "events/kprobes/bad/enable", "1")
    t = kernel.spawn("faulty")
    assert kernel.syscall(t, "openat", AT_FDCWD, 0x10, 0, 0) == -14   # EFAULT
    (line,) = trace_lines(root, "bad")
    assert line.endswith("path=(fault) kbad=(fault)"), line


@pytest.mark.parametrize("native", [False, True])
def test_kernel_fetch_below_task_size_reads_user_memory(native):
    """x86's address spaces do not overlap: 6.1's probe_mem_read and fetch_store_string
    read user memory for an address below TASK_SIZE, so a plain `string` of
    do_sys_open's filename records the name (and a kernel address still reads kernel
    memory).  Both recorders: the kernel's (default clock) and the host's."""
    kernel = Kernel(cpus=2, seed=0)
    tracer = Tracer(kernel.kprobes, kernel, **({} if native else {"clock": kernel.clock_ns}))
    assert (tracer.native is not None) == native
    root = tracer.tracefs_root()
    # c0 and r0 come after a string: their stores must not reach the string's bytes.
    write(root, "kprobe_events", "p:myopen do_sys_open file=+0(%si):string "
          "c0=+0(%si):u8 r0=%di:u8 ban=@linux_proc_banner:string\n")
    write(root, "events/kprobes/myopen/enable", "1")
    t = kernel.spawn("opener")
    kernel.syscall(t, "openat", AT_FDCWD, "/tmp/by-name", O_CREAT | O_RDWR, 0o644)
    kernel.syscall(t, "openat", AT_FDCWD, 0x10, 0, 0)
    lines = trace_lines(root, "myopen")
    assert len(lines) == 2
    assert 'file="/tmp/by-name" c0=47 r0=156 ban="%s version %s (kprobefs@emulator) ' \
        in lines[0], lines[0]
    assert "file=(fault) c0=0 r0=156 ban=" in lines[1], lines[1]


def test_return_probe_and_profile_counts(sysfs):
    kernel, tracer, root, _ = sysfs
    write(root, "kprobe_events", "r:myretprobe do_sys_open rv ra\n"
          "p:myprobe do_sys_open a0 a1 a2 a3\n")
    write(root, "events/kprobes/enable", "1")
    t = kernel.spawn("opener")
    for _ in range(3):
        kernel.syscall(t, "open", "/tmp/x", O_CREAT | O_RDWR, 0o600)
    lines = trace_lines(root, "myprobe")
    assert len(lines) == 3
    # Unnamed args are named argN; open(2) adds O_LARGEFILE (0x8000) to the flags.
    assert all(re.search(r"arg1=0xffffff9c arg2=0x[0-9a-f]+ arg3=0x8042 arg4=0x180$", line)
               for line in lines), lines
    rets = trace_lines(root, "myretprobe")
    assert [re.search(r"arg1=0x([0-9a-f]+) arg2=0x[0-9a-f]+$", line).group(1)
            for line in rets] == ["0", "1", "2"]
    profile = read(root, "kprobe_profile").splitlines()
    assert any(re.match(r"\s+myprobe\s+3\s+0$", line) for line in profile), profile
    assert any(re.match(r"\s+myretprobe\s+3\s+0$", line) for line in profile), profile


def test_more_fetch_kinds_and_types(sysfs):
    """Stack slots, immediates, symbol strings, kernel arrays, and every integer
    rendering, on one real hit of vfs_read."""
    kernel, tracer, root, _ = sysfs
    write(root, "kprobe_events",
          "p:kinds vfs_read sp=$stack s0=$stack0:symbol s1=$stack1 imm=\\123 neg=\\-5:s8 "
          'str=\\"hello" ss=$stack0:symstr ip=%ip:symbol cnt8=%dx:u8 cnt16=%dx:x16 '
          "cnts=%dx:s64 b=%dx:b3@1/8 arr=+0(%di):x8[4] arrw=+0(%di):u16[2] "
          "old0=s0 olda=sa\n")
    write(root, "events/kprobes/kinds/enable", "1")
    t = kernel.spawn("kinds")
    fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/k", O_CREAT | O_RDWR, 0o644)
    assert kernel.syscall(t, "read", fd, UserBuffer(6), 6) == 0
    (line,) = trace_lines(root, "kinds")
    m = re.search(r"kinds: \(vfs_read\+0x0/0x[0-9a-f]+\) sp=0x(?P<sp>[0-9a-f]+) "
                  r"s0=(?P<s0>ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+) s1=0x[0-9a-f]+ imm=0x7b "
                  r'neg=-5 str="hello" ss="(?P<ss>ksys_read\+0x[0-9a-f]+/0x[0-9a-f]+)" '
                  r"ip=vfs_read\+0x1/0x[0-9a-f]+ cnt8=6 cnt16=0x6 cnts=6 b=3 "
                  r"arr=\{(0x[0-9a-f]+,){3}0x[0-9a-f]+\} arrw=\{\d+,\d+\} "
                  r"old0=0x(?P<old0>[0-9a-f]+) olda=0x(?P<sa>[0-9a-f]+)$", line)
    assert m, line
    assert m.group("s0") == m.group("ss")                  # symbol and symstr agree
    assert m.group("sp") == m.group("sa")                  # $stack and the old `sa`
    (ksys,) = kernel.image.lookup_name("ksys_read")
    s0 = int(m.group("old0"), 16)                          # the old `s0` = $stack0
    assert ksys.addr < s0 < ksys.end
    assert kernel.image.format_address(s0) == m.group("s0")
