/* Targets for the probe-overhead benchmark (kprobes.txt section 6) and for engine tests:
 * a small function called in a loop, once without an ftrace site (notrace: its entry is a
 * plain instruction that int3, boosting and jump optimization apply to) and once with one
 * (its entry is an ftrace site).  The host runs the loops on an idle CPU (upcall). */
#include "kernel.h"
#include "sched.h"

notrace noinline int kprobe_target(int a, int b)
{
	volatile int x = a + b;

	return x * 2 + 7;
}

noinline int kprobe_target_traced(int a, int b)
{
	volatile int x = a + b;

	return x * 2 + 7;
}

/* Recursion depth d, then unwind: kretprobe maxactive tests. */
noinline long kprobe_recurse(long d)
{
	long r;

	if (d <= 0)
		return 0;
	r = kprobe_recurse(d - 1);
	barrier();
	return r + d;
}

notrace long kprobe_bench_loop(long n, long traced)
{
	long i, s = 0;

	for (i = 0; i < n; i++)
		s += traced ? kprobe_target_traced(i, s) : kprobe_target(i, s);
	return s;
}

/* Static-event benchmark target: n getpid calls through the system call path
 * (do_syscall_64), with its raw_syscalls and syscalls tracepoints. */
long do_syscall_64(struct pt_regs *regs, int nr);

notrace long syscall_bench_loop(long n)
{
	struct pt_regs regs = { .orig_ax = 39 };	/* __NR_getpid */
	long i, s = 0;

	for (i = 0; i < n; i++)
		s += do_syscall_64(&regs, 39);
	return s;
}
