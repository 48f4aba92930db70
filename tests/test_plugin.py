"""The pytest plugin (kprobefs.testing.plugin), each behaviour shown by a pytest session
of its own run in a subprocess with this interpreter, as a user's project runs it: the
sample project of docs/testing-your-code.md passes against the installed package; a
test that leaves probes, triggers, an instance and changed options behind is followed
by one that finds the tracefs as a new daemon has it; a failing test's report carries
the daemon's log; the same seeded test run twice gives the same records; a machine
without FUSE skips with the reason, and fails under CI=true.

Where the package is installed (tests/run.sh) the sessions find the plugin through its
``pytest11`` entry point; from a source tree they are given ``-p
kprobefs.testing.plugin``."""

import functools
import json
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kprobefs.testing
from robust_mount import need_fuse

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "sample-project"
DOC = ROOT / "docs" / "testing-your-code.md"
PACKAGE_PARENT = str(Path(kprobefs.testing.__file__).resolve().parents[2])


@functools.lru_cache
def plugin_found(pythonpath: str | None) -> bool:
    """Whether this interpreter, started outside any source tree with PYTHONPATH (None:
    as it is), finds the plugin's entry point: the installed package's, or a source
    tree's egg-info on PYTHONPATH."""
    probe = ("import importlib.metadata as m; print(any(ep.value == "
             "'kprobefs.testing.plugin' for ep in m.entry_points(group='pytest11')))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True,
                       env=env, text=True, timeout=60)
    return r.stdout.strip() == "True"


def run_pytest(cwd: Path, *args: str, env: dict | None = None,
               timeout: float = 240) -> subprocess.CompletedProcess:
    """pytest in cwd: with the installed package and its entry point when this
    interpreter has them (tests/run.sh), else with this source tree on PYTHONPATH."""
    environ = dict(os.environ if env is None else env, PYTHONDONTWRITEBYTECODE="1")
    environ.pop("PYTHONPATH", None)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfs", *args]
    if not plugin_found(None):
        environ["PYTHONPATH"] = PACKAGE_PARENT
        if not plugin_found(PACKAGE_PARENT):
            argv[3:3] = ["-p", "kprobefs.testing.plugin"]
    return subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.fuse
def test_the_sample_project_passes():
    need_fuse()
    r = run_pytest(SAMPLE)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "4 passed" in out and "kprobefs: 4 resets" in out, out
    assert "kprobefs umount failed" not in out, out


LEAVE_THEN_CLEAN = '''
    import os
    from pathlib import Path

    baseline = {}

    def write(path, text, append=False):
        with open(path, "a" if append else "w") as f:
            f.write(text)

    #: What tells one tracefs from another, read file by file as ftracetest's own reset
    #: would (every event's enable, filter and trigger); left out are the files whose
    #: content is a history (saved_cmdlines, kprobe_profile, printk_formats, stats).
    SKIP = {"trace_pipe", "trace", "saved_cmdlines", "saved_tgids", "kprobe_profile",
            "printk_formats", "stack_trace", "snapshot", "README", "per_cpu",
            "available_filter_functions", "trace_marker", "trace_marker_raw", "trace_stat",
            "hist"}

    def state(root):
        t = root / "tracing"
        out = {}
        for dirpath, dirs, files in os.walk(t):
            dirs[:] = [d for d in dirs if d not in SKIP]
            rel = os.path.relpath(dirpath, t)
            out[rel + "/"] = sorted(dirs) + sorted(files)
            for name in files:
                path = Path(dirpath) / name
                if name in SKIP or not os.access(path, os.R_OK) or name in ("format", "id"):
                    continue
                out[f"{rel}/{name}"] = path.read_text()
        for cpu in sorted(os.listdir(t / "per_cpu")):
            out[cpu] = (t / "per_cpu" / cpu / "buffer_size_kb").read_text()
        for rel in ("proc/modules", "proc/sys/kernel/ftrace_enabled",
                    "proc/sys/kernel/stack_tracer_enabled",
                    "proc/sys/debug/kprobes-optimization", "kprobes/enabled", "kprobes/list"):
            out[rel] = (root / rel).read_text()
        out["entries"] = (t / "trace").read_text().splitlines()[2]
        out["snapshot"] = "Snapshot is freed" in (t / "snapshot").read_text()
        return out

    def test_0_baseline(kprobefs):
        t = kprobefs / "tracing"
        assert len(os.listdir(t / "per_cpu")) == 3          # kprobefs_cpus in the ini
        write(t / "events/sched/sched_switch/enable", "1")  # the buffers expand once
        write(t / "events/sched/sched_switch/enable", "0")
        write(t / "trace", "")
        baseline.update(state(kprobefs))
        assert baseline["./current_tracer"] == "nop\\n"

    def test_1_leaves_everything_behind(kprobefs):
        t = kprobefs / "tracing"
        write(t / "kprobe_events", "p:leftover/open do_sys_openat2 path=+0(%si):ustring\\n"
                                   "r:leftover/ret do_sys_openat2 ret=$retval\\n")
        write(t / "synthetic_events", "openlat u64 lat")
        write(t / "events/leftover/open/trigger", "hist:keys=common_pid:ts0=common_timestamp")
        write(t / "events/leftover/ret/trigger",
              "hist:keys=common_pid:lat=common_timestamp-$ts0:onmatch(leftover.open)"
              ".openlat($lat)")
        write(t / "events/synthetic/openlat/trigger", "hist:keys=lat")
        write(t / "events/leftover/enable", "1")
        write(t / "events/leftover/open/filter", 'path ~ "/proc/*"')
        write(t / "events/sched/sched_wakeup/filter", "prio < 100")
        write(t / "events/sched/sched_process_exec/trigger", "traceoff")
        write(t / "events/sched/sched_process_fork/enable", "1")
        write(t / "events/ftrace/print/trigger", 'snapshot if buf == "x"')
        write(t / "set_ftrace_filter", "vfs_read ksys_read")
        write(t / "set_ftrace_filter", "schedule:traceoff:5", append=True)
        write(t / "set_ftrace_filter", "vfs_read:enable_event:sched:sched_switch:2",
              append=True)
        write(t / "set_ftrace_notrace", "fget")
        write(t / "set_graph_function", "ksys_read")
        write(t / "current_tracer", "function_graph")
        write(t / "options/funcgraph-proc", "1")
        write(t / "trace_options", "sym-offset")
        write(t / "options/record-tgid", "1")
        write(t / "trace_clock", "mono")
        write(t / "buffer_size_kb", "512")
        write(t / "per_cpu/cpu1/buffer_size_kb", "64")
        write(t / "tracing_cpumask", "1")
        write(t / "set_event_pid", str(os.getpid()))
        write(t / "set_ftrace_pid", str(os.getpid()))
        write(t / "tracing_thresh", "100")
        write(t / "max_graph_depth", "3")
        write(t / "snapshot", "1")
        os.mkdir(t / "instances/leftover")
        write(t / "instances/leftover/events/leftover/open/enable", "1")
        write(t / "instances/leftover/events/sched/sched_switch/trigger", "stacktrace")
        write(kprobefs / "kprobefs/modules", "load trace-printk")
        write(kprobefs / "proc/sys/kernel/stack_tracer_enabled", "1")
        write(kprobefs / "proc/sys/debug/kprobes-optimization", "0")
        write(kprobefs / "kprobes/enabled", "0")
        try:
            write(t / "kprobe_events", "p:bad no_such_function_here\\n", append=True)
        except OSError:
            pass                                            # an error_log entry
        (kprobefs / "proc/version").read_text()
        write(t / "tracing_on", "0")
        assert "leftover" in (t / "available_events").read_text()
        assert "[mono]" in (t / "trace_clock").read_text()

    def test_2_finds_the_tracefs_clean(kprobefs):
        now = state(kprobefs)
        assert {k: v for k, v in now.items() if baseline.get(k) != v} == {}
        assert now == baseline

    def test_3_fails_to_show_the_log(kprobefs):
        assert False, "on purpose"
'''


@pytest.mark.fuse
def test_a_test_that_leaves_state_behind_is_followed_by_a_clean_tracefs(tmp_path):
    need_fuse()
    (tmp_path / "test_leave.py").write_text(textwrap.dedent(LEAVE_THEN_CLEAN))
    (tmp_path / "pytest.ini").write_text("[pytest]\nkprobefs_cpus = 3\n"
                                         "kprobefs_workload = 0.5\nkprobefs_seed = 4\n")
    r = run_pytest(tmp_path)
    out = r.stdout + r.stderr
    assert "1 failed, 3 passed" in out, out
    assert "FAILED test_leave.py::test_3_fails_to_show_the_log" in out, out
    assert "kprobefs log (kprobefs at " in out, out
    assert "(--cpus 3 --workload 0.5 --seed 4)" in out, out


DETERMINISM = '''
    import json, os, subprocess
    from kprobefs.testing import canonical

    def test_seeded(kprobefs, kprobefs_reader):
        t = kprobefs / "tracing"
        assert len(os.listdir(t / "per_cpu")) == 1          # --kprobefs-cpus 1
        with open(t / "kprobe_events", "w") as f:
            f.write("p:open do_sys_openat2 path=+0(%si):ustring\\n"
                    "r:openret do_sys_openat2 ret=$retval:s32\\n")
        for event in ("kprobes", "sched/sched_process_fork", "sched/sched_process_exec",
                      "sched/sched_process_exit", "syscalls/sys_exit_openat"):
            (t / "events" / event / "enable").write_text("1")
        (kprobefs / "proc" / "version").read_text()
        # A child that runs until the kernel has seen its exec: a request of this
        # process takes the fork and exec events first, while the child's comm can be
        # read (one that had exited by then would keep its parent's).  The host sends
        # the exec's event after it closes the close-on-exec pipe Popen waits on, so
        # the child answers a line first: then it runs its program, the event sent.
        child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        child.stdin.write(b"running\\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"running\\n"
        (t / "tracing_on").read_text()
        child.stdin.close()
        child.wait()
        child.stdout.close()
        # A child that opens files of the mount: its fds follow its parent's closes.
        subprocess.run(["cat", str(kprobefs / "proc" / "version")],
                       stdout=subprocess.DEVNULL, check=True)
        (t / "trace_marker").write_text("between")
        (kprobefs / "tmp" / "made-by-the-test").write_text("x")
        (t / "events" / "enable").write_text("0")
        records = kprobefs_reader.trace()
        with open(os.environ["RECORDS_OUT"], "w") as f:
            json.dump({"canonical": [repr(r) for r in canonical(records)],
                       "timestamps": [r.timestamp for r in records],
                       "events": sorted({r.event for r in records})}, f)
'''


@pytest.mark.fuse
def test_the_same_seeded_test_gives_the_same_records_twice(tmp_path):
    need_fuse()
    (tmp_path / "test_seeded.py").write_text(textwrap.dedent(DETERMINISM))
    runs = []
    for n in range(2):
        out = tmp_path / f"records{n}.json"
        r = run_pytest(tmp_path, "--kprobefs-seed", "7", "--kprobefs-cpus", "1",
                       env=dict(os.environ, RECORDS_OUT=str(out)))
        assert r.returncode == 0, r.stdout + r.stderr
        runs.append(json.loads(out.read_text()))
    first, second = runs
    assert {"open", "openret", "sched_process_fork", "sched_process_exec",
            "sched_process_exit", "sys_exit_openat", "print"} <= set(first["events"])
    differ = [(a, b) for a, b in zip(first["canonical"], second["canonical"]) if a != b]
    assert differ == [] and len(first["canonical"]) == len(second["canonical"])
    assert any(r.startswith("('cat', ") and "openret" in r for r in first["canonical"])
    assert sum(r.startswith("('cat', ") and "sched_process_exec" in r
               for r in first["canonical"]) == 2
    assert first["timestamps"] != second["timestamps"]


NO_FUSE = '''
    import kprobefs.testing.plugin

    def pytest_configure(config):
        kprobefs.testing.plugin.fuse_missing = lambda: "no FUSE in this test"
'''


def test_without_fuse_the_fixture_skips_with_the_reason_but_fails_under_ci(tmp_path):
    (tmp_path / "conftest.py").write_text(textwrap.dedent(NO_FUSE))
    (tmp_path / "test_it.py").write_text("def test_it(kprobefs):\n    pass\n"
                                         "def test_other():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    r = run_pytest(tmp_path, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 passed, 1 skipped" in out and "kprobefs cannot mount here: no FUSE in this test" \
        in out, out
    r = run_pytest(tmp_path, env=dict(env, CI="true"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "kprobefs cannot mount under CI=true: no FUSE in this test" in out, out


def doc_blocks() -> list[tuple[str, str]]:
    """(caption, text) of each fenced block of the page that follows an HTML comment
    naming a file; ("", text) for the others."""
    out = []
    for m in re.finditer(r"(?:<!-- (\S+) -->\n)?```\w*\n(.*?)```\n", DOC.read_text(), re.S):
        out.append((m[1] or "", m[2]))
    return out


def test_the_page_shows_the_sample_project_as_it_is():
    shown = {name: text for name, text in doc_blocks() if name}
    assert set(shown) == {"examples/sample-project/pyproject.toml",
                          "examples/sample-project/filesnoop.py",
                          "examples/sample-project/tests/test_filesnoop.py"}
    for name, text in shown.items():
        assert text == (ROOT / name).read_text(), name
    imports = [text for _, text in doc_blocks() if text.startswith("from kprobefs.testing")]
    assert imports
    for text in imports:
        exec(compile(text.split("\n\n")[0], str(DOC), "exec"), {})


@pytest.mark.fuse
def test_the_pages_example_without_pytest_runs():
    need_fuse()
    block = next(text for _, text in doc_blocks() if "with KprobefsMount(" in text)
    scope: dict = {}
    exec(compile(block, str(DOC), "exec"), scope)
    assert scope["result"].returncode == 0, scope["result"].stderr
    assert "/proc/version" in {r["path"] for r in scope["opens"] if r.event == "open"}


def test_loading_the_plugin_does_not_load_the_emulator():
    """The entry point is loaded by every pytest run of an environment kprobefs is in:
    it must not import unicorn, capstone or lark (kprobefs/__init__ is lazy)."""
    code = ("import sys, kprobefs.testing.plugin; "
            "print([m for m in ('unicorn', 'capstone', 'lark') if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.strip() == "[]"
