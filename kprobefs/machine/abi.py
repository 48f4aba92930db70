"""Numbers shared with the emulated kernel: system calls, flags, hypercalls."""

__all__ = [
    "SYSCALLS", "AT_FDCWD", "AT_REMOVEDIR", "O_RDONLY", "O_WRONLY", "O_RDWR", "O_CREAT",
    "O_EXCL", "O_TRUNC", "O_APPEND", "O_NONBLOCK", "O_DIRECTORY", "PR_SET_NAME",
    "PR_GET_NAME", "AF_INET", "SOCK_STREAM", "HC", "IDLE_WAKE_TASK", "IDLE_UPCALL",
    "TASK_RUNNING", "TASK_INTERRUPTIBLE", "TASK_UNINTERRUPTIBLE", "NO_SYSCALL",
    "S_IFDIR", "S_IFREG", "S_IFLNK", "U64", "signed64", "KERNEL_MUTEXES", "mutexes_word",
]

#: x86_64 system call numbers the kernel implements.
SYSCALLS = {
    "read": 0, "write": 1, "open": 2, "close": 3, "stat": 4, "lseek": 8,
    "pread64": 17, "pwrite64": 18, "rt_sigaction": 13, "getpid": 39, "socket": 41,
    "accept": 43, "bind": 49,
    "listen": 50, "clone": 56, "fork": 57, "execve": 59, "exit": 60, "wait4": 61,
    "kill": 62, "uname": 63, "getcwd": 79, "chdir": 80, "mkdir": 83, "rmdir": 84,
    "unlink": 87, "symlink": 88, "readlink": 89, "rename": 82, "getppid": 110,
    "setpriority": 141, "sched_setscheduler": 144, "prctl": 157,
    "gettid": 186, "getdents64": 217, "exit_group": 231, "tgkill": 234, "openat": 257,
    "mkdirat": 258, "newfstatat": 262, "unlinkat": 263, "symlinkat": 266,
    "readlinkat": 267, "renameat": 264, "accept4": 288, "renameat2": 316,
    "execveat": 322, "clone3": 435, "openat2": 437,
}

AT_FDCWD = -100
AT_REMOVEDIR = 0x200
O_RDONLY, O_WRONLY, O_RDWR = 0, 1, 2
O_CREAT = 0o100
O_EXCL = 0o200
O_TRUNC = 0o1000
O_APPEND = 0o2000
O_NONBLOCK = 0o4000
O_DIRECTORY = 0o200000
PR_SET_NAME, PR_GET_NAME = 15, 16
#: Task states a task sleeps in (include/sched.h).
TASK_RUNNING, TASK_INTERRUPTIBLE, TASK_UNINTERRUPTIBLE = 0x0, 0x1, 0x2
#: orig_ax of a wake-up for a run of the host process, no system call (HOST_RUN in
#: include/kernel.h; -1 means no call at all: user_mode_loop).
NO_SYSCALL = -2
AF_INET, SOCK_STREAM = 2, 1
S_IFDIR, S_IFREG, S_IFLNK = 0o040000, 0o100000, 0o120000


class HC:
    """Hypercall numbers (enum hypercall_nr in include/kernel.h)."""

    IDLE = 1
    SYSCALL_DONE = 2
    TASK_NEW = 3
    TASK_EXIT = 4
    IRET = 5
    # 6 was CLOCK: ktime_get_ns reads the TSC in the kernel (ktime_tsc)
    CONSOLE = 7
    PANIC = 8
    HOSTFS_LOOKUP = 16
    HOSTFS_OPEN = 17
    HOSTFS_READ = 18
    HOSTFS_WRITE = 19
    HOSTFS_RELEASE = 20
    HOSTFS_READDIR = 21
    UPCALL_DONE = 22
    BOOTED = 23
    YIELD = 24
    TRACE_COMM = 25
    TRACE_PAGE_FULL = 26
    TRACE_WAKE = 27
    WORK_NEXT = 28
    WORK_DONE = 29
    TRACE_EVENT = 30
    HOSTFS_MKDIR = 40
    HOSTFS_RMDIR = 41
    SELF_IPI = 42
    TASK_FREE = 43
    FTRACE_DIRECT = 50
    KRETPROBE_MISSED = 51


IDLE_WAKE_TASK = 1
IDLE_UPCALL = 3
HYPERCALL_VECTOR = 0x81


#: A register's width: values written to registers are masked with it.
U64 = 0xFFFFFFFFFFFFFFFF


def signed64(v: int) -> int:
    """A 64-bit register value as the signed long the kernel means by it."""
    return v - (1 << 64) if v & (1 << 63) else v


#: The kernel mutexes hostfs takes around a host-served operation, by bit, in the order
#: it takes them (fs/hostfs.c: hostfs_mutexes; 6.1's nesting: event_mutex outside
#: trace_types_lock, kprobe_mutex outside ftrace_lock outside text_mutex).
KERNEL_MUTEXES = ("event_mutex", "trace_types_lock", "module_mutex", "kprobe_mutex",
                  "ftrace_lock", "text_mutex")


def mutexes_word(mutexes) -> int:
    """The u32 a hostfs lookup answers with (HC_HOSTFS_LOOKUP's fourth argument) for a
    node's mutexes (tracing.nodes.Mutexes: ``open``, ``trunc``, ``read``, ``write``
    names and ``work_unlocked``): a byte of KERNEL_MUTEXES bits each for write, read,
    open and trunc, then bit 31 for work_unlocked.  ValueError for an unknown name."""
    def bits(names: tuple[str, ...]) -> int:
        return sum(1 << KERNEL_MUTEXES.index(name) for name in names)
    return (bits(mutexes.write) | bits(mutexes.read) << 8 | bits(mutexes.open) << 16
            | bits(mutexes.trunc) << 24 | int(mutexes.work_unlocked) << 31)
