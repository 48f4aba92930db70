/* Hardware interrupts: the C half of asm_common_interrupt, the irq descriptors and the
 * timer interrupt.  The host delivers an interrupt only where the kernel has RFLAGS.IF
 * set; the handlers here and the softirqs they raise take no lock, so none can wait
 * on what the interrupted code holds. */
#include "hardirq.h"
#include "trace/events/irq.h"

static struct irqaction irq_action[NR_IRQS];
unsigned long irq_work_interrupts[NR_CPUS];

int request_irq(unsigned int irq, irq_handler_t handler, unsigned long flags,
		const char *name, void *dev_id)
{
	struct irqaction *action;

	if (irq >= NR_IRQS || !handler)
		return -EINVAL;
	action = &irq_action[irq];
	if (action->handler)
		return -EBUSY;
	action->dev_id = dev_id;
	action->name = name;
	action->handler = handler;
	return 0;
}

/* handle_irq_event: the line's action, between its two events. */
static void handle_irq(unsigned int irq)
{
	struct irqaction *action = &irq_action[irq];
	irqreturn_t res;

	if (!action->handler)
		return;		/* spurious: no handler on the line */
	trace_irq_handler_entry(irq, action);
	res = action->handler(irq, action->dev_id);
	trace_irq_handler_exit(irq, action, res);
	action->count++;
}

/* Called by asm_common_interrupt with interrupts off, on the interrupted stack. */
void common_interrupt(struct pt_regs *regs, unsigned long vector)
{
	irq_enter();
	if (vector == IRQ_WORK_VECTOR) {		/* sysvec_irq_work */
		irq_work_interrupts[smp_processor_id()]++;
		irq_work_run();
	} else if (vector >= ISA_IRQ_VECTOR(0) && vector < ISA_IRQ_VECTOR(NR_IRQS)) {
		handle_irq(vector - ISA_IRQ_VECTOR(0));
	}
	irq_exit();
}
NOKPROBE_SYMBOL(common_interrupt);

/* ---- the tick ------------------------------------------------------------------------ */
#define TICK_NSEC (1000000000UL / HZ)

/* scheduler_tick: this CPU's clock and the current task's run time (CONFIG_PREEMPT=n:
 * the tick never preempts).  A function of its own, as in Linux, so that it can be
 * traced (ftracetest's func_set_ftrace_file filters on it). */
noinline void scheduler_tick(void)
{
	struct pcpu *rq = this_pcpu();

	rq->irq_count++;
	if (!(current->flags & PF_IDLE))
		current->utime_ns += TICK_NSEC;
}

noinline void update_process_times(void)
{
	run_local_timers();
	scheduler_tick();
}

/* The timer interrupt (jiffies are the host's: the tick only accounts and runs timers). */
static irqreturn_t timer_interrupt(int irq, void *dev_id)
{
	update_process_times();
	return IRQ_HANDLED;
}

extern void irq_work_init(void);

void init_IRQ(void)
{
	irq_work_init();
	timer_softirq_init();
	request_irq(TIMER_IRQ, timer_interrupt, 0, "timer", NULL);
}
