/* Tasks, CPUs and the register frame. */
#ifndef _KPF_SCHED_H
#define _KPF_SCHED_H
#include "kernel.h"
#include "signal.h"

#define NR_CPUS 8
#define TASK_COMM_LEN 16
#define PID_MAX 4194304
#define MUTEX_HELD_MAX 8

/* The frame exceptions and system calls save, laid out as Linux's x86_64 pt_regs. */
struct pt_regs {
	unsigned long r15, r14, r13, r12, bp, bx;
	unsigned long r11, r10, r9, r8, ax, cx, dx, si, di;
	unsigned long orig_ax;
	unsigned long ip, cs, flags, sp, ss;
};

#define TASK_RUNNING 0x0000
#define TASK_INTERRUPTIBLE 0x0001
#define TASK_UNINTERRUPTIBLE 0x0002
#define TASK_WAKEKILL 0x0100
#define TASK_KILLABLE (TASK_WAKEKILL | TASK_UNINTERRUPTIBLE)
#define TASK_DEAD 0x0080
#define EXIT_ZOMBIE 0x0020
#define EXIT_DEAD 0x0010

#define PF_EXITING 0x00000004
#define PF_KTHREAD 0x00200000
#define PF_IDLE 0x00000002

#define SCHED_NORMAL 0
#define SCHED_FIFO 1
#define SCHED_RR 2
#define SCHED_BATCH 3
#define SCHED_IDLE 5
#define MAX_RT_PRIO 100
#define DEFAULT_PRIO 120
#define NICE_TO_PRIO(nice) ((nice) + DEFAULT_PRIO)

struct thread_struct {
	unsigned long sp;		/* saved kernel stack pointer while switched out */
};

struct files_struct;
struct fs_struct;
struct mm_struct {
	unsigned long start;		/* the user window the host mapped for this task */
	unsigned long size;
	atomic_t users;
};

struct wait_queue_head {
	spinlock_t lock;
	struct list_head head;
};
typedef struct wait_queue_head wait_queue_head_t;

struct task_struct {
	volatile long __state;
	void *stack;
	unsigned int flags;
	int on_cpu;
	int on_rq;
	int cpu;
	struct list_head run_list;
	pid_t pid;
	pid_t tgid;
	struct task_struct *real_parent;
	struct list_head children;
	struct list_head sibling;
	struct list_head tasks;
	struct list_head pid_chain;
	int exit_state;
	int exit_code;
	int exit_signal;
	char comm[TASK_COMM_LEN];
	int prio;		/* what the scheduler and the sched events use */
	int static_prio;	/* 120 + nice */
	int normal_prio;	/* static_prio, or 99 - rt_priority for SCHED_FIFO/RR */
	unsigned int policy;
	unsigned int rt_priority;
	struct thread_struct thread;
	struct mm_struct *mm;
	struct files_struct *files;
	struct fs_struct *fs;
	wait_queue_head_t wait_chldexit;
	struct list_head kretprobe_instances;	/* for the host's kretprobe engine */
	struct list_head kretprobe_native_instances;	/* kprobes_native.c's */
	unsigned long nvcsw, nivcsw;
	unsigned long utime_ns;
	unsigned long start_time;
	int syscall_nr;
	int oops;
	/* The mutexes the task holds (kernel/locking.c), so that a task killed by an oops
	 * lets them go; past MUTEX_HELD_MAX the rest are not remembered. */
	struct mutex *mutexes_held[MUTEX_HELD_MAX];
	int nr_mutexes_held;
	struct sigpending pending;		/* kernel/signal.c */
	struct k_sigaction sig_action[_NSIG];
};

/* Per-CPU block, addressed through %gs like Linux's per-CPU area. */
struct upcall_slot {
	unsigned long fn;
	unsigned long args[6];
	unsigned long ret;
};
struct pcpu {
	struct pcpu *self;		/* %gs:0 */
	struct task_struct *current_task;	/* %gs:8 */
	int cpu_number;			/* %gs:16 */
	int preempt_count;
	struct task_struct *idle;
	struct list_head runqueue;
	unsigned long nr_switches;
	unsigned long irq_count;
	struct upcall_slot upcall;
	unsigned long softirq_pending;
};
extern struct pcpu pcpu_area[NR_CPUS];
extern int nr_cpu_ids;

static __always_inline struct task_struct *get_current(void)
{
	struct task_struct *t;
	__asm__("movq %%gs:8, %0" : "=r"(t));
	return t;
}
#define current get_current()

void kretprobe_native_init(void);
void kretprobe_native_task_free(struct task_struct *task);
static __always_inline int smp_processor_id(void)
{
	int cpu;
	__asm__("movl %%gs:16, %0" : "=r"(cpu));
	return cpu;
}
static __always_inline struct pcpu *this_pcpu(void)
{
	struct pcpu *p;
	__asm__("movq %%gs:0, %0" : "=r"(p));
	return p;
}

static inline struct pt_regs *task_pt_regs(struct task_struct *t)
{
	return (struct pt_regs *)((char *)t->stack + THREAD_SIZE) - 1;
}
#define set_current_state(s) WRITE_ONCE(current->__state, (s))

extern struct task_struct init_task;
extern struct list_head task_list_head;
extern int nr_threads;
extern unsigned long total_forks;
/* Taken through the out-of-line lock API (_raw_spin_lock), as Linux's
 * write_lock_irq(&tasklist_lock) is a call of _raw_write_lock_irq: every fork and exit
 * enters a traceable lock function (a `*lock*` stack_trace_filter sees one). */
extern spinlock_t tasklist_lock;

void sched_init(void);
void __noreturn cpu_idle_loop(void);
void schedule(void);
void schedule_tail(struct task_struct *prev);
void put_task_stack(struct task_struct *tsk);
extern pid_t pid_auto_base;
pid_t alloc_pid(struct task_struct *tsk, pid_t *set_tid, size_t set_tid_size);
void free_pid(struct task_struct *tsk);
pid_t kernel_thread(int (*fn)(void *), void *arg, const char *name);
int wake_up_process(struct task_struct *p);
void scheduler_tick(void);
void update_process_times(void);
void wake_up_new_task(struct task_struct *p);
void set_user_nice(struct task_struct *p, long nice);
int sched_setscheduler_nocheck(struct task_struct *p, int policy, int rt_priority);
struct task_struct *__switch_to(struct task_struct *prev, struct task_struct *next);
struct task_struct *find_task_by_vpid(pid_t pid);
void __noreturn do_exit(long code);
void __noreturn make_task_dead(int signr);
void mutex_release_held(struct task_struct *tsk);
void __noreturn user_mode_loop(void);
void init_waitqueue_head(wait_queue_head_t *wq);
void __wake_up(wait_queue_head_t *wq);
struct wait_queue_entry {
	struct task_struct *task;
	struct list_head entry;
};
#define DEFINE_WAIT(name) struct wait_queue_entry name = { .entry = LIST_HEAD_INIT(name.entry) }
void prepare_to_wait(wait_queue_head_t *wq, struct wait_queue_entry *w);
void finish_wait(wait_queue_head_t *wq, struct wait_queue_entry *w);

struct kernel_clone_args {
	u64 flags;
	int exit_signal;
	pid_t *set_tid;
	size_t set_tid_size;
	int (*fn)(void *);
	void *fn_arg;
};
pid_t kernel_clone(struct kernel_clone_args *args);
void __set_task_comm(struct task_struct *tsk, const char *from, bool exec);
pid_t kernel_wait4(pid_t upid, int __user *stat_addr, int options);
void release_task(struct task_struct *p);

/* entry.S */
struct task_struct *__switch_to_asm(struct task_struct *prev, struct task_struct *next,
				    unsigned long *prev_sp, unsigned long next_sp);
void ret_from_fork(void);

#endif
