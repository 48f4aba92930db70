/* The module events, with Linux 6.1's fields and print formats.  The kernel's modules
 * are placed by the host's loader; it has the kernel fire these from the load and
 * unload paths (kernel/module.c). */
#if !defined(_TRACE_MODULE_H) || defined(TRACE_HEADER_MULTI_READ)
#define _TRACE_MODULE_H
#include "tracepoint.h"
#include <module.h>	/* the kernel's include/module.h */

#undef TRACE_SYSTEM
#define TRACE_SYSTEM module

/* The taint bits a module sets (include/linux/panic.h's TAINT_* numbers). */
#ifndef show_module_flags
#define show_module_flags(flags) __print_flags(flags, "",	\
	{ (1UL << 0), "P" },					\
	{ (1UL << 12), "O" },					\
	{ (1UL << 1), "F" },					\
	{ (1UL << 10), "C" },					\
	{ (1UL << 13), "E" })
#endif

TRACE_EVENT(module_load,

	TP_PROTO(struct module_trace *mod),

	TP_ARGS(mod),

	TP_STRUCT__entry(
		__field(unsigned int, taints)
		__string(name, mod->name)
	),

	TP_fast_assign(
		__entry->taints = mod->taints;
		__assign_str(name, mod->name);
	),

	TP_printk("%s %s", __get_str(name), show_module_flags(__entry->taints))
);

TRACE_EVENT(module_free,

	TP_PROTO(struct module_trace *mod),

	TP_ARGS(mod),

	TP_STRUCT__entry(
		__string(name, mod->name)
	),

	TP_fast_assign(
		__assign_str(name, mod->name);
	),

	TP_printk("%s", __get_str(name))
);

DECLARE_EVENT_CLASS(module_refcnt,

	TP_PROTO(struct module_trace *mod, unsigned long ip),

	TP_ARGS(mod, ip),

	TP_STRUCT__entry(
		__field(unsigned long, ip)
		__field(int, refcnt)
		__string(name, mod->name)
	),

	TP_fast_assign(
		__entry->ip = ip;
		__entry->refcnt = mod->refcnt;
		__assign_str(name, mod->name);
	),

	TP_printk("%s call_site=%ps refcnt=%d",
		  __get_str(name), (void *)__entry->ip, __entry->refcnt)
);

DEFINE_EVENT(module_refcnt, module_get,
	     TP_PROTO(struct module_trace *mod, unsigned long ip), TP_ARGS(mod, ip));
DEFINE_EVENT(module_refcnt, module_put,
	     TP_PROTO(struct module_trace *mod, unsigned long ip), TP_ARGS(mod, ip));
#endif
