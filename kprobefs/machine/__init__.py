"""The emulated machine: the only package that imports unicorn."""

from .image import KernelImage, Symbol
from .kernel import Cpu, Kernel, ProcessExited, SyscallRequest, Task, UserBuffer
from .memory import FaultError

__all__ = ["Kernel", "KernelImage", "Symbol", "Task", "UserBuffer", "SyscallRequest", "Cpu",
           "ProcessExited", "FaultError"]
