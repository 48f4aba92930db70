"""Opcode tables for the x86_64 instruction-analysis layer (plain data, no logic).

The facts come from Linux 6.1 (arch/x86/kernel/kprobes/core.c and opt.c, arch/x86/lib/insn.c
and x86-opcode-map.txt) and are restated here as byte sets; see ``insn.py`` for their use.
"""

__all__ = [
    "MAX_INSN_SIZE",
    "INT3_INSN_OPCODE",
    "INT3_INSN_SIZE",
    "JMP32_INSN_OPCODE",
    "JMP32_INSN_SIZE",
    "CALL_INSN_OPCODE",
    "DISP32_SIZE",
    "LEGACY_PREFIXES",
    "EMULATE_PREFIXES",
    "I64_OPCODES",
    "REGISTER_ONLY_MODRM",
    "ONE_BYTE_NOT_BOOSTABLE",
    "TWO_BYTE_BOOSTABLE",
    "GPR_NAMES",
]


def _byte_set(ranges: str) -> frozenset[int]:
    """Expand ``"02-03 06 08-09"`` (hex, inclusive ranges) into a set of byte values."""
    values: set[int] = set()
    for item in ranges.split():
        first, _, last = item.partition("-")
        values.update(range(int(first, 16), int(last or first, 16) + 1))
    return frozenset(values)


# Linux's MAX_INSN_SIZE is 15: an insn slot holds the instruction and a trailing int3, so
# a 15-byte instruction leaves no room (ENOSPC).
MAX_INSN_SIZE = 15
INT3_INSN_OPCODE = 0xCC
INT3_INSN_SIZE = 1
JMP32_INSN_OPCODE = 0xE9
JMP32_INSN_SIZE = 5
CALL_INSN_OPCODE = 0xE8
DISP32_SIZE = 4

# Segment overrides, operand/address size, lock and rep prefixes (REX/VEX are not legacy).
LEGACY_PREFIXES = _byte_set("26 2e 36 3e 64 65 66 67 f0 f2 f3")

# Forced-emulation prefixes: ud2 followed by the ASCII text "xen" / "kvm".  Linux decodes
# them as part of the next instruction and refuses to copy such an instruction.
EMULATE_PREFIXES = (
    bytes.fromhex("0f0b78656e"),
    bytes.fromhex("0f0b6b766d"),
)

# One-byte opcodes that are invalid in 64-bit mode (so capstone rejects them) but that
# Linux's table-driven decoder still decodes, mapped to (name, operand layout).  Layouts:
# "" no operands, "ib" imm8, "modrm_ib" ModRM (+SIB/disp) then imm8, "ptr" far pointer
# (imm16:imm32, or imm16:imm16 with an operand-size prefix).
I64_OPCODES: dict[int, tuple[str, str]] = {
    0x06: ("push es", ""),
    0x07: ("pop es", ""),
    0x0E: ("push cs", ""),
    0x16: ("push ss", ""),
    0x17: ("pop ss", ""),
    0x1E: ("push ds", ""),
    0x1F: ("pop ds", ""),
    0x27: ("daa", ""),
    0x2F: ("das", ""),
    0x37: ("aaa", ""),
    0x3F: ("aas", ""),
    0x60: ("pusha", ""),
    0x61: ("popa", ""),
    0x82: ("grp1 (i64)", "modrm_ib"),
    0x9A: ("lcall", "ptr"),
    0xCE: ("into", ""),
    0xD4: ("aam", "ib"),
    0xD5: ("aad", "ib"),
    0xD6: ("salc", ""),
    0xEA: ("ljmp", "ptr"),
}

# Two-byte opcodes whose ModRM always names registers (mov to/from control and debug
# registers): mod is ignored, so mod=00 rm=101 is not RIP-relative and has no disp32.
REGISTER_ONLY_MODRM = frozenset(bytes([0x0F, op]) for op in (0x20, 0x21, 0x22, 0x23))

# can_boost(): one-byte opcodes that are never boostable (bound, jcc, far call, group 2,
# int3/int/into, UD, x87 escapes, loop/jcxz, call/jmp, lock/rep/hlt, group 3, group 4).
# Group 5 (ff) is decided by ModRM.reg and is handled separately.
ONE_BYTE_NOT_BOOSTABLE = _byte_set(
    "62 70-7f 9a c0-c1 cc-ce d0-d3 d6 d8-df e0-e3 e8-e9 eb f0-f4 f6-f7 fe"
)

# can_boost(): the second byte of the two-byte (0f xx) opcodes that are boostable.
TWO_BYTE_BOOSTABLE = _byte_set(
    "02-03 06 08-09 1f-23 31 40-4f 60-6b 6e-6f 74-77 7e-7f 90-a1 a3-a5 a8-a9 ab-ad af-b7"
    " bb-c1 c8-cf d1-d3 d5 d8-d9 db-dd df e1-e2 e5 e8-e9 eb-ed ef f1-f3 f5 f8-fa fc-fe"
)

# General-purpose registers in x86 encoding order (ModRM.rm + 8 * REX.B), named as the
# fields of struct pt_regs.
GPR_NAMES = (
    "ax", "cx", "dx", "bx", "sp", "bp", "si", "di",
    "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15",
)
