"""The generic kprobes engine (kernel/kprobes.c, kernel/trace/fprobe.c): no instruction
bytes here; the arch implementation is injected."""

from .core import OPTIMIZE_DELAY, KprobeEngine, ListEntry
from .fgraph import FgraphOps, FtraceGraphEnt, FunctionGraph
from .fprobe import FprobeManager
from .ftrace import Ftrace, FtraceOps
from .probes import (
    FPROBE_FL_DISABLED, FPROBE_FL_KPROBE_SHARED, KPROBE_FLAG_DISABLED, KPROBE_FLAG_FTRACE,
    KPROBE_FLAG_GONE, KPROBE_FLAG_OPTIMIZED, MAX_STACK_SIZE, Fprobe, Jprobe, Kprobe,
    Kretprobe, KretprobeInstance,
)

__all__ = [
    "KprobeEngine", "ListEntry", "OPTIMIZE_DELAY", "FprobeManager", "Ftrace", "FtraceOps",
    "FgraphOps", "FtraceGraphEnt", "FunctionGraph",
    "Kprobe", "Jprobe", "Kretprobe", "KretprobeInstance", "Fprobe", "KPROBE_FLAG_GONE",
    "KPROBE_FLAG_DISABLED", "KPROBE_FLAG_OPTIMIZED", "KPROBE_FLAG_FTRACE",
    "FPROBE_FL_DISABLED", "FPROBE_FL_KPROBE_SHARED", "MAX_STACK_SIZE",
]
