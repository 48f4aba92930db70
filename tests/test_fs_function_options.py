"""The function tracer's options and its filter files through a real mount, driven by
a shell: options/func_stack_trace (a stack record after each entry, the traced
function first), options/latency-format on the function tracer's trace, and
set_graph_function's EINVAL for a function with no ftrace site."""

import re

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    sh(f"""
        echo nop > {t}/current_tracer
        echo 0 > {t}/options/func_stack_trace; echo 0 > {t}/options/latency-format
        echo > {t}/set_ftrace_filter; echo > {t}/set_graph_function
        echo 1 > {t}/tracing_on; rmdir {t}/instances/fst 2>/dev/null
    """)


def test_func_stack_trace_follows_each_entry_with_its_stack(t):
    r = sh(f"""
        set -e
        cat {t}/options/func_stack_trace
        grep func_stack_trace {t}/trace_options || echo none
        echo vfs_read > {t}/set_ftrace_filter
        echo function > {t}/current_tracer
        grep func_stack_trace {t}/trace_options
        echo 1 > {t}/options/func_stack_trace
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    head, _, trace = r.stdout.partition("# tracer: function\n")
    assert head == "0\nnone\nnofunc_stack_trace\n"
    lines = [line for line in trace.splitlines() if not line.startswith("#")]
    entry = next(i for i, line in enumerate(lines)
                 if re.search(r"^ +cat-\d+ .*: vfs_read <-ksys_read$", line))
    assert re.search(r"\[\d{3}\] \S{5} +\d+\.\d{6}: <stack trace>$", lines[entry + 1])
    assert lines[entry + 2] == " => vfs_read"
    assert lines[entry + 3] == " => ksys_read"


def test_func_stack_trace_off_records_entries_only(t):
    r = sh(f"""
        set -e
        echo vfs_read > {t}/set_ftrace_filter
        echo function > {t}/current_tracer
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    assert ": vfs_read <-ksys_read" in r.stdout
    assert "<stack trace>" not in r.stdout


def test_func_stack_trace_is_one_value_for_every_instance(t):
    # 6.1's func_flags is the function tracer's, not an array's
    r = sh(f"""
        set -e
        mkdir {t}/instances/fst
        echo 1 > {t}/options/func_stack_trace
        cat {t}/instances/fst/options/func_stack_trace
        echo 0 > {t}/instances/fst/options/func_stack_trace
        cat {t}/options/func_stack_trace
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "1\n0\n"
