/* Static tracepoints, the way Linux builds them.
 *
 * An event is written once, as TRACE_EVENT(name, proto, args, struct, assign, print) in
 * include/trace/events/SYSTEM.h.  Everywhere else that definition only declares
 * trace_NAME(args): a static branch (a 5-byte NOP in the caller's text, recorded in
 * __jump_table) around a call of the event's probe.  kernel/trace_events.c reads the
 * same definitions again with other meanings for the macros (CREATE_TRACE_POINTS):
 * the record's struct, the table of its fields (type, name, size, alignment,
 * signedness; offsets follow C's layout, as 6.1's event_define_fields computes them),
 * the print format (the TP_printk text with __entry spelled REC) and the probe, which
 * fills the record in the kernel recorder's stage (trace_native.c).  The host reads
 * the events from __trace_events and turns the branch into a jump, with text_poke,
 * when an event is enabled.  There is one probe per event (the trace event's own):
 * no perf or BPF attach to tracepoints here. */
#ifndef _KPF_TRACEPOINT_H
#define _KPF_TRACEPOINT_H
#include "kernel.h"

/* A static key: `enabled` mirrors what the host patched into the sites. */
struct static_key {
	int enabled;
};

/* One site of a static branch: the NOP at `code` becomes `jmp target` when the key
 * is enabled (absolute addresses; Linux keeps them relative). */
struct jump_entry {
	unsigned long code;
	unsigned long target;
	unsigned long key;
};

static __always_inline bool static_branch_unlikely(struct static_key *key)
{
	asm goto("1:	.byte 0x0f,0x1f,0x44,0x00,0x00\n"	/* nopl 0x0(%%rax,%%rax,1) */
		 ".pushsection __jump_table, \"aw\"\n"
		 ".balign 8\n"
		 ".quad 1b, %l[l_yes], %c0\n"
		 ".popsection\n"
		 : : "i"(key) : : l_yes);
	return false;
l_yes:
	return true;
}

/* The common fields every record starts with (struct trace_entry). */
struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
};

/* A record being written in the kernel recorder's stage (trace_native.c). */
struct trace_event_buffer {
	struct trace_native_probe *tp;
	void *entry;		/* the record: struct trace_entry, then the fields */
	u32 len;		/* bytes after the common fields */
	int cpu;
};
void *trace_event_buffer_reserve(struct trace_event_buffer *fbuffer,
				 struct trace_native_probe *tp, u32 size);
void *trace_buffer_lock_reserve(struct trace_event_buffer *fbuffer,
				struct trace_native_probe *tp, u32 size);
void trace_event_buffer_commit(struct trace_event_buffer *fbuffer);

/* set_event_pid and set_event_notrace_pid, as the events recorded in the kernel see
 * them (the host writes them; with options/event-fork the kernel adds a listed task's
 * children and drops exiting tasks, as 6.1's sched_process_fork/exit probes do). */
#define TRACE_PID_MAX 32768
struct trace_pid_filter {
	u32 pids_set;		/* set_event_pid is not empty */
	u32 no_pids_set;	/* set_event_notrace_pid is not empty */
	u32 fork;		/* options/event-fork */
	u32 pad;
	u64 pids[TRACE_PID_MAX / 64];
	u64 no_pids[TRACE_PID_MAX / 64];
};
extern struct trace_pid_filter trace_event_pids;
struct task_struct;
void trace_event_pid_fork(struct task_struct *parent, struct task_struct *child);
void trace_event_pid_exit(struct task_struct *task);

/* An event's field, as 6.1's struct trace_event_fields describes it. */
struct trace_event_field {
	const char *type;
	const char *name;
	u32 size;
	u32 align;
	u32 is_signed;
	u32 len;		/* an array's elements (0: not an array) */
};

struct trace_native_probe;

/* One static event, for the host: where its state lives and how it looks. */
struct trace_event_call {
	const char *system;
	const char *name;
	const char *print_fmt;
	const struct trace_event_field *fields;	/* ended by a NULL name */
	u32 size;			/* sizeof its struct trace_event_raw_* */
	u32 pad;
	struct static_key *key;
	struct trace_native_probe *tp;	/* flags (recording), type (id), filter, counts */
};

#define PARAMS(args...) args
#define TP_PROTO(args...) args
#define TP_ARGS(args...) args
#define TP_CONDITION(args...) args

/* The declarations every user of a trace header sees. */
#define DECLARE_TRACE(name, proto, args)					\
	extern struct static_key __tracepoint_##name;				\
	void trace_event_raw_event_##name(proto);				\
	static __always_inline void trace_##name(proto)				\
	{									\
		if (static_branch_unlikely(&__tracepoint_##name))		\
			trace_event_raw_event_##name(args);			\
	}
#define DECLARE_EVENT_CLASS(name, proto, args, tstruct, assign, print)
#define DEFINE_EVENT(template, name, proto, args)				\
	DECLARE_TRACE(name, PARAMS(proto), PARAMS(args))
#define TRACE_EVENT(name, proto, args, tstruct, assign, print)			\
	DECLARE_EVENT_CLASS(name, PARAMS(proto), PARAMS(args), PARAMS(tstruct),	\
			    PARAMS(assign), PARAMS(print))			\
	DEFINE_EVENT(name, name, PARAMS(proto), PARAMS(args))
#endif
