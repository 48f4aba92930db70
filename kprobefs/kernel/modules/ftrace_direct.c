/* ftrace-direct: the sample module of the kprobefs kernel for direct calls from ftrace
 * sites.  Loading it makes wake_up_process()'s fentry site call my_tramp, a trampoline of
 * this module's own, which keeps the function's argument (the task being woken) in %rdi
 * around a call to my_direct_func() and returns into the function; my_direct_func()
 * records "waking up COMM-PID" with trace_printk().  Unloading it takes the call away.
 * ftracetest's direct/ftrace-direct.tc and kprobe-direct.tc load it while tracers and
 * kprobes use the same site. */
#include "module.h"
#include "trace_printk.h"
#include "sched.h"

void my_direct_func(struct task_struct *p)
{
	trace_printk("waking up %s-%d\n", p->comm, p->pid);
}

void my_tramp(void);

asm(
"	.pushsection .text, \"ax\", @progbits\n"
"	.type my_tramp, @function\n"
"	.globl my_tramp\n"
"my_tramp:\n"
"	pushq %rbp\n"
"	movq %rsp, %rbp\n"
"	pushq %rdi\n"
"	call my_direct_func\n"
"	popq %rdi\n"
"	leave\n"
"	ret\n"
"	.size my_tramp, .-my_tramp\n"
"	.popsection\n"
);

static int ftrace_direct_init(void)
{
	return register_ftrace_direct((unsigned long)wake_up_process, (unsigned long)my_tramp);
}

static void ftrace_direct_exit(void)
{
	unregister_ftrace_direct((unsigned long)wake_up_process, (unsigned long)my_tramp);
}

module_init(ftrace_direct_init);
module_exit(ftrace_direct_exit);

MODULE_AUTHOR("kprobefs");
MODULE_DESCRIPTION("Example use case of using register_ftrace_direct()");
MODULE_LICENSE("GPL");
