"""Hist triggers: the ``hist`` file's exact text for every key modifier and value form,
sort/size/name/pause/cont/clear, error_log entries, expressions, variables, and the
onmatch/onmax/onchange actions generating synthetic events — on kprobe events."""

import errno

import pytest

from tracer_fakes import (
    KDATA, KERNEL_CLONE, KSYS_READ, VFS_READ, cat, echo, make_tracer, write_errno,
)

EV = "events/kprobes/p1/"
TOTALS = "\nTotals:\n    Hits: {}\n    Entries: {}\n    Dropped: {}\n"


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "kprobe_events",
         "p:p1 vfs_read arg1=%di:u32 addr=%si:x64 name=+0(%dx):string sz=%cx:u64")
    echo(t.root, "kprobe_events", "p:p2 ksys_read arg1=%di:u32")
    t.kernel.run_as(42, "bash")
    return t


def hit(t, arg1=0, addr=0, sz=0, name_addr=KDATA + 0x80, fn=VFS_READ):
    t.engine.hit(fn, di=arg1, si=addr, dx=name_addr, cx=sz)


def hist(t, path=EV):
    return cat(t.root, path + "hist")


def header(info):
    return f"# event histogram\n#\n# trigger info: {info}\n#\n\n"


def only_entries(text):
    return [line for line in text.splitlines() if line.startswith("{")]


def test_plain_key_value_and_totals(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:vals=sz")
    for arg1, sz in ((3, 10), (1, 5), (3, 7)):
        hit(t, arg1, sz=sz)
    info = "hist:keys=arg1:vals=hitcount,sz:sort=hitcount:size=2048 [active]"
    assert hist(t) == (header(info)
                       + "{ arg1:          1 } hitcount:          1  sz:          5\n"
                       + "{ arg1:          3 } hitcount:          2  sz:         17\n"
                       + TOTALS.format(3, 2, 0))


def test_no_hist_triggers_reads_empty(t):
    echo(t.root, EV + "trigger", "traceon")
    assert hist(t) == ""


def test_compound_keys_and_sort_descending(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1,sz:sort=sz.descending")
    for arg1, sz in ((1, 5), (2, 9), (1, 7)):
        hit(t, arg1, sz=sz)
    assert cat(t.root, EV + "trigger") == (
        "hist:keys=arg1,sz:vals=hitcount:sort=sz.descending:size=2048 [active]\n")
    assert only_entries(hist(t)) == [
        "{ arg1:          2, sz:          9 } hitcount:          1",
        "{ arg1:          1, sz:          7 } hitcount:          1",
        "{ arg1:          1, sz:          5 } hitcount:          1",
    ]


def test_sort_ascending_is_shown_without_a_suffix(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:sort=arg1.ascending,hitcount")
    assert cat(t.root, EV + "trigger") == (
        "hist:keys=arg1:vals=hitcount:sort=arg1,hitcount:size=2048 [active]\n")


def test_hex_modifier_on_key_and_value(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1.hex:vals=sz.hex")
    hit(t, 255, sz=4096)
    assert only_entries(hist(t)) == [
        "{ arg1: ff } hitcount:          1  sz:       1000"]


def test_sym_and_sym_offset(t):
    echo(t.root, EV + "trigger", "hist:keys=addr.sym")
    echo(t.root, EV + "trigger", "hist:keys=addr.sym-offset")
    hit(t, addr=VFS_READ + 0x10)
    hit(t, addr=0x1234)
    text = hist(t)
    sym = f"{{ addr: [{VFS_READ + 0x10:x}] {'vfs_read':<45} }} hitcount:          1"
    off = f"{{ addr: [{VFS_READ + 0x10:x}] {'vfs_read+0x10/0x1a0':<55} }} hitcount:          1"
    raw = f"{{ addr: [1234] {'0x1234':<45} }} hitcount:          1"
    assert sym in text and off in text and raw in text
    assert "hist:keys=addr.sym-offset:vals=hitcount" in cat(t.root, EV + "trigger")


def test_execname(t):
    echo(t.root, EV + "trigger", "hist:keys=common_pid.execname")
    hit(t)
    assert only_entries(hist(t)) == [
        "{ common_pid: bash            [        42] } hitcount:          1"]


def test_execname_only_on_common_pid(t):
    assert write_errno(t.root, EV + "trigger", "hist:keys=arg1.execname") == errno.EINVAL
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        "[ 1234.567891] hist:kprobes:p1: error: Invalid field modifier",
        "  Command: hist:keys=arg1.execname",
        "                          ^"]


def test_syscall_without_a_table_is_unknown(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1.syscall")
    hit(t, 3)
    assert only_entries(hist(t)) == [
        f"{{ arg1: {'unknown_syscall':<30}[  3] }} hitcount:          1"]


def test_log2_and_buckets(t):
    echo(t.root, EV + "trigger", "hist:keys=sz.log2")
    echo(t.root, EV + "trigger", "hist:keys=sz.buckets=100")
    for sz in (1, 3, 100, 120):
        hit(t, sz=sz)
    text = hist(t)
    assert "{ sz: ~ 2^0  } hitcount:          1\n" in text
    assert "{ sz: ~ 2^2  } hitcount:          1\n" in text
    assert "{ sz: ~ 2^7  } hitcount:          2\n" in text
    assert "{ sz: ~ 0-99 } hitcount:          2\n" in text
    assert "{ sz: ~ 100-199 } hitcount:          2\n" in text
    assert "hist:keys=sz.buckets=100:vals=hitcount" in cat(t.root, EV + "trigger")


def test_string_key(t):
    echo(t.root, EV + "trigger", "hist:keys=name")
    hit(t)
    assert only_entries(hist(t)) == [f"{{ name: {'hello':<50} }} hitcount:          1"]


def test_stacktrace_key(t):
    echo(t.root, EV + "trigger", "hist:keys=stacktrace")
    hit(t)
    text = hist(t)
    assert "hist:keys=stacktrace:vals=hitcount" in text
    assert "{ stacktrace:\n         vfs_read+0x0/0x1a0\n} hitcount:          1\n" in text


def test_percent_and_graph_values(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:vals=sz.percent,sz.graph:sort=arg1")
    hit(t, 1, sz=1)
    hit(t, 2, sz=3)
    assert only_entries(hist(t)) == [
        "{ arg1:          1 } hitcount:          1  sz (%):  25.00  sz: ######              ",
        "{ arg1:          2 } hitcount:          1  sz (%):  75.00  sz: ####################",
    ]


def test_common_timestamp_usecs_value_and_clock(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:t=common_timestamp.usecs")
    assert cat(t.root, EV + "trigger") == (
        "hist:keys=arg1:vals=hitcount:t=common_timestamp.usecs:sort=hitcount:size=2048"
        ":clock=global [active]\n")
    assert cat(t.root, "trace_clock").startswith("local [global]")


def test_common_cpu_key(t):
    echo(t.root, EV + "trigger", "hist:keys=cpu")
    hit(t)
    assert cat(t.root, EV + "trigger").startswith("hist:keys=common_cpu:")
    assert only_entries(hist(t)) == ["{ common_cpu:          0 } hitcount:          1"]


def test_size_drops_entries_past_the_map(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:size=100")
    for i in range(130):
        hit(t, i)
    assert cat(t.root, EV + "trigger").endswith(":size=128 [active]\n")
    assert hist(t).endswith(TOTALS.format(128, 128, 2))


@pytest.mark.parametrize("size", ["64", "200000", "x"])
def test_bad_sizes(t, size):
    assert write_errno(t.root, EV + "trigger", f"hist:keys=arg1:size={size}") == errno.EINVAL


def test_two_histograms_on_one_event(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1")
    echo(t.root, EV + "trigger", "hist:keys=sz")
    hit(t, 1, sz=2)
    text = hist(t)
    assert text.count("# event histogram") == 2
    assert "Dropped: 0\n\n\n# event histogram" in text


def test_same_histogram_twice_is_eexist_with_a_log_entry(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1")
    assert write_errno(t.root, EV + "trigger", "hist:keys=arg1") == errno.EEXIST
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        "[ 1234.567891] hist:kprobes:p1: error: Hist trigger already exists",
        "  Command: hist:keys=arg1",
        "           ^"]


def test_filter_and_removal_by_its_readback(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1 if arg1 > 1")
    hit(t, 1)
    hit(t, 2)
    line = cat(t.root, EV + "trigger")
    assert line == "hist:keys=arg1:vals=hitcount:sort=hitcount:size=2048 if arg1 > 1 [active]\n"
    assert hist(t).endswith(TOTALS.format(1, 1, 0))
    echo(t.root, EV + "trigger", "!" + line.split("[")[0])
    assert cat(t.root, EV + "trigger").startswith("# Available")


def test_pause_cont_clear(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:pause")
    assert cat(t.root, EV + "trigger").endswith(" [paused]\n")
    hit(t, 1)
    assert hist(t).endswith(TOTALS.format(0, 0, 0))
    echo(t.root, EV + "trigger", "hist:keys=arg1:cont")
    hit(t, 1)
    assert cat(t.root, EV + "trigger").endswith(" [active]\n")
    echo(t.root, EV + "trigger", "hist:keys=arg1:pause")
    assert cat(t.root, EV + "trigger").endswith(" [paused]\n")
    echo(t.root, EV + "trigger", "hist:keys=arg1:continue")
    assert hist(t).endswith(TOTALS.format(1, 1, 0))
    echo(t.root, EV + "trigger", "hist:keys=arg1:clear")
    assert hist(t).endswith(TOTALS.format(0, 0, 0))
    assert write_errno(t.root, EV + "trigger", "hist:keys=sz:clear") == errno.ENOENT
    assert cat(t.root, "error_log").splitlines()[-2] == (
        "  Command: hist:keys=sz:clear")


def test_named_histograms_share_one_table(t):
    echo(t.root, EV + "trigger", "hist:name=shared:keys=arg1")
    echo(t.root, "events/kprobes/p2/trigger", "hist:name=shared:keys=arg1")
    hit(t, 1)
    hit(t, 1, fn=KSYS_READ)
    a, b = hist(t), hist(t, "events/kprobes/p2/")
    assert a == b
    assert "# trigger info: hist:name=shared:keys=arg1:vals=hitcount:sort=hitcount:" \
           "size=2048 [active]\n" in a
    assert "{ arg1:          1 } hitcount:          2\n" in a
    assert write_errno(t.root, "events/kprobes/p2/trigger",
                       "hist:name=shared:keys=arg1,common_pid", append=True) == errno.EINVAL
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        "[ 1234.567891] hist:kprobes:p2: error: Named hist trigger doesn't match existing "
        "named trigger (includes variables)",
        "  Command: hist:name=shared:keys=arg1,common_pid",
        "                ^"]


@pytest.mark.parametrize("command, message", [   # the caret goes where ^ is
    ("hist:keys=arg1:vals=sz:sort=arg1,^junk", "Sort field must be a key or a val"),
    ("hist:keys=arg1:vals=sz:^sort=", "Empty assignment"),
    ("hist:keys=arg1:vals=sz:^sort=arg1,", "Empty sort field"),
    ("hist:keys=arg1:vals=sz:sort=arg1.^junk", "Invalid sort modifier"),
    ("hist:keys=arg1:vals=sz,addr:^sort=arg1,sz,addr", "Too many sort fields (Max = 2)"),
    ("hist:keys=arg1:x=32+^10*3/20-4", "Too many subexpressions (3 max)"),
    ("hist:keys=sz:x=^1+2+3+4+5", "Too many subexpressions (3 max)"),
    ("hist:keys=arg1:x=-(^1)+2", "Unary minus not supported in sub-expressions"),
    ("hist:keys=arg1:x=3/^0", "Division by zero"),
    ("hist:keys=^nosuch", "Couldn't find field"),
    ("hist:keys=arg1:x=$^nosuch", "Couldn't find variable"),
    ("hist:keys=arg1:x=^name+1", "String type can not be an operand in expression"),
    ("hist:keys=arg1:onmax(^sz).save(addr)", "For onmax(x) or onchange(x), x must be a variable"),
    ("hist:keys=arg1:onmax($^nosuch).save(addr)", "Couldn't find onmax or onchange variable"),
    ("hist:keys=arg1:onmatch(kprobes.^nosuch).x()", "Invalid subsystem or event name"),
    ("hist:keys=arg1:onmatch(^kprobes).x()", "Missing subsystem"),
    ("hist:keys=arg1:onmatch(kprobes.p2).^save(sz)", "Handler doesn't support action"),
    ("hist:keys=arg1:onmatch(kprobes.p2).^nosynth(sz)", "Couldn't find synthetic event"),
])
def test_error_log_entries(t, command, message):
    caret = command.index("^")
    text = command.replace("^", "")
    assert write_errno(t.root, EV + "trigger", text) in (errno.EINVAL, errno.EDOM)
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        f"[ 1234.567891] hist:kprobes:p1: error: {message}",
        f"  Command: {text}",
        " " * (len("  Command: ") + caret) + "^"]
    assert cat(t.root, EV + "trigger").startswith("# Available")


def test_silent_rejections(t):
    for text in ("hist", "hist:vals=sz", "hist:keys=arg1,sz,addr,common_pid",
                 "hist:keys=arg1:bogus"):
        assert write_errno(t.root, EV + "trigger", text) == errno.EINVAL
    assert cat(t.root, "error_log") == ""


@pytest.mark.parametrize("expr, value", [
    ("123", "123"), ("16-8-4-2", "2"), ("64/8/4/2", "1"), ("16-8+4+2", "14"),
    ("4*3/2*2", "12"), ("4+3*2-2", "8"), ("4+6/2-2", "5"),
])
def test_constant_expressions_fold(t, expr, value):
    echo(t.root, EV + "trigger", f"hist:keys=arg1:x={expr}")
    assert f":x={value}:" in cat(t.root, EV + "trigger")


def test_expression_values(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:vals=sz,addr:x=sz*2:y=-(sz)")
    assert "vals=hitcount,sz,addr:x=sz*2,y=-(sz):sort" in cat(t.root, EV + "trigger")


# ------------------------------------------------------------------ inter-event

def latency_setup(t, action="onmatch(kprobes.p1).lat($d,arg1)"):
    echo(t.root, "synthetic_events", "lat u64 d; pid_t pid")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs")
    echo(t.root, "events/kprobes/p2/trigger",
         f"hist:keys=arg1:d=common_timestamp.usecs-$ts0:{action}")


def pair(t, key, usecs):
    hit(t, key)
    t.clock.advance(usecs * 1000)
    hit(t, key, fn=KSYS_READ)


def test_onmatch_generates_a_synthetic_event(t):
    latency_setup(t)
    echo(t.root, "events/synthetic/lat/trigger", "hist:keys=d:sort=d")
    echo(t.root, "events/synthetic/lat/enable", "1")
    pair(t, 5, 30)
    pair(t, 6, 12)
    hit(t, 7, fn=KSYS_READ)                     # no start: no variable, no event
    pair(t, 5, 30)
    assert cat(t.root, "events/kprobes/p2/trigger") == (
        "hist:keys=arg1:vals=hitcount:d=common_timestamp.usecs-$ts0:sort=hitcount:"
        "size=2048:clock=global:onmatch(kprobes.p1).lat($d,arg1) [active]\n")
    assert only_entries(hist(t, "events/synthetic/lat/")) == [
        "{ d:         12 } hitcount:          1",
        "{ d:         30 } hitcount:          2",
    ]
    lines = [line for line in cat(t.root, "trace").splitlines() if "lat:" in line]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "lat: d=30 pid=5", "lat: d=12 pid=6", "lat: d=30 pid=5"]
    assert "bash-42" in lines[0]


def test_a_start_variable_is_read_once(t):
    latency_setup(t)
    echo(t.root, "events/synthetic/lat/enable", "1")
    pair(t, 5, 10)
    hit(t, 5, fn=KSYS_READ)                     # ts0 was used up
    assert len([line for line in cat(t.root, "trace").splitlines() if "lat:" in line]) == 1


def test_trace_keyword_form(t):
    latency_setup(t, "onmatch(kprobes.p1).trace(lat,$d,arg1)")
    echo(t.root, "events/synthetic/lat/enable", "1")
    pair(t, 1, 4)
    assert "onmatch(kprobes.p1).trace(lat,$d,arg1)" in cat(t.root, "events/kprobes/p2/trigger")
    assert "lat: d=4 pid=1" in cat(t.root, "trace")


def test_synthetic_param_count_must_match(t):
    echo(t.root, "synthetic_events", "lat u64 d; pid_t pid")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs")
    assert write_errno(t.root, "events/kprobes/p2/trigger",
                       "hist:keys=arg1:d=common_timestamp.usecs-$ts0:"
                       "onmatch(kprobes.p1).lat($d)") == errno.EINVAL
    assert "Param count doesn't match synthetic event field count" in cat(t.root, "error_log")


def test_generated_synthetic_event_and_referenced_hist_are_busy(t):
    latency_setup(t)
    assert write_errno(t.root, "synthetic_events", "!lat") == errno.EBUSY
    assert write_errno(t.root, EV + "trigger",
                       "!hist:keys=arg1:ts0=common_timestamp.usecs") == errno.EBUSY
    echo(t.root, "events/kprobes/p2/trigger",
         "!hist:keys=arg1:d=common_timestamp.usecs-$ts0:onmatch(kprobes.p1).lat($d,arg1)")
    echo(t.root, EV + "trigger", "!hist:keys=arg1:ts0=common_timestamp.usecs")
    echo(t.root, "synthetic_events", "!lat")


def test_onmax_save(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs")
    echo(t.root, "events/kprobes/p2/trigger",
         "hist:keys=arg1:d=common_timestamp.usecs-$ts0:onmax($d).save(arg1,common_pid)")
    pair(t, 3, 20)
    pair(t, 3, 50)
    pair(t, 3, 10)
    text = hist(t, "events/kprobes/p2/")
    assert ":onmax($d).save(arg1,common_pid) [active]" in text
    assert ("{ arg1:          3 } hitcount:          3\n"
            "\tmax:         50  arg1:          3  common_pid:         42\n") in text


def test_onchange_snapshot(t):
    taken = []
    t.tracer.top.take_snapshot = lambda cond=None: taken.append(1)
    echo(t.root, EV + "trigger", "hist:keys=arg1:v=sz:onchange($v).snapshot()")
    for sz in (1, 1, 2, 2, 1):
        hit(t, 0, sz=sz)
    assert taken == [1, 1, 1]
    assert "{ arg1:          0 } hitcount:          5\n" in hist(t)     # no "changed:"
    assert ":v=sz:sort=hitcount:size=2048:onchange($v).snapshot() [active]" in cat(
        t.root, EV + "trigger")
    assert hist(t).endswith(
        "\nSnapshot taken (see tracing/snapshot).  Details:\n"
        "\ttriggering value { onchange($v) }:          1"
        "\ttriggered by event with key: { arg1:          0 }\n" + TOTALS.format(5, 1, 0))


def test_a_field_of_the_matching_event_becomes_a_field_variable(t):
    echo(t.root, "synthetic_events", "lat u64 d; pid_t pid; u64 size")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs if arg1 < 100")
    cmd = ("hist:keys=arg1:d=common_timestamp.usecs-$ts0:"
           "onmatch(kprobes.p1).lat($d,arg1,kprobes.p1.sz)")
    echo(t.root, "events/kprobes/p2/trigger", cmd)
    assert cat(t.root, EV + "trigger").splitlines()[1] == (
        "hist:keys=arg1:vals=hitcount:synthetic_sz=sz:sort=hitcount:size=2048"
        " if arg1 < 100 [active]")
    echo(t.root, "events/synthetic/lat/enable", "1")
    hit(t, 4, sz=77)
    t.clock.advance(5000)
    hit(t, 4, fn=KSYS_READ)
    assert "lat: d=5 pid=4 size=77" in cat(t.root, "trace")
    echo(t.root, "events/kprobes/p2/trigger", "!" + cmd)
    assert len(cat(t.root, EV + "trigger").splitlines()) == 1


def test_a_qualified_variable_of_another_histogram(t):
    echo(t.root, "synthetic_events", "lat u64 d; pid_t pid")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs")
    echo(t.root, "events/kprobes/p2/trigger", "hist:keys=arg1:d=common_timestamp.usecs-$ts0")
    echo(t.root, "events/kprobes/p2/trigger",
         "hist:keys=arg1:onmatch(kprobes.p1).lat(kprobes.p2.$d,arg1)")
    echo(t.root, "events/synthetic/lat/enable", "1")
    pair(t, 2, 9)
    assert "lat: d=9 pid=2" in cat(t.root, "trace")


def test_a_synthetic_event_generating_itself_stops(t):
    echo(t.root, "synthetic_events", "lat u64 d")
    echo(t.root, EV + "trigger", "hist:keys=arg1:onmatch(kprobes.p1).lat(arg1)")
    echo(t.root, "events/synthetic/lat/trigger", "hist:keys=d:onmatch(synthetic.lat).lat(d)")
    echo(t.root, "events/synthetic/lat/enable", "1")
    hit(t, 1)
    assert cat(t.root, "trace").count(" lat: d=1") == 4


def test_truncating_keeps_histograms_another_one_reads(t):
    latency_setup(t)
    echo(t.root, EV + "trigger", "hist:keys=sz", append=True)
    echo(t.root, EV + "trigger", "traceon", append=False)       # O_TRUNC: nothing goes
    assert len(cat(t.root, EV + "trigger").splitlines()) == 3


def test_a_variable_two_events_define_needs_its_full_name(t):
    echo(t.root, "kprobe_events", "p:p3 kernel_clone arg1=%di:u32")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp")
    echo(t.root, "events/kprobes/p3/trigger", "hist:keys=arg1:ts0=common_timestamp")
    assert write_errno(t.root, "events/kprobes/p2/trigger",
                       "hist:keys=arg1:d=common_timestamp-$ts0") == errno.EINVAL
    assert cat(t.root, "error_log").splitlines()[-3:] == [
        "[ 1234.567891] hist:kprobes:p2: error: Variable name not unique, need to use "
        "fully qualified name (subsys.event.var) for variable",
        "  Command: hist:keys=arg1:d=common_timestamp-$ts0",
        " " * (len("  Command: hist:keys=arg1:d=common_timestamp-$")) + "^"]
    echo(t.root, "events/kprobes/p2/trigger",
         "hist:keys=arg1:d=common_timestamp-kprobes.p3.$ts0")
    assert "d=common_timestamp-$kprobes.p3.ts0" in cat(t.root, "events/kprobes/p2/trigger")


def test_a_string_variable_fills_a_dynamic_string_field(t):
    echo(t.root, "synthetic_events", "named u64 lat; char filename[]")
    echo(t.root, EV + "trigger", "hist:key=arg1:fv=name:ts0=common_timestamp.usecs")
    echo(t.root, "events/kprobes/p2/trigger",
         "hist:key=arg1:lat=common_timestamp.usecs-$ts0:"
         "onmatch(kprobes.p1).named($lat,$fv)")
    echo(t.root, "events/synthetic/named/trigger", "hist:keys=filename,lat:sort=filename,lat")
    echo(t.root, "events/synthetic/named/enable", "1")
    pair(t, 3, 8)
    assert "named: lat=8 filename=hello" in cat(t.root, "trace")
    assert only_entries(hist(t, "events/synthetic/named/")) == [
        f"{{ filename: {'hello':<50}, lat:          8 }} hitcount:          1"]


def test_combined_latencies_through_a_synthetic_event_matching_itself(t):
    """trigger-inter-event-combined-hist.tc on kprobe events: waking (p1) → wakeup
    (p2) → switch (p3); the sum of both latencies from wakeup_latency's own hist."""
    echo(t.root, "kprobe_events", "p:p3 kernel_clone arg1=%di:u32")
    sw = "events/kprobes/p3/trigger"
    echo(t.root, "synthetic_events", "waking_latency u64 lat; pid_t pid")
    echo(t.root, EV + "trigger", "hist:keys=arg1:ts0=common_timestamp.usecs")
    echo(t.root, "events/kprobes/p2/trigger",
         "hist:keys=arg1:waking_lat=common_timestamp.usecs-$ts0:"
         "onmatch(kprobes.p1).waking_latency($waking_lat,arg1)")
    echo(t.root, "synthetic_events", "wakeup_latency u64 lat; pid_t pid")
    echo(t.root, "events/kprobes/p2/trigger", "hist:keys=arg1:ts1=common_timestamp.usecs")
    echo(t.root, sw, "hist:keys=arg1:wakeup_lat=common_timestamp.usecs-$ts1:"
                     "onmatch(kprobes.p2).wakeup_latency($wakeup_lat,arg1)")
    echo(t.root, "synthetic_events", "waking_plus_wakeup_latency u64 lat; pid_t pid")
    echo(t.root, "events/synthetic/wakeup_latency/trigger",
         "hist:keys=pid,lat:sort=pid,lat:ww_lat=$waking_lat+$wakeup_lat:"
         "onmatch(synthetic.wakeup_latency).waking_plus_wakeup_latency($ww_lat,pid)")
    echo(t.root, "events/synthetic/waking_plus_wakeup_latency/trigger",
         "hist:keys=pid,lat:sort=pid,lat")
    hit(t, 7)                                   # waking
    t.clock.advance(3000)
    hit(t, 7, fn=KSYS_READ)                     # wakeup: 3 us after waking
    t.clock.advance(5000)
    t.engine.hit(KERNEL_CLONE, di=7)            # switch: 5 us after wakeup
    assert only_entries(hist(t, "events/synthetic/waking_plus_wakeup_latency/")) == [
        "{ pid:          7, lat:          8 } hitcount:          1"]


def test_common_flags_as_the_format_file_has_them(t):
    echo(t.root, "kprobe_events", "p:p4 vfs_read+4")
    echo(t.root, "events/kprobes/p4/trigger", "hist:keys=common_flags.hex")
    t.engine.hit(VFS_READ + 4)                  # an int3: irqs off, in an NMI-like context
    assert only_entries(hist(t, "events/kprobes/p4/")) == [
        "{ common_flags: 49 } hitcount:          1"]
