"""Event probes through a real mount: ``e:`` written to dynamic_events with a shell, on
the kernel's syscall events; the trace shows what the probe fetched from each record
(a user string behind the attached event's pointer field), and a host ``cd`` into the
mount reaches the kernel as a chdir(2)."""

from test_fs_mount import _need_fuse, real, sh  # noqa: F401  (fixtures)


def test_an_eprobe_on_chdir_records_the_path(real):
    t = f"{real}/tracing"
    probe = "e:ech syscalls/sys_enter_chdir file=+0($filename):ustring"
    try:
        r = sh(f"echo '{probe}' >> {t}/dynamic_events && echo > {t}/trace"
               f" && echo 1 > {t}/events/eprobes/ech/enable"
               f" && cd {t} && echo 0 > {t}/events/eprobes/ech/enable"
               f" && cat {t}/dynamic_events {t}/trace")
        assert r.returncode == 0, r.stderr
        assert "e:eprobes/ech syscalls.sys_enter_chdir file=+0($filename):ustring\n" in r.stdout
        assert ': ech: (syscalls.sys_enter_chdir) file="/sys/kernel/tracing"\n' in r.stdout
        # the attached event was only armed for the probe: it recorded nothing itself
        assert "sys_chdir(" not in r.stdout
        assert sh(f"cat {t}/events/syscalls/sys_enter_chdir/enable").stdout == "0\n"
    finally:
        sh(f"echo 0 > {t}/events/eprobes/ech/enable; echo '-:ech' >> {t}/dynamic_events")
    assert "ech" not in sh(f"cat {t}/dynamic_events").stdout


def test_an_eprobe_on_openat_sees_each_file_and_feeds_a_hist(real):
    t = f"{real}/tracing"
    probe = "e:eopen syscalls/sys_enter_openat file=+0($filename):ustring flags=$flags:x32"
    try:
        r = sh(f"echo '{probe}' >> {t}/dynamic_events"
               f" && echo 'hist:keys=file' > {t}/events/eprobes/eopen/trigger"
               f" && echo > {t}/trace && echo 1 > {t}/events/eprobes/eopen/enable"
               f" && cat {t}/README > /dev/null && cat {t}/README > /dev/null"
               f" && echo 0 > {t}/events/eprobes/eopen/enable"
               f" && cat {t}/trace {t}/events/eprobes/eopen/hist")
        assert r.returncode == 0, r.stderr
        assert 'eopen: (syscalls.sys_enter_openat) file="/sys/kernel/tracing/README" ' \
               'flags=0x0\n' in r.stdout
        assert '{ file: /sys/kernel/tracing/README' in r.stdout
        # its hist trigger keeps the probe, and so the attached event, armed
        assert sh(f"cat {t}/events/syscalls/sys_enter_openat/enable").stdout == "0*\n"
    finally:
        sh(f"echo 0 > {t}/events/eprobes/eopen/enable;"
           f" echo '!hist:keys=file' > {t}/events/eprobes/eopen/trigger;"
           f" echo '-:eopen' >> {t}/dynamic_events")
    assert sh(f"cat {t}/events/syscalls/sys_enter_openat/enable").stdout == "0\n"
    assert "eopen" not in sh(f"cat {t}/dynamic_events").stdout
