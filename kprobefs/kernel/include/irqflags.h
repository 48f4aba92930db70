/* Interrupt-off and preemption-off sections, with the hooks of 6.1's
 * CONFIG_TRACE_IRQFLAGS and CONFIG_TRACE_PREEMPT_TOGGLE (kernel/trace_preemptirq.c):
 * local_irq_disable() calls trace_hardirqs_off() once interrupts are off,
 * local_irq_enable() calls trace_hardirqs_on() before they come back, and
 * preempt_disable()/preempt_enable() move this CPU's preempt_count through
 * preempt_count_add()/_sub(), which call trace_preempt_off()/_on() when it leaves or
 * returns to 0.  The latency tracers (irqsoff, preemptoff, preemptirqsoff) hook the
 * tracer_* functions those call. */
#ifndef _KPF_IRQFLAGS_H
#define _KPF_IRQFLAGS_H
#include "sched.h"

void trace_hardirqs_on(void);
void trace_hardirqs_off(void);
void preempt_count_add(int val);
void preempt_count_sub(int val);

#define IRQFLAGS_IF 0x200UL

static __always_inline unsigned long irqflags_save_fl(void)
{
	unsigned long flags;

	__asm__ __volatile__("pushfq; popq %0" : "=rm"(flags) : : "memory");
	return flags;
}
static __always_inline void local_irq_disable(void)
{
	__asm__ __volatile__("cli" ::: "memory");
	trace_hardirqs_off();
}
static __always_inline void local_irq_enable(void)
{
	trace_hardirqs_on();
	__asm__ __volatile__("sti" ::: "memory");
}
/* As 6.1's: only a save that turns interrupts off, and a restore that turns them back
 * on, is a toggle the tracers see. */
#define local_irq_save(flags) do {					\
	(flags) = irqflags_save_fl();					\
	__asm__ __volatile__("cli" ::: "memory");			\
	if ((flags) & IRQFLAGS_IF)					\
		trace_hardirqs_off();					\
} while (0)
#define local_irq_restore(flags) do {					\
	if ((flags) & IRQFLAGS_IF)					\
		local_irq_enable();					\
	else								\
		trace_hardirqs_off();					\
} while (0)

#define preempt_disable() preempt_count_add(1)
#define preempt_enable() preempt_count_sub(1)
#endif
