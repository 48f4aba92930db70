/* The latency tracers' hook points.
 *
 * The irq and preemption toggles the latency tracers see (6.1's trace_preemptirq.c
 * and the preempt_count_add/sub of CONFIG_TRACE_PREEMPT_TOGGLE): each CPU remembers
 * whether its interrupts are traced as off, so only a change calls the tracer, with
 * CALLER_ADDR0 (where the toggle was called from), CALLER_ADDR1 (its caller) and the
 * CPU's preempt_count.
 *
 * The tracer_* functions are the tracers' hook points: the host's irqsoff family
 * attaches to their ftrace sites while it is the current tracer, and reads what it
 * needs from their arguments.  noipa keeps gcc from dropping the calls to bodies
 * that do nothing in C. */
#include "irqflags.h"

/* Beside trace_sched_wakeup(_new) and trace_sched_switch (the wakeup tracers register
 * on those tracepoints in 6.1): the tasks, with what the tracers print of them. */
noinline __attribute__((__noipa__)) void tracer_sched_wakeup(struct task_struct *p, int prio,
							     int cpu, int curr_prio)
{
	barrier();
}

noinline __attribute__((__noipa__)) void tracer_sched_switch(struct task_struct *prev,
							     struct task_struct *next,
							     int prev_prio, int next_prio,
							     int next_cpu)
{
	barrier();
}

static int tracing_irq_cpu[NR_CPUS];

noinline __attribute__((__noipa__)) void tracer_hardirqs_on(unsigned long a0, unsigned long a1,
								int pc)
{
	barrier();
}

noinline __attribute__((__noipa__)) void tracer_hardirqs_off(unsigned long a0, unsigned long a1,
								 int pc)
{
	barrier();
}

noinline __attribute__((__noipa__)) void tracer_preempt_on(unsigned long a0, unsigned long a1,
							       int pc)
{
	barrier();
}

noinline __attribute__((__noipa__)) void tracer_preempt_off(unsigned long a0, unsigned long a1,
								int pc)
{
	barrier();
}

#define CALLER_ADDR0 ((unsigned long)__builtin_return_address(0))
#pragma GCC diagnostic ignored "-Wframe-address"
#define CALLER_ADDR1 ((unsigned long)__builtin_return_address(1))

noinline void trace_hardirqs_on(void)
{
	int cpu = smp_processor_id();

	if (tracing_irq_cpu[cpu]) {
		tracer_hardirqs_on(CALLER_ADDR0, CALLER_ADDR1, this_pcpu()->preempt_count);
		tracing_irq_cpu[cpu] = 0;
	}
}

noinline void trace_hardirqs_off(void)
{
	int cpu = smp_processor_id();

	if (!tracing_irq_cpu[cpu]) {
		tracing_irq_cpu[cpu] = 1;
		tracer_hardirqs_off(CALLER_ADDR0, CALLER_ADDR1, this_pcpu()->preempt_count);
	}
}

noinline void preempt_count_add(int val)
{
	struct pcpu *rq = this_pcpu();

	rq->preempt_count += val;
	if (rq->preempt_count == val)
		tracer_preempt_off(CALLER_ADDR0, CALLER_ADDR1, rq->preempt_count);
}

noinline void preempt_count_sub(int val)
{
	struct pcpu *rq = this_pcpu();

	if (rq->preempt_count == val)
		tracer_preempt_on(CALLER_ADDR0, CALLER_ADDR1, rq->preempt_count);
	rq->preempt_count -= val;
}
