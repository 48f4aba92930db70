"""kprobefs without root, exec (issue 32): an ordinary user's ``kprobefs exec``, made in a
user namespace of its own (kprobefs/execns.py), gives the view root gets: a ``tracefs``
line at /sys/kernel/tracing, the emulated kernel's /proc files and module tools; and
Debian's tools run in it as that user: trace-cmd record and report, perf probe, and
Linux 6.1's ftracetest on its ``test.d/kprobe`` directory.  A host with no tracefs to
bind over gets the warning and perf's TRACEFS_PATH; each host setting that forbids user
namespaces gets its own message and exit status.

The tests run as root, as CI does, and act as a user they make (USER, ``useradd -m``,
removed again after) inside a :class:`Sandbox`: a private mount namespace that root
makes to look like a standard Debian 12 (/dev/fuse open to users, tracefs at
/sys/kernel/tracing, debugfs at /sys/kernel/debug) without changing the host's own
/dev/fuse or mounts, so nothing is left to put back and the other tests on the machine
see the host as it was.  The user's mount (its own ``kprobefs mount``, through
fusermount) lives in that namespace.  Skipped without root or FUSE, never under CI=true.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import conformance_runner as runner
import kprobefs
from kprobefs import execns

pytestmark = pytest.mark.fuse

CI = os.environ.get("CI") == "true"
USER = "kprobefs-exec"
PACKAGE_PARENT = str(Path(kprobefs.__file__).resolve().parents[1])
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: ftracetest's kprobe cases that do not PASS (tests/test_torture.py's NOT_PASSING):
#: no user-mode code runs in this kernel, so there is no uprobe_events.
NOT_PASSING = {"kprobe/uprobe_syntax_errors.tc": "UNSUPPORTED"}
#: x86_64's mount(2), failed by the filter that stands for AppArmor's refusal.
_NR_MOUNT = 165


def _skip_or_fail(reason: str):
    if CI:
        pytest.fail(f"cannot run under CI=true: {reason}")
    pytest.skip(reason)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "makes a user and a mount namespace: needs root"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    for tool in ("useradd", "unshare", "nsenter", "setpriv", "fusermount3"):
        if shutil.which(tool) is None and not (tool == "fusermount3"
                                               and shutil.which("fusermount")):
            return f"no {tool}"
    if not os.path.exists(execns.USERNS_FILE):
        return "the host kernel has no user namespaces"
    return None


@pytest.fixture(scope="module")
def user():
    reason = _why_not()
    if reason:
        _skip_or_fail(reason)
    made = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True,
                       capture_output=True)
        made = True
    entry = pwd.getpwnam(USER)
    yield entry
    if made:
        subprocess.run(["userdel", "-r", USER], capture_output=True)


# ---- the sandbox -----------------------------------------------------------------------------
#: Run by root in the new mount namespace: /dev/fuse open to users (a node of its own
#: over it), the copies of the host's FUSE mounts let go (a copy would keep their
#: daemons serving after their umount), tracefs and debugfs where systemd puts them.
_SETUP = r"""
set -e
mount -t tmpfs -o mode=755 kprobefs-dev "$1"
mknod -m 666 "$1/fuse" c "$2" "$3"
mount --bind "$1/fuse" /dev/fuse
awk '$3 == "fuse" || $3 ~ /^fuse\./ {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m"; done
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug
echo ready
exec sleep 86400
"""


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG


class Sandbox:
    """A mount namespace of root's that looks like a standard Debian 12 to the user,
    held by a child (killed with this process at the latest), under base: a
    directory of the user's with the mount point (``mnt``), the logs and the
    selftests."""

    def __init__(self, user, base: Path):
        self.user = user
        self.base = base
        self.mnt = base / "mnt"
        rdev = os.stat("/dev/fuse").st_rdev
        dev = base / ".dev"
        dev.mkdir()
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SETUP, "setup",
             str(dev), str(os.major(rdev)), str(os.minor(rdev))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, preexec_fn=_die_with_parent)
        line = self.holder.stdout.readline()
        if line != "ready\n":
            self.holder.kill()
            raise RuntimeError(f"the sandbox did not start: {self.holder.stderr.read()}")

    def env(self) -> dict[str, str]:
        return {"HOME": self.user.pw_dir, "USER": self.user.pw_name,
                "LOGNAME": self.user.pw_name, "LC_ALL": "C", "PATH": SYSTEM_PATH,
                "PYTHONPATH": PACKAGE_PARENT}

    def prefix(self, cwd: Path | None = None, root_first: str | None = None) -> list[str]:
        """What runs a command as the user in the sandbox, in cwd (default base):
        root_first is a shell script root runs before, in a mount namespace of its own
        made from the sandbox's (its "$@" is the rest)."""
        argv = ["nsenter", "-t", str(self.holder.pid), "-m", f"--wd={cwd or self.base}"]
        if root_first is not None:
            argv += ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                     root_first + '\nexec "$@"', "root-first"]
        argv += ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                 "--clear-groups", "env", "-i"]
        return argv + [f"{k}={v}" for k, v in self.env().items()]

    def run(self, *argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.prefix(**kw) + list(argv), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def kprobefs(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run(sys.executable, "-m", "kprobefs", *args, **kw)

    def exec(self, *argv: str, **kw) -> subprocess.CompletedProcess:
        """``kprobefs exec MNT -- argv`` as the user."""
        return self.kprobefs("exec", str(self.mnt), "--", *argv, **kw)

    def sh(self, script: str, **kw) -> str:
        done = self.exec("sh", "-c", script, **kw)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def close(self) -> None:
        self.holder.kill()
        self.holder.wait()


def _daemons(mnt: Path) -> list[int]:
    """The pids of the daemons serving mnt (by their command lines)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in words and os.fsencode(mnt) in words:
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def sandbox(user):
    base = Path(tempfile.mkdtemp(prefix="kprobefs-nonroot-exec-", dir="/var/tmp"))
    box = None
    try:
        (base / "mnt").mkdir()
        box = Sandbox(user, base)
        for path in (base, base / "mnt"):
            os.chown(path, user.pw_uid, user.pw_gid)
        done = box.kprobefs("mount", str(box.mnt))
        assert done.returncode == 0, (
            f"{USER} cannot mount (kprobefs from {PACKAGE_PARENT}, which the user must "
            f"be able to read): {done.stderr}")
        yield box
        done = box.kprobefs("umount", str(box.mnt))
        assert done.returncode == 0, done.stderr
    finally:
        for pid in _daemons(base / "mnt"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if box is not None:
            box.close()
        shutil.rmtree(base, ignore_errors=True)


def _tracing_reset(box: Sandbox) -> None:
    box.sh("echo 0 > /sys/kernel/tracing/events/enable; "
           "echo > /sys/kernel/tracing/kprobe_events; echo > /sys/kernel/tracing/trace")


# ---- the view -------------------------------------------------------------------------------
def test_the_users_view_is_roots(sandbox):
    done = sandbox.exec("sh", "-c", "id -u; grep -m1 ' tracefs ' /proc/mounts | "
                        "cut -d' ' -f2,3; grep -c 6.1.0-kprobefs /proc/version; "
                        "grep -c ' vfs_read$' /proc/kallsyms; ls /sys/kernel/debug/kprobes")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split("\n")[:4] == ["0", "/sys/kernel/tracing tracefs", "1", "1"]
    assert "list" in done.stdout.split()


def test_kprobe_events_modules_and_the_chdir_mirror(sandbox):
    out = sandbox.sh(
        "cd /sys/kernel/tracing && echo 'p:myprobe vfs_read' >> kprobe_events && "
        "cat kprobe_events && modprobe trace_printk && lsmod | cut -d' ' -f1 && "
        "rmmod trace_printk && echo > kprobe_events")
    assert out.split("\n")[:3] == ["p:kprobes/myprobe vfs_read", "Module", "trace_printk"]


def test_nothing_is_gained_on_the_host(sandbox):
    """Root in the namespace is the user everywhere else: the host's files and
    processes are as shut to it as to the user."""
    out = sandbox.sh("cat /proc/self/uid_map /proc/self/gid_map; "
                     "touch /etc/kprobefs-exec 2>&1; kill -0 1 2>&1; true")
    uid, gid = sandbox.user.pw_uid, sandbox.user.pw_gid
    assert out.split()[:6] == ["0", str(uid), "1", "0", str(gid), "1"]
    assert "Permission denied" in out and "Operation not permitted" in out, out
    assert not os.path.exists("/etc/kprobefs-exec")


# ---- the tools ------------------------------------------------------------------------------
def test_trace_cmd_record_and_report_as_the_user(sandbox):
    sandbox.sh("echo 'p:myprobe vfs_read count=%dx:u32' > /sys/kernel/tracing/kprobe_events")
    try:
        # The command waits out the recorders' start (test_exec's record test says why).
        out = sandbox.sh("trace-cmd record -o r.dat -e kprobes:myprobe sh -c "
                         "'sleep 1; echo $$ > pid; exec cat /proc/version' >/dev/null && "
                         "trace-cmd report -i r.dat")
    finally:
        _tracing_reset(sandbox)
    pid = (sandbox.base / "pid").read_text().strip()
    mine = [line for line in out.splitlines() if f"-{pid} " in line]
    assert mine and all(line.split()[0].startswith("cat-") and "myprobe:" in line
                        for line in mine), out


def test_perf_probe_as_the_user(sandbox):
    try:
        out = sandbox.sh("perf probe -q -a vfs_read && perf probe -l")
    finally:
        _tracing_reset(sandbox)
    assert out.split() == ["probe:vfs_read", "(on", "vfs_read)"]


@pytest.fixture(scope="module")
def selftests(sandbox):
    """6.1's selftests/ftrace, copied where the user may write (ftracetest writes in
    its directory)."""
    found, reason = runner.prepare()
    if reason:
        _skip_or_fail(reason)
    copy = sandbox.base / "ftrace"
    shutil.copytree(found, copy, symlinks=True)
    subprocess.run(["chown", "-R", f"{sandbox.user.pw_uid}:{sandbox.user.pw_gid}",
                    str(copy)], check=True)
    return copy


def test_ftracetest_kprobe_as_the_user(sandbox, selftests, request):
    """ftracetest's test.d/kprobe under an ordinary user's kprobefs exec: every case
    PASS but NOT_PASSING."""
    logs = sandbox.base / "logs"
    logs.mkdir()
    os.chown(logs, sandbox.user.pw_uid, sandbox.user.pw_gid)
    run = runner.run_ftracetest(
        sandbox.mnt, selftests, logs, ("test.d/kprobe",), prefix=sandbox.prefix(selftests),
        checks=False, report=runner.line_printer(request.config, "ftracetest[user]"))
    runner.line_printer(request.config, "ftracetest[user]")(
        f"{len(run.results)} cases in {run.elapsed:.1f} s, exit {run.returncode}")
    cases = runner.with_instance_pass(selftests, runner.list_cases(selftests, dirs=("kprobe",)))
    assert list(run.results) == cases, run.output[-3000:]
    wrong = {case: result for case, result in run.results.items()
             if result != NOT_PASSING.get(case.removesuffix(runner.INSTANCE_SUFFIX), "PASS")}
    assert not wrong, f"{wrong}" + "".join(f"\n--- {case}\n{run.log(case)[-2000:]}"
                                           for case in wrong)
    assert run.returncode == 0, run.output[-3000:]
    assert sandbox.sh("cat /sys/kernel/tracing/kprobe_events /sys/kernel/debug/kprobes/list"
                      ) == ""


# ---- a host without tracefs -----------------------------------------------------------------
_NO_TRACEFS = "umount /sys/kernel/tracing; umount /sys/kernel/debug"


def test_no_tracefs_on_the_host_is_a_warning_and_perf_still_finds_the_mount(sandbox):
    done = sandbox.exec("sh", "-c", 'echo "$TRACEFS_PATH"; perf probe -q -a vfs_read && '
                        "perf probe -l && perf probe -q -d 'probe:*'; "
                        "grep -c ' tracefs ' /proc/mounts; trace-cmd list -t",
                        root_first=_NO_TRACEFS)
    assert done.stdout.split("\n")[:3] == ["/sys/kernel/tracing",
                                           "  probe:vfs_read       (on vfs_read)", "0"]
    assert done.returncode != 0       # trace-cmd, with no tracefs or debugfs line
    assert done.stderr.startswith(
        "kprobefs: warning: no tracefs or debugfs line in /proc/mounts (tracefs: mount "
        "nodev on /sys/kernel/tracing: Operation not permitted; debugfs: mount nodev on "
        "/sys/kernel/debug: Operation not permitted): trace-cmd and other libtracefs "
        "tools will not find the mount (perf is given TRACEFS_PATH); the host has none "
        "mounted to bind over, and a user namespace cannot mount one: as root, "
        "`mount -t tracefs nodev /sys/kernel/tracing` once, as systemd does at boot\n"), \
        done.stderr


def test_debugfs_alone_serves_libtracefs(sandbox):
    done = sandbox.exec("trace-cmd", "list", "-t", root_first="umount /sys/kernel/tracing")
    assert done.returncode == 0 and "function_graph" in done.stdout, done.stderr
    assert done.stderr.startswith("kprobefs: warning: no tracefs line in /proc/mounts")


# ---- a host that forbids user namespaces ----------------------------------------------------
def _settings(**values: str) -> str:
    """Root's script that makes /proc/sys/kernel hold only the named settings (a tmpfs
    over it: a Debian or Ubuntu kernel's knob on this one)."""
    lines = ["mount -t tmpfs settings /proc/sys/kernel"]
    lines += [f"echo {value} > /proc/sys/kernel/{name}" for name, value in values.items()]
    return "\n".join(lines)


#: Root's script that makes unshare(CLONE_NEWUSER) fail as user.max_user_namespaces = 0
#: does: the limit is set in a user namespace of root's (identity-mapped by a child
#: left outside), which binds every namespace made under it, so the host's own limit
#: (which this machine's root may not even change) is left alone.
_NO_USER_NAMESPACES = f"""exec {sys.executable} -c '
import ctypes, os, sys
me = os.getpid()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.read(r, 1)
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{{me}}/{{name}}", "w") as f:
            f.write("0 0 65536")
    os._exit(0)
if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:     # CLONE_NEWUSER
    sys.exit("no user namespace")
os.write(w, b"x")
os.waitpid(child, 0)
with open("/proc/sys/user/max_user_namespaces", "w") as f:
    f.write("0")
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
"""


def _exec_true(sandbox, script: str) -> subprocess.CompletedProcess:
    done = sandbox.exec("true", root_first=script, timeout=60)
    assert done.stdout == ""
    return done


def _message(status: int) -> str:
    found = [p for p in execns.PREREQUISITES + (execns.NO_USERNS,) if p.status == status]
    return f"kprobefs: {found[0].message}\n"


def test_max_user_namespaces_zero(sandbox):
    done = _exec_true(sandbox, _NO_USER_NAMESPACES)
    assert (done.returncode, done.stderr) == (8, _message(8))


def test_unprivileged_userns_clone_zero(sandbox):
    done = _exec_true(sandbox, _settings(unprivileged_userns_clone=0) + "\n"
                      + _NO_USER_NAMESPACES)
    assert (done.returncode, done.stderr) == (7, _message(7))


_DENY_MOUNT = f"""exec {sys.executable} -c '
import ctypes, errno, os, struct, sys
from kprobefs import seccomp
code = seccomp.build_filter([{_NR_MOUNT}], seccomp.SECCOMP_RET_ERRNO | errno.EPERM)
buf = ctypes.create_string_buffer(code, len(code))
prog = ctypes.create_string_buffer(struct.pack("<H6xQ", len(code) // 8,
                                               ctypes.addressof(buf)))
if ctypes.CDLL(None, use_errno=True).prctl(22, 2, prog, 0, 0) != 0:   # PR_SET_SECCOMP
    sys.exit("no seccomp filter")
os.execvp(sys.argv[1], sys.argv[1:])' "$@"
"""


def test_apparmor_restrict_unprivileged_userns(sandbox):
    """Ubuntu's AppArmor lets the namespace be made but gives it no capability, so the
    first mount fails: a filter that fails mount(2) with EPERM stands for it."""
    done = _exec_true(sandbox, _settings(apparmor_restrict_unprivileged_userns=1) + "\n"
                      + f"export PYTHONPATH={PACKAGE_PARENT}\n" + _DENY_MOUNT)
    assert (done.returncode, done.stderr) == (9, _message(9))


def test_a_kernel_without_user_namespaces(monkeypatch, tmp_path):
    """unshare(CLONE_NEWUSER) is EINVAL on a kernel without CONFIG_USER_NS, which has
    no /proc/self/ns/user either."""
    monkeypatch.setattr(execns, "USERNS_FILE", str(tmp_path / "none"))
    error = execns._no_userns(errno.EINVAL, "unshare", "unshare(CLONE_NEWUSER)")
    assert (type(error), error.status, str(error)) == (
        execns.PrerequisiteError, 10, execns.NO_USERNS.message)


def test_each_prerequisite_has_its_own_status():
    """Of its own among exec's statuses, and kprobefs mount's (3 to 6,
    docs/without-root.md)."""
    statuses = [p.status for p in execns.PREREQUISITES + (execns.NO_USERNS,)]
    assert sorted(statuses) == [7, 8, 9, 10]


_IMPOSTOR = """
import socket, sys, time
from kprobefs.fs.syscallwatch import socket_address
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(socket_address(sys.argv[1]))
s.listen()
print("listening", flush=True)
time.sleep(60)
"""


def test_no_listener_is_handed_to_another_users_socket(tmp_path):
    """Anyone may bind the abstract name of a mount's daemon before it does: exec then
    hands its seccomp listener (which can answer its calls) to no one but root or
    itself."""
    if os.geteuid() != 0:
        _skip_or_fail("binds a socket as another user: needs root")
    where = str(tmp_path / "not-yet-mounted")
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    impostor = subprocess.Popen([sys.executable, "-c", _IMPOSTOR, where], user=65534,
                                group=65534, extra_groups=[], env=env, text=True,
                                stdout=subprocess.PIPE)
    try:
        assert impostor.stdout.readline() == "listening\n"
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from kprobefs.fs.syscallwatch import "
             "hand_over; print(hand_over(sys.argv[1]))", where],
            env=env, capture_output=True, text=True, timeout=60)
    finally:
        impostor.kill()
        impostor.wait()
    assert done.stdout == (f"the socket of {where}'s daemon is held by uid 65534, neither "
                           f"root nor this user: none of its system calls are handed to "
                           f"it\n"), done.stderr
