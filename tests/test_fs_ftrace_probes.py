"""set_ftrace_filter commands through a real mount: function probes act on their trace
array whatever the current tracer, read back in 6.1's text, go with ``!FUNC:CMD``;
``:mod:`` waits for its module; bad commands fail with 6.1's errno."""

import errno
import os

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)


def test_a_traceoff_probe_stops_tracing_and_reads_back(real):
    t = f"{real}/tracing"
    try:
        # read without forking (a fork is what fires the probe)
        r = sh(f"echo 1 > {t}/tracing_on && echo 'kernel_clone:traceoff:1' > "
               f"{t}/set_ftrace_filter && while read l; do echo $l; done < "
               f"{t}/set_ftrace_filter && (true) && cat {t}/tracing_on && "
               f"cat {t}/set_ftrace_filter")
        assert r.returncode == 0, r.stderr
        assert r.stdout == ("#### all functions enabled ####\n"
                            "kernel_clone:traceoff:count=1\n"
                            "0\n"
                            "#### all functions enabled ####\n"
                            "kernel_clone:traceoff:count=0\n")
        assert sh(f"cat {t}/current_tracer").stdout == "nop\n"
    finally:
        sh(f"echo '!kernel_clone:traceoff:0' > {t}/set_ftrace_filter;"
           f" echo 1 > {t}/tracing_on")
    assert sh(f"cat {t}/set_ftrace_filter").stdout == "#### all functions enabled ####\n"


def test_an_instance_probe_acts_on_the_instance_only(real):
    t = f"{real}/tracing"
    i = f"{t}/instances/probes"
    r = sh(f"mkdir {i}")
    assert r.returncode == 0, r.stderr
    try:
        r = sh(f"echo 'kernel_clone:traceoff' > {i}/set_ftrace_filter && (true) && "
               f"cat {i}/tracing_on {t}/tracing_on && cat {t}/set_ftrace_filter")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "0\n1\n#### all functions enabled ####\n"
    finally:
        sh(f"echo '!kernel_clone:traceoff' > {i}/set_ftrace_filter; rmdir {i}")


def test_an_enable_event_probe_soft_enables_its_event(real):
    t = f"{real}/tracing"
    ev = f"{t}/events/sched/sched_process_fork/enable"
    try:
        r = sh(f"echo 'kernel_clone:enable_event:sched:sched_process_fork:2' > "
               f"{t}/set_ftrace_filter && read e < {ev} && echo $e && (true) && cat {ev} && "
               f"grep enable_event {t}/set_ftrace_filter")
        assert r.returncode == 0, r.stderr
        assert r.stdout == ("0*\n1*\n"
                            "kernel_clone:enable_event:sched:sched_process_fork:count=1\n")
        sh(f"echo '!kernel_clone:enable_event:sched:sched_process_fork:1' > "
           f"{t}/set_ftrace_filter")
        # as in 6.1, leaving soft mode keeps the event as the probe left it: enabled
        assert sh(f"cat {ev}").stdout == "1\n"
        assert "enable_event" not in sh(f"cat {t}/set_ftrace_filter").stdout
    finally:
        sh(f"echo '!kernel_clone:enable_event:sched:sched_process_fork:1' > "
           f"{t}/set_ftrace_filter; echo 0 > {ev}")


def test_mod_waits_for_its_module(real):
    t = f"{real}/tracing"
    ctl = f"{real}/kprobefs/modules"
    try:
        r = sh(f"echo '*:mod:trace_printk' > {t}/set_ftrace_filter && "
               f"cat {t}/set_ftrace_filter && echo 'load trace_printk' > {ctl} && "
               f"cat {t}/set_ftrace_filter && echo 'unload trace_printk' > {ctl} && "
               f"cat {t}/set_ftrace_filter | wc -l")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        # a waiting :mod: makes the filter non-empty (FTRACE_HASH_FL_MOD)
        assert lines[0] == "*:mod:trace_printk"
        assert "trace_printk_irq_work [trace_printk]" in lines[1:-1]
        assert lines[-1] == "0"
    finally:
        sh(f"echo 'unload trace_printk' > {ctl} 2>/dev/null; echo > {t}/set_ftrace_filter")


def _write_errno(path: str, text: str) -> int:
    """The errno of one write(2) of ``text`` to ``path`` (0: it succeeded); dash's echo
    reports every failed write as an I/O error."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, text.encode())
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
    return 0


def test_bad_commands_fail_with_linux_errnos(real):
    t = f"{real}/tracing"
    for command, err in (("kernel_clone:nosuch", errno.EINVAL),
                         ("nosuch_function:traceoff", errno.EINVAL),
                         ("kernel_clone:traceoff:x", errno.EINVAL),
                         ("kernel_clone:enable_event:sched", errno.EINVAL),
                         ("kernel_clone:enable_event:sched:nosuch", errno.EINVAL),
                         ("!kernel_clone:snapshot", errno.ENODEV)):
        assert _write_errno(f"{t}/set_ftrace_filter", command + "\n") == err, command
    assert _write_errno(f"{t}/set_ftrace_notrace", "kernel_clone:traceoff\n") == \
        errno.EINVAL
    assert _write_errno(f"{t}/set_ftrace_filter", "kernel_clone:traceoff\n") == 0
    try:
        # the kind has the function already: EINVAL, as 6.1 adds nothing
        assert _write_errno(f"{t}/set_ftrace_filter", "kernel_clone:traceoff\n") == \
            errno.EINVAL
        assert _write_errno(f"{t}/set_ftrace_filter", "!vfs_read:traceoff\n") == \
            errno.EINVAL
    finally:
        sh(f"echo '!kernel_clone:traceoff' > {t}/set_ftrace_filter; echo 1 > {t}/tracing_on")
    assert sh(f"cat {t}/set_ftrace_filter").stdout == "#### all functions enabled ####\n"


def test_dump_prints_the_buffer_to_the_kernel_log_and_stops_tracing(real):
    t = f"{real}/tracing"
    fork = f"{t}/events/sched/sched_process_fork/enable"
    try:
        r = sh(f"echo 1 > {fork} && (true) && echo 0 > {fork} && "
               f"echo 'kernel_clone:dump' > {t}/set_ftrace_filter && (true) && "
               f"cat {t}/tracing_on {t}/set_ftrace_filter && cat {real}/dev/kmsg")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[:3] == ["0", "#### all functions enabled ####",
                             "kernel_clone:dump:count=0"]
        kmsg = [line.split(";", 1)[1] for line in lines[3:] if line.startswith("0,")]
        at = kmsg.index("Dumping ftrace buffer:")
        assert kmsg[at + 1] == "---------------------------------"
        assert "sched_process_fork: comm=" in kmsg[at + 2]
        assert kmsg[-1] == "---------------------------------"
        assert sh(f"grep -vc '^#' {t}/trace").stdout == "0\n"   # consumed
    finally:
        sh(f"echo '!kernel_clone:dump' > {t}/set_ftrace_filter; echo 0 > {fork};"
           f" echo 1 > {t}/tracing_on")


def test_an_instance_goes_with_its_probes(real):
    t = f"{real}/tracing"
    i = f"{t}/instances/probes2"
    ev = "events/sched/sched_process_fork/enable"
    try:
        r = sh(f"mkdir {i} && echo 'kernel_clone:enable_event:sched:sched_process_fork' > "
               f"{i}/set_ftrace_filter && read e < {i}/{ev} && echo $e && rmdir {i} && "
               f"cat {t}/{ev} && mkdir {i} && cat {i}/set_ftrace_filter {i}/{ev}")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "0*\n0\n#### all functions enabled ####\n0\n"
    finally:
        sh(f"rmdir {i}")
