"""The reset between tests (kprobefs.testing.reset) on a real mount, in-process: it
undoes what it heard written, from this process, a shell, or a tool under ``kprobefs
exec`` (another mount namespace); it touches nothing when nothing was written; a reset
that failed (an instance kept busy) is followed by one that looks at everything; a
pytest session given the mount (``--kprobefs-mount``) resets it and leaves it mounted.
Skipped without FUSE, except under CI=true."""

import os
import subprocess
import textwrap

import pytest

from kprobefs.testing import ResetError, TracefsReset
from test_plugin import run_pytest
from test_records import mount  # noqa: F401 - the module's own mount, as there

pytestmark = pytest.mark.fuse


@pytest.fixture
def reset(mount):
    r = TracefsReset(mount.root)
    r.reset()
    yield r
    r.close()


def test_nothing_written_nothing_done(mount, reset):
    (mount.tracing / "trace").read_text()
    (mount.tracing / "kprobe_events").read_text()
    assert reset.reset() == []


def test_writes_from_a_shell_and_from_kprobefs_exec_are_undone(mount, reset):
    t = mount.tracing
    subprocess.run(["sh", "-c", f"echo 'p:sh_probe vfs_read' >> {t}/kprobe_events && "
                                f"echo 1 > {t}/options/sym-offset && "
                                f"echo 100 > {t}/buffer_percent"], check=True)
    r = mount.exec("echo function > /sys/kernel/tracing/current_tracer && "
                   "echo mono > /sys/kernel/debug/tracing/trace_clock")
    assert r.returncode == 0, r.stderr
    done = reset.reset()
    assert "current_tracer function -> nop" in done and "trace_clock local" in done
    assert "option sym-offset 1 -> 0" in done and "removed 1 dynamic events" in done
    assert (t / "current_tracer").read_text() == "nop\n"
    assert "[local]" in (t / "trace_clock").read_text()
    assert (t / "kprobe_events").read_text() == ""
    assert (t / "buffer_percent").read_text() == "50\n"


def test_a_tracers_option_set_through_trace_options_is_reset(mount, reset):
    t = mount.tracing
    (t / "current_tracer").write_text("function_graph")
    (t / "trace_options").write_text("funcgraph-proc")
    assert (t / "options" / "funcgraph-proc").read_text() == "1\n"
    assert "option funcgraph-proc 1 -> 0" in reset.reset()
    assert (t / "options" / "funcgraph-proc").read_text() == "0\n"


def test_a_reset_that_failed_is_followed_by_a_full_one(mount, reset):
    t = mount.tracing
    os.mkdir(t / "instances" / "busy")
    held = open(t / "instances" / "busy" / "trace")
    try:
        with pytest.raises(ResetError, match="instances/busy: cannot remove: a process "
                                             "still has one of its files open"):
            reset.reset()
    finally:
        held.close()
    assert "rmdir instances/busy" in reset.reset()
    assert os.listdir(t / "instances") == []


REUSE = '''
    import os
    from pathlib import Path

    def test_reused(kprobefs):
        assert kprobefs == Path(os.environ["REUSED"])
        assert (kprobefs / "tracing" / "kprobe_events").read_text() == ""
        (kprobefs / "tracing" / "kprobe_events").write_text("p:kept_by_none vfs_read\\n")
'''


def test_a_session_given_an_existing_mount_resets_it_and_leaves_it_mounted(mount, tmp_path):
    (tmp_path / "test_reuse.py").write_text(textwrap.dedent(REUSE))
    (mount.tracing / "kprobe_events").write_text("p:left_before vfs_read\n")
    r = run_pytest(tmp_path, "--kprobefs-mount", str(mount.root),
                   env=dict(os.environ, REUSED=str(mount.root)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.path.ismount(mount.root)
    assert "kept_by_none" in (mount.tracing / "kprobe_events").read_text()
