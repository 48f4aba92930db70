"""Fetch programs: interpretation, record encoding, trace text and the format file."""

import struct
import time

import pytest

from kprobefs.tracing.events import fetch
from kprobefs.tracing.events.fetch import (
    FetchFault, encode_args, format_event_format, print_args, run,
)
from kprobefs.tracing.events.probe_parser import parse_command

KBASE = 0xFFFF888000001000        # kernel data
STACK = 0xFFFFC90000004000        # a 16 KiB-aligned kernel stack
SP = STACK + 0x3F00               # 32 longs below the top of the stack
UBASE = 0x00007FFF00001000        # user data
VFS_READ = 0xFFFFFFFF81200000
JIFFIES = 0xFFFFFFFF82000000


class FakeSymbols:
    table = {"vfs_read": (VFS_READ, 0x1A0), "jiffies": (JIFFIES, 8),
             "ksys_read": (0xFFFFFFFF81201000, 0xF0)}

    def lookup(self, name):
        return [self.table[name][0]] if name in self.table else []

    def find_symbol(self, addr):
        for name, (start, size) in self.table.items():
            if start <= addr < start + size:
                return name, addr - start, size
        return None

    def hash_pointer(self, addr):
        return 0x12345678


SYMS = FakeSymbols()


def symbolize(addr):
    found = SYMS.find_symbol(addr)
    return None if found is None else f"{found[0]}+0x{found[1]:x}/0x{found[2]:x}"


class FakeCtx:
    """Registers and memory of one probe hit; unmapped reads raise FetchFault."""

    def __init__(self, regs=None, kmem=None, umem=None, retval=0, ret_ip=0, comm="bash"):
        self.regs = {name: 0 for name in ("r15", "r14", "r13", "r12", "r11", "r10", "r9",
                                          "r8", "bx", "cx", "dx", "si", "di", "bp", "ax",
                                          "orig_ax", "ip", "cs", "flags", "sp", "ss")}
        self.regs["sp"] = SP
        self.regs.update(regs or {})
        self.kmem = dict(kmem or {})
        self.umem = dict(umem or {})
        self._retval = retval
        self._ret_ip = ret_ip
        self._comm = comm

    @staticmethod
    def _read(regions, addr, size):
        for base, data in regions.items():
            if base <= addr and addr + size <= base + len(data):
                return data[addr - base:addr - base + size]
        raise FetchFault(hex(addr))

    @staticmethod
    def _read_string(regions, addr, max_len):
        for base, data in regions.items():
            if base <= addr < base + len(data):
                rest = data[addr - base:]
                end = rest.find(b"\0")
                if end < 0:
                    raise FetchFault(hex(addr))
                return rest[:min(end, max_len - 1)]
        raise FetchFault(hex(addr))

    def reg(self, name):
        return self.regs[name]

    def stack_pointer(self):
        return self.regs["sp"]

    def read_kernel(self, addr, size):
        return self._read(self.kmem, addr, size)

    def read_user(self, addr, size):
        return self._read(self.umem, addr, size)

    def read_kernel_string(self, addr, max_len):
        return self._read_string(self.kmem, addr, max_len)

    def read_user_string(self, addr, max_len):
        return self._read_string(self.umem, addr, max_len)

    def comm(self):
        return self._comm

    def retval(self):
        return self._retval

    def ret_ip(self):
        return self._ret_ip

    def symbolize(self, addr):
        return symbolize(addr)


def q(*values):
    return b"".join(struct.pack("<Q", v & (1 << 64) - 1) for v in values)


def make_ctx():
    stack = bytearray(0x4000)
    for i in range(32):
        struct.pack_into("<Q", stack, 0x3F00 + 8 * i, 0x1000 + i)
    kdata = bytearray(0x200)
    kdata[0:16] = bytes(range(0xF0, 0x100))                       # +0: bytes f0..ff
    kdata[0x20:0x28] = struct.pack("<Q", KBASE + 0x80)             # pointer to "hello"
    kdata[0x28:0x30] = struct.pack("<Q", KBASE + 0x90)             # pointer to "world"
    kdata[0x30:0x38] = struct.pack("<Q", 0xDEAD000000000000)       # bad pointer
    kdata[0x80:0x86] = b"hello\0"
    kdata[0x90:0x96] = b"world\0"
    kdata[0xA0:0xA8] = struct.pack("<Q", VFS_READ + 0x10)
    return FakeCtx(
        regs={"di": KBASE, "si": UBASE, "dx": 0xFFFFFFFFFFFFFFFE, "cx": 3, "r8": 8,
              "r9": 9, "ax": 0x1234, "ip": VFS_READ + 1, "bp": JIFFIES},
        kmem={STACK: bytes(stack), KBASE: bytes(kdata), JIFFIES: q(0x100000123)},
        umem={UBASE: b"/dev/null\0" + q(UBASE)},
        retval=-2, ret_ip=0xFFFFFFFF81201075, comm="cat")


def trace_text(line, ctx=None):
    spec = parse_command(line, SYMS)
    ctx = ctx or make_ctx()
    header = (fetch.KRETPROBE_HEADER_SIZE if spec.is_return else fetch.KPROBE_HEADER_SIZE)
    record = bytes(header) + encode_args(spec.programs, ctx, is_return=spec.is_return)
    return print_args(spec.args, record, symbolize, is_return=spec.is_return)


# --------------------------------------------------------------------- every type

@pytest.mark.parametrize("arg, text", [
    ("%dx", "0xfffffffffffffffe"),
    ("%dx:x64", "0xfffffffffffffffe"),
    ("%dx:x32", "0xfffffffe"),
    ("%dx:x16", "0xfffe"),
    ("%dx:x8", "0xfe"),
    ("%dx:u64", "18446744073709551614"),
    ("%dx:u32", "4294967294"),
    ("%dx:u16", "65534"),
    ("%dx:u8", "254"),
    ("%dx:s64", "-2"),
    ("%dx:s32", "-2"),
    ("%dx:s16", "-2"),
    ("%dx:s8", "-2"),
    ("%cx:s8", "3"),
    ("%ax:x8", "0x34"),
    ("%ip:symbol", "vfs_read+0x1/0x1a0"),
    ("%ax:symbol", "0x1234"),
    ("+0xa0(%di):symbol", "vfs_read+0x10/0x1a0"),
    ("+0(%di):x8", "0xf0"),
    ("+0(%di):u16", "61936"),
    ("+0(%di):s16", "-3600"),
    ("+0(%di):x32", "0xf3f2f1f0"),
    ("+1(%di):x64", "0xf8f7f6f5f4f3f2f1"),
    ("-8(%bp)", "0x0"),                         # fault: no memory before jiffies
    ("@jiffies", "0x100000123"),
    ("@jiffies:u32", "291"),
    ("@0xffffffff82000000:x16", "0x123"),
    ("@jiffies+4:u32", "1"),
    ("@jiffies-0x10", "0x0"),
    ("\\0x10", "0x10"),
    ("\\-1:s32", "-1"),
    ("\\+5:u8", "5"),
    ("$stack", hex(SP)),
    ("$stack0", "0x1000"),
    ("$stack31", "0x101f"),
    ("$stack32", "0x0"),                         # past the top of the 16 KiB stack
    ("+0($stack):x16", "0x1000"),
    ("$arg1", hex(KBASE)),
    ("$arg3", "0xfffffffffffffffe"),
    ("$arg4", "0x3"),
    ("$arg5", "0x8"),
    ("$arg6", "0x9"),
    ("$arg7", "0x1001"),
    ("$arg8:u8", "2"),
    ("a0", hex(KBASE)),
    ("a6", "0x1001"),
    ("s1", "0x1001"),
    ("sa", hex(SP)),
    ("+0(+0x20(%di)):x8", "0x68"),
])
def test_numeric_fetch_and_print(arg, text):
    assert trace_text(f"p vfs_read x={arg}") == f" x={text}"


@pytest.mark.parametrize("arg, text", [
    ("+0x80(%di):string", '"hello"'),
    ("+0(+0x20(%di)):string", '"hello"'),
    ("+0x20(%di):string[2]", '{"hello","world"}'),
    ("+0x20(%di):string[3]", '{"hello","world",(fault)}'),
    ("+0x28(%di):string[1]", '{"world"}'),
    ("+0x30(%di):string", '""'),               # an empty string is not a fault
    ("+0(+0x30(%di)):string", "(fault)"),
    ("+0x200(%di):string", "(fault)"),
    ("+0(%si):string", '"/dev/null"'),          # below TASK_SIZE a kernel read is the user's
    ("+0(%si):ustring", '"/dev/null"'),
    ("+u0(%si):string", '"/dev/null"'),
    ("+u0(%di):string", "(fault)"),
    ("+u10(%si):x64", hex(UBASE)),
    ("+u0(+u10(%si)):ustring", '"/dev/null"'),
    ("$comm", '"cat"'),
    ("$COMM:string", '"cat"'),
    ('\\"imm"', '"imm"'),
    ("\\0xffff888000001080:string", '"hello"'),
    ("%ip:symstr", '"vfs_read+0x1/0x1a0"'),
    ("%ax:symstr", '"0x1234"'),
    ("+0xa0(%di):symstr", '"vfs_read+0x10/0x1a0"'),
    ("+0(%di):x8[4]", "{0xf0,0xf1,0xf2,0xf3}"),
    ("+0(%di):u16[2]", "{61936,62450}"),
    ("+0(%di):s8[2]", "{-16,-15}"),
    ("+0x1fe(%di):x8[4]", "{0x0,0x0,0x0,0x0}"),  # runs off the mapping
    ("+0(%di):b4@4/8", "15"),
    ("+0(%di):b4@0/8", "0"),
    ("+1(%di):b3@1/8", "0"),
    ("+1(%di):b3@4/8", "7"),
    ("+0(%di):b12@4/16", "3871"),
    ("+0(%di):b4@4/8[3]", "{15,15,15}"),
])
def test_string_array_bitfield_fetch_and_print(arg, text):
    assert trace_text(f"p vfs_read x={arg}") == f" x={text}"


def test_return_probe_values():
    ctx = make_ctx()
    assert trace_text("r vfs_read $retval rv ra ret=$retval:s32", ctx) == (
        " arg1=0xfffffffffffffffe arg2=0xfffffffffffffffe arg3=0xffffffff81201075 ret=-2")


def test_old_spelling_example():
    assert trace_text("p:myprobe vfs_read a0 a1 a2 a3") == (
        f" arg1={hex(KBASE)} arg2={hex(UBASE)} arg3=0xfffffffffffffffe arg4=0x3")


def test_string_array_without_pointer_load():
    # Linux has no pointer to step for an immediate's string array: later elements fault.
    assert trace_text("p vfs_read x=\\0xffff888000001080:string[2]") == ' x={"hello",(fault)}'


# ------------------------------------------------------------------- record layout

def test_record_layout_is_packed_with_data_locs():
    spec = parse_command("p vfs_read a=%ax:u8 s=+0x80(%di):string b=%cx t=$comm "
                         "f=+0x200(%di):string", SYMS)
    data = encode_args(spec.programs, make_ctx())
    # fixed part: u8 @16, data_loc @17, u64 @21, data_loc @29, data_loc @33 -> 37 bytes
    a, s_loc, b, t_loc, f_loc = struct.unpack_from("<BIQII", data)
    assert (a, b) == (0x34, 3)
    assert s_loc == (6 << 16) | 37
    assert t_loc == (4 << 16) | 43
    assert f_loc == (0 << 16) | 47
    assert data[37 - 16:] == b"hello\0cat\0"
    fields = fetch.build_record_fields(spec.args, spec.is_return)
    assert [(f.name, f.offset, f.size) for f in fields] == [
        ("__probe_ip", 8, 8), ("a", 16, 1), ("s", 17, 4), ("b", 21, 8), ("t", 29, 4),
        ("f", 33, 4)]


def test_kretprobe_data_loc_counts_the_longer_header():
    spec = parse_command("r vfs_read s=$comm", SYMS)
    data = encode_args(spec.programs, make_ctx(), is_return=True)
    assert struct.unpack_from("<I", data)[0] == (4 << 16) | 28


def test_long_strings_are_cut_to_4095_bytes():
    text = b"x" * 5000 + b"\0"
    ctx = make_ctx()
    ctx.kmem[0xFFFF888000100000] = text
    spec = parse_command("p vfs_read s=+0(%ax):string", SYMS)
    ctx.regs["ax"] = 0xFFFF888000100000
    data = encode_args(spec.programs, ctx)
    assert struct.unpack_from("<I", data)[0] >> 16 == 4096


def test_run_returns_python_values():
    ctx = make_ctx()
    program = parse_command("p vfs_read +0(%di):x8[2]", SYMS).args[0].program
    assert run(program, ctx) == (0xF0, 0xF1)
    program = parse_command("p vfs_read +0(+0x30(%di)):string", SYMS).args[0].program
    assert run(program, ctx) is None
    program = parse_command("p vfs_read +0x80(%di):string", SYMS).args[0].program
    assert run(program, ctx) == b"hello"


# ---------------------------------------------------------------------- format file

FORMAT_EXAMPLE = (
    "name: myprobe\n"
    "ID: 1873\n"
    "format:\n"
    "\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n"
    "\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n"
    "\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;\n"
    "\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n"
    "\n"
    "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n"
    "\tfield:u64 file;\toffset:16;\tsize:8;\tsigned:0;\n"
    "\tfield:u32 count;\toffset:24;\tsize:4;\tsigned:0;\n"
    "\tfield:__data_loc char[] name;\toffset:28;\tsize:4;\tsigned:1;\n"
    "\tfield:u8 flag;\toffset:32;\tsize:1;\tsigned:0;\n"
    "\tfield:u64 sym;\toffset:33;\tsize:8;\tsigned:0;\n"
    "\tfield:u8 arr[];\toffset:41;\tsize:2;\tsigned:0;\n"
    "\n"
    'print fmt: "(%lx) file=0x%Lx count=%u name=\\"%s\\" flag=%u sym=%pS arr={0x%x,0x%x}", '
    "REC->__probe_ip, REC->file, REC->count, __get_str(name), REC->flag, REC->sym, "
    "REC->arr[0], REC->arr[1]\n"
)


def test_format_file_golden():
    spec = parse_command("p:myprobe vfs_read file=%di count=%dx:u32 name=+0(%si):string "
                         "flag=+8(%di):b3@2/8 sym=%ip:symbol arr=+0(%di):x8[2]", SYMS)
    assert format_event_format("myprobe", 1873, spec) == FORMAT_EXAMPLE


def test_format_file_kretprobe_golden():
    spec = parse_command("r:myretprobe vfs_read ret=$retval:s64", SYMS)
    text = format_event_format("myretprobe", 7, spec)
    assert text.split("\n\n", 1)[1] == (
        "\tfield:unsigned long __probe_func;\toffset:8;\tsize:8;\tsigned:0;\n"
        "\tfield:unsigned long __probe_ret_ip;\toffset:16;\tsize:8;\tsigned:0;\n"
        "\tfield:s64 ret;\toffset:24;\tsize:8;\tsigned:1;\n"
        "\n"
        'print fmt: "(%lx <- %lx) ret=%Ld", REC->__probe_func, REC->__probe_ret_ip, REC->ret\n')


def test_format_file_string_arrays_and_every_fmt():
    spec = parse_command("p:ev vfs_read s=+0(%di):string[2] a=%ax:s8 b=%ax:s16 c=%ax:s32 "
                         "d=%ax:u64 e=%ax:x16 f=%ax:symstr g=+0(%si):ustring", SYMS)
    text = format_event_format("ev", 9, spec)
    assert "\tfield:__data_loc char[][2] s;\toffset:16;\tsize:8;\tsigned:1;\n" in text
    assert "\tfield:s16 b;\toffset:25;\tsize:2;\tsigned:1;\n" in text
    assert text.endswith(
        'print fmt: "(%lx) s={\\"%s\\",\\"%s\\"} a=%d b=%d c=%d d=%Lu e=0x%x f=\\"%s\\" '
        'g=\\"%s\\"", REC->__probe_ip, __get_str(s[0]), __get_str(s[1]), REC->a, REC->b, '
        "REC->c, REC->d, REC->e, __get_str(f), __get_str(g)\n")


def test_format_file_without_args():
    spec = parse_command("p:ev vfs_read", SYMS)
    assert format_event_format("ev", 1, spec).endswith(
        "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n\n"
        'print fmt: "(%lx)", REC->__probe_ip\n')


# --------------------------------------------------------------------------- speed

def test_encode_is_fast():
    spec = parse_command("p vfs_read a=%di b=+8(%di):u32 c=$arg3 d=+0x80(%di):string", SYMS)
    ctx = make_ctx()
    programs = spec.programs
    encode_args(programs, ctx)
    rounds = 2000
    start = time.perf_counter()
    for _ in range(rounds):
        encode_args(programs, ctx)
    per_call = (time.perf_counter() - start) / rounds
    assert per_call < 100e-6       # generous bound for slow CI; typically a few µs
