"""The first read of ``trace`` over records the kernel recorded prints what a read that
keeps no text prints, and a reread the same again; so does a read after others, the
texts kept from read to read (text_caches) whatever changed in between: an event
defined again, its compiled text, the options, a comm."""

import os

import pytest

from kprobefs.tracing.buffers import text_caches
from kprobefs.tracing.buffers.output import compile_probe_text
from test_tracer_e2e import read, write
from test_tracer_kept_lines import hits
from test_tracer_native import make, workload
from tracer_fakes import VFS_READ, cat, echo, make_tracer

ARGS = "a=%di b=%si c=%dx:u32 d=%cx:s64"


def test_first_read_and_reread_print_what_a_fresh_formatter_prints():
    kernel, tracer, root = make(True, cpus=2)
    write(root, "kprobe_events", "".join(f"p:e{i} kprobe_target_traced+5 {ARGS}\n"
                                         for i in range(3)))
    write(root, "events/kprobes/enable", "1")
    kernel.wait_for_kprobe_optimizer()
    kernel.upcall("kprobe_bench_loop", 300, 1)
    workload(kernel)
    write(root, "events/kprobes/enable", "0")
    first = read(root, "trace")
    again = read(root, "trace")
    options = tracer.trace_options()
    fresh = tracer.render(tracer.buffer.snapshot(), options)
    body = "".join(line + "\n" for line in first.splitlines() if not line.startswith("#"))
    assert first == again and body == fresh and body.count("\n") > 300


def test_events_defined_again_print_their_new_format_from_staged_entries():
    kernel, tracer, root = make(True, cpus=2)
    for round_, args in enumerate((ARGS, "x=%si:x32 y=%di:u8 z=%dx:s16")):
        write(root, "kprobe_events", "".join(f"p:e{i} kprobe_target_traced+5 {args}\n"
                                             for i in range(3)))
        write(root, "events/kprobes/enable", "1")
        kernel.wait_for_kprobe_optimizer()
        kernel.upcall("kprobe_bench_loop", 100, 1)
        write(root, "events/kprobes/enable", "0")
        text = read(root, "trace")
        fresh = tracer.render(tracer.buffer.snapshot(), tracer.trace_options())
        body = "".join(line + "\n" for line in text.splitlines() if not line.startswith("#"))
        assert body == fresh and body.count("\n") >= 100
        assert (" x=0x" in body) == bool(round_) and (" a=0x" in body) != bool(round_)
        write(root, "trace", "", os.O_WRONLY | os.O_TRUNC)
        write(root, "kprobe_events", "", os.O_WRONLY | os.O_TRUNC)


# ------------------------------------------------ the texts kept from read to read
# (text_caches.SharedTextCaches): a read after others prints what a read that keeps
# nothing prints, whatever changed in between.

def fake_tracer():
    t = make_tracer(nr_cpus=2)
    echo(t.root, "kprobe_events", "p:num vfs_read a=%di b=%si:s32\n"
                                  "r:ret vfs_read rv=$retval:x16\n")
    echo(t.root, "events/kprobes/enable", "1")
    return t


def fresh_text(t):
    """``trace`` as a formatter with no texts kept writes it (the pairs path)."""
    tr = t.tracer.top
    options = tr.trace_options()
    return tr.trace_header(options) + tr.render(tr.buffer.snapshot(), options)


def read_fresh(t):
    text = cat(t.root, "trace", chunk=1 << 20)
    assert text == fresh_text(t)
    return text


def test_an_event_defined_again_under_its_name_prints_its_new_format():
    t = fake_tracer()
    hits(t, 12)
    assert " a=" in read_fresh(t)
    echo(t.root, "events/kprobes/enable", "0")
    echo(t.root, "trace", "", append=False)
    echo(t.root, "kprobe_events", "", append=False)
    echo(t.root, "kprobe_events", "p:num vfs_read+1 x=%si:x32 y=%di:u8\n"
                                  "r:ret vfs_read rv=$retval:s16\n")
    echo(t.root, "events/kprobes/enable", "1")
    for i in range(12):
        t.kernel.run_as(100 + i % 3, f"task{i % 3}", cpu=i % 2)
        t.engine.hit(VFS_READ + 1, di=i, si=-i)
        t.engine.ret(VFS_READ, VFS_READ + 0x40, ax=-i, si=i)
        t.clock.advance(1_000)
    text = read_fresh(t)
    assert " a=" not in text and " x=0x" in text and "(vfs_read+0x1/0x1a0)" in text


def test_a_new_compiled_text_of_the_same_event_is_printed(monkeypatch):
    # the texts kept of an event are those of the compiled text it gives at each read
    t = fake_tracer()
    hits(t, 12)
    read_fresh(t)
    echo(t.root, "trace", "", append=False)
    hits(t, 12, start=12)
    ev = t.tracer.events[("kprobes", "num")]
    renamed = compile_probe_text("other", False, ev.primary.args,
                                 t.tracer.top.symbols.symbolize)
    monkeypatch.setattr(ev, "compile_text", lambda *args: renamed)
    text = cat(t.root, "trace", chunk=1 << 20)
    assert " num: " not in text and text.count(" other: (vfs_read+0x0/0x1a0) a=") == 12


@pytest.mark.parametrize("option", ["noirq-info", "nocontext-info", "sym-offset",
                                    "nosym-offset"])
def test_an_option_changed_since_prints_with_it(option):
    t = fake_tracer()
    hits(t, 12)
    read_fresh(t)
    echo(t.root, "trace", "", append=False)
    echo(t.root, "trace_options", option, append=False)
    hits(t, 12, start=12)
    read_fresh(t)


def test_a_comm_changed_since_prints():
    t = fake_tracer()
    hits(t, 12)
    assert "task1-101" in read_fresh(t)
    echo(t.root, "trace", "", append=False)
    hits(t, 12, start=12)
    t.tracer.comm_cache.save(101, "renamed")
    text = read_fresh(t)
    assert "task1-101" not in text and "renamed-101" in text


def test_a_read_while_another_has_the_texts_makes_its_own():
    t = fake_tracer()
    hits(t, 12)
    first = read_fresh(t)
    tr = t.tracer.top
    with tr._text_caches.lend(None, lambda: None):
        assert cat(t.root, "trace", chunk=1 << 20) == first
    assert read_fresh(t) == first


@pytest.mark.parametrize("bound", ["EVENTS_KEPT", "CONTEXTS_KEPT", "ARGS_KEPT"])
def test_texts_past_their_bounds_are_dropped_and_made_again(monkeypatch, bound):
    # each round other events (defined again), other pids and other argument values:
    # past its bound, what was kept is dropped as the next read starts
    monkeypatch.setattr(text_caches, bound, 0)
    t = make_tracer(nr_cpus=2)
    caches = []
    for round_ in range(3):
        echo(t.root, "kprobe_events", f"p:num vfs_read a=%di b=%si:s{8 << round_}\n",
             append=False)
        echo(t.root, "events/kprobes/enable", "1")
        for i in range(12):
            t.kernel.run_as(100 + 10 * round_ + i % 3, f"task{i % 3}", cpu=i % 2)
            t.engine.hit(VFS_READ, di=12 * round_ + i, si=-i)
            t.clock.advance(1_000)
        read_fresh(t)
        caches.append(t.tracer.top._text_caches._caches)
        sizes = {"EVENTS_KEPT": len(caches[-1].events),
                 "CONTEXTS_KEPT": len(caches[-1].contexts),
                 "ARGS_KEPT": sum(map(len, caches[-1].bytes_texts.values()))}
        assert sizes[bound] == {"EVENTS_KEPT": 1, "CONTEXTS_KEPT": 6, "ARGS_KEPT": 12}[bound]
        echo(t.root, "events/kprobes/enable", "0")
        echo(t.root, "trace", "", append=False)
    assert caches[0] is caches[1] is caches[2]


def test_dropped_texts_are_made_again():
    """SharedTextCaches.drop: the next read gets caches made for it, not the kept ones."""
    from kprobefs.tracing.buffers.text_caches import SharedTextCaches
    shared, made = SharedTextCaches(), []

    def make():
        made.append(_Caches())
        return made[-1]

    class _Caches:
        key = "k"

        def end(self):
            pass

    with shared.lend("k", make) as first:
        pass
    with shared.lend("k", make) as again:
        assert again is first
    shared.drop()
    with shared.lend("k", make) as fresh:
        assert fresh is not first
    assert len(made) == 2
