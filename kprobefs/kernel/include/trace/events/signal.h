/* The signal events, with Linux 6.1's fields and print formats. */
#if !defined(_TRACE_SIGNAL_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_SIGNAL_H
#include "tracepoint.h"
#include <sched.h>
#include <signal.h>

#undef TRACE_SYSTEM
#define TRACE_SYSTEM signal

/* A signal sent to task: result is what became of it (TRACE_SIGNAL_*), group whether it
 * went to the thread group. */
TRACE_EVENT(signal_generate,

	TP_PROTO(int sig, struct kernel_siginfo *info, struct task_struct *task,
		 int group, int result),

	TP_ARGS(sig, info, task, group, result),

	TP_STRUCT__entry(
		__field(int, sig)
		__field(int, errno)
		__field(int, code)
		__array(char, comm, TASK_COMM_LEN)
		__field(pid_t, pid)
		__field(int, group)
		__field(int, result)
	),

	TP_fast_assign(
		__entry->sig = sig;
		__entry->errno = info->si_errno;
		__entry->code = info->si_code;
		memcpy(__entry->comm, task->comm, TASK_COMM_LEN);
		__entry->pid = task->pid;
		__entry->group = group;
		__entry->result = result;
	),

	TP_printk("sig=%d errno=%d code=%d comm=%s pid=%d grp=%d res=%d",
		  __entry->sig, __entry->errno, __entry->code,
		  __entry->comm, __entry->pid, __entry->group,
		  __entry->result)
);

#endif
