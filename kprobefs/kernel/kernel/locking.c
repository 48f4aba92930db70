/* The out-of-line lock API (kernel/locking/spinlock.c and mutex.c): what a module, or
 * code that must not inline a lock, calls.  The kernel's own code inlines spin_lock().
 *
 * A mutex is a sleeping lock, with 6.1's out-of-line functions.  The owner word holds the
 * owning task, and in its low bits MUTEX_FLAG_WAITERS while tasks wait.  mutex_lock() is
 * one cmpxchg when the mutex is free; only a task that finds it taken enters
 * __mutex_lock_slowpath(), queues itself on wait_list and sleeps (TASK_UNINTERRUPTIBLE,
 * through schedule()).  mutex_unlock() is one cmpxchg when nobody waits; else
 * __mutex_unlock_slowpath() hands the mutex to the first waiter (it becomes the owner
 * there and then) and wakes it: waiters get the mutex in the order they came, and a
 * task that comes later cannot take it from a woken waiter.  (6.1 wakes the first
 * waiter to try again and hands off only to a waiter that lost such a race; there is no
 * optimistic spinning here, since the owner cannot run while another CPU spins: the
 * CPUs take turns on one host thread.)
 *
 * A CPU's idle task cannot sleep (an upcall runs there): it waits for a taken mutex by
 * yielding its CPU, as for a spinlock.  Nor can the task it wakes run on its CPU before
 * the upcall ends (a wake-up queues the task on the waker's CPU), so an idle task's
 * unlock hands nothing over: the mutex is let go and the first waiter woken to try
 * again, as in 6.1; the upcall may take the mutex again meanwhile and does not wait for
 * a task that cannot run.
 *
 * A task that locks a mutex it holds dies of an oops, which lets its mutexes go: 6.1
 * (without lockdep) hangs there, here a host process's request would. */
#include "kernel.h"
#include "sched.h"

void _raw_spin_lock(spinlock_t *lock)
{
	spin_lock(lock);
}

int _raw_spin_trylock(spinlock_t *lock)
{
	return spin_trylock(lock);
}

void _raw_spin_unlock(spinlock_t *lock)
{
	spin_unlock(lock);
}

#define MUTEX_FLAG_WAITERS 0x01UL	/* wait_list is not empty: unlock takes the slowpath */
#define MUTEX_FLAGS 0x07UL		/* task_structs are 8-byte aligned at least */

struct mutex_waiter {
	struct list_head list;
	struct task_struct *task;
};

static inline struct task_struct *mutex_owner_task(unsigned long owner)
{
	return (struct task_struct *)(owner & ~MUTEX_FLAGS);
}

static inline unsigned long mutex_owner_word(struct mutex *lock)
{
	return __atomic_load_n(&lock->owner.counter, __ATOMIC_ACQUIRE);
}

void __mutex_init(struct mutex *lock, const char *name, void *key)
{
	__atomic_store_n(&lock->owner.counter, 0, __ATOMIC_RELAXED);
	lock->wait_lock.locked = 0;
	INIT_LIST_HEAD(&lock->wait_list);
}

bool mutex_is_locked(struct mutex *lock)
{
	return mutex_owner_task(mutex_owner_word(lock)) != NULL;
}

/* Whether current owns lock (what lockdep_assert_held checks). */
bool mutex_owned_by_current(struct mutex *lock)
{
	return mutex_owner_task(mutex_owner_word(lock)) == current;
}

static void mutex_held_add(struct mutex *lock)
{
	struct task_struct *tsk = current;

	if (tsk->nr_mutexes_held < MUTEX_HELD_MAX)
		tsk->mutexes_held[tsk->nr_mutexes_held] = lock;
	tsk->nr_mutexes_held++;
}

static void mutex_held_del(struct mutex *lock)
{
	struct task_struct *tsk = current;
	int i, n = min(tsk->nr_mutexes_held, MUTEX_HELD_MAX);

	for (i = n - 1; i >= 0; i--) {
		if (tsk->mutexes_held[i] == lock) {
			memmove(&tsk->mutexes_held[i], &tsk->mutexes_held[i + 1],
				(n - i - 1) * sizeof(tsk->mutexes_held[0]));
			break;
		}
	}
	if (tsk->nr_mutexes_held > 0)
		tsk->nr_mutexes_held--;
}

static __always_inline bool mutex_trylock_fast(struct mutex *lock)
{
	long free = 0;

	return __atomic_compare_exchange_n(&lock->owner.counter, &free, (long)current, false,
					   __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

static __always_inline bool mutex_unlock_fast(struct mutex *lock)
{
	long mine = (long)current;

	return __atomic_compare_exchange_n(&lock->owner.counter, &mine, 0, false,
					   __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

/* Takes lock if it is free, keeping its flags: whether it did.  Caller holds wait_lock,
 * or its taking leaves the waiters to the next unlock (mutex_trylock). */
static bool mutex_try_acquire(struct mutex *lock)
{
	long owner = mutex_owner_word(lock);

	while (!mutex_owner_task(owner)) {
		if (__atomic_compare_exchange_n(&lock->owner.counter, &owner,
						(long)current | (owner & MUTEX_FLAGS), false,
						__ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			return true;
	}
	return false;
}

static bool mutex_wait_interrupted(unsigned int state)
{
	struct sigpending *pending = &current->pending;

	if (host_exit_pending(pending))
		return state != TASK_UNINTERRUPTIBLE;
	if (state == TASK_INTERRUPTIBLE)
		return pending->signal != 0;
	if (state == TASK_KILLABLE)
		return pending->signal & (1ULL << (SIGKILL - 1));
	return false;
}

/* The contended path of every mutex_lock variant: 0 with the mutex held, or -EINTR when
 * a signal state lets through came first. */
static int __mutex_lock(struct mutex *lock, unsigned int state)
{
	struct mutex_waiter waiter = { .task = current };
	bool idle = current->flags & PF_IDLE;
	int ret = 0;

	BUG_ON(mutex_owned_by_current(lock));
	spin_lock(&lock->wait_lock);
	if (mutex_try_acquire(lock))
		goto out;
	list_add_tail(&waiter.list, &lock->wait_list);
	__atomic_or_fetch(&lock->owner.counter, MUTEX_FLAG_WAITERS, __ATOMIC_RELAXED);
	for (;;) {
		/* First, or a hand-off that came with a signal would be lost. */
		if (mutex_owned_by_current(lock) || mutex_try_acquire(lock))
			break;
		if (mutex_wait_interrupted(state)) {
			ret = -EINTR;
			break;
		}
		/* Asleep before wait_lock goes: the unlocker's wake-up cannot come between
		 * the check above and schedule(). */
		if (!idle)
			set_current_state(state);
		spin_unlock(&lock->wait_lock);
		if (idle)
			cpu_relax_yield();
		else
			schedule();
		spin_lock(&lock->wait_lock);
	}
	set_current_state(TASK_RUNNING);
	list_del_init(&waiter.list);
	if (list_empty(&lock->wait_list))
		__atomic_and_fetch(&lock->owner.counter, ~MUTEX_FLAG_WAITERS, __ATOMIC_RELAXED);
out:
	spin_unlock(&lock->wait_lock);
	if (!ret)
		mutex_held_add(lock);
	return ret;
}

/* Each variant's slowpath is a function of its own, as in 6.1: a probe on
 * __mutex_lock_slowpath sees only contended mutex_lock() calls. */
static noinline void __mutex_lock_slowpath(struct mutex *lock)
{
	__mutex_lock(lock, TASK_UNINTERRUPTIBLE);
}

static noinline int __mutex_lock_interruptible_slowpath(struct mutex *lock)
{
	return __mutex_lock(lock, TASK_INTERRUPTIBLE);
}

static noinline int __mutex_lock_killable_slowpath(struct mutex *lock)
{
	return __mutex_lock(lock, TASK_KILLABLE);
}

void mutex_lock(struct mutex *lock)
{
	if (mutex_trylock_fast(lock))
		mutex_held_add(lock);
	else
		__mutex_lock_slowpath(lock);
}

/* 0 with the mutex held, -EINTR when a signal came while waiting. */
int mutex_lock_interruptible(struct mutex *lock)
{
	if (mutex_trylock_fast(lock)) {
		mutex_held_add(lock);
		return 0;
	}
	return __mutex_lock_interruptible_slowpath(lock);
}

/* 0 with the mutex held, -EINTR when SIGKILL came while waiting. */
int mutex_lock_killable(struct mutex *lock)
{
	if (mutex_trylock_fast(lock)) {
		mutex_held_add(lock);
		return 0;
	}
	return __mutex_lock_killable_slowpath(lock);
}

/* 1 with the mutex taken, 0 when another task holds it. */
int mutex_trylock(struct mutex *lock)
{
	if (!mutex_try_acquire(lock))
		return 0;
	mutex_held_add(lock);
	return 1;
}

/* Somebody waits (MUTEX_FLAG_WAITERS): the first waiter becomes the owner, and wakes;
 * from an idle task, the mutex is let go and the first waiter wakes to take it. */
static noinline void __mutex_unlock_slowpath(struct mutex *lock, unsigned long ip)
{
	struct task_struct *next = NULL;
	long owner = 0;

	spin_lock(&lock->wait_lock);
	if (!list_empty(&lock->wait_list)) {
		next = list_first_entry(&lock->wait_list, struct mutex_waiter, list)->task;
		owner = MUTEX_FLAG_WAITERS;
		if (!(current->flags & PF_IDLE))
			owner |= (long)next;
	}
	__atomic_store_n(&lock->owner.counter, owner, __ATOMIC_RELEASE);
	if (next)
		wake_up_process(next);
	spin_unlock(&lock->wait_lock);
}

void mutex_unlock(struct mutex *lock)
{
	if (WARN_ON(mutex_owner_task(mutex_owner_word(lock)) != current))
		return;
	mutex_held_del(lock);
	if (mutex_unlock_fast(lock))
		return;
	__mutex_unlock_slowpath(lock, _RET_IP_);
}

/* tsk (current) dies of an oops with mutexes held: they are let go, newest first, so
 * that the operations waiting for them go on (6.1 leaves them held, and its waiters
 * hang; here they are requests of host processes). */
void mutex_release_held(struct task_struct *tsk)
{
	while (tsk->nr_mutexes_held > 0) {
		int n = min(tsk->nr_mutexes_held, MUTEX_HELD_MAX);
		struct mutex *lock = tsk->mutexes_held[n - 1];

		printk(KERN_WARNING "BUG: %s/%d dies holding mutex %lx: released\n",
		       tsk->comm, tsk->pid, (unsigned long)lock);
		if (tsk->nr_mutexes_held > MUTEX_HELD_MAX) {	/* not remembered: lost */
			tsk->nr_mutexes_held--;
			continue;
		}
		mutex_unlock(lock);
	}
}
