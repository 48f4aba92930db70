/* Direct calls from ftrace sites (6.1's register_ftrace_direct): a function's fentry site
 * calls a trampoline of the caller's own, which runs with the function's arguments still
 * in their registers and returns into the function.  The sites are patched by the kprobes
 * engine in the host, together with the ftrace ops that may share them (then the ops'
 * trampoline runs them and jumps on to the direct one); the kernel only asks. */
#include "kernel.h"

/* ip: the function (its fentry site); addr: the trampoline.  0, -ENODEV when ip has no
 * ftrace site, -EBUSY when it has a direct call already. */
int register_ftrace_direct(unsigned long ip, unsigned long addr)
{
	return hypercall(HC_FTRACE_DIRECT, 1, ip, addr, 0);
}

/* 0, or -ENODEV when ip has no direct call to addr. */
int unregister_ftrace_direct(unsigned long ip, unsigned long addr)
{
	return hypercall(HC_FTRACE_DIRECT, 0, ip, addr, 0);
}
