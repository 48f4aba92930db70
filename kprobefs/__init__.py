"""kprobefs: a kprobes engine and Linux's tracefs/debugfs, served over FUSE, running on an
emulated x86_64 kernel."""

from .kprobes import Fprobe, Jprobe, Kprobe, Kretprobe
from .system import Kernel

__all__ = ["Kernel", "Kprobe", "Jprobe", "Kretprobe", "Fprobe"]
