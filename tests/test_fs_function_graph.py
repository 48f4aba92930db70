"""The function_graph tracer and the function profiler through a real mount, driven by
a shell: the cat's own ksys_read and vfs_read in the graph, tracing_thresh, and
trace_stat filled by the profiler, which excludes the graph tracer (EBUSY)."""

import re

import pytest

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)

HEADER = ("# tracer: function_graph\n"
          "#\n"
          "# CPU  DURATION                  FUNCTION CALLS\n"
          "# |     |   |                     |   |   |   |\n")


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    sh(f"""
        echo nop > {t}/current_tracer
        echo 0 > {t}/function_profile_enabled
        echo > {t}/set_ftrace_filter; echo > {t}/set_graph_function
        echo 0 > {t}/tracing_thresh; echo 1 > {t}/tracing_on
    """)


def test_graph_of_the_shells_reads(t):
    r = sh(f"""
        set -e
        echo 'ksys_read vfs_read' > {t}/set_ftrace_filter
        echo function_graph > {t}/current_tracer
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(HEADER)
    lines = r.stdout[len(HEADER):].splitlines()
    assert any(re.fullmatch(r" \d\)               \|  ksys_read\(\) \{", line)
               for line in lines), lines
    assert any(re.fullmatch(r" \d\) [ +!#*@$] +\d+\.\d+ us +\|    vfs_read\(\);", line)
               for line in lines), lines
    assert any(re.fullmatch(r" \d\) [ +!#*@$] +\d+\.\d+ us +\|  \}", line)
               for line in lines), lines


def test_tracing_thresh_keeps_long_returns_only(t):
    r = sh(f"""
        set -e
        echo 'ksys_read vfs_read' > {t}/set_ftrace_filter
        echo 1 > {t}/tracing_thresh
        echo function_graph > {t}/current_tracer
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    lines = r.stdout[len(HEADER):].splitlines()
    assert lines and all(re.fullmatch(
        r" \d\) [ +!#*@$] +\d+\.\d+ us +\|  (  )?\} /\* (ksys_read|vfs_read) \*/", line)
        for line in lines), lines


def test_profiler_fills_trace_stat_and_excludes_the_graph(t):
    r = sh(f"""
        set -e
        echo 1 > {t}/function_profile_enabled
        cat {t}/README > /dev/null
        cat {t}/function_profile_enabled
        cat {t}/trace_stat/function0 {t}/trace_stat/function1
        echo function_graph > {t}/current_tracer || echo busy
        cat {t}/current_tracer
    """)
    assert r.returncode == 0, r.stderr
    assert "echo" in r.stderr             # dash says "I/O error" for any errno (EBUSY)
    assert r.stdout.startswith("1\n  Function                               Hit    Time     "
                               "       Avg             s^2\n")
    assert re.search(r"^  vfs_read {23}\s+\d+    \d+(\.\d+)? us ", r.stdout, re.M), r.stdout
    assert r.stdout.endswith("busy\nnop\n")
