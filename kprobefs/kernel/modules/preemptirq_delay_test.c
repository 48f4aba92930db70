/* preemptirq_delay_test: 6.1's module of that name, for the irqsoff and preemptoff
 * tracers.  Loading it runs the test: burst_size times, it spins for `delay`
 * microseconds on the kernel's clock with interrupts off (test_mode=irq), preemption
 * off (preempt), or the two in turn (alternate).  6.1 runs the test in a kthread
 * named after the mode and waits for it; this kernel runs it in the loading task.
 * The ten preemptirqtest_N functions are 6.1's: each burst iteration comes from a
 * different caller, so the tracers' "started at" differ. */
#include "module.h"
#include "irqflags.h"

static unsigned long delay = 100;
static char test_mode[12] = "irq";
static unsigned int burst_size = 1;
static int cpu_affinity = -1;

module_param_named(delay, delay, ulong, 0444);
module_param_string(test_mode, test_mode, 12, 0444);
module_param_named(burst_size, burst_size, uint, 0444);
module_param_named(cpu_affinity, cpu_affinity, int, 0444);
MODULE_PARM_DESC(delay, "Period in microseconds (100 us default)");
MODULE_PARM_DESC(test_mode, "Mode of the test such as preempt, irq, or alternate (default irq)");
MODULE_PARM_DESC(burst_size, "The size of a burst (default 1)");
MODULE_PARM_DESC(cpu_affinity, "Cpu num test is running on");

static void busy_wait(unsigned long time)
{
	u64 start = ktime_get_ns(), end;

	do {
		end = ktime_get_ns();
	} while ((end - start) < (time * 1000));
}

static __always_inline void irqoff_test(void)
{
	unsigned long flags;

	local_irq_save(flags);
	busy_wait(delay);
	local_irq_restore(flags);
}

static __always_inline void preemptoff_test(void)
{
	preempt_disable();
	busy_wait(delay);
	preempt_enable();
}

static void execute_preemptirqtest(int idx)
{
	if (!strcmp(test_mode, "irq"))
		irqoff_test();
	else if (!strcmp(test_mode, "preempt"))
		preemptoff_test();
	else if (!strcmp(test_mode, "alternate")) {
		if (idx % 2 == 0)
			irqoff_test();
		else
			preemptoff_test();
	}
}

#define DECLARE_TESTFN(POSTFIX)				\
	static noinline void preemptirqtest_##POSTFIX(int idx)	\
	{						\
		execute_preemptirqtest(idx);		\
	}

DECLARE_TESTFN(0)
DECLARE_TESTFN(1)
DECLARE_TESTFN(2)
DECLARE_TESTFN(3)
DECLARE_TESTFN(4)
DECLARE_TESTFN(5)
DECLARE_TESTFN(6)
DECLARE_TESTFN(7)
DECLARE_TESTFN(8)
DECLARE_TESTFN(9)

static void (*testfuncs[])(int) = {
	preemptirqtest_0, preemptirqtest_1, preemptirqtest_2, preemptirqtest_3,
	preemptirqtest_4, preemptirqtest_5, preemptirqtest_6, preemptirqtest_7,
	preemptirqtest_8, preemptirqtest_9,
};

static noinline int preemptirq_delay_run(void *data)
{
	unsigned int i, s = burst_size < 10 ? burst_size : 10;

	/* 6.1 binds its kthread to the CPU; the loading task cannot move */
	if (cpu_affinity > -1 && cpu_affinity != smp_processor_id())
		printk(KERN_ERR "cpu_affinity:%d, failed\n", cpu_affinity);
	for (i = 0; i < s; i++)
		(testfuncs[i])(i);
	return 0;
}

static int preemptirq_delay_init(void)
{
	return preemptirq_delay_run(NULL);
}

static void preemptirq_delay_exit(void)
{
}

module_init(preemptirq_delay_init);
module_exit(preemptirq_delay_exit);

MODULE_DESCRIPTION("Preempt / IRQ disable delay thread to test latency tracers");
MODULE_LICENSE("GPL v2");
