/* What this kernel has of signals: a child's exit signal sent to its parent.  No task
 * installs a handler, so every signal has its default action (SIG_DFL). */
#ifndef _SIGNAL_H
#define _SIGNAL_H
#include "kernel.h"

#define SIGKILL		9
#define SIGCHLD		17
#define _NSIG		64
#define valid_signal(sig) ((unsigned long)(sig) <= _NSIG)

/* si_code of SIGCHLD */
#define CLD_EXITED	1
#define CLD_KILLED	2
#define CLD_DUMPED	3

/* __send_signal_locked's outcome, as the signal_generate event reports it */
enum {
	TRACE_SIGNAL_DELIVERED,
	TRACE_SIGNAL_IGNORED,
	TRACE_SIGNAL_ALREADY_PENDING,
	TRACE_SIGNAL_OVERFLOW_FAIL,
	TRACE_SIGNAL_LOSE_INFO,
};

struct kernel_siginfo {
	int si_signo;
	int si_errno;
	int si_code;
	pid_t si_pid;
	int si_status;
};

struct task_struct;
bool do_notify_parent(struct task_struct *tsk, int sig);
#endif
