"""The x86_64 implementation of the kprobes arch contract (the only place besides the
machine that looks at instruction bytes; capstone lives here)."""

from .insn import (
    EmulateOp, EmulateRegs, Insn, InsnCopyPlan, InsnDecodeError, InsnKind, OptimizePlan,
    SinglestepFixup, can_boost, can_optimize, check_boundary, copy_instruction, decode,
    emulate, fixup_after_singlestep, iter_insns, prepare_copy, relocate, synthesize_relcall,
    synthesize_reljump,
)

__all__ = [
    "Insn", "InsnKind", "InsnDecodeError", "decode", "iter_insns", "check_boundary",
    "prepare_copy", "InsnCopyPlan", "EmulateOp", "can_boost", "copy_instruction", "relocate",
    "fixup_after_singlestep", "SinglestepFixup", "emulate", "EmulateRegs", "can_optimize",
    "OptimizePlan", "synthesize_reljump", "synthesize_relcall",
]
