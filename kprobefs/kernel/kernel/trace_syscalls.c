/* The syscalls events (include/trace/syscalls.h): each system call's metadata, and the
 * probes on the system call path that record sys_enter_NAME and sys_exit_NAME. */
#include "trace/syscalls.h"
#include "trace_native.h"
#include "syscalls.h"
#include "trace/events/syscalls.h"	/* syscall_get_arguments */

#define __stringify_1(x...) #x
#define __stringify(x...) __stringify_1(x)
#define __user

/* SYSCALL_METADATA(nr, name, nb_args, type, arg, ...): the types are stringified after
 * expansion, so __user goes, as in 6.1's format files ("const char * filename"). */
#define __SC_STR_TDECL(t) __stringify(t)
#define __META_ARGS0() .types = { NULL }
#define __META_ARGS1(t1, a1) \
	.types = { __SC_STR_TDECL(t1) }, .args = { #a1 }
#define __META_ARGS2(t1, a1, t2, a2) \
	.types = { __SC_STR_TDECL(t1), __SC_STR_TDECL(t2) }, .args = { #a1, #a2 }
#define __META_ARGS3(t1, a1, t2, a2, t3, a3) \
	.types = { __SC_STR_TDECL(t1), __SC_STR_TDECL(t2), __SC_STR_TDECL(t3) }, \
	.args = { #a1, #a2, #a3 }
#define __META_ARGS4(t1, a1, t2, a2, t3, a3, t4, a4) \
	.types = { __SC_STR_TDECL(t1), __SC_STR_TDECL(t2), __SC_STR_TDECL(t3), \
		   __SC_STR_TDECL(t4) }, \
	.args = { #a1, #a2, #a3, #a4 }
#define __META_ARGS5(t1, a1, t2, a2, t3, a3, t4, a4, t5, a5) \
	.types = { __SC_STR_TDECL(t1), __SC_STR_TDECL(t2), __SC_STR_TDECL(t3), \
		   __SC_STR_TDECL(t4), __SC_STR_TDECL(t5) }, \
	.args = { #a1, #a2, #a3, #a4, #a5 }

#define SYSCALL_METADATA(nr, sname, n, ...)					\
	static struct trace_native_probe enter_tp_##sname, exit_tp_##sname;	\
	static struct syscall_metadata __used __section("__syscalls_metadata")	\
	__aligned(8) syscall_meta_##sname = {					\
		.name = "sys_" #sname, .syscall_nr = nr, .nb_args = n,		\
		__META_ARGS##n(__VA_ARGS__),					\
		.enter_tp = &enter_tp_##sname, .exit_tp = &exit_tp_##sname,	\
	};

SYSCALL_METADATA(__NR_read, read, 3, unsigned int, fd, char __user *, buf, size_t, count)
SYSCALL_METADATA(__NR_write, write, 3, unsigned int, fd, const char __user *, buf,
		 size_t, count)
SYSCALL_METADATA(__NR_open, open, 3, const char __user *, filename, int, flags,
		 umode_t, mode)
SYSCALL_METADATA(__NR_rt_sigaction, rt_sigaction, 4, int, sig,
		 const struct sigaction __user *, act, struct sigaction __user *, oact,
		 size_t, sigsetsize)
SYSCALL_METADATA(__NR_close, close, 1, unsigned int, fd)
SYSCALL_METADATA(__NR_stat, newstat, 2, const char __user *, filename,
		 struct stat __user *, statbuf)
SYSCALL_METADATA(__NR_lseek, lseek, 3, unsigned int, fd, off_t, offset,
		 unsigned int, whence)
SYSCALL_METADATA(__NR_pread64, pread64, 4, unsigned int, fd, char __user *, buf,
		 size_t, count, loff_t, pos)
SYSCALL_METADATA(__NR_pwrite64, pwrite64, 4, unsigned int, fd, const char __user *, buf,
		 size_t, count, loff_t, pos)
SYSCALL_METADATA(__NR_getpid, getpid, 0)
SYSCALL_METADATA(__NR_socket, socket, 3, int, family, int, type, int, protocol)
SYSCALL_METADATA(__NR_accept, accept, 3, int, fd, struct sockaddr __user *, upeer_sockaddr,
		 int __user *, upeer_addrlen)
SYSCALL_METADATA(__NR_bind, bind, 3, int, fd, struct sockaddr __user *, umyaddr,
		 int, addrlen)
SYSCALL_METADATA(__NR_listen, listen, 2, int, fd, int, backlog)
SYSCALL_METADATA(__NR_clone, clone, 5, unsigned long, clone_flags, unsigned long, newsp,
		 int __user *, parent_tidptr, int __user *, child_tidptr, unsigned long, tls)
SYSCALL_METADATA(__NR_fork, fork, 0)
SYSCALL_METADATA(__NR_execve, execve, 3, const char __user *, filename,
		 const char __user *const __user *, argv,
		 const char __user *const __user *, envp)
SYSCALL_METADATA(__NR_kill, kill, 2, pid_t, pid, int, sig)
SYSCALL_METADATA(__NR_exit, exit, 1, int, error_code)
SYSCALL_METADATA(__NR_wait4, wait4, 4, pid_t, upid, int __user *, stat_addr, int, options,
		 struct rusage __user *, ru)
SYSCALL_METADATA(__NR_uname, newuname, 1, struct new_utsname __user *, name)
SYSCALL_METADATA(__NR_getcwd, getcwd, 2, char __user *, buf, unsigned long, size)
SYSCALL_METADATA(__NR_chdir, chdir, 1, const char __user *, filename)
SYSCALL_METADATA(__NR_mkdir, mkdir, 2, const char __user *, pathname, umode_t, mode)
SYSCALL_METADATA(__NR_rmdir, rmdir, 1, const char __user *, pathname)
SYSCALL_METADATA(__NR_unlink, unlink, 1, const char __user *, pathname)
SYSCALL_METADATA(__NR_symlink, symlink, 2, const char __user *, oldname,
		 const char __user *, newname)
SYSCALL_METADATA(__NR_rename, rename, 2, const char __user *, oldname,
		 const char __user *, newname)
SYSCALL_METADATA(__NR_readlink, readlink, 3, const char __user *, path, char __user *, buf,
		 int, bufsiz)
SYSCALL_METADATA(__NR_getppid, getppid, 0)
SYSCALL_METADATA(__NR_setpriority, setpriority, 3, int, which, int, who, int, niceval)
SYSCALL_METADATA(__NR_sched_setscheduler, sched_setscheduler, 3, pid_t, pid, int, policy,
		 struct sched_param __user *, param)
SYSCALL_METADATA(__NR_prctl, prctl, 5, int, option, unsigned long, arg2, unsigned long, arg3,
		 unsigned long, arg4, unsigned long, arg5)
SYSCALL_METADATA(__NR_gettid, gettid, 0)
SYSCALL_METADATA(__NR_getdents64, getdents64, 3, unsigned int, fd,
		 struct linux_dirent64 __user *, dirent, unsigned int, count)
SYSCALL_METADATA(__NR_exit_group, exit_group, 1, int, error_code)
SYSCALL_METADATA(__NR_tgkill, tgkill, 3, pid_t, tgid, pid_t, pid, int, sig)
SYSCALL_METADATA(__NR_openat, openat, 4, int, dfd, const char __user *, filename, int, flags,
		 umode_t, mode)
SYSCALL_METADATA(__NR_openat2, openat2, 4, int, dfd, const char __user *, filename,
		 struct open_how __user *, how, size_t, usize)
SYSCALL_METADATA(__NR_mkdirat, mkdirat, 3, int, dfd, const char __user *, pathname,
		 umode_t, mode)
SYSCALL_METADATA(__NR_newfstatat, newfstatat, 4, int, dfd, const char __user *, filename,
		 struct stat __user *, statbuf, int, flag)
SYSCALL_METADATA(__NR_unlinkat, unlinkat, 3, int, dfd, const char __user *, pathname,
		 int, flag)
SYSCALL_METADATA(__NR_symlinkat, symlinkat, 3, const char __user *, oldname, int, newdfd,
		 const char __user *, newname)
SYSCALL_METADATA(__NR_renameat, renameat, 4, int, olddfd, const char __user *, oldname,
		 int, newdfd, const char __user *, newname)
SYSCALL_METADATA(__NR_readlinkat, readlinkat, 4, int, dfd, const char __user *, pathname,
		 char __user *, buf, int, bufsiz)
SYSCALL_METADATA(__NR_accept4, accept4, 4, int, fd, struct sockaddr __user *, upeer_sockaddr,
		 int __user *, upeer_addrlen, int, flags)
SYSCALL_METADATA(__NR_renameat2, renameat2, 5, int, olddfd, const char __user *, oldname,
		 int, newdfd, const char __user *, newname, unsigned int, flags)
SYSCALL_METADATA(__NR_execveat, execveat, 5, int, fd, const char __user *, filename,
		 const char __user *const __user *, argv,
		 const char __user *const __user *, envp, int, flags)
SYSCALL_METADATA(__NR_clone3, clone3, 2, struct clone_args __user *, uargs, size_t, size)

extern struct syscall_metadata __start___syscalls_metadata[], __stop___syscalls_metadata[];

struct static_key syscall_trace_key;

/* System call number -> its metadata, filled on first use (6.1 fills its
 * syscalls_metadata at boot). */
static struct syscall_metadata *syscalls_metadata[NR_syscalls];
static bool syscalls_metadata_ready;

/* The metadata of system call nr, or NULL. */
static struct syscall_metadata *syscall_nr_to_meta(long nr)
{
	struct syscall_metadata *m;

	if (unlikely(!syscalls_metadata_ready)) {
		for (m = __start___syscalls_metadata; m < __stop___syscalls_metadata; m++)
			syscalls_metadata[m->syscall_nr] = m;
		syscalls_metadata_ready = true;
	}
	if ((unsigned long)nr >= NR_syscalls)
		return NULL;
	return syscalls_metadata[nr];
}

/* struct syscall_trace_enter / _exit, after struct trace_entry. */
struct syscall_trace_enter {
	struct trace_entry ent;
	int nr;
	unsigned long args[];
};

struct syscall_trace_exit {
	struct trace_entry ent;
	int nr;
	long ret;
};

void ftrace_syscall_enter(struct pt_regs *regs, long id)
{
	struct syscall_metadata *meta = syscall_nr_to_meta(id);
	struct trace_event_buffer fbuffer;
	struct syscall_trace_enter *entry;
	unsigned long args[6];
	int i;

	if (!meta)
		return;
	entry = trace_event_buffer_reserve(&fbuffer, meta->enter_tp,
					   sizeof(*entry) + sizeof(long) * meta->nb_args);
	if (!entry)
		return;
	entry->nr = id;
	syscall_get_arguments(regs, args);
	for (i = 0; i < meta->nb_args; i++)
		entry->args[i] = args[i];
	trace_event_buffer_commit(&fbuffer);
}

void ftrace_syscall_exit(struct pt_regs *regs, long ret)
{
	struct syscall_metadata *meta = syscall_nr_to_meta(regs->orig_ax);
	struct trace_event_buffer fbuffer;
	struct syscall_trace_exit *entry;

	if (!meta)
		return;
	entry = trace_event_buffer_reserve(&fbuffer, meta->exit_tp, sizeof(*entry));
	if (!entry)
		return;
	entry->nr = regs->orig_ax;
	entry->ret = ret;
	trace_event_buffer_commit(&fbuffer);
}
