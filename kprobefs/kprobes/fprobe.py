"""fprobe (fprobe.rst): one entry/exit handler pair on many functions, built on ftrace
ops for the entries and return hooks (rethook) for the exits."""

from __future__ import annotations

import errno
import fnmatch
from dataclasses import dataclass, field
from typing import Iterable

from ..errors import ProbeError
from .ftrace import FtraceOps
from .probes import FPROBE_FL_DISABLED, FPROBE_FL_KPROBE_SHARED, Fprobe

__all__ = ["FprobeManager", "rethook_return"]


@dataclass(eq=False)
class RethookNode:
    """One pending function exit of an fprobe."""

    fp: Fprobe | None
    entry_ip: int = 0
    ret_addr: int = 0
    slot: int = 0
    task: int = 0
    data: bytearray = field(default_factory=bytearray)


class FprobeManager:
    """register_fprobe and friends for one engine."""

    def __init__(self, engine):
        self.engine = engine
        self.kernel = engine.kernel
        self._pending: dict[int, list[RethookNode]] = {}   # pid -> exits, oldest first
        self._busy = [False] * self.kernel.nr_cpus         # the ftrace recursion lock
        self.kernel.exit_listeners.append(lambda pid: self._pending.pop(pid, None))
        engine.fprobes = self

    # ---- which functions ------------------------------------------------------------------
    def _traceable(self) -> dict[str, int]:
        """Name -> ftrace site of every traceable function (the first of duplicates)."""
        out: dict[str, int] = {}
        img = self.kernel.image
        for site in img.ftrace_sites:
            sym = img.symbol_at(site)
            if sym is not None:
                out.setdefault(sym.name, site)
        return out

    def register_fprobe(self, fp: Fprobe, filter: str | None, notfilter: str | None = None
                        ) -> None:
        """Attach fp to every traceable function matching the glob filter (and not
        notfilter).  EINVAL without a filter or with no match."""
        if not filter:
            raise ProbeError(errno.EINVAL, "register_fprobe needs a filter")
        sites = [site for name, site in self._traceable().items()
                 if _glob_any(name, filter) and not (notfilter and _glob_any(name, notfilter))]
        if not sites:
            raise ProbeError(errno.ENOENT, f"no traceable function matches {filter!r}")
        self._register(fp, sites)

    def register_fprobe_ips(self, fp: Fprobe, addrs: Iterable[int]) -> None:
        addrs = list(addrs)
        if not addrs:
            raise ProbeError(errno.EINVAL, "no addresses")
        for a in addrs:
            if not self.engine.ftrace.is_ftrace_location(a):
                raise ProbeError(errno.EINVAL, f"{a:#x} is not an ftrace location")
        self._register(fp, addrs)

    def register_fprobe_syms(self, fp: Fprobe, syms: list[str]) -> None:
        if not syms:
            raise ProbeError(errno.EINVAL, "no symbols")
        syms.sort()
        table = self._traceable()
        missing = [s for s in syms if s not in table]
        if missing:
            raise ProbeError(errno.ENOENT, f"not traceable: {', '.join(missing)}")
        self._register(fp, [table[s] for s in syms])

    def _register(self, fp: Fprobe, sites: list[int]) -> None:
        if fp.ops is not None:
            raise ProbeError(errno.EBUSY, "fprobe already registered")
        if fp.exit_handler is not None:
            size = fp.nr_maxactive or len(sites) * self.kernel.nr_cpus * 2
            fp.free_instances = [RethookNode(fp, data=bytearray(fp.entry_data_size))
                                 for _ in range(size)]
        ops = FtraceOps(func=self._fprobe_handler, filter=set(sites), private=fp)
        fp.ops = ops
        self.engine.ftrace.register_ftrace_function(ops)

    def unregister_fprobe(self, fp: Fprobe) -> None:
        """After this returns neither handler runs again, even for calls in flight."""
        if fp.ops is None:
            raise ProbeError(errno.EINVAL, "fprobe not registered")
        self.engine.ftrace.unregister_ftrace_function(fp.ops)
        fp.ops = None
        fp.free_instances = []
        for nodes in self._pending.values():
            for node in nodes:
                if node.fp is fp:
                    node.fp = None

    def disable_fprobe(self, fp: Fprobe) -> None:
        fp.flags |= FPROBE_FL_DISABLED

    def enable_fprobe(self, fp: Fprobe) -> None:
        fp.flags &= ~FPROBE_FL_DISABLED

    # ---- hits -----------------------------------------------------------------------------
    def _fprobe_handler(self, site: int, parent_ip: int, ops, regs) -> None:
        fp: Fprobe = ops.private
        if fp is None or fp.disabled():
            return
        cpu = self.kernel.cpu.index
        if self._busy[cpu] or (fp.flags & FPROBE_FL_KPROBE_SHARED
                               and self.engine.kprobe_running(cpu)):
            fp.nmissed += 1
            return
        node = None
        if fp.exit_handler is not None:
            if fp.free_instances:
                node = fp.free_instances.pop()
            else:
                fp.nmissed += 1
        data = node.data if node is not None and fp.entry_data_size else None
        self._busy[cpu] = True
        kcb = self.engine.kprobe_ctlblk(cpu)
        shared = fp.flags & FPROBE_FL_KPROBE_SHARED
        if shared:
            kcb.current, kcb.status = ops, "fprobe"
        try:
            cancel = fp.entry_handler(fp, site, regs, data) if fp.entry_handler else 0
        except Exception as e:
            self._handler_failed(fp, "entry", site, e)
            cancel = 1
        finally:
            self._busy[cpu] = False
            if shared:
                kcb.reset()
        if node is None:
            return
        if cancel:
            fp.free_instances.append(node)
            return
        node.entry_ip = site
        node.task = self.kernel.current_pid()
        node.ret_addr, node.slot = self.engine.arch.prepare_rethook(regs)
        self._pending.setdefault(node.task, []).append(node)

    def on_return(self, regs, slot: int) -> int:
        pid = self.kernel.current_pid()
        nodes = self._pending.get(pid, [])
        for i in range(len(nodes) - 1, -1, -1):
            if nodes[i].slot == slot:
                node = nodes.pop(i)
                break
        else:
            self.kernel.panicked = f"rethook trampoline: no node for {slot:#x}"
            return self.kernel.image.symbol_value("host_call_return")
        regs.ip = node.ret_addr
        fp = node.fp
        if fp is not None and fp.ops is not None:
            if not fp.disabled() and fp.exit_handler is not None:
                data = node.data if fp.entry_data_size else None
                try:
                    fp.exit_handler(fp, node.entry_ip, regs, data)
                except Exception as e:
                    self._handler_failed(fp, "exit", node.entry_ip, e)
            fp.free_instances.append(node)
        return node.ret_addr

    def _handler_failed(self, fp: Fprobe, which: str, site: int, exc: Exception) -> None:
        """fp's entry or exit handler raised at the function of ``site``: a miss, logged
        (rate-limited per fprobe) with the exception's traceback."""
        fp.nmissed += 1
        sym = self.kernel.image.symbol_at(site)
        where = sym.name if sym is not None else f"{site:#x}"
        self.engine.handler_errors.report(fp, which, f"{which} handler of fprobe on {where}",
                                          exc)


def _glob_any(name: str, patterns: str) -> bool:
    """ftrace filter globs: several patterns separated by spaces or commas."""
    return any(fnmatch.fnmatchcase(name, p) for p in patterns.replace(",", " ").split())


def rethook_return(engine, regs, slot: int) -> int:
    return engine.fprobes.on_return(regs, slot)
