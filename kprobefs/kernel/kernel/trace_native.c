/* The kprobe event recorder in kernel context: what Linux's kprobe_trace_func and
 * kretprobe_trace_func do.
 *
 * A probe's detour, ftrace trampoline or int3 stub calls trace_native_probe(tp, regs)
 * with the registers saved as a struct pt_regs (a return probe: trace_native_ret_entry,
 * then trace_native_ret_handler from trace_native_ret_trampoline).  The host (the tracer)
 * compiles each event's fetch arguments and filter into small programs when the event is
 * defined; here they are only interpreted.  The record goes into this CPU's staging
 * area, in the layout of struct tn_entry; the host takes staged records into its ring
 * buffer when it reads the buffer, writes its own record on this CPU, or when the staged
 * records fill its pages (HC_TRACE_PAGE_FULL; overwriting, the kernel closes up to
 * TN_BATCH_MAX full pages first).  Pages are accounted exactly as the host accounts them
 * (Linux's rule: a 4-byte event header, the payload rounded up to 4 bytes, a length word
 * past 112 bytes, an 8-byte time extend when the delta does not fit 27 bits), so a page
 * here holds what a ring-buffer page holds.
 *
 * Nothing here may be probed (it runs inside a probe), hence __kprobes. */
#include "kernel.h"
#include "sched.h"
#include "uaccess.h"
#include "trace_native.h"
#include "tracepoint.h"
#include "hardirq.h"

#define __kprobes notrace __section(".kprobes.text")

struct trace_clock_tsc trace_clock_tsc;

/* The selected trace clock's value, for a record's timestamp. */
u64 __kprobes trace_clock_read(void)
{
	return tsc_clock_read(&trace_clock_tsc);
}

struct tn_cpu trace_native_cpu[NR_CPUS];

/* Host-managed memory for struct trace_native_probe (the host allocates in it). */
u8 trace_native_arena[1024 * 1024] __aligned(64);

#define TN_KERNEL_MIN 0x0000800000000000UL

static __always_inline bool canonical(unsigned long a)
{
	unsigned long top = a >> 47;

	return top == 0 || top == 0x1ffff;
}

/* One load that may fault: 0 on success, -EFAULT (the exception table's fixup). */
#define DEFINE_LOAD_NOFAULT(bits, insn, reg)					\
static noinline int __kprobes load##bits##_nofault(unsigned long addr, u64 *out) \
{										\
	int err = 0;								\
	u64 v = 0;								\
	__asm__ __volatile__(							\
		"1:	" insn " (%2), %" reg "1\n"				\
		"2:\n"								\
		".pushsection .text.unlikely\n"					\
		"3:	movl %3, %0\n"						\
		"	jmp 2b\n"						\
		".popsection\n"							\
		_ASM_EXTABLE(1b, 3b)						\
		: "+r"(err), "+r"(v)						\
		: "r"(addr), "i"(-EFAULT));					\
	*out = v;								\
	return err;								\
}
DEFINE_LOAD_NOFAULT(8, "movzbq", "q")
DEFINE_LOAD_NOFAULT(16, "movzwq", "q")
DEFINE_LOAD_NOFAULT(32, "movl", "k")
DEFINE_LOAD_NOFAULT(64, "movq", "q")

/* Read `size` bytes at addr (kernel or user memory as the fetcharg says).  x86's
 * address spaces do not overlap (CONFIG_ARCH_HAS_NON_OVERLAPPING_ADDRESS_SPACE), so a
 * kernel read below TASK_SIZE reads user memory, as 6.1's probe_mem_read does. */
static int __kprobes fetch_load(unsigned long addr, int size, bool user, u64 *out)
{
	if (user || addr < TASK_SIZE_MAX) {
		if (addr > TASK_SIZE_MAX || TASK_SIZE_MAX - addr < (unsigned long)size)
			return -EFAULT;
	} else if (addr < TN_KERNEL_MIN || !canonical(addr)) {
		return -EFAULT;
	}
	switch (size) {
	case 1: return load8_nofault(addr, out);
	case 2: return load16_nofault(addr, out);
	case 4: return load32_nofault(addr, out);
	default: return load64_nofault(addr, out);
	}
}

/* Store the low `size` bytes of v.  Exactly those: an 8-byte store of the last fixed
 * value would run into the dynamic data, where an earlier argument's string already is
 * (TN_REG_RAW stores 8 bytes: the host uses it only where no string lies in reach). */
static __always_inline void store_value(u8 *dst, u64 v, int size)
{
	switch (size) {
	case 1: *dst = (u8)v; break;
	case 2: *(u16 *)dst = (u16)v; break;
	case 4: *(u32 *)dst = (u32)v; break;
	default: *(u64 *)dst = v; break;
	}
}

static __always_inline u64 size_mask(int size)
{
	return size >= 8 ? ~0UL : (1UL << (8 * size)) - 1;
}

static __always_inline u64 apply_bitfield(const struct tn_insn *bf, u64 v)
{
	return ((v << bf->lshift) & size_mask(bf->size)) >> bf->rshift;
}

/* Where a record is being written: the fixed part's cursor, the dynamic data's (strings),
 * where a __data_loc says the dynamic data is (counted from the record's start, the 8
 * bytes of common fields included), and how far the record may grow. */
struct tn_rec {
	u8 *fixed;
	u8 *dyn;
	u32 dyn_loc;
	u8 *limit;
	unsigned long ret_ip;	/* a return probe's return address */
};

#define TN_STRING_MAX 4096	/* a string's bytes, its NUL included (PATH_MAX) */
#define TN_TOO_BIG 1

/* A string of `len` bytes (its NUL included; 0: "(fault)") now at r->dyn: store its
 * __data_loc and move past it. */
static __always_inline void put_string(struct tn_rec *r, u32 len)
{
	*(u32 *)r->fixed = len << 16 | r->dyn_loc;
	r->fixed += 4;
	r->dyn += len;
	r->dyn_loc += len;
}

/* Append a string's bytes and its NUL to the dynamic data and store its __data_loc;
 * a fault stores an empty one ("(fault)").  TN_TOO_BIG if the record would outgrow a
 * ring-buffer page (Linux drops such an event). */
static int __kprobes store_string(struct tn_rec *r, unsigned long addr, bool user,
				  bool fault)
{
	u8 *start = r->dyn, *out = start;
	u64 c = 0;

	if (addr < TASK_SIZE_MAX)	/* a kernel string there is the user's (fetch_load) */
		user = true;
	if (!fault && (user ? addr >= TASK_SIZE_MAX : addr < TN_KERNEL_MIN || !canonical(addr)))
		fault = true;
	while (!fault) {
		if (out - start == TN_STRING_MAX - 1)
			break;
		if (out == r->limit)
			return TN_TOO_BIG;
		if (fetch_load(addr++, 1, user, &c))
			fault = true;
		else if (!c)
			break;
		else
			*out++ = (u8)c;
	}
	if (fault) {
		put_string(r, 0);
		return 0;
	}
	if (out == r->limit)
		return TN_TOO_BIG;
	*out++ = 0;
	put_string(r, out - start);
	return 0;
}

/* strnlen of the comm, here because a probe may sit on lib's strnlen. */
static __always_inline u32 comm_len(const struct task_struct *task)
{
	u32 n = 0;

	while (n < TASK_COMM_LEN - 1 && task->comm[n])
		n++;
	return n;
}

/* Append `len` known bytes ($comm, an immediate string) as a string argument. */
static int __kprobes store_bytes(struct tn_rec *r, const u8 *src, u32 len)
{
	u32 i;

	if (r->dyn + len + 1 > r->limit)
		return TN_TOO_BIG;
	for (i = 0; i < len; i++)
		r->dyn[i] = src[i];
	r->dyn[len] = 0;
	put_string(r, len + 1);
	return 0;
}

/* Run one argument's program from *pc into r and leave *pc past its TN_END.  A fault
 * in a dereference stores zeroes (a string: an empty one), as the host's interpreter
 * does. */
static __always_inline int run_fetch(const struct tn_insn **pc, struct pt_regs *regs,
				     struct tn_rec *r)
{
	const struct tn_insn *insn = *pc, *store, *bf = NULL;
	unsigned long sp, addr;
	u64 val = 0, v;
	u32 i, n, size;
	bool fault = false;

	switch (insn->op) {
	case TN_REG:
		val = *(u64 *)((char *)regs + insn->param);
		break;
	case TN_IMM:
		val = insn->param;
		break;
	case TN_RETIP:
		val = r->ret_ip;
		break;
	case TN_STACK:
		sp = regs->sp;
		addr = sp + 8 * insn->param;
		if ((addr & ~(THREAD_SIZE - 1)) != (sp & ~(THREAD_SIZE - 1)) ||
		    fetch_load(addr, 8, false, &val))
			val = 0;
		break;
	}
	for (insn++; insn->op == TN_DEREF || insn->op == TN_UDEREF; insn++) {
		if (!fault && fetch_load(val + insn->param, 8, insn->op == TN_UDEREF, &val))
			fault = true;
	}
	store = insn++;
	if (insn->op == TN_BITFIELD)
		bf = insn++;
	*pc = insn + 1;		/* past TN_END */

	if (store->op == TN_ST_STRING || store->op == TN_ST_USTRING)
		return store_string(r, val + store->param, store->op == TN_ST_USTRING, fault);
	size = store->size;
	n = store->op == TN_ST_RAW || !store->count ? 1 : store->count;
	for (i = 0; i < n; i++) {
		if (fault) {
			v = 0;
		} else if (store->op == TN_ST_RAW) {
			v = val & size_mask(size);
		} else if (fetch_load(val + store->param + i * size, size,
				      store->op == TN_ST_UMEM, &v)) {
			v = 0;
		}
		if (bf && !fault)
			v = apply_bitfield(bf, v);
		store_value(r->fixed + i * size, v, size);
	}
	r->fixed += n * size;
	return 0;
}

/* Write the data of tp's record at data: __probe_ip (or __probe_func and
 * __probe_ret_ip), the arguments, their strings.  Returns its length, or -1 when it
 * would outgrow a ring-buffer page. */
static __always_inline int write_data(struct trace_native_probe *tp, struct pt_regs *regs,
				      struct task_struct *task, u8 *data,
				      unsigned long ret_ip)
{
	const struct tn_insn *pc;
	bool ret = tp->flags & TNP_RETURN;
	struct tn_rec r = {
		.fixed = data + (ret ? 16 : 8),
		.dyn = data + tp->data_size,
		.dyn_loc = 8 + tp->data_size,
		.limit = data + TN_DATA_MAX,
		.ret_ip = ret_ip,
	};
	int err = 0;

	*(u64 *)data = tp->ip;
	if (ret)
		*(u64 *)(data + 8) = ret_ip;
	for (pc = tp->insns; pc->op != TN_END && !err;) {
		if (likely(pc->op == TN_REG_RAW)) {
			/* 8 bytes: the host encodes this only where that is safe. */
			*(u64 *)r.fixed = *(u64 *)((char *)regs + pc->param);
			r.fixed += pc->size;
		} else if (pc->op == TN_COMM) {
			err = store_bytes(&r, (const u8 *)task->comm, comm_len(task));
		} else if (pc->op == TN_DATA) {
			err = store_bytes(&r, (const u8 *)pc->param, pc->count);
		} else {
			err = run_fetch(&pc, regs, &r);
			continue;
		}
		pc++;
	}
	return err ? -1 : r.dyn - data;
}

/* ---- event filters ------------------------------------------------------------------ */
static __always_inline s64 read_field(const u8 *rec, const struct tn_pred *p)
{
	const u8 *f = rec + p->offset;

	switch (p->size) {
	case 1: return p->is_signed ? (s64)*(const s8 *)f : (s64)*f;
	case 2: return p->is_signed ? (s64)*(const s16 *)f : (s64)*(const u16 *)f;
	case 4: return p->is_signed ? (s64)*(const s32 *)f : (s64)*(const u32 *)f;
	default: return *(const s64 *)f;
	}
}

static __always_inline bool compare(const struct tn_pred *p, s64 v, int bits)
{
	u64 mask = bits >= 64 ? ~0UL : (1UL << bits) - 1;

	switch (p->cmp) {
	case TF_EQ: return ((u64)v & mask) == ((u64)p->value & mask);
	case TF_NE: return ((u64)v & mask) != ((u64)p->value & mask);
	case TF_BAND: return (v & p->value) != 0;
	}
	if (p->is_signed) {
		switch (p->cmp) {
		case TF_LT: return v < p->value;
		case TF_LE: return v <= p->value;
		case TF_GT: return v > p->value;
		default: return v >= p->value;
		}
	}
	switch (p->cmp) {
	case TF_LT: return (u64)v < (u64)p->value;
	case TF_LE: return (u64)v <= (u64)p->value;
	case TF_GT: return (u64)v > (u64)p->value;
	default: return (u64)v >= (u64)p->value;
	}
}

/* Whether the n bytes at s, up to a NUL, equal the operand (TF_GLOB: match it, where
 * `*` is any run of characters and `?` any one). */
static __always_inline bool string_is(const struct tn_pred *p, const char *s, u32 n)
{
	const char *want = (const char *)p->value;
	u32 i, len = 0, star = ~0U, mark = 0;

	while (len < n && s[len])
		len++;
	if (p->cmp != TF_GLOB) {
		if (len != p->len)
			return false;
		for (i = 0; i < len; i++)
			if (s[i] != want[i])
				return false;
		return true;
	}
	for (i = 0, n = 0; n < len;) {
		if (i < p->len && want[i] == '*') {
			star = i++;
			mark = n;
		} else if (i < p->len && (want[i] == '?' || want[i] == s[n])) {
			i++;
			n++;
		} else if (star != ~0U) {
			i = star + 1;
			n = ++mark;
		} else {
			return false;
		}
	}
	while (i < p->len && want[i] == '*')
		i++;
	return i == p->len;
}

static bool __kprobes filter_match(const struct tn_pred *p, const u8 *rec,
				   const struct task_struct *task, int cpu)
{
	bool stack[TF_STACK_MAX];
	int depth = 0;
	u32 loc;
	bool v;

	for (; p->op != TF_END; p++) {
		switch (p->op) {
		case TF_AND:
			depth--;
			stack[depth - 1] = stack[depth - 1] && stack[depth];
			continue;
		case TF_OR:
			depth--;
			stack[depth - 1] = stack[depth - 1] || stack[depth];
			continue;
		case TF_NOT:
			stack[depth - 1] = !stack[depth - 1];
			continue;
		case TF_NUM:
			v = compare(p, read_field(rec, p), 8 * p->size);
			break;
		case TF_CPU:
			v = compare(p, cpu, 32);
			break;
		case TF_STR:
			loc = *(const u32 *)(rec + p->offset);
			v = string_is(p, (const char *)rec + (loc & 0xffff), loc >> 16);
			v = p->cmp == TF_NE ? !v : v;
			break;
		case TF_SSTR:
			v = string_is(p, (const char *)rec + p->offset, p->size);
			v = p->cmp == TF_NE ? !v : v;
			break;
		case TF_COMM:
			v = string_is(p, task->comm, TASK_COMM_LEN);
			v = p->cmp == TF_NE ? !v : v;
			break;
		default:
			v = false;
			break;
		}
		stack[depth++] = v;
	}
	return stack[0];
}

/* The bytes a record of `len` data bytes, stamped ts, takes in the host's page. */
static __always_inline u32 record_acct(struct tn_cpu *c, u32 len, u64 ts)
{
	u32 payload = ALIGN(8 + len, 4);	/* the common fields, then the data */
	u32 acct = 4 + payload + (payload > 112 ? 4 : 0);

	if (c->has_last && ts - c->last_ts >= TN_TS_DELTA_MAX)
		acct += 8;
	return acct;
}

/* The open page is full: close it and go on in the next (overwrite mode: the host
 * opens them all when it takes them), or have the host take the staged pages and open
 * the next one.  False: the event is dropped (overwrite off, buffer full).  When the
 * host took the pages, c->staged moved. */
static __always_inline bool next_page(struct tn_cpu *c, int cpu, bool closable)
{
	if (closable && c->closed + 1 < c->batch) {
		c->page_end[c->closed] = c->staged;
		c->page_count[c->closed] = c->count;
		c->closed++;
		c->used = 0;
		return true;
	}
	return hypercall(HC_TRACE_PAGE_FULL, cpu, 0, 0, 0);
}

/* Make room for a record of `len` data bytes in the host's open page.  Returns the
 * bytes it accounts for, or 0 to drop it. */
static __always_inline u32 make_room(struct tn_cpu *c, int cpu, u32 len, u64 ts)
{
	u32 acct;

	for (;;) {
		acct = record_acct(c, len, ts);
		if (c->used + acct <= TN_PAGE_DATA)
			return acct;
		if (!next_page(c, cpu, true))
			return 0;
	}
}

/* Where the next record goes, with room for the largest one: a page of records never
 * fills the stage, so the host taking them is only a safeguard.  NULL: dropped. */
static __always_inline struct tn_entry *stage_slot(struct tn_cpu *c, int cpu)
{
	while (c->staged + sizeof(struct tn_entry) + TN_DATA_MAX > TN_STAGE_SIZE)
		if (!hypercall(HC_TRACE_PAGE_FULL, cpu, 0, 0, 0))
			return NULL;
	return (struct tn_entry *)(c->stage + c->staged);
}

/* The host took the staged pages while a record waited at e: move it (its common
 * fields and `len` data bytes) to where the stage ends now. */
static noinline struct tn_entry * __kprobes move_record(struct tn_cpu *c,
							 struct tn_entry *e, u32 len)
{
	struct tn_entry *to = (struct tn_entry *)(c->stage + c->staged);
	u8 *dst = (u8 *)&to->type;
	const u8 *src = (const u8 *)&e->type;
	u32 i;

	for (i = 0; i < 8 + len; i++)	/* forward: the new place is never after the old */
		dst[i] = src[i];
	return to;
}

/* The host keeps saved_cmdlines: tell it once per task change. */
static __always_inline void save_comm(struct tn_cpu *c, int cpu, struct task_struct *task)
{
	if (unlikely(c->comm_task != task)) {
		hypercall(HC_TRACE_COMM, cpu, 0, 0, 0);
		c->comm_task = task;
	}
}

/* Write e's ring-buffer event header (struct tn_entry's rb) for `len` data bytes
 * stamped ts, and zero the data's padding to 4 bytes: the event as a trace_pipe_raw
 * page holds it is then the entry's bytes from its header word on. */
static __always_inline void set_event_header(struct tn_cpu *c, struct tn_entry *e,
					     u32 len, u64 ts)
{
	u32 payload = ALIGN(8 + len, 4);	/* the common fields, then the data */
	u64 delta = c->has_last && ts > c->last_ts ? ts - c->last_ts : 0;
	u32 i;

	for (i = len; i & 3; i++)
		e->data[i] = 0;
	if (delta >= TN_TS_DELTA_MAX) {
		e->rb[0] = e->rb[1] = TN_RB_TYPE_TIME_EXTEND;
	} else if (payload <= TN_RB_TYPE_DATA_MAX * 4) {
		e->rb[0] = 0;
		e->rb[1] = payload >> 2 | (u32)delta << 5;
	} else {
		e->rb[0] = (u32)delta << 5;
		e->rb[1] = payload + 4;		/* the length word counts itself */
	}
}

/* Stage the record at e, `len` data bytes, its common fields written. */
static __always_inline void stage_commit(struct tn_cpu *c, int cpu, struct tn_entry *e,
					 u32 len, u32 acct, u64 ts)
{
	u32 size = sizeof(*e) + ALIGN(len, 8);

	set_event_header(c, e, len, ts);
	e->ts = ts;
	e->size = size;
	e->len = len;
	c->staged += size;
	c->count++;
	c->used += acct;
	c->last_ts = ts;
	c->has_last = 1;
	if (unlikely(READ_ONCE(c->waiters)))
		hypercall(HC_TRACE_WAKE, cpu, 0, 0, 0);
}

static __always_inline void set_common(struct tn_entry *e, u16 type, u8 flags, pid_t pid)
{
	e->type = type;
	e->flags = flags;
	e->preempt_count = 0;
	e->pid = pid;
}

/* The task's comm changed: have the next record save it again (saved_cmdlines keeps
 * the latest, as Linux's does once the renamed task records). */
void __kprobes trace_native_comm_changed(struct task_struct *task)
{
	int cpu;

	for (cpu = 0; cpu < NR_CPUS; cpu++)
		if (trace_native_cpu[cpu].comm_task == task)
			trace_native_cpu[cpu].comm_task = NULL;
}

/* Stage one record of tp's event on this CPU. */
static __always_inline void record(struct trace_native_probe *tp, struct pt_regs *regs,
				   struct tn_cpu *c, int cpu, unsigned long ret_ip, u8 flags)
{
	struct task_struct *task = current;
	struct tn_entry *e;
	u32 acct;
	int len;
	u64 ts;

	save_comm(c, cpu, task);
	ts = trace_clock_read();
	for (;;) {
		/* A page of records never fills the stage, so there is always room for the
		 * largest record after the staged ones (the check is only a safeguard). */
		e = (struct tn_entry *)(c->stage + c->staged);
		len = c->staged + sizeof(*e) + TN_DATA_MAX <= TN_STAGE_SIZE ?
			write_data(tp, regs, task, e->data, ret_ip) : 0;
		if (len < 0)
			return;
		if (len && tp->filter) {
			/* The record as the filter sees it: the common fields, the data. */
			set_common(e, tp->type, flags, task->pid);
			if (!filter_match(tp->filter, (const u8 *)&e->type, task, cpu))
				return;
		}
		acct = record_acct(c, len, ts);
		if (len && c->used + acct <= TN_PAGE_DATA)
			break;
		/* Written again where the stage ends once the host took the pages. */
		if (!next_page(c, cpu, len))
			return;
	}
	set_common(e, tp->type, flags, task->pid);
	stage_commit(c, cpu, e, len, acct, ts);
}

/* ---- static events (kernel/trace_events.c) ------------------------------------------ */
struct trace_pid_filter trace_event_pids;

static __always_inline bool pid_in(const u64 *set, pid_t pid)
{
	return (unsigned int)pid < TRACE_PID_MAX && (set[pid / 64] >> (pid % 64)) & 1;
}

static __always_inline void pid_assign(u64 *set, pid_t pid, bool on)
{
	if ((unsigned int)pid >= TRACE_PID_MAX)
		return;
	if (on)
		set[pid / 64] |= 1UL << (pid % 64);
	else
		set[pid / 64] &= ~(1UL << (pid % 64));
}

/* 6.1's trace_ignore_this_task: not in a non-empty set_event_pid, or in
 * set_event_notrace_pid. */
static __always_inline bool trace_event_ignore_pid(pid_t pid)
{
	struct trace_pid_filter *f = &trace_event_pids;

	return (f->pids_set && !pid_in(f->pids, pid)) ||
	       (f->no_pids_set && pid_in(f->no_pids, pid));
}

/* options/event-fork: a child of a listed task is listed (in either list). */
void __kprobes trace_event_pid_fork(struct task_struct *parent, struct task_struct *child)
{
	struct trace_pid_filter *f = &trace_event_pids;

	if (!READ_ONCE(f->fork))
		return;
	if (f->pids_set && pid_in(f->pids, parent->pid))
		pid_assign(f->pids, child->pid, true);
	if (f->no_pids_set && pid_in(f->no_pids, parent->pid))
		pid_assign(f->no_pids, child->pid, true);
}

/* options/event-fork: an exiting task leaves the lists. */
void __kprobes trace_event_pid_exit(struct task_struct *task)
{
	struct trace_pid_filter *f = &trace_event_pids;

	if (!READ_ONCE(f->fork))
		return;
	pid_assign(f->pids, task->pid, false);
	pid_assign(f->no_pids, task->pid, false);
}

/* Reserve a record of `size` bytes, the common fields included, of tp's type, and
 * return it with its common fields set; the caller fills the rest and commits.  NULL
 * when it does not record (disabled, nested in the recorder, no room).  Not filtered by
 * pid: trace_printk's records (trace_buffer_lock_reserve). */
void * __kprobes trace_buffer_lock_reserve(struct trace_event_buffer *fbuffer,
					   struct trace_native_probe *tp, u32 size)
{
	int cpu = smp_processor_id();
	struct tn_cpu *c = &trace_native_cpu[cpu];
	struct tn_entry *e;

	tp->nhit++;
	if (!(READ_ONCE(tp->flags) & (TNP_RECORD | TNP_HOST)))
		return NULL;
	if (unlikely(c->busy)) {
		tp->nmissed++;
		return NULL;
	}
	if (size - 8 > TN_DATA_MAX)
		return NULL;
	c->busy = 1;
	e = stage_slot(c, cpu);
	if (!e) {
		c->busy = 0;
		return NULL;
	}
	set_common(e, tp->type, tracing_gen_ctx_flags(), current->pid);
	fbuffer->tp = tp;
	fbuffer->entry = &e->type;
	fbuffer->len = size - 8;
	fbuffer->cpu = cpu;
	return fbuffer->entry;
}

/* The same for a static event's record, which set_event_pid filters. */
void * __kprobes trace_event_buffer_reserve(struct trace_event_buffer *fbuffer,
					    struct trace_native_probe *tp, u32 size)
{
	if (unlikely(trace_event_pids.pids_set | trace_event_pids.no_pids_set) &&
	    trace_event_ignore_pid(current->pid)) {
		tp->nhit++;
		return NULL;
	}
	return trace_buffer_lock_reserve(fbuffer, tp, size);
}

/* Filter the reserved record and stage it. */
void __kprobes trace_event_buffer_commit(struct trace_event_buffer *fbuffer)
{
	struct trace_native_probe *tp = fbuffer->tp;
	struct tn_cpu *c = &trace_native_cpu[fbuffer->cpu];
	struct task_struct *task = current;
	struct tn_entry *e = container_of(fbuffer->entry, struct tn_entry, type);
	u32 acct, staged;
	u64 ts;

	if (unlikely(READ_ONCE(tp->flags) & TNP_HOST))
		hypercall(HC_TRACE_EVENT, fbuffer->cpu, (long)fbuffer->entry, fbuffer->len, 0);
	if (!(READ_ONCE(tp->flags) & TNP_RECORD))
		goto out;
	if (tp->filter && !filter_match(tp->filter, fbuffer->entry, task, fbuffer->cpu))
		goto out;
	save_comm(c, fbuffer->cpu, task);
	ts = trace_clock_read();
	staged = c->staged;
	acct = make_room(c, fbuffer->cpu, fbuffer->len, ts);
	if (!acct)
		goto out;
	if (unlikely(c->staged != staged))
		e = move_record(c, e, fbuffer->len);
	stage_commit(c, fbuffer->cpu, e, fbuffer->len, acct, ts);
out:
	c->busy = 0;
}

/* A hit that trapped passes the probe's address + 1 (probes are 64-byte aligned): its
 * record shows interrupts off in an NMI-like context, as an int3 handler's does; other
 * hits show the context they ran in. */
#define TN_TRAPPED 1UL
#define TN_FLAGS_INT3 (TRACE_FLAG_IRQS_OFF | TRACE_FLAG_HARDIRQ | 0x40)	/* "d.Z.." */

static __always_inline struct trace_native_probe *untag(struct trace_native_probe *tp,
							u8 *flags)
{
	unsigned long p = (unsigned long)tp;

	*flags = p & TN_TRAPPED ? TN_FLAGS_INT3 : tracing_gen_ctx_flags();
	return (struct trace_native_probe *)(p & ~TN_TRAPPED);
}

/* The pre-handler of a natively recorded kprobe event. */
void __kprobes trace_native_probe(struct trace_native_probe *tp, struct pt_regs *regs)
{
	int cpu = smp_processor_id();
	struct tn_cpu *c = &trace_native_cpu[cpu];
	u8 flags;

	tp = untag(tp, &flags);

	tp->nhit++;
	if (!(READ_ONCE(tp->flags) & TNP_RECORD))
		return;
	if (unlikely(c->busy)) {
		/* A probe hit inside the recorder (in a fault it took, say). */
		tp->nmissed++;
		return;
	}
	c->busy = 1;
	record(tp, regs, c, cpu, 0, flags);
	c->busy = 0;
}

/* ---- return probes ---------------------------------------------------------------- */
/* The entry handler of a natively recorded return probe: take a free instance, keep the
 * return address and point it at trace_native_ret_trampoline (what a kretprobe's
 * pre-handler and arch_rethook_prepare do).  No instance left: a miss. */
void __kprobes trace_native_ret_entry(struct trace_native_probe *tp, struct pt_regs *regs)
{
	unsigned long *slot = (unsigned long *)regs->sp;
	struct tn_ret_instance *ri;
	u8 flags;

	tp = untag(tp, &flags);

	if (list_empty(&tp->ret_free)) {
		tp->nmissed++;
		return;
	}
	ri = list_first_entry(&tp->ret_free, struct tn_ret_instance, list);
	list_del_init(&ri->list);
	ri->ret_addr = *slot;
	ri->slot = (unsigned long)slot;
	*slot = (unsigned long)trace_native_ret_trampoline;
	list_add(&ri->list, &current->kretprobe_instances);
	tp->ret_pending++;
}

/* Called by trace_native_ret_trampoline when a function with a hijacked return address
 * returns: record the event and give back the real return address.  regs->sp is the
 * caller's stack pointer, one slot above where the return address was. */
unsigned long __kprobes trace_native_ret_handler(struct pt_regs *regs)
{
	unsigned long slot = regs->sp - 8;
	int cpu = smp_processor_id();
	struct tn_cpu *c = &trace_native_cpu[cpu];
	struct trace_native_probe *tp;
	struct tn_ret_instance *ri;

	list_for_each_entry(ri, &current->kretprobe_instances, list)
		if (ri->slot == slot)
			goto found;
	panic("trace_native_ret_handler: no instance for %lx", slot);
found:
	list_del_init(&ri->list);
	tp = ri->tp;
	regs->ip = ri->ret_addr;
	tp->nhit++;
	tp->ret_pending--;
	if (READ_ONCE(tp->flags) & TNP_RECORD) {
		if (unlikely(c->busy)) {
			tp->nmissed++;
		} else {
			c->busy = 1;
			record(tp, regs, c, cpu, ri->ret_addr, tracing_gen_ctx_flags());
			c->busy = 0;
		}
	}
	list_add(&ri->list, &tp->ret_free);
	return ri->ret_addr;
}

/* The task's memory goes (it exited and was reaped, off its CPU for good): its pending
 * returns, the last schedule()'s among them, never come; give the instances back, as
 * rethook_flush_task does when a task_struct is freed. */
void __kprobes trace_native_task_free(struct task_struct *task)
{
	struct tn_ret_instance *ri, *n;

	list_for_each_entry_safe(ri, n, &task->kretprobe_instances, list) {
		list_del_init(&ri->list);
		ri->tp->ret_pending--;
		list_add(&ri->list, &ri->tp->ret_free);
	}
}
