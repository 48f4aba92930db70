/* Miscellaneous system calls: ids, names, uname, time. */
#include "sched.h"
#include "syscalls.h"
#include "uaccess.h"
#include "trace_native.h"

#ifndef LINUX_COMPILER
#define LINUX_COMPILER "gcc"
#endif
#define UTS_SYSNAME "Linux"
#define UTS_RELEASE "6.1.0-kprobefs"
#define UTS_VERSION "#1 SMP Debian 6.1.0 (kprobefs)"

/* /proc/version is this format applied to sysname, release and version. */
const char linux_proc_banner[] =
	"%s version %s (kprobefs@emulator) (" LINUX_COMPILER ") %s\n";
const char linux_banner[] = "Linux version " UTS_RELEASE " (kprobefs@emulator) ("
	LINUX_COMPILER ") " UTS_VERSION "\n";

struct new_utsname {
	char sysname[65];
	char nodename[65];
	char release[65];
	char version[65];
	char machine[65];
	char domainname[65];
};

struct new_utsname init_uts_ns = {
	.sysname = UTS_SYSNAME,
	.nodename = "kprobefs",
	.release = UTS_RELEASE,
	.version = UTS_VERSION,
	.machine = "x86_64",
	.domainname = "(none)",
};

SYSCALL_DECL(uname)
{
	if (copy_to_user((void __user *)regs->di, &init_uts_ns, sizeof(init_uts_ns)))
		return -EFAULT;
	return 0;
}

SYSCALL_DECL(getpid)
{
	return current->tgid;
}

SYSCALL_DECL(gettid)
{
	return current->pid;
}

SYSCALL_DECL(getppid)
{
	struct task_struct *parent = current->real_parent;

	return parent ? parent->tgid : 0;
}

void __set_task_comm(struct task_struct *tsk, const char *from, bool exec)
{
	char buf[TASK_COMM_LEN];

	/* Pad with NULs, as strscpy_pad() does: comm is copied out whole. */
	memset(buf, 0, sizeof(buf));
	strscpy(buf, from, sizeof(buf));
	memcpy(tsk->comm, buf, sizeof(buf));
	trace_native_comm_changed(tsk);
}

#define PR_SET_NAME 15
#define PR_GET_NAME 16

SYSCALL_DECL(prctl)
{
	char comm[TASK_COMM_LEN];
	int option = (int)regs->di;

	switch (option) {
	case PR_SET_NAME:
		comm[sizeof(comm) - 1] = 0;
		if (strncpy_from_user(comm, (const char __user *)regs->si,
				      sizeof(comm) - 1) < 0)
			return -EFAULT;
		__set_task_comm(current, comm, false);
		return 0;
	case PR_GET_NAME:
		if (copy_to_user((void __user *)regs->si, current->comm, sizeof(current->comm)))
			return -EFAULT;
		return 0;
	default:
		return -EINVAL;
	}
}

volatile unsigned long jiffies;

struct trace_clock_tsc ktime_tsc;

/* Read in the kernel, as Linux reads its clocksource: a hypercall for each of the
 * clock readings a path walk or a write makes was a host round trip each. */
u64 ktime_get_ns(void)
{
	return tsc_clock_read(&ktime_tsc);
}
