/* trace_printk(): printf into the trace buffer, as Linux 6.1's include/linux/kernel.h
 * spells it.  A constant format is kept in the __trace_printk_fmt section (one pointer
 * per call site) that printk_formats lists, and the record holds only its address and
 * the arguments in binary (ftrace:bprint), or, with no arguments, only the string's
 * address (ftrace:bputs); a format that is not a constant is printed into the record
 * (ftrace:print).  A module's section is listed too: its loader copies the strings
 * into kernel memory that outlives the module and points the section's pointers at
 * the copies. */
#ifndef _KPF_TRACE_PRINTK_H
#define _KPF_TRACE_PRINTK_H
#include "kernel.h"

#define _THIS_IP_ ({ __label__ __here; __here: (unsigned long)&&__here; })
#define __trace_stringify_1(x...) #x
#define __trace_stringify(x...) __trace_stringify_1(x)

int __trace_bprintk(unsigned long ip, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int __trace_printk(unsigned long ip, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
int __trace_bputs(unsigned long ip, const char *str);
int __trace_puts(unsigned long ip, const char *str, int size);

#define trace_puts(str) ({						\
	static const char *trace_printk_fmt __used			\
		__section("__trace_printk_fmt") =			\
		__builtin_constant_p(str) ? str : NULL;			\
									\
	if (__builtin_constant_p(str))					\
		__trace_bputs(_THIS_IP_, trace_printk_fmt);		\
	else								\
		__trace_puts(_THIS_IP_, str, strlen(str));		\
})

#define do_trace_printk(fmt, args...)					\
do {									\
	static const char *trace_printk_fmt __used			\
		__section("__trace_printk_fmt") =			\
		__builtin_constant_p(fmt) ? fmt : NULL;			\
									\
	if (__builtin_constant_p(fmt))					\
		__trace_bprintk(_THIS_IP_, trace_printk_fmt, ##args);	\
	else								\
		__trace_printk(_THIS_IP_, fmt, ##args);			\
} while (0)

/* No arguments: trace_puts (the stringified argument list is "()"). */
#define trace_printk(fmt, ...)						\
do {									\
	char _______STR[] = __trace_stringify((__VA_ARGS__));		\
									\
	if (sizeof(_______STR) > 3)					\
		do_trace_printk(fmt, ##__VA_ARGS__);			\
	else								\
		trace_puts(fmt);					\
} while (0)
#endif
