/* trace_printk: the sample loadable module of the kprobefs kernel.
 *
 * Loading it queues one piece of deferred work and runs it at once (this kernel has no
 * interrupts to defer it to): trace_printk_irq_work() prints through printk().  So a
 * probe on trace_printk:trace_printk_irq_work that is waiting for the module fires while
 * the module loads, which is what ftracetest's kprobe_module.tc checks after a reload.
 *
 * Its pieces exercise every relocation the loader applies: calls into the kernel
 * (R_X86_64_PLT32), RIP-relative data (R_X86_64_PC32), absolute addresses taken with
 * -mcmodel=kernel (R_X86_64_32S) and a function pointer in initialised data
 * (R_X86_64_64); trace_printk_checksum() lets a test see that they all landed. */
#include "module.h"

struct trace_printk_work {
	void (*func)(struct trace_printk_work *work);
	int runs;
};

static void trace_printk_irq_work(struct trace_printk_work *work);

static const char trace_printk_string[] = "a static string";
static int trace_printk_calls;
struct trace_printk_work trace_printk_work = { .func = trace_printk_irq_work };

static noinline void trace_printk_irq_work(struct trace_printk_work *work)
{
	work->runs++;
	printk(KERN_INFO "trace_printk: %s from the deferred work (run %d)\n",
	       trace_printk_string, work->runs);
}

/* Runs the work the way irq_work_queue() would once the interrupt came. */
static noinline void trace_printk_queue(struct trace_printk_work *work)
{
	work->func(work);
}

/* x + the length of a string in .rodata + 1000 * the runs of the work + 100 * its own
 * calls so far (in .bss); and 0 if the work's function pointer is not where kallsyms
 * says trace_printk_irq_work is. */
long trace_printk_checksum(long x)
{
	if (trace_printk_work.func != trace_printk_irq_work)
		return 0;
	return x + strlen(trace_printk_string) + 1000L * trace_printk_work.runs
		+ 100L * trace_printk_calls++;
}

static int trace_printk_init(void)
{
	printk(KERN_INFO "trace_printk: loaded at %lx\n", (unsigned long)&trace_printk_work);
	trace_printk_queue(&trace_printk_work);
	return 0;
}

static void trace_printk_exit(void)
{
	printk(KERN_INFO "trace_printk: unloaded after %d runs\n", trace_printk_work.runs);
}

module_init(trace_printk_init);
module_exit(trace_printk_exit);

MODULE_AUTHOR("kprobefs");
MODULE_DESCRIPTION("trace_printk sample: deferred work that prints while the module loads");
MODULE_LICENSE("GPL");
