/* The sched events, with Linux 6.1's fields and print formats. */
#if !defined(_TRACE_SCHED_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_SCHED_H
#include "tracepoint.h"
#include <sched.h>	/* the kernel's include/sched.h, not this file */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM sched

TRACE_EVENT(sched_process_fork,

	TP_PROTO(struct task_struct *parent, struct task_struct *child),

	TP_ARGS(parent, child),

	TP_STRUCT__entry(
		__array(char, parent_comm, TASK_COMM_LEN)
		__field(pid_t, parent_pid)
		__array(char, child_comm, TASK_COMM_LEN)
		__field(pid_t, child_pid)
	),

	TP_fast_assign(
		memcpy(__entry->parent_comm, parent->comm, TASK_COMM_LEN);
		__entry->parent_pid = parent->pid;
		memcpy(__entry->child_comm, child->comm, TASK_COMM_LEN);
		__entry->child_pid = child->pid;
	),

	TP_printk("comm=%s pid=%d child_comm=%s child_pid=%d",
		  __entry->parent_comm, __entry->parent_pid,
		  __entry->child_comm, __entry->child_pid)
);

/* A task woken (waking: in the waker's context; wakeup_new: a new task). */
DECLARE_EVENT_CLASS(sched_wakeup_template,

	TP_PROTO(struct task_struct *p),

	TP_ARGS(p),

	TP_STRUCT__entry(
		__array(char, comm, TASK_COMM_LEN)
		__field(pid_t, pid)
		__field(int, prio)
		__field(int, target_cpu)
	),

	TP_fast_assign(
		memcpy(__entry->comm, p->comm, TASK_COMM_LEN);
		__entry->pid = p->pid;
		__entry->prio = p->prio;
		__entry->target_cpu = p->cpu;
	),

	TP_printk("comm=%s pid=%d prio=%d target_cpu=%03d",
		  __entry->comm, __entry->pid, __entry->prio, __entry->target_cpu)
);

DEFINE_EVENT(sched_wakeup_template, sched_waking,
	     TP_PROTO(struct task_struct *p), TP_ARGS(p));
DEFINE_EVENT(sched_wakeup_template, sched_wakeup,
	     TP_PROTO(struct task_struct *p), TP_ARGS(p));
DEFINE_EVENT(sched_wakeup_template, sched_wakeup_new,
	     TP_PROTO(struct task_struct *p), TP_ARGS(p));

/* prev_state as 6.1 reports it: one bit, the highest of the task's state and exit
 * state within TASK_REPORT (TASK_REPORT_IDLE for an idle sleep), or TASK_REPORT_MAX for
 * a preempted task.  The constants are spelled as 6.1's print fmt shows them. */
#ifndef _TRACE_SCHED_REPORT
#define _TRACE_SCHED_REPORT
#define TASK_REPORT (0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | \
		     0x00000010 | 0x00000020 | 0x00000040)
#define TASK_REPORT_IDLE (TASK_REPORT + 1)
#define TASK_REPORT_MAX (TASK_REPORT_IDLE << 1)

static __always_inline long trace_sched_switch_state(bool preempt, const struct task_struct *p)
{
	unsigned int state = (p->__state | p->exit_state) & TASK_REPORT;

	if (preempt)
		return TASK_REPORT_MAX;
	return state ? 1L << (31 - __builtin_clz(state)) : 0;
}
#endif

TRACE_EVENT(sched_switch,

	TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next),

	TP_ARGS(preempt, prev, next),

	TP_STRUCT__entry(
		__array(char, prev_comm, TASK_COMM_LEN)
		__field(pid_t, prev_pid)
		__field(int, prev_prio)
		__field(long, prev_state)
		__array(char, next_comm, TASK_COMM_LEN)
		__field(pid_t, next_pid)
		__field(int, next_prio)
	),

	TP_fast_assign(
		memcpy(__entry->next_comm, next->comm, TASK_COMM_LEN);
		__entry->prev_pid = prev->pid;
		__entry->prev_prio = prev->prio;
		__entry->prev_state = trace_sched_switch_state(preempt, prev);
		memcpy(__entry->prev_comm, prev->comm, TASK_COMM_LEN);
		__entry->next_pid = next->pid;
		__entry->next_prio = next->prio;
	),

	TP_printk("prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d next_prio=%d",
		__entry->prev_comm, __entry->prev_pid, __entry->prev_prio,
		(__entry->prev_state & (TASK_REPORT_MAX - 1)) ?
		  __print_flags(__entry->prev_state & (TASK_REPORT_MAX - 1), "|",
				{ 0x00000001, "S" }, { 0x00000002, "D" },
				{ 0x00000004, "T" }, { 0x00000008, "t" },
				{ 0x00000010, "X" }, { 0x00000020, "Z" },
				{ 0x00000040, "P" }, { 0x00000080, "I" }) :
		  "R",
		__entry->prev_state & TASK_REPORT_MAX ? "+" : "",
		__entry->next_comm, __entry->next_pid, __entry->next_prio)
);

DECLARE_EVENT_CLASS(sched_process_template,

	TP_PROTO(struct task_struct *p),

	TP_ARGS(p),

	TP_STRUCT__entry(
		__array(char, comm, TASK_COMM_LEN)
		__field(pid_t, pid)
		__field(int, prio)
	),

	TP_fast_assign(
		memcpy(__entry->comm, p->comm, TASK_COMM_LEN);
		__entry->pid = p->pid;
		__entry->prio = p->prio;
	),

	TP_printk("comm=%s pid=%d prio=%d", __entry->comm, __entry->pid, __entry->prio)
);

DEFINE_EVENT(sched_process_template, sched_process_free,
	     TP_PROTO(struct task_struct *p), TP_ARGS(p));
DEFINE_EVENT(sched_process_template, sched_process_exit,
	     TP_PROTO(struct task_struct *p), TP_ARGS(p));

/* A task exec'd a new program (after the exec, old_pid: its pid before). */
TRACE_EVENT(sched_process_exec,

	TP_PROTO(struct task_struct *p, pid_t old_pid, const char *filename),

	TP_ARGS(p, old_pid, filename),

	TP_STRUCT__entry(
		__string(filename, filename)
		__field(pid_t, pid)
		__field(pid_t, old_pid)
	),

	TP_fast_assign(
		__assign_str(filename, filename);
		__entry->pid = p->pid;
		__entry->old_pid = old_pid;
	),

	TP_printk("filename=%s pid=%d old_pid=%d", __get_str(filename),
		  __entry->pid, __entry->old_pid)
);

TRACE_EVENT(sched_process_wait,

	TP_PROTO(pid_t pid),

	TP_ARGS(pid),

	TP_STRUCT__entry(
		__array(char, comm, TASK_COMM_LEN)
		__field(pid_t, pid)
		__field(int, prio)
	),

	TP_fast_assign(
		memcpy(__entry->comm, current->comm, TASK_COMM_LEN);
		__entry->pid = pid;
		__entry->prio = current->prio;
	),

	TP_printk("comm=%s pid=%d prio=%d", __entry->comm, __entry->pid, __entry->prio)
);
#endif
