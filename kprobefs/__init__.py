"""kprobefs: a kprobes engine and Linux's tracefs/debugfs, served over FUSE, running on an
emulated x86_64 kernel."""

from .machine import Kernel

__all__ = ["Kernel"]
