/* The syscalls events: sys_enter_NAME and sys_exit_NAME for every system call, from
 * each call's metadata (its name and its arguments' types and names, as 6.1's
 * SYSCALL_DEFINEn records them).  kernel/trace_syscalls.c records them from the
 * system call path when the host enabled syscall_trace_key; the host reads
 * __syscalls_metadata and builds the events' fields and print formats from it, as
 * 6.1's trace_syscalls.c does at boot. */
#ifndef _KPF_TRACE_SYSCALLS_H
#define _KPF_TRACE_SYSCALLS_H
#include "tracepoint.h"
#include <sched.h>	/* the kernel's include/sched.h: struct pt_regs */

struct syscall_metadata {
	const char *name;		/* "sys_openat" */
	int syscall_nr;
	int nb_args;
	const char *types[6];
	const char *args[6];
	struct trace_native_probe *enter_tp;	/* sys_enter_NAME's state */
	struct trace_native_probe *exit_tp;	/* sys_exit_NAME's */
};

extern struct static_key syscall_trace_key;	/* some syscalls event is enabled */
void ftrace_syscall_enter(struct pt_regs *regs, long id);
void ftrace_syscall_exit(struct pt_regs *regs, long ret);
#endif
