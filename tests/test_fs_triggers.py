"""Event triggers and histograms through a real mount, driven by a shell: a latency
histogram built from a kprobe and a kretprobe on vfs_read through a synthetic event, a
traceoff trigger, a hist trigger's error in error_log, and triggers in an instance
acting on that instance only."""

import re

import pytest

STOP = ("hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:"
        "onmatch(kprobes.rstart).readlat($lat,common_pid)")

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)


@pytest.fixture
def t(real):
    t = f"{real}/tracing"
    yield t
    # triggers first (they hold their events), then the events
    sh(f"""
        rmdir {t}/instances/foo 2>/dev/null
        echo '!hist:keys=lat.log2:sort=lat' >> {t}/events/synthetic/readlat/trigger
        echo 0 > {t}/events/synthetic/readlat/enable
        echo > {t}/events/kprobes/rstop/trigger
        echo '!{STOP}' >> {t}/events/kprobes/rstop/trigger
        echo '!hist:keys=common_pid:ts0=common_timestamp.usecs' >> {t}/events/kprobes/rstart/trigger
        echo '!traceoff' >> {t}/events/kprobes/rstart/trigger
        echo '!enable_event:kprobes:kread' >> {t}/events/kprobes/rstart/trigger
        echo > {t}/events/kprobes/kread/trigger
        echo 0 > {t}/events/kprobes/kread/enable
        echo > {t}/synthetic_events; echo > {t}/kprobe_events
        echo 1 > {t}/tracing_on; echo local > {t}/trace_clock; echo > {t}/error_log
    """)
    assert sh(f"cat {t}/kprobe_events {t}/synthetic_events").stdout == ""


def test_read_latency_histogram_end_to_end(t):
    r = sh(f"""
        set -e
        echo 'p:rstart vfs_read' >> {t}/kprobe_events
        echo 'r:rstop vfs_read' >> {t}/kprobe_events
        echo 'readlat u64 lat; pid_t pid' >> {t}/synthetic_events
        echo 'hist:keys=common_pid:ts0=common_timestamp.usecs' > {t}/events/kprobes/rstart/trigger
        echo '{STOP}' > {t}/events/kprobes/rstop/trigger
        echo 'hist:keys=lat.log2:sort=lat' > {t}/events/synthetic/readlat/trigger
        echo 1 > {t}/events/synthetic/readlat/enable
        cat {t}/events/kprobes/rstart/enable {t}/events/synthetic/readlat/enable
        for i in 1 2 3; do cat {t}/README > /dev/null; done
        echo 0 > {t}/events/synthetic/readlat/enable
        cat {t}/events/synthetic/readlat/hist
        echo ---
        cat {t}/trace
    """)
    assert r.returncode == 0, r.stderr
    states, rest = r.stdout.split("# event histogram", 1)
    assert states == "0*\n1*\n"
    hist, trace = rest.split("---\n")
    assert hist.startswith("\n#\n# trigger info: hist:keys=lat.log2:vals=hitcount:"
                           "sort=lat.log2:size=2048 [active]\n#\n\n")
    entries = re.findall(r"^\{ lat: ~ 2\^(\d+) *\} hitcount: +(\d+)$", hist, re.M)
    hits = int(re.search(r"Hits: (\d+)", hist).group(1))
    assert entries and sum(int(n) for _, n in entries) == hits >= 3
    events = re.findall(r"^ +cat-(\d+) .*: readlat: lat=(\d+) pid=(\d+)$", trace, re.M)
    assert len(events) >= 3
    assert all(pid == own for pid, _lat, own in events)
    assert "Dropped: 0" in hist


def test_traceoff_trigger_and_a_hist_error(t):
    r = sh(f"""
        echo 'p:rstart vfs_read' >> {t}/kprobe_events
        echo 'traceoff:1' > {t}/events/kprobes/rstart/trigger
        cat {t}/README > /dev/null
        cat {t}/events/kprobes/rstart/trigger
        cat {t}/tracing_on
        echo 'hist:keys=common_pid:vals=hitcount:sort=common_pid,junk' \\
            >> {t}/events/kprobes/rstart/trigger
        echo rc=$?
        cat {t}/error_log
    """, shell="bash")
    assert r.stdout.startswith("traceoff:count=0\n0\nrc=1\n"), r.stdout
    assert r.stdout.endswith(
        "hist:kprobes:rstart: error: Sort field must be a key or a val\n"
        "  Command: hist:keys=common_pid:vals=hitcount:sort=common_pid,junk\n"
        + " " * (len("  Command: hist:keys=common_pid:vals=hitcount:sort=common_pid,")) + "^\n")
    assert "Invalid argument" in r.stderr


def test_enable_event_turns_on_a_kernel_recorded_event(t):
    """kread has no trigger of its own: the kernel records it, soft disabled until
    rstart's enable_event fires; then a hist trigger moves it to the host."""
    r = sh(f"""
        set -e
        echo 'p:rstart vfs_read' >> {t}/kprobe_events
        echo 'p:kread ksys_read fd=%di:s32' >> {t}/kprobe_events
        echo 'enable_event:kprobes:kread:1' > {t}/events/kprobes/rstart/trigger
        cat {t}/README > /dev/null
        cat {t}/events/kprobes/rstart/trigger {t}/events/kprobes/kread/enable
        cat {t}/trace
        echo 'hist:keys=common_pid.execname,fd' > {t}/events/kprobes/kread/trigger
        cat {t}/README > /dev/null
        cat {t}/events/kprobes/kread/hist
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("enable_event:kprobes:kread:count=0\n1*\n"), r.stdout
    assert re.search(r"^\{ common_pid: cat +\[ *\d+\], fd: +\d+ \} hitcount: +\d+$",
                     r.stdout, re.M)
    assert re.search(r"^ +cat-\d+ .* kread: \(ksys_read\+0x0/0x[0-9a-f]+\) fd=\d+$",
                     r.stdout, re.M)


def test_triggers_in_an_instance_act_on_that_instance(t):
    """traceoff and enable_event written in instances/foo stop foo's buffer and
    soft-enable kread in foo; the top level's files and buffer are untouched."""
    i = f"{t}/instances/foo"
    r = sh(f"""
        set -e
        echo 'p:rstart vfs_read' >> {t}/kprobe_events
        echo 'p:kread ksys_read fd=%di:s32' >> {t}/kprobe_events
        mkdir {i}
        echo 'enable_event:kprobes:kread' > {i}/events/kprobes/rstart/trigger
        cat {i}/events/kprobes/kread/enable {t}/events/kprobes/kread/enable
        cat {t}/events/kprobes/rstart/trigger | head -1
        cat {t}/README > /dev/null
        cat {i}/events/kprobes/kread/enable {t}/events/kprobes/kread/enable
        echo 'traceoff' >> {i}/events/kprobes/rstart/trigger
        cat {t}/README > /dev/null
        cat {i}/tracing_on {t}/tracing_on
        echo ---
        cat {i}/trace
        echo ---
        cat {t}/trace
        rmdir {i}
        echo ---
        cat {t}/events/kprobes/rstart/enable {t}/events/kprobes/kread/enable
    """)
    assert r.returncode == 0, r.stderr
    states, foo, top, after = r.stdout.split("---\n")
    # reading kread's enable file is a vfs_read: the trigger has fired by then
    assert states == "1*\n0\n# Available triggers:\n1*\n0\n0\n1\n", states
    assert re.search(r"^ +cat-\d+ .* kread: \(ksys_read\+0x0/0x[0-9a-f]+\) fd=\d+$",
                     foo, re.M)
    assert [line for line in top.splitlines() if not line.startswith("#")] == []
    assert after == "0\n0\n"                    # rmdir dropped foo's triggers
