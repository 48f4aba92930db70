"""kprobefs without root, the mount (issue 32): an ordinary user mounts through the
set-uid fusermount3 (or fusermount), adds and enables a kprobe, sees their own ``cat``
in ``trace``, reads the status and unmounts; the files are theirs and shut to every
other user (``--allow-other`` opens them where /etc/fuse.conf allows it); each missing
prerequisite has its own one-line message and exit status; a mount that fails returns
at once and leaves no process and none of its caller's descriptors behind.

The tests run as root, as CI does, and act as two users they make (``useradd -m``,
removed again after) through a ``kprobefs`` command that runs this interpreter's
kprobefs (the installed wheel under tests/run.sh: /opt/kprobefs is readable by all).
/dev/fuse gets Debian's default mode 0666 for the module and /etc/fuse.conf a
``user_allow_other`` line for one test; both are put back as they were.  Skipped
without root or FUSE, never under CI=true.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import kprobefs
from kprobefs.daemon import FUSE_CONF, FUSE_DEVICE, unmount
from kprobefs.fs.fuse_ll import find_fusermount
from robust_mount import is_mounted, need, ready_then_stopping

pytestmark = pytest.mark.fuse

TOP = Path(__file__).resolve().parents[1]
PACKAGE_PARENT = str(Path(kprobefs.__file__).resolve().parents[1])
#: The user who mounts, and another one.
USERS = ("kprobefs-owner", "kprobefs-other")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
#: What a mount that fails before it forks may take (Python's start and imports).
PROMPT = 15.0


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "makes users and changes /dev/fuse's mode: needs root"
    if not os.path.exists(FUSE_DEVICE):
        return f"{FUSE_DEVICE} is missing"
    if find_fusermount() is None:
        return "no fusermount3 or fusermount (apt-get install fuse3)"
    if shutil.which("useradd") is None:
        return "no useradd"
    return None


@pytest.fixture(scope="module", autouse=True)
def _need_root_and_fuse():
    need(_why_not())


# ---- what the tests change, and put back ---------------------------------------------------
@contextlib.contextmanager
def _mode(path: str, mode: int):
    """path with mode meanwhile, its own mode back after."""
    old = stat.S_IMODE(os.stat(path).st_mode)
    os.chmod(path, mode)
    try:
        yield
    finally:
        os.chmod(path, old)


@contextlib.contextmanager
def _users_may_allow_other(allowed: bool):
    """FUSE_CONF with a user_allow_other line or without, its own text back after (or
    none, when there was none)."""
    conf = Path(FUSE_CONF)
    old = conf.read_text() if conf.exists() else None
    lines = [line for line in (old or "").splitlines() if line.strip() != "user_allow_other"]
    conf.write_text("\n".join(lines + ["user_allow_other"] * allowed) + "\n")
    try:
        yield
    finally:
        if old is None:
            conf.unlink()
        else:
            conf.write_text(old)


@pytest.fixture(scope="module")
def fuse_for_users():
    with _mode(FUSE_DEVICE, 0o666):
        yield


@pytest.fixture(scope="module")
def users():
    made = []
    try:
        for name in USERS:
            try:
                pwd.getpwnam(name)
            except KeyError:
                subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True,
                               capture_output=True)
                made.append(name)
        yield [pwd.getpwnam(name) for name in USERS]
    finally:
        for name in made:
            _end_processes(pwd.getpwnam(name).pw_uid)
            subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture(scope="module")
def base(users):
    """A directory every user may walk, holding the ``kprobefs`` command (bin/) and each
    user's mount point."""
    path = Path(tempfile.mkdtemp(prefix="kprobefs-nonroot-"))
    path.chmod(0o755)
    (path / "bin").mkdir(mode=0o755)
    command = path / "bin" / "kprobefs"
    command.write_text(f'#!/bin/sh\nexec {sys.executable} -m kprobefs "$@"\n')
    command.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def owner(users, base, fuse_for_users):
    user = users[0]
    done = as_user(user, base, "kprobefs --help >/dev/null")
    assert done.returncode == 0, (
        f"{user.pw_name} cannot run {sys.executable} -m kprobefs from {PACKAGE_PARENT} "
        f"(run the tests from an install others can read: tests/run.sh): {done.stderr}")
    return user


@pytest.fixture(scope="module")
def other(users):
    return users[1]


# ---- acting as a user ----------------------------------------------------------------------
def as_user(user, base: Path, script: str, path: str | None = None, timeout: float = 60,
            **env) -> subprocess.CompletedProcess:
    """script run by sh as user (no supplementary groups), with a clean environment:
    ``kprobefs`` and then path (default SYSTEM_PATH) on PATH, the user's HOME, and
    $BASE."""
    environ = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
               "LC_ALL": "C", "PYTHONPATH": PACKAGE_PARENT, "BASE": str(base),
               "PATH": f"{base}/bin:{SYSTEM_PATH if path is None else path}", **env}
    return subprocess.run(["/bin/sh", "-c", script], user=user.pw_uid, group=user.pw_gid,
                          extra_groups=[], env=environ, cwd=user.pw_dir, text=True,
                          capture_output=True, timeout=timeout)


def processes(uid: int) -> set[int]:
    """Pids of the live processes of uid."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[0]) == uid and "Z" not in fields["State"]:
            out.add(int(entry))
    return out


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""       # gone meanwhile


def _end_processes(uid: int) -> None:
    """Kills what a test left running as uid (its daemons), by pid."""
    for pid in processes(uid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def mount_point(user, base: Path, name: str) -> Path:
    path = base / f"{user.pw_name}-{name}"
    path.mkdir(mode=0o755, exist_ok=True)
    os.chown(path, user.pw_uid, user.pw_gid)
    return path


def _unmount_left(path: Path, uid: int) -> None:
    if is_mounted(path):
        _end_processes(uid)
        unmount(str(path), lazy=True)


@pytest.fixture(scope="module")
def user_mount(owner, base):
    """The owner's mount, made with ``out=$(kprobefs mount ...)`` and the caller's fd 3
    on that same pipe: the command returns only if the daemon keeps neither."""
    mnt = mount_point(owner, base, "kp")
    done = as_user(owner, base, 'out=$(kprobefs mount "$MNT" 3>&1); echo "exit $? [$out]"',
                   MNT=str(mnt))
    assert done.stdout == "exit 0 []\n", done.stderr
    assert is_mounted(mnt)
    yield mnt
    _unmount_left(mnt, owner.pw_uid)


# ---- the owner's mount ---------------------------------------------------------------------
def test_the_mount_and_its_files_belong_to_the_user_who_made_it(owner, base, user_mount):
    done = as_user(owner, base, 'stat -c "%u:%g %a %n" "$MNT" "$MNT/tracing" '
                   '"$MNT/tracing/kprobe_events" "$MNT/kprobes/enabled"', MNT=str(user_mount))
    ids = f"{owner.pw_uid}:{owner.pw_gid}"
    assert done.returncode == 0, done.stderr
    assert [line.split()[0] for line in done.stdout.splitlines()] == [ids] * 4
    (entry,) = [line.split() for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[1] == str(user_mount)]
    assert entry[2] == "fuse.kprobefs" and f"user_id={owner.pw_uid}" in entry[3]
    assert "allow_other" not in entry[3]


def test_the_user_adds_and_enables_a_kprobe_and_sees_their_own_cat(owner, base,
                                                                    user_mount):
    script = """
        cd "$MNT/tracing" || exit 1
        sh -c 'echo "p:userprobe vfs_read count=%dx:u32" > kprobe_events' || exit 2
        sh -c 'echo 1 > events/kprobes/userprobe/enable' || exit 3
        cat kprobe_events
        cat trace
        echo 0 > events/kprobes/userprobe/enable
        echo > kprobe_events
    """
    done = as_user(owner, base, script, MNT=str(user_mount))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "p:kprobes/userprobe vfs_read count=%dx:u32"
    hits = [line for line in lines if "userprobe: (vfs_read+0x0/" in line]
    assert hits and all(line.split()[0].startswith("cat-") for line in hits), done.stdout


def test_the_user_reads_the_status(owner, base, user_mount):
    done = as_user(owner, base, 'kprobefs status "$MNT"', MNT=str(user_mount))
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "state: ok"), done.stderr


def test_another_user_is_shut_out(other, base, user_mount):
    done = as_user(other, base, """
        ls -d "$BASE" >/dev/null || exit 9
        stat "$MNT"; echo "stat $?"
        ls "$MNT"; echo "ls $?"
        cat "$MNT/tracing/trace"; echo "cat $?"
        sh -c 'echo "p:theirs vfs_read" > "$MNT/tracing/kprobe_events"'; echo "echo $?"
    """, MNT=str(user_mount))
    assert done.stdout.split("\n") == ["stat 1", "ls 2", "cat 1", "echo 2", ""], done.stderr
    assert done.stderr.count("Permission denied") == 4, done.stderr


def test_the_user_unmounts_and_the_daemon_goes(owner, base, user_mount):
    before = processes(owner.pw_uid)
    assert before, "the daemon runs as its user"
    done = as_user(owner, base, 'kprobefs umount "$MNT"', MNT=str(user_mount))
    assert done.returncode == 0, done.stderr
    assert not is_mounted(user_mount)
    deadline = time.monotonic() + 20
    while processes(owner.pw_uid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not processes(owner.pw_uid)
    done = as_user(owner, base, 'kprobefs umount "$MNT"', MNT=str(user_mount))
    assert (done.returncode, done.stderr) == (1, f"kprobefs: {user_mount}: not mounted\n")


# ---- --allow-other -------------------------------------------------------------------------
def test_allow_other_opens_the_mount_to_others_where_fuse_conf_allows_it(owner, other,
                                                                         base):
    mnt = mount_point(owner, base, "shared")
    try:
        with _users_may_allow_other(True):
            done = as_user(owner, base, 'kprobefs mount --allow-other "$MNT"',
                           MNT=str(mnt))
        assert done.returncode == 0, done.stderr
        # the other user reaches the mount (without allow_other not even its stat
        # answers), and its modes apply: the root is debugfs's 0700, the owner's
        done = as_user(other, base, 'stat -c "%a %u" "$MNT"; ls "$MNT"; echo "ls $?"',
                       MNT=str(mnt))
        assert done.stdout == f"700 {owner.pw_uid}\nls 2\n", done.stderr
        assert "Permission denied" in done.stderr
        assert as_user(owner, base, 'kprobefs umount "$MNT"', MNT=str(mnt)).returncode == 0
    finally:
        _unmount_left(mnt, owner.pw_uid)


# ---- a prerequisite missing: its own message and exit status, at once, nothing left ---------
def _refused(user, base: Path, script: str, path: str | None = None):
    """(exit status, stderr) of a command that must fail before anything is started:
    within PROMPT seconds, no process of user left, nothing mounted."""
    before = processes(user.pw_uid)
    mnt = mount_point(user, base, "refused")
    start = time.monotonic()
    done = as_user(user, base, script, path=path, MNT=str(mnt))
    assert time.monotonic() - start < PROMPT
    assert processes(user.pw_uid) <= before
    assert not is_mounted(mnt)
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    return done.returncode, done.stderr


def test_no_fuse_device(monkeypatch, tmp_path, capsys):
    from kprobefs import cli, daemon
    monkeypatch.setattr(daemon, "FUSE_DEVICE", str(tmp_path / "fuse"))
    assert cli.main(["mount", str(tmp_path / "mnt")]) == 3
    assert capsys.readouterr().err == (
        f"kprobefs: {tmp_path}/fuse is missing: as root, modprobe fuse (a container needs "
        f"the device: --device {tmp_path}/fuse)\n")
    assert not (tmp_path / "mnt").exists()


def test_no_fuse_device_for_the_user(owner, base):
    with _mode(FUSE_DEVICE, 0o600):
        status, err = _refused(owner, base, 'kprobefs mount "$MNT"')
    assert status == 3
    assert err == (f"kprobefs: {FUSE_DEVICE} cannot be opened by {owner.pw_name} "
                   "(Permission denied; mode 0600, owner root): as root, chmod 0666 "
                   f"{FUSE_DEVICE} (Debian's default mode)\n")


@pytest.mark.parametrize("command", ["mount", "umount"])
def test_no_fusermount_on_path(owner, base, command):
    status, err = _refused(owner, base, f'kprobefs {command} "$MNT"', path="/nonexistent")
    assert status == 4
    assert err == ("kprobefs: no fusermount3 or fusermount on PATH, which mounts FUSE for "
                   "a user: as root, apt-get install fuse3\n")


def test_a_fusermount_that_is_not_set_uid(owner, base):
    helper = find_fusermount()
    copies = base / "not-set-uid"
    copies.mkdir(mode=0o755, exist_ok=True)
    copy = copies / os.path.basename(helper)
    shutil.copy(helper, copy)
    copy.chmod(0o755)
    status, err = _refused(owner, base, 'kprobefs mount "$MNT"',
                           path=f"{copies}:{SYSTEM_PATH}")
    assert status == 5
    assert err == (f"kprobefs: {copy} is not set-uid root, so it cannot mount for a user: "
                   f"as root, chown root:root {copy} && chmod 4755 {copy}\n")


def test_allow_other_without_user_allow_other(owner, base):
    with _users_may_allow_other(False):
        status, err = _refused(owner, base, 'kprobefs mount --allow-other "$MNT"')
    assert status == 6
    assert err == (f"kprobefs: --allow-other is not allowed to users: {FUSE_CONF} has no "
                   f"user_allow_other line; as root: echo user_allow_other >> {FUSE_CONF}\n")


# ---- a mount that fails once its daemon runs -----------------------------------------------
def test_a_mount_the_daemon_cannot_make_returns_and_leaves_nothing(owner, base):
    """fusermount refuses a mount point the user does not own, after the daemon has
    forked and booted: the command still returns within seconds, with fusermount's
    reason; the daemon is gone, and so is its hold on the caller's pipe (fd 3 too)."""
    before = processes(owner.pw_uid)
    mnt = base / "roots"
    mnt.mkdir(mode=0o755, exist_ok=True)
    start = time.monotonic()
    done = as_user(owner, base, 'out=$(kprobefs mount "$MNT" 3>&1 2>&1); '
                   'echo "exit $?"; echo "$out"', MNT=str(mnt))
    assert time.monotonic() - start < 30
    status, message = done.stdout.splitlines()
    assert status == "exit 1"
    assert message.startswith(f"kprobefs: {mnt}: mount failed (") and \
        "fusermount" in message, message
    assert processes(owner.pw_uid) <= before
    assert not is_mounted(mnt)


#: The fake kernel's CLI (tests/fs_fakes.py) with its mount refusing the daemon's own
#: readiness listing, as the mount of a user did when its files were root's.
REFUSING_CLI = """
import errno, os, sys
sys.path.insert(0, {tests!r})
import fs_fakes
from kprobefs.cli import main
listdir = os.listdir
def refusing(path="."):
    if path == os.environ["MNT"]:
        raise PermissionError(errno.EACCES, "Permission denied", path)
    return listdir(path)
os.listdir = refusing
sys.exit(main(sys.argv[1:], kernel_factory=fs_fakes.FakeKernel.factory,
              tracer_factory=fs_fakes.FakeTracer.factory))
"""


@pytest.mark.parametrize("loop", ["dev", "libfuse"])
def test_a_mount_that_refuses_its_own_user_stops_at_once(tmp_path, loop):
    """The daemon's readiness check is refused (EACCES): waiting would not mend it, so
    the daemon says why, unmounts and exits, and the command returns with its reason,
    leaving no process, no mount and no hold on its caller's pipes (fd 3 too); with
    either FUSE loop (KPROBEFS_FUSE)."""
    mnt = tmp_path / "mnt"
    script = tmp_path / "refusing.py"
    script.write_text(REFUSING_CLI.format(tests=str(TOP / "tests")))
    start = time.monotonic()
    done = subprocess.run(
        ["sh", "-c", f'out=$({sys.executable} {script} mount "$MNT" 3>&1 2>&1); '
                     'echo "exit $?"; echo "$out"'],
        env=dict(os.environ, PYTHONPATH=PACKAGE_PARENT, MNT=str(mnt), KPROBEFS_FUSE=loop),
        capture_output=True, text=True, timeout=60)
    try:
        assert time.monotonic() - start < PROMPT
        assert done.stdout == (f"exit 1\nkprobefs: {mnt}: the mount refuses the user who "
                               "made it (Permission denied)\n"), done.stderr
        assert not is_mounted(mnt)
        assert not [pid for pid in processes(0) if str(script) in _command_line(pid)]
    finally:
        if is_mounted(mnt):
            unmount(str(mnt), lazy=True)


def test_a_roots_mount_keeps_none_of_its_callers_descriptors(base, tmp_path):
    mnt = tmp_path / "mnt"
    done = subprocess.run(
        ["sh", "-c", 'out=$(kprobefs mount "$MNT" 3>&1 2>&1); echo "exit $? [$out]"; '
                     'kprobefs umount "$MNT"'],
        env=dict(os.environ, PATH=f"{base}/bin:{os.environ['PATH']}",
                 PYTHONPATH=PACKAGE_PARENT, MNT=str(mnt)),
        capture_output=True, text=True, timeout=60)
    try:
        assert (done.returncode, done.stdout) == (0, "exit 0 []\n"), done.stderr
    finally:
        if is_mounted(mnt):
            unmount(str(mnt), lazy=True)


# ---- the user's service: Type=notify, as the system one --------------------------------------
def test_the_users_foreground_daemon_notifies_ready_and_stopping(owner, base):
    """What systemd --user runs (systemd/kprobefs-user.service): ``mount --foreground``
    as the user, READY=1 once the files answer, STOPPING=1 and a clean exit on
    SIGTERM."""
    mnt = mount_point(owner, base, "unit")
    address = base / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(address))
        address.chmod(0o777)
        sock.settimeout(60)
        environ = {"HOME": owner.pw_dir, "PATH": SYSTEM_PATH, "LC_ALL": "C",
                   "PYTHONPATH": PACKAGE_PARENT, "NOTIFY_SOCKET": str(address)}
        proc = subprocess.Popen([sys.executable, "-m", "kprobefs", "mount", "--foreground",
                                 str(mnt)], user=owner.pw_uid, group=owner.pw_gid,
                                extra_groups=[], env=environ, cwd=owner.pw_dir,
                                stderr=subprocess.DEVNULL)
        try:
            ready_then_stopping(proc, sock, mnt, lambda: as_user(
                owner, base, 'cat "$MNT/kprobes/enabled"', MNT=str(mnt)).stdout == "1\n")
        finally:
            _unmount_left(mnt, owner.pw_uid)


def test_install_sh_puts_the_users_unit_where_systemctl_user_finds_it(owner, base):
    """./install.sh as a user installs systemd/kprobefs-user.service as
    ~/.config/systemd/user/kprobefs.service, its ExecStart where the command went;
    --uninstall removes it.  pip's part is a stand-in: the environment's python."""
    src = base / "src"
    for part in ("install.sh", "docs/kprobefs.8", "systemd/kprobefs-user.service"):
        (src / part).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(TOP / part, src / part)
    home = Path(owner.pw_dir)
    venv, bindir = home / "venv", home / "ibin"
    unit = home / "cfg" / "systemd" / "user" / "kprobefs.service"
    env = dict(KPROBEFS_VENV=str(venv), KPROBEFS_BINDIR=str(bindir),
               KPROBEFS_MANDIR=str(home / "man8"), XDG_CONFIG_HOME=str(home / "cfg"))
    done = as_user(owner, base, """
        mkdir -p "$KPROBEFS_VENV/bin" && printf '#!/bin/sh\\nexit 0\\n' > "$KPROBEFS_VENV/bin/python"
        chmod 755 "$KPROBEFS_VENV/bin/python" && "$SRC/install.sh"
    """, SRC=str(src), **env)
    assert done.returncode == 0, done.stdout + done.stderr
    text = unit.read_text()
    assert f"\nExecStart={bindir}/kprobefs mount --foreground %t/kprobefs\n" in text
    assert text.replace(f"={bindir}/", "=%h/.local/bin/") == \
        (TOP / "systemd" / "kprobefs-user.service").read_text()
    done = as_user(owner, base, '"$SRC/install.sh" --uninstall', SRC=str(src), **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not unit.exists() and not venv.exists()
