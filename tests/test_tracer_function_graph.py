"""The function_graph tracer and the function profiler over the real function graph
core (kprobes/fgraph.py) with a fake ftrace and fake return hooks: what they record,
and their text against Linux 6.1's formats."""

import errno
import os
import struct

import pytest

from kprobefs.kprobes import FunctionGraph
from kprobefs.tracing import Tracer
from kprobefs.tracing.tracers.function_graph_output import (
    format_duration, graph_header, GRAPH_FLAG_DEFAULTS,
)
from tracer_fakes import (
    Clock, FakeEngine, FakeFtrace, FakeKernel, KERNEL_CLONE, KSYS_READ, VFS_READ, cat, echo,
    node, write_errno,
)

HEADER = ("# tracer: function_graph\n"
          "#\n"
          "# CPU  DURATION                  FUNCTION CALLS\n"
          "# |     |   |                     |   |   |   |\n")


class _Rethook:
    """The rethook trampoline: hooked returns, innermost last."""

    def __init__(self):
        self.pending = []

    def hook_return(self, regs, entry_ip, on_exit):
        self.pending.append((entry_ip, on_exit))


class Machine:
    def __init__(self, nr_cpus=2):
        self.kernel = FakeKernel(nr_cpus)
        self.engine = FakeEngine(self.kernel)
        self.engine.ftrace = self.ftrace = FakeFtrace()
        self.engine.fprobes = self.rethook = _Rethook()
        self.fgraph = FunctionGraph(self.engine)
        self.clock = Clock()
        self.tracer = Tracer(self.engine, self.kernel, clock=self.clock,
                             pointer_key=b"test")
        self.root = self.tracer.tracefs_root()

    def enter(self, site, advance=1000):
        for ops in list(self.ftrace.attached.get(site, ())):
            ops.func(site, 0, ops, None)
        self.clock.advance(advance)

    def leave(self, site, advance=1000):
        """``site`` returns (through the trampoline if its return was hooked)."""
        if self.rethook.pending and self.rethook.pending[-1][0] == site:
            self.rethook.pending.pop()[1](None)
        self.clock.advance(advance)

    def call(self, site, took):
        """A leaf call: entered, returned ``took`` ns later."""
        hooked = len(self.rethook.pending)
        self.enter(site, took)
        if len(self.rethook.pending) > hooked:
            self.leave(site, 0)


@pytest.fixture
def m():
    return Machine()


def body(text):
    return [line for line in text.splitlines(keepends=True) if not line.startswith("#")]


def nested_calls(m):
    """ksys_read { vfs_read (5 us) } 12 us in all."""
    m.enter(KSYS_READ, 2000)
    m.call(VFS_READ, 5000)
    m.clock.advance(5000)
    m.leave(KSYS_READ)


def test_tracer_offered_and_events_formats(m):
    assert cat(m.root, "available_tracers") == "function_graph function nop\n"
    fmt = cat(m.root, "events/ftrace/funcgraph_entry/format")
    assert fmt.startswith("name: funcgraph_entry\nID: 11\n")
    assert "\tfield:int depth;\toffset:16;\tsize:4;\tsigned:1;\n" in fmt
    assert fmt.endswith('print fmt: "--> %ps (%d)", (void *)REC->func, REC->depth\n')
    fmt = cat(m.root, "events/ftrace/funcgraph_exit/format")
    assert "\tfield:unsigned long long rettime;\toffset:32;\tsize:8;\tsigned:0;\n" in fmt
    # instances do not offer it (graph_trace has no allow_instances)
    m.tracer.new_instance("foo")
    assert m.tracer.instances["foo"].available_tracers() == ["function", "nop"]


def test_nested_leaf_and_durations(m):
    echo(m.root, "current_tracer", "function_graph")
    nested_calls(m)
    assert cat(m.root, "trace") == HEADER + (
        " 0)               |  ksys_read() {\n"
        " 0)   5.000 us    |    vfs_read();\n"
        " 0) + 12.000 us   |  }\n")


def test_records_and_raw_layout(m):
    echo(m.root, "current_tracer", "function_graph")
    start = m.clock()
    nested_calls(m)
    records = [rec for _cpu, rec in m.tracer.top.buffer.snapshot()]
    assert [(rec[3].id, rec[4], rec[5]) for rec in records] == [
        (11, KSYS_READ, 0), (11, VFS_READ, 1), (10, VFS_READ, 1), (10, KSYS_READ, 0)]
    assert records[0][0] == start
    assert [rec[8] - rec[7] for rec in records[2:]] == [5000, 12000]
    entry, exit_ = records[1], records[2]
    assert struct.unpack_from("<Qi", entry[3].raw(entry), 8) == (VFS_READ, 1)
    assert struct.unpack_from("<QiIQQ", exit_[3].raw(exit_), 8) == (
        VFS_READ, 1, 0, *exit_[7:9])


def test_deeper_nesting_and_marks(m):
    echo(m.root, "current_tracer", "function_graph")
    m.enter(KERNEL_CLONE, 500)
    m.enter(KSYS_READ, 500)
    m.call(VFS_READ, 150_000)
    m.leave(KSYS_READ, 0)
    m.clock.advance(2_000_000)
    m.leave(KERNEL_CLONE)
    assert body(cat(m.root, "trace")) == [
        " 0)               |  kernel_clone() {\n",
        " 0)               |    ksys_read() {\n",
        " 0) ! 150.000 us  |      vfs_read();\n",
        " 0) ! 150.500 us  |    }\n",
        " 0) # 2151.000 us |  }\n"]


def test_task_switch_block_and_proc_column(m):
    echo(m.root, "current_tracer", "function_graph")
    m.call(VFS_READ, 1000)
    m.kernel.run_as(200, "cat")
    m.call(VFS_READ, 1000)
    assert body(cat(m.root, "trace")) == [
        " 0)   1.000 us    |  vfs_read();\n",
        " ------------------------------------------\n",
        " 0)    bash-100    =>    cat-200    \n",
        " ------------------------------------------\n",
        "\n",
        " 0)   1.000 us    |  vfs_read();\n"]
    echo(m.root, "options/funcgraph-proc", "1")
    echo(m.root, "options/funcgraph-cpu", "0")
    text = cat(m.root, "trace")
    assert "#  TASK/PID         DURATION                  FUNCTION CALLS\n" in text
    assert "#   |    |           |   |                     |   |   |   |\n" in text
    assert "   cat-200     |   1.000 us    |  vfs_read();\n" in text


def test_cpu_column_per_cpu(m):
    echo(m.root, "current_tracer", "function_graph")
    m.kernel.run_as(100, "bash", cpu=1)
    m.call(VFS_READ, 1000)
    assert body(cat(m.root, "trace")) == [" 1)   1.000 us    |  vfs_read();\n"]


def test_tail_option_and_unmatched_return(m):
    echo(m.root, "current_tracer", "function_graph")
    echo(m.root, "trace_options", "funcgraph-tail")
    nested_calls(m)
    assert body(cat(m.root, "trace"))[-1] == " 0) + 12.000 us   |  } /* ksys_read */\n"


def test_tracing_thresh_prints_only_long_returns(m):
    echo(m.root, "tracing_thresh", "10")
    echo(m.root, "current_tracer", "function_graph")
    nested_calls(m)
    assert body(cat(m.root, "trace")) == [" 0) + 12.000 us   |  } /* ksys_read */\n"]


def test_set_graph_function_traces_only_inside(m):
    echo(m.root, "set_graph_function", "ksys_read")
    assert cat(m.root, "set_graph_function") == "ksys_read\n"
    echo(m.root, "current_tracer", "function_graph")
    m.call(VFS_READ, 1000)                # outside ksys_read: not traced
    nested_calls(m)
    m.call(VFS_READ, 1000)
    assert body(cat(m.root, "trace")) == [
        " 0)               |  ksys_read() {\n",
        " 0)   5.000 us    |    vfs_read();\n",
        " 0) + 12.000 us   |  }\n"]


def test_set_graph_notrace_hides_nested(m):
    echo(m.root, "set_graph_notrace", "ksys_read")
    echo(m.root, "current_tracer", "function_graph")
    nested_calls(m)
    m.call(VFS_READ, 1000)
    assert body(cat(m.root, "trace")) == [" 0)   1.000 us    |  vfs_read();\n"]


def test_graph_filter_files_and_errors(m):
    assert cat(m.root, "set_graph_function") == "#### all functions enabled ####\n"
    assert cat(m.root, "set_graph_notrace") == "#### no functions disabled ####\n"
    assert write_errno(m.root, "set_graph_function", "no_such_function") == errno.EINVAL
    echo(m.root, "set_graph_function", "*read")
    assert cat(m.root, "set_graph_function") == "vfs_read\nksys_read\n"
    echo(m.root, "set_graph_function", "!vfs_read")
    assert cat(m.root, "set_graph_function") == "ksys_read\n"
    # unlike set_ftrace_filter, removing what is not there fails
    assert write_errno(m.root, "set_graph_function", "!vfs_read") == errno.EINVAL
    assert write_errno(m.root, "set_graph_notrace", "vfs_read:traceon") == errno.EINVAL
    node(m.root, "set_graph_function").open(os.O_WRONLY | os.O_TRUNC, 1, "sh").release()
    assert cat(m.root, "set_graph_function") == "#### all functions enabled ####\n"


def test_max_graph_depth(m):
    assert cat(m.root, "max_graph_depth") == "0\n"
    echo(m.root, "max_graph_depth", "1")
    echo(m.root, "current_tracer", "function_graph")
    nested_calls(m)
    assert body(cat(m.root, "trace")) == [" 0) + 12.000 us   |  ksys_read();\n"]
    echo(m.root, "max_graph_depth", "4294967295")
    assert cat(m.root, "max_graph_depth") == "-1\n"
    assert write_errno(m.root, "max_graph_depth", "-1") == errno.EINVAL


def test_set_ftrace_filter_and_pid_apply(m):
    echo(m.root, "set_ftrace_filter", "vfs_read")
    echo(m.root, "current_tracer", "function_graph")
    nested_calls(m)                       # ksys_read is not hooked
    assert body(cat(m.root, "trace")) == [" 0)   5.000 us    |  vfs_read();\n"]
    echo(m.root, "set_ftrace_filter", "", append=False)
    echo(m.root, "trace", "", append=False)
    echo(m.root, "set_ftrace_pid", "200")
    nested_calls(m)
    assert body(cat(m.root, "trace")) == []


def test_tracing_off_hooks_no_return(m):
    echo(m.root, "current_tracer", "function_graph")
    echo(m.root, "tracing_on", "0")
    m.enter(VFS_READ)
    assert m.rethook.pending == []


def test_options_files_and_trace_options(m):
    options = node(m.root, "options").children()
    for name in GRAPH_FLAG_DEFAULTS:
        assert cat(m.root, f"options/{name}") == f"{int(GRAPH_FLAG_DEFAULTS[name])}\n"
    assert "funcgraph-cpu" not in cat(m.root, "trace_options")
    assert write_errno(m.root, "trace_options", "funcgraph-proc") == errno.EINVAL
    echo(m.root, "current_tracer", "function_graph")
    text = cat(m.root, "trace_options")
    assert text.endswith("nofuncgraph-overrun\nfuncgraph-cpu\nfuncgraph-overhead\n"
                         "nofuncgraph-proc\nfuncgraph-duration\nnofuncgraph-abstime\n"
                         "funcgraph-irqs\nnofuncgraph-tail\nsleep-time\ngraph-time\n")
    echo(m.root, "trace_options", "nofuncgraph-duration")
    assert cat(m.root, "options/funcgraph-duration") == "0\n"
    assert write_errno(m.root, "options/funcgraph-duration", "2") == errno.EINVAL
    assert "funcgraph-tail" in options


def test_marker_is_a_comment(m):
    echo(m.root, "current_tracer", "function_graph")
    m.enter(KERNEL_CLONE)
    echo(m.root, "trace_marker", "at depth 0", pid=100)
    m.enter(KSYS_READ)
    echo(m.root, "trace_marker", "at depth 1", pid=100)
    m.leave(KSYS_READ)
    m.leave(KERNEL_CLONE)
    lines = body(cat(m.root, "trace"))
    # 6.1 indents a comment only below depth 0
    assert lines[1] == " 0)               |  /* at depth 0 */\n"
    assert lines[3] == " 0)               |      /* at depth 1 */\n"


def test_graph_and_profiler_exclude_each_other(m):
    echo(m.root, "current_tracer", "function_graph")
    assert write_errno(m.root, "function_profile_enabled", "1") == errno.EBUSY
    assert cat(m.root, "function_profile_enabled") == "0\n"
    echo(m.root, "current_tracer", "nop")
    echo(m.root, "function_profile_enabled", "1")
    assert write_errno(m.root, "current_tracer", "function_graph") == errno.EBUSY
    assert cat(m.root, "current_tracer") == "nop\n"


# ---- the function profiler -----------------------------------------------------------------
PROFILE_HEADER = (
    "  Function                               Hit    Time            Avg             s^2\n"
    "  --------                               ---    ----            ---             ---\n")


def test_profile_columns_and_order(m):
    assert cat(m.root, "trace_stat/function0") == PROFILE_HEADER
    echo(m.root, "function_profile_enabled", "1")
    m.call(VFS_READ, 1000)
    m.call(VFS_READ, 3000)
    nested_calls(m)                       # ksys_read 12 us, vfs_read 5 us more
    assert cat(m.root, "trace_stat/function0") == PROFILE_HEADER + (
        "  ksys_read                                1    12.000 us       12.000 us       "
        "0.000 us    \n"
        "  vfs_read                                 3    9.000 us        3.000 us        "
        "4.000 us    \n")
    assert cat(m.root, "trace_stat/function1") == PROFILE_HEADER
    echo(m.root, "function_profile_enabled", "0")
    m.call(VFS_READ, 1000)                # off: the numbers stay as they were
    assert "vfs_read                                 3 " in cat(m.root, "trace_stat/function0")
    echo(m.root, "function_profile_enabled", "1")   # on again: from zero
    assert cat(m.root, "trace_stat/function0") == PROFILE_HEADER


def test_profile_graph_time_off_subtracts_children(m):
    echo(m.root, "options/graph-time", "0")
    echo(m.root, "function_profile_enabled", "1")
    nested_calls(m)
    assert "  ksys_read                                1    7.000 us " in \
        cat(m.root, "trace_stat/function0")


def test_profile_follows_set_ftrace_filter(m):
    echo(m.root, "function_profile_enabled", "1")
    echo(m.root, "set_ftrace_filter", "ksys_read")
    nested_calls(m)
    assert [line.split()[0] for line in body(cat(m.root, "trace_stat/function0"))[2:]] \
        == ["ksys_read"]


# ---- the formats ---------------------------------------------------------------------------
@pytest.mark.parametrize("ns,text", [
    (5000, "5.000 us    "), (12_000, "12.000 us   "), (1_234_567, "1234.567 us "),
    (12_345_678, "12345.67 us "), (123_456_789, "123456.7 us "),
    (1_234_567_890, "1234567 us  "), (0, "0.000 us    ")])
def test_format_duration(ns, text):
    assert format_duration(ns) == text


def test_header_with_every_column():
    flags = dict(GRAPH_FLAG_DEFAULTS, **{"funcgraph-abstime": True, "funcgraph-proc": True})
    assert graph_header(flags, True) == (
        "#     TIME        CPU  TASK/PID         DURATION                  FUNCTION CALLS\n"
        "#      |          |     |    |           |   |                     |   |   |   |\n")
    assert graph_header(flags, False) == ""


def test_readme_lists_the_graph_files(m):
    assert "  max_graph_depth\t- Trace a limited depth of nested calls (0 is unlimited)\n" \
        in cat(m.root, "README")


def test_sleep_time_off_leaves_switched_out_time_out():
    """With options/sleep-time off, the time a task spends switched out (from its
    __switch_to away to the __switch_to back) is not in its calls' durations."""
    from types import SimpleNamespace
    m = Machine()
    switch = 0xFFFFFFFF81009000
    m.ftrace.sites = [switch]
    m.kernel.image.symbols.append(type(m.kernel.image.symbols[0])(switch, "__switch_to", 0x40))
    m.kernel.image.symbols.sort()
    m.kernel.kabi = {"task.pid": 0x10}
    task_100 = 0xFFFF888000002000
    task_200 = task_100 + 0x40
    m.kernel.mem[task_100] = struct.pack("<16xi44x16xi44x", 100, 200)
    echo(m.root, "options/sleep-time", "0")
    echo(m.root, "current_tracer", "function_graph")
    m.enter(KSYS_READ, 2000)
    for ops in m.ftrace.attached[switch]:           # bash (100) leaves
        ops.func(switch, 0, ops, SimpleNamespace(regs_get_kernel_argument=lambda n: task_200))
    m.clock.advance(50_000)
    m.kernel.run_as(200, "cat")
    for ops in m.ftrace.attached[switch]:           # and comes back
        ops.func(switch, 0, ops, SimpleNamespace(regs_get_kernel_argument=lambda n: task_100))
    m.kernel.run_as(100, "bash")
    m.clock.advance(1000)
    m.leave(KSYS_READ)
    assert body(cat(m.root, "trace"))[-1] == " 0)   3.000 us    |  ksys_read();\n"
    echo(m.root, "options/sleep-time", "1")
    assert not m.ftrace.attached[switch]


def test_tracing_cpumask_leaves_a_cpu_out(m):
    echo(m.root, "tracing_cpumask", "1")
    echo(m.root, "current_tracer", "function_graph")
    m.kernel.run_as(100, "bash", cpu=1)
    m.enter(VFS_READ)
    assert m.rethook.pending == []        # not recorded, so not hooked either
    m.kernel.run_as(100, "bash", cpu=0)
    m.call(VFS_READ, 1000)
    assert body(cat(m.root, "trace")) == [" 0)   1.000 us    |  vfs_read();\n"]
