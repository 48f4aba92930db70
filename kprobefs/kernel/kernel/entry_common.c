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

/* A fresh user task (its fork returns 0 here) and every task between system calls. */
void __noreturn user_mode_loop(void)
{
	long ret = 0;

	for (;;) {
		struct pt_regs *regs = task_pt_regs(current);

		set_current_state(TASK_INTERRUPTIBLE);
		/* Non-zero: the host already put the next call in regs; no need to sleep. */
		if (hypercall(HC_SYSCALL_DONE, ret, current->pid, regs, 0))
			set_current_state(TASK_RUNNING);
		else
			schedule();
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
