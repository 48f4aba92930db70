/* Several probes at one address whose pre-handlers are all kernel code: what
 * aggr_pre_handler does for them.  The host's kprobes engine keeps one struct
 * kprobe_native_aggr per such address, rewritten when its probes change, and points the
 * address's detour, ftrace trampoline or int3 stub at kprobe_native_aggr_handler.
 * Nothing here may be probed. */
#include "kernel.h"
#include "sched.h"
#include "fs.h"

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

/* ---- return probes whose entry is kernel code ------------------------------------- */
/* The host's kretprobe engine keeps a struct kretprobe_native per return probe whose
 * handler is the host's: how many instances it may still take (its maxactive less
 * those pending; the host's own entry path takes and gives back through it too), how
 * many are pending here, and its id (0 once the probe is unregistered: its pending
 * returns still come, without a handler).  kretprobe_native_entry hijacks the return
 * address as pre_handler_kretprobe does, with an instance from one pool on the task's
 * list; kretprobe_native_trampoline's handler gives it back and leaves what the host's
 * handler needs in the CPU's struct kretprobe_native_ret before the host's hook, which
 * sees the registers as the function returned them.  A miss is the host's to count. */
#define KRETPROBE_NATIVES 1024
#define KRETPROBE_NATIVE_INSTANCES 4096

struct kretprobe_native {
	u64 free;
	u64 pending;
	u64 id;			/* the host's name for the probe */
};

struct kretprobe_native_instance {
	struct list_head list;	/* on the task's list while pending, else the pool's */
	unsigned long ret_addr;
	unsigned long slot;
	struct kretprobe_native *kn;
};

struct kretprobe_native_ret {
	u64 id;
	u64 ret_addr;
	u64 slot;
	u64 task;
};

struct kretprobe_native kretprobe_natives[KRETPROBE_NATIVES];
struct kretprobe_native_ret kretprobe_native_rets[NR_CPUS];
const unsigned long kretprobe_native_layout[] = {
	sizeof(struct kretprobe_native), KRETPROBE_NATIVES,
	sizeof(struct kretprobe_native_ret), NR_CPUS,
};
static struct kretprobe_native_instance kretprobe_native_pool[KRETPROBE_NATIVE_INSTANCES];
static LIST_HEAD(kretprobe_native_free);

extern char kretprobe_native_trampoline[];

/* 6.1's kprobes.c lock: held while kprobes are registered, armed or disarmed.  The
 * host's engine does that; hostfs takes this for the writes that ask for it. */
static DEFINE_MUTEX(kprobe_mutex);

void kretprobe_native_init(void)
{
	int i;

	hostfs_set_kprobe_mutex(&kprobe_mutex);
	for (i = 0; i < KRETPROBE_NATIVE_INSTANCES; i++)
		list_add(&kretprobe_native_pool[i].list, &kretprobe_native_free);
}

/* regs->sp is the slot holding the return address (the probe is at the entry). */
void __kprobes kretprobe_native_entry(struct kretprobe_native *kn, struct pt_regs *regs)
{
	unsigned long *slot = (unsigned long *)regs->sp;
	struct kretprobe_native_instance *ri;

	kn = (struct kretprobe_native *)((unsigned long)kn & ~1UL);
	if (!kn->free || list_empty(&kretprobe_native_free)) {
		hypercall(HC_KRETPROBE_MISSED, kn->id, 0, 0, 0);
		return;
	}
	ri = list_first_entry(&kretprobe_native_free, struct kretprobe_native_instance, list);
	list_del_init(&ri->list);
	kn->free--;
	kn->pending++;
	ri->kn = kn;
	ri->ret_addr = *slot;
	ri->slot = (unsigned long)slot;
	*slot = (unsigned long)kretprobe_native_trampoline;
	list_add(&ri->list, &current->kretprobe_native_instances);
}

static void __kprobes kretprobe_native_put(struct kretprobe_native_instance *ri)
{
	struct kretprobe_native *kn = ri->kn;

	list_del_init(&ri->list);
	kn->pending--;
	if (kn->id)
		kn->free++;
	list_add(&ri->list, &kretprobe_native_free);
}

/* Called by kretprobe_native_trampoline: the real return address, and the host's
 * record of this return.  regs->sp is the caller's, one slot above the return address. */
unsigned long __kprobes kretprobe_native_ret_handler(struct pt_regs *regs)
{
	unsigned long slot = regs->sp - 8;
	struct kretprobe_native_ret *r = &kretprobe_native_rets[smp_processor_id()];
	struct kretprobe_native_instance *ri;

	list_for_each_entry(ri, &current->kretprobe_native_instances, list)
		if (ri->slot == slot)
			goto found;
	panic("kretprobe_native_ret_handler: no instance for %lx", slot);
found:
	r->id = ri->kn->id;
	r->ret_addr = ri->ret_addr;
	r->slot = slot;
	r->task = (unsigned long)current;
	kretprobe_native_put(ri);
	return r->ret_addr;
}

/* The task is freed: its pending returns never come (rethook_flush_task). */
void __kprobes kretprobe_native_task_free(struct task_struct *task)
{
	struct kretprobe_native_instance *ri, *n;

	list_for_each_entry_safe(ri, n, &task->kretprobe_native_instances, list)
		kretprobe_native_put(ri);
}
