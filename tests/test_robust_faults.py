"""Faults never take the daemon down: probe handlers that raise, fetches through bad
pointers, a task that oopses, a spinning request (EIO, other files keep being served;
tests/test_robust_hangs.py has the rest of what can hang), a full task table, jiffies
wrapping, the daemon killed with -9 in the middle of a write and mounted again,
SIGTERM, and the kernel text given back whole at unmount.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kprobefs
from kprobefs import Kprobe

from robust_mount import InProcessMount, is_mounted, need_fuse, read, wait_for, write

pytestmark = pytest.mark.fuse


@pytest.fixture
def mnt(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt", request_timeout=4.0).start()
    yield m
    m.stop()


def _mkdir_errno(path: str) -> int:
    try:
        os.mkdir(path)
    except OSError as e:
        return e.errno
    return 0


def test_a_raising_handler_is_contained(mnt):
    hits = []

    def pre(p, regs):
        hits.append(1)
        raise RuntimeError("a buggy handler")

    kp = Kprobe(symbol_name="vfs_read", pre_handler=pre)
    with mnt.kernel.lock:
        mnt.kernel.register_kprobe(kp)
    try:
        assert read(mnt.p("tracing/README")).startswith("tracing mini-HOWTO")
        assert hits and kp.nmissed >= len(hits)
    finally:
        with mnt.kernel.lock:
            mnt.kernel.unregister_kprobe(kp)
    assert read(mnt.p("tracing/README")).startswith("tracing mini-HOWTO")


def test_fetches_through_bad_pointers_record_faults(mnt):
    t = mnt.p("tracing")
    assert write(f"{t}/kprobe_events",
                 "p:ff vfs_read s=+0(@0x10):string n=@0xdead0000:u64 k=+0(%sp):x64 "
                 "u=@0xffffffff81000000:ustring z=+8(@0):u32") == 0
    assert write(f"{t}/events/kprobes/ff/enable", "1", append=False) == 0
    read(f"{t}/README")
    assert write(f"{t}/events/kprobes/ff/enable", "0", append=False) == 0
    text = read(f"{t}/trace")
    assert "ff: (" in text and 's=(fault)' in text and "u=(fault)" in text
    assert read(f"{t}/README")


def test_an_oopsing_task_fails_its_request_only(mnt):
    """A kernel-mode fault no exception entry covers kills the task (an oops); its
    request fails with EIO and the next request of the process gets a new task."""
    kernel = mnt.kernel
    (fn,) = kernel.image.lookup_name("do_mkdirat")
    original = kernel.read(fn.addr, 8)
    kernel.text_poke(fn.addr, bytes.fromhex("488b042500000000"))   # mov rax, [0]
    try:
        assert _mkdir_errno(mnt.p("tmp/oops")) == errno.EIO
    finally:
        kernel.text_poke(fn.addr, original)
    assert read(mnt.p("tracing/README"))
    assert _mkdir_errno(mnt.p("tmp/after")) == 0


def test_a_spinning_request_fails_with_eio_and_the_rest_is_served(mnt):
    """A request whose kernel code spins without hypercalls: the watchdog stops the CPU
    and kills the task as an oops does (the kernel's soft-lockup report in dmesg); the
    request fails with EIO, the CPU stays in service, the same process's next request
    gets a new task, and other processes are served all along."""
    kernel = mnt.kernel
    kernel.WEDGE_SECONDS = 1.0
    # the system call's own entry: the kernel's internal mkdirs (init_mkdir, the host
    # binaries an exec mirror creates) go through do_mkdirat and must not spin
    (fn,) = kernel.image.lookup_name("__x64_sys_mkdir")
    original = kernel.read(fn.addr, 2)
    kernel.text_poke(fn.addr, bytes.fromhex("ebfe"))                # jmp . (a tight loop)
    try:
        started = time.monotonic()
        assert _mkdir_errno(mnt.p("tmp/spin")) == errno.EIO
        assert time.monotonic() - started < 15
        r = subprocess.run(["sh", "-c", f"cat {mnt.p('tracing/README')} >/dev/null && "
                                        f"echo still serving > {mnt.p('tracing/trace_marker')}"
                                        f" && cat {mnt.p('tracing/trace')}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "still serving" in r.stdout
    finally:
        kernel.text_poke(fn.addr, original)
    assert "watchdog: BUG: soft lockup - CPU#" in kernel.dmesg()
    assert not kernel.wedged and all(c.state != "wedged" for c in kernel.cpus)
    assert _mkdir_errno(mnt.p("tmp/after")) == 0


def test_a_full_task_table_fails_new_processes_with_eagain(mnt):
    kernel = mnt.kernel
    mnt.daemon.gateway.reap = lambda: 0     # no window is freed meanwhile

    class Full(list):
        """No window comes free while the table is full (tasks of exited threads)."""

        held: list = []

        def append(self, window):
            self.held.append(window)

    with kernel.lock:
        saved = kernel._free_windows, kernel.MAX_TASKS
        kernel._free_windows = Full()
        kernel.MAX_TASKS = kernel._next_window
    try:
        r = subprocess.run(["cat", mnt.p("tracing/README")], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode != 0 and "Resource temporarily unavailable" in r.stderr
    finally:
        with kernel.lock:
            saved[0].extend(kernel._free_windows + Full.held)
            kernel._free_windows, kernel.MAX_TASKS = saved
    r = subprocess.run(["cat", mnt.p("tracing/README")], capture_output=True, timeout=60)
    assert r.returncode == 0


def test_unmount_gives_back_every_patched_byte(tmp_path):
    need_fuse()
    m = InProcessMount(tmp_path / "mnt").start()
    t = m.p("tracing")
    try:
        assert write(f"{t}/kprobe_events", "p:a vfs_read x=%di\nr:b vfs_write\n"
                     "p:c do_sys_open\np:d kprobe_target_traced+5\n") == 0
        assert write(f"{t}/events/enable", "1", append=False) == 0
        assert write(f"{t}/current_tracer", "function", append=False) == 0
        assert write(m.p("proc/sys/kernel/stack_tracer_enabled"), "1", append=False) == 0
        read(f"{t}/README")
    finally:
        m.stop()
    kernel = m.kernel
    arch = kernel.kprobes.arch
    assert not kernel.kprobes.registered()
    for fn in kernel.image.symbols:
        if fn.is_text and fn.size:
            assert kernel.read(fn.addr, fn.size) == arch.original_bytes(fn.addr, fn.size), \
                fn.name


def test_jiffies_wrap_five_minutes_after_boot():
    """Linux starts jiffies five minutes before the wrap; the machine must wrap too
    (it used to fail every slice from then on: the daemon died after five minutes)."""
    from kprobefs.machine import Kernel

    kernel = Kernel(cpus=1)
    kernel._boot_ns -= 400 * 10**9
    task = kernel.spawn("late")
    assert kernel.syscall(task, "getpid") == task.pid


# ---- the daemon as a process ------------------------------------------------------------
PACKAGE_PARENT = str(Path(kprobefs.__file__).resolve().parents[1])


def _cli(*args, **kw):
    env = dict(os.environ, PYTHONPATH=PACKAGE_PARENT)
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run([sys.executable, "-m", "kprobefs", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd="/", **kw)


def _daemon_pid(path) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"mount" in argv and str(path).encode() in argv and b"-m" in argv:
            return int(entry)
    raise LookupError(path)


def test_kill_9_during_a_write_then_mount_again_and_sigterm(tmp_path):
    need_fuse()
    path = tmp_path / "mnt"
    r = _cli("mount", str(path))
    assert r.returncode == 0, r.stderr
    pid = _daemon_pid(path)
    try:
        ev = path / "tracing" / "kprobe_events"
        writer = subprocess.Popen(
            ["sh", "-c", f"i=0; while :; do echo \"p:k$i vfs_read x=%di\" >> {ev}; "
                         f"i=$((i+1)); done"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        assert wait_for(lambda: ev.exists() and read(str(ev)).count("\n") > 20, 30)
        os.kill(pid, signal.SIGKILL)
        writer.kill()
        writer.wait(30)
        assert wait_for(lambda: _stale(path), 10)
        r = _cli("mount", str(path))                 # recovers the stale mount
        assert r.returncode == 0, r.stderr
        pid = _daemon_pid(path)
        assert read(str(ev)) == ""                   # a fresh kernel
        assert write(str(ev), "p:again vfs_read") == 0
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not is_mounted(path), 30)
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}/cmdline") or
                        _zombie(pid), 30)
    finally:
        try:
            os.kill(_daemon_pid(path), signal.SIGKILL)
        except LookupError:
            pass
        if is_mounted(path):
            subprocess.run(["fusermount", "-u", "-z", str(path)], capture_output=True)


def test_host_cpu_runs_every_thread_of_the_daemon_on_that_cpu(tmp_path):
    """mount --host-cpu N: the daemon's threads (the machine's, FUSE's, the watchers')
    are all allowed N only, and the mount works; a CPU the process may not use is
    refused before anything starts."""
    need_fuse()
    cpu = max(os.sched_getaffinity(0))
    path = tmp_path / "mnt"
    r = _cli("mount", str(path), "--host-cpu", "1000000")
    assert r.returncode == 2 and "--host-cpu" in r.stderr
    r = _cli("mount", str(path), "--host-cpu", str(cpu))
    assert r.returncode == 0, r.stderr
    try:
        pid = _daemon_pid(path)
        assert write(str(path / "tracing/kprobe_events"), "p:pinned vfs_read") == 0
        tids = os.listdir(f"/proc/{pid}/task")
        assert len(tids) > 5
        assert all(os.sched_getaffinity(int(t)) == {cpu} for t in tids)
    finally:
        r = _cli("umount", str(path))
        assert r.returncode == 0, r.stderr


def _stale(path) -> bool:
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
    except OSError:
        return True
