"""``kprobefs exec``: unmodified tracing tools against a real mount, in the private mount
namespace that puts it where Linux tools look (kprobefs/execns.py).

The view itself (the first tracefs line of /proc/mounts, /sys/kernel/debug, the
emulated kernel's /proc files, the host left alone), the command's exit status and
signals, then Debian's own tools: trace-cmd (``list -e/-t/-o``, ``stat``, ``show``,
``reset``, ``extract`` and ``report`` compared record by record with ``trace``,
``record``, ``report --stat``, the ftrace_enabled sysctl), perf (``perf probe -a/-l/-d``,
``perf ftrace -T/-G``, which poll ``trace_pipe``), perf-tools' ``kprobe``, ``opensnoop``
and ``funcslower`` scripts, and ftracetest itself.  The FUSE tests are skipped without
/dev/fuse, a missing tool is skipped, except under CI=true (tests/run.sh installs them).
"""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import conformance_runner as runner
from kprobefs.cli import build_parser, _parse
from kprobefs.testing import TracefsReset
from kprobefs.testing.records import parse_trace
from robust_mount import need_fuse

CI = os.environ.get("CI") == "true"
EXEC = [sys.executable, "-m", "kprobefs", "exec"]
#: Debian packages of the tools tested here (tests/run.sh installs them).
PACKAGES = {"trace-cmd": "trace-cmd", "perf": "linux-perf",
            "kprobe-perf": "perf-tools-unstable", "opensnoop-perf": "perf-tools-unstable",
            "funcslower-perf": "perf-tools-unstable", "gawk": "gawk"}


def _default_sigint():
    """In a child before exec: SIGINT back to its default action."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is missing (apt-get install {PACKAGES[name]})"
        if CI:
            pytest.fail(f"cannot run under CI=true: {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def mnt() -> Path:
    """One daemon for the module (the CLI's, in the foreground, in a child)."""
    need_fuse()
    with runner.Mount() as mount:
        yield mount.path


@pytest.fixture
def tracing(mnt) -> Path:
    """MNT/tracing, with no event enabled, no probe, an empty buffer and buffer_percent
    at its default afterwards."""
    yield mnt / "tracing"
    (mnt / "tracing" / "buffer_percent").write_text("50\n")
    (mnt / "tracing" / "events" / "enable").write_text("0\n")
    (mnt / "tracing" / "kprobe_events").write_text("")
    (mnt / "tracing" / "trace").write_text("")


def run_exec(mnt: Path, *argv: str, **kw) -> subprocess.CompletedProcess:
    """``kprobefs exec MNT -- argv``, its output as text."""
    return subprocess.run(EXEC + [str(mnt), "--", *argv], capture_output=True, text=True,
                          timeout=120, env=runner._cli_env(), cwd="/", **kw)


def sh(mnt: Path, script: str) -> str:
    done = run_exec(mnt, "sh", "-c", script)
    assert done.returncode == 0, done.stderr
    return done.stdout


def host_mounts_at(paths) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if line.split()[4] in paths]


# ---- the command line --------------------------------------------------------------------
@pytest.mark.parametrize("argv, mountpoint, program", [
    (["exec", "--", "trace-cmd", "list"], "/run/kprobefs", ["trace-cmd", "list"]),
    (["exec", "/mnt", "--", "sh", "-c", "x", "--", "y"], "/mnt",
     ["sh", "-c", "x", "--", "y"]),
    (["--log-level", "debug", "exec", "/mnt"], "/mnt", []),
    (["exec"], "/run/kprobefs", []),
])
def test_exec_arguments(argv, mountpoint, program):
    args = _parse(build_parser(), argv)
    assert (args.command, args.mountpoint, args.program) == ("exec", mountpoint, program)


def test_kernel_scratch_is_an_exec_option():
    args = _parse(build_parser(), ["exec", "--kernel-scratch", "/mnt", "--", "true"])
    assert (args.kernel_scratch, args.mountpoint, args.program) == (True, "/mnt", ["true"])
    assert _parse(build_parser(), ["exec"]).kernel_scratch is False


def test_double_dash_is_only_for_exec(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(build_parser(), ["status", "--", "x"])
    assert e.value.code == 2 and "-- is for exec" in capsys.readouterr().err


def test_exec_refuses_a_directory_that_is_no_kprobefs_mount(tmp_path):
    done = subprocess.run(EXEC + [str(tmp_path), "--", "true"], capture_output=True,
                          text=True, timeout=60, env=runner._cli_env())
    assert done.returncode == 1
    assert done.stderr == f"kprobefs: {tmp_path}: not a kprobefs mount\n"


# ---- the view ----------------------------------------------------------------------------
def test_the_tracing_dir_is_the_first_tracefs_line(mnt):
    out = sh(mnt, "grep -m1 ' tracefs ' /proc/mounts | cut -d' ' -f2,3; "
                  "grep -m1 ' debugfs ' /proc/mounts | cut -d' ' -f2,3; "
                  "cat /sys/kernel/tracing/README | md5sum; "
                  "cat /sys/kernel/debug/tracing/README | md5sum; ls /sys/kernel/debug")
    readme = subprocess.run(["md5sum"], input=(mnt / "tracing" / "README").read_bytes(),
                            capture_output=True).stdout.decode()
    lines = out.splitlines()
    assert lines[:4] == ["/sys/kernel/tracing tracefs", "/sys/kernel/debug debugfs",
                         readme.strip(), readme.strip()]
    assert sorted(lines[4:]) == sorted(os.listdir(mnt))


def test_the_proc_files_are_the_emulated_kernels(mnt):
    out = sh(mnt, "md5sum /proc/kallsyms /proc/version; wc -c < /sys/kernel/notes; "
                  "[ -e /proc/kcore ] && wc -c < /proc/kcore || echo 0")
    sums = subprocess.run(["md5sum", str(mnt / "proc" / "kallsyms"),
                           str(mnt / "proc" / "version")], capture_output=True, text=True)
    expected = [line.split()[0] for line in sums.stdout.splitlines()]
    lines = out.split("\n")
    assert [line.split()[0] for line in lines[:2]] == expected
    assert lines[2:4] == ["0", "0"]     # no build id, no kcore: the host's are masked


def test_a_proc_file_the_host_has_is_bound(mnt):
    """Every file under MNT/proc replaces the host's of that name, when there is one;
    a sysctl knob is there even when the host kernel lacks it (its directory is
    shadowed), and the host's other knobs beside it stay reachable."""
    for rel in ("modules", "sys/debug/kprobes-optimization",
                "sys/kernel/stack_tracer_enabled"):
        present = os.path.isfile(f"/proc/{rel}") or (
            rel.startswith("sys/") and os.path.isdir(os.path.dirname(f"/proc/{rel}")))
        out = sh(mnt, f"cat /proc/{rel} 2>/dev/null || echo absent")
        assert out == ((mnt / "proc" / rel).read_text() if present else "absent\n"), rel
    assert sh(mnt, "cat /proc/sys/kernel/ostype") == "Linux\n"
    out = sh(mnt, "echo 1 > /proc/sys/kernel/stack_tracer_enabled; "
                  "cat /proc/sys/kernel/stack_tracer_enabled; "
                  "echo 0 > /proc/sys/kernel/stack_tracer_enabled")
    assert out == "1\n"


def test_the_host_mounts_are_untouched(mnt):
    places = {"/sys/kernel/tracing", "/sys/kernel/debug", "/proc/kallsyms",
              "/proc/version", "/sys/kernel/notes"}
    before = host_mounts_at(places)
    sh(mnt, "ls /sys/kernel/tracing > /dev/null")
    assert host_mounts_at(places) == before


def _mount_at(target: str, mountinfo: str) -> str | None:
    """The filesystem type of the topmost mount at target in a mountinfo text."""
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if fields[4] == target:
            found = fields[fields.index("-") + 1]
    return found


def test_dev_null_and_tmp_stay_the_hosts_by_default(mnt):
    mountinfo = sh(mnt, "cat /proc/self/mountinfo")
    assert "fuse.kprobefs" not in (_mount_at("/tmp", mountinfo) or "")
    assert "fuse.kprobefs" not in (_mount_at("/dev/null", mountinfo) or "")


def test_the_module_tools_work_with_kernel_scratch_from_a_package_under_tmp(mnt, tmp_path):
    """--kernel-scratch hides the host's /tmp; a kprobefs there (a CI clone, a virtual
    environment) must still give the command its module tools: the tool is a copy of
    kmod.py's source with the modules' digests, run by the interpreter's real path."""
    import kprobefs
    copy = tmp_path / "tree"
    shutil.copytree(Path(kprobefs.__file__).resolve().parent, copy / "kprobefs",
                    ignore=shutil.ignore_patterns("__pycache__", "*.c", "*.h", "*.S"))
    env = dict(runner._cli_env(), PYTHONPATH=str(copy))
    done = subprocess.run(EXEC + ["--kernel-scratch", str(mnt), "--", "sh", "-c",
                                  "modprobe trace_printk && lsmod | grep -c '^trace_printk ' "
                                  "&& rmmod trace_printk"],
                          capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert done.returncode == 0 and done.stdout == "1\n", done.stderr


def test_kernel_scratch_makes_dev_null_and_tmp_the_emulated_kernels(mnt):
    done = subprocess.run(EXEC + ["--kernel-scratch", str(mnt), "--", "sh", "-c",
                                  "echo hi > /dev/null && cat /dev/null && "
                                  "mkdir /tmp/kprobefs-scratch-test && "
                                  "cat /proc/self/mountinfo"],
                          capture_output=True, text=True, timeout=120,
                          env=runner._cli_env(), cwd="/")
    try:
        assert done.returncode == 0, done.stderr
        assert _mount_at("/tmp", done.stdout) == "fuse.kprobefs"
        assert _mount_at("/dev/null", done.stdout) == "fuse.kprobefs"
        assert (mnt / "tmp" / "kprobefs-scratch-test").is_dir()   # the emulated /tmp
        assert not Path("/tmp/kprobefs-scratch-test").exists()      # not the host's
    finally:
        if (mnt / "tmp" / "kprobefs-scratch-test").exists():
            (mnt / "tmp" / "kprobefs-scratch-test").rmdir()


def test_kernel_scratch_refuses_a_working_directory_under_tmp(mnt):
    cwd = Path("/tmp")
    done = subprocess.run(EXEC + ["--kernel-scratch", str(mnt), "--", "true"],
                          capture_output=True, text=True, timeout=120,
                          env=runner._cli_env(), cwd=cwd)
    assert done.returncode == 1
    assert done.stderr.startswith("kprobefs: --kernel-scratch: the working directory "
                                  "/tmp is under /tmp")


# ---- the module tools --------------------------------------------------------------------
@pytest.fixture
def no_module(mnt):
    """Every module of the emulated kernel unloaded afterwards."""
    yield
    for line in (mnt / "proc" / "modules").read_text().splitlines():
        (mnt / "kprobefs" / "modules").write_text(f"unload {line.split()[0]}\n")


def test_modprobe_lsmod_and_rmmod_act_on_the_emulated_kernel(mnt, no_module):
    """Issue 28's line: kprobefs exec -- sh -c 'modprobe trace_printk && lsmod | grep
    trace_printk && rmmod trace_printk'."""
    done = run_exec(mnt, "sh", "-c", "modprobe trace_printk && lsmod | grep trace_printk "
                                     "&& rmmod trace_printk")
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"trace_printk +\d+  0\n", done.stdout), done.stdout
    assert "trace_printk" not in (mnt / "proc" / "modules").read_text()


def test_lsmod_prints_kmods_columns(mnt, no_module):
    out = sh(mnt, "modprobe ftrace-direct && modprobe trace_printk && lsmod && kmod list")
    proc = [line.split() for line in (mnt / "proc" / "modules").read_text().splitlines()]
    # /proc/modules' order (newest first), kmod's "%-19s %8lu  %d"
    table = ["Module                  Size  Used by"] + [
        f"{name:<19} {int(size):>8}  {refs}" for name, size, refs, *_ in proc]
    assert [name for name, *_ in proc] == ["trace_printk", "ftrace_direct"]
    assert out.splitlines() == table * 2


#: (script, exit status, stderr); a script ending in `lsmod | wc -l` prints how many
#: lines lsmod printed: its header and a line per module left loaded.
KMOD_CASES = [
    ("modprobe no-such-module", 1,
     "modprobe: FATAL: Module no-such-module not found in directory {modules}\n"),
    ("modprobe -q no-such-module", 1, ""),
    ("modprobe", 1, "modprobe: ERROR: missing parameters. See -h.\n"),
    ("modprobe -r no-such-module", 1, "modprobe: FATAL: Module no-such-module not found.\n"),
    ("modprobe -r trace-printk", 1, "modprobe: FATAL: Module trace_printk is not in kernel.\n"),
    ("modprobe trace_printk && modprobe trace-printk && lsmod | wc -l", 0, ""),
    ("modprobe trace_printk && modprobe --first-time trace_printk", 1,
     "modprobe: ERROR: could not insert 'trace_printk': Module already in kernel\n"),
    ("modprobe -n trace_printk && lsmod | wc -l", 0, ""),
    ("modprobe trace-printk && modprobe -r trace-printk && lsmod | wc -l", 0, ""),
    ("rmmod trace-printk", 1, "rmmod: ERROR: Module trace_printk is not currently loaded\n"),
    ("rmmod", 1, "rmmod: ERROR: missing module name.\n"),
    ("modprobe trace_printk && rmmod trace_printk.ko && lsmod | wc -l", 0, ""),
    ("insmod", 1, "insmod: ERROR: missing filename.\n"),
    ("insmod /no/such.ko", 1,
     "insmod: ERROR: could not load module /no/such.ko: No such file or directory\n"),
    ("insmod /proc/version", 1,
     "insmod: ERROR: could not insert module /proc/version: Invalid module format\n"),
    ("insmod {modules}/trace_printk.ko && lsmod | wc -l", 0, ""),
    ("lsmod -a", 1, "Usage: lsmod\n"),
    ("modinfo trace_printk", 1, "modinfo: not available in kprobefs exec, whose "
     "modprobe, insmod, rmmod, lsmod act on the emulated kernel's modules\n"),
]


@pytest.mark.parametrize("script, status, stderr", KMOD_CASES)
def test_module_tools_say_what_kmod_says(mnt, no_module, script, status, stderr):
    from kprobefs.kmod import module_dir
    done = run_exec(mnt, "sh", "-c", script.replace("{modules}", str(module_dir())))
    assert (done.returncode, done.stderr) == (
        status, stderr.replace("{modules}", str(module_dir()))), done.stdout
    if script.endswith("lsmod | wc -l"):
        left = len((mnt / "proc" / "modules").read_text().splitlines())
        assert done.stdout == f"{1 + left}\n"
        assert left == (0 if "-r " in script or "rmmod" in script or " -n " in script
                        else 1), script


def test_every_way_to_the_hosts_kmod_reaches_the_emulated_kernels(mnt):
    """modprobe and friends by any name or path are kprobefs's, and so is the kmod
    program they link to: nothing in the namespace loads a host module."""
    tools = [t for t in ("/usr/sbin/modprobe", "/sbin/modprobe", "/usr/sbin/insmod",
                         "/usr/sbin/rmmod", "/usr/sbin/lsmod", "/bin/lsmod", "/usr/bin/kmod")
             if os.path.exists(t)]
    out = sh(mnt, "for t in modprobe insmod rmmod lsmod; do command -v $t; done | "
                  "xargs stat -L -c %d:%i " + " ".join(tools) + "; modprobe --version")
    *files, version = out.splitlines()
    assert len(files) == 4 + len(tools) and len(set(files)) == 1, out    # one program
    assert version.startswith("modprobe from kprobefs"), version
    if os.path.exists("/usr/bin/kmod"):
        assert sh(mnt, "/usr/bin/kmod list").startswith("Module                  Size")


# ---- the command's process ---------------------------------------------------------------
def test_the_exit_status_is_the_commands(mnt):
    assert run_exec(mnt, "sh", "-c", "exit 7").returncode == 7
    assert run_exec(mnt, "sh", "-c", "kill -TERM $$").returncode == -signal.SIGTERM
    missing = run_exec(mnt, "no-such-command")
    assert missing.returncode == 127
    assert missing.stderr == "kprobefs: no-such-command: No such file or directory\n"


def test_sigpipe_ends_the_command(mnt):
    # Python ignores SIGPIPE; the command must not inherit that.
    p = subprocess.Popen(EXEC + [str(mnt), "--", "yes"], stdout=subprocess.PIPE,
                         env=runner._cli_env(), cwd="/")
    p.stdout.read(10)
    p.stdout.close()
    assert p.wait(60) == -signal.SIGPIPE


def test_the_command_is_the_process_signals_reach(mnt):
    # SIGINT at its default in the child: a shell's background job inherits it ignored
    p = subprocess.Popen(EXEC + [str(mnt), "--", "sleep", "60"], env=runner._cli_env(),
                         cwd="/", preexec_fn=_default_sigint)
    try:
        comm = Path(f"/proc/{p.pid}/comm")
        deadline = time.monotonic() + 30
        while comm.read_text().strip() != "sleep":
            assert time.monotonic() < deadline, "the command never replaced kprobefs exec"
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == -signal.SIGINT
    finally:
        p.kill()
        p.wait()


def test_without_a_command_it_runs_the_shell(mnt):
    done = subprocess.run(EXEC + [str(mnt)], input="head -c 5 /proc/version; exit 3\n",
                          capture_output=True, text=True, timeout=60, cwd="/",
                          env=dict(runner._cli_env(), SHELL="/bin/sh"))
    assert (done.returncode, done.stdout) == (3, "Linux")


# ---- trace-cmd ---------------------------------------------------------------------------
def test_trace_cmd_lists_events_tracers_and_options(mnt, tracing):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32\n")
    events = run_exec(mnt, "trace-cmd", "list", "-e")
    assert events.returncode == 0
    listed = events.stdout.split()
    assert "kprobes:myprobe" in listed and "sched:sched_switch" in listed
    assert sorted(listed) == sorted((tracing / "available_events").read_text().split())
    tracers = run_exec(mnt, "trace-cmd", "list", "-t")
    assert (tracers.returncode, tracers.stdout.split()) == (
        0, (tracing / "available_tracers").read_text().split())
    options = run_exec(mnt, "trace-cmd", "list", "-o")
    expected = [name if (tracing / "options" / name).read_text().strip() == "1"
                else "no" + name for name in sorted(os.listdir(tracing / "options"))]
    assert (options.returncode, sorted(options.stdout.split())) == (0, sorted(expected))


def test_trace_cmd_stat_show_and_reset(mnt, tracing):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32\n"
                                           "r:myretprobe vfs_write $retval\n")
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("1\n")
    (mnt / "proc" / "version").read_text()      # a vfs_read
    stat = run_exec(mnt, "trace-cmd", "stat")
    assert stat.returncode == 0, stat.stderr
    assert "\nEvents:\n Individual events:\n    kprobes\n        myprobe\n\n" in stat.stdout
    # r10: register_kretprobe's default maxactive on 2 CPUs, as Linux shows it
    assert ("\nKprobe events:\n   p:kprobes/myprobe vfs_read count=%dx:u32\n"
            "   r10:kprobes/myretprobe vfs_write arg1=$retval\n\n") in stat.stdout

    show = run_exec(mnt, "trace-cmd", "show")
    assert show.returncode == 0, show.stderr
    assert show.stdout.startswith("# tracer: nop\n")
    assert re.search(r"\bmyprobe: \(vfs_read\+0x0/0x[0-9a-f]+\) count=\d+", show.stdout)

    reset = run_exec(mnt, "trace-cmd", "reset")
    assert reset.returncode == 0, reset.stderr
    assert (tracing / "kprobe_events").read_text() == ""
    assert not [line for line in (tracing / "trace").read_text().splitlines()
                if not line.startswith("#")]
    assert not [event for event in run_exec(mnt, "trace-cmd", "list", "-e").stdout.split()
                if event.startswith("kprobes:")]


def test_trace_cmd_show_and_record_in_an_instance(mnt, tracing, tmp_path):
    """trace-cmd's -B: the instance it makes, enables the event in, records from and
    removes again; the top-level buffer gets nothing."""
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32\n")
    (tracing / "instances" / "foo").mkdir()
    try:
        (tracing / "instances" / "foo" / "events" / "kprobes" / "myprobe" / "enable"
         ).write_text("1\n")
        (mnt / "proc" / "version").read_text()      # a vfs_read
        show = run_exec(mnt, "trace-cmd", "show", "-B", "foo")
        assert show.returncode == 0, show.stderr
        assert re.search(r"\bmyprobe: \(vfs_read\+0x0/0x[0-9a-f]+\) count=\d+", show.stdout)
        stat = run_exec(mnt, "trace-cmd", "stat")
        assert "\nInstances:\n foo\n" in stat.stdout, stat.stdout
    finally:
        (tracing / "instances" / "foo" / "events" / "enable").write_text("0\n")
        (tracing / "instances" / "foo").rmdir()

    dat = tmp_path / "trace.dat"
    # The command waits out the recorders' start (see test_trace_cmd_record_and_report).
    record = run_exec(mnt, "trace-cmd", "record", "-B", "bar", "-e", "kprobes:myprobe",
                      "-o", str(dat), "sh", "-c", "sleep 1; exec cat /sys/kernel/tracing/README")
    try:
        assert record.returncode == 0, record.stderr
        assert os.listdir(tracing / "instances") == []     # trace-cmd removed it
        report = run_exec(mnt, "trace-cmd", "report", "-i", str(dat))
        assert report.returncode == 0, report.stderr
        hits = [line for line in report.stdout.splitlines() if " myprobe: " in line]
        assert hits and all(line.lstrip().startswith("bar: ") and "count=" in line
                            for line in hits), report.stdout
        assert " myprobe: " not in (tracing / "trace").read_text()
    finally:
        if (tracing / "instances" / "bar").exists():
            (tracing / "instances" / "bar" / "events" / "enable").write_text("0\n")
            (tracing / "instances" / "bar").rmdir()


# A line of `trace` ("cat-42   [000] .....   1.000001: ev: (vfs_read+0x0/0x98) a=1") or
# of `trace-cmd report` ("cat-42 [000]   1.000001: ev:   (ffffffff81000000) a=1").
_EVENT_LINE = re.compile(r"^\s*(?P<comm>.+)-(?P<pid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?:[.\w]{5}\s+)?"
                         r"(?P<ts>\d+\.\d{6}): (?P<name>\w+):\s+\((?P<ip>[^)]*)\)(?P<args>.*)$")


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        m = _EVENT_LINE.match(line)
        if m:
            out.append(m.groupdict())
    return out


def _trace_cmd(mnt: Path, cwd: Path, *argv: str) -> str:
    done = run_exec(mnt, "sh", "-c", 'cd "$0" && exec trace-cmd "$@"', str(cwd), *argv)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_trace_cmd_extract_and_report_show_the_records_of_trace(mnt, tracing, tmp_path):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32 file=%di:x64\n")
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("1\n")
    assert run_exec(mnt, "cat", "/proc/version").returncode == 0
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("0\n")
    expected = _events((tracing / "trace").read_text())
    assert expected, "no event to compare"

    _trace_cmd(mnt, tmp_path, "extract", "-o", "x.dat")
    report = _events(_trace_cmd(mnt, tmp_path, "report", "-i", "x.dat"))
    vfs_read = _kallsyms(mnt)["vfs_read"]
    for ev in report:               # report prints the probe's ip as print fmt's %lx
        assert int(ev.pop("ip"), 16) == vfs_read
    for ev in expected:
        assert ev.pop("ip").startswith("vfs_read+0x0/")
    # trace-cmd's order is by timestamp across CPUs, trace's too.
    assert report == expected
    assert not _events((tracing / "trace").read_text())     # extract consumed them

    stat = _trace_cmd(mnt, tmp_path, "report", "-i", "x.dat", "--stat")
    assert "Kernel buffer statistics:" in stat
    for cpu in range(2):
        assert re.search(rf"\nCPU: {cpu}\nentries: 0\noverrun: 0\n", stat), stat


def test_trace_cmd_record_and_report(mnt, tracing, tmp_path):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32\n")
    # trace-cmd's recorders start after the command is forked, and one told to stop
    # before it has opened trace_pipe_raw never reads (trace-cmd's own code): on a loaded
    # machine that loses the command's first pages, so the command waits for them.
    workload = 'sleep 1; echo $$ > pid; exec cat /proc/version'
    out = _trace_cmd(mnt, tmp_path, "record", "-o", "r.dat", "-e", "kprobes:myprobe",
                     "sh", "-c", workload)
    assert out.startswith("Linux version")
    pid = (tmp_path / "pid").read_text().strip()
    report = _events(_trace_cmd(mnt, tmp_path, "report", "-i", "r.dat"))
    mine = [ev for ev in report if ev["pid"] == pid]
    assert mine and {ev["comm"] for ev in mine} == {"cat"}, report
    assert [float(ev["ts"]) for ev in report] == sorted(float(ev["ts"]) for ev in report)

    # The same command with `cat trace`: the same records, but for times and pids.
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("1\n")
    assert run_exec(mnt, "sh", "-c", 'cd "$0" && ' + workload, str(tmp_path)).returncode == 0
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("0\n")
    pid = (tmp_path / "pid").read_text().strip()
    traced = [ev for ev in _events((tracing / "trace").read_text()) if ev["pid"] == pid]
    assert [(ev["comm"], ev["name"], ev["args"]) for ev in mine] == [
        (ev["comm"], ev["name"], ev["args"]) for ev in traced]


def test_trace_cmd_stream_prints_the_events_as_they_come(mnt, tracing, tmp_path):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read count=%dx:u32\n")
    # The command runs once stream has started (it turns tracing_on off, enables the
    # event, starts its recorders, turns tracing_on on); its events must be printed
    # while stream runs, within 8 s, before stream is stopped as a user would (SIGINT).
    # The recorders wait in select(2) on trace_pipe_raw, which waits for buffer_percent
    # of the CPU's buffer (6.1's default 50), or for stream's flush every half second
    # (a page a CPU); at 0 they read each record as it comes, as on Linux.
    (tracing / "buffer_percent").write_text("0\n")
    script = r"""
        cd "$0" || exit
        trace-cmd stream -e kprobes:myprobe > out 2> err & stream=$!
        cd /sys/kernel/tracing
        until grep -q 1 events/kprobes/myprobe/enable && grep -q 1 tracing_on; do
            sleep 0.1
        done
        cd "$0"
        sh -c 'echo $$ > pid; exec cat /proc/version' > /dev/null
        i=0
        until grep -q -e "-$(cat pid) " out || [ $i -ge 80 ]; do sleep 0.1; i=$((i+1)); done
        grep -q -e "-$(cat pid) " out && echo streamed
        kill -INT $stream
        # trace-cmd 3.1's stream may wait in poll(2) without a timeout once its
        # recorders have gone (a race in its own shutdown, on Linux too); a user's
        # second Ctrl-C ends that wait, and it cleans up as after the first.
        i=0
        while [ $i -lt 100 ] && grep -qv ') Z' /proc/$stream/stat 2>/dev/null; do
            sleep 0.1; i=$((i+1))
        done
        [ $i -lt 100 ] || kill -INT $stream
        wait $stream
    """
    done = run_exec(mnt, "sh", "-c", script, str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "streamed\n", done.stderr + (tmp_path / "err").read_text()
    pid = (tmp_path / "pid").read_text().strip()
    mine = [ev for ev in _events((tmp_path / "out").read_text()) if ev["pid"] == pid]
    assert mine and {ev["name"] for ev in mine} == {"myprobe"}, mine
    assert all(re.fullmatch(r" count=\d+", ev["args"]) for ev in mine), mine
    assert (tracing / "events" / "kprobes" / "myprobe" / "enable").read_text() == "0\n"


def test_trace_cmd_turns_ftrace_enabled_on_and_restores_it(mnt, tracing, tmp_path):
    need_tool("trace-cmd")
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read\n")
    knob = mnt / "proc" / "sys" / "kernel" / "ftrace_enabled"
    knob.write_text("0\n")
    try:
        assert sh(mnt, "cat /proc/sys/kernel/ftrace_enabled") == "0\n"
        _trace_cmd(mnt, tmp_path, "record", "-o", "r.dat", "-e", "kprobes:myprobe",
                   "sh", "-c", "cat /proc/sys/kernel/ftrace_enabled > seen")
        assert (tmp_path / "seen").read_text() == "1\n"    # on while it recorded
        assert knob.read_text() == "0\n"                   # and restored afterwards
    finally:
        knob.write_text("1\n")


def test_set_event_pid_keeps_only_the_listed_tasks_events(mnt, tracing):
    (tracing / "kprobe_events").write_text("p:myprobe vfs_read\n")
    (tracing / "events" / "kprobes" / "myprobe" / "enable").write_text("1\n")
    try:
        # The shell lists itself; its child cat is not listed, the exec'd one is the shell.
        out = sh(mnt, "echo $$ > /sys/kernel/tracing/set_event_pid; echo $$; "
                      "cat /proc/version > /dev/null; exec cat /proc/version > /dev/null")
        pids = {ev["pid"] for ev in _events((tracing / "trace").read_text())}
        assert pids == {out.strip()}
        assert (tracing / "set_event_pid").read_text() == out
    finally:
        (tracing / "set_event_pid").write_text("")


# ---- the tool's own system calls ---------------------------------------------------------


def _records(trace: str) -> list[tuple[str, str]]:
    """(pid, event name) of each record of a trace file's text (a system call's line
    names its call, not its event: the reader knows which event that is)."""
    return [(str(r.pid), r.event) for r in parse_trace(trace)]


@pytest.fixture
def chdir_eprobe(tracing):
    """eprobes/cds: the filename of each sys_enter_chdir (as ``file="..."``)."""
    (tracing / "dynamic_events").write_text(
        "e:cds syscalls/sys_enter_chdir file=+0($filename):ustring\n")
    yield tracing / "events" / "eprobes" / "cds"
    (tracing / "dynamic_events").write_text("")


def test_the_shells_chdirs_are_its_tasks_syscall_events(mnt, chdir_eprobe):
    """A ``cd`` of the shell is its task's chdir in the emulated kernel, with the
    filename it passed (read through an eprobe), the same directory again included;
    a directory outside the mount is not mirrored."""
    out = sh(mnt, "cd /sys/kernel/tracing; "
                  "echo 1 > events/syscalls/sys_enter_chdir/enable; "
                  "echo 1 > events/eprobes/cds/enable; "
                  "cd /sys/kernel/tracing; cd events; cd /; cd /sys/kernel/tracing; "
                  "echo 0 > events/eprobes/cds/enable; "
                  "echo 0 > events/syscalls/sys_enter_chdir/enable; "
                  "echo $$; cat trace")
    pid, trace = out.split("\n", 1)
    # the eprobe (a trigger of the event) records before the event itself
    assert _records(trace) == [(pid, "cds"), (pid, "sys_enter_chdir")] * 3
    # (dash's cd passes the whole path: "events" from the tracing directory is
    # chdir("/sys/kernel/tracing/events"))
    assert re.findall(r'file="([^"]*)"', trace) == [
        "/sys/kernel/tracing", "/sys/kernel/tracing/events", "/sys/kernel/tracing"]


def test_fchdir_is_mirrored_as_its_directorys_chdir(mnt, chdir_eprobe):
    out = sh(mnt, "echo 1 > /sys/kernel/tracing/events/eprobes/cds/enable; "
                  f"{sys.executable} -c 'import os; print(os.getpid()); "
                  "os.fchdir(os.open(\"/sys/kernel/tracing/events\", os.O_RDONLY)); "
                  # the mirrored call comes before the process's next request
                  "os.listdir(\".\")'; "
                  "echo 0 > /sys/kernel/tracing/events/eprobes/cds/enable; "
                  "cat /sys/kernel/tracing/trace")
    pid, trace = out.split("\n", 1)
    assert _records(trace) == [(pid, "cds")]
    assert 'file="/sys/kernel/tracing/events"' in trace


# ---- perf --------------------------------------------------------------------------------
def _kallsyms(mnt: Path) -> dict[str, int]:
    out = {}
    for line in (mnt / "proc" / "kallsyms").read_text().splitlines():
        address, _kind, name = line.split()[:3]
        out.setdefault(name, int(address, 16))
    return out


def test_perf_probe_adds_lists_and_deletes(mnt, tracing):
    need_tool("perf")
    added = run_exec(mnt, "perf", "probe", "-a", "vfs_read")
    assert added.returncode == 0, added.stderr
    assert "probe:vfs_read" in added.stderr
    added = run_exec(mnt, "perf", "probe", "-a", "vfs_write%return $retval")
    assert added.returncode == 0, added.stderr
    added = run_exec(mnt, "perf", "probe", "-a", "do_sys_open %di %si:u64")
    assert added.returncode == 0, added.stderr

    # perf writes a symbol as an offset from _text, read from the emulated kallsyms.
    symbols = _kallsyms(mnt)
    defined = {}
    for line in (tracing / "kprobe_events").read_text().splitlines():
        m = re.fullmatch(r"([pr])\d*:probe/(\w+) _text\+(\d+)(.*)", line)
        assert m, line
        assert symbols["_text"] + int(m[3]) == symbols[m[2].removesuffix("__return")]
        defined[m[2]] = (m[1], m[4])
    assert defined == {"vfs_read": ("p", ""), "vfs_write__return": ("r", " arg1=$retval"),
                       "do_sys_open": ("p", " arg1=%di arg2=%si:u64")}

    listed = run_exec(mnt, "perf", "probe", "-l")
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == [
        "probe:do_sys_open", "probe:vfs_read", "probe:vfs_write__return"]
    assert "(on vfs_read)" in listed.stdout

    (tracing / "events" / "probe" / "vfs_read" / "enable").write_text("1\n")
    (mnt / "proc" / "version").read_text()
    assert re.search(r"\bvfs_read: \(vfs_read\+0x0/0x[0-9a-f]+\)",
                     (tracing / "trace").read_text())
    (tracing / "events" / "probe" / "vfs_read" / "enable").write_text("0\n")

    deleted = run_exec(mnt, "perf", "probe", "-d", "probe:vfs_read")
    assert deleted.returncode == 0, deleted.stderr
    assert "probe:vfs_read" not in (tracing / "kprobe_events").read_text()
    deleted = run_exec(mnt, "perf", "probe", "-d", "probe:*")
    assert deleted.returncode == 0, deleted.stderr
    assert (tracing / "kprobe_events").read_text() == ""


def test_perf_probe_on_a_function_the_kernel_lacks_fails(mnt, tracing):
    need_tool("perf")
    done = run_exec(mnt, "perf", "probe", "-a", "no_such_function_in_kprobefs")
    assert done.returncode != 0
    assert (tracing / "kprobe_events").read_text() == ""


# ---- perf ftrace: it polls trace_pipe -------------------------------------------------------
@pytest.fixture
def ftrace_reset(mnt):
    """The tracefs as ftracetest leaves it afterwards (perf ftrace leaves tracing off,
    funcslower its tracing_thresh on a failure)."""
    yield
    reset = TracefsReset(mnt)
    try:
        reset.reset(full=True)
    finally:
        reset.close()


def _traced_dd(mnt: Path, *perf_args: str) -> tuple[str, int, int]:
    """``perf ftrace ARGS -- dd`` reading tracing/README through the mount in blocks
    of 1000 bytes: (perf's output, dd's pid, how many read(2)s dd made: its whole
    and partial records and the read that found the end)."""
    need_tool("perf")
    done = run_exec(mnt, "perf", "ftrace", *perf_args, "--", "dd",
                    "if=/sys/kernel/tracing/README", "of=/dev/null", "bs=1000")
    assert done.returncode == 0, done.stderr
    full, partial = map(int, re.search(r"^(\d+)\+(\d+) records in$", done.stderr,
                                       re.M).groups())
    pids = set(re.findall(r"\bdd-(\d+)\b", done.stdout))
    return done.stdout, int(pids.pop()) if len(pids) == 1 else None, full + partial + 1


def test_perf_ftrace_shows_every_vfs_read_of_the_command(mnt, ftrace_reset):
    out, pid, reads = _traced_dd(mnt, "-T", "vfs_read")
    assert pid is not None, out
    calls = re.findall(rf"^ +dd-{pid} +\[\d+\] +[\d.]+: vfs_read <-ksys_read$", out, re.M)
    assert len(calls) == reads, out


@pytest.mark.parametrize("depth", [None, 2])
def test_perf_ftrace_graph_shows_every_vfs_read_of_the_command(mnt, ftrace_reset, depth):
    opts = ("--graph-opts", f"depth={depth}") if depth else ()
    out, _pid, reads = _traced_dd(mnt, "-G", "vfs_read", *opts)
    lines = [line for line in out.splitlines() if re.match(r" *\d+\) ", line)]
    assert sum(line.endswith("|  vfs_read() {") for line in lines) == reads, out
    # two spaces of indent a level: depth=2 stops at vfs_read's callees (hostfs_read)
    levels = {len(m[1]) // 2 for line in lines if (m := re.search(r"\|( +)\S", line))}
    assert "|    hostfs_read" in out
    assert max(levels) == 2 if depth else max(levels) > 2, out


# ---- perf-tools: kprobe, opensnoop, funcslower -----------------------------------------------
def _at_a_terminal(mnt: Path, argv: list[str], started: str, action, shown: str) -> str:
    """argv under ``kprobefs exec``, in a session of its own, writing to a terminal
    (gawk then writes each line as it comes, as for a user): once its output matches
    ``started``, ``action()`` runs; once it matches ``shown`` (regular expressions,
    line by line), the session gets a user's Ctrl-C (SIGINT), and the whole output is
    returned when the command has ended."""
    master, slave = pty.openpty()
    p = subprocess.Popen(EXEC + [str(mnt), "--", *argv], stdin=subprocess.DEVNULL,
                         stdout=slave, stderr=slave, env=runner._cli_env(), cwd="/",
                         start_new_session=True, preexec_fn=_default_sigint)
    os.close(slave)
    out = bytearray()

    def read_until(done, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([master], [], [], left)[0]:
                return False
            try:
                chunk = os.read(master, 65536)
            except OSError:         # EIO: the terminal's last writer has gone
                return done()
            if not chunk:
                return done()
            out.extend(chunk)
        return True

    def text() -> str:
        return out.decode("utf-8", "replace").replace("\r\n", "\n")

    try:
        assert read_until(lambda: re.search(started, text(), re.M), 60), text()
        action()
        found = read_until(lambda: re.search(shown, text(), re.M), 60)
        os.killpg(p.pid, signal.SIGINT)
        read_until(lambda: p.poll() is not None, 60)
        assert p.wait(60) == 0 and found, text()
        return text()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        os.close(master)


def test_perf_tools_opensnoop_shows_the_traced_command(mnt, tracing, ftrace_reset):
    """opensnoop reads each open as sys_exit_openat's line, ``sys_openat -> 0xFD`` at
    its fourth field (6.1 prints no event name), after a kretprobe on getname."""
    need_tool("opensnoop-perf")
    need_tool("gawk")
    cat = []

    def open_a_file():
        cat.append(subprocess.run(["sh", "-c", f"echo $$; exec cat {mnt}/tracing/README"],
                                  capture_output=True, text=True, timeout=60))

    # its own cat of trace_pipe shows once it has emptied the buffer and reads it
    out = _at_a_terminal(mnt, ["opensnoop-perf"],
                         r"^cat +\d+ +\S+ /sys/kernel/tracing/trace_pipe$", open_a_file,
                         r"^cat +\d+ +\S+ /sys/kernel/tracing/README$")
    pid = cat[0].stdout.split("\n", 1)[0]
    assert re.search(rf"^cat +{pid} +\S+ /sys/kernel/tracing/README$", out, re.M), out
    assert "Ending tracing..." in out
    assert (tracing / "kprobe_events").read_text() == ""


def test_perf_tools_funcslower_shows_the_traced_command(mnt, ftrace_reset):
    """funcslower: function_graph with tracing_thresh, read through trace_pipe; 6.1
    records only the returns that took longer, each ``} /* vfs_read */`` with its
    duration (and with -P the task)."""
    need_tool("funcslower-perf")
    need_tool("gawk")
    dd = []

    def read_a_file():
        dd.append(subprocess.run(["sh", "-c", f"echo $$; exec dd if={mnt}/tracing/README "
                                  "of=/dev/null bs=1000"], capture_output=True, text=True,
                                 timeout=60))

    # it prints its first line before it starts; its own reads of trace_pipe come next
    out = _at_a_terminal(mnt, ["funcslower-perf", "-P", "vfs_read", "1"],
                         r"^ *\d+\) +gawk-\d+ +\|", read_a_file, r"^ *\d+\) +dd-\d+ +\|")
    pid = dd[0].stdout.split("\n", 1)[0]
    mine = [line for line in out.splitlines() if f" dd-{pid} " in line]
    assert mine, out
    for line in mine:
        assert re.fullmatch(rf" *\d+\) +dd-{pid} +\| +[+!#*@$]? *[\d.]+ us +\| +"
                            r"\} /\* vfs_read \*/", line), line
    assert "vfs_read();" not in out and "vfs_read() {" not in out
    assert "Ending tracing..." in out


# ---- perf-tools' kprobe ------------------------------------------------------------------
def test_perf_tools_kprobe_traces_for_a_while(mnt, tracing):
    need_tool("kprobe-perf")
    # It works in /sys/kernel/debug/tracing; its `grep -v '^#' trace` opens the file
    # through do_sys_open while the probe is on.
    done = run_exec(mnt, "kprobe-perf", "-d", "1", "p:myopen do_sys_open")
    assert done.returncode == 0, done.stderr
    assert re.search(r"\bgrep-\d+ +\[\d+\] .* myopen: \(do_sys_open\+0x0/0x[0-9a-f]+\)",
                     done.stdout), done.stdout
    assert (tracing / "kprobe_events").read_text() == ""


# ---- ftracetest --------------------------------------------------------------------------
def test_ftracetest_runs_unmodified(mnt, tmp_path):
    try:
        selftests = runner.selftest_dir()
    except runner.RunnerError as e:
        if CI:
            pytest.fail(f"the selftests are not available: {e}")
        pytest.skip(f"the selftests are not available: {e}")
    cases = [str(selftests / "test.d" / "kprobe" / name)
             for name in ("add_and_remove.tc", "kprobe_args.tc", "kretprobe_args.tc")]
    done = subprocess.run(EXEC + [str(mnt), "--", str(selftests / "ftracetest"), "-l",
                                  str(tmp_path), *cases],
                          capture_output=True, text=True, timeout=300, cwd=selftests,
                          env=runner._cli_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# of passed:  3\n" in done.stdout


def _daemon_of(mountpoint: Path) -> int | None:
    """The pid of the daemon whose command line mounts mountpoint."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and str(mountpoint).encode() in argv:
            return int(entry.name)
    return None


def test_the_daemon_exits_at_umount_after_an_exec(tmp_path):
    """The daemon reads an exec namespace's mount table through /proc/PID/mountinfo;
    that open file held the namespace, and the namespace its copy of the mount, so
    after `kprobefs umount` the daemon kept serving a mount nobody could reach."""
    need_fuse()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = runner._cli_env()
    subprocess.run([sys.executable, "-m", "kprobefs", "mount", str(mnt), "--log-file",
                    str(tmp_path / "log")], check=True, env=env, timeout=120)
    daemon = _daemon_of(mnt)
    assert daemon is not None
    try:
        done = subprocess.run(EXEC + [str(mnt), "--", "cat", "/sys/kernel/tracing/tracing_on"],
                              capture_output=True, text=True, timeout=120, env=env, cwd="/")
        assert done.stdout == "1\n", done.stderr
        subprocess.run([sys.executable, "-m", "kprobefs", "umount", str(mnt)], check=True,
                       env=env, timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{daemon}").exists():
            time.sleep(0.2)
        assert not Path(f"/proc/{daemon}").exists(), "the daemon still serves after umount"
    finally:
        if Path(f"/proc/{daemon}").exists():
            os.kill(daemon, signal.SIGKILL)
