/* Several probes at one address whose pre-handlers are all kernel code: what
 * aggr_pre_handler does for them.  The host's kprobes engine keeps one struct
 * kprobe_native_aggr per such address, rewritten when its probes change, and points the
 * address's detour, ftrace trampoline or int3 stub at kprobe_native_aggr_handler.
 * Nothing here may be probed. */
#include "kernel.h"
#include "sched.h"

#define __kprobes notrace __section(".kprobes.text")

#define KPROBE_NATIVE_AGGR_MAX 8	/* more probes at one address: the host's handlers */
#define KPROBE_NATIVE_AGGRS 1024	/* addresses */

struct kprobe_native {
	void (*handler)(void *arg, struct pt_regs *regs);
	unsigned long arg;
};

struct kprobe_native_aggr {
	u64 n;
	struct kprobe_native probes[KPROBE_NATIVE_AGGR_MAX];
};

struct kprobe_native_aggr kprobe_native_aggrs[KPROBE_NATIVE_AGGRS];
const unsigned long kprobe_native_aggr_layout[] = {
	sizeof(struct kprobe_native_aggr), KPROBE_NATIVE_AGGR_MAX, KPROBE_NATIVE_AGGRS,
};

/* Run every probe's handler in order.  A hit that trapped tags the argument with its
 * low bit; each handler's argument gets the same tag. */
void __kprobes kprobe_native_aggr_handler(struct kprobe_native_aggr *a, struct pt_regs *regs)
{
	unsigned long trapped = (unsigned long)a & 1;
	u64 i;

	a = (struct kprobe_native_aggr *)((unsigned long)a & ~1UL);
	for (i = 0; i < a->n; i++)
		a->probes[i].handler((void *)(a->probes[i].arg | trapped), regs);
}
