/* System call dispatch and the user-mode loop.  A task in "user mode" sleeps here until
 * the host hands it a system call in its pt_regs (orig_ax = number, di/si/dx/r10/r8/r9 =
 * arguments) and wakes it; the result goes back through HC_SYSCALL_DONE. */
#include "sched.h"
#include "syscalls.h"
#include "trace/events/syscalls.h"
#include "trace/syscalls.h"

#define __SYSCALL(nr, sym) extern long __x64_##sym(const struct pt_regs *);
#include "syscall_table.h"
#undef __SYSCALL

/* kernel/sys_ni.c: a system call that is not implemented */
long sys_ni_syscall(void)
{
	return -ENOSYS;
}

static long __x64_sys_ni_syscall(const struct pt_regs *regs)
{
	return sys_ni_syscall();
}

#define __SYSCALL(nr, sym) [nr] = __x64_##sym,
const sys_call_ptr_t sys_call_table[NR_syscalls] = {
	[0 ... NR_syscalls - 1] = __x64_sys_ni_syscall,
#include "syscall_table.h"
};
#undef __SYSCALL

long do_syscall_64(struct pt_regs *regs, int nr)
{
	current->syscall_nr = nr;
	trace_sys_enter(regs, nr);
	if (static_branch_unlikely(&syscall_trace_key))
		ftrace_syscall_enter(regs, nr);
	if (likely((unsigned int)nr < NR_syscalls))
		regs->ax = sys_call_table[nr](regs);
	else
		regs->ax = -ENOSYS;
	trace_sys_exit(regs, regs->ax);
	if (static_branch_unlikely(&syscall_trace_key))
		ftrace_syscall_exit(regs, regs->ax);
	current->syscall_nr = -1;
	return regs->ax;
}

/* A fresh user task (its fork returns 0 here) and every task between system calls.
 *
 * The task sleeps here while its host process runs on the host or waits there.  The
 * host wakes it for a system call (orig_ax = its number), or with orig_ax = -1 and no
 * call when it mirrors the host process's own scheduling: the process was woken and
 * ran on the host, and has blocked again, interruptibly or not (di = the state it
 * sleeps in, TASK_INTERRUPTIBLE or TASK_UNINTERRUPTIBLE). */
void __noreturn user_mode_loop(void)
{
	long ret = 0;
	bool done = true;	/* a call has completed: ret is its result */
	unsigned int sleep_state = TASK_INTERRUPTIBLE;

	for (;;) {
		struct pt_regs *regs = task_pt_regs(current);

		exit_to_user_mode();
		/* The host writes orig_ax with the next call: still -1 after a wakeup means
		 * a signal woke the task, not a call.  (Only after a call: after a signal's
		 * wakeup the host may have loaded the next call meanwhile.) */
		if (done)
			regs->orig_ax = -1;
		set_current_state(sleep_state);
		/* Non-zero: the host already put the next call in regs; no need to sleep.
		 * done == false: no call completed, the host's call in flight is not this. */
		if (hypercall(HC_SYSCALL_DONE, ret, current->pid, regs, !done))
			set_current_state(TASK_RUNNING);
		else
			schedule();
		sleep_state = TASK_INTERRUPTIBLE;
		done = (long)regs->orig_ax != -1;
		if (!done)
			continue;
		/* HOST_RUN: the host process ran (kprobefs/fs/schedwatch.py), no call; the
		 * task sleeps again in the state di names. */
		if ((long)regs->orig_ax == HOST_RUN) {
			if (regs->di == TASK_UNINTERRUPTIBLE)
				sleep_state = TASK_UNINTERRUPTIBLE;
			ret = 0;
			continue;
		}
		/* A task whose host process is dead runs no more calls (they fail). */
		if (!host_exit_pending(&current->pending))
			ret = do_syscall_64(regs, (int)regs->orig_ax);
	}
}

/* The host asked this idle CPU to call a kernel function (IDLE_UPCALL). */
void run_upcall(struct pcpu *cpu)
{
	struct upcall_slot *s = &cpu->upcall;
	long (*fn)(long, long, long, long, long, long) = (void *)s->fn;

	s->ret = fn(s->args[0], s->args[1], s->args[2], s->args[3], s->args[4], s->args[5]);
	hypercall(HC_UPCALL_DONE, s->ret, 0, 0, 0);
}
