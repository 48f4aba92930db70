/* Kernel work the host asks for in process context.
 *
 * A hypercall handler never runs kernel code itself: nested inside the hypercall, that
 * code could wait for a lock held by another CPU, which cannot run until the hypercall
 * returns.  When a control write needs the kernel to act (make or remove a tracefs
 * directory, run a module's init or exit), the host queues the call; the file operation
 * that made the hypercall runs the queue as soon as the hypercall returns, in the same
 * system call, as Linux's own write handlers would.  The host may change the
 * operation's result from a call's return value (a failed init fails the write). */
#include "kernel.h"

typedef long (*host_work_fn)(unsigned long, unsigned long, unsigned long, unsigned long,
			     unsigned long, unsigned long);

/* How many calls the host has queued (it keeps the count): none, no hypercall. */
volatile unsigned long host_work_queued;

/* Runs every queued call, in order; returns result, or what the host made of it.  The
 * count is read again before each HC_WORK_NEXT: once the last call has run, the queue
 * is empty without a hypercall to say so (a call's completion may queue another). */
long host_work_run(long result)
{
	struct host_work work;

	while (host_work_queued && hypercall(HC_WORK_NEXT, &work, 0, 0, 0) > 0) {
		long ret = ((host_work_fn)work.fn)(work.args[0], work.args[1], work.args[2],
						   work.args[3], work.args[4], work.args[5]);

		result = hypercall(HC_WORK_DONE, ret, result, 0, 0);
	}
	return result;
}
