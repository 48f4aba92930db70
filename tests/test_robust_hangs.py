"""The daemon never hangs: every request answers within request_timeout whatever the
kernel does, and what went wrong can be seen.

- kernel calls a control write needs (tracefs directories, module init and exit) run in
  the writer's own system call, never nested inside a hypercall;
- a livelock that keeps making hypercalls, a spin without them, a host hook on every
  iteration of a loop: the request fails with EIO within its timeout, its task is killed
  as an oops would, other files are served all along;
- a host handler that never returns: the machine is declared stuck and every request
  fails at once; ``kprobefs status`` says so;
- the kernel log as /dev/kmsg records, the oops report in the daemon's log, the default
  log destination of a backgrounded daemon.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kprobefs
from kprobefs import Kprobe
from kprobefs import cli

from conftest import blocking_kprobe
from robust_mount import InProcessMount, need_fuse, read, write

pytestmark = pytest.mark.fuse

TIMEOUT = 4.0          # request_timeout of these mounts
MARGIN = 3.0


@pytest.fixture
def mnt(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt", request_timeout=TIMEOUT).start()
    yield m
    m.stop()


def _errno_of(fn, *args) -> int:
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def _sh(script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout)


def _patch(kernel, name: str, code: bytes, offset: int = 0):
    """Overwrite the start of a function; returns a callable that puts it back."""
    (fn,) = kernel.image.lookup_name(name)
    original = kernel.read(fn.addr + offset, len(code))
    kernel.text_poke(fn.addr + offset, code)
    return fn.addr + offset, lambda: kernel.text_poke(fn.addr + offset, original)


class _Served:
    """Reads a file over and over from another thread, timing each read: the files
    other requests touch keep being answered while one request cannot finish."""

    def __init__(self, path: str):
        self.path = path
        self.times: list[float] = []
        self.errors: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                read(self.path)
            except OSError as e:
                self.errors.append(e.errno)
            self.times.append(time.monotonic() - started)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)


def _unstick(kernel, kp) -> None:
    """Once the blocking handler of kp is released: waits (a while) for the machine to
    run again and takes the probe out."""
    deadline = time.monotonic() + 10
    while kernel.stuck and time.monotonic() < deadline:
        time.sleep(0.05)
    with kernel.lock:
        kernel.unregister_kprobe(kp)


# ---- process context ------------------------------------------------------------------
def test_event_directories_are_made_in_the_writers_own_system_call(mnt):
    """tracefs_create_dir and tracefs_remove run as kernel code of the task that wrote
    kprobe_events, after the write's hypercall returned (Linux: in the write system
    call, under event_mutex), never nested inside the hypercall."""
    kernel = mnt.kernel
    seen = []

    def pre(p, regs):
        seen.append((p.symbol_name, kernel.current_pid(), kernel.serving_hypercall))

    probes = [Kprobe(symbol_name=name, pre_handler=pre)
              for name in ("tracefs_create_dir", "tracefs_remove")]
    with kernel.lock:
        for kp in probes:
            kernel.register_kprobe(kp)
    try:
        t = mnt.p("tracing")
        r = _sh(f"echo $$; echo 'p:hangs/ctx vfs_read' >> {t}/kprobe_events && "
                f"echo '-:hangs/ctx' >> {t}/kprobe_events")
        assert r.returncode == 0, r.stderr
        pid = int(r.stdout.split()[0])
    finally:
        with kernel.lock:
            for kp in probes:
                kernel.unregister_kprobe(kp)
    names = [name for name, _pid, _nested in seen]
    assert names.count("tracefs_create_dir") == 2     # the group hangs/, then ctx/
    assert names.count("tracefs_remove") >= 1
    assert {(p, nested) for _name, p, nested in seen} == {(pid, False)}


def test_module_init_and_exit_run_in_the_writers_own_system_call(mnt):
    kernel = mnt.kernel
    seen = []

    def pre(p, regs):
        seen.append((kernel.current_pid(), kernel.serving_hypercall))

    kp = Kprobe(symbol_name="printk", pre_handler=pre)
    with kernel.lock:
        kernel.register_kprobe(kp)
    try:
        ctl = mnt.p("kprobefs/modules")
        r = _sh(f"echo $$; echo 'load trace-printk' > {ctl} && "
                f"grep -q trace_printk {mnt.p('proc/modules')} && "
                f"echo 'unload trace-printk' > {ctl}")
        assert r.returncode == 0, r.stderr
        pid = int(r.stdout.split()[0])
    finally:
        with kernel.lock:
            kernel.unregister_kprobe(kp)
    mine = [nested for p, nested in seen if p == pid]
    assert len(mine) >= 3 and not any(mine)    # loaded, the deferred work, unloaded
    assert "trace_printk: unloaded after 1 runs" in kernel.dmesg()
    assert "trace_printk" not in read(mnt.p("proc/modules"))


@pytest.fixture
def roomy_mnt(tmp_path):
    """A mount with the default request_timeout: a big write may take seconds on a
    loaded machine."""
    need_fuse()
    m = InProcessMount(tmp_path / "mnt").start()
    yield m
    m.stop()


def test_thousands_of_probes_in_one_write_then_all_enabled(roomy_mnt):
    """The second way into the old hang: one write(2) of 2,000 probe lines (25 on each
    of 80 functions), then events/kprobes/enable.  Every event directory is made in
    the writer's system call; nothing nests, nothing waits without a bound."""
    mnt = roomy_mnt
    t = mnt.p("tracing")
    usable = []
    for name in read(f"{t}/available_filter_functions").split():
        if len(usable) == 80:
            break
        if write(f"{t}/kprobe_events", f"p:kprobes/probe {name}") == 0:
            usable.append(name)
        write(f"{t}/kprobe_events", "-:kprobes/probe")
    lines = "".join(f"p:kprobes/q{i}_{j} {name}+0\n"
                    for i, name in enumerate(usable) for j in range(25))
    started = time.monotonic()
    fd = os.open(f"{t}/kprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        data, done = lines.encode(), 0
        while done < len(data):             # FUSE hands a write over in 128 KiB pieces
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
    r = _sh(f"echo 1 > {t}/events/kprobes/enable && cat {mnt.p('kprobes/list')} | wc -l")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == 2000
    took = time.monotonic() - started
    assert _sh(f"echo 0 > {t}/events/kprobes/enable && echo > {t}/kprobe_events"
               ).returncode == 0
    assert read(mnt.p("kprobes/list")) == ""
    assert read(mnt.p("kprobefs/status")).startswith("state: ok")
    print(f"2,000 probes written and enabled in {took:.1f} s")


# ---- livelocks and spins -----------------------------------------------------------------
def test_a_livelock_that_keeps_yielding_fails_the_request_and_kills_its_task(mnt):
    """do_mkdirat spins on HC_YIELD for ever (a spin lock whose holder never lets go):
    the mkdir fails with EIO within request_timeout, other requests are answered all
    along, the task is killed with the kernel's soft-lockup report, the CPU stays."""
    kernel = mnt.kernel
    # mov $24, %eax; int $0x81; jmp back to the mov
    _, restore = _patch(kernel, "do_mkdirat", bytes.fromhex("b818000000cd81ebf7"))
    try:
        with _Served(mnt.p("tracing/README")) as served:
            started = time.monotonic()
            r = _sh(f"mkdir {mnt.p('tmp/livelock')}")
            took = time.monotonic() - started
    finally:
        restore()
    assert r.returncode != 0 and "Input/output error" in r.stderr
    assert TIMEOUT - 0.5 < took < TIMEOUT + MARGIN
    # answered all along: a read held up behind the livelock would be the only one
    assert len(served.times) >= 5 and not served.errors, served.times
    assert "watchdog: BUG: soft lockup - CPU#" in kernel.dmesg()
    assert all(c.state != "wedged" for c in kernel.cpus)
    assert _sh(f"mkdir {mnt.p('tmp/after')}").returncode == 0


def test_a_host_hook_on_every_iteration_of_a_loop_is_stopped(mnt):
    """A tight loop with a host code hook on it (the way breakpoints reach Python): the
    CPU never makes a hypercall and the emulating thread is in the hook much of the
    time; the watchdog stops it anyway and the request fails with EIO."""
    kernel = mnt.kernel
    kernel.WEDGE_SECONDS = 1.0
    hits = []
    addr, restore = _patch(kernel, "do_mkdirat", bytes.fromhex("ebfe"))      # jmp .
    hook = kernel.hook_code(addr, addr, lambda k, address: hits.append(address))
    try:
        started = time.monotonic()
        r = _sh(f"mkdir {mnt.p('tmp/hooked')}")
        took = time.monotonic() - started
    finally:
        kernel.hook_del(hook)
        restore()
    assert r.returncode != 0 and "Input/output error" in r.stderr
    assert took < TIMEOUT + MARGIN
    assert len(hits) > 100
    assert "soft lockup" in kernel.dmesg()
    assert read(mnt.p("tracing/README")).startswith("tracing mini-HOWTO")


def test_a_handler_that_never_returns_makes_the_machine_stuck_and_requests_fail_at_once(
        mnt, tmp_path):
    """A probe handler blocks: its own request fails with EIO at request_timeout (the
    caller never waits inside the emulation); the machine is declared stuck, every
    request then fails at once, and the status file (answered without the kernel) says
    degraded, with `kprobefs status` exiting 1.  When the handler returns, the machine
    runs again."""
    kernel = mnt.kernel
    kernel.WEDGE_SECONDS = 0.5
    kernel.STUCK_SECONDS = 1.0
    kp, entered, release = blocking_kprobe("do_mkdirat")
    with kernel.lock:
        kernel.register_kprobe(kp)
    try:
        started = time.monotonic()
        assert _errno_of(os.mkdir, mnt.p("tmp/h")) == errno.EIO
        assert entered.is_set() and time.monotonic() - started < TIMEOUT + MARGIN
        assert kernel.stuck
        started = time.monotonic()
        assert _errno_of(read, mnt.p("tracing/README")) == errno.EIO
        assert time.monotonic() - started < 1.0
        status = subprocess.run(_cli() + ["status", str(mnt.path)], capture_output=True,
                                text=True, timeout=30, env=_env())
        assert status.returncode == cli.STATUS_DEGRADED, status.stdout + status.stderr
        assert status.stdout.startswith("state: degraded")
        assert "stuck: cpu" in status.stdout and "probe handler" in status.stdout
    finally:
        release.set()
    _unstick(kernel, kp)
    assert kernel.stuck is None
    assert read(mnt.p("tracing/README")).startswith("tracing mini-HOWTO")


def test_a_stuck_machine_does_not_delay_a_mirrored_system_call(mnt):
    """The shell under ``kprobefs exec`` goes on cd-ing while the machine is stuck: its
    chdirs are still seen (and queued), and answered without the machine."""
    kernel = mnt.kernel
    kernel.WEDGE_SECONDS = 0.5
    kernel.STUCK_SECONDS = 1.0
    watch = mnt.daemon.syscalls
    shell = subprocess.Popen(
        _cli() + ["exec", str(mnt.path), "--", "sh", "-c",
                  "cd /sys/kernel/tracing; echo ready; read go; cd /sys/kernel/tracing; "
                  "cd /; cd /sys/kernel/tracing/events; echo done"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=_env(), cwd="/")
    kp, _entered, release = blocking_kprobe("do_mkdirat")
    try:
        assert shell.stdout.readline() == "ready\n"
        assert watch.stats["mirrored"] == 1
        with kernel.lock:
            kernel.register_kprobe(kp)
        assert _errno_of(os.mkdir, mnt.p("tmp/h")) == errno.EIO
        assert kernel.stuck
        out, _ = shell.communicate("go\n", timeout=60)
        assert out == "done\n"
        assert watch.stats["mirrored"] == 3 and watch.stats["skipped"] == 1
    finally:
        release.set()
        if shell.poll() is None:
            shell.kill()
            shell.wait()
    _unstick(kernel, kp)


# ---- what can be seen ---------------------------------------------------------------
def test_status_of_a_healthy_daemon(mnt):
    t = mnt.p("tracing")
    assert write(f"{t}/kprobe_events", "p:st vfs_read") == 0
    r = subprocess.run(_cli() + ["status", str(mnt.path)], capture_output=True, text=True,
                       timeout=30, env=_env())
    assert r.returncode == cli.STATUS_OK, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "state: ok"
    fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line
                  and not line.startswith(" "))
    assert fields["cpus"] == "2 in service of 2"
    every_event = len(read(mnt.p("tracing/available_events")).splitlines())
    assert fields["probes"] == "1" and fields["events"] == str(every_event)
    assert float(fields["uptime"].split()[0]) > 0
    assert "status" in os.listdir(mnt.p("kprobefs"))
    assert write(f"{t}/kprobe_events", "", append=False, trunc=True) == 0


def test_status_of_a_mount_nobody_serves(tmp_path):
    r = subprocess.run(_cli() + ["status", str(tmp_path)], capture_output=True,
                       text=True, timeout=30, env=_env())
    assert r.returncode == cli.STATUS_NO_ANSWER
    assert r.stdout.startswith("state: no answer")


def test_the_kernel_log_reads_as_dev_kmsg_records(mnt):
    """MNT/dev/kmsg is the kernel's /dev/kmsg: one "level,seq,usec,-;text" record per
    read, sequence numbers counting up, a message written there logged at its level,
    O_NONBLOCK at the end is EAGAIN; the oops of a killed task is there."""
    kernel = mnt.kernel
    kernel.WEDGE_SECONDS = 0.5
    _, restore = _patch(kernel, "do_mkdirat", bytes.fromhex("ebfe"))
    try:
        assert _errno_of(os.mkdir, mnt.p("tmp/oops")) == errno.EIO
    finally:
        restore()
    assert write(mnt.p("dev/kmsg"), "<3>hangs: a message from user space\n",
                 append=False) == 0
    records = []
    fd = os.open(mnt.p("dev/kmsg"), os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                records.append(os.read(fd, 4096).decode())
            except OSError as e:
                assert e.errno == errno.EAGAIN
                break
    finally:
        os.close(fd)
    parsed = []
    for rec in records:
        prefix, text = rec.rstrip("\n").split(";", 1)
        level, seq, usec, flags = prefix.split(",")
        parsed.append((int(level), int(seq), int(usec), flags, text))
    seqs = [p[1] for p in parsed]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert [p[2] for p in parsed] == sorted(p[2] for p in parsed)
    texts = {p[4]: p[0] for p in parsed}
    assert texts["hangs: a message from user space"] == 3
    oops = [t for t in texts if t.startswith("Oops: soft lockup")]
    assert oops and texts[oops[0]] == 0     # KERN_EMERG
    assert any(t.startswith("watchdog: BUG: soft lockup") for t in texts)
    # A small buffer is EINVAL; a plain read at the end is end-of-file (not a wait).
    fd = os.open(mnt.p("dev/kmsg"), os.O_RDONLY)
    try:
        assert _errno_of(os.read, fd, 8) == errno.EINVAL
        blocking = list(iter(lambda: os.read(fd, 4096), b""))
    finally:
        os.close(fd)
    assert len(blocking) >= len(records)


def test_an_oops_is_logged_at_error_with_the_kernels_report(mnt, caplog):
    kernel = mnt.kernel
    with caplog.at_level(logging.ERROR, logger="kprobefs.machine"):
        _, restore = _patch(kernel, "do_mkdirat", bytes.fromhex("488b042500000000"))
        try:
            assert _errno_of(os.mkdir, mnt.p("tmp/oops")) == errno.EIO
        finally:
            restore()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    report = next(m for m in errors if m.startswith("oops: task"))
    assert "oops: task " in report and ") killed in mkdir" in report
    assert "BUG: unable to handle page fault for address: 0000000000000000" in report
    assert "Oops: page fault" in report and "(do_mkdirat+0x0/" in report


# ---- where a backgrounded daemon logs ----------------------------------------------------
def test_a_backgrounded_daemon_logs_to_syslog_when_it_listens(tmp_path, monkeypatch):
    path = str(tmp_path / "log.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    monkeypatch.setattr(cli, "SYSLOG_SOCKET", path)
    handler, where = cli.daemon_log_handler(None)
    try:
        assert where == f"syslog ({path})"
        logger = logging.getLogger("kprobefs.test-syslog")
        logger.addHandler(handler)
        logger.propagate = False
        logger.error("the machine is stuck")
        data = sock.recv(4096).decode()
    finally:
        handler.close()
        sock.close()
    # <27>: facility daemon (3), severity error (3).
    assert data.startswith("<27>kprobefs[") and "ERROR kprobefs.test-syslog: the machine" \
        " is stuck" in data


def test_a_backgrounded_daemon_without_syslog_logs_under_var_log(tmp_path):
    """The CLI, backgrounded, in a mount namespace whose /var/log is empty and where no
    syslog listens on /dev/log: the daemon's log, kernel messages included, lands in
    /var/log/kprobefs.log."""
    need_fuse()
    mnt = tmp_path / "mnt"
    kprobefs_cli = " ".join(_cli())
    script = f"""
        set -e
        mount -t tmpfs none /var/log
        if [ -e /dev/log ]; then mount --bind /dev/null /dev/log; fi
        {kprobefs_cli} mount {mnt}
        trap '{kprobefs_cli} umount {mnt}' EXIT
        echo '<3>hangs: seen by the host log' > {mnt}/dev/kmsg
        cat /var/log/kprobefs.log
    """
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr
    assert "WARNING kprobefs.machine: kernel: hangs: seen by the host log" in r.stdout


def _cli() -> list[str]:
    return [sys.executable, "-m", "kprobefs"]


def _env() -> dict:
    env = dict(os.environ)
    parent = str(Path(kprobefs.__file__).resolve().parents[1])
    env["PYTHONPATH"] = parent + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("NOTIFY_SOCKET", None)
    return env


_SPAWN_WITH_A_FILE_OPEN = """
import subprocess, sys
from pathlib import Path
sys.path[:0] = sys.argv[2:]
from robust_mount import InProcessMount
m = InProcessMount(Path(sys.argv[1])).start()
with open(m.p("tracing/README")) as f:
    subprocess.run(["true"], check=True)     # close_fds: the child closes f on its way
m.stop()
print("spawned")
"""


def test_a_process_serving_a_mount_spawns_while_it_holds_a_file_of_it(tmp_path):
    """A test process that serves an in-process mount starts a program while it has a
    file of the mount open: the child's close of that file (a FUSE FLUSH) is answered
    by the parent's own threads, so the child must not hold the parent suspended with
    the GIL taken, as a vfork does (the whole process hung).  Run in a process of its
    own, so that a hang fails the test instead of holding the suite."""
    need_fuse()
    mnt = tmp_path / "mnt"
    tests = str(Path(__file__).resolve().parent)
    child = subprocess.Popen(
        [sys.executable, "-c", _SPAWN_WITH_A_FILE_OPEN, str(mnt), tests,
         str(Path(kprobefs.__file__).resolve().parents[1])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        from kprobefs.daemon import unmount
        from robust_mount import abort_connection
        abort_connection(mnt)           # frees the child held in its FLUSH
        child.kill()
        unmount(str(mnt), lazy=True)
        out, err = child.communicate()
        pytest.fail("the process hung spawning with a file of its mount open")
    assert child.returncode == 0 and out.strip() == "spawned", err[-2000:]
