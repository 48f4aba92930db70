/* PID allocation and lookup: a hash of live pids.  Pids the kernel picks itself start at
 * pid_auto_base (set by the host at boot) so they never clash with host pids that come
 * in through clone3()'s set_tid. */
#include "sched.h"

#define PIDHASH_BITS 8
#define PIDHASH_SIZE (1 << PIDHASH_BITS)

static struct list_head pid_hash[PIDHASH_SIZE];
static DEFINE_SPINLOCK(pidmap_lock);
pid_t pid_auto_base = 300;
static pid_t last_pid;

static inline unsigned int pid_hashfn(pid_t nr)
{
	return jhash(&nr, sizeof(nr), 0) & (PIDHASH_SIZE - 1);
}

void pidhash_init(void)
{
	int i;

	for (i = 0; i < PIDHASH_SIZE; i++)
		INIT_LIST_HEAD(&pid_hash[i]);
}

static struct task_struct *__find_task(pid_t nr)
{
	struct task_struct *t;

	list_for_each_entry(t, &pid_hash[pid_hashfn(nr)], pid_chain)
		if (t->pid == nr)
			return t;
	return NULL;
}

struct task_struct *find_task_by_vpid(pid_t nr)
{
	struct task_struct *t;

	spin_lock(&pidmap_lock);
	t = __find_task(nr);
	spin_unlock(&pidmap_lock);
	return t;
}

/* Returns the pid given to tsk, or -EEXIST / -EINVAL / -EAGAIN. */
pid_t alloc_pid(struct task_struct *tsk, pid_t *set_tid, size_t set_tid_size)
{
	pid_t nr;

	spin_lock(&pidmap_lock);
	if (set_tid_size) {
		nr = set_tid[0];
		if (nr <= 0 || nr >= PID_MAX) {
			nr = -EINVAL;
			goto out;
		}
		if (__find_task(nr)) {
			nr = -EEXIST;
			goto out;
		}
	} else {
		int tries = PID_MAX;

		if (last_pid < pid_auto_base)
			last_pid = pid_auto_base - 1;
		do {
			nr = ++last_pid;
			if (nr >= PID_MAX)
				nr = last_pid = pid_auto_base;
		} while (__find_task(nr) && --tries);
		if (!tries) {
			nr = -EAGAIN;
			goto out;
		}
	}
	tsk->pid = nr;
	list_add(&tsk->pid_chain, &pid_hash[pid_hashfn(nr)]);
out:
	spin_unlock(&pidmap_lock);
	return nr;
}

void free_pid(struct task_struct *tsk)
{
	spin_lock(&pidmap_lock);
	if (!list_empty(&tsk->pid_chain))
		list_del_init(&tsk->pid_chain);
	spin_unlock(&pidmap_lock);
}

/* Register a task the kernel built by hand (init_task, the idle tasks). */
void attach_pid(struct task_struct *tsk)
{
	spin_lock(&pidmap_lock);
	INIT_LIST_HEAD(&tsk->pid_chain);
	list_add(&tsk->pid_chain, &pid_hash[pid_hashfn(tsk->pid)]);
	spin_unlock(&pidmap_lock);
}
