"""The snapshot buffer (``snapshot``, ``per_cpu/cpuN/snapshot`` and ``snapshot_raw``):
6.1's write semantics (0 frees, 1 allocates and swaps, other numbers clear), its help
text when empty, the snapshot trigger (a real swap, and the "not allocated" message
that stops tracing), the hist ``snapshot()`` action owning the buffer, and the
snapshot following buffer_size_kb."""

import errno

import pytest

from tracer_fakes import VFS_READ, cat, echo, make_tracer, node, write_errno

EV = "events/kprobes/p1/"

_HELP = (
    "# echo 0 > snapshot : Clears and frees snapshot buffer\n"
    "# echo 1 > snapshot : Allocates snapshot buffer, if not already allocated.\n"
    "#                      Takes a snapshot of the main buffer.\n"
    "# echo 2 > snapshot : Clears snapshot buffer (but does not allocate or free)\n"
    "#                      (Doesn't have to be '2' works with any number that\n"
    "#                       is not a '0' or '1')\n")


@pytest.fixture
def t():
    t = make_tracer()
    echo(t.root, "kprobe_events", "p:p1 vfs_read arg1=%di:u32")
    t.kernel.run_as(42, "bash")
    return t


def lines(text):
    return [line for line in text.splitlines() if not line.startswith("#")]


def marker_texts(text):
    return [line.split("tracing_mark_write: ")[1] for line in lines(text)]


def test_a_freed_snapshot_reads_the_help(t):
    assert cat(t.root, "snapshot") == (
        "# tracer: nop\n#\n#\n# * Snapshot is freed *\n#\n# Snapshot commands:\n" + _HELP)


def test_an_allocated_empty_snapshot_says_so(t):
    echo(t.root, "snapshot", "2")                  # clears; allocates nothing
    assert "# * Snapshot is freed *" in cat(t.root, "snapshot")
    echo(t.root, "snapshot", "1")
    assert cat(t.root, "snapshot").startswith(
        "# tracer: nop\n#\n#\n# * Snapshot is allocated *\n#\n")


def test_writing_1_swaps_the_buffers(t):
    echo(t.root, "trace_marker", "first")
    echo(t.root, "snapshot", "1")
    assert lines(cat(t.root, "trace")) == []
    snap = cat(t.root, "snapshot")
    assert marker_texts(snap) == ["first"]
    assert "# entries-in-buffer/entries-written: 1/1   #P:2" in snap
    echo(t.root, "trace_marker", "second")
    echo(t.root, "snapshot", "1")                 # swap back
    assert marker_texts(cat(t.root, "trace")) == ["first"]
    assert marker_texts(cat(t.root, "snapshot")) == ["second"]


def test_writing_2_clears_and_0_frees(t):
    echo(t.root, "trace_marker", "x")
    echo(t.root, "snapshot", "1")
    echo(t.root, "snapshot", "2")
    assert "# * Snapshot is allocated *" in cat(t.root, "snapshot")
    echo(t.root, "snapshot", "0")
    assert "# * Snapshot is freed *" in cat(t.root, "snapshot")


def test_a_swap_keeps_tracing_on_as_it_was(t):
    echo(t.root, "tracing_on", "0")
    echo(t.root, "snapshot", "1")
    assert cat(t.root, "tracing_on") == "0\n"


def test_bad_numbers_are_einval(t):
    assert write_errno(t.root, "snapshot", "x") == errno.EINVAL
    assert write_errno(t.root, "snapshot", "-1") == errno.EINVAL


def test_per_cpu_snapshot_swaps_one_cpu_and_cannot_free(t):
    t.kernel.cpu.index = 1
    echo(t.root, "trace_marker", "on1")
    t.kernel.cpu.index = 0
    echo(t.root, "trace_marker", "on0")
    echo(t.root, "per_cpu/cpu1/snapshot", "1")
    assert marker_texts(cat(t.root, "trace")) == ["on0"]
    assert marker_texts(cat(t.root, "snapshot")) == ["on1"]
    assert marker_texts(cat(t.root, "per_cpu/cpu1/snapshot")) == ["on1"]
    assert write_errno(t.root, "per_cpu/cpu1/snapshot", "0") == errno.EINVAL
    help_text = cat(t.root, "per_cpu/cpu0/snapshot")
    assert "# echo 0 > snapshot : Invalid for per_cpu snapshot file.\n" in help_text
    echo(t.root, "per_cpu/cpu1/snapshot", "2")
    assert lines(cat(t.root, "snapshot")) == []


def test_snapshot_raw_reads_the_snapshot_pages(t):
    echo(t.root, "trace_marker", "raw")
    echo(t.root, "snapshot", "1")
    cpu = t.kernel.cpu.index
    handle = node(t.root, f"per_cpu/cpu{cpu}/snapshot_raw").open(0, 1, "cat")
    page = handle.read(4096, 0)
    handle.release()
    assert b"raw\n" in page
    assert lines(cat(t.root, "snapshot")) == []        # consumed


def test_the_snapshot_follows_buffer_size_kb(t):
    echo(t.root, "snapshot", "1")
    echo(t.root, "buffer_size_kb", "8")
    max_buffer = t.tracer.top.max_tr.buffer
    assert [max_buffer.size_kb(c) for c in range(2)] == [11, 11]
    echo(t.root, "per_cpu/cpu1/buffer_size_kb", "16")
    assert max_buffer.size_kb(1) == 19
    echo(t.root, "snapshot", "0")
    assert max_buffer.size_kb(1) < 16


def test_snapshot_trigger_swaps(t):
    echo(t.root, "snapshot", "1")
    echo(t.root, EV + "enable", "1")
    t.engine.hit(VFS_READ, di=1)
    echo(t.root, EV + "trigger", "snapshot")
    t.engine.hit(VFS_READ, di=2)
    # the event is committed where it was reserved, before the swap: the snapshot
    assert [line.split("arg1=")[1] for line in lines(cat(t.root, "snapshot"))] == ["1", "2"]
    assert lines(cat(t.root, "trace")) == []


def test_registering_a_snapshot_trigger_allocates(t):
    echo(t.root, EV + "trigger", "snapshot")
    assert "# * Snapshot is allocated *" in cat(t.root, "snapshot")
    assert write_errno(t.root, EV + "trigger", "snapshot") == errno.EEXIST
    assert write_errno(t.root, EV + "trigger", "snapshot+1") == errno.EINVAL


def test_snapshot_without_a_buffer_says_so_and_stops_tracing(t):
    t.tracer.top.take_snapshot()
    assert cat(t.root, "tracing_on") == "0\n"
    text = [line.split(": ", 1)[1] for line in lines(cat(t.root, "trace"))]
    assert text == ["tracing_snapshot_instance_cond: *** SNAPSHOT NOT ALLOCATED ***",
                    "tracing_snapshot_instance_cond: *** stopping trace here!   ***"]


def test_marker_snapshot_trigger_alternates_the_writes(t):
    """trigger-trace-marker-snapshot.tc: each write lands in the buffer it was
    reserved in, which the trigger then swaps out."""
    echo(t.root, "events/ftrace/print/trigger", "snapshot")
    for i in range(1, 11):
        echo(t.root, "trace_marker", f"hello >{i}<")
    assert marker_texts(cat(t.root, "trace")) == [f"hello >{i}<" for i in (1, 3, 5, 7, 9)]
    assert marker_texts(cat(t.root, "snapshot")) == [f"hello >{i}<"
                                                     for i in (2, 4, 6, 8, 10)]


def test_hist_snapshot_action_owns_the_snapshot(t):
    echo(t.root, EV + "trigger", "hist:keys=arg1:v=arg1:onchange($v).snapshot()")
    assert write_errno(t.root, "snapshot", "1") == errno.EBUSY
    assert "# * Snapshot is allocated *" in cat(t.root, "snapshot")
    echo(t.root, EV + "enable", "1")
    t.engine.hit(VFS_READ, di=5)
    assert [line.split("arg1=")[1] for line in lines(cat(t.root, "snapshot"))] == ["5"]
    echo(t.root, EV + "trigger", "!hist:keys=arg1:v=arg1:onchange($v).snapshot()")
    echo(t.root, "snapshot", "1")                      # released


def test_a_second_snapshot_action_is_ebusy(t):
    echo(t.root, "kprobe_events", "p:p2 ksys_read arg1=%di:u32")
    echo(t.root, EV + "trigger", "hist:keys=arg1:v=arg1:onchange($v).snapshot()")
    assert write_errno(t.root, "events/kprobes/p2/trigger",
                       "hist:keys=arg1:v=arg1:onchange($v).snapshot()") == errno.EBUSY
    assert cat(t.root, "events/kprobes/p2/trigger").startswith("# Available triggers")


def test_an_instance_has_its_own_snapshot(t):
    node(t.root, "instances").mkdir("i", 0o755)
    echo(t.root, "instances/i/trace_marker", "inst")
    echo(t.root, "instances/i/snapshot", "1")
    assert marker_texts(cat(t.root, "instances/i/snapshot")) == ["inst"]
    assert "# * Snapshot is freed *" in cat(t.root, "snapshot")


class _Stage:
    """A kernel recorder's stage, as RingBuffer sees it: records staged per CPU."""

    def __init__(self):
        self.staged = {0: [], 1: []}
        self.synced = {}

    def take(self, cpu):
        from kprobefs.tracing.buffers.ring_buffer import Chunk
        recs, self.staged[cpu] = self.staged[cpu], []
        if not recs:
            return None
        return [Chunk(b"", len(recs), lambda _data, recs=recs: recs)], 8 * len(recs), recs[-1][0]

    def sync(self, cpu, used, last_ts, overwrite):
        self.synced[cpu] = (used, last_ts)

    def pending(self, cpu):
        return bool(self.staged[cpu])

    def set_waiters(self, waiting):
        pass


def test_a_swap_takes_the_staged_records_along_and_the_stage_goes_on_in_the_new_page():
    from kprobefs.tracing.buffers.ring_buffer import RingBuffer
    main, snap = RingBuffer(2), RingBuffer(2)
    stage = _Stage()
    main.attach_stage(stage)
    stage.staged[1] = [(10, 1, 0, None), (11, 1, 0, None)]
    main.swap(snap, 1)
    assert [rec[0] for _cpu, rec in snap.snapshot()] == [10, 11]
    assert main.is_empty()
    assert stage.synced[1] == (0, None)              # the stage writes the empty page now
    stage.staged[0] = [(12, 1, 0, None)]
    main.swap(snap)
    assert [rec[0] for _cpu, rec in main.snapshot()] == [10, 11]
    assert [rec[0] for _cpu, rec in snap.snapshot()] == [12]
