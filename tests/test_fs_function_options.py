"""The function tracer's options and its filter files through a real mount, driven by
a shell: options/func_stack_trace (a stack record after each entry, the traced
function first), options/latency-format on the function tracer's trace, and
set_graph_function's EINVAL for a function with no ftrace site, options/func-no-repeats
(a call repeated on a CPU printed once, then a func_repeats line)."""

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
        echo 0 > {t}/options/func-no-repeats
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


LAT_HEADER = re.compile(
    r"# tracer: function\n#\n"
    r"# function latency trace v1\.1\.5 on \S+\n"
    r"# -{68}\n"
    r"# latency: 0 us, #(\d+)/\1, CPU#0 \| \(M:desktop VP:0, KP:0, SP:0 HP:0 #P:\d+\)\n"
    r"#    -----------------\n"
    r"#    \| task: -0 \(uid:0 nice:0 policy:0 rt_prio:0\)\n"
    r"#    -----------------\n"
    r"#\n"
    r"#                    _------=> CPU#            \n")


def test_latency_format_prints_the_latency_header_and_columns(t):
    r = sh(f"""
        set -e
        cat {t}/options/latency-format
        grep latency-format {t}/trace_options
        echo vfs_read > {t}/set_ftrace_filter
        echo function > {t}/current_tracer
        echo 1 > {t}/options/latency-format
        cat {t}/trace
        echo ===
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    head, _, rest = r.stdout.partition("===\n")
    # an empty buffer: the tracer line only, as trace_default_header
    assert head == "0\nnolatency-format\n# tracer: function\n#\n"
    assert LAT_HEADER.match(rest), rest
    lines = [line for line in rest.splitlines() if not line.startswith("#")]
    assert lines and all(re.fullmatch(
        r" *\S+-\d+ +\d+[.dNnhHs0-9]{5} +\d+us[ +!#*@$]: vfs_read <-ksys_read", line)
        for line in lines), lines
    assert re.search(r"\s0us[ +!#*@$]: ", lines[0]), lines[0]     # from the first record


def test_set_graph_function_of_an_untraceable_function_is_einval(t):
    # asm_common_interrupt is in kallsyms but has no ftrace site (noinstr), as 6.1's;
    # bash prints the errno (dash's echo says "I/O error" for any)
    r = sh(f"""
        grep -c ' asm_common_interrupt$' {t}/../proc/kallsyms
        grep -c '^asm_common_interrupt$' {t}/available_filter_functions
        echo vfs_read > {t}/set_graph_function
        for f in set_graph_function set_graph_notrace; do
            bash -c "echo asm_common_interrupt >> {t}/$f" 2>&1
            bash -c "echo 'asm_exc_*' >> {t}/$f" 2>&1
        done
        cat {t}/set_graph_function {t}/set_graph_notrace
    """)
    assert r.stdout.replace(t + "/", "") == (
        "1\n0\n" + "bash: line 1: echo: write error: Invalid argument\n" * 4
        + "vfs_read\n#### no functions disabled ####\n"), r.stdout


def _exit_files_run(t, no_repeats):
    """The cat's lines from its exit_files on, of a trace of pick_file (called for each
    slot of its descriptor table) and the calls around it."""
    r = sh(f"""
        set -e
        echo {no_repeats} > {t}/options/func-no-repeats
        echo 'pick_file* exit_files exit_fs' > {t}/set_ftrace_filter
        echo function > {t}/current_tracer
        grep -e func_ -e func- {t}/trace_options
        cat {t}/README > /dev/null
        echo 0 > {t}/tracing_on
        cat {t}/trace
        echo nop > {t}/current_tracer; echo 1 > {t}/tracing_on
    """)
    assert r.returncode == 0, r.stderr
    head, _, trace = r.stdout.partition("# tracer: function\n")
    assert head == f"nofunc_stack_trace\n{'' if no_repeats else 'no'}func-no-repeats\n"
    lines = [line for line in trace.splitlines() if re.match(r" +cat-\d+ ", line)]
    start = next(i for i, line in enumerate(lines) if line.endswith(": exit_files <-do_exit"))
    return [line.split("]", 1)[1] for line in lines[start:]]


def test_func_no_repeats_prints_a_repeated_call_once_and_its_count(t):
    lines = _exit_files_run(t, 1)
    assert len(lines) == 4, lines
    first = re.fullmatch(r" \.{5} +(\d+\.\d{6}): pick_file\.part\.0 <-exit_files", lines[1])
    repeats = re.fullmatch(r" \.{5} +(\d+\.\d{6}): pick_file\.part\.0 <-exit_files "
                           r"\(repeats: (\d+), last_ts: +(\d+\.\d{6})\)", lines[2])
    after = re.fullmatch(r" \.{5} +(\d+\.\d{6}): exit_fs <-do_exit", lines[3])
    assert first and repeats and after, lines
    # written as the next other call is, with the time of the last repeat
    assert repeats[1] == after[1]
    assert float(first[1]) <= float(repeats[3]) <= float(repeats[1])
    count = int(repeats[2])
    assert count > 1
    # with the option off every call is printed: as many as were counted, plus one
    calls = [line.split(": ", 1)[1] for line in _exit_files_run(t, 0)]
    assert calls == ["exit_files <-do_exit", *["pick_file.part.0 <-exit_files"] * (count + 1),
                     "exit_fs <-do_exit"]
