"""``timestamp_mode`` through a real mount, as 6.1 has it: ``[delta] absolute`` always.
Issue 30 asked for ``delta [absolute]`` while a hist trigger uses ``common_timestamp``;
6.1's hist triggers then set the trace clock and filter buffering
(tracing_set_filter_buffering), and nothing in 6.1 calls
ring_buffer_set_time_stamp_abs any more, so the mode never changes."""

from test_fs_mount import _need_fuse, real, sh  # noqa: F401 (fixtures)


def test_timestamp_mode_stays_delta_under_a_common_timestamp_hist(real):
    t = f"{real}/tracing"
    trigger = f"{t}/events/ftrace/print/trigger"
    assert open(f"{t}/timestamp_mode").read() == "[delta] absolute\n"
    r = sh(f"echo 'hist:keys=common_pid:ts0=common_timestamp.usecs' > {trigger}")
    assert r.returncode == 0, r.stderr
    try:
        assert open(f"{t}/trace_clock").read().count("[global]") == 1
        assert open(f"{t}/timestamp_mode").read() == "[delta] absolute\n"
    finally:
        sh(f"echo '!hist:keys=common_pid:ts0=common_timestamp.usecs' >> {trigger}; "
           f"echo local > {t}/trace_clock")
