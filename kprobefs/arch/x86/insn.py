"""x86_64 instruction analysis for kprobes: decode, copy rules, boosting, relocation, emulation.

This module is pure: it looks at instruction bytes and computes, but never touches the
emulated machine.  It mirrors what Linux 6.1 does in arch/x86/kernel/kprobes/{core,opt}.c:

* :func:`decode` / :func:`iter_insns` turn bytes into frozen :class:`Insn` records (capstone
  finds the length and the ModRM position; prefixes, opcode and operands are read from the
  bytes here, the way Linux's ``struct insn`` reports them);
* :func:`check_boundary` is the ``can_probe`` test behind ``EILSEQ``;
* :func:`copy_instruction`, :func:`prepare_copy` and :func:`can_boost` are the copy,
  emulation and boost rules, raising :class:`~kprobefs.errors.ProbeError` with Linux's errno;
* :func:`relocate` and :func:`fixup_after_singlestep` move an instruction to an insn slot or
  a detour buffer and repair ``ip`` afterwards;
* :func:`emulate` executes the instructions kprobes emulates instead of single-stepping;
* :func:`can_optimize` is the jump-optimization safety check.

Callers must hand every function the *original* bytes: under an armed probe the first byte
is ``int3`` and under an optimized one a ``jmp``, and an ftrace site must be decoded as the
5-byte NOP it was built as.
"""

from __future__ import annotations

import enum
import errno
import threading
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator, Protocol

import capstone

from kprobefs.arch.x86._opcodes import (
    DISP32_SIZE,
    EMULATE_PREFIXES,
    GPR_NAMES,
    I64_OPCODES,
    INT3_INSN_OPCODE,
    INT3_INSN_SIZE,
    JMP32_INSN_OPCODE,
    JMP32_INSN_SIZE,
    CALL_INSN_OPCODE,
    LEGACY_PREFIXES,
    MAX_INSN_SIZE,
    ONE_BYTE_NOT_BOOSTABLE,
    REGISTER_ONLY_MODRM,
    TWO_BYTE_BOOSTABLE,
)
from kprobefs.errors import KprobefsError, ProbeError
from kprobefs.machine.abi import HYPERCALL_VECTOR

__all__ = [
    "MAX_INSN_SIZE",
    "INT3_INSN_SIZE",
    "JMP32_INSN_SIZE",
    "GPR_NAMES",
    "InsnDecodeError",
    "InsnKind",
    "Insn",
    "decode",
    "iter_insns",
    "check_boundary",
    "FunctionText",
    "EmulateOp",
    "InsnCopyPlan",
    "copy_instruction",
    "prepare_copy",
    "can_boost",
    "relocate",
    "synthesize_reljump",
    "synthesize_relcall",
    "SinglestepFixup",
    "fixup_after_singlestep",
    "EmulateRegs",
    "emulate",
    "OptimizePlan",
    "can_optimize",
]

_U64 = (1 << 64) - 1

X86_EFLAGS_CF = 0x0001
X86_EFLAGS_PF = 0x0004
X86_EFLAGS_ZF = 0x0040
X86_EFLAGS_SF = 0x0080
X86_EFLAGS_IF = 0x0200
X86_EFLAGS_OF = 0x0800


class InsnDecodeError(KprobefsError):
    """Raised when bytes do not decode to one complete x86_64 instruction."""

    def __init__(self, address: int, code: bytes, why: str = "cannot decode"):
        super().__init__(f"{why} at {address:#x}: {code[:MAX_INSN_SIZE].hex(' ')}")
        self.address = address


# --------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------

class InsnKind(enum.Enum):
    """What an instruction does, as far as kprobes cares; everything else is ``OTHER``."""

    OTHER = "other"
    CALL_REL = "call rel32"
    JMP_REL = "jmp rel8/rel32"
    JCC_REL = "jcc rel8/rel32"
    LOOPNE = "loopne"
    LOOPE = "loope"
    LOOP = "loop"
    JCXZ = "jcxz"
    RET = "ret"
    RET_IMM = "ret imm16"
    LRET = "lret"
    LRET_IMM = "lret imm16"
    IRET = "iret"
    INT3 = "int3"
    CLI = "cli"
    STI = "sti"
    PUSHF = "pushf"
    POPF = "popf"
    CALL_INDIRECT = "call near indirect (ff /2)"
    CALL_FAR_INDIRECT = "call far indirect (ff /3)"
    JMP_INDIRECT = "jmp near indirect (ff /4)"
    JMP_FAR_INDIRECT = "jmp far indirect (ff /5)"
    CALL_FAR = "call far absolute (9a)"
    JMP_FAR = "jmp far absolute (ea)"
    MOV_SS = "mov ss (8e /2)"
    POP_SS = "pop ss (17)"
    VMX = "vmx (0f 01 /0, mod=3)"


# Legacy (non-VEX) opcode bytes -> kind.
_KIND_BY_OPCODE: dict[bytes, InsnKind] = {
    b"\xe8": InsnKind.CALL_REL,
    b"\xe9": InsnKind.JMP_REL,
    b"\xeb": InsnKind.JMP_REL,
    **{bytes([0x70 + cc]): InsnKind.JCC_REL for cc in range(16)},
    **{bytes([0x0F, 0x80 + cc]): InsnKind.JCC_REL for cc in range(16)},
    b"\xe0": InsnKind.LOOPNE,
    b"\xe1": InsnKind.LOOPE,
    b"\xe2": InsnKind.LOOP,
    b"\xe3": InsnKind.JCXZ,
    b"\xc3": InsnKind.RET,
    b"\xc2": InsnKind.RET_IMM,
    b"\xcb": InsnKind.LRET,
    b"\xca": InsnKind.LRET_IMM,
    b"\xcf": InsnKind.IRET,
    b"\xcc": InsnKind.INT3,
    b"\xfa": InsnKind.CLI,
    b"\xfb": InsnKind.STI,
    b"\x9c": InsnKind.PUSHF,
    b"\x9d": InsnKind.POPF,
    b"\x9a": InsnKind.CALL_FAR,
    b"\xea": InsnKind.JMP_FAR,
    b"\x17": InsnKind.POP_SS,
}

# (opcode bytes, ModRM.reg) -> kind, for opcodes whose meaning depends on ModRM.reg.
_KIND_BY_GROUP: dict[tuple[bytes, int], InsnKind] = {
    (b"\xff", 2): InsnKind.CALL_INDIRECT,
    (b"\xff", 3): InsnKind.CALL_FAR_INDIRECT,
    (b"\xff", 4): InsnKind.JMP_INDIRECT,
    (b"\xff", 5): InsnKind.JMP_FAR_INDIRECT,
    (b"\x8e", 2): InsnKind.MOV_SS,
}

# Size of the relative displacement of each relative branch opcode (it ends the insn).
_REL_SIZE: dict[bytes, int] = {
    b"\xe8": 4,
    b"\xe9": 4,
    b"\xeb": 1,
    b"\xe0": 1,
    b"\xe1": 1,
    b"\xe2": 1,
    b"\xe3": 1,
    **{bytes([0x70 + cc]): 1 for cc in range(16)},
    **{bytes([0x0F, 0x80 + cc]): 4 for cc in range(16)},
}

_LOOP_KINDS = frozenset({InsnKind.LOOPNE, InsnKind.LOOPE, InsnKind.LOOP, InsnKind.JCXZ})
_INDIRECT_JUMP_KINDS = frozenset(
    {InsnKind.JMP_INDIRECT, InsnKind.JMP_FAR_INDIRECT, InsnKind.JMP_FAR}
)
# Relative jumps whose targets can_optimize() checks (a relative call is not checked).
_RELATIVE_JUMP_KINDS = frozenset({InsnKind.JMP_REL, InsnKind.JCC_REL}) | _LOOP_KINDS

# VEX/EVEX/XOP escape bytes -> prefix length (always VEX/EVEX in 64-bit mode).
_VEX_PREFIX_SIZE = {0xC4: 3, 0xC5: 2, 0x62: 4}
_XOP_PREFIX = 0x8F


@dataclass(frozen=True)
class Insn:
    """One decoded x86_64 instruction, as Linux's ``struct insn`` would describe it.

    ``opcode`` follows Linux: one byte, ``0f xx`` or ``0f 38|3a xx``; for a VEX/EVEX/XOP
    instruction it is the single byte after that prefix (``vex`` holds the prefix).  Offsets
    (``opcode_offset``, ``disp_offset``) are from the first byte of the instruction, which
    includes a forced-emulation prefix when ``emulate_prefix`` is set.
    """

    address: int
    length: int
    bytes: bytes
    mnemonic: str
    op_str: str
    prefixes: bytes          # legacy prefixes, in order
    rex: int                 # the REX byte, 0 if none
    vex: bytes               # VEX/EVEX/XOP prefix, empty if none
    opcode_offset: int
    opcode: bytes
    modrm: int | None     # None if the opcode takes no ModRM byte
    addr_bytes: int          # 8, or 4 with an address-size (67) prefix
    disp_offset: int | None   # where the memory displacement starts, None if none
    disp_size: int               # 0, 1 or 4
    kind: InsnKind
    rel: int | None       # signed displacement of a relative branch, else None
    emulate_prefix: bool = False

    @property
    def next_address(self) -> int:
        """The address of the instruction that follows this one."""
        return self.address + self.length

    @property
    def modrm_mod(self) -> int | None:
        """ModRM.mod (0-3), or None without a ModRM byte."""
        return None if self.modrm is None else self.modrm >> 6

    @property
    def modrm_reg(self) -> int | None:
        """ModRM.reg (0-7, no REX.R), or None without a ModRM byte."""
        return None if self.modrm is None else (self.modrm >> 3) & 7

    @property
    def modrm_rm(self) -> int | None:
        """ModRM.rm (0-7, no REX.B), or None without a ModRM byte."""
        return None if self.modrm is None else self.modrm & 7

    @property
    def is_rip_relative(self) -> bool:
        """True if the memory operand is ``disp32(%rip)``."""
        return (self.modrm is not None and (self.modrm & 0xC7) == 0x05
                and self.disp_size == DISP32_SIZE)

    @property
    def displacement(self) -> int | None:
        """The signed memory displacement, or None if the instruction has none."""
        if self.disp_offset is None:
            return None
        raw = self.bytes[self.disp_offset:self.disp_offset + self.disp_size]
        return int.from_bytes(raw, "little", signed=True)

    @property
    def rip_target(self) -> int | None:
        """The absolute address a RIP-relative operand refers to, or None if not RIP-relative."""
        if not self.is_rip_relative:
            return None
        return (self.next_address + self.displacement) & _U64

    @property
    def branch_target(self) -> int | None:
        """The absolute target of a relative call/jmp/jcc/loop/jcxz, else None."""
        if self.rel is None:
            return None
        return (self.next_address + self.rel) & _U64

    @property
    def cond(self) -> int | None:
        """The condition nibble (0-15) of a jcc, else None."""
        if self.kind is not InsnKind.JCC_REL:
            return None
        return self.opcode[-1] & 0x0F

    @property
    def indirect_reg(self) -> int | None:
        """Register index (see ``GPR_NAMES``) of ``call/jmp *%reg``; None for other insns."""
        if self.kind not in (InsnKind.CALL_INDIRECT, InsnKind.JMP_INDIRECT):
            return None
        if self.modrm_mod != 3:
            return None
        return self.modrm_rm + (8 if self.rex & 0x01 else 0)

    @property
    def is_indirect_jump(self) -> bool:
        """True for ``ff /4``, ``ff /5`` and ``ea`` (what can_optimize forbids)."""
        return self.kind in _INDIRECT_JUMP_KINDS


_cs_local = threading.local()


def _capstone() -> capstone.Cs:
    # One handle per thread: capstone calls release the GIL and a handle is not reentrant.
    md = getattr(_cs_local, "md", None)
    if md is None:
        md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
        md.detail = True
        _cs_local.md = md
    return md


def _split_prefixes(code: bytes) -> tuple[bytes, int, bytes, int]:
    """Return (legacy prefixes, REX byte or 0, VEX prefix, offset of the opcode)."""
    pos = 0
    rex = 0
    while pos < len(code) and pos < MAX_INSN_SIZE:
        byte = code[pos]
        if byte in LEGACY_PREFIXES:
            rex = 0          # a REX byte only counts right before the opcode
        elif 0x40 <= byte <= 0x4F:
            rex = byte
        else:
            break
        pos += 1
    prefixes = bytes(b for b in code[:pos] if b in LEGACY_PREFIXES)
    vex = b""
    if pos < len(code):
        size = _VEX_PREFIX_SIZE.get(code[pos], 0)
        if code[pos] == _XOP_PREFIX and pos + 1 < len(code) and code[pos + 1] & 0x38:
            size = 3
        vex = code[pos:pos + size]
        pos += size
    return prefixes, rex, vex, pos


def _opcode_bytes(code: bytes, pos: int, vex: bytes) -> bytes:
    if vex:
        return code[pos:pos + 1]
    if code[pos:pos + 1] == b"\x0f":
        if code[pos + 1:pos + 2] in (b"\x38", b"\x3a"):
            return code[pos:pos + 3]
        return code[pos:pos + 2]
    return code[pos:pos + 1]


def _memory_operand(code: bytes, modrm_pos: int, opcode: bytes) -> tuple[int | None, int, int]:
    """Return (displacement offset or None, displacement size, ModRM+SIB+disp length)."""
    modrm = code[modrm_pos]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3 or opcode in REGISTER_ONLY_MODRM:
        return None, 0, 1
    pos = modrm_pos + 1
    if rm == 4:                                    # SIB follows
        if pos >= len(code):
            return None, 0, 1
        base = code[pos] & 7
        pos += 1
        size = {0: 4 if base == 5 else 0, 1: 1, 2: 4}[mod]
    else:
        size = {0: 4 if rm == 5 else 0, 1: 1, 2: 4}[mod]
    return (pos if size else None), size, pos + size - modrm_pos


def _decode_i64(code: bytes, address: int, opcode_pos: int,
                prefixes: bytes) -> tuple[int, str, int | None]:
    """Decode an opcode that is invalid in 64-bit mode but that Linux's decoder accepts.

    Returns (length, mnemonic, ModRM offset or None); raises InsnDecodeError otherwise.
    """
    entry = I64_OPCODES.get(code[opcode_pos]) if opcode_pos < len(code) else None
    if entry is None:
        raise InsnDecodeError(address, code)
    name, layout = entry
    end = opcode_pos + 1
    modrm_pos = None
    if layout == "ib":
        end += 1
    elif layout == "ptr":
        end += 2 + (2 if 0x66 in prefixes else 4)
    elif layout == "modrm_ib":
        if end >= len(code):
            raise InsnDecodeError(address, code, "truncated instruction")
        modrm_pos = end
        end += _memory_operand(code, modrm_pos, code[opcode_pos:end])[2] + 1
    if end > len(code):
        raise InsnDecodeError(address, code, "truncated instruction")
    return end, name, modrm_pos


def _decode_plain(code: bytes, address: int) -> Insn:
    prefixes, rex, vex, opcode_pos = _split_prefixes(code)
    if opcode_pos >= len(code):
        raise InsnDecodeError(address, code, "truncated instruction")
    opcode = _opcode_bytes(code, opcode_pos, vex)
    found = list(_capstone().disasm(code, address, count=1))
    if found:
        cs_insn = found[0]
        length, mnemonic, op_str = cs_insn.size, cs_insn.mnemonic, cs_insn.op_str
        modrm_pos = cs_insn.modrm_offset or None
    else:
        length, mnemonic, modrm_pos = _decode_i64(code, address, opcode_pos, prefixes)
        op_str = ""
    raw = bytes(code[:length])

    modrm = None
    disp_offset, disp_size = None, 0
    if modrm_pos is not None:
        modrm = raw[modrm_pos]
        disp_offset, disp_size, _ = _memory_operand(raw, modrm_pos, opcode)
        if disp_offset is not None and disp_offset + disp_size > length:
            raise InsnDecodeError(address, code, "inconsistent displacement")

    kind, rel = InsnKind.OTHER, None
    if not vex:
        # Linux classifies a VEX opcode byte as if it were a legacy one (VEX 0x70 would be
        # a "jcc"); we do not: VEX instructions are never control transfers.
        kind = _KIND_BY_OPCODE.get(opcode, InsnKind.OTHER)
        if modrm is not None:
            kind = _KIND_BY_GROUP.get((opcode, (modrm >> 3) & 7), kind)
            if opcode == b"\x0f\x01" and (modrm & 0x38) == 0 and (modrm >> 6) == 3:
                kind = InsnKind.VMX
        rel_size = _REL_SIZE.get(opcode)
        if rel_size is not None:
            rel = int.from_bytes(raw[length - rel_size:], "little", signed=True)

    return Insn(
        address=address,
        length=length,
        bytes=raw,
        mnemonic=mnemonic,
        op_str=op_str,
        prefixes=prefixes,
        rex=rex,
        vex=bytes(vex),
        opcode_offset=opcode_pos,
        opcode=bytes(opcode),
        modrm=modrm,
        addr_bytes=4 if 0x67 in prefixes else 8,
        disp_offset=disp_offset,
        disp_size=disp_size,
        kind=kind,
        rel=rel,
    )


def decode(code: bytes, address: int) -> Insn:
    """Decode the instruction at the start of ``code``, which lives at ``address``.

    At most ``MAX_INSN_SIZE`` bytes are looked at.  A forced-emulation prefix (``ud2`` +
    ``"xen"``/``"kvm"``) is decoded together with the instruction after it, as Linux does,
    and sets ``emulate_prefix``.  Returns the :class:`Insn`; raises :class:`InsnDecodeError`
    if the bytes are not one complete instruction.
    """
    code = bytes(code[:MAX_INSN_SIZE])
    for prefix in EMULATE_PREFIXES:
        if code.startswith(prefix) and len(code) > len(prefix):
            inner = _decode_plain(code[len(prefix):], address + len(prefix))
            shift = len(prefix)
            return replace(
                inner,
                address=address,
                length=inner.length + shift,
                bytes=prefix + inner.bytes,
                opcode_offset=inner.opcode_offset + shift,
                disp_offset=None if inner.disp_offset is None else inner.disp_offset + shift,
                emulate_prefix=True,
            )
    return _decode_plain(code, address)


def iter_insns(code: bytes, address: int) -> Iterator[Insn]:
    """Yield every instruction of ``code`` (e.g. a whole function) placed at ``address``.

    Raises :class:`InsnDecodeError` at the first offset that does not decode, including an
    instruction that would run past the end of ``code``.
    """
    offset = 0
    while offset < len(code):
        insn = decode(code[offset:offset + MAX_INSN_SIZE], address + offset)
        yield insn
        offset += insn.length


@dataclass(frozen=True)
class FunctionText:
    """A whole function decoded once from its start: the instructions up to the first
    offset that does not decode (``error`` says why, ``error_at`` where; both None when
    the whole function decodes).  What every probe in the function is checked against,
    so a function's text is decoded once however many probes it gets."""

    addr: int
    size: int
    insns: tuple[Insn, ...]
    error: str | None
    error_at: int | None
    #: the instructions by start address (the boundaries ``can_probe`` accepts)
    by_address: dict[int, Insn] = field(compare=False, repr=False)

    @classmethod
    def decode(cls, func_code: bytes, func_addr: int) -> "FunctionText":
        insns: list[Insn] = []
        error = error_at = None
        offset = 0
        while offset < len(func_code):
            try:
                insn = decode(func_code[offset:offset + MAX_INSN_SIZE], func_addr + offset)
            except InsnDecodeError as exc:
                error, error_at = str(exc), func_addr + offset
                break
            insns.append(insn)
            offset += insn.length
        return cls(func_addr, len(func_code), tuple(insns), error, error_at,
                   {insn.address: insn for insn in insns})


def check_boundary(func_code: bytes, func_addr: int, addr: int) -> bool:
    """Return True iff decoding from ``func_addr`` lands exactly on ``addr`` (can_probe).

    False means Linux's ``EILSEQ``: ``addr`` is outside ``func_code``, inside an instruction,
    or after bytes that do not decode.
    """
    if not func_addr <= addr < func_addr + len(func_code):
        return False
    offset, target = 0, addr - func_addr
    while offset < target:
        try:
            insn = decode(func_code[offset:offset + MAX_INSN_SIZE], func_addr + offset)
        except InsnDecodeError:
            return False
        offset += insn.length
    return offset == target


# --------------------------------------------------------------------------------------
# Copy rules, emulation choice and boosting
# --------------------------------------------------------------------------------------

class EmulateOp(enum.Enum):
    """How an emulated instruction is executed (Linux's ``kprobe_emulate_*`` family)."""

    IFMODIFIERS = "ifmodifiers"
    RET = "ret"
    CALL = "call"
    JMP = "jmp"
    JCC = "jcc"
    LOOP = "loop"
    CALL_INDIRECT = "call_indirect"
    JMP_INDIRECT = "jmp_indirect"


_EMULATE_OP: dict[InsnKind, EmulateOp] = {
    InsnKind.CLI: EmulateOp.IFMODIFIERS,
    InsnKind.STI: EmulateOp.IFMODIFIERS,
    InsnKind.PUSHF: EmulateOp.IFMODIFIERS,
    InsnKind.POPF: EmulateOp.IFMODIFIERS,
    InsnKind.RET: EmulateOp.RET,
    InsnKind.RET_IMM: EmulateOp.RET,
    InsnKind.LRET: EmulateOp.RET,
    InsnKind.LRET_IMM: EmulateOp.RET,
    InsnKind.CALL_REL: EmulateOp.CALL,
    InsnKind.JMP_REL: EmulateOp.JMP,
    InsnKind.JCC_REL: EmulateOp.JCC,
    InsnKind.LOOPNE: EmulateOp.LOOP,
    InsnKind.LOOPE: EmulateOp.LOOP,
    InsnKind.LOOP: EmulateOp.LOOP,
    InsnKind.JCXZ: EmulateOp.LOOP,
    InsnKind.CALL_INDIRECT: EmulateOp.CALL_INDIRECT,
    InsnKind.JMP_INDIRECT: EmulateOp.JMP_INDIRECT,
}

# Kinds kprobes refuses with EOPNOTSUPP (prepare_emulation), and why.
_NOT_SUPPORTED: dict[InsnKind, str] = {
    InsnKind.CALL_FAR: "far call absolute",
    InsnKind.JMP_FAR: "far jmp absolute",
    InsnKind.INT3: "int3",
    InsnKind.IRET: "iret in the kernel",
    InsnKind.VMX: "VM extension instruction",
    InsnKind.CALL_FAR_INDIRECT: "far indirect call",
    InsnKind.JMP_FAR_INDIRECT: "far indirect jmp",
}

# Kinds kprobes refuses to copy at all (EINVAL): single-stepping them would mask the trap.
_MASKING_EXCEPTION = frozenset({InsnKind.MOV_SS, InsnKind.POP_SS})


def _fits_s32(value: int) -> bool:
    return -(1 << 31) <= value < (1 << 31)


def _rebase_rip(code: bytearray, insn: Insn, new_address: int) -> None:
    new_disp = insn.displacement + insn.address - new_address
    if not _fits_s32(new_disp):
        raise ProbeError(
            errno.EINVAL,
            f"RIP-relative displacement of {insn.address:#x} does not fit in s32 "
            f"at {new_address:#x} ({new_disp:#x})",
        )
    start = insn.disp_offset
    code[start:start + DISP32_SIZE] = new_disp.to_bytes(DISP32_SIZE, "little", signed=True)


def copy_instruction(insn: Insn, real_address: int) -> bytes:
    """Return ``insn``'s bytes as they must be written at ``real_address`` (__copy_instruction).

    Only a RIP-relative displacement is re-based; relative branches are left as they are
    (kprobes emulates them instead of running the copy).  Raises ``ProbeError(EINVAL)`` for
    a forced-emulation prefix, ``int3`` (someone else's breakpoint), ``mov ss``/``pop ss``,
    or a displacement that no longer fits in 32 bits.
    """
    if insn.emulate_prefix:
        raise ProbeError(errno.EINVAL, f"forced-emulation prefix at {insn.address:#x}")
    if insn.opcode[0] == INT3_INSN_OPCODE and not insn.vex:
        raise ProbeError(errno.EINVAL, f"int3 at {insn.address:#x} (another breakpoint)")
    if insn.kind in _MASKING_EXCEPTION:
        raise ProbeError(errno.EINVAL, f"exception-masking {insn.mnemonic} at {insn.address:#x}")
    code = bytearray(insn.bytes)
    if insn.is_rip_relative:
        _rebase_rip(code, insn, real_address)
    return bytes(code)


@dataclass(frozen=True)
class InsnCopyPlan:
    """How a probed instruction is executed out of line.

    ``emulate_op`` is the emulation to run, or None when the instruction is single-stepped
    from its insn slot.  ``insn_slot`` is what to write into the slot (the copy followed by
    ``int3``), or None when :func:`prepare_copy` was given no slot address.
    """

    insn: Insn
    emulate_op: EmulateOp | None
    slot_address: int | None = None
    insn_slot: bytes | None = None

    @property
    def singlestep(self) -> bool:
        """True if the copy in the insn slot is executed (not emulated)."""
        return self.emulate_op is None

    @property
    def slot_size(self) -> int:
        """Bytes an insn slot needs: the instruction plus the trailing int3."""
        return self.insn.length + INT3_INSN_SIZE


def _emulate_op(insn: Insn) -> EmulateOp | None:
    why = _NOT_SUPPORTED.get(insn.kind)
    if why is not None:
        raise ProbeError(errno.EOPNOTSUPP, f"{why} at {insn.address:#x}")
    op = _EMULATE_OP.get(insn.kind)
    if op in (EmulateOp.CALL_INDIRECT, EmulateOp.JMP_INDIRECT):
        if insn.addr_bytes != 8:
            raise ProbeError(errno.EOPNOTSUPP,
                             f"indirect branch with 32-bit addressing at {insn.address:#x}")
        if insn.modrm_mod != 3:
            raise ProbeError(errno.EOPNOTSUPP,
                             f"indirect branch through memory at {insn.address:#x}")
    return op


def prepare_copy(insn: Insn, slot_address: int | None = None) -> InsnCopyPlan:
    """Apply the kprobe copy rules (arch_copy_kprobe) to ``insn``.

    Returns the :class:`InsnCopyPlan`; with ``slot_address`` it also holds the slot bytes.
    Raises :class:`~kprobefs.errors.ProbeError` with, in Linux's order:
    ``EINVAL`` for the :func:`copy_instruction` refusals (including a RIP-relative
    displacement that overflows at ``slot_address``); ``EOPNOTSUPP`` for far call/jmp
    absolute, int3, iret, VMX ``0f 01 /0 mod=3`` and the kernel's hypercall
    (``int $0x81``), ``ff /3``, ``ff /5`` and an indirect
    call/jmp through memory or with a 67 prefix; ``ENOSPC`` when a 15-byte instruction leaves
    no room for the trailing int3.
    """
    copy = copy_instruction(insn, insn.address if slot_address is None else slot_address)
    if insn.opcode == b"\xcd" and insn.bytes[-1] == HYPERCALL_VECTOR:
        # This kernel's hypercall, its vmcall: refused as 6.1 refuses VMX instructions
        # (a stepped hypercall would end the CPU's turn inside the step).
        raise ProbeError(errno.EOPNOTSUPP, f"hypercall at {insn.address:#x}")
    op = _emulate_op(insn)
    if MAX_INSN_SIZE - insn.length < INT3_INSN_SIZE:
        raise ProbeError(errno.ENOSPC, f"no room for int3 after {insn.address:#x}")
    slot = None if slot_address is None else copy + bytes([INT3_INSN_OPCODE])
    return InsnCopyPlan(insn=insn, emulate_op=op, slot_address=slot_address, insn_slot=slot)


def can_boost(insn: Insn, has_extable_entry: bool) -> bool:
    """Return True if ``insn`` may run from a copy that jumps straight back (Linux can_boost).

    Not boostable: anything with an exception-table entry; a two-byte ``0f xx`` opcode
    outside the boostable bitmap; any three-byte opcode; and, for one-byte opcodes (VEX
    instructions count as one-byte, as in Linux), a CS (2e) or address-size (67) prefix, the
    listed one-byte opcodes, and group 5 (``ff``) except ``jmp`` near indirect (``ff /4``).
    As in Linux the prefix test applies to one-byte opcodes only.
    """
    if has_extable_entry:
        return False
    if len(insn.opcode) == 2:
        return insn.opcode[1] in TWO_BYTE_BOOSTABLE
    if len(insn.opcode) != 1:
        return False
    if 0x2E in insn.prefixes or 0x67 in insn.prefixes:
        return False
    opcode = insn.opcode[0]
    if opcode == 0xFF:
        return insn.modrm_reg == 4
    return opcode not in ONE_BYTE_NOT_BOOSTABLE


# --------------------------------------------------------------------------------------
# Relocation and single-step fixups
# --------------------------------------------------------------------------------------

def _rel32(target: int, next_address: int, what: str) -> bytes:
    rel = target - next_address
    if not _fits_s32(rel):
        raise ProbeError(errno.EINVAL, f"{what}: target {target:#x} out of rel32 range")
    return rel.to_bytes(4, "little", signed=True)


def synthesize_reljump(from_address: int, to_address: int) -> bytes:
    """Return ``jmp rel32`` placed at ``from_address`` jumping to ``to_address``.

    Raises ``ProbeError(EINVAL)`` if the distance does not fit in 32 bits.
    """
    end = from_address + JMP32_INSN_SIZE
    return bytes([JMP32_INSN_OPCODE]) + _rel32(to_address, end, "reljump")


def synthesize_relcall(from_address: int, to_address: int) -> bytes:
    """Return ``call rel32`` placed at ``from_address`` calling ``to_address``.

    Raises ``ProbeError(EINVAL)`` if the distance does not fit in 32 bits.
    """
    end = from_address + JMP32_INSN_SIZE
    return bytes([CALL_INSN_OPCODE]) + _rel32(to_address, end, "relcall")


def _relocate_rel8(insn: Insn, new_address: int) -> bytes:
    """Re-base a rel8 branch, widening it to a rel32 form if the target is out of reach."""
    head = insn.bytes[:insn.opcode_offset]
    opcode = insn.opcode[0]
    target = insn.branch_target
    rel = target - (new_address + insn.length)
    if -128 <= rel < 128:
        return insn.bytes[:-1] + rel.to_bytes(1, "little", signed=True)
    if insn.kind is InsnKind.JMP_REL:                       # eb rel8 -> e9 rel32
        body = bytes([JMP32_INSN_OPCODE])
    elif insn.kind is InsnKind.JCC_REL:                     # 7x rel8 -> 0f 8x rel32
        body = bytes([0x0F, 0x80 | (opcode & 0x0F)])
    else:
        # loop/jcxz have no rel32 form: "loopX taken; jmp short over; taken: jmp rel32".
        head += bytes([opcode, 0x02, 0xEB, 0x05])
        body = bytes([JMP32_INSN_OPCODE])
    end = new_address + len(head) + len(body) + 4
    return head + body + _rel32(target, end, f"relocating {insn.address:#x}")


def relocate(insn: Insn, new_address: int) -> bytes:
    """Return the bytes that, placed at ``new_address``, behave as ``insn`` at its address.

    A RIP-relative displacement and the rel32 of ``call``/``jmp``/``jcc`` are re-based; a
    rel8 ``jmp``/``jcc`` keeps its form when the target is still within reach and becomes
    the rel32 form otherwise; ``loop*``/``jcxz`` then become a short sequence ending in
    ``jmp rel32``.  The result may thus be longer than ``insn``.  A relocated ``call``
    pushes the copy's next address, so it returns into the copy, not to the original.
    Raises ``ProbeError(EINVAL)`` when a displacement does not fit in 32 bits.
    """
    if insn.rel is not None:
        if _REL_SIZE[insn.opcode] == 1:
            return _relocate_rel8(insn, new_address)
        rel = _rel32(insn.branch_target, new_address + insn.length,
                     f"relocating {insn.address:#x}")
        return insn.bytes[:-4] + rel
    code = bytearray(insn.bytes)
    if insn.is_rip_relative:
        _rebase_rip(code, insn, new_address)
    return bytes(code)


@dataclass(frozen=True)
class SinglestepFixup:
    """What to repair after a copy of an instruction ran in its insn slot.

    ``ip`` is the corrected instruction pointer.  ``return_address`` is not None when the
    instruction was a call: the word at the (new) top of stack must be overwritten with it,
    since the call pushed the copy's next address instead of the original's.
    """

    ip: int
    return_address: int | None = None


# Per kind: (ip is relative to the copy and must be moved back, a return address was pushed).
_SINGLESTEP_FIXUP: dict[InsnKind, tuple[bool, bool]] = {
    InsnKind.RET: (False, False),
    InsnKind.RET_IMM: (False, False),
    InsnKind.LRET: (False, False),
    InsnKind.LRET_IMM: (False, False),
    InsnKind.IRET: (False, False),
    InsnKind.JMP_INDIRECT: (False, False),
    InsnKind.JMP_FAR_INDIRECT: (False, False),
    InsnKind.JMP_FAR: (False, False),
    InsnKind.CALL_INDIRECT: (False, True),
    InsnKind.CALL_FAR_INDIRECT: (False, True),
    InsnKind.CALL_FAR: (False, True),
    InsnKind.CALL_REL: (True, True),
}


def fixup_after_singlestep(insn: Insn, copy_addr: int, orig_addr: int, regs_ip: int,
                           *, after_int3: bool = True) -> SinglestepFixup:
    """Return where execution continues after the copy at ``copy_addr`` was single-stepped.

    ``regs_ip`` is the ip the CPU reported.  With ``after_int3`` (Linux 6.1: the copy is
    followed by ``int3`` and the trap reports the address after it) the int3 is stepped
    back over; pass ``after_int3=False`` for a trap-flag single step, where ``regs_ip`` is
    the next instruction to run.  For most instructions ``ip += orig - copy``; returns and
    indirect/far jumps and calls already hold an absolute ip and are left alone; calls also
    report the original next address as ``return_address``.  In 6.1 every ip-changing
    instruction kprobes accepts is emulated, so only the fall-through case is reached there.
    """
    moves_ip, pushes = _SINGLESTEP_FIXUP.get(insn.kind, (True, False))
    ip = regs_ip
    if moves_ip:
        ip += orig_addr - copy_addr - (INT3_INSN_SIZE if after_int3 else 0)
    return SinglestepFixup(
        ip=ip & _U64,
        return_address=orig_addr + insn.length if pushes else None,
    )


# --------------------------------------------------------------------------------------
# Emulation
# --------------------------------------------------------------------------------------

class EmulateRegs(Protocol):
    """The slice of ``struct pt_regs`` that :func:`emulate` reads and writes.

    ``ip``, ``sp``, ``flags`` and ``cx`` are unsigned 64-bit attributes.  ``get_reg(i)``
    returns general-purpose register ``i`` in encoding order (``GPR_NAMES``: ax, cx, dx,
    bx, sp, bp, si, di, r8-r15).  ``push(v)`` stores the 64-bit ``v`` below ``sp`` and
    lowers ``sp`` by 8; ``pop()`` reads the word at ``sp`` and raises ``sp`` by 8.  The
    kernel's int3 handler runs on a stack with room for the push; providing that room is
    the implementer's business.
    """

    ip: int
    sp: int
    flags: int
    cx: int

    def get_reg(self, index: int) -> int: ...

    def push(self, value: int) -> None: ...

    def pop(self) -> int: ...


# Condition tests indexed by cc >> 1 (jo, jb, je, jbe, js, jp, jl, jle); odd cc negates.
_JCC_TESTS: tuple[Callable[[int], bool], ...] = (
    lambda f: bool(f & X86_EFLAGS_OF),
    lambda f: bool(f & X86_EFLAGS_CF),
    lambda f: bool(f & X86_EFLAGS_ZF),
    lambda f: bool(f & (X86_EFLAGS_CF | X86_EFLAGS_ZF)),
    lambda f: bool(f & X86_EFLAGS_SF),
    lambda f: bool(f & X86_EFLAGS_PF),
    lambda f: bool(f & X86_EFLAGS_SF) != bool(f & X86_EFLAGS_OF),
    lambda f: bool(f & X86_EFLAGS_ZF) or bool(f & X86_EFLAGS_SF) != bool(f & X86_EFLAGS_OF),
)


def _jcc_taken(cc: int, flags: int) -> bool:
    return _JCC_TESTS[cc >> 1](flags) != bool(cc & 1)


def _emulate_ifmodifiers(insn: Insn, regs: EmulateRegs) -> int:
    kind = insn.kind
    if kind is InsnKind.CLI:
        regs.flags &= ~X86_EFLAGS_IF & _U64
    elif kind is InsnKind.STI:
        regs.flags |= X86_EFLAGS_IF
    elif kind is InsnKind.PUSHF:
        regs.push(regs.flags)
    else:
        regs.flags = regs.pop()
    return insn.next_address


def _emulate_ret(insn: Insn, regs: EmulateRegs) -> int:
    ip = regs.pop()
    if insn.kind in (InsnKind.LRET, InsnKind.LRET_IMM):
        regs.pop()                      # the code segment: we stay in kernel CS
    if insn.kind in (InsnKind.RET_IMM, InsnKind.LRET_IMM):
        imm = int.from_bytes(insn.bytes[-2:], "little")
        regs.sp = (regs.sp + imm) & _U64
    return ip


def _emulate_call(insn: Insn, regs: EmulateRegs) -> int:
    regs.push(insn.next_address)
    return insn.branch_target


def _emulate_jmp(insn: Insn, regs: EmulateRegs) -> int:
    return insn.branch_target


def _emulate_jcc(insn: Insn, regs: EmulateRegs) -> int:
    return insn.branch_target if _jcc_taken(insn.cond, regs.flags) else insn.next_address


def _emulate_loop(insn: Insn, regs: EmulateRegs) -> int:
    mask = (1 << (8 * insn.addr_bytes)) - 1
    count = regs.cx & mask
    if insn.kind is InsnKind.JCXZ:
        taken = count == 0
    else:
        count = (count - 1) & mask
        regs.cx = count           # a 32-bit count register write clears bits 63:32
        taken = count != 0
        zf = bool(regs.flags & X86_EFLAGS_ZF)
        if insn.kind is InsnKind.LOOPNE:
            taken = taken and not zf
        elif insn.kind is InsnKind.LOOPE:
            taken = taken and zf
    return insn.branch_target if taken else insn.next_address


def _emulate_call_indirect(insn: Insn, regs: EmulateRegs) -> int:
    target = regs.get_reg(insn.indirect_reg)     # read before the push: call *%rsp
    regs.push(insn.next_address)
    return target


def _emulate_jmp_indirect(insn: Insn, regs: EmulateRegs) -> int:
    return regs.get_reg(insn.indirect_reg)


_EMULATORS: dict[EmulateOp, Callable[[Insn, EmulateRegs], int]] = {
    EmulateOp.IFMODIFIERS: _emulate_ifmodifiers,
    EmulateOp.RET: _emulate_ret,
    EmulateOp.CALL: _emulate_call,
    EmulateOp.JMP: _emulate_jmp,
    EmulateOp.JCC: _emulate_jcc,
    EmulateOp.LOOP: _emulate_loop,
    EmulateOp.CALL_INDIRECT: _emulate_call_indirect,
    EmulateOp.JMP_INDIRECT: _emulate_jmp_indirect,
}


def emulate(insn: Insn, regs: EmulateRegs) -> int:
    """Execute ``insn`` on ``regs`` as kprobes does instead of single-stepping it.

    The instruction is taken to be at ``insn.address`` whatever ``regs.ip`` holds (after an
    int3 hit that is ``address + 1``).  Updates ``regs.ip`` and, as the instruction
    requires, ``flags``, ``cx``, ``sp`` and the stack (through ``push``/``pop``); returns the
    new ip.  Raises ``ValueError`` if ``insn`` is not an emulated kind (see
    :func:`prepare_copy`).  Unlike Linux 6.1, ``ret imm16``/``lret`` release their stack
    operands and ``loop`` tests the decremented count, as the CPU does.
    """
    op = _EMULATE_OP.get(insn.kind)
    if op is None or (op in (EmulateOp.CALL_INDIRECT, EmulateOp.JMP_INDIRECT)
                      and insn.indirect_reg is None):
        raise ValueError(f"{insn.mnemonic} {insn.op_str} at {insn.address:#x} is not emulated")
    ip = _EMULATORS[op](insn, regs) & _U64
    regs.ip = ip
    return ip


# --------------------------------------------------------------------------------------
# Jump optimization
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OptimizePlan:
    """The instructions a 5-byte jump at ``addr`` replaces, and how to copy them.

    ``insns`` are the whole instructions from ``addr`` covering at least 5 bytes; ``size``
    is their total length (Linux's ``optinsn.size``).
    """

    addr: int
    insns: tuple[Insn, ...]
    size: int

    def detour_copy(self, copy_address: int) -> bytes:
        """Return the copied instructions for ``copy_address`` plus the ``jmp`` back.

        This is what follows the register-save template in the detour buffer.  Raises
        ``ProbeError(EINVAL)`` if a RIP-relative displacement or the jump does not reach.
        """
        out = bytearray()
        for insn in self.insns:
            out += copy_instruction(insn, copy_address + len(out))
        out += synthesize_reljump(copy_address + len(out), self.addr + self.size)
        return bytes(out)


def _jumps_into(insn: Insn, start: int, end: int) -> bool:
    """True if ``insn`` is a relative jmp/jcc/loop/jcxz with a target in [start, end]."""
    return insn.kind in _RELATIVE_JUMP_KINDS and start <= insn.branch_target <= end


def can_optimize(func_code: bytes, func_addr: int, addr: int,
                 extable_addrs: Iterable[int], ftrace_sites: Iterable[int],
                 kprobe_addrs_in_region: Iterable[int] = (), *,
                 copy_address: int | None = None,
                 indirect_thunk: tuple[int, int] | None = None,
                 decoded: FunctionText | None = None,
                 ) -> tuple[OptimizePlan | None, str | None]:
    """Decide whether the probe at ``addr`` can become a 5-byte jump (opt.c checks).

    ``func_code`` is the whole containing function (original bytes) at ``func_addr``;
    ``extable_addrs`` are addresses with an exception-table entry; ``ftrace_sites`` the
    starts of 5-byte ftrace sites; ``kprobe_addrs_in_region`` addresses of other armed
    probes.  With ``copy_address`` (where the copied instructions will sit in the detour),
    RIP-relative displacements and the jump back must reach.  With ``indirect_thunk`` =
    ``(start, end)`` a relative jump into that range counts as an indirect jump (retpolines).

    ``decoded`` is the function already decoded (:class:`FunctionText`; ``func_code`` is
    then not looked at), to check many probes in one function without decoding it each
    time.

    Returns ``(plan, None)`` when optimizable, else ``(None, reason)`` with a reason for
    the log.
    """
    func_end = func_addr + (len(func_code) if decoded is None else decoded.size)
    if not func_addr <= addr < func_end:
        return None, f"{addr:#x} is not inside the function"
    if func_end - addr < JMP32_INSN_SIZE:
        return None, f"less than {JMP32_INSN_SIZE} bytes from {addr:#x} to the function end"

    extable = extable_addrs if isinstance(extable_addrs, (set, frozenset)) \
        else frozenset(extable_addrs)
    if decoded is None:
        decoded = FunctionText.decode(func_code, func_addr)
    region_start, region_end = addr + INT3_INSN_SIZE, addr + INT3_INSN_SIZE + DISP32_SIZE
    for insn in decoded.insns:
        here = insn.address
        if here in extable:
            return None, f"instruction at {here:#x} has an exception-table entry"
        if insn.is_indirect_jump or (
                indirect_thunk is not None and _jumps_into(insn, *indirect_thunk)):
            return None, f"indirect jump at {here:#x}"
        if _jumps_into(insn, region_start, region_end):
            return None, f"jump at {here:#x} into the optimized region"
    if decoded.error is not None:
        if decoded.error_at in extable:
            return None, f"instruction at {decoded.error_at:#x} has an exception-table entry"
        return None, f"function does not decode: {decoded.error}"

    by_address = decoded.by_address
    if addr not in by_address:
        return None, f"{addr:#x} is not an instruction boundary"
    covered: list[Insn] = []
    size = 0
    while size < JMP32_INSN_SIZE:
        insn = by_address[addr + size]
        try:
            copy_instruction(insn, insn.address if copy_address is None else copy_address + size)
        except ProbeError as exc:
            return None, f"cannot copy instruction at {insn.address:#x}: {exc.strerror}"
        if not can_boost(insn, insn.address in extable):
            return None, f"instruction at {insn.address:#x} ({insn.mnemonic}) is not boostable"
        covered.append(insn)
        size += insn.length

    for site in ftrace_sites:
        if site <= addr + size - 1 and addr <= site + JMP32_INSN_SIZE - 1:
            return None, f"region overlaps the ftrace site at {site:#x}"
    plan = OptimizePlan(addr=addr, insns=tuple(covered), size=size)
    if copy_address is not None:
        try:
            plan.detour_copy(copy_address)
        except ProbeError as exc:
            return None, f"detour out of reach: {exc.strerror}"
    for other in kprobe_addrs_in_region:
        if addr < other < addr + size:
            return None, f"another probe at {other:#x} inside the optimized region"
    return plan, None
