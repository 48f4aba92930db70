/* Boot: start_kernel() on the boot CPU, start_secondary() on the others, and the table
 * of structure offsets the host reads to find its way around kernel memory. */
#include "sched.h"
#include "mm.h"
#include "hardirq.h"
#include "fs.h"
#include "trace_native.h"

/* Filled in by the host before the first instruction runs. */
struct boot_params {
	unsigned long nr_cpus;
	unsigned long mem_start;	/* physical range the page allocator owns */
	unsigned long mem_end;
	unsigned long pid_auto_base;
} boot_params;

union thread_union {
	struct task_struct task;
	unsigned long stack[THREAD_SIZE / sizeof(long)];
};
static union thread_union init_thread_union __aligned(THREAD_SIZE);
static union thread_union idle_stacks[NR_CPUS - 1] __aligned(THREAD_SIZE);

/* Where each CPU's idle task starts: the host sets %rsp from here. */
unsigned long idle_stack_top[NR_CPUS];

struct task_struct init_task __section(".data.init_task") = {
	.__state = TASK_RUNNING,
	.flags = PF_KTHREAD | PF_IDLE,
	.on_cpu = 1,
	.pid = 0,
	.comm = "swapper/0",
	.prio = DEFAULT_PRIO,
	.static_prio = DEFAULT_PRIO,
	.normal_prio = DEFAULT_PRIO,
	.run_list = LIST_HEAD_INIT(init_task.run_list),
	.children = LIST_HEAD_INIT(init_task.children),
	.sibling = LIST_HEAD_INIT(init_task.sibling),
	.tasks = LIST_HEAD_INIT(init_task.tasks),
	.pid_chain = LIST_HEAD_INIT(init_task.pid_chain),
	.kretprobe_instances = LIST_HEAD_INIT(init_task.kretprobe_instances),
	.kretprobe_native_instances = LIST_HEAD_INIT(init_task.kretprobe_native_instances),
};

static struct task_struct idle_tasks[NR_CPUS - 1];

extern const char linux_banner[];
extern void pidhash_init(void);
extern void kmem_cache_init(void);
extern void attach_pid(struct task_struct *tsk);
extern void net_init(void);
extern void workload_init(void);

static void init_idle(struct task_struct *idle, int cpu, void *stack)
{
	struct pcpu *p = &pcpu_area[cpu];

	idle->stack = stack;
	idle->cpu = cpu;
	idle->on_cpu = 1;
	idle->flags = PF_KTHREAD | PF_IDLE;
	idle->prio = idle->static_prio = idle->normal_prio = DEFAULT_PRIO;
	idle->__state = TASK_RUNNING;
	snprintf(idle->comm, sizeof(idle->comm), "swapper/%d", cpu);
	INIT_LIST_HEAD(&idle->run_list);
	INIT_LIST_HEAD(&idle->children);
	INIT_LIST_HEAD(&idle->sibling);
	INIT_LIST_HEAD(&idle->tasks);
	INIT_LIST_HEAD(&idle->pid_chain);
	INIT_LIST_HEAD(&idle->kretprobe_instances);
	INIT_LIST_HEAD(&idle->kretprobe_native_instances);
	p->idle = idle;
	p->current_task = idle;
	idle_stack_top[cpu] = (unsigned long)stack + THREAD_SIZE;
}

/* init (pid 1) spends its life in user mode: the host may hand it system calls. */
static void rest_init(void)
{
	pid_t one = 1;
	struct kernel_clone_args args = {
		.exit_signal = 17, .set_tid = &one, .set_tid_size = 1,
	};
	pid_t pid = kernel_clone(&args);

	if (pid > 0)
		__set_task_comm(find_task_by_vpid(pid), "init", false);
}

void __noreturn start_kernel(void)
{
	int cpu;

	sched_init();
	nr_cpu_ids = boot_params.nr_cpus ? boot_params.nr_cpus : 1;
	if (nr_cpu_ids > NR_CPUS)
		nr_cpu_ids = NR_CPUS;
	if (boot_params.pid_auto_base)
		pid_auto_base = boot_params.pid_auto_base;
	init_idle(&init_task, 0, &init_thread_union);
	mem_init(boot_params.mem_start, boot_params.mem_end);
	kmem_cache_init();
	kretprobe_native_init();
	pidhash_init();
	for (cpu = 1; cpu < nr_cpu_ids; cpu++)
		init_idle(&idle_tasks[cpu - 1], cpu, &idle_stacks[cpu - 1]);
	printk(KERN_INFO "%s", linux_banner);
	printk(KERN_INFO "Memory: %luK available\n", totalram_pages << (PAGE_SHIFT - 10));
	init_IRQ();
	vfs_caches_init();
	net_init();
	rest_init();
	printk(KERN_INFO "smp: Bringing up %d CPUs\n", nr_cpu_ids);
	hypercall(HC_BOOTED, nr_cpu_ids, 0, 0, 0);
	cpu_idle_loop();
}

void __noreturn start_secondary(void)
{
	cpu_idle_loop();
}

/* ---- the host's map of kernel structures ------------------------------------------ */
struct kabi_entry {
	const char *name;
	unsigned long value;
};
#define KABI(n, v) { n, (unsigned long)(v) }
#define KOFF(n, t, m) KABI(n, offsetof(t, m))
const struct kabi_entry kabi[] = {
	KOFF("task.state", struct task_struct, __state),
	KOFF("task.stack", struct task_struct, stack),
	KOFF("task.flags", struct task_struct, flags),
	KOFF("task.pid", struct task_struct, pid),
	KOFF("task.tgid", struct task_struct, tgid),
	KOFF("task.comm", struct task_struct, comm),
	KOFF("task.real_parent", struct task_struct, real_parent),
	KOFF("task.tasks", struct task_struct, tasks),
	KOFF("task.exit_state", struct task_struct, exit_state),
	KOFF("task.exit_code", struct task_struct, exit_code),
	KOFF("task.mm", struct task_struct, mm),
	KOFF("task.on_cpu", struct task_struct, on_cpu),
	KOFF("task.oops", struct task_struct, oops),
	KOFF("task.kretprobe_instances", struct task_struct, kretprobe_instances),
	KOFF("mm.start", struct mm_struct, start),
	KABI("pcpu.size", sizeof(struct pcpu)),
	KOFF("pcpu.current_task", struct pcpu, current_task),
	KOFF("pcpu.upcall", struct pcpu, upcall),
	KOFF("pcpu.preempt_count", struct pcpu, preempt_count),
	KOFF("pcpu.nr_switches", struct pcpu, nr_switches),
	KOFF("pcpu.runqueue", struct pcpu, runqueue),
	KABI("pt_regs.size", sizeof(struct pt_regs)),
	KOFF("pt_regs.orig_ax", struct pt_regs, orig_ax),
	KABI("thread_size", THREAD_SIZE),
	KABI("trace_native.cpu_size", sizeof(trace_native_cpu[0])),
	KABI("trace_native.stage", offsetof(typeof(trace_native_cpu[0]), stage)),
	KABI("trace_native.batch", offsetof(typeof(trace_native_cpu[0]), batch)),
	KABI("trace_native.batch_max", TN_BATCH_MAX),
	KABI("trace_native.probe_insns", offsetof(struct trace_native_probe, insns)),
	KABI("trace_native.entry_size", sizeof(struct tn_entry)),
	KABI("kmem_cache.size", sizeof(struct kmem_cache)),
	KOFF("kmem_cache.name", struct kmem_cache, name),
	KOFF("kmem_cache.object_size", struct kmem_cache, size),
	KOFF("kmem_cache.objs_per_slab", struct kmem_cache, objs_per_slab),
	KOFF("kmem_cache.nr_slabs", struct kmem_cache, nr_slabs),
	KOFF("kmem_cache.nr_active", struct kmem_cache, nr_active),
	KABI("kmalloc.nr_caches", NR_KMALLOC),
	KABI("page_offset", PAGE_OFFSET),
	KABI("task_size_max", TASK_SIZE_MAX),
	KABI("nr_cpus_max", NR_CPUS),
	{ NULL, 0 },
};
