/* Task priorities: nice values and scheduling policies (Linux's set_user_nice() and
 * sched_setscheduler(), with the setpriority and sched_setscheduler system calls).
 *
 * The run queues are FIFO, so a priority changes what the sched events report (prio =
 * 120 + nice for the fair policies, 99 - rt_priority for SCHED_FIFO and SCHED_RR), not
 * the order tasks run in.  There is no priority inheritance: prio is normal_prio.  The
 * daemon runs as root, so no capability is checked. */
#include "sched.h"
#include "syscalls.h"
#include "uaccess.h"

#define MIN_NICE (-20)
#define MAX_NICE 19
#define MAX_RT_PRIO_USER (MAX_RT_PRIO - 1)
#define PRIO_PROCESS 0
#define PRIO_PGRP 1
#define PRIO_USER 2

struct sched_param {
	int sched_priority;
};

static int rt_policy(int policy)
{
	return policy == SCHED_FIFO || policy == SCHED_RR;
}

static int normal_prio(struct task_struct *p)
{
	return rt_policy(p->policy) ? MAX_RT_PRIO - 1 - (int)p->rt_priority : p->static_prio;
}

void set_user_nice(struct task_struct *p, long nice)
{
	if (nice < MIN_NICE || nice > MAX_NICE || p->static_prio == NICE_TO_PRIO(nice))
		return;
	p->static_prio = NICE_TO_PRIO(nice);
	/* An RT task keeps its RT priority; its nice counts once it is fair again. */
	p->normal_prio = normal_prio(p);
	p->prio = p->normal_prio;
}

/* policy and rt_priority already checked; the nice value is kept. */
int sched_setscheduler_nocheck(struct task_struct *p, int policy, int rt_priority)
{
	p->policy = policy;
	p->rt_priority = rt_priority;
	p->normal_prio = normal_prio(p);
	p->prio = p->normal_prio;
	return 0;
}

static struct task_struct *find_process_by_pid(pid_t pid)
{
	return pid ? find_task_by_vpid(pid) : current;
}

/* Only PRIO_PROCESS names tasks here: a process group or user is the caller alone. */
SYSCALL_DECL(setpriority)
{
	int which = (int)regs->di, who = (int)regs->si;
	long niceval = (int)regs->dx;
	struct task_struct *p;

	if (which < PRIO_PROCESS || which > PRIO_USER)
		return -EINVAL;
	if (niceval < MIN_NICE)
		niceval = MIN_NICE;
	if (niceval > MAX_NICE)
		niceval = MAX_NICE;
	p = which == PRIO_PROCESS ? find_process_by_pid(who) : who ? NULL : current;
	if (!p)
		return -ESRCH;
	set_user_nice(p, niceval);
	return 0;
}

SYSCALL_DECL(sched_setscheduler)
{
	pid_t pid = (pid_t)regs->di;
	int policy = (int)regs->si;
	struct sched_param param;
	struct task_struct *p;

	if (!regs->dx || pid < 0)
		return -EINVAL;
	if (copy_from_user(&param, (const void __user *)regs->dx, sizeof(param)))
		return -EFAULT;
	if (policy != SCHED_NORMAL && policy != SCHED_BATCH && policy != SCHED_IDLE &&
	    !rt_policy(policy))
		return -EINVAL;
	if (rt_policy(policy) ? param.sched_priority < 1 ||
				param.sched_priority > MAX_RT_PRIO_USER : param.sched_priority)
		return -EINVAL;
	p = find_process_by_pid(pid);
	if (!p)
		return -ESRCH;
	return sched_setscheduler_nocheck(p, policy, param.sched_priority);
}
