"""kprobefs: a kprobes engine and Linux's tracefs/debugfs, served over FUSE, running on an
emulated x86_64 kernel.

The names below are imported when first used (PEP 562): the pytest plugin
(``kprobefs.testing``) and the command line import this package, and must not pay for
the emulator, capstone and lark at every start."""

import importlib

__all__ = ["Kernel", "Kprobe", "Jprobe", "Kretprobe", "Fprobe"]

_HOMES = {"Kernel": ".system", "Kprobe": ".kprobes", "Jprobe": ".kprobes",
          "Kretprobe": ".kprobes", "Fprobe": ".kprobes"}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'kprobefs' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
