"""Tests for kprobefs.arch.x86.insn: decode, boundaries, copy rules, boosting, relocation,
single-step fixups, emulation and the jump-optimization check.

Instruction bytes come from the GNU assembler (``as --64`` + ``objcopy -O binary``) run
inside the test, or from ``.byte`` lines where the encoding itself is the point.  Behaviour
is cross-checked against unicorn executing the original instruction.
"""

import dataclasses
import errno
import functools
import os
import subprocess
import tempfile

import capstone
import pytest
from unicorn import UC_ARCH_X86, UC_HOOK_CODE, UC_MODE_64, Uc
from unicorn import x86_const as ux

from kprobefs.arch.x86.insn import (
    GPR_NAMES,
    EmulateOp,
    Insn,
    InsnDecodeError,
    InsnKind,
    OptimizePlan,
    can_boost,
    can_optimize,
    check_boundary,
    copy_instruction,
    decode,
    emulate,
    fixup_after_singlestep,
    iter_insns,
    prepare_copy,
    relocate,
    synthesize_relcall,
    synthesize_reljump,
)
from kprobefs.errors import KprobefsError, ProbeError

KTEXT = 0xFFFFFFFF81000000          # where pure tests place code
# Unicorn runs without paging, so executed code lives in the low canonical half.
UC_CODE = 0x7FFF81000000
UC_FAR = 0x7FFFA0000000             # a copy 512 MiB away from UC_CODE
UC_DATA = UC_CODE - 0x40000000       # reachable by disp32 from both
UC_STACK = 0x7FFF90000000
UC_SIZE = 0x10000


@functools.lru_cache(maxsize=None)
def asm(source: str) -> bytes:
    """Assemble AT&T ``source`` with GNU as and return the raw .text bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        src, obj, out = (os.path.join(tmp, n) for n in ("a.s", "a.o", "a.bin"))
        with open(src, "w") as f:
            f.write(".text\n" + source + "\n")
        subprocess.run(["as", "--64", "-o", obj, src], check=True, capture_output=True)
        subprocess.run(["objcopy", "-O", "binary", "-j", ".text", obj, out],
                       check=True, capture_output=True)
        with open(out, "rb") as f:
            return f.read()


def insn_of(source: str, address: int = KTEXT) -> Insn:
    code = asm(source)
    insn = decode(code, address)
    assert insn.length == len(code), f"{source!r} is not one instruction"
    return insn


_md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_md.detail = True


def cs_rip_target(code: bytes, address: int) -> int:
    """Absolute address of the RIP-relative memory operand, per capstone alone."""
    cs_insn = next(_md.disasm(code, address, count=1))
    assert cs_insn.size == len(code)
    mem = [op.mem for op in cs_insn.operands if op.type == capstone.x86.X86_OP_MEM]
    assert mem and mem[0].base == capstone.x86.X86_REG_RIP
    return (address + cs_insn.size + mem[0].disp) & (2**64 - 1)


# ---------------------------------------------------------------- unicorn harness

_UC_REGS = {name: getattr(ux, "UC_X86_REG_" + (name if name[1:].isdigit() else "r" + name).upper())
            for name in GPR_NAMES}


def make_uc(code_at: dict[int, bytes], regs: dict[str, int] = (), data: bytes = b"") -> Uc:
    mu = Uc(UC_ARCH_X86, UC_MODE_64)
    for base in (UC_CODE, UC_FAR, UC_DATA, UC_STACK):
        mu.mem_map(base, UC_SIZE)
    for addr, code in code_at.items():
        mu.mem_write(addr, code)
    mu.mem_write(UC_DATA, data)
    mu.reg_write(ux.UC_X86_REG_RSP, UC_STACK + 0x8000)
    mu.reg_write(ux.UC_X86_REG_EFLAGS, 0x202)
    for name, value in dict(regs).items():
        reg = ux.UC_X86_REG_EFLAGS if name == "flags" else _UC_REGS[name]
        mu.reg_write(reg, value)
    return mu


def run_uc(mu: Uc, start: int, until: int = None, count: int = 0) -> None:
    mu.emu_start(start, until if until is not None else 0, count=count)


def uc_state(mu: Uc) -> dict:
    state = {name: mu.reg_read(reg) for name, reg in _UC_REGS.items()}
    state["ip"] = mu.reg_read(ux.UC_X86_REG_RIP)
    state["flags"] = mu.reg_read(ux.UC_X86_REG_EFLAGS)
    state["stack"] = bytes(mu.mem_read(UC_STACK + 0x7F00, 0x200))
    return state


class Regs:
    """An EmulateRegs implementation over a dict of registers and a bytearray stack."""

    def __init__(self, ip, regs=(), flags=0x202):
        self.gpr = {name: 0 for name in GPR_NAMES}
        self.gpr.update(dict(regs))
        self.gpr["sp"] = self.gpr["sp"] or UC_STACK + 0x8000
        self.ip = ip
        self.flags = flags
        self.stack = bytearray(UC_SIZE)

    sp = property(lambda s: s.gpr["sp"], lambda s, v: s.gpr.__setitem__("sp", v))
    cx = property(lambda s: s.gpr["cx"], lambda s, v: s.gpr.__setitem__("cx", v))

    def get_reg(self, index):
        return self.gpr[GPR_NAMES[index]]

    def push(self, value):
        self.sp -= 8
        off = self.sp - UC_STACK
        self.stack[off:off + 8] = value.to_bytes(8, "little")

    def pop(self):
        off = self.sp - UC_STACK
        self.sp += 8
        return int.from_bytes(self.stack[off:off + 8], "little")

    def state(self) -> dict:
        state = dict(self.gpr, ip=self.ip, flags=self.flags)
        state["stack"] = bytes(self.stack[0x7F00:0x8100])
        return state


# ---------------------------------------------------------------- decode


def test_decode_rip_relative_fields():
    insn = insn_of("mov 0x1234(%rip), %rax")
    assert insn.bytes == bytes.fromhex("488b0534120000")
    assert (insn.rex, insn.opcode, insn.modrm) == (0x48, b"\x8b", 0x05)
    assert insn.is_rip_relative and (insn.disp_offset, insn.disp_size) == (3, 4)
    assert insn.rip_target == KTEXT + 7 + 0x1234
    assert insn.mnemonic == "mov" and insn.kind is InsnKind.OTHER


def test_decode_displacement_before_immediate():
    insn = insn_of("cmpl $5, -0x10(%rip)")
    assert (insn.disp_offset, insn.disp_size, insn.length) == (2, 4, 7)
    assert insn.rip_target == KTEXT + 7 - 0x10


def test_decode_not_rip_relative():
    for source in ("mov 0x10(%rax), %rbx", "mov 0x1234, %rax", "mov (%rax,%rbx,4), %rcx",
                   "mov %cr0, %rax"):
        assert not insn_of(source).is_rip_relative, source


def test_decode_prefixes_and_opcode_forms():
    insn = insn_of("lock cmpxchg %rcx, %gs:(%rdx)")
    assert insn.prefixes == bytes([0x65, 0xF0]) or insn.prefixes == bytes([0xF0, 0x65])
    assert insn.opcode == b"\x0f\xb1" and insn.rex == 0x48
    assert insn_of("pshufb %xmm1, %xmm0").opcode == bytes.fromhex("0f3800")
    assert insn_of("palignr $1, %xmm1, %xmm0").opcode == bytes.fromhex("0f3a0f")
    vex = insn_of("vmovdqa %ymm1, %ymm0")
    assert vex.vex == bytes.fromhex("c5fd") and vex.opcode == b"\x6f"
    assert insn_of("mov (%eax), %ebx").addr_bytes == 4
    assert insn_of("mov (%rax), %ebx").addr_bytes == 8


BRANCHES = [
    # (source, kind, rel size); every one targets label "t" 0x40 bytes after its start.
    ("call t", InsnKind.CALL_REL, 4),
    ("{disp32} jmp t", InsnKind.JMP_REL, 4),
    ("jmp t", InsnKind.JMP_REL, 1),
    ("jne t", InsnKind.JCC_REL, 1),
    ("{disp32} jg t", InsnKind.JCC_REL, 4),
    ("loopne t", InsnKind.LOOPNE, 1),
    ("loope t", InsnKind.LOOPE, 1),
    ("loop t", InsnKind.LOOP, 1),
    ("jrcxz t", InsnKind.JCXZ, 1),
    ("jecxz t", InsnKind.JCXZ, 1),
]


@pytest.mark.parametrize("source,kind,rel_size", BRANCHES)
def test_decode_relative_branches(source, kind, rel_size):
    code = asm(f"{source}\n.org 0x40\nt: nop")
    insn = decode(code, KTEXT)
    assert insn.kind is kind
    assert insn.length == len(insn.prefixes) + len(insn.opcode) + rel_size
    assert insn.branch_target == KTEXT + 0x40


@pytest.mark.parametrize("source,kind", [
    ("ret", InsnKind.RET), ("ret $16", InsnKind.RET_IMM), ("lret", InsnKind.LRET),
    ("lret $8", InsnKind.LRET_IMM), ("iretq", InsnKind.IRET), ("int3", InsnKind.INT3),
    ("cli", InsnKind.CLI), ("sti", InsnKind.STI), ("pushf", InsnKind.PUSHF),
    ("popf", InsnKind.POPF), ("call *%r11", InsnKind.CALL_INDIRECT),
    ("call *8(%rax)", InsnKind.CALL_INDIRECT), ("lcall *(%rax)", InsnKind.CALL_FAR_INDIRECT),
    ("jmp *%rax", InsnKind.JMP_INDIRECT), ("ljmp *(%rax)", InsnKind.JMP_FAR_INDIRECT),
    ("mov %eax, %ss", InsnKind.MOV_SS), ("mov (%rax), %ss", InsnKind.MOV_SS),
    ("mov %eax, %ds", InsnKind.OTHER), ("vmcall", InsnKind.VMX), ("sgdt (%rax)", InsnKind.OTHER),
    (".byte 0xcd, 0x03", InsnKind.OTHER), ("nopl 0x0(%rax,%rax,1)", InsnKind.OTHER),
    ("endbr64", InsnKind.OTHER), ("rep ret", InsnKind.RET),
    ("bnd jmp *%rax", InsnKind.JMP_INDIRECT),
])
def test_decode_kinds(source, kind):
    assert insn_of(source).kind is kind


def test_decode_indirect_register_index():
    assert insn_of("call *%rax").indirect_reg == 0
    assert insn_of("jmp *%rsp").indirect_reg == 4
    assert insn_of("call *%r11").indirect_reg == 11
    assert insn_of("jmp *%r15").indirect_reg == 15
    assert insn_of("call *(%rax)").indirect_reg is None


def test_decode_opcodes_invalid_in_64bit_as_linux_does():
    # Linux's decoder accepts these (i64) opcodes; the copy rules then refuse them.
    assert decode(bytes.fromhex("17 90"), KTEXT).kind is InsnKind.POP_SS
    lcall = decode(bytes.fromhex("9a 11223344 5566 90"), KTEXT)
    assert (lcall.kind, lcall.length) == (InsnKind.CALL_FAR, 7)
    ljmp = decode(bytes.fromhex("ea 11223344 5566"), KTEXT)
    assert (ljmp.kind, ljmp.length) == (InsnKind.JMP_FAR, 7)


def test_decode_emulate_prefix_is_part_of_the_insn():
    code = asm(".byte 0x0f, 0x0b, 0x78, 0x65, 0x6e\nmov 0x10(%rip), %rax")
    insn = decode(code, KTEXT)
    assert insn.emulate_prefix and insn.length == 12
    assert insn.rip_target == KTEXT + 12 + 0x10
    kvm = decode(asm(".byte 0x0f, 0x0b, 0x6b, 0x76, 0x6d\ncpuid"), KTEXT)
    assert kvm.emulate_prefix and kvm.length == 7
    assert not decode(asm("ud2\nnop"), KTEXT).emulate_prefix


def test_decode_errors():
    for code in (b"", bytes.fromhex("0f0a"), bytes.fromhex("e8 00 00"), bytes.fromhex("48")):
        with pytest.raises(InsnDecodeError) as info:
            decode(code, KTEXT)
        assert isinstance(info.value, KprobefsError)


def test_decode_reads_at_most_15_bytes():
    sixteen = bytes([0x66] * 8) + bytes.fromhex("2e0f1f840000000000")
    with pytest.raises(InsnDecodeError):
        decode(sixteen, KTEXT)


def test_ftrace_site_decodes_as_5_byte_nop():
    insn = decode(bytes.fromhex("0f1f440000"), KTEXT)
    assert insn.length == 5 and insn.opcode == b"\x0f\x1f"


def test_iter_insns_whole_function():
    code = asm(".byte 0x0f, 0x1f, 0x44, 0, 0\npush %rbp\nmov %rsp, %rbp\nmov 8(%rip), %rax\n"
               "pop %rbp\nret")
    insns = list(iter_insns(code, KTEXT))
    assert [i.address - KTEXT for i in insns] == [0, 5, 6, 9, 16, 17]
    assert insns[-1].kind is InsnKind.RET
    with pytest.raises(InsnDecodeError):
        list(iter_insns(code + b"\xe8\x00", KTEXT))


# ---------------------------------------------------------------- boundaries (EILSEQ)

FUNC = """
    .byte 0x0f, 0x1f, 0x44, 0, 0   # +0  ftrace site (5-byte nop)
    push %rbp                    # +5
    mov %rsp, %rbp               # +6
    movabs $0x1122334455667788, %rax   # +9 (10 bytes)
    add $1, %rax                 # +19
    pop %rbp                     # +23
    ret                          # +24
"""


def test_check_boundary():
    code = asm(FUNC)
    starts = {0, 5, 6, 9, 19, 23, 24}
    for off in range(len(code)):
        assert check_boundary(code, KTEXT, KTEXT + off) == (off in starts), off
    assert not check_boundary(code, KTEXT, KTEXT + len(code))
    assert not check_boundary(code, KTEXT, KTEXT - 1)


def test_check_boundary_needs_decodable_prefix_code():
    code = bytes.fromhex("0f0a") + asm("nop\nnop")
    assert check_boundary(code, KTEXT, KTEXT)
    assert not check_boundary(code, KTEXT, KTEXT + 2)


# ---------------------------------------------------------------- prepare_copy

def copy_errno(insn: Insn, slot_address=None) -> int:
    with pytest.raises(ProbeError) as info:
        prepare_copy(insn, slot_address)
    assert isinstance(info.value, OSError)
    return info.value.errno


@pytest.mark.parametrize("code", [
    "0f0b78656e 4889c7",          # xen forced-emulation prefix + mov
    "0f0b6b766d 90",              # kvm forced-emulation prefix + nop
    "cc",                         # int3: someone else's breakpoint (before EOPNOTSUPP)
    "8ed0",                       # mov %eax, %ss
    "8e10",                       # mov (%rax), %ss
    "17",                         # pop %ss
])
def test_copy_refused_einval(code):
    assert copy_errno(decode(bytes.fromhex(code), KTEXT)) == errno.EINVAL


def test_copy_refused_einval_rip_overflow():
    insn = insn_of("mov 0x100(%rip), %rax")
    near = KTEXT + 0x7FFF0000
    assert prepare_copy(insn, near).insn_slot is not None
    assert copy_errno(insn, KTEXT + 0x80000200) == errno.EINVAL
    assert copy_errno(insn, KTEXT - 0x80000000) == errno.EINVAL
    assert prepare_copy(insn, KTEXT - 0x7FFFFE00).insn_slot is not None


@pytest.mark.parametrize("source", [
    ".byte 0x9a, 1, 2, 3, 4, 5, 6",      # far call absolute
    ".byte 0xea, 1, 2, 3, 4, 5, 6",      # far jmp absolute
    "iretq", "iret",
    "vmcall", "vmlaunch", "vmresume", "vmxoff",
    "lcall *(%rax)", "ljmp *(%rax)",
    "call *(%rax)", "call *0x10(%rip)", "jmp *(%rax,%rbx,8)", "jmp *0x10(%rip)",
    ".byte 0x67, 0xff, 0xd0",            # addr32 call *%rax
    ".byte 0x67, 0xff, 0xe0",            # addr32 jmp *%rax
])
def test_copy_refused_eopnotsupp(source):
    assert copy_errno(insn_of(source)) == errno.EOPNOTSUPP


def test_copy_refused_enospc_for_15_byte_insn():
    fifteen = bytes([0x66] * 6) + bytes.fromhex("2e0f1f840000000000")
    insn = decode(fifteen, KTEXT)
    assert insn.length == 15
    assert copy_errno(insn) == errno.ENOSPC
    assert prepare_copy(decode(fifteen[1:], KTEXT)).singlestep


def test_vmx_group_needs_mod3_reg0():
    # 0f 01 /0 with a memory operand is sgdt, and /1 mod=3 (monitor etc.) is fine.
    assert prepare_copy(insn_of("sgdt (%rax)")).singlestep
    assert prepare_copy(insn_of("monitor %rax,%ecx,%edx")).singlestep


@pytest.mark.parametrize("source,op", [
    ("cli", EmulateOp.IFMODIFIERS), ("sti", EmulateOp.IFMODIFIERS),
    ("pushf", EmulateOp.IFMODIFIERS), ("popf", EmulateOp.IFMODIFIERS),
    ("ret", EmulateOp.RET), ("ret $8", EmulateOp.RET), ("lret", EmulateOp.RET),
    ("lret $8", EmulateOp.RET),
    ("call .+0x100", EmulateOp.CALL), ("jmp .+0x100", EmulateOp.JMP),
    ("jmp .", EmulateOp.JMP), ("je .", EmulateOp.JCC), ("{disp32} jae .", EmulateOp.JCC),
    ("loop .", EmulateOp.LOOP), ("loope .", EmulateOp.LOOP), ("loopne .", EmulateOp.LOOP),
    ("jrcxz .", EmulateOp.LOOP),
    ("call *%rax", EmulateOp.CALL_INDIRECT), ("jmp *%r9", EmulateOp.JMP_INDIRECT),
    ("mov %rdi, %rax", None), ("push %rbp", None), ("mov 8(%rip), %rax", None),
    ("cpuid", None), (".byte 0xcd, 0x03", None), ("hlt", None), ("syscall", None),
    ("push (%rax)", None), ("incq (%rax)", None),
])
def test_prepare_copy_classifies(source, op):
    plan = prepare_copy(insn_of(source))
    assert plan.emulate_op is op
    assert plan.singlestep == (op is None)
    assert plan.insn_slot is None and plan.slot_size == plan.insn.length + 1


def test_prepare_copy_slot_bytes():
    insn = insn_of("mov 0x100(%rip), %rax")
    slot = KTEXT + 0x100000
    plan = prepare_copy(insn, slot)
    assert plan.insn_slot[-1] == 0xCC and len(plan.insn_slot) == insn.length + 1
    assert cs_rip_target(plan.insn_slot[:-1], slot) == insn.rip_target
    # Emulated branches are copied unchanged: they never run from the slot.
    jmp = insn_of("jmp .+0x40")
    assert prepare_copy(jmp, KTEXT + 0x7FFF0000).insn_slot == jmp.bytes + b"\xcc"


# ---------------------------------------------------------------- can_boost

TWO_BYTE_BOOSTABLE_REF = (
    "02-03 06 08-09 1f-23 31 40-4f 60-6b 6e-6f 74-77 7e-7f 90-a1 a3-a5 a8-a9 ab-ad af-b7 "
    "bb-c1 c8-cf d1-d3 d5 d8-d9 db-dd df e1-e2 e5 e8-e9 eb-ed ef f1-f3 f5 f8-fa fc-fe")
ONE_BYTE_NOT_BOOSTABLE_REF = (
    "62 70-7f 9a c0-c1 cc-ce d0-d3 d6 d8-df e0-e3 e8-e9 eb f0-f4 f6-f7 fe")


def expand(ranges: str) -> set[int]:
    out = set()
    for item in ranges.split():
        lo, _, hi = item.partition("-")
        out |= set(range(int(lo, 16), int(hi or lo, 16) + 1))
    return out


def test_can_boost_two_byte_bitmap_exhaustive():
    base = insn_of("nopl (%rax)")
    boostable = expand(TWO_BYTE_BOOSTABLE_REF)
    for op in range(256):
        insn = dataclasses.replace(base, opcode=bytes([0x0F, op]))
        assert can_boost(insn, False) == (op in boostable), hex(op)


def test_can_boost_one_byte_table_exhaustive():
    base = insn_of("mov %rdi, %rax")
    not_boostable = expand(ONE_BYTE_NOT_BOOSTABLE_REF)
    for op in range(256):
        if op == 0xFF:
            continue
        insn = dataclasses.replace(base, opcode=bytes([op]))
        assert can_boost(insn, False) == (op not in not_boostable), hex(op)


@pytest.mark.parametrize("source,boostable", [
    # one-byte opcodes, one sample per not-boostable range and some boostable ones
    ("jne .", False), ("jo .", False), ("jg .", False),
    ("shl $3, %eax", False), ("shlq $3, (%rax)", False), ("shl %eax", False),
    ("shl %cl, %rax", False), ("sar %cl, %al", False),
    ("int3", False), ("int $0x80", False),
    ("fld1", False), ("fstp %st(1)", False), ("fnstcw (%rax)", False),
    ("loopne .", False), ("jrcxz .", False), ("loop .", False),
    ("call .", False), ("{disp32} jmp .", False), ("jmp .", False),
    ("hlt", False), (".byte 0xf1", False), ("lock incl (%rax)", False),
    ("testb $1, (%rax)", False), ("neg %rax", False), ("notq (%rax)", False),
    ("incb (%rax)", False), ("decb %al", False),
    ("call *%rax", False), ("incq (%rax)", False), ("push (%rax)", False),
    ("jmp *%rax", True), ("jmp *(%rax)", True),
    ("mov %rdi, %rax", True), ("push %rbp", True), ("pop %rbp", True), ("ret", True),
    ("lock addl $1, (%rax)", True), ("cmc", True), ("add $1, %rax", True),
    ("mov 8(%rip), %rax", True), ("lea 8(%rip), %rax", True), ("xchg %eax, %ebx", True),
    ("movabs $1, %rax", True), ("cli", True), ("pushf", True), ("rep movsb", True),
    # prefixes: CS override and address size block one-byte opcodes only
    ("mov %cs:(%rax), %rbx", False), ("mov %ds:(%rax), %rbx", True),
    ("mov (%eax), %ebx", False), ("mov (%rax), %ebx", True),
    ("movzbl (%eax), %ebx", True),
    # two-byte opcodes, both ends of several ranges and some outside
    ("lar %ax, %bx", True), ("lsl %ax, %bx", True), ("clts", True), ("wbinvd", True),
    ("nopl (%rax)", True), ("mov %cr0, %rax", True), ("mov %rax, %dr7", True),
    ("rdtsc", True), ("cmovo %rax, %rbx", True), ("cmovg %rax, %rbx", True),
    ("seto %al", True), ("setg %al", True), ("push %fs", True), ("cpuid", False),
    ("bt %eax, %ebx", True), ("shld $1, %eax, %ebx", True), ("bts %eax, %ebx", True),
    ("imul %rax, %rbx", True), ("cmpxchg %rcx, (%rdx)", True), ("movzwl %ax, %ebx", True),
    ("movsbl %al, %ebx", True), ("xadd %eax, %ebx", True), ("bswap %eax", True),
    ("bswap %r15", True),
    ("syscall", False), ("sysret", False), ("ud2", False), ("wrmsr", False), ("rdmsr", False),
    ("{disp32} jne .", False), ("prefetcht0 (%rax)", False), ("endbr64", False),
    ("lgdt (%rax)", False), ("rdpmc", False), ("movaps %xmm0, %xmm1", False),
    ("pxor %xmm0, %xmm1", True), ("paddw %mm0, %mm1", True), ("paddq %mm0, %mm1", False),
    ("psubq %xmm0, %xmm1", False),
    # three-byte opcodes
    ("pshufb %xmm1, %xmm0", False), ("palignr $1, %xmm1, %xmm0", False),
    ("movbe (%rax), %eax", False), ("crc32b %al, %eax", False),
])
def test_can_boost_samples(source, boostable):
    assert can_boost(insn_of(source), False) is boostable


def test_can_boost_refuses_extable_insn():
    assert can_boost(insn_of("mov (%rdi), %rax"), False)
    assert not can_boost(insn_of("mov (%rdi), %rax"), True)


# ---------------------------------------------------------------- relocation


RIP_FORMS = [
    "mov 0x1234(%rip), %rax", "mov %rax, -0x80(%rip)", "lea 0x100000(%rip), %rdi",
    "cmpl $5, 0x10(%rip)", "movq $-1, 0x20(%rip)", "addl $0x12345678, -0x100(%rip)",
    "movss 0x40(%rip), %xmm3", "vmovdqa 0x40(%rip), %ymm9", "call *0x8(%rip)",
    "incl %fs:0x30(%rip)", "mov 0x10(%rip), %r12d",
]


@pytest.mark.parametrize("source", RIP_FORMS)
@pytest.mark.parametrize("delta", [0, 0x1000, -0x1000, 0x7F000000, -0x7F000000])
def test_relocate_rip_relative_keeps_absolute_target(source, delta):
    insn = insn_of(source)
    new = KTEXT + delta
    code = relocate(insn, new)
    assert len(code) == insn.length
    assert cs_rip_target(code, new) == insn.rip_target == cs_rip_target(insn.bytes, KTEXT)
    assert copy_instruction(insn, new) == code


def test_relocate_rip_relative_overflow():
    insn = insn_of("mov 0x1234(%rip), %rax")
    with pytest.raises(ProbeError) as info:
        relocate(insn, KTEXT - 0x80000000)
    assert info.value.errno == errno.EINVAL
    relocate(insn, KTEXT - 0x7FFFE000)


def test_relocate_other_insns_unchanged():
    for source in ("mov %rdi, %rax", "mov 0x10(%rax), %rax", "movabs $0x1234, %rax",
                   "call *%rax", "ret"):
        insn = insn_of(source)
        assert relocate(insn, KTEXT + 0x12345678) == insn.bytes


@pytest.mark.parametrize("source", ["call t", "{disp32} jmp t", "{disp32} je t"])
@pytest.mark.parametrize("delta", [0x100, -0x100, 0x70000000, -0x70000000])
def test_relocate_rel32_branches(source, delta):
    insn = decode(asm(f"{source}\n.org 0x200\nt: nop"), KTEXT)
    new = KTEXT + delta
    moved = decode(relocate(insn, new), new)
    assert (moved.kind, moved.length) == (insn.kind, insn.length)
    assert moved.branch_target == insn.branch_target == KTEXT + 0x200


def test_relocate_rel32_overflow():
    insn = insn_of("call .+0x1000")
    with pytest.raises(ProbeError) as info:
        relocate(insn, KTEXT - 0x80000000)
    assert info.value.errno == errno.EINVAL


@pytest.mark.parametrize("source,wide_opcode", [
    ("jmp t", b"\xe9"), ("jne t", b"\x0f\x85"), ("jle t", b"\x0f\x8e"),
    ("ds jmp t", b"\xe9"),
])
def test_relocate_rel8_stays_short_or_widens(source, wide_opcode):
    insn = decode(asm(f"{source}\n.org 0x40\nt: nop"), KTEXT)
    near = decode(relocate(insn, KTEXT + 0x20), KTEXT + 0x20)
    assert near.length == insn.length and near.branch_target == KTEXT + 0x40
    far_at = KTEXT + 0x10000000
    far = decode(relocate(insn, far_at), far_at)
    assert far.opcode == wide_opcode and far.kind is insn.kind
    assert far.cond == insn.cond and far.prefixes == insn.prefixes
    assert far.branch_target == KTEXT + 0x40


@pytest.mark.parametrize("source", ["loop t", "loope t", "loopne t", "jrcxz t", "jecxz t"])
@pytest.mark.parametrize("rcx,zf", [(0, 0), (1, 0), (2, 0), (2, 1), (1 << 32, 1), (5 << 32 | 1, 0)])
def test_relocate_loop_far_runs_like_original(source, rcx, zf):
    original = asm(f"{source}\n.org 0x40\nt: nop")
    insn = decode(original, UC_CODE)
    copy = relocate(insn, UC_FAR)
    assert len(copy) > insn.length and decode(copy, UC_FAR).kind is insn.kind
    target = UC_CODE + 0x40
    results = []
    for start, length in ((UC_CODE, insn.length), (UC_FAR, len(copy))):
        mu = make_uc({UC_CODE: original, UC_FAR: copy},
                     {"cx": rcx, "flags": 0x202 | (0x40 if zf else 0)})
        mu.hook_add(UC_HOOK_CODE,
                    lambda uc, addr, size, _: uc.emu_stop() if addr == target else None)
        run_uc(mu, start, until=start + length, count=4)
        rip = mu.reg_read(ux.UC_X86_REG_RIP)
        results.append(("taken" if rip == target else rip - start - length,
                        mu.reg_read(ux.UC_X86_REG_RCX)))
    assert results[0] == results[1]
    assert results[0][0] in ("taken", 0)


def test_relocated_rip_relative_copy_runs_like_original():
    data = bytes(range(256)) * 4
    for source in ("mov -0x3fffffc0(%rip), %rax", "add -0x3fffff00(%rip), %rax",
                   "cmpl $0x07060504, -0x3fffffbc(%rip)"):
        insn = decode(asm(source), UC_CODE)
        assert UC_DATA <= insn.rip_target < UC_DATA + len(data)
        copy = relocate(insn, UC_FAR)
        states = []
        for start, code in ((UC_CODE, insn.bytes), (UC_FAR, copy)):
            mu = make_uc({start: code}, {"ax": 3}, data)
            run_uc(mu, start, count=1)
            state = uc_state(mu)
            state["ip"] -= start
            states.append(state)
        assert states[0] == states[1], source


def test_synthesize_jumps():
    assert synthesize_reljump(KTEXT, KTEXT + 0x105) == bytes.fromhex("e900010000")
    assert synthesize_relcall(KTEXT + 0x10, KTEXT) == bytes.fromhex("e8ebffffff")
    with pytest.raises(ProbeError):
        synthesize_reljump(KTEXT, KTEXT + 0x80000005)


# ---------------------------------------------------------------- single-step fixups

def test_fixup_fall_through_after_int3():
    insn = insn_of("mov %rdi, %rax")
    copy = KTEXT + 0x500000
    fix = fixup_after_singlestep(insn, copy, KTEXT, copy + insn.length + 1)
    assert fix.ip == insn.next_address and fix.return_address is None
    fix = fixup_after_singlestep(insn, copy, KTEXT, copy + insn.length, after_int3=False)
    assert fix.ip == insn.next_address


@pytest.mark.parametrize("source", ["call t", "call *%rbx", "jmp *%rbx", "ret", "jne t",
                                    "{disp32} jmp t", "mov 0x100(%rip), %rax", "push %rbp"])
def test_fixup_trap_flag_step_matches_original(source):
    """Run the raw copy (no relocation) one step in unicorn, fix it up, compare."""
    original = asm(f"{source}\n.org 0x40\nt: nop")
    insn = decode(original, UC_CODE)
    regs = {"bx": UC_CODE + 0x40, "flags": 0x202}
    mu = make_uc({UC_CODE: original}, regs, bytes(64))
    mu.mem_write(UC_STACK + 0x8000, (UC_CODE + 0x40).to_bytes(8, "little"))
    run_uc(mu, UC_CODE, count=1)
    expected = uc_state(mu)

    mu = make_uc({UC_FAR: insn.bytes}, regs, bytes(64))
    mu.mem_write(UC_STACK + 0x8000, (UC_CODE + 0x40).to_bytes(8, "little"))
    run_uc(mu, UC_FAR, count=1)
    fix = fixup_after_singlestep(insn, UC_FAR, UC_CODE, mu.reg_read(ux.UC_X86_REG_RIP),
                                 after_int3=False)
    if fix.return_address is not None:
        mu.mem_write(mu.reg_read(ux.UC_X86_REG_RSP), fix.return_address.to_bytes(8, "little"))
    mu.reg_write(ux.UC_X86_REG_RIP, fix.ip)
    got = uc_state(mu)
    if source.startswith("mov 0x100(%rip)"):
        expected.pop("ax"), got.pop("ax")     # the raw copy reads another address
    assert got == expected
    assert (fix.return_address is not None) == source.startswith("call")


# ---------------------------------------------------------------- emulation

def compare_with_unicorn(source: str, regs: dict, flags: int = 0x202, stack=()):
    code = asm(f"{source}\n.org 0x40\nt: nop")
    insn = decode(code, UC_CODE)
    assert prepare_copy(insn).emulate_op is not None
    mu = make_uc({UC_CODE: code}, dict(regs, flags=flags))
    sp = UC_STACK + 0x8000
    for i, word in enumerate(stack):
        mu.mem_write(sp + 8 * i, word.to_bytes(8, "little"))
    run_uc(mu, UC_CODE, count=1)
    expected = uc_state(mu)

    pt_regs = Regs(UC_CODE + 1, regs, flags)        # ip as after the int3 hit
    for i, word in enumerate(stack):
        pt_regs.stack[0x8000 + 8 * i:0x8008 + 8 * i] = word.to_bytes(8, "little")
    new_ip = emulate(insn, pt_regs)
    assert new_ip == pt_regs.ip
    assert pt_regs.state() == expected, source


@pytest.mark.parametrize("source,flags", [
    ("cli", 0x202), ("cli", 0x2c3), ("sti", 0x002), ("sti", 0x8c3),
    ("pushf", 0x2d7), ("pushf", 0x002),
])
def test_emulate_if_modifiers(source, flags):
    compare_with_unicorn(source, {}, flags)


def test_emulate_popf():
    compare_with_unicorn("popf", {}, 0x202, stack=[0x8c7 | 0x2])
    compare_with_unicorn("popf", {}, 0x8c7, stack=[0x202])


@pytest.mark.parametrize("source", ["ret", "ret $0x10", "rep ret"])
def test_emulate_ret(source):
    compare_with_unicorn(source, {}, stack=[UC_CODE + 0x1234, 7, 8, 9])


def test_emulate_lret_pops_ip_and_cs():
    for source, pops in (("lret", 16), ("lret $0x18", 16 + 0x18)):
        insn = insn_of(source)
        regs = Regs(insn.address + 1)
        regs.push(0x10)
        regs.push(0xFFFFFFFF81234567)
        sp = regs.sp
        assert emulate(insn, regs) == 0xFFFFFFFF81234567
        assert regs.sp == sp + pops


@pytest.mark.parametrize("source", ["call t", "{disp32} jmp t", "jmp t"])
def test_emulate_call_and_jmp(source):
    compare_with_unicorn(source, {})


JCC = ["jo", "jno", "jb", "jae", "je", "jne", "jbe", "ja",
       "js", "jns", "jp", "jnp", "jl", "jge", "jle", "jg"]
FLAG_SETS = [0x002, 0x003, 0x006, 0x042, 0x043, 0x082, 0x802, 0x882, 0x842, 0x8c3]


@pytest.mark.parametrize("mnemonic", JCC)
def test_emulate_jcc_every_condition(mnemonic):
    for flags in FLAG_SETS:
        compare_with_unicorn(f"{mnemonic} t", {}, flags)
        compare_with_unicorn(f"{{disp32}} {mnemonic} t", {}, flags)


@pytest.mark.parametrize("source", ["loop t", "loope t", "loopne t", "jrcxz t",
                                    "addr32 loop t", "jecxz t"])
def test_emulate_loop_and_jcxz(source):
    for rcx in (0, 1, 2, 0x100000000, 0x500000001, 2**64 - 1):
        for flags in (0x202, 0x242):
            compare_with_unicorn(source, {"cx": rcx}, flags)


@pytest.mark.parametrize("source", ["call *%rax", "call *%r11", "call *%rsp",
                                    "jmp *%rdx", "jmp *%r15", "bnd jmp *%rax"])
def test_emulate_indirect_register(source):
    regs = {name: UC_CODE + 0x100 + 8 * i for i, name in enumerate(GPR_NAMES) if name != "sp"}
    compare_with_unicorn(source, regs)


@pytest.mark.parametrize("source", ["mov %rdi, %rax", "call *(%rax)", "int3", "nop"])
def test_emulate_rejects_non_emulated(source):
    with pytest.raises(ValueError):
        emulate(insn_of(source), Regs(KTEXT + 1))


# ---------------------------------------------------------------- can_optimize

OPT_FUNC = """
f:  .byte 0x0f, 0x1f, 0x44, 0, 0 # +0   ftrace site (5-byte nop)
p:  push %rbp                    # +5   probe address
    mov %rsp, %rbp               # +6
    mov 0x100(%rip), %rax        # +9   (7 bytes)
    add %rdi, %rax               # +16
    {body}
    pop %rbp
    ret
    int3
"""


def opt_func(body: str = "") -> bytes:
    return asm(OPT_FUNC.replace("{body}", body))


def optimize(code: bytes, addr_off: int = 5, *, extable=(), ftrace=(0,), probes=(), **kw):
    return can_optimize(code, KTEXT, KTEXT + addr_off, [KTEXT + e for e in extable],
                        [KTEXT + s for s in ftrace], [KTEXT + p for p in probes], **kw)


def test_can_optimize_ok():
    plan, reason = optimize(opt_func())
    assert reason is None and isinstance(plan, OptimizePlan)
    assert plan.addr == KTEXT + 5 and plan.size == 11
    assert [i.address - KTEXT for i in plan.insns] == [5, 6, 9]
    plan, reason = optimize(opt_func(), 6)
    assert reason is None and plan.size == 10 and len(plan.insns) == 2


def test_can_optimize_region_must_fit_in_function():
    code = opt_func()
    assert optimize(code, -1)[0] is None
    assert "not inside" in optimize(code, len(code))[1]
    plan, reason = optimize(code, len(code) - 4)
    assert plan is None and "less than 5 bytes" in reason
    plan, reason = optimize(code, len(code) - 5)   # pop; ret; int3 ... last 5 bytes
    assert "less than" not in (reason or "")


def test_can_optimize_whole_function_must_decode():
    plan, reason = optimize(opt_func() + b"\xe8\x00")
    assert plan is None and "does not decode" in reason
    plan, reason = optimize(opt_func(".byte 0x0f, 0x0a"))
    assert plan is None and "does not decode" in reason


def test_can_optimize_refuses_extable_anywhere_in_function():
    code = opt_func("mov (%rdi), %rdx")
    insns = list(iter_insns(code, KTEXT))
    load = next(i for i in insns if i.mnemonic == "mov" and i.op_str == "rdx, qword ptr [rdi]")
    assert optimize(code)[1] is None
    plan, reason = optimize(code, extable=[load.address - KTEXT])
    assert plan is None and "exception-table" in reason


@pytest.mark.parametrize("body", ["jmp *%rax", "jmp *(%rax,%rbx,8)", "jmp *0x10(%rip)",
                                  "ljmp *(%rax)", ".byte 0xea, 1, 2, 3, 4, 5, 6"])
def test_can_optimize_refuses_indirect_jump(body):
    plan, reason = optimize(opt_func(body))
    assert plan is None and "indirect jump" in reason


def test_can_optimize_indirect_call_is_not_a_jump():
    assert optimize(opt_func("call *%rax"))[1] is None


def test_can_optimize_retpoline_thunk_jump_counts_as_indirect():
    code = opt_func("{disp32} jmp f+0x800")
    assert optimize(code)[1] is None
    thunk = (KTEXT + 0x800, KTEXT + 0x820)
    plan, reason = optimize(code, indirect_thunk=thunk)
    assert plan is None and "indirect jump" in reason


@pytest.mark.parametrize("offset,refused", [(0, False), (1, True), (3, True), (5, True),
                                            (6, False), (-1, False)])
@pytest.mark.parametrize("jump", ["jmp", "{disp32} jmp", "jne", "{disp32} jne", "loop",
                                  "jrcxz"])
def test_can_optimize_refuses_jump_into_region(jump, offset, refused):
    plan, reason = optimize(opt_func(f"{jump} p+{offset}"))
    assert (plan is None) == refused
    if refused:
        assert "into the optimized region" in reason


def test_can_optimize_allows_call_into_region():
    assert optimize(opt_func("call p+2"))[1] is None


def test_can_optimize_copied_insns_must_be_copyable():
    code = asm("push %rbp\nmov %eax, %ss\nnop\nnop\nnop\nret")
    plan, reason = optimize(code, 0, ftrace=())
    assert plan is None and "cannot copy" in reason


def test_can_optimize_rip_relative_copy_must_reach():
    code = opt_func()
    plan, reason = optimize(code, 6, copy_address=KTEXT + 0x10000000)
    assert reason is None
    plan, reason = optimize(code, 6, copy_address=KTEXT + 0x90000000)
    assert plan is None and "cannot copy" in reason


@pytest.mark.parametrize("source", ["push %rbp\ncall .+0x100", "push %rbp\njne .+0x40",
                                    "push %rbp\ncpuid", "push %rbp\nhlt", "cli\nsyscall",
                                    "mov %cs:(%rax), %rbx", "push %rbp\npushq (%rax)"])
def test_can_optimize_copied_insns_must_be_boostable(source):
    code = asm(source + "\n" + "nop\n" * 8 + "ret")
    plan, reason = optimize(code, 0, ftrace=())
    assert plan is None and "not boostable" in reason


def test_can_optimize_copied_insn_with_extable_is_refused():
    code = asm("mov (%rdi), %rax\nmov (%rsi), %rdx\nret\n" + "int3\n" * 8)
    assert optimize(code, 0, ftrace=())[1] is None
    plan, reason = optimize(code, 0, ftrace=(), extable=[3])
    assert plan is None and "exception-table" in reason


def test_can_optimize_refuses_ftrace_overlap():
    code = opt_func()
    # probe at +0 would cover the ftrace site itself
    plan, reason = optimize(code, 0)
    assert plan is None and "ftrace" in reason
    # a site just after the covered range [5, 16) does not overlap, one at +15 does
    assert optimize(code, 5, ftrace=(0, 16))[1] is None
    plan, reason = optimize(code, 5, ftrace=(0, 15))
    assert plan is None and "ftrace site" in reason
    plan, reason = optimize(code, 5, ftrace=(1,))
    assert plan is None and "ftrace site" in reason


def test_can_optimize_refuses_other_probe_in_region():
    code = opt_func()
    assert optimize(code, probes=(5, 16))[1] is None
    plan, reason = optimize(code, probes=(6,))
    assert plan is None and "another probe" in reason


def test_can_optimize_needs_boundary():
    plan, reason = optimize(opt_func(), 7)
    assert plan is None and "boundary" in reason


def test_can_optimize_detour_jump_must_reach():
    plan, reason = optimize(opt_func(), copy_address=KTEXT + 0x80000100)
    assert plan is None and "out of reach" in reason


def test_detour_copy_runs_like_the_original_region():
    source = ("push %rbp\nmov %rsp, %rbp\nmov -0x3fffff00(%rip), %rax\nadd %rdi, %rax\n"
              "pop %rbp\nret")
    code = asm(source)
    plan, reason = can_optimize(code, UC_CODE, UC_CODE, (), ())
    assert reason is None and plan.size == 11
    detour = plan.detour_copy(UC_FAR)
    tail = decode(detour[-5:], UC_FAR + len(detour) - 5)
    assert tail.kind is InsnKind.JMP_REL and tail.branch_target == UC_CODE + 11

    data = bytes(range(256)) * 4
    states = []
    for start in (UC_CODE, UC_FAR):
        mu = make_uc({UC_CODE: code, UC_FAR: detour}, {"di": 5, "bp": 77}, data)
        run_uc(mu, start, until=UC_CODE + plan.size)
        states.append(uc_state(mu))
    assert states[0] == states[1]
    load = plan.insns[-1]
    assert load.is_rip_relative and UC_DATA <= load.rip_target < UC_DATA + 0x200
    offset = load.rip_target - UC_DATA
    assert states[0]["ax"] == int.from_bytes(data[offset:offset + 8], "little")
