/* Interrupts: the flag, the interrupt context counts, softirqs and irq_work.
 *
 * The host is the interrupt controller: between emulation slices it delivers a pending
 * interrupt to a CPU whose RFLAGS.IF is set, as x86 does through an interrupt gate
 * (it pushes ss, rsp, rflags, cs, rip and the vector on the kernel stack, clears IF
 * and enters asm_common_interrupt, which ends in iretq).  So the kernel's interrupt
 * flag is the hardware's: cli/sti and pushf/popf, as in Linux.
 *
 * The interrupt context lives in this CPU's pcpu->preempt_count, laid out as Linux's
 * (SOFTIRQ_OFFSET counts softirq processing, HARDIRQ_OFFSET hardirq nesting). */
#ifndef _KPF_HARDIRQ_H
#define _KPF_HARDIRQ_H
#include "sched.h"

#define X86_EFLAGS_IF 0x200UL

static __always_inline unsigned long native_save_fl(void)
{
	unsigned long flags;

	__asm__ __volatile__("pushfq; popq %0" : "=rm"(flags) : : "memory");
	return flags;
}
static __always_inline void local_irq_disable(void) { __asm__ __volatile__("cli" ::: "memory"); }
static __always_inline void local_irq_enable(void) { __asm__ __volatile__("sti" ::: "memory"); }
#define local_irq_save(flags) do { (flags) = native_save_fl(); local_irq_disable(); } while (0)
static __always_inline void local_irq_restore(unsigned long flags)
{
	if (flags & X86_EFLAGS_IF)
		local_irq_enable();
}
static __always_inline bool irqs_disabled(void)
{
	return !(native_save_fl() & X86_EFLAGS_IF);
}

#define SOFTIRQ_OFFSET (1 << 8)
#define SOFTIRQ_MASK (0xff << 8)
#define HARDIRQ_OFFSET (1 << 16)
#define HARDIRQ_MASK (0xf << 16)

static __always_inline int preempt_count(void)
{
	return READ_ONCE(this_pcpu()->preempt_count);
}
#define in_hardirq() (preempt_count() & HARDIRQ_MASK)
#define in_serving_softirq() (preempt_count() & SOFTIRQ_OFFSET)
#define in_interrupt() (preempt_count() & (HARDIRQ_MASK | SOFTIRQ_MASK))

/* A record's context flags (struct trace_entry's flags), as 6.1's tracing_gen_ctx
 * computes them: irqs off, in hardirq, serving a softirq. */
#define TRACE_FLAG_IRQS_OFF 0x01
#define TRACE_FLAG_HARDIRQ 0x08
#define TRACE_FLAG_SOFTIRQ 0x10
static __always_inline u8 tracing_gen_ctx_flags(void)
{
	int pc = preempt_count();

	return (irqs_disabled() ? TRACE_FLAG_IRQS_OFF : 0) |
	       (pc & HARDIRQ_MASK ? TRACE_FLAG_HARDIRQ : 0) |
	       (pc & SOFTIRQ_OFFSET ? TRACE_FLAG_SOFTIRQ : 0);
}

/* ---- hardware interrupts (kernel/irq.c) ---------------------------------------------- */
/* Vectors as x86 numbers them: legacy IRQ n at 0x30 + n, system vectors at the top. */
#define ISA_IRQ_VECTOR(irq) (0x30 + (irq))
#define IRQ_WORK_VECTOR 0xf6
#define NR_IRQS 16
#define TIMER_IRQ 0
#define NIC_IRQ 11

enum irqreturn { IRQ_NONE = 0, IRQ_HANDLED = 1 };
typedef enum irqreturn irqreturn_t;
typedef irqreturn_t (*irq_handler_t)(int irq, void *dev_id);

struct irqaction {
	irq_handler_t handler;
	void *dev_id;
	const char *name;
	unsigned long count;	/* interrupts handled, as kstat_irqs */
};
int request_irq(unsigned int irq, irq_handler_t handler, unsigned long flags,
		const char *name, void *dev_id);
void common_interrupt(struct pt_regs *regs, unsigned long vector);
void irq_enter(void);
void irq_exit(void);

/* ---- softirqs (kernel/softirq.c) ------------------------------------------------------ */
enum {
	HI_SOFTIRQ = 0,
	TIMER_SOFTIRQ,
	NET_TX_SOFTIRQ,
	NET_RX_SOFTIRQ,
	BLOCK_SOFTIRQ,
	IRQ_POLL_SOFTIRQ,
	TASKLET_SOFTIRQ,
	SCHED_SOFTIRQ,
	HRTIMER_SOFTIRQ,
	RCU_SOFTIRQ,
	NR_SOFTIRQS
};
struct softirq_action {
	void (*action)(struct softirq_action *);
};
void open_softirq(int nr, void (*action)(struct softirq_action *));
void raise_softirq_irqoff(unsigned int nr);
void raise_softirq(unsigned int nr);
void do_softirq(void);

/* ---- timers, run by TIMER_SOFTIRQ once jiffies reach their expiry ------------------- */
struct timer_list {
	struct list_head entry;
	unsigned long expires;
	void (*function)(struct timer_list *);
};
void timer_setup(struct timer_list *timer, void (*fn)(struct timer_list *));
void add_timer(struct timer_list *timer);
int mod_timer(struct timer_list *timer, unsigned long expires);
int del_timer(struct timer_list *timer);
static inline int timer_pending(const struct timer_list *timer)
{
	return timer->entry.next && !list_empty(&timer->entry);
}
void run_local_timers(void);
void timer_softirq_init(void);

/* ---- irq_work: run a function in hardirq context, from anywhere -------------------- */
struct irq_work {
	struct list_head node;
	void (*func)(struct irq_work *);
	int busy;		/* queued or running */
};
#define IRQ_WORK_INIT(fn) { .func = (fn) }
static inline void init_irq_work(struct irq_work *work, void (*func)(struct irq_work *))
{
	work->node.next = work->node.prev = NULL;
	work->func = func;
	work->busy = 0;
}
bool irq_work_queue(struct irq_work *work);
void irq_work_sync(struct irq_work *work);
void irq_work_run(void);

void init_IRQ(void);
#endif
