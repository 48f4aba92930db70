/* raw_syscalls: every system call's entry and exit, with 6.1's fields and formats. */
#if !defined(_TRACE_RAW_SYSCALLS_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_RAW_SYSCALLS_H
#include "tracepoint.h"
#include <sched.h>	/* the kernel's include/sched.h */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM raw_syscalls

#ifndef _TRACE_SYSCALL_ARGS
#define _TRACE_SYSCALL_ARGS
/* x86_64's syscall_get_arguments: di, si, dx, r10, r8, r9. */
static __always_inline void syscall_get_arguments(const struct pt_regs *regs,
						  unsigned long *args)
{
	args[0] = regs->di;
	args[1] = regs->si;
	args[2] = regs->dx;
	args[3] = regs->r10;
	args[4] = regs->r8;
	args[5] = regs->r9;
}
#endif

TRACE_EVENT(sys_enter,

	TP_PROTO(struct pt_regs *regs, long id),

	TP_ARGS(regs, id),

	TP_STRUCT__entry(
		__field(long, id)
		__array(unsigned long, args, 6)
	),

	TP_fast_assign(
		__entry->id = id;
		syscall_get_arguments(regs, __entry->args);
	),

	TP_printk("NR %ld (%lx, %lx, %lx, %lx, %lx, %lx)",
		  __entry->id,
		  __entry->args[0], __entry->args[1], __entry->args[2],
		  __entry->args[3], __entry->args[4], __entry->args[5])
);

TRACE_EVENT(sys_exit,

	TP_PROTO(struct pt_regs *regs, long ret),

	TP_ARGS(regs, ret),

	TP_STRUCT__entry(
		__field(long, id)
		__field(long, ret)
	),

	TP_fast_assign(
		__entry->id = regs->orig_ax;
		__entry->ret = ret;
	),

	TP_printk("NR %ld = %ld", __entry->id, __entry->ret)
);
#endif
