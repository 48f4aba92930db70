"""The seed documents' own sequences, through a real mount and a shell: kprobetrace.txt's
`myprobe`/`myretprobe` session, and kprobes.txt's Appendix A (kprobes/list,
kprobes/enabled) and Appendix B (the optimization sysctl)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.fuse


def _fuse_missing() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if os.geteuid() != 0:
        return "mounting needs root"
    return None


@pytest.fixture(scope="module")
def mnt(tmp_path_factory):
    reason = _fuse_missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"FUSE tests cannot run under CI=true: {reason}")
        pytest.skip(reason)
    path = tmp_path_factory.mktemp("seeds") / "mnt"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("NOTIFY_SOCKET", None)
    subprocess.run([sys.executable, "-m", "kprobefs", "mount", str(path), "--cpus", "2"],
                   check=True, env=env, timeout=60)
    yield path
    subprocess.run([sys.executable, "-m", "kprobefs", "umount", str(path)], env=env,
                   timeout=60)


def bash(cmd: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_kprobetrace_session(mnt):
    t = mnt / "tracing"
    r = bash("echo p:myprobe do_sys_open a0 a1 a2 a3 > kprobe_events && "
             "echo r:myretprobe do_sys_open rv ra >> kprobe_events && cat kprobe_events", t)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ("p:kprobes/myprobe do_sys_open arg1=a0 arg2=a1 arg3=a2 arg4=a3\n"
                        # registered: the default maxactive shows, as in 6.1
                        "r10:kprobes/myretprobe do_sys_open arg1=rv arg2=ra\n")
    fmt = bash("cat events/kprobes/myprobe/format", t).stdout
    assert fmt.startswith("name: myprobe\nID: ")
    assert "\tfield:unsigned long __probe_ip;\toffset:8;\tsize:8;\tsigned:0;\n" in fmt
    assert "\tfield:u64 arg4;\toffset:40;\tsize:8;\tsigned:0;\n" in fmt
    assert fmt.endswith('print fmt: "(%lx) arg1=0x%Lx arg2=0x%Lx arg3=0x%Lx arg4=0x%Lx", '
                        "REC->__probe_ip, REC->arg1, REC->arg2, REC->arg3, REC->arg4\n")
    assert bash("echo 1 > events/kprobes/enable && cat ../proc/version > /dev/null", t)\
        .returncode == 0
    # Enabled events cannot be cleared: the shell prints Linux's message.
    busy = bash("echo > kprobe_events", t)
    assert busy.returncode != 0 and "Device or resource busy" in busy.stderr
    trace = bash("echo 0 > events/kprobes/enable && cat trace", t).stdout
    opens = [line for line in trace.splitlines() if " myprobe: (do_sys_open+0x0/" in line]
    rets = [line for line in trace.splitlines() if " myretprobe: (" in line]
    assert opens and rets
    assert re.search(r"^\s+cat-\d+\s+\[\d{3}\] .{5} +\d+\.\d{6}: myprobe: "
                     r"\(do_sys_open\+0x0/0x[0-9a-f]+\) arg1=0xffffff9c arg2=0x[0-9a-f]+ "
                     r"arg3=0x[0-9a-f]+ arg4=0x[0-9a-f]+$", opens[0], re.M), opens[0]
    # `ra` is the return address the line starts with (the syscall wrapper tail-calls
    # do_sys_open, so it is the wrapper's caller).
    m = re.search(r"myretprobe: \((\w+)\+0x([0-9a-f]+)/0x[0-9a-f]+ <- do_sys_open\) "
                  r"arg1=0x[0-9a-f]+ arg2=0x([0-9a-f]+)$", rets[0])
    assert m, rets[0]
    kallsyms = (mnt / "proc/kallsyms").read_text()
    base = int(re.search(rf"^([0-9a-f]+) [tT] {m.group(1)}$", kallsyms, re.M).group(1), 16)
    assert base + int(m.group(2), 16) == int(m.group(3), 16)
    r = bash("echo > kprobe_events && cat kprobe_events && ls events", t)
    assert r.returncode == 0 and "kprobes" not in r.stdout


def test_appendix_a_list_and_enabled(mnt):
    t = mnt / "tracing"
    assert bash("echo 'p:ka vfs_read' > kprobe_events && echo 'p:kb vfs_read+5' >> "
                "kprobe_events && echo 1 > events/kprobes/ka/enable", t).returncode == 0
    listing = bash("cat ../kprobes/list", t).stdout.splitlines()
    assert any(re.fullmatch(r"[0-9a-f]{16}  k  vfs_read\+0x0    \[FTRACE\]", line)
               for line in listing), listing
    assert any(re.fullmatch(r"[0-9a-f]{16}  k  vfs_read\+0x5    \[DISABLED\]", line)
               for line in listing), listing
    r = bash("cat ../kprobes/enabled && echo 0 > ../kprobes/enabled && "
             "cat ../kprobes/enabled && echo 1 > ../kprobes/enabled && "
             "cat ../kprobes/enabled", t)
    assert r.stdout == "1\n0\n1\n", r.stderr
    bad = bash("echo 2 > ../kprobes/enabled", t)
    assert bad.returncode != 0 and "Invalid argument" in bad.stderr
    assert bash("echo 0 > events/kprobes/ka/enable && echo > kprobe_events", t)\
        .returncode == 0


def test_appendix_b_optimization_sysctl(mnt):
    t = mnt / "tracing"
    knob = "../proc/sys/debug/kprobes-optimization"
    assert bash("echo 'p:opt vfs_read+5' > kprobe_events && "
                "echo 1 > events/kprobes/opt/enable", t).returncode == 0
    assert "vfs_read+0x5    [OPTIMIZED]" in bash("cat ../kprobes/list", t).stdout
    r = bash(f"echo 0 > {knob} && cat {knob} && cat ../kprobes/list", t)
    assert r.stdout.startswith("0\n") and "[OPTIMIZED]" not in r.stdout
    r = bash(f"echo 1 > {knob} && cat {knob} && cat ../kprobes/list", t)
    assert r.stdout.startswith("1\n") and "vfs_read+0x5    [OPTIMIZED]" in r.stdout
    bad = bash(f"echo 5 > {knob}", t)
    assert bad.returncode != 0 and "Invalid argument" in bad.stderr
    assert bash("echo 0 > events/kprobes/opt/enable && echo > kprobe_events", t)\
        .returncode == 0
