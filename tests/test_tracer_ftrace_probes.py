"""set_ftrace_filter's commands (tracing/tracers/ftrace_probes.py) over a fake ftrace
core and a fake trace array: the token parser, 6.1's globs, the probes' hit semantics and
counts, the read-back text, removal, :mod: and its cache."""

import errno
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kprobefs.tracing.tracers.ftrace_probes import (
    NO_ARRAY_COMMANDS, FunctionProbes, lat_context, match_sites, parse_filter_token,
)
from kprobefs.tracing.tracers.function import FunctionFilter, FunctionTracer

ALL = "#### all functions enabled ####\n"
SITES = [(0x1000, "schedule"), (0x2000, "scheduler_tick"), (0x3000, "_raw_spin_lock"),
         (0x4000, "_raw_spin_trylock"), (0x5000, "mutex_unlock"),
         (0xC000, "mod_fn"), (0xC100, "mod_helper")]
MODULE_SITES = {0xC000: "mymod", 0xC100: "mymod"}


class _Ftrace:
    def __init__(self):
        self.registered = []

    def register_ftrace_function(self, ops):
        ops.registered = True
        self.registered.append(ops)

    def unregister_ftrace_function(self, ops):
        ops.registered = False
        self.registered.remove(ops)

    def ftrace_set_filter_ip(self, ops, ip, remove=False):
        (ops.filter.discard if remove else ops.filter.add)(ip)

    def call(self, site, regs=None):
        for ops in list(self.registered):
            if site in ops.filter:
                ops.func(site, 0, ops, regs)


class _Ops:
    def __init__(self, func, want_parent_ip=False):
        self.func, self.filter, self.registered = func, set(), False


class _Array:
    """What the probes touch of a trace array."""

    def __init__(self, events):
        self.tracing_on = True
        self.stacks = []
        self.snapshots = 0
        self.soft = []
        self._events = events
        self.allocated = 0
        self.trigger_host = SimpleNamespace(
            snapshot=lambda: setattr(self, "snapshots", self.snapshots + 1),
            alloc_snapshot=lambda: setattr(self, "allocated", self.allocated + 1),
            find_event=lambda system, name: self._events.get((system, name)))
        self.registry = SimpleNamespace(top=self)

    def set_tracing_on_hit(self, on):
        self.tracing_on = on

    def write_stack(self, hit):
        self.stacks.append(hit)

    def file_enable_disable(self, ef, on, soft):
        self.soft.append((ef.name, on, soft))
        ef.soft_mode += 1 if on else -1

    def set_soft_disabled(self, ef, disabled):
        ef.soft_disabled = disabled


@pytest.fixture
def env():
    ev = SimpleNamespace(name="sched_switch", soft_mode=0, soft_disabled=True)
    tr = _Array({("sched", "sched_switch"): ev})
    ftrace = _Ftrace()
    loaded = set()
    dumps = []
    sites = [s for s in SITES if s[0] not in MODULE_SITES or "mymod" in loaded]
    probes = FunctionProbes(tr, ftrace, _Ops, lambda: list(sites), MODULE_SITES.get,
                            lambda ip, regs: SimpleNamespace(cpu=1, ip=ip), dumps.append,
                            loaded.__contains__)
    flt = FunctionFilter(lambda: list(sites), ALL)
    notrace = FunctionFilter(lambda: list(sites), "#### no functions disabled ####\n")
    flt.commands = notrace.commands = probes
    notrace.enable = False
    probes.hashes = {True: flt, False: notrace}

    def load():
        loaded.add("mymod")
        sites[:] = SITES
        probes.module_coming("mymod")
    return SimpleNamespace(tr=tr, ftrace=ftrace, probes=probes, filter=flt, ev=ev,
                           notrace=notrace, dumps=dumps, load=load)


def _errno(hash_, text):
    with pytest.raises(OSError) as e:
        hash_.write(text.encode())
    return e.value.errno


# ---- parsing and globs -----------------------------------------------------------------------
def test_tokens_split_as_strsep_does():
    assert parse_filter_token("schedule") == ("schedule", None, None)
    assert parse_filter_token("schedule:traceoff") == ("schedule", "traceoff", None)
    assert parse_filter_token("schedule:traceoff:") == ("schedule", "traceoff", "")
    assert parse_filter_token("!f:enable_event:sched:sw:3") == (
        "!f", "enable_event", "sched:sw:3")
    assert parse_filter_token("*:mod:mymod") == ("*", "mod", "mymod")


@pytest.mark.parametrize("glob, names", [
    ("*lock", {"_raw_spin_lock", "_raw_spin_trylock", "mutex_unlock"}),
    ("sched*", {"schedule", "scheduler_tick"}),
    ("*ule*", {"schedule", "scheduler_tick"}),
    ("*pin*lock", {"_raw_spin_lock", "_raw_spin_trylock"}),
    ("mutex*unl*", {"mutex_unlock"}),
    ("sch?dule", {"schedule"}),
    ("[s]chedule", {"schedule"}),
    ("schedule", {"schedule"}),
    ("2", {"scheduler_tick"}),                 # an index into the functions, from 1
    ("0x3", {"_raw_spin_lock"}),               # simple_strtoul: any base
    ("4abc", {"_raw_spin_trylock"}),
    ("0", set()),
])
def test_globs_match_as_filter_parse_regex(glob, names):
    kernel = [s for s in SITES if s[0] not in MODULE_SITES]
    assert {dict(SITES)[s] for s in match_sites(glob, kernel)} == names


def test_module_matching():
    got = match_sites("*", SITES, "mymod", MODULE_SITES.get)
    assert got == {0xC000, 0xC100}
    assert match_sites("*_fn", SITES, "my*", MODULE_SITES.get) == {0xC000}
    assert 0xC000 not in match_sites("*", SITES, "!mymod", MODULE_SITES.get)
    assert match_sites("*", SITES, "", MODULE_SITES.get) == {0x1000, 0x2000, 0x3000,
                                                              0x4000, 0x5000}


# ---- probes ----------------------------------------------------------------------------------
def test_traceoff_reads_back_and_fires(env):
    env.filter.write(b"schedule:traceoff\n")
    assert env.filter.text() == ALL + "schedule:traceoff:unlimited\n"
    env.ftrace.call(0x2000)
    assert env.tr.tracing_on
    env.ftrace.call(0x1000)
    assert not env.tr.tracing_on
    env.filter.write(b"!schedule:traceoff\n")
    assert env.filter.text() == ALL
    assert env.ftrace.registered == []
    # a kind without functions is gone from the array (release_probe)
    assert _errno(env.filter, "!schedule:traceoff") == errno.ENODEV


def test_counted_traceoff_counts_only_changes(env):
    env.filter.write(b"schedule:traceoff:2")
    assert env.filter.text() == ALL + "schedule:traceoff:count=2\n"
    env.ftrace.call(0x1000)
    env.ftrace.call(0x1000)                     # already off: the count stays
    assert env.filter.text() == ALL + "schedule:traceoff:count=1\n"
    env.tr.tracing_on = True
    env.ftrace.call(0x1000)
    env.tr.tracing_on = True
    env.ftrace.call(0x1000)
    assert env.tr.tracing_on
    assert env.filter.text() == ALL + "schedule:traceoff:count=0\n"
    # the uncounted kind is another probe: removing it finds nothing (ENODEV)
    assert _errno(env.filter, "!schedule:traceoff") == errno.ENODEV
    env.filter.write(b"!schedule:traceoff:0")
    assert env.filter.text() == ALL


def test_listing_functions_then_probes_newest_kind_first(env):
    env.filter.write(b"*spin*lock:traceoff")
    env.filter.write(b"schedule:stacktrace:5 scheduler_tick:snapshot")
    env.filter.write(b"schedule")
    assert env.filter.text() == ("schedule\n"
                                 "scheduler_tick:snapshot:unlimited\n"
                                 "schedule:stacktrace:count=5\n"
                                 "_raw_spin_lock:traceoff:unlimited\n"
                                 "_raw_spin_trylock:traceoff:unlimited\n")
    env.filter.clear()                          # O_TRUNC: the functions, not the probes
    assert env.filter.text().startswith(ALL + "scheduler_tick:snapshot:unlimited\n")
    env.filter.write(b"!*try*:traceoff")
    assert "_raw_spin_trylock" not in env.filter.text()


def test_stacktrace_snapshot_dump_cpudump(env):
    env.filter.write(b"schedule:stacktrace:1 scheduler_tick:snapshot "
                     b"_raw_spin_lock:dump mutex_unlock:cpudump")
    for site in (0x1000, 0x1000, 0x2000, 0x3000, 0x3000, 0x5000):
        env.ftrace.call(site)
    assert [h.ip for h in env.tr.stacks] == [0x1000]
    assert env.tr.snapshots == 1
    assert env.tr.allocated == 1                # when the snapshot probe came
    assert env.dumps == [None, 1]               # dump once, all CPUs; cpudump: this CPU
    text = env.filter.text()
    assert "_raw_spin_lock:dump:count=0\n" in text
    assert "mutex_unlock:cpudump:unlimited\n" in text
    assert "schedule:stacktrace:count=0\n" in text


def test_enable_event_soft_mode_and_count(env):
    env.filter.write(b"schedule:enable_event:sched:sched_switch:2")
    assert env.tr.soft == [("sched_switch", True, True)]
    assert env.filter.text() == ALL + "schedule:enable_event:sched:sched_switch:count=2\n"
    env.ftrace.call(0x1000)
    assert env.ev.soft_disabled is False
    env.ftrace.call(0x1000)                     # already enabled: no count used
    assert "count=1" in env.filter.text()
    env.filter.write(b"!schedule:enable_event:sched:sched_switch:count=1")
    assert env.tr.soft[-1] == ("sched_switch", False, True)
    assert env.filter.text() == ALL


def test_disable_event_unlimited(env):
    env.ev.soft_disabled = False
    env.filter.write(b"sched*:disable_event:sched:sched_switch")
    assert env.filter.text() == ALL + (
        "schedule:disable_event:sched:sched_switch:unlimited\n"
        "scheduler_tick:disable_event:sched:sched_switch:unlimited\n")
    env.ftrace.call(0x2000)
    assert env.ev.soft_disabled
    env.filter.write(b"!schedule:disable_event:sched:sched_switch")
    assert env.tr.soft == [("sched_switch", True, True)]      # still one function left
    env.filter.write(b"!*:disable_event:sched:sched_switch")
    assert env.tr.soft[-1] == ("sched_switch", False, True)


@pytest.mark.parametrize("text, err", [
    ("schedule:nosuch", errno.EINVAL),
    ("nosuch:traceoff", errno.EINVAL),
    ("schedule:traceoff:zz", errno.EINVAL),
    ("schedule:enable_event", errno.EINVAL),
    ("schedule:enable_event:sched", errno.EINVAL),
    ("schedule:enable_event:sched:nosuch", errno.EINVAL),
    ("schedule:enable_event:sched:sched_switch:", errno.EINVAL),
    ("!schedule:snapshot", errno.ENODEV),
])
def test_bad_commands(env, text, err):
    assert _errno(env.filter, text) == err
    assert env.filter.text() == ALL
    assert env.tr.soft in ([], [("sched_switch", True, True), ("sched_switch", False, True)])


def test_the_same_probe_twice_adds_nothing(env):
    env.filter.write(b"schedule:traceoff")
    assert _errno(env.filter, "schedule:traceoff") == errno.EINVAL
    assert _errno(env.filter, "!scheduler_tick:traceoff") == errno.EINVAL


def test_probes_only_in_set_ftrace_filter(env):
    assert _errno(env.notrace, "schedule:traceoff") == errno.EINVAL


# ---- :mod: -----------------------------------------------------------------------------------
def test_mod_cached_until_its_module_comes(env):
    env.filter.write(b"nosuch:mod:other *:mod:mymod")
    # waiting :mod: commands make the filter non-empty (FTRACE_HASH_FL_MOD)
    assert env.filter.text() == "nosuch:mod:other\n*:mod:mymod\n"
    assert env.filter.restricts()
    env.filter.write(b"!nosuch:mod:other")
    env.load()
    assert env.filter.text() == "mod_fn [mymod]\nmod_helper [mymod]\n"
    env.filter.write(b"!mod_helper:mod:mymod")
    assert env.filter.text() == "mod_fn [mymod]\n"
    # a loaded module without the function: EINVAL, nothing cached
    assert _errno(env.filter, "nosuch:mod:mymod") == errno.EINVAL
    assert _errno(env.filter, "!nosuch:mod:other") == errno.EINVAL
    env.filter.clear()
    assert not env.filter.restricts()


def test_mod_cache_goes_with_o_trunc_and_works_for_notrace(env):
    env.notrace.write(b"mod_fn:mod:mymod")
    assert env.notrace.text() == "#### no functions disabled ####\nmod_fn:mod:mymod\n"
    env.notrace.clear()
    assert env.notrace.text() == "#### no functions disabled ####\n"
    env.notrace.write(b"mod_fn:mod:mymod")
    env.load()
    assert env.notrace.text() == "mod_fn [mymod]\n"


def test_a_filter_without_a_trace_array_has_no_commands():
    """stack_trace_filter: its ops has no trace array, so each command is ENODEV."""
    flt = FunctionFilter(lambda: SITES, ALL)
    flt.commands = NO_ARRAY_COMMANDS
    assert _errno(flt, "schedule:traceoff") == errno.ENODEV
    assert _errno(flt, "*:mod:mymod") == errno.ENODEV
    assert _errno(flt, "schedule:nosuch") == errno.EINVAL
    flt.write(b"schedule")
    assert flt.text() == "schedule\n"


def test_a_failed_registration_leaves_nothing_behind(env):
    def refuse(ops):
        raise OSError(errno.EBUSY, "refused")
    env.ftrace.register_ftrace_function = refuse
    assert _errno(env.filter, "schedule:enable_event:sched:sched_switch") == errno.EBUSY
    assert env.tr.soft == [("sched_switch", True, True), ("sched_switch", False, True)]
    assert env.filter.text() == ALL
    env.ftrace.call(0x1000)                     # no probe left to run
    assert env.ev.soft_disabled


def test_the_function_tracer_traces_nothing_while_a_mod_waits(env):
    records = []
    tracer = FunctionTracer(env.ftrace, _Ops, lambda: SITES[:5],
                            record=lambda cpu, rec, size: records.append(rec[4]),
                            context=lambda: (1, 0), recording=lambda: True,
                            now=lambda: 0)
    tracer.filter.commands = env.probes
    env.probes.hashes = {True: tracer.filter, False: tracer.notrace}
    tracer.filter.write(b"*:mod:mymod")
    tracer.start()
    env.ftrace.call(0x1000)
    assert records == []
    tracer.filter.write(b"!*:mod:mymod")        # the filter is empty again: all
    env.ftrace.call(0x1000)
    assert records == [0x1000]
    tracer.stop()


_PIECES = ["schedule", "sched*", "*lock", "!schedule", "!*", "", "9", "mod_fn", "nosuch"]
_COMMANDS = ["traceon", "traceoff", "snapshot", "stacktrace", "dump", "cpudump",
             "enable_event", "disable_event", "mod", "bogus", ""]
_PARAMS = [None, "", "0", "3", "x", "sched:sched_switch", "sched:sched_switch:2",
           "sched:nosuch", "sched", "mymod", "my*", "!mymod", "0x10", "1:2:3"]


@given(st.lists(st.tuples(st.sampled_from(_PIECES), st.sampled_from(_COMMANDS + [None]),
                          st.sampled_from(_PARAMS), st.booleans()), max_size=12),
       st.lists(st.sampled_from([0x1000, 0x2000, 0x3000, 0x5000]), max_size=6))
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_token_sequence_fails_cleanly_and_reads_back(env, tokens, hits):
    """Whatever is written, a write fails only with OSError, the file reads back, and
    removing every probe kind leaves the event's soft mode as it found it."""
    for func, command, param, notrace in tokens:
        text = func if command is None else f"{func}:{command}" + (
            "" if param is None else f":{param}")
        try:
            (env.notrace if notrace else env.filter).write(text.encode())
        except OSError:
            pass
        for site in hits:
            env.ftrace.call(site)
        env.filter.text()
        env.notrace.text()
    env.probes.remove_all()
    assert env.ev.soft_mode == 0
    assert env.ftrace.registered == []


def test_the_dump_lines_context_is_6_1s_latency_format():
    # "%8.8s-%-7d %3d", the flags, " %4lldus%c: " with trace_find_mark of the gap
    assert lat_context("kworker/0:1", 42, 1, 0, 1_234_000, 5_000) == \
        "kworker/-42        1..... 1234us : "
    assert lat_context("sh", 7, 0, 0, 0, 150_000) == "      sh-7         0.....    0us!: "
    assert lat_context("sh", 7, 0, 0, 0, 2_000_000_000).endswith(" 0us$: ")
    assert lat_context("sh", 7, 0, 0, 12, 0, in_ns=False) == "      sh-7         0.....   12: "
