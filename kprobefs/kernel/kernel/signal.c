/* Signals, as Linux 6.1's kernel/signal.c has them, for a kernel whose tasks run no user
 * code: kill(), tgkill() and rt_sigaction(); a signal is generated (signal_generate)
 * into the target's pending set, and taken on the way back to user mode
 * (exit_to_user_mode, signal_deliver): ignored, "handled" (there is no user handler to
 * run: delivering it is all that happens), or its default action -- a fatal signal
 * ends the task with it as the wait status.  Only the legacy kind: a signal already
 * pending is not queued again.  One task per thread group, and no process groups. */
#include "sched.h"
#include "trace/events/signal.h"
#include "syscalls.h"
#include "uaccess.h"

#define sig_mask(sig) (1ULL << ((sig) - 1))
#define SIG_KERNEL_IGNORE_MASK (sig_mask(SIGCONT) | sig_mask(SIGCHLD) | \
				sig_mask(SIGWINCH) | sig_mask(SIGURG))
#define SIG_KERNEL_STOP_MASK (sig_mask(SIGSTOP) | sig_mask(SIGTSTP) | \
			      sig_mask(SIGTTIN) | sig_mask(SIGTTOU))
#define SIG_KERNEL_ONLY_MASK (sig_mask(SIGKILL) | sig_mask(SIGSTOP))
#define SIGRTMIN 32

static bool sig_kernel_ignore(int sig)
{
	return sig < SIGRTMIN && (sig_mask(sig) & SIG_KERNEL_IGNORE_MASK);
}

static bool sig_kernel_stop(int sig)
{
	return sig < SIGRTMIN && (sig_mask(sig) & SIG_KERNEL_STOP_MASK);
}

static bool sig_kernel_only(int sig)
{
	return sig_mask(sig) & SIG_KERNEL_ONLY_MASK;
}

/* Whether t would throw sig away (6.1's sig_task_ignored; nothing is blocked here). */
static bool sig_ignored(struct task_struct *t, int sig, bool force)
{
	unsigned long handler = t->sig_action[sig - 1].sa.sa_handler;

	/* Kernel threads and init take only what they handle (SIGNAL_UNKILLABLE). */
	if (((t->flags & PF_KTHREAD) || t->pid == 1) && handler == SIG_DFL &&
	    !(force && sig_kernel_only(sig)))
		return true;
	return handler == SIG_IGN || (handler == SIG_DFL && sig_kernel_ignore(sig));
}

/* Makes sig pending for t and wakes it; returns what signal_generate reports. */
static noinline int __send_signal(int sig, struct kernel_siginfo *info,
				  struct task_struct *t, bool group)
{
	struct sigpending *pending = &t->pending;
	struct kernel_siginfo *q;
	int result = TRACE_SIGNAL_IGNORED;

	if (t->exit_state || (t->flags & PF_EXITING) ||
	    sig_ignored(t, sig, info == SEND_SIG_PRIV))
		goto out;
	result = TRACE_SIGNAL_ALREADY_PENDING;
	if (pending->signal & sig_mask(sig))
		goto out;
	result = TRACE_SIGNAL_DELIVERED;
	q = &pending->info[sig - 1];
	q->si_signo = sig;
	if (info == SEND_SIG_NOINFO) {
		q->si_errno = 0;
		q->si_code = SI_USER;
		q->si_pid = current->tgid;
	} else if (info == SEND_SIG_PRIV) {
		q->si_errno = 0;
		q->si_code = SI_KERNEL;
		q->si_pid = 0;
	} else {
		*q = *info;
	}
	pending->signal |= sig_mask(sig);
	if (t->__state == TASK_INTERRUPTIBLE)
		wake_up_process(t);
out:
	trace_signal_generate(sig, info, t, group, result);
	return 0;
}

int send_signal_info(int sig, struct kernel_siginfo *info, struct task_struct *t,
		     bool group)
{
	return __send_signal(sig, info, t, group);
}

/* An exec: handled signals go back to their default action; ignored stay ignored. */
void flush_signal_handlers(struct task_struct *t)
{
	int i;

	for (i = 0; i < _NSIG; i++) {
		struct k_sigaction *ka = &t->sig_action[i];

		if (ka->sa.sa_handler != SIG_IGN)
			ka->sa.sa_handler = SIG_DFL;
		ka->sa.sa_flags = 0;
		ka->sa.sa_restorer = 0;
		ka->sa.sa_mask = 0;
	}
}

static bool valid_signal(int sig)
{
	return sig >= 0 && sig <= _NSIG;
}

/* The target is looked up before the signal is checked, as 6.1 does: a bad signal
 * to no one is ESRCH. */
static int kill_task_info(int sig, struct kernel_siginfo *info, pid_t pid, bool group)
{
	struct task_struct *t = find_task_by_vpid(pid);

	if (!t || t->exit_state)
		return -ESRCH;
	if (!valid_signal(sig))
		return -EINVAL;
	/* Everyone runs as root: every sender may signal every task. */
	if (!sig)
		return 0;
	return __send_signal(sig, info, t, group);
}

/* kill(-1, sig): every task but init and the caller; ESRCH when there is none. */
static int kill_all(int sig, struct kernel_siginfo *info)
{
	struct task_struct *p, *victims[64];
	int n = 0, i;

	_raw_spin_lock(&tasklist_lock);
	list_for_each_entry(p, &task_list_head, tasks) {
		if (p->pid > 1 && p != current && !(p->flags & PF_KTHREAD) &&
		    !p->exit_state && n < (int)ARRAY_SIZE(victims))
			victims[n++] = p;
	}
	_raw_spin_unlock(&tasklist_lock);
	if (!n)
		return -ESRCH;
	if (!valid_signal(sig))
		return -EINVAL;
	for (i = 0; sig && i < n; i++)
		__send_signal(sig, info, victims[i], true);
	return 0;
}

SYSCALL_DECL(kill)
{
	pid_t pid = (pid_t)regs->di;
	int sig = (int)regs->si;
	struct kernel_siginfo info = {
		.si_signo = sig, .si_errno = 0, .si_code = SI_USER, .si_pid = current->tgid,
	};

	if (pid > 0)
		return kill_task_info(sig, &info, pid, true);
	if (pid == -1)
		return kill_all(sig, &info);
	/* 0 and -pgrp: the caller's process group; each task here is its own group. */
	if (pid == 0 || -pid == current->tgid)
		return kill_task_info(sig, &info, current->pid, true);
	return -ESRCH;
}

SYSCALL_DECL(tgkill)
{
	pid_t tgid = (pid_t)regs->di, pid = (pid_t)regs->si;
	int sig = (int)regs->dx;
	struct kernel_siginfo info = {
		.si_signo = sig, .si_errno = 0, .si_code = SI_TKILL, .si_pid = current->tgid,
	};
	struct task_struct *t;

	if (pid <= 0 || tgid <= 0)
		return -EINVAL;
	t = find_task_by_vpid(pid);
	if (!t || t->tgid != tgid)
		return -ESRCH;
	return kill_task_info(sig, &info, pid, false);
}

SYSCALL_DECL(rt_sigaction)
{
	int sig = (int)regs->di;
	const struct sigaction __user *act = (const void __user *)regs->si;
	struct sigaction __user *oact = (void __user *)regs->dx;
	struct k_sigaction *k, new_ka;

	if (regs->r10 != sizeof(u64))
		return -EINVAL;
	if (sig < 1 || sig > _NSIG || (act && sig_kernel_only(sig)))
		return -EINVAL;
	if (act && copy_from_user(&new_ka.sa, act, sizeof(new_ka.sa)))
		return -EFAULT;
	k = &current->sig_action[sig - 1];
	if (oact && copy_to_user(oact, &k->sa, sizeof(k->sa)))
		return -EFAULT;
	if (act) {
		new_ka.sa.sa_mask &= ~(sig_mask(SIGKILL) | sig_mask(SIGSTOP));
		*k = new_ka;
		/* Now ignored: a pending one goes (6.1's sigaction discards it). */
		if (sig_ignored(current, sig, false))
			current->pending.signal &= ~sig_mask(sig);
	}
	return 0;
}

/* The lowest pending signal, SIGKILL first; 0 when none. */
static int next_signal(struct sigpending *pending)
{
	if (pending->signal & sig_mask(SIGKILL))
		return SIGKILL;
	return pending->signal ? __builtin_ctzll(pending->signal) + 1 : 0;
}

/* For the host: the process that task pid mirrors died of a signal, whose sender it
 * cannot know (a kill(2) on the host makes no process event).  The task follows it
 * on its way back to user mode, without running another call: it exits with status
 * (the signal, and 0x80 for a core dump), and its parent hears CLD_KILLED or
 * CLD_DUMPED.  No signal is generated or delivered here: that part was the host's. */
long host_task_killed(pid_t pid, int status)
{
	struct task_struct *t = find_task_by_vpid(pid);

	if (!t || t->exit_state || !(status & 0x7f))
		return !t || t->exit_state ? -ESRCH : -EINVAL;
	t->pending.host_exit = status & 0xff;
	if (t->__state == TASK_INTERRUPTIBLE)
		wake_up_process(t);
	return 0;
}

/* Takes every pending signal (6.1's get_signal): a fatal one ends the task. */
static noinline void get_signal(void)
{
	struct task_struct *t = current;
	int sig;

	if (host_exit_pending(&t->pending))
		do_exit(t->pending.host_exit);
	while ((sig = next_signal(&t->pending))) {
		struct k_sigaction *ka = &t->sig_action[sig - 1];
		struct kernel_siginfo info = t->pending.info[sig - 1];

		t->pending.signal &= ~sig_mask(sig);
		trace_signal_deliver(sig, &info, ka);
		if (ka->sa.sa_handler == SIG_IGN)
			continue;
		if (ka->sa.sa_handler != SIG_DFL) {
			/* The handler would run now; there is no user code to run it in. */
			if (ka->sa.sa_flags & SA_RESETHAND)
				ka->sa.sa_handler = SIG_DFL;
			continue;
		}
		if (sig_kernel_ignore(sig) || sig_kernel_stop(sig))
			continue;	/* no job control here: a stop is not taken */
		do_exit(sig);
	}
}

/* On the way back to user mode: deliver what is pending. */
void exit_to_user_mode(void)
{
	if (unlikely(current->pending.signal || host_exit_pending(&current->pending)))
		get_signal();
}
