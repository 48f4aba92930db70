/* ftrace-direct-too: a second direct-call sample, so that two modules' trampolines are in
 * use at once (ftracetest's direct cases load it beside ftrace-direct).  Its trampoline
 * sits on vfs_read()'s fentry site and keeps the function's four arguments around a call
 * to my_direct_func(), which records the file and the count with trace_printk(). */
#include "module.h"
#include "trace_printk.h"
#include "fs.h"

void my_direct_func(struct file *file, char *buf, size_t count, loff_t *pos)
{
	trace_printk("vfs read file=%p count=%lu\n", file, (unsigned long)count);
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
"	pushq %rsi\n"
"	pushq %rdx\n"
"	pushq %rcx\n"
"	call my_direct_func\n"
"	popq %rcx\n"
"	popq %rdx\n"
"	popq %rsi\n"
"	popq %rdi\n"
"	leave\n"
"	ret\n"
"	.size my_tramp, .-my_tramp\n"
"	.popsection\n"
);

static int ftrace_direct_too_init(void)
{
	return register_ftrace_direct((unsigned long)vfs_read, (unsigned long)my_tramp);
}

static void ftrace_direct_too_exit(void)
{
	unregister_ftrace_direct((unsigned long)vfs_read, (unsigned long)my_tramp);
}

module_init(ftrace_direct_too_init);
module_exit(ftrace_direct_too_exit);

MODULE_AUTHOR("kprobefs");
MODULE_DESCRIPTION("Another example of using register_ftrace_direct()");
MODULE_LICENSE("GPL");
