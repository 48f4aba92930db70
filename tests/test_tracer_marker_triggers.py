"""Triggers on trace_marker's event (``events/ftrace/print``, 6.1's trace_marker_file):
the event has ``trigger`` and ``hist`` but no ``enable`` or ``filter``; the triggers see
the text as written, before the newline is added, so a filter on ``buf`` compares it
whole; the record is written either way; onmatch(ftrace.print) finds it."""

import pytest

from tracer_fakes import cat, echo, make_tracer, node

PRINT = "events/ftrace/print"


@pytest.fixture
def t():
    return make_tracer()


def test_print_has_trigger_and_hist_but_no_enable_or_filter(t):
    names = set(node(t.root, PRINT).children())
    assert {"trigger", "hist", "format", "id"} <= names
    assert not names & {"enable", "filter"}


def test_a_hist_on_the_marker_counts_each_write(t):
    echo(t.root, f"{PRINT}/trigger", "hist:keys=common_pid")
    for _ in range(10):
        echo(t.root, "trace_marker", "hello", pid=42)
    hist = cat(t.root, f"{PRINT}/hist")
    assert "{ common_pid:         42 } hitcount:         10\n" in hist
    assert cat(t.root, "trace").count("tracing_mark_write: hello") == 10


def test_a_filter_on_buf_sees_the_text_without_the_newline(t):
    echo(t.root, f"{PRINT}/trigger", 'traceoff if buf == "stop"')
    echo(t.root, "trace_marker", "go on")
    assert cat(t.root, "tracing_on") == "1\n"
    echo(t.root, "trace_marker", "stop")
    assert cat(t.root, "tracing_on") == "0\n"
    assert "tracing_mark_write: stop" in cat(t.root, "trace")   # written, then off


def test_a_latency_between_two_markers_through_a_synthetic_event(t):
    echo(t.root, "synthetic_events", "latency u64 lat")
    echo(t.root, f"{PRINT}/trigger",
         'hist:keys=common_pid:ts0=common_timestamp.usecs if buf == "start"')
    echo(t.root, f"{PRINT}/trigger",
         'hist:keys=common_pid:lat=common_timestamp.usecs-$ts0:'
         'onmatch(ftrace.print).latency($lat) if buf == "end"', append=True)
    echo(t.root, "events/synthetic/latency/trigger", "hist:keys=common_pid,lat:sort=lat")
    t.clock.advance(1000)
    echo(t.root, "trace_marker", "start", pid=7)
    t.clock.advance(5_000_000)
    echo(t.root, "trace_marker", "end", pid=7)
    hist = cat(t.root, "events/synthetic/latency/hist")
    assert "lat:       5000 } hitcount:          1" in hist, hist


def test_an_instance_has_its_own_marker_triggers(t):
    node(t.root, "instances").mkdir("m", 0o755)
    echo(t.root, f"instances/m/{PRINT}/trigger", "traceoff")
    echo(t.root, "trace_marker", "top")
    assert cat(t.root, "tracing_on") == "1\n"
    echo(t.root, "instances/m/trace_marker", "inst")
    assert cat(t.root, "instances/m/tracing_on") == "0\n"


def test_a_hist_keyed_on_the_marker_text(t):
    echo(t.root, f"{PRINT}/trigger", "hist:keys=buf")
    for text in ("alpha", "beta", "alpha"):
        echo(t.root, "trace_marker", text)
    hist = cat(t.root, f"{PRINT}/hist")
    assert "{ buf: alpha" in hist and "{ buf: beta" in hist, hist
    assert "Hits: 3\n" in hist and "Entries: 2\n" in hist
