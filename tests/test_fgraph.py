"""The function graph core (kprobes/fgraph.py) on the real kernel: entries through the
ftrace sites, returns through the rethook trampoline, one user at a time."""

import errno
from collections import Counter

import pytest

from kprobefs import Kernel
from kprobefs.errors import ProbeError
from kprobefs.kprobes import FgraphOps
from kprobefs.machine import UserBuffer
from kprobefs.machine.abi import AT_FDCWD, O_CREAT, O_RDWR


@pytest.fixture(scope="module")
def kernel():
    return Kernel(cpus=2, seed=0)


def test_every_function_is_entered_and_returns(kernel):
    """The whole kernel under the graph: file system calls and the task switches they
    cause run as before, every call that returned was entered, and a nested call's
    depth is its parent's plus one."""
    image = kernel.image
    name = lambda site: image.symbol_at(site).name    # noqa: E731
    entered, returned, nesting = Counter(), Counter(), set()

    def entry(ent):
        entered[name(ent.func)] += 1
        if ent.parent is not None:
            assert ent.depth == ent.parent.depth + 1
            nesting.add((name(ent.parent.func), name(ent.func)))
        else:
            assert ent.depth == 0
        return True

    gops = FgraphOps(entry, lambda ent: returned.update([name(ent.func)]))
    kernel.fgraph.register_ftrace_graph(gops, set(image.ftrace_sites))
    try:
        t = kernel.spawn("graphed")
        fd = kernel.syscall(t, "openat", AT_FDCWD, "/tmp/graphed", O_CREAT | O_RDWR, 0o644)
        assert kernel.syscall(t, "write", fd, b"0123456789", 10) == 10
        kernel.syscall(t, "lseek", fd, 0, 0)
        buf = UserBuffer(10)
        assert kernel.syscall(t, "read", fd, buf, 10) == 10
        assert buf.data == b"0123456789"
    finally:
        kernel.fgraph.unregister_ftrace_graph(gops)
    assert returned["vfs_write"] == entered["vfs_write"] >= 1
    assert ("ksys_write", "vfs_write") in nesting
    assert all(returned[f] <= entered[f] for f in returned)
    assert "__switch_to" not in entered            # __notrace_funcgraph, as in 6.1
    assert entered["__schedule"] >= 1
    assert not kernel.kprobes.ftrace.enabled_sites()


def test_one_user_at_a_time(kernel):
    first = FgraphOps(lambda ent: False, lambda ent: None)
    second = FgraphOps(lambda ent: False, lambda ent: None)
    sites = set(kernel.image.ftrace_sites[:3])
    kernel.fgraph.register_ftrace_graph(first, sites)
    try:
        with pytest.raises(ProbeError) as exc:
            kernel.fgraph.register_ftrace_graph(second, sites)
        assert exc.value.errno == errno.EBUSY
    finally:
        kernel.fgraph.unregister_ftrace_graph(first)
    kernel.fgraph.register_ftrace_graph(second, sites)
    kernel.fgraph.unregister_ftrace_graph(second)
