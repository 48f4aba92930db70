"""The kernel with its kprobes engine: the Python API that mirrors Linux's.

``Kernel`` is the booted machine plus the engine (x86 arch injected here, as the daemon
does), with the kernel's function names as methods: register_kprobe, enable_kretprobe,
register_fprobe and the rest.  Failures raise OSError with Linux's errno.
"""

from __future__ import annotations

from .arch.x86.kprobes import X86Kprobes
from .kprobes import FprobeManager, FunctionGraph, KprobeEngine
from .machine import Kernel as Machine

__all__ = ["Kernel"]

_ENGINE_API = (
    "register_kprobe", "unregister_kprobe", "register_kprobes", "unregister_kprobes",
    "enable_kprobe", "disable_kprobe",
    "register_jprobe", "unregister_jprobe", "register_jprobes", "unregister_jprobes",
    "enable_jprobe", "disable_jprobe",
    "register_kretprobe", "unregister_kretprobe", "register_kretprobes",
    "unregister_kretprobes", "enable_kretprobe", "disable_kretprobe",
    "arm_all_kprobes", "disarm_all_kprobes", "wait_for_kprobe_optimizer",
)
_FPROBE_API = ("register_fprobe", "register_fprobe_ips", "register_fprobe_syms",
               "unregister_fprobe", "disable_fprobe", "enable_fprobe")


class Kernel(Machine):
    """The emulated kernel with kprobes.  Probe registration changes kernel text, so it
    takes the machine lock: call these from the driving thread or a hook."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kprobes = KprobeEngine(self, X86Kprobes)
        self.fprobes = FprobeManager(self.kprobes)
        self.fgraph = FunctionGraph(self.kprobes)


    # The engine's and the fprobe manager's functions are properties made below, not a
    # __getattr__: a class with __getattr__ slows every attribute lookup on the kernel,
    # and the probe hit paths make several.

    @property
    def kprobes_enabled(self) -> bool:
        """kprobes/enabled."""
        return not self.kprobes.kprobes_all_disarmed

    @property
    def kprobes_optimization(self) -> bool:
        """/proc/sys/debug/kprobes-optimization."""
        return self.kprobes.optimization_enabled

    @kprobes_optimization.setter
    def kprobes_optimization(self, on: bool) -> None:
        self.kprobes.set_optimization(bool(on))
        self.kprobes.wait_for_kprobe_optimizer()


def _delegate(owner: str, name: str) -> property:
    return property(lambda self: getattr(getattr(self, owner), name),
                    doc=f"The {owner} {name}.")


for _name in _ENGINE_API:
    setattr(Kernel, _name, _delegate("kprobes", _name))
for _name in _FPROBE_API:
    setattr(Kernel, _name, _delegate("fprobes", _name))
del _name
