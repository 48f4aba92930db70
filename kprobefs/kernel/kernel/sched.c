/* The scheduler: per-CPU run queues, schedule(), wake-ups, wait queues and the idle
 * loop.  CONFIG_PREEMPT=n: a task runs until it sleeps or returns to user mode.  One
 * lock covers every run queue; it is held across the context switch and released by
 * the next task in finish_task_switch(), so a wake-up never sees a half-switched task. */
#include "sched.h"
#include "hardirq.h"
#include "trace/events/sched.h"

struct pcpu pcpu_area[NR_CPUS] __aligned(64);
int nr_cpu_ids = 1;
static DEFINE_SPINLOCK(rq_lock);

/* The wakeup latency tracers' hooks beside the sched tracepoints (trace_preemptirq.c) */
void tracer_sched_wakeup(struct task_struct *p, int prio, int cpu, int curr_prio);
void tracer_sched_switch(struct task_struct *prev, struct task_struct *next, int prev_prio,
			 int next_prio, int next_cpu);

static void enqueue_task(struct pcpu *rq, struct task_struct *p)
{
	p->on_rq = 1;
	list_add_tail(&p->run_list, &rq->runqueue);
}

static struct task_struct *pick_next_task(struct pcpu *rq, struct task_struct *prev)
{
	struct task_struct *next;

	if (prev->__state == TASK_RUNNING && !(prev->flags & PF_IDLE) && !prev->on_rq)
		return prev;
	if (list_empty(&rq->runqueue))
		return prev->__state == TASK_RUNNING ? prev : rq->idle;
	next = list_first_entry(&rq->runqueue, struct task_struct, run_list);
	list_del_init(&next->run_list);
	next->on_rq = 0;
	if (prev != next && prev->__state == TASK_RUNNING && !(prev->flags & PF_IDLE))
		enqueue_task(rq, prev);
	return next;
}

/* Called by the next task with rq_lock held by the CPU that switched to it, and
 * interrupts off since __schedule: they come back on here, as 6.1's
 * raw_spin_rq_unlock_irq does. */
static void finish_task_switch(struct task_struct *prev)
{
	/* Read before on_cpu goes: from then on a parent's wait4 may free a zombie. */
	bool autoreaped = prev->__state == TASK_DEAD && prev->exit_state == EXIT_DEAD;

	prev->on_cpu = 0;
	spin_unlock(&rq_lock);
	local_irq_enable();
	if (autoreaped) {
		release_task(prev);
	} else if (prev->__state == TASK_DEAD) {
		put_task_stack(prev);
		if (prev->real_parent)
			__wake_up(&prev->real_parent->wait_chldexit);
	}
}

void schedule_tail(struct task_struct *prev)
{
	finish_task_switch(prev);
}

static struct task_struct *context_switch(struct pcpu *rq, struct task_struct *prev,
					  struct task_struct *next)
{
	rq->nr_switches++;
	next->on_cpu = 1;
	next->cpu = rq->cpu_number;
	return __switch_to_asm(prev, next, &prev->thread.sp, next->thread.sp);
}

/* The second half of a switch, on the next task's stack: make it current. */
struct task_struct *__switch_to(struct task_struct *prev, struct task_struct *next)
{
	struct pcpu *rq = this_pcpu();

	rq->current_task = next;
	return prev;
}
NOKPROBE_SYMBOL(__switch_to);

static void __schedule(void)
{
	struct task_struct *prev = current, *next;
	struct pcpu *rq = this_pcpu();

	local_irq_disable();
	spin_lock(&rq_lock);
	next = pick_next_task(rq, prev);
	if (next == prev) {
		spin_unlock(&rq_lock);
		local_irq_enable();
		return;
	}
	if (prev->__state == TASK_RUNNING)
		prev->nivcsw++;
	else
		prev->nvcsw++;
	trace_sched_switch(false, prev, next);	/* CONFIG_PREEMPT=n: never preempted */
	tracer_sched_switch(prev, next, prev->prio, next->prio, rq->cpu_number);
	prev = context_switch(rq, prev, next);
	finish_task_switch(prev);
}

void schedule(void)
{
	__schedule();
}

/* Returns 1 if p was woken, 0 if it was already running. */
static int try_to_wake_up(struct task_struct *p, unsigned int state)
{
	struct pcpu *rq = this_pcpu();
	int woken = 0;

	spin_lock(&rq_lock);
	if (!(p->__state & state))
		goto out;
	trace_sched_waking(p);
	WRITE_ONCE(p->__state, TASK_RUNNING);
	woken = 1;
	/* Still switching out elsewhere: that CPU's schedule() sees TASK_RUNNING. */
	if (!p->on_cpu && !p->on_rq) {
		p->cpu = rq->cpu_number;
		enqueue_task(rq, p);
	}
	trace_sched_wakeup(p);
	tracer_sched_wakeup(p, p->prio, p->cpu, current->prio);
out:
	spin_unlock(&rq_lock);
	return woken;
}

/* Not inlined into this file's callers: as in Linux, every wake-up goes through it (its
 * ftrace site is what tracers and direct calls hook). */
noinline int wake_up_process(struct task_struct *p)
{
	return try_to_wake_up(p, TASK_INTERRUPTIBLE | TASK_UNINTERRUPTIBLE);
}

void wake_up_new_task(struct task_struct *p)
{
	struct pcpu *rq = this_pcpu();

	spin_lock(&rq_lock);
	p->__state = TASK_RUNNING;
	p->cpu = rq->cpu_number;
	enqueue_task(rq, p);
	trace_sched_wakeup_new(p);
	tracer_sched_wakeup(p, p->prio, p->cpu, current->prio);
	spin_unlock(&rq_lock);
}

void init_waitqueue_head(wait_queue_head_t *wq)
{
	wq->lock.locked = 0;
	INIT_LIST_HEAD(&wq->head);
}

/* Queue the current task on wq and mark it sleeping; the caller then re-checks its
 * condition and calls schedule() only if it still has to wait, so a wake-up between the
 * check and the sleep is never lost. */
void prepare_to_wait(wait_queue_head_t *wq, struct wait_queue_entry *w)
{
	w->task = current;
	spin_lock(&wq->lock);
	if (list_empty(&w->entry) || !w->entry.next)
		list_add_tail(&w->entry, &wq->head);
	set_current_state(TASK_INTERRUPTIBLE);
	spin_unlock(&wq->lock);
}

void finish_wait(wait_queue_head_t *wq, struct wait_queue_entry *w)
{
	set_current_state(TASK_RUNNING);
	spin_lock(&wq->lock);
	if (w->entry.next && !list_empty(&w->entry))
		list_del_init(&w->entry);
	spin_unlock(&wq->lock);
}

void __wake_up(wait_queue_head_t *wq)
{
	struct wait_queue_entry *w;

	spin_lock(&wq->lock);
	list_for_each_entry(w, &wq->head, entry)
		wake_up_process(w->task);
	spin_unlock(&wq->lock);
}

extern void run_upcall(struct pcpu *cpu);

static void idle_work(unsigned long word)
{
	struct task_struct *p;

	switch (word & 0xff) {
	case IDLE_WAKE_TASK:
		p = find_task_by_vpid((pid_t)(word >> 8));
		if (p)
			wake_up_process(p);
		break;
	case IDLE_UPCALL:
		run_upcall(this_pcpu());
		break;
	}
}

/* Each CPU ends up here once booted.  The host resumes an idle CPU only when it has
 * work for it, handed over as the hypercall's return word. */
void __noreturn cpu_idle_loop(void)
{
	struct pcpu *rq = this_pcpu();

	current->flags |= PF_IDLE;
	local_irq_enable();	/* booted: interrupts may come (sti; hlt) */
	for (;;) {
		unsigned long word;

		if (!list_empty(&rq->runqueue)) {
			schedule();
			continue;
		}
		word = hypercall(HC_IDLE, 0, 0, 0, 0);
		if (word)
			idle_work(word);
	}
}

void sched_init(void)
{
	int cpu;

	for (cpu = 0; cpu < NR_CPUS; cpu++) {
		struct pcpu *p = &pcpu_area[cpu];

		p->self = p;
		p->cpu_number = cpu;
		INIT_LIST_HEAD(&p->runqueue);
	}
}
