/* Task exit and reaping: do_exit(), exit_notify(), release_task(), wait4(). */
#include "sched.h"
#include "trace/events/sched.h"
#include "trace_native.h"
#include "fs.h"
#include "syscalls.h"
#include "uaccess.h"

#define WNOHANG 0x00000001

static void exit_mm(struct task_struct *tsk)
{
	struct mm_struct *mm = tsk->mm;

	if (!mm)
		return;
	tsk->mm = NULL;
	if (atomic_dec_and_test(&mm->users))
		kfree(mm);
}

/* Sends the parent sig (its exit_signal) for tsk's death, unless the parent ignores
 * SIGCHLD outright (6.1's do_notify_parent; there is no autoreap here). */
static void do_notify_parent(struct task_struct *tsk, int sig)
{
	struct task_struct *parent = tsk->real_parent;
	struct kernel_siginfo info = {
		.si_signo = sig,
		.si_errno = 0,
		.si_code = (tsk->exit_code & 0x80) ? CLD_DUMPED :
			   (tsk->exit_code & 0x7f) ? CLD_KILLED : CLD_EXITED,
		.si_pid = tsk->tgid,
	};

	if (!parent || sig <= 0 || sig > _NSIG)
		return;
	if (sig == SIGCHLD && parent->sig_action[SIGCHLD - 1].sa.sa_handler == SIG_IGN)
		return;
	send_signal_info(sig, &info, parent, true);
}

/* Hand tsk's children to init, then tell the parent.  An autoreaped task (one the host
 * made for a host process: its parent waits for it on the host, never here) goes
 * EXIT_DEAD, out of wait4's sight, and is released once off its CPU
 * (finish_task_switch), as 6.1's exit_notify releases an autoreaped task. */
static noinline void exit_notify(struct task_struct *tsk, bool autoreap)
{
	struct task_struct *child, *n;
	struct task_struct *reaper = find_task_by_vpid(1);

	_raw_spin_lock(&tasklist_lock);
	list_for_each_entry_safe(child, n, &tsk->children, sibling) {
		list_del_init(&child->sibling);
		if (reaper && reaper != tsk) {
			child->real_parent = reaper;
			list_add_tail(&child->sibling, &reaper->children);
		} else {
			child->real_parent = NULL;
		}
	}
	tsk->exit_state = autoreap ? EXIT_DEAD : EXIT_ZOMBIE;
	_raw_spin_unlock(&tasklist_lock);
	do_notify_parent(tsk, tsk->exit_signal);
	/* The parent is woken from finish_task_switch(), once this task is off its CPU. */
}

void __noreturn do_exit(long code)
{
	struct task_struct *tsk = current;
	bool autoreap;

	tsk->flags |= PF_EXITING;
	tsk->exit_code = (int)code;
	/* The host answers 1 for a task of a host process (reaped on the host). */
	autoreap = hypercall(HC_TASK_EXIT, tsk->pid, code, 0, 0) == 1;
	exit_mm(tsk);
	trace_sched_process_exit(tsk);
	exit_files(tsk);
	exit_fs(tsk);
	exit_notify(tsk, autoreap);
	set_current_state(TASK_DEAD);
	schedule();
	panic("do_exit: dead task %d scheduled again", tsk->pid);
}

void __noreturn make_task_dead(int signr)
{
	current->oops = 1;
	mutex_release_held(current);
	do_exit(signr);
}

noinline void release_task(struct task_struct *p)
{
	_raw_spin_lock(&tasklist_lock);
	list_del_init(&p->sibling);
	list_del_init(&p->tasks);
	nr_threads--;
	_raw_spin_unlock(&tasklist_lock);
	free_pid(p);
	p->exit_state = EXIT_DEAD;
	trace_sched_process_free(p);
	/* After the free, as 6.1's pid-list probe on sched_process_free: a dying task's
	 * last events (its SIGCHLD to the parent) are still filtered by its pid. */
	trace_event_pid_exit(p);
	hypercall(HC_TASK_FREE, p->pid, 0, 0, 0);	/* the host's pid lists, likewise */
	trace_native_task_free(p);
	kretprobe_native_task_free(p);
	put_task_stack(p);
	kfree(p);
}

static noinline int wait_task_zombie(struct task_struct *p, int __user *stat_addr)
{
	pid_t pid = p->pid;
	int status = p->exit_code;
	if (stat_addr && put_user(status, stat_addr))
		return -EFAULT;
	release_task(p);
	return pid;
}

pid_t kernel_wait4(pid_t upid, int __user *stat_addr, int options)
{
	struct task_struct *tsk = current, *p;

	trace_sched_process_wait(upid > 0 ? upid : 0);
	for (;;) {
		bool any = false;
		DEFINE_WAIT(wait);

		prepare_to_wait(&tsk->wait_chldexit, &wait);
		_raw_spin_lock(&tasklist_lock);
		list_for_each_entry(p, &tsk->children, sibling) {
			if ((upid > 0 && p->pid != upid) || p->exit_state == EXIT_DEAD)
				continue;
			any = true;
			if (p->exit_state == EXIT_ZOMBIE && p->__state == TASK_DEAD &&
			    !p->on_cpu) {
				_raw_spin_unlock(&tasklist_lock);
				finish_wait(&tsk->wait_chldexit, &wait);
				return wait_task_zombie(p, stat_addr);
			}
		}
		_raw_spin_unlock(&tasklist_lock);
		if (!any || (options & WNOHANG)) {
			finish_wait(&tsk->wait_chldexit, &wait);
			return any ? 0 : -ECHILD;
		}
		schedule();
		finish_wait(&tsk->wait_chldexit, &wait);
	}
}

SYSCALL_DECL(exit)
{
	do_exit((regs->di & 0xff) << 8);
}

SYSCALL_DECL(exit_group)
{
	do_exit((regs->di & 0xff) << 8);
}

SYSCALL_DECL(wait4)
{
	return kernel_wait4((pid_t)regs->di, (int __user *)regs->si, (int)regs->dx);
}
