/* Direct calls from ftrace sites (6.1's register_ftrace_direct): a function's fentry site
 * calls a trampoline of the caller's own, which runs with the function's arguments still
 * in their registers and returns into the function.  The sites are patched by the kprobes
 * engine in the host, together with the ftrace ops that may share them (then the ops'
 * trampoline runs them and jumps on to the direct one); the kernel only asks. */
#include "kernel.h"

/* 6.1's ftrace.c locks: direct_mutex covers the direct calls, ftrace_lock the ftrace ops
 * and their sites (register_ftrace_function, taken inside direct_mutex). */
static DEFINE_MUTEX(direct_mutex);
DEFINE_MUTEX(ftrace_lock);

static int ftrace_direct_update(int add, unsigned long ip, unsigned long addr)
{
	int ret;

	mutex_lock(&direct_mutex);
	mutex_lock(&ftrace_lock);
	ret = hypercall(HC_FTRACE_DIRECT, add, ip, addr, 0);
	mutex_unlock(&ftrace_lock);
	mutex_unlock(&direct_mutex);
	return ret;
}

/* ip: the function (its fentry site); addr: the trampoline.  0, -ENODEV when ip has no
 * ftrace site, -EBUSY when it has a direct call already. */
int register_ftrace_direct(unsigned long ip, unsigned long addr)
{
	return ftrace_direct_update(1, ip, addr);
}

/* 0, or -ENODEV when ip has no direct call to addr. */
int unregister_ftrace_direct(unsigned long ip, unsigned long addr)
{
	return ftrace_direct_update(0, ip, addr);
}
