/* trace_printk: the sample loadable module of the kprobefs kernel, after Linux 6.1's
 * samples/trace_printk.
 *
 * Loading it prints through trace_printk() in each of its forms (bputs, puts, bprintk,
 * printk), then queues an irq_work and waits for it: the self-IPI's interrupt runs
 * trace_printk_irq_work() in hardirq context, which prints the same four "(irq)" lines
 * and a printk() line.  So a probe on trace_printk:trace_printk_irq_work that is
 * waiting for the module fires while the module loads, which is what ftracetest's
 * kprobe_module.tc checks after a reload, and event/trace_printk.tc finds its lines.
 *
 * Its pieces exercise every relocation the loader applies: calls into the kernel
 * (R_X86_64_PLT32), RIP-relative data (R_X86_64_PC32), absolute addresses taken with
 * -mcmodel=kernel (R_X86_64_32S) and a function pointer in initialised data
 * (R_X86_64_64); trace_printk_checksum() lets a test see that they all landed. */
#include "module.h"
#include "hardirq.h"
#include "trace_printk.h"

struct trace_printk_work {
	void (*func)(struct irq_work *work);
	int runs;
	struct irq_work irq_work;
};

static void trace_printk_irq_work(struct irq_work *work);

static const char trace_printk_string[] = "a static string";
static int trace_printk_calls;
struct trace_printk_work trace_printk_work = { .func = trace_printk_irq_work };

static const char *trace_printk_test_global_str =
	"This is a dynamic string that will use trace_puts\n";
static const char *trace_printk_test_global_str_irq =
	"(irq) This is a dynamic string that will use trace_puts\n";
static char *trace_printk_test_global_str_fmt = "%sThis is a %s that will use trace_printk\n";

static noinline void trace_printk_irq_work(struct irq_work *irq_work)
{
	struct trace_printk_work *work = container_of(irq_work, struct trace_printk_work,
						      irq_work);

	work->runs++;
	printk(KERN_INFO "trace_printk: %s from the deferred work (run %d)\n",
	       trace_printk_string, work->runs);
	trace_printk("(irq) This is a static string that will use trace_bputs\n");
	trace_printk(trace_printk_test_global_str_irq);
	trace_printk("(irq) This is a %s that will use trace_bprintk()\n", "static string");
	trace_printk(trace_printk_test_global_str_fmt, "(irq) ", "dynamic string");
}

/* Queue the work for the interrupt and wait for it to have run. */
static noinline void trace_printk_queue(struct trace_printk_work *work)
{
	init_irq_work(&work->irq_work, work->func);
	irq_work_queue(&work->irq_work);
	irq_work_sync(&work->irq_work);
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
	trace_printk("This is a static string that will use trace_bputs\n");
	trace_printk(trace_printk_test_global_str);
	trace_printk_queue(&trace_printk_work);
	trace_printk("This is a %s that will use trace_bprintk()\n", "static string");
	trace_printk(trace_printk_test_global_str_fmt, "", "dynamic string");
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
