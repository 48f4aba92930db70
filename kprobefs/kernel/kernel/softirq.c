/* Softirqs, timers and irq_work: the work an interrupt defers, run on its way out
 * (irq_exit) or when process context re-enables them (do_softirq).  Per CPU, with
 * interrupts off around each list: nothing here takes a lock, so an interrupt may
 * arrive anywhere interrupts are on. */
#include "hardirq.h"
#include "trace/events/irq.h"

static struct softirq_action softirq_vec[NR_SOFTIRQS];

void open_softirq(int nr, void (*action)(struct softirq_action *))
{
	softirq_vec[nr].action = action;
}

/* Caller has interrupts off. */
void raise_softirq_irqoff(unsigned int nr)
{
	trace_softirq_raise(nr);
	this_pcpu()->softirq_pending |= 1UL << nr;
}

void raise_softirq(unsigned int nr)
{
	unsigned long flags;

	local_irq_save(flags);
	raise_softirq_irqoff(nr);
	local_irq_restore(flags);
}

#define MAX_SOFTIRQ_RESTART 10

/* Run the pending softirqs, with interrupts on, in softirq context.  Entered with
 * interrupts off and returns with them off. */
static void __do_softirq(void)
{
	struct pcpu *pcpu = this_pcpu();
	int restart = MAX_SOFTIRQ_RESTART;
	unsigned long pending;

	pcpu->preempt_count += SOFTIRQ_OFFSET;
	while ((pending = pcpu->softirq_pending) && restart--) {
		unsigned int nr;

		pcpu->softirq_pending = 0;
		local_irq_enable();
		for (nr = 0; pending; nr++, pending >>= 1) {
			if (!(pending & 1) || !softirq_vec[nr].action)
				continue;
			trace_softirq_entry(nr);
			softirq_vec[nr].action(&softirq_vec[nr]);
			trace_softirq_exit(nr);
		}
		local_irq_disable();
	}
	pcpu->preempt_count -= SOFTIRQ_OFFSET;
}

/* Process context: run what is pending now (Linux's do_softirq, or ksoftirqd). */
void do_softirq(void)
{
	unsigned long flags;

	if (in_interrupt())
		return;
	local_irq_save(flags);
	if (this_pcpu()->softirq_pending)
		__do_softirq();
	local_irq_restore(flags);
}

void irq_enter(void)
{
	this_pcpu()->preempt_count += HARDIRQ_OFFSET;
}

/* Leave hardirq context; run the softirqs it raised unless it interrupted a softirq
 * or another interrupt.  Interrupts are off. */
void irq_exit(void)
{
	struct pcpu *pcpu = this_pcpu();

	pcpu->preempt_count -= HARDIRQ_OFFSET;
	if (!in_interrupt() && pcpu->softirq_pending)
		__do_softirq();
}

/* ---- timers -------------------------------------------------------------------------- */
static struct list_head timer_base[NR_CPUS];

void timer_setup(struct timer_list *timer, void (*fn)(struct timer_list *))
{
	timer->entry.next = timer->entry.prev = NULL;
	timer->function = fn;
}

/* The timer fires on this CPU once jiffies pass its expiry. */
void add_timer(struct timer_list *timer)
{
	unsigned long flags;

	local_irq_save(flags);
	list_add_tail(&timer->entry, &timer_base[smp_processor_id()]);
	local_irq_restore(flags);
}

int del_timer(struct timer_list *timer)
{
	unsigned long flags;
	int was = 0;

	local_irq_save(flags);
	if (timer_pending(timer)) {
		list_del_init(&timer->entry);
		was = 1;
	}
	local_irq_restore(flags);
	return was;
}

int mod_timer(struct timer_list *timer, unsigned long expires)
{
	int was = del_timer(timer);

	timer->expires = expires;
	add_timer(timer);
	return was;
}

#define time_after_eq(a, b) ((long)((a) - (b)) >= 0)

static bool timers_due(struct list_head *base)
{
	struct timer_list *t;

	list_for_each_entry(t, base, entry)
		if (time_after_eq(jiffies, t->expires))
			return true;
	return false;
}

/* The tick: TIMER_SOFTIRQ when a timer of this CPU is due (as 6.1's run_local_timers
 * raises it only then).  Hardirq context. */
void run_local_timers(void)
{
	if (timers_due(&timer_base[smp_processor_id()]))
		raise_softirq_irqoff(TIMER_SOFTIRQ);
}

static void run_timer_softirq(struct softirq_action *h)
{
	struct list_head *base = &timer_base[smp_processor_id()];
	struct timer_list *t, *n;
	LIST_HEAD(expired);

	local_irq_disable();
	list_for_each_entry_safe(t, n, base, entry) {
		if (time_after_eq(jiffies, t->expires)) {
			list_del_init(&t->entry);
			list_add_tail(&t->entry, &expired);
		}
	}
	while (!list_empty(&expired)) {
		t = list_first_entry(&expired, struct timer_list, entry);
		list_del_init(&t->entry);
		t->entry.next = t->entry.prev = NULL;
		local_irq_enable();
		t->function(t);
		local_irq_disable();
	}
	local_irq_enable();
}

void timer_softirq_init(void)
{
	int cpu;

	for (cpu = 0; cpu < NR_CPUS; cpu++)
		INIT_LIST_HEAD(&timer_base[cpu]);
	open_softirq(TIMER_SOFTIRQ, run_timer_softirq);
}

/* ---- irq_work: x86 raises IRQ_WORK_VECTOR on this CPU; the host is its APIC ---------- */
static struct list_head irq_work_list[NR_CPUS];

bool irq_work_queue(struct irq_work *work)
{
	unsigned long flags;

	if (READ_ONCE(work->busy))
		return false;
	local_irq_save(flags);
	work->busy = 1;
	list_add_tail(&work->node, &irq_work_list[smp_processor_id()]);
	hypercall(HC_SELF_IPI, IRQ_WORK_VECTOR, 0, 0, 0);	/* arch_irq_work_raise */
	local_irq_restore(flags);
	return true;
}

/* Hardirq context (the IRQ_WORK_VECTOR interrupt). */
void irq_work_run(void)
{
	struct list_head *list = &irq_work_list[smp_processor_id()];

	if (!list->next)
		return;
	while (!list_empty(list)) {
		struct irq_work *work = list_first_entry(list, struct irq_work, node);

		list_del_init(&work->node);
		work->func(work);
		WRITE_ONCE(work->busy, 0);
	}
}

void irq_work_sync(struct irq_work *work)
{
	while (READ_ONCE(work->busy))
		cpu_relax_yield();
}

void irq_work_init(void)
{
	int cpu;

	for (cpu = 0; cpu < NR_CPUS; cpu++)
		INIT_LIST_HEAD(&irq_work_list[cpu]);
}
