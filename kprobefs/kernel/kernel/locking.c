/* The out-of-line lock API (kernel/locking/spinlock.c and mutex.c): what a module, or
 * code that must not inline a lock, calls.  The kernel's own code inlines spin_lock().
 * A mutex here is a lock whose waiter yields its CPU until the owner lets go. */
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

int mutex_trylock(struct mutex *lock)
{
	struct task_struct *none = NULL;

	return __atomic_compare_exchange_n(&lock->owner, &none, current, false,
					   __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

void mutex_lock(struct mutex *lock)
{
	while (!mutex_trylock(lock))
		cpu_relax_yield();
}

void mutex_unlock(struct mutex *lock)
{
	__atomic_store_n(&lock->owner, NULL, __ATOMIC_RELEASE);
}
