/* The kprobe event recorder's structures, shared by kernel/trace_native.c and the host
 * (the tracer writes probes and reads staged records; init/main.c exports the layout). */
#ifndef _KPF_TRACE_NATIVE_H
#define _KPF_TRACE_NATIVE_H
#include "kernel.h"
#include "sched.h"

/* ---- the trace clock, when trace_clock selects one the TSC drives: local (the TSC
 * scaled to ns, as sched_clock does), global and perf (the same, moved onto ktime by
 * sched_clock's offset), x86-tsc (raw cycles: base 0, mult 1, shift 0).  The host
 * writes the selected one and reads the TSC the same way, so host and kernel records
 * agree.  The other clocks are the host's timekeeping: the host records them. */
struct trace_clock_tsc {
	u64 tsc_base;		/* TSC at boot */
	u32 mult, shift;	/* value = offset + ((tsc - tsc_base) * mult >> shift) */
	s64 offset;
};
extern struct trace_clock_tsc trace_clock_tsc;
/* ktime_get_ns's clock: the TSC scaled to ns since boot, set once by the host at boot
 * (trace_clock_tsc is the selected trace clock and changes with it). */
extern struct trace_clock_tsc ktime_tsc;

static __always_inline u64 rdtsc(void)
{
	u32 lo, hi;

	__asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
	return ((u64)hi << 32) | lo;
}

static __always_inline u64 tsc_clock_read(const struct trace_clock_tsc *c)
{
	u64 delta = rdtsc() - c->tsc_base;

	return c->offset + (u64)(((unsigned __int128)delta * c->mult) >> c->shift);
}

/* ---- fetch programs ----------------------------------------------------------------- */
enum tn_op {
	TN_END = 0,	/* end of one argument */
	TN_REG,		/* val = *(u64 *)((char *)regs + param) */
	TN_IMM,		/* val = param */
	TN_STACK,	/* val = param-th word of the stack, 0 outside THREAD_SIZE or on a fault */
	TN_DEREF,	/* val = kernel u64 at val + param; a fault zeroes the argument */
	TN_UDEREF,	/* the same in user memory */
	TN_ST_RAW,	/* store the low `size` bytes of val */
	TN_ST_MEM,	/* store `count` (0: one) kernel values of `size` bytes at val + param */
	TN_ST_UMEM,	/* the same from user memory */
	TN_BITFIELD,	/* stored value = ((v << lshift) & mask(size)) >> rshift */
	TN_REG_RAW,	/* a whole argument, no TN_END: store `size` bytes of a register */
	TN_ST_STRING,	/* store the kernel string at val + param (a __data_loc) */
	TN_ST_USTRING,	/* the same from user memory */
	TN_COMM,	/* a whole argument, no TN_END: the task's comm, as a string */
	TN_DATA,	/* a whole argument, no TN_END: `count` bytes at param, as a string */
	TN_RETIP,	/* val = the return address (a return probe's old `ra`) */
};

struct tn_insn {
	u8 op, size, lshift, rshift;
	u32 count;
	s64 param;
};

#define TNP_RECORD 1	/* the event is enabled and tracing is on: record hits */
#define TNP_RETURN 2	/* a return probe: the data begins with __probe_func, __probe_ret_ip */
#define TNP_HOST 4	/* a static event enabled in a trace instance: hand the host each
			 * record before the filter (HC_TRACE_EVENT) */

/* An event filter in postfix order: predicates push a truth value, TF_AND/TF_OR/TF_NOT
 * combine the top ones. */
enum tf_op {
	TF_END = 0,
	TF_NUM,		/* a numeric field: `size` bytes at record `offset` */
	TF_CPU,		/* the CPU number, as an int */
	TF_STR,		/* a __data_loc string field at record `offset` */
	TF_COMM,	/* the task's comm */
	TF_FALSE,	/* a predicate on a field no comparison applies to */
	TF_AND,
	TF_OR,
	TF_NOT,
	TF_SSTR,	/* a char array of `size` bytes at record `offset` */
};
/* TF_GLOB: a string matches a pattern of `*` and `?` (the host keeps `[...]`). */
enum tf_cmp { TF_EQ, TF_NE, TF_LT, TF_LE, TF_GT, TF_GE, TF_BAND, TF_GLOB };

struct tn_pred {
	u8 op;		/* enum tf_op */
	u8 cmp;		/* enum tf_cmp (strings: TF_EQ, TF_NE or TF_GLOB) */
	u8 size;	/* a numeric field's bytes: 1, 2, 4 or 8 */
	u8 is_signed;
	u16 offset;	/* the field's offset in the record */
	u16 len;	/* a string operand's length */
	s64 value;	/* the operand, as the field's type holds it; a string's address */
};
#define TF_STACK_MAX 64	/* the host keeps deeper filters */

struct trace_native_probe {
	u64 nhit;		/* every hit, for kprobe_profile */
	u64 nmissed;		/* hits while this CPU was already recording (a nested hit) */
	const struct tn_pred *filter;	/* the event's filter, or NULL */
	u32 flags;		/* TNP_* */
	u16 type;		/* the event id */
	u8 pad[2];
	u64 ip;			/* __probe_ip (a return probe: __probe_func) */
	u32 data_size;		/* bytes of that header and the fixed part of the args */
	u32 ret_pending;	/* a return probe's instances on tasks' stacks */
	struct list_head ret_free;	/* a return probe's free instances */
	struct tn_insn insns[];	/* one program per argument, each ended by TN_END */
};

/* A pending return of a natively recorded return probe (what kretprobe_instance is):
 * on the task's kretprobe_instances list while the function runs, else on its probe's
 * free list.  The host allocates maxactive of them with the probe. */
struct tn_ret_instance {
	struct list_head list;
	struct trace_native_probe *tp;
	unsigned long ret_addr;		/* the real return address */
	unsigned long slot;		/* the stack slot that held it */
};

/* A staged record: the common fields the host's records carry, then the data. */
struct tn_entry {
	u64 ts;
	u32 size;		/* bytes of this entry, header included, a multiple of 8 */
	u32 len;		/* bytes of data */
	/* The record's ring-buffer event header as a trace_pipe_raw page holds it, ending
	 * where the common fields begin (the data's padding to 4 bytes is zeroed): a short
	 * event's word (type_len 1..28) in rb[1], rb[0] zero; a long one's (type_len 0)
	 * in rb[0], its length word in rb[1].  The delta is from the CPU's last record;
	 * one that needs a time extend gets both words RINGBUF_TYPE_TIME_EXTEND instead
	 * (the host then makes the event's header itself). */
	u32 rb[2];
	/* From here on, the record as Linux lays it out (what format files and filters
	 * count offsets in): the common fields, then the data. */
	u16 type;
	u8 flags;
	u8 preempt_count;
	s32 pid;
	u8 data[];		/* __probe_ip, the fixed part of the args, their strings */
};

#define TN_PAGE_DATA 4080	/* data bytes of a ring-buffer page */
/* The largest record data: an event's payload (8 bytes of common fields, then the
 * data) fits a page with its header and length word, or Linux drops the event. */
#define TN_DATA_MAX (TN_PAGE_DATA - 8 - 8)
/* Pages the kernel may close itself before the host takes them (in overwrite mode,
 * where opening a page always succeeds): one hypercall per TN_BATCH_MAX pages. */
#define TN_BATCH_MAX 8
/* A page of the smallest kprobe records takes at most 2 pages here (40 bytes staged for
 * 20 accounted); TN_BATCH_MAX of them, then the largest record, must fit. */
#define TN_STAGE_SIZE (72 * 1024)
#define TN_TS_DELTA_MAX (1UL << 27)
#define TN_RB_TYPE_DATA_MAX 28	/* RINGBUF_TYPE_DATA_TYPE_LEN_MAX */
#define TN_RB_TYPE_TIME_EXTEND 30

struct tn_cpu {
	u32 used;		/* accounted bytes in the host's open page */
	u32 has_last;		/* last_ts is valid */
	u64 last_ts;		/* time of the last event on this CPU */
	u32 staged;		/* bytes in stage[] */
	u32 count;		/* records in stage[] */
	u32 waiters;		/* a reader waits: wake it on each record */
	u32 busy;		/* recording now: a nested hit is missed, as kprobe_running() */
	struct task_struct *comm_task;	/* the task whose comm the host saved last */
	u32 batch;		/* pages to fill before handing them over (host-set, 1..MAX) */
	u32 closed;		/* pages the kernel closed in stage[] */
	u32 page_end[TN_BATCH_MAX];	/* stage[] bytes at each closed page's end */
	u32 page_count[TN_BATCH_MAX];	/* records in stage[] then */
	u8 stage[TN_STAGE_SIZE + 8] __aligned(8);	/* + the slack of a last 8-byte store */
};
extern struct tn_cpu trace_native_cpu[NR_CPUS];
extern u8 trace_native_arena[];
void trace_native_probe(struct trace_native_probe *tp, struct pt_regs *regs);
void trace_native_ret_entry(struct trace_native_probe *tp, struct pt_regs *regs);
unsigned long trace_native_ret_handler(struct pt_regs *regs);
void trace_native_task_free(struct task_struct *task);
void trace_native_comm_changed(struct task_struct *task);
extern const char trace_native_ret_trampoline[];
u64 trace_clock_read(void);
#endif
