"""The filesystem layer: a FUSE-free tree of nodes served to the emulated kernel through
the hostfs hypercalls (:mod:`.tree`), the syscall gateway that runs each request of a host
process as a system call of the emulated kernel (:mod:`.gateway`), the mirror of the host
processes' scheduling into their tasks (:mod:`.schedwatch`), and the two FUSE loops
that serve the gateway: :mod:`.fuse_ll` on /dev/fuse itself (the default) and
:mod:`.fuse_ops` through fusepy and libfuse2 (the only module importing fusepy); import
them explicitly."""

from .gateway import Attributes, Caller, Gateway
from .schedwatch import KernelMirror, SchedWatch
from .tree import (
    DEBUGFS_ROOT, PROC_ROOT, TRACEFS_ROOT, BoolKnob, Directory, HostFS, IntKnob, TextFile,
    build_tree, kstrtobool, kstrtol, kstrtoul,
)

__all__ = [
    "build_tree", "HostFS", "Directory", "TextFile", "BoolKnob", "IntKnob", "kstrtobool",
    "kstrtoul", "kstrtol", "DEBUGFS_ROOT", "TRACEFS_ROOT", "PROC_ROOT", "Gateway", "Caller",
    "Attributes", "SchedWatch", "KernelMirror",
]
