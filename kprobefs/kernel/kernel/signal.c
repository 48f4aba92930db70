/* Signals, as far as this kernel has them: do_notify_parent() sends a dead child's exit
 * signal to its parent.  No task installs a handler, so the signal meets its default
 * action; for SIGCHLD that is to ignore it (sig_kernel_ignore), and the parent reaps the
 * child with wait4() as before. */
#include "sched.h"
#include "signal.h"
#include "trace/events/signal.h"

/* SIGCHLD, SIGCONT, SIGURG, SIGWINCH: ignored by default */
static bool sig_kernel_ignore(int sig)
{
	return sig == SIGCHLD || sig == 18 || sig == 23 || sig == 28;
}

static noinline int __send_signal_locked(int sig, struct kernel_siginfo *info,
					 struct task_struct *t, int group)
{
	int result = TRACE_SIGNAL_IGNORED;

	if (!sig_kernel_ignore(sig))
		result = TRACE_SIGNAL_DELIVERED;	/* pending; nothing acts on it yet */
	trace_signal_generate(sig, info, t, group, result);
	return 0;
}

/* Tell tsk's parent that tsk died; returns whether the child reaps itself (never
 * here: SIGCHLD is not SIG_IGN and no SA_NOCLDWAIT). */
bool do_notify_parent(struct task_struct *tsk, int sig)
{
	struct kernel_siginfo info = {
		.si_signo = sig,
		.si_pid = tsk->tgid,
	};
	int status = tsk->exit_code;

	if (status & 0x80)
		info.si_code = CLD_DUMPED;
	else if (status & 0x7f)
		info.si_code = CLD_KILLED;
	else
		info.si_code = CLD_EXITED;
	info.si_status = info.si_code == CLD_EXITED ? status >> 8 : status & 0x7f;
	if (valid_signal(sig) && sig && tsk->real_parent)
		__send_signal_locked(sig, &info, tsk->real_parent, 1);
	return false;
}
