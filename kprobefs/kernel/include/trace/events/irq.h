/* The irq events, with Linux 6.1's fields and print formats (the softirq names are
 * spelled as 6.1's format file shows them, the enum values in place). */
#if !defined(_TRACE_IRQ_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_IRQ_H
#include "tracepoint.h"
#include "hardirq.h"

#undef TRACE_SYSTEM
#define TRACE_SYSTEM irq

TRACE_EVENT(irq_handler_entry,

	TP_PROTO(int irq, struct irqaction *action),

	TP_ARGS(irq, action),

	TP_STRUCT__entry(
		__field(int, irq)
		__string(name, action->name)
	),

	TP_fast_assign(
		__entry->irq = irq;
		__assign_str(name, action->name);
	),

	TP_printk("irq=%d name=%s", __entry->irq, __get_str(name))
);

TRACE_EVENT(irq_handler_exit,

	TP_PROTO(int irq, struct irqaction *action, int ret),

	TP_ARGS(irq, action, ret),

	TP_STRUCT__entry(
		__field(int, irq)
		__field(int, ret)
	),

	TP_fast_assign(
		__entry->irq = irq;
		__entry->ret = ret;
	),

	TP_printk("irq=%d ret=%s", __entry->irq, __entry->ret ? "handled" : "unhandled")
);

DECLARE_EVENT_CLASS(softirq,

	TP_PROTO(unsigned int vec_nr),

	TP_ARGS(vec_nr),

	TP_STRUCT__entry(
		__field(unsigned int, vec)
	),

	TP_fast_assign(
		__entry->vec = vec_nr;
	),

	TP_printk("vec=%u [action=%s]", __entry->vec,
		  __print_symbolic(__entry->vec, { 0, "HI" }, { 1, "TIMER" }, { 2, "NET_TX" }, { 3, "NET_RX" }, { 4, "BLOCK" }, { 5, "IRQ_POLL" }, { 6, "TASKLET" }, { 7, "SCHED" }, { 8, "HRTIMER" }, { 9, "RCU" }))
);

DEFINE_EVENT(softirq, softirq_entry,
	     TP_PROTO(unsigned int vec_nr), TP_ARGS(vec_nr));
DEFINE_EVENT(softirq, softirq_exit,
	     TP_PROTO(unsigned int vec_nr), TP_ARGS(vec_nr));
DEFINE_EVENT(softirq, softirq_raise,
	     TP_PROTO(unsigned int vec_nr), TP_ARGS(vec_nr));
#endif
