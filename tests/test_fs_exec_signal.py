"""A host process's exec and exit, as the emulated kernel sees them through a real mount:
an exec is an execve (do_execve names the task), a child's exit sends SIGCHLD to its
parent (signal:signal_generate, ignored by default: res=1)."""

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)


def test_an_exec_runs_do_execve_with_the_new_name(real):
    t = f"{real}/tracing"
    # the exec is mirrored at the exec'd process's first request after the host's
    # process event arrives: the sleep lets it arrive before the second read
    script = (f"read x < {t}/tracing_on; exec bash -c 'read x < {t}/tracing_on; "
              f"sleep 0.3; read y < {t}/tracing_on'")
    try:
        r = sh(f"echo 'do_execve* __set_task_comm' > {t}/set_ftrace_filter && "
               f"cat {t}/set_ftrace_filter && echo function > {t}/current_tracer && "
               f"sh -c \"{script}\" && echo 0 > {t}/tracing_on && cat {t}/trace")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[:3] == ["do_execveat_common.constprop.0", "do_execve",
                             "__set_task_comm"]
        calls = [l.split(":", 1)[1].strip() for l in lines[3:] if not l.startswith("#")]
        assert "do_execve <-__x64_sys_execve" in calls, calls
        assert "__set_task_comm <-do_execveat_common.constprop.0" in calls, calls
    finally:
        sh(f"echo nop > {t}/current_tracer; echo > {t}/set_ftrace_filter;"
           f" echo 1 > {t}/tracing_on")


def test_a_child_exit_signals_its_parent(real):
    t = f"{real}/tracing"
    ev = f"{t}/events/signal/signal_generate"
    try:
        r = sh(f"echo > {t}/trace && echo 1 > {ev}/enable && (true) && "
               f"echo 0 > {ev}/enable && echo $$ && cat {t}/trace")
        assert r.returncode == 0, r.stderr
        shell, _, trace = r.stdout.partition("\n")
        lines = [l for l in trace.splitlines() if "signal_generate:" in l]
        assert any(l.endswith(f"sig=17 errno=0 code=1 comm=sh pid={shell} grp=1 res=1")
                   for l in lines), lines
    finally:
        sh(f"echo 0 > {ev}/enable")
