"""The host kernel's seccomp user notification (seccomp(2), seccomp_unotify(2)), through
ctypes: a classic-BPF filter that hands chosen system calls to a listener, and the
listener's side (receive a notification, check that it is still valid, let the call
go on).  No kprobefs layer here: :mod:`kprobefs.fs.syscallwatch` says what is mirrored
and why.

The filter (:func:`build_filter`) answers ``SECCOMP_RET_USER_NOTIF`` for the listed
x86_64 system call numbers and ``SECCOMP_RET_ALLOW`` for everything else, including
every call made through another ABI (i386's ``int 0x80``: its arch is not
AUDIT_ARCH_X86_64; x32's numbers carry bit 30, so they never equal a listed number).
The listener always answers with ``SECCOMP_USER_NOTIF_FLAG_CONTINUE`` (host kernel 5.5
and later): the host kernel then runs the call itself, so a notification only tells
the listener that the call is being made; it changes nothing of the call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct
from typing import NamedTuple, Sequence

__all__ = ["Notification", "SeccompError", "build_filter", "install_listener",
           "decode_notification", "receive", "id_valid", "answer_continue",
           "read_string", "NOTIF_SIZE", "SECCOMP_RET_ERRNO"]

_NR_SECCOMP = 317                       # x86_64
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_GET_NOTIF_SIZES = 3
_SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
_SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV = 1 << 5     # Linux 5.19
_SECCOMP_USER_NOTIF_FLAG_CONTINUE = 1
_PR_SET_NO_NEW_PRIVS = 38
AUDIT_ARCH_X86_64 = 0xC000003E
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_ERRNO = 0x00050000          # | the errno

# classic BPF opcodes (linux/filter.h, linux/bpf_common.h)
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20      # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x05 | 0x10 | 0x00         # BPF_JMP | BPF_JEQ | BPF_K
_BPF_RET_K = 0x06 | 0x00                # BPF_RET | BPF_K
_SOCK_FILTER = struct.Struct("<HBBI")   # code, jt, jf, k
_SECCOMP_DATA_NR, _SECCOMP_DATA_ARCH = 0, 4   # offsets in struct seccomp_data

#: struct seccomp_notif: id, pid, flags, then struct seccomp_data (nr, arch,
#: instruction_pointer, args[6]).
_NOTIF = struct.Struct("<QII" "iIQ6Q")
#: struct seccomp_notif_resp: id, val, error, flags.
_NOTIF_RESP = struct.Struct("<QqiI")
NOTIF_SIZE = _NOTIF.size


def _iowr(nr: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | nr


_IOCTL_NOTIF_RECV = _iowr(0, _NOTIF.size)
_IOCTL_NOTIF_SEND = _iowr(1, _NOTIF_RESP.size)
_IOCTL_NOTIF_ID_VALID = (1 << 30) | (8 << 16) | (ord("!") << 8) | 2   # _IOW('!', 2, u64)

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


class SeccompError(OSError):
    """The filter cannot be installed (a host kernel without seccomp or without user
    notification, or no permission); ``errno`` says why."""


class Notification(NamedTuple):
    """One received notification: the thread ``pid`` (in the listener's pid namespace)
    is making the system call ``nr`` with ``args``."""

    id: int
    pid: int
    flags: int
    nr: int
    arch: int
    ip: int
    args: tuple


def build_filter(nrs: Sequence[int], action: int = SECCOMP_RET_USER_NOTIF) -> bytes:
    """The filter program (an array of struct sock_filter) that answers ``action`` to
    the x86_64 system calls ``nrs`` (by default: notify the listener; the tests fail
    a call with ``SECCOMP_RET_ERRNO | errno``) and allows everything else."""
    nrs = sorted(set(nrs))
    if not nrs or len(nrs) > 250:
        raise ValueError("between 1 and 250 system calls")
    notify = 3 + len(nrs) + 1                     # index of the action's return
    allow = notify - 1
    prog = [(_BPF_LD_W_ABS, 0, 0, _SECCOMP_DATA_ARCH),
            (_BPF_JEQ_K, 0, allow - 2, AUDIT_ARCH_X86_64),
            (_BPF_LD_W_ABS, 0, 0, _SECCOMP_DATA_NR)]
    for nr in nrs:
        here = len(prog)
        prog.append((_BPF_JEQ_K, notify - here - 1, 0, nr))
    prog += [(_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (_BPF_RET_K, 0, 0, action)]
    return b"".join(_SOCK_FILTER.pack(*insn) for insn in prog)


def _seccomp(op: int, flags: int, arg) -> int:
    ret = _libc.syscall(_NR_SECCOMP, op, flags, arg)
    if ret < 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"seccomp: {os.strerror(err)}")
    return ret


def _check_sizes() -> None:
    """Raises SeccompError unless the host kernel's notification structures are the
    ones this module packs (SECCOMP_GET_NOTIF_SIZES; EINVAL on a kernel before 5.0)."""
    sizes = (ctypes.c_uint16 * 3)()
    _seccomp(_SECCOMP_GET_NOTIF_SIZES, 0, ctypes.byref(sizes))
    if (sizes[0], sizes[1], sizes[2]) != (_NOTIF.size, _NOTIF_RESP.size, 64):
        raise SeccompError(errno.EINVAL, f"seccomp: unexpected notification sizes "
                           f"{tuple(sizes)}")


def install_listener(nrs: Sequence[int]) -> int:
    """Installs the filter of :func:`build_filter` on the calling thread (inherited by
    its children and kept across execve; never removed) and returns the listener fd
    (close-on-exec).  Sets no_new_privs only when the caller may not install a filter
    without it (no CAP_SYS_ADMIN), so a root tool keeps its set-user-ID helpers.
    Precondition: a single-threaded process (the other threads would not be filtered).
    Raises SeccompError when it cannot (nothing is installed then)."""
    _check_sizes()
    code = build_filter(nrs)
    buf = ctypes.create_string_buffer(code, len(code))
    prog = struct.pack("<H6xQ", len(code) // _SOCK_FILTER.size, ctypes.addressof(buf))
    fprog = ctypes.create_string_buffer(prog, len(prog))
    try:
        return _install(fprog)
    except SeccompError as e:
        if e.errno != errno.EACCES:
            raise
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(err, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    return _install(fprog)


def _install(fprog) -> int:
    """The filter with a listener; once the listener has a notification, the caller's
    wait for the answer is killable only (a signal no longer fails the call with
    EINTR), where the host kernel knows the flag (5.19)."""
    try:
        return _seccomp(_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_NEW_LISTENER
                        | _SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, fprog)
    except SeccompError as e:
        if e.errno != errno.EINVAL:
            raise
    return _seccomp(_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_NEW_LISTENER, fprog)


def decode_notification(data: bytes) -> Notification:
    """A struct seccomp_notif."""
    nid, pid, flags, nr, arch, ip, *args = _NOTIF.unpack_from(data)
    return Notification(nid, pid, flags, nr, arch, ip, tuple(args))


def receive(fd: int) -> Notification | None:
    """The next notification of the listener fd (which poll() said is readable); None
    when there is none any more (its thread was interrupted by a signal and the call
    restarts: ENOENT), or the filter has no task left."""
    buf = bytearray(_NOTIF.size)      # the kernel wants it zeroed
    try:
        fcntl.ioctl(fd, _IOCTL_NOTIF_RECV, buf, True)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
            return None
        raise
    return decode_notification(bytes(buf))


def id_valid(fd: int, nid: int) -> bool:
    """Whether notification nid still waits for its answer: its thread has not been
    killed, so what was read of its memory (/proc/PID/mem) is that thread's."""
    try:
        fcntl.ioctl(fd, _IOCTL_NOTIF_ID_VALID, struct.pack("<Q", nid))
    except OSError:
        return False
    return True


def answer_continue(fd: int, nid: int) -> bool:
    """Lets the notified call go on as if there were no filter; False when its thread
    is gone (ENOENT)."""
    resp = bytearray(_NOTIF_RESP.pack(nid, 0, 0, _SECCOMP_USER_NOTIF_FLAG_CONTINUE))
    try:
        fcntl.ioctl(fd, _IOCTL_NOTIF_SEND, resp, True)
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def read_string(pid: int, addr: int, limit: int = 4096) -> bytes:
    """The NUL-terminated string at addr in pid's memory (/proc/PID/mem), without its
    NUL, at most limit bytes (PATH_MAX).  Raises OSError (EFAULT: the address is not
    mapped; ENAMETOOLONG past limit)."""
    out = bytearray()
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        while len(out) < limit:
            # up to the end of the page, so that a string ending just before an
            # unmapped page reads
            chunk = min(4096 - (addr + len(out)) % 4096, limit - len(out))
            try:
                data = os.pread(mem.fileno(), chunk, addr + len(out))
            except OSError as e:
                raise OSError(errno.EFAULT, "Bad address") from e
            if not data:
                raise OSError(errno.EFAULT, "Bad address")
            end = data.find(b"\0")
            if end >= 0:
                return bytes(out + data[:end])
            out += data
    raise OSError(errno.ENAMETOOLONG, "File name too long")
