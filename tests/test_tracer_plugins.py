"""current_tracer's tracers (tracing/tracers/plugin.py): a registered tracer is offered
in every array that allows it, listed newest first; a switch resets the old tracer,
clears the buffer and initialises the new one, in that order; an unknown name is EINVAL
and changes nothing; a tracer may print its own header and trace text."""

import errno

import pytest

from tracer_fakes import cat, echo, make_tracer, node, write_errno
from kprobefs.tracing.tracers.plugin import TracerPlugin


class _Recorder(TracerPlugin):
    def __init__(self, name, log, allow_instances=True, header=None):
        self.name = name
        self.log = log
        self.allow_instances = allow_instances
        self.header = header

    def init(self, tr):
        self.log.append(("init", self.name, tr.name, len(tr.buffer.snapshot())))

    def reset(self, tr):
        self.log.append(("reset", self.name, tr.name))

    def print_header(self, tr, options):
        return self.header

    def print_trace(self, tr, pairs, options):
        return None if self.header is None else f"# {self.name} lines\n"


@pytest.fixture
def t():
    t = make_tracer()
    t.log = []
    reg = t.tracer
    reg.tracer_factories.append(lambda reg, tr: _Recorder("alpha", t.log))
    reg.tracer_factories.append(
        lambda reg, tr: _Recorder("beta", t.log, allow_instances=False, header="# beta\n"))
    reg._install_tracers(reg.top)
    return t


def test_tracers_are_listed_newest_first(t):
    names = cat(t.root, "available_tracers").split()
    assert names[:2] == ["beta", "alpha"] and names[-1] == "nop"


def test_a_switch_resets_the_old_tracer_clears_the_buffer_then_inits_the_new(t):
    echo(t.root, "trace_marker", "hello")
    echo(t.root, "current_tracer", "alpha")
    assert t.log == [("init", "alpha", "", 0)]         # the buffer was empty at init
    echo(t.root, "current_tracer", "alpha")            # the same tracer: nothing happens
    assert len(t.log) == 1
    echo(t.root, "current_tracer", "nop")
    assert t.log[-1] == ("reset", "alpha", "")
    assert cat(t.root, "current_tracer") == "nop\n"


def test_an_unknown_tracer_is_einval_and_changes_nothing(t):
    echo(t.root, "current_tracer", "alpha")
    assert write_errno(t.root, "current_tracer", "nosuch") == errno.EINVAL
    assert cat(t.root, "current_tracer") == "alpha\n"
    assert t.log == [("init", "alpha", "", 0)]


def test_a_tracer_prints_its_own_header_and_trace(t):
    echo(t.root, "current_tracer", "beta")
    assert cat(t.root, "trace") == "# beta\n# beta lines\n"


def test_an_instance_offers_only_tracers_that_allow_instances(t):
    node(t.root, "instances").mkdir("inst", 0o755)
    names = cat(t.root, "instances/inst/available_tracers").split()
    assert "alpha" in names and "beta" not in names
    echo(t.root, "instances/inst/current_tracer", "alpha")
    assert t.log == [("init", "alpha", "inst", 0)]
    node(t.root, "instances").rmdir("inst")
    assert t.log[-1] == ("reset", "alpha", "inst")     # rmdir resets its tracer
